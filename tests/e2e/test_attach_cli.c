/* tests/e2e/test_attach_cli.c: `heapprof attach` and heapprofd find processes the way
 * pgrep does and say what happened. `-n NAME` matched argv[0] only, so retitled
 * processes ("nginx: master process ...") were never found; an attach that profiled
 * nothing exited 0 and blamed "the signal disabled, or another handler" when the pid was
 * already in a session, under `heapprof record`, another user's, or not dumpable.
 * Real programs: tests/programs/attach_cli_target.c. The cases that switch users run as
 * root only (nobody's processes and attachers). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"
#include "tests/e2e/e2e_util.h"

#define NOBODY 65534

static char runtime_dir[128];
/* nobody's runtime directory (theirs: its own sockets live there), made by setup(). */
static char nobody_runtime[192];

static int setup(void **state)
{
    (void)state;
    if (e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "acli") < 0)
        return -1;
    /* Searchable by nobody, whose runtime directory lies inside. */
    (void)chmod(runtime_dir, 0711);
    snprintf(nobody_runtime, sizeof(nobody_runtime), "%s/nobody", runtime_dir);
    if (geteuid() == 0 &&
        (mkdir(nobody_runtime, 0700) < 0 || chown(nobody_runtime, NOBODY, NOBODY) < 0))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* A program started by start(): its pid, the write end of its stdin, its output file. */
struct target {
    pid_t pid;
    int in;
    char out[256];
};

/* How start() and run() set up the child. */
struct as {
    uid_t uid;      /* 0: stay root (or whoever we are) */
    bool preload;   /* the library, dormant */
    bool no_ptrace; /* without CAP_SYS_PTRACE */
};

static const char *nobody_dir(void)
{
    return nobody_runtime;
}

/* Drops CAP_SYS_PTRACE from every set of this (root) process. */
static void drop_ptrace_cap(void)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) < 0 || syscall(SYS_capget, &h, d) < 0)
        _exit(126);
    unsigned bit = 1u << (CAP_SYS_PTRACE % 32);
    d[CAP_SYS_PTRACE / 32].effective &= ~bit;
    d[CAP_SYS_PTRACE / 32].permitted &= ~bit;
    d[CAP_SYS_PTRACE / 32].inheritable &= ~bit;
    if (syscall(SYS_capset, &h, d) < 0)
        _exit(126);
}

/* In a forked child: becomes what @a says (before exec). */
static void become(const struct as *a)
{
    if (a->preload) {
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
    }
    if (a->no_ptrace)
        drop_ptrace_cap();
    if (a->uid) {
        setenv("XDG_RUNTIME_DIR", nobody_dir(), 1);
        if (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0)
            _exit(126);
        if (chdir(nobody_dir()) < 0)
            _exit(126);
    }
}

/* Starts @argv (argv[0] a path) as @a says, stdin a pipe, stdout and stderr to a file;
 * returns once it printed "ready" (10 s at most). */
