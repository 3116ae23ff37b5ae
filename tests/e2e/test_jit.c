/* tests/e2e/test_jit.c: `heapprof record` on node, whose stacks cross V8's JIT code:
 * frames there are walked in the program by their frame-pointer chain and named from
 * node's perf map (--perf-basic-prof), so a JavaScript leak is found by its function.
 *
 * tests/programs/leak.js keeps 2048 Buffers of 4 KiB (8 MiB) from heapprofJsLeak() and
 * churns 512 MiB more through churn(). Sampling at 4 KiB, the leak's estimate has a
 * standard deviation of sqrt(4096 * 8 MiB) ~ 185 KiB; the check allows 5 of them plus an
 * interval (the run's seed is fixed). Most of the program's unreleased memory must be on
 * the leak's stacks, and at least 90% of the samples must be walked in the program (the
 * rest are the first stacks of new code, copied for the service to unwind).
 *
 * A slow service loses nothing it need not (issue 26, case 5): node's first records do
 * not wait for the service to read its binary, and a service stopped for 200 ms costs
 * under 5% of the samples and leaves no phantom unreleased memory. */
#include <inttypes.h>
#include <math.h>
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

#define NODE "/usr/bin/node"
#define LEAK_BYTES (2048ull * 4096)
#define INTERVAL 4096.0

static char runtime_dir[128];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "jit");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* The samples kept and dropped, from record's summary in @err; false without one. */
static bool kept_dropped(const char *err, unsigned long long *kept, unsigned long long *dropped)
{
    const char *s = strstr(err, "heapprof: 1 process, ");
    const char *d = s ? strstr(s, " samples dropped") : NULL;
    if (!s || !d || sscanf(s, "heapprof: 1 process, %llu samples", kept) != 1)
        return false;
    while (d > s && d[-1] >= '0' && d[-1] <= '9')
        d--;
    return sscanf(d, "%llu", dropped) == 1;
}

/* What @argv prints unprofiled (malloc'd). */
static char *plain_output(char *const argv[])
{
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    char *out = run.out;
    run.out = NULL;
    e2e_run_free(&run);
    return out;
}

/* "N samples (M walked in the app" from record's summary: M / N, or -1. */
static double walked_share(const char *err)
{
    const char *s = strstr(err, "heapprof: 1 process, ");
    unsigned long long n, walked;
    if (!s || sscanf(s, "heapprof: 1 process, %llu samples (%llu walked", &n, &walked) != 2 ||
        n == 0)
        return -1;
    return (double)walked / (double)n;
}

static void test_jit_node_leak_named_and_walked(void **state)
{
    (void)state;
    if (access(NODE, X_OK) != 0)
        skip();
    char *trace = e2e_tmp_path(".pftrace");
    /* The block timeout keeps the client waiting for the service rather than dropping
     * samples while it unwinds the first stacks of node's start (checked below: none
     * dropped). --logfile keeps V8's log, which --perf-basic-prof turns on, out of the
     * working directory. */
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-o",
                    trace,
                    "--seed",
                    "7",
                    "--block-timeout-us",
                    "5000000",
                    "--",
                    NODE,
                    "--perf-basic-prof",
                    "--logfile=/dev/null",
                    (char *)e2e_env("LEAK_JS"),
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    print_message("%s", run.err);
    assert_int_equal(run.status, 0);
    assert_string_equal(run.out, "kept 2048 bytes 8388608 churned 131072\n");
    assert_non_null(strstr(run.err, " 0 samples dropped"));

    double share = walked_share(run.err);
    print_message("  walked in the program: %.3f of the samples\n", share);
    assert_true(share >= 0.9);

    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    const struct rp_trace_process *p = &t->processes[0];
    struct e2e_sums leak, all;
    e2e_sum_function(p, "heapprofJsLeak", &leak);
    e2e_sum_function(p, "", &all);
    uint64_t leak_unreleased = leak.alloc_bytes - leak.free_bytes;
    uint64_t all_unreleased = all.alloc_bytes - all.free_bytes;
    double tol = 5 * sqrt(INTERVAL * (double)LEAK_BYTES) + INTERVAL;
    print_message("  heapprofJsLeak: %" PRIu64 " bytes unreleased (truth %llu, tolerance %.0f) "
                  "of %" PRIu64 " in all\n",
                  leak_unreleased, LEAK_BYTES, tol, all_unreleased);
    assert_true(fabs((double)leak_unreleased - (double)LEAK_BYTES) <= tol);
    assert_true(leak_unreleased * 2 > all_unreleased);

    /* JIT frames carry the JavaScript name, in the JIT mapping. */
    bool named = false;
    for (size_t i = 0; i < p->n_callsites && !named; i++)
        for (size_t j = 0; j < p->callsites[i].n_frames && !named; j++) {
            const struct rp_trace_frame *f = &p->callsites[i].frames[j];
            named = strstr(f->function_name, "heapprofJsLeak") &&
                    strstr(f->function_name, "leak.js:") && strstr(f->mapping_path, "[jit]");
        }
    assert_true(named);

    char map[64];
    snprintf(map, sizeof(map), "/tmp/perf-%d.map", (int)p->pid);
    (void)unlink(map);
    rp_trace_free(t);
    e2e_run_free(&run);
    (void)unlink(trace);
    free(trace);
}

