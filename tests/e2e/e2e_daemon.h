/* tests/e2e/e2e_daemon.h: running heapprofd and preloaded clients in end-to-end tests
 * (the daemon and fault tests share these). Functions fail the current cmocka test on
 * setup errors. */
#ifndef HP_TESTS_E2E_DAEMON_H
#define HP_TESTS_E2E_DAEMON_H

#include <sys/types.h>

#include "tests/e2e/e2e_util.h"

struct e2e_daemon {
    pid_t pid;
    char dir[256];
    char sock[300];
    char trace[300];
    char log[300];
};

/* A temp dir named after @tag with the paths of the daemon's socket, trace and log. */
void e2e_daemon_prepare(struct e2e_daemon *d, const char *tag);
/* Starts heapprofd with @args (NULL-terminated) plus --socket/--output in @d's dir, its
 * stdout and stderr to @d->log, and waits for its socket. */
void e2e_daemon_launch(struct e2e_daemon *d, const char *const args[]);
/* Sends @sig and waits: the exit code, or 128 + signal. */
int e2e_daemon_stop(struct e2e_daemon *d, int sig);
/* Waits until @d's log says each of the @n processes @pids ended or was dropped (the
 * service has read, or counted, all they wrote), at most @timeout_ms; fails the test
 * then. Before a SIGINT in tests that want every record: a stop gives the reading of
 * what is left a short budget, which a slow build can overrun (then counted as unread). */
void e2e_daemon_wait_ended(const struct e2e_daemon *d, const pid_t *pids, int n, long timeout_ms);
/* Removes the daemon's files and directory. */
void e2e_daemon_remove_files(struct e2e_daemon *d);

/* Forks @prog with the library preloaded and pointed at @d (startup profiling), stdout to
 * @out_path (or inherited when NULL). */
pid_t e2e_spawn_client(const struct e2e_daemon *d, char *const prog[], const char *out_path);

/* Asserts that every "truth" line of @out matches @p's callsites exactly. */
void e2e_check_exact_sites(const struct rp_trace_process *p, const char *out);
/* The process @pid of @t, or NULL. */
const struct rp_trace_process *e2e_find_pid(const struct rp_trace *t, pid_t pid);

#endif
