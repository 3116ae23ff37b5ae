/* tests/shmem_ring/test_utable.c: unit tests of the unwind table shared by the service
 * (writer) and a client (readers). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "shmem_ring/utable.h"

#include "common/clock.h"

struct pair {
    struct utable w, r; /* the service's writable and the client's read-only mapping */
};

static void pair_open(struct pair *p, size_t slots)
{
    int fd;
    assert_int_equal(utable_create(slots, &fd), 0);
    assert_int_equal(utable_map(fd, true, &p->w), 0);
    assert_int_equal(utable_map(fd, false, &p->r), 0);
    close(fd);
}

static void pair_close(struct pair *p)
{
    utable_unmap(&p->w);
    utable_unmap(&p->r);
}

static bool lookup(const struct pair *p, uint64_t addr, uint64_t *rule)
{
    return utable_lookup(&p->r, utable_gen(&p->r), addr, rule);
}

static void test_utable_rule_fields_round_trip(void **state)
{
    (void)state;
    uint64_t r = utable_rule_make(true, -123456, true, -32768, false);
    assert_true(r & UTABLE_RULE_CFA_RBP);
    assert_true(r & UTABLE_RULE_RBP_SAVED);
    assert_false(r & UTABLE_RULE_OUTERMOST);
    assert_int_equal(utable_rule_cfa_off(r), -123456);
    assert_int_equal(utable_rule_rbp_off(r), -32768);
    r = utable_rule_make(false, INT32_MAX, false, 32767, true);
    assert_false(r & UTABLE_RULE_CFA_RBP);
    assert_true(r & UTABLE_RULE_OUTERMOST);
    assert_int_equal(utable_rule_cfa_off(r), INT32_MAX);
    assert_int_equal(utable_rule_rbp_off(r), 32767);
}

static void test_utable_create_rejects_bad_sizes(void **state)
{
    (void)state;
    int fd = -1;
    assert_int_equal(utable_create(0, &fd), -EINVAL);
    assert_int_equal(utable_create(UTABLE_MIN_SLOTS - 1, &fd), -EINVAL);
    assert_int_equal(utable_create(100, &fd), -EINVAL);
    assert_int_equal(utable_create((size_t)UTABLE_MAX_SLOTS * 2, &fd), -EINVAL);
    assert_int_equal(fd, -1);
}

/* A file that is not a table (wrong size, wrong magic, unsealed for the writer) is
 * refused. */
static void test_utable_map_rejects_foreign_files(void **state)
{
    (void)state;
    struct utable t;
    int fd = memfd_create("x", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 100), 0);
    assert_int_equal(utable_map(fd, false, &t), -EBADMSG);
    /* The right size, but zeros: no magic. */
    assert_int_equal(ftruncate(fd, (off_t)(sizeof(struct utable_header) +
                                           UTABLE_MIN_SLOTS * sizeof(struct utable_slot))),
                     0);
    assert_int_equal(utable_map(fd, false, &t), -EPERM);
    /* Not sealed: the writer will not map what a client could shrink. */
    assert_int_equal(utable_map(fd, true, &t), -EPERM);
    close(fd);
    /* Sealed, but zeros: no magic. */
    fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(sizeof(struct utable_header) +
                                           UTABLE_MIN_SLOTS * sizeof(struct utable_slot))),
                     0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    assert_int_equal(utable_map(fd, false, &t), -EBADMSG);
    close(fd);
}

/* A table with a valid header, sealed with @seals (0: none), as a peer posing as the
 * service could send it. */
