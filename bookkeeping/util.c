#include "bookkeeping/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int bk__grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return -ENOMEM;
        n *= 2;
    }
    if (n > SIZE_MAX / elem)
        return -ENOMEM;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

uint64_t bk__hash_u64(uint64_t x)
{
    /* splitmix64's finalizer: every input bit affects every output bit. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t bk__hash_bytes(const void *p, size_t len, uint64_t seed)
{
    /* Eight bytes per step, each word mixed in with a multiply-rotate; the tail is
     * zero-padded, and the length goes into the final mix. */
    const unsigned char *s = p;
    const size_t total = len;
    uint64_t h = seed ^ 0x9e3779b97f4a7c15ull;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h = (h << 29) | (h >> 35);
        s += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, len);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return bk__hash_u64(h ^ (uint64_t)total);
}

/* ---- arena ---- */

struct bk_arena_chunk {
    struct bk_arena_chunk *next;
    size_t used, cap;
    _Alignas(8) unsigned char data[];
};

#define ARENA_CHUNK_BYTES (64 * 1024)

void *bk__arena_alloc(struct bk_arena *a, size_t n)
{
    n = HP_ALIGN_UP(n, (size_t)8);
    struct bk_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK_BYTES ? n : ARENA_CHUNK_BYTES;
        if (cap > SIZE_MAX - sizeof(*c))
            return NULL;
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->used = 0;
        c->cap = cap;
        /* A big block goes behind the current chunk so the chunk's free tail stays usable. */
        if (a->head && cap > ARENA_CHUNK_BYTES) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
        a->bytes += sizeof(*c) + cap;
    }
    void *r = c->data + c->used;
    c->used += n;
    return r;
}

char *bk__arena_strndup(struct bk_arena *a, const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *d = bk__arena_alloc(a, len + 1);
    if (!d)
        return NULL;
    if (len)
        memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void bk__arena_done(struct bk_arena *a)
{
    struct bk_arena_chunk *c = a->head;
    while (c) {
        struct bk_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->bytes = 0;
}

/* ---- map ---- */

void bk__map_init(struct bk_map *m, size_t val_size)
{
    *m = (struct bk_map){.val_size = HP_ALIGN_UP(val_size, (size_t)8)};
}

void bk__map_done(struct bk_map *m)
{
    free(m->keys);
    free(m->used);
    free(m->vals);
    bk__map_init(m, m->val_size);
}

static size_t map_find(const struct bk_map *m, uint64_t key, bool *ret_found)
{
    size_t mask = m->cap - 1;
    size_t i = bk__hash_u64(key) & mask;
    while (m->used[i]) {
        if (m->keys[i] == key) {
            *ret_found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
    *ret_found = false;
    return i;
}

void *bk__map_get(const struct bk_map *m, uint64_t key)
{
    if (!m->count)
        return NULL;
    bool found;
    size_t i = map_find(m, key, &found);
    return found ? m->vals + i * m->val_size : NULL;
}

static int map_rehash(struct bk_map *m, size_t cap)
{
    if (cap > SIZE_MAX / (m->val_size ? m->val_size : 1) || cap > SIZE_MAX / 8)
        return -ENOMEM;
    struct bk_map n = {.val_size = m->val_size, .cap = cap};
    n.keys = malloc(cap * sizeof(*n.keys));
    n.used = calloc(cap, 1);
    n.vals = malloc(cap * m->val_size + 1);
    if (!n.keys || !n.used || !n.vals) {
        free(n.keys);
        free(n.used);
        free(n.vals);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->used[i])
            continue;
        bool found;
        size_t j = map_find(&n, m->keys[i], &found);
        n.used[j] = 1;
        n.keys[j] = m->keys[i];
        memcpy(n.vals + j * n.val_size, m->vals + i * m->val_size, m->val_size);
    }
    n.count = m->count;
    free(m->keys);
    free(m->used);
    free(m->vals);
    *m = n;
    return 0;
}

int bk__map_put(struct bk_map *m, uint64_t key, void **ret_val)
{
    /* Load at most 13/16: linear probing with a mixing hash stays short there, and a
     * live allocation costs at most ~62 bytes of slots (25 bytes each). */
    if ((m->count + 1) * 16 > m->cap * 13) {
        int r = map_rehash(m, m->cap ? m->cap * 2 : 16);
        if (r < 0)
            return r;
    }
    bool found;
    size_t i = map_find(m, key, &found);
    void *v = m->vals + i * m->val_size;
    if (!found) {
        m->used[i] = 1;
        m->keys[i] = key;
        memset(v, 0, m->val_size);
        m->count++;
    }
    *ret_val = v;
    return found ? 0 : 1;
}

bool bk__map_remove(struct bk_map *m, uint64_t key)
{
    if (!m->count)
        return false;
    bool found;
    size_t i = map_find(m, key, &found);
    if (!found)
        return false;
    size_t mask = m->cap - 1;
    /* Backward-shift deletion: pull later members of the probe run into the hole when
     * their home slot does not lie cyclically in (hole, their slot]. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->used[j])
            break;
        size_t home = bk__hash_u64(m->keys[j]) & mask;
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        m->keys[i] = m->keys[j];
        memcpy(m->vals + i * m->val_size, m->vals + j * m->val_size, m->val_size);
        i = j;
    }
    m->used[i] = 0;
    m->count--;
    return true;
}

bool bk__map_next(const struct bk_map *m, size_t *pos, uint64_t *ret_key, void **ret_val)
{
    for (size_t i = *pos; i < m->cap; i++) {
        if (!m->used[i])
            continue;
        *ret_key = m->keys[i];
        *ret_val = m->vals + i * m->val_size;
        *pos = i + 1;
        return true;
    }
    *pos = m->cap;
    return false;
}

/* ---- idtab ---- */

void bk__idtab_init(struct bk_idtab *t)
{
    *t = (struct bk_idtab){0};
}

void bk__idtab_done(struct bk_idtab *t)
{
    free(t->slots);
    bk__idtab_init(t);
}

int64_t bk__idtab_find(const struct bk_idtab *t, uint64_t hash, bk_idtab_eq_fn eq, const void *ctx,
                       const void *key)
{
    if (!t->count)
        return -1;
    size_t mask = t->cap - 1;
    uint32_t h32 = (uint32_t)hash;
    for (size_t i = h32 & mask; t->slots[i].id; i = (i + 1) & mask) {
        if (t->slots[i].hash == h32 && eq(ctx, t->slots[i].id - 1, key))
            return t->slots[i].id - 1;
    }
    return -1;
}

/* Callers' hashes are already mixed, so the stored low half also picks the home slot. */
static void idtab_place(struct bk_idtab *t, struct bk_idtab_slot s)
{
    size_t mask = t->cap - 1;
    size_t i = s.hash & mask;
    while (t->slots[i].id)
        i = (i + 1) & mask;
    t->slots[i] = s;
}

int bk__idtab_add(struct bk_idtab *t, uint64_t hash, uint32_t id)
{
    if ((t->count + 1) * 4 > t->cap * 3) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(struct bk_idtab_slot))
            return -ENOMEM;
        struct bk_idtab n = {.cap = cap, .count = t->count};
        n.slots = calloc(cap, sizeof(*n.slots));
        if (!n.slots)
            return -ENOMEM;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i].id)
                idtab_place(&n, t->slots[i]);
        free(t->slots);
        *t = n;
    }
    idtab_place(t, (struct bk_idtab_slot){.hash = (uint32_t)hash, .id = id + 1});
    t->count++;
    return 0;
}
