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
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"
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

/* Records @python running @script ("name.py" or "name.py ARG"; with @opts, up to 2, before "--";
 * @env added to the environment), checks its output is @want_out and the trace's rules; returns the
 * trace path. Unless @site, the interpreter starts without its site directories (-s -S; the PYTHON*
 * variables still apply): its start then makes a fraction of the objects, each a sample at interval
 * 1 (some builds load many modules from there). */
static char *record_with(const char *python, bool site, const char *script, const char *interval,
                         const char *const opts[2], char *const env[], const char *want_out)
{
    char *trace = e2e_tmp_path(".pftrace");
    /* "name.py ARG": the program's one argument */
    const char *arg = strchr(script, ' ');
    char name[64];
    snprintf(name, sizeof(name), "%.*s", arg ? (int)(arg - script) : (int)strlen(script), script);
    char *prog = program(name);
    /* Patient (as tests/e2e/test_accuracy.c): the default wait for room in a full ring,
     * 100 ms, runs out on a loaded machine while the service reads a large interpreter's
     * debug info at the start, and the samples of that moment are dropped; the counts
     * here are exact. */
    char *argv[20] = {(char *)e2e_env("HEAPPROF_BIN"),
                      "record",
                      "-i",
                      (char *)interval,
                      "-o",
                      trace,
                      "-q",
                      "--block-timeout-us",
                      "60000000"};
    size_t n = 9;
    for (size_t i = 0; i < 2; i++)
        if (opts[i])
            argv[n++] = (char *)opts[i];
    argv[n++] = "--";
    argv[n++] = (char *)python;
    if (!site) {
        argv[n++] = "-s";
        argv[n++] = "-S";
    }
    argv[n++] = prog;
    if (arg)
        argv[n++] = (char *)arg + 1;
    argv[n] = NULL;
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, env, &r), 0);
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

static char *record(const char *python, const char *script, const char *interval, const char *extra,
                    const char *want_out)
{
    return record_with(python, false, script, interval, (const char *const[2]){extra, NULL}, NULL,
                       want_out);
}

/* Heap @heap of the process running @needle in @t, or NULL. */
static const struct rp_trace_process *find_heap(const struct rp_trace *t, const char *needle,
                                                const char *heap)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (p->cmdline && strstr(p->cmdline, needle) && p->heap_name && !strcmp(p->heap_name, heap))
            return p;
    }
    return NULL;
}

/* As find_heap(), among the processes whose command line holds @needle the one that
 * allocated most under the function @fn (a child of fork shares its parent's command
 * line, and either may come first in the trace). */
static const struct rp_trace_process *find_heap_at(const struct rp_trace *t, const char *needle,
                                                   const char *heap, const char *fn)
{
    const struct rp_trace_process *best = NULL;
    uint64_t most = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->cmdline || !strstr(p->cmdline, needle) || !p->heap_name ||
            strcmp(p->heap_name, heap) != 0)
            continue;
        struct e2e_sums s;
        e2e_sum_function(p, fn, &s);
        if (!best || s.alloc_count > most) {
            best = p;
            most = s.alloc_count;
        }
    }
    return best;
}

/* The heap @heap of process @pid in @t, or NULL. */
static const struct rp_trace_process *heap_of_pid(const struct rp_trace *t, int32_t pid,
                                                  const char *heap)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == pid && t->processes[i].heap_name &&
            !strcmp(t->processes[i].heap_name, heap))
            return &t->processes[i];
    return NULL;
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

/* The top unreleased site of python.objects is leaky_append's line (the bytearrays'
 * buffers, which pymalloc takes from malloc: python.objects' alone), on top of the
 * allocator's native frames, under outer and <module>, in the order they were called. */