static void start(struct target *t, char *const argv[], const struct as *a)
{
    static int seq;
    snprintf(t->out, sizeof(t->out), "%s/out-%d.txt", runtime_dir, seq++);
    int in[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    t->pid = fork();
    assert_true(t->pid >= 0);
    if (t->pid == 0) {
        int fd = open(t->out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0666);
        dup2(fd, 1);
        dup2(fd, 2);
        dup2(in[0], 0);
        become(a);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    t->in = in[1];
    for (int i = 0; i < 1000; i++) {
        char *o = e2e_read_file(t->out);
        bool ready = strstr(o, "ready\n") != NULL;
        free(o);
        if (ready)
            break;
        e2e_sleep_ms(10);
    }
}

/* Ends @t (EOF on its stdin); returns its exit status. */
static int finish(struct target *t)
{
    close(t->in);
    return e2e_wait_status(t->pid);
}

/* Starts `heapprof attach ARGS... -i 1 --no-status -o TRACE` as @a says, its stderr to
 * a file; returns its pid. */
static pid_t attach_start(char *const args[], const char *trace, const struct as *a, char *err_path,
                          size_t err_len)
{
    static int seq;
    snprintf(err_path, err_len, "%s/attach-%d.err", runtime_dir, seq++);
    char *argv[32];
    int k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "attach";
    for (int i = 0; args[i] && k < 24; i++)
        argv[k++] = args[i];
    argv[k++] = "-i";
    argv[k++] = "1";
    argv[k++] = "--no-status";
    argv[k++] = "-o";
    argv[k++] = (char *)trace;
    argv[k] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        dup2(fd, 2);
        dup2(fd, 1);
        become(a);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Runs `heapprof attach` to its end: its exit status, its stderr in @ret_err (malloc'd). */
static int attach_run(char *const args[], const char *trace, const struct as *a, char **ret_err)
{
    char err[256];
    pid_t pid = attach_start(args, trace, a, err, sizeof(err));
    int status = e2e_wait_status(pid);
    *ret_err = e2e_read_file(err);
    print_message("  attach: status %d, stderr:\n%s", status, *ret_err);
    return status;
}

/* The samples of attach_cli_alloc for @pid in @trace (-1: no trace or no such process). */
static long long samples_of(const char *trace, pid_t pid)
{
    struct rp_trace *t = NULL;
    long long n = -1;
    if (access(trace, F_OK) != 0 || rp_trace_load(trace, &(struct rp_trace_options){0}, &t) < 0)
        return -1;
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    if (p) {
        struct e2e_sums s;
        e2e_sum_function(p, "attach_cli_alloc", &s);
        n = (long long)s.alloc_count;
    }
    rp_trace_free(t);
    return n;
}

/* True once @pid maps a ring (it is in a session). */
static bool in_session(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *m = e2e_read_file(path);
    bool r = strstr(m, "heapprof-ring") != NULL;
    free(m);
    return r;
}

static void wait_in_session(pid_t pid)
{
    for (int i = 0; i < 500 && !in_session(pid); i++)
        e2e_sleep_ms(10);
    assert_true(in_session(pid));
}

/* @err has a line "pid PID (NAME) " followed by @why (or ending there when @why is ""). */
static void assert_said(const char *err, pid_t pid, const char *name, const char *why)
{
    char head[256];
    snprintf(head, sizeof(head), "pid %d (%s)%s%s", (int)pid, name, why[0] ? " " : "\n", why);
    if (!strstr(err, head))
        print_message("  wanted: %s\n", head);
    assert_non_null(strstr(err, head));
    assert_null(strstr(err, "another handler"));
    assert_null(strstr(err, "signal disabled"));
}

static bool root(void)
{
    if (geteuid() == 0)
        return true;
    print_message("  not root: cannot run processes as another user; case skipped\n");
    return false;
}

#define TITLE "hpcli: master process /usr/sbin/hpcli -c /etc/hpcli/hpcli.conf"
#define PG_TITLE "hpclipg: checkpointer"

/* (a) -n NAME finds a retitled process by its comm (`pgrep hpcli` does), and one by a
 * glob of its title; messages and the trace name them by their titles. Before: the
 * first matched nothing (its argv[0]'s basename is "hpcli.conf"). */
static void test_attach_cli_bug_name_misses_retitled(void **state)
{
    (void)state;
    const struct as dormant = {.preload = true};
    char *nginx[] = {
        (char *)e2e_env("ATTACH_CLI_TARGET"), "--title", TITLE, "--comm", "hpcli", NULL};
    char *pg[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--title", PG_TITLE, NULL};
    struct target a, b;
    start(&a, nginx, &dormant);
    start(&b, pg, &dormant);
    char trace[256], *err;
    snprintf(trace, sizeof(trace), "%s/names.pftrace", runtime_dir);
    char *args[] = {"-n", "hpcli", "-n", "hpclipg: *", "--duration", "1", NULL};
    int status = attach_run(args, trace, &(struct as){0}, &err);
    assert_int_equal(status, 0);
    assert_said(err, a.pid, TITLE, "");
    assert_said(err, b.pid, PG_TITLE, "");
    assert_true(samples_of(trace, a.pid) > 0);
    assert_true(samples_of(trace, b.pid) > 0);
    free(err);
    assert_int_equal(finish(&a), 0);
    assert_int_equal(finish(&b), 0);
}

/* (b) A second attach of a pid in a session, and an attach of a pid under `heapprof
 * record`: exit status 1, naming the session's process. Before: status 0 after 2 s,
 * "was woken but did not connect" or "no process was profiled". */
static void test_attach_cli_bug_already_profiled_rc0(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-twice", NULL};
    struct target t;
    start(&t, argv, &(struct as){.preload = true});
    char trace1[256], trace2[256], err1[256], pidbuf[16], *err;
    snprintf(trace1, sizeof(trace1), "%s/first.pftrace", runtime_dir);
    snprintf(trace2, sizeof(trace2), "%s/second.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t.pid);
    char *first[] = {"-p", pidbuf, "--duration", "2", NULL};
    pid_t a = attach_start(first, trace1, &(struct as){0}, err1, sizeof(err1));
    wait_in_session(t.pid);
    e2e_sleep_ms(200); /* its handshake done: "busy" otherwise (another attach under way) */
    char *second[] = {"-p", pidbuf, "--duration", "1", NULL};
    int status = attach_run(second, trace2, &(struct as){0}, &err);
    char by[64];
    snprintf(by, sizeof(by), "is already being profiled by pid %d (heapprof attach", (int)a);
    assert_int_equal(status, 1);
    assert_said(err, t.pid, "attach_cli_target --comm hpcli-twice", by);
    assert_int_equal(access(trace2, F_OK), -1);
    free(err);
    assert_int_equal(e2e_wait_status(a), 0);
    assert_true(samples_of(trace1, t.pid) > 0);
    assert_int_equal(finish(&t), 0);

    /* Under `heapprof record`. */
    char rec_trace[256];
    snprintf(rec_trace, sizeof(rec_trace), "%s/rec.pftrace", runtime_dir);
    char *rec[] = {
        (char *)e2e_env("HEAPPROF_BIN"),      "record", "-q",        "-o", rec_trace, "--",
        (char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-rec", NULL};
    struct target r;
    start(&r, rec, &(struct as){0});
    pid_t child = 0;
    for (int i = 0; i < 500 && !child; i++) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "pgrep -P %d -x hpcli-rec", (int)r.pid);
        FILE *f = popen(cmd, "r");
        if (f && fscanf(f, "%d", &child) != 1)
            child = 0;
        if (f)
            pclose(f);
        if (!child)
            e2e_sleep_ms(10);
    }
    assert_true(child > 0);
    wait_in_session(child);
    e2e_sleep_ms(200);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)child);
    char *under[] = {"-p", pidbuf, "--duration", "1", NULL};
    status = attach_run(under, trace2, &(struct as){0}, &err);
    snprintf(by, sizeof(by), "is already being profiled by pid %d (heapprof record", (int)r.pid);
    assert_int_equal(status, 1);
    assert_said(err, child, "attach_cli_target --comm hpcli-rec", by);
    free(err);
    assert_int_equal(finish(&r), 0);
}

/* (c) A process without the library, by pid and by name. Before, -n said only that no
 * process matched; since the injection, both load the library into it and profile it
 * (the second attach finds it loaded and only wakes it). */
static void test_attach_cli_bug_no_library_by_name(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-nolib", NULL};
    struct target t;
    start(&t, argv, &(struct as){0});
    char trace[256], pidbuf[16], *err;
    snprintf(trace, sizeof(trace), "%s/nolib.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t.pid);
    const char *name = "attach_cli_target --comm hpcli-nolib";
    char *by_pid[] = {"-p", pidbuf, "--duration", "1", NULL};
    assert_int_equal(attach_run(by_pid, trace, &(struct as){0}, &err), 0);
    assert_said(err, t.pid, name, "now has libheapprof.so loaded (thread");
    free(err);
    char *by_name[] = {"-n", "hpcli-nolib", "--duration", "1", NULL};
    assert_int_equal(attach_run(by_name, trace, &(struct as){0}, &err), 0);
    assert_null(strstr(err, "libheapprof.so loaded (thread"));
    free(err);
    assert_int_equal(finish(&t), 0);
}

/* (d) Another user's process, both ways: status 1 and what to do. Before, root woke
 * nobody's process, which could never connect, and exited 0. */
static void test_attach_cli_bug_other_user_rc0(void **state)
{
    (void)state;
    if (!root())
        return;
    char *argv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-nobody", NULL};
    struct target t, r;
    start(&t, argv, &(struct as){.uid = NOBODY, .preload = true});
    char trace[256], pidbuf[16], *err;
    snprintf(trace, sizeof(trace), "%s/other.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t.pid);
    char *args[] = {"-p", pidbuf, "--duration", "1", NULL};
    assert_int_equal(attach_run(args, trace, &(struct as){0}, &err), 1);
    assert_said(err, t.pid, "attach_cli_target --comm hpcli-nobody", "runs as user nobody");
    assert_non_null(strstr(err, "sudo -u nobody heapprof attach"));
    free(err);
    /* The same user attaches it. */
    snprintf(trace, sizeof(trace), "%s/other-ok.pftrace", nobody_dir());
    assert_int_equal(attach_run(args, trace, &(struct as){.uid = NOBODY}, &err), 0);
    free(err);
    assert_true(samples_of(trace, t.pid) > 0);
    assert_int_equal(finish(&t), 0);

    /* nobody attaching root's process. */
    char *rargv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-root", NULL};
    start(&r, rargv, &(struct as){.preload = true});
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)r.pid);
    snprintf(trace, sizeof(trace), "%s/other-root.pftrace", nobody_dir());
    assert_int_equal(attach_run(args, trace, &(struct as){.uid = NOBODY}, &err), 1);
    assert_said(err, r.pid, "attach_cli_target --comm hpcli-root", "runs as user root");
    free(err);
    assert_int_equal(finish(&r), 0);
}

/* (e) A non-dumpable process (as ssh-agent): its maps are root's, so a non-root attach
 * said it "does not have libheapprof.so loaded". Now: status 1, it is not dumpable. */
static void test_attach_cli_bug_nondumpable_no_library(void **state)
{
    (void)state;
    if (!root())
        return;
    char *argv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-nodump", "--nodump",
                    NULL};
    struct target t;
    start(&t, argv, &(struct as){.uid = NOBODY, .preload = true});
    char trace[256], pidbuf[16], *err;
    snprintf(trace, sizeof(trace), "%s/nodump.pftrace", nobody_dir());
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t.pid);
    char *args[] = {"-p", pidbuf, "--duration", "1", NULL};
    assert_int_equal(attach_run(args, trace, &(struct as){.uid = NOBODY}, &err), 1);
    assert_said(err, t.pid, "attach_cli_target --comm hpcli-nodump --nodump", "is not dumpable");
    assert_null(strstr(err, "does not have libheapprof.so"));
    free(err);
    assert_int_equal(finish(&t), 0);
}

/* (f) No permission to trace (EPERM from ptrace): root without CAP_SYS_PTRACE attaching
 * root's process, whose capabilities it lacks. Status 1, and what is needed. */
static void test_attach_cli_eperm_says_what_is_needed(void **state)
{
    (void)state;
    if (!root())
        return;
    char *argv[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli-eperm", NULL};
    struct target t;
    start(&t, argv, &(struct as){.preload = true});
    char trace[256], pidbuf[16], *err;
    snprintf(trace, sizeof(trace), "%s/eperm.pftrace", runtime_dir);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)t.pid);
    char *args[] = {"-p", pidbuf, "--duration", "1", NULL};
    assert_int_equal(attach_run(args, trace, &(struct as){.no_ptrace = true}, &err), 1);
    assert_said(err, t.pid, "attach_cli_target --comm hpcli-eperm",
                "may not be traced by this process");
    assert_non_null(strstr(err, "CAP_SYS_PTRACE"));
    free(err);
    assert_int_equal(finish(&t), 0);
}

/* (g) heapprofd attaches running targets at its start by the same rule: a retitled
 * process found by its comm, logged by its title; another user's process is logged
 * with the reason, not woken. Before: the first was not found. */
static void test_attach_cli_bug_daemon_misses_retitled(void **state)
{
    (void)state;
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "acli");
    setenv("HEAPPROF_SOCKET", d.sock, 1);
    char *nginx[] = {
        (char *)e2e_env("ATTACH_CLI_TARGET"), "--title", TITLE, "--comm", "hpcli", NULL};
    struct target a, b = {0};
    start(&a, nginx, &(struct as){.preload = true});
    if (geteuid() == 0) {
        char *other[] = {(char *)e2e_env("ATTACH_CLI_TARGET"), "--comm", "hpcli", NULL};
        start(&b, other, &(struct as){.uid = NOBODY, .preload = true});
    }
    unsetenv("HEAPPROF_SOCKET");
    const char *args[] = {"-n", "hpcli", "-i", "1", NULL};
    e2e_daemon_launch(&d, args);
    for (int i = 0; i < 300 && !in_session(a.pid); i++)
        e2e_sleep_ms(10);
    e2e_sleep_ms(200);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    print_message("  heapprofd log:\n%s", log);
    char line[256];
    snprintf(line, sizeof(line), "pid %d (%s): profiling (attached while running)", (int)a.pid,
             TITLE);
    assert_non_null(strstr(log, line));
    if (b.pid) {
        snprintf(line, sizeof(line), "pid %d (attach_cli_target --comm hpcli) runs as user nobody",
                 (int)b.pid);
        assert_non_null(strstr(log, line));
        assert_int_equal(finish(&b), 0);
    }
    free(log);
    assert_true(samples_of(d.trace, a.pid) > 0);
    assert_int_equal(finish(&a), 0);
    e2e_daemon_remove_files(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attach_cli_bug_name_misses_retitled),
        cmocka_unit_test(test_attach_cli_bug_already_profiled_rc0),
        cmocka_unit_test(test_attach_cli_bug_no_library_by_name),
        cmocka_unit_test(test_attach_cli_bug_other_user_rc0),
        cmocka_unit_test(test_attach_cli_bug_nondumpable_no_library),
        cmocka_unit_test(test_attach_cli_eperm_says_what_is_needed),
        cmocka_unit_test(test_attach_cli_bug_daemon_misses_retitled),
    };
    return cmocka_run_group_tests_name("e2e_attach_cli", tests, setup, teardown);
}
