/* tests/e2e/test_daemon.c: heapprofd with real processes: startup profiling, continuous
 * dumps, SIGUSR1 dumps, many concurrent targets, configuration errors, other users,
 * and either side killed mid-run. */
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

#include "tests/e2e/e2e_daemon.h"

static void daemon_start(struct e2e_daemon *d, const char *const args[])
{
    e2e_daemon_prepare(d, "daemon");
    e2e_daemon_launch(d, args);
}

static void daemon_cleanup(struct e2e_daemon *d)
{
    /* Traces with dumps follow the trace processor's import rules. */
    struct rp_trace *t = NULL;
    if (rp_trace_load(d->trace, &(struct rp_trace_options){0}, &t) == 0) {
        bool dumped = false;
        for (size_t i = 0; i < t->n_processes; i++)
            dumped |= t->processes[i].n_dumps > 0;
        if (dumped)
            assert_int_equal(e2e_check_rules(d->trace), 0);
        rp_trace_free(t);
    }
    e2e_daemon_remove_files(d);
}

/* Runs @prog under the daemon (startup profiling). */
static void run_client(struct e2e_daemon *d, char *const prog[], struct e2e_run *run)
{
    char preload[4200], sock[400];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
    snprintf(sock, sizeof(sock), "HEAPPROF_SOCKET=%s", d->sock);
    char *env[] = {preload, sock, "HEAPPROF_STARTUP=1", NULL};
    assert_int_equal(e2e_run(prog, env, run), 0);
}

static void test_daemon_startup_profiling(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"-n",       "three_sites",    "-i",
                          "1",        "--block-client", "--block-timeout-us",
                          "30000000", "--no-running",   NULL};
    daemon_start(&d, args);
    struct e2e_run run, other;
    char *prog[] = {(char *)e2e_env("THREE_SITES"), "1", "4", NULL};
    run_client(&d, prog, &run);
    assert_int_equal(run.status, 4);
    /* Not a target: runs unprofiled, quietly. */
    char *prog2[] = {(char *)e2e_env("WORKER"), "busy", "50", NULL};
    run_client(&d, prog2, &other);
    assert_int_equal(other.status, 0);
    assert_string_equal(other.err, "");
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);

    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    const struct rp_trace_process *p = e2e_find_process(t, "three_sites");
    assert_non_null(p);
    assert_true(p->from_startup);
    /* It exited normally: disconnected as heapprofd marks every ended session, not lost. */
    assert_true(p->disconnected);
    assert_false(p->connection_lost);
    e2e_check_exact_sites(p, run.out);
    rp_trace_free(t);
    e2e_run_free(&run);
    e2e_run_free(&other);
    daemon_cleanup(&d);
}

static void test_daemon_continuous_and_sigusr1(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--continuous-dump", "100,0", "--no-running", NULL};
    daemon_start(&d, args);
    char *prog[] = {(char *)e2e_env("WORKER"), "busy", "1200", NULL};
    pid_t w = e2e_spawn_client(&d, prog, NULL);
    e2e_sleep_ms(350);
    kill(d.pid, SIGUSR1);
    assert_int_equal(e2e_wait_status(w), 0);
    assert_int_equal(e2e_daemon_stop(&d, SIGTERM), 0);

    /* Every dump of the process, in order: timestamps increase, cumulative values never
     * decrease. */
    uint64_t last_ts = 0, last_alloc = 0, last_free = 0;
    int dumps = 0;
    for (int n = 1;; n++) {
        struct rp_trace *t = NULL;
        assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){.dump_index = n}, &t),
                         0);
        const struct rp_trace_process *p = e2e_find_pid(t, w);
        assert_non_null(p);
        if ((int)p->n_dumps < n) {
            rp_trace_free(t);
            break;
        }
        uint64_t alloc = 0, freed = 0;
        for (size_t i = 0; i < p->n_callsites; i++) {
            alloc += p->callsites[i].self_allocated;
            freed += p->callsites[i].self_freed;
        }
        assert_true(p->timestamp > last_ts);
        assert_true(alloc >= last_alloc);
        assert_true(freed >= last_free);
        last_ts = p->timestamp;
        last_alloc = alloc;
        last_free = freed;
        dumps++;
        rp_trace_free(t);
    }
    print_message("  %d dumps of the worker\n", dumps);
    assert_true(dumps >= 4); /* >= 3 continuous + the final one (and SIGUSR1's) */
    assert_true(last_alloc > 0);
    daemon_cleanup(&d);
}

