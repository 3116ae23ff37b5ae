/* tests/bench/churn.c: a malloc-heavy program for the app-level overhead benchmark.
 *
 *     churn [ITERATIONS [THREADS]]
 *
 * THREADS threads (default 2, at most 64), each ITERATIONS times: free a random one of its
 * 256 live blocks and allocate a new one of 16..271 bytes, writing into it; prints a
 * checksum so the work is not elided.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIVE 256
#define MAX_THREADS 64

static long iterations = 2000000;

static void *churn(void *arg)
{
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 12345;
    uint64_t sum = 0;
    unsigned char *live[LIVE] = {0};
    for (long i = 0; i < iterations; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        unsigned k = (unsigned)(x % LIVE);
        size_t size = 16 + (x >> 32) % 256;
        free(live[k]);
        live[k] = malloc(size);
        if (!live[k])
            abort();
        live[k][0] = (unsigned char)i;
        live[k][size - 1] = (unsigned char)k;
        sum += live[(k + 1) % LIVE] ? live[(k + 1) % LIVE][0] : 0;
    }
    for (unsigned k = 0; k < LIVE; k++)
        free(live[k]);
    return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv)
{
    pthread_t th[MAX_THREADS];
    int threads = 2;
    uint64_t sum = 0;
    if (argc > 1)
        iterations = atol(argv[1]);
    if (argc > 2)
        threads = atoi(argv[2]);
    if (threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "churn: THREADS must be 1..%d\n", MAX_THREADS);
        return 2;
    }
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1)) != 0)
            return 1;
    for (int i = 0; i < threads; i++) {
        void *ret = NULL;
        (void)pthread_join(th[i], &ret);
        sum += (uintptr_t)ret;
    }
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
