/* tests/bench/free_pairs.c: cost of malloc(16)+free next to N live blocks of 512 bytes
 * (run by tests/bench/bench_client_free.c under `heapprof record -i 512`, where each of
 * those blocks is sampled and watched by the client's free set).
 *
 *   free_pairs N     prints "free_pairs: N live, X ns per pair" on stderr, "ok" on stdout
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PAIRS 5000000

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000;
    void **live = malloc((size_t)n * sizeof(*live));
    if (!live)
        return 1;
    for (long i = 0; i < n; i++)
        live[i] = malloc(512);
    double best = 1e18;
    /* Best of 3 rounds: other load only ever adds time. */
    for (int round = 0; round < 3; round++) {
        double t0 = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            void *volatile p = malloc(16);
            free(p);
        }
        double ns = (now_ns() - t0) / PAIRS;
        best = ns < best ? ns : best;
    }
    for (long i = 0; i < n; i++)
        free(live[i]);
    free(live);
    fprintf(stderr, "free_pairs: %ld live, %.2f ns per pair\n", n, best);
    printf("ok\n");
    return 0;
}
