/* tests/e2e/test_inject.c: heapprof attach on programs started without libheapprof.so
 * (issue 25): the first attach loads the library (service/inject.c), every later one
 * wakes it; the programs keep their behaviour and their blocks.
 *
 *   - tests/programs/inject_threads (4 threads, each in a site of its own, filling and
 *     checking every block): INJECT_CYCLES attach/detach cycles, each with samples from
 *     every thread's site; the same program linked with jemalloc, tcmalloc or
 *     mimalloc (each when installed);
 *   - exact counts at interval 1 for allocations made after the attach;
 *   - real programs: python3, sqlite3, a C++ STL program: attached while running, same
 *     output as unprofiled;
 *   - (the EINTR-fatal event loop, tail -f and the other programs an attach used to
 *     harm are attached this way by tests/e2e/test_attach_matrix.c, "injected" column);
 *   - refusals, each with rc 1, its reason, and the process unharmed and without the
 *     library: static, stopped, traced, seccomp (a filter, one that kills, a thread in
 *     strict mode), a vfork child; and a process in another mount namespace, where the
 *     library's path names another file, attached with the library in a memfd;
 *   - a process that cannot read the library: heapprof attach says so (rc 1), and a
 *     library it can read loads afterwards;
 *   - each detach gives the program's GOT slot of malloc back to libc (slotwatch, also
 *     full RELRO).
 * Every trace also goes through the rule checker and Perfetto's trace processor
 * (e2e_check_rules). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"
#include "tests/e2e/e2e_util.h"

#define INJECT_CYCLES 50
#define REAL_CYCLES 5

static char runtime_dir[256];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "inject");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* `heapprof attach -p PID --duration DUR -i INTERVAL --no-source-lines -q -o TRACE`: its
 * status, its stderr in @err (malloc'd, may be NULL), the trace loaded in @ret (NULL
 * unless status 0). */
static int attach(pid_t pid, const char *dur, const char *interval, struct rp_trace **ret,
                  char **err)
{
    char pids[16], trace[300];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    snprintf(trace, sizeof(trace), "%s/inject.pftrace", runtime_dir);
    unlink(trace);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pids,
                    "--duration",
                    (char *)dur,
                    "-i",
                    (char *)interval,
                    "--no-source-lines",
                    "--no-status",
                    "-q",
                    "-o",
                    trace,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    *ret = NULL;
    if (run.status == 0) {
        assert_int_equal(e2e_check_rules(trace), 0);
        assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, ret), 0);
    }
    int status = run.status;
    if (err)
        *err = run.err, run.err = NULL;
    e2e_run_free(&run);
    return status;
}

static const struct rp_trace_process *proc_of(const struct rp_trace *t, pid_t pid)
{
    for (size_t i = 0; t && i < t->n_processes; i++)
        if (t->processes[i].pid == pid)
            return &t->processes[i];
    return NULL;
}

/* Waits up to 5 s for @text in @t's output. */
static bool wait_for(const struct e2e_target *t, const char *text)
{
    for (int i = 0; i < 500; i++) {
        char *o = e2e_read_file(t->out);
        bool found = strstr(o, text) != NULL;
        free(o);
        if (found)
            return true;
        e2e_sleep_ms(10);
    }
    return false;
}

/* True while @pid runs (not yet a zombie; the child is not reaped, so that its exit
 * status is still there for e2e_target_finish()). */
static bool running(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    char *st = e2e_read_file(path);
    const char *p = strrchr(st, ')');
    bool r = p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
    free(st);
    return r;
}

static void start(struct e2e_target *t, char *const argv[], const char *ready)
{
    assert_int_equal(e2e_target_start(t, runtime_dir, argv, NULL, ready), 0);
}

/* How many copies of libheapprof.so's code @pid has mapped. */
static int library_copies(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *maps = e2e_read_file(path);
    int n = 0;
    for (char *l = strtok(maps, "\n"); l; l = strtok(NULL, "\n"))
        n += strstr(l, "libheapprof.so") && strstr(l, " r-xp ");
    free(maps);
    return n;
}

