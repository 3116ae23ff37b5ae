/* tests/unwinder/test_perfmap.c: the perf map reader (unwinder/perfmap.c): its line
 * parser on good and hostile lines, and the reading of a growing file in which later
 * lines supersede earlier ones for the same addresses. */
#include <stdbool.h>
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

#include "unwinder/unwinder_internal.h"

static int parse(const char *line, uint64_t *start, uint64_t *size, char *name, size_t cap)
{
    size_t off, len;
    int r = unwinder__perfmap_parse_line(line, strlen(line), start, size, &off, &len);
    if (r == 0) {
        assert_true(len < cap);
        memcpy(name, line + off, len);
        name[len] = '\0';
    }
    return r;
}

static void test_perfmap_parse_lines(void **state)
{
    (void)state;
    uint64_t start, size;
    char name[64];
    assert_int_equal(parse("3f34ae959236 d JS:~f a.js:1:2", &start, &size, name, sizeof(name)), 0);
    assert_int_equal(start, 0x3f34ae959236);
    assert_int_equal(size, 0xd);
    assert_string_equal(name, "JS:~f a.js:1:2");
    assert_int_equal(parse("0x10 0X20 x", &start, &size, name, sizeof(name)), 0);
    assert_int_equal(start, 0x10);
    assert_int_equal(size, 0x20);
    /* Not lines of a perf map: no name, an empty or wrapping range, too many digits,
     * other separators, a NUL in the name. */
    assert_int_not_equal(parse("10 20", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("10 20 ", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("10 0 x", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("ffffffffffffffff 2 x", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("10000000000000000 2 x", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("10\t20 x", &start, &size, name, sizeof(name)), 0);
    assert_int_not_equal(parse("g 20 x", &start, &size, name, sizeof(name)), 0);
    size_t off, len;
    assert_int_not_equal(unwinder__perfmap_parse_line("1 2 a\0b", 7, &start, &size, &off, &len), 0);
}

static const char *lookup(struct unwinder__perfmap *pm, uint64_t pc, char *buf, size_t cap)
{
    size_t len;
    const char *n = unwinder__perfmap_lookup(pm, pc, &len);
    if (!n)
        return NULL;
    assert_true(len < cap);
    memcpy(buf, n, len);
    buf[len] = '\0';
    return buf;
}

static void append(int fd, const char *s)
{
    assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* A growing file: lines come in over reads, a partial last line waits for its end, and
 * a later line wins over the part of an earlier one it covers. */
static void test_perfmap_bug_later_line_supersedes(void **state)
{
    (void)state;
    int fd = memfd_create("perfmap", MFD_CLOEXEC);
    assert_true(fd >= 0);
    struct unwinder__perfmap *pm = unwinder__perfmap_new(fd);
    assert_non_null(pm);
    char buf[64];
    append(fd, "1000 100 old\n2000 10 other\n30");
    assert_true(unwinder__perfmap_read(pm));
    assert_string_equal(lookup(pm, 0x1080, buf, sizeof(buf)), "old");
    assert_null(lookup(pm, 0x3000, buf, sizeof(buf))); /* its line is not complete yet */
    assert_null(lookup(pm, 0x2010, buf, sizeof(buf)));
    assert_false(unwinder__perfmap_read(pm));
    append(fd, "00 8 third\n1040 20 new\n");
    assert_true(unwinder__perfmap_read(pm));
    assert_string_equal(lookup(pm, 0x3004, buf, sizeof(buf)), "third");
    assert_string_equal(lookup(pm, 0x1000, buf, sizeof(buf)), "old");
    assert_string_equal(lookup(pm, 0x1050, buf, sizeof(buf)), "new");
    assert_string_equal(lookup(pm, 0x1060, buf, sizeof(buf)), "old");
    assert_string_equal(lookup(pm, 0x10ff, buf, sizeof(buf)), "old");
    assert_null(lookup(pm, 0x1100, buf, sizeof(buf)));
    /* The same range again: the latest name. */
    append(fd, "1000 100 newest\ngarbage line\n");
    assert_true(unwinder__perfmap_read(pm));
    assert_string_equal(lookup(pm, 0x1050, buf, sizeof(buf)), "newest");
    assert_string_equal(lookup(pm, 0x2000, buf, sizeof(buf)), "other");
    assert_true(unwinder__perfmap_valid(pm));
    unwinder__perfmap_free(pm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perfmap_parse_lines),
        cmocka_unit_test(test_perfmap_bug_later_line_supersedes),
    };
    return cmocka_run_group_tests_name("unwinder_perfmap", tests, NULL, NULL);
}
