/* tests/e2e/test_every_program.c: "every program" — the library must never change what a
 * program does. Each case is a real program run three ways: unprofiled (the reference),
 * with libheapprof.so preloaded and dormant, and under `heapprof record`; the stdout and
 * the exit status of every run must equal the reference's, and a recorded trace must
 * pass the trace-processor import rules. A case may add a check of its own (e.g. that
 * its allocations were profiled). The attach column (programs attached and detached
 * while they run, preloaded or not) is tests/e2e/test_attach_matrix.c.
 *
 * Add a case: a program in tests/programs/harm/ (built by its meson.build, its path
 * given to the tests in an environment variable), and an entry in harm_cases below.
 * Arguments and environment values written "$VAR" are replaced by that variable's value
 * (paths from meson); "$LIB" is libheapprof.so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

enum harm_mode {
    HARM_DORMANT = 1u << 0, /* LD_PRELOAD=libheapprof.so, no service */
    HARM_RECORD = 1u << 1,  /* heapprof record -- argv */
};
#define HARM_ALL (HARM_DORMANT | HARM_RECORD)

struct harm_run;
struct harm_case {
    const char *name;
    const char *argv[16];
    /* Extra environment of every run. An LD_PRELOAD here is kept in the profiled runs,
     * with libheapprof.so placed first, unless it names "$LIB" itself (its position is
     * then kept: a library preloaded before ours). */
    const char *env[8];
    unsigned modes;
    /* Options of `heapprof record` beside -o (default: -q). */
    const char *record_args[8];
    /* Optional: more checks of a profiled run (trace is NULL in dormant runs). */
    void (*check)(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                  const char *trace);
};

/* ---- checks cases share ---------------------------------------------------------- */

/* Sampled allocations in the trace of a recorded run. */
static uint64_t samples_in(const char *trace)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    uint64_t samples = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        for (size_t j = 0; j < t->processes[i].n_callsites; j++)
            samples += t->processes[i].callsites[j].alloc_count;
    rp_trace_free(t);
    print_message("    %llu sampled allocations\n", (unsigned long long)samples);
    return samples;
}

/* The recording profiled the program: at least one sample. */
static void check_sampled(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                          const char *trace)
{
    (void)c;
    (void)run;
    if (mode == HARM_RECORD)
        assert_true(samples_in(trace) > 0);
}

/* The plugin's own allocations were profiled: at least 500 samples (its ~40 MB at 4 KiB:
 * ~10000 expected) under harm_plugin_alloc. */
static void check_plugin_sampled(const struct harm_case *c, enum harm_mode mode,
                                 const struct e2e_run *run, const char *trace)
{
    (void)c;
    (void)run;
    if (mode != HARM_RECORD)
        return;
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    assert_true(t->n_processes >= 1);
    struct e2e_sums sums;
    e2e_sum_function(&t->processes[0], "harm_plugin_alloc", &sums);
    print_message("    %llu samples in the plugin\n", (unsigned long long)sums.alloc_count);
    assert_true(sums.alloc_count >= 500);
    rp_trace_free(t);
}

/* The service was stopped for 2 s while the program ran (tests/programs/harm/rate_stop.c
 * stops its parent when that is `heapprof record`): the loop's rate from 1 s after the
 * stop on stays at least RATE_STOP_MIN_RATIO of its rate before (the bench's goal is 0.5;
 * the test leaves room for a loaded machine: before the fix it was about 1e-4), and the
 * dump says samples were dropped (buffer_overran) but not that the client stopped
 * waiting for good (CLIENT_ERROR_HIT_TIMEOUT): it waits again once the service is back. */
#define RATE_STOP_MIN_RATIO 0.2
static void check_stopped_service(const struct harm_case *c, enum harm_mode mode,
                                  const struct e2e_run *run, const char *trace)
{
    (void)c;
    const char *line = strstr(run->err, "rate_stop:");
    assert_non_null(line);
    double before, during, after, ratio;
    assert_int_equal(sscanf(line, "rate_stop: before %lf/s during %lf/s after %lf/s ratio %lf",
                            &before, &during, &after, &ratio),
                     4);
    print_message("    %s: %.3g pairs/s before, %.3g during the stop, %.3g after (ratio %.3f)\n",
                  mode == HARM_RECORD ? "recorded" : "dormant", before, during, after, ratio);
    if (mode != HARM_RECORD)
        return;
    assert_true(ratio >= RATE_STOP_MIN_RATIO);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    assert_false(t->processes[0].client_error);
    assert_true(t->processes[0].buffer_overran);
    rp_trace_free(t);
}

