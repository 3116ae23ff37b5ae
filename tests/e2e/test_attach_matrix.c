/* tests/e2e/test_attach_matrix.c: the attach column of the "every program" matrix
 * (tests/e2e/test_every_program.c runs programs unprofiled, dormant and recorded; this
 * file attaches them while they run). Each case is a real program an attach used to
 * harm (issue 24): run once unprofiled, then again attached and detached CYCLES times
 * while it runs; its output and exit status must equal the unprofiled run's, each
 * attach must end as the case expects (profiled, or refused with rc 1 and the reason),
 * and the sessions together must sample the case's allocation site.
 *
 * Two columns: "preloaded" (LD_PRELOAD=libheapprof.so, dormant until the attach wakes
 * it) and "injected" (started without the library: the first attach loads it, the
 * later ones wake it; one copy stays). HEAPPROF_MATRIX_COLUMN=preloaded|injected runs
 * one column (meson runs the two as separate tests, side by side);
 * HEAPPROF_TEST_FILTER=pattern runs the matching cases.
 *
 * Add a case: an entry in cases[] below. Arguments written "$VAR" are replaced by that
 * variable's value (paths from meson); "$DIR" is the test's runtime directory. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

#define CYCLES 20
/* Long enough for the programs' allocations (every 100 ms or more often) to be sampled
 * in most sessions, short enough for 20 cycles of 14 cases to take under a minute. */
#define SESSION_S "0.15"
#define SESSION_RETRY_S "2"

struct attach_case {
    const char *name;
    const char *argv[6];
    /* The program is ended with this signal (0: EOF on its stdin). */
    int finish_sig;
    /* The function whose allocations the sessions must sample (NULL: the program may
     * allocate nothing in a session; such a session ends with rc 1, "no process was
     * profiled"). */
    const char *site;
    /* Non-NULL: every attach is refused with rc 1 and this text in its message. */
    const char *refused;
    /* Non-NULL: "$DIR/tailed.txt" is created with this line, and each cycle appends
     * "line N" to it (in the unprofiled run too): for tail -f. */
    const char *tailed;
    /* After each attach, a peer posing as the service (tests/programs/fake_service.c
     * "attach") wakes the program itself and answers it with an unsealed ring and
     * unwind table, which it truncates: the program must refuse them. */
    bool fake_service;
};

static const struct attach_case cases[] = {
    /* Case 1: no system call changes its result. */
    {.name = "epoll_wait_eintr_fatal",
     .argv = {"$WAKE_TARGET", "epoll_inf"},
     .site = "wake_target_alloc"},
    {.name = "epoll_wait_timed",
     .argv = {"$WAKE_TARGET", "epoll_timed"},
     .site = "wake_target_alloc"},
    {.name = "clock_nanosleep", .argv = {"$WAKE_TARGET", "nanosleep"}, .site = "wake_target_alloc"},
    {.name = "tail_f",
     .argv = {"/usr/bin/tail", "-f", "$DIR/tailed.txt"},
     .finish_sig = SIGTERM,
     .tailed = "line start\n"},
    /* Case 2: programs that take signals themselves never see one of ours. */
    {.name = "sigwait_server",
     .argv = {"$WAKE_TARGET", "sigwait"},
     .finish_sig = SIGTERM,
     .site = "wake_target_alloc"},
    {.name = "signalfd_daemon",
     .argv = {"$WAKE_TARGET", "signalfd"},
     .finish_sig = SIGTERM,
     .site = "wake_target_alloc"},
    {.name = "own_rt_handler", .argv = {"$WAKE_TARGET", "rtsig"}, .site = "wake_target_alloc"},
    /* Case 3: sandboxes are refused, never killed. */
    {.name = "seccomp_trap", .argv = {"$WAKE_REFUSED", "seccomp", "trap"}, .refused = "seccomp"},
    {.name = "seccomp_kill_process",
     .argv = {"$WAKE_REFUSED", "seccomp", "kill"},
     .refused = "seccomp"},
    {.name = "seccomp_errno", .argv = {"$WAKE_REFUSED", "seccomp", "errno"}, .refused = "seccomp"},
    /* Case 4: a program that patches its own GOT and RELRO pages. */
    {.name = "got_patcher_keep", .argv = {"$RELRO_PATCH", "keep"}, .site = "relro_patch_alloc"},
    {.name = "got_patcher_restore",
     .argv = {"$RELRO_PATCH", "restore"},
     .site = "relro_patch_alloc"},
    /* Case 5: a dl_iterate_phdr callback takes a lock another thread allocates under. */
    {.name = "dl_iterate_phdr_lock",
     .argv = {"$DLITER_LOCK", "$DIR/progress"},
     .site = "dliter_log_line"},
    /* Case 6: a peer posing as the service truncates the files it handed over. */
    {.name = "fake_service_truncates",
     .argv = {"$WAKE_TARGET", "epoll_inf"},
     .site = "wake_target_alloc",
     .fake_service = true},
};

