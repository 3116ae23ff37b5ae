/* preload/freeset.h: the set of sampled addresses still live, so that free() records only
 * frees of sampled allocations.
 *
 * A set that grows with the heap: up to CLIENT_FREESET_MAX_LEVELS lock-free
 * open-addressing tables (linear probing), the first of 2^log2_slots slots, each further
 * one CLIENT_FREESET_GROWTH times larger. A level is mmap'd the first time it is needed
 * (MAP_NORESERVE: pages are touched only as slots get used) and stays mapped for good.
 * Inserts go to the newest level; when it is half full or its probe bound is exhausted,
 * the thread that noticed maps the next level (the only system call, on the sampled path, once per
 * growth) and inserts there. Entries never move: a removal probes the levels newest
 * first. A slot holds 0 (empty), 1 (tombstone) or an address; inserts claim the first
 * empty or tombstone slot with a compare-and-swap, removals turn the slot into a
 * tombstone, so a probe chain never breaks. An insert fails only when every level is
 * full (2^28 slots at the last) or mapping one failed: the caller then drops the sample
 * (the set never goes into a mode where every free is recorded).
 *
 *     if (client_freeset_insert(&set, (uintptr_t)p) < 0) drop_sample();
 *     if (client_freeset_maybe(&set, p) && client_freeset_remove(&set, p)) record_free(p);
 *
 * In front of each level's table sits a filter of one byte per group of
 * 2^CLIENT_FREESET_LINE_LOG2 slots: a saturating 7-bit counter of the entries whose home
 * slot lies in that group, and a flag (CLIENT_FREESET_FILTER_DISPLACED) set for good once
 * an entry with its home there was stored past its home slot. The first level's filter
 * counts the entries of every level (by their home in the first level), so a free of an
 * unsampled address reads one counter (16 KiB of them, in cache) whatever the set's size.
 * A counter is raised before its entry is stored and lowered after it is removed; at 127
 * it stays (the tables are then probed). A removal in a group never displaced looks at
 * the home slot alone: an address whose home is there is at its home or not in the level.
 * (Tombstones are never emptied, so with time a probe for an absent address that shares
 * a group with a present one ran to CLIENT_FREESET_PROBES: 4 cache lines per such free.)
 *
 * Frees recorded in batches (preload/record.c, the malloc family's set only). A slot may
 * also hold an address with a tag: PENDING, the block was freed and its free is still to
 * be recorded (bits 48-63 name the batch that holds it and the batch's epoch), or
 * CLAIMED, a thread other than the batch's owner is recording it. The filters leave such
 * entries out (a free of the address, reused unsampled, passes by); they still take a
 * slot. Every such free is recorded once, by whoever moves its entry on:
 *
 *     retire  address -> PENDING    the free, before the real free
 *     commit  PENDING -> tombstone  the batch's owner, after it reserved the batch's record
 *     claim   PENDING -> CLAIMED    another thread (the session thread), before it reserves
 *     settle  CLAIMED -> tombstone  that thread, after it reserved (release)
 *     take    PENDING -> address    a sampled allocation of the address, whose record then
 *                                   carries the free first (WIRE_HEAD_FREE_FIRST)
 *
 * For every address the records are reserved in the order things happened:
 *   - a free's record comes after the free: a claim comes after the retire, the claimer's
 *     reservation after its claim; an entry carries the epoch of its owner's batch, and
 *     the owner commits only entries of the epoch it is recording, all retired by itself
 *     before it reserved (an entry of the same address retired later by another thread,
 *     which the owner's stale hint would otherwise find, has another tag);
 *   - a sampled allocation's record comes after the free of its address: the allocation
 *     takes the PENDING entry over (an owner that reserved already finds it changed and
 *     leaves it out of its record), waits while it is CLAIMED, or finds the tombstone
 *     (acquire), which the committer or settler left after its reservation.
 * A batch entry is only a hint of where to look: one whose free was taken or recorded by
 * another thread finds its slot changed and is left out.
 *
 * Thread-safe and hook-safe (atomics, mmap when growing, sched_yield while waiting for a
 * claim). Addresses must be neither 0 nor 1 and unique among live entries (true of live
 * heap blocks).
 */
#ifndef HP_PRELOAD_FREESET_H
#define HP_PRELOAD_FREESET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

#define CLIENT_FREESET_LOG2 19 /* first level: 2^19 slots, 4 MiB of address space */
/* Each level 8 times the previous: 2^19, 2^22, 2^25, 2^28 slots (the last 2 GiB of address
 * space, for 134 M live sampled blocks). Few levels keep a free's probes few. */
