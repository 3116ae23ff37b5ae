/* tests/e2e/test_nginx.c: nginx, a real server that daemonizes (its foreground process
 * exits at once; a forked master runs on) and, as root, drops its workers to www-data.
 *
 *   daemon    heapprofd --all --follow-fork --allow-other-users (as root) and
 *             LD_PRELOAD=libheapprof.so nginx: the www-data workers that serve the
 *             requests are profiled (samples in the trace from worker pids whose uid is
 *             www-data, each named by its own title, "nginx: worker process")
 *   record    heapprof record --follow-fork -- nginx: recording goes on after the
 *             foreground process exits, the master and workers are in the trace, SIGINT
 *             ends recording, nginx keeps serving, and record says what still runs
 *   no-follow heapprof record -- nginx: record ends with nginx and says that the fork it
 *             did not follow was not followed, and which children still run
 *   attach    heapprof attach -p WORKER as root: refused with the reason without
 *             --allow-other-users, profiled with it
 *
 * Each case runs nginx with its own configuration in a temporary directory (pid file,
 * error log, temp paths, document root; a random high port on 127.0.0.1), fetches a
 * 20 KiB page 40 times with one curl and compares every body. As root the workers run as
 * www-data; otherwise the "user" line is left out (nginx cannot switch users) and the
 * uid checks are skipped. The teardown stops nginx by its pid file and any profiler still
 * running, whatever the outcome. Skipped when nginx or curl is missing. */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
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

#define NGINX "/usr/sbin/nginx"
#define CURL "/usr/bin/curl"
#define FETCHES 40
#define PAGE_BYTES 20000

struct nginx_case {
    char dir[256];
    char conf[300];
    char pidfile[300];
    char page[300];
    int port;
    bool as_root;
    pid_t profiler; /* heapprofd or heapprof record, while it runs */
    struct e2e_daemon daemon;
};

static void write_file(const char *path, const char *text, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

/* A configuration on a new random port. */
static void write_conf(struct nginx_case *c)
{
    c->port = 20000 + (int)((unsigned)rand() % 40000u);
    char conf[2048];
    int n = snprintf(conf, sizeof(conf),
                     "daemon on;\nmaster_process on;\nworker_processes 2;\n%s"
                     "pid %s;\nerror_log %s/error.log;\n"
                     "events { worker_connections 64; }\n"
                     "http {\n    access_log off;\n"
                     "    client_body_temp_path %s/body;\n    proxy_temp_path %s/proxy;\n"
                     "    fastcgi_temp_path %s/fastcgi;\n    uwsgi_temp_path %s/uwsgi;\n"
                     "    scgi_temp_path %s/scgi;\n"
                     "    server { listen 127.0.0.1:%d; root %s/www; }\n}\n",
                     c->as_root ? "user www-data;\n" : "", c->pidfile, c->dir, c->dir, c->dir,
                     c->dir, c->dir, c->dir, c->port, c->dir);
    write_file(c->conf, conf, (size_t)n);
}

static int setup(void **state)
{
    *state = NULL;
    if (access(NGINX, X_OK) != 0 || access(CURL, X_OK) != 0) {
        print_message("nginx or curl is not installed (scripts/install-deps.sh)\n");
        return 0;
    }
    struct nginx_case *c = calloc(1, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "/tmp/heapprof-e2e-nginx-XXXXXX");
    assert_non_null(mkdtemp(c->dir));
    /* The workers (www-data) read the page. */
    assert_int_equal(chmod(c->dir, 0755), 0);
    char www[300];
    snprintf(www, sizeof(www), "%s/www", c->dir);
    assert_int_equal(mkdir(www, 0755), 0);
    snprintf(c->conf, sizeof(c->conf), "%s/nginx.conf", c->dir);
    snprintf(c->pidfile, sizeof(c->pidfile), "%s/nginx.pid", c->dir);
    snprintf(c->page, sizeof(c->page), "%s/www/index.html", c->dir);
    char *page = malloc(PAGE_BYTES);
    for (size_t i = 0; i < PAGE_BYTES; i++)
        page[i] = (char)('a' + (i * 7 + i / 61) % 26);
    write_file(c->page, page, PAGE_BYTES);
    free(page);
    c->as_root = geteuid() == 0 && getpwnam("www-data") != NULL;
    if (!c->as_root)
        print_message("not root: nginx's workers keep our user\n");
    srand((unsigned)getpid());
    *state = c;
    return 0;
}

/* The master's pid from the pid file, or 0. */
static pid_t master_pid(const struct nginx_case *c)
{
    char *text = e2e_read_file(c->pidfile);
    pid_t pid = text ? (pid_t)atoi(text) : 0;
    free(text);
    return pid;
}

/* Stops nginx (by its pid file) and waits until the master is gone. */
static void nginx_stop(struct nginx_case *c)
{
    pid_t m = master_pid(c);
    if (m > 0 && kill(m, SIGTERM) == 0)
        for (int i = 0; i < 300 && kill(m, 0) == 0; i++)
            e2e_sleep_ms(10);
    unlink(c->pidfile);
}

static void profiler_stop(struct nginx_case *c)
{
    if (c->profiler > 0) {
        kill(c->profiler, SIGKILL);
        (void)e2e_wait_status(c->profiler);
        c->profiler = 0;
    }
}

static int teardown(void **state)
{
    struct nginx_case *c = *state;
    if (!c)
        return 0;
    nginx_stop(c);
    profiler_stop(c);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
    (void)!system(cmd);
    free(c);
    return 0;
}

/* The effective uid of @pid. */
static uid_t uid_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    char *st = e2e_read_file(path);
    unsigned r = 0, e = (unsigned)-1;
    const char *u = st ? strstr(st, "\nUid:") : NULL;
    if (u)
        (void)sscanf(u + 5, "%u %u", &r, &e);
    free(st);
    return (uid_t)e;
}

