/* tests/e2e/test_files.c: files and sockets other users can reach (issue 16, case 7):
 * the trace file in a shared directory, and heapprofd --allow-other-users, whose socket
 * other users' processes must reach while the peer checks still hold. Run as root (they
 * plant files of another user and run clients as another user); skipped otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"

#define OTHER_UID 65534

static void need_root(void)
{
    if (geteuid() != 0) {
        print_message("  needs root (files and processes of another user): skipped\n");
        skip();
    }
}

/* Runs @argv as OTHER_UID with stdout and stderr to @out; returns the pid. */
static pid_t spawn_as_other(char *const argv[], const char *out)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        dup2(fd, 1);
        dup2(fd, 2);
        if (setgroups(0, NULL) < 0 || setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* A shared directory (mode 1777, like /tmp) with a file of ours and, planted by another
 * user, a symlink to it at the name we are told to write the trace to: `heapprof record
 * -o` used to open it O_CREAT | O_TRUNC, following the link and truncating the file. */
static void test_files_bug_record_truncates_through_planted_symlink(void **state)
{
    (void)state;
    need_root();
    char dir[] = "/tmp/heapprof-e2e-files-XXXXXX", victim[128], link_path[128];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 01777), 0);
    snprintf(victim, sizeof(victim), "%s/precious", dir);
    snprintf(link_path, sizeof(link_path), "%s/out.pftrace", dir);
    int fd = open(victim, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    assert_int_equal(write(fd, "precious data", 13), 13);
    close(fd);
    assert_int_equal(symlink(victim, link_path), 0);
    assert_int_equal(lchown(link_path, OTHER_UID, OTHER_UID), 0);

    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "record", "-q", "-o", link_path, "--",
                    (char *)e2e_env("THREE_SITES"),  NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    struct stat st;
    assert_int_equal(stat(victim, &st), 0);
    print_message("  rc %d, the file is %lld bytes; stderr: %s", run.status, (long long)st.st_size,
                  run.err);
    assert_int_equal(st.st_size, 13);
    assert_int_equal(run.status, 3);
    assert_non_null(strstr(run.err, "symbolic link owned by uid 65534"));
    e2e_run_free(&run);
    unlink(link_path);
    unlink(victim);
    rmdir(dir);
}

struct daemon_for_others {
    struct e2e_daemon d;
    char out[300];
};

static void launch(struct daemon_for_others *x, bool allow)
{
    e2e_daemon_prepare(&x->d, "files");
    /* Like /run: others may search the directory, not list or write it. */
    assert_int_equal(chmod(x->d.dir, 0711), 0);
    const char *with[] = {"--all", "--no-running", "-i", "1", "--allow-other-users", NULL};
    const char *without[] = {"--all", "--no-running", "-i", "1", NULL};
    e2e_daemon_launch(&x->d, allow ? with : without);
    snprintf(x->out, sizeof(x->out), "%s/client.txt", x->d.dir);
}

/* The profile the trace holds for @pid: its sample count, or -1 when it has none. */
static long long samples_of(const char *trace, pid_t pid)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    long long n = p ? (long long)p->heap_samples : -1;
    rp_trace_free(t);
    return n;
}

/* --allow-other-users left the socket mode 0755 (from the umask), so another user's
 * process could not even connect, and nothing said so. Now the socket is 0666, the log
 * says who may connect, and a client of another uid is profiled; one that lies about its
 * pid is still refused. */
