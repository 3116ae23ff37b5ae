/* tests/e2e/test_inject_container.c: heapprof attach -p HOSTPID, from the host, on a
 * program in a "container" (issue 25): its own mount, pid and network namespaces
 * (unshare --mount --pid --net --fork --mount-proc), where the program exists only inside
 * (a tmpfs on /mnt), the build directory with libheapprof.so is hidden (a tmpfs over it)
 * and so is the host's /tmp with the session's runtime directory (a tmpfs over /tmp).
 *
 *   - tests/programs/inject_threads is attached twice: rc 0, traces the rule checker and
 *     Perfetto's trace processor accept, the process under its host pid with samples of
 *     each thread's site named (symbols of a file only the container has); one copy of
 *     the library (a memfd) after both; no descriptor of ours left behind but the
 *     library's own, no socket file left in the container; the program's output and exit
 *     status as without profiling;
 *   - a program in a pid namespace alone, without a /proc of its own: attached;
 *   - a program in a user namespace whose root is ours (made by root): attached;
 *   - a rootless container (a user namespace made by another user, where our root is
 *     nobody): refused, rc 1, the reason given, the library not loaded, the program
 *     unharmed;
 *   - heapprofd -n NAME finds the program running in the container and attaches it the
 *     same way: its trace passes both checkers, with every thread's site under the host
 *     pid; the socket it made inside the container's /tmp is gone once the program
 *     connected and after the daemon exits; the program's output and status unchanged.
 * Root only (namespaces); skipped, saying why, when not root or unshare cannot make them. */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"
#include "tests/e2e/e2e_util.h"

static char runtime_dir[256];

static int setup(void **state)
{
    (void)state;
    return e2e_runtime_dir_make(runtime_dir, sizeof(runtime_dir), "container");
}

static int teardown(void **state)
{
    (void)state;
    return e2e_runtime_dir_remove(runtime_dir);
}

/* Skips the test unless we may make namespaces (root, unshare, a /mnt to mount on). */
static void need_namespaces(void)
{
    if (geteuid() != 0) {
        print_message("  not root (namespaces need it): skipped\n");
        skip();
    }
    struct stat st;
    if (access("/usr/bin/unshare", X_OK) != 0 || stat("/mnt", &st) != 0 || !S_ISDIR(st.st_mode)) {
        print_message("  no /usr/bin/unshare or no /mnt: skipped\n");
        skip();
    }
    char *argv[] = {"/usr/bin/unshare", "--mount",      "--pid",     "--net",
                    "--fork",           "--mount-proc", "/bin/true", NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    int st_run = run.status;
    if (st_run != 0)
        print_message("  unshare cannot make namespaces here (%s): skipped\n", run.err);
    e2e_run_free(&run);
    if (st_run != 0)
        skip();
}

/* Starts tests/programs/inject_threads in a container made by unshare with @ns_flags
 * (space-separated options), run by user nobody when @as_nobody: the program copied to
 * /mnt (a tmpfs there), the directory of libheapprof.so and /tmp hidden under tmpfs.
 * Returns the program's pid on the host. */
static pid_t start_in_container(struct e2e_target *t, const char *ns_flags, bool as_nobody)
{
    char lib_dir[512];
    snprintf(lib_dir, sizeof(lib_dir), "%s", e2e_env("HEAPPROF_LIB"));
    dirname(lib_dir);
    /* A copy anyone may read (the runtime directory opened to all), for a container made
     * by another user. */
    char prog[320], cmd[1024];
    snprintf(prog, sizeof(prog), "%s/ctr_prog", runtime_dir);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && chmod 755 '%s' '%s'", e2e_env("INJECT_THREADS"),
             prog, prog, runtime_dir);
    assert_int_equal(system(cmd), 0);
    char script[2048];
    /* The library's directory first: the build may be under /tmp. */
    snprintf(script, sizeof(script),
             "exec %s /usr/bin/unshare %s --fork --mount-proc /bin/sh -c \""
             "mount -t tmpfs app /mnt && cp '%s' /mnt/ctr_threads && "
             "mount -t tmpfs hide '%s' && mount -t tmpfs tmp /tmp && exec /mnt/ctr_threads\"",
             as_nobody ? "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups" : "",
             ns_flags, prog, lib_dir);
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    assert_int_equal(e2e_target_start(t, runtime_dir, argv, NULL, "ready"), 0);
    char *o = e2e_read_file(t->out);
    if (!strstr(o, "ready"))
        print_message("  the container did not start: %s\n", o);
    assert_non_null(strstr(o, "ready"));
    free(o);
    /* unshare --fork's child, which exec'd the program. */
    char path[96];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)t->pid, (int)t->pid);
    char *kids = e2e_read_file(path);
    pid_t pid = (pid_t)atoi(kids);
    free(kids);
    assert_true(pid > 0);
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    char exe[256];
    ssize_t n = readlink(path, exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    assert_string_equal(exe, "/mnt/ctr_threads");
    /* Really out of the host's reach: no such file here. */
    assert_int_not_equal(access("/mnt/ctr_threads", F_OK), 0);
    return pid;
}

