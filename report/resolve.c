/* report/resolve.c: resolution of callstacks: ids to frames, function names, mapping
 * paths (joined from their components) and build ids (as hex), all interned in the
 * trace, so the result outlives the sequence's tables; each callstack once per sequence
 * generation, shared by every sample. And the source lines of ModuleSymbols packets,
 * attached to the frames once the whole trace is read (a dump's lines follow it).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/pbwire.h"

static const struct rd_mapping_info *mapping_info(struct rd *rd, struct rd_seq *seq,
                                                  uint64_t mapping_id)
{
    struct rd_mapping_info *cached = hp_map_get(&seq->path_cache, mapping_id);
    if (cached)
        return cached;
    const struct rd_mapping *m = hp_map_get(&seq->mappings, mapping_id);
    char buf[READ_MAX_STRING_BYTES];
    size_t len = 0;
    for (uint32_t i = 0; m && i < m->n_comps; i++) {
        const struct rd_str *c = hp_map_get(&seq->strs[STR_PATH], m->comps[i]);
        if (!c)
            break; /* as Perfetto: a missing component ends the path */
        if (len + 1 + c->len > sizeof(buf))
            break;
        buf[len++] = '/';
        memcpy(buf + len, c->s, c->len);
        len += c->len;
    }
    /* Writers that put the whole path in one component produce "//path". */
    size_t skip = (len >= 2 && buf[0] == '/' && buf[1] == '/') ? 1 : 0;
    struct rd_mapping_info info = {.path = rp__intern(rd, buf + skip, len - skip)};
    /* Build ids are raw bytes (heapprof, heapprofd) or already hex text: keep hex text,
     * encode anything else. */
    const struct rd_str *b =
        m && m->build_id ? hp_map_get(&seq->strs[STR_BUILD_ID], m->build_id) : NULL;
    size_t blen = 0;
    if (b && b->len) {
        bool hex = true;
        for (size_t i = 0; i < b->len && hex; i++)
            hex = (b->s[i] >= '0' && b->s[i] <= '9') || (b->s[i] >= 'a' && b->s[i] <= 'f');
        static const char digits[] = "0123456789abcdef";
        for (size_t i = 0; i < b->len && blen + 2 < sizeof(buf); i++) {
            if (hex) {
                buf[blen++] = b->s[i];
            } else {
                buf[blen++] = digits[(uint8_t)b->s[i] >> 4];
                buf[blen++] = digits[(uint8_t)b->s[i] & 15];
            }
        }
    }
    info.build_id = rp__intern(rd, buf, blen);
    if (!info.path || !info.build_id)
        return NULL;
    struct rd_mapping_info *slot;
    if (hp_map_put(&seq->path_cache, mapping_id, (void **)&slot) < 0)
        return NULL;
    *slot = info;
    return slot;
}

uint64_t rp__hash(const struct rd *rd, const uint64_t *words, size_t n)
{
    uint64_t h = rd->hash_seed;
    for (size_t i = 0; i < n; i++)
        h = hp_hash_combine(h, words[i]);
    return h;
}

/* The frame @frame_id of @seq as a report frame (strings interned in the trace). */
static int resolve_frame(struct rd *rd, struct rd_seq *seq, uint64_t frame_id, const char *empty,
                         struct rp_trace_frame *ret)
{
    *ret = (struct rp_trace_frame){
        .function_name = empty, .mapping_path = empty, .build_id = empty, .file = empty};
    const struct rd_frame *f = hp_map_get(&seq->frames, frame_id);
    if (!f)
        return 0;
    ret->rel_pc = f->rel_pc;
    const struct rd_str *name = hp_map_get(&seq->strs[STR_FUNCTION], f->name_id);
    if (name && name->len) {
        const char *n = rp__intern(rd, name->s, name->len);
        if (!n)
            return -ENOMEM;
        ret->function_name = n;
    }
    const struct rd_mapping_info *info = mapping_info(rd, seq, f->mapping_id);
    if (!info)
        return -ENOMEM;
    ret->mapping_path = info->path;
    ret->build_id = info->build_id;
    const struct rd_mapping *m = hp_map_get(&seq->mappings, f->mapping_id);
    if (m) {
        ret->map_start = m->start;
        ret->map_end = m->end;
        ret->map_offset = m->exact_offset;
        ret->map_load_bias = m->load_bias;
    }
    return 0;
}

