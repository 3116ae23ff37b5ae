/* tests/programs/harm/fibers.c: allocations on stacks that are not the thread's own,
 * written the way coroutine code is (issue 15, case 4).
 *
 * 1. Two ucontext fibers with guard-paged stacks take turns allocating with the main
 *    thread (swapcontext back and forth).
 * 2. The safety review's A4 case: in a new thread, whose first allocation big enough to
 *    be sampled runs on a 256 KiB fiber stack; that stack is unmapped and a 32 KiB one
 *    is mapped at the same address (MAP_FIXED), and the fiber runs again there, deeper
 *    into the old range than the new one reaches.
 *
 * Prints a checksum of what the fibers computed; exits 0. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define PAGE 4096

static ucontext_t main_ctx, fiber_ctx[2];
static unsigned long sums[2];

/* Allocations big enough to be sampled at the default interval, and small ones. */
static __attribute__((noinline)) unsigned long fiber_work(int id, int rounds)
{
    unsigned long s = 0;
    for (int i = 0; i < rounds; i++) {
        size_t n = (i % 3 == 0) ? 8192 + (size_t)i : 64 + (size_t)i;
        unsigned char *p = malloc(n);
        if (!p)
            abort();
        memset(p, id + i, n);
        s += p[n / 2];
        free(p);
    }
    return s;
}

static void fiber_main(int id)
{
    for (int r = 0; r < 50; r++) {
        sums[id] += fiber_work(id, 20);
        swapcontext(&fiber_ctx[id], &main_ctx);
    }
}

/* A stack with a guard page below it, as coroutine libraries allocate them. */
static void *guarded_stack(size_t size)
{
    char *m = mmap(NULL, size + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, PAGE, PROT_NONE) != 0)
        abort();
    return m + PAGE;
}

static __attribute__((noinline)) void make_fiber(int id, size_t size)
{
    void *stack = guarded_stack(size);
    getcontext(&fiber_ctx[id]);
    fiber_ctx[id].uc_stack.ss_sp = stack;
    fiber_ctx[id].uc_stack.ss_size = size;
    fiber_ctx[id].uc_link = &main_ctx;
    makecontext(&fiber_ctx[id], (void (*)(void))fiber_main, 1, id);
}

static void take_turns(void)
{
    make_fiber(0, 256u << 10);
    make_fiber(1, 64u << 10);
    unsigned long own = 0;
    for (int r = 0; r < 50; r++) {
        for (int id = 0; id < 2; id++)
            swapcontext(&main_ctx, &fiber_ctx[id]);
        own += fiber_work(2, 5);
    }
    printf("turns: %lu %lu %lu\n", sums[0], sums[1], own);
}

/* ---- A4: a fiber stack unmapped and replaced by a smaller one ------------------------ */

static ucontext_t a4_main, a4_fiber;
static unsigned long a4_sum;

/* Recursion, so that the fiber's frames reach down into the stack it runs on. */
static __attribute__((noinline)) unsigned long a4_deeper(int depth)
{
    volatile char pad[512];
    pad[0] = (char)depth;
    if (depth > 0)
        return a4_deeper(depth - 1) + (unsigned long)pad[0];
    return fiber_work(3, 6);
}

static void a4_fiber_main(int depth)
{
    a4_sum += a4_deeper(depth);
}

static void a4_run(void *stack, size_t size, int depth)
{
    getcontext(&a4_fiber);
    a4_fiber.uc_stack.ss_sp = stack;
    a4_fiber.uc_stack.ss_size = size;
    a4_fiber.uc_link = &a4_main;
    makecontext(&a4_fiber, (void (*)(void))a4_fiber_main, 1, depth);
    swapcontext(&a4_main, &a4_fiber);
}

static void *a4_thread(void *arg)
{
    (void)arg;
    const size_t big = 256u << 10, small = 32u << 10;
    char *x = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (x == MAP_FAILED)
        abort();
    a4_run(x, big, 100); /* this thread's first sampled allocation */
    if (munmap(x, big) != 0)
        abort();
    char *y =
        mmap(x, small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (y != x)
        abort();
    a4_run(y, small, 20);
    a4_run(y, small, 40);
    munmap(y, small);
    return NULL;
}

int main(void)
{
    take_turns();
    pthread_t t;
    if (pthread_create(&t, NULL, a4_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 1;
    printf("replaced: %lu\n", a4_sum);
    return 0;
}
