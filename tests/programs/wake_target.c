/* tests/programs/wake_target.c: programs an attach must leave alone
 * (tests/e2e/test_attach_matrix.c).
 * Each prints "ready", allocates now and then through wake_target_alloc() (for the
 * session to sample), treats any surprise as fatal (a message on stdout, exit 1), and
 * ends cleanly with "done":
 *
 *   epoll_inf       its only thread waits in epoll_wait(-1) (a timerfd ticks every 20 ms)
 *   epoll_timed     epoll_wait(100 ms) in a loop: never EINTR, never early
 *   nanosleep       clock_nanosleep(100 ms) in a loop: never EINTR, never early
 *   sigwait         every signal blocked, sigwaitinfo() for all (a timer's SIGALRM ticks)
 *   signalfd        every signal blocked, read from a signalfd for all
 *   rtsig           its own SIGRTMIN+4 handler, installed in main(); nanosleep loop
 *
 * The first three and rtsig end at EOF on stdin; sigwait and signalfd at SIGTERM (any
 * other signal but their SIGALRM is fatal). rtsig prints how often its handler ran. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

void wake_target_alloc(void);
__attribute__((noinline)) void wake_target_alloc(void)
{
    for (int i = 0; i < 4; i++) {
        char *p = malloc(1000);
        memset(p, i, 1000);
        sink = p;
        free(p);
    }
    sink = malloc(1000); /* leaked: something live for the trace */
}

static void fatal(const char *what, int err)
{
    printf("FATAL: %s: %s\n", what, strerror(err));
    fflush(stdout);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* True at EOF on stdin (not blocking). */
static bool stdin_closed(void)
{
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return false;
    char buf[64];
    return read(0, buf, sizeof(buf)) == 0;
}

static int epoll_loop(bool infinite)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = 0};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev) < 0)
        fatal("epoll_ctl", errno);
    int tfd = -1;
    if (infinite) {
        tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
        struct itimerspec its = {{0, 20000000}, {0, 20000000}};
        timerfd_settime(tfd, 0, &its, NULL);
        ev = (struct epoll_event){.events = EPOLLIN, .data.fd = tfd};
        epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        double t0 = now_s();
        int n = epoll_wait(ep, &ev, 1, infinite ? -1 : 100);
        double dt = now_s() - t0;
        if (n < 0)
            fatal("epoll_wait", errno);
        if (n == 0 && dt < 0.1) {
            printf("FATAL: epoll_wait(100 ms) returned after %.6f s\n", dt);
            return 1;
        }
        if (n == 1 && ev.data.fd == 0) {
            char buf[64];
            if (read(0, buf, sizeof(buf)) == 0)
                break;
        }
        if (n == 1 && ev.data.fd == tfd) {
            uint64_t ticks;
            if (read(tfd, &ticks, sizeof(ticks)) < 0)
                fatal("read timerfd", errno);
        }
        wake_target_alloc();
    }
    printf("done\n");
    return 0;
}

static int nanosleep_loop(void)
{
    printf("ready\n");
    fflush(stdout);
    while (!stdin_closed()) {
        struct timespec req = {0, 100000000}, t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int r = clock_nanosleep(CLOCK_MONOTONIC, 0, &req, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (r != 0)
            fatal("clock_nanosleep", r);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (dt < 0.1) {
            printf("FATAL: clock_nanosleep(100 ms) returned after %.6f s\n", dt);
            return 1;
        }
        wake_target_alloc();
    }
    printf("done\n");
    return 0;
}

/* SIGALRM every 20 ms, from a timer (blocked: taken by sigwaitinfo or the signalfd). */
static void start_alarm(void)
{
    timer_t t;
    struct sigevent sev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGALRM};
    if (timer_create(CLOCK_MONOTONIC, &sev, &t) < 0)
        fatal("timer_create", errno);
    struct itimerspec its = {{0, 20000000}, {0, 20000000}};
    timer_settime(t, 0, &its, NULL);
}

static int sig_loop(bool use_signalfd)
{
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    int sfd = use_signalfd ? signalfd(-1, &all, SFD_CLOEXEC) : -1;
    start_alarm();
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int sig;
        if (use_signalfd) {
            struct signalfd_siginfo si;
            ssize_t n = read(sfd, &si, sizeof(si));
            if (n != (ssize_t)sizeof(si))
                fatal("read signalfd", n < 0 ? errno : EIO);
            sig = (int)si.ssi_signo;
        } else {
            siginfo_t si;
            sig = sigwaitinfo(&all, &si);
            if (sig < 0)
                fatal("sigwaitinfo", errno);
        }
        if (sig == SIGTERM)
            break;
        if (sig != SIGALRM) {
            printf("FATAL: got signal %d\n", sig);
            return 1;
        }
        wake_target_alloc();
    }
    printf("done\n");
    return 0;
}

static volatile sig_atomic_t rtsig_count;

static void rtsig_handler(int sig)
{
    (void)sig;
    rtsig_count++;
}

static int rtsig_loop(void)
{
    struct sigaction sa = {.sa_handler = rtsig_handler};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGRTMIN + 4, &sa, NULL) < 0)
        fatal("sigaction", errno);
    printf("ready\n");
    fflush(stdout);
    while (!stdin_closed()) {
        struct timespec req = {0, 20000000};
        while (nanosleep(&req, &req) < 0 && errno == EINTR)
            ;
        wake_target_alloc();
    }
    printf("handler ran %d times\ndone\n", (int)rtsig_count);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "epoll_inf") == 0)
        return epoll_loop(true);
    if (strcmp(mode, "epoll_timed") == 0)
        return epoll_loop(false);
    if (strcmp(mode, "nanosleep") == 0)
        return nanosleep_loop();
    if (strcmp(mode, "sigwait") == 0)
        return sig_loop(false);
    if (strcmp(mode, "signalfd") == 0)
        return sig_loop(true);
    if (strcmp(mode, "rtsig") == 0)
        return rtsig_loop();
    fprintf(stderr, "usage: wake_target epoll_inf|epoll_timed|nanosleep|sigwait|signalfd|rtsig\n");
    return 2;
}