/* A dump requested right after the app allocated holds those allocations and frees: the
 * service reads the rings before it dumps, however late it would have read them
 * otherwise, and asks the clients for the frees their threads hold in batches (the
 * library's own rounds, which record them too, are off here: HEAPPROF_TEST_SWEEP=0). */
static void test_daemon_dump_includes_recent_records(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "-i", "1", "--no-running", NULL};
    daemon_start(&d, args);
    assert_int_equal(setenv("HEAPPROF_TEST_SWEEP", "0", 1), 0);
    for (int round = 0; round < 5; round++) {
        char out[400];
        snprintf(out, sizeof(out), "%s/hold-%d.out", d.dir, round);
        char *prog[] = {(char *)e2e_env("WORKER"), "hold", "400", NULL};
        pid_t w = e2e_spawn_client(&d, prog, out);
        char *text = NULL;
        for (int i = 0; i < 5000; i++) {
            text = e2e_read_file(out);
            if (strstr(text, "leaked\n"))
                break;
            free(text);
            text = NULL;
            e2e_sleep_ms(1);
        }
        assert_non_null(text);
        if (round % 2) {
            kill(d.pid, SIGUSR1);
        } else {
            /* `heapprof dump`: a request on the socket, which the daemon answers. */
            char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "dump", "--socket", d.sock, NULL};
            struct e2e_run run;
            assert_int_equal(e2e_run(argv, NULL, &run), 0);
            char want[64];
            snprintf(want, sizeof(want), "asked heapprofd (pid %d) to dump", (int)d.pid);
            if (run.status != 0)
                print_message("  heapprof dump: status %d: %s", run.status, run.err);
            assert_int_equal(run.status, 0);
            assert_non_null(strstr(run.err, want));
            e2e_run_free(&run);
        }
        assert_int_equal(e2e_wait_status(w), 0);
        e2e_sleep_ms(100);

        /* The first dump of the process is the one asked for (the final one comes at its
         * exit). */
        struct rp_trace *t = NULL;
        assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){.dump_index = 1}, &t),
                         0);
        const struct rp_trace_process *p = e2e_find_pid(t, w);
        assert_non_null(p);
        assert_true(p->n_dumps >= 2);
        e2e_check_exact_sites(p, text);
        rp_trace_free(t);
        free(text);
    }
    (void)unsetenv("HEAPPROF_TEST_SWEEP");
    assert_int_equal(e2e_daemon_stop(&d, SIGTERM), 0);
    daemon_cleanup(&d);
}

/* `heapprof dump` never signals a process: not one named on the command line, not one
 * from a file; without a daemon it says so (issue 15, case 9: it used to send SIGUSR1 to
 * the pid given, which killed `sleep`). With a daemon, a pid that is not that daemon's is
 * refused and nothing is dumped. */
static void test_daemon_bug_dump_signals_any_pid(void **state)
{
    (void)state;
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "dump");
    pid_t victim = fork();
    assert_true(victim >= 0);
    if (victim == 0) {
        execl("/bin/sleep", "sleep", "100", (char *)NULL);
        _exit(127);
    }
    char pid[16], xdg[300];
    snprintf(pid, sizeof(pid), "%d", (int)victim);
    /* As a user types it: `heapprof dump $!`, no daemon in the runtime directory. */
    snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", d.dir);
    char *plain[] = {(char *)e2e_env("HEAPPROF_BIN"), "dump", pid, NULL};
    char *env[] = {xdg, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(plain, env, &run), 0);
    print_message("  no daemon: status %d, %s", run.status, run.err);
    e2e_sleep_ms(100);
    int st;
    assert_int_equal(waitpid(victim, &st, WNOHANG), 0); /* alive */
    assert_int_equal(run.status, 1);
    assert_non_null(strstr(run.err, "no heapprofd is running"));
    e2e_run_free(&run);

    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "dump", "--socket", d.sock, pid, NULL};
    const char *args[] = {"--all", "--no-running", NULL};
    e2e_daemon_launch(&d, args);
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    print_message("  daemon %d, asked for %s: status %d, %s", (int)d.pid, pid, run.status, run.err);
    assert_int_equal(run.status, 1);
    assert_non_null(strstr(run.err, "is not the heapprofd"));
    e2e_run_free(&run);
    assert_int_equal(waitpid(victim, &st, WNOHANG), 0);
    kill(victim, SIGKILL);
    assert_int_equal(e2e_wait_status(victim), 128 + SIGKILL);
    assert_int_equal(e2e_daemon_stop(&d, SIGTERM), 0);
    daemon_cleanup(&d);
}

