/* tests/preload/test_freeset.c: the sampled-address set (preload/freeset.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/freeset.h"

static uint64_t line_of(const struct client_freeset *s, unsigned level, uint64_t addr)
{
    return client_freeset_home(&s->lv[level], client_freeset_page_hash(addr), addr) >> s->line_log2;
}

static size_t filter_len(const struct client_freeset *s, unsigned level)
{
    return CLIENT_FREESET_SLOTS(s->log2_slots + level * CLIENT_FREESET_GROWTH_LOG2) >> s->line_log2;
}

static void test_freeset_insert_remove(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);

    for (uint64_t i = 1; i <= 1000; i++)
        assert_int_equal(client_freeset_insert(&s, i * 16 + 0x10000), 0);
    for (uint64_t i = 1; i <= 1000; i++)
        assert_true(client_freeset_remove(&s, i * 16 + 0x10000));
    /* Gone, and never there. */
    for (uint64_t i = 1; i <= 1000; i++)
        assert_false(client_freeset_remove(&s, i * 16 + 0x10000));
    assert_false(client_freeset_remove(&s, 0x999990));
    /* Every filter counter went back to zero: unsampled frees read only the filter. */
    for (size_t i = 0; i < filter_len(&s, 0); i++)
        assert_int_equal(atomic_load(&s.lv[0].filter[i]), 0);
}

static void test_freeset_filter_tracks_line(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);

    /* Many addresses whose home slot lies in one line (one filter counter; fewer than
     * CLIENT_FREESET_FILTER_SAT, where it would saturate). */
    uint64_t addrs[100];
    size_t n = 0;
    uint64_t line = line_of(&s, 0, 0x10000);
    for (uint64_t a = 0x10000; n < 100; a += 16)
        if (line_of(&s, 0, a) == line)
            addrs[n++] = a;
    /* The probe bound limits how many fit around one line of the first level; the rest
     * go to the next level. The counter is non-zero while they are present and back to
     * zero once all are removed (failed inserts undo their raise). */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(client_freeset_insert(&s, addrs[i]), 0);
    assert_true(atomic_load(&s.nlevels) >= 2);
    assert_true((atomic_load(&s.lv[0].filter[line]) & CLIENT_FREESET_FILTER_COUNT) > 0);
    for (size_t i = 0; i < n; i++)
        assert_true(client_freeset_maybe(&s, addrs[i]));
    for (size_t i = 0; i < n; i++)
        assert_true(client_freeset_remove(&s, addrs[i]));
    assert_int_equal(atomic_load(&s.lv[0].filter[line]) & CLIENT_FREESET_FILTER_COUNT, 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&s.lv[1].filter[line_of(&s, 1, addrs[i])]) &
                             CLIENT_FREESET_FILTER_COUNT,
                         0);
}

/* The bug: a set of fixed size overflowed at about 0.5 M live sampled blocks, after which
 * every free() of the session was recorded (saturated filter). Now it grows: many times
 * the first level's size fit, and every member is found. (Only the calls the old set had
 * too, so that this test runs against it.) */
static void test_freeset_bug_overflow_saturates(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 10), 0); /* 1024 slots */
    const uint64_t n = 20000;
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(client_freeset_insert(&s, 0x7f0000000000ull + i * 4096), 0);
    for (uint64_t i = 0; i < n; i++)
        assert_true(client_freeset_remove(&s, 0x7f0000000000ull + i * 4096));
    for (uint64_t i = 0; i < n; i++)
        assert_false(client_freeset_remove(&s, 0x7f0000000000ull + i * 4096));
}

/* Grown, emptied: every level's filter is back to zero; a new session starts from one
 * level. */
