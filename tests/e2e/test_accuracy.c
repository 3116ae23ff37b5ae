/* tests/e2e/test_accuracy.c: accuracy of `heapprof record` against ground truth.
 *
 * tests/programs/truth_prog prints, per named call site, the exact bytes and counts it
 * allocated and freed (sizes from 1 byte to 4 MiB, three threads, realloc chains, frees
 * in other threads, address reuse, calloc/posix_memalign/aligned_alloc).
 *
 * - At interval 1 every site matches exactly (bytes and counts, allocated and freed).
 * - Frees and reuses of one address in different threads (tests/programs/reuse_threads:
 *   8 threads swapping blocks through shared slots, so that an address freed in one
 *   thread is allocated again in another a few hundred nanoseconds later), at interval
 *   1: allocated and freed bytes and counts exact, no callsite with more freed than
 *   allocated, no free of an address the profile did not hold, nothing marked possibly
 *   freed: a reuse applied before the free that came first would show in each.
 * - At intervals 4096 and 524288, three fixed sampler seeds each (21-23, 31-33): each
 *   byte is sampled with probability 1/I and an allocation of s < I bytes holding k
 *   sampled bytes is attributed I * k, so a site's estimate of B true bytes has mean B and
 *   variance at most I * B (allocations of at least I bytes are recorded exactly and add
 *   no variance). Every check allows |estimate - B| <= 5 * sqrt(I * B) + I: under the
 *   normal approximation a false failure has probability below 1e-6 per check. Sites
 *   with B < 20 * I (too few expected samples) are skipped; at least 3 sites are checked
 *   per run. Allocated, freed and unreleased bytes are each checked this way. truth_huge
 *   allocates only blocks of at least 512 KiB, so at both intervals it must be exact.
 * - Stacks: weighted by sample count (alloc_count of the callsites), at least 99.9% of
 *   the samples of every run have as root-most named frame `main` (reached through the C
 *   runtime's `_start`, `__libc_start_main`, `__libc_start_call_main`) or a thread start
 *   (`start_thread`, `clone3`, `clone`).
 * - Real programs nobody here wrote (python3, sqlite3, and clang-format for C++), at
 *   interval 1 and at 4096 (seed 41): no frame in libheapprof, the top sites have named
 *   functions, and the 4096 run's total unreleased bytes are within 10% of the interval-1
 *   run's. When the interval-1 run leaves less than 16 MiB unreleased (the programs free
 *   nearly everything at exit, and 10% of a small total is only a few standard
 *   deviations) the reference is the total allocated bytes instead, within 10% too.
 * - The stacks the programs walk themselves with the service's unwind tables: a third
 *   run (4096, seed 41, --audit-every 1) sends every walked stack with its copy, and the
 *   service's unwind of each copy must name exactly the frames of the walk (the summary
 *   reports no difference); at least a fifth of the samples are walked (73-99% in an
 *   optimised build; stacks met for the first time are copied until the service has
 *   published their rules, and a sanitized service publishes them later). The truth
 *   program's runs above walk by default, so their exact figures hold for walked stacks
 *   too.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"

#define N_TRUTH_SITES 12

/* Every run waits for the service as long as it takes when the ring is full (the default
 * gives up after 100 ms and drops the sample, which a loaded machine reaches): dropped
 * samples are the fault tests' subject, not this file's. */
static char *const g_patient[] = {"--block-timeout-us", "60000000", NULL};

/* Records @prog_argv at @interval (seed @seed when not NULL; @extra options and @env may
 * be NULL); returns the trace path (malloc'd). */
static char *record(const char *interval, const char *seed, char *const extra[],
                    char *const prog_argv[], char *const env[], struct e2e_run *run)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[64];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "record";
    argv[k++] = "-q";
    argv[k++] = "-o";
    argv[k++] = trace;
    argv[k++] = "-i";
    argv[k++] = (char *)interval;
    if (seed) {
        argv[k++] = "--seed";
        argv[k++] = (char *)seed;
    }
    for (size_t i = 0; extra && extra[i] && k < 40; i++)
        argv[k++] = extra[i];
    argv[k++] = "--";
    for (size_t i = 0; prog_argv[i] && k < 63; i++)
        argv[k++] = prog_argv[i];
    argv[k] = NULL;
    assert_int_equal(e2e_run(argv, env, run), 0);
    return trace;
}

