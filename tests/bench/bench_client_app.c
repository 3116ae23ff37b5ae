/* tests/bench/bench_client_app.c: wall time of a malloc-heavy program (tests/bench/churn.c)
 * under `heapprof record`, against the same program unprofiled.
 *
 * Runs churn and `heapprof record -q -i N -o <tmp> -- churn` alternately from the same
 * build (beside this binary, or HEAPPROF_BUILD), RUNS times each, and prints the ratio
 * of the best runs as app_churn<T>t_ratio_4k (interval 4096) for 1, 2, 4 and 8 threads
 * (churn1t..churn8t: the same total work, CHURN_PAIRS malloc/free pairs, split among the
 * threads; with 4 and 8 more threads than this machine kind's 2 cores), and
 * app_churn2t_ratio_512k (interval 524288): on a shared machine other load only ever
 * adds time, so the minimum is the stable estimate (the medians go to stderr). Also checks
 * that the profiled run prints the same output.
 *
 * app_churn2t_ratio_4k_one_lane, app_churn4t_ratio_4k_one_lane: as app_churn2t_ratio_4k
 * and app_churn4t_ratio_4k with the service's rings in one lane (HEAPPROF_RING_LANES=1;
 * shmem_ring/ring_layout.h), the ring before lanes: what the lanes save.
 *
 * app_churn2t_ratio_dormant: the same program with libheapprof.so preloaded but no
 * session (the price of interposing malloc at all: the floor under the other ratios).
 *
 * app_churn2t_ratio_4k_injected: the program started without the library and attached
 * (`heapprof attach -p PID -i 4096`, which loads it: service/inject.c): the time of its
 * threads' work under the session (churn times it itself once the session's ring is
 * mapped, CHURN_WAIT_SESSION=1) against the same work unprofiled; comparable with
 * app_churn2t_ratio_4k, the preloaded path.
 *
 * app_churn1t_ratio_4k_jemalloc_prof, app_churn2t_ratio_4k_jemalloc_prof,
 * app_churn2t_ratio_512k_jemalloc_prof: a reference, not heapprof. jemalloc's own heap
 * profiler (libjemalloc.so.2 preloaded, MALLOC_CONF=prof:true with lg_prof_sample 12 or
 * 19: one sample per 4 KiB or 512 KiB on average, as heapprof's intervals) against
 * jemalloc unprofiled: what an allocator that samples in its own code costs at the same
 * rates. Not printed when jemalloc or its profiler is missing (said on stderr).
 *
 * svc_cpu_us_per_sample: the CPU time of the `heapprof record` process itself (its
 * threads: handshake, reading the ring, unwinding, bookkeeping, the dump; not the
 * program's) over the samples it recorded, for churn2t at 4096 (median of SVC_RUNS runs;
 * the per-run CPU comes from libbench_peak_rss.so preloaded into heapprof, the samples
 * from its summary). The pipeline's cost per sample, which on a machine with no idle
 * core the program pays in wall time.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/bench/bench_util.h"

#define RUNS 7
#define SVC_RUNS 5
#define ITERATIONS "40000000" /* per thread, for churn2t */
#define CHURN_PAIRS 80000000L

extern char **environ;

