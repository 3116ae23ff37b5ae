/* preload/freeset.c: see freeset.h. Hook-safe, and safe on the raw session thread
 * (preload/attach.c): raw system calls only, errno untouched. */
#include "preload/freeset.h"

#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "common/sys.h"

/* How often an insert that found no room yields to a thread mapping the next level. */
#define CLIENT_FREESET_GROW_WAIT_ROUNDS 200

static int freeset_map_level(struct client_freeset_level *lv, unsigned log2_slots,
                             unsigned line_log2)
{
    size_t bytes = CLIENT_FREESET_MAP_BYTES(log2_slots, line_log2);
    /* Pages are touched only as slots get used. */
    void *p = hp_sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_sys_failed((long)p))
        return (int)(long)p;
    lv->slots = p;
    lv->filter = (_Atomic uint8_t *)((char *)p + 8 * CLIENT_FREESET_SLOTS(log2_slots));
    lv->shift = 64 - log2_slots;
    lv->line_log2 = line_log2;
    return 0;
}

static unsigned freeset_level_log2(const struct client_freeset *s, unsigned i)
{
    return s->log2_slots + i * CLIENT_FREESET_GROWTH_LOG2;
}

int client_freeset_init(struct client_freeset *s, unsigned log2_slots)
{
    s->log2_slots = log2_slots;
    s->line_log2 = CLIENT_FREESET_LINE_LOG2;
    int r = freeset_map_level(&s->lv[0], log2_slots, s->line_log2);
    if (r < 0)
        return r;
    atomic_store_explicit(&s->growing, false, memory_order_relaxed);
    atomic_store_explicit(&s->nlevels, 1, memory_order_release);
    return 0;
}

int client_freeset_init_once(struct client_freeset *s, unsigned log2_slots, unsigned line_log2)
{
    /* Acquire pairs with the release store of nlevels below. */
    if (HP_LIKELY(atomic_load_explicit(&s->nlevels, memory_order_acquire) != 0))
        return 0;
    /* growing guards the first mapping as it guards the next ones: its holder is the only
     * thread that writes lv[] until it lets go. */
    bool expected = false;
    if (!atomic_compare_exchange_strong_explicit(&s->growing, &expected, true, memory_order_acquire,
                                                 memory_order_relaxed))
        return -EBUSY;
    int r = 0;
    if (atomic_load_explicit(&s->nlevels, memory_order_acquire) == 0) {
        r = freeset_map_level(&s->lv[0], log2_slots, line_log2);
        if (r == 0) {
            s->log2_slots = log2_slots;
            s->line_log2 = line_log2;
            atomic_store_explicit(&s->nlevels, 1, memory_order_release);
        }
    }
    atomic_store_explicit(&s->growing, false, memory_order_release);
    return r;
}

void client_freeset_clear(struct client_freeset *s)
{
    atomic_store_explicit(&s->nlevels, 1, memory_order_release);
    /* No insert runs now (freeset.h): a flag left set by a thread of the parent
     * that a fork copied mid-growth would keep the set from growing for good. */
    atomic_store_explicit(&s->growing, false, memory_order_relaxed);
    for (unsigned i = 0; i < CLIENT_FREESET_MAX_LEVELS; i++)
        if (s->lv[i].slots) {
            atomic_store_explicit(&s->counted[i].n, 0, memory_order_relaxed);
            (void)hp_sys3(SYS_madvise, (long)s->lv[i].slots,
                          (long)CLIENT_FREESET_MAP_BYTES(freeset_level_log2(s, i), s->line_log2),
                          MADV_DONTNEED);
        }
}

