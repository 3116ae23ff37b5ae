/* tests/e2e/test_attach_dl.c: a session never makes malloc wait for the loader's lock,
 * and code loaded during a session is still named.
 *
 * (a) tests/programs/dliter_lock.c lists its modules with dl_iterate_phdr() and takes its
 *     log mutex in the callback, while another thread allocates under that mutex. A
 *     sample that waited for the loader's lock (dl_iterate_phdr() before each sample)
 *     deadlocked it for good at the first attach. Attached and detached many times, it
 *     must keep running during and after each session, and end as an unprofiled run does;
 *     also with a malloc preloaded before the library (tests/programs/dliter_alloc.c),
 *     where the hooks sit in GOT slots and the client looks for objects to patch.
 * (b) tests/programs/dlloop.c loads and unloads two libraries in turn, often at the same
 *     addresses: attached, every sample is named, and each library's allocations are its
 *     own (the client tells the service of loaded and unloaded code before the samples
 *     that need it). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

/* Sessions of test (a): short, and as many as stay cheap (about 0.2 s each). */
#define DL_CYCLES 10
/* Each session's --duration: a sanitizer build's woken process may take longer than
 * 0.1 s to connect, and then is not in the session. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DL_SESSION_S "0.5"
#else
#define DL_SESSION_S "0.1"
#endif
/* How long a program may show no progress before it counts as stuck. Far above any
 * scheduling delay of a busy machine; a deadlock never ends. */
#define STUCK_MS 5000
/* An attach that has not returned by then never will. */
#define ATTACH_TIMEOUT "30"

static char runtime_dir[128];
static pid_t target_pid; /* killed by teardown when a test failed with it running */

static int setup(void **state)
{
    (void)state;
    if (e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "attach-dl") < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (target_pid > 0) {
        kill(target_pid, SIGKILL);
        (void)waitpid(target_pid, NULL, 0);
        target_pid = 0;
    }
    return e2e_runtime_dir_remove(runtime_dir);
}

/* Starts @argv with LD_PRELOAD=@preload (NULL: none; the library dormant), stdin a pipe,
 * stdout and stderr to a file; returns once it printed @ready_text (10 s at most; NULL:
 * no wait). */
static void start(struct e2e_target *t, char *const argv[], const char *preload,
                  const char *ready_text)
{
    assert_int_equal(e2e_target_start(t, runtime_dir, argv, preload, ready_text), 0);
    target_pid = t->pid;
}

/* Ends @t (EOF on its stdin), returns its exit status (128 + signal). */
static int finish(struct e2e_target *t)
{
    int status = e2e_target_finish(t, 0);
    assert_true(status >= 0);
    target_pid = 0;
    return status;
}

/* `heapprof attach -p PID --duration @dur -i @interval -q -o TRACE` and @extra (NULL or
 * one option), killed after ATTACH_TIMEOUT seconds: its exit status, and the trace
 * loaded (NULL: none). */
