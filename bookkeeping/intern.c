/* bookkeeping/intern.c: the interning tables of a session (intern.h). */
#include "bookkeeping/intern.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/pbwire.h"
#include "protos/fields.h"

/* Callstacks are encoded with one-byte tags (emit_callstack). */
_Static_assert(PF_INTERNED(callstacks) < 16 && PF_CALLSTACK(iid) < 16 &&
                   PF_CALLSTACK(frame_ids) < 16,
               "one-byte tags");

int bk__intern_init(struct bk_intern *in)
{
    *in = (struct bk_intern){.unknown_mapping = -1, .seed = hp_hash_seed()};
    for (int k = 0; k < BK_STR_KINDS; k++)
        hp_idtab_init(&in->str[k].index);
    hp_idtab_init(&in->mapping_index);
    hp_idtab_init(&in->frame_index);
    hp_idtab_init(&in->cs_index);
    /* Slot 0 of every table: "" for strings, unused for the others (ids start at 1). */
    int r = 0;
    for (int k = 0; k < BK_STR_KINDS && r == 0; k++) {
        r = hp_grow((void **)&in->str[k].v, &in->str[k].cap, 1, sizeof(struct bk_str));
        if (r == 0) {
            in->str[k].v[0] = (struct bk_str){.s = "", .len = 0};
            in->str[k].n = 1;
            r = hp_idtab_add(&in->str[k].index, hp_hash_bytes("", 0, in->seed + (uint64_t)k), 0);
        }
    }
    if (r == 0)
        r = hp_grow((void **)&in->mappings, &in->cap_mappings, 1, sizeof(*in->mappings));
    if (r == 0)
        r = hp_grow((void **)&in->frames, &in->cap_frames, 1, sizeof(*in->frames));
    if (r == 0)
        r = hp_grow((void **)&in->nodes, &in->cap_nodes, 1, sizeof(*in->nodes));
    if (r < 0) {
        bk__intern_done(in);
        return r;
    }
    memset(&in->mappings[0], 0, sizeof(in->mappings[0]));
    memset(&in->frames[0], 0, sizeof(in->frames[0]));
    memset(&in->nodes[0], 0, sizeof(in->nodes[0]));
    in->n_mappings = in->n_frames = in->n_nodes = 1;
    return 0;
}

void bk__intern_done(struct bk_intern *in)
{
    for (size_t i = 0; in->stack_cache && i < BK_STACK_CACHE_SLOTS; i++)
        free(in->stack_cache[i].copy);
    free(in->stack_cache);
    for (int k = 0; k < BK_STR_KINDS; k++) {
        hp_idtab_done(&in->str[k].index);
        free(in->str[k].v);
    }
    hp_idtab_done(&in->mapping_index);
    hp_idtab_done(&in->frame_index);
    hp_idtab_done(&in->cs_index);
    free(in->mappings);
    free(in->frames);
    free(in->nodes);
    free(in->emit.p);
    free(in->emit.marks);
    hp_arena_done(&in->arena);
    *in = (struct bk_intern){.unknown_mapping = -1};
}

/* ---- strings ---- */

struct str_key {
    const char *s;
    size_t len;
};

static bool str_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct bk_strtab *t = ctx;
    const struct str_key *k = key;
    return t->v[id].len == k->len && memcmp(t->v[id].s, k->s, k->len) == 0;
}

int bk__intern_string(struct bk_intern *in, enum bk_str_kind kind, const char *s, size_t len,
                      uint32_t *ret_id)
{
    struct bk_strtab *t = &in->str[kind];
    if (len > BK_MAX_STRING_BYTES)
        len = BK_MAX_STRING_BYTES;
    struct str_key key = {.s = s ? s : "", .len = s ? len : 0};
    uint64_t h = hp_hash_bytes(key.s, key.len, in->seed + (uint64_t)kind);
    int64_t id = hp_idtab_find(&t->index, h, str_eq, t, &key);
    if (id >= 0) {
        *ret_id = (uint32_t)id;
        return 0;
    }
    if (t->n >= UINT32_MAX - 1)
        return -ENOMEM;
    int r = hp_grow((void **)&t->v, &t->cap, t->n + 1, sizeof(*t->v));
    if (r < 0)
        return r;
    char *copy = hp_arena_strndup(&in->arena, key.s, key.len);
    if (!copy)
        return -ENOMEM;
    uint32_t nid = (uint32_t)t->n;
    r = hp_idtab_add(&t->index, h, nid);
    if (r < 0)
        return r;
    t->v[nid] = (struct bk_str){.s = copy, .len = (uint32_t)key.len};
    t->n++;
    *ret_id = nid;
    return 0;
}