static void check_leak(const char *python)
{
    char *trace = record(python, "py_leak.py", "4096", NULL, "kept 200\n");
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = find_heap(t, "py_leak.py", "python.objects");
    assert_non_null(p);
    /* Not counted again on malloc's heap: there, only the list that keeps them grows. */
    const struct rp_trace_process *m = find_heap(t, "py_leak.py", "libc.malloc");
    assert_non_null(m);
    struct e2e_sums ms;
    e2e_sum_function(m, "leaky_append (py_leak.py:", &ms);
    assert_true(ms.alloc_bytes < 100000);
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

/* A bytearray object without its buffer (PyByteArrayObject, from pymalloc). */
#define BYTEARRAY_HEAD 56

/* At interval 1, the count under one Python line, where the program makes @want_count
 * bytearrays whose buffers take @size bytes each, is the program's. With --heaps
 * libc.malloc (@malloc_only) the buffers are malloc's (pymalloc hands them to malloc);
 * with the default heaps they and the bytearrays are python.objects', and malloc's heap
 * has none of them: one heap each. */
static void check_count(const char *python, const char *script, const char *marker, const char *fn,
                        bool malloc_only, const char *extra, const char *want_out,
                        const char *process, uint64_t want_count, uint64_t size)
{
    const char *const opts[2] = {malloc_only ? "--heaps=libc.malloc" : NULL, extra};
    char *trace = record_with(python, false, script, "1", opts, NULL, want_out);
    struct rp_trace *t = load(trace);
    char *src = program(script);
    char want[128];
    snprintf(want, sizeof(want), "%s (%s:%d)", fn, script, line_of(src, marker));
    const struct rp_trace_process *p =
        find_heap_at(t, process, malloc_only ? "libc.malloc" : "python.objects", want);
    assert_non_null(p);
    const struct rp_trace_process *m = heap_of_pid(t, p->pid, "libc.malloc");
    assert_non_null(m);
    struct e2e_sums s, ms;
    e2e_sum_function(p, want, &s);
    e2e_sum_function(m, want, &ms);
    uint64_t n = malloc_only ? want_count : 2 * want_count;
    uint64_t bytes = malloc_only ? want_count * size : want_count * (size + BYTEARRAY_HEAD);
    if (s.alloc_count != n || s.alloc_bytes != bytes)
        print_message("  %s %s: %llu allocations (%llu bytes) under %s, want %llu (%llu)\n", python,
                      script, (unsigned long long)s.alloc_count, (unsigned long long)s.alloc_bytes,
                      want, (unsigned long long)n, (unsigned long long)bytes);
    assert_int_equal(s.alloc_count, n);
    assert_int_equal(s.alloc_bytes, bytes);
    if (!malloc_only)
        assert_int_equal(ms.alloc_count, 0);
    assert_int_equal(find_heap(t, process, "python.objects") != NULL, !malloc_only);
    free(src);
    finish(trace, t);
}

/* py_objects.py's Points: 500 objects of 64 bytes each (a 48-byte basic size for four
 * slots and the GC header's 16), which pymalloc serves; nothing else is allocated at
 * that line (the list they go into was made before). */
#define OBJ_COUNT 500
#define OBJ_SIZE 64

/* What @heap of py_objects.py's processes (a child of fork too) holds at the object site
 * in @t (zeros when the heap is not in the trace); @ret_found says whether it is. */
static void object_sums(const struct rp_trace *t, const char *heap, struct e2e_sums *ret,
                        bool *ret_found)
{
    char *src = program("py_objects.py");
    char want[128];
    snprintf(want, sizeof(want), "make_points (py_objects.py:%d)", line_of(src, "# object site"));
    free(src);
    memset(ret, 0, sizeof(*ret));
    *ret_found = false;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->cmdline || !strstr(p->cmdline, "py_objects.py") || !p->heap_name ||
            strcmp(p->heap_name, heap) != 0)
            continue;
        struct e2e_sums one;
        e2e_sum_function(p, want, &one);
        ret->alloc_count += one.alloc_count;
        ret->alloc_bytes += one.alloc_bytes;
        *ret_found = true;
    }
}

/* Records py_objects.py at interval 1 with @opts and @env; checks the object site holds
 * @want_objects on python.objects and @want_malloc on libc.malloc, each OBJ_SIZE bytes,
 * and whether python.objects is in the trace at all (@want_heap). */