static void test_freeset_levels_and_clear(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 14), 0); /* 512 counters: none saturates */
    const uint64_t n = 20000;
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(client_freeset_insert(&s, 0x7f0000000000ull + i * 4096), 0);
    assert_true(atomic_load(&s.nlevels) >= 2);
    print_message("    %u levels for %llu entries\n", atomic_load(&s.nlevels),
                  (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        assert_true(client_freeset_remove(&s, 0x7f0000000000ull + i * 4096));
    for (unsigned l = 0; l < atomic_load(&s.nlevels); l++)
        for (size_t i = 0; i < filter_len(&s, l); i++)
            assert_int_equal(atomic_load(&s.lv[l].filter[i]) & CLIENT_FREESET_FILTER_COUNT, 0);
    client_freeset_clear(&s);
    assert_int_equal(atomic_load(&s.nlevels), 1);
    assert_false(client_freeset_remove(&s, 0x7f0000000000ull));
    assert_int_equal(client_freeset_insert(&s, 0x7f0000000000ull), 0);
    assert_true(client_freeset_remove(&s, 0x7f0000000000ull));
}

/* A set with one counter per 8 slots (python.objects'): a block 8 granules from a
 * sampled one in its page is certainly not in the set, where one counter per 32 slots
 * would send its free to the table; grown levels and clearing keep the granularity. */
static void test_freeset_fine_filter(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init_once(&s, 12, 3), 0);
    assert_int_equal(s.line_log2, 3);
    assert_int_equal(s.lv[0].line_log2, 3);
    const uint64_t page = 0x7f0000001000ull;
    assert_int_equal(client_freeset_insert(&s, page), 0);
    assert_true(client_freeset_maybe(&s, page));
    for (uint64_t g = 8; g < 32; g++)
        assert_false(client_freeset_maybe(&s, page + g * 16));
    assert_true(client_freeset_remove(&s, page));
    assert_false(client_freeset_maybe(&s, page));
    /* Grown past the first level: the next levels count per 8 slots too. */
    const uint64_t n = 4000;
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(client_freeset_insert(&s, 0x7f0000000000ull + i * 4096), 0);
    assert_true(atomic_load(&s.nlevels) >= 2);
    assert_int_equal(s.lv[1].line_log2, 3);
    for (uint64_t i = 0; i < n; i++)
        assert_true(client_freeset_remove(&s, 0x7f0000000000ull + i * 4096));
    for (unsigned l = 0; l < atomic_load(&s.nlevels); l++)
        for (size_t i = 0; i < filter_len(&s, l); i++)
            assert_int_equal(atomic_load(&s.lv[l].filter[i]), 0);
    client_freeset_clear(&s);
    assert_int_equal(client_freeset_init_once(&s, 12, 3), 0);
    assert_int_equal(client_freeset_insert(&s, page), 0);
    assert_false(client_freeset_maybe(&s, page + 8 * 16));
    assert_true(client_freeset_remove(&s, page));

    /* A displaced entry flags its own group of 8 slots, which a removal reads: flagged in
     * a group of 32's place instead, the removal looked at the home slot alone and lost
     * the entry (a sampled block's free never recorded). */
    uint64_t same[2];
    size_t k = 0;
    /* A home far from slot 0, where a group of 8 and one of 32 have different bytes. */
    uint64_t first = page + 16;
    uint64_t home = client_freeset_home(&s.lv[0], client_freeset_page_hash(first), first);
    assert_true(home >> 3 != home >> CLIENT_FREESET_LINE_LOG2);
    for (uint64_t x = first; k < 2; x += 16)
        if (client_freeset_home(&s.lv[0], client_freeset_page_hash(x), x) == home)
            same[k++] = x;
    assert_int_equal(client_freeset_insert(&s, same[0]), 0);
    assert_int_equal(client_freeset_insert(&s, same[1]), 0);
    assert_true(atomic_load(&s.lv[0].filter[home >> 3]) & CLIENT_FREESET_FILTER_DISPLACED);
    assert_true(client_freeset_remove(&s, same[1]));
    assert_true(client_freeset_remove(&s, same[0]));
}

static void test_freeset_tombstones_reused_and_bounded(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);

    /* Addresses that all hash to one slot fill its probe window; the next goes to a new
     * level. */
    uint64_t same[CLIENT_FREESET_PROBES + 1];
    size_t n = 0;
    uint64_t home = client_freeset_home(&s.lv[0], client_freeset_page_hash(16), 16);
    for (uint64_t a = 16; n < CLIENT_FREESET_PROBES + 1; a += 16)
        if (client_freeset_home(&s.lv[0], client_freeset_page_hash(a), a) == home)
            same[n++] = a;
    for (size_t i = 0; i < CLIENT_FREESET_PROBES; i++)
        assert_int_equal(client_freeset_insert(&s, same[i]), 0);
    assert_int_equal(atomic_load(&s.nlevels), 1);
    assert_int_equal(client_freeset_insert(&s, same[CLIENT_FREESET_PROBES]), 0);
    assert_int_equal(atomic_load(&s.nlevels), 2);
    /* A removal leaves a tombstone; lookups still walk past it, in every level. */
    assert_true(client_freeset_remove(&s, same[3]));
    assert_true(client_freeset_remove(&s, same[CLIENT_FREESET_PROBES - 1]));
    assert_true(client_freeset_remove(&s, same[CLIENT_FREESET_PROBES]));
    assert_false(client_freeset_remove(&s, same[3]));
    assert_true(client_freeset_remove(&s, same[4]));
}