static void test_daemon_16_targets(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"-n",       "three_sites",    "-i",
                          "1",        "--block-client", "--block-timeout-us",
                          "30000000", "--no-running",   NULL};
    /* An ending session's records are all read, however busy the service is: with a
     * 1 ms end budget (renewed while records are read) nothing of the 16 ends is
     * skipped. A fixed 3 s budget lost a third of some clients' records under TSan on a
     * loaded machine, and then their leaks read as possibly freed. */
    setenv("HEAPPROF_TEST_END_BUDGET_MS", "1", 1);
    daemon_start(&d, args);
    unsetenv("HEAPPROF_TEST_END_BUDGET_MS");
    enum { N = 16 };
    pid_t pids[N];
    char outs[N][300];
    char *prog[] = {(char *)e2e_env("THREE_SITES"), "1", NULL};
    for (int i = 0; i < N; i++) {
        snprintf(outs[i], sizeof(outs[i]), "%s/out-%d.txt", d.dir, i);
        pids[i] = e2e_spawn_client(&d, prog, outs[i]);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(e2e_wait_status(pids[i]), 0);
    e2e_daemon_wait_ended(&d, pids, N, 60000);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, N);
    for (int i = 0; i < N; i++) {
        const struct rp_trace_process *p = NULL;
        for (size_t j = 0; j < t->n_processes; j++)
            if (t->processes[j].pid == pids[i])
                p = &t->processes[j];
        assert_non_null(p);
        char *out = e2e_read_file(outs[i]);
        e2e_check_exact_sites(p, out);
        free(out);
        unlink(outs[i]);
    }
    rp_trace_free(t);
    daemon_cleanup(&d);
}

static void test_daemon_config_errors(void **state)
{
    (void)state;
    char path[] = "/tmp/heapprof-e2e-cfg-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "sampling_interval_bytes: 4096\nbogus_field: 1\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char *argv[] = {(char *)e2e_env("HEAPPROFD_BIN"), "--config", path, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 2);
    char want[400];
    snprintf(want, sizeof(want), "%s:2: unknown field 'bogus_field'", path);
    assert_non_null(strstr(run.err, want));
    e2e_run_free(&run);

    char *argv2[] = {(char *)e2e_env("HEAPPROFD_BIN"), "-i", "0", NULL};
    assert_int_equal(e2e_run(argv2, NULL, &run), 0);
    assert_int_equal(run.status, 2);
    assert_non_null(strstr(run.err, "invalid sampling interval"));
    e2e_run_free(&run);
    char *argv3[] = {(char *)e2e_env("HEAPPROFD_BIN"), "--continuous-dump", "5", NULL};
    assert_int_equal(e2e_run(argv3, NULL, &run), 0);
    assert_int_equal(run.status, 2);
    e2e_run_free(&run);
    unlink(path);
}

static void test_daemon_socket_in_use(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--no-running", NULL};
    daemon_start(&d, args);
    char *argv[] = {(char *)e2e_env("HEAPPROFD_BIN"), "--socket", d.sock, "-o", "/dev/null", NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 3);
    /* Said once, by the command, with the socket. */
    const char *said = strstr(run.err, "already");
    assert_non_null(said);
    assert_null(strstr(said + 1, "already"));
    assert_non_null(strstr(run.err, d.sock));
    e2e_run_free(&run);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    daemon_cleanup(&d);
}

static void test_daemon_other_user_rejected(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* needs root to run a client as another uid */
    struct e2e_daemon d;
    const char *args[] = {"--all", "--no-running", NULL};
    daemon_start(&d, args);
    chmod(d.dir, 0755);
    chmod(d.sock, 0777);
    char out[300];
    snprintf(out, sizeof(out), "%s/nobody.txt", d.dir);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    close(fd);
    chmod(out, 0666);
    pid_t pid = fork();
    if (pid == 0) {
        fd = open(out, O_WRONLY);
        dup2(fd, 1);
        if (setgid(65534) < 0 || setuid(65534) < 0)
            _exit(99);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_SOCKET", d.sock, 1);
        setenv("HEAPPROF_STARTUP", "1", 1);
        char *prog[] = {(char *)e2e_env("THREE_SITES"), "1", NULL};
        execv(prog[0], prog);
        _exit(127);
    }
    int st = e2e_wait_status(pid);
    if (st == 99 || st == 127) {
        e2e_daemon_stop(&d, SIGINT);
        daemon_cleanup(&d);
        skip(); /* cannot switch user or the test files are not readable by nobody */
    }
    assert_int_equal(st, 0);
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "truth alloc_leaked"));
    free(o);
    unlink(out);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    assert_non_null(strstr(log, "uid 65534 rejected"));
    free(log);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 0);
    rp_trace_free(t);
    daemon_cleanup(&d);
}