static void check_objects(const char *python, const char *script, const char *const opts[2],
                          char *const env[], const char *want_out, bool want_heap,
                          uint64_t want_objects, uint64_t want_malloc)
{
    char *trace = record_with(python, false, script, "1", opts, env, want_out);
    struct rp_trace *t = load(trace);
    struct e2e_sums objs, mall;
    bool has_objs, has_malloc;
    object_sums(t, "python.objects", &objs, &has_objs);
    object_sums(t, "libc.malloc", &mall, &has_malloc);
    if (has_objs != want_heap || objs.alloc_count != want_objects ||
        mall.alloc_count != want_malloc) {
        print_message("  %s %s %s: python.objects %s, %llu objects; malloc %llu\n", python,
                      opts[0] ? opts[0] : "", opts[1] ? opts[1] : "", has_objs ? "in" : "absent",
                      (unsigned long long)objs.alloc_count, (unsigned long long)mall.alloc_count);
        /* What the trace says it lost, to tell a loss from a sample put elsewhere. */
        for (size_t i = 0; i < t->n_processes; i++) {
            const struct rp_trace_process *p = &t->processes[i];
            print_message("    %s: %llu samples, %llu dropped, %llu unread, %llu unwinding "
                          "errors, %llu stacks truncated\n",
                          p->heap_name ? p->heap_name : "?", (unsigned long long)p->heap_samples,
                          (unsigned long long)p->losses.records_dropped,
                          (unsigned long long)p->losses.records_unread,
                          (unsigned long long)p->unwinding_errors,
                          (unsigned long long)p->losses.stacks_truncated);
        }
    }
    assert_true(has_malloc);
    assert_int_equal(has_objs, want_heap);
    assert_int_equal(objs.alloc_count, want_objects);
    assert_int_equal(objs.alloc_bytes, want_objects * OBJ_SIZE);
    assert_int_equal(mall.alloc_count, want_malloc);
    assert_int_equal(mall.alloc_bytes, want_malloc * OBJ_SIZE);
    finish(trace, t);
}

/* Every heap: the objects on python.objects under their Python frame, none on malloc
 * (pymalloc never asked it). */
static void test_objects_all_heaps(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_objects(pythons[i], "py_objects.py", (const char *const[2]){"--all-heaps", NULL},
                      NULL, "made 500\n", true, OBJ_COUNT, 0);
}

/* The child of fork (os.fork, as multiprocessing's fork context) makes them, with the
 * default heaps and --follow-fork: its session puts the wrapper it inherited to use. */
static void test_objects_fork(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_objects(pythons[i], "py_objects.py fork",
                      (const char *const[2]){"--follow-fork", NULL}, NULL, "child exit 0\n", true,
                      OBJ_COUNT, 0);
}

/* PYTHONMALLOC=malloc: malloc's hooks see the objects; python.objects does not count
 * them again (the wrapper is not installed, or the interpreter's start replaced it). */
static void test_objects_pythonmalloc(void **state)
{
    (void)state;
    char *env[] = {"PYTHONMALLOC=malloc", NULL};
    for (size_t i = 0; i < n_pythons; i++) {
        char *trace = record_with(pythons[i], false, "py_objects.py", "1",
                                  (const char *const[2]){"--all-heaps", NULL}, env, "made 500\n");
        struct rp_trace *t = load(trace);
        struct e2e_sums objs, mall;
        bool has_objs, has_malloc;
        object_sums(t, "python.objects", &objs, &has_objs);
        object_sums(t, "libc.malloc", &mall, &has_malloc);
        if (objs.alloc_count != 0 || mall.alloc_count != OBJ_COUNT)
            print_message("  %s PYTHONMALLOC=malloc: %llu objects, malloc %llu\n", pythons[i],
                          (unsigned long long)objs.alloc_count,
                          (unsigned long long)mall.alloc_count);
        assert_int_equal(objs.alloc_count, 0);
        assert_int_equal(mall.alloc_count, OBJ_COUNT);
        assert_int_equal(mall.alloc_bytes, OBJ_COUNT * OBJ_SIZE);
        finish(trace, t);
    }
}

/* heapprof attach on a running program, without the library (loaded then) and with it
 * preloaded, dormant: the wrapper goes in from a sampled allocation under the GIL, the
 * objects made meanwhile are on python.objects under their Python frame, and the
 * program's allocator is CPython's own again after the session. */
