/* tests/programs/many_sites.c: one allocation at each of 2^BITS distinct call stacks, for
 * dumps of many call sites (tests/e2e/test_producer.c, scripts/bench/bench_html.sh,
 * scripts/bench/bench_http.sh).
 *   many_sites BITS [COUNT] [hold]   (COUNT: only the first COUNT sites; default all;
 *                                     hold: keep the blocks and wait to be killed)
 * The stacks are the paths of a binary recursion BITS deep through two functions
 * (left/right, chosen by the bits of the site's number); each site allocates 100 bytes
 * and every other one is freed. Prints "sites N"; with "hold", then waits for a signal,
 * its allocations still live. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define BARRIER() __asm__ volatile("" ::: "memory")

static void *volatile keep;

void site_left(unsigned n, unsigned depth);
void site_right(unsigned n, unsigned depth);

static NOINLINE void leaf(unsigned n)
{
    void *p = malloc(100);
    BARRIER();
    if (n % 2)
        free(p);
    else
        keep = p;
}

static NOINLINE void step(unsigned n, unsigned depth)
{
    if (depth == 0)
        leaf(n);
    else if (n >> (depth - 1) & 1)
        site_right(n, depth - 1);
    else
        site_left(n, depth - 1);
    BARRIER(); /* not a tail call: every level stays on the stack */
}

NOINLINE void site_left(unsigned n, unsigned depth)
{
    step(n, depth);
    BARRIER();
}

NOINLINE void site_right(unsigned n, unsigned depth)
{
    step(n, depth);
    BARRIER();
}

int main(int argc, char **argv)
{
    unsigned bits = argc > 1 ? (unsigned)atoi(argv[1]) : 10;
    if (bits > 24)
        bits = 24;
    int a = 2;
    unsigned count =
        argc > a && strcmp(argv[a], "hold") != 0 ? (unsigned)atoi(argv[a++]) : 1u << bits;
    bool hold = argc > a && strcmp(argv[a], "hold") == 0;
    if (count > 1u << bits)
        count = 1u << bits;
    for (unsigned n = 0; n < count; n++)
        step(n, bits);
    printf("sites %u\n", count);
    fflush(stdout);
    if (hold)
        for (;;)
            pause();
    return 0;
}
