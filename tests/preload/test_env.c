/* tests/preload/test_env.c: removing the profiler from an environment array
 * (preload/env.c), on arrays built by the tests. */
#include <stdio.h>
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

#include "preload/env.h"

#define LIB "/opt/hp/lib/libheapprof.so"

static const char *const names[] = {"HEAPPROF_SOCKET", "HEAPPROF_STARTUP", "HEAPPROF_SEED",
                                    "HEAPPROF_FOLLOW_EXEC", NULL};

/* A writable copy of @in (NULL-terminated), as the kernel hands the environment over.
 * Strings live in one block; the array has room for a canary after the NULL. */
struct env_copy {
    char *env[32];
    char store[4096];
};

static void env_copy_init(struct env_copy *c, const char *const *in)
{
    size_t off = 0, i = 0;
    memset(c, 0, sizeof(*c));
    for (; in[i]; i++) {
        size_t n = strlen(in[i]) + 1;
        assert_true(off + n <= sizeof(c->store) && i + 2 < 32);
        memcpy(c->store + off, in[i], n);
        c->env[i] = c->store + off;
        off += n;
    }
    c->env[i] = NULL;
    c->env[i + 1] = (char *)"canary";
}

/* Scrubs a copy of @in and compares with @want (NULL-terminated); returns the changes. */
static size_t scrub_expect(const char *const *in, const char *const *want)
{
    struct env_copy c;
    env_copy_init(&c, in);
    size_t n_in = 0;
    while (in[n_in])
        n_in++;
    size_t changes = client_env_scrub(c.env, names, CLIENT_LIB_NAME);
    size_t i = 0;
    for (; want[i]; i++) {
        assert_non_null(c.env[i]);
        assert_string_equal(c.env[i], want[i]);
    }
    assert_null(c.env[i]);
    /* Nothing written past the original terminator. */
    assert_string_equal(c.env[n_in + 1], "canary");
    return changes;
}

/* LD_PRELOAD=@value scrubbed; @want NULL: the variable is gone. Returns the changes. */
static size_t preload_expect(const char *value, const char *want)
{
    char in_var[1024], want_var[1024];
    snprintf(in_var, sizeof(in_var), "LD_PRELOAD=%s", value);
    const char *in[] = {"HOME=/root", in_var, "PATH=/bin", NULL};
    if (!want) {
        const char *out[] = {"HOME=/root", "PATH=/bin", NULL};
        return scrub_expect(in, out);
    }
    snprintf(want_var, sizeof(want_var), "LD_PRELOAD=%s", want);
    const char *out[] = {"HOME=/root", want_var, "PATH=/bin", NULL};
    return scrub_expect(in, out);
}

