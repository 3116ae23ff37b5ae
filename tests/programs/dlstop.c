/* tests/programs/dlstop.c: a library loaded, used and unloaded while the profiler's
 * service does not read (tests/e2e/test_faults.c stops it): dlclose() must return at
 * once, and the library's samples must still be named once the service reads them.
 *
 * Usage: dlstop LIB READY_FILE GO_FILE
 * Loads LIB (a dlloop library: tests/programs/dlloop_lib.c), calls its allocating
 * function 100 times, creates READY_FILE, waits for GO_FILE (the service is stopped by
 * then), calls it 100 more times, unloads LIB (timed), allocates a little more, and
 * prints "dlclose_us N" and its ground truth per allocating function (three_sites.c's
 * format). Exits 0, or 1 on a setup error. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 1;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlstop: %s\n", dlerror());
        return 1;
    }
    void *(*fn)(size_t) = (void *(*)(size_t))(uintptr_t)dlsym(h, "dlloop_alloc_a");
    if (!fn)
        return 1;
    unsigned long long count = 0;
    for (int i = 0; i < 100; i++, count++)
        free(fn(1000));
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return 1;
    close(fd);
    for (int i = 0; access(argv[3], F_OK) != 0; i++) {
        if (i > 30000)
            return 1;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    for (int i = 0; i < 100; i++, count++)
        free(fn(1000));
    uint64_t t0 = now_us();
    if (dlclose(h) != 0)
        return 1;
    uint64_t t1 = now_us();
    /* Samples after the unload: the library's going is noticed on the sampled path. */
    for (int i = 0; i < 10; i++)
        free(malloc(100));
    printf("dlclose_us %llu\n", (unsigned long long)(t1 - t0));
    printf("truth dlloop_alloc_a %llu %llu %llu %llu\n", count * 1000, count, count * 1000, count);
    fflush(stdout);
    return 0;
}