/* `heapprof attach -p PID --duration 1 ...`: its status, its stderr in @err (malloc'd);
 * the trace checked and loaded in @ret when the status is 0 (else NULL). */
static int attach(pid_t pid, const char *option, struct rp_trace **ret, char **err)
{
    char pids[16], trace[300];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    snprintf(trace, sizeof(trace), "%s/container.pftrace", runtime_dir);
    unlink(trace);
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "attach",
                    "-p",
                    pids,
                    "--duration",
                    "1",
                    "--no-source-lines",
                    "--no-status",
                    "-q",
                    "-o",
                    trace,
                    (char *)option,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    *ret = NULL;
    if (run.status == 0) {
        assert_int_equal(e2e_check_rules(trace), 0);
        assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, ret), 0);
    }
    int status = run.status;
    *err = run.err;
    run.err = NULL;
    e2e_run_free(&run);
    return status;
}

/* The descriptors of @pid, as "N -> target" lines (malloc'd). */
static char *fds_of(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t cap = 8192, n = 0;
    char *out = calloc(1, cap);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[400], target[256];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        /* Closed while we listed (the session thread reads /proc/self files now and
         * then): not a descriptor the process keeps. */
        if (k <= 0)
            continue;
        target[k] = '\0';
        n += (size_t)snprintf(out + n, cap - n, "%s -> %s\n", e->d_name, target);
        assert_true(n < cap);
    }
    closedir(d);
    return out;
}

/* How many executable mappings of libheapprof.so @pid has, and whether one is a memfd. */
static int library_copies(pid_t pid, bool *ret_memfd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *maps = e2e_read_file(path);
    int n = 0;
    *ret_memfd = false;
    for (char *l = strtok(maps, "\n"); l; l = strtok(NULL, "\n"))
        if (strstr(l, "libheapprof.so") && strstr(l, " r-xp ")) {
            n++;
            *ret_memfd |= strstr(l, "/memfd:") != NULL;
        }
    free(maps);
    return n;
}

/* Sockets of ours (heapprof-*.sock) in @pid's /tmp and /dev/shm (its root). */
static int sockets_left(pid_t pid)
{
    int n = 0;
    const char *dirs[] = {"tmp", "dev/shm"};
    for (size_t i = 0; i < 2; i++) {
        char path[96];
        snprintf(path, sizeof(path), "/proc/%d/root/%s", (int)pid, dirs[i]);
        DIR *d = opendir(path);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strncmp(e->d_name, "heapprof-", 9) == 0 && strlen(e->d_name) > 5 &&
                strcmp(e->d_name + strlen(e->d_name) - 5, ".sock") == 0) {
                print_message("  left in the container: /%s/%s\n", dirs[i], e->d_name);
                n++;
            }
        closedir(d);
    }
    return n;
}

/* One attach of @pid: rc 0, the process under its host pid, every thread's site named. */
static void attach_once(pid_t pid, int round)
{
    struct rp_trace *tr;
    char *err = NULL;
    int st = attach(pid, NULL, &tr, &err);
    if (st != 0)
        print_message("  attach %d: status %d: %s\n", round, st, err);
    assert_int_equal(st, 0);
    const struct rp_trace_process *p = NULL;
    for (size_t i = 0; i < tr->n_processes; i++)
        if (tr->processes[i].pid == pid)
            p = &tr->processes[i];
    assert_non_null(p);
    for (int k = 0; k < 4; k++) {
        char site[16];
        snprintf(site, sizeof(site), "site_t%d", k);
        struct e2e_sums s;
        e2e_sum_function(p, site, &s);
        if (s.alloc_count == 0)
            print_message("  attach %d: no sample of %s\n", round, site);
        assert_true(s.alloc_count > 0);
    }
    rp_trace_free(tr);
    free(err);
}

static void test_container_attach_twice(void **state)
{
    (void)state;
    need_namespaces();
    struct e2e_target t;
    pid_t pid = start_in_container(&t, "--mount --pid --net", false);
    char *before = fds_of(pid);

    attach_once(pid, 1);
    bool memfd;
    assert_int_equal(library_copies(pid, &memfd), 1);
    assert_true(memfd);
    assert_int_equal(sockets_left(pid), 0);
    char *after = fds_of(pid);
    /* The memfd was closed; the library keeps its /proc/self/mem (a descriptor moved
     * high, as in any attached process) and nothing else. */
    assert_null(strstr(after, "memfd:"));
    size_t extra = 0;
    for (char *l = after, *nl; *l; l = nl + 1) {
        nl = strchr(l, '\n');
        *nl = '\0';
        if (!strstr(before, l)) {
            print_message("  new descriptor: %s\n", l);
            assert_true(atoi(l) >= 256 && strstr(l, "/mem") != NULL);
            extra++;
        }
        *nl = '\n';
    }
    assert_true(extra <= 1);

    /* The second attach wakes the copy it finds: no second one, no other descriptor. */
    attach_once(pid, 2);
    assert_int_equal(library_copies(pid, &memfd), 1);
    assert_int_equal(sockets_left(pid), 0);
    char *again = fds_of(pid);
    assert_string_equal(again, after);

    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
    free(before);
    free(after);
    free(again);
}

