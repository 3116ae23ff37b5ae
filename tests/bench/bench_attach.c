/* tests/bench/bench_attach.c: attaching to a dormant program (service/wake.c).
 *
 *   attach_latency_idle_ms  from the start of the wake (heapprof attach's debug log) to
 *   attach_latency_busy_ms  the target's first allocation once its session's ring is
 *                           mapped (sampled: interval 1), median of ROUNDS attaches, for
 *                           tests/bench/attach_target idle (one thread, a block every
 *                           5 ms) and busy (one thread, flat out)
 *   inject_attach_ms        the same for a target started without the library (its first
 *                           attach loads it: service/inject.c), from the start of the
 *                           heapprof command, median of ROUNDS fresh targets
 *   inject_stop_us_p50/_p95 how long the thread that loads the library is stopped, over
 *                           INJECT_LOADS fresh targets (4 threads, steady)
 *   inject_cycles_ok        attach/detach cycles that profiled a 4-thread target started
 *                           without the library (the first loads it), of CYCLES
 *   attach_cycles_ok        of CYCLES attach/detach cycles on a 4-thread target that
 *                           allocates steadily (4 x 64 blocks a millisecond: a busy
 *                           machine would only time the scheduler) and checks every block
 *                           it frees, those that profiled it (exit
 *                           status 0, target alive); 0 when the target found a corrupt
 *                           block or died
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench/bench_util.h"

#define ROUNDS 9
#define CYCLES 100
#define INJECT_LOADS 30

static char build[4096], heapprof[4200], lib[4200], target[4200];

struct target {
    pid_t pid;
    int in;
    FILE *out;
};

static void target_start_with(struct target *t, const char *mode, const char *threads, bool preload)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0)
        exit(1);
    t->pid = fork();
    if (t->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        if (preload) {
            setenv("LD_PRELOAD", lib, 1);
            setenv("HEAPPROF_STARTUP", "0", 1);
        } else {
            unsetenv("LD_PRELOAD");
        }
        execl(target, "attach_target", mode, threads, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->in = in[1];
    t->out = fdopen(out[0], "r");
    char line[256];
    if (!fgets(line, sizeof(line), t->out) || strcmp(line, "ready\n") != 0) {
        fprintf(stderr, "bench_attach: the target did not start\n");
        exit(1);
    }
}

static void target_start(struct target *t, const char *mode, const char *threads)
{
    target_start_with(t, mode, threads, true);
}

/* Ends @t; returns its exit status, its "blocks N corrupt C" line in @last. */
static int target_finish(struct target *t, char *last, size_t cap)
{
    close(t->in);
    char line[256];
    last[0] = '\0';
    while (fgets(line, sizeof(line), t->out))
        if (strncmp(line, "blocks", 6) == 0)
            snprintf(last, cap, "%s", line);
    fclose(t->out);
    int st;
    waitpid(t->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `heapprof attach -p PID --duration DUR -i 1 -q -o TRACE` with HEAPPROF_LOG=debug. */
static int attach(pid_t pid, const char *dur, char *err, size_t cap)
{
    char pidbuf[16], trace[64];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
    if (bench_tmp_trace(trace, sizeof(trace)) < 0)
        return -1;
    setenv("HEAPPROF_LOG", "debug", 1);
    char *argv[] = {heapprof, "attach", "-p", pidbuf, "--duration", (char *)dur,
                    "-i",     "1",      "-q", "-o",   trace,        NULL};
    int r = bench_run_stderr(argv, err, cap);
    unsetenv("HEAPPROF_LOG");
    unlink(trace);
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void latency(const char *mode)
{
    struct target t;
    target_start(&t, mode, "1");
    double ms[ROUNDS];
    int n = 0;
    static char err[1 << 16];
    for (int i = 0; i < ROUNDS; i++) {
        if (attach(t.pid, "0.3", err, sizeof(err)) != 0)
            continue;
        const char *w = strstr(err, "(started at ");
        if (!w)
            continue;
        unsigned long long start = strtoull(w + 12, NULL, 10), first = 0;
        char line[256];
        /* The "sampled" line of this session (printed during it, read after it). */
        while (fgets(line, sizeof(line), t.out))
            if (sscanf(line, "sampled %llu", &first) == 1 || strcmp(line, "unsampled\n") == 0)
                if (first)
                    break;
        if (first > start)
            ms[n++] = (double)(first - start) / 1e6;
        /* Back to dormant before the next round. */
        while (fgets(line, sizeof(line), t.out) && strcmp(line, "unsampled\n") != 0)
            ;
    }
    char last[256];
    int st = target_finish(&t, last, sizeof(last));
    if (n == 0 || st != 0) {
        fprintf(stderr, "bench_attach: %s: %d of %d rounds measured, target status %d\n", mode, n,
                ROUNDS, st);
        exit(1);
    }
    qsort(ms, (size_t)n, sizeof(ms[0]), cmp_double);
    printf("bench: attach_latency_%s_ms %.2f ms\n", mode, ms[n / 2]);
}

/* The "sampled NS" time of @t's next session, or 0. */
static unsigned long long first_sample(struct target *t)
{
    char line[256];
    unsigned long long first = 0;
    while (fgets(line, sizeof(line), t->out))
        if (sscanf(line, "sampled %llu", &first) == 1 && first)
            return first;
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void inject_latency(void)
{
    double ms[ROUNDS];
    int n = 0;
    static char err[1 << 16];
    for (int i = 0; i < ROUNDS; i++) {
        struct target t;
        target_start_with(&t, "idle", "1", false);
        uint64_t start = mono_ns();
        int r = attach(t.pid, "0.3", err, sizeof(err));
        unsigned long long first = r == 0 ? first_sample(&t) : 0;
        char last[256];
        int st = target_finish(&t, last, sizeof(last));
        if (first > start && st == 0)
            ms[n++] = (double)(first - start) / 1e6;
        else
            fprintf(stderr, "bench_attach: inject round %d: status %d, target %d: %.300s\n", i, r,
                    st, err);
    }
    if (n == 0)
        exit(1);
    qsort(ms, (size_t)n, sizeof(ms[0]), cmp_double);
    printf("bench: inject_attach_ms %.2f ms\n", ms[n / 2]);
}

static void inject_stops(void)
{
    double us[INJECT_LOADS];
    int n = 0;
    static char err[1 << 16];
    for (int i = 0; i < INJECT_LOADS; i++) {
        struct target t;
        target_start_with(&t, "steady", "4", false);
        int r = attach(t.pid, "0.05", err, sizeof(err));
        const char *w = strstr(err, " stopped ");
        char last[256];
        int st = target_finish(&t, last, sizeof(last));
        double ms;
        if (r == 0 && st == 0 && w && sscanf(w, " stopped %lf ms", &ms) == 1)
            us[n++] = ms * 1000.0;
        else
            fprintf(stderr, "bench_attach: inject load %d: status %d, target %d: %.300s\n", i, r,
                    st, err);
    }
    if (n == 0)
        exit(1);
    qsort(us, (size_t)n, sizeof(us[0]), cmp_double);
    printf("bench: inject_stop_us_p50 %.0f us\n", us[n / 2]);
    printf("bench: inject_stop_us_p95 %.0f us\n", us[(n * 95 + 99) / 100 - 1]);
}

static void cycles_of(bool preload, const char *name)
{
    struct target t;
    target_start_with(&t, "steady", "4", preload);
    int ok = 0;
    static char err[1 << 16];
    for (int i = 0; i < CYCLES; i++) {
        int r = attach(t.pid, "0.05", err, sizeof(err));
        if (r == 0 && kill(t.pid, 0) == 0)
            ok++;
        else
            fprintf(stderr, "bench_attach: cycle %d: status %d: %.300s\n", i, r, err);
    }
    /* Drain what it printed meanwhile (the pipe must not fill), then end it. */
    char last[256];
    int st = target_finish(&t, last, sizeof(last));
    if (st != 0 || strstr(last, "corrupt 0") == NULL) {
        fprintf(stderr, "bench_attach: target status %d, %s", st, last);
        ok = 0;
    }
    printf("bench: %s %d count\n", name, ok);
}

int main(void)
{
    if (bench_build_dir(build, sizeof(build)) < 0)
        return 1;
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(lib, sizeof(lib), "%s/preload/libheapprof.so", build);
    snprintf(target, sizeof(target), "%s/tests/bench/attach_target", build);
    char xdg[] = "/tmp/heapprof-bench-attach-XXXXXX";
    if (!mkdtemp(xdg))
        return 1;
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    signal(SIGPIPE, SIG_IGN);
    latency("idle");
    latency("busy");
    cycles_of(true, "attach_cycles_ok");
    inject_latency();
    inject_stops();
    cycles_of(false, "inject_cycles_ok");
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", xdg);
    return system(cmd) == 0 ? 0 : 1;
}
