/* tests/e2e/test_heap_api.c: the heaps of a program's own (preload/include/heapprof.h), with
 * tests/programs/heap_api.c: two heaps, "arena.small" and "arena.big", reported from known
 * functions with known sizes, some blocks freed, beside some malloc(). At interval 1 every
 * report is recorded, so the counts are exact.
 *
 * Checked: the heaps a session selects (--all-heaps, --heaps, the default "libc.malloc"
 * only) and only those in the trace, each named as registered (ProcessHeapSamples.heap_name,
 * with the trace checker, Perfetto's trace processor where present, and protoc); the
 * report shows each heap; the program runs unharmed without the library and with it
 * dormant; attaching finds the heaps of a program started with the library preloaded
 * (weak symbols) and of one it was injected into (looked up at run time,
 * heapprof_api_load()). */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

/* As tests/programs/heap_api.c. */
#define SMALL_N 100
#define SMALL_SIZE 48
#define SMALL_FREED 40
#define BIG_N 20
#define BIG_SIZE 4096
#define BIG_FREED 5
#define SELF_N 3
#define SELF_WEIGHT 1000
#define MALLOC_N 10
#define MALLOC_SIZE 200
#define SHARED_N 10
#define SHARED_SMALL 32
#define SHARED_BIG 1024

static char runtime_dir[256];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "heapapi");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* `heapprof record -i 1 -q --no-source-lines OPTS... -o TRACE -- heap_api`; the trace,
 * checked and loaded. */
static struct rp_trace *record(const char *const opts[], char *trace, size_t trace_len)
{
    snprintf(trace, trace_len, "%s/rec.pftrace", runtime_dir);
    char *argv[32];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "record";
    argv[k++] = "-i";
    argv[k++] = "1";
    argv[k++] = "-q";
    argv[k++] = "--no-source-lines";
    for (size_t i = 0; opts[i] && k < 24; i++)
        argv[k++] = (char *)opts[i];
    argv[k++] = "-o";
    argv[k++] = trace;
    argv[k++] = "--";
    argv[k++] = (char *)e2e_env("HEAP_API");
    argv[k] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    if (run.status != 0)
        print_message("  record: %s\n", run.err);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.out, "heaps 1 2\n"));
    e2e_run_free(&run);
    assert_int_equal(e2e_check_rules(trace), 0);
    assert_int_equal(e2e_check_protoc(trace), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    return t;
}

/* The heap @heap of @pid (0: any heap_api process) in @t, or NULL. */
static const struct rp_trace_process *heap_of(const struct rp_trace *t, pid_t pid, const char *heap)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if ((pid ? p->pid == pid : strstr(p->cmdline, "heap_api") != NULL) &&
            !strcmp(p->heap_name, heap))
            return p;
    }
    return NULL;
}

static void expect_site(const struct rp_trace_process *p, const char *fn, uint64_t n, uint64_t size,
                        uint64_t freed)
{
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, fn, &s);
    print_message("  %s/%s: %llu allocations, %llu bytes, %llu frees, %llu bytes\n", p->heap_name,
                  fn, (unsigned long long)s.alloc_count, (unsigned long long)s.alloc_bytes,
                  (unsigned long long)s.free_count, (unsigned long long)s.free_bytes);
    assert_int_equal(s.alloc_count, n);
    assert_int_equal(s.alloc_bytes, n * size);
    assert_int_equal(s.free_count, freed);
    assert_int_equal(s.free_bytes, freed * size);
}

/* The arena heaps' exact counts in @t (for @pid; 0: any). */
static void expect_arenas(const struct rp_trace *t, pid_t pid)
{
    const struct rp_trace_process *small = heap_of(t, pid, "arena.small");
    const struct rp_trace_process *big = heap_of(t, pid, "arena.big");
    expect_site(small, "arena_small_site", SMALL_N, SMALL_SIZE, SMALL_FREED);
    expect_site(big, "arena_big_site", BIG_N, BIG_SIZE, BIG_FREED);
    /* Self-sampled: recorded as they came, each standing for its weight. */
    expect_site(big, "self_sampled_site", SELF_N, SELF_WEIGHT, 0);
    /* Nothing of one heap on the other. */
    struct e2e_sums s;
    e2e_sum_function(small, "arena_big_site", &s);
    assert_int_equal(s.alloc_count, 0);
    e2e_sum_function(big, "arena_small_site", &s);
    assert_int_equal(s.alloc_count, 0);
    e2e_sum_function(big, "malloc_site", &s);
    assert_int_equal(s.alloc_count, 0);
}

/* `heapprof report TRACE`: its output (malloc'd). */
static char *report(const char *trace)
{
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "report", (char *)trace, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    char *out = run.out;
    run.out = NULL;
    e2e_run_free(&run);
    return out;
}

