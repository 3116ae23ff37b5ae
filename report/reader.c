/* report/reader.c: streaming reader of heap-profile traces.
 *
 * The file is read one Trace.packet at a time into a buffer of at most
 * READ_MAX_PACKET_BYTES, and each packet is walked with the field iterator of
 * common/pbwire.h: no length from the file is trusted before it is checked
 * against the bytes actually present, so hostile input ends in -EBADMSG, never in a
 * crash or an allocation larger than the input.
 *
 * State kept while reading:
 * - per packet sequence (trusted_packet_sequence_id): the interning tables, reset by
 *   SEQ_INCREMENTAL_STATE_CLEARED, and the dump in progress (ProfilePackets linked by
 *   `continued`, checked by `index`);
 * - per (pid, heap): the number of complete dumps and the raw samples of the selected
 *   one. Samples are resolved to frames and strings only when their sequence's tables
 *   are about to be cleared, or at the end, so following the latest dump of a long
 *   continuous trace costs no symbol work per dump.
 */
#include "report/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/pbwire.h"
#include "common/strtab.h"

#define READ_MAX_PACKET_BYTES (64u * 1024 * 1024)
#define READ_MAX_STRING_BYTES 4096
#define READ_MAX_COMPONENTS 256
#define READ_MAX_FRAMES 4096

enum { STR_FUNCTION, STR_PATH, STR_BUILD_ID, STR_KINDS };

struct rd_str {
    const char *s;
    size_t len;
};

struct rd_mapping {
    const uint64_t *comps;
    uint32_t n_comps;
    uint64_t build_id, start, end, exact_offset, load_bias;
};

struct rd_mapping_info {
    const char *path, *build_id; /* strtab */
};

struct rd_frame {
    uint64_t name_id, mapping_id, rel_pc;
};

struct rd_callstack {
    const uint64_t *frames;
    size_t n;
};

struct rd_sample {
    uint64_t callstack_id;
    uint64_t self_allocated, self_freed, alloc_count, free_count, self_max, self_max_count;
};

struct rd_header {
    uint64_t timestamp, sampling_interval_bytes;
    bool from_startup, disconnected, buffer_overran, buffer_corrupted, hit_guardrail, client_error;
    bool writer_stalled, connection_closed_by_program;
    uint64_t unwinding_errors, heap_samples, map_reparses, total_unwinding_time_us,
        client_spinlock_blocked_us, writer_stalls, stalled_records_skipped;
};

/* One process's (and heap's) part of the dump in progress on a sequence. */
struct rd_pdump {
    uint64_t pid;
    const char *heap_name; /* in the trace's strtab */
    struct rd_header hdr;
    struct hp_map index; /* callstack id -> index in samples */
    struct rd_sample *samples;
    size_t n_samples, cap_samples;
};

struct rd_seq {
    uint32_t id;
    struct hp_arena arena;
    struct hp_map strs[STR_KINDS]; /* iid -> struct rd_str */
    struct hp_map mappings;        /* iid -> struct rd_mapping */
    struct hp_map frames;          /* iid -> struct rd_frame */
    struct hp_map callstacks;      /* iid -> struct rd_callstack */
    struct hp_map path_cache;      /* mapping iid -> struct rd_mapping_info */
    bool have_index;
    uint64_t next_index;
    struct rd_pdump *chain; /* the dump in progress */
    size_t n_chain, cap_chain;
};

struct rd_proc {
    int32_t pid;
    const char *heap_name;
    uint32_t n_dumps;
    bool selected;
    struct rd_header hdr;
    struct rd_seq *seq; /* whose tables the raw samples refer to */
    struct rd_sample *raw;
    size_t n_raw;
    bool resolved;
    struct rp_trace_callsite *callsites; /* in the trace's arena */
    size_t n_callsites;
};

struct trace_priv {
    struct rp_trace pub; /* first: rp_trace_free() casts back */
    hp_strtab_t *strings;
    struct hp_arena arena;
};

struct rd {
    const struct rp_trace_options *opt;
    struct trace_priv *tp;
    struct rd_seq **seqs;
    size_t n_seqs, cap_seqs;
    struct rd_proc *procs;
    size_t n_procs, cap_procs;
    struct hp_map cmdlines; /* pid -> const char * (strtab) */
    uint64_t *tmp;          /* scratch for id lists */
    size_t cap_tmp;
};

