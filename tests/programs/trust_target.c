/* tests/programs/trust_target.c: programs an attach, or a peer posing as the service,
 * must leave alone (tests/e2e/test_attach_trust.c). Each prints "ready", allocates and
 * checks what it allocated, treats any surprise as fatal (a message, exit 1), and ends
 * at EOF on stdin with "done" (stdout is the same for every run; pids go to stderr):
 *
 *   alloc     allocates through trust_target_alloc() every millisecond.
 *   rawfork   two threads allocate and check their blocks; the main thread makes children
 *             without glibc's fork(), so without atfork handlers: _Fork() and
 *             syscall(SYS_clone, SIGCHLD) in turn, every few milliseconds. Each child
 *             allocates and checks (trust_child_alloc()), sometimes makes a child the
 *             same way, and exits 0. A line "k" on stdin makes one kept child of each
 *             kind, which prints "kept PID" on stderr and allocates until stdin's EOF.
 *             Prints how many children did not exit 0.
 *
 * Children of a multi-threaded process made without fork() may call only what no other
 * thread could hold a lock of: the main thread's arena is its own (the threads have
 * theirs), and only the main thread uses stdio. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;
static atomic_bool stopping;

static void fatal(const char *what, int err)
{
    printf("FATAL: %s: %s\n", what, strerror(err));
    fflush(stdout);
    _exit(1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Allocates @n blocks of sizes from @seed, fills, checks and frees them. */
static void alloc_check(unsigned n, unsigned seed)
{
    void *blocks[64];
    size_t sizes[64];
    if (n > 64)
        n = 64;
    for (unsigned i = 0; i < n; i++) {
        sizes[i] = 16 + (seed * 2654435761u + i * 40503u) % 5000;
        blocks[i] = malloc(sizes[i]);
        if (!blocks[i])
            fatal("malloc", ENOMEM);
        memset(blocks[i], (int)(i + seed) & 0xff, sizes[i]);
    }
    for (unsigned i = 0; i < n; i++) {
        const unsigned char *b = blocks[i];
        for (size_t k = 0; k < sizes[i]; k += 97)
            if (b[k] != ((i + seed) & 0xff))
                fatal("heap corrupted", EIO);
        free(blocks[i]);
    }
}

void trust_target_alloc(void);
__attribute__((noinline)) void trust_target_alloc(void)
{
    alloc_check(8, 1);
    sink = malloc(1000); /* leaked: something live for the trace */
}

void trust_child_alloc(unsigned seed);
__attribute__((noinline)) void trust_child_alloc(unsigned seed)
{
    alloc_check(32, seed);
    /* Not a tail call: the frame stays on the stacks sampled. */
    __asm__ volatile("" ::: "memory");
}

/* True at EOF on stdin; @line gets a line that came meanwhile ("" if none). Main thread
 * only: the kept children never read. */
static bool stdin_closed(char *line, size_t len)
{
    line[0] = '\0';
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return false;
    ssize_t n = read(0, line, len - 1);
    if (n <= 0)
        return true;
    line[n] = '\0';
    return false;
}

/* True once stdin's writer is gone, without reading from it. */
static bool stdin_hung_up(void)
{
    struct pollfd p = {.fd = 0, .events = 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

static int alloc_main(void)
{
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (!stdin_closed(line, sizeof(line))) {
        trust_target_alloc();
        sleep_ms(1);
    }
    printf("done\n");
    return 0;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!atomic_load(&stopping))
        alloc_check(16, seed++);
    return NULL;
}

/* A child without atfork handlers: _Fork() when @kind is 0, else a raw clone(). */
static pid_t raw_fork(int kind)
{
    if (kind == 0)
        return _Fork();
    return (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
}

/* What a short-lived child does: allocate, maybe make a child of its own, exit 0. */
static void child_body(unsigned seed, int depth)
{
    trust_child_alloc(seed);
    if (depth == 0 && seed % 4 == 0) {
        pid_t g = raw_fork((int)(seed / 4) % 2);
        if (g == 0) {
            child_body(seed + 1, 1);
            exit(0);
        }
        int st;
        if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            exit(3);
    }
    trust_child_alloc(seed + 7);
}

/* A kept child: says who it is, allocates until stdin's EOF. */
static void kept_body(int kind)
{
    char msg[64];
    int n = snprintf(msg, sizeof(msg), "kept %s %d\n", kind ? "clone" : "_Fork", (int)getpid());
    (void)!write(2, msg, (size_t)n);
    for (unsigned i = 0; !stdin_hung_up(); i++) {
        trust_child_alloc(i);
        sleep_ms(1);
    }
    exit(0);
}

static int rawfork_main(void)
{
    pthread_t th[2];
    char line[64];
    pid_t kept[2] = {0, 0};
    unsigned bad = 0;
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 2; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i * 1000)) != 0)
            fatal("pthread_create", EAGAIN);
    for (unsigned round = 0; !stdin_closed(line, sizeof(line)); round++) {
        for (int kind = 0; kind < 2 && line[0] == 'k' && !kept[kind]; kind++) {
            kept[kind] = raw_fork(kind);
            if (kept[kind] == 0)
                kept_body(kind);
        }
        pid_t c = raw_fork((int)(round % 2));
        if (c == 0) {
            child_body(round, 0);
            exit(0);
        }
        int st;
        if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
        sleep_ms(3);
    }
    for (int kind = 0; kind < 2; kind++) {
        int st;
        if (kept[kind] > 0 &&
            (waitpid(kept[kind], &st, 0) != kept[kind] || !WIFEXITED(st) || WEXITSTATUS(st)))
            bad++;
    }
    atomic_store(&stopping, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    printf("children that failed: %u\ndone\n", bad);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "alloc") == 0)
        return alloc_main();
    if (strcmp(mode, "rawfork") == 0)
        return rawfork_main();
    fprintf(stderr, "usage: trust_target alloc|rawfork\n");
    return 2;
}
