/* tests/programs/worker.c: a long-running program for daemon and attach tests.
 *   worker MODE DURATION_MS
 * MODE "busy": allocates and frees in a tight loop (keeping a little); "idle": sleeps,
 * allocating one leaked block every 100 ms. Prints "truth worker_leak <bytes> <count> 0 0"
 * and "done" at the end; exits 0. A line "ready <pid>" is printed at the start. MODE
 * "hold": leaks 10 blocks of 1000 bytes at once and frees 5 of 500 bytes (fewer than a
 * batch of frees holds, preload/client.h), prints their truth lines and "leaked", then
 * sleeps for DURATION (allocating nothing more). Built a second time as worker_tls,
 * with a thread-local variable in the executable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *worker_leak(size_t n);
void *worker_churn(size_t n);

NOINLINE void *worker_leak(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

#ifdef WORKER_TLS
/* As Rust's standard library and C++ thread_local have: attaching once killed such
 * programs (the attach thread made glibc read the executable's TLS). */
static __thread unsigned long worker_tls_calls;
#endif

NOINLINE void *worker_churn(size_t n)
{
#ifdef WORKER_TLS
    worker_tls_calls++;
#endif
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "busy";
    long duration = argc > 2 ? atol(argv[2]) : 1000;
    unsigned long long leak_bytes = 0, leak_count = 0;
    static void *volatile keep;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (!strcmp(mode, "hold")) {
        for (int k = 0; k < 10; k++)
            keep = worker_leak(1000);
        void *freed[5];
        for (int k = 0; k < 5; k++)
            freed[k] = worker_churn(500);
        for (int k = 0; k < 5; k++)
            free(freed[k]);
        printf("truth worker_leak 10000 10 0 0\ntruth worker_churn 2500 5 2500 5\nleaked\n");
        fflush(stdout);
        usleep((useconds_t)duration * 1000);
        printf("done\n");
        return 0;
    }
    long long end = now_ms() + duration;
    unsigned i = 0;
    while (now_ms() < end) {
        if (!strcmp(mode, "idle")) {
            keep = worker_leak(1000);
            leak_bytes += 1000;
            leak_count++;
            usleep(100 * 1000);
            continue;
        }
        for (int k = 0; k < 1000; k++) {
            void *p = worker_churn(64 + (i++ % 2000));
            memset(p, 1, 8);
            free(p);
        }
        keep = worker_leak(2000);
        leak_bytes += 2000;
        leak_count++;
    }
    (void)keep;
    printf("truth worker_leak %llu %llu 0 0\ndone\n", leak_bytes, leak_count);
    return 0;
}
