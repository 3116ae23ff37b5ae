/* common/containers.h: containers shared by the components of the service (bookkeeping,
 * report).
 *
 * - struct hp_arena: bump allocator for immutable bytes (strings, id lists) freed at once.
 * - struct hp_map: open-addressing hash map from a uint64_t key to a fixed-size value
 *   (linear probing, backward-shift deletion, so no tombstones pile up). Each slot holds
 *   its key and value side by side, so a lookup touches one cache line; the key
 *   UINT64_MAX marks an empty slot, and that key itself lives outside the table.
 * - struct hp_idtab: an index of uint32_t ids by content: the caller hashes the content
 *   and supplies the equality test, the table only stores ids and hashes. Used for
 *   interning, where the content lives in the caller's own arrays.
 *
 * Keys often come from untrusted input (a client's addresses and pcs, paths and symbol
 * names of its files, ids in a trace). An unkeyed hash lets such input pick keys that
 * share a slot, and every insert then walks one growing run: quadratic time, and the
 * bookkeeping thread stalls every client. So the hashing is keyed: each table draws its
 * own seed from hp_hash_seed() (derived from a secret read from getrandom(2) once per
 * process), an hp_map draws a new one when a probe runs long, and strings are hashed with
 * SipHash-1-3 under that secret. Probes are bounded too: an hp_map never places a key
 * more than HP_MAP_MAX_PROBE slots past its home slot (it rehashes under a new seed, or
 * refuses the key with -ENOSPC), and an hp_idtab refuses an id that would land further
 * than HP_IDTAB_MAX_PROBE. With random keys both bounds are far beyond the longest runs
 * (a few hundred slots in a table of 2^24 at the highest load); crafted keys cannot aim
 * at a seed they do not know.
 *
 *     struct hp_map m;
 *     hp_map_init(&m, sizeof(uint64_t));
 *     uint64_t *v;
 *     if (hp_map_put(&m, key, (void **)&v) >= 0) *v += 1;   // 1: new (zeroed), 0: found
 *     hp_map_done(&m);
 *
 * Not thread-safe; each container has one owner (hp_hash_seed() and hp_hash_bytes() are
 * thread-safe).
 */
#ifndef HP_COMMON_CONTAINERS_H
#define HP_COMMON_CONTAINERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

/* Grows the array *@p of *@cap elements of @elem bytes so it holds at least @need.
 * Returns 0 or -ENOMEM (then *@p and *@cap are unchanged). */
int hp_grow(void **p, size_t *cap, size_t need, size_t elem) HP_WARN_UNUSED;
/* The bytes an array of @n of @cap elements of @elem bytes grown by hp_grow() takes on
 * if @more elements are added: 0 while they fit; SIZE_MAX where hp_grow() would fail
 * (for memory budgets). */
size_t hp_grow_ahead(size_t n, size_t cap, size_t elem, size_t more);
/* Asks for huge pages under the 2 MiB-aligned part of [@p, @p + @bytes) when it has
 * some: large tables hit at random, or streamed through by dumps, then take fewer TLB
 * misses. Only a hint. */
void hp_advise_huge(void *p, size_t bytes);

/* splitmix64's finalizer: every input bit affects every output bit. Unkeyed and
 * invertible: anyone can compute inputs that collide, so keys from untrusted input go
 * through hp_hash_keyed() instead. */
static inline uint64_t hp_hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}
/* A new random seed for one table, from the process's secret (thread-safe; the first
 * call reads the secret). */
uint64_t hp_hash_seed(void);
/* @x under @seed: without the seed, which inputs share low bits cannot be told. */
static inline uint64_t hp_hash_keyed(uint64_t seed, uint64_t x)
{
    return hp_hash_u64(x ^ seed);
}
/* The pair (@a, @b) under @seed. Keyed as a whole: (a, b) and (a', b') collide only
 * when b ^ b' equals a difference of two keyed hashes, which depends on the seed. */
static inline uint64_t hp_hash_keyed2(uint64_t seed, uint64_t a, uint64_t b)
{
    return hp_hash_u64(hp_hash_keyed(seed, a) ^ b);
}
/* SipHash-1-3 of @p[0..len) keyed by the process's secret and @seed (a table's seed,
 * possibly plus a small constant to tell kinds of strings apart). Thread-safe. */