static struct rp_trace *load(const char *trace)
{
    struct rp_trace *t = NULL;
    int r = rp_trace_load(trace, &(struct rp_trace_options){0}, &t);
    assert_int_equal(r, 0);
    assert_non_null(t);
    assert_int_equal(e2e_check_rules(trace), 0);
    return t;
}

/* ---- stacks ----------------------------------------------------------------------- */

static bool name_is(const char *name, const char *const *set)
{
    for (size_t i = 0; set[i]; i++)
        if (strcmp(name, set[i]) == 0)
            return true;
    return false;
}

/* True when the root-most named frame of @cs, past the C runtime's start-up frames, is
 * main or a thread start. */
static bool stack_complete(const struct rp_trace_callsite *cs)
{
    static const char *const startup[] = {"_start", "__libc_start_main", "__libc_start_call_main",
                                          NULL};
    static const char *const roots[] = {"main", "start_thread", "clone3", "clone", NULL};
    for (size_t f = 0; f < cs->n_frames; f++) {
        const char *name = cs->frames[f].function_name;
        if (!*name)
            continue;
        if (name_is(name, startup))
            continue;
        return name_is(name, roots);
    }
    return false;
}

/* Samples (alloc_count) of @p whose stack is complete, and all samples. */
static void count_complete(const struct rp_trace_process *p, uint64_t *complete, uint64_t *all)
{
    *complete = *all = 0;
    for (size_t c = 0; c < p->n_callsites; c++) {
        const struct rp_trace_callsite *cs = &p->callsites[c];
        *all += cs->alloc_count;
        if (stack_complete(cs))
            *complete += cs->alloc_count;
        else if (cs->alloc_count > 0 && cs->n_frames > 0)
            print_message("  incomplete stack (%llu samples), leaf %s in %s\n",
                          (unsigned long long)cs->alloc_count,
                          cs->frames[cs->n_frames - 1].function_name,
                          cs->frames[cs->n_frames - 1].mapping_path);
    }
}

static uint64_t g_stack_complete, g_stack_all;

static void check_stacks(const struct rp_trace_process *p)
{
    uint64_t complete, all;
    count_complete(p, &complete, &all);
    assert_true(all > 0);
    double pct = 100.0 * (double)complete / (double)all;
    print_message("  stacks reaching main or a thread start: %.3f%% of %llu samples\n", pct,
                  (unsigned long long)all);
    g_stack_complete += complete;
    g_stack_all += all;
    assert_true(pct >= 99.9);
}

static void no_heapprof_frames(const struct rp_trace_process *p)
{
    for (size_t c = 0; c < p->n_callsites; c++)
        for (size_t f = 0; f < p->callsites[c].n_frames; f++)
            assert_null(strstr(p->callsites[c].frames[f].mapping_path, "libheapprof"));
}

/* ---- ground truth ----------------------------------------------------------------- */

static const struct rp_trace_process *run_truth(const char *interval, const char *seed,
                                                const char *scale, struct e2e_truth *truth,
                                                struct rp_trace **t, char **trace)
{
    struct e2e_run run;
    char *prog[] = {(char *)e2e_env("TRUTH_PROG"), (char *)scale, NULL};
    *trace = record(interval, seed, g_patient, prog, NULL, &run);
    assert_int_equal(run.status, 0);
    size_t nt = e2e_parse_truth(run.out, truth, E2E_MAX_TRUTH);
    assert_int_equal(nt, N_TRUTH_SITES);
    e2e_run_free(&run);
    *t = load(*trace);
    const struct rp_trace_process *p = e2e_find_process(*t, "truth_prog");
    assert_non_null(p);
    assert_int_equal(p->sampling_interval_bytes, strtoull(interval, NULL, 10));
    assert_true(p->from_startup);
    assert_false(p->buffer_overran);
    assert_int_equal(p->unwinding_errors, 0);
    no_heapprof_frames(p);
    return p;
}