static void test_daemon_killed_mid_run(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--block-client", "--no-running", NULL};
    daemon_start(&d, args);
    char out[300];
    snprintf(out, sizeof(out), "%s/worker.txt", d.dir);
    char *prog[] = {(char *)e2e_env("WORKER"), "busy", "600", NULL};
    pid_t w = e2e_spawn_client(&d, prog, out);
    e2e_sleep_ms(200);
    e2e_daemon_stop(&d, SIGKILL);
    /* The target keeps running and finishes normally. */
    assert_int_equal(e2e_wait_status(w), 0);
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "done"));
    free(o);
    unlink(out);
    daemon_cleanup(&d);
}

static void test_daemon_target_killed(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--no-running", NULL};
    daemon_start(&d, args);
    char *prog[] = {(char *)e2e_env("WORKER"), "busy", "5000", NULL};
    pid_t w = e2e_spawn_client(&d, prog, "/dev/null");
    e2e_sleep_ms(300);
    kill(w, SIGKILL);
    assert_int_equal(e2e_wait_status(w), 128 + SIGKILL);
    /* A second client is still served after the first one died. */
    struct e2e_run run;
    char *prog2[] = {(char *)e2e_env("THREE_SITES"), "1", NULL};
    run_client(&d, prog2, &run);
    assert_int_equal(run.status, 0);
    e2e_sleep_ms(100);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = NULL;
    for (size_t j = 0; j < t->n_processes; j++)
        if (t->processes[j].pid == w)
            p = &t->processes[j];
    assert_non_null(p);
    assert_true(p->disconnected);
    assert_true(p->heap_samples > 0);
    assert_non_null(e2e_find_process(t, "three_sites"));
    rp_trace_free(t);
    e2e_run_free(&run);
    daemon_cleanup(&d);
}

/* Issue 18 (live feedback): the daemon says what happens to each process, in one line
 * each (pid, name, samples, why): it said nothing unless asked for debug logs. A process
 * killed is "dropped" there; a lost connection is connection_lost in the trace, while
 * Perfetto's disconnected marks every ended session, as heapprofd sets it. */
static void test_daemon_bug_disconnected_on_every_exit(void **state)
{
    (void)state;
    struct e2e_daemon d;
    const char *args[] = {"--all", "--no-running", NULL};
    daemon_start(&d, args);
    struct e2e_run run;
    char *prog[] = {(char *)e2e_env("THREE_SITES"), "1", NULL};
    run_client(&d, prog, &run);
    assert_int_equal(run.status, 0);
    char *prog2[] = {(char *)e2e_env("WORKER"), "busy", "5000", NULL};
    pid_t w = e2e_spawn_client(&d, prog2, "/dev/null");
    e2e_sleep_ms(300);
    kill(w, SIGKILL);
    assert_int_equal(e2e_wait_status(w), 128 + SIGKILL);
    e2e_sleep_ms(200);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);

    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *ok = e2e_find_process(t, "three_sites");
    const struct rp_trace_process *killed = e2e_find_pid(t, w);
    assert_non_null(ok);
    assert_non_null(killed);
    /* Both ended (Perfetto's disconnected); neither was lost by the profiler: the
     * killed one is told apart in the daemon's log. */
    assert_true(ok->disconnected);
    assert_false(ok->connection_lost);
    assert_true(killed->disconnected);
    assert_false(killed->connection_lost);
    char *log = e2e_read_file(d.log);
    char line[256];
    snprintf(line, sizeof(line), "pid %d (three_sites): profiling (from its start)\n", ok->pid);
    assert_non_null(strstr(log, line));
    snprintf(line, sizeof(line), "pid %d (three_sites): ended (exited): %llu samples\n", ok->pid,
             (unsigned long long)ok->heap_samples);
    if (!strstr(log, line))
        fail_msg("no line \"%s\" in the log:\n%s", line, log);
    snprintf(line, sizeof(line),
             "pid %d (worker): dropped (went away without exiting: killed, crashed or _exit; "
             "frees of its last 200 ms may be missing): %llu samples",
             (int)w, (unsigned long long)killed->heap_samples);
    if (!strstr(log, line))
        fail_msg("no line \"%s\" in the log:\n%s", line, log);
    free(log);
    rp_trace_free(t);
    e2e_run_free(&run);
    daemon_cleanup(&d);
}