/* The bug: tombstones are never emptied, so with time a removal of an absent address
 * whose group holds a present one probed through tombstones to CLIENT_FREESET_PROBES
 * (churn at 4 KiB: a sixth of the profiled program's time in the hooks). Now a group none
 * of whose entries was ever stored past its home slot is looked at in the home slot
 * alone: a stray copy of an address behind a tombstone at its home is not looked for
 * (white box: the set never puts it there without flagging the group), while entries really
 * displaced by a collision are still found. */
static void test_freeset_bug_remove_probes_tombstones(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);
    const uint64_t a = 0x7f0000001000ull, b = a + 32;
    assert_int_equal(client_freeset_insert(&s, a), 0);
    uint64_t hb = client_freeset_home(&s.lv[0], client_freeset_page_hash(b), b);
    assert_int_equal(line_of(&s, 0, a), line_of(&s, 0, b));
    assert_int_equal(atomic_load(&s.lv[0].filter[hb >> CLIENT_FREESET_LINE_LOG2]) &
                         CLIENT_FREESET_FILTER_DISPLACED,
                     0);
    /* What a long-lived set looks like: a tombstone at b's home. */
    atomic_store(&s.lv[0].slots[hb], CLIENT_FREESET_TOMB);
    atomic_store(&s.lv[0].slots[hb + 1], b);
    assert_false(client_freeset_remove(&s, b));
    atomic_store(&s.lv[0].slots[hb + 1], CLIENT_FREESET_EMPTY);

    /* Two addresses with one home slot: the second is displaced, its group flagged, and
     * both are found. */
    uint64_t same[2];
    size_t n = 0;
    uint64_t home = client_freeset_home(&s.lv[0], client_freeset_page_hash(16), 16);
    for (uint64_t x = 16; n < 2; x += 16)
        if (client_freeset_home(&s.lv[0], client_freeset_page_hash(x), x) == home)
            same[n++] = x;
    assert_int_equal(client_freeset_insert(&s, same[0]), 0);
    assert_int_equal(client_freeset_insert(&s, same[1]), 0);
    assert_true(atomic_load(&s.lv[0].filter[home >> CLIENT_FREESET_LINE_LOG2]) &
                CLIENT_FREESET_FILTER_DISPLACED);
    assert_true(client_freeset_remove(&s, same[0]));
    assert_true(client_freeset_remove(&s, same[1]));
    assert_false(client_freeset_remove(&s, same[1]));
    assert_true(client_freeset_remove(&s, a));
    assert_false(client_freeset_maybe(&s, same[1]));
}

#define THREADS 4
#define PER_THREAD 50000

static struct client_freeset shared_set;

static void *churn(void *arg)
{
    uint64_t base = ((uint64_t)(uintptr_t)arg + 1) << 40;
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        uint64_t a = base + (i % 512) * 32;
        if (client_freeset_insert(&shared_set, a) != 0)
            return (void *)1;
        if (!client_freeset_remove(&shared_set, a))
            return (void *)2;
    }
    return NULL;
}

/* Threads insert many more addresses than the first level holds, so that they race to
 * grow the set, then remove them all. */
static void *grow(void *arg)
{
    uint64_t base = ((uint64_t)(uintptr_t)arg + 1) << 40;
    for (uint64_t i = 0; i < PER_THREAD / 4; i++)
        if (client_freeset_insert(&shared_set, base + i * 64) != 0)
            return (void *)1;
    for (uint64_t i = 0; i < PER_THREAD / 4; i++)
        if (!client_freeset_remove(&shared_set, base + i * 64))
            return (void *)2;
    return NULL;
}

static void test_freeset_concurrent_growth(void **state)
{
    (void)state;
    pthread_t th[THREADS];
    memset(&shared_set, 0, sizeof(shared_set));
    assert_int_equal(client_freeset_init(&shared_set, 8), 0);
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, grow, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_int_equal((uintptr_t)ret, 0);
    }
    assert_true(atomic_load(&shared_set.nlevels) > 1);
}

/* client_freeset_init_once(): a zeroed set is mapped by one thread, once, while others
 * hear -EBUSY (and drop their sample) or find it ready; afterwards it takes entries. */
static _Atomic int init_ready, init_busy;
static void *init_once(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        int r = client_freeset_init_once(&shared_set, 10, CLIENT_FREESET_LINE_LOG2);
        if (r == 0)
            atomic_fetch_add(&init_ready, 1);
        else if (r == -EBUSY)
            atomic_fetch_add(&init_busy, 1);
        else
            return (void *)1;
    }
    return NULL;
}