static int attach(pid_t pid, const char *dur, const char *interval, const char *extra,
                  struct rp_trace **ret_trace)
{
    char trace[256], pidbuf[16];
    snprintf(trace, sizeof(trace), "%s/attach-dl.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
    unlink(trace);
    char *argv[] = {"/usr/bin/timeout",
                    "-s",
                    "KILL",
                    ATTACH_TIMEOUT,
                    (char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pidbuf,
                    "--duration",
                    (char *)dur,
                    "-i",
                    (char *)interval,
                    "-q",
                    "-o",
                    trace,
                    (char *)extra,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    *ret_trace = NULL;
    if (run.status == 0 && access(trace, F_OK) == 0 &&
        rp_trace_load(trace, &(struct rp_trace_options){0}, ret_trace) < 0)
        *ret_trace = NULL;
    if (run.status != 0)
        print_message("  attach: status %d, stderr: %s\n", run.status, run.err);
    int status = run.status;
    e2e_run_free(&run);
    return status;
}

static const struct rp_trace_process *trace_process(const struct rp_trace *t, pid_t pid)
{
    for (size_t i = 0; t && i < t->n_processes; i++)
        if (t->processes[i].pid == pid)
            return &t->processes[i];
    return NULL;
}

/* ---- (a) a dl_iterate_phdr() callback that takes the program's log mutex ----------- */

struct progress {
    unsigned long listed, logged;
};

static struct progress read_progress(const char *path)
{
    struct progress p = {0, 0};
    char *s = e2e_read_file(path);
    (void)sscanf(s, "listed %lu logged %lu", &p.listed, &p.logged);
    free(s);
    return p;
}

/* Waits until both threads went on past @from (STUCK_MS at most); returns the progress
 * then, or prints what it saw and fails. */
static struct progress await_progress(const char *path, struct progress from, const char *when)
{
    struct progress p = from;
    for (int waited = 0; waited < STUCK_MS; waited += 10) {
        p = read_progress(path);
        if (p.listed > from.listed && p.logged > from.logged)
            return p;
        e2e_sleep_ms(10);
    }
    print_message("  stuck %s: listed %lu -> %lu, logged %lu -> %lu in %d ms\n", when, from.listed,
                  p.listed, from.logged, p.logged, STUCK_MS);
    fail();
    return p;
}

/* Progress of both threads over @ms. */
static struct progress rate(const char *path, long ms)
{
    struct progress a = read_progress(path);
    e2e_sleep_ms(ms);
    struct progress b = read_progress(path);
    return (struct progress){b.listed - a.listed, b.logged - a.logged};
}

/* dliter_lock with LD_PRELOAD=@preload, attached DL_CYCLES times. */
static void dliter_cycles(const char *preload)
{
    char progress[256];
    snprintf(progress, sizeof(progress), "%s/progress", runtime_dir);
    char *argv[] = {(char *)e2e_env("DLITER_LOCK"), progress, NULL};

    struct e2e_target plain, t;
    start(&plain, argv, NULL, "ready\n");
    e2e_sleep_ms(100);
    int plain_status = finish(&plain);
    char *plain_out = e2e_read_file(plain.out);

    start(&t, argv, preload, "ready\n");
    /* Both threads under way first: on a busy machine they may not have run yet. */
    (void)await_progress(progress, (struct progress){0, 0}, "at the start");
    struct progress before = rate(progress, 200);
    print_message("  before: listed %lu logged %lu in 200 ms\n", before.listed, before.logged);
    assert_true(before.listed > 0 && before.logged > 0);
    long long samples = 0;
    for (int i = 0; i < DL_CYCLES; i++) {
        struct progress p0 = read_progress(progress);
        struct rp_trace *tr;
        int status = attach(t.pid, DL_SESSION_S, "1M", NULL, &tr);
        /* Progress since the session began (the attach returns after it ended), then
         * after it: a deadlock in the session lasts for good. */
        char when[64];
        snprintf(when, sizeof(when), "in or after session %d", i);
        struct progress p1 = await_progress(progress, p0, when);
        snprintf(when, sizeof(when), "after session %d", i);
        (void)await_progress(progress, p1, when);
        assert_int_equal(status, 0);
        const struct rp_trace_process *proc = trace_process(tr, t.pid);
        assert_non_null(proc);
        struct e2e_sums s;
        e2e_sum_function(proc, "dliter_log_line", &s);
        samples += (long long)s.alloc_count;
        rp_trace_free(tr);
    }
    /* A 0.1 s session at 1 MiB takes a sample per ~128 log lines: under a sanitizer one
     * session may see none, the sessions together always do. */
    assert_true(samples > 0);
    struct progress after = rate(progress, 200);
    print_message("  after %d sessions (%lld samples of the logger): listed %lu logged %lu in "
                  "200 ms\n",
                  DL_CYCLES, samples, after.listed, after.logged);
    /* Still going at a dormant pace: both threads go on, and the mutex changes hands
     * about as often as before. How the mutex is shared between the two threads swings
     * more than 100 times over from one 200 ms window to the next, unprofiled too (one
     * run listed 9.3 M then 57 k while the logger went from 402 k to 491 k), so the
     * bound is on the acquisitions of both together: only a program that nearly stopped
     * fails this. */
    assert_true(after.listed > 0 && after.logged > 0);
    assert_true((after.listed + after.logged) * 100 >= before.listed + before.logged);

    int status = finish(&t);
    char *out = e2e_read_file(t.out);
    assert_int_equal(status, plain_status);
    assert_string_equal(out, plain_out);
    assert_string_equal(out, "ready\ndone\n");
    free(out);
    free(plain_out);
}

static void test_attach_dl_iterate_callback_lock(void **state)
{
    (void)state;
    dliter_cycles(e2e_env("HEAPPROF_LIB"));
}

/* The same with an allocator preloaded before the library: the hooks are in GOT slots,
 * and the client looks for new objects to patch every 100 ms on the sampled path (that
 * look waited for the loader's lock too). */
static void test_attach_dl_iterate_callback_lock_got(void **state)
{
    (void)state;
    char preload[1024];
    snprintf(preload, sizeof(preload), "%s:%s", e2e_env("DLITER_ALLOC"), e2e_env("HEAPPROF_LIB"));
    dliter_cycles(preload);
}

/* ---- (b) code loaded and unloaded during a session ---------------------------------- */

/* dlloop alternates libraries a and b, 200 allocations of 1000 bytes per round (with a
 * 100 ms pause halfway), so that one is often mapped where the other just was. Attached
 * for a second at interval 1, blocking: each allocation of either library is sampled, and
 * must be named by its own library's function, never the other's, with no frame left
 * unnamed. */
static void test_attach_dlopen_named(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("DLLOOP"), (char *)e2e_env("DLLOOP_LIB_A"),
                    (char *)e2e_env("DLLOOP_LIB_B"), "14", NULL};
    struct e2e_target t;
    start(&t, argv, e2e_env("HEAPPROF_LIB"), NULL);
    e2e_sleep_ms(150);
    struct rp_trace *tr;
    int status = attach(t.pid, "1", "1", "--block-client", &tr);
    int exit_status = finish(&t);
    assert_int_equal(status, 0);
    assert_int_equal(exit_status, 0);
    const struct rp_trace_process *proc = trace_process(tr, t.pid);
    assert_non_null(proc);
    struct e2e_sums a, b;
    e2e_sum_function(proc, "dlloop_alloc_a", &a);
    e2e_sum_function(proc, "dlloop_alloc_b", &b);
    print_message("  %llu samples of a, %llu of b, %llu unwinding errors, %llu map rereads\n",
                  (unsigned long long)a.alloc_count, (unsigned long long)b.alloc_count,
                  (unsigned long long)proc->unwinding_errors,
                  (unsigned long long)proc->map_reparses);
    /* Whole rounds of each (200 allocations each) fall in the session. */
    assert_true(a.alloc_count >= 200 && b.alloc_count >= 200);
    assert_int_equal(a.alloc_bytes, a.alloc_count * 1000);
    assert_int_equal(b.alloc_bytes, b.alloc_count * 1000);
    /* Alternating rounds: neither library takes the other's samples. */
    assert_true(a.alloc_count <= b.alloc_count + 400 && b.alloc_count <= a.alloc_count + 400);
    assert_int_equal(proc->unwinding_errors, 0);
    rp_trace_free(tr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_attach_dl_iterate_callback_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attach_dl_iterate_callback_lock_got, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attach_dlopen_named, setup, teardown),
    };
    /* HEAPPROF_TEST_FILTER=pattern runs the matching tests only. */
    const char *filter = getenv("HEAPPROF_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("e2e_attach_dl", tests, NULL, NULL);
}