/* ---- mappings ---- */

struct mapping_key {
    const struct hp_mapping *m;
    const char *path;
    size_t path_len;
    uint32_t build_id;
};

static bool mapping_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct bk_intern *in = ctx;
    const struct mapping_key *k = key;
    const struct bk_mapping *e = &in->mappings[id];
    return e->start == k->m->start && e->end == k->m->end &&
           e->exact_offset == k->m->exact_offset && e->start_offset == k->m->start_offset &&
           e->load_bias == k->m->load_bias && e->build_id == k->build_id &&
           e->path_len == k->path_len && memcmp(e->path, k->path, k->path_len) == 0;
}

/* Splits @path at '/' (empty components are dropped) and interns each component. */
static int intern_path(struct bk_intern *in, const char *path, size_t len, uint32_t **ret_comps,
                       uint32_t *ret_n)
{
    uint32_t ids[BK_MAX_PATH_COMPONENTS];
    uint32_t n = 0;
    size_t i = 0;
    while (i < len && n < BK_MAX_PATH_COMPONENTS) {
        while (i < len && path[i] == '/')
            i++;
        size_t b = i;
        while (i < len && path[i] != '/')
            i++;
        if (i > b) {
            int r = bk__intern_string(in, BK_STR_PATH, path + b, i - b, &ids[n]);
            if (r < 0)
                return r;
            n++;
        }
    }
    uint32_t *comps = NULL;
    if (n) {
        comps = hp_arena_alloc(&in->arena, n * sizeof(*comps));
        if (!comps)
            return -ENOMEM;
        memcpy(comps, ids, n * sizeof(*comps));
    }
    *ret_comps = comps;
    *ret_n = n;
    return 0;
}

/* Whether @m has exactly the content of interned mapping @id. */
static bool mapping_same(const struct bk_intern *in, uint32_t id, const struct hp_mapping *m)
{
    const struct bk_mapping *e = &in->mappings[id];
    const struct bk_str *bid = &in->str[BK_STR_BUILD_ID].v[e->build_id];
    return e->start == m->start && e->end == m->end && e->exact_offset == m->exact_offset &&
           e->start_offset == m->start_offset && e->load_bias == m->load_bias &&
           bid->len == m->build_id_len && memcmp(bid->s, m->build_id, bid->len) == 0 && m->path &&
           memcmp(e->path, m->path, e->path_len) == 0 && m->path[e->path_len] == 0;
}

int bk__intern_mapping(struct bk_intern *in, const struct hp_mapping *m, uint32_t *ret_id)
{
    static const struct hp_mapping unknown = {.path = ""};
    if (!m && in->unknown_mapping >= 0) {
        *ret_id = (uint32_t)in->unknown_mapping;
        return 0;
    }
    struct bk_mapping_cache *slot = NULL;
    if (m) {
        slot = &in->mapping_cache[(hp_hash_u64((uintptr_t)m) >> 7) % BK_MAPPING_CACHE_SLOTS];
        if (slot->ptr == m && mapping_same(in, slot->id, m)) {
            *ret_id = slot->id;
            return 0;
        }
    }
    const struct hp_mapping *src = m ? m : &unknown;
    struct mapping_key key = {.m = src, .path = src->path ? src->path : ""};
    key.path_len = strnlen(key.path, BK_MAX_STRING_BYTES);
    uint32_t bid_len = HP_MIN(src->build_id_len, (uint32_t)HP_BUILD_ID_MAX);
    int r =
        bk__intern_string(in, BK_STR_BUILD_ID, (const char *)src->build_id, bid_len, &key.build_id);
    if (r < 0)
        return r;
    /* Keyed by the path's keyed hash: each step below mixes a keyed value. */
    uint64_t h = hp_hash_bytes(key.path, key.path_len, in->seed ^ ((uint64_t)key.build_id << 32));
    h = hp_hash_combine(h, src->start);
    h = hp_hash_combine(h, src->end);
    h = hp_hash_combine(h, src->exact_offset);
    h = hp_hash_combine(h, src->start_offset);
    h = hp_hash_combine(h, src->load_bias);
    int64_t id = hp_idtab_find(&in->mapping_index, h, mapping_eq, in, &key);
    if (id < 0) {
        if (in->n_mappings >= UINT32_MAX - 1)
            return -ENOMEM;
        r = hp_grow((void **)&in->mappings, &in->cap_mappings, in->n_mappings + 1,
                    sizeof(*in->mappings));
        if (r < 0)
            return r;
        struct bk_mapping e = {
            .start = src->start,
            .end = src->end,
            .exact_offset = src->exact_offset,
            .start_offset = src->start_offset,
            .load_bias = src->load_bias,
            .build_id = key.build_id,
            .path_len = (uint32_t)key.path_len,
        };
        uint32_t *comps;
        r = intern_path(in, key.path, key.path_len, &comps, &e.n_comps);
        if (r < 0)
            return r;
        e.comps = comps;
        e.path = hp_arena_strndup(&in->arena, key.path, key.path_len);
        if (!e.path)
            return -ENOMEM;
        id = (int64_t)in->n_mappings;
        r = hp_idtab_add(&in->mapping_index, h, (uint32_t)id);
        if (r < 0)
            return r;
        in->mappings[id] = e;
        in->n_mappings++;
    }
    if (!m)
        in->unknown_mapping = id;
    else
        *slot = (struct bk_mapping_cache){.ptr = m, .id = (uint32_t)id};
    *ret_id = (uint32_t)id;
    return 0;
}

