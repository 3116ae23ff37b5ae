/* tests/preload/attach_prog.c: a long-running program driven by one-byte commands on
 * stdin, run under LD_PRELOAD=libheapprof.so by tests/preload/test_attach.c. Prints
 * "ready" at start and one line per command:
 *   a  100 malloc(1000) (each frees the block allocated 100 calls before), "a"
 *   f  fork; the child makes 50 malloc(5000)/free pairs and exits 0: "f <pid> <status>"
 *   v  vfork; the child allocates and frees once, then _exit(0): "v <status>"
 *   b  start 2 threads churning malloc/free with random sizes until q: "b"
 *   B  the same with 64 threads: "B"
 *   F  a storm: 20 forks (the child allocates), 20 vfork+exec and 20 posix_spawn of
 *      /bin/true, 10 fork+exec of /bin/true: "F <failures>"
 *   S  300 ms of malloc/free with SIGALRM every 200 us (the handler clobbers errno and
 *      restores it): "S <signals> <errno changed>"
 *   D  200 dlopen/dlsym/call/dlclose of ATTACH_PROG_DLLIB (its function allocates):
 *      "D <failures>"
 *   T  256 short-lived threads (16 at a time) allocating 50 blocks each: "T"
 *   U  allocations on a ucontext stack carved from the heap, then on ours: "U"
 *   t  the process's thread count (/proc/self/status): "t <threads>"
 *   q  stop the threads, "done <allocations made>", exit 0
 * Idle (blocked in read) between commands.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

static void *blocks[100];
static unsigned next_block;
static _Atomic bool stop;
static _Atomic uint64_t made;
static pthread_t th[64];
static int nthreads;

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

extern char **environ;

static __attribute__((noinline)) int vfork_exec(char **argv)
{
    int st;
    pid_t pid = vfork();
    if (pid == 0) {
        execve(argv[0], argv, environ);
        _exit(127);
    }
    return pid < 0 || waitpid(pid, &st, 0) != pid || st != 0;
}

static int storm(void)
{
    int failures = 0, st;
    char *argv[] = {"/bin/true", NULL};
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *volatile p = malloc(777);
            free(p);
            _exit(0);
        }
        failures += pid < 0 || waitpid(pid, &st, 0) != pid || st != 0;
    }
    for (int i = 0; i < 20; i++)
        failures += vfork_exec(argv);
    for (int i = 0; i < 20; i++) {
        pid_t pid;
        failures += posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0 ||
                    waitpid(pid, &st, 0) != pid || st != 0;
    }
    for (int i = 0; i < 10; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            execve(argv[0], argv, environ);
            _exit(127);
        }
        failures += pid < 0 || waitpid(pid, &st, 0) != pid || st != 0;
    }
    return failures;
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    errno = EDOM;
    alarms++;
    errno = saved;
}

static int signals_during_malloc(int *errno_changed)
{
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    struct itimerval it = {{0, 200}, {0, 200}};
    void *keep[32] = {0};
    uint64_t x = 88172645463325252ull;
    sigaction(SIGALRM, &sa, NULL);
    alarms = 0;
    *errno_changed = 0;
    setitimer(ITIMER_REAL, &it, NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 1000; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            unsigned k = x % 32;
            errno = 0;
            free(keep[k]);
            keep[k] = malloc(1 + (x >> 40) % 20000);
            if (!keep[k])
                _exit(6);
            *errno_changed |= errno != 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 300000000L);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int i = 0; i < 32; i++)
        free(keep[i]);
    return alarms;
}

static int dl_loop(void)
{
    const char *path = getenv("ATTACH_PROG_DLLIB");
    int failures = 0;
    if (!path)
        return 1;
    for (int i = 0; i < 200; i++) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            failures++;
            continue;
        }
        int (*fn)(int) = (int (*)(int))dlsym(h, "dl_lib_allocate");
        failures += !fn || fn(i) != i;
        failures += dlclose(h) != 0;
    }
    return failures;
}

static void *short_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++) {
        void *volatile p = malloc(100 + i);
        free(p);
    }
    return NULL;
}

static void short_threads(void)
{
    for (int round = 0; round < 16; round++) {
        pthread_t t16[16];
        for (int i = 0; i < 16; i++)
            if (pthread_create(&t16[i], NULL, short_thread, NULL) != 0)
                _exit(7);
        for (int i = 0; i < 16; i++)
            (void)pthread_join(t16[i], NULL);
    }
}

static ucontext_t main_ctx, fiber_ctx;

static void fiber(void)
{
    for (int i = 0; i < 20; i++) {
        void *volatile p = malloc(1500);
        free(p);
    }
    swapcontext(&fiber_ctx, &main_ctx);
}

static void on_fiber(void)
{
    size_t size = 256 << 10;
    char *stack = malloc(size);
    if (!stack || getcontext(&fiber_ctx) < 0)
        _exit(8);
    fiber_ctx.uc_stack.ss_sp = stack;
    fiber_ctx.uc_stack.ss_size = size;
    fiber_ctx.uc_link = &main_ctx;
    makecontext(&fiber_ctx, fiber, 0);
    if (swapcontext(&main_ctx, &fiber_ctx) < 0)
        _exit(8);
    free(stack);
    for (int i = 0; i < 20; i++) {
        void *volatile p = malloc(1600);
        free(p);
    }
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
        case 'B':
            for (; nthreads < (c == 'b' ? 2 : 64); nthreads++)
                if (pthread_create(&th[nthreads], NULL, churn, (void *)(uintptr_t)(nthreads + 1)))
                    return 7;
            say(c == 'b' ? "b\n" : "B\n");
            break;
        case 'F':
            snprintf(line, sizeof(line), "F %d\n", storm());
            say(line);
            break;
        case 'S': {
            int changed, sigs = signals_during_malloc(&changed);
            snprintf(line, sizeof(line), "S %d %d\n", sigs, changed);
            say(line);
            break;
        }
        case 'D':
            snprintf(line, sizeof(line), "D %d\n", dl_loop());
            say(line);
            break;
        case 'T':
            short_threads();
            say("T\n");
            break;
        case 'U':
            on_fiber();
            say("U\n");
            break;
        case 't': {
            char status[4096];
            int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
            ssize_t k = fd >= 0 ? read(fd, status, sizeof(status) - 1) : -1;
            if (fd >= 0)
                close(fd);
            status[k > 0 ? k : 0] = 0;
            const char *t = strstr(status, "\nThreads:");
            snprintf(line, sizeof(line), "t %d\n", t ? atoi(t + 9) : -1);
            say(line);
            break;
        }
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
