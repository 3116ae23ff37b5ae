/* tests/service/test_procstate.c: telling a live process from one that is going away,
 * from the text of /proc/PID/stat (service/procstate.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "service/svc_internal.h"

/* A stat line of pid 42 named @comm in state @state with @flags, the rest as the kernel
 * writes it. */
static const char *stat_line(char *buf, size_t len, const char *comm, char state,
                             unsigned long flags)
{
    snprintf(buf, len, "42 (%s) %c 1 42 42 0 -1 %lu 123 0 0 0 5 3 0 0 20 0 1 0 777", comm, state,
             flags);
    return buf;
}

static void test_procstate_running_and_sleeping_are_alive(void **state)
{
    (void)state;
    char b[256];
    assert_true(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'R', 4194304)));
    assert_true(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'S', 4194560)));
    assert_true(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'D', 4194304)));
}

static void test_procstate_zombies_are_gone(void **state)
{
    (void)state;
    char b[256];
    assert_false(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'Z', 4227084)));
    assert_false(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'X', 4227084)));
    assert_false(svc__stat_alive(""));
}

/* A process killed closes its descriptors, the profiler's socket among them, before it
 * becomes a zombie. The service read its state there and, on a busy machine, found it
 * still running: a SIGKILLed program was logged "ended (exec'd)". PF_EXITING (0x4) in
 * the flags says it is on its way out. */
static void test_procstate_bug_killed_process_read_as_execd(void **state)
{
    (void)state;
    char b[256];
    assert_false(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'R', 4194304 | 0x4)));
    assert_false(svc__stat_alive(stat_line(b, sizeof(b), "worker", 'D', 0x4)));
}

/* The name may hold anything, spaces and parentheses included. */
static void test_procstate_name_with_parentheses(void **state)
{
    (void)state;
    char b[256];
    assert_true(svc__stat_alive(stat_line(b, sizeof(b), "a) Z 1 (b", 'S', 4194304)));
    assert_false(svc__stat_alive(stat_line(b, sizeof(b), "a) S 1 (b", 'S', 4194304 | 0x4)));
}

/* This test process itself, read from /proc: alive. */
static void test_procstate_self_is_alive(void **state)
{
    (void)state;
    assert_true(svc__process_alive(getpid()));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_procstate_running_and_sleeping_are_alive),
        cmocka_unit_test(test_procstate_zombies_are_gone),
        cmocka_unit_test(test_procstate_bug_killed_process_read_as_execd),
        cmocka_unit_test(test_procstate_name_with_parentheses),
        cmocka_unit_test(test_procstate_self_is_alive),
    };
    return cmocka_run_group_tests_name("service_procstate", tests, NULL, NULL);
}
