/* tests/bench/bench_client_stop.c: a malloc loop while its service is stopped for 2 s
 * (issue 15, case 7).
 *
 * Runs tests/programs/harm/rate_stop under `heapprof record -q` (it stops the service
 * with SIGSTOP at 1 s and continues it at 3 s) ROUNDS times and prints the median of its
 * ratio: the loop's rate from 1 s after the stop on over its rate before the stop.
 *   client_stopped_service_rate_ratio   ratio (goal >= 0.5)
 * The range goes to stderr. From the build beside this binary, or HEAPPROF_BUILD.
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

static double run(void)
{
    char heapprof[8192], prog[8192], trace[] = "/tmp/heapprof-bench-XXXXXX";
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(prog, sizeof(prog), "%s/tests/programs/harm/rate_stop", build);
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
    char *argv[] = {heapprof, "record", "-q", "-o", trace, "--", prog, NULL};
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
    const char *line = strstr(out, "rate_stop:");
    double before, during, after, ratio;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !line ||
        sscanf(line, "rate_stop: before %lf/s during %lf/s after %lf/s ratio %lf", &before, &during,
               &after, &ratio) != 4) {
        fprintf(stderr, "bench_client_stop: run failed:\n%s\n", out);
        return -1;
    }
    fprintf(stderr, "# rate_stop: %.3g pairs/s before, %.3g during the stop, %.3g after\n", before,
            during, after);
    return ratio;
}

int main(void)
{
    const char *env = getenv("HEAPPROF_BUILD");
    if (env) {
        snprintf(build, sizeof(build), "%s", env);
    } else {
        /* <build>/tests/bench/bench_client_stop */
        ssize_t n = readlink("/proc/self/exe", build, sizeof(build) - 1);
        if (n <= 0)
            return 1;
        build[n] = 0;
        for (int i = 0; i < 3; i++)
            *strrchr(build, '/') = 0;
    }
    double ratio[ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        if ((ratio[r] = run()) < 0)
            return 1;
    qsort(ratio, ROUNDS, sizeof(double), cmp_double);
    printf("bench: client_stopped_service_rate_ratio %.3f ratio\n", ratio[ROUNDS / 2]);
    fprintf(stderr, "# client_stopped_service_rate_ratio: %.3f-%.3f over %d runs\n", ratio[0],
            ratio[ROUNDS - 1], ROUNDS);
    return 0;
}