static void test_freeset_init_once(void **state)
{
    (void)state;
    pthread_t th[THREADS];
    memset(&shared_set, 0, sizeof(shared_set));
    assert_int_equal(atomic_load(&shared_set.nlevels), 0);
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, init_once, NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_int_equal((uintptr_t)ret, 0);
    }
    assert_int_equal(atomic_load(&init_ready) + atomic_load(&init_busy), THREADS * 1000);
    assert_true(atomic_load(&init_ready) > 0);
    assert_int_equal(atomic_load(&shared_set.nlevels), 1);
    assert_int_equal(shared_set.log2_slots, 10);
    assert_false(atomic_load(&shared_set.growing));
    void *first = (void *)shared_set.lv[0].slots;
    assert_int_equal(client_freeset_init_once(&shared_set, 10, CLIENT_FREESET_LINE_LOG2), 0);
    assert_ptr_equal((void *)shared_set.lv[0].slots, first); /* not mapped again */
    assert_int_equal(client_freeset_insert(&shared_set, 0x123450), 0);
    assert_true(client_freeset_maybe(&shared_set, 0x123450));
    assert_true(client_freeset_remove(&shared_set, 0x123450));
    /* Cleared for a new session, it stays mapped and ready. */
    client_freeset_clear(&shared_set);
    assert_int_equal(client_freeset_init_once(&shared_set, 10, CLIENT_FREESET_LINE_LOG2), 0);
    assert_ptr_equal((void *)shared_set.lv[0].slots, first);
}

static void test_freeset_concurrent_churn(void **state)
{
    (void)state;
    pthread_t th[THREADS];
    memset(&shared_set, 0, sizeof(shared_set));
    assert_int_equal(client_freeset_init(&shared_set, 16), 0);
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, churn, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
}

/* The free path's two steps: @addr's slot, turned PENDING with @tag; NULL when @addr is
 * not in the set. */
static _Atomic uint64_t *retire(struct client_freeset *s, uint64_t addr, uint32_t tag)
{
    unsigned level;
    _Atomic uint64_t *slot = client_freeset_find(s, addr, &level);
    return slot && client_freeset_retire_at(s, slot, level, addr, tag) ? slot : NULL;
}

/* Every filter counter of every level of @s is zero (no live entry left). */
static void assert_filters_empty(const struct client_freeset *s)
{
    for (unsigned l = 0; l < atomic_load(&s->nlevels); l++)
        for (size_t i = 0; i < filter_len(s, l); i++)
            assert_int_equal(atomic_load(&s->lv[l].filter[i]) & CLIENT_FREESET_FILTER_COUNT, 0);
}

/* Frees in batches (freeset.h): a retired entry is PENDING, out of the filters (a free of
 * its address reused unsampled passes by), and only its own batch's tag commits it. */
static void test_freeset_batch_retire_commit(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);
    const uint64_t a = 0x7f0000123450ull;
    assert_int_equal(client_freeset_insert(&s, a), 0);
    _Atomic uint64_t *slot = retire(&s, a, 0x201);
    assert_non_null(slot);
    assert_int_equal(atomic_load(slot), client_freeset_pending(a, 0x201));
    assert_false(client_freeset_maybe(&s, a));
    assert_false(client_freeset_remove(&s, a));
    assert_null(retire(&s, a, 0x201));
    int level = client_freeset_slot_level(&s, slot);
    assert_int_equal(level, 0);
    assert_int_equal(client_freeset_slot_level(&s, (_Atomic uint64_t *)&s), -1);
    /* Another batch's tag (or epoch) is not ours to commit. */
    assert_false(client_freeset_commit(&s, slot, 0, client_freeset_pending(a, 0x202)));
    assert_true(client_freeset_commit(&s, slot, 0, client_freeset_pending(a, 0x201)));
    assert_int_equal(atomic_load(slot), CLIENT_FREESET_TOMB);
    assert_false(client_freeset_commit(&s, slot, 0, client_freeset_pending(a, 0x201)));
    /* Recorded: a sampled allocation of the address inserts it anew. */
    assert_int_equal(client_freeset_insert_taking(&s, a), 0);
    assert_true(client_freeset_remove(&s, a));
    assert_filters_empty(&s);
}

/* A sampled allocation of an address whose free is PENDING takes the entry over (its
 * record carries the free); the batch's owner then finds it changed. A stale hint of that
 * batch never commits a later free of the address another batch holds. */