int rp__resolve_stack(struct rd *rd, struct rd_seq *seq, uint64_t cs_id,
                      const struct rd_stack **ret)
{
    static const struct rd_stack none = {NULL, 0};
    struct rd_stack *stk = hp_map_get(&seq->resolved, cs_id);
    if (stk) {
        *ret = stk;
        return 0;
    }
    const struct rd_callstack *cs = hp_map_get(&seq->callstacks, cs_id);
    if (!cs || !cs->n) {
        *ret = &none;
        return 0;
    }
    /* Once per (sequence generation, callstack): every sample that uses it shares the
     * frames, and the frames each take at least one byte of the input. */
    int r = rp__keep(rd, cs->n * sizeof(struct rp_trace_frame) + sizeof(struct rd_stack));
    if (r < 0)
        return r;
    const char *empty = rp__intern(rd, "", 0);
    struct rp_trace_frame *frames = hp_arena_alloc(&rd->tp->arena, cs->n * sizeof(*frames));
    if (!empty || !frames ||
        hp_grow((void **)&rd->stacks, &rd->cap_stacks, rd->n_stacks + 1, sizeof(*rd->stacks)) < 0)
        return -ENOMEM;
    for (size_t j = 0; j < cs->n; j++) {
        r = resolve_frame(rd, seq, cs->frames[j], empty, &frames[j]);
        if (r < 0)
            return r;
    }
    if (hp_map_put(&seq->resolved, cs_id, (void **)&stk) < 0)
        return -ENOMEM;
    *stk = (struct rd_stack){frames, cs->n};
    rd->stacks[rd->n_stacks++] = *stk;
    *ret = stk;
    return 0;
}

void rp__seq_resolved_done(struct rd_seq *seq)
{
    hp_map_done(&seq->resolved);
    hp_map_init(&seq->resolved, sizeof(struct rd_stack));
}

/* ---- source lines (ModuleSymbols) ---- */

struct sym_key {
    const struct rd *rd;
    const char *path, *build_id;
    uint64_t address;
};

static bool sym_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct sym_key *k = key;
    const struct rd_syms *s = &k->rd->syms[id];
    (void)ctx;
    return s->path == k->path && s->build_id == k->build_id && s->address == k->address;
}

static uint64_t sym_hash(const struct rd *rd, const char *path, const char *build_id,
                         uint64_t address)
{
    return rp__hash(rd, (uint64_t[]){(uintptr_t)path, (uintptr_t)build_id, address}, 3);
}

/* A build id as the frames carry it: raw bytes as lower-case hex (at most 64 bytes). */
static const char *hex_build_id(struct rd *rd, const uint8_t *b, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    char buf[2 * 64];
    size_t n = 0;
    for (size_t i = 0; i < len && i < 64; i++) {
        buf[n++] = digits[b[i] >> 4];
        buf[n++] = digits[b[i] & 15];
    }
    return rp__intern(rd, buf, n);
}

/* A Line message into @ret (strings interned). */
static int parse_line(struct rd *rd, const uint8_t *buf, size_t len, const char *empty,
                      struct rp_trace_line *ret)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    *ret = (struct rp_trace_line){.function_name = empty, .file = empty};
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type == HP_PB_LEN &&
            (f.num == PF_LINE(function_name) || f.num == PF_LINE(source_file_name))) {
            const char *s =
                rp__intern(rd, (const char *)f.ptr, HP_MIN(f.len, (size_t)READ_MAX_STRING_BYTES));
            if (!s)
                return -ENOMEM;
            if (f.num == PF_LINE(function_name))
                ret->function_name = s;
            else
                ret->file = s;
        } else if (f.wire_type == HP_PB_VARINT && f.num == PF_LINE(line_number)) {
            ret->line = (uint32_t)f.varint;
        }
    }
    return it.error ? -EBADMSG : 0;
}

