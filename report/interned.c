/* report/interned.c: the interning tables of a packet sequence (strings, mappings,
 * frames, callstacks), filled from TracePacket.interned_data and from the legacy
 * tables of Android Q's ProfilePackets.
 *
 * Every entry is copied into the sequence's arena, so the packet buffer can be reused;
 * id lists are capped (READ_MAX_COMPONENTS, READ_MAX_FRAMES) and strings cut
 * (READ_MAX_STRING_BYTES).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/pbwire.h"

/* ---- helpers ---- */

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

/* ---- tables ---- */

void rp__seq_tables_init(struct rd_seq *seq)
{
    for (int k = 0; k < STR_KINDS; k++)
        hp_map_init(&seq->strs[k], sizeof(struct rd_str));
    hp_map_init(&seq->mappings, sizeof(struct rd_mapping));
    hp_map_init(&seq->frames, sizeof(struct rd_frame));
    hp_map_init(&seq->callstacks, sizeof(struct rd_callstack));
    hp_map_init(&seq->path_cache, sizeof(struct rd_mapping_info));
    hp_map_init(&seq->resolved, sizeof(struct rd_stack));
}

void rp__seq_tables_done(struct rd_seq *seq)
{
    for (int k = 0; k < STR_KINDS; k++)
        hp_map_done(&seq->strs[k]);
    hp_map_done(&seq->mappings);
    hp_map_done(&seq->frames);
    hp_map_done(&seq->callstacks);
    hp_map_done(&seq->path_cache);
    hp_map_done(&seq->resolved);
    hp_arena_done(&seq->arena);
}

/* ---- interned data ---- */

int rp__parse_id_bytes(const uint8_t *buf, size_t len, uint32_t id_num, uint32_t bytes_num,
                       size_t max, uint64_t *ret_id, const uint8_t **ret_bytes, size_t *ret_len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t id = 0;
    const uint8_t *b = NULL;
    size_t blen = 0;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == id_num && f.wire_type == HP_PB_VARINT)
            id = f.varint;
        else if (f.num == bytes_num && f.wire_type == HP_PB_LEN) {
            b = f.ptr;
            blen = HP_MIN(f.len, max);
        }
    }
    if (it.error)
        return -EBADMSG;
    *ret_id = id;
    *ret_bytes = b;
    *ret_len = blen;
    return 0;
}

int rp__parse_varints(const uint8_t *buf, size_t len, const struct rd_varint *fields, size_t n,
                      void *dst)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        for (size_t i = 0; i < n; i++) {
            if (f.num == fields[i].num) {
                memcpy((uint8_t *)dst + fields[i].offset, &f.varint, sizeof(f.varint));
                break;
            }
        }
    }
    return it.error ? -EBADMSG : 0;
}

int rp__parse_string(struct rd_seq *seq, struct hp_map *table, const uint8_t *buf, size_t len)
{
    uint64_t iid;
    const uint8_t *s;
    size_t slen;
    int r = rp__parse_id_bytes(buf, len, PF_STRING(iid), PF_STRING(str), READ_MAX_STRING_BYTES,
                               &iid, &s, &slen);
    if (r < 0)
        return r;
    char *copy = hp_arena_strndup(&seq->arena, (const char *)s, slen);
    struct rd_str *slot;
    if (!copy || hp_map_put(table, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = (struct rd_str){.s = copy, .len = slen};
    return 0;
}

/* Collects the integers of repeated field @num of the message at @buf into rd->tmp, and
 * its varint field @iid_num. */
static int parse_ids(struct rd *rd, const uint8_t *buf, size_t len, uint32_t iid_num, uint32_t num,
                     size_t max, uint64_t *ret_iid, size_t *ret_n)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    size_t n = 0;
    bool err = false;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == iid_num && f.wire_type == HP_PB_VARINT) {
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

int rp__parse_mapping(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    uint64_t iid = 0;
    size_t n;
    int r = parse_ids(rd, buf, len, PF_MAPPING(iid), PF_MAPPING(path_string_ids),
                      READ_MAX_COMPONENTS, &iid, &n);
    if (r < 0)
        return r;
    static const struct rd_varint fields[] = {
        {PF_MAPPING(build_id), RD_U64(struct rd_mapping, build_id)},
        {PF_MAPPING(start), RD_U64(struct rd_mapping, start)},
        {PF_MAPPING(end), RD_U64(struct rd_mapping, end)},
        {PF_MAPPING(load_bias), RD_U64(struct rd_mapping, load_bias)},
        {PF_MAPPING(exact_offset), RD_U64(struct rd_mapping, exact_offset)},
    };
    struct rd_mapping m = {.comps = copy_ids(seq, rd->tmp, n), .n_comps = (uint32_t)n};
    r = rp__parse_varints(buf, len, fields, HP_ARRAY_SIZE(fields), &m);
    if (r < 0)
        return r;
    struct rd_mapping *slot;
    if ((n && !m.comps) || hp_map_put(&seq->mappings, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = m;
    hp_map_remove(&seq->path_cache, iid);
    return 0;
}

int rp__parse_callstack(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    uint64_t iid = 0;
    size_t n;
    int r = parse_ids(rd, buf, len, PF_CALLSTACK(iid), PF_CALLSTACK(frame_ids), READ_MAX_FRAMES,
                      &iid, &n);
    if (r < 0)
        return r;
    struct rd_callstack cs = {.frames = copy_ids(seq, rd->tmp, n), .n = n};
    struct rd_callstack *slot;
    if ((n && !cs.frames) || hp_map_put(&seq->callstacks, iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = cs;
    return 0;
}

int rp__parse_frame(struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct entry {
        uint64_t iid;
        struct rd_frame fr;
    };
    static const struct rd_varint fields[] = {
        {PF_FRAME(iid), RD_U64(struct entry, iid)},
        {PF_FRAME(function_name_id), RD_U64(struct entry, fr.name_id)},
        {PF_FRAME(mapping_id), RD_U64(struct entry, fr.mapping_id)},
        {PF_FRAME(rel_pc), RD_U64(struct entry, fr.rel_pc)},
    };
    struct entry e = {0};
    int r = rp__parse_varints(buf, len, fields, HP_ARRAY_SIZE(fields), &e);
    if (r < 0)
        return r;
    struct rd_frame *slot;
    if (hp_map_put(&seq->frames, e.iid, (void **)&slot) < 0)
        return -ENOMEM;
    *slot = e.fr;
    return 0;
}

int rp__parse_interned(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        int r = 0;
        switch (f.num) {
        case PF_INTERNED(function_names):
            r = rp__parse_string(seq, &seq->strs[STR_FUNCTION], f.ptr, f.len);
            break;
        case PF_INTERNED(frames):
            r = rp__parse_frame(seq, f.ptr, f.len);
            break;
        case PF_INTERNED(callstacks):
            r = rp__parse_callstack(rd, seq, f.ptr, f.len);
            break;
        case PF_INTERNED(build_ids):
            r = rp__parse_string(seq, &seq->strs[STR_BUILD_ID], f.ptr, f.len);
            break;
        case PF_INTERNED(mapping_paths):
            r = rp__parse_string(seq, &seq->strs[STR_PATH], f.ptr, f.len);
            break;
        case PF_INTERNED(mappings):
            r = rp__parse_mapping(rd, seq, f.ptr, f.len);
            break;
        }
        if (r < 0)
            return r;
    }
    return it.error ? -EBADMSG : 0;
}
