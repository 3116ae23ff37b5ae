/* tests/bench/bench_client_free.c: a free() next to a large heap (issue 15, case 8).
 *
 * Runs tests/bench/free_pairs under `heapprof record -q -i 512` holding 10 000 and then
 * 2 000 000 live blocks of 512 bytes (each sampled, so each in the client's free set),
 * alternately, ROUNDS times each, and prints the best ns per malloc(16)+free pair of
 * each (on a shared machine other load only adds time):
 *   client_free_pair_ns_10k_live, client_free_pair_ns_2m_live   ns
 *   client_free_pair_2m_vs_10k_ratio                             ratio (goal <= 1.5)
 * The medians go to stderr. From the build beside this binary, or HEAPPROF_BUILD.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 3

extern char **environ;

static char build[4096];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs free_pairs @n under heapprof; returns its ns per pair, < 0 on error. */
static double run(const char *n)
{
    char heapprof[8192], prog[8192], trace[] = "/tmp/heapprof-bench-XXXXXX";
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(prog, sizeof(prog), "%s/tests/bench/free_pairs", build);
    int fd = mkstemp(trace);
    if (fd < 0)
        return -1;
    (void)close(fd);
    int p[2];
    if (pipe(p) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {heapprof, "record", "-q", "-i",      "512", "-o",
                    trace,    "--",     prog, (char *)n, NULL};
    pid_t pid;
    if (posix_spawn(&pid, heapprof, &fa, NULL, argv, environ) != 0)
        return -1;
    posix_spawn_file_actions_destroy(&fa);
    (void)close(p[1]);
    char out[4096];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(p[0], out + len, sizeof(out) - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    out[len] = 0;
    (void)close(p[0]);
    int st;
    (void)waitpid(pid, &st, 0);
    (void)unlink(trace);
    const char *line = strstr(out, "free_pairs:");
    double ns;
    long live;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !line ||
        sscanf(line, "free_pairs: %ld live, %lf ns per pair", &live, &ns) != 2) {
        fprintf(stderr, "bench_client_free: run failed:\n%s\n", out);
        return -1;
    }
    return ns;
}

int main(void)
{
    const char *env = getenv("HEAPPROF_BUILD");
    if (env) {
        snprintf(build, sizeof(build), "%s", env);
    } else {
        /* <build>/tests/bench/bench_client_free */
        ssize_t n = readlink("/proc/self/exe", build, sizeof(build) - 1);
        if (n <= 0)
            return 1;
        build[n] = 0;
        for (int i = 0; i < 3; i++)
            *strrchr(build, '/') = 0;
    }
    double small[ROUNDS], large[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        small[r] = run("10000");
        large[r] = run("2000000");
        if (small[r] < 0 || large[r] < 0)
            return 1;
    }
    qsort(small, ROUNDS, sizeof(double), cmp_double);
    qsort(large, ROUNDS, sizeof(double), cmp_double);
    printf("bench: client_free_pair_ns_10k_live %.2f ns\n", small[0]);
    printf("bench: client_free_pair_ns_2m_live %.2f ns\n", large[0]);
    printf("bench: client_free_pair_2m_vs_10k_ratio %.3f ratio\n", large[0] / small[0]);
    fprintf(stderr, "# free pairs: 10k live %.2f-%.2f ns, 2M live %.2f-%.2f ns (%d runs each)\n",
            small[0], small[ROUNDS - 1], large[0], large[ROUNDS - 1], ROUNDS);
    return 0;
}
