/* tests/e2e/test_attach.c: `heapprof attach` on running processes that have
 * libheapprof.so preloaded and dormant: idle and busy targets, detach and attach again,
 * name targets started later, and the errors a user can make. Also what attaching must
 * never do (issue 15): keep a thread in a dormant process or after the session, kill a
 * process still in its constructors or one with another attach signal. */
#include <dirent.h>
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

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int setup(void **state)
{
    (void)state;
    if (e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "attach") < 0)
        return -1;
    /* Both the attacher and the targets find the session sockets here. */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* Starts @argv (e2e_env() names its program, @argv[0]) dormant: the library preloaded, no
 * service at startup, the "NAME=value" strings of @env (NULL-ended, or NULL) set, stdout
 * to @out. Returns once it printed (the library's constructor installed its handler),
 * at most 5 s. */
static pid_t start_dormant(const char *prog_env, char *const argv[], const char *const env[],
                           const char *out)
{
    /* The wait below is for this program's first line: a file left by the test before
     * would end it at once, and attach would find the forked test still in its place. */
    unlink(out);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        dup2(fd, 1);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(e2e_env(prog_env), argv);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        struct stat st;
        if (stat(out, &st) == 0 && st.st_size > 0)
            break;
        e2e_sleep_ms(10);
    }
    return pid;
}

/* A dormant worker (tests/programs/worker.c, or the build of it @prog_env names) in @mode
 * for @ms; @signal: its HEAPPROF_ATTACH_SIGNAL, or NULL. */
static pid_t start_worker_prog(const char *prog_env, const char *mode, const char *ms,
                               const char *out, const char *signal)
{
    char sig_env[64];
    snprintf(sig_env, sizeof(sig_env), "HEAPPROF_ATTACH_SIGNAL=%s", signal ? signal : "");
    const char *env[] = {signal ? sig_env : NULL, NULL};
    char *argv[] = {"worker", (char *)mode, (char *)ms, NULL};
    return start_dormant(prog_env, argv, env, out);
}

static pid_t start_worker_sig(const char *mode, const char *ms, const char *out, const char *signal)
{
    return start_worker_prog("WORKER", mode, ms, out, signal);
}

static pid_t start_worker(const char *mode, const char *ms, const char *out)
{
    return start_worker_sig(mode, ms, out, NULL);
}

static int wait_status(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The command line `heapprof attach ARGS -o TRACE [-q]` in @argv. */
static void attach_argv(char *const args[], const char *trace, bool quiet, char *argv[32])
{
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "attach";
    for (size_t i = 0; args[i] && k < 26; i++)
        argv[k++] = args[i];
    argv[k++] = "-o";
    argv[k++] = (char *)trace;
    if (quiet)
        argv[k++] = "-q";
    argv[k] = NULL;
}

/* Runs `heapprof attach ARGS -o TRACE -q` and loads the trace's process @pid. */
static struct rp_trace *attach(char *const args[], const char *trace, int want_status,
                               struct e2e_run *run)
{
    char *argv[32];
    attach_argv(args, trace, true, argv);
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
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "done"));
    free(o);
}

static void attach_busy(const char *prog_env)
{
    char out[256], trace[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/busy.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/busy.pftrace", runtime_dir);
    pid_t w = start_worker_prog(prog_env, "busy", "2000", out, NULL);
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
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "done"));
    free(o);
}

static void test_attach_busy(void **state)
{
    (void)state;
    attach_busy("WORKER");
}

/* An executable with a __thread variable died of SIGSEGV on attach: the attach thread,
 * which has no glibc thread block, called dl_iterate_phdr, which reads each module's TLS
 * block through it. */
static void test_attach_bug_executable_tls_killed(void **state)
{
    (void)state;
    attach_busy("WORKER_TLS");
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
        execl(e2e_env("HEAPPROF_BIN"), "heapprof", "attach", "-n", "worker", "--duration", "4",
              "-i", "1", "-q", "-o", trace, (char *)NULL);
        _exit(127);
    }
    e2e_sleep_ms(300);
    /* It allocates every 100 ms until after the attach ends: names are looked for every
     * 500 ms, and on a busy machine the attach may come late in its 4 s. */
    pid_t w = start_worker("idle", "5000", out);
    assert_int_equal(wait_status(a), 0);
    assert_int_equal(wait_status(w), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = find_pid(t, w);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "worker_leak", &s);
    print_message("  worker_leak: %llu samples\n", (unsigned long long)s.alloc_count);
    assert_true(s.alloc_count >= 2);
    rp_trace_free(t);
}

