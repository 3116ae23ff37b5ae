/* tests/e2e/test_attach.c: `heapprof attach` on running processes that have
 * libheapprof.so preloaded and dormant: idle and busy targets, detach and attach again,
 * name targets started later, and the errors a user can make. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
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

#include "tests/e2e/e2e_util.h"

static char runtime_dir[128];

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int setup(void **state)
{
    (void)state;
    snprintf(runtime_dir, sizeof(runtime_dir), "/tmp/heapprof-e2e-attach-XXXXXX");
    if (!mkdtemp(runtime_dir))
        return -1;
    /* Both the attacher and the targets find the session sockets here. */
    setenv("XDG_RUNTIME_DIR", runtime_dir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", runtime_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Starts a dormant worker (library preloaded, no service at startup); its stdout goes
 * to @out. */
static pid_t start_worker(const char *mode, const char *ms, const char *out)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        execl(e2e_env("WORKER"), "worker", mode, ms, (char *)NULL);
        _exit(127);
    }
    /* Wait until it runs (and the library's constructor installed its handler). */
    for (int i = 0; i < 200; i++) {
        struct stat st;
        if (stat(out, &st) == 0 && st.st_size > 0)
            break;
        sleep_ms(10);
    }
    return pid;
}

static int wait_status(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 65536);
    if (f) {
        size_t n = fread(buf, 1, 65535, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* Runs `heapprof attach ARGS -o TRACE -q` and loads the trace's process @pid. */
static struct rp_trace *attach(char *const args[], const char *trace, int want_status,
                               struct e2e_run *run)
{
    char *argv[32];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "attach";
    for (size_t i = 0; args[i] && k < 26; i++)
        argv[k++] = args[i];
    argv[k++] = "-o";
    argv[k++] = (char *)trace;
    argv[k++] = "-q";
    argv[k] = NULL;
    assert_int_equal(e2e_run(argv, NULL, run), 0);
    print_message("  attach: status %d, stderr: %s\n", run->status, run->err);
    assert_int_equal(run->status, want_status);
    if (want_status != 0)
        return NULL;
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    return t;
}

static const struct rp_trace_process *find_pid(const struct rp_trace *t, pid_t pid)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == pid)
            return &t->processes[i];
    return NULL;
}

static void test_attach_idle_detach_reattach(void **state)
{
    (void)state;
    char out[256], trace[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/idle.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/idle.pftrace", runtime_dir);
    pid_t w = start_worker("idle", "3000", out);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);

    for (int round = 0; round < 2; round++) {
        struct e2e_run run;
        char *args[] = {"-p", pidbuf, "--duration", "0.8", "-i", "1", NULL};
        struct rp_trace *t = attach(args, trace, 0, &run);
        const struct rp_trace_process *p = find_pid(t, w);
        assert_non_null(p);
        assert_false(p->from_startup);
        /* one 1000-byte leak every 100 ms, all recorded at interval 1 */
        struct e2e_sums s;
        e2e_sum_function(p, "worker_leak", &s);
        print_message("  round %d: worker_leak %llu bytes in %llu allocations\n", round,
                      (unsigned long long)s.alloc_bytes, (unsigned long long)s.alloc_count);
        assert_true(s.alloc_count >= 3);
        assert_int_equal(s.alloc_bytes, s.alloc_count * 1000);
        rp_trace_free(t);
        e2e_run_free(&run);
    }
    /* Detached twice, the worker carries on and ends normally. */
    assert_int_equal(wait_status(w), 0);
    char *o = read_all(out);
    assert_non_null(strstr(o, "done"));
    free(o);
}

static void test_attach_busy(void **state)
{
    (void)state;
    char out[256], trace[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/busy.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/busy.pftrace", runtime_dir);
    pid_t w = start_worker("busy", "2000", out);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    struct e2e_run run;
    char *args[] = {"-p", pidbuf, "--duration", "0.6", NULL};
    struct rp_trace *t = attach(args, trace, 0, &run);
    const struct rp_trace_process *p = find_pid(t, w);
    assert_non_null(p);
    assert_true(p->heap_samples > 10);
    struct e2e_sums s;
    e2e_sum_function(p, "worker_churn", &s);
    assert_true(s.alloc_count > 0);
    rp_trace_free(t);
    e2e_run_free(&run);
    assert_int_equal(wait_status(w), 0);
    char *o = read_all(out);
    assert_non_null(strstr(o, "done"));
    free(o);
}

static void test_attach_name_started_later(void **state)
{
    (void)state;
    char out[256], trace[256];
    snprintf(out, sizeof(out), "%s/later.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/later.pftrace", runtime_dir);
    pid_t a = fork();
    if (a == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(e2e_env("HEAPPROF_BIN"), "heapprof", "attach", "-n", "worker", "--duration", "2",
              "-i", "1", "-q", "-o", trace, (char *)NULL);
        _exit(127);
    }
    sleep_ms(300);
    pid_t w = start_worker("idle", "1200", out);
    assert_int_equal(wait_status(w), 0);
    assert_int_equal(wait_status(a), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = find_pid(t, w);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "worker_leak", &s);
    assert_true(s.alloc_count >= 2);
    rp_trace_free(t);
}

static void test_attach_user_errors(void **state)
{
    (void)state;
    char trace[256];
    snprintf(trace, sizeof(trace), "%s/err.pftrace", runtime_dir);
    struct e2e_run run;
    /* A process without the library. */
    pid_t plain = fork();
    if (plain == 0) {
        execl("/bin/sleep", "sleep", "5", (char *)NULL);
        _exit(127);
    }
    sleep_ms(50);
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)plain);
    char *args[] = {"-p", pidbuf, NULL};
    attach(args, trace, 1, &run);
    assert_non_null(strstr(run.err, "does not have libheapprof.so loaded"));
    assert_non_null(strstr(run.err, "LD_PRELOAD"));
    e2e_run_free(&run);
    kill(plain, SIGKILL);
    wait_status(plain);

    char *bad[] = {"-p", "12abc", NULL};
    attach(bad, trace, 2, &run);
    assert_non_null(strstr(run.err, "invalid pid '12abc'"));
    e2e_run_free(&run);
    char *none[] = {"-p", "4194303", NULL};
    attach(none, trace, 1, &run);
    assert_non_null(strstr(run.err, "no process with pid 4194303"));
    e2e_run_free(&run);
    char *nothing[] = {"--duration", "1", NULL};
    attach(nothing, trace, 2, &run);
    assert_non_null(strstr(run.err, "-p or -n"));
    e2e_run_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attach_idle_detach_reattach),
        cmocka_unit_test(test_attach_busy),
        cmocka_unit_test(test_attach_name_started_later),
        cmocka_unit_test(test_attach_user_errors),
    };
    return cmocka_run_group_tests_name("e2e_attach", tests, setup, teardown);
}
