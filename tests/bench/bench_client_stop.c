/* tests/bench/bench_client_stop.c: a malloc loop while its service is stopped for 2 s
 * (issue 15, case 7).
 *
 * Runs tests/programs/harm/rate_stop under `heapprof record -q` (it stops the service
 * with SIGSTOP at 1 s and continues it at 3 s) ROUNDS times and prints the median of its
 * ratio: the loop's rate from 1 s after the stop on over its rate before the stop.
 *   client_stopped_service_rate_ratio   ratio (goal >= 0.5)
 * The range goes to stderr. From the build beside this binary, or HEAPPROF_BUILD.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/bench/bench_util.h"

#define ROUNDS 3

static char build[4096];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs rate_stop under heapprof; returns its ratio, < 0 on error. */
static double run(void)
{
    char heapprof[8192], prog[8192], trace[64], out[4096];
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(prog, sizeof(prog), "%s/tests/programs/harm/rate_stop", build);
    if (bench_tmp_trace(trace, sizeof(trace)) < 0)
        return -1;
    char *argv[] = {heapprof, "record", "-q", "-o", trace, "--", prog, NULL};
    int st = bench_run_stderr(argv, out, sizeof(out));
    (void)unlink(trace);
    const char *line = strstr(out, "rate_stop:");
    double before, during, after, ratio;
    if (st != 0 || !line ||
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
    if (bench_build_dir(build, sizeof(build)) < 0)
        return 1;
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