uint64_t hp_hash_bytes(const void *p, size_t len, uint64_t seed);
/* Mixes @v into @h. Unkeyed: for keys from untrusted input, @h must already be keyed. */
static inline uint64_t hp_hash_combine(uint64_t h, uint64_t v)
{
    return hp_hash_u64(h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}

struct hp_arena_chunk;
struct hp_arena {
    struct hp_arena_chunk *head;
    size_t bytes; /* allocated from the system, for accounting */
};

/* Returns @n bytes aligned to 8, valid until hp_arena_done(), or NULL. */
void *hp_arena_alloc(struct hp_arena *a, size_t n);
/* Copies @s[0..len) plus a NUL. */
char *hp_arena_strndup(struct hp_arena *a, const char *s, size_t len);
void hp_arena_done(struct hp_arena *a);

/* The furthest an hp_map key lies from its home slot, and an hp_idtab id on insert. */
#define HP_MAP_MAX_PROBE 1024
#define HP_IDTAB_MAX_PROBE 1024

struct hp_map {
    size_t val_size; /* bytes per value, rounded up to 8 */
    size_t stride;   /* bytes per slot: key + value */
    size_t cap;      /* slots, a power of two (0 before the first insert) */
    size_t count;    /* including the UINT64_MAX key */
    unsigned char *slots;
    bool has_max;           /* key UINT64_MAX is present ... */
    unsigned char *max_val; /* ... with this value */
    uint64_t seed;          /* drawn with the first slots, and anew by each rekey */
    size_t inserts;         /* since the last rehash: pays for a rehash on a long probe */
    uint64_t rekeys;        /* rehashes under a new seed forced by a long probe */
};

void hp_map_init(struct hp_map *m, size_t val_size);
void hp_map_done(struct hp_map *m);
/* Borrowed pointer to the value of @key, or NULL; valid until the next put or remove. */
void *hp_map_get(const struct hp_map *m, uint64_t key);
/* Finds or inserts @key; *@ret_val points to its value (zeroed when new). Returns 1 when
 * inserted, 0 when found, -ENOMEM, or -ENOSPC when @key would land more than
 * HP_MAP_MAX_PROBE slots from home even under a new seed (callers count it as a drop;
 * with keys not chosen against the seed it does not happen). The pointer is valid until
 * the next put or remove. */
int hp_map_put(struct hp_map *m, uint64_t key, void **ret_val) HP_WARN_UNUSED;
/* Starts loading the slot where @key would be, for a lookup soon after. Always inlined:
 * GCC counts a prefetch as no side effect, so a call it leaves out of line is a call of a
 * pure function whose result is unused, and it deletes the call. */
static HP_ALWAYS_INLINE void hp_map_prefetch(const struct hp_map *m, uint64_t key)
{
    if (m->cap)
        __builtin_prefetch(m->slots + (hp_hash_keyed(m->seed, key) & (m->cap - 1)) * m->stride);
}
/* Removes @key; returns whether it was present. */
bool hp_map_remove(struct hp_map *m, uint64_t key);
/* The bytes @m allocates (new slots, while the old ones are still held) if @more keys
 * are inserted: 0 while they fit without a rehash, the new slots of every doubling
 * otherwise (for memory budgets; SIZE_MAX past what can be counted). */
size_t hp_map_grow_ahead(const struct hp_map *m, size_t more);
/* The keys @m takes before its next doubling: hp_map_grow_ahead(m, hp_map_room(m) + 1)
 * is the cost of that doubling alone. */
size_t hp_map_room(const struct hp_map *m);
/* Removes the entry whose value @val is (as returned by hp_map_get() or hp_map_put()
 * since the last change of the map): saves the second lookup of get-then-remove. */
void hp_map_remove_value(struct hp_map *m, void *val);
/* Iteration: start with *@pos = 0; returns false at the end. */
bool hp_map_next(const struct hp_map *m, size_t *pos, uint64_t *ret_key, void **ret_val);

typedef bool (*hp_idtab_eq_fn)(const void *ctx, uint32_t id, const void *key);

struct hp_idtab_slot {
    uint32_t hash; /* low half of the content hash */
    uint32_t id;   /* id + 1; 0 marks an empty slot */
};

struct hp_idtab {
    size_t cap, count;
    struct hp_idtab_slot *slots;
};

void hp_idtab_init(struct hp_idtab *t);
void hp_idtab_done(struct hp_idtab *t);
/* Returns the id whose content equals @key (by @eq), or -1. @hash must be keyed (by a
 * seed from hp_hash_seed()) when the content comes from untrusted input. */
int64_t hp_idtab_find(const struct hp_idtab *t, uint64_t hash, hp_idtab_eq_fn eq, const void *ctx,
                      const void *key);
/* Adds @id under @hash. Returns 0, -ENOMEM, or -ENOSPC when the id would land more than
 * HP_IDTAB_MAX_PROBE slots from its home (not added). pre: no equal content is indexed
 * yet; id < UINT32_MAX. */
int hp_idtab_add(struct hp_idtab *t, uint64_t hash, uint32_t id) HP_WARN_UNUSED;
/* As hp_map_grow_ahead(), for @more ids added to @t. */
size_t hp_idtab_grow_ahead(const struct hp_idtab *t, size_t more);

#endif