/* ---- frames ---- */

struct frame_key {
    uint32_t mapping_id;
    uint64_t rel_pc;
    struct str_key name;
};

static bool frame_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct bk_intern *in = ctx;
    const struct frame_key *k = key;
    const struct bk_frame *e = &in->frames[id];
    return e->mapping_id == k->mapping_id && e->rel_pc == k->rel_pc &&
           str_eq(&in->str[BK_STR_FUNCTION], e->function_name_id, &k->name);
}

int bk__intern_frame(struct bk_intern *in, const struct hp_frame *f, uint32_t *ret_id)
{
    struct frame_key key = {.rel_pc = f->rel_pc};
    int r = bk__intern_mapping(in, f->map, &key.mapping_id);
    if (r < 0)
        return r;
    key.name.s = f->function_name ? f->function_name : "";
    key.name.len = strnlen(key.name.s, BK_MAX_STRING_BYTES);
    /* The name is not hashed: it almost never differs for one (mapping, pc). */
    uint64_t h = hp_hash_keyed2(in->seed, key.mapping_id, key.rel_pc);
    int64_t id = hp_idtab_find(&in->frame_index, h, frame_eq, in, &key);
    if (id >= 0) {
        *ret_id = (uint32_t)id;
        return 0;
    }
    if (in->n_frames >= UINT32_MAX - 1)
        return -ENOMEM;
    uint32_t name_id;
    r = bk__intern_string(in, BK_STR_FUNCTION, key.name.s, key.name.len, &name_id);
    if (r < 0)
        return r;
    r = hp_grow((void **)&in->frames, &in->cap_frames, in->n_frames + 1, sizeof(*in->frames));
    if (r < 0)
        return r;
    uint32_t nid = (uint32_t)in->n_frames;
    r = hp_idtab_add(&in->frame_index, h, nid);
    if (r < 0)
        return r;
    in->frames[nid] = (struct bk_frame){.rel_pc = key.rel_pc,
                                        .mapping_id = key.mapping_id,
                                        .function_name_id = name_id,
                                        .src_map = f->map};
    in->n_frames++;
    *ret_id = nid;
    return 0;
}

/* ---- callstack trie ---- */

struct node_key {
    uint32_t parent, frame_id;
};

static bool node_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct bk_intern *in = ctx;
    const struct node_key *k = key;
    return in->nodes[id].parent == k->parent && in->nodes[id].frame_id == k->frame_id;
}

int bk__intern_node(struct bk_intern *in, uint32_t parent, uint32_t frame_id, uint32_t *ret_id)
{
    struct node_key key = {.parent = parent, .frame_id = frame_id};
    uint64_t h = hp_hash_keyed2(in->seed, parent, frame_id);
    int64_t id = hp_idtab_find(&in->cs_index, h, node_eq, in, &key);
    if (id >= 0) {
        *ret_id = (uint32_t)id;
        return 0;
    }
    if (in->n_nodes >= UINT32_MAX - 1 || parent >= in->n_nodes)
        return -ENOMEM;
    int r = hp_grow((void **)&in->nodes, &in->cap_nodes, in->n_nodes + 1, sizeof(*in->nodes));
    if (r < 0)
        return r;
    uint32_t nid = (uint32_t)in->n_nodes;
    r = hp_idtab_add(&in->cs_index, h, nid);
    if (r < 0)
        return r;
    in->nodes[nid] = (struct bk_cs_node){
        .parent = parent, .frame_id = frame_id, .depth = in->nodes[parent].depth + 1};
    in->n_nodes++;
    *ret_id = nid;
    return 0;
}

