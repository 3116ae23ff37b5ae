/* tests/unwinder/test_maps.c: the /proc/PID/maps parser on sample and hostile text. */
/* cmocka.h needs these first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unwinder/maps.h"

static const char SAMPLE[] =
    "55d0c1a00000-55d0c1a02000 r--p 00000000 fe:00 247134                     /usr/bin/cat\n"
    "55d0c1a02000-55d0c1a07000 r-xp 00002000 fe:00 247134                     /usr/bin/cat\n"
    "55d0c2b3e000-55d0c2b5f000 rw-p 00000000 00:00 0                          [heap]\n"
    "7f1c2a021000-7f1c2a1b6000 r-xp 00026000 fe:00 332835                     "
    "/usr/lib/x86_64-linux-gnu/libc.so.6\n"
    "7f1c2a300000-7f1c2a301000 r-xp 00001000 08:11 99                         "
    "/home/u/My Programs/lib with spaces.so\n"
    "7f1c2a400000-7f1c2a401000 r-xs 00000000 00:05 1234                       "
    "/memfd:jit (deleted)\n"
    "7f1c2a500000-7f1c2a600000 rwxp 00000000 00:00 0 \n"
    "7ffd5a1e4000-7ffd5a205000 rw-p 00000000 00:00 0                          [stack]\n"
    "7ffd5a2f2000-7ffd5a2f4000 r-xp 00000000 00:00 0                          [vdso]\n"
    "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n";

static void parse_ok(const char *text, struct unwinder__maps *m)
{
    assert_int_equal(unwinder__maps_parse(text, strlen(text), m), 0);
}

static void test_maps_parse_sample(void **state)
{
    (void)state;
    struct unwinder__maps m;
    parse_ok(SAMPLE, &m);
    assert_int_equal(m.n, 10);
    assert_int_equal(m.bad_lines, 0);

    assert_int_equal(m.v[0].start, 0x55d0c1a00000);
    assert_int_equal(m.v[0].end, 0x55d0c1a02000);
    assert_int_equal(m.v[0].perms, UNWINDER_PERM_READ);
    assert_int_equal(m.v[0].dev_major, 0xfe);
    assert_int_equal(m.v[0].dev_minor, 0);
    assert_int_equal(m.v[0].inode, 247134);
    assert_string_equal(m.v[0].path, "/usr/bin/cat");
    assert_int_equal(m.v[0].path_len, strlen("/usr/bin/cat"));

    assert_int_equal(m.v[1].pgoff, 0x2000);
    assert_int_equal(m.v[1].perms, UNWINDER_PERM_READ | UNWINDER_PERM_EXEC);
    assert_string_equal(m.v[2].path, "[heap]");
    assert_int_equal(m.v[2].perms, UNWINDER_PERM_READ | UNWINDER_PERM_WRITE);
    assert_string_equal(m.v[3].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    assert_int_equal(m.v[3].pgoff, 0x26000);
    assert_string_equal(m.v[4].path, "/home/u/My Programs/lib with spaces.so");
    assert_int_equal(m.v[4].dev_major, 8);
    assert_int_equal(m.v[4].dev_minor, 0x11);
    assert_string_equal(m.v[5].path, "/memfd:jit (deleted)");
    assert_int_equal(m.v[5].perms, UNWINDER_PERM_READ | UNWINDER_PERM_EXEC | UNWINDER_PERM_SHARED);
    assert_string_equal(m.v[6].path, ""); /* anonymous, trailing space */
    assert_int_equal(m.v[6].perms, UNWINDER_PERM_READ | UNWINDER_PERM_WRITE | UNWINDER_PERM_EXEC);
    assert_string_equal(m.v[7].path, "[stack]");
    assert_string_equal(m.v[8].path, "[vdso]");
    assert_int_equal(m.v[9].start, 0xffffffffff600000);
    assert_int_equal(m.v[9].perms, UNWINDER_PERM_EXEC);
    unwinder__maps_done(&m);
    assert_null(m.v);
}

static void test_maps_find(void **state)
{
    (void)state;
    struct unwinder__maps m;
    parse_ok(SAMPLE, &m);
    assert_int_equal(unwinder__maps_find(&m, 0), -1);
    assert_int_equal(unwinder__maps_find(&m, 0x55d0c19fffff), -1);
    assert_int_equal(unwinder__maps_find(&m, 0x55d0c1a00000), 0);
    assert_int_equal(unwinder__maps_find(&m, 0x55d0c1a01fff), 0);
    assert_int_equal(unwinder__maps_find(&m, 0x55d0c1a02000), 1);  /* adjacent mapping */
    assert_int_equal(unwinder__maps_find(&m, 0x55d0c1a07000), -1); /* gap */
    assert_int_equal(unwinder__maps_find(&m, 0x7f1c2a1b5fff), 3);
    assert_int_equal(unwinder__maps_find(&m, 0x7ffd5a1e4010), 7);
    assert_int_equal(unwinder__maps_find(&m, 0xffffffffff600fff), 9);
    assert_int_equal(unwinder__maps_find(&m, UINT64_MAX), -1);
    unwinder__maps_done(&m);

    struct unwinder__maps empty;
    parse_ok("", &empty);
    assert_int_equal(empty.n, 0);
    assert_int_equal(unwinder__maps_find(&empty, 0x1000), -1);
    unwinder__maps_done(&empty);
}