static void finish_truth(struct rp_trace *t, char *trace)
{
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

static void test_accuracy_exact(void **state)
{
    (void)state;
    struct e2e_truth truth[E2E_MAX_TRUTH];
    struct rp_trace *t;
    char *trace;
    const struct rp_trace_process *p = run_truth("1", "1", "1", truth, &t, &trace);
    print_message("interval 1\n");
    for (size_t i = 0; i < N_TRUTH_SITES; i++) {
        struct e2e_sums s;
        e2e_sum_function(p, truth[i].name, &s);
        print_message("  %-22s alloc %llu/%llu (truth %llu/%llu) freed %llu/%llu (truth "
                      "%llu/%llu)\n",
                      truth[i].name, (unsigned long long)s.alloc_bytes,
                      (unsigned long long)s.alloc_count, (unsigned long long)truth[i].alloc_bytes,
                      (unsigned long long)truth[i].alloc_count, (unsigned long long)s.free_bytes,
                      (unsigned long long)s.free_count, (unsigned long long)truth[i].free_bytes,
                      (unsigned long long)truth[i].free_count);
        assert_true(s.callsites > 0);
        assert_int_equal(s.alloc_bytes, truth[i].alloc_bytes);
        assert_int_equal(s.alloc_count, truth[i].alloc_count);
        assert_int_equal(s.free_bytes, truth[i].free_bytes);
        assert_int_equal(s.free_count, truth[i].free_count);
    }
    check_stacks(p);
    finish_truth(t, trace);
}

/* @lanes: the lanes of the ring (HEAPPROF_RING_LANES, read by the service); NULL: as
 * the service picks them for this machine. */
static void run_reuse_8_threads(const char *lanes)
{
    struct e2e_run run;
    char *prog[] = {(char *)e2e_env("REUSE_THREADS"), "20000", "8", NULL};
    if (lanes)
        assert_int_equal(setenv("HEAPPROF_RING_LANES", lanes, 1), 0);
    char *trace = record("1", "1", g_patient, prog, NULL, &run);
    (void)unsetenv("HEAPPROF_RING_LANES");
    assert_int_equal(run.status, 0);
    struct e2e_truth truth[E2E_MAX_TRUTH];
    assert_int_equal(e2e_parse_truth(run.out, truth, E2E_MAX_TRUTH), 2);
    e2e_run_free(&run);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_process(t, "reuse_threads");
    assert_non_null(p);
    /* What was lost, by cause, before the asserts that fail on it. */
    print_message("  losses: dropped %llu reserve_failures %llu unread %llu in_service %llu "
                  "refused %llu frees_lost %llu client_error %d\n",
                  (unsigned long long)p->losses.records_dropped,
                  (unsigned long long)p->losses.reserve_failures,
                  (unsigned long long)p->losses.records_unread,
                  (unsigned long long)p->losses.records_lost_in_service,
                  (unsigned long long)p->losses.records_refused, (unsigned long long)p->frees_lost,
                  (int)p->client_error);
    assert_false(p->buffer_overran);
    assert_int_equal(p->frees_lost, 0);
    assert_int_equal(p->losses.records_dropped, 0);
    assert_int_equal(p->losses.unknown_frees, 0);
    assert_int_equal(p->possibly_freed_count, 0);
    uint64_t live = 0;
    for (size_t i = 0; i < 2; i++) {
        struct e2e_sums s;
        e2e_sum_function(p, truth[i].name, &s);
        print_message("  %-14s alloc %llu/%llu (truth %llu/%llu) freed %llu/%llu (truth "
                      "%llu/%llu)\n",
                      truth[i].name, (unsigned long long)s.alloc_bytes,
                      (unsigned long long)s.alloc_count, (unsigned long long)truth[i].alloc_bytes,
                      (unsigned long long)truth[i].alloc_count, (unsigned long long)s.free_bytes,
                      (unsigned long long)s.free_count, (unsigned long long)truth[i].free_bytes,
                      (unsigned long long)truth[i].free_count);
        assert_true(s.callsites > 0);
        assert_int_equal(s.alloc_bytes, truth[i].alloc_bytes);
        assert_int_equal(s.alloc_count, truth[i].alloc_count);
        assert_int_equal(s.free_bytes, truth[i].free_bytes);
        assert_int_equal(s.free_count, truth[i].free_count);
        live += truth[i].alloc_bytes - truth[i].free_bytes;
    }
    /* No phantom or negative live bytes anywhere, the program's other allocations
     * (stdio, thread stacks' bookkeeping) included. */
    uint64_t unreleased = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        assert_true(c->self_freed <= c->self_allocated);
        assert_true(c->free_count <= c->alloc_count);
        unreleased += c->self_allocated - c->self_freed;
    }
    assert_true(unreleased >= live);
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

/* tests/programs/idle_frees at interval 1 (@hold_ms, @end): the frees left in the
 * batches of a thread gone idle for good and of one that exited are all recorded. */
static void run_idle_frees(const char *hold_ms, const char *end)
{
    struct e2e_run run;
    char *prog[] = {(char *)e2e_env("IDLE_FREES"), (char *)hold_ms, (char *)end, NULL};
    char *trace = record("1", "1", NULL, prog, NULL, &run);
    assert_int_equal(run.status, 0);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_process(t, "idle_frees");
    assert_non_null(p);
    assert_int_equal(p->frees_lost, 0);
    e2e_check_exact_sites(p, run.out);
    e2e_run_free(&run);
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

/* By the library's own thread, every round: the process ends with the exit_group system
 * call after a second (no code of the library's runs at its end). */
static void test_accuracy_idle_batches_recorded(void **state)
{
    (void)state;
    run_idle_frees("1000", "exit_group");
}

/* By _exit(), at once (a child of fork, Python's os._exit): before any round. */
static void test_accuracy_idle_batches_at_exit(void **state)
{
    (void)state;
    run_idle_frees("0", "_exit");
}

static void test_accuracy_reuse_8_threads(void **state)
{
    (void)state;
    run_reuse_8_threads(NULL);
}

/* The same through rings of one lane (every record in reservation order) and of four
 * (merged by stamp, ring_layout.h): the order holds whichever the machine gets. Four
 * lanes on a machine of fewer CPUs also crowd the lanes of the CPUs there are with frees
 * (whose samples went to the others): a free there must move to a lane with room. */
static void test_accuracy_reuse_8_threads_one_lane(void **state)
{
    (void)state;
    run_reuse_8_threads("1");
}

static void test_accuracy_reuse_8_threads_four_lanes(void **state)
{
    (void)state;
    /* Forced lanes order records by the TSC: only where the kernel keeps time with it
     * (it checked that the CPUs' counters agree; elsewhere the service makes one lane). */
    char *clock = e2e_read_file("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    bool tsc = clock && strncmp(clock, "tsc\n", 4) == 0;
    free(clock);
    if (!tsc)
        skip();
    run_reuse_8_threads("4");
}

/* Checks @got against @truth at @interval when truth >= 20 * interval; returns whether
 * it checked. Prints the error in standard deviations. */
static bool check_poisson(const char *site, const char *what, uint64_t got, uint64_t truth,
                          uint64_t interval, double *worst_sigma)
{
    if (truth < 20 * interval)
        return false;
    double sd = sqrt((double)interval * (double)truth);
    double err = (double)got - (double)truth;
    double tol = 5 * sd + (double)interval;
    print_message("  %-22s %-10s got %12llu truth %12llu error %+7.3f sigma\n", site, what,
                  (unsigned long long)got, (unsigned long long)truth, err / sd);
    if (fabs(err / sd) > *worst_sigma)
        *worst_sigma = fabs(err / sd);
    assert_true(fabs(err) <= tol);
    return true;
}

static void sampled(const char *interval, const char *const seeds[3], const char *scale)
{
    uint64_t iv = strtoull(interval, NULL, 10);
    double worst = 0;
    for (size_t si = 0; si < 3; si++) {
        struct e2e_truth truth[E2E_MAX_TRUTH];
        struct rp_trace *t;
        char *trace;
        const struct rp_trace_process *p = run_truth(interval, seeds[si], scale, truth, &t, &trace);
        print_message("interval %s seed %s scale %s\n", interval, seeds[si], scale);
        size_t checked = 0;
        for (size_t i = 0; i < N_TRUTH_SITES; i++) {
            struct e2e_sums s;
            e2e_sum_function(p, truth[i].name, &s);
            if (strcmp(truth[i].name, "truth_huge") == 0) {
                /* Blocks of at least 512 KiB: recorded exactly at both intervals. */
                assert_true(iv <= (512u << 10));
                print_message("  %-22s exact: alloc %llu/%llu freed %llu/%llu\n", truth[i].name,
                              (unsigned long long)s.alloc_bytes, (unsigned long long)s.alloc_count,
                              (unsigned long long)s.free_bytes, (unsigned long long)s.free_count);
                assert_int_equal(s.alloc_bytes, truth[i].alloc_bytes);
                assert_int_equal(s.alloc_count, truth[i].alloc_count);
                assert_int_equal(s.free_bytes, truth[i].free_bytes);
                assert_int_equal(s.free_count, truth[i].free_count);
                checked++;
                continue;
            }
            bool c = check_poisson(truth[i].name, "allocated", s.alloc_bytes, truth[i].alloc_bytes,
                                   iv, &worst);
            check_poisson(truth[i].name, "freed", s.free_bytes, truth[i].free_bytes, iv, &worst);
            assert_true(s.free_bytes <= s.alloc_bytes);
            check_poisson(truth[i].name, "unreleased", s.alloc_bytes - s.free_bytes,
                          truth[i].alloc_bytes - truth[i].free_bytes, iv, &worst);
            checked += c;
        }
        print_message("  %zu sites checked\n", checked);
        assert_true(checked >= 3);
        check_stacks(p);
        finish_truth(t, trace);
    }
    print_message("interval %s: largest error %.3f sigma\n", interval, worst);
}

static void test_accuracy_sampled_4k(void **state)
{
    (void)state;
    const char *const seeds[3] = {"21", "22", "23"};
    sampled("4096", seeds, "2");
}

static void test_accuracy_sampled_512k(void **state)
{
    (void)state;
    const char *const seeds[3] = {"31", "32", "33"};
    sampled("524288", seeds, "10");
}

static void test_accuracy_stacks_total(void **state)
{
    (void)state;
    assert_true(g_stack_all > 0);
    double pct = 100.0 * (double)g_stack_complete / (double)g_stack_all;
    print_message("stacks reaching main or a thread start, all truth runs: %.3f%% of %llu "
                  "samples\n",
                  pct, (unsigned long long)g_stack_all);
    assert_true(pct >= 99.9);
}

/* ---- real programs ---------------------------------------------------------------- */

struct totals {
    uint64_t allocated, freed, samples, unwinding_errors, callsites;
};

static void process_totals(const struct rp_trace_process *p, struct totals *ret)
{
    memset(ret, 0, sizeof(*ret));
    for (size_t c = 0; c < p->n_callsites; c++) {
        ret->allocated += p->callsites[c].self_allocated;
        ret->freed += p->callsites[c].self_freed;
        ret->samples += p->callsites[c].alloc_count;
    }
    ret->unwinding_errors = p->unwinding_errors;
    ret->callsites = p->n_callsites;
}

static int by_allocated_desc(const void *a, const void *b)
{
    const struct rp_trace_callsite *x = *(const struct rp_trace_callsite *const *)a;
    const struct rp_trace_callsite *y = *(const struct rp_trace_callsite *const *)b;
    return x->self_allocated < y->self_allocated   ? 1
           : x->self_allocated > y->self_allocated ? -1
                                                   : 0;
}

/* The top 5 sites by allocated bytes each have a named function among their frames
 * (their leaf-most named frame is printed), and no frame is in libheapprof. */
static void check_plausible(const struct rp_trace_process *p)
{
    no_heapprof_frames(p);
    assert_true(p->n_callsites > 0);
    const struct rp_trace_callsite **order = calloc(p->n_callsites, sizeof(*order));
    assert_non_null(order);
    for (size_t c = 0; c < p->n_callsites; c++)
        order[c] = &p->callsites[c];
    qsort(order, p->n_callsites, sizeof(*order), by_allocated_desc);
    for (size_t i = 0; i < 5 && i < p->n_callsites; i++) {
        const struct rp_trace_callsite *cs = order[i];
        size_t named = 0;
        const char *leaf = NULL;
        for (size_t f = cs->n_frames; f-- > 0;) {
            if (!*cs->frames[f].function_name)
                continue;
            named++;
            if (!leaf && strcmp(cs->frames[f].function_name, "malloc") != 0)
                leaf = cs->frames[f].function_name;
        }
        char buf[256];
        print_message("  top %zu: %llu bytes, %zu/%zu frames named, leaf-most %s\n", i + 1,
                      (unsigned long long)cs->self_allocated, named, cs->n_frames,
                      leaf ? rp_demangle(leaf, buf, sizeof(buf)) : "(none)");
        assert_non_null(leaf);
    }
    free(order);
}

static const uint64_t g_unreleased_floor = 16u << 20;

/* Every stack the app walks is also copied (--audit-every 1): none may differ from the
 * service's unwind of its copy, and at least a fifth of the samples are walked. */
static void check_walks(const char *needle, char *const prog[], char *const env[])
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[64];
    size_t k = 0;
    char *const opts[] = {(char *)e2e_env("HEAPPROF_BIN"),
                          "record",
                          "--top",
                          "0",
                          "-o",
                          trace,
                          "-i",
                          "4096",
                          "--seed",
                          "41",
                          "--audit-every",
                          "1",
                          "--block-timeout-us",
                          "60000000",
                          "--",
                          NULL};
    for (size_t i = 0; opts[i]; i++)
        argv[k++] = opts[i];
    for (size_t i = 0; prog[i] && k < 63; i++)
        argv[k++] = prog[i];
    argv[k] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, env, &run), 0);
    assert_int_equal(run.status, 0);
    long long samples = e2e_number_before(run.err, " samples (");
    long long audited = e2e_number_before(run.err, " walks audited");
    print_message("%s: %lld samples, %lld walked and audited\n", needle, samples, audited);
    if (strstr(run.err, "differed"))
        print_message("%s", run.err);
    assert_null(strstr(run.err, "differed"));
    assert_true(samples > 0);
    assert_true(audited * 5 >= samples);
    e2e_run_free(&run);
    unlink(trace);
    free(trace);
}