static void test_env_is_lib(void **state)
{
    (void)state;
    const char *s = "libheapprof.so";
    assert_true(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = LIB;
    assert_true(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = "/usr/$LIB/libheapprof.so";
    assert_true(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = "/opt/libheapprof.so.1";
    assert_false(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = "/opt/mylibheapprof.so";
    assert_false(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = "/opt/libheapprof.so/";
    assert_false(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    s = "libheapprof.s";
    assert_false(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    /* Only @len bytes count: an entry cut out of a longer list. */
    s = LIB ":/lib/libm.so.6";
    assert_true(client_env_is_lib(s, strlen(LIB), CLIENT_LIB_NAME));
    assert_false(client_env_is_lib(s, strlen(s), CLIENT_LIB_NAME));
    assert_false(client_env_is_lib(s, 0, CLIENT_LIB_NAME));
}

static void test_env_preload_alone(void **state)
{
    (void)state;
    assert_int_equal(preload_expect(LIB, NULL), 2); /* one entry, one variable */
    assert_int_equal(preload_expect("libheapprof.so", NULL), 2);
    /* Separators around it count for nothing. */
    assert_int_equal(preload_expect(" " LIB ": ", NULL), 2);
}

static void test_env_preload_first(void **state)
{
    (void)state;
    assert_int_equal(preload_expect(LIB ":/lib/libm.so.6", "/lib/libm.so.6"), 1);
    assert_int_equal(preload_expect(LIB ":/lib/a.so:/lib/b.so", "/lib/a.so:/lib/b.so"), 1);
}

static void test_env_preload_middle(void **state)
{
    (void)state;
    assert_int_equal(preload_expect("/lib/a.so:" LIB ":/lib/b.so", "/lib/a.so:/lib/b.so"), 1);
    assert_int_equal(preload_expect("/lib/a.so " LIB " /lib/b.so", "/lib/a.so /lib/b.so"), 1);
}

static void test_env_preload_last(void **state)
{
    (void)state;
    assert_int_equal(preload_expect("/lib/a.so:/lib/b.so:" LIB, "/lib/a.so:/lib/b.so"), 1);
    assert_int_equal(preload_expect("/lib/a.so " LIB, "/lib/a.so"), 1);
}

static void test_env_preload_separators(void **state)
{
    (void)state;
    /* Spaces and colons, mixed and repeated: the kept entries keep the run that preceded
     * them; the ends are trimmed. */
    assert_int_equal(preload_expect("/lib/a.so  " LIB ": /lib/b.so", "/lib/a.so: /lib/b.so"), 1);
    assert_int_equal(preload_expect(" :" LIB " /lib/a.so:: /lib/b.so ", "/lib/a.so:: /lib/b.so"),
                     1);
    assert_int_equal(preload_expect("/lib/a.so:" LIB ":", "/lib/a.so"), 1);
}

static void test_env_preload_duplicates(void **state)
{
    (void)state;
    assert_int_equal(preload_expect(LIB ":/lib/a.so:libheapprof.so:" LIB, "/lib/a.so"), 3);
    assert_int_equal(preload_expect(LIB " " LIB, NULL), 3);
    /* Two LD_PRELOAD variables: both are cleaned. */
    const char *in[] = {"LD_PRELOAD=" LIB ":/lib/a.so", "X=1", "LD_PRELOAD=" LIB, NULL};
    const char *want[] = {"LD_PRELOAD=/lib/a.so", "X=1", NULL};
    assert_int_equal(scrub_expect(in, want), 3);
}

static void test_env_preload_absent(void **state)
{
    (void)state;
    /* Not ours: untouched, separators and all. */
    assert_int_equal(preload_expect(" /lib/a.so::/lib/b.so ", " /lib/a.so::/lib/b.so "), 0);
    assert_int_equal(preload_expect("/opt/libheapprof.so.1", "/opt/libheapprof.so.1"), 0);
    assert_int_equal(preload_expect("", ""), 0);
    assert_int_equal(preload_expect(":", ":"), 0);
    const char *none[] = {"HOME=/root", "PATH=/bin", NULL};
    assert_int_equal(scrub_expect(none, none), 0);
    const char *empty[] = {NULL};
    assert_int_equal(scrub_expect(empty, empty), 0);
    assert_int_equal(client_env_scrub(NULL, names, CLIENT_LIB_NAME), 0);
}

static void test_env_variables(void **state)
{
    (void)state;
    const char *in[] = {"HEAPPROF_SOCKET=/tmp/x/heapprofd.sock",
                        "HOME=/root",
                        "HEAPPROF_STARTUP=1",
                        "HEAPPROF_SEED=7",
                        "LD_PRELOAD=" LIB ":/lib/libm.so.6",
                        "HEAPPROF_FOLLOW_EXEC=0",
                        "HEAPPROF_LIB=/elsewhere/libheapprof.so", /* not in names: kept */
                        "HEAPPROF_SOCKETX=1",                     /* another name: kept */
                        "HEAPPROF_SEED",                          /* no '=': kept */
                        "PATH=/bin",
                        NULL};
    const char *want[] = {"HOME=/root",
                          "LD_PRELOAD=/lib/libm.so.6",
                          "HEAPPROF_LIB=/elsewhere/libheapprof.so",
                          "HEAPPROF_SOCKETX=1",
                          "HEAPPROF_SEED",
                          "PATH=/bin",
                          NULL};
    assert_int_equal(scrub_expect(in, want), 5);
    /* Adjacent entries to remove, at both ends. */
    const char *in2[] = {"HEAPPROF_SEED=1",    "LD_PRELOAD=" LIB,   "A=1",
                         "HEAPPROF_STARTUP=1", "HEAPPROF_SOCKET=s", NULL};
    const char *want2[] = {"A=1", NULL};
    assert_int_equal(scrub_expect(in2, want2), 5);
    /* A second pass finds nothing. */
    struct env_copy c;
    env_copy_init(&c, in2);
    assert_int_equal(client_env_scrub(c.env, names, CLIENT_LIB_NAME), 5);
    assert_int_equal(client_env_scrub(c.env, names, CLIENT_LIB_NAME), 0);
    assert_string_equal(c.env[0], "A=1");
    assert_null(c.env[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_is_lib),
        cmocka_unit_test(test_env_preload_alone),
        cmocka_unit_test(test_env_preload_first),
        cmocka_unit_test(test_env_preload_middle),
        cmocka_unit_test(test_env_preload_last),
        cmocka_unit_test(test_env_preload_separators),
        cmocka_unit_test(test_env_preload_duplicates),
        cmocka_unit_test(test_env_preload_absent),
        cmocka_unit_test(test_env_variables),
    };
    return cmocka_run_group_tests_name("env", tests, NULL, NULL);
}