/* Waits for nginx's pid file and its workers. Returns the master's pid, or 0. */
static pid_t nginx_wait_ready(const struct nginx_case *c, pid_t workers[2])
{
    for (int i = 0; i < 500; i++) {
        pid_t m = master_pid(c);
        if (m > 0) {
            /* The workers: the master's children. */
            char path[64];
            snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)m, (int)m);
            char *kids = e2e_read_file(path);
            int n = kids ? sscanf(kids, "%d %d", &workers[0], &workers[1]) : 0;
            free(kids);
            /* As root: once they became www-data. */
            uid_t want = c->as_root ? getpwnam("www-data")->pw_uid : geteuid();
            if (n == 2 && uid_of(workers[0]) == want && uid_of(workers[1]) == want)
                return m;
        }
        e2e_sleep_ms(10);
    }
    return 0;
}

/* One curl fetching the page FETCHES times; every body must be the page. */
static void fetch_and_check(const struct nginx_case *c)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/index.html", c->port);
    char *argv[FETCHES + 4];
    size_t k = 0;
    argv[k++] = CURL;
    argv[k++] = "-sf";
    for (int i = 0; i < FETCHES; i++)
        argv[k++] = url;
    argv[k] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    char *page = e2e_read_file(c->page);
    assert_int_equal(strlen(run.out), (size_t)FETCHES * PAGE_BYTES);
    for (int i = 0; i < FETCHES; i++)
        assert_memory_equal(run.out + (size_t)i * PAGE_BYTES, page, PAGE_BYTES);
    free(page);
    e2e_run_free(&run);
}

static uint64_t samples_of(const struct rp_trace *t, pid_t pid)
{
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    if (!p)
        return 0;
    uint64_t n = 0;
    for (size_t i = 0; i < p->n_callsites; i++)
        n += p->callsites[i].alloc_count;
    return n;
}

/* Checks the workers ran as www-data (as root) and allocated in the trace at @path. */
static void check_workers(const struct nginx_case *c, const char *path, pid_t master,
                          const pid_t workers[2], const uid_t uids[2])
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(path, &(struct rp_trace_options){0}, &t), 0);
    struct passwd *pw = getpwnam("www-data");
    for (int i = 0; i < 2; i++) {
        if (c->as_root)
            assert_int_equal(uids[i], pw->pw_uid);
        if (samples_of(t, workers[i]) == 0)
            fail_msg("worker %d has no samples in the trace", (int)workers[i]);
        /* Named by its own title, not its master's command line (issue 26 case 3). */
        const struct rp_trace_process *w = e2e_find_pid(t, workers[i]);
        if (strcmp(w->cmdline, "nginx: worker process") != 0)
            fail_msg("worker %d is named '%s'", (int)workers[i], w->cmdline);
    }
    const struct rp_trace_process *m = e2e_find_pid(t, master);
    assert_non_null(m);
    if (strncmp(m->cmdline, "nginx: master process ", 22) != 0)
        fail_msg("the master %d is named '%s'", (int)master, m->cmdline);
    rp_trace_free(t);
}

/* Starts nginx with @env (preloaded, or NULL) and waits until it serves: 0, or -1 when
 * its port was taken (a new one is tried). */
