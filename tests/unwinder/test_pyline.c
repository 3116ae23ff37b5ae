/* tests/unwinder/test_pyline.c: lines from CPython 3.11 location tables
 * (unwinder_py_line()), against what CPython itself says. The vector below is the
 * co_linetable of a small function compiled by CPython 3.11 and the line of each of its
 * code units from co_lines() (0: none). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "unwinder/unwinder.h"

static const uint8_t table[] = {
    128, 0,   216, 8,   9,  136, 65, 137, 5,   128, 65,  224, 8,   29,  208, 8,   29,  149,
    69,  152, 33,  145, 72, 148, 72, 208, 8,   29,  209, 8,   29,  212, 8,   29,  128, 65,
    216, 7,   8,   240, 0,  2,   5,  14,  221, 15,  18,  144, 49,  137, 118, 140, 118, 216,
    12,  13,  241, 3,   1,  16,  14, 240, 0,   1,   9,   14,  229, 10,  20,  216, 8,   12,
    241, 3,   1,   11,  14, 244, 0,  1,   11,  14,  240, 0,   1,   5,   14};
static const int first = 1;
static const int want[66] = {1, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
                             4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
                             6, 6, 6, 7, 6, 6, 6, 8, 8, 8, 8, 8, 8, 9, 8, 8, 8, 8, 8, 8, 8, 8};

static void test_every_unit(void **state)
{
    (void)state;
    for (int i = 0; i < (int)(sizeof(want) / sizeof(want[0])); i++)
        assert_int_equal(unwinder_py_line(table, sizeof(table), first, i), want[i]);
}

/* Before the first instruction: the first line; past the table, or a table cut short or
 * not starting an entry: 0, never a read past its end. */
static void test_edges(void **state)
{
    (void)state;
    assert_int_equal(unwinder_py_line(table, sizeof(table), first, -1), first);
    assert_int_equal(unwinder_py_line(table, sizeof(table), first, 100000), 0);
    for (size_t len = 0; len < sizeof(table); len++)
        (void)unwinder_py_line(table, len, first, 60);
    static const uint8_t bad[] = {0x10, 0x80};
    assert_int_equal(unwinder_py_line(bad, sizeof(bad), 5, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_unit),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests_name("unwinder_pyline", tests, NULL, NULL);
}
