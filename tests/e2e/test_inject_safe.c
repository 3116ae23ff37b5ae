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
#include <fcntl.h>
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

#include "tests/e2e/e2e_daemon.h"
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

/* The library's constructor runs inside the injected dlopen, on a thread taken for it: it
 * must not make the startup handshake a preloaded library makes when a daemon's socket
 * exists (a wait of up to a second in that thread, with the loader's lock held). Before,
 * a heapprofd --all took the process as one starting up (from_startup), and the attach
 * that had loaded the library was refused as "already being profiled". */
static void test_inject_bug_startup_handshake_in_dlopen(void **state)
{
    (void)state;
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "inject-startup");
    const char *args[] = {"--all", "--no-status", NULL};
    e2e_daemon_launch(&d, args);
    int in[2];
    assert_int_equal(pipe(in), 0); /* inject_busy ends at EOF on its stdin */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(in[0], 0);
        close(in[1]);
        unsetenv("LD_PRELOAD");
        setenv("HEAPPROF_SOCKET", d.sock, 1); /* what a preloaded client would use */
        execl(e2e_env("INJECT_BUSY"), "inject_busy", "1", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    e2e_sleep_ms(200);
    struct e2e_run r;
    char pids[16];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pids,
                    "--duration",
                    "0.3",
                    "--no-status",
                    "--no-source-lines",
                    "-q",
                    "-o",
                    trace,
                    NULL};
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    if (r.status != 0)
        print_message("attach: %s\n", r.err);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_false(p->from_startup);
    assert_true(p->heap_samples > 0);
    rp_trace_free(t);
    close(in[1]);
    assert_int_equal(e2e_wait_status(pid), 0);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    char mention[32];
    snprintf(mention, sizeof(mention), "pid %d ", (int)pid);
    if (strstr(log, mention))
        print_message("heapprofd's log:\n%s\n", log);
    assert_null(strstr(log, mention));
    free(log);
    e2e_daemon_remove_files(&d);
    unlink(trace);
    free(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inject_first_load_busy_process),
        cmocka_unit_test(test_inject_bug_no_safe_point_deadlocks),
        cmocka_unit_test(test_inject_bug_startup_handshake_in_dlopen),
    };
    return cmocka_run_group_tests_name("e2e_inject_safe", tests, setup, teardown);
}
