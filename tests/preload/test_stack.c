/* tests/preload/test_stack.c: stack bounds from /proc/self/maps (preload/stack.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/stack.h"

static void test_stack_find_mapping(void **state)
{
    (void)state;
    uint64_t lo, hi;
    int local = 0;
    uint64_t here = (uint64_t)(uintptr_t)&local;

    assert_int_equal(client_find_mapping(here, &lo, &hi), 0);
    assert_true(lo <= here && here < hi);
    /* A fresh mapping is found exactly; an address just past it is not in it. */
    uint8_t *m = mmap(NULL, 3 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(munmap(m + 2 * 4096, 4096), 0);
    assert_int_equal(client_find_mapping((uint64_t)(uintptr_t)(m + 100), &lo, &hi), 0);
    assert_true(lo <= (uint64_t)(uintptr_t)m);
    assert_int_equal(hi, (uint64_t)(uintptr_t)(m + 2 * 4096));
    assert_int_equal(client_find_mapping((uint64_t)(uintptr_t)(m + 2 * 4096), &lo, &hi), -ENOENT);
    assert_int_equal(client_find_mapping(0x10, &lo, &hi), -ENOENT);
    (void)munmap(m, 2 * 4096);
}

static void *thread_lookup(void *arg)
{
    struct client_stack_cache *c = arg;
    int local = 0;
    uint64_t end;
    if (client_stack_lookup(c, (uint64_t)(uintptr_t)&local, &end) != 0)
        return (void *)1;
    return (void *)(uintptr_t)end;
}

static void test_stack_lookup_caches_per_thread(void **state)
{
    (void)state;
    struct client_stack_cache main_cache = {0}, thread_cache = {0};
    int local = 0;
    uint64_t end, end2;

    assert_int_equal(client_stack_lookup(&main_cache, (uint64_t)(uintptr_t)&local, &end), 0);
    assert_int_equal(main_cache.hi, end);
    assert_true(end > (uint64_t)(uintptr_t)&local);
    /* Cached: a bogus range is believed, showing the cache is used. */
    main_cache.hi = end + 4096;
    assert_int_equal(client_stack_lookup(&main_cache, (uint64_t)(uintptr_t)&local, &end2), 0);
    assert_int_equal(end2, end + 4096);
    main_cache.hi = end;

    pthread_t th;
    void *ret;
    assert_int_equal(pthread_create(&th, NULL, thread_lookup, &thread_cache), 0);
    assert_int_equal(pthread_join(th, &ret), 0);
    assert_true((uintptr_t)ret > 1);
    assert_int_equal(thread_cache.hi, (uint64_t)(uintptr_t)ret);
    assert_true(thread_cache.hi != main_cache.hi);
}

static void test_stack_other_stack_not_cached(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    int local = 0;
    uint64_t end;

    assert_int_equal(client_stack_lookup(&c, (uint64_t)(uintptr_t)&local, &end), 0);
    struct client_stack_cache before = c;
    /* An address on another "stack" (a heap-like mapping, as a fiber would use). */
    uint8_t *alt = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(alt != MAP_FAILED);
    assert_int_equal(client_stack_lookup(&c, (uint64_t)(uintptr_t)(alt + 1000), &end), 1);
    assert_true(end >= (uint64_t)(uintptr_t)(alt + 65536));
    assert_int_equal(c.lo, before.lo);
    assert_int_equal(c.hi, before.hi);
    (void)munmap(alt, 65536);
    assert_int_equal(client_stack_lookup(&c, (uint64_t)(uintptr_t)(alt + 1000), &end), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stack_find_mapping),
        cmocka_unit_test(test_stack_lookup_caches_per_thread),
        cmocka_unit_test(test_stack_other_stack_not_cached),
    };
    return cmocka_run_group_tests_name("stack", tests, NULL, NULL);
}