/* Runs @prog at interval 1 and at 4096 and compares the totals of the process whose
 * cmdline contains @needle. */
static void real_program(const char *needle, char *const opts[], char *const prog[],
                         char *const env[])
{
    struct totals tot[2];
    const char *intervals[2] = {"1", "4096"};
    for (size_t k = 0; k < 2; k++) {
        struct e2e_run run;
        char *trace = record(intervals[k], "41", opts, prog, env, &run);
        if (run.status != 0)
            print_message("%s", run.err);
        assert_int_equal(run.status, 0);
        e2e_run_free(&run);
        struct rp_trace *t = load(trace);
        const struct rp_trace_process *p = e2e_find_process(t, needle);
        assert_non_null(p);
        process_totals(p, &tot[k]);
        print_message(
            "%s at interval %s: allocated %llu freed %llu unreleased %llu, %llu "
            "samples, %llu unwinding errors, %llu callsites%s\n",
            needle, intervals[k], (unsigned long long)tot[k].allocated,
            (unsigned long long)tot[k].freed, (unsigned long long)(tot[k].allocated - tot[k].freed),
            (unsigned long long)p->heap_samples, (unsigned long long)tot[k].unwinding_errors,
            (unsigned long long)tot[k].callsites, p->buffer_overran ? ", samples dropped" : "");
        if (p->buffer_overran)
            print_message("%s: dropped %llu (freeset full %llu), reserve failures %llu, "
                          "unread %llu, client error %d\n",
                          needle, (unsigned long long)p->losses.records_dropped,
                          (unsigned long long)p->losses.freeset_full,
                          (unsigned long long)p->losses.reserve_failures,
                          (unsigned long long)p->losses.records_unread, (int)p->client_error);
        assert_false(p->buffer_overran);
        check_plausible(p);
        rp_trace_free(t);
        unlink(trace);
        free(trace);
    }
    uint64_t ref_unreleased = tot[0].allocated - tot[0].freed;
    uint64_t got_unreleased = tot[1].allocated - tot[1].freed;
    double ratio_unreleased =
        (double)got_unreleased / (double)(ref_unreleased ? ref_unreleased : 1);
    double ratio_allocated = (double)tot[1].allocated / (double)tot[0].allocated;
    print_message("%s: 4096 / interval 1: unreleased %.4f, allocated %.4f (reference: %s)\n",
                  needle, ratio_unreleased, ratio_allocated,
                  ref_unreleased >= g_unreleased_floor ? "unreleased" : "allocated");
    if (ref_unreleased >= g_unreleased_floor) {
        assert_true(fabs(ratio_unreleased - 1) <= 0.10);
    } else {
        assert_true(tot[0].allocated >= g_unreleased_floor);
        assert_true(fabs(ratio_allocated - 1) <= 0.10);
    }
    check_walks(needle, prog, env);
}

