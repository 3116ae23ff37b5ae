/* preload/freeset.h: the set of sampled addresses still live, so that free() records only
 * frees of sampled allocations.
 *
 * A lock-free open-addressing table (linear probing) of 2^CLIENT_FREESET_LOG2 slots,
 * mmap'd once at the handshake and never freed. A slot holds 0 (empty), 1 (tombstone) or
 * an address. Inserts claim the first empty or tombstone slot with a compare-and-swap;
 * removals turn the slot into a tombstone, so a probe chain never breaks. Every operation
 * looks at most CLIENT_FREESET_PROBES slots; an insert that finds no room fails, and the
 * caller then records every free instead (correct, slower).
 *
 *     if (client_freeset_insert(&set, (uintptr_t)p) < 0) send_every_free = true;
 *     if (client_freeset_remove(&set, (uintptr_t)p)) record_free(p);
 *
 * In front of the table sits a filter of one saturating 8-bit counter per group of
 * 2^CLIENT_FREESET_LINE_LOG2 slots (the entries whose home slot lies in that group): a
 * free of an unsampled address usually reads only the filter, which stays in cache,
 * instead of a random line of the table. A counter is raised before its entry is
 * stored and lowered after it is removed; at 255 it stays (the table is then probed).
 *
 * Thread-safe and hook-safe (atomics only). Addresses must be neither 0 nor 1 and unique
 * among live entries (true of live heap blocks).
 */
#ifndef HP_PRELOAD_FREESET_H
#define HP_PRELOAD_FREESET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/macros.h"

#define CLIENT_FREESET_LOG2 19
#define CLIENT_FREESET_PROBES 32
#define CLIENT_FREESET_EMPTY 0u
#define CLIENT_FREESET_TOMB 1u
/* One filter counter per 32 slots (4 cache lines): a 16 KiB filter for the default
 * table, small enough to stay in L1 next to the application's own data. */
#define CLIENT_FREESET_LINE_LOG2 5
#define CLIENT_FREESET_FILTER_SAT 255u

struct client_freeset {
    _Atomic uint64_t *slots;
    _Atomic uint8_t *filter; /* slots >> CLIENT_FREESET_LINE_LOG2 counters, after the slots */
    uint64_t mask;
    unsigned shift; /* 64 - log2(slots) */
};

/* Bytes of the one mapping holding 2^log2_slots slots and their filter. */
#define CLIENT_FREESET_MAP_BYTES(log2_slots)                                                       \
    (((size_t)8 << (log2_slots)) + ((size_t)1 << ((log2_slots)-CLIENT_FREESET_LINE_LOG2)))

/* Lowers the filter counter of home slot @i (not below 0, never from saturation). */
void client_freeset_filter_dec(struct client_freeset *s, uint64_t i);

/* Sets every filter counter to saturation for good: every address then "maybe" is in the
 * set (for a caller that must see every free from now on). */
void client_freeset_saturate(struct client_freeset *s);

/* Maps the table (pre: log2_slots >= CLIENT_FREESET_LINE_LOG2); returns 0 or -errno. */
int client_freeset_init(struct client_freeset *s, unsigned log2_slots) HP_WARN_UNUSED;
/* Returns 0, or -ENOSPC when no slot within the probe bound is free. */
int client_freeset_insert(struct client_freeset *s, uint64_t addr) HP_WARN_UNUSED;

static inline uint64_t client_freeset_hash(const struct client_freeset *s, uint64_t addr)
{
    return ((addr >> 4) * 0x9e3779b97f4a7c15ull) >> s->shift;
}

/* False when @addr is certainly not in the set (its filter counter is 0): one load. */
static inline bool client_freeset_maybe(const struct client_freeset *s, uint64_t addr)
{
    uint64_t home = client_freeset_hash(s, addr);
    return atomic_load_explicit(&s->filter[home >> CLIENT_FREESET_LINE_LOG2],
                                memory_order_relaxed) != 0;
}

/* Removes @addr; returns true when it was in the set. Relaxed atomics are enough: an
 * address reaches the thread freeing it only through the application's own
 * synchronisation, which orders our insert before this removal. */
static inline bool client_freeset_remove(struct client_freeset *s, uint64_t addr)
{
    uint64_t home = client_freeset_hash(s, addr), i = home;
    if (HP_LIKELY(atomic_load_explicit(&s->filter[home >> CLIENT_FREESET_LINE_LOG2],
                                       memory_order_relaxed) == 0))
        return false;
    for (unsigned n = 0; n < CLIENT_FREESET_PROBES; n++, i = (i + 1) & s->mask) {
        uint64_t v = atomic_load_explicit(&s->slots[i], memory_order_relaxed);
        if (v == CLIENT_FREESET_EMPTY)
            return false;
        if (v == addr) {
            if (!atomic_compare_exchange_strong_explicit(&s->slots[i], &v, CLIENT_FREESET_TOMB,
                                                         memory_order_relaxed,
                                                         memory_order_relaxed))
                return false;
            client_freeset_filter_dec(s, home);
            return true;
        }
    }
    return false;
}

#endif
