/* tests/e2e/test_names.c: each process is named by its own current title (issue 26 case
 * 3), and a process attached while running says when, after its start, its profile began
 * (case 7).
 *
 *   - tests/programs/retitle: a parent and its forked worker each write a title over
 *     their argv area (NUL and space padding), as nginx and postgres do. Recorded with
 *     --follow-fork: the report and Perfetto's trace processor name each by its own
 *     title, without padding (the worker was named by its parent's command line at the
 *     fork, and the padding kept).
 *   - a program started without the profiler and attached a second later: the report
 *     says it was profiled from about a second after the process started. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

static char runtime_dir[128];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "names");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

static const struct rp_trace_process *by_site(const struct rp_trace *t, const char *fn)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        struct e2e_sums s;
        e2e_sum_function(&t->processes[i], fn, &s);
        if (s.alloc_count > 0)
            return &t->processes[i];
    }
    return NULL;
}

/* Records `retitle MS` at interval 1, following its fork, with the extra environment
 * entry @env_entry (or NULL); checks it printed "done". Returns the trace's path (malloc'd). */
static char *record_retitle(const char *ms, const char *env_entry)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-q",
                    "-i",
                    "1",
                    "--follow-fork",
                    "-o",
                    trace,
                    "--",
                    (char *)e2e_env("RETITLE"),
                    (char *)ms,
                    "padding-padding-padding-padding-padding",
                    NULL};
    char *env[] = {(char *)env_entry, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, env_entry ? env : NULL, &run), 0);
    assert_int_equal(run.status, 0);
    assert_string_equal(run.out, "done\n");
    e2e_run_free(&run);
    return trace;
}

static void test_names_own_titles(void **state)
{
    (void)state;
    char *trace = record_retitle("1500", NULL);
    assert_int_equal(e2e_check_rules(trace), 0);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *w = by_site(t, "retitle_worker_alloc");
    const struct rp_trace_process *m = by_site(t, "retitle_master_alloc");
    assert_non_null(w);
    assert_non_null(m);
    print_message("  worker %d \"%s\", master %d \"%s\", %zu processes\n", w->pid, w->cmdline,
                  m->pid, m->cmdline, t->n_processes);
    assert_string_equal(w->cmdline, "retitle: worker process");
    assert_string_equal(m->cmdline, "retitle: master process");
    assert_int_equal(t->n_processes, 2); /* a retitle is not a new process */

    char *argv_rep[] = {(char *)e2e_env("HEAPPROF_BIN"), "report", trace, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv_rep, NULL, &run), 0);
    char want[96];
    snprintf(want, sizeof(want), "Process %d: retitle: worker process\n", (int)w->pid);
    assert_non_null(strstr(run.out, want));
    snprintf(want, sizeof(want), "Process %d: retitle: master process\n", (int)m->pid);
    assert_non_null(strstr(run.out, want));
    e2e_run_free(&run);

    /* Perfetto's trace processor takes each process's latest process tree, as it takes
     * traced_probes' (its name column is the first word of a title with spaces). */
    char *tp = e2e_trace_processor_query(trace, "select pid, cmdline from process where pid > 0 "
                                                "order by pid");
    if (tp) {
        print_message("  trace processor:\n%s", tp);
        snprintf(want, sizeof(want), "%d,\"retitle: worker process\"", (int)w->pid);
        assert_non_null(strstr(tp, want));
        snprintf(want, sizeof(want), "%d,\"retitle: master process\"", (int)m->pid);
        assert_non_null(strstr(tp, want));
        free(tp);
    }
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

/* Records `retitle MS` whose worker takes its title RETITLE_LATE_MS after its first
 * allocations; checks the worker is named by that title. */
static void check_late_title(const char *ms, const char *late_env)
{
    char *trace = record_retitle(ms, late_env);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *w = by_site(t, "retitle_worker_alloc");
    assert_non_null(w);
    print_message("  worker %d \"%s\"\n", w->pid, w->cmdline);
    assert_string_equal(w->cmdline, "retitle: worker process");
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

/* A worker that allocates, then idles and only then takes its title (as an nginx worker
 * does), living 400 ms more: its title is read within RETITLE_EARLY_NS of the change
 * although no record wakes the service (which slept up to a second then: the worker had
 * exited meanwhile and kept its parent's command line). */
static void test_names_title_taken_idle(void **state)
{
    (void)state;
    check_late_title("400", "RETITLE_LATE_MS=300");
}

/* A worker that takes its title 30 ms after its first allocations (after the service's
 * first read of it) and exits at once, as an nginx worker told to stop soon after its
 * start, or a postgres backend of a short connection: the client gives the title at
 * exit (WIRE_TITLE), which no read of /proc/PID/cmdline could have seen. */
static void test_names_title_at_exit(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        check_late_title("0", "RETITLE_LATE_MS=30");
}

static void test_names_attach_says_when(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("RETITLE"), "20000", "padding-padding", NULL};
    struct e2e_target tg;
    assert_int_equal(e2e_target_start(&tg, runtime_dir, argv, NULL, NULL), 0);
    e2e_sleep_ms(1000);
    char trace[256], pid[16];
    snprintf(trace, sizeof(trace), "%s/attach.pftrace", runtime_dir);
    snprintf(pid, sizeof(pid), "%d", (int)tg.pid);
    char *att[] = {(char *)e2e_env("HEAPPROF_BIN"),
                   "attach",
                   "-p",
                   pid,
                   "--duration",
                   "1",
                   "--no-source-lines",
                   "-q",
                   "-o",
                   trace,
                   NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(att, NULL, &run), 0);
    /* The master allocates nothing after its start: the session may be empty (rc 1). */
    print_message("  attach: %d %s", run.status, run.err ? run.err : "");
    e2e_run_free(&run);
    char *rep[] = {(char *)e2e_env("HEAPPROF_BIN"), "report", trace, NULL};
    assert_int_equal(e2e_run(rep, NULL, &run), 0);
    const char *p = run.out ? strstr(run.out, "profiled from ") : NULL;
    print_message("  report: %.*s\n", p ? 90 : 0, p ? p : "");
    if (!p)
        print_message("  the whole report:\n%s\n%s", run.out, run.err);
    assert_non_null(p);
    double after = atof(p + strlen("profiled from "));
    assert_non_null(strstr(p, " s after the process started"));
    assert_true(after >= 0.9 && after < 30.0);
    e2e_run_free(&run);
    assert_int_equal(e2e_target_finish(&tg, SIGTERM), 128 + SIGTERM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_own_titles),
        cmocka_unit_test(test_names_title_taken_idle),
        cmocka_unit_test(test_names_title_at_exit),
        cmocka_unit_test(test_names_attach_says_when),
    };
    return cmocka_run_group_tests_name("e2e_names", tests, setup, teardown);
}