/* The site of @p's four threads that has no sample (NULL when each has one). */
static const char *site_missing(const struct rp_trace_process *p)
{
    static char site[16];
    for (int k = 0; k < 4; k++) {
        snprintf(site, sizeof(site), "site_t%d", k);
        struct e2e_sums s;
        e2e_sum_function(p, site, &s);
        if (s.alloc_count == 0)
            return site;
    }
    return NULL;
}

/* @cycles attaches of inject_threads build @prog_env, each sampling all four sites. A
 * session of 0.1 s in which a thread had no CPU (a busy machine) is tried once more for
 * a second: the attach must work, not the scheduler. */
static void threads_cycles(const char *prog_env, int cycles)
{
    char *argv[] = {(char *)e2e_env(prog_env), NULL};
    struct e2e_target t;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    start(&t, argv, "ready");
    for (int i = 0; i < cycles; i++) {
        const char *duration = "0.1", *missing = NULL;
        for (int attempt = 0; attempt < 2; attempt++, duration = "1") {
            struct rp_trace *tr;
            char *err = NULL;
            int st = attach(t.pid, duration, "4096", &tr, &err);
            if (st != 0)
                print_message("  cycle %d: status %d: %s\n", i, st, err);
            assert_int_equal(st, 0);
            const struct rp_trace_process *p = proc_of(tr, t.pid);
            assert_non_null(p);
            assert_false(p->from_startup);
            missing = site_missing(p);
            if (missing)
                print_message("  cycle %d: no sample of %s in %s s\n", i, missing, duration);
            rp_trace_free(tr);
            free(err);
            assert_true(e2e_alive(t.pid));
            /* One copy of the library, loaded by the first attach only. */
            assert_int_equal(library_copies(t.pid), 1);
            if (!missing)
                break;
        }
        assert_null(missing);
    }
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("  %d cycles in %.1f s\n", cycles,
                  (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
}

static void test_inject_cycles_four_threads(void **state)
{
    (void)state;
    threads_cycles("INJECT_THREADS", INJECT_CYCLES);
}

/* The program linked with another allocator (its variant's variable unset when the
 * allocator is not installed). */
static void other_allocator_cycles(const char *var, const char *package)
{
    if (!getenv(var)) {
        print_message("  %s is not installed: skipped\n", package);
        skip();
    }
    threads_cycles(var, REAL_CYCLES * 2);
}

static void test_inject_cycles_jemalloc(void **state)
{
    (void)state;
    other_allocator_cycles("INJECT_THREADS_JEMALLOC", "libjemalloc2");
}

static void test_inject_cycles_tcmalloc(void **state)
{
    (void)state;
    other_allocator_cycles("INJECT_THREADS_TCMALLOC", "libtcmalloc-minimal4");
}

static void test_inject_cycles_mimalloc(void **state)
{
    (void)state;
    other_allocator_cycles("INJECT_THREADS_MIMALLOC", "libmimalloc2.0");
}

/* `heapprof attach -p PID --duration 2 -i INTERVAL -o TRACE` started in the background
 * (its stderr to /dev/null); returns its pid. */
static pid_t attach_in_background(pid_t pid, const char *interval, const char *trace)
{
    char pids[16];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    /* The program waits for ring space rather than drop a record (exact counts), however
     * slow the service (under TSan, 731 of 1000 came through with the default wait). */
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pids,
                    "--duration",
                    "2",
                    "--block-client",
                    "--block-timeout-us",
                    "10000000",
                    "-i",
                    (char *)interval,
                    "--no-source-lines",
                    "--no-status",
                    "-q",
                    "-o",
                    (char *)trace,
                    NULL};
    pid_t a = fork();
    assert_true(a >= 0);
    if (a == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return a;
}

/* Interval 1 after an attach: the BURST allocations of exact_site(), made once the
 * session is on, are counted exactly. */
static void test_inject_exact_after_attach(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("INJECT_THREADS"), NULL};
    struct e2e_target t;
    start(&t, argv, "ready");
    char trace[300];
    snprintf(trace, sizeof(trace), "%s/exact.pftrace", runtime_dir);
    pid_t a = attach_in_background(t.pid, "1", trace);
    assert_true(wait_for(&t, "attached"));
    /* The ring is mapped before the session's thread has put the hooks into the slots
     * (it opens /proc/self/mem for that first): give it that moment. */
    e2e_sleep_ms(500);
    assert_int_equal(write(t.in, "burst\n", 6), 6);
    assert_true(wait_for(&t, "burst done"));
    assert_int_equal(e2e_wait_status(a), 0);
    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *tr = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &tr), 0);
    const struct rp_trace_process *p = proc_of(tr, t.pid);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "exact_site", &s);
    print_message("  exact_site: %llu allocations, %llu bytes, %llu frees\n",
                  (unsigned long long)s.alloc_count, (unsigned long long)s.alloc_bytes,
                  (unsigned long long)s.free_count);
    assert_int_equal(s.alloc_count, 1000);
    assert_int_equal(s.alloc_bytes, 48000);
    assert_int_equal(s.free_count, 1000);
    rp_trace_free(tr);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
}

