/* tests/e2e/test_wake.c: `heapprof attach` wakes a dormant process without a signal and
 * without changing the result of any of its system calls (the attach signal made
 * epoll_wait and sigtimedwait fail with EINTR, cut timed waits short, reached programs
 * that sigwait() or read a signalfd, fired the program's own handler for it, and killed
 * programs under seccomp). Those programs, attached 20 times each, are the cases of
 * tests/e2e/test_attach_matrix.c; here: stopped and traced processes are refused and
 * left as they were. Real programs: tests/programs/wake_target.c, wake_refused.c. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

static char runtime_dir[128];

static int setup(void **state)
{
    (void)state;
    if (e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "wake") < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* Starts @argv (argv[0] a path), the library preloaded and dormant unless !@preload, stdin
 * a pipe, stdout and stderr to a file; returns once it printed @ready_text (10 s at
 * most; NULL: does not wait). */
static void start(struct e2e_target *t, char *const argv[], bool preload, const char *ready_text)
{
    const char *lib = preload ? e2e_env("HEAPPROF_LIB") : NULL;
    assert_int_equal(e2e_target_start(t, runtime_dir, argv, lib, ready_text), 0);
}

/* Ends @t (EOF on its stdin, or @sig), returns its exit status (128 + signal). */
static int finish(struct e2e_target *t, int sig)
{
    int status = e2e_target_finish(t, sig);
    assert_true(status >= 0);
    return status;
}

/* `heapprof attach -p PID --duration @dur -i 1 -q -o TRACE`: returns its exit status,
 * its stderr in @err (malloc'd, or NULL), and the samples of @fn in the trace (-1: no
 * trace). */
static int attach(pid_t pid, const char *dur, const char *fn, char **err, long long *ret_samples)
{
    char trace[256], pidbuf[16];
    snprintf(trace, sizeof(trace), "%s/wake.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
    unlink(trace);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pidbuf,
                    "--duration",
                    (char *)dur,
                    "-i",
                    "1",
                    "-q",
                    "-o",
                    trace,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    *ret_samples = -1;
    struct rp_trace *t = NULL;
    if (run.status == 0 && access(trace, F_OK) == 0 &&
        rp_trace_load(trace, &(struct rp_trace_options){0}, &t) == 0) {
        for (size_t i = 0; i < t->n_processes; i++) {
            if (t->processes[i].pid != pid)
                continue;
            struct e2e_sums s;
            e2e_sum_function(&t->processes[i], fn, &s);
            *ret_samples = (long long)s.alloc_count;
        }
        rp_trace_free(t);
    }
    int status = run.status;
    if (err)
        *err = run.err, run.err = NULL;
    e2e_run_free(&run);
    return status;
}

/* @cycles attach + detach of @t, each sampling @fn; the program stays alive. */
/* @cycles attach sessions of @dur seconds: each must end well with the program alive,
 * and together they must sample @fn. The programs allocate every 100 ms: one short
 * session on a loaded machine may see no allocation. */
static void attach_cycles(struct e2e_target *t, int cycles, const char *dur, const char *fn)
{
    long long total = 0;
    for (int i = 0; i < cycles; i++) {
        char *err = NULL;
        long long samples;
        int status = attach(t->pid, dur, fn, &err, &samples);
        if (status != 0 || samples <= 0 || !e2e_alive(t->pid)) {
            char *o = e2e_read_file(t->out);
            print_message("  cycle %d: status %d, %lld samples of %s, stderr: %s\n  program: %s\n",
                          i, status, samples, fn, err, o);
            free(o);
        }
        free(err);
        assert_int_equal(status, 0);
        assert_true(e2e_alive(t->pid));
        total += samples > 0 ? samples : 0;
    }
    assert_true(total > 0);
}

/* The program's output after @finish: "ready ... done", no FATAL line. */
static void assert_clean(struct e2e_target *t, int status)
{
    char *o = e2e_read_file(t->out);
    if (status != 0 || strstr(o, "FATAL"))
        print_message("  status %d, output: %s\n", status, o);
    assert_int_equal(status, 0);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "ready\n"));
    assert_non_null(strstr(o, "done\n"));
    free(o);
}

/* `heapprof attach -p` of @pid is refused: exit status 1, a message with @why and the
 * pid. */
static void assert_refused(pid_t pid, const char *why)
{
    char *err = NULL;
    long long samples;
    int status = attach(pid, "0.5", "main", &err, &samples);
    print_message("  refused: status %d, stderr: %s", status, err);
    char pidbuf[32];
    snprintf(pidbuf, sizeof(pidbuf), "pid %d ", (int)pid);
    assert_int_equal(status, 1);
    assert_non_null(strstr(err, pidbuf));
    assert_non_null(strstr(err, why));
    free(err);
}

/* (f) Stopped and traced processes are refused, and left as they were. */
static void test_wake_refuses_stopped_and_traced(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("WAKE_TARGET"), "nanosleep", NULL};
    struct e2e_target t;
    start(&t, argv, true, "ready\n");
    kill(t.pid, SIGSTOP);
    char path[64], st[4096];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)t.pid);
    for (int i = 0; i < 200; i++) {
        char *s = e2e_read_file(path);
        bool stopped = strstr(s, ") T ") != NULL;
        free(s);
        if (stopped)
            break;
        e2e_sleep_ms(5);
    }
    assert_refused(t.pid, "is stopped");
    char *s = e2e_read_file(path);
    assert_non_null(strstr(s, ") T ")); /* still stopped */
    free(s);
    kill(t.pid, SIGCONT);
    attach_cycles(&t, 1, "0.3", "wake_target_alloc");
    assert_clean(&t, finish(&t, 0));

    /* Traced by its parent. */
    char *traced[] = {(char *)e2e_env("WAKE_REFUSED"), "tracer", (char *)e2e_env("WAKE_TARGET"),
                      "nanosleep", NULL};
    start(&t, traced, true, "ready\n");
    char *o = e2e_read_file(t.out);
    int child = 0;
    const char *c = strstr(o, "child ");
    assert_non_null(c);
    child = atoi(c + 6);
    free(o);
    (void)st;
    assert_refused(child, "is being traced by pid");
    assert_true(e2e_alive(t.pid));
    assert_clean(&t, finish(&t, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wake_refuses_stopped_and_traced),
    };
    return cmocka_run_group_tests_name("e2e_wake", tests, setup, teardown);
}