#define CLIENT_FREESET_GROWTH_LOG2 3
#define CLIENT_FREESET_MAX_LEVELS 4
/* A level takes inserts until about half of its slots are used (probes stay short), or
 * until an insert finds no room within CLIENT_FREESET_PROBES. The count is kept for the
 * addresses of one page in 2^CLIENT_FREESET_COUNT_LOG2 (and scaled), so that threads
 * seldom share its line. */
#define CLIENT_FREESET_COUNT_LOG2 6
#define CLIENT_FREESET_PROBES 32
#define CLIENT_FREESET_EMPTY 0u
#define CLIENT_FREESET_TOMB 1u
/* Tags of an address whose free is being recorded (see above). */
#define CLIENT_FREESET_PENDING 1u
#define CLIENT_FREESET_CLAIMED 2u
#define CLIENT_FREESET_TAGS 3u
/* A PENDING entry also says whose batch holds it (bits 48-63, above every user address of
 * a 4-level page table; addresses with any of them set are never batched). */
#define CLIENT_FREESET_TAG_SHIFT 48
#define CLIENT_FREESET_ADDR_BITS 0x0000fffffffffffcull
/* How often a sampled allocation yields to the holder of a claim on its address before it
 * gives up (its sample is dropped and counted). */
#define CLIENT_FREESET_CLAIM_WAIT_ROUNDS 200
/* One filter counter per 32 slots (4 cache lines): a 16 KiB filter for the first level,
 * small enough to stay in L1 next to the application's own data. A set whose frees are
 * far more than its live entries (python.objects: millions of frees a second, 10^4 live
 * samples) may take one per 8 (client_freeset_init_once()): at one per 32, about every
 * fourth free of an unsampled object found its counter raised and missed the cache on
 * the table; one in 14 at one per 8. */
#define CLIENT_FREESET_LINE_LOG2 5
#define CLIENT_FREESET_FILTER_COUNT 0x7fu
#define CLIENT_FREESET_FILTER_SAT 0x7fu
#define CLIENT_FREESET_FILTER_DISPLACED 0x80u

/* A level's table has 2^log2 + CLIENT_FREESET_SLACK slots: a home slot is below
 * 2^log2 + 255 and a probe never goes more than CLIENT_FREESET_PROBES past it, so no index
 * wraps (no mask on the fast path). */
#define CLIENT_FREESET_SLACK 512u

struct client_freeset_level {
    _Atomic uint64_t *slots;
    _Atomic uint8_t *filter; /* one counter per 2^line_log2 slots */
    unsigned shift;          /* 64 - log2: the page's place = page hash >> shift */
    unsigned line_log2;      /* the set's, CLIENT_FREESET_LINE_LOG2 unless told */
};

struct client_freeset {
    /* Read by every free() while profiling, with lv[0]: on one cache line. */
    _Alignas(64) _Atomic unsigned nlevels; /* levels in use, >= 1 after init */
    unsigned log2_slots;                   /* of lv[0] */
    unsigned line_log2;                    /* slots per filter counter, log2 */
    /* lv[0] is set by client_freeset_init(); lv[i > 0] is written by the thread that
     * maps it, before the release store of nlevels that publishes it. */
    struct client_freeset_level lv[CLIENT_FREESET_MAX_LEVELS];
    _Atomic bool growing; /* a thread is mapping the next level */
    /* Per level: entries whose hash has CLIENT_FREESET_COUNT_LOG2 low zero bits (about
     * one in 64), each on its own line. */
    struct {
        _Alignas(64) _Atomic int64_t n;
    } counted[CLIENT_FREESET_MAX_LEVELS];
};

/* Slots of a level of 2^log2_slots, and bytes of the one mapping holding them and their
 * filter. */
#define CLIENT_FREESET_SLOTS(log2_slots) (((size_t)1 << (log2_slots)) + CLIENT_FREESET_SLACK)
#define CLIENT_FREESET_MAP_BYTES(log2_slots, line_log2)                                            \
    (8 * CLIENT_FREESET_SLOTS(log2_slots) + (CLIENT_FREESET_SLOTS(log2_slots) >> (line_log2)))

/* Maps the first level (pre: log2_slots >= CLIENT_FREESET_LINE_LOG2); returns 0 or
 * -errno. */