static int utable_fake_fd(unsigned seals)
{
    size_t len = sizeof(struct utable_header) + UTABLE_MIN_SLOTS * sizeof(struct utable_slot);
    int fd = memfd_create("fake-utable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    struct utable_header h = {.magic = UTABLE_MAGIC, .n_slots = UTABLE_MIN_SLOTS};
    atomic_init(&h.gen, 1);
    assert_int_equal(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    if (seals)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
}

/* The client reads the table inside malloc: it maps only a file sealed as utable_create()
 * seals it, which its peer can no longer shrink (SIGBUS in the program). */
static void test_utable_bug_client_maps_unsealed(void **state)
{
    (void)state;
    static const unsigned partial[] = {0, F_SEAL_SHRINK, F_SEAL_SHRINK | F_SEAL_GROW};
    struct utable t = {0};
    for (size_t i = 0; i < sizeof(partial) / sizeof(partial[0]); i++) {
        int fd = utable_fake_fd(partial[i]);
        assert_int_equal(utable_map(fd, false, &t), -EPERM);
        assert_int_equal(utable_map(fd, true, &t), -EPERM);
        close(fd);
    }
    int fd = utable_fake_fd(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(utable_map(fd, false, &t), 0);
    utable_unmap(&t);
    close(fd);
}

static void test_utable_insert_and_lookup(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, UTABLE_MIN_SLOTS);
    uint64_t rule = 0;
    assert_false(lookup(&p, 0x401000, &rule));
    utable_insert(&p.w, 0x401000, utable_rule_make(false, 16, false, 0, false));
    utable_insert(&p.w, 0x401001, utable_rule_make(true, 16, true, -16, false));
    assert_true(lookup(&p, 0x401000, &rule));
    assert_int_equal(utable_rule_cfa_off(rule), 16);
    assert_false(rule & UTABLE_RULE_CFA_RBP);
    assert_true(lookup(&p, 0x401001, &rule));
    assert_true(rule & UTABLE_RULE_CFA_RBP);
    assert_false(lookup(&p, 0x401002, &rule));
    /* Addresses past 48 bits cannot be keyed. */
    utable_insert(&p.w, UINT64_C(1) << 50, 1);
    assert_false(lookup(&p, UINT64_C(1) << 50, &rule));
    /* The same address again takes the new rule. */
    utable_insert(&p.w, 0x401000, utable_rule_make(false, 32, false, 0, false));
    assert_true(lookup(&p, 0x401000, &rule));
    assert_int_equal(utable_rule_cfa_off(rule), 32);
    pair_close(&p);
}

/* More addresses than slots: every lookup answers the rule of its own address or
 * nothing, and the most recent inserts are found. */
static void test_utable_overfull_never_mixes_rules(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, UTABLE_MIN_SLOTS);
    const uint64_t n = UTABLE_MIN_SLOTS * 8;
    for (uint64_t i = 0; i < n; i++)
        utable_insert(&p.w, 0x10000 + i * 16, utable_rule_make(false, (int32_t)i, false, 0, false));
    unsigned found = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t rule;
        if (lookup(&p, 0x10000 + i * 16, &rule)) {
            assert_int_equal(utable_rule_cfa_off(rule), (int32_t)i);
            found++;
        }
    }
    assert_true(found > 0 && found <= UTABLE_MIN_SLOTS);
    /* The last one inserted is there. */
    uint64_t rule;
    assert_true(lookup(&p, 0x10000 + (n - 1) * 16, &rule));
    pair_close(&p);
}

/* A flush forgets every slot; new inserts are found; and across the wrap of the 16-bit
 * generations no rule of a generation long gone comes back. */
static void test_utable_flush_and_generation_wrap(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, UTABLE_MIN_SLOTS);
    uint64_t rule;
    utable_insert(&p.w, 0x5000, utable_rule_make(false, 8, false, 0, false));
    assert_true(lookup(&p, 0x5000, &rule));
    uint64_t gen_before = utable_gen(&p.r);
    utable_flush(&p.w);
    assert_int_not_equal(utable_gen(&p.r), gen_before);
    assert_false(lookup(&p, 0x5000, &rule));
    /* A walk that loaded the old generation still sees the old slots: the race the
     * header describes, bounded by one walk. */
    assert_true(utable_lookup(&p.r, gen_before, 0x5000, &rule));

    /* Insert one rule per generation until the generations wrap twice. */
    for (unsigned i = 0; i < 2 * 0x10000 + 10; i++) {
        utable_insert(&p.w, 0x6000, utable_rule_make(false, (int32_t)i, false, 0, false));
        assert_true(lookup(&p, 0x6000, &rule));
        assert_int_equal(utable_rule_cfa_off(rule), (int32_t)i);
        utable_flush(&p.w);
        assert_false(lookup(&p, 0x6000, &rule));
        assert_int_not_equal(utable_gen(&p.r), 0);
    }
    assert_false(lookup(&p, 0x5000, &rule));
    /* Generation 0 (the table being cleared) finds nothing. */
    assert_false(utable_lookup(&p.r, 0, 0x6000, &rule));
    pair_close(&p);
}