static void freeset_filter_inc(struct client_freeset_level *lv, uint64_t home)
{
    _Atomic uint8_t *c = &lv->filter[home >> lv->line_log2];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    while ((v & CLIENT_FREESET_FILTER_COUNT) != CLIENT_FREESET_FILTER_SAT &&
           !atomic_compare_exchange_weak_explicit(c, &v, (uint8_t)(v + 1), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* An entry whose home is in @home's group goes past its home slot: removals there must
 * probe. Set before the entry is stored (relaxed, as the rest: see freeset.h). */
static void freeset_filter_displace(struct client_freeset_level *lv, uint64_t home)
{
    _Atomic uint8_t *c = &lv->filter[home >> lv->line_log2];
    if (!(atomic_load_explicit(c, memory_order_relaxed) & CLIENT_FREESET_FILTER_DISPLACED))
        (void)atomic_fetch_or_explicit(c, CLIENT_FREESET_FILTER_DISPLACED, memory_order_relaxed);
}

static void freeset_filter_dec(struct client_freeset_level *lv, uint64_t home)
{
    _Atomic uint8_t *c = &lv->filter[home >> lv->line_log2];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    while ((v & CLIENT_FREESET_FILTER_COUNT) != 0 &&
           (v & CLIENT_FREESET_FILTER_COUNT) != CLIENT_FREESET_FILTER_SAT &&
           !atomic_compare_exchange_weak_explicit(c, &v, (uint8_t)(v - 1), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* Entries of one page in 2^CLIENT_FREESET_COUNT_LOG2 (middle bits of the page's hash; its
 * top bits pick the place). */
static bool freeset_counted(uint64_t ph)
{
    return ((ph >> 32) & ((1u << CLIENT_FREESET_COUNT_LOG2) - 1)) == 0;
}

/* True when level @i holds about half as many entries as it has slots. */
static bool freeset_level_full(const struct client_freeset *s, unsigned i)
{
    int64_t n = atomic_load_explicit(&s->counted[i].n, memory_order_relaxed);
    return (uint64_t)HP_MAX(n, 0) << CLIENT_FREESET_COUNT_LOG2 >
           ((uint64_t)1 << freeset_level_log2(s, i)) / 2;
}

/* The first level's filter counts the entries of every level: for those of a later level
 * it is raised and lowered too. */
static void freeset_summary_inc(struct client_freeset *s, unsigned level, uint64_t ph,
                                uint64_t addr)
{
    if (level > 0)
        freeset_filter_inc(&s->lv[0], client_freeset_home(&s->lv[0], ph, addr));
}

static void freeset_summary_dec(struct client_freeset *s, unsigned level, uint64_t ph,
                                uint64_t addr)
{
    if (level > 0)
        freeset_filter_dec(&s->lv[0], client_freeset_home(&s->lv[0], ph, addr));
}

/* An entry of level @level leaves the filters (it turned PENDING: frees of its address
 * need not look any more), or comes back (taken over by a sampled allocation). */
static void freeset_filters_dec(struct client_freeset *s, unsigned level, uint64_t ph,
                                uint64_t addr)
{
    freeset_filter_dec(&s->lv[level], client_freeset_home(&s->lv[level], ph, addr));
    freeset_summary_dec(s, level, ph, addr);
}

static void freeset_filters_inc(struct client_freeset *s, unsigned level, uint64_t ph,
                                uint64_t addr)
{
    freeset_summary_inc(s, level, ph, addr);
    freeset_filter_inc(&s->lv[level], client_freeset_home(&s->lv[level], ph, addr));
}

static int freeset_level_insert(struct client_freeset *s, unsigned level, uint64_t ph,
                                uint64_t addr)
{
    struct client_freeset_level *lv = &s->lv[level];
    uint64_t home = client_freeset_home(lv, ph, addr);
    /* Raised first: whoever can see the entry sees non-zero counters. */
    freeset_summary_inc(s, level, ph, addr);
    freeset_filter_inc(lv, home);
    for (uint64_t i = home; i < home + CLIENT_FREESET_PROBES; i++) {
        uint64_t v = atomic_load_explicit(&lv->slots[i], memory_order_relaxed);
        if (v != CLIENT_FREESET_EMPTY && v != CLIENT_FREESET_TOMB)
            continue;
        if (i != home)
            freeset_filter_displace(lv, home);
        if (atomic_compare_exchange_strong_explicit(&lv->slots[i], &v, addr, memory_order_relaxed,
                                                    memory_order_relaxed)) {
            if (freeset_counted(ph))
                atomic_fetch_add_explicit(&s->counted[level].n, 1, memory_order_relaxed);
            return 0;
        }
    }
    freeset_filter_dec(lv, home);
    freeset_summary_dec(s, level, ph, addr);
    return -ENOSPC;
}

/* The slot of level @level that holds @addr (page hash @ph), or NULL. */
static _Atomic uint64_t *freeset_level_find(struct client_freeset *s, unsigned level, uint64_t ph,
                                            uint64_t addr)
{
    struct client_freeset_level *lv = &s->lv[level];
    uint64_t home = client_freeset_home(lv, ph, addr);
    uint8_t f = atomic_load_explicit(&lv->filter[home >> lv->line_log2], memory_order_relaxed);
    if (HP_LIKELY((f & CLIENT_FREESET_FILTER_COUNT) == 0))
        return NULL;
    /* Never displaced here: @addr is at its home, or not in this level. */
    uint64_t probes = (f & CLIENT_FREESET_FILTER_DISPLACED) ? CLIENT_FREESET_PROBES : 1;
    for (uint64_t i = home; i < home + probes; i++) {
        uint64_t v = atomic_load_explicit(&lv->slots[i], memory_order_relaxed);
        if (v == CLIENT_FREESET_EMPTY)
            return NULL;
        if (v == addr)
            return &lv->slots[i];
    }
    return NULL;
}

/* The slot of an entry of @addr in level @level is a tombstone now: it counts no more. */
static void freeset_level_uncount(struct client_freeset *s, unsigned level, uint64_t ph)
{
    if (freeset_counted(ph))
        atomic_fetch_sub_explicit(&s->counted[level].n, 1, memory_order_relaxed);
}

_Atomic uint64_t *client_freeset_find(struct client_freeset *s, uint64_t addr, unsigned *ret_level)
{
    if (!client_freeset_maybe(s, addr))
        return NULL;
    uint64_t h = client_freeset_page_hash(addr);
    unsigned n = atomic_load_explicit(&s->nlevels, memory_order_acquire);
    /* Newest first: most frees are of recent blocks. */
    for (unsigned i = n; i-- > 0;) {
        _Atomic uint64_t *slot = freeset_level_find(s, i, h, addr);
        if (slot) {
            *ret_level = i;
            return slot;
        }
    }
    return NULL;
}

/* Level @n (the set has @n levels) for the next inserts. Returns 0 when the set has more
 * than @n levels now (mapped here or by another thread), -EBUSY while another thread
 * maps it, -ENOSPC at the last level, -ENOMEM when mapping failed. */
static int freeset_grow(struct client_freeset *s, unsigned n)
{
    if (n >= CLIENT_FREESET_MAX_LEVELS)
        return -ENOSPC;
    /* Acquire pairs with the release below: lv[n] is complete once seen. */
    if (atomic_exchange_explicit(&s->growing, true, memory_order_acquire))
        return -EBUSY;
    int r = 0;
    if (atomic_load_explicit(&s->nlevels, memory_order_acquire) == n) {
        /* Mapped by an earlier session of this slot: cleared at its end, reused. */
        if (!s->lv[n].slots)
            r = freeset_map_level(&s->lv[n], freeset_level_log2(s, n), s->line_log2);
        if (r == 0)
            atomic_store_explicit(&s->nlevels, n + 1, memory_order_release);
    }
    atomic_store_explicit(&s->growing, false, memory_order_release);
    return r;
}

int client_freeset_insert(struct client_freeset *s, uint64_t addr)
{
    uint64_t h = client_freeset_page_hash(addr);
    for (unsigned round = 0; round < CLIENT_FREESET_MAX_LEVELS; round++) {
        /* Acquire pairs with the release store publishing a level. */
        unsigned n = atomic_load_explicit(&s->nlevels, memory_order_acquire);
        if ((n == CLIENT_FREESET_MAX_LEVELS || !freeset_level_full(s, n - 1)) &&
            freeset_level_insert(s, n - 1, h, addr) == 0)
            return 0;
        int r = freeset_grow(s, n);
        if (r == 0)
            continue;
        /* Another thread is growing the set (or it cannot grow): any room will do. */
        for (unsigned i = n; i-- > 0;)
            if (freeset_level_insert(s, i, h, addr) == 0)
                return 0;
        if (r != -EBUSY)
            return r;
        /* No room anywhere before the new level: give the thread mapping it (perhaps
         * preempted) a moment. Bounded: it may be this very thread, interrupted by the
         * signal handler we run in. */
        for (unsigned k = 0; k < CLIENT_FREESET_GROW_WAIT_ROUNDS &&
                             atomic_load_explicit(&s->nlevels, memory_order_relaxed) == n;
             k++)
            (void)hp_sys0(SYS_sched_yield);
    }
    return -ENOSPC;
}

bool client_freeset_remove_at(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                              uint64_t addr)
{
    uint64_t v = addr;
    if (!atomic_compare_exchange_strong_explicit(slot, &v, CLIENT_FREESET_TOMB,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    uint64_t ph = client_freeset_page_hash(addr);
    freeset_filters_dec(s, level, ph, addr);
    freeset_level_uncount(s, level, ph);
    return true;
}

bool client_freeset_remove(struct client_freeset *s, uint64_t addr)
{
    unsigned level;
    _Atomic uint64_t *slot = client_freeset_find(s, addr, &level);
    return slot && client_freeset_remove_at(s, slot, level, addr);
}

bool client_freeset_retire_at(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                              uint64_t addr, uint32_t tag)
{
    uint64_t v = addr;
    if (!atomic_compare_exchange_strong_explicit(slot, &v, client_freeset_pending(addr, tag),
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    /* Frees of the address from here on (its block reused unsampled) pass by. */
    freeset_filters_dec(s, level, client_freeset_page_hash(addr), addr);
    return true;
}

int client_freeset_slot_level(const struct client_freeset *s, const _Atomic uint64_t *slot)
{
    unsigned n = atomic_load_explicit(&s->nlevels, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        const _Atomic uint64_t *first = s->lv[i].slots;
        if (first && slot >= first && slot < first + CLIENT_FREESET_SLOTS(freeset_level_log2(s, i)))
            return (int)i;
    }
    return -1;
}

bool client_freeset_commit(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                           uint64_t v)
{
    if (!atomic_compare_exchange_strong_explicit(slot, &v, CLIENT_FREESET_TOMB,
                                                 memory_order_release, memory_order_relaxed))
        return false;
    freeset_level_uncount(s, level, client_freeset_page_hash(v & CLIENT_FREESET_ADDR_BITS));
    return true;
}

bool client_freeset_claim(_Atomic uint64_t *slot, uint64_t v)
{
    return atomic_compare_exchange_strong_explicit(
        slot, &v, (v & ~(uint64_t)CLIENT_FREESET_TAGS) | CLIENT_FREESET_CLAIMED,
        memory_order_relaxed, memory_order_relaxed);
}

void client_freeset_settle(struct client_freeset *s, _Atomic uint64_t *slot, unsigned level,
                           uint64_t addr)
{
    /* Release: whoever finds the tombstone comes after our record (freeset.h). */
    atomic_store_explicit(slot, CLIENT_FREESET_TOMB, memory_order_release);
    freeset_level_uncount(s, level, client_freeset_page_hash(addr));
}

/* Finds an entry of @addr with a tag (PENDING or CLAIMED) in level @level: its slot and
 * value, or false. */
static bool freeset_level_find_tagged(struct client_freeset *s, unsigned level, uint64_t ph,
                                      uint64_t addr, _Atomic uint64_t **ret_slot, uint64_t *ret_v)
{
    struct client_freeset_level *lv = &s->lv[level];
    uint64_t home = client_freeset_home(lv, ph, addr);
    /* The filter's count leaves such entries out; its flag still tells where to look. */
    uint8_t f = atomic_load_explicit(&lv->filter[home >> lv->line_log2], memory_order_relaxed);
    uint64_t probes = (f & CLIENT_FREESET_FILTER_DISPLACED) ? CLIENT_FREESET_PROBES : 1;
    for (uint64_t i = home; i < home + probes; i++) {
        /* Acquire: a tombstone a claimer left is seen after its record (settle()). */
        uint64_t v = atomic_load_explicit(&lv->slots[i], memory_order_acquire);
        if (v == CLIENT_FREESET_EMPTY)
            return false;
        if ((v & CLIENT_FREESET_TAGS) && v != CLIENT_FREESET_TOMB &&
            (v & CLIENT_FREESET_ADDR_BITS) == addr) {
            *ret_slot = &lv->slots[i];
            *ret_v = v;
            return true;
        }
    }
    return false;
}

int client_freeset_insert_taking(struct client_freeset *s, uint64_t addr)
{
    uint64_t h = client_freeset_page_hash(addr);
    for (unsigned k = 0; k <= CLIENT_FREESET_CLAIM_WAIT_ROUNDS; k++) {
        _Atomic uint64_t *slot = NULL;
        uint64_t v = 0;
        unsigned level = 0;
        /* The filters leave such entries out: each level is looked at (its chain for
         * @addr, which the insert below walks too). */
        unsigned n = atomic_load_explicit(&s->nlevels, memory_order_acquire);
        for (unsigned i = n; i-- > 0 && !slot;)
            if (freeset_level_find_tagged(s, i, h, addr, &slot, &v))
                level = i;
        if (!slot) {
            int r = client_freeset_insert(s, addr);
            return r < 0 ? r : 0;
        }
        /* A free of @addr still to be recorded: ours now, recorded with our sample. Its
         * batch's owner, should it have reserved its record already, finds the entry
         * changed and leaves it out. */
        if ((v & CLIENT_FREESET_TAGS) == CLIENT_FREESET_PENDING) {
            /* Counted again first: whoever can see the entry sees the filter raised. */
            freeset_filters_inc(s, level, h, addr);
            if (atomic_compare_exchange_strong_explicit(slot, &v, addr, memory_order_relaxed,
                                                        memory_order_relaxed))
                return 1;
            freeset_filters_dec(s, level, h, addr);
            continue;
        }
        /* One being recorded (CLAIMED): its record must come first. Wait for the
         * tombstone (a claim is held for one reservation; its holder may be preempted). */
        if (k < CLIENT_FREESET_CLAIM_WAIT_ROUNDS)
            (void)hp_sys0(SYS_sched_yield);
    }
    return -EBUSY;
}
