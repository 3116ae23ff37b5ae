/* tests/e2e/test_python.c: Python frames in the stacks of CPython 3.11 programs
 * (tests/programs/py_*.py, issue 28): each evaluation loop frame is replaced by the
 * Python frames it ran, "function (file.py:line)", at the right place among the native
 * frames; counts at interval 1 are exact; the programs' output is unchanged; the traces
 * pass our import rules and Perfetto's trace processor.
 *
 * Every test runs with each CPython 3.11 found: the system's /usr/bin/python3 and the
 * python3.11 / python3 of the PATH when those are other builds (a --enable-shared one,
 * with debug symbols). Another version only is skipped. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

#define MAX_PYTHONS 3
static char pythons[MAX_PYTHONS][PATH_MAX];
static size_t n_pythons;

/* True when @path runs a CPython 3.11. */
static bool is_py311(const char *path)
{
    char *argv[] = {(char *)path, "-c", "import sys; print(sys.version_info[:2] == (3, 11))", NULL};
    struct e2e_run r;
    if (e2e_run(argv, NULL, &r) != 0)
        return false;
    bool yes = r.status == 0 && strcmp(r.out, "True\n") == 0;
    e2e_run_free(&r);
    return yes;
}

/* The interpreter @path runs (a launcher script may stand for it), into @ret. */
static bool executable_of(const char *path, char *ret)
{
    char *argv[] = {(char *)path, "-c", "import sys; print(sys.executable)", NULL};
    struct e2e_run r;
    if (e2e_run(argv, NULL, &r) != 0)
        return false;
    size_t len = strcspn(r.out, "\n");
    bool ok = r.status == 0 && len > 0 && len < PATH_MAX;
    if (ok)
        snprintf(ret, PATH_MAX, "%.*s", (int)len, r.out);
    e2e_run_free(&r);
    return ok;
}

static void add_python(const char *launcher)
{
    char real[PATH_MAX], path[PATH_MAX];
    if (n_pythons == MAX_PYTHONS || access(launcher, X_OK) != 0 || !is_py311(launcher) ||
        !executable_of(launcher, path) || !realpath(path, real))
        return;
    for (size_t i = 0; i < n_pythons; i++) {
        char other[PATH_MAX];
        if (realpath(pythons[i], other) && strcmp(other, real) == 0)
            return;
    }
    snprintf(pythons[n_pythons++], PATH_MAX, "%s", path);
}

/* The CPython 3.11 interpreters to test with. */
static void find_pythons(void)
{
    add_python("/usr/bin/python3");
    const char *path = getenv("PATH");
    static const char *const names[] = {"python3.11", "python3"};
    for (size_t k = 0; path && k < 2; k++) {
        char *dirs = strdup(path), *save = NULL;
        for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
            char p[PATH_MAX];
            snprintf(p, sizeof(p), "%s/%s", d, names[k]);
            if (access(p, X_OK) == 0) {
                add_python(p);
                break;
            }
        }
        free(dirs);
    }
}

static char *program(const char *name)
{
    char *p = malloc(PATH_MAX);
    snprintf(p, PATH_MAX, "%s/tests/programs/%s", e2e_env("SOURCE_ROOT"), name);
    return p;
}

/* The line of @path holding @marker. */
static int line_of(const char *path, const char *marker)
{
    char *text = e2e_read_file(path);
    const char *m = strstr(text, marker);
    assert_non_null(m);
    int line = 1;
    for (const char *c = text; c < m; c++)
        line += *c == '\n';
    free(text);
    return line;
}

/* Records @python running @script (with @extra options before "--"), checks its output
 * is @want_out and the trace's rules; returns the trace path. */
static char *record(const char *python, const char *script, const char *interval, const char *extra,
                    const char *want_out)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *prog = program(script);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-i",
                    (char *)interval,
                    "-o",
                    trace,
                    (char *)(extra ? extra : "-q"),
                    "--",
                    (char *)python,
                    prog,
                    NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    if (r.status != 0 || strcmp(r.out, want_out) != 0)
        print_message("  %s %s: status %d, out \"%s\", err %s\n", python, script, r.status, r.out,
                      r.err);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, want_out);
    e2e_run_free(&r);
    free(prog);
    assert_int_equal(e2e_check_rules(trace), 0);
    return trace;
}

static struct rp_trace *load(const char *trace)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    return t;
}

/* The index of the first frame of @cs (root first) whose name starts with @prefix, or -1. */
static long frame_index(const struct rp_trace_callsite *cs, const char *prefix)
{
    for (size_t j = 0; j < cs->n_frames; j++)
        if (strncmp(cs->frames[j].function_name, prefix, strlen(prefix)) == 0)
            return (long)j;
    return -1;
}

static void finish(char *trace, struct rp_trace *t)
{
    rp_trace_free(t);
    unlink(trace);
    free(trace);
}

/* The top unreleased site is leaky_append's line, on top of the allocator's native frames,
 * under outer and <module>, in the order they were called. */