/* ---- helpers ---- */

static const char *intern(struct rd *rd, const char *s, size_t len)
{
    return hp_strtab_intern(rd->tp->strings, s, len);
}

static int push_tmp(struct rd *rd, size_t n, uint64_t v)
{
    int r = hp_grow((void **)&rd->tmp, &rd->cap_tmp, n + 1, sizeof(*rd->tmp));
    if (r < 0)
        return r;
    rd->tmp[n] = v;
    return 0;
}

static uint64_t *copy_ids(struct rd_seq *seq, const uint64_t *ids, size_t n)
{
    if (!n)
        return NULL;
    uint64_t *c = hp_arena_alloc(&seq->arena, n * sizeof(*c));
    if (c)
        memcpy(c, ids, n * sizeof(*c));
    return c;
}

/* ---- sequences ---- */

static void pdump_done(struct rd_pdump *d)
{
    hp_map_done(&d->index);
    free(d->samples);
}

static void chain_drop(struct rd_seq *seq)
{
    for (size_t i = 0; i < seq->n_chain; i++)
        pdump_done(&seq->chain[i]);
    seq->n_chain = 0;
}

static void seq_tables_init(struct rd_seq *seq)
{
    for (int k = 0; k < STR_KINDS; k++)
        hp_map_init(&seq->strs[k], sizeof(struct rd_str));
    hp_map_init(&seq->mappings, sizeof(struct rd_mapping));
    hp_map_init(&seq->frames, sizeof(struct rd_frame));
    hp_map_init(&seq->callstacks, sizeof(struct rd_callstack));
    hp_map_init(&seq->path_cache, sizeof(struct rd_mapping_info));
}

static void seq_tables_done(struct rd_seq *seq)
{
    for (int k = 0; k < STR_KINDS; k++)
        hp_map_done(&seq->strs[k]);
    hp_map_done(&seq->mappings);
    hp_map_done(&seq->frames);
    hp_map_done(&seq->callstacks);
    hp_map_done(&seq->path_cache);
    hp_arena_done(&seq->arena);
}

static struct rd_seq *seq_get(struct rd *rd, uint32_t id)
{
    for (size_t i = 0; i < rd->n_seqs; i++)
        if (rd->seqs[i]->id == id)
            return rd->seqs[i];
    if (hp_grow((void **)&rd->seqs, &rd->cap_seqs, rd->n_seqs + 1, sizeof(*rd->seqs)) < 0)
        return NULL;
    struct rd_seq *seq = calloc(1, sizeof(*seq));
    if (!seq)
        return NULL;
    seq->id = id;
    seq_tables_init(seq);
    rd->seqs[rd->n_seqs++] = seq;
    return seq;
}

/* ---- resolution of selected dumps ---- */

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
    struct rd_mapping_info info = {.path = intern(rd, buf + skip, len - skip)};
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
    info.build_id = intern(rd, buf, blen);
    if (!info.path || !info.build_id)
        return NULL;
    struct rd_mapping_info *slot;
    if (hp_map_put(&seq->path_cache, mapping_id, (void **)&slot) < 0)
        return NULL;
    *slot = info;
    return slot;
}