static char build[4096];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs @argv with stdout captured into @out; returns the wall time in ms, < 0 on error. */
static double run(char *const argv[], char *out, size_t cap)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0)
        return -1;
    posix_spawn_file_actions_destroy(&fa);
    (void)close(p[1]);
    size_t n = 0;
    for (;;) {
        ssize_t r = read(p[0], out + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    out[n] = 0;
    (void)close(p[0]);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    return (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1e6;
}

/* Runs @base and @tool alternately RUNS times; both must succeed with the same output.
 * Prints @name with the ratio of their best times, and the medians on stderr. Returns 0,
 * or 1 after a message. */
static int best_ratio(char *const base[], char *const tool[], const char *name)
{
    char out_base[256], out_tool[256];
    double tb[RUNS], tt[RUNS];
    for (int i = 0; i < RUNS; i++) {
        tb[i] = run(base, out_base, sizeof(out_base));
        tt[i] = run(tool, out_tool, sizeof(out_tool));
        if (tb[i] < 0 || tt[i] < 0 || strcmp(out_base, out_tool) != 0) {
            fprintf(stderr, "bench_client_app: %s: run failed or output differs\n", name);
            return 1;
        }
    }
    qsort(tb, RUNS, sizeof(double), cmp_double);
    qsort(tt, RUNS, sizeof(double), cmp_double);
    printf("bench: %s %.3f ratio\n", name, tt[0] / tb[0]);
    fprintf(stderr,
            "# %s: baseline best %.1f median %.1f ms, measured best %.1f median %.1f ms "
            "(median ratio %.3f)\n",
            name, tb[0], tb[RUNS / 2], tt[0], tt[RUNS / 2], tt[RUNS / 2] / tb[RUNS / 2]);
    return 0;
}

/* @interval NULL: dormant (the library preloaded, nothing profiled). @threads: churn's,
 * each doing CHURN_PAIRS / @threads pairs. */
static int ratio(const char *interval, int threads, const char *name)
{
    char churn[8192], heapprof[8192], trace[] = "/tmp/heapprof-bench-XXXXXX";
    char iters[32], nthreads[16];

    snprintf(churn, sizeof(churn), "%s/tests/bench/churn", build);
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(iters, sizeof(iters), "%ld", CHURN_PAIRS / threads);
    snprintf(nthreads, sizeof(nthreads), "%d", threads);
    int fd = mkstemp(trace);
    if (fd < 0)
        return 1;
    (void)close(fd);
    char *argv_plain[] = {churn, iters, nthreads, NULL};
    char *argv_prof[] = {heapprof, "record", "-q",  "-i",  (char *)interval, "-o",
                         trace,    "--",     churn, iters, nthreads,         NULL};
    char env_bin[] = "/usr/bin/env", preload[8300];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s/preload/libheapprof.so", build);
    char *argv_dormant[] = {env_bin, "-u",  "HEAPPROF_STARTUP", preload,
                            churn,   iters, nthreads,           NULL};
    char *const *argv_tool = interval ? argv_prof : argv_dormant;
    int r = best_ratio(argv_plain, argv_tool, name);
    (void)unlink(trace);
    return r;
}

#define JEMALLOC_LIB "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"

/* jemalloc's profiler at one sample per 2^@lg_sample bytes against jemalloc alone, for
 * churn with @threads threads (the same work as ratio()). 1 on a failed run, 0 (nothing
 * printed) when jemalloc or its profiler is missing. */
static int ratio_jemalloc_prof(int threads, int lg_sample, const char *name)
{
    char churn[8192], iters[32], nthreads[16], conf[128];
    char env_bin[] = "/usr/bin/env", preload[] = "LD_PRELOAD=" JEMALLOC_LIB;
    if (access(JEMALLOC_LIB, R_OK) != 0) {
        fprintf(stderr, "# %s: %s missing, not measured\n", name, JEMALLOC_LIB);
        return 0;
    }
    snprintf(churn, sizeof(churn), "%s/tests/bench/churn", build);
    snprintf(iters, sizeof(iters), "%ld", CHURN_PAIRS / threads);
    snprintf(nthreads, sizeof(nthreads), "%d", threads);
    snprintf(conf, sizeof(conf), "MALLOC_CONF=prof:true,prof_active:true,lg_prof_sample:%d",
             lg_sample);
    char *argv_plain[] = {env_bin, preload, churn, iters, nthreads, NULL};
    char *argv_prof[] = {env_bin, preload, conf, churn, iters, nthreads, NULL};
    /* A jemalloc built without the profiler says so on stderr and runs unprofiled. */
    char *argv_check[] = {env_bin, preload, conf, churn, "1", "1", NULL};
    char err[4096];
    if (bench_run_stderr(argv_check, err, sizeof(err)) != 0 || strstr(err, "<jemalloc>")) {
        fprintf(stderr, "# %s: jemalloc without its profiler, not measured\n", name);
        return 0;
    }
    return best_ratio(argv_plain, argv_prof, name);
}

/* The CPU milliseconds libbench_peak_rss.so wrote for the process named @comm into @path
 * (the sum if several), or -1. */
static long cpu_ms_of(const char *path, const char *comm)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char name[64];
    long hwm, ms, sum = -1;
    int pid;
    while (fscanf(f, "%d %63s %ld %ld", &pid, name, &hwm, &ms) == 4)
        if (strcmp(name, comm) == 0 && ms >= 0)
            sum = (sum < 0 ? 0 : sum) + ms;
    fclose(f);
    return sum;
}

static int svc_cpu_per_sample(void)
{
    char churn[8192], heapprof[8192], peak[8300], peak_file[] = "/tmp/heapprof-bench-XXXXXX";
    char trace[] = "/tmp/heapprof-bench-XXXXXX";
    char err[16384];
    double us[SVC_RUNS];
    snprintf(churn, sizeof(churn), "%s/tests/bench/churn", build);
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(peak, sizeof(peak), "%s/tests/bench/libbench_peak_rss.so", build);
    int fd = mkstemp(peak_file), fd2 = mkstemp(trace);
    if (fd < 0 || fd2 < 0)
        return 1;
    (void)close(fd);
    (void)close(fd2);
    char *argv[] = {heapprof, "record", "-i", "4096", "-o", trace, "--", churn, ITERATIONS, NULL};
    const char *old_preload = getenv("LD_PRELOAD");
    int rc = 0;
    for (int i = 0; i < SVC_RUNS && rc == 0; i++) {
        if (truncate(peak_file, 0) < 0)
            rc = 1;
        setenv("BENCH_PEAK_RSS_FILE", peak_file, 1);
        setenv("LD_PRELOAD", peak, 1);
        int st = bench_run_stderr(argv, err, sizeof(err));
        if (old_preload)
            setenv("LD_PRELOAD", old_preload, 1);
        else
            unsetenv("LD_PRELOAD");
        unsetenv("BENCH_PEAK_RSS_FILE");
        const char *p = strstr(err, "Stats: ");
        unsigned long long samples = 0;
        long ms = cpu_ms_of(peak_file, "heapprof");
        if (st != 0 || !p || sscanf(p, "Stats: %llu samples", &samples) != 1 || samples == 0 ||
            ms < 0) {
            fprintf(stderr, "bench_client_app: svc run failed (status %d, %ld ms)\n", st, ms);
            rc = 1;
            break;
        }
        us[i] = (double)ms * 1000.0 / (double)samples;
    }
    (void)unlink(peak_file);
    (void)unlink(trace);
    if (rc)
        return rc;
    qsort(us, SVC_RUNS, sizeof(double), cmp_double);
    printf("bench: svc_cpu_us_per_sample %.3f us\n", us[SVC_RUNS / 2]);
    fprintf(stderr, "# svc_cpu_us_per_sample: best %.3f median %.3f worst %.3f us\n", us[0],
            us[SVC_RUNS / 2], us[SVC_RUNS - 1]);
    return 0;
}

/* Runs churn with CHURN_WAIT_SESSION=1; with @attach, attaches `heapprof attach -i 4096`
 * to it once it waits. Returns its work_ms, < 0 on error. */
static double run_timed(const char *churn, const char *heapprof, bool attach)
{
    int out[2], err[2];
    if (pipe(out) < 0 || pipe(err) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        setenv("CHURN_WAIT_SESSION", attach ? "1" : "0", 1);
        unsetenv("LD_PRELOAD");
        execl(churn, "churn", ITERATIONS, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    char line[256];
    FILE *o = fdopen(out[0], "r");
    pid_t ap = -1;
    if (attach && fgets(line, sizeof(line), o) && strcmp(line, "waiting\n") == 0) {
        char pidbuf[16], trace[] = "/tmp/heapprof-bench-XXXXXX";
        int fd = mkstemp(trace);
        if (fd >= 0)
            (void)close(fd);
        snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
        ap = fork();
        if (ap == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 2);
            execl(heapprof, "heapprof", "attach", "-p", pidbuf, "-i", "4096", "-q", "-o", trace,
                  (char *)NULL);
            _exit(127);
        }
        int st;
        (void)waitpid(pid, &st, 0);
        (void)waitpid(ap, &st, 0);
        (void)unlink(trace);
    }
    while (fgets(line, sizeof(line), o))
        ;
    fclose(o);
    FILE *e = fdopen(err[0], "r");
    double ms = -1;
    int session = 0;
    while (fgets(line, sizeof(line), e))
        if (sscanf(line, "churn: work_ms %lf session %d", &ms, &session) == 2)
            break;
    /* Attached: only a run that was profiled to its end counts. */
    if (attach && !session)
        ms = 0;
    fclose(e);
    int st;
    (void)waitpid(pid, &st, 0);
    return ms;
}

static int ratio_injected(void)
{
    char churn[8192], heapprof[8192];
    snprintf(churn, sizeof(churn), "%s/tests/bench/churn", build);
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    double plain[RUNS], prof[RUNS];
    int n = 0;
    for (int i = 0; i < RUNS; i++) {
        double a = run_timed(churn, heapprof, false), b = run_timed(churn, heapprof, true);
        if (a > 0 && b > 0) {
            plain[n] = a;
            prof[n++] = b;
        } else {
            fprintf(stderr, "# injected run %d failed or was not profiled to its end\n", i);
        }
    }
    if (n < 3) {
        fprintf(stderr, "bench_client_app: %d of %d injected runs profiled\n", n, RUNS);
        return 1;
    }
    qsort(plain, (size_t)n, sizeof(double), cmp_double);
    qsort(prof, (size_t)n, sizeof(double), cmp_double);
    printf("bench: app_churn2t_ratio_4k_injected %.3f ratio\n", prof[0] / plain[0]);
    fprintf(stderr,
            "# injected (%d runs): unprofiled best %.1f median %.1f ms, attached best %.1f "
            "median %.1f ms\n",
            n, plain[0], plain[n / 2], prof[0], prof[n / 2]);
    return 0;
}

int main(void)
{
    if (bench_build_dir(build, sizeof(build)) < 0)
        return 1;
    int r = ratio("4096", 1, "app_churn1t_ratio_4k");
    r |= ratio("4096", 2, "app_churn2t_ratio_4k");
    r |= ratio("4096", 4, "app_churn4t_ratio_4k");
    r |= ratio("4096", 8, "app_churn8t_ratio_4k");
    r |= ratio("524288", 2, "app_churn2t_ratio_512k");
    r |= ratio(NULL, 2, "app_churn2t_ratio_dormant");
    /* The same rings in one lane (every writer on one position and its lines: the ring
     * before lanes), for the lanes' share of the ratios above. */
    if (setenv("HEAPPROF_RING_LANES", "1", 1) == 0) {
        r |= ratio("4096", 2, "app_churn2t_ratio_4k_one_lane");
        r |= ratio("4096", 4, "app_churn4t_ratio_4k_one_lane");
        (void)unsetenv("HEAPPROF_RING_LANES");
    }
    r |= ratio_jemalloc_prof(1, 12, "app_churn1t_ratio_4k_jemalloc_prof");
    r |= ratio_jemalloc_prof(2, 12, "app_churn2t_ratio_4k_jemalloc_prof");
    r |= ratio_jemalloc_prof(2, 19, "app_churn2t_ratio_512k_jemalloc_prof");
    r |= svc_cpu_per_sample();
    return r | ratio_injected();
}
