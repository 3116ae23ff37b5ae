/* tests/bench/churn.c: a malloc-heavy program for the app-level overhead benchmark.
 *
 *     churn [ITERATIONS [THREADS]]
 *
 * THREADS threads (default 2, at most 64), each ITERATIONS times: free a random one of its
 * 256 live blocks and allocate a new one of 16..271 bytes, writing into it; prints a
 * checksum so the work is not elided.
 *
 * CHURN_WAIT_SESSION=1: first waits (30 s at most) until a profiling session's ring is
 * mapped (an attach, which loads the library into a program started without it), then
 * says on stderr how long the threads' work took ("churn: work_ms MS"), so that the
 * benchmark times only what runs under the session, and whether the session was still on
 * at the end ("session 1"); =0: the same timing, no wait.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static bool has_ring(void)
{
    static char buf[1 << 16];
    FILE *f = fopen("/proc/self/maps", "r");
    bool r = false;
    if (!f)
        return false;
    while (!r && fgets(buf, sizeof(buf), f))
        r = strstr(buf, "heapprof-ring") != NULL;
    fclose(f);
    return r;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
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
    const char *wait = getenv("CHURN_WAIT_SESSION");
    bool timed = wait != NULL; /* "0": timed the same way, without waiting */
    if (timed && strcmp(wait, "1") == 0) {
        printf("waiting\n");
        fflush(stdout);
        for (int i = 0; i < 30000 && !has_ring(); i++)
            usleep(1000);
    }
    double t0 = now_ms();
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1)) != 0)
            return 1;
    for (int i = 0; i < threads; i++) {
        void *ret = NULL;
        (void)pthread_join(th[i], &ret);
        sum += (uintptr_t)ret;
    }
    if (timed)
        fprintf(stderr, "churn: work_ms %.1f session %d\n", now_ms() - t0, has_ring() ? 1 : 0);
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
