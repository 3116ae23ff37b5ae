/* tests/preload/attach_prog.c: a long-running program driven by one-byte commands on
 * stdin, run under LD_PRELOAD=libheapprof.so by tests/preload/test_attach.c. Prints
 * "ready" at start and one line per command:
 *   a  100 malloc(1000) (each frees the block allocated 100 calls before), "a"
 *   f  fork; the child makes 50 malloc(5000)/free pairs and exits 0: "f <pid> <status>"
 *   v  vfork; the child allocates and frees once, then _exit(0): "v <status>"
 *   b  start 2 threads churning malloc/free with random sizes until q: "b"
 *   q  stop the threads, "done <allocations made>", exit 0
 * Idle (blocked in read) between commands.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *blocks[100];
static unsigned next_block;
static _Atomic bool stop;
static _Atomic uint64_t made;

static void say(const char *s)
{
    size_t n = strlen(s);
    if (write(1, s, n) != (ssize_t)n)
        _exit(5);
}

static void *churn(void *arg)
{
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    void *keep[64] = {0};
    while (!atomic_load(&stop)) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        unsigned i = x % 64;
        free(keep[i]);
        keep[i] = malloc(1 + (x >> 20) % 8192);
        if (!keep[i])
            _exit(6);
        atomic_fetch_add(&made, 1);
    }
    for (unsigned i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

/* The child allocates in the parent's memory, on the parent's thread state. */
static __attribute__((noinline)) int do_vfork(void)
{
    pid_t pid = vfork();
    if (pid == 0) {
        void *volatile p = malloc(3000);
        free(p);
        _exit(0);
    }
    int st = -1;
    (void)waitpid(pid, &st, 0);
    return st;
}

int main(void)
{
    pthread_t th[2];
    int nthreads = 0;
    char line[128];

    say("ready\n");
    for (;;) {
        char c;
        ssize_t n = read(0, &c, 1);
        if (n <= 0)
            return 4;
        switch (c) {
        case 'a':
            for (int i = 0; i < 100; i++) {
                unsigned k = next_block++ % 100;
                free(blocks[k]);
                blocks[k] = malloc(1000);
                if (!blocks[k])
                    return 3;
                atomic_fetch_add(&made, 1);
            }
            say("a\n");
            break;
        case 'f': {
            pid_t pid = fork();
            if (pid == 0) {
                for (int i = 0; i < 50; i++) {
                    void *volatile p = malloc(5000);
                    free(p);
                }
                _exit(0);
            }
            int st = -1;
            (void)waitpid(pid, &st, 0);
            snprintf(line, sizeof(line), "f %d %d\n", (int)pid, st);
            say(line);
            break;
        }
        case 'v':
            snprintf(line, sizeof(line), "v %d\n", do_vfork());
            say(line);
            break;
        case 'b':
            for (; nthreads < 2; nthreads++)
                if (pthread_create(&th[nthreads], NULL, churn, (void *)(uintptr_t)(nthreads + 1)))
                    return 7;
            say("b\n");
            break;
        case 'q':
            atomic_store(&stop, true);
            for (int i = 0; i < nthreads; i++)
                (void)pthread_join(th[i], NULL);
            snprintf(line, sizeof(line), "done %llu\n", (unsigned long long)atomic_load(&made));
            say(line);
            return 0;
        default:
            break;
        }
    }
}