/* ---- concurrency: one writer replacing rules, readers checking every answer ---- */

#define STRESS_ADDRS 512
#define STRESS_READERS 3

struct stress {
    struct pair p;
    _Atomic bool stop;
    _Atomic unsigned long hits, checks;
    _Atomic unsigned long progress; /* lookups / 1024 so far, while they run */
};

/* Every rule the writer stores for @addr carries the address in its CFA offset and a
 * version in its rbp offset: a rule read with another address's key is detected. */
static uint64_t stress_rule(uint64_t addr, unsigned version)
{
    return utable_rule_make(false, (int32_t)(addr >> 4), true, (int16_t)(version & 0x7fff), false);
}

static void *stress_reader(void *arg)
{
    struct stress *st = arg;
    unsigned long hits = 0, checks = 0;
    uint64_t x = (uint64_t)(uintptr_t)&hits;
    while (!atomic_load_explicit(&st->stop, memory_order_relaxed)) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t addr = 0x100000 + (x % STRESS_ADDRS) * 16;
        uint64_t rule;
        if (++checks % 1024 == 0)
            atomic_fetch_add_explicit(&st->progress, 1, memory_order_relaxed);
        if (lookup(&st->p, addr, &rule)) {
            hits++;
            if (utable_rule_cfa_off(rule) != (int32_t)(addr >> 4))
                abort(); /* a rule paired with the wrong key */
        }
    }
    atomic_fetch_add(&st->hits, hits);
    atomic_fetch_add(&st->checks, checks);
    return NULL;
}

static void test_utable_concurrent_readers_never_pair_wrong_rules(void **state)
{
    (void)state;
    static struct stress st;
    memset(&st, 0, sizeof(st));
    /* Few slots for many addresses: slots are replaced all the time. */
    pair_open(&st.p, UTABLE_MIN_SLOTS);
    pthread_t t[STRESS_READERS];
    for (int i = 0; i < STRESS_READERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, stress_reader, &st), 0);
    /* 200 000 rounds, and on until the readers made 4096 lookups between the changes (on
     * a loaded machine they may not run at all during the first ones), at most 10 s. */
    uint64_t x = 7;
    uint64_t deadline = hp_clock_ns(CLOCK_MONOTONIC) + 10000000000u;
    for (unsigned round = 0; round < 200000 || (atomic_load(&st.progress) < 4 &&
                                                hp_clock_ns(CLOCK_MONOTONIC) < deadline);
         round++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t addr = 0x100000 + (x % STRESS_ADDRS) * 16;
        utable_insert(&st.p.w, addr, stress_rule(addr, round));
        if (round % 50000 == 49999)
            utable_flush(&st.p.w);
    }
    atomic_store(&st.stop, true);
    for (int i = 0; i < STRESS_READERS; i++)
        pthread_join(t[i], NULL);
    print_message("  %lu lookups, %lu hits\n", atomic_load(&st.checks), atomic_load(&st.hits));
    assert_true(atomic_load(&st.checks) > 0);
    pair_close(&st.p);
}

/* ---- one slot handed back and forth between two addresses ---- */

struct aba {
    struct pair p;
    uint64_t a; /* the address the readers look up */
    _Atomic bool stop;
    _Atomic unsigned long hits, checks;
    _Atomic unsigned long progress; /* lookups / 1024 so far, while they run */
};

