/* tests/bench/attach_target.c: the program `scripts/bench.sh attach` attaches to.
 *
 *     attach_target idle|busy|steady THREADS
 *
 * THREADS threads allocate blocks of 16..527 bytes filled with a pattern of their own,
 * keep 64 live, and check the pattern of each block before freeing it: busy flat out,
 * idle one block every 5 ms (clock_nanosleep in between). The main thread looks at
 * /proc/self/maps every millisecond: when a session's ring appears it prints
 * "sampled NS", NS the CLOCK_MONOTONIC time of the first allocation made after that
 * (sampled: the benchmark attaches at interval 1); "unsampled" when the ring is gone. At
 * EOF on stdin it prints "blocks N corrupt C" and "done"; exit status 1 when C > 0. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LIVE 64

static const char *mode;
static atomic_bool stop;
static atomic_int session;     /* 1: a ring seen, first allocation not yet timed */
static atomic_ullong first_ns; /* time of that first allocation */
static atomic_ullong blocks, corrupt;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *alloc_main(void *arg)
{
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    unsigned char *live[LIVE] = {0};
    size_t len[LIVE] = {0};
    bool idle = strcmp(mode, "idle") == 0, steady = strcmp(mode, "steady") == 0;
    while (!atomic_load(&stop)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned i = (unsigned)(x % LIVE);
        if (live[i]) {
            for (size_t k = 0; k < len[i]; k++)
                if (live[i][k] != (unsigned char)(len[i] + k)) {
                    atomic_fetch_add(&corrupt, 1);
                    break;
                }
            free(live[i]);
        }
        len[i] = 16 + (size_t)(x >> 32) % 512;
        live[i] = malloc(len[i]);
        int one = 1;
        if (atomic_load_explicit(&session, memory_order_relaxed) == 1 &&
            atomic_compare_exchange_strong(&session, &one, 2))
            atomic_store(&first_ns, now_ns());
        for (size_t k = 0; k < len[i]; k++)
            live[i][k] = (unsigned char)(len[i] + k);
        atomic_fetch_add_explicit(&blocks, 1, memory_order_relaxed);
        if (idle || (steady && i == 0)) {
            struct timespec ts = {0, idle ? 5000000 : 1000000};
            clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
        }
    }
    for (unsigned i = 0; i < LIVE; i++)
        free(live[i]);
    return NULL;
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

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "busy";
    int n = argc > 2 ? atoi(argv[2]) : 1;
    if (n < 1 || n > 64)
        n = 1;
    pthread_t t[64];
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, alloc_main, (void *)(uintptr_t)(i + 1));
    printf("ready\n");
    fflush(stdout);
    bool on = false;
    for (;;) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 1) == 1) {
            char b[64];
            if (read(0, b, sizeof(b)) <= 0)
                break;
        }
        bool ring = has_ring();
        if (ring && !on)
            atomic_store(&session, 1);
        if (!ring && on) {
            printf("unsampled\n");
            fflush(stdout);
        }
        on = ring;
        if (atomic_load(&session) == 2) {
            atomic_store(&session, 0);
            printf("sampled %llu\n", (unsigned long long)atomic_load(&first_ns));
            fflush(stdout);
        }
    }
    atomic_store(&stop, true);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("blocks %llu corrupt %llu\ndone\n", (unsigned long long)atomic_load(&blocks),
           (unsigned long long)atomic_load(&corrupt));
    return atomic_load(&corrupt) ? 1 : 0;
}
