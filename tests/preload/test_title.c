/* tests/preload/test_title.c: the title the client sends at exit (preload/title.c): the
 * argv area read from /proc/PID/stat, and the title copied from memory as the kernel's
 * /proc/PID/cmdline gives it, checked against the kernel on this very process. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/title.h"

static char **test_argv;

static size_t read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    size_t len = 0;
    ssize_t n;
    while (len < cap && (n = read(fd, buf + len, cap - len)) > 0)
        len += (size_t)n;
    close(fd);
    return len;
}

static struct client_title_area own_area(void)
{
    char buf[1024];
    size_t len = read_file("/proc/self/stat", buf, sizeof(buf));
    struct client_title_area a;
    assert_int_equal(client_title_parse_stat(buf, len, &a), 0);
    return a;
}

/* Our copy equals the kernel's /proc/self/cmdline. */
static void check_same_as_kernel(void)
{
    struct client_title_area a = own_area();
    static char ours[8192], kernels[8192];
    size_t n = client_title_copy(&a, ours, sizeof(ours));
    size_t k = read_file("/proc/self/cmdline", kernels, sizeof(kernels));
    assert_true(n > 0);
    assert_int_equal(n, k);
    assert_memory_equal(ours, kernels, n);
}

static void test_title_parse_own_stat(void **state)
{
    (void)state;
    struct client_title_area a = own_area();
    assert_ptr_equal((char *)a.arg_start, test_argv[0]);
    assert_true(a.arg_start < a.arg_end && a.arg_end <= a.env_start && a.env_start < a.env_end);
}

static void test_title_parse_hostile(void **state)
{
    (void)state;
    struct client_title_area a;
    /* A command name with ") " and digits in it: the fields start after its last ')'. */
    const char tail[] = " S 1 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 1 1 "
                        "18446744073709551615 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 "
                        "1 1 1 100 200 200 300 0";
    char line[512];
    snprintf(line, sizeof(line), "42 (a) 7 8 (x)%s", tail);
    assert_int_equal(client_title_parse_stat(line, strlen(line), &a), 0);
    assert_int_equal(a.arg_start, 100);
    assert_int_equal(a.arg_end, 200);
    assert_int_equal(a.env_start, 200);
    assert_int_equal(a.env_end, 300);
    /* Cut short (a kernel before 3.5 has no such fields), no parenthesis, garbage,
     * an overflow, an empty argv area. */
    assert_int_equal(client_title_parse_stat(line, strlen(line) - 10, &a), -1);
    assert_int_equal(client_title_parse_stat("42 x S 1", 8, &a), -1);
    snprintf(line, sizeof(line), "42 (a)%s", " S  1");
    assert_int_equal(client_title_parse_stat(line, strlen(line), &a), -1);
    char big[600];
    snprintf(big, sizeof(big), "42 (a)%.*s 99999999999999999999 200 200 300 0",
             (int)(strlen(tail) - strlen(" 100 200 200 300 0")), tail);
    assert_int_equal(client_title_parse_stat(big, strlen(big), &a), -1);
    snprintf(big, sizeof(big), "42 (a)%.*s 200 200 200 300 0",
             (int)(strlen(tail) - strlen(" 100 200 200 300 0")), tail);
    assert_int_equal(client_title_parse_stat(big, strlen(big), &a), -1);
}

/* Made-up areas: the arguments, a title over them and on into the environment, a title
 * where the environment does not follow, and a cap. */
static void test_title_copy_rules(void **state)
{
    (void)state;
    char mem[64] = "prog\0-a\0b\0HOME=/x\0PATH=/y";
    struct client_title_area a = {(uintptr_t)mem, (uintptr_t)mem + 10, (uintptr_t)mem + 10,
                                  (uintptr_t)mem + 25};
    char out[64];
    assert_int_equal(client_title_copy(&a, out, sizeof(out)), 10);
    assert_memory_equal(out, "prog\0-a\0b", 10);
    assert_int_equal(client_title_copy(&a, out, 3), 3);
    /* A title longer than the arguments: the byte that ended them is overwritten. */
    memcpy(mem, "server: a long role", 20);
    assert_int_equal(client_title_copy(&a, out, sizeof(out)), 20);
    assert_string_equal(out, "server: a long role");
    /* Without a NUL before the environment's end: up to there. */
    memset(mem, 'x', 25);
    assert_int_equal(client_title_copy(&a, out, sizeof(out)), 25);
    /* The environment elsewhere: the title stops at the arguments' end. */
    a.env_start = a.env_end = (uintptr_t)mem + 40;
    assert_int_equal(client_title_copy(&a, out, sizeof(out)), 10);
    struct client_title_area none = {0, 0, 0, 0};
    assert_int_equal(client_title_copy(&none, out, sizeof(out)), 0);
}

/* On this process, as the kernel reads it: the arguments, then a title written over
 * them padded with NULs (nginx), then one running on into the environment (postgres
 * with a long title), then one padded with spaces. */
static void test_title_copy_matches_kernel(void **state)
{
    (void)state;
    struct client_title_area a = own_area();
    check_same_as_kernel();
    char *area = (char *)a.arg_start;
    size_t args = a.arg_end - a.arg_start;
    char *saved = malloc(a.env_end - a.arg_start);
    memcpy(saved, area, a.env_end - a.arg_start);
    memset(area, 0, args);
    memcpy(area, "test: worker", 12);
    check_same_as_kernel();
    size_t over = args + (a.env_end - a.env_start) / 2;
    memset(area, 'w', over);
    area[over] = '\0';
    check_same_as_kernel();
    memset(area, ' ', args - 1);
    memcpy(area, "test: master", 12);
    area[args - 1] = '\0';
    check_same_as_kernel();
    memcpy(area, saved, a.env_end - a.arg_start);
    free(saved);
    check_same_as_kernel();
}

int main(int argc, char **argv)
{
    (void)argc;
    test_argv = argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_title_parse_own_stat),
        cmocka_unit_test(test_title_parse_hostile),
        cmocka_unit_test(test_title_copy_rules),
        cmocka_unit_test(test_title_copy_matches_kernel),
    };
    return cmocka_run_group_tests_name("title", tests, NULL, NULL);
}