/* node allocates from its first moment (tests/programs/node_burst.js) into a 1 MiB ring
 * whose waits for room end after 10 ms. The service used to read node's 90 MB binary
 * (its unwind tables and symbols: 40 to 80 ms) only when the first stack arrived, while
 * the ring filled: 12 to 13% of the samples were dropped on a quiet machine, 19% beside
 * `stress -c 2`. It now reads the files of the process's code before it answers the
 * hello: none dropped when quiet, at most 1.5% beside the hog (which takes CPU from the
 * service at any time). Bound: 5%, in one of up to 5 runs. */
static void test_jit_bug_slow_start_fills_ring(void **state)
{
    (void)state;
    if (access(NODE, X_OK) != 0)
        skip();
    char *node_argv[] = {NODE, (char *)e2e_env("NODE_BURST_JS"), NULL};
    char *want = plain_output(node_argv);
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-o",
                    trace,
                    "--shmem-size",
                    "1M",
                    "--block-timeout-us",
                    "10000",
                    "--",
                    NODE,
                    (char *)e2e_env("NODE_BURST_JS"),
                    NULL};
    /* A machine busy enough to keep the service off the CPU for 10 ms at a time drops
     * samples at any moment, the start or not: up to 5 runs, one within the bound. */
    bool ok = false;
    for (int attempt = 0; attempt < 5 && !ok; attempt++) {
        struct e2e_run run;
        assert_int_equal(e2e_run(argv, NULL, &run), 0);
        assert_int_equal(run.status, 0);
        assert_string_equal(run.out, want);
        unsigned long long kept, dropped;
        assert_true(kept_dropped(run.err, &kept, &dropped));
        print_message("  run %d: %llu samples kept, %llu dropped (%.1f%%)\n", attempt + 1, kept,
                      dropped, 100.0 * (double)dropped / (double)(kept + dropped));
        ok = dropped * 100 <= 5 * (kept + dropped);
        e2e_run_free(&run);
    }
    assert_true(ok);
    (void)unlink(trace);
    free(trace);
    free(want);
}

/* One run of the node workload under `heapprof record`, the service stopped for 200 ms
 * after 600 ms: the output must be unchanged and no phantom unreleased memory shown, in
 * every run; returns whether at least 95% of the samples were kept. */
static bool stopped_service_run(int attempt)
{
    char *node_argv[] = {NODE, (char *)e2e_env("NODE_WORKLOAD_JS"), "6", NULL};
    char *want = plain_output(node_argv);
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),     "record", "-o", trace, "--", NODE,
                    (char *)e2e_env("NODE_WORKLOAD_JS"), "6",      NULL};
    struct e2e_target t;
    assert_int_equal(e2e_target_start(&t, runtime_dir, argv, NULL, NULL), 0);
    e2e_sleep_ms(600);
    assert_int_equal(kill(t.pid, SIGSTOP), 0);
    e2e_sleep_ms(200);
    assert_int_equal(kill(t.pid, SIGCONT), 0);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *out = e2e_read_file(t.out);
    assert_non_null(strstr(out, want));
    unsigned long long kept, dropped;
    assert_true(kept_dropped(out, &kept, &dropped));

    struct rp_trace *tr = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &tr), 0);
    assert_int_equal(tr->n_processes, 1);
    struct e2e_sums all;
    e2e_sum_function(&tr->processes[0], "", &all);
    uint64_t unreleased = all.alloc_bytes - all.free_bytes;
    print_message("  run %d: %llu samples kept, %llu dropped (%.1f%%); unreleased at the end: "
                  "%" PRIu64 " bytes\n",
                  attempt + 1, kept, dropped, 100.0 * (double)dropped / (double)(kept + dropped),
                  unreleased);
    assert_true(unreleased <= 3ull << 20);
    rp_trace_free(tr);
    free(out);
    (void)unlink(trace);
    free(trace);
    free(want);
    return dropped * 100 <= 5 * (kept + dropped);
}

/* A service stopped for 200 ms in the middle of a node workload (tests/bench/
 * workload_node.js, 1.5 s, 90,000 samples a second): the ring takes what comes meanwhile,
 * or the client drops (counted) only until the service caught up. At least 95% of the
 * samples are kept (0.1% dropped when quiet; a busy machine drops more at any time: one
 * of up to 3 runs), the output is unchanged, and the memory unreleased at the end stays
 * what the program holds (about 0.8 MiB; a lost free shown as unreleased memory once made
 * 17 to 28 MiB). Bound: 3 MiB, in every run. */
static void test_jit_service_stopped_keeps_samples(void **state)
{
    (void)state;
    if (access(NODE, X_OK) != 0)
        skip();
    bool ok = false;
    for (int attempt = 0; attempt < 3 && !ok; attempt++)
        ok = stopped_service_run(attempt);
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jit_node_leak_named_and_walked),
        cmocka_unit_test(test_jit_bug_slow_start_fills_ring),
        cmocka_unit_test(test_jit_service_stopped_keeps_samples),
    };
    return cmocka_run_group_tests_name("e2e_jit", tests, setup, teardown);
}
