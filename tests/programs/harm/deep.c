/* tests/programs/harm/deep.c: allocations at the bottom of a deep recursion, over 64 KiB
 * of stack in 300 frames (issue 15, case 5: stacks deeper than the old copy cap). The
 * stacks must come out whole, from deep_alloc to main.
 *
 * Usage: deep [ROUNDS]. Prints a checksum; exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH 300

static __attribute__((noinline)) unsigned long deep_alloc(int round)
{
    size_t n = 1000 + (size_t)(round % 7) * 1000;
    unsigned char *p = malloc(n);
    if (!p)
        abort();
    memset(p, round, n);
    unsigned long s = p[n / 2];
    free(p);
    return s;
}

/* About 256 bytes of frame each, kept by the volatile array and the non-tail call. */
static __attribute__((noinline)) unsigned long deep_recurse(int depth, int round)
{
    volatile unsigned char pad[224];
    pad[depth % 224] = (unsigned char)depth;
    unsigned long s;
    if (depth == 0) {
        s = 0;
        for (int i = 0; i < 8; i++)
            s += deep_alloc(round + i);
    } else {
        s = deep_recurse(depth - 1, round);
    }
    __asm__ volatile("" ::: "memory");
    return s + pad[depth % 224];
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    unsigned long s = 0;
    for (int r = 0; r < rounds; r++)
        s += deep_recurse(DEPTH, r);
    printf("deep: %lu\n", s);
    return 0;
}