static void test_daemon_guardrail(void **state)
{
    (void)state;
    struct e2e_daemon d;
    /* The service's own resident memory at rest, then a limit 9.5 MiB above it: room to
     * admit one client (its 8 MiB ring and unwind table count whole), whose ring, as it
     * is read, and samples push the service over. Under TSan the service grows by a few
     * MiB of its own between that reading and the client's arrival (shadow memory of its
     * threads), which alone refused the client: 6 MiB more there. */
    const char *plain[] = {"--all", "--no-running", NULL};
    daemon_start(&d, plain);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)d.pid);
    char *status = e2e_read_file(path);
    const char *rss = strstr(status, "VmRSS:");
    assert_non_null(rss);
    long base_kb = atol(rss + 6);
    free(status);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    daemon_cleanup(&d);
    char limit[32];
#ifdef __SANITIZE_THREAD__
    base_kb += 6144;
#endif
    snprintf(limit, sizeof(limit), "%ld", base_kb + 9728);
    const char *args[] = {"--all", "--no-running", "--max-memory-kb", limit, NULL};
    daemon_start(&d, args);
    char out[300];
    snprintf(out, sizeof(out), "%s/worker.txt", d.dir);
    char *prog[] = {(char *)e2e_env("WORKER"), "busy", "600", NULL};
    pid_t w = e2e_spawn_client(&d, prog, out);
    assert_int_equal(e2e_wait_status(w), 0);
    char *o = e2e_read_file(out);
    assert_non_null(strstr(o, "done"));
    free(o);
    unlink(out);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    if (!strstr(log, "guardrail hit"))
        fail_msg("no \"guardrail hit\" in the daemon's log (limit %s KiB):\n%s", limit, log);
    free(log);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "worker");
    assert_non_null(p);
    assert_true(p->hit_guardrail);
    /* Samples are usually there too, but a sanitizer build's own memory growth can fire
     * the guardrail before the first one: not asserted. */
    rp_trace_free(t);
    daemon_cleanup(&d);
}

static void test_daemon_attaches_running_targets(void **state)
{
    (void)state;
    /* A dormant process (library preloaded, not connecting at startup) that is already
     * running when the daemon starts gets the attach signal and is profiled. */
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "daemon");
    char out[300];
    snprintf(out, sizeof(out), "%s/worker.txt", d.dir);
    pid_t w = fork();
    if (w == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_SOCKET", d.sock, 1);
        setenv("HEAPPROF_STARTUP", "0", 1);
        execl(e2e_env("WORKER"), "worker", "idle", "1500", (char *)NULL);
        _exit(127);
    }
    e2e_sleep_ms(200);
    char pidbuf[16];
    snprintf(pidbuf, sizeof(pidbuf), "%d", (int)w);
    const char *args[] = {"-p", pidbuf, "-i", "1", NULL};
    e2e_daemon_launch(&d, args);
    assert_int_equal(e2e_wait_status(w), 0);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "worker");
    assert_non_null(p);
    assert_false(p->from_startup);
    struct e2e_sums s;
    e2e_sum_function(p, "worker_leak", &s);
    print_message("  running target: %llu worker_leak allocations\n",
                  (unsigned long long)s.alloc_count);
    assert_true(s.alloc_count >= 3);
    rp_trace_free(t);
    unlink(out);
    daemon_cleanup(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_startup_profiling),
        cmocka_unit_test(test_daemon_continuous_and_sigusr1),
        cmocka_unit_test(test_daemon_dump_includes_recent_records),
        cmocka_unit_test(test_daemon_bug_dump_signals_any_pid),
        cmocka_unit_test(test_daemon_16_targets),
        cmocka_unit_test(test_daemon_config_errors),
        cmocka_unit_test(test_daemon_socket_in_use),
        cmocka_unit_test(test_daemon_other_user_rejected),
        cmocka_unit_test(test_daemon_killed_mid_run),
        cmocka_unit_test(test_daemon_target_killed),
        cmocka_unit_test(test_daemon_bug_disconnected_on_every_exit),
        cmocka_unit_test(test_daemon_guardrail),
        cmocka_unit_test(test_daemon_attaches_running_targets),
    };
    /* HEAPPROF_TEST_FILTER=pattern runs the matching tests only (while iterating). */
    const char *filter = getenv("HEAPPROF_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("e2e_daemon", tests, NULL, NULL);
}
