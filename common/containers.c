/* common/containers.c: hash map, arena and id table (containers.h). */
#include "common/containers.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void hp_advise_huge(void *p, size_t bytes)
{
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (bytes < 2 * huge)
        return;
    uintptr_t start = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_HUGEPAGE); /* a hint; may fail */
}

/* @a + @b, or SIZE_MAX past it. */
static size_t add_sat(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* The bytes of the new slot arrays a hash table of @count entries in @cap slots of @elem
 * bytes allocates if @more entries are added, when it doubles (from @first slots) as
 * soon as it would be fuller than @num/@den; SIZE_MAX where that cannot be counted. */
static size_t table_grow_ahead(size_t count, size_t cap, size_t elem, size_t more, size_t num,
                               size_t den, size_t first)
{
    size_t need = add_sat(count, more);
    if (need > SIZE_MAX / den)
        return SIZE_MAX;
    size_t bytes = 0;
    while (need * den > cap * num) {
        cap = cap ? cap * 2 : first;
        if (cap > SIZE_MAX / 2 / elem)
            return SIZE_MAX;
        bytes += cap * elem; /* at most 2 * cap * elem in all */
    }
    return bytes;
}

size_t hp_grow_ahead(size_t n, size_t cap, size_t elem, size_t more)
{
    size_t need = add_sat(n, more);
    if (need <= cap)
        return 0;
    /* As hp_grow(); where it would fail, as much as can be counted. */
    size_t to = cap ? cap : 16;
    while (to < need) {
        if (to > SIZE_MAX / 2)
            return SIZE_MAX;
        to *= 2;
    }
    if (elem && to - cap > SIZE_MAX / elem)
        return SIZE_MAX;
    return (to - cap) * elem;
}

int hp_grow(void **p, size_t *cap, size_t need, size_t elem)
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
    hp_advise_huge(q, n * elem);
    *p = q;
    *cap = n;
    return 0;
}

/* ---- keyed hashing ---- */

static pthread_once_t s_secret_once = PTHREAD_ONCE_INIT;
static uint64_t s_secret[2];     /* written once, under s_secret_once */
static _Atomic uint64_t s_seeds; /* seeds handed out; only needs to be unique */