/* A pid namespace alone, without a /proc of its own (unshare --pid --fork): the client
 * says its pid there (1) but opens its /proc files in ours, under its host pid. */
static void test_container_pid_namespace_only(void **state)
{
    (void)state;
    need_namespaces();
    char *argv[] = {"/usr/bin/unshare", "--pid", "--fork", (char *)e2e_env("INJECT_THREADS"), NULL};
    struct e2e_target t;
    assert_int_equal(e2e_target_start(&t, runtime_dir, argv, NULL, "ready"), 0);
    char path[96];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)t.pid, (int)t.pid);
    char *kids = e2e_read_file(path);
    pid_t pid = (pid_t)atoi(kids);
    free(kids);
    assert_true(pid > 0);
    attach_once(pid, 1);
    assert_int_equal(sockets_left(pid), 0);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
}

#define USERNS_FLAGS "--user --map-root-user --mount --pid --net"

/* A user namespace made by root with its root mapped to ours (unshare --user
 * --map-root-user as root): we are its root; attached like any container. */
static void test_container_user_namespace_mapped(void **state)
{
    (void)state;
    need_namespaces();
    struct e2e_target t;
    pid_t pid = start_in_container(&t, USERNS_FLAGS, false);
    attach_once(pid, 1);
    assert_int_equal(sockets_left(pid), 0);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
}

/* A rootless container: a user namespace made by another user (nobody), whose root is
 * that user; our root is nobody there, and its client would refuse us. Refused before
 * anything is done to it, with the reason. */
static void test_container_rootless_refused(void **state)
{
    (void)state;
    need_namespaces();
    struct e2e_target t;
    pid_t pid = start_in_container(&t, USERNS_FLAGS, true);
    struct rp_trace *tr;
    char *err = NULL;
    /* Another user's process: root may take it only when asked to. */
    int st = attach(pid, "--allow-other-users", &tr, &err);
    print_message("  status %d: %s", st, err);
    assert_int_equal(st, 1);
    assert_non_null(strstr(err, "another user namespace"));
    free(err);
    bool memfd;
    assert_int_equal(library_copies(pid, &memfd), 0);
    assert_int_equal(sockets_left(pid), 0);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
}

/* heapprofd -n NAME, started after the program: it scans, finds the program in the
 * container (no library there, another /tmp, another network) and attaches it as heapprof
 * attach does. */
static void test_container_daemon_attaches(void **state)
{
    (void)state;
    need_namespaces();
    struct e2e_target t;
    pid_t pid = start_in_container(&t, "--mount --pid --net", false);
    struct e2e_daemon d;
    e2e_daemon_prepare(&d, "ctrd");
    const char *args[] = {"-n", "ctr_threads", "--no-source-lines", NULL};
    e2e_daemon_launch(&d, args);

    char want[64];
    snprintf(want, sizeof(want), "pid %d (", (int)pid);
    char *log = NULL;
    for (int i = 0; i < 1500; i++) { /* 15 s: a loaded machine, a sanitizer build */
        free(log);
        log = e2e_read_file(d.log);
        const char *l = strstr(log, want);
        if ((l && strstr(l, "): profiling")) || strstr(log, "not attached"))
            break;
        e2e_sleep_ms(10);
    }
    const char *l = strstr(log, want);
    if (!l || !strstr(l, "): profiling"))
        print_message("  heapprofd's log:\n%s\n", log);
    assert_non_null(l);
    assert_non_null(strstr(l, "): profiling"));
    free(log);
    /* Taken by its first connection. */
    assert_int_equal(sockets_left(pid), 0);
    e2e_sleep_ms(300); /* samples of each thread (each allocates every ms) */
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    assert_int_equal(sockets_left(pid), 0);

    assert_int_equal(e2e_check_rules(d.trace), 0);
    struct rp_trace *tr = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &tr), 0);
    const struct rp_trace_process *p = e2e_find_pid(tr, pid);
    assert_non_null(p);
    for (int k = 0; k < 4; k++) {
        char site[16];
        snprintf(site, sizeof(site), "site_t%d", k);
        struct e2e_sums s;
        e2e_sum_function(p, site, &s);
        if (s.alloc_count == 0)
            print_message("  no sample of %s\n", site);
        assert_true(s.alloc_count > 0);
    }
    rp_trace_free(tr);
    bool memfd;
    assert_int_equal(library_copies(pid, &memfd), 1);
    assert_true(memfd);

    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
    e2e_daemon_remove_files(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_container_attach_twice),
        cmocka_unit_test(test_container_pid_namespace_only),
        cmocka_unit_test(test_container_user_namespace_mapped),
        cmocka_unit_test(test_container_rootless_refused),
        cmocka_unit_test(test_container_daemon_attaches),
    };
    return cmocka_run_group_tests_name("e2e_inject_container", tests, setup, teardown);
}
