/* tests/e2e/test_attach_trust.c: the program trusts only the service, and children it
 * makes without fork() are not harmed (issue 24, cases 6 and 7).
 *
 *   unsealed files   a peer posing as the service hands the program an unsealed ring and
 *                    unwind table, then truncates them: the program used to die of SIGBUS
 *                    in malloc; it refuses them and runs as without the profiler.
 *   squatted socket  a process of the program's uid listens on the socket path of the
 *                    attacher that woke the program: it used to get the program's
 *                    /proc/self/mem; it gets nothing, and the real attach still works.
 *   raw children     children of _Fork() and raw clone() (no atfork handler) made while
 *                    sessions come and go allocate and exit 0, and a child made during a
 *                    session can be attached later (it could not: it kept its parent's
 *                    state).
 *
 * Real programs: tests/programs/trust_target.c and fake_service.c; outputs and exit
 * statuses are compared with a run without the profiler. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/paths.h"
#include "service/targets.h"
#include "tests/e2e/e2e_util.h"

extern char **environ;

/* Programs that meet a peer posing as the service, one after another. */
#define TRUST_CYCLES 20

static char runtime_dir[128];

static int setup(void **state)
{
    (void)state;
    if (e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "trust") < 0)
        return -1;
    char dir[HP_PATH_MAX];
    if (hp_runtime_dir(runtime_dir, getuid(), dir, sizeof(dir)) < 0 || mkdir(dir, 0700) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* A program started by start(): its pid, the write end of its stdin, its output files. */
struct target {
    pid_t pid;
    int in;
    char out[256], err[256];
};

/* Waits up to 10 s for @text in file @path. */
static bool wait_for_text(const char *path, const char *text)
{
    for (int i = 0; i < 1000; i++) {
        char *o = e2e_read_file(path);
        bool found = strstr(o, text) != NULL;
        free(o);
        if (found)
            return true;
        e2e_sleep_ms(10);
    }
    return false;
}

/* Starts @argv with the library preloaded when @preload, the NULL-terminated "NAME=value"
 * entries of @env added, stdin a pipe, stdout and stderr to files of their own; returns
 * once stdout shows @ready_text. */
static void start(struct target *t, char *const argv[], bool preload, char *const env[],
                  const char *ready_text)
{
    static int seq;
    snprintf(t->out, sizeof(t->out), "%s/out-%d.txt", runtime_dir, seq);
    snprintf(t->err, sizeof(t->err), "%s/err-%d.txt", runtime_dir, seq++);
    int in[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    t->pid = fork();
    assert_true(t->pid >= 0);
    if (t->pid == 0) {
        int out = open(t->out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        int err = open(t->err, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        dup2(out, 1);
        dup2(err, 2);
        dup2(in[0], 0);
        if (preload)
            setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        for (size_t i = 0; env && env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    t->in = in[1];
    assert_true(wait_for_text(t->out, ready_text));
}

/* Ends @t (EOF on its stdin), returns its exit status (128 + signal). */
static int finish(struct target *t)
{
    close(t->in);
    int st;
    assert_int_equal(waitpid(t->pid, &st, 0), t->pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The argv of `heapprof attach -p @pid --duration @dur -i 4096 -q -o @trace`. */
struct attach_argv {
    char pid[16], trace[256];
    char *argv[12];
};

static void attach_argv_init(struct attach_argv *a, pid_t pid, const char *dur)
{
    static int seq;
    snprintf(a->pid, sizeof(a->pid), "%d", (int)pid);
    snprintf(a->trace, sizeof(a->trace), "%s/trust-%d.pftrace", runtime_dir, seq++);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    a->pid,
                    "--duration",
                    (char *)dur,
                    "-i",
                    "4096",
                    "-q",
                    "-o",
                    a->trace,
                    NULL};
    memcpy(a->argv, argv, sizeof(argv));
}

/* The samples of @fn in @pid's part of @trace; -1 without a trace. */
static long long trace_samples(const char *trace, pid_t pid, const char *fn)
{
    struct rp_trace *t = NULL;
    long long n = -1;
    if (access(trace, F_OK) != 0 || rp_trace_load(trace, &(struct rp_trace_options){0}, &t) != 0)
        return -1;
    for (size_t i = 0; i < t->n_processes; i++) {
        if (t->processes[i].pid != pid)
            continue;
        struct e2e_sums s;
        e2e_sum_function(&t->processes[i], fn, &s);
        n = (long long)s.alloc_count;
    }
    rp_trace_free(t);
    return n;
}

/* Attaches @pid for @dur seconds; asserts exit status 0 and samples of @fn. */
static void attach_ok(pid_t pid, const char *dur, const char *fn)
{
    struct attach_argv a;
    attach_argv_init(&a, pid, dur);
    struct e2e_run run;
    assert_int_equal(e2e_run(a.argv, NULL, &run), 0);
    long long samples = run.status == 0 ? trace_samples(a.trace, pid, fn) : -1;
    if (run.status != 0 || samples <= 0)
        print_message("  attach %d: status %d, %lld samples of %s, stderr: %s\n", (int)pid,
                      run.status, samples, fn, run.err);
    assert_int_equal(run.status, 0);
    assert_true(samples > 0);
    e2e_run_free(&run);
}

/* The output and exit status of @argv run without the profiler, ended after @ms (and
 * the line @line sent half-way, when not NULL). */
static int run_plain(char *const argv[], long ms, const char *line, char **ret_out)
{
    struct target t;
    start(&t, argv, false, NULL, "ready\n");
    e2e_sleep_ms(ms / 2);
    if (line)
        assert_true(write(t.in, line, strlen(line)) == (ssize_t)strlen(line));
    e2e_sleep_ms(ms / 2);
    int status = finish(&t);
    *ret_out = e2e_read_file(t.out);
    return status;
}

/* (1) A peer posing as the service sends an unsealed ring and table and truncates them:
 * the program refuses them (the peer sees it hang up) and ends as without the profiler.
 * Before, it mapped them and died of SIGBUS in malloc. TRUST_CYCLES programs in turn
 * meet the peer (the program connects at its start, HEAPPROF_STARTUP unset: the socket
 * exists). */
static void test_trust_bug_unsealed_files_sigbus(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("TRUST_TARGET"), "alloc", NULL};
    char *plain_out = NULL;
    int plain_status = run_plain(argv, 100, NULL, &plain_out);

    static char sock_env[300];
    char sock[256];
    snprintf(sock, sizeof(sock), "%s/fake.sock", runtime_dir);
    snprintf(sock_env, sizeof(sock_env), "HEAPPROF_SOCKET=%s", sock);
    char *fake_argv[] = {(char *)e2e_env("FAKE_SERVICE"), "unsealed", sock, NULL};
    char *env[] = {sock_env, NULL};
    for (int i = 0; i < TRUST_CYCLES; i++) {
        struct target fake, t;
        start(&fake, fake_argv, false, NULL, "listening\n");
        start(&t, argv, true, env, "ready\n");
        /* The peer exits once the program hung up, or 300 ms after its answer when the
         * program mapped the files (it truncates them then). */
        int fake_status = finish(&fake);
        e2e_sleep_ms(50); /* the program allocates on */
        int status = finish(&t);
        char *out = e2e_read_file(t.out);
        char *fake_out = e2e_read_file(fake.out);
        if (i == 0 || status != plain_status || !strstr(fake_out, "client refused"))
            print_message("  program %d: unprofiled: %d, with the fake service: %d; the fake "
                          "said: %s",
                          i, plain_status, status, fake_out);
        assert_int_equal(fake_status, 0);
        assert_non_null(strstr(fake_out, "client refused"));
        assert_int_equal(status, plain_status);
        assert_string_equal(out, plain_out);
        free(fake_out);
        free(out);
    }
    free(plain_out);
}

/* Wakes @pid as `heapprof attach` does, naming us as the attacher. */
static void wake_as_attacher(pid_t pid)
{
    struct svc_proc p;
    for (int i = 0; i < 500; i++) {
        assert_int_equal(svc_proc_inspect(pid, &p), 0);
        if (p.attach_ready)
            break;
        e2e_sleep_ms(10);
    }
    char why[512];
    int r = svc_proc_wake(&p, getpid(), why, sizeof(why));
    if (r != 0)
        print_message("  wake: %d %s\n", r, why);
    assert_int_equal(r, 0);
}

/* (2) We wake the program as an attacher; another process of our uid listens on our
 * attach socket path (it may unlink and bind any name in the runtime directory): it gets
 * no descriptor (before, the program's /proc/self/mem and maps). A real attach works
 * afterwards, and the program ends as without the profiler. */
static void test_trust_bug_squatted_attach_socket(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("TRUST_TARGET"), "alloc", NULL};
    char *plain_out = NULL;
    int plain_status = run_plain(argv, 200, NULL, &plain_out);

    char *env[] = {"HEAPPROF_STARTUP=0", NULL};
    struct target t;
    start(&t, argv, true, env, "ready\n");
    char sock[HP_PATH_MAX];
    assert_int_equal(hp_socket_path(runtime_dir, getuid(), getpid(), sock, sizeof(sock)), 0);
    char *squat_argv[] = {(char *)e2e_env("FAKE_SERVICE"), "squat", sock, NULL};
    struct target squat;
    start(&squat, squat_argv, false, NULL, "listening\n");
    wake_as_attacher(t.pid);
    int squat_status = finish(&squat);
    char *squat_out = e2e_read_file(squat.out);
    print_message("  the squatter said: %s", squat_out);
    assert_int_equal(squat_status, 0);
    assert_non_null(strstr(squat_out, "got nothing"));
    free(squat_out);

    attach_ok(t.pid, "0.2", "trust_target_alloc");
    int status = finish(&t);
    char *out = e2e_read_file(t.out);
    assert_int_equal(status, plain_status);
    assert_string_equal(out, plain_out);
    free(out);
    free(plain_out);
}

/* True once /proc/@pid/maps shows a ring mapped (a session runs), within 5 s. */
static bool wait_session(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    return wait_for_text(path, "heapprof-ring");
}

/* The pid after "kept @kind " in @err, or 0. */
static pid_t kept_pid(const char *err, const char *kind)
{
    char key[32];
    snprintf(key, sizeof(key), "kept %s ", kind);
    const char *p = strstr(err, key);
    return p ? (pid_t)atoi(p + strlen(key)) : 0;
}

/* (3) Children of _Fork() and raw clone() made while sessions come and go: each allocates
 * and exits 0; two made during a session are attached afterwards and sampled (before,
 * they kept their parent's state and the wake ignored them). The program's output and
 * status are those of a run without the profiler. */
static void test_trust_bug_raw_fork_children(void **state)
{
    (void)state;
    char *argv[] = {(char *)e2e_env("TRUST_TARGET"), "rawfork", NULL};
    char *plain_out = NULL;
    int plain_status = run_plain(argv, 300, "k\n", &plain_out);

    char *env[] = {"HEAPPROF_STARTUP=0", NULL};
    struct target t;
    start(&t, argv, true, env, "ready\n");
    for (int i = 0; i < 2; i++)
        attach_ok(t.pid, "0.2", "worker");

    /* A session in the background; the kept children are made while it runs. */
    struct attach_argv a;
    attach_argv_init(&a, t.pid, "0.6");
    pid_t bg;
    assert_int_equal(posix_spawn(&bg, a.argv[0], NULL, NULL, a.argv, environ), 0);
    assert_true(wait_session(t.pid));
    assert_true(write(t.in, "k\n", 2) == 2);
    assert_true(wait_for_text(t.err, "kept clone"));
    int st;
    assert_int_equal(waitpid(bg, &st, 0), bg);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    char *err = e2e_read_file(t.err);
    pid_t kept[2] = {kept_pid(err, "_Fork"), kept_pid(err, "clone")};
    free(err);
    for (int i = 0; i < 2; i++) {
        print_message("  attaching the %s child %d\n", i ? "clone()" : "_Fork()", (int)kept[i]);
        assert_true(kept[i] > 0);
        attach_ok(kept[i], "0.2", "trust_child_alloc");
    }
    int status = finish(&t);
    char *out = e2e_read_file(t.out);
    print_message("  unprofiled: %d \"%s\", attached: %d \"%s\"\n", plain_status, plain_out, status,
                  out);
    assert_int_equal(status, plain_status);
    assert_string_equal(out, plain_out);
    free(out);
    free(plain_out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trust_bug_unsealed_files_sigbus),
        cmocka_unit_test(test_trust_bug_squatted_attach_socket),
        cmocka_unit_test(test_trust_bug_raw_fork_children),
    };
    /* HEAPPROF_TEST_FILTER=pattern runs the matching tests only. */
    const char *filter = getenv("HEAPPROF_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("e2e_attach_trust", tests, setup, teardown);
}
