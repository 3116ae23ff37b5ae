/* tests/e2e/test_privdrop.c: processes that change their user after they start (a root
 * server dropping to its own user): profiled across the change when the service's
 * policy allows the new user (heapprofd as root with --allow-other-users, heapprof
 * record as root), dropped with one line saying why when it does not (root without
 * --allow-other-users, a service of another user). Runs as root; skipped otherwise.
 *
 * tests/programs/setuid_drop allocates 100 x 5000 bytes before the drop and 200 x 3000
 * after, and says how many of its threads still run as root afterwards: none may (the
 * profiler's session thread must take the new ids too). Exact counts: interval 1. */
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
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"

#define NOBODY "65534"

static char *const drop_argv[] = {NULL, NOBODY, NOBODY, NULL, NULL};

static void need_root(void)
{
    if (geteuid() != 0) {
        print_message("not root: changing users needs root\n");
        skip();
    }
}

/* Runs setuid_drop (@arg3: NULL or "nodump") under @d. */
static void run_drop(struct e2e_daemon *d, const char *arg3, struct e2e_run *run)
{
    char preload[4200], sock[400];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
    snprintf(sock, sizeof(sock), "HEAPPROF_SOCKET=%s", d->sock);
    char *env[] = {preload, sock, "HEAPPROF_STARTUP=1", NULL};
    char *argv[5];
    memcpy(argv, drop_argv, sizeof(argv));
    argv[0] = (char *)e2e_env("SETUID_DROP");
    argv[3] = (char *)arg3;
    assert_int_equal(e2e_run(argv, env, run), 0);
    assert_int_equal(run->status, 0);
    assert_non_null(strstr(run->out, "root_threads 0\n"));
}

static struct rp_trace *load_trace(const char *path)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(path, &(struct rp_trace_options){0}, &t), 0);
    return t;
}

/* The count of @needle in @hay. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static const char *const daemon_base[] = {"--all", "-i", "1", "--block-client", "--no-running"};

/* heapprofd (root) with @extra, setuid_drop under it; its log in @ret_log (malloc'd). */
static struct rp_trace *daemon_drop(const char *extra, const char *arg3, struct e2e_run *run,
                                    char **ret_log)
{
    struct e2e_daemon d;
    const char *args[10];
    size_t k = 0;
    for (size_t i = 0; i < sizeof(daemon_base) / sizeof(daemon_base[0]); i++)
        args[k++] = daemon_base[i];
    args[k++] = extra;
    args[k] = NULL;
    e2e_daemon_prepare(&d, "privdrop");
    e2e_daemon_launch(&d, args);
    run_drop(&d, arg3, run);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    *ret_log = e2e_read_file(d.log);
    struct rp_trace *t = load_trace(d.trace);
    e2e_daemon_remove_files(&d);
    return t;
}

/* Root with --allow-other-users: every allocation, before and after the drop, whether
 * the process makes itself dumpable again (nginx) or not. */
static void test_daemon_follows_drop(void **state)
{
    (void)state;
    need_root();
    const char *variants[] = {NULL, "nodump"};
    for (size_t v = 0; v < 2; v++) {
        struct e2e_run run;
        char *log = NULL;
        struct rp_trace *t = daemon_drop("--allow-other-users", variants[v], &run, &log);
        assert_int_equal(t->n_processes, 1);
        e2e_check_exact_sites(&t->processes[0], run.out);
        assert_false(t->processes[0].connection_lost);
        if (!strstr(log, "changed its user to nobody (uid 65534) (group 65534); still profiled"))
            fail_msg("no change logged:\n%s", log);
        assert_null(strstr(log, "not profiled from there on"));
        rp_trace_free(t);
        free(log);
        e2e_run_free(&run);
    }
}

/* Root without --allow-other-users: what came before the drop is kept, nothing after,
 * and the log says why once. */