static int resolve(struct rd *rd, struct rd_proc *p)
{
    if (p->resolved || !p->selected)
        return 0;
    struct rd_seq *seq = p->seq;
    struct hp_arena *a = &rd->tp->arena;
    const char *empty = intern(rd, "", 0);
    if (!empty)
        return -ENOMEM;
    p->callsites = p->n_raw ? hp_arena_alloc(a, p->n_raw * sizeof(*p->callsites)) : NULL;
    if (p->n_raw && !p->callsites)
        return -ENOMEM;
    for (size_t i = 0; i < p->n_raw; i++) {
        const struct rd_sample *s = &p->raw[i];
        struct rp_trace_callsite *c = &p->callsites[i];
        *c = (struct rp_trace_callsite){
            .callstack_id = s->callstack_id,
            .self_allocated = s->self_allocated,
            .self_freed = s->self_freed,
            .alloc_count = s->alloc_count,
            .free_count = s->free_count,
            .self_max = s->self_max,
            .self_max_count = s->self_max_count,
        };
        const struct rd_callstack *cs = hp_map_get(&seq->callstacks, s->callstack_id);
        if (!cs || !cs->n)
            continue;
        struct rp_trace_frame *frames = hp_arena_alloc(a, cs->n * sizeof(*frames));
        if (!frames)
            return -ENOMEM;
        for (size_t j = 0; j < cs->n; j++) {
            const struct rd_frame *f = hp_map_get(&seq->frames, cs->frames[j]);
            frames[j] = (struct rp_trace_frame){
                .function_name = empty, .mapping_path = empty, .build_id = empty};
            if (!f)
                continue;
            frames[j].rel_pc = f->rel_pc;
            const struct rd_str *name = hp_map_get(&seq->strs[STR_FUNCTION], f->name_id);
            if (name && name->len) {
                const char *n = intern(rd, name->s, name->len);
                if (!n)
                    return -ENOMEM;
                frames[j].function_name = n;
            }
            const struct rd_mapping_info *info = mapping_info(rd, seq, f->mapping_id);
            if (!info)
                return -ENOMEM;
            frames[j].mapping_path = info->path;
            frames[j].build_id = info->build_id;
            const struct rd_mapping *m = hp_map_get(&seq->mappings, f->mapping_id);
            if (m) {
                frames[j].map_start = m->start;
                frames[j].map_end = m->end;
                frames[j].map_offset = m->exact_offset;
                frames[j].map_load_bias = m->load_bias;
            }
        }
        c->frames = frames;
        c->n_frames = cs->n;
    }
    p->n_callsites = p->n_raw;
    p->resolved = true;
    free(p->raw);
    p->raw = NULL;
    p->n_raw = 0;
    return 0;
}

/* The tables of @seq are about to change meaning: resolve what refers to them. */
static int resolve_seq(struct rd *rd, struct rd_seq *seq)
{
    for (size_t i = 0; i < rd->n_procs; i++) {
        if (rd->procs[i].seq == seq && !rd->procs[i].resolved) {
            int r = resolve(rd, &rd->procs[i]);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

static int seq_clear(struct rd *rd, struct rd_seq *seq)
{
    int r = resolve_seq(rd, seq);
    if (r < 0)
        return r;
    chain_drop(seq);
    seq_tables_done(seq);
    seq_tables_init(seq);
    return 0;
}

/* ---- interned data ---- */

static int parse_string(struct rd_seq *seq, struct hp_map *table, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t iid = 0;
    const uint8_t *s = NULL;
    size_t slen = 0;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 1 && f.wire_type == HP_PB_VARINT)
            iid = f.varint;
        else if (f.num == 2 && f.wire_type == HP_PB_LEN) {
            s = f.ptr;
            slen = HP_MIN(f.len, (size_t)READ_MAX_STRING_BYTES);
        }
    }
    if (it.error)
        return -EBADMSG;
    char *copy = hp_arena_strndup(&seq->arena, (const char *)s, s ? slen : 0);
    struct rd_str *slot;
    if (!copy || hp_map_put(table, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = (struct rd_str){.s = copy, .len = s ? slen : 0};
    return 0;
}

/* Collects the integers of repeated field @num of the message at @buf into rd->tmp. */
static int parse_ids(struct rd *rd, const uint8_t *buf, size_t len, uint32_t num, size_t max,
                     uint64_t *ret_iid, size_t *ret_n)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    size_t n = 0;
    bool err = false;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 1 && f.wire_type == HP_PB_VARINT) {
            *ret_iid = f.varint;
        } else if (f.num == num) {
            struct hp_pb_ints ints;
            uint64_t v;
            hp_pb_ints_init(&ints, &f);
            while (hp_pb_ints_next(&ints, &v, &err)) {
                if (n < max && push_tmp(rd, n++, v) < 0)
                    return -ENOMEM;
            }
        }
    }
    if (it.error || err)
        return -EBADMSG;
    *ret_n = n;
    return 0;
}

