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

/* Runs free_pairs @n under heapprof; returns its ns per pair, < 0 on error. */
static double run(const char *n)
{
    char heapprof[8192], prog[8192], trace[64], out[4096];
    snprintf(heapprof, sizeof(heapprof), "%s/cli/heapprof", build);
    snprintf(prog, sizeof(prog), "%s/tests/bench/free_pairs", build);
    if (bench_tmp_trace(trace, sizeof(trace)) < 0)
        return -1;
    char *argv[] = {heapprof, "record", "-q", "-i",      "512", "-o",
                    trace,    "--",     prog, (char *)n, NULL};
    int st = bench_run_stderr(argv, out, sizeof(out));
    (void)unlink(trace);
    const char *line = strstr(out, "free_pairs:");
    double ns;
    long live;
    if (st != 0 || !line ||
        sscanf(line, "free_pairs: %ld live, %lf ns per pair", &live, &ns) != 2) {
        fprintf(stderr, "bench_client_free: run failed:\n%s\n", out);
        return -1;
    }
    return ns;
}

int main(void)
{
    if (bench_build_dir(build, sizeof(build)) < 0)
        return 1;
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