/* Threads of @pid (its /proc/PID/task entries). */
static int threads_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* True when @pid maps a ring: a session is on. */
static bool has_ring(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *m = e2e_read_file(path);
    bool r = strstr(m, "heapprof-ring") != NULL;
    free(m);
    return r;
}

/* Waits up to @ms for @pid to be back to dormant: one thread, no ring. */
static bool back_to_dormant(pid_t pid, long ms)
{
    for (long t = 0; t < ms; t += 10) {
        if (threads_of(pid) == 1 && !has_ring(pid))
            return true;
        e2e_sleep_ms(10);
    }
    return false;
}

/* Starts `heapprof attach ARGS -o TRACE -q` in the background, stderr to @err. */
static pid_t attach_bg(char *const args[], const char *trace, const char *err)
{
    pid_t a = fork();
    assert_true(a >= 0);
    if (a == 0) {
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        char *argv[32];
        attach_argv(args, trace, true, argv);
        execv(argv[0], argv);
        _exit(127);
    }
    return a;
}

/* A dormant process has no thread of ours: a process blocked in read(2) that never
 * allocates stays single-threaded (it had a helper thread before, issue 15 case 6); the
 * attach still comes promptly; after the session the process is single-threaded again. */
static void test_attach_bug_dormant_thread_blocked_reader(void **state)
{
    (void)state;
    char trace[256], err[256];
    snprintf(trace, sizeof(trace), "%s/cat.pftrace", runtime_dir);
    snprintf(err, sizeof(err), "%s/cat.err", runtime_dir);
    int in[2];
    assert_int_equal(pipe(in), 0);
    pid_t cat = fork();
    assert_true(cat >= 0);
    if (cat == 0) {
        dup2(in[0], 0);
        close(in[1]);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        execl("/bin/cat", "cat", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    /* Blocked in read(2) once its handler is advertised. */
    for (int i = 0; i < 500; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/maps", (int)cat);
        char *m = e2e_read_file(path);
        bool ready = strstr(m, "heapprof-attach-") != NULL;
        free(m);
        if (ready)
            break;
        e2e_sleep_ms(10);
    }
    e2e_sleep_ms(50);
    print_message("  dormant cat: %d thread(s)\n", threads_of(cat));
    assert_int_equal(threads_of(cat), 1);

    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)cat);
    char *args[] = {"-p", pidbuf, "--duration", "1", NULL};
    uint64_t t0 = now_ms();
    pid_t a = attach_bg(args, trace, err);
    uint64_t ms = 0;
    while (!has_ring(cat) && (ms = now_ms() - t0) < 5000)
        e2e_sleep_ms(1);
    print_message("  ring mapped %llu ms after heapprof attach started\n", (unsigned long long)ms);
    assert_true(ms < 1000); /* the service's own start included; the signal to the
                               handshake is timed by the preload unit test (< 100 ms) */
    assert_int_equal(threads_of(cat), 2);
    assert_int_equal(wait_status(a), 0);
    assert_true(back_to_dormant(cat, 2000));
    close(in[1]);
    assert_int_equal(wait_status(cat), 0);
}

/* The service killed mid-session: the process goes back to the dormant cost, with no
 * thread of ours left (it kept one before, issue 15 case 6). */
static void test_attach_bug_service_killed_thread_stays(void **state)
{
    (void)state;
    char out[256], trace[256], err[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/killed.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/killed.pftrace", runtime_dir);
    snprintf(err, sizeof(err), "%s/killed.err", runtime_dir);
    pid_t w = start_worker("idle", "3000", out);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    assert_int_equal(threads_of(w), 1);
    char *args[] = {"-p", pidbuf, "--duration", "20", NULL};
    pid_t a = attach_bg(args, trace, err);
    for (int i = 0; i < 500 && !has_ring(w); i++)
        e2e_sleep_ms(10);
    assert_true(has_ring(w));
    kill(a, SIGKILL);
    assert_int_equal(wait_status(a), 128 + SIGKILL);
    assert_true(back_to_dormant(w, 1000));
    assert_int_equal(wait_status(w), 0);
}

/* A process that maps the library but is still in its constructors (its wake entry is
 * not advertised yet) is left alone: the attach waits until it is ready (the attach
 * signal used to kill it with "Real-time signal 4", issue 15 case 9). */
static void test_attach_bug_kills_process_in_constructors(void **state)
{
    (void)state;
    char out[256], trace[256];
    snprintf(out, sizeof(out), "%s/slow.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/slow.pftrace", runtime_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        /* 3 s: the attach, started once the library is mapped, must find the constructor
         * still running also on a loaded machine (1 s was not always enough there). */
        setenv("SLOWCTOR_MS", "3000", 1);
        execl(e2e_env("HARM_SLOWCTOR"), "harm_slowctor", "2000", (char *)NULL);
        _exit(127);
    }
    /* The library is mapped from the start; its constructor runs 3 s later. */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    bool mapped = false;
    for (int i = 0; i < 200 && !mapped; i++) {
        char *m = e2e_read_file(path);
        mapped = strstr(m, "libheapprof.so") != NULL;
        assert_null(strstr(m, "heapprof-attach-"));
        free(m);
        if (!mapped)
            e2e_sleep_ms(5);
    }
    assert_true(mapped);
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)pid);
    struct e2e_run run;
    char *args[] = {"-p", pidbuf, "--duration", "6", "-i", "1", "--no-status", NULL};
    char *argv[32];
    attach_argv(args, trace, false, argv);
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    print_message("  attach: status %d, stderr: %.300s\n", run.status, run.err);
    /* The program survives, and was attached once ready. */
    assert_int_equal(wait_status(pid), 0);
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "done"));
    free(o);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.err, "has not advertised its wake entry yet"));
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = find_pid(t, pid);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "leak_site", &s);
    assert_true(s.alloc_count > 0);
    rp_trace_free(t);
    e2e_run_free(&run);
}