static int parse_mapping(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    uint64_t iid = 0;
    size_t n;
    int r = parse_ids(rd, buf, len, 7, READ_MAX_COMPONENTS, &iid, &n);
    if (r < 0)
        return r;
    struct rd_mapping m = {.comps = copy_ids(seq, rd->tmp, n), .n_comps = (uint32_t)n};
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        switch (f.num) {
        case 2:
            m.build_id = f.varint;
            break;
        case 4:
            m.start = f.varint;
            break;
        case 5:
            m.end = f.varint;
            break;
        case 6:
            m.load_bias = f.varint;
            break;
        case 8:
            m.exact_offset = f.varint;
            break;
        }
    }
    struct rd_mapping *slot;
    if ((n && !m.comps) || hp_map_put(&seq->mappings, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = m;
    hp_map_remove(&seq->path_cache, iid);
    return 0;
}

static int parse_callstack(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    uint64_t iid = 0;
    size_t n;
    int r = parse_ids(rd, buf, len, 2, READ_MAX_FRAMES, &iid, &n);
    if (r < 0)
        return r;
    struct rd_callstack cs = {.frames = copy_ids(seq, rd->tmp, n), .n = n};
    struct rd_callstack *slot;
    if ((n && !cs.frames) || hp_map_put(&seq->callstacks, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = cs;
    return 0;
}

static int parse_frame(struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t iid = 0;
    struct rd_frame fr = {0};
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        switch (f.num) {
        case 1:
            iid = f.varint;
            break;
        case 2:
            fr.name_id = f.varint;
            break;
        case 3:
            fr.mapping_id = f.varint;
            break;
        case 4:
            fr.rel_pc = f.varint;
            break;
        }
    }
    if (it.error)
        return -EBADMSG;
    struct rd_frame *slot;
    if (hp_map_put(&seq->frames, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = fr;
    return 0;
}

static int parse_interned(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        int r = 0;
        switch (f.num) {
        case 5:
            r = parse_string(seq, &seq->strs[STR_FUNCTION], f.ptr, f.len);
            break;
        case 6:
            r = parse_frame(seq, f.ptr, f.len);
            break;
        case 7:
            r = parse_callstack(rd, seq, f.ptr, f.len);
            break;
        case 16:
            r = parse_string(seq, &seq->strs[STR_BUILD_ID], f.ptr, f.len);
            break;
        case 17:
            r = parse_string(seq, &seq->strs[STR_PATH], f.ptr, f.len);
            break;
        case 19:
            r = parse_mapping(rd, seq, f.ptr, f.len);
            break;
        }
        if (r < 0)
            return r;
    }
    return it.error ? -EBADMSG : 0;
}

/* ---- profile packets ---- */

static int parse_stats(struct rd_header *h, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    h->unwinding_errors = h->heap_samples = h->map_reparses = 0;
    h->total_unwinding_time_us = h->client_spinlock_blocked_us = 0;
    h->writer_stalls = h->stalled_records_skipped = 0;
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        switch (f.num) {
        case 1:
            h->unwinding_errors = f.varint;
            break;
        case 2:
            h->heap_samples = f.varint;
            break;
        case 3:
            h->map_reparses = f.varint;
            break;
        case 5:
            h->total_unwinding_time_us = f.varint;
            break;
        case 6:
            h->client_spinlock_blocked_us = f.varint;
            break;
        case 1501:
            h->writer_stalls = f.varint;
            break;
        case 1502:
            h->stalled_records_skipped = f.varint;
            break;
        }
    }
    return it.error ? -EBADMSG : 0;
}

static int parse_sample(struct rd_pdump *d, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    struct rd_sample s = {0};
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        switch (f.num) {
        case 1:
            s.callstack_id = f.varint;
            break;
        case 2:
            s.self_allocated = f.varint;
            break;
        case 3:
            s.self_freed = f.varint;
            break;
        case 5:
            s.alloc_count = f.varint;
            break;
        case 6:
            s.free_count = f.varint;
            break;
        case 8:
            s.self_max = f.varint;
            break;
        case 9:
            s.self_max_count = f.varint;
            break;
        }
    }
    if (it.error)
        return -EBADMSG;
    uint64_t *idx;
    int r = hp_map_put(&d->index, s.callstack_id, (void **)&idx);
    if (r < 0)
        return r;
    if (r == 0) {
        /* The same callstack twice in one dump: add up (values are per callstack). */
        struct rd_sample *o = &d->samples[*idx];
        o->self_allocated += s.self_allocated;
        o->self_freed += s.self_freed;
        o->alloc_count += s.alloc_count;
        o->free_count += s.free_count;
        o->self_max += s.self_max;
        o->self_max_count += s.self_max_count;
        return 0;
    }
    if (hp_grow((void **)&d->samples, &d->cap_samples, d->n_samples + 1, sizeof(s)) < 0) {
        hp_map_remove(&d->index, s.callstack_id);
        return -ENOMEM;
    }
    *idx = d->n_samples;
    d->samples[d->n_samples++] = s;
    return 0;
}

static struct rd_pdump *chain_get(struct rd_seq *seq, uint64_t pid, const char *heap_name)
{
    for (size_t i = 0; i < seq->n_chain; i++)
        if (seq->chain[i].pid == pid && seq->chain[i].heap_name == heap_name)
            return &seq->chain[i];
    if (hp_grow((void **)&seq->chain, &seq->cap_chain, seq->n_chain + 1, sizeof(*seq->chain)) < 0)
        return NULL;
    struct rd_pdump *d = &seq->chain[seq->n_chain++];
    *d = (struct rd_pdump){.pid = pid, .heap_name = heap_name};
    hp_map_init(&d->index, sizeof(uint64_t));
    return d;
}

static int parse_process_dump(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t pid = 0;
    const uint8_t *heap = NULL;
    size_t heap_len = 0;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 1 && f.wire_type == HP_PB_VARINT)
            pid = f.varint;
        else if (f.num == 11 && f.wire_type == HP_PB_LEN) {
            heap = f.ptr;
            heap_len = HP_MIN(f.len, (size_t)256);
        }
    }
    if (it.error)
        return -EBADMSG;
    const char *heap_name = intern(rd, heap ? (const char *)heap : "", heap_len);
    if (!heap_name)
        return -ENOMEM;
    struct rd_pdump *d = chain_get(seq, pid, heap_name);
    if (!d)
        return -ENOMEM;
    struct rd_header *h = &d->hdr;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        int r = 0;
        if (f.wire_type == HP_PB_LEN) {
            if (f.num == 2)
                r = parse_sample(d, f.ptr, f.len);
            else if (f.num == 5)
                r = parse_stats(h, f.ptr, f.len);
        } else if (f.wire_type == HP_PB_VARINT) {
            bool b = f.varint != 0;
            switch (f.num) {
            case 3:
                h->from_startup |= b;
                break;
            case 6:
                h->disconnected |= b;
                break;
            case 7:
                h->buffer_overran |= b;
                break;
            case 8:
                h->buffer_corrupted |= b;
                break;
            case 9:
                h->timestamp = f.varint;
                break;
            case 10:
                h->hit_guardrail |= b;
                break;
            case 12:
                h->sampling_interval_bytes = f.varint;
                break;
            case 14:
                h->client_error |= b;
                break;
            case 1501:
                h->writer_stalled |= b;
                break;
            case 1502:
                h->connection_closed_by_program |= b;
                break;
            }
        }
        if (r < 0)
            return r;
    }
    return it.error ? -EBADMSG : 0;
}

