/* tests/programs/dlloop.c: loads and unloads two libraries in turn (dlopen, allocate,
 * dlclose), so that one is often mapped where the other was just unloaded, and prints
 * its ground truth per allocating function (see three_sites.c for the format).
 *
 * Usage: dlloop LIB_A LIB_B ROUNDS
 * Each round loads LIB_A or LIB_B (alternately), calls its dlloop_alloc_{a,b} 200 times
 * for 1000 bytes (with a pause of 100 ms halfway, for a profiler to learn the library's
 * frames), frees every other block, keeps the rest until the end of the run, and unloads
 * the library. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PER_ROUND 200

struct truth {
    unsigned long long alloc_bytes, alloc_count, free_bytes, free_count;
};

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: dlloop LIB_A LIB_B ROUNDS\n");
        return 2;
    }
    int rounds = atoi(argv[3]);
    struct truth t[2] = {{0}};
    void **keep = calloc((size_t)rounds * PER_ROUND, sizeof(void *));
    size_t kept = 0;
    for (int r = 0; r < rounds; r++) {
        int v = r % 2;
        void *h = dlopen(argv[1 + v], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlloop: %s\n", dlerror());
            return 1;
        }
        void *(*fn)(size_t) =
            (void *(*)(size_t))(uintptr_t)dlsym(h, v ? "dlloop_alloc_b" : "dlloop_alloc_a");
        if (!fn) {
            fprintf(stderr, "dlloop: %s\n", dlerror());
            return 1;
        }
        for (int i = 0; i < PER_ROUND; i++) {
            if (i == PER_ROUND / 2) {
                struct timespec ts = {0, 100 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            void *p = fn(1000);
            t[v].alloc_bytes += 1000;
            t[v].alloc_count++;
            if (i % 2) {
                free(p);
                t[v].free_bytes += 1000;
                t[v].free_count++;
            } else {
                keep[kept++] = p;
            }
        }
        dlclose(h);
    }
    printf("truth dlloop_alloc_a %llu %llu %llu %llu\n", t[0].alloc_bytes, t[0].alloc_count,
           t[0].free_bytes, t[0].free_count);
    printf("truth dlloop_alloc_b %llu %llu %llu %llu\n", t[1].alloc_bytes, t[1].alloc_count,
           t[1].free_bytes, t[1].free_count);
    fflush(stdout);
    return kept > 0 ? 0 : 1;
}
