/* tests/preload/test_freeset.c: the sampled-address set (preload/freeset.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/freeset.h"

static void test_freeset_insert_remove(void **state)
{
    (void)state;
    struct client_freeset s;
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
    for (size_t i = 0; i < ((size_t)1 << (12 - CLIENT_FREESET_LINE_LOG2)); i++)
        assert_int_equal(atomic_load(&s.filter[i]), 0);
}

static void test_freeset_filter_tracks_line(void **state)
{
    (void)state;
    struct client_freeset s;
    assert_int_equal(client_freeset_init(&s, 12), 0);

    /* Many addresses whose home slot lies in one line (one filter counter). */
    uint64_t addrs[300];
    size_t n = 0;
    uint64_t line = client_freeset_hash(&s, 0x10000) >> CLIENT_FREESET_LINE_LOG2;
    for (uint64_t a = 0x10000; n < 300; a += 16)
        if (client_freeset_hash(&s, a) >> CLIENT_FREESET_LINE_LOG2 == line)
            addrs[n++] = a;
    size_t inserted = 0;
    for (size_t i = 0; i < n; i++)
        inserted += client_freeset_insert(&s, addrs[i]) == 0;
    /* The probe bound limits how many fit around one line; the counter is non-zero while
     * they are present and back to zero once all are removed (failed inserts undo their
     * raise). */
    assert_true(inserted >= CLIENT_FREESET_PROBES - 8);
    assert_true(atomic_load(&s.filter[line]) > 0);
    for (size_t i = 0; i < n; i++)
        (void)client_freeset_remove(&s, addrs[i]);
    assert_int_equal(atomic_load(&s.filter[line]), 0);
}

/* Saturated (the set overflowed): every address "maybe" is a member, for good; the table
 * itself still answers exactly. */
static void test_freeset_saturate(void **state)
{
    (void)state;
    struct client_freeset s;
    assert_int_equal(client_freeset_init(&s, 12), 0);
    assert_int_equal(client_freeset_insert(&s, 0x20000), 0);
    /* One of 128 filter counters is raised: about 1/128 of addresses "maybe" match. */
    size_t maybe = 0;
    for (uint64_t a = 0x10000; a < 0x10000 + 16 * 4096; a += 16)
        maybe += client_freeset_maybe(&s, a);
    assert_true(maybe >= 1 && maybe < 4096 / 8);
    client_freeset_saturate(&s);
    for (uint64_t a = 0x10000; a < 0x10000 + 16 * 4096; a += 16)
        assert_true(client_freeset_maybe(&s, a));
    assert_false(client_freeset_remove(&s, 0x30000));
    assert_true(client_freeset_remove(&s, 0x20000));
    assert_false(client_freeset_remove(&s, 0x20000));
    for (uint64_t a = 0x10000; a < 0x10000 + 16 * 4096; a += 16)
        assert_true(client_freeset_maybe(&s, a)); /* removals do not lower a saturated one */
}

static void test_freeset_tombstones_reused_and_bounded(void **state)
{
    (void)state;
    struct client_freeset s;
    assert_int_equal(client_freeset_init(&s, 6), 0); /* 64 slots */

    /* Addresses that all hash to one slot fill its probe window, then inserts fail. */
    uint64_t same[CLIENT_FREESET_PROBES + 1];
    size_t n = 0;
    for (uint64_t a = 16; n < CLIENT_FREESET_PROBES + 1; a += 16)
        if (client_freeset_hash(&s, a) == client_freeset_hash(&s, 16))
            same[n++] = a;
    for (size_t i = 0; i < CLIENT_FREESET_PROBES; i++)
        assert_int_equal(client_freeset_insert(&s, same[i]), 0);
    assert_int_equal(client_freeset_insert(&s, same[CLIENT_FREESET_PROBES]), -ENOSPC);
    /* A removal leaves a tombstone the next insert reuses; lookups still walk past it. */
    assert_true(client_freeset_remove(&s, same[3]));
    assert_int_equal(client_freeset_insert(&s, same[CLIENT_FREESET_PROBES]), 0);
    assert_true(client_freeset_remove(&s, same[CLIENT_FREESET_PROBES - 1]));
    assert_true(client_freeset_remove(&s, same[CLIENT_FREESET_PROBES]));
    assert_false(client_freeset_remove(&s, same[3]));
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

static void test_freeset_concurrent_churn(void **state)
{
    (void)state;
    pthread_t th[THREADS];
    assert_int_equal(client_freeset_init(&shared_set, 16), 0);
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, churn, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freeset_insert_remove),
        cmocka_unit_test(test_freeset_tombstones_reused_and_bounded),
        cmocka_unit_test(test_freeset_filter_tracks_line),
        cmocka_unit_test(test_freeset_saturate),
        cmocka_unit_test(test_freeset_concurrent_churn),
    };
    return cmocka_run_group_tests_name("freeset", tests, NULL, NULL);
}
