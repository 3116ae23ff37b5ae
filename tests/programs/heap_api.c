/* tests/programs/heap_api.c: a program with two heaps of its own, reported through the heap
 * API (preload/include/heapprof.h), beside some malloc() (tests/e2e/test_heap_api.c).
 *
 *     heap_api [dynamic] [serve]
 *
 * Registers "arena.small" and "arena.big", then does one round of work:
 *   arena_small_site()   SMALL_N blocks of SMALL_SIZE bytes on arena.small, the first
 *                        SMALL_FREED of them freed;
 *   arena_big_site()     BIG_N blocks of BIG_SIZE bytes on arena.big, BIG_FREED freed;
 *   self_sampled_site()  SELF_N blocks of SELF_SIZE bytes on arena.big reported as samples
 *                        that stand for SELF_WEIGHT bytes each (heapprof_report_sample);
 *   malloc_site()        MALLOC_N malloc() blocks of MALLOC_SIZE bytes, kept.
 * It prints "heaps SMALL BIG" (the ids; 0 0 without the library) and "sampled N" (the
 * reports heapprof said it recorded), then exits 0.
 *
 *     heap_api shared
 *
 * Registers both heaps, then shared_site() reports SHARED_N blocks to each from one call
 * (the same stack for both heaps: SHARED_SMALL bytes each on arena.small, SHARED_BIG on
 * arena.big), half of them freed, prints "shared done" and stays 300 ms for the dumps of
 * a session with --continuous-dump to see them more than once.
 *
 * The calls are found through weak symbols (the library preloaded, or absent), or with
 * `dynamic` at run time (heapprof_api_load(): also a library injected by heapprof attach),
 * looked for again before each round while not found. With `serve` it registers the heaps
 * first when it can, prints "ready",
 * does a round for each line on stdin ("round done" after it), says "attached" when a
 * session's ring appears in its maps, and exits at EOF. */
#define HEAPPROF_WEAK
#define HEAPPROF_DYNAMIC
#include "heapprof.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SMALL_N 100
#define SMALL_SIZE 48
#define SMALL_FREED 40
#define BIG_N 20
#define BIG_SIZE 4096
#define BIG_FREED 5
#define SELF_N 3
#define SELF_SIZE 100
#define SELF_WEIGHT 1000
#define MALLOC_N 10
#define MALLOC_SIZE 200
#define SHARED_N 10
#define SHARED_SMALL 32
#define SHARED_BIG 1024

void arena_small_site(void);
void arena_big_site(void);
void self_sampled_site(void);
void malloc_site(void);
void shared_site(void);

static struct heapprof_api api;
static uint32_t small_heap, big_heap;
static unsigned sampled;

/* A bump arena: a block's id is its address. Never reused, so ids stay unique. */
static _Alignas(16) char arena_mem[4u << 20];
static size_t arena_used;

static bool resolve(bool dynamic)
{
    if (dynamic)
        return heapprof_api_load(&api);
    if (!heapprof_register_heap)
        return false;
    api = (struct heapprof_api){heapprof_register_heap, heapprof_report_allocation,
                                heapprof_report_free, heapprof_report_sample};
    return true;
}

__attribute__((noinline)) static void *arena_alloc(uint32_t heap, size_t n)
{
    if (arena_used + n > sizeof(arena_mem))
        abort();
    void *p = arena_mem + arena_used;
    arena_used += (n + 15) & ~(size_t)15;
    if (heap && api.report_allocation(heap, (uintptr_t)p, n))
        sampled++;
    return p;
}

__attribute__((noinline)) static void arena_free(uint32_t heap, void *p)
{
    if (heap)
        api.report_free(heap, (uintptr_t)p);
}

__attribute__((noinline)) void arena_small_site(void)
{
    void *b[SMALL_N];
    for (int i = 0; i < SMALL_N; i++)
        b[i] = arena_alloc(small_heap, SMALL_SIZE);
    for (int i = 0; i < SMALL_FREED; i++)
        arena_free(small_heap, b[i]);
}

__attribute__((noinline)) void arena_big_site(void)
{
    void *b[BIG_N];
    for (int i = 0; i < BIG_N; i++)
        b[i] = arena_alloc(big_heap, BIG_SIZE);
    for (int i = 0; i < BIG_FREED; i++)
        arena_free(big_heap, b[i]);
}

__attribute__((noinline)) void self_sampled_site(void)
{
    for (int i = 0; i < SELF_N; i++) {
        void *p = arena_mem + arena_used;
        arena_used += SELF_SIZE + 12; /* 16-aligned */
        if (big_heap && api.report_sample(big_heap, (uintptr_t)p, SELF_SIZE, SELF_WEIGHT))
            sampled++;
    }
}

static void *volatile keep[64];
static unsigned kept;

__attribute__((noinline)) void malloc_site(void)
{
    for (int i = 0; i < MALLOC_N; i++) {
        keep[kept % 64] = malloc(MALLOC_SIZE);
        kept++;
    }
}

/* Both heaps' blocks from one call of arena_alloc(), whose stack is thus the same. */
__attribute__((noinline)) void shared_site(void)
{
    void *b[2 * SHARED_N];
    uint32_t heaps[2] = {small_heap, big_heap};
    for (int i = 0; i < 2 * SHARED_N; i++)
        b[i] = arena_alloc(heaps[i % 2], i % 2 ? SHARED_BIG : SHARED_SMALL);
    for (int i = 0; i < SHARED_N; i++)
        arena_free(heaps[i % 2], b[i]);
}

static void round_of_work(bool dynamic)
{
    if (!small_heap && resolve(dynamic)) {
        small_heap = api.register_heap("arena.small");
        big_heap = api.register_heap("arena.big");
    }
    sampled = 0;
    arena_small_site();
    arena_big_site();
    self_sampled_site();
    malloc_site();
    printf("heaps %u %u\nsampled %u\n", small_heap, big_heap, sampled);
    fflush(stdout);
}

static bool has_ring(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool r = false;
    while (f && !r && fgets(line, sizeof(line), f))
        r = strstr(line, "heapprof-ring") != NULL;
    if (f)
        fclose(f);
    return r;
}

int main(int argc, char **argv)
{
    bool dynamic = false, serve = false;
    for (int i = 1; i < argc; i++) {
        dynamic |= !strcmp(argv[i], "dynamic");
        serve |= !strcmp(argv[i], "serve");
        if (!strcmp(argv[i], "shared")) {
            if (resolve(false)) {
                small_heap = api.register_heap("arena.small");
                big_heap = api.register_heap("arena.big");
            }
            shared_site();
            printf("shared done\n");
            fflush(stdout);
            usleep(300000);
            return 0;
        }
    }
    if (!serve) {
        round_of_work(dynamic);
        return 0;
    }
    /* Heaps registered before any session, when the library is there already. */
    if (resolve(dynamic)) {
        small_heap = api.register_heap("arena.small");
        big_heap = api.register_heap("arena.big");
    }
    printf("ready\n");
    fflush(stdout);
    bool ring = false;
    for (;;) {
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        int r = poll(&pfd, 1, 5);
        bool now = has_ring();
        if (now && !ring) {
            printf("attached\n");
            fflush(stdout);
        }
        ring = now;
        if (r <= 0)
            continue;
        char line[64];
        ssize_t n = read(0, line, sizeof(line));
        if (n <= 0)
            break;
        round_of_work(dynamic);
        printf("round done\n");
        fflush(stdout);
    }
    printf("done\n");
    return 0;
}