/* The program was profiled through and through, not only by the odd call that reached
 * our exports: at least 500 samples of its ~20 MB at 4 KiB (about 1750 expected; Poisson,
 * so fewer than 500 does not happen by chance). With an allocator preloaded before us
 * this is what the hooks in GOT slots add (2 samples without them). */
static void check_sampled_many(const struct harm_case *c, enum harm_mode mode,
                               const struct e2e_run *run, const char *trace)
{
    (void)c;
    (void)run;
    if (mode == HARM_RECORD)
        assert_true(samples_in(trace) >= 500);
}

/* cxx_new_site() in tests/programs/harm/alloc_family.cpp: CXX_BLOCKS blocks through every
 * operator new, freed through every operator delete. */
#define CXX_SITE "cxx_new_site"
#define CXX_BLOCKS 4000

/* The sums of the frames named CXX_SITE in the only process of @trace. */
static void cxx_sums(const char *trace, struct e2e_sums *ret)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    e2e_sum_function(&t->processes[0], CXX_SITE, ret);
    print_message("    %s: %llu allocations (%llu bytes), %llu frees (%llu bytes)\n", CXX_SITE,
                  (unsigned long long)ret->alloc_count, (unsigned long long)ret->alloc_bytes,
                  (unsigned long long)ret->free_count, (unsigned long long)ret->free_bytes);
    rp_trace_free(t);
}

/* As check_sampled_many, and C++'s new and delete were profiled too, with an allocator
 * whose operators never call malloc: at least 500 samples of cxx_new_site()'s ~7.8 MB at
 * 4 KiB (about 1900 expected; none before the operators were hooked), each of them freed
 * (every block is deleted before the program exits). */
static void check_sampled_cxx(const struct harm_case *c, enum harm_mode mode,
                              const struct e2e_run *run, const char *trace)
{
    check_sampled_many(c, mode, run, trace);
    if (mode != HARM_RECORD)
        return;
    struct e2e_sums s;
    cxx_sums(trace, &s);
    assert_true(s.alloc_count >= 500);
    assert_int_equal(s.free_count, s.alloc_count);
    assert_int_equal(s.free_bytes, s.alloc_bytes);
}

/* At interval 1, every block of cxx_new_site() is counted once, and its delete once:
 * neither missed (operators not hooked) nor counted twice (a hook on the operator and
 * another on the malloc it calls, as libstdc++'s does). */
static void check_cxx_exact(const struct harm_case *c, enum harm_mode mode,
                            const struct e2e_run *run, const char *trace)
{
    (void)c;
    (void)run;
    if (mode != HARM_RECORD)
        return;
    struct e2e_sums s;
    cxx_sums(trace, &s);
    assert_int_equal(s.alloc_count, CXX_BLOCKS);
    assert_int_equal(s.free_count, CXX_BLOCKS);
    assert_int_equal(s.free_bytes, s.alloc_bytes);
}

/* Sampled allocations (and frees) at frames named @fn in @p. */
static uint64_t samples_at(const struct rp_trace_process *p, const char *fn)
{
    struct e2e_sums s;
    e2e_sum_function(p, fn, &s);
    return s.alloc_count;
}

static const struct rp_trace_process *only_process(const struct rp_trace *t)
{
    assert_int_equal(t->n_processes, 1);
    return &t->processes[0];
}

/* The program closed the profiler's connection at start (close_range): its data came
 * through (compared by the harness); the loss is in the dump and in the summary, and
 * what it allocated before is profiled. */