static int nginx_start(struct nginx_case *c, char *const env[], pid_t *ret_master, pid_t workers[2])
{
    write_conf(c);
    char *argv[] = {NGINX, "-c", c->conf, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, env, &run), 0);
    bool in_use = strstr(run.err, "Address already in use") != NULL;
    if (in_use) {
        e2e_run_free(&run);
        return -1;
    }
    if (run.status != 0)
        fail_msg("nginx did not start: %s", run.err);
    e2e_run_free(&run);
    *ret_master = nginx_wait_ready(c, workers);
    assert_true(*ret_master > 0);
    return 0;
}

/* Waits until @log holds @needle @n times (5 s at most). */
static void wait_log(const char *log, const char *needle, int n)
{
    for (int waited = 0;; waited += 20) {
        char *text = e2e_read_file(log);
        int found = 0;
        for (const char *p = text ? strstr(text, needle) : NULL; p; p = strstr(p + 1, needle))
            found++;
        if (found >= n) {
            free(text);
            return;
        }
        if (waited >= 5000)
            fail_msg("'%s' %d times in the log: %s", needle, n, text ? text : "(none)");
        free(text);
        e2e_sleep_ms(20);
    }
}

static void test_daemon_profiles_workers(void **state)
{
    struct nginx_case *c = *state;
    if (!c)
        skip();
    struct e2e_daemon *d = &c->daemon;
    const char *args[] = {"--all", "--follow-fork", "--no-running",
                          c->as_root ? "--allow-other-users" : NULL, NULL};
    e2e_daemon_prepare(d, "nginx");
    e2e_daemon_launch(d, args);
    c->profiler = d->pid;
    char preload[4200], sock[400];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
    snprintf(sock, sizeof(sock), "HEAPPROF_SOCKET=%s", d->sock);
    char *env[] = {preload, sock, "HEAPPROF_STARTUP=1", NULL};
    pid_t master, workers[2];
    for (int tries = 0; nginx_start(c, env, &master, workers) < 0; tries++)
        assert_true(tries < 3);
    /* The requests come once both workers became www-data and are still profiled. */
    if (c->as_root)
        wait_log(d->log, "changed its user to www-data (uid", 2);
    fetch_and_check(c);
    uid_t uids[2] = {uid_of(workers[0]), uid_of(workers[1])};
    nginx_stop(c);
    e2e_daemon_wait_ended(d, workers, 2, 10000);
    assert_int_equal(e2e_daemon_stop(d, SIGINT), 0);
    c->profiler = 0;
    check_workers(c, d->trace, master, workers, uids);
    char *log = e2e_read_file(d->log);
    assert_null(strstr(log, "not profiled from there on"));
    if (c->as_root && !strstr(log, "changed its user to www-data"))
        fail_msg("no worker's change of user in the log:\n%s", log);
    free(log);
    e2e_daemon_remove_files(d);
}

/* Starts `heapprof record OPTS -- nginx -c CONF` with stderr to @err_path; returns when
 * nginx serves. */
static void record_start(struct nginx_case *c, const char *opt, const char *trace,
                         const char *err_path, pid_t *ret_master, pid_t workers[2])
{
    for (int tries = 0;; tries++) {
        assert_true(tries < 3);
        write_conf(c);
        c->profiler = fork();
        assert_true(c->profiler >= 0);
        if (c->profiler == 0) {
            int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(fd, 2);
            execl(e2e_env("HEAPPROF_BIN"), "heapprof", "record", "-o", trace, "--top", "0", opt,
                  "--", NGINX, "-c", c->conf, (char *)NULL);
            _exit(127);
        }
        *ret_master = nginx_wait_ready(c, workers);
        if (*ret_master > 0)
            return;
        char *err = e2e_read_file(err_path);
        bool in_use = err && strstr(err, "Address already in use");
        free(err);
        profiler_stop(c);
        if (!in_use)
            fail_msg("nginx did not start under heapprof record");
    }
}

static void test_record_follows_daemon(void **state)
{
    struct nginx_case *c = *state;
    if (!c)
        skip();
    char trace[320], err_path[320];
    snprintf(trace, sizeof(trace), "%s/record.pftrace", c->dir);
    snprintf(err_path, sizeof(err_path), "%s/record.err", c->dir);
    pid_t master, workers[2];
    record_start(c, "--follow-fork", trace, err_path, &master, workers);
    fetch_and_check(c);
    uid_t uids[2] = {uid_of(workers[0]), uid_of(workers[1])};
    /* Still recording: nginx's foreground process exited long ago. */
    assert_int_equal(waitpid(c->profiler, NULL, WNOHANG), 0);
    kill(c->profiler, SIGINT);
    assert_int_equal(e2e_wait_status(c->profiler), 0);
    c->profiler = 0;
    /* nginx serves on. */
    assert_int_equal(kill(master, 0), 0);
    fetch_and_check(c);
    nginx_stop(c);
    check_workers(c, trace, master, workers, uids);
    char *err = e2e_read_file(err_path);
    char want[128];
    snprintf(want, sizeof(want), "nginx exited; recording its descendants %d", (int)master);
    if (!strstr(err, want) || !strstr(err, "nginx exited; its children ") ||
        !strstr(err, "still run (recording stopped: no longer profiled)"))
        fail_msg("record did not say what it follows and what still runs:\n%s", err);
    free(err);
}