static struct rd_proc *proc_get(struct rd *rd, int32_t pid, const char *heap_name)
{
    for (size_t i = 0; i < rd->n_procs; i++)
        if (rd->procs[i].pid == pid && rd->procs[i].heap_name == heap_name)
            return &rd->procs[i];
    if (hp_grow((void **)&rd->procs, &rd->cap_procs, rd->n_procs + 1, sizeof(*rd->procs)) < 0)
        return NULL;
    struct rd_proc *p = &rd->procs[rd->n_procs++];
    *p = (struct rd_proc){.pid = pid, .heap_name = heap_name};
    return p;
}

/* The dump in progress on @seq is complete. */
static int chain_commit(struct rd *rd, struct rd_seq *seq)
{
    int r = 0;
    for (size_t i = 0; i < seq->n_chain && r == 0; i++) {
        struct rd_pdump *d = &seq->chain[i];
        if (rd->opt->pid && (int32_t)d->pid != rd->opt->pid)
            continue;
        struct rd_proc *p = proc_get(rd, (int32_t)d->pid, d->heap_name);
        if (!p) {
            r = -ENOMEM;
            break;
        }
        p->n_dumps++;
        int want = rd->opt->dump_index;
        if (want > 0 && p->n_dumps != (uint32_t)want)
            continue;
        free(p->raw);
        p->selected = true;
        p->hdr = d->hdr;
        p->seq = seq;
        p->raw = d->samples; /* moved */
        p->n_raw = d->n_samples;
        p->resolved = false;
        p->callsites = NULL; /* earlier resolved ones stay in the arena until the end */
        p->n_callsites = 0;
        d->samples = NULL;
        d->n_samples = 0;
    }
    chain_drop(seq);
    return r;
}

