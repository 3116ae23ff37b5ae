/* tests/e2e/test_inject_safe.c: the injection's safe point (service/inject.c), on fresh
 * processes, where dlopen really maps and relocates the library and allocates.
 *
 * tests/programs/inject_busy has no idle thread: every thread spends most of its time in
 * glibc's allocator, half of it reached through aligned_alloc's tail jump. A thread taken
 * while it holds an arena lock deadlocks inside dlopen's calloc. With the safe-point check
 * each of INJECT_LOADS fresh processes is attached and keeps running; without it (the
 * negative control, HEAPPROF_TEST_INJECT_ANYWHERE=1) the call hangs within a few loads:
 * 13 of 20 loads hung on a 2-core machine, so the chance that 30 all pass by luck is
 * below 1e-13 at that rate; the control stops at the first hang. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

#define INJECT_LOADS 15
#define CONTROL_LOADS 30

static char runtime_dir[256];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "inject-safe");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* `heapprof attach -p PID` for 0.2 s; its output in @ret. */
static void attach_once(pid_t pid, bool anywhere, struct e2e_run *ret)
{
    char pids[16];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pids,
                    "--duration",
                    "0.2",
                    "--no-status",
                    "-q",
                    "--no-source-lines",
                    "-o",
                    trace,
                    NULL};
    char *env[] = {anywhere ? "HEAPPROF_TEST_INJECT_ANYWHERE=1" : "HEAPPROF_TEST_INJECT_ANYWHERE=0",
                   NULL};
    assert_int_equal(e2e_run(argv, env, ret), 0);
    unlink(trace);
    free(trace);
}

static void test_inject_first_load_busy_process(void **state)
{
    (void)state;
    for (int i = 0; i < INJECT_LOADS; i++) {
        struct e2e_target t;
        char *argv[] = {(char *)e2e_env("INJECT_BUSY"), "1", NULL};
        assert_int_equal(e2e_target_start(&t, runtime_dir, argv, NULL, "ready"), 0);
        struct e2e_run r;
        attach_once(t.pid, false, &r);
        if (r.status != 0)
            fprintf(stderr, "load %d: rc %d: %s\n", i, r.status, r.err);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.err, "libheapprof.so loaded"));
        e2e_run_free(&r);
        assert_true(e2e_alive(t.pid));
        /* Its blocks still hold their fill, every thread ends. */
        assert_int_equal(e2e_target_finish(&t, 0), 0);
    }
}

static void test_inject_bug_no_safe_point_deadlocks(void **state)
{
    (void)state;
    int hung = 0, tries = 0;
    for (; tries < CONTROL_LOADS && !hung; tries++) {
        struct e2e_target t;
        char *argv[] = {(char *)e2e_env("INJECT_BUSY"), "1", NULL};
        assert_int_equal(e2e_target_start(&t, runtime_dir, argv, NULL, "ready"), 0);
        struct e2e_run r;
        attach_once(t.pid, true, &r);
        if (r.status != 0 && strstr(r.err, "did not return"))
            hung++;
        e2e_run_free(&r);
        (void)e2e_target_finish(&t, SIGKILL);
    }
    fprintf(stderr, "negative control: hung at load %d of at most %d\n", tries, CONTROL_LOADS);
    assert_int_equal(hung, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inject_first_load_busy_process),
        cmocka_unit_test(test_inject_bug_no_safe_point_deadlocks),
    };
    return cmocka_run_group_tests_name("e2e_inject_safe", tests, setup, teardown);
}