/* --all-heaps: both arenas and malloc, exactly, each named; the report shows each. */
static void test_heap_api_all_heaps(void **state)
{
    (void)state;
    char trace[300];
    struct rp_trace *t = record((const char *[]){"--all-heaps", NULL}, trace, sizeof(trace));
    expect_arenas(t, 0);
    const struct rp_trace_process *m = heap_of(t, 0, "libc.malloc");
    assert_non_null(m);
    struct e2e_sums s;
    e2e_sum_function(m, "malloc_site", &s);
    assert_int_equal(s.alloc_count, MALLOC_N);
    assert_int_equal(s.alloc_bytes, MALLOC_N * MALLOC_SIZE);
    e2e_sum_function(m, "arena_alloc", &s);
    assert_int_equal(s.alloc_count, 0);
    rp_trace_free(t);
    char *out = report(trace);
    assert_non_null(strstr(out, "heap arena.small,"));
    assert_non_null(strstr(out, "heap arena.big,"));
    assert_non_null(strstr(out, "heap libc.malloc,"));
    /* The process table names the heaps beside malloc's; the process is counted once. */
    assert_non_null(strstr(out, "[heap arena.small] "));
    assert_non_null(strstr(out, "[heap arena.big] "));
    assert_non_null(strstr(out, "Total over 1 process:"));
    free(out);
    /* pprof: a profile per heap. */
    char prefix[300];
    snprintf(prefix, sizeof(prefix), "%s/prof", runtime_dir);
    char *pargv[] = {(char *)e2e_env("HEAPPROF_BIN"), "pprof", trace, "-o", prefix, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(pargv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    for (int i = 0; i < 3; i++) {
        const char *heap[] = {"libc.malloc", "arena.small", "arena.big"};
        const char *want = strstr(run.out, heap[i]);
        if (!want)
            print_message("  pprof said: %s\n", run.out);
        assert_non_null(want);
    }
    e2e_run_free(&run);
    /* Perfetto's own reading of the heap names, where its trace processor is present. */
    char *q = e2e_trace_processor_query(
        trace, "select distinct heap_name from heap_profile_allocation order by heap_name");
    if (q) {
        print_message("  trace processor:\n%s", q);
        assert_non_null(strstr(q, "arena.big"));
        assert_non_null(strstr(q, "arena.small"));
        assert_non_null(strstr(q, "libc.malloc"));
        free(q);
    }
}

/* --heaps arena.small: that heap only, not malloc's. */
static void test_heap_api_one_heap(void **state)
{
    (void)state;
    char trace[300];
    struct rp_trace *t =
        record((const char *[]){"--heaps", "arena.small", NULL}, trace, sizeof(trace));
    expect_site(heap_of(t, 0, "arena.small"), "arena_small_site", SMALL_N, SMALL_SIZE, SMALL_FREED);
    assert_null(heap_of(t, 0, "arena.big"));
    assert_null(heap_of(t, 0, "libc.malloc"));
    rp_trace_free(t);
}

/* The default: malloc's heap only, as before the heap API. */
static void test_heap_api_default_malloc_only(void **state)
{
    (void)state;
    char trace[300];
    struct rp_trace *t = record((const char *[]){NULL}, trace, sizeof(trace));
    const struct rp_trace_process *m = heap_of(t, 0, "libc.malloc");
    assert_non_null(m);
    struct e2e_sums s;
    e2e_sum_function(m, "malloc_site", &s);
    assert_int_equal(s.alloc_count, MALLOC_N);
    assert_null(heap_of(t, 0, "arena.small"));
    assert_null(heap_of(t, 0, "arena.big"));
    rp_trace_free(t);
}

/* Two heaps' blocks reported from one stack, in several dumps: Perfetto's trace processor
 * keeps running totals per (process, callstack) whatever the heap, and took the two heaps'
 * totals for one site's going backwards (heapprofd_malformed_packet) until each heap's
 * stacks got a leaf frame of their own. Exact on each heap, the frame left out. */
static void test_heap_api_bug_shared_stack(void **state)
{
    (void)state;
    char trace[300];
    snprintf(trace, sizeof(trace), "%s/shared.pftrace", runtime_dir);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-i",
                    "1",
                    "-q",
                    "--no-source-lines",
                    "--all-heaps",
                    "--continuous-dump",
                    "50",
                    "-o",
                    trace,
                    "--",
                    (char *)e2e_env("HEAP_API"),
                    "shared",
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    if (run.status != 0)
        print_message("  record: %s\n", run.err);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.out, "shared done\n"));
    e2e_run_free(&run);
    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *small = heap_of(t, 0, "arena.small");
    const struct rp_trace_process *big = heap_of(t, 0, "arena.big");
    assert_true(small && small->n_dumps >= 2);
    expect_site(small, "shared_site", SHARED_N, SHARED_SMALL, SHARED_N / 2);
    expect_site(big, "shared_site", SHARED_N, SHARED_BIG, SHARED_N / 2);
    /* The views show the program's frames only: arena_alloc at the leaf. */
    for (size_t i = 0; i < small->n_callsites; i++) {
        const struct rp_trace_callsite *c = &small->callsites[i];
        assert_true(c->n_frames > 0);
        assert_string_not_equal(c->frames[c->n_frames - 1].function_name, "arena.small");
    }
    rp_trace_free(t);
    /* Perfetto's reading: both heaps' bytes at the site, where its trace processor is
     * present (its error stats were checked with the rules). */
    char *q = e2e_trace_processor_query(
        trace, "select heap_name, sum(size) as s from heap_profile_allocation where size > 0 "
               "group by heap_name order by heap_name");
    if (q) {
        print_message("  trace processor:\n%s", q);
        char want[64];
        snprintf(want, sizeof(want), "\"arena.big\",%d", SHARED_N * SHARED_BIG);
        assert_non_null(strstr(q, want));
        snprintf(want, sizeof(want), "\"arena.small\",%d", SHARED_N * SHARED_SMALL);
        assert_non_null(strstr(q, want));
        free(q);
    }
}