struct column {
    const char *name;
    bool preload;
};
static const struct column columns[] = {{"preloaded", true}, {"injected", false}};

/* What a test runs: one case in one column. */
struct cell {
    const struct attach_case *c;
    const struct column *col;
    char name[96];
};

static char runtime_dir[128];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "matrix");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* @arg with "$DIR" and "$VAR" replaced (into @buf). */
static char *expand(const char *arg, char *buf, size_t size)
{
    if (strncmp(arg, "$DIR", 4) == 0)
        snprintf(buf, size, "%s%s", runtime_dir, arg + 4);
    else if (arg[0] == '$')
        snprintf(buf, size, "%s", e2e_env(arg + 1));
    else
        snprintf(buf, size, "%s", arg);
    return buf;
}

/* The tailed file of @c, created anew with its first line (NULL when @c has none). */
static FILE *tailed_create(const struct attach_case *c)
{
    if (!c->tailed)
        return NULL;
    char path[256];
    FILE *f = fopen(expand("$DIR/tailed.txt", path, sizeof(path)), "w");
    assert_non_null(f);
    fputs(c->tailed, f);
    fflush(f);
    return f;
}

static void tailed_append(FILE *f, int i)
{
    if (f) {
        fprintf(f, "line %d\n", i);
        fflush(f);
    }
}

/* Starts @c (the library preloaded and dormant with @preload); returns once it printed
 * its first line. */
static void start(const struct attach_case *c, bool preload, struct e2e_target *t)
{
    static char bufs[6][256];
    char *argv[7] = {0};
    for (int i = 0; i < 6 && c->argv[i]; i++)
        argv[i] = expand(c->argv[i], bufs[i], sizeof(bufs[i]));
    const char *lib = preload ? e2e_env("HEAPPROF_LIB") : NULL;
    assert_int_equal(e2e_target_start(t, runtime_dir, argv, lib, c->tailed ? c->tailed : "ready\n"),
                     0);
}

/* Ends @c's run @t, @f its tailed file or NULL; returns its exit status and output. */
static int finish(const struct attach_case *c, struct e2e_target *t, FILE *f, char **out)
{
    if (f) {
        fputs("line end\n", f);
        fclose(f);
        e2e_sleep_ms(1200); /* tail -f looks again at least every second */
    }
    int status = e2e_target_finish(t, c->finish_sig);
    assert_true(status >= 0);
    *out = e2e_read_file(t->out);
    return status;
}

/* Copies of libheapprof.so mapped in @pid: its mappings at file offset 0. */
static int library_copies(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *maps = e2e_read_file(path);
    int n = 0;
    for (char *line = maps; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        char *off = strchr(line, ' ');
        if (strstr(line, "libheapprof") && off && strncmp(off + 6, "00000000 ", 9) == 0)
            n++;
        line = end ? end + 1 : NULL;
    }
    free(maps);
    return n;
}

/* One `heapprof attach -p PID --duration DURATION -i 1 -q -o TRACE`: its exit status,
 * stderr (malloc'd) and the samples of @site in its trace (0 without a trace). */