static void test_maps_bad_lines_skipped(void **state)
{
    (void)state;
    static const char text[] =
        "garbage\n"
        "1000-2000 r-xp 00000000 00:00 0 /ok/first\n"
        "3000-\n"                                                   /* truncated */
        "3000-4000 r-xp\n"                                          /* truncated */
        "3000-4000 rzxp 00000000 00:00 0 /bad/perms\n"              /* bad perms */
        "5000-4000 r-xp 00000000 00:00 0 /bad/reversed\n"           /* start > end */
        "6000-6000 r-xp 00000000 00:00 0 /bad/empty\n"              /* empty range */
        "10000000000000000-10000000000000001 r-xp 0 0:0 0\n"        /* 17 hex digits */
        "7000-8000 r-xp 0 0:0 99999999999999999999999 /bad/inode\n" /* overflow */
        "\n"
        "9000-a000 r-xp 00000000 00:00 0/no/space\n"
        "1800-2800 r-xp 00000000 00:00 0 /bad/overlaps-first\n"
        "b000-c000 r--p 00001000 01:02 7 /ok/last-without-newline";
    struct unwinder__maps m;
    parse_ok(text, &m);
    assert_int_equal(m.n, 2);
    assert_string_equal(m.v[0].path, "/ok/first");
    assert_string_equal(m.v[1].path, "/ok/last-without-newline");
    assert_int_equal(m.v[1].pgoff, 0x1000);
    assert_int_equal(m.bad_lines, 10);
    unwinder__maps_done(&m);
}

static void test_maps_unsorted_input_is_sorted(void **state)
{
    (void)state;
    static const char text[] = "5000-6000 r-xp 0 0:0 0 /c\n"
                               "1000-2000 r-xp 0 0:0 0 /a\n"
                               "3000-4000 r-xp 0 0:0 0 /b\n";
    struct unwinder__maps m;
    parse_ok(text, &m);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.v[0].path, "/a");
    assert_string_equal(m.v[1].path, "/b");
    assert_string_equal(m.v[2].path, "/c");
    assert_int_equal(unwinder__maps_find(&m, 0x3800), 1);
    unwinder__maps_done(&m);
}

static void test_maps_embedded_nul_and_binary(void **state)
{
    (void)state;
    static const char text[] = "1000-2000 r-xp 0 0:0 0 /a\0hidden\n"
                               "\xff\xfe\x00\x01-\n"
                               "3000-4000 r-xp 0 0:0 0 /b\n";
    struct unwinder__maps m;
    assert_int_equal(unwinder__maps_parse(text, sizeof(text) - 1, &m), 0);
    assert_int_equal(m.n, 2);
    assert_string_equal(m.v[0].path, "/a");
    assert_int_equal(m.v[0].path_len, 2);
    assert_string_equal(m.v[1].path, "/b");
    unwinder__maps_done(&m);

    /* Random bytes (seed 7): must not crash, and whatever parses is sorted and disjoint. */
    uint64_t x = 7;
    char buf[4096];
    for (int iter = 0; iter < 200; iter++) {
        for (size_t i = 0; i < sizeof(buf); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            /* Mostly maps-like characters so some lines get far into the parser. */
            static const char alpha[] = "0123456789abcdef-: rwxp/\n";
            buf[i] = (x >> 32) % 4 ? alpha[(x >> 8) % (sizeof(alpha) - 1)] : (char)x;
        }
        assert_int_equal(unwinder__maps_parse(buf, sizeof(buf), &m), 0);
        for (size_t i = 0; i < m.n; i++) {
            assert_true(m.v[i].start < m.v[i].end);
            if (i)
                assert_true(m.v[i - 1].end <= m.v[i].start);
            assert_int_equal(strlen(m.v[i].path), m.v[i].path_len);
        }
        unwinder__maps_done(&m);
    }
}

static void test_maps_read_self(void **state)
{
    (void)state;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct unwinder__maps m;
    assert_int_equal(unwinder__maps_read(fd, &m), 0);
    /* Twice from the same fd: pread from offset 0 needs no rewind. */
    struct unwinder__maps m2;
    assert_int_equal(unwinder__maps_read(fd, &m2), 0);
    close(fd);
    assert_true(m.n > 5);
    assert_int_equal(m.bad_lines, 0);
    ssize_t i = unwinder__maps_find(&m, (uint64_t)(uintptr_t)&test_maps_read_self);
    assert_true(i >= 0);
    assert_true(m.v[i].perms & UNWINDER_PERM_EXEC);
    assert_true(strstr(m.v[i].path, "test_maps") != NULL);
    int local;
    i = unwinder__maps_find(&m, (uint64_t)(uintptr_t)&local);
    assert_true(i >= 0);
    assert_string_equal(m.v[i].path, "[stack]");
    unwinder__maps_done(&m);
    unwinder__maps_done(&m2);

    assert_int_equal(unwinder__maps_read(-1, &m), -EBADF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps_parse_sample),
        cmocka_unit_test(test_maps_find),
        cmocka_unit_test(test_maps_bad_lines_skipped),
        cmocka_unit_test(test_maps_unsorted_input_is_sorted),
        cmocka_unit_test(test_maps_embedded_nul_and_binary),
        cmocka_unit_test(test_maps_read_self),
    };
    return cmocka_run_group_tests_name("unwinder_maps", tests, NULL, NULL);
}