static int parse_profile_packet(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    bool continued = false, has_index = false;
    uint64_t index = 0;
    int r = 0;
    /* First pass: scalars, and the legacy (Android Q) interning tables, which share one
     * string table for names, paths and build ids. */
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f) && r == 0) {
        if (f.wire_type == HP_PB_VARINT) {
            if (f.num == 6)
                continued = f.varint != 0;
            else if (f.num == 7) {
                has_index = true;
                index = f.varint;
            }
        } else if (f.wire_type == HP_PB_LEN) {
            switch (f.num) {
            case 1:
                for (int k = 0; k < STR_KINDS && r == 0; k++)
                    r = parse_string(seq, &seq->strs[k], f.ptr, f.len);
                break;
            case 2:
                r = parse_frame(seq, f.ptr, f.len);
                break;
            case 3:
                r = parse_callstack(rd, seq, f.ptr, f.len);
                break;
            case 4:
                r = parse_mapping(rd, seq, f.ptr, f.len);
                break;
            }
        }
    }
    if (r < 0)
        return r;
    if (it.error)
        return -EBADMSG;
    if (has_index) {
        /* A gap in the index means lost packets: the dump in progress is incomplete. */
        if (seq->have_index && index != seq->next_index)
            chain_drop(seq);
        seq->have_index = true;
        seq->next_index = index + 1;
    }
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f) && r == 0) {
        if (f.num == 5 && f.wire_type == HP_PB_LEN)
            r = parse_process_dump(rd, seq, f.ptr, f.len);
    }
    if (r < 0)
        return r;
    if (it.error)
        return -EBADMSG;
    return continued ? 0 : chain_commit(rd, seq);
}

/* ---- other packets ---- */

static int parse_process_tree(struct rd *rd, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it, pit;
    struct hp_pb_field f, pf;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != 1 || f.wire_type != HP_PB_LEN)
            continue;
        char line[READ_MAX_STRING_BYTES];
        size_t n = 0;
        int32_t pid = 0;
        hp_pb_iter_init(&pit, f.ptr, f.len);
        while (hp_pb_next(&pit, &pf)) {
            if (pf.num == 1 && pf.wire_type == HP_PB_VARINT) {
                pid = (int32_t)pf.varint;
            } else if (pf.num == 3 && pf.wire_type == HP_PB_LEN) {
                if (n && n < sizeof(line))
                    line[n++] = ' ';
                size_t c = HP_MIN(pf.len, sizeof(line) - n);
                memcpy(line + n, pf.ptr, c);
                n += c;
            }
        }
        if (pit.error)
            return -EBADMSG;
        const char *s = intern(rd, line, n);
        const char **slot;
        if (!s || hp_map_put(&rd->cmdlines, (uint64_t)(uint32_t)pid, (void **)&slot) < 0)
            return -ENOMEM;
        *slot = s;
    }
    return it.error ? -EBADMSG : 0;
}

static int parse_packet(struct rd *rd, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint32_t seq_id = 0;
    bool cleared = false, profile = false;
    rd->tp->pub.n_packets++;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type == HP_PB_VARINT) {
            if (f.num == 10)
                seq_id = (uint32_t)f.varint;
            else if (f.num == 13)
                cleared |= (f.varint & 1) != 0; /* SEQ_INCREMENTAL_STATE_CLEARED */
            else if (f.num == 41)
                cleared |= f.varint != 0;
        } else if (f.wire_type == HP_PB_LEN) {
            if (f.num == 37)
                profile = true;
            else if (f.num == 6)
                rd->tp->pub.has_clock_snapshot = true;
        }
    }
    if (it.error)
        return -EBADMSG;
    struct rd_seq *seq = seq_get(rd, seq_id);
    if (!seq)
        return -ENOMEM;
    int r = cleared ? seq_clear(rd, seq) : 0;
    /* Interned data first: the packet's own payload may refer to it. */
    hp_pb_iter_init(&it, buf, len);
    while (r == 0 && hp_pb_next(&it, &f))
        if (f.num == 12 && f.wire_type == HP_PB_LEN)
            r = parse_interned(rd, seq, f.ptr, f.len);
    hp_pb_iter_init(&it, buf, len);
    while (r == 0 && hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        if (f.num == 37)
            r = parse_profile_packet(rd, seq, f.ptr, f.len);
        else if (f.num == 2)
            r = parse_process_tree(rd, f.ptr, f.len);
    }
    if (profile)
        rd->tp->pub.n_profile_packets++;
    return r;
}

