/* tests/e2e/test_every_program.c: "every program" — the library must never change what a
 * program does. Each case is a real program run three ways: unprofiled (the reference),
 * with libheapprof.so preloaded and dormant, and under `heapprof record`; the stdout and
 * the exit status of every run must equal the reference's, and a recorded trace must
 * pass the trace-processor import rules. A case may add a check of its own (e.g. that
 * its allocations were profiled).
 *
 * Add a case: a program in tests/programs/harm/ (built by its meson.build, its path
 * given to the tests in an environment variable), and an entry in harm_cases below.
 * Arguments and environment values written "$VAR" are replaced by that variable's value
 * (paths from meson); "$LIB" is libheapprof.so. */
#include <setjmp.h>
#include <stdarg.h>
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
    /* Optional: more checks of a profiled run (trace is NULL in dormant runs). */
    void (*check)(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                  const char *trace);
};

/* ---- checks cases share ---------------------------------------------------------- */

/* The recording profiled the program: at least one sample. */
static void check_sampled(const struct harm_case *c, enum harm_mode mode, const struct e2e_run *run,
                          const char *trace)
{
    (void)c;
    (void)run;
    if (mode != HARM_RECORD)
        return;
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    uint64_t samples = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        for (size_t j = 0; j < t->processes[i].n_callsites; j++)
            samples += t->processes[i].callsites[j].alloc_count;
    print_message("    %llu sampled allocations\n", (unsigned long long)samples);
    assert_true(samples > 0);
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

static const struct harm_case harm_cases[] = {
    /* A plain program, as a reference for the harness itself. */
    {"three_sites", {"$THREE_SITES", NULL}, {NULL}, HARM_ALL, check_sampled},
    /* ucontext fibers taking turns, and the review's A4 case: a thread's first sample on
     * a 256 KiB fiber stack that is then unmapped and replaced by a 32 KiB one. */
    {"fibers", {"$HARM_FIBERS", NULL}, {NULL}, HARM_ALL, check_whole},
    /* A signal handler allocating on a sigaltstack, a roomy one and a small one. */
    {"altstack", {"$HARM_ALTSTACK", NULL}, {NULL}, HARM_ALL, check_whole},
    /* Plugin loaders (the review's A3): a plugin found through the program's DT_RUNPATH,
     * through $ORIGIN in the name given to dlopen, and loaded into a namespace of its own
     * (whose dlopen of a helper must stay in that namespace). */
    {"plugins_runpath", {"$HARM_PLUGINS_RUNPATH", "runpath", NULL}, {NULL}, HARM_ALL, check_whole},
    {"plugins_origin", {"$HARM_PLUGINS_ORIGIN", "origin", NULL}, {NULL}, HARM_ALL, check_whole},
    {"plugins_dlmopen", {"$HARM_PLUGINS_ORIGIN", "dlmopen", NULL}, {NULL}, HARM_ALL, check_sampled},
    /* Allocations 300 frames and over 64 KiB deep: whole stacks, no error frame. */
    {"deep_recursion", {"$HARM_DEEP", NULL}, {NULL}, HARM_ALL, check_whole},
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
        r->argv[k++] = "-q";
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