static void test_daemon_refuses_drop(void **state)
{
    (void)state;
    need_root();
    struct e2e_run run;
    char *log = NULL;
    struct rp_trace *t = daemon_drop("--no-follow-fork", NULL, &run, &log);
    assert_int_equal(t->n_processes, 1);
    struct e2e_sums before, after;
    e2e_sum_function(&t->processes[0], "before_drop", &before);
    e2e_sum_function(&t->processes[0], "after_drop", &after);
    assert_int_equal(before.alloc_count, 100);
    assert_int_equal(after.alloc_count, 0);
    assert_true(t->processes[0].connection_lost);
    const char *why = "changed its user to nobody (uid 65534): not profiled from there on: "
                      "this service runs as root without --allow-other-users";
    if (count_of(log, why) != 1 || count_of(log, "not profiled from there on") != 1)
        fail_msg("not said once:\n%s", log);
    rp_trace_free(t);
    free(log);
    e2e_run_free(&run);
}

/* heapprof record as root follows the programs it started, whatever user they become. */
static void test_record_follows_drop(void **state)
{
    (void)state;
    need_root();
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "record", "-q",   "-o", trace, "-i", "1", "--",
                    (char *)e2e_env("SETUID_DROP"),  NOBODY,   NOBODY, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.out, "root_threads 0\n"));
    struct rp_trace *t = load_trace(trace);
    assert_int_equal(t->n_processes, 1);
    e2e_check_exact_sites(&t->processes[0], run.out);
    assert_null(strstr(run.err, "not profiled from there on"));
    rp_trace_free(t);
    unlink(trace);
    free(trace);
    e2e_run_free(&run);
}

/* A service of user nobody profiles a process of nobody's that holds CAP_SETUID (given
 * by setpriv as ambient capabilities) until it becomes another user: then it says why,
 * once. */
static void test_user_service_refuses_drop(void **state)
{
    (void)state;
    need_root();
    if (access("/usr/bin/setpriv", X_OK) != 0) {
        print_message("no setpriv: skipped\n");
        skip();
    }
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "privdrop-user");
    assert_int_equal(chown(d.dir, 65534, 65534), 0);
    char *argv[] = {"/usr/bin/setpriv",
                    "--reuid=" NOBODY,
                    "--regid=" NOBODY,
                    "--clear-groups",
                    "--",
                    (char *)e2e_env("HEAPPROFD_BIN"),
                    "--socket",
                    d.sock,
                    "-o",
                    d.trace,
                    "--no-status",
                    "--all",
                    "-i",
                    "1",
                    "--no-running",
                    NULL};
    d.pid = fork();
    assert_true(d.pid >= 0);
    if (d.pid == 0) {
        int fd = open(d.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        dup2(fd, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 1000 && stat(d.sock, &st) != 0; i++)
        e2e_sleep_ms(2);
    char preload[4200], sock[400];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
    snprintf(sock, sizeof(sock), "HEAPPROF_SOCKET=%s", d.sock);
    char *prog[] = {"/usr/bin/setpriv",
                    "--reuid=" NOBODY,
                    "--regid=" NOBODY,
                    "--clear-groups",
                    "--inh-caps=+setuid,+setgid",
                    "--ambient-caps=+setuid,+setgid",
                    "--",
                    "/usr/bin/env",
                    preload,
                    sock,
                    "HEAPPROF_STARTUP=1",
                    (char *)e2e_env("SETUID_DROP"),
                    "65533",
                    "65533",
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(prog, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.out, "root_threads 0\n"));
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    char *log = e2e_read_file(d.log);
    const char *why = "changed its user to uid 65533: not profiled from there on: this service "
                      "runs as nobody (uid 65534) and profiles only that user's processes";
    if (count_of(log, why) != 1 || count_of(log, "not profiled from there on") != 1)
        fail_msg("not said once:\n%s", log);
    struct rp_trace *t = load_trace(d.trace);
    assert_int_equal(t->n_processes, 1);
    struct e2e_sums before, after;
    e2e_sum_function(&t->processes[0], "before_drop", &before);
    e2e_sum_function(&t->processes[0], "after_drop", &after);
    assert_int_equal(before.alloc_count, 100);
    assert_int_equal(after.alloc_count, 0);
    rp_trace_free(t);
    free(log);
    e2e_run_free(&run);
    e2e_daemon_remove_files(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_follows_drop),
        cmocka_unit_test(test_daemon_refuses_drop),
        cmocka_unit_test(test_record_follows_drop),
        cmocka_unit_test(test_user_service_refuses_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