static int attach_once(pid_t pid, const char *duration, const char *site, char **err,
                       long long *samples)
{
    char trace[256], pidbuf[16];
    snprintf(trace, sizeof(trace), "%s/matrix.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
    unlink(trace);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pidbuf,
                    "--duration",
                    (char *)duration,
                    "-i",
                    "1",
                    "-q",
                    "-o",
                    trace,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    *samples = 0;
    struct rp_trace *t = NULL;
    if (site && run.status == 0 && rp_trace_load(trace, &(struct rp_trace_options){0}, &t) == 0) {
        for (size_t i = 0; i < t->n_processes; i++) {
            if (t->processes[i].pid != pid)
                continue;
            struct e2e_sums s;
            e2e_sum_function(&t->processes[i], site, &s);
            *samples += (long long)s.alloc_count;
        }
        rp_trace_free(t);
    }
    int status = run.status;
    *err = run.err, run.err = NULL;
    e2e_run_free(&run);
    return status;
}

/* The fake service's attach of @t's program (fake_service_truncates): the program hung up
 * on it before it truncated the files. */
static void fake_attach(const struct cell *cell, const struct e2e_target *t, int i)
{
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t->pid);
    char *argv[] = {(char *)e2e_env("FAKE_SERVICE"), "attach", pidbuf, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    bool ok = run.status == 0 && strstr(run.out, "client refused");
    if (!ok || i == 0)
        print_message("  %s cycle %d: the fake service: status %d, said: %s%s\n", cell->name, i,
                      run.status, run.out, run.err);
    e2e_run_free(&run);
    assert_true(ok);
}

/* One attach of @cell's running program @t, checked as the case expects; adds the
 * samples of its site to @total. */
static void cycle(const struct cell *cell, const struct e2e_target *t, int i, long long *total)
{
    const struct attach_case *c = cell->c;
    char *err = NULL;
    long long samples;
    int status = attach_once(t->pid, SESSION_S, c->site, &err, &samples);
    /* A session thread that had no CPU before the session ended is a defined outcome on
     * a busy machine (the attach says so, rc 1): once more, with time to connect. */
    if (status == 1 && err && strstr(err, "had not connected when the session ended")) {
        print_message("  %s cycle %d: not connected in " SESSION_S " s, again for %s s\n",
                      cell->name, i, SESSION_RETRY_S);
        free(err);
        err = NULL;
        status = attach_once(t->pid, SESSION_RETRY_S, c->site, &err, &samples);
    }
    bool ok;
    if (c->refused)
        ok = status == 1 && err && strstr(err, c->refused);
    else if (c->site)
        ok = status == 0;
    else /* may be empty */
        ok = status == 0 || (status == 1 && err && strstr(err, "no process was profiled"));
    if (!ok || !e2e_alive(t->pid)) {
        char *o = e2e_read_file(t->out);
        print_message("  %s cycle %d: status %d, stderr: %s\n  program: %s\n", cell->name, i,
                      status, err ? err : "", o);
        free(o);
    }
    free(err);
    assert_true(ok);
    assert_true(e2e_alive(t->pid));
    *total += samples;
    /* Injected: the first attach loaded the library, no later one loads another; a
     * refused one loads nothing. */
    if (!cell->col->preload)
        assert_int_equal(library_copies(t->pid), c->refused ? 0 : 1);
    if (c->fake_service) {
        fake_attach(cell, t, i);
        assert_true(e2e_alive(t->pid));
    }
}

static void run_cell(void **state)
{
    const struct cell *cell = *state;
    const struct attach_case *c = cell->c;

    struct e2e_target plain, t;
    FILE *f = tailed_create(c);
    start(c, false, &plain);
    for (int i = 0; i < CYCLES; i++)
        tailed_append(f, i);
    e2e_sleep_ms(100);
    char *plain_out;
    int plain_status = finish(c, &plain, f, &plain_out);

    f = tailed_create(c);
    start(c, cell->col->preload, &t);
    long long total = 0;
    for (int i = 0; i < CYCLES; i++) {
        tailed_append(f, i);
        cycle(cell, &t, i, &total);
    }
    char *out;
    int status = finish(c, &t, f, &out);
    print_message("  %s: %d attaches, %lld samples of %s; unprofiled: %d, %zu bytes of output; "
                  "attached: %d, %zu bytes\n",
                  cell->name, CYCLES, total, c->site ? c->site : "(any)", plain_status,
                  strlen(plain_out), status, strlen(out));
    if (status != plain_status || strcmp(out, plain_out) != 0)
        print_message("  unprofiled output:\n%s  attached output:\n%s", plain_out, out);
    assert_int_equal(status, plain_status);
    assert_string_equal(out, plain_out);
    assert_null(strstr(out, "FATAL"));
    if (c->site)
        assert_true(total > 0);
    free(out);
    free(plain_out);
}

int main(void)
{
    enum { N_CASES = sizeof(cases) / sizeof(cases[0]), N_COLUMNS = 2 };
    static struct cell cells[N_CASES * N_COLUMNS];
    static struct CMUnitTest tests[N_CASES * N_COLUMNS];
    const char *only = getenv("HEAPPROF_MATRIX_COLUMN");
    size_t n = 0;
    for (size_t k = 0; k < N_COLUMNS; k++) {
        if (only && strcmp(only, columns[k].name) != 0)
            continue;
        for (size_t i = 0; i < N_CASES; i++) {
            struct cell *cell = &cells[n];
            cell->c = &cases[i];
            cell->col = &columns[k];
            snprintf(cell->name, sizeof(cell->name), "%s/%s", columns[k].name, cases[i].name);
            tests[n++] = (struct CMUnitTest){.name = cell->name,
                                             .test_func = run_cell,
                                             .setup_func = NULL,
                                             .teardown_func = NULL,
                                             .initial_state = cell};
        }
    }
    const char *filter = getenv("HEAPPROF_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests("e2e_attach_matrix", tests, n, setup, teardown);
}
