/* report/resolve.c: resolution of a selected dump: callstack ids to frames, function
 * names, mapping paths (joined from their components) and build ids (as hex), all
 * interned in the trace, so the result outlives the sequence's tables.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

int rp__resolve(struct rd *rd, struct rd_proc *p)
{
    if (p->resolved || !p->selected)
        return 0;
    struct rd_seq *seq = p->seq;
    struct hp_arena *a = &rd->tp->arena;
    const char *empty = rp__intern(rd, "", 0);
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
                const char *n = rp__intern(rd, name->s, name->len);
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
int rp__resolve_seq(struct rd *rd, struct rd_seq *seq)
{
    for (size_t i = 0; i < rd->n_procs; i++) {
        if (rd->procs[i].seq == seq && !rd->procs[i].resolved) {
            int r = rp__resolve(rd, &rd->procs[i]);
            if (r < 0)
                return r;
        }
    }
    return 0;
}