static void check_attach(const char *python, const char *dir, const char *preload)
{
    char *prog = program("py_attach.py");
    char *argv[] = {(char *)python, "-s", "-S", prog, NULL};
    struct e2e_target target;
    assert_int_equal(e2e_target_start(&target, dir, argv, preload, "ready\n"), 0);
    char *trace = e2e_tmp_path(".pftrace");
    char pid[16];
    snprintf(pid, sizeof(pid), "%d", (int)target.pid);
    char *att[] = {(char *)e2e_env("HEAPPROF_BIN"),
                   "attach",
                   "-p",
                   pid,
                   "-d",
                   "0.4",
                   "-q",
                   "--no-status",
                   "-o",
                   trace,
                   NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(att, NULL, &r), 0);
    if (r.status != 0)
        print_message("  %s attach: status %d, err %s\n", python, r.status, r.err);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    e2e_sleep_ms(200); /* the program allocates meanwhile: the wrapper leaves */
    assert_int_equal(e2e_target_finish(&target, 0), 0);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *m = find_heap(t, "py_attach.py", "libc.malloc");
    struct e2e_sums all;
    assert_non_null(m);
    e2e_sum_function(m, "", &all);
    if (!preload && all.alloc_count == 0) {
        /* The wrapper goes in at a malloc sample: none when the loaded library could not
         * take the interpreter's calls of malloc (a shared libpython's, counted as
         * unseen_call_slots). */
        print_message("  %s attach: no malloc sample, python.objects not tried\n", python);
        unlink(target.out);
        free(prog);
        finish(trace, t);
        return;
    }
    char *out = e2e_read_file(target.out);
    if (strcmp(out, "ready\nstates pymalloc wrapped pymalloc\n") != 0)
        print_message("  %s attach%s: out \"%s\"\n", python, preload ? " (preloaded)" : "", out);
    assert_string_equal(out, "ready\nstates pymalloc wrapped pymalloc\n");
    free(out);
    unlink(target.out);

    const struct rp_trace_process *p = find_heap(t, "py_attach.py", "python.objects");
    assert_non_null(p);
    char want[128];
    snprintf(want, sizeof(want), "attach_work (py_attach.py:%d)", line_of(prog, "# attach site"));
    struct e2e_sums s;
    e2e_sum_function(p, want, &s);
    assert_true(s.alloc_count > 0);
    free(prog);
    finish(trace, t);
}

static void test_objects_attach(void **state)
{
    (void)state;
    char dir[128];
    assert_int_equal(e2e_runtime_dir_make(dir, sizeof(dir), "py-attach"), 0);
    for (size_t i = 0; i < n_pythons; i++) {
        check_attach(pythons[i], dir, NULL);
        check_attach(pythons[i], dir, e2e_env("HEAPPROF_LIB"));
    }
    assert_int_equal(e2e_runtime_dir_remove(dir), 0);
}

/* A Python frame called from C (@inner) lies below the native frames of that C code
 * (@native, when given) and above the Python frame that called it (@outer). */
static void check_order(const char *python, bool site, const char *script, const char *want_out,
                        const char *inner, const char *native, const char *outer)
{
    /* Malloc's heap only: the objects' would be many more samples. */
    const char *const opts[2] = {"--heaps=libc.malloc", NULL};
    char *trace = record_with(python, site, script, "1", opts, NULL, want_out);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = find_heap(t, script, "libc.malloc");
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
        check_count(pythons[i], "py_exact.py", "# exact site", "exact_sites", true, NULL,
                    "made 300\n", "py_exact.py", 300, 5001);
}

static void test_threads(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_count(pythons[i], "py_threads.py", "# thread site", "thread_work", false, NULL,
                    "kept 400\n", "py_threads.py", 400, 7001);
}

static void test_fork(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_count(pythons[i], "py_fork.py", "# child site", "child_work", true, "--follow-fork",
                    "child exit 0\n", "py_fork.py", 50, 9001);
}

/* The key function raises through sorted()'s C frames (the stack of the allocation
 * before the raise has them between the two Python frames). */
static void test_raise(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_order(pythons[i], false, "py_raise.py", "kept 80\n", "key_alloc (py_raise.py:", NULL,
                    "raise_through (py_raise.py:");
}

/* py_codes.py's functions, each freed before the next is made, whose code objects
 * take each other's blocks: the client keeps the code objects it checked until the
 * object allocator frees them (preload/pycodes.h), so no function is credited with the
 * objects of the one at its address before (which the service would name from the check
 * the client sent). A frame whose code object was freed before the service read it goes
 * unnamed (a busy machine): each function has at most its own objects, and some have
 * them all. */
#define CODES_ROUNDS 16
#define CODES_N 20

static void check_codes(const char *python)
{
    char *trace = record(python, "py_codes.py", "1", NULL, "made 320\n");
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = find_heap(t, "py_codes.py", "python.objects");
    assert_non_null(p);
    size_t whole = 0;
    for (int k = 0; k < CODES_ROUNDS; k++) {
        char want[64];
        snprintf(want, sizeof(want), "gen_%d (py_codes_gen.py:%d)", k, k + 3);
        struct e2e_sums s;
        e2e_sum_function(p, want, &s);
        if (s.alloc_count > CODES_N)
            print_message("  %s: %llu objects under %s, want at most %d\n", python,
                          (unsigned long long)s.alloc_count, want, CODES_N);
        assert_true(s.alloc_count <= CODES_N);
        whole += s.alloc_count == CODES_N;
    }
    if (whole == 0)
        print_message("  %s: no function with all its objects\n", python);
    assert_true(whole > 0);
    finish(trace, t);
}

