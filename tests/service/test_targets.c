/* tests/service/test_targets.c: the attacher wakes only a process that advertises its
 * wake entry, and never a pid that now names another process (issue 15, case 9). Real
 * processes: a dormant worker (HEAPPROF_LIB, WORKER) and sleep(1). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "service/svc.h"

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* A dormant worker idling for @ms, its wake entry advertised. */
static pid_t start_worker(const char *ms, struct svc_proc *ret)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        setenv("LD_PRELOAD", getenv("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        setenv("XDG_RUNTIME_DIR", "/nonexistent", 1);
        execl(getenv("WORKER"), "worker", "idle", ms, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        assert_int_equal(svc_proc_inspect(pid, ret), 0);
        if (ret->attach_ready)
            return pid;
        sleep_ms(10);
    }
    fail_msg("worker %d never advertised its wake entry", (int)pid);
    return -1;
}

static pid_t start_sleep(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sleep", "sleep", "5", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static bool alive(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A process without the library is refused, and keeps running. */
static void test_targets_no_handler_refused(void **state)
{
    (void)state;
    pid_t s = start_sleep();
    sleep_ms(50);
    struct svc_proc p;
    assert_int_equal(svc_proc_inspect(s, &p), 0);
    assert_false(p.attach_ready);
    assert_int_equal(p.wake_page, 0);
    char why[256];
    assert_int_equal(svc_proc_wake(&p, 0, why, sizeof(why)), -EAGAIN);
    sleep_ms(50);
    assert_true(alive(s));
    reap(s);
}

/* A worker is woken whatever HEAPPROF_ATTACH_SIGNAL says (no signal is involved any
 * more), and is left running; HEAPPROF_ATTACH_SIGNAL=0 still turns attaching off. */
static void test_targets_wake_advertised(void **state)
{
    (void)state;
    char sig[16];
    snprintf(sig, sizeof(sig), "%d", SIGRTMIN + 7);
    setenv("HEAPPROF_ATTACH_SIGNAL", sig, 1);
    struct svc_proc p;
    pid_t w = start_worker("2000", &p);
    unsetenv("HEAPPROF_ATTACH_SIGNAL");
    assert_true(p.preloaded);
    assert_true(p.wake_page != 0);
    /* Woken (no service to attach to: nothing else happens). */
    char why[256];
    int r = svc_proc_wake(&p, getpid(), why, sizeof(why));
    print_message("  wake: %d %s\n", r, why);
    assert_int_equal(r, 0);
    sleep_ms(100);
    assert_true(alive(w));
    reap(w);

    setenv("HEAPPROF_ATTACH_SIGNAL", "0", 1);
    pid_t off = fork();
    assert_true(off >= 0);
    if (off == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        setenv("LD_PRELOAD", getenv("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        execl(getenv("WORKER"), "worker", "idle", "2000", (char *)NULL);
        _exit(127);
    }
    unsetenv("HEAPPROF_ATTACH_SIGNAL");
    bool preloaded = false;
    for (int i = 0; i < 500 && !preloaded; i++) {
        sleep_ms(10);
        assert_int_equal(svc_proc_inspect(off, &p), 0);
        preloaded = p.preloaded;
    }
    sleep_ms(200);
    assert_int_equal(svc_proc_inspect(off, &p), 0);
    assert_true(p.preloaded);
    assert_false(p.attach_ready);
    assert_int_equal(svc_proc_wake(&p, 0, why, sizeof(why)), -EAGAIN);
    assert_true(alive(off));
    reap(off);
}

/* The pid of an inspected process that died names another process now: it is not
 * signalled. The reuse is made real by choosing the next pid (ns_last_pid, root only). */
static void test_targets_bug_reused_pid_woken(void **state)
{
    (void)state;
    struct svc_proc p;
    pid_t w = start_worker("5000", &p);
    /* Same process, start time not the one inspected: refused, not signalled. */
    struct svc_proc stale = p;
    stale.start_time++;
    char why[256];
    assert_int_equal(svc_proc_wake(&stale, 0, why, sizeof(why)), -ESRCH);
    reap(w);

    int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        print_message("  cannot choose the next pid (%s): the reuse itself is not tested\n",
                      strerror(errno));
        skip();
    }
    pid_t s = -1;
    for (int attempt = 0; attempt < 20 && s != p.pid; attempt++) {
        if (s > 0)
            reap(s);
        char buf[16];
        int n = snprintf(buf, sizeof(buf), "%d", (int)p.pid - 1);
        assert_int_equal(pwrite(fd, buf, (size_t)n, 0), n);
        s = start_sleep();
    }
    close(fd);
    if (s != p.pid) {
        reap(s);
        print_message("  pid %d was taken by another process meanwhile\n", (int)p.pid);
        skip();
    }
    sleep_ms(50);
    print_message("  pid %d: worker, then sleep\n", (int)p.pid);
    assert_int_equal(svc_proc_wake(&p, 0, why, sizeof(why)), -ESRCH);
    sleep_ms(50);
    assert_true(alive(s));
    reap(s);
}

int main(void)
{
    if (!getenv("HEAPPROF_LIB") || !getenv("WORKER")) {
        fprintf(stderr, "HEAPPROF_LIB and WORKER must be set\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets_no_handler_refused),
        cmocka_unit_test(test_targets_wake_advertised),
        cmocka_unit_test(test_targets_bug_reused_pid_woken),
    };
    return cmocka_run_group_tests_name("targets", tests, NULL, NULL);
}