static void test_files_bug_allow_other_users_socket_unreachable(void **state)
{
    (void)state;
    need_root();
    struct daemon_for_others x;
    launch(&x, true);
    struct stat st;
    assert_int_equal(stat(x.d.sock, &st), 0);
    print_message("  socket mode %04o\n", (unsigned)(st.st_mode & 07777));
    char *ok[] = {(char *)e2e_env("HOSTILE_CLIENT"), x.d.sock, "randflood", "1", "10", NULL};
    pid_t c = spawn_as_other(ok, x.out);
    assert_int_equal(e2e_wait_status(c), 0);
    char *o = e2e_read_file(x.out);
    print_message("  client of uid %d: %s", OTHER_UID, o);
    assert_null(strstr(o, "not profiled"));
    free(o);
    char *liar[] = {(char *)e2e_env("HOSTILE_CLIENT"), x.d.sock, "pidlie", NULL};
    pid_t l = spawn_as_other(liar, x.out);
    assert_int_equal(e2e_wait_status(l), 0);
    o = e2e_read_file(x.out);
    assert_non_null(strstr(o, "not profiled"));
    free(o);
    assert_int_equal(e2e_daemon_stop(&x.d, SIGINT), 0);
    char *log = e2e_read_file(x.d.log);
    assert_non_null(strstr(log, "mode 0666 (--allow-other-users)"));
    assert_non_null(strstr(log, "do not match the peer"));
    assert_int_equal(samples_of(x.d.trace, c), 10);
    assert_int_equal(st.st_mode & 0777, 0666);
    free(log);
    unlink(x.out);
    e2e_daemon_remove_files(&x.d);
}

/* Without --allow-other-users, a client of another uid that reaches the socket anyway
 * (made 0666 by hand) is refused by its uid. */
static void test_files_other_user_refused_by_default(void **state)
{
    (void)state;
    need_root();
    struct daemon_for_others x;
    launch(&x, false);
    assert_int_equal(chmod(x.d.sock, 0666), 0);
    char *argv[] = {(char *)e2e_env("HOSTILE_CLIENT"), x.d.sock, "randflood", "1", "10", NULL};
    pid_t c = spawn_as_other(argv, x.out);
    assert_int_equal(e2e_wait_status(c), 0);
    char *o = e2e_read_file(x.out);
    assert_non_null(strstr(o, "not profiled"));
    free(o);
    assert_int_equal(e2e_daemon_stop(&x.d, SIGINT), 0);
    char *log = e2e_read_file(x.d.log);
    assert_non_null(strstr(log, "client of uid 65534 rejected"));
    assert_int_equal(samples_of(x.d.trace, c), -1);
    free(log);
    unlink(x.out);
    e2e_daemon_remove_files(&x.d);
}

/* --allow-other-users without root cannot do what it says (the uid check would refuse
 * everyone else): it is refused at start with a message, exit 2. */
static void test_files_bug_allow_other_users_needs_root(void **state)
{
    (void)state;
    need_root();
    char dir[] = "/tmp/heapprof-e2e-files-XXXXXX", sock[128], out[128], trace[128];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 01777), 0);
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    snprintf(out, sizeof(out), "%s/log.txt", dir);
    snprintf(trace, sizeof(trace), "%s/t.pftrace", dir);
    char *argv[] = {(char *)e2e_env("HEAPPROFD_BIN"),
                    "--allow-other-users",
                    "--all",
                    "--socket",
                    sock,
                    "-o",
                    trace,
                    "--no-status",
                    NULL};
    pid_t d = spawn_as_other(argv, out);
    int st = -1;
    for (int i = 0; i < 300 && waitpid(d, &st, WNOHANG) == 0; i++)
        e2e_sleep_ms(10);
    if (st == -1) {
        kill(d, SIGKILL);
        e2e_wait_status(d);
    }
    char *log = e2e_read_file(out);
    print_message("  heapprofd as uid %d: %s", OTHER_UID, log);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 2);
    assert_non_null(strstr(log, "--allow-other-users needs root"));
    free(log);
    unlink(out);
    unlink(trace);
    unlink(sock);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_bug_record_truncates_through_planted_symlink),
        cmocka_unit_test(test_files_bug_allow_other_users_socket_unreachable),
        cmocka_unit_test(test_files_other_user_refused_by_default),
        cmocka_unit_test(test_files_bug_allow_other_users_needs_root),
    };
    return cmocka_run_group_tests_name("e2e_files", tests, NULL, NULL);
}