/* A process started with another HEAPPROF_ATTACH_SIGNAL is attached (the attacher used to
 * send its own signal and kill it, issue 15 case 9); no signal is involved any more. */
static void test_attach_bug_other_attach_signal_killed(void **state)
{
    (void)state;
    char out[256], trace[256], pidbuf[16], sig[16];
    snprintf(out, sizeof(out), "%s/sig.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/sig.pftrace", runtime_dir);
    snprintf(sig, sizeof(sig), "%d", SIGRTMIN + 6);
    pid_t w = start_worker_sig("idle", "2000", out, sig);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    struct e2e_run run;
    char *args[] = {"-p", pidbuf, "--duration", "0.8", "-i", "1", NULL};
    struct rp_trace *t = attach(args, trace, 0, &run);
    const struct rp_trace_process *p = find_pid(t, w);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "worker_leak", &s);
    assert_true(s.alloc_count >= 3);
    rp_trace_free(t);
    e2e_run_free(&run);
    assert_int_equal(wait_status(w), 0);
}

static void test_attach_user_errors(void **state)
{
    (void)state;
    char trace[256];
    snprintf(trace, sizeof(trace), "%s/err.pftrace", runtime_dir);
    struct e2e_run run;
    /* A process without the library, and no library to load into it (HEAPPROF_LIB
     * names a missing file): refused, saying what to do. */
    pid_t plain = fork();
    if (plain == 0) {
        execl("/bin/sleep", "sleep", "5", (char *)NULL);
        _exit(127);
    }
    e2e_sleep_ms(50);
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)plain);
    char *args[] = {"-p", pidbuf, NULL};
    char *argv[32];
    attach_argv(args, trace, true, argv);
    char *no_lib[] = {"HEAPPROF_LIB=/nonexistent/libheapprof.so", NULL};
    assert_int_equal(e2e_run(argv, no_lib, &run), 0);
    assert_int_equal(run.status, 1);
    assert_non_null(strstr(run.err, "does not have libheapprof.so loaded"));
    assert_non_null(strstr(run.err, "HEAPPROF_LIB"));
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

/* User trial: `attach -n NAME` that matched nothing said nothing and exited 0 with an
 * empty trace. It must say so, last, exit 1, and leave no trace file (nor a summary
 * naming one). Without a terminal there is no status line. */
static void test_attach_bug_name_matches_nothing(void **state)
{
    (void)state;
    char trace[256];
    snprintf(trace, sizeof(trace), "%s/nomatch.pftrace", runtime_dir);
    char *args[] = {"-n", "heapprof-e2e-no-such-name", "--duration", "1", NULL};
    char *argv[32];
    attach_argv(args, trace, false, argv);
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    print_message("  attach: status %d, stderr: %s\n", run.status, run.err);
    assert_int_equal(run.status, 1);
    assert_non_null(strstr(run.err, "no running process matches 'heapprof-e2e-no-such-name' yet"));
    const char *last = "heapprof attach: no process matched 'heapprof-e2e-no-such-name': "
                       "nothing was profiled\n";
    size_t n = strlen(run.err), k = strlen(last);
    assert_true(n >= k);
    assert_string_equal(run.err + n - k, last);
    assert_null(strstr(run.err, "\033[K"));
    assert_non_null(strstr(run.err, "no process was profiled; no trace written"));
    assert_null(strstr(run.err, "trace written to"));
    assert_int_equal(access(trace, F_OK), -1);
    e2e_run_free(&run);
    unlink(trace);
}

