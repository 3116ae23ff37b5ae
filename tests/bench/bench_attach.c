/* tests/bench/bench_attach.c: attaching to a dormant program (service/wake.c).
 *
 *   attach_latency_idle_ms  from the start of the wake (heapprof attach's debug log) to
 *   attach_latency_busy_ms  the target's first allocation once its session's ring is
 *                           mapped (sampled: interval 1), median of ROUNDS attaches, for
 *                           tests/bench/attach_target idle (one thread, a block every
 *                           5 ms) and busy (one thread, flat out)
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

static char build[4096], heapprof[4200], lib[4200], target[4200];

struct target {
    pid_t pid;
    int in;
    FILE *out;
};

static void target_start(struct target *t, const char *mode, const char *threads)
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
        setenv("LD_PRELOAD", lib, 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
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

static void cycles(void)
{
    struct target t;
    target_start(&t, "steady", "4");
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
    printf("bench: attach_cycles_ok %d count\n", ok);
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
    cycles();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", xdg);
    return system(cmd) == 0 ? 0 : 1;
}