/* A hash of the stack's pcs and mappings, for the stack cache (hits are confirmed by
 * comparing the frames, so it only needs to spread stacks over the sets). Four lanes
 * take every fourth frame each, xor it in and multiply: five instructions a frame, and
 * the lanes' multiplies overlap. The lanes and the order within each make the position
 * of a frame count; the final mix spreads every bit. */
static uint64_t stack_hash(uint64_t seed, const struct hp_frame *frames, size_t n)
{
    const uint64_t k = 0x9e3779b97f4a7c15ull;
    /* Lanes start from the seed, so which stacks share a set is not known outside. */
    uint64_t h0 = seed ^ n, h1 = h0 + 1, h2 = h0 + 2, h3 = h0 + 3;
    size_t i = 0;
#define STACK_HASH_MIX(h, f) (h) = ((h) ^ (f).rel_pc ^ ((uint64_t)(uintptr_t)(f).map << 20)) * k
    for (; i + 4 <= n; i += 4) {
        STACK_HASH_MIX(h0, frames[i]);
        STACK_HASH_MIX(h1, frames[i + 1]);
        STACK_HASH_MIX(h2, frames[i + 2]);
        STACK_HASH_MIX(h3, frames[i + 3]);
    }
    for (; i < n; i++)
        STACK_HASH_MIX(h0, frames[i]);
#undef STACK_HASH_MIX
    return hp_hash_u64(h0 ^ (h1 << 16 | h1 >> 48) ^ (h2 << 32 | h2 >> 32) ^ (h3 << 48 | h3 >> 16));
}

/* Appends callstack @cs with its @n frame ids (root first) to @em. */
static int emit_callstack(struct bk_emit *em, uint32_t cs, const uint32_t *fids, size_t n)
{
    /* Tag, a length of at most 3 bytes, iid and frame ids of at most 6 bytes each. */
    size_t bound = 4 + 6 * (n + 1);
    if (hp_grow((void **)&em->p, &em->cap, em->len + bound, 1) < 0)
        return -ENOMEM;
    if (em->n % BK_EMIT_MARK_EVERY == 0) {
        if (hp_grow((void **)&em->marks, &em->cap_marks, em->n_marks + 1, sizeof(*em->marks)) < 0)
            return -ENOMEM;
        em->marks[em->n_marks++] = em->len;
    }
    /* The body first, after room for the longest length; then moved in place. */
    uint8_t *start = em->p + em->len, *body = start + 4, *q = body;
    *q++ = PF_CALLSTACK(iid) << 3 | HP_PB_VARINT;
    q += hp_pb_put_varint(q, cs);
    for (size_t i = 0; i < n; i++) {
        *q++ = PF_CALLSTACK(frame_ids) << 3 | HP_PB_VARINT;
        q += hp_pb_put_varint(q, fids[i]);
    }
    size_t body_len = (size_t)(q - body);
    uint8_t hdr[4];
    hdr[0] = PF_INTERNED(callstacks) << 3 | HP_PB_LEN;
    size_t hlen = 1 + hp_pb_put_varint(hdr + 1, body_len);
    memmove(start + hlen, body, body_len);
    memcpy(start, hdr, hlen);
    em->len += hlen + body_len;
    em->n++;
    return 0;
}

void bk__intern_emit_written(struct bk_intern *in, size_t n, size_t off)
{
    struct bk_emit *em = &in->emit;
    if (n < em->n || off != em->len)
        return;
    /* All written: start over, and give back a buffer that a burst of new callstacks
     * made large. */
    em->len = em->n = em->n_marks = 0;
    if (em->cap > ((size_t)1 << 20)) {
        free(em->p);
        free(em->marks);
        em->p = NULL;
        em->marks = NULL;
        em->cap = em->cap_marks = 0;
    }
}

int bk__intern_emit_all(struct bk_intern *in)
{
    struct bk_emit *em = &in->emit;
    em->len = em->n = em->n_marks = 0;
    uint32_t fids[BK_MAX_DEPTH];
    for (size_t node = 1; node < in->n_nodes; node++) {
        if (!in->nodes[node].queued)
            continue;
        size_t k = bk__intern_callstack_frames(in, (uint32_t)node, fids);
        int r = emit_callstack(em, (uint32_t)node, fids, k);
        if (r < 0)
            return r;
    }
    return 0;
}

int bk__intern_emit_into(const struct bk_intern *in, struct bk_emit *em, uint32_t cs)
{
    uint32_t fids[BK_MAX_DEPTH];
    size_t k = bk__intern_callstack_frames(in, cs, fids);
    return emit_callstack(em, cs, fids, k);
}