/* The end of a plugin test: @runs "run" commands to inject_threads @t, 150 ms apart,
 * while the session @a writes @trace; then the trace must have samples of the plugin's
 * function, and the program detach and end cleanly. */
static void plugin_runs_sampled(struct e2e_target *t, pid_t a, const char *trace, int runs)
{
    for (int i = 0; i < runs; i++) {
        e2e_sleep_ms(150);
        assert_int_equal(write(t->in, "run\n", 4), 4);
    }
    assert_int_equal(e2e_wait_status(a), 0);
    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *tr = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &tr), 0);
    const struct rp_trace_process *p = proc_of(tr, t->pid);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "harm_plugin_alloc", &s);
    print_message("  harm_plugin_alloc: %llu samples\n", (unsigned long long)s.alloc_count);
    assert_true(s.alloc_count > 0);
    rp_trace_free(tr);
    assert_true(wait_for(t, "detached"));
    assert_int_equal(e2e_target_finish(t, 0), 0);
    char *o = e2e_read_file(t->out);
    assert_null(strstr(o, "FATAL"));
    free(o);
}

/* A plugin dlopened during a session (after the library was loaded): its calls reach the
 * hooks too (the GOT patcher finds it at the next sample), and its slot is given back at
 * the detach like the others. */
static void test_inject_plugin_loaded_during_session(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("INJECT_THREADS"), NULL};
    struct e2e_target t;
    start(&t, argv, "ready");
    char trace[300];
    snprintf(trace, sizeof(trace), "%s/plugin.pftrace", runtime_dir);
    pid_t a = attach_in_background(t.pid, "4096", trace);
    assert_true(wait_for(&t, "attached"));
    char cmd[600];
    int n = snprintf(cmd, sizeof(cmd), "load %s\n", e2e_env("HARM_PLUGIN"));
    assert_int_equal(write(t.in, cmd, (size_t)n), n);
    assert_true(wait_for(&t, "loaded "));
    /* Twice more: the first samples of the plugin's code patch its slots. */
    plugin_runs_sampled(&t, a, trace, 2);
}

/* @argv run unprofiled, then again attached REAL_CYCLES times while it runs: the same
 * output and status, samples of @fn in most sessions. */
static void real_program(char *const argv[], const char *fn)
{
    struct e2e_run plain;
    assert_int_equal(e2e_run(argv, NULL, &plain), 0);
    assert_int_equal(plain.status, 0);

    struct e2e_target t;
    start(&t, argv, NULL);
    e2e_sleep_ms(300);
    int cycles = 0, sampled = 0;
    for (; cycles < REAL_CYCLES && running(t.pid); cycles++) {
        struct rp_trace *tr;
        char *err = NULL;
        int st = attach(t.pid, "0.2", "4096", &tr, &err);
        if (!running(t.pid)) {
            /* It ended meanwhile: the session may hold only its exit (a stdio buffer). */
            rp_trace_free(tr);
            free(err);
            break;
        }
        if (st != 0)
            print_message("  %s: cycle %d: status %d: %s\n", argv[0], cycles, st, err);
        assert_int_equal(st, 0);
        const struct rp_trace_process *p = proc_of(tr, t.pid);
        assert_non_null(p);
        struct e2e_sums s;
        e2e_sum_function(p, fn, &s);
        if (p->heap_samples == 0 || s.alloc_count == 0)
            print_message("  %s: cycle %d: %llu samples, %llu of them in %s\n", argv[0], cycles,
                          (unsigned long long)p->heap_samples, (unsigned long long)s.alloc_count,
                          fn);
        /* A 0.2 s window can fall in a phase without allocations (the C++ program's
         * sorts): most sessions, not each, must see the function. */
        sampled += p->heap_samples > 0 && s.alloc_count > 0;
        rp_trace_free(tr);
        free(err);
    }
    print_message("  %s: attached %d times while it ran, %d with samples of %s\n", argv[0], cycles,
                  sampled, fn);
    assert_true(cycles >= 2);
    assert_true(sampled >= 2 && sampled * 2 >= cycles);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_string_equal(o, plain.out);
    free(o);
    e2e_run_free(&plain);
}