/* User trial: the attach status line had no time. On a terminal it shows the time
 * elapsed, the time left of --duration, the processes and the live heap; the run ends
 * with a line without time left. Nothing says "disconnected" for a process that was
 * detached or exited. */
static void test_attach_status_line(void **state)
{
    (void)state;
    char out[256], trace[256];
    snprintf(out, sizeof(out), "%s/status.out", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/status.pftrace", runtime_dir);
    pid_t w = start_worker("busy", "6000", out);
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    char *args[] = {"-p", pidbuf, "--duration", "3", NULL};
    char *argv[32];
    attach_argv(args, trace, false, argv);
    struct e2e_run run;
    assert_int_equal(e2e_run_pty(argv, &run), 0);
    print_message("  attach on a terminal: status %d, output: %.600s\n", run.status, run.out);
    assert_int_equal(run.status, 0);
    /* "\r\033[Kheapprof: 0:01 (0:02 left), 1 process, live heap 25.8 MiB, ..." */
    const char *first = strstr(run.out, "\r\033[Kheapprof: 0:0");
    assert_non_null(first);
    const char *left = strstr(first, " left), 1 process, live heap ");
    assert_non_null(left);
    assert_true(memchr(first, '\n', (size_t)(left - first)) == NULL);
    /* The last one: no time left. */
    const char *last = first;
    for (const char *p = first; (p = strstr(p + 1, "\r\033[Kheapprof: ")) != NULL;)
        last = p;
    char line[512];
    snprintf(line, sizeof(line), "%.*s", (int)strcspn(last + 2, "\r\n"), last + 2);
    print_message("  last status line: %s\n", line + 2);
    assert_non_null(strstr(line, ", 1 process, live heap "));
    assert_null(strstr(line, "left"));
    assert_null(strstr(line, " 0 samples/s")); /* the mean of the run, not of the last ms */
    assert_null(strstr(run.out, "isconnected"));
    assert_null(strstr(run.out, "DISCONNECTED"));
    e2e_run_free(&run);
    assert_int_equal(wait_status(w), 0);
    unlink(trace);
    unlink(out);
}

/* Starts slotwatch (tests/programs/slotwatch.c) dormant for @ms, stdout to @out, with
 * HEAPPROF_DORMANT_DIRECT=@direct unless NULL; returns once it printed its first line. */
static pid_t start_slotwatch(const char *ms, const char *out, const char *direct)
{
    char direct_env[64];
    snprintf(direct_env, sizeof(direct_env), "HEAPPROF_DORMANT_DIRECT=%s", direct ? direct : "");
    const char *env[] = {direct ? direct_env : NULL, NULL};
    char *argv[] = {"slotwatch", (char *)ms, NULL};
    return start_dormant("SLOTWATCH", argv, env, out);
}

/* Dormant means free (issue 15 case 6): while dormant, the program's PLT slot of malloc
 * leads straight to libc's malloc, not through the library (a forwarding interposer alone
 * costs 5-8% on a malloc+free pair). An attach puts the hook back, so the session samples
 * the program's allocations; after the detach the slot is direct again, also in children
 * forked meanwhile. HEAPPROF_DORMANT_DIRECT=0 keeps the hook. */
static void test_attach_bug_dormant_calls_through_library(void **state)
{
    (void)state;
    char out[256], trace[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/slotwatch.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/slotwatch.pftrace", runtime_dir);

    pid_t w = start_slotwatch("4000", out, NULL);
    e2e_sleep_ms(200);
    char *o = e2e_read_file(out);
    print_message("  dormant: %s", o);
    assert_true(strncmp(o, "direct\n", 7) == 0);
    free(o);

    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    struct e2e_run run;
    char *args[] = {"-p", pidbuf, "--duration", "1", "-i", "4096", NULL};
    struct rp_trace *t = attach(args, trace, 0, &run);
    const struct rp_trace_process *p = find_pid(t, w);
    assert_non_null(p);
    struct e2e_sums s;
    e2e_sum_function(p, "slotwatch_alloc", &s);
    print_message("  session: slotwatch_alloc %llu samples\n", (unsigned long long)s.alloc_count);
    assert_true(s.alloc_count >= 10);
    rp_trace_free(t);
    e2e_run_free(&run);
    assert_true(back_to_dormant(w, 2000));

    assert_int_equal(wait_status(w), 0);
    o = e2e_read_file(out);
    print_message("  lines: %s", o);
    /* direct, hooked during the session, direct again; the forked children likewise. */
    char *hooked = strstr(o, "\nhooked\n");
    assert_non_null(hooked);
    char *again = strstr(hooked, "\ndirect\n");
    assert_non_null(again);
    assert_non_null(strstr(again, "\nchild direct\n"));
    assert_non_null(strstr(again, "\ndone\n"));
    assert_null(strstr(o, "other"));
    assert_null(strstr(o, "failed"));
    assert_null(strstr(again + 1, "hooked"));
    free(o);

    w = start_slotwatch("100", out, "0");
    assert_int_equal(wait_status(w), 0);
    o = e2e_read_file(out);
    print_message("  HEAPPROF_DORMANT_DIRECT=0: %s", o);
    assert_true(strncmp(o, "hooked\n", 7) == 0);
    assert_null(strstr(o, "direct"));
    free(o);
    unlink(out);
    unlink(trace);
}

/* A program started without the library (issue 25): the first attach loads it; during
 * each session the slot leads to the hook, and after each detach straight to libc again
 * (before, the slots kept the hooks for good once loaded). */
static void test_attach_injected_slots_given_back(void **state)
{
    (void)state;
    char out[256], trace[256], pidbuf[16];
    snprintf(out, sizeof(out), "%s/slotwatch-inj.txt", runtime_dir);
    snprintf(trace, sizeof(trace), "%s/slotwatch-inj.pftrace", runtime_dir);
    unlink(out);
    pid_t w = fork();
    assert_true(w >= 0);
    if (w == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        dup2(fd, 1);
        unsetenv("LD_PRELOAD");
        /* Ended by SIGTERM after the second session: two injections take seconds on a
         * loaded machine under ASan. */
        execl(e2e_env("SLOTWATCH"), "slotwatch", "60000", (char *)NULL);
        _exit(127);
    }
    e2e_sleep_ms(200);
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    for (int i = 0; i < 2; i++) {
        struct e2e_run run;
        char *args[] = {"-p", pidbuf, "--duration", "0.5", "-i", "4096", NULL};
        struct rp_trace *t = attach(args, trace, 0, &run);
        const struct rp_trace_process *p = find_pid(t, w);
        assert_non_null(p);
        struct e2e_sums s;
        e2e_sum_function(p, "slotwatch_alloc", &s);
        print_message("  session %d: slotwatch_alloc %llu samples\n", i,
                      (unsigned long long)s.alloc_count);
        assert_true(s.alloc_count >= 10);
        rp_trace_free(t);
        e2e_run_free(&run);
        e2e_sleep_ms(300);
    }
    /* The slot back to direct after the second detach (its third "direct"), then the
     * end. */
    for (int i = 0; i < 1000; i++) {
        char *o = e2e_read_file(out);
        unsigned directs = 0;
        for (const char *at = o; at && (at = strstr(at, "\ndirect")); at++)
            directs++;
        free(o);
        if (directs >= 2) /* the first line has no newline before it */
            break;
        e2e_sleep_ms(10);
    }
    kill(w, SIGTERM);
    assert_int_equal(wait_status(w), 0);
    char *o = e2e_read_file(out);
    print_message("  lines: %s", o);
    /* The program's own lines (not its children's): direct, hooked, direct, hooked,
     * direct, done. */
    char seq[256] = "";
    for (char *l = strtok(o, "\n"); l; l = strtok(NULL, "\n"))
        if (strncmp(l, "child", 5) != 0 && strlen(seq) + strlen(l) + 2 < sizeof(seq)) {
            strcat(seq, l);
            strcat(seq, " ");
        }
    print_message("  program: %s\n", seq);
    assert_string_equal(seq, "direct hooked direct hooked direct done ");
    free(o);
    unlink(out);
    unlink(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attach_idle_detach_reattach),
        cmocka_unit_test(test_attach_busy),
        cmocka_unit_test(test_attach_bug_executable_tls_killed),
        cmocka_unit_test(test_attach_name_started_later),
        cmocka_unit_test(test_attach_user_errors),
        cmocka_unit_test(test_attach_bug_name_matches_nothing),
        cmocka_unit_test(test_attach_status_line),
        cmocka_unit_test(test_attach_bug_dormant_thread_blocked_reader),
        cmocka_unit_test(test_attach_bug_service_killed_thread_stays),
        cmocka_unit_test(test_attach_bug_kills_process_in_constructors),
        cmocka_unit_test(test_attach_bug_other_attach_signal_killed),
        cmocka_unit_test(test_attach_bug_dormant_calls_through_library),
        cmocka_unit_test(test_attach_injected_slots_given_back),
    };
    return cmocka_run_group_tests_name("e2e_attach", tests, setup, teardown);
}