/* ---- file ---- */

/* Reads a varint from @fp: 0, 1 at a clean end of file before the first byte, -EAGAIN
 * when the file ends inside it, -EBADMSG when it is too long. */
static int read_varint(FILE *fp, uint64_t *ret)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        int c = getc(fp);
        if (c == EOF) {
            if (ferror(fp))
                return -EIO;
            return shift == 0 ? 1 : -EAGAIN;
        }
        if (shift == 63 && c > 1)
            return -EBADMSG;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *ret = v;
            return 0;
        }
    }
    return -EBADMSG;
}

static int skip_bytes(FILE *fp, uint64_t n)
{
    while (n) {
        char tmp[4096];
        size_t c = (size_t)HP_MIN(n, (uint64_t)sizeof(tmp));
        if (fread(tmp, 1, c, fp) != c)
            return ferror(fp) ? -EIO : -EAGAIN;
        n -= c;
    }
    return 0;
}

/* Reads packets until the end; a truncated last packet ends the file quietly. */
static int read_file(struct rd *rd, FILE *fp)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    int r;
    for (;;) {
        uint64_t tag, len;
        r = read_varint(fp, &tag);
        if (r != 0)
            break;
        uint32_t wt = (uint32_t)(tag & 7);
        if ((tag >> 3) == 0) {
            r = -EBADMSG;
            break;
        }
        if (wt == HP_PB_VARINT) {
            r = read_varint(fp, &len);
        } else if (wt == HP_PB_FIXED64 || wt == HP_PB_FIXED32) {
            r = skip_bytes(fp, wt == HP_PB_FIXED64 ? 8 : 4);
        } else if (wt == HP_PB_LEN) {
            r = read_varint(fp, &len);
            if (r == 1)
                r = -EAGAIN;
            if (r != 0)
                break;
            if (len > READ_MAX_PACKET_BYTES) {
                r = -EBADMSG;
                break;
            }
            if ((tag >> 3) != 1) {
                r = skip_bytes(fp, len); /* not a packet: Trace has no other fields */
                if (r != 0)
                    break;
                continue;
            }
            r = hp_grow((void **)&buf, &cap, (size_t)len + 1, 1);
            if (r < 0)
                break;
            if (fread(buf, 1, (size_t)len, fp) != (size_t)len) {
                r = ferror(fp) ? -EIO : -EAGAIN;
                break;
            }
            r = parse_packet(rd, buf, (size_t)len);
        } else {
            r = -EBADMSG;
        }
        if (r == 1)
            r = -EAGAIN;
        if (r != 0)
            break;
    }
    free(buf);
    if (r == 1 || r == -EAGAIN)
        return 0; /* clean end, or a truncated last packet */
    return r;
}

/* ---- result ---- */

