/* tests/programs/inject_busy.c: a program with no idle thread, for the injection's safe
 * point (tests/e2e/test_inject_safe.c). Started without libheapprof.so. Every thread
 * (main and argv[1] more, default 1) allocates, fills, checks and frees blocks of random
 * sizes without pause, half of them through aligned_alloc (which reaches glibc's
 * allocator by a tail jump, with no exported frame on the stack). Prints "ready" once
 * running; exits 0 when its stdin ends, 3 when a block does not hold its fill. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 128

static atomic_bool stop;

static void check_free(unsigned char *p, size_t n, unsigned char fill)
{
    for (size_t i = 0; i < n; i += 61)
        if (p[i] != fill) {
            fprintf(stderr, "inject_busy: block %p lost its fill at %zu\n", (void *)p, i);
            _exit(3);
        }
    free(p);
}

/* Stdin ended? Looked at without waiting: no thread of ours ever sleeps. */
static bool stdin_ended(void)
{
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    char buf[64];
    return poll(&pfd, 1, 0) == 1 && read(0, buf, sizeof(buf)) <= 0;
}

static void *work(void *arg)
{
    unsigned s = (unsigned)(uintptr_t)arg * 7919u + 1u;
    unsigned char *p[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    for (unsigned long k = 0; !atomic_load_explicit(&stop, memory_order_relaxed); k++) {
        if (arg == NULL && k % 4096 == 0 && stdin_ended())
            atomic_store(&stop, true);
        s = s * 1103515245u + 12345u;
        unsigned i = (s >> 8) % SLOTS;
        if (p[i])
            check_free(p[i], len[i], (unsigned char)i);
        size_t n = 16 + (s >> 12) % 4000;
        if (s & 1) {
            n = (n + 63) & ~(size_t)63;
            p[i] = aligned_alloc(64, n);
        } else {
            p[i] = malloc(n);
        }
        if (!p[i])
            _exit(4);
        len[i] = n;
        memset(p[i], (int)i, n);
    }
    for (unsigned i = 0; i < SLOTS; i++)
        if (p[i])
            check_free(p[i], len[i], (unsigned char)i);
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    pthread_t t[16];
    if (n < 0 || n > 16)
        return 2;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, work, (void *)(uintptr_t)(i + 1)) != 0)
            return 2;
    printf("ready\n");
    fflush(stdout);
    work((void *)0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    return 0;
}