/* A plugin the loader has listed but not yet bound when the session first looks at it
 * (a dlopen in progress): its malloc slot holds its link-time value, then malloc. The
 * patcher looks again and hooks it (the old one gave up on it for good: 0 samples in
 * every run). */
static void test_inject_plugin_bound_after_first_look(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("INJECT_THREADS"), NULL};
    struct e2e_target t;
    start(&t, argv, "ready");
    char cmd[600];
    int n = snprintf(cmd, sizeof(cmd), "load_unbound %s\n", e2e_env("HARM_PLUGIN"));
    assert_int_equal(write(t.in, cmd, (size_t)n), n);
    assert_true(wait_for(&t, "unbound"));
    char trace[300];
    snprintf(trace, sizeof(trace), "%s/unbound.pftrace", runtime_dir);
    pid_t a = attach_in_background(t.pid, "4096", trace);
    assert_true(wait_for(&t, "attached"));
    e2e_sleep_ms(150); /* the threads' samples look at the unbound plugin */
    assert_int_equal(write(t.in, "bind\n", 5), 5);
    assert_true(wait_for(&t, "bound"));
    plugin_runs_sampled(&t, a, trace, 3);
}

static void test_inject_python(void **state)
{
    (void)state;
    char *argv[] = {"/usr/bin/python3", "-c",
                    "import time\n"
                    "t = time.time(); d = {}; i = 0\n"
                    "while time.time() - t < 3:\n"
                    "    d[i % 3000] = bytearray(2000 + i % 900); i += 1\n"
                    "print(len(d))\n",
                    NULL};
    real_program(argv, "PyByteArray");
}

static void test_inject_sqlite3(void **state)
{
    (void)state;
    if (access("/usr/bin/sqlite3", X_OK) != 0) {
        print_message("  sqlite3 is not installed: skipped\n");
        skip();
    }
    char *argv[] = {"/usr/bin/sqlite3", ":memory:",
                    "create table t(a, b);"
                    "with recursive c(x) as (select 1 union all select x + 1 from c "
                    "where x < 1500000) insert into t select x, randomblob(40) from c;"
                    "create index i on t(b); select count(*) from t;",
                    NULL};
    real_program(argv, "sqlite3");
}

static void test_inject_cxx(void **state)
{
    (void)state;
    /* 240 rounds: 3.2 s here, like the other programs' 3 s (60 rounds, 0.8 s, ended
     * after one attach in a CI run). */
    char *argv[] = {(char *)e2e_env("STL_CHURN"), "240", NULL};
    real_program(argv, "operator new");
}

/* True when libheapprof.so is mapped in @pid. */
static bool has_library(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *maps = e2e_read_file(path);
    bool r = strstr(maps, "libheapprof") != NULL;
    free(maps);
    return r;
}

/* Attaching @pid fails with rc 1 and @why in the message, and the library was not loaded. */
static void refused(pid_t pid, const char *why)
{
    struct rp_trace *tr;
    char *err = NULL;
    int st = attach(pid, "0.2", "4096", &tr, &err);
    print_message("  pid %d: status %d: %s", (int)pid, st, err);
    assert_int_equal(st, 1);
    /* The reason, not the process's title ("pid N (wake_refused seccomp kill) ..."). */
    char tag[32];
    snprintf(tag, sizeof(tag), "pid %d (", (int)pid);
    char *title = strstr(err, tag), *end = title ? strstr(title, ") ") : NULL;
    if (end)
        memmove(title, end + 1, strlen(end + 1) + 1);
    assert_non_null(strstr(err, why));
    free(err);
    assert_false(has_library(pid));
}

