/* tests/preload/test_pycodes.c: the code objects known good (preload/pycodes.h). */
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

#include "preload/pycodes.h"

static struct client_pycodes codes;

static void test_put_lookup_forget(void **state)
{
    (void)state;
    client_pycodes_clear(&codes);
    uint64_t a = 0x7f1234567890ull;
    uint32_t check = 0;
    assert_false(client_pycodes_lookup(&codes, a, &check));
    client_pycodes_put(&codes, a, 0xabcdef);
    assert_true(client_pycodes_lookup(&codes, a, &check));
    assert_int_equal(check, 0xabcdef);
    /* Only the check's 24 bits are kept. */
    client_pycodes_put(&codes, a, 0x7f123456);
    assert_true(client_pycodes_lookup(&codes, a, &check));
    assert_int_equal(check, 0x123456);
    /* Another block's free leaves it. */
    client_pycodes_forget(&codes, a + 16);
    assert_true(client_pycodes_lookup(&codes, a, &check));
    client_pycodes_forget(&codes, a);
    assert_false(client_pycodes_lookup(&codes, a, &check));
}

/* An address that shares a slot with another is never taken for it: slot and tag give
 * the address back whole. Addresses a pool apart, and far apart. */
static void test_no_alias(void **state)
{
    (void)state;
    client_pycodes_clear(&codes);
    const uint64_t base = 0x7f0000000000ull;
    for (uint64_t i = 0; i < 4 * CLIENT_PYCODES_SLOTS; i++)
        client_pycodes_put(&codes, base + i * 16, (uint32_t)i);
    uint64_t hits = 0;
    for (uint64_t i = 0; i < 4 * CLIENT_PYCODES_SLOTS; i++) {
        uint32_t check;
        if (client_pycodes_lookup(&codes, base + i * 16, &check)) {
            assert_int_equal(check, (uint32_t)i);
            hits++;
        }
        /* An address in another 64 KiB region and another bit above: never found. */
        assert_false(client_pycodes_lookup(&codes, base + i * 16 + (1ull << 40), &check));
        assert_false(client_pycodes_lookup(&codes, (base + i * 16) ^ (1ull << 20), &check));
    }
    /* The last of each slot's four stays. */
    assert_int_equal(hits, CLIENT_PYCODES_SLOTS);
}

/* Unaligned and out-of-range addresses are never kept; 0 is never found. */
static void test_refused(void **state)
{
    (void)state;
    client_pycodes_clear(&codes);
    uint32_t check;
    client_pycodes_put(&codes, 0x7f0000000008ull, 1);
    assert_false(client_pycodes_lookup(&codes, 0x7f0000000008ull, &check));
    client_pycodes_put(&codes, 1ull << 47, 1);
    assert_false(client_pycodes_lookup(&codes, 1ull << 47, &check));
    assert_false(client_pycodes_lookup(&codes, 0, &check));
    for (uint32_t i = 0; i < CLIENT_PYCODES_SLOTS; i++)
        assert_int_equal(atomic_load(&codes.slot[i]), 0);
}

/* Sent marks: per session epoch, kept by a put of the same entry, lost with another
 * check or a forget, cleared by unmark_all; lookups see through them. */
static void test_sent_marks(void **state)
{
    (void)state;
    client_pycodes_clear(&codes);
    uint64_t a = 0x7f1234567890ull, e1 = client_pycodes_epoch(1), e2 = client_pycodes_epoch(2);
    uint32_t check = 0;
    assert_true(e1 >= 1 && e1 <= 63 && e1 != e2);
    assert_int_equal(client_pycodes_epoch(63), client_pycodes_epoch(0));
    assert_false(client_pycodes_sent(&codes, a, 0x1234, e1));
    /* Not kept: nothing to mark. */
    client_pycodes_mark_sent(&codes, a, 0x1234, e1);
    assert_false(client_pycodes_sent(&codes, a, 0x1234, e1));
    client_pycodes_put(&codes, a, 0x1234);
    client_pycodes_mark_sent(&codes, a, 0x1235, e1); /* another object now */
    assert_false(client_pycodes_sent(&codes, a, 0x1234, e1));
    client_pycodes_mark_sent(&codes, a, 0x1234, e1);
    assert_true(client_pycodes_sent(&codes, a, 0x1234, e1));
    assert_false(client_pycodes_sent(&codes, a, 0x1234, e2));
    assert_false(client_pycodes_sent(&codes, a, 0x1235, e1));
    assert_true(client_pycodes_lookup(&codes, a, &check));
    assert_int_equal(check, 0x1234);
    /* The same put keeps the mark; another check drops it. */
    client_pycodes_put(&codes, a, 0x1234);
    assert_true(client_pycodes_sent(&codes, a, 0x1234, e1));
    client_pycodes_put(&codes, a, 0x1235);
    assert_false(client_pycodes_sent(&codes, a, 0x1235, e1));
    /* A forget of a marked entry forgets it. */
    client_pycodes_mark_sent(&codes, a, 0x1235, e1);
    client_pycodes_forget(&codes, a);
    assert_false(client_pycodes_lookup(&codes, a, &check));
    /* A session start clears every mark and keeps the entries. */
    client_pycodes_put(&codes, a, 0x1234);
    client_pycodes_mark_sent(&codes, a, 0x1234, e2);
    client_pycodes_unmark_all(&codes);
    assert_false(client_pycodes_sent(&codes, a, 0x1234, e2));
    assert_true(client_pycodes_lookup(&codes, a, &check));
    assert_int_equal(check, 0x1234);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_lookup_forget),
        cmocka_unit_test(test_no_alias),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_sent_marks),
    };
    return cmocka_run_group_tests_name("pycodes", tests, NULL, NULL);
}
