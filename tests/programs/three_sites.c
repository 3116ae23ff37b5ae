/* tests/programs/three_sites.c: three distinct allocation paths with known totals.
 * Prints its ground truth as lines "truth <function> <alloc_bytes> <alloc_count>
 * <free_bytes> <free_count>" so tests compare the profile with it.
 * Usage: three_sites [scale] [exit_code] [hold]
 * With "hold" it waits for a signal after printing, its allocations still live (for
 * tests that look at a running process's profile). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define BARRIER() __asm__ volatile("" ::: "memory")

static void *volatile sink;

/* Not static: their names must appear in the profile's stacks. */
void *alloc_leaked(size_t n);
void *alloc_freed(size_t n);
void *alloc_half(size_t n);

NOINLINE void *alloc_leaked(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *alloc_freed(size_t n)
{
    void *p = calloc(1, n);
    BARRIER();
    return p;
}

NOINLINE void *alloc_half(size_t n)
{
    void *p = malloc(n / 2);
    BARRIER();
    void *q = realloc(p, n); /* realloc's new block is attributed here too */
    BARRIER();
    return q;
}

struct truth {
    const char *name;
    unsigned long long alloc_bytes, alloc_count, free_bytes, free_count;
};

int main(int argc, char **argv)
{
    int scale = argc > 1 ? atoi(argv[1]) : 1;
    int code = argc > 2 ? atoi(argv[2]) : 0;
    if (scale < 1)
        scale = 1;
    struct truth t[3] = {
        {"alloc_leaked", 0, 0, 0, 0}, {"alloc_freed", 0, 0, 0, 0}, {"alloc_half", 0, 0, 0, 0}};

    int n_leak = 2000 * scale, n_freed = 3000 * scale, n_half = 4000 * scale;
    void **keep = malloc(sizeof(void *) * (size_t)n_half);
    for (int i = 0; i < n_leak; i++) {
        sink = alloc_leaked(3000);
        t[0].alloc_bytes += 3000;
        t[0].alloc_count++;
    }
    for (int i = 0; i < n_freed; i++) {
        void *p = alloc_freed(2000);
        memset(p, 1, 2000);
        free(p);
        t[1].alloc_bytes += 2000;
        t[1].alloc_count++;
        t[1].free_bytes += 2000;
        t[1].free_count++;
    }
    for (int i = 0; i < n_half; i++) {
        keep[i] = alloc_half(1000);
        /* the malloc(500) inside was freed by realloc, on this same path */
        t[2].alloc_bytes += 500 + 1000;
        t[2].alloc_count += 2;
        t[2].free_bytes += 500;
        t[2].free_count++;
    }
    for (int i = 0; i < n_half; i += 2) {
        free(keep[i]);
        t[2].free_bytes += 1000;
        t[2].free_count++;
    }
    for (int i = 0; i < 3; i++)
        printf("truth %s %llu %llu %llu %llu\n", t[i].name, t[i].alloc_bytes, t[i].alloc_count,
               t[i].free_bytes, t[i].free_count);
    fflush(stdout);
    if (argc > 3 && strcmp(argv[3], "hold") == 0)
        for (;;)
            pause();
    return code;
}