static void test_inject_refusals(void **state)
{
    (void)state;
    struct e2e_target t;
    /* Static. */
    char *st_argv[] = {(char *)e2e_env("STATIC_PROG"), "wait", NULL};
    start(&t, st_argv, "static");
    refused(t.pid, "statically linked");
    assert_int_equal(e2e_target_finish(&t, 0), 0);

    /* Stopped: refused, and still stopped afterwards (a SIGCONT lets it end). */
    char *th_argv[] = {(char *)e2e_env("INJECT_THREADS"), NULL};
    start(&t, th_argv, "ready");
    kill(t.pid, SIGSTOP);
    e2e_sleep_ms(100);
    refused(t.pid, "is stopped");
    char path[64], *status;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)t.pid);
    status = e2e_read_file(path);
    assert_non_null(strstr(status, "State:\tT"));
    free(status);
    kill(t.pid, SIGCONT);
    assert_int_equal(e2e_target_finish(&t, 0), 0);

    /* Traced (by tests/programs/wake_refused's tracer mode). */
    char *tr_argv[] = {(char *)e2e_env("WAKE_REFUSED"), "tracer", (char *)e2e_env("INJECT_THREADS"),
                       NULL};
    start(&t, tr_argv, "ready");
    char *o = e2e_read_file(t.out);
    const char *c = strstr(o, "child ");
    assert_non_null(c);
    pid_t child = (pid_t)atoi(c + 6);
    free(o);
    refused(child, "traced");
    assert_int_equal(e2e_target_finish(&t, 0), 0);

    /* A seccomp filter. */
    char *sc_argv[] = {(char *)e2e_env("WAKE_REFUSED"), "seccomp", "errno", NULL};
    start(&t, sc_argv, "ready");
    refused(t.pid, "seccomp");
    assert_int_equal(e2e_target_finish(&t, 0), 0);

    /* A vfork child: refused, and it still ends as it would (its parent then too). */
    char *vf_argv[] = {(char *)e2e_env("INJECT_THREADS"), "vfork", NULL};
    start(&t, vf_argv, "child ");
    o = e2e_read_file(t.out);
    c = strstr(o, "child ");
    assert_non_null(c);
    child = (pid_t)atoi(c + 6);
    free(o);
    refused(child, "vfork child");
    kill(child, SIGKILL);
    assert_int_equal(e2e_target_finish(&t, 0), 0);

    /* Another mount namespace where the library's path names another file (a container
     * with its own /usr): that file is never loaded; the library is handed over in a
     * memfd instead (tests/e2e/test_inject_container.c attaches a whole container). Root
     * only (unshare -m). */
    if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
        print_message("  mount namespace case: not root or no unshare: skipped\n");
        return;
    }
    char other[300], script[1200];
    snprintf(other, sizeof(other), "%s/other.so", runtime_dir);
    snprintf(script, sizeof(script), "cp /bin/true '%s' && mount --bind '%s' '%s' && exec '%s'",
             other, other, e2e_env("HEAPPROF_LIB"), e2e_env("INJECT_THREADS"));
    char *ns_argv[] = {"/usr/bin/unshare", "-m", "/bin/sh", "-c", script, NULL};
    start(&t, ns_argv, "ready");
    struct rp_trace *ns_tr;
    char *ns_err = NULL;
    int ns_st = attach(t.pid, "0.5", "4096", &ns_tr, &ns_err);
    if (ns_st != 0)
        print_message("  mount namespace: status %d: %s\n", ns_st, ns_err);
    assert_int_equal(ns_st, 0);
    const struct rp_trace_process *ns_p = proc_of(ns_tr, t.pid);
    assert_non_null(ns_p);
    struct e2e_sums ns_sums;
    e2e_sum_function(ns_p, "site_t0", &ns_sums);
    assert_true(ns_sums.alloc_count > 0);
    rp_trace_free(ns_tr);
    free(ns_err);
    char ns_maps_path[64];
    snprintf(ns_maps_path, sizeof(ns_maps_path), "/proc/%d/maps", (int)t.pid);
    char *ns_maps = e2e_read_file(ns_maps_path);
    assert_non_null(strstr(ns_maps, "/memfd:heapprof/libheapprof.so"));
    assert_null(strstr(ns_maps, "other.so"));
    free(ns_maps);
    assert_int_equal(library_copies(t.pid), 1);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
}

