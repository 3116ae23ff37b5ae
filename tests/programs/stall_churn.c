/* tests/programs/stall_churn.c: a ground-truth program for a stalled service
 * (tests/e2e/test_stall.c). Everything it allocates in its loops is freed before it
 * exits, so a profile that shows any of it unreleased shows a phantom leak.
 *
 * Usage: stall_churn GO1 GO2 N_AFTER WINDOW
 * Keeps the last WINDOW blocks (freeing the oldest for each new one, as a rolling cache
 * does), allocated
 *   phase 1: from stall_before() (32-112 bytes) until the file GO1 exists;
 *   phase 2: from stall_during() (200-440 bytes) until the file GO2 exists;
 *   phase 3: N_AFTER times from stall_after() (520-760 bytes);
 * then frees the window and prints "before N", "during N" and "after N". Each phase's
 * sizes differ, and phase 1's are glibc's fast bins, which the larger requests of the
 * later phases never consolidate: an address of phase 1 is not reused later, so a free
 * of phase 1 lost in phase 2 is not undone by a later allocation at its address (as in
 * a program whose later blocks differ in size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *stall_before(size_t n);
void *stall_during(size_t n);
void *stall_after(size_t n);

NOINLINE void *stall_before(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

NOINLINE void *stall_during(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

NOINLINE void *stall_after(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

/* Replaces the oldest block of @keep (@window of them) with one from @fn. */
static void churn(void **keep, long window, long i, void *(*fn)(size_t), size_t base, size_t n)
{
    free(keep[i % window]);
    keep[i % window] = fn(base + (size_t)(i % (long)n) * 16);
}

int main(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    const char *go1 = argv[1], *go2 = argv[2];
    long n_after = atol(argv[3]);
    long window = atol(argv[4]);
    void **keep = calloc((size_t)window, sizeof(*keep));
    if (!keep)
        return 1;
    long i = 0, before = 0, during = 0;
    for (; (i & 1023) != 0 || access(go1, F_OK) != 0; i++, before++)
        churn(keep, window, i, stall_before, 32, 6);
    for (; (i & 1023) != 0 || access(go2, F_OK) != 0; i++, during++)
        churn(keep, window, i, stall_during, 200, 16);
    for (long k = 0; k < n_after; k++, i++)
        churn(keep, window, i, stall_after, 520, 16);
    for (long k = 0; k < window; k++)
        free(keep[k]);
    free(keep);
    printf("before %ld\nduring %ld\nafter %ld\n", before, during, n_after);
    return 0;
}
