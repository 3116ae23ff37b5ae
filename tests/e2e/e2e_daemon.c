#include "tests/e2e/e2e_daemon.h"

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

void e2e_daemon_prepare(struct e2e_daemon *d, const char *tag)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/heapprof-e2e-%s-XXXXXX", tag);
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/sock", d->dir);
    snprintf(d->trace, sizeof(d->trace), "%s/out.pftrace", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);
}

void e2e_daemon_launch(struct e2e_daemon *d, const char *const args[])
{
    char *argv[64];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROFD_BIN");
    argv[k++] = "--socket";
    argv[k++] = d->sock;
    argv[k++] = "-o";
    argv[k++] = d->trace;
    argv[k++] = "--no-status";
    for (size_t i = 0; args && args[i] && k < 62; i++)
        argv[k++] = (char *)args[i];
    argv[k] = NULL;
    (void)unlink(d->sock);
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        dup2(fd, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        struct stat st;
        if (stat(d->sock, &st) == 0)
            return;
        e2e_sleep_ms(2);
    }
    fail_msg("heapprofd did not create its socket");
}

int e2e_daemon_stop(struct e2e_daemon *d, int sig)
{
    kill(d->pid, sig);
    return e2e_wait_status(d->pid);
}

void e2e_daemon_remove_files(struct e2e_daemon *d)
{
    /* The whole directory: tests leave their targets' output and traces there too. */
    (void)e2e_runtime_dir_remove(d->dir);
}

void e2e_daemon_wait_ended(const struct e2e_daemon *d, const pid_t *pids, int n, long timeout_ms)
{
    for (long waited = 0;; waited += 20) {
        char *log = e2e_read_file(d->log);
        int ended = 0;
        for (int i = 0; i < n; i++) {
            /* "pid N (name): ended (why): ..." or "pid N (name): dropped (why): ..." */
            char head[32];
            snprintf(head, sizeof(head), "pid %d (", (int)pids[i]);
            for (const char *l = strstr(log, head); l; l = strstr(l + 1, head)) {
                const char *eol = strchr(l, '\n');
                const char *e = strstr(l, "): ended ");
                const char *dr = strstr(l, "): dropped ");
                if ((e && (!eol || e < eol)) || (dr && (!eol || dr < eol))) {
                    ended++;
                    break;
                }
            }
        }
        if (ended == n) {
            free(log);
            return;
        }
        if (waited >= timeout_ms)
            fail_msg("%d of %d processes ended in the daemon's log after %ld ms:\n%s", ended, n,
                     timeout_ms, log);
        free(log);
        e2e_sleep_ms(20);
    }
}

pid_t e2e_spawn_client(const struct e2e_daemon *d, char *const prog[], const char *out_path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (out_path) {
            int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(fd, 1);
        }
        setenv("LD_PRELOAD", e2e_env("HEAPPROF_LIB"), 1);
        setenv("HEAPPROF_SOCKET", d->sock, 1);
        setenv("HEAPPROF_STARTUP", "1", 1);
        execv(prog[0], prog);
        _exit(127);
    }
    return pid;
}

void e2e_check_exact_sites(const struct rp_trace_process *p, const char *out)
{
    struct e2e_truth truth[E2E_MAX_TRUTH];
    size_t nt = e2e_parse_truth(out, truth, E2E_MAX_TRUTH);
    assert_true(nt > 0);
    for (size_t i = 0; i < nt; i++) {
        struct e2e_sums s;
        e2e_sum_function(p, truth[i].name, &s);
        assert_int_equal(s.alloc_bytes, truth[i].alloc_bytes);
        assert_int_equal(s.alloc_count, truth[i].alloc_count);
        assert_int_equal(s.free_bytes, truth[i].free_bytes);
        assert_int_equal(s.free_count, truth[i].free_count);
    }
}

const struct rp_trace_process *e2e_find_pid(const struct rp_trace *t, pid_t pid)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == pid)
            return &t->processes[i];
    return NULL;
}