static void test_record_without_follow_fork(void **state)
{
    struct nginx_case *c = *state;
    if (!c)
        skip();
    char trace[320], err_path[320];
    snprintf(trace, sizeof(trace), "%s/record-nofollow.pftrace", c->dir);
    snprintf(err_path, sizeof(err_path), "%s/record-nofollow.err", c->dir);
    pid_t master, workers[2];
    record_start(c, "--no-follow-fork", trace, err_path, &master, workers);
    /* It ends by itself: nothing it profiles is left. */
    assert_int_equal(e2e_wait_status(c->profiler), 0);
    c->profiler = 0;
    fetch_and_check(c);
    nginx_stop(c);
    char *err = e2e_read_file(err_path);
    char want[128];
    /* The workers are listed too when they had started by then. */
    snprintf(want, sizeof(want), "nginx exited; its children %d", (int)master);
    const char *after = strstr(err, want);
    if (after)
        after += strlen(want);
    if (!after || (*after != ',' && *after != ' ') || !strstr(err, "still run (not profiled") ||
        !strstr(err, "heapprof: 1 process forked from targets was not followed (use "
                     "--follow-fork)"))
        fail_msg("record did not say what it did not follow:\n%s", err);
    free(err);
}

/* heapprof attach -p WORKER as root: refused without --allow-other-users (rc 1, the real
 * reason), profiled with it (the worker reaches the attach session's abstract socket). */
static void test_attach_worker(void **state)
{
    struct nginx_case *c = *state;
    if (!c || !c->as_root) {
        print_message("attaching another user's process needs root\n");
        skip();
    }
    char preload[4200];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", e2e_env("HEAPPROF_LIB"));
    char *env[] = {preload, NULL};
    pid_t master, workers[2];
    for (int tries = 0; nginx_start(c, env, &master, workers) < 0; tries++)
        assert_true(tries < 3);
    char pid_arg[16], trace[320], err_path[320];
    snprintf(pid_arg, sizeof(pid_arg), "%d", (int)workers[0]);
    snprintf(trace, sizeof(trace), "%s/attach.pftrace", c->dir);
    snprintf(err_path, sizeof(err_path), "%s/attach.err", c->dir);

    char *refused[] = {
        (char *)e2e_env("HEAPPROF_BIN"), "attach", "-p", pid_arg, "-d", "1", "-o", trace, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(refused, NULL, &run), 0);
    assert_int_equal(run.status, 1);
    if (!strstr(run.err, "runs as user www-data") || !strstr(run.err, "--allow-other-users"))
        fail_msg("not the real reason:\n%s", run.err);
    e2e_run_free(&run);

    c->profiler = fork();
    assert_true(c->profiler >= 0);
    if (c->profiler == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execl(e2e_env("HEAPPROF_BIN"), "heapprof", "attach", "--allow-other-users", "-p", pid_arg,
              "-d", "1", "--top", "0", "-o", trace, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        char *err = e2e_read_file(err_path);
        bool on = err && strstr(err, "attaching to pid");
        free(err);
        if (on)
            break;
        e2e_sleep_ms(10);
    }
    /* Both workers share the load: enough requests reach the one attached. Requests go
     * on until the attach ends (its session may begin late on a busy machine). */
    int st = 0;
    pid_t ended = 0;
    for (int i = 0; ended == 0; i++) {
        if (i > 0 && i % 2 == 0)
            ended = waitpid(c->profiler, &st, WNOHANG);
        if (ended == 0)
            fetch_and_check(c);
    }
    assert_int_equal(ended, c->profiler);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    c->profiler = 0;
    nginx_stop(c);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    if (samples_of(t, workers[0]) == 0) {
        char *err = e2e_read_file(err_path);
        fail_msg("the worker has no samples:\n%s", err);
    }
    rp_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_daemon_profiles_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_follows_daemon, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_without_follow_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attach_worker, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
