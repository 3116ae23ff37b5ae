/* tests/e2e/test_forks.c: children of fork() a session does not follow are counted and
 * named, in every mode's summary and in the daemon's end-of-process line, with the
 * option that follows them; children that exec a profiled program are not counted (they
 * are profiled on their own). tests/programs/forker forks one child that does not exec;
 * "sh -c" forks children that exec (or spawns them) and subshells that do not. The
 * attach case wakes its target: not in the TSan build (as the other attach tests). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"

#define ONE_LOST "heapprof: 1 process forked from targets was not followed (use --follow-fork)"

/* `heapprof record OPT -- @prog...`: its stderr in @run. */
static void record(const char *opt, char *const prog[], struct e2e_run *run)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[16];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "record";
    argv[k++] = "--top";
    argv[k++] = "0";
    argv[k++] = "-o";
    argv[k++] = trace;
    argv[k++] = (char *)opt;
    argv[k++] = "--";
    for (size_t i = 0; prog[i] && k < 15; i++)
        argv[k++] = prog[i];
    argv[k] = NULL;
    assert_int_equal(e2e_run(argv, NULL, run), 0);
    assert_int_equal(run->status, 0);
    unlink(trace);
    free(trace);
}

static void test_record_counts_unfollowed_fork(void **state)
{
    (void)state;
    char *prog[] = {(char *)e2e_env("FORKER"), NULL};
    struct e2e_run run;
    record("--no-follow-fork", prog, &run);
    if (!strstr(run.err, ONE_LOST))
        fail_msg("no count of the fork not followed:\n%s", run.err);
    e2e_run_free(&run);
    record("--follow-fork", prog, &run);
    assert_null(strstr(run.err, "not followed"));
    e2e_run_free(&run);
}

static void test_record_exec_children_not_counted(void **state)
{
    (void)state;
    char *prog[] = {"/bin/sh", "-c", "ls / >/dev/null; cat /dev/null", NULL};
    struct e2e_run run;
    record("--no-follow-fork", prog, &run);
    assert_null(strstr(run.err, "not followed"));
    e2e_run_free(&run);
    /* Subshells are forks that do not exec; the programs beside them are not counted. */
    char *sub[] = {"/bin/sh", "-c", "(true); ls / >/dev/null; (true)", NULL};
    record("--no-follow-fork", sub, &run);
    if (!strstr(run.err, "heapprof: 2 processes forked from targets were not followed"))
        fail_msg("not two:\n%s", run.err);
    e2e_run_free(&run);
}

static void test_daemon_says_unfollowed_fork(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--no-running", NULL};
    e2e_daemon_prepare(&d, "forks");
    e2e_daemon_launch(&d, args);
    char *prog[] = {(char *)e2e_env("FORKER"), NULL};
    pid_t pid = e2e_spawn_client(&d, prog, "/dev/null");
    assert_int_equal(e2e_wait_status(pid), 0);
    e2e_daemon_wait_ended(&d, &pid, 1, 10000);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    if (!strstr(log, "1 child forked from it not followed (use --follow-fork)") ||
        !strstr(log, ONE_LOST))
        fail_msg("the daemon did not say it:\n%s", log);
    free(log);
    e2e_daemon_remove_files(&d);
}

/* attach: the children forked while attached are counted, with the way to take them. */
static void test_attach_counts_unfollowed_forks(void **state)
{
    (void)state;
    pid_t sh = fork();
    assert_true(sh >= 0);
    if (sh == 0) {
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        execl("/bin/sh", "sh", "-c", "while :; do (true); sleep 0.05; done", (char *)NULL);
        _exit(127);
    }
    e2e_sleep_ms(300); /* dormant, its wake entry advertised */
    char pid_arg[16];
    snprintf(pid_arg, sizeof(pid_arg), "%d", (int)sh);
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pid_arg,
                    "-d",
                    "0.8",
                    "--top",
                    "0",
                    "-o",
                    trace,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    kill(sh, SIGKILL);
    (void)e2e_wait_status(sh);
    assert_int_equal(run.status, 0);
    if (!strstr(run.err, "forked from targets were not followed (attach them by name with -n"))
        fail_msg("no count of the forks not followed:\n%s", run.err);
    e2e_run_free(&run);
    unlink(trace);
    free(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_counts_unfollowed_fork),
        cmocka_unit_test(test_record_exec_children_not_counted),
        cmocka_unit_test(test_daemon_says_unfollowed_fork),
        cmocka_unit_test(test_attach_counts_unfollowed_forks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