/* A process that cannot read the library (another user's, attached by a root heapprofd
 * with --allow-other-users; the library in a directory only root may enter): the dlopen
 * fails inside the process, which is left running without it, and the daemon says why
 * (the loader's message and what the process needs). Root only. */
static void test_inject_unreadable_library(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("  not root: skipped\n");
        skip();
    }
    char dir[300], lib[340], cmd[2048];
    snprintf(dir, sizeof(dir), "%s/priv", runtime_dir);
    snprintf(lib, sizeof(lib), "%s/libheapprof.so", dir);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp '%s' '%s' && chmod 700 '%s'", dir,
             e2e_env("HEAPPROF_LIB"), lib, dir);
    assert_int_equal(system(cmd), 0);
    /* Others may enter the runtime directory (the target's output file is there). */
    assert_int_equal(chmod(runtime_dir, 0755), 0);

    int in[2]; /* close-on-exec: the daemon must not keep the target's stdin open */
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    char out[320];
    snprintf(out, sizeof(out), "%s/nobody.out", runtime_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        dup2(fd, 1);
        dup2(in[0], 0);
        close(in[1]);
        if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
            _exit(126);
        execl(e2e_env("INJECT_THREADS"), "inject_threads", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    e2e_sleep_ms(200);

    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "inject-unreadable");
    char pids[16];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    const char *args[] = {"--allow-other-users", "-p", pids, "--no-status", NULL};
    char *old = getenv("HEAPPROF_LIB") ? strdup(getenv("HEAPPROF_LIB")) : NULL;
    setenv("HEAPPROF_LIB", lib, 1);
    e2e_daemon_launch(&d, args);
    if (old)
        setenv("HEAPPROF_LIB", old, 1);
    free(old);
    char *log = NULL;
    for (int i = 0; i < 500; i++) {
        free(log);
        log = e2e_read_file(d.log);
        if (strstr(log, "could not load"))
            break;
        e2e_sleep_ms(10);
    }
    print_message("  heapprofd: %s", log);
    /* Stopped before any check: a failed check must not leave it running. */
    int stopped = e2e_daemon_stop(&d, SIGINT);
    e2e_daemon_remove_files(&d);
    assert_non_null(strstr(log, "could not load"));
    assert_non_null(strstr(log, "Permission denied"));
    free(log);
    assert_int_equal(stopped, 0);
    /* Unharmed, and without the library. */
    assert_true(running(pid));
    char maps[64];
    snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)pid);
    char *m = e2e_read_file(maps);
    assert_null(strstr(m, "libheapprof"));
    free(m);
    close(in[1]);
    assert_int_equal(e2e_wait_status(pid), 0);
    char *o = e2e_read_file(out);
    assert_string_equal(o, "ready\ndone\n");
    free(o);
}

/* @argv (prints "ready", ends with "done" at EOF) refused with @why; it runs on and ends
 * as unprofiled. */
static void refused_unharmed(char *const argv[], const char *why)
{
    struct e2e_target t;
    start(&t, argv, "ready");
    refused(t.pid, why);
    e2e_sleep_ms(100);
    assert_true(running(t.pid));
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_string_equal(o, "ready\ndone\n");
    free(o);
}

/* A process with one thread in strict seccomp mode (any call but read, write and exit
 * kills the whole process, as a hook running on that thread would make): refused, and
 * it runs on and ends as unprofiled. */
static void test_inject_refuses_strict_seccomp_thread(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("INJECT_THREADS"), "strict", NULL};
    refused_unharmed(argv, "seccomp");
}

/* A seccomp filter that kills the process at socket(2), which a session makes: refused,
 * and the process lives on and ends as unprofiled. */