static void check_conn_closed(const struct harm_case *c, enum harm_mode mode,
                              const struct e2e_run *run, const char *trace)
{
    (void)c;
    if (mode != HARM_RECORD)
        return;
    assert_non_null(strstr(run->err, "closed the profiler's connection while running"));
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = only_process(t);
    print_message("    connection_closed_by_program %d, %llu samples before the close\n",
                  p->connection_closed_by_program,
                  (unsigned long long)samples_at(p, "before_close"));
    assert_true(p->connection_closed_by_program);
    assert_true(p->connection_lost);
    assert_false(p->buffer_corrupted);
    assert_true(samples_at(p, "before_close") > 0);
    rp_trace_free(t);
}

/* The program was stopped for longer than the stall timeout with a record half written:
 * the service waited for it, said so, and the profile goes on after the stop. */
static void check_stopped(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                          const char *trace)
{
    (void)c;
    if (mode != HARM_RECORD)
        return;
    if (strstr(run->err, "cannot trace")) {
        print_message("    ptrace is not permitted here: %s\n", run->err);
        skip();
    }
    /* The debugger found the thread inside a record (it searches for 10 s; the thread
     * spends much of its time there). */
    assert_non_null(strstr(run->err, "held inside a record"));
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = only_process(t);
    print_message("    writer_stalled %d (%llu waits), buffer_corrupted %d, %llu samples after "
                  "the stop\n",
                  p->writer_stalled, (unsigned long long)p->writer_stalls, p->buffer_corrupted,
                  (unsigned long long)samples_at(p, "after_stop"));
    assert_false(p->buffer_corrupted);
    assert_true(p->writer_stalled);
    assert_true(p->writer_stalls >= 1);
    assert_int_equal(samples_at(p, "after_stop"), 64);
    rp_trace_free(t);
}

/* Every sampled stack with a frame named @fn (all of them if NULL) starts at one of @roots
 * (NULL-terminated; the root is the first frame) and holds no error frame ("ERROR ...")
 * but, when @label is set, that one as its root; at least one such stack, and no
 * unwinding error in any process. */
static void check_stacks(const char *fn, const char *const *roots, const char *label,
                         const char *trace)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    uint64_t whole = 0, broken = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        for (size_t j = 0; j < p->n_callsites; j++) {
            const struct rp_trace_callsite *cs = &p->callsites[j];
            bool has_fn = !fn, has_error = false, rooted = false;
            for (size_t f = 0; f < cs->n_frames; f++) {
                const char *name = cs->frames[f].function_name;
                has_fn |= fn && strcmp(name, fn) == 0;
                has_error |=
                    strncmp(name, "ERROR", 5) == 0 && !(f == 0 && label && !strcmp(name, label));
            }
            for (size_t r = 0; cs->n_frames && roots[r]; r++)
                rooted |= strcmp(cs->frames[0].function_name, roots[r]) == 0;
            if (!has_fn || !cs->alloc_count)
                continue;
            if (rooted && !has_error) {
                whole += cs->alloc_count;
                continue;
            }
            broken += cs->alloc_count;
            print_message("    broken stack (%zu frames, %llu samples):", cs->n_frames,
                          (unsigned long long)cs->alloc_count);
            for (size_t f = 0; f < cs->n_frames && f < 8; f++)
                print_message(" %s", cs->frames[f].function_name);
            print_message("\n");
        }
        print_message("    %s: %llu unwinding errors\n", p->cmdline,
                      (unsigned long long)p->unwinding_errors);
        assert_int_equal(p->unwinding_errors, 0);
    }
    print_message("    %llu samples of %s whole, %llu not\n", (unsigned long long)whole,
                  fn ? fn : "any function", (unsigned long long)broken);
    assert_true(whole > 0);
    assert_int_equal(broken, 0);
    rp_trace_free(t);
}

/* The roots a whole stack of the main thread or of a thread has. */
static const char *const thread_roots[] = {"_start", "clone3", NULL};
/* Fibers end at their entry (glibc's __start_context, which makecontext puts below the
 * fiber's function); the main thread's stacks at _start. */
static const char *const fiber_roots[] = {"_start", "__start_context", NULL};
/* A handler on a signal stack: up to the signal frame; the stack it interrupted is not
 * copied, which the stack says rather than guessing it from memory changed since. */
static const char *const altstack_roots[] = {"ERROR STACK_TRUNCATED", NULL};