static void test_accuracy_python(void **state)
{
    (void)state;
    const char *py = "/usr/bin/python3";
    if (access(py, X_OK) != 0)
        skip();
    /* Dicts, lists and strings; strings above 512 bytes and big tables come from malloc
     * (smaller objects from Python's own arenas). malloc's heap only: the accuracy of
     * sampling is what is measured, and python.objects at interval 1 (every object of the
     * interpreter, 1.2 M samples) only makes the run longer. */
    static char *const malloc_only[] = {"--block-timeout-us", "60000000", "--heaps", "libc.malloc",
                                        NULL};
    char *prog[] = {(char *)py, "-c",
                    "d = {}\n"
                    "for i in range(60000):\n"
                    "    d['key%06d' % i] = 'v' * (520 + i % 300)\n"
                    "lst = [str(i) * 3 for i in range(100000)]\n"
                    "s = ' '.join(lst)\n"
                    "words = s.split()\n"
                    "counts = {}\n"
                    "for w in words:\n"
                    "    counts[w[:4]] = counts.get(w[:4], 0) + 1\n"
                    "big = [list(range(i % 50)) for i in range(20000)]\n"
                    "print(len(d), len(words), len(counts), sum(len(x) for x in big))\n",
                    NULL};
    char *env[] = {"PYTHONHASHSEED=0", "PYTHONDONTWRITEBYTECODE=1", NULL};
    real_program("python3", malloc_only, prog, env);
}