static void secret_init(void)
{
    uint64_t k[2] = {0, 0};
    size_t got = 0;
    while (got < sizeof(k)) {
        ssize_t n = getrandom((char *)k + got, sizeof(k) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof(k)) {
        /* No getrandom (a seccomp filter, an old kernel): what differs between runs is
         * better than a constant the attacker knows. */
        struct timespec a, b;
        clock_gettime(CLOCK_REALTIME, &a);
        clock_gettime(CLOCK_MONOTONIC, &b);
        k[0] ^= hp_hash_u64((uint64_t)a.tv_nsec ^ ((uint64_t)a.tv_sec << 30) ^ (uint64_t)getpid());
        k[1] ^= hp_hash_u64((uint64_t)b.tv_nsec ^ ((uint64_t)b.tv_sec << 30) ^ (uintptr_t)&a ^
                            (uintptr_t)&secret_init);
    }
    s_secret[0] = k[0];
    s_secret[1] = k[1];
}

static inline uint64_t rotl64(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND(v0, v1, v2, v3)                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl64(v1, 13);                                                                       \
        v1 ^= v0;                                                                                  \
        v0 = rotl64(v0, 32);                                                                       \
        v2 += v3;                                                                                  \
        v3 = rotl64(v3, 16);                                                                       \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl64(v3, 21);                                                                       \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl64(v1, 17);                                                                       \
        v1 ^= v2;                                                                                  \
        v2 = rotl64(v2, 32);                                                                       \
    } while (0)

/* SipHash-1-3 (one round per word, three to finish) of @p[0..len) under (@k0, @k1):
 * a keyed pseudo-random function, so collisions cannot be computed without the key. */
static uint64_t siphash13(uint64_t k0, uint64_t k1, const void *p, size_t len)
{
    const unsigned char *s = p;
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
    const uint64_t tail_len = (uint64_t)len << 56;
    while (len >= 8) {
        uint64_t m;
        memcpy(&m, s, 8); /* little-endian: the project is x86_64 first */
        v3 ^= m;
        SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
        s += 8;
        len -= 8;
    }
    uint64_t m = 0;
    memcpy(&m, s, len);
    m |= tail_len;
    v3 ^= m;
    SIPROUND(v0, v1, v2, v3);
    v0 ^= m;
    v2 ^= 0xff;
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t hp_hash_seed(void)
{
    (void)pthread_once(&s_secret_once, secret_init);
    uint64_t n = atomic_fetch_add_explicit(&s_seeds, 1, memory_order_relaxed);
    return siphash13(s_secret[0], ~s_secret[1], &n, sizeof(n));
}

uint64_t hp_hash_bytes(const void *p, size_t len, uint64_t seed)
{
    (void)pthread_once(&s_secret_once, secret_init);
    return siphash13(s_secret[0] ^ seed, s_secret[1], p, len);
}

/* ---- arena ---- */

struct hp_arena_chunk {
    struct hp_arena_chunk *next;
    size_t used, cap;
    _Alignas(8) unsigned char data[];
};

#define ARENA_CHUNK_BYTES (64 * 1024)

void *hp_arena_alloc(struct hp_arena *a, size_t n)
{
    n = HP_ALIGN_UP(n, (size_t)8);
    struct hp_arena_chunk *c = a->head;
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

char *hp_arena_strndup(struct hp_arena *a, const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *d = hp_arena_alloc(a, len + 1);
    if (!d)
        return NULL;
    if (len)
        memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void hp_arena_done(struct hp_arena *a)
{
    struct hp_arena_chunk *c = a->head;
    while (c) {
        struct hp_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->bytes = 0;
}

/* ---- map ---- */

#define MAP_EMPTY UINT64_MAX

static inline uint64_t *slot_key(const struct hp_map *m, size_t i)
{
    return (uint64_t *)(void *)(m->slots + i * m->stride);
}

static inline void *slot_val(const struct hp_map *m, size_t i)
{
    return m->slots + i * m->stride + sizeof(uint64_t);
}

void hp_map_init(struct hp_map *m, size_t val_size)
{
    size_t v = HP_ALIGN_UP(val_size, (size_t)8);
    *m = (struct hp_map){.val_size = v, .stride = v + sizeof(uint64_t)};
}

void hp_map_done(struct hp_map *m)
{
    free(m->slots);
    free(m->max_val);
    hp_map_init(m, m->val_size);
}

static inline size_t map_home(const struct hp_map *m, uint64_t key)
{
    return hp_hash_keyed(m->seed, key) & (m->cap - 1);
}

/* The slot of @key (*@ret_found true), else the empty slot where it would go; SIZE_MAX
 * when there is none within HP_MAP_MAX_PROBE slots of its home. Every key lies within
 * that distance (hp_map_put() and map_rehash() see to it), so the search stops there. */
static size_t map_find(const struct hp_map *m, uint64_t key, bool *ret_found)
{
    size_t mask = m->cap - 1;
    size_t i = map_home(m, key);
    *ret_found = false;
    for (size_t d = 0; d <= HP_MAP_MAX_PROBE; d++) {
        uint64_t k = *slot_key(m, i);
        if (k == key) {
            *ret_found = true;
            return i;
        }
        if (k == MAP_EMPTY)
            return i;
        i = (i + 1) & mask;
    }
    return SIZE_MAX;
}

void *hp_map_get(const struct hp_map *m, uint64_t key)
{
    if (HP_UNLIKELY(key == MAP_EMPTY))
        return m->has_max ? m->max_val : NULL;
    if (!m->cap)
        return NULL;
    bool found;
    size_t i = map_find(m, key, &found);
    return found ? slot_val(m, i) : NULL;
}

/* Moves every entry into @cap slots, under a fresh seed when @rekey (or when the map has
 * none yet). Growth keeps the seed: entries then move in slot order to nearby slots of
 * the new table, which a new seed would scatter (a cache miss each: +5% on the
 * bookkeeping bench). A seed that leaves some key too far from home is replaced (every
 * fourth try also doubles the slots); with random keys the first one almost always
 * places them all. */
static int map_rehash(struct hp_map *m, size_t cap, bool rekey)
{
    for (unsigned attempt = 1;; attempt++) {
        if (cap > SIZE_MAX / m->stride)
            return -ENOMEM;
        struct hp_map n = *m;
        n.cap = cap;
        if (rekey || attempt > 1 || !m->cap)
            n.seed = hp_hash_seed();
        n.inserts = 0;
        n.slots = malloc(cap * m->stride);
        if (!n.slots)
            return -ENOMEM;
        hp_advise_huge(n.slots, cap * m->stride);
        for (size_t i = 0; i < cap; i++)
            *slot_key(&n, i) = MAP_EMPTY;
        bool placed = true;
        for (size_t i = 0; i < m->cap && placed; i++) {
            uint64_t k = *slot_key(m, i);
            if (k == MAP_EMPTY)
                continue;
            bool found;
            size_t j = map_find(&n, k, &found);
            if (j == SIZE_MAX)
                placed = false;
            else
                memcpy(n.slots + j * n.stride, m->slots + i * m->stride, m->stride);
        }
        if (placed) {
            free(m->slots);
            *m = n;
            return 0;
        }
        free(n.slots);
        if (attempt % 4 == 0) {
            if (cap > SIZE_MAX / 2)
                return -ENOMEM;
            cap *= 2;
        }
    }
}

int hp_map_put(struct hp_map *m, uint64_t key, void **ret_val)
{
    if (HP_UNLIKELY(key == MAP_EMPTY)) {
        if (m->has_max) {
            *ret_val = m->max_val;
            return 0;
        }
        if (!m->max_val && !(m->max_val = malloc(m->val_size ? m->val_size : 1)))
            return -ENOMEM;
        memset(m->max_val, 0, m->val_size);
        m->has_max = true;
        m->count++;
        *ret_val = m->max_val;
        return 1;
    }
    /* Load at most 13/16: linear probing with a mixing hash stays short there, and a
     * live allocation costs at most ~59 bytes of slots (24 bytes each). */
    if ((m->count + 1) * 16 > m->cap * 13) {
        int r = map_rehash(m, m->cap ? m->cap * 2 : 16, false);
        if (r < 0)
            return r;
    }
    bool found;
    size_t i = map_find(m, key, &found);
    if (HP_UNLIKELY(i == SIZE_MAX)) {
        /* A run longer than random keys make: rehash under a new seed, but at most once
         * per cap/16 inserts, so that keys made to collide under any seed cost a
         * bounded amortised time; past that the key is refused. */
        if (m->inserts < m->cap / 16)
            return -ENOSPC;
        int r = map_rehash(m, m->cap, true);
        if (r < 0)
            return r;
        m->rekeys++;
        i = map_find(m, key, &found);
        if (i == SIZE_MAX)
            return -ENOSPC;
    }
    void *v = slot_val(m, i);
    if (!found) {
        *slot_key(m, i) = key;
        memset(v, 0, m->val_size);
        m->count++;
        m->inserts++;
    }
    *ret_val = v;
    return found ? 0 : 1;
}

/* Empties slot @i by backward-shift deletion: later members of the probe run move into
 * the hole when their home slot does not lie cyclically in (hole, their slot]. */
static void map_remove_at(struct hp_map *m, size_t i)
{
    size_t mask = m->cap - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t k = *slot_key(m, j);
        if (k == MAP_EMPTY)
            break;
        size_t home = map_home(m, k);
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        memcpy(m->slots + i * m->stride, m->slots + j * m->stride, m->stride);
        i = j;
    }
    *slot_key(m, i) = MAP_EMPTY;
    m->count--;
}

size_t hp_map_room(const struct hp_map *m)
{
    size_t fit = m->cap / 16 * 13; /* cap is 0 or a power of two >= 16 */
    return fit > m->count ? fit - m->count : 0;
}

size_t hp_map_grow_ahead(const struct hp_map *m, size_t more)
{
    /* As hp_map_put(): a map that would be fuller than 13/16 doubles, and its old slots
     * are freed once the new ones are filled. */
    return table_grow_ahead(m->count, m->cap, m->stride, more, 13, 16, 16);
}

bool hp_map_remove(struct hp_map *m, uint64_t key)
{
    if (HP_UNLIKELY(key == MAP_EMPTY)) {
        if (!m->has_max)
            return false;
        m->has_max = false;
        m->count--;
        return true;
    }
    if (!m->cap)
        return false;
    bool found;
    size_t i = map_find(m, key, &found);
    if (!found)
        return false;
    map_remove_at(m, i);
    return true;
}

void hp_map_remove_value(struct hp_map *m, void *val)
{
    if (HP_UNLIKELY(val == m->max_val)) {
        m->has_max = false;
        m->count--;
        return;
    }
    size_t i = (size_t)((unsigned char *)val - m->slots) / m->stride;
    map_remove_at(m, i);
}

bool hp_map_next(const struct hp_map *m, size_t *pos, uint64_t *ret_key, void **ret_val)
{
    for (size_t i = *pos; i < m->cap; i++) {
        uint64_t k = *slot_key(m, i);
        if (k == MAP_EMPTY)
            continue;
        *ret_key = k;
        *ret_val = slot_val(m, i);
        *pos = i + 1;
        return true;
    }
    if (*pos <= m->cap && m->has_max) {
        *ret_key = MAP_EMPTY;
        *ret_val = m->max_val;
        *pos = m->cap + 1;
        return true;
    }
    *pos = m->cap + 1;
    return false;
}

/* ---- idtab ---- */

void hp_idtab_init(struct hp_idtab *t)
{
    *t = (struct hp_idtab){0};
}

void hp_idtab_done(struct hp_idtab *t)
{
    free(t->slots);
    hp_idtab_init(t);
}

int64_t hp_idtab_find(const struct hp_idtab *t, uint64_t hash, hp_idtab_eq_fn eq, const void *ctx,
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

/* Callers' hashes are already mixed (and keyed), so the stored low half also picks the
 * home slot. */
static void idtab_place(struct hp_idtab *t, struct hp_idtab_slot s)
{
    size_t mask = t->cap - 1;
    size_t i = s.hash & mask;
    while (t->slots[i].id)
        i = (i + 1) & mask;
    t->slots[i] = s;
}

size_t hp_idtab_grow_ahead(const struct hp_idtab *t, size_t more)
{
    /* As hp_idtab_add(): a table that would be fuller than 3/4 doubles. */
    return table_grow_ahead(t->count, t->cap, sizeof(struct hp_idtab_slot), more, 3, 4, 64);
}

int hp_idtab_add(struct hp_idtab *t, uint64_t hash, uint32_t id)
{
    if ((t->count + 1) * 4 > t->cap * 3) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(struct hp_idtab_slot))
            return -ENOMEM;
        struct hp_idtab n = {.cap = cap, .count = t->count};
        n.slots = calloc(cap, sizeof(*n.slots));
        if (!n.slots)
            return -ENOMEM;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i].id)
                idtab_place(&n, t->slots[i]);
        free(t->slots);
        *t = n;
    }
    /* Probe first: an id past the bound is refused, never placed. */
    size_t mask = t->cap - 1;
    size_t i = (uint32_t)hash & mask;
    for (size_t d = 0; t->slots[i].id; d++, i = (i + 1) & mask)
        if (d >= HP_IDTAB_MAX_PROBE)
            return -ENOSPC;
    t->slots[i] = (struct hp_idtab_slot){.hash = (uint32_t)hash, .id = id + 1};
    t->count++;
    return 0;
}