static void test_freeset_batch_take(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);
    const uint64_t a = 0x7f0000123460ull;
    assert_int_equal(client_freeset_insert(&s, a), 0);
    _Atomic uint64_t *first = retire(&s, a, 0x201);
    assert_non_null(first);
    assert_int_equal(client_freeset_insert_taking(&s, a), 1);
    assert_int_equal(atomic_load(first), a);
    assert_true(client_freeset_maybe(&s, a));
    assert_false(client_freeset_commit(&s, first, 0, client_freeset_pending(a, 0x201)));
    /* Freed again, into another batch: the first batch's hint finds another tag. */
    _Atomic uint64_t *second = retire(&s, a, 0x401);
    assert_ptr_equal((void *)second, (void *)first);
    assert_false(client_freeset_commit(&s, first, 0, client_freeset_pending(a, 0x201)));
    /* The session thread claims it, whatever its tag, and settles it after its record. */
    uint64_t v = atomic_load(second);
    assert_true(client_freeset_claim(second, v));
    assert_false(client_freeset_claim(second, v));
    assert_false(client_freeset_commit(&s, second, 0, v));
    client_freeset_settle(&s, second, 0, a);
    assert_int_equal(atomic_load(second), CLIENT_FREESET_TOMB);
    assert_int_equal(client_freeset_insert_taking(&s, a), 0);
    assert_true(client_freeset_remove(&s, a));
    assert_filters_empty(&s);
}

/* A sampled allocation of an address whose free is CLAIMED waits for the tombstone (its
 * record must come after the claimer's); held too long, it gives up (-EBUSY: the sample
 * is dropped and counted). */
static void test_freeset_batch_claimed_waits(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);
    const uint64_t a = 0x7f0000123470ull;
    assert_int_equal(client_freeset_insert(&s, a), 0);
    _Atomic uint64_t *slot = retire(&s, a, 0x201);
    assert_true(client_freeset_claim(slot, atomic_load(slot)));
    assert_int_equal(client_freeset_insert_taking(&s, a), -EBUSY);
    client_freeset_settle(&s, slot, 0, a);
    assert_int_equal(client_freeset_insert_taking(&s, a), 0);
    assert_true(client_freeset_remove(&s, a));
    assert_filters_empty(&s);
}

/* Entries past their home slot (a displaced group): found, taken and committed there. */
static void test_freeset_batch_displaced(void **state)
{
    (void)state;
    struct client_freeset s = {0};
    assert_int_equal(client_freeset_init(&s, 12), 0);
    /* Page-aligned addresses whose pages hash to one home slot. */
    uint64_t addrs[6];
    size_t n = 0;
    uint64_t home = client_freeset_home(&s.lv[0], client_freeset_page_hash(0x7f0000200000ull),
                                        0x7f0000200000ull);
    for (uint64_t p = 0x7f0000200000ull; n < 6; p += 4096)
        if (client_freeset_home(&s.lv[0], client_freeset_page_hash(p), p) == home)
            addrs[n++] = p;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(client_freeset_insert(&s, addrs[i]), 0);
    _Atomic uint64_t *slots[6];
    for (size_t i = 0; i < n; i++)
        assert_non_null(slots[i] = retire(&s, addrs[i], 0x201));
    /* Taken over, the last (farthest from home) and one in the middle. */
    assert_int_equal(client_freeset_insert_taking(&s, addrs[5]), 1);
    assert_int_equal(client_freeset_insert_taking(&s, addrs[2]), 1);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(
            client_freeset_commit(&s, slots[i], 0, client_freeset_pending(addrs[i], 0x201)),
            i != 5 && i != 2);
    assert_true(client_freeset_remove(&s, addrs[5]));
    assert_true(client_freeset_remove(&s, addrs[2]));
    assert_filters_empty(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freeset_insert_remove),
        cmocka_unit_test(test_freeset_tombstones_reused_and_bounded),
        cmocka_unit_test(test_freeset_filter_tracks_line),
        cmocka_unit_test(test_freeset_fine_filter),
        cmocka_unit_test(test_freeset_bug_overflow_saturates),
        cmocka_unit_test(test_freeset_bug_remove_probes_tombstones),
        cmocka_unit_test(test_freeset_levels_and_clear),
        cmocka_unit_test(test_freeset_concurrent_growth),
        cmocka_unit_test(test_freeset_init_once),
        cmocka_unit_test(test_freeset_concurrent_churn),
        cmocka_unit_test(test_freeset_batch_retire_commit),
        cmocka_unit_test(test_freeset_batch_take),
        cmocka_unit_test(test_freeset_batch_claimed_waits),
        cmocka_unit_test(test_freeset_batch_displaced),
    };
    return cmocka_run_group_tests_name("freeset", tests, NULL, NULL);
}
