/* tests/programs/reuse_threads.c: ground truth for the order of frees and reuses of one
 * address in different threads (tests/e2e/test_accuracy.c, at interval 1).
 *
 *     reuse_threads [ITERATIONS [THREADS]]
 *
 * THREADS threads (default 8, at most 16), each ITERATIONS times (default 20000): allocate
 * a block of 16..271 bytes in reuse_alloc (every 8th with calloc in reuse_calloc), swap it
 * into a random one of 64 shared slots and free the block it takes out, which another
 * thread allocated most of the time. glibc puts a block freed by a thread in that thread's
 * cache, whose next allocation of the size gets the address back: the same address is
 * freed in one thread and allocated again in another all the time, the two records written
 * by different threads a few hundred nanoseconds apart. At the end the main thread frees
 * the blocks of the even slots and keeps the others (unreleased on purpose), then prints
 * per function "truth NAME alloc_bytes alloc_count free_bytes free_count" (a block's bytes
 * are counted to the function that allocated it, wherever it is freed).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
#define MAX_THREADS 16

enum { SITE_MALLOC, SITE_CALLOC, N_SITES };

struct block {
    uint32_t size;
    uint32_t site;
};

struct counts {
    _Atomic uint64_t alloc_bytes, alloc_count, free_bytes, free_count;
};

static struct counts g_truth[N_SITES];
static _Atomic(struct block *) g_slots[SLOTS];
static long g_iterations = 20000;

__attribute__((noinline)) static struct block *reuse_alloc(size_t size)
{
    struct block *b = malloc(size);
    if (!b)
        abort();
    return b;
}

__attribute__((noinline)) static struct block *reuse_calloc(size_t size)
{
    struct block *b = calloc(1, size);
    if (!b)
        abort();
    return b;
}

static void count(struct counts *c, uint64_t bytes, bool freed)
{
    atomic_fetch_add(freed ? &c->free_bytes : &c->alloc_bytes, bytes);
    atomic_fetch_add(freed ? &c->free_count : &c->alloc_count, 1);
}

static void drop(struct block *b)
{
    if (!b)
        return;
    count(&g_truth[b->site], b->size, true);
    free(b);
}

static void *worker(void *arg)
{
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 77;
    for (long i = 0; i < g_iterations; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t size = 16 + (x >> 40) % 256;
        uint32_t site = i % 8 == 0 ? SITE_CALLOC : SITE_MALLOC;
        struct block *b = site == SITE_CALLOC ? reuse_calloc(size) : reuse_alloc(size);
        b->size = (uint32_t)size;
        b->site = site;
        count(&g_truth[site], size, false);
        drop(atomic_exchange(&g_slots[x % SLOTS], b));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 8;
    if (argc > 1)
        g_iterations = atol(argv[1]);
    if (argc > 2)
        threads = atoi(argv[2]);
    if (threads < 1 || threads > MAX_THREADS || g_iterations < 1)
        return 2;
    pthread_t th[MAX_THREADS];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1)) != 0)
            return 1;
    for (int i = 0; i < threads; i++)
        (void)pthread_join(th[i], NULL);
    for (int k = 0; k < SLOTS; k += 2)
        drop(atomic_exchange(&g_slots[k], NULL));
    static const char *const names[N_SITES] = {"reuse_alloc", "reuse_calloc"};
    for (int s = 0; s < N_SITES; s++)
        printf(
            "truth %s %llu %llu %llu %llu\n", names[s], (unsigned long long)g_truth[s].alloc_bytes,
            (unsigned long long)g_truth[s].alloc_count, (unsigned long long)g_truth[s].free_bytes,
            (unsigned long long)g_truth[s].free_count);
    fflush(stdout);
    return 0;
}