static int finish(struct rd *rd)
{
    struct rp_trace *t = &rd->tp->pub;
    for (size_t i = 0; i < rd->n_procs; i++) {
        int r = resolve(rd, &rd->procs[i]);
        if (r < 0)
            return r;
    }
    /* Processes named by a process tree but never dumped are listed too. */
    size_t pos = 0;
    uint64_t key;
    void *val;
    const char *empty = intern(rd, "", 0);
    if (!empty)
        return -ENOMEM;
    while (hp_map_next(&rd->cmdlines, &pos, &key, &val)) {
        bool seen = false;
        for (size_t i = 0; i < rd->n_procs && !seen; i++)
            seen = rd->procs[i].pid == (int32_t)(uint32_t)key;
        if (rd->opt->pid && (int32_t)(uint32_t)key != rd->opt->pid)
            continue;
        if (!seen && !proc_get(rd, (int32_t)(uint32_t)key, empty))
            return -ENOMEM;
    }
    if (rd->n_procs) {
        t->processes = hp_arena_alloc(&rd->tp->arena, rd->n_procs * sizeof(*t->processes));
        if (!t->processes)
            return -ENOMEM;
    }
    for (size_t i = 0; i < rd->n_procs; i++) {
        const struct rd_proc *p = &rd->procs[i];
        const struct rd_header *h = &p->hdr;
        const char **cmd = hp_map_get(&rd->cmdlines, (uint64_t)(uint32_t)p->pid);
        t->processes[i] = (struct rp_trace_process){
            .pid = p->pid,
            .cmdline = cmd ? *cmd : empty,
            .heap_name = p->heap_name,
            .sampling_interval_bytes = h->sampling_interval_bytes,
            .timestamp = h->timestamp,
            .n_dumps = p->n_dumps,
            .from_startup = h->from_startup,
            .disconnected = h->disconnected,
            .buffer_overran = h->buffer_overran,
            .buffer_corrupted = h->buffer_corrupted,
            .hit_guardrail = h->hit_guardrail,
            .client_error = h->client_error,
            .writer_stalled = h->writer_stalled,
            .connection_closed_by_program = h->connection_closed_by_program,
            .unwinding_errors = h->unwinding_errors,
            .heap_samples = h->heap_samples,
            .map_reparses = h->map_reparses,
            .total_unwinding_time_us = h->total_unwinding_time_us,
            .client_spinlock_blocked_us = h->client_spinlock_blocked_us,
            .writer_stalls = h->writer_stalls,
            .stalled_records_skipped = h->stalled_records_skipped,
            .n_callsites = p->n_callsites,
            .callsites = p->callsites,
        };
    }
    t->n_processes = rd->n_procs;
    return 0;
}

static void rd_done(struct rd *rd)
{
    for (size_t i = 0; i < rd->n_seqs; i++) {
        chain_drop(rd->seqs[i]);
        free(rd->seqs[i]->chain);
        seq_tables_done(rd->seqs[i]);
        free(rd->seqs[i]);
    }
    free(rd->seqs);
    for (size_t i = 0; i < rd->n_procs; i++)
        free(rd->procs[i].raw);
    free(rd->procs);
    hp_map_done(&rd->cmdlines);
    free(rd->tmp);
}

/* Reads the trace from @fp (NULL: an empty trace). */
static int load_fp(FILE *fp, const struct rp_trace_options *opt, struct rp_trace **ret)
{
    static const struct rp_trace_options defaults = {0};
    struct trace_priv *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return -ENOMEM;
    tp->strings = hp_strtab_new();
    struct rd rd = {.opt = opt ? opt : &defaults, .tp = tp};
    hp_map_init(&rd.cmdlines, sizeof(const char *));
    int r = tp->strings ? (fp ? read_file(&rd, fp) : 0) : -ENOMEM;
    if (r == 0)
        r = finish(&rd);
    rd_done(&rd);
    if (r < 0) {
        rp_trace_free(&tp->pub);
        return r;
    }
    *ret = &tp->pub;
    return 0;
}

int rp_trace_load(const char *path, const struct rp_trace_options *opt, struct rp_trace **ret)
{
    FILE *fp = fopen(path, "rbe");
    if (!fp)
        return -errno;
    int r = load_fp(fp, opt, ret);
    fclose(fp);
    return r;
}

int rp_trace_load_buffer(const void *buf, size_t len, const struct rp_trace_options *opt,
                         struct rp_trace **ret)
{
    if (len == 0)
        return load_fp(NULL, opt, ret);
    FILE *fp = fmemopen((void *)buf, len, "rb");
    if (!fp)
        return -errno;
    int r = load_fp(fp, opt, ret);
    fclose(fp);
    return r;
}

struct rp_trace *rp_trace_free(struct rp_trace *t)
{
    if (!t)
        return NULL;
    struct trace_priv *tp = (struct trace_priv *)t;
    hp_strtab_free(tp->strings);
    hp_arena_done(&tp->arena);
    free(tp);
    return NULL;
}