static void check_leak(const char *python)
{
    char *trace = record(python, "py_leak.py", "4096", NULL, "kept 200\n");
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_process(t, "py_leak.py");
    assert_non_null(p);
    char *src = program("py_leak.py");
    char want[128];
    snprintf(want, sizeof(want), "leaky_append (py_leak.py:%d)", line_of(src, "# leak site"));
    const struct rp_trace_callsite *top = NULL;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        if (!top || c->self_allocated - c->self_freed > top->self_allocated - top->self_freed)
            top = c;
    }
    assert_non_null(top);
    long leaf = frame_index(top, want), outer = frame_index(top, "outer (py_leak.py:"),
         module = frame_index(top, "<module> (py_leak.py:");
    if (leaf < 0)
        print_message("  %s: no frame %s in the top site\n", python, want);
    assert_true(leaf > 0 && outer == leaf - 1 && module == outer - 1);
    /* Native frames (bytearray's) above it, the interpreter's below. */
    assert_true((size_t)leaf + 1 < top->n_frames);
    assert_true(top->self_allocated - top->self_freed >= 200 * 10000);
    assert_string_equal(top->frames[leaf].mapping_path, src);
    free(src);
    finish(trace, t);
}

/* At interval 1, the count under one Python line is the program's. */
static void check_count(const char *python, const char *script, const char *marker, const char *fn,
                        const char *extra, const char *want_out, const char *process,
                        uint64_t want_count, uint64_t size)
{
    char *trace = record(python, script, "1", extra, want_out);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_process(t, process);
    assert_non_null(p);
    char *src = program(script);
    char want[128];
    snprintf(want, sizeof(want), "%s (%s:%d)", fn, script, line_of(src, marker));
    struct e2e_sums s;
    e2e_sum_function(p, want, &s);
    if (s.alloc_count != want_count)
        print_message("  %s %s: %llu allocations under %s, want %llu\n", python, script,
                      (unsigned long long)s.alloc_count, want, (unsigned long long)want_count);
    assert_int_equal(s.alloc_count, want_count);
    assert_int_equal(s.alloc_bytes, want_count * size);
    free(src);
    finish(trace, t);
}

/* A Python frame called from C (@inner) lies below the native frames of that C code
 * (@native, when given) and above the Python frame that called it (@outer). */
static void check_order(const char *python, const char *script, const char *want_out,
                        const char *inner, const char *native, const char *outer)
{
    char *trace = record(python, script, "1", NULL, want_out);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_process(t, script);
    assert_non_null(p);
    size_t seen = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        long in = frame_index(c, inner), out = frame_index(c, outer);
        if (in < 0)
            continue;
        seen++;
        assert_true(out >= 0 && out < in);
        bool between = native == NULL;
        for (long j = out + 1; j < in && !between; j++)
            between = strstr(c->frames[j].mapping_path, native) != NULL;
        if (!between)
            print_message("  %s %s: no %s frame between %s and %s\n", python, script, native, outer,
                          inner);
        assert_true(between);
    }
    assert_true(seen > 0);
    finish(trace, t);
}

static void test_leak_site(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_leak(pythons[i]);
}

static void test_exact_count(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_count(pythons[i], "py_exact.py", "# exact site", "exact_sites", NULL, "made 300\n",
                    "py_exact.py", 300, 5001);
}

static void test_threads(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_count(pythons[i], "py_threads.py", "# thread site", "thread_work", NULL, "kept 400\n",
                    "py_threads.py", 400, 7001);
}

static void test_fork(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_count(pythons[i], "py_fork.py", "# child site", "child_work", "--follow-fork",
                    "child exit 0\n", "py_fork.py", 50, 9001);
}

/* The key function raises through sorted()'s C frames (the stack of the allocation
 * before the raise has them between the two Python frames). */
static void test_raise(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_order(pythons[i], "py_raise.py", "kept 80\n", "key_alloc (py_raise.py:", NULL,
                    "raise_through (py_raise.py:");
}

/* numpy's native frames between the Python callback and the Python caller. */
static void test_numpy(void **state)
{
    (void)state;
    size_t ran = 0;
    for (size_t i = 0; i < n_pythons; i++) {
        char *argv[] = {pythons[i], "-c", "import numpy", NULL};
        struct e2e_run r;
        assert_int_equal(e2e_run(argv, NULL, &r), 0);
        int st = r.status;
        e2e_run_free(&r);
        if (st != 0)
            continue; /* no numpy for this one */
        check_order(pythons[i], "py_numpy.py", "kept 30\n", "np_callback (py_numpy.py:", "numpy",
                    "np_outer (py_numpy.py:");
        ran++;
    }
    if (ran == 0) {
        print_message("  numpy is not installed: skipped\n");
        skip();
    }
}

int main(void)
{
    find_pythons();
    if (n_pythons == 0) {
        printf("e2e_python: no CPython 3.11: skipped\n");
        return 77;
    }
    for (size_t i = 0; i < n_pythons; i++)
        printf("e2e_python: testing with %s\n", pythons[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leak_site), cmocka_unit_test(test_exact_count),
        cmocka_unit_test(test_threads),   cmocka_unit_test(test_fork),
        cmocka_unit_test(test_raise),     cmocka_unit_test(test_numpy),
    };
    return cmocka_run_group_tests_name("e2e_python", tests, NULL, NULL);
}