static void *aba_reader(void *arg)
{
    struct aba *st = arg;
    unsigned long hits = 0, checks = 0;
    while (!atomic_load_explicit(&st->stop, memory_order_relaxed)) {
        uint64_t rule;
        if (++checks % 1024 == 0)
            atomic_fetch_add_explicit(&st->progress, 1, memory_order_relaxed);
        if (lookup(&st->p, st->a, &rule)) {
            hits++;
            if (utable_rule_cfa_off(rule) != (int32_t)(st->a >> 4))
                abort(); /* the other address's rule under this key */
        }
    }
    atomic_fetch_add(&st->hits, hits);
    atomic_fetch_add(&st->checks, checks);
    return NULL;
}

/* The home slot of @addr in a table of UTABLE_MIN_SLOTS, as utable_insert() computes it. */
static uint64_t aba_home(uint64_t addr)
{
    return ((addr * 0x9e3779b97f4a7c15ull) >> 32) & (UTABLE_MIN_SLOTS - 1);
}

/* Regression: a reader between its loads of a slot while the writer gave the slot to
 * another address and back took that address's rule under a key that matched again (the
 * key was read before and after the rule, with no sequence). Addresses A and B compete
 * for one slot of a full probe run, the writer alternates them, readers look up A. */
static void test_utable_bug_slot_back_and_forth_pairs_wrong_rule(void **state)
{
    (void)state;
    static struct aba st;
    memset(&st, 0, sizeof(st));
    pair_open(&st.p, UTABLE_MIN_SLOTS);
    /* Eight fillers with the home slot of A fill its run; B shares A's home and the bits
     * (7-9) that choose the victim in a full run. */
    uint64_t same[10];
    unsigned n = 0;
    uint64_t home = aba_home(0x100000);
    for (uint64_t addr = 0x100000; n < 10; addr += 16)
        if (aba_home(addr) == home && (n < 9 || ((addr ^ same[8]) & 0x380) == 0))
            same[n++] = addr;
    for (unsigned i = 0; i < 8; i++)
        utable_insert(&st.p.w, same[i], stress_rule(same[i], 0));
    st.a = same[8];
    uint64_t b = same[9];
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, aba_reader, &st), 0);
    /* 300 ms of rounds once the readers run (at most 2 s for them to start). */
    uint64_t start = hp_clock_ns(CLOCK_MONOTONIC), now = start, ran = 0;
    for (unsigned round = 0; now < start + 2000000000u; round++) {
        utable_insert(&st.p.w, st.a, stress_rule(st.a, round));
        utable_insert(&st.p.w, b, stress_rule(b, round));
        if (round % 4096 != 0)
            continue;
        now = hp_clock_ns(CLOCK_MONOTONIC);
        if (ran == 0 && atomic_load(&st.progress) > 0)
            ran = now;
        if (ran != 0 && now > ran + 300000000u)
            break;
    }
    atomic_store(&st.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    print_message("  %lu lookups, %lu hits\n", atomic_load(&st.checks), atomic_load(&st.hits));
    assert_true(atomic_load(&st.checks) > 0);
    pair_close(&st.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utable_rule_fields_round_trip),
        cmocka_unit_test(test_utable_create_rejects_bad_sizes),
        cmocka_unit_test(test_utable_map_rejects_foreign_files),
        cmocka_unit_test(test_utable_bug_client_maps_unsealed),
        cmocka_unit_test(test_utable_insert_and_lookup),
        cmocka_unit_test(test_utable_overfull_never_mixes_rules),
        cmocka_unit_test(test_utable_flush_and_generation_wrap),
        cmocka_unit_test(test_utable_concurrent_readers_never_pair_wrong_rules),
        cmocka_unit_test(test_utable_bug_slot_back_and_forth_pairs_wrong_rule),
    };
    return cmocka_run_group_tests_name("utable", tests, NULL, NULL);
}