static void test_accuracy_sqlite(void **state)
{
    (void)state;
    const char *sq = "/usr/bin/sqlite3";
    if (access(sq, X_OK) != 0)
        skip();
    char *prog[] = {
        (char *)sq,
        "-batch",
        "-init",
        "/dev/null",
        ":memory:",
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val REAL);"
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "
        "INSERT INTO t SELECT x, printf('name-%08d-%s', (x * 7919) % 200003, "
        "substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 26)), x % 1000, x * 1.5 FROM c;"
        "CREATE INDEX t_name ON t(name);"
        "CREATE INDEX t_grp ON t(grp, val);"
        "SELECT count(*), sum(val) FROM t WHERE grp = 7;",
        NULL};
    real_program("sqlite3", g_patient, prog, NULL);
}

static void test_accuracy_clang_format(void **state)
{
    (void)state;
    const char *cf = "/usr/bin/clang-format";
    if (access(cf, X_OK) != 0)
        skip();
    /* A realistic input: this project's bookkeeping sources, formatted as one file. */
    char *input = e2e_tmp_path(".c");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "cat '%s'/bookkeeping/*.c > '%s'", e2e_env("SOURCE_ROOT"), input);
    assert_int_equal(system(cmd), 0);
    char *prog[] = {(char *)cf, "--style=LLVM", input, NULL};
    real_program("clang-format", g_patient, prog, NULL);
    unlink(input);
    free(input);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accuracy_exact),
        cmocka_unit_test(test_accuracy_reuse_8_threads),
        cmocka_unit_test(test_accuracy_idle_batches_recorded),
        cmocka_unit_test(test_accuracy_idle_batches_at_exit),
        cmocka_unit_test(test_accuracy_reuse_8_threads_one_lane),
        cmocka_unit_test(test_accuracy_reuse_8_threads_four_lanes),
        cmocka_unit_test(test_accuracy_sampled_4k),
        cmocka_unit_test(test_accuracy_sampled_512k),
        cmocka_unit_test(test_accuracy_stacks_total),
        cmocka_unit_test(test_accuracy_python),
        cmocka_unit_test(test_accuracy_sqlite),
        cmocka_unit_test(test_accuracy_clang_format),
    };
    return cmocka_run_group_tests_name("e2e_accuracy", tests, NULL, NULL);
}