int client_freeset_init(struct client_freeset *s, unsigned log2_slots) HP_WARN_UNUSED;
/* client_freeset_init() for a set that starts zeroed and may be first used by any of
 * several threads at once (hook-safe), with one filter counter per 2^@line_log2 slots
 * (2..CLIENT_FREESET_LINE_LOG2, <= log2_slots): 0 when the set is ready (now or before),
 * -EBUSY while another thread maps it, or -errno. */
int client_freeset_init_once(struct client_freeset *s, unsigned log2_slots,
                             unsigned line_log2) HP_WARN_UNUSED;
/* Empties the set for a new session, back to one level: every mapped level's pages are
 * dropped (zero again). Owner only, with no insert running; a late free() probing it
 * meanwhile finds nothing. */
void client_freeset_clear(struct client_freeset *s);
/* Returns 0, -ENOSPC when every level is full or -ENOMEM when the next level could not
 * be mapped. */
int client_freeset_insert(struct client_freeset *s, uint64_t addr) HP_WARN_UNUSED;
/* Removes @addr; returns true when it was in the set. Relaxed atomics are enough: an
 * address reaches the thread freeing it only through the application's own
 * synchronisation, which orders our insert before this removal. */
bool client_freeset_remove(struct client_freeset *s, uint64_t addr);
/* The PENDING entry of @addr in the batch of tag @tag (16 bits). */
static inline uint64_t client_freeset_pending(uint64_t addr, uint32_t tag)
{
    return addr | ((uint64_t)tag << CLIENT_FREESET_TAG_SHIFT) | CLIENT_FREESET_PENDING;
}
/* The slot that holds @addr (its level in @ret_level), or NULL: a look, no change. */
_Atomic uint64_t *client_freeset_find(struct client_freeset *s, uint64_t addr, unsigned *ret_level);
/* client_freeset_remove() of @addr found at @slot of level @level. */
bool client_freeset_remove_at(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                              uint64_t addr);
/* Turns @addr's entry at @slot of level @level into client_freeset_pending(@addr, @tag);
 * false when it holds @addr no more. */
bool client_freeset_retire_at(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                              uint64_t addr, uint32_t tag);
/* The level of @s whose table holds @slot, or -1 (a slot of another set). */
int client_freeset_slot_level(const struct client_freeset *s, const _Atomic uint64_t *slot);
/* The batch's owner, after it reserved its record: the PENDING entry @v in @slot (of
 * level @level) becomes a tombstone. False when @slot holds @v no more (taken, claimed,
 * recorded). */
bool client_freeset_commit(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                           uint64_t v);
/* Another thread, before it reserves its record: the PENDING entry @v in @slot becomes
 * CLAIMED. False when @slot holds @v no more. */
bool client_freeset_claim(_Atomic uint64_t *slot, uint64_t v);
/* After the claimer reserved its record: the CLAIMED entry of @addr in @slot (of level
 * @level) becomes a tombstone. */
void client_freeset_settle(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                           uint64_t addr);
/* client_freeset_insert() of a sampled address of the malloc family's set: 1 when it took
 * a PENDING free of @addr over (the caller's record must carry that free first), 0 when
 * inserted, -EBUSY when a claim on its free was held too long, or insert's errors. */
int client_freeset_insert_taking(struct client_freeset *s, uint64_t addr) HP_WARN_UNUSED;
/* Where an address lives: its 4 KiB page picks a place at random (the page number's
 * multiplicative hash, top bits), and the blocks of one page follow each other from there
 * (16-byte granules). Blocks allocated together usually share pages, so their slots and
 * filter counters share cache lines: at interval 1, where every block is in the set, a
 * random slot per block cost jq a cache miss per malloc and per free (exact mode 2.2x its
 * unprofiled time; 1.3-1.45x with this layout). */
static inline uint64_t client_freeset_page_hash(uint64_t addr)
{
    return (addr >> 12) * 0x9e3779b97f4a7c15ull;
}

/* Home slot of @addr (page hash @ph) in @lv. */
static inline uint64_t client_freeset_home(const struct client_freeset_level *lv, uint64_t ph,
                                           uint64_t addr)
{
    return (ph >> lv->shift) + ((addr >> 4) & 255);
}

/* False when @addr is certainly not in the set: one load of the first level's filter. */
static inline bool client_freeset_maybe(const struct client_freeset *s, uint64_t addr)
{
    const struct client_freeset_level *lv = &s->lv[0];
    uint64_t home = client_freeset_home(lv, client_freeset_page_hash(addr), addr);
    return (atomic_load_explicit(&lv->filter[home >> lv->line_log2], memory_order_relaxed) &
            CLIENT_FREESET_FILTER_COUNT) != 0;
}

#endif