static void test_inject_refuses_seccomp_kill_filter(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("WAKE_REFUSED"), "seccomp", "kill", NULL};
    refused_unharmed(argv, "seccomp");
}

/* heapprof attach on a process that cannot read the library: a root process without
 * capabilities (no CAP_DAC_OVERRIDE, as hardened services run), the library in a
 * directory only its owner, nobody, may enter. rc 1 saying the process cannot read it;
 * the process runs on without the library, and a later attach with a library it can
 * read loads it and profiles. Root only (setpriv). */
static void test_inject_attach_unreadable_library(void **state)
{
    (void)state;
    if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
        print_message("  not root or no setpriv: skipped\n");
        skip();
    }
    char dir[300], lib[340], cmd[2048];
    snprintf(dir, sizeof(dir), "%s/nobodys", runtime_dir);
    snprintf(lib, sizeof(lib), "%s/libheapprof.so", dir);
    snprintf(cmd, sizeof(cmd),
             "mkdir -p '%s' && cp '%s' '%s' && chown -R 65534 '%s' && chmod 700 '%s'", dir,
             e2e_env("HEAPPROF_LIB"), lib, dir, dir);
    assert_int_equal(system(cmd), 0);

    char *argv[] = {"/usr/bin/setpriv", "--bounding-set=-all", "--inh-caps=-all",
                    (char *)e2e_env("INJECT_THREADS"), NULL};
    struct e2e_target t;
    start(&t, argv, "ready");
    char *own = strdup(e2e_env("HEAPPROF_LIB"));
    setenv("HEAPPROF_LIB", lib, 1);
    struct rp_trace *tr;
    char *err = NULL;
    int st = attach(t.pid, "0.2", "4096", &tr, &err);
    setenv("HEAPPROF_LIB", own, 1);
    free(own);
    print_message("  status %d: %s", st, err);
    assert_int_equal(st, 1);
    assert_non_null(strstr(err, "Permission denied"));
    assert_non_null(strstr(err, "read the library"));
    free(err);
    assert_false(has_library(t.pid));
    e2e_sleep_ms(100);
    assert_true(running(t.pid));

    /* Nothing left half-done: the library it can read loads, and profiles. */
    st = attach(t.pid, "0.2", "4096", &tr, &err);
    if (st != 0)
        print_message("  readable library: status %d: %s", st, err);
    assert_int_equal(st, 0);
    const struct rp_trace_process *p = proc_of(tr, t.pid);
    assert_non_null(p);
    assert_true(p->heap_samples > 0);
    rp_trace_free(tr);
    free(err);
    assert_true(has_library(t.pid));
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
}

/* fnoplt (build @prog_env, -fno-plt: it calls malloc through its GLOB_DAT slot) started
 * without the library, attached 3 times for 0.3 s at 4 KiB. Returns the samples of
 * fnoplt_alloc and the unseen call slots the sessions counted, in all; asserts the program
 * ran as unprofiled. */
static void fnoplt_sessions(const char *prog_env, long long *samples, uint64_t *unseen)
{
    char *argv[] = {(char *)e2e_env(prog_env), NULL};
    struct e2e_target t;
    start(&t, argv, "ready");
    *samples = 0;
    *unseen = 0;
    for (int i = 0; i < 3; i++) {
        struct rp_trace *tr;
        char *err = NULL;
        int st = attach(t.pid, "0.3", "4096", &tr, &err);
        if (st != 0)
            print_message("  session %d: status %d: %s\n", i, st, err);
        assert_int_equal(st, 0);
        const struct rp_trace_process *p = proc_of(tr, t.pid);
        assert_non_null(p);
        struct e2e_sums s;
        e2e_sum_function(p, "fnoplt_alloc", &s);
        *samples += (long long)s.alloc_count;
        *unseen += p->losses.unseen_call_slots;
        rp_trace_free(tr);
        free(err);
    }
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    print_message("  %s: %lld samples of fnoplt_alloc, %llu unseen call slots; program: %s",
                  prog_env, *samples, (unsigned long long)*unseen, o);
    assert_string_equal(o, "ready\ndone\n");
    free(o);
}

