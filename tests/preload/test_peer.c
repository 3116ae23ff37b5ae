/* tests/preload/test_peer.c: whom the client hands its /proc/self/mem (preload/peer.c):
 * the rules on made-up peers, and the facts read from /proc on real processes. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/peer.h"

#define ME 1000
#define OTHER 1001

/* A peer of our uid, pid 4242, for a wake by attacher @want (0: the daemon's socket). */
static struct client_peer woken_by(pid_t want)
{
    return (struct client_peer){
        .self_uid = ME,
        .uid = ME,
        .pid = 4242,
        .want_pid = want,
        .woken = true,
        .yama_scope = -1,
    };
}

/* Another user's process never gets anything, whatever else holds; root always may,
 * unless the attacher that woke us is another process. */
static void test_peer_uid_rule(void **state)
{
    (void)state;
    struct client_peer p = woken_by(4242);
    p.uid = OTHER;
    assert_false(client_peer_trusted(&p));
    p.woken = false;
    p.want_pid = 0;
    assert_false(client_peer_trusted(&p));
    p.uid = 0;
    assert_true(client_peer_trusted(&p));
    p = woken_by(0);
    p.uid = 0;
    p.yama_scope = 3;
    assert_true(client_peer_trusted(&p));
    p.want_pid = 99;
    assert_false(client_peer_trusted(&p));
}

/* A wake that names its attacher: only that process, even of our uid. */
static void test_peer_bug_not_the_attacher(void **state)
{
    (void)state;
    struct client_peer p = woken_by(4242);
    assert_true(client_peer_trusted(&p));
    p.want_pid = 4243;
    assert_false(client_peer_trusted(&p));
    p.ancestor = true;
    p.cap_ptrace = true;
    assert_false(client_peer_trusted(&p));
    /* A peer in a pid namespace we cannot see shows pid 0. */
    p = woken_by(4242);
    p.pid = 0;
    assert_false(client_peer_trusted(&p));
}

/* A wake from outside our pid namespace (heapprof attach on a container's host), to the
 * socket it made in our root: only a peer we cannot see (pid 0), of our uid or root; any
 * process we can see, even of our uid, with Yama's facts or not, gets nothing. */
static void test_peer_wake_from_outside(void **state)
{
    (void)state;
    struct client_peer p = woken_by(CLIENT_PEER_HIDDEN);
    assert_false(client_peer_needs_ptrace_facts(&p));
    assert_false(client_peer_trusted(&p)); /* pid 4242: one of ours */
    p.ancestor = true;
    p.cap_ptrace = true;
    p.yama_scope = 1;
    assert_false(client_peer_trusted(&p));
    p = woken_by(CLIENT_PEER_HIDDEN);
    p.pid = 0;
    assert_true(client_peer_trusted(&p));
    p.uid = 0;
    assert_true(client_peer_trusted(&p));
    p.uid = OTHER;
    assert_false(client_peer_trusted(&p));
}

/* A daemon's wake (no attacher pid): Yama's rule for a ptrace. */
static void test_peer_bug_daemon_wake_under_yama(void **state)
{
    (void)state;
    struct client_peer p = woken_by(0);
    assert_false(client_peer_needs_ptrace_facts(&p));
    assert_true(client_peer_trusted(&p)); /* no Yama */
    p.yama_scope = 0;
    assert_true(client_peer_trusted(&p));

    p.yama_scope = 1;
    assert_true(client_peer_needs_ptrace_facts(&p));
    assert_false(client_peer_trusted(&p));
    p.ancestor = true;
    assert_true(client_peer_trusted(&p));
    p.ancestor = false;
    p.cap_ptrace = true;
    assert_true(client_peer_trusted(&p));

    /* Admin only: an ancestor is not enough. */
    p = woken_by(0);
    p.yama_scope = 2;
    p.ancestor = true;
    assert_false(client_peer_trusted(&p));
    p.cap_ptrace = true;
    assert_true(client_peer_trusted(&p));
}

/* A startup handshake, on the socket the program was started with: the uid rule only. */
static void test_peer_startup_uid_only(void **state)
{
    (void)state;
    struct client_peer p = woken_by(0);
    p.woken = false;
    p.yama_scope = 1;
    assert_false(client_peer_needs_ptrace_facts(&p));
    assert_true(client_peer_trusted(&p));
    /* A followed fork names its parent's service. */
    p.want_pid = 4243;
    assert_false(client_peer_trusted(&p));
}

/* Our parent and its parents are ancestors; we, our child and nonsense are not. */
static void test_peer_ancestors(void **state)
{
    (void)state;
    assert_true(client_peer_is_ancestor(getppid()));
    assert_false(client_peer_is_ancestor(getpid()));
    assert_false(client_peer_is_ancestor(0));
    assert_false(client_peer_is_ancestor(-1));
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        pause();
        _exit(0);
    }
    assert_false(client_peer_is_ancestor(c));
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
}

/* CAP_SYS_PTRACE as capget() tells it for us; a pid that does not exist has none. */
static void test_peer_cap_ptrace(void **state)
{
    (void)state;
    struct {
        uint32_t version;
        int pid;
    } hdr = {0x20080522, 0}; /* _LINUX_CAPABILITY_VERSION_3 */
    struct {
        uint32_t effective, permitted, inheritable;
    } data[2];
    assert_int_equal(syscall(SYS_capget, &hdr, data), 0);
    bool has = (data[0].effective >> 19) & 1;
    assert_int_equal(client_peer_has_cap_ptrace(getpid()), has);
    assert_false(client_peer_has_cap_ptrace(0));
    assert_false(client_peer_has_cap_ptrace(0x3fffffff));
}

static void test_peer_yama_scope(void **state)
{
    (void)state;
    int expect = -1;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (f) {
        assert_int_equal(fscanf(f, "%d", &expect), 1);
        fclose(f);
    }
    assert_int_equal(client_peer_yama_scope(), expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_uid_rule),
        cmocka_unit_test(test_peer_bug_not_the_attacher),
        cmocka_unit_test(test_peer_bug_daemon_wake_under_yama),
        cmocka_unit_test(test_peer_wake_from_outside),
        cmocka_unit_test(test_peer_startup_uid_only),
        cmocka_unit_test(test_peer_ancestors),
        cmocka_unit_test(test_peer_cap_ptrace),
        cmocka_unit_test(test_peer_yama_scope),
    };
    return cmocka_run_group_tests_name("peer", tests, NULL, NULL);
}