/* The cases whose recorded stacks through @fn must come out whole (check_whole()): the
 * root one of @roots (NULL: thread_roots), no error frame but @label as the root. */
static const struct whole_spec {
    const char *name, *fn;
    const char *const *roots;
    const char *label;
} whole_specs[] = {
    {"fibers", "fiber_work", fiber_roots, NULL},
    {"altstack", "handler_work", altstack_roots, "ERROR STACK_TRUNCATED"},
    {"plugins_runpath", "plug_work", NULL, NULL},
    {"plugins_origin", "plug_work", NULL, NULL},
    {"deep_recursion", "deep_alloc", NULL, NULL},
};

static void check_whole(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                        const char *trace)
{
    (void)run;
    for (size_t i = 0; mode == HARM_RECORD && i < sizeof(whole_specs) / sizeof(whole_specs[0]);
         i++) {
        const struct whole_spec *w = &whole_specs[i];
        if (!strcmp(w->name, c->name))
            check_stacks(w->fn, w->roots ? w->roots : thread_roots, w->label, trace);
    }
}

/* ---- the cases --------------------------------------------------------------------- */

/* One program using every malloc-family call, with another allocator linked (a DT_NEEDED
 * library), preloaded before libheapprof.so (its calls never reach our exports: hooks go
 * into GOT slots) and preloaded after it. The output carries the allocator's usable
 * sizes: a block from the wrong allocator changes it, a pointer given to the wrong one
 * crashes. Cases whose allocator is not installed are skipped. */