static int parse_address(struct rd *rd, const char *path, const char *build_id, const uint8_t *buf,
                         size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t address = 0;
    size_t n = 0;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == PF_ADDRESS(address) && f.wire_type == HP_PB_VARINT)
            address = f.varint;
        else if (f.num == PF_ADDRESS(lines) && f.wire_type == HP_PB_LEN)
            n++;
    }
    if (it.error)
        return -EBADMSG;
    n = HP_MIN(n, (size_t)READ_MAX_LINES);
    if (n == 0)
        return 0; /* an address without lines says nothing */
    const char *empty = rp__intern(rd, "", 0);
    int r = rp__keep(rd, n * sizeof(struct rp_trace_line) + sizeof(struct rd_syms));
    if (r < 0)
        return r;
    struct rp_trace_line *lines = hp_arena_alloc(&rd->tp->arena, n * sizeof(*lines));
    if (!empty || !lines)
        return -ENOMEM;
    size_t k = 0;
    hp_pb_iter_init(&it, buf, len);
    while (k < n && hp_pb_next(&it, &f)) {
        if (f.num != PF_ADDRESS(lines) || f.wire_type != HP_PB_LEN)
            continue;
        r = parse_line(rd, f.ptr, f.len, empty, &lines[k++]);
        if (r < 0)
            return r;
    }
    struct sym_key key = {rd, path, build_id, address};
    uint64_t h = sym_hash(rd, path, build_id, address);
    int64_t id = hp_idtab_find(&rd->sym_index, h, sym_eq, NULL, &key);
    if (id < 0) {
        if (rd->n_syms >= UINT32_MAX - 1 ||
            hp_grow((void **)&rd->syms, &rd->cap_syms, rd->n_syms + 1, sizeof(*rd->syms)) < 0 ||
            hp_idtab_add(&rd->sym_index, h, (uint32_t)rd->n_syms) < 0)
            return -ENOMEM;
        id = (int64_t)rd->n_syms++;
        rd->tp->pub.n_source_lines++;
    }
    /* The last ModuleSymbols for an address wins. */
    rd->syms[id] = (struct rd_syms){path, build_id, address, (uint32_t)k, lines};
    return 0;
}

int rp__parse_module_symbols(struct rd *rd, const uint8_t *buf, size_t len)
{
    const uint8_t *path = NULL, *bid = NULL;
    size_t path_len = 0, bid_len = 0;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        if (f.num == PF_MODULE(path)) {
            path = f.ptr;
            path_len = HP_MIN(f.len, (size_t)READ_MAX_STRING_BYTES);
        } else if (f.num == PF_MODULE(build_id)) {
            bid = f.ptr;
            bid_len = f.len;
        }
    }
    if (it.error)
        return -EBADMSG;
    const char *p = rp__intern(rd, path ? (const char *)path : "", path_len);
    const char *b = hex_build_id(rd, bid, bid_len);
    if (!p || !b)
        return -ENOMEM;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != PF_MODULE(address_symbols) || f.wire_type != HP_PB_LEN)
            continue;
        int r = parse_address(rd, p, b, f.ptr, f.len);
        if (r < 0)
            return r;
    }
    return 0;
}

int rp__attach_lines(struct rd *rd)
{
    if (!rd->n_syms)
        return 0;
    for (size_t i = 0; i < rd->n_stacks; i++) {
        for (size_t j = 0; j < rd->stacks[i].n; j++) {
            struct rp_trace_frame *f = &rd->stacks[i].frames[j];
            struct sym_key key = {rd, f->mapping_path, f->build_id, f->rel_pc};
            int64_t id =
                hp_idtab_find(&rd->sym_index, sym_hash(rd, f->mapping_path, f->build_id, f->rel_pc),
                              sym_eq, NULL, &key);
            if (id < 0)
                continue;
            const struct rd_syms *s = &rd->syms[id];
            /* Innermost first: the last line is the frame's own function. */
            const struct rp_trace_line *own = &s->lines[s->n_lines - 1];
            f->file = own->file;
            f->line = own->line;
            if (!f->function_name[0])
                f->function_name = own->function_name;
            f->n_inlined = s->n_lines - 1;
            f->inlined = s->n_lines > 1 ? s->lines : NULL;
        }
    }
    return 0;
}