/* Without the library (weak symbols NULL, dlopen finds nothing) and with it dormant. */
static void test_heap_api_absent_and_dormant(void **state)
{
    (void)state;
    struct e2e_run run;
    for (int dynamic = 0; dynamic < 2; dynamic++) {
        char *argv[] = {(char *)e2e_env("HEAP_API"), dynamic ? "dynamic" : "weak", NULL};
        assert_int_equal(e2e_run(argv, NULL, &run), 0);
        assert_int_equal(run.status, 0);
        assert_non_null(strstr(run.out, "heaps 0 0\nsampled 0\n"));
        e2e_run_free(&run);
        char preload[600];
        snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
        char *env[] = {preload, "HEAPPROF_STARTUP=0", NULL};
        assert_int_equal(e2e_run(argv, env, &run), 0);
        assert_int_equal(run.status, 0);
        assert_non_null(strstr(run.out, "heaps 1 2\nsampled 0\n"));
        e2e_run_free(&run);
    }
}

/* Waits up to 10 s for @text in @t's output. */
static bool wait_for(const struct e2e_target *t, const char *text)
{
    for (int i = 0; i < 1000; i++) {
        char *o = e2e_read_file(t->out);
        bool found = strstr(o, text) != NULL;
        free(o);
        if (found)
            return true;
        e2e_sleep_ms(10);
    }
    return false;
}

/* Attaches `heapprof attach -p PID --all-heaps -i 1 --duration 2` to heap_api serving
 * rounds (@mode: "weak" or "dynamic"; @preload: the library preloaded, dormant, or not:
 * injected), makes it do one round in the session and checks the arenas' counts. */
static void attach_round(const char *mode, bool preload)
{
    char *argv[] = {(char *)e2e_env("HEAP_API"), (char *)mode, "serve", NULL};
    struct e2e_target t;
    assert_int_equal(
        e2e_target_start(&t, runtime_dir, argv, preload ? e2e_env("HEAPPROF_LIB") : NULL, "ready"),
        0);
    char pids[16], trace[300];
    snprintf(pids, sizeof(pids), "%d", (int)t.pid);
    snprintf(trace, sizeof(trace), "%s/attach.pftrace", runtime_dir);
    char *aargv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                     "attach",
                     "-p",
                     pids,
                     "--all-heaps",
                     "--duration",
                     "2",
                     "--block-client",
                     "-i",
                     "1",
                     "--no-source-lines",
                     "--no-status",
                     "-q",
                     "-o",
                     trace,
                     NULL};
    pid_t a = fork();
    assert_true(a >= 0);
    if (a == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        execv(aargv[0], aargv);
        _exit(127);
    }
    assert_true(wait_for(&t, "attached"));
    /* The ring is mapped a moment before the session is live (test_inject.c waits the
     * same): a report before that is not recorded. */
    e2e_sleep_ms(500);
    assert_int_equal(write(t.in, "round\n", 6), 6);
    assert_true(wait_for(&t, "round done"));
    assert_int_equal(e2e_wait_status(a), 0);
    char *o = e2e_read_file(t.out);
    print_message("  %s", o);
    free(o);
    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *tr = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &tr), 0);
    expect_arenas(tr, t.pid);
    rp_trace_free(tr);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
}

/* Preloaded and dormant: the weak symbols found the library at the start; the heaps
 * registered before the session are recorded in it. */
static void test_heap_api_attach_preloaded(void **state)
{
    (void)state;
    attach_round("weak", true);
}

/* Injected by the attach: weak symbols stay NULL (the loader resolved them at the start,
 * header's note), heapprof_api_load() finds the library once it is there. */
static void test_heap_api_attach_injected(void **state)
{
    (void)state;
    attach_round("dynamic", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heap_api_all_heaps),
        cmocka_unit_test(test_heap_api_one_heap),
        cmocka_unit_test(test_heap_api_default_malloc_only),
        cmocka_unit_test(test_heap_api_bug_shared_stack),
        cmocka_unit_test(test_heap_api_absent_and_dormant),
        cmocka_unit_test(test_heap_api_attach_preloaded),
        cmocka_unit_test(test_heap_api_attach_injected),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
