/* tests/programs/harm/closefds.c: a daemon-style program. It allocates, closes every
 * descriptor above stderr at start (close_range, as closefrom() does), then uses pipes
 * whose numbers are the first free ones: the ones the profiler's descriptors had. Its
 * data must come through intact, with the library dormant or recording.
 *
 * While the library is dormant (HEAPPROF_STARTUP=0) and its attach handler installed,
 * the program also sends itself the attach signal, as an operator's `heapprof attach`
 * would: the handler must not write into the program's pipe (the old wake pipe had the
 * same number). Prints what it read, then "done".
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Each keeps half of what it allocates: the profile has something to show. */
static __attribute__((noinline)) void before_close(void)
{
    for (int i = 0; i < 200; i++) {
        char *volatile p = malloc(8192);
        if (!p)
            exit(3);
        if (i % 2)
            free(p);
    }
}

static __attribute__((noinline)) void after_close(void)
{
    for (int i = 0; i < 200; i++) {
        char *volatile p = malloc(12288);
        if (!p)
            exit(3);
        if (i % 2)
            free(p);
    }
}

/* Reads what the pipe holds, without blocking; prints it. */
static void drain(const char *what, int fd)
{
    char buf[64];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0)
        printf("%s: nothing (%s)\n", what, errno == EAGAIN ? "EAGAIN" : strerror(errno));
    else
        printf("%s: %zd bytes \"%.*s\"\n", what, n, (int)n, buf);
}

int main(void)
{
    before_close();
    if (syscall(SYS_close_range, 3u, ~0u, 0u) < 0)
        return 2;

    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0)
        return 2;
    printf("pipe %d %d\n", p[0], p[1]);
    if (write(p[1], "hello", 5) != 5)
        return 2;
    /* The old dormant helper woke up once a second and drained "its" pipe. */
    sleep_ms(1100);
    drain("first read", p[0]);

    const char *startup = getenv("HEAPPROF_STARTUP");
    struct sigaction sa;
    if (startup && !strcmp(startup, "0") && sigaction(SIGRTMIN + 4, NULL, &sa) == 0 &&
        (sa.sa_flags & SA_SIGINFO)) {
        (void)kill(getpid(), SIGRTMIN + 4);
        sleep_ms(100);
    }
    if (write(p[1], "world", 5) != 5)
        return 2;
    drain("second read", p[0]);

    after_close();
    printf("done\n");
    return 0;
}
