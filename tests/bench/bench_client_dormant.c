/* tests/bench/bench_client_dormant.c: what a dormant libheapprof.so costs a
 * single-threaded program beyond its interposed malloc: glibc keeps fast paths for
 * single-threaded processes (stdio without locks, malloc without atomic operations), which
 * a thread of ours would turn off.
 *
 * Runs itself as a child, in turn without LD_PRELOAD, with libheapprof.so (no service:
 * the library stays dormant) and with libforward_shim.so (a wrapper that only forwards
 * malloc and free, the floor of any interposition), RUNS times each, and prints the
 * ratios of the best runs to the run without:
 *   client_dormant_putc_ratio            putc() to a buffered /dev/null stream
 *   client_dormant_bigalloc_ratio        malloc+free of 2-2.5 KiB blocks (beyond glibc's
 *                                        tcache, 8 allocations then 8 frees per round)
 *   client_dormant_bigalloc_floor_ratio  the same under the forwarding wrapper
 * Goal: <= 1.02 both, which the floor does not reach for bigalloc (an indirect jump per
 * call): there the goal is the floor's ratio. The child also reports its thread count,
 * which must be 1.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

#define RUNS 7
#define PUTCS 20000000
#define BIG_ROUNDS 1000000

extern char **environ;

static int threads_now(void)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *t = strstr(buf, "\nThreads:");
    return t ? atoi(t + 9) : -1;
}

static double putc_ns(FILE *f)
{
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < PUTCS; i++)
        putc('x', f);
    return (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / PUTCS;
}

static double bigalloc_ns(void)
{
    void *volatile p[8];
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (int r = 0; r < BIG_ROUNDS; r++) {
        for (int i = 0; i < 8; i++)
            p[i] = malloc(2048 + 64 * (size_t)i);
        for (int i = 0; i < 8; i++)
            free(p[i]);
    }
    return (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / (8.0 * BIG_ROUNDS);
}

static int child(void)
{
    FILE *f = fopen("/dev/null", "we");
    if (!f)
        return 1;
    static char buf[1 << 16];
    setvbuf(f, buf, _IOFBF, sizeof(buf));
    double best_putc = 1e9, best_big = 1e9;
    for (int i = 0; i < 3; i++) {
        double a = putc_ns(f), b = bigalloc_ns();
        best_putc = a < best_putc ? a : best_putc;
        best_big = b < best_big ? b : best_big;
    }
    fclose(f);
    printf("%.3f %.3f %d\n", best_putc, best_big, threads_now());
    return 0;
}

/* Runs the child with @preload (NULL: none); its figures in @ret (putc, bigalloc). */
static int run_child(const char *self, const char *preload, const char *xdg, double ret[2],
                     int *ret_threads)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        if (preload)
            setenv("LD_PRELOAD", preload, 1);
        else
            unsetenv("LD_PRELOAD");
        setenv("XDG_RUNTIME_DIR", xdg, 1); /* empty: no daemon socket, dormant */
        unsetenv("HEAPPROF_SOCKET");
        setenv("HEAPPROF_STARTUP", "0", 1);
        setenv("BENCH_DORMANT_CHILD", "1", 1);
        execl(self, self, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char out[256];
    ssize_t n = read(p[0], out, sizeof(out) - 1);
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    out[n] = 0;
    return sscanf(out, "%lf %lf %d", &ret[0], &ret[1], ret_threads) == 3 ? 0 : -1;
}

int main(void)
{
    if (getenv("BENCH_DORMANT_CHILD"))
        return child();

    char lib[8192], shim[8192], self[4096], xdg[] = "/tmp/heapprof-bench-dormant-XXXXXX";
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = 0;
    /* <build>/tests/bench/bench_client_dormant -> <build>/preload/libheapprof.so and
     * <build>/tests/bench/libforward_shim.so */
    char *slash = strrchr(self, '/');
    *slash = 0;
    const char *env_lib = getenv("HEAPPROF_LIB");
    if (env_lib)
        snprintf(lib, sizeof(lib), "%s", env_lib);
    else
        snprintf(lib, sizeof(lib), "%s/../../preload/libheapprof.so", self);
    snprintf(shim, sizeof(shim), "%s/libforward_shim.so", self);
    *slash = '/';
    if (!mkdtemp(xdg))
        return 1;
    const char *preloads[3] = {NULL, lib, shim};
    double best[3][2] = {{1e9, 1e9}, {1e9, 1e9}, {1e9, 1e9}};
    int threads[3] = {0, 0, 0};
    for (int r = 0; r < RUNS; r++) {
        for (int mode = 0; mode < 3; mode++) {
            double v[2];
            int t = 0;
            if (run_child(self, preloads[mode], xdg, v, &t) < 0) {
                fprintf(stderr, "bench_client_dormant: child failed\n");
                rmdir(xdg);
                return 1;
            }
            threads[mode] = t > threads[mode] ? t : threads[mode];
            for (int k = 0; k < 2; k++)
                best[mode][k] = v[k] < best[mode][k] ? v[k] : best[mode][k];
        }
    }
    rmdir(xdg);
    fprintf(stderr,
            "# putc %.2f ns plain, %.2f ns dormant; malloc+free 2-2.5 KiB %.2f ns plain, "
            "%.2f ns dormant, %.2f ns forwarded; threads at most %d plain, %d dormant\n",
            best[0][0], best[1][0], best[0][1], best[1][1], best[2][1], threads[0], threads[1]);
    printf("bench: client_dormant_putc_ratio %.3f ratio\n", best[1][0] / best[0][0]);
    printf("bench: client_dormant_bigalloc_ratio %.3f ratio\n", best[1][1] / best[0][1]);
    printf("bench: client_dormant_bigalloc_floor_ratio %.3f ratio\n", best[2][1] / best[0][1]);
    return 0;
}