static const struct harm_case harm_cases[] = {
    /* A plain program, as a reference for the harness itself. */
    {"three_sites", {"$THREE_SITES", NULL}, {NULL}, HARM_ALL, {NULL}, check_sampled},
    {"alloc_jemalloc_linked",
     {"$HARM_ALLOC_FAMILY_JEMALLOC", NULL},
     {NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_jemalloc_before",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBJEMALLOC:$LIB", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_jemalloc_after",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBJEMALLOC", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_tcmalloc_linked",
     {"$HARM_ALLOC_FAMILY_TCMALLOC", NULL},
     {NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_tcmalloc_before",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBTCMALLOC:$LIB", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_tcmalloc_after",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBTCMALLOC", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_mimalloc_linked",
     {"$HARM_ALLOC_FAMILY_MIMALLOC", NULL},
     {NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_mimalloc_before",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBMIMALLOC:$LIB", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
    {"alloc_mimalloc_after",
     {"$HARM_ALLOC_FAMILY", NULL},
     {"LD_PRELOAD=$HARM_LIBMIMALLOC", NULL},
     HARM_ALL,
     {NULL},
     check_sampled_cxx},
/* C++'s operators at interval 1: counted once each with glibc (libstdc++'s operators
 * call malloc) and with each allocator's own operators, through our exports (after
 * us) and through GOT slots (before us). The failing news throw std::bad_alloc
 * through the hooks (tcmalloc, jemalloc). */
#define CXX_EXACT_ARGS                                                                             \
    {                                                                                              \
        "-q", "-i", "1", "--block-timeout-us", "60000000", NULL                                    \
    }
    {"cxx_exact_glibc",
     {"$HARM_ALLOC_FAMILY", "cxx", NULL},
     {NULL},
     HARM_RECORD,
     CXX_EXACT_ARGS,
     check_cxx_exact},
    {"cxx_exact_jemalloc_after",
     {"$HARM_ALLOC_FAMILY", "cxx", NULL},
     {"LD_PRELOAD=$HARM_LIBJEMALLOC", NULL},
     HARM_RECORD,
     CXX_EXACT_ARGS,
     check_cxx_exact},
    {"cxx_exact_tcmalloc_before",
     {"$HARM_ALLOC_FAMILY", "cxx", NULL},
     {"LD_PRELOAD=$HARM_LIBTCMALLOC:$LIB", NULL},
     HARM_RECORD,
     CXX_EXACT_ARGS,
     check_cxx_exact},
    {"cxx_exact_mimalloc_linked",
     {"$HARM_ALLOC_FAMILY_MIMALLOC", "cxx", NULL},
     {NULL},
     HARM_RECORD,
     CXX_EXACT_ARGS,
     check_cxx_exact},
#undef CXX_EXACT_ARGS
    /* Code loaded after start-up, with the allocator preloaded before us: the plugin's GOT
     * slots get the hooks when dlopen returns. */
    {"alloc_jemalloc_before_plugin",
     {"$HARM_PLUGIN_HOST", "$HARM_PLUGIN", NULL},
     {"LD_PRELOAD=$HARM_LIBJEMALLOC:$LIB", NULL},
     HARM_ALL,
     {NULL},
     check_plugin_sampled},
    /* A service stopped for 2 s. */
    /* Waits for room end after 0.5 s: the 2 s stop ends one, and a busy machine that
     * keeps the service off the CPU for 0.1 s would end another near the program's end
     * (CLIENT_ERROR_HIT_TIMEOUT then, rightly: it was not waiting when it ended). */
    {"service_stopped",
     {"$HARM_RATE_STOP", NULL},
     {NULL},
     HARM_ALL,
     {"-q", "--block-timeout-us", "500000", NULL},
     check_stopped_service},
    /* A daemon that closes every descriptor at start and then uses pipes (issue 15,
     * case 2): its data intact, the lost connection visible. */
    {"closefds_daemon",
     {"$HARM_CLOSEFDS", NULL},
     {NULL},
     HARM_ALL,
     {"--top", "0", NULL},
     check_conn_closed},
    /* A user namespace needs a single-threaded process: the dormant library keeps no
     * thread (case 6). */
    {"unshare_user", {"/usr/bin/unshare", "-U", "true", NULL}, {NULL}, HARM_DORMANT, {NULL}, NULL},
    /* Stopped mid-record by a debugger, and by SIGSTOP, for longer than the stall timeout
     * (case 10). Stack copies on every sample make the thread spend its time in records. */
    {"stopped_ptrace",
     {"$HARM_STOPPED", "ptrace", NULL},
     {NULL},
     HARM_ALL,
     {"-q", "--no-fast-unwind", NULL},
     check_stopped},
    {"stopped_sigstop",
     {"$HARM_STOPPED", "sigstop", NULL},
     {NULL},
     HARM_ALL,
     {"-q", "--no-fast-unwind", NULL},
     check_stopped},
    /* ucontext fibers taking turns, and the review's A4 case: a thread's first sample on
     * a 256 KiB fiber stack that is then unmapped and replaced by a 32 KiB one. */
    {"fibers", {"$HARM_FIBERS", NULL}, {NULL}, HARM_ALL, {NULL}, check_whole},
    /* A signal handler allocating on a sigaltstack, a roomy one and a small one. */
    {"altstack", {"$HARM_ALTSTACK", NULL}, {NULL}, HARM_ALL, {NULL}, check_whole},
    /* Plugin loaders (the review's A3): a plugin found through the program's DT_RUNPATH,
     * through $ORIGIN in the name given to dlopen, and loaded into a namespace of its own
     * (whose dlopen of a helper must stay in that namespace). */
    /* Recorded in block mode: the sample after the dlopen waits until the service has
     * read the maps, so the plugin's frames are named although it is closed at once (in
     * the default mode a service slower than the program, as the ASan build's beside a
     * CPU hog, reads them after the dlclose: unnamed). */
    {"plugins_runpath",
     {"$HARM_PLUGINS_RUNPATH", "runpath", NULL},
     {NULL},
     HARM_ALL,
     {"-q", "--block-client", "--block-timeout-us", "10000000", NULL},
     check_whole},
    {"plugins_origin",
     {"$HARM_PLUGINS_ORIGIN", "origin", NULL},
     {NULL},
     HARM_ALL,
     {"-q", "--block-client", "--block-timeout-us", "10000000", NULL},
     check_whole},
    {"plugins_dlmopen",
     {"$HARM_PLUGINS_ORIGIN", "dlmopen", NULL},
     {NULL},
     HARM_ALL,
     {NULL},
     check_sampled},
    /* Allocations 300 frames and over 64 KiB deep: whole stacks, no error frame. */
    {"deep_recursion", {"$HARM_DEEP", NULL}, {NULL}, HARM_ALL, {NULL}, check_whole},
};

/* ---- the harness ------------------------------------------------------------------- */

static const char *expand(const char *s, char *buf, size_t len)
{
    if (s[0] != '$')
        return s;
    const char *name = s + 1;
    const char *v = !strcmp(name, "LIB") ? e2e_env("HEAPPROF_LIB") : e2e_env(name);
    snprintf(buf, len, "%s", v);
    return buf;
}

/* "VAR=value" with each ':'-separated "$X" of the value expanded. */
static char *expand_env(const char *entry)
{
    char out[4096];
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) + 1 : strlen(entry);
    snprintf(out, sizeof(out), "%.*s", (int)n, entry);
    const char *p = eq ? eq + 1 : "";
    while (*p) {
        const char *colon = strchr(p, ':');
        size_t l = colon ? (size_t)(colon - p) : strlen(p);
        char item[1024], buf[1024];
        snprintf(item, sizeof(item), "%.*s", (int)l, p);
        size_t o = strlen(out);
        snprintf(out + o, sizeof(out) - o, "%s%s", o > n ? ":" : "",
                 expand(item, buf, sizeof(buf)));
        p += l;
        if (*p == ':')
            p++;
    }
    return strdup(out);
}

struct harm_run {
    char *argv[40];
    char *env[12];
    char *owned[48];
    size_t n_owned;
};

static char *own(struct harm_run *r, char *s)
{
    assert_true(r->n_owned < 48);
    r->owned[r->n_owned++] = s;
    return s;
}

static void harm_run_free(struct harm_run *r)
{
    for (size_t i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    memset(r, 0, sizeof(*r));
}

/* Builds the command line and environment of @c in @mode (0: unprofiled). */
static void build(const struct harm_case *c, unsigned mode, const char *trace, struct harm_run *r)
{
    size_t k = 0, e = 0;
    char buf[1024];
    if (mode == HARM_RECORD) {
        r->argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
        r->argv[k++] = "record";
        if (!c->record_args[0])
            r->argv[k++] = "-q";
        for (size_t i = 0; c->record_args[i]; i++)
            r->argv[k++] = (char *)c->record_args[i];
        r->argv[k++] = "-o";
        r->argv[k++] = (char *)trace;
        r->argv[k++] = "--";
    }
    for (size_t i = 0; c->argv[i]; i++)
        r->argv[k++] = own(r, strdup(expand(c->argv[i], buf, sizeof(buf))));
    r->argv[k] = NULL;

    bool have_preload = false;
    for (size_t i = 0; c->env[i]; i++) {
        bool preload = !strncmp(c->env[i], "LD_PRELOAD=", 11);
        if (preload && mode == 0 && strstr(c->env[i], "$LIB")) {
            /* Unprofiled: the other libraries of the list, without ours. */
            char tmp[2048] = "LD_PRELOAD=";
            const char *p = c->env[i] + 11;
            while (*p) {
                const char *colon = strchr(p, ':');
                size_t l = colon ? (size_t)(colon - p) : strlen(p);
                if (strncmp(p, "$LIB", l) != 0 || l != 4)
                    snprintf(tmp + strlen(tmp), sizeof(tmp) - strlen(tmp), "%s%.*s",
                             tmp[11] ? ":" : "", (int)l, p);
                p += l + (p[l] == ':');
            }
            r->env[e++] = own(r, expand_env(tmp));
            have_preload = true;
            continue;
        }
        if (preload && mode == HARM_DORMANT && !strstr(c->env[i], "$LIB")) {
            char tmp[2048];
            snprintf(tmp, sizeof(tmp), "LD_PRELOAD=$LIB:%s", c->env[i] + 11);
            r->env[e++] = own(r, expand_env(tmp));
            have_preload = true;
            continue;
        }
        have_preload |= preload;
        r->env[e++] = own(r, expand_env(c->env[i]));
    }
    if (mode == HARM_DORMANT && !have_preload)
        r->env[e++] = own(r, expand_env("LD_PRELOAD=$LIB"));
    if (mode == HARM_DORMANT)
        r->env[e++] = "HEAPPROF_STARTUP=0";
    r->env[e] = NULL;
}

/* The case preloads a library of its own (the service gets it too in recorded runs). */
static bool preloads_other(const struct harm_case *c)
{
    for (size_t i = 0; c->env[i]; i++)
        if (!strncmp(c->env[i], "LD_PRELOAD=", 11) && strcmp(c->env[i], "LD_PRELOAD=$LIB") != 0)
            return true;
    return false;
}

/* False when a "$VAR" the case names is not set (an allocator that is not installed). */
static bool available(const struct harm_case *c)
{
    const char *items[24];
    size_t n = 0;
    for (size_t i = 0; c->argv[i] && n < 24; i++)
        items[n++] = c->argv[i];
    for (size_t i = 0; c->env[i] && n < 24; i++)
        items[n++] = strchr(c->env[i], '=') ? strchr(c->env[i], '=') + 1 : c->env[i];
    for (size_t i = 0; i < n; i++) {
        for (const char *p = items[i]; p && *p;) {
            size_t l = strcspn(p, ":");
            if (p[0] == '$' && strncmp(p, "$LIB", l) != 0) {
                char var[128];
                snprintf(var, sizeof(var), "%.*s", (int)(l - 1), p + 1);
                const char *v = getenv(var);
                if (!v || !*v) {
                    print_message("  %s: skipped, %s is not set (not installed)\n", c->name, var);
                    return false;
                }
            }
            p += l + (p[l] == ':');
        }
    }
    return true;
}

static void run_case(const struct harm_case *c)
{
    struct harm_run r;
    struct e2e_run ref;
    memset(&r, 0, sizeof(r));
    build(c, 0, NULL, &r);
    assert_int_equal(e2e_run(r.argv, r.env, &ref), 0);
    harm_run_free(&r);
    print_message("  %s: unprofiled exit %d, %zu bytes of output\n", c->name, ref.status,
                  strlen(ref.out));
    static const enum harm_mode modes[] = {HARM_DORMANT, HARM_RECORD};
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        if (!(c->modes & modes[m]))
            continue;
        if (modes[m] == HARM_RECORD && preloads_other(c) && getenv("HARM_SANITIZE") &&
            strcmp(getenv("HARM_SANITIZE"), "none") != 0) {
            print_message("  %s (recorded): skipped, the sanitized service would run with the "
                          "case's LD_PRELOAD\n",
                          c->name);
            continue;
        }
        char *trace = modes[m] == HARM_RECORD ? e2e_tmp_path(".pftrace") : NULL;
        struct e2e_run run;
        memset(&r, 0, sizeof(r));
        build(c, modes[m], trace, &r);
        assert_int_equal(e2e_run(r.argv, r.env, &run), 0);
        harm_run_free(&r);
        const char *mname = modes[m] == HARM_RECORD ? "recorded" : "dormant";
        if (run.status != ref.status || strcmp(run.out, ref.out) != 0) {
            print_error("%s (%s): exit %d, want %d\n--- stdout\n%s\n--- want\n%s\n--- stderr\n%s\n",
                        c->name, mname, run.status, ref.status, run.out, ref.out, run.err);
            fail();
        }
        if (trace)
            assert_int_equal(e2e_check_rules(trace), 0);
        if (c->check)
            c->check(c, modes[m], &run, trace);
        print_message("  %s (%s): same output and exit status\n", c->name, mname);
        e2e_run_free(&run);
        if (trace) {
            unlink(trace);
            free(trace);
        }
    }
    e2e_run_free(&ref);
}

static void test_every_program(void **state)
{
    const struct harm_case *c = *state;
    if (!available(c))
        skip();
    run_case(c);
}

int main(void)
{
    size_t n = sizeof(harm_cases) / sizeof(harm_cases[0]);
    struct CMUnitTest *tests = calloc(n, sizeof(*tests));
    for (size_t i = 0; i < n; i++)
        tests[i] = (struct CMUnitTest){.name = harm_cases[i].name,
                                       .test_func = test_every_program,
                                       .initial_state = (void *)&harm_cases[i]};
    int r = _cmocka_run_group_tests("every_program", tests, n, NULL, NULL);
    free(tests);
    return r;
}