/* A -fno-plt program's calls through its GLOB_DAT slot of malloc are seen: the slot is
 * used for calls only, and the session switches it. */
static void test_inject_fnoplt_calls_seen(void **state)
{
    (void)state;
    long long samples;
    uint64_t unseen;
    fnoplt_sessions("FNOPLT_CALLS", &samples, &unseen);
    assert_true(samples > 0);
    assert_int_equal(unseen, 0);
}

/* A program that compares &malloc with the address it took at its start: the sessions
 * switched the GLOB_DAT slot the code loads it from, and the two differed (the program
 * said FATAL and exited 1). The slot now keeps the allocator's (&malloc keeps one value);
 * the calls through it are not seen, and every session counts it as unseen. */
static void test_inject_bug_address_of_malloc_changed(void **state)
{
    (void)state;
    long long samples;
    uint64_t unseen;
    fnoplt_sessions("FNOPLT_COMPARE", &samples, &unseen);
    assert_int_equal(samples, 0);
    assert_true(unseen >= 3);
}

/* tests/programs/slotwatch (build @prog_env), started without the library, reports where
 * its GOT slot of malloc leads every millisecond: two injected sessions each hook it, and
 * each detach gives it back to libc ("direct") with the library still loaded. */
static void slot_restored(const char *prog_env)
{
    char *argv[] = {(char *)e2e_env(prog_env), "2500", NULL};
    struct e2e_target t;
    start(&t, argv, "direct\n");
    for (int i = 0; i < 2; i++) {
        struct rp_trace *tr;
        char *err = NULL;
        int st = attach(t.pid, "0.3", "4096", &tr, &err);
        if (st != 0)
            print_message("  session %d: status %d: %s\n", i, st, err);
        assert_int_equal(st, 0);
        rp_trace_free(tr);
        free(err);
        e2e_sleep_ms(100);
    }
    assert_int_equal(library_copies(t.pid), 1);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    /* Its own slot's states in order (its forked children's lines left out). */
    char *o = e2e_read_file(t.out), states[256] = "";
    for (char *l = strtok(o, "\n"); l; l = strtok(NULL, "\n"))
        if (strncmp(l, "child ", 6) != 0 && strlen(states) + strlen(l) + 2 < sizeof(states))
            strcat(strcat(states, l), " ");
    free(o);
    print_message("  slot: %s\n", states);
    assert_string_equal(states, "direct hooked direct hooked direct done ");
}

static void test_inject_slot_restored_after_detach(void **state)
{
    (void)state;
    slot_restored("SLOTWATCH");
}

/* The same as a full-RELRO PIE (-z now -z relro): its slots are read-only. */
static void test_inject_slot_restored_full_relro(void **state)
{
    (void)state;
    slot_restored("SLOTWATCH_NOW");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inject_cycles_four_threads),
        cmocka_unit_test(test_inject_cycles_jemalloc),
        cmocka_unit_test(test_inject_cycles_tcmalloc),
        cmocka_unit_test(test_inject_cycles_mimalloc),
        cmocka_unit_test(test_inject_exact_after_attach),
        cmocka_unit_test(test_inject_plugin_loaded_during_session),
        cmocka_unit_test(test_inject_plugin_bound_after_first_look),
        cmocka_unit_test(test_inject_python),
        cmocka_unit_test(test_inject_sqlite3),
        cmocka_unit_test(test_inject_cxx),
        cmocka_unit_test(test_inject_refusals),
        cmocka_unit_test(test_inject_unreadable_library),
        cmocka_unit_test(test_inject_refuses_strict_seccomp_thread),
        cmocka_unit_test(test_inject_refuses_seccomp_kill_filter),
        cmocka_unit_test(test_inject_attach_unreadable_library),
        cmocka_unit_test(test_inject_fnoplt_calls_seen),
        cmocka_unit_test(test_inject_bug_address_of_malloc_changed),
        cmocka_unit_test(test_inject_slot_restored_after_detach),
        cmocka_unit_test(test_inject_slot_restored_full_relro),
    };
    /* HEAPPROF_TEST_FILTER=pattern runs the matching tests only. */
    const char *filter = getenv("HEAPPROF_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("e2e_inject", tests, setup, teardown);
}