static void test_code_reuse(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_pythons; i++)
        check_codes(pythons[i]);
}

/* py_freed.py under heapprofd stopped (SIGSTOP) from before its function is compiled
 * until after the process exited: every record is read once the function's code object
 * was freed and the process gone, so its frames are named only from what the client sent
 * with the samples (WIRE_PY_CODE). The bytearrays are counted exactly under
 * "make_freed (py_freed_gen.py:5)": @n_per each (the object and its buffer on
 * python.objects, or the buffer alone on libc.malloc with @heaps). */
#define FREED_N 50

static void check_freed(const char *python, const char *heaps, const char *heap, uint64_t n_per)
{
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "pyfreed");
    const char *args[] = {
        "--all", "--no-running",           "-i",  "1", "--no-block-client", "--shmem-size",
        "64m",   heaps ? "--heaps" : NULL, heaps, NULL};
    e2e_daemon_launch(&d, args);
    char ready[300], go[300], out[300];
    snprintf(ready, sizeof(ready), "%s/ready", d.dir);
    snprintf(go, sizeof(go), "%s/go", d.dir);
    snprintf(out, sizeof(out), "%s/out.txt", d.dir);
    char *prog = program("py_freed.py");
    char *argv[] = {(char *)python, "-s", "-S", prog, ready, go, NULL};
    pid_t c = e2e_spawn_client(&d, argv, out);
    for (int i = 0; i < 3000 && access(ready, F_OK) != 0; i++)
        e2e_sleep_ms(10);
    assert_int_equal(access(ready, F_OK), 0);
    /* The handshake was made before the script ran. A moment for the service to read
     * the interpreter's start (else the ring may fill while it is stopped; how much it
     * read does not matter): stopped now, it reads the rest only after the process is
     * gone. */
    e2e_sleep_ms(300);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    int st = e2e_wait_status(c);
    assert_int_equal(kill(d.pid, SIGCONT), 0);
    assert_int_equal(st, 0);
    char *o = e2e_read_file(out);
    assert_string_equal(o, "made 50\n");
    free(o);
    e2e_daemon_wait_ended(&d, &c, 1, 60000);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    assert_int_equal(e2e_check_rules(d.trace), 0);
    struct rp_trace *t = load(d.trace);
    const struct rp_trace_process *p = find_heap(t, "py_freed.py", heap);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "make_freed (py_freed_gen.py:5)", &s);
    if (s.alloc_count != FREED_N * n_per)
        print_message("  %s %s: %llu allocations under make_freed, want %llu\n", python, heap,
                      (unsigned long long)s.alloc_count, (unsigned long long)(FREED_N * n_per));
    assert_int_equal(s.alloc_count, FREED_N * n_per);
    rp_trace_free(t);
    free(prog);
    e2e_daemon_remove_files(&d);
}

static void test_freed_code(void **state)
{
    (void)state;
    /* Without python.objects (no wrapper: the table only keeps the sent marks) with one
     * CPython: once is enough. */
    for (size_t i = 0; i < n_pythons; i++)
        check_freed(pythons[i], NULL, "python.objects", 2);
    check_freed(pythons[0], "libc.malloc", "libc.malloc", 1);
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
        check_order(pythons[i], true, "py_numpy.py", "kept 30\n",
                    "np_callback (py_numpy.py:", "numpy", "np_outer (py_numpy.py:");
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
    // clang-format off
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leak_site),
        cmocka_unit_test(test_exact_count),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_raise),
        cmocka_unit_test(test_numpy),
        cmocka_unit_test(test_code_reuse),
        cmocka_unit_test(test_freed_code),
        cmocka_unit_test(test_objects_all_heaps),
        cmocka_unit_test(test_objects_fork),
        cmocka_unit_test(test_objects_pythonmalloc),
        cmocka_unit_test(test_objects_attach),
    };
    // clang-format on
    return cmocka_run_group_tests_name("e2e_python", tests, NULL, NULL);
}