/* Walks @frames (leaf first) through frame interning and the trie. */
static int intern_walk(struct bk_intern *in, const struct hp_frame *frames, size_t n,
                       uint32_t *ret_id)
{
    uint32_t fids[BK_MAX_DEPTH];
    uint32_t node = 0;
    size_t k = 0;
    for (size_t i = n; i-- > 0;) {
        int r = bk__intern_frame(in, &frames[i], &fids[k]);
        if (r == 0)
            r = bk__intern_node(in, node, fids[k], &node);
        if (r < 0)
            return r;
        k++;
    }
    if (!in->nodes[node].queued) {
        int r = emit_callstack(&in->emit, node, fids, k);
        if (r < 0)
            return r;
        in->nodes[node].queued = true;
    }
    *ret_id = node;
    return 0;
}

int bk__intern_stack(struct bk_intern *in, const struct hp_frame *frames, size_t n,
                     uint32_t *ret_id)
{
    static const struct hp_frame unknown_frame = {.function_name = ""};
    if (n == 0) {
        frames = &unknown_frame;
        n = 1;
    }
    if (n > BK_MAX_FRAMES)
        n = BK_MAX_FRAMES; /* keep the leaf side: it says who allocated */
    if (HP_UNLIKELY(!in->stack_cache && !in->stack_cache_failed)) {
        size_t bytes = BK_STACK_CACHE_SLOTS * sizeof(*in->stack_cache);
        in->stack_cache = aligned_alloc(64, bytes);
        if (in->stack_cache)
            memset(in->stack_cache, 0, bytes);
        in->stack_cache_failed = !in->stack_cache;
    }
    if (!in->stack_cache || n > BK_STACK_CACHE_FRAMES)
        return intern_walk(in, frames, n, ret_id);

    uint64_t hash = stack_hash(in->seed, frames, n);
    uint32_t tag = (uint32_t)(hash >> 32);
    struct bk_stack_cache_slot *set =
        &in->stack_cache[hash & (BK_STACK_CACHE_SLOTS - BK_STACK_CACHE_WAYS)];
    /* Ways in order of last use, most recent first. */
    for (int w = 0; w < BK_STACK_CACHE_WAYS; w++) {
        const struct bk_stack_cache_copy *c = set[w].copy;
        if (set[w].tag == tag && set[w].id && c->n == n &&
            memcmp(c->frames, frames, n * sizeof(*frames)) == 0) {
            struct bk_stack_cache_slot hit = set[w];
            memmove(&set[1], &set[0], (size_t)w * sizeof(*set));
            set[0] = hit;
            *ret_id = hit.id;
            return 0;
        }
    }
    uint32_t id;
    int r = intern_walk(in, frames, n, &id);
    if (r < 0)
        return r;
    /* The least recently used way makes room. */
    free(set[BK_STACK_CACHE_WAYS - 1].copy);
    memmove(&set[1], &set[0], (BK_STACK_CACHE_WAYS - 1) * sizeof(*set));
    struct bk_stack_cache_copy *copy = malloc(sizeof(*copy) + n * sizeof(*frames));
    if (copy) {
        copy->n = n;
        memcpy(copy->frames, frames, n * sizeof(*frames));
        set[0] = (struct bk_stack_cache_slot){.tag = tag, .id = id, .copy = copy};
    } else {
        set[0] = (struct bk_stack_cache_slot){0};
    }
    *ret_id = id;
    return 0;
}

int bk__intern_leaf(struct bk_intern *in, uint32_t cs, const struct hp_frame *leaf,
                    uint32_t *ret_id)
{
    uint32_t fid, node;
    int r = bk__intern_frame(in, leaf, &fid);
    if (r == 0)
        r = bk__intern_node(in, cs, fid, &node);
    if (r < 0)
        return r;
    if (!in->nodes[node].queued) {
        uint32_t fids[BK_MAX_DEPTH];
        size_t k = bk__intern_callstack_frames(in, node, fids);
        r = emit_callstack(&in->emit, node, fids, k);
        if (r < 0)
            return r;
        in->nodes[node].queued = true;
    }
    *ret_id = node;
    return 0;
}

size_t bk__intern_callstack_frames(const struct bk_intern *in, uint32_t cs, uint32_t *buf)
{
    size_t depth = cs < in->n_nodes ? in->nodes[cs].depth : 0;
    if (depth > BK_MAX_DEPTH)
        depth = BK_MAX_DEPTH;
    size_t i = depth;
    for (uint32_t n = cs; n && i > 0; n = in->nodes[n].parent)
        buf[--i] = in->nodes[n].frame_id;
    return depth;
}
