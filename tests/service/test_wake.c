/* tests/service/test_wake.c: which thread a wake takes and which interrupted call it
 * restarts (service/wake.h), from /proc texts and registers as the kernel shows them. */
#include <errno.h>
#include <sys/syscall.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "service/svc.h"
#include "service/wake.h"

/* "NR a1..a6 sp pc", as /proc/PID/task/TID/syscall prints it. */
#define SP_PC " 0x7ffd1230 0x7f0012345678"

static void test_wake_look_states(void **state)
{
    (void)state;
    assert_int_equal(svc_wake_look('R', "running\n"), SVC_WAKE_RUNNING);
    assert_int_equal(svc_wake_look('S', "running\n"), SVC_WAKE_RUNNING); /* raced */
    assert_int_equal(svc_wake_look('S', "-1" SP_PC "\n"), SVC_WAKE_RUNNING);
    /* D: no prompt stop (a vfork parent, I/O); T/t: stopped or traced; Z: gone. */
    assert_int_equal(svc_wake_look('D', "0 0x3 0x1 0x1 0 0 0" SP_PC), SVC_WAKE_SKIP);
    assert_int_equal(svc_wake_look('T', "running"), SVC_WAKE_SKIP);
    assert_int_equal(svc_wake_look('t', "running"), SVC_WAKE_SKIP);
    assert_int_equal(svc_wake_look('Z', "running"), SVC_WAKE_SKIP);
    assert_int_equal(svc_wake_look('S', ""), SVC_WAKE_SKIP);
}

/* Calls a stop restarts transparently (measured: -ERESTART* at the stop). */
static void test_wake_look_transparent_calls(void **state)
{
    (void)state;
    assert_int_equal(svc_wake_look('S', "7 0x7ffd 0x1 0xffffffff 0 0 0" SP_PC), SVC_WAKE_IDLE);
    assert_int_equal(svc_wake_look('S', "202 0x55 0x80 0x2 0 0 0" SP_PC), SVC_WAKE_IDLE);
    assert_int_equal(svc_wake_look('S', "230 0x1 0 0x7ffd 0 0 0" SP_PC), SVC_WAKE_IDLE);
    assert_int_equal(svc_wake_look('S', "0 0x0 0x7ffd 0x1 0 0 0" SP_PC), SVC_WAKE_IDLE);
    assert_int_equal(svc_wake_look('S', "271 0 0 0 0 0x8 0" SP_PC), SVC_WAKE_IDLE);
}

/* Calls a stop ends with EINTR: taken only without a timeout. */
static void test_wake_look_eintr_calls(void **state)
{
    (void)state;
    /* epoll_wait(ep, ev, n, -1): the int timeout may come with any upper half. */
    assert_int_equal(svc_wake_look('S', "232 0x3 0x7ffd 0x1 0xffffffff 0 0" SP_PC),
                     SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "232 0x3 0x7ffd 0x1 0xffffffffffffffff 0 0" SP_PC),
                     SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "232 0x3 0x7ffd 0x1 0x64 0 0" SP_PC), SVC_WAKE_LATER);
    assert_int_equal(svc_wake_look('S', "232 0x3 0x7ffd 0x1 0x0 0 0" SP_PC), SVC_WAKE_LATER);
    assert_int_equal(svc_wake_look('S', "281 0x3 0x7ffd 0x1 0xffffffff 0x7ffd 0x8" SP_PC),
                     SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "281 0x3 0x7ffd 0x1 0x3e8 0x7ffd 0x8" SP_PC),
                     SVC_WAKE_LATER);
    /* epoll_pwait2 and semtimedop: a timespec pointer, NULL for none. */
    assert_int_equal(svc_wake_look('S', "441 0x3 0x7ffd 0x1 0x0 0 0x8" SP_PC), SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "441 0x3 0x7ffd 0x1 0x7ffd 0 0x8" SP_PC), SVC_WAKE_LATER);
    assert_int_equal(svc_wake_look('S', "65 0x8000 0x7ffd 0x1 0 0 0" SP_PC), SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "220 0x8000 0x7ffd 0x1 0 0 0" SP_PC), SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "220 0x8000 0x7ffd 0x1 0x7ffd 0 0" SP_PC), SVC_WAKE_LATER);
    /* rt_sigtimedwait(set, info, timeout, 8): sigwaitinfo passes NULL. */
    assert_int_equal(svc_wake_look('S', "128 0x7ffd 0x7ffd 0 0x8 0 0" SP_PC), SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "128 0x7ffd 0 0x7ffd 0x8 0 0" SP_PC), SVC_WAKE_LATER);
    assert_int_equal(svc_wake_look('S', "208 0x7f00 0x1 0x1 0x7ffd 0 0" SP_PC),
                     SVC_WAKE_IDLE_EINTR);
    assert_int_equal(svc_wake_look('S', "208 0x7f00 0x1 0x1 0x7ffd 0x7ffd 0" SP_PC),
                     SVC_WAKE_LATER);
    /* Arguments cut off: not guessed. */
    assert_int_equal(svc_wake_look('S', "232 0x3"), SVC_WAKE_LATER);
}

static void test_wake_restart_rule(void **state)
{
    (void)state;
    /* Our stop ended epoll_wait with EINTR: restarted exactly. */
    assert_true(svc_wake_restart(SYS_epoll_wait, -EINTR, false));
    assert_true(svc_wake_restart(SYS_rt_sigtimedwait, -EINTR, false));
    /* A real signal is pending: the EINTR is the program's. */
    assert_false(svc_wake_restart(SYS_epoll_wait, -EINTR, true));
    /* The kernel restarts these itself (rax -ERESTARTSYS, -ERESTARTNOHAND,
     * -ERESTART_RESTARTBLOCK); a call that completed is left as it is. */
    assert_false(svc_wake_restart(SYS_read, -512, false));
    assert_false(svc_wake_restart(SYS_ppoll, -514, false));
    assert_false(svc_wake_restart(SYS_nanosleep, -516, false));
    assert_false(svc_wake_restart(SYS_epoll_wait, 1, false));
    assert_false(svc_wake_restart(SYS_read, -EAGAIN, false));
    /* Not in a system call. */
    assert_false(svc_wake_restart(-1, -EINTR, false));
}

static void test_wake_page_in_maps(void **state)
{
    (void)state;
    const char *maps =
        "55d0a0000000-55d0a0001000 r--p 00000000 08:01 123 /usr/bin/prog\n"
        "7f1c2d3e4000-7f1c2d3e5000 r--s 00000000 00:01 4567 /memfd:heapprof-attach-38 (deleted)\n"
        "7f1c2d3e6000-7f1c2d3e7000 r--s 00000000 00:01 4568 /memfd:heapprof-attach-wake-x "
        "(deleted)\n"
        "7f1c2d3e8000-7f1c2d3e9000 r--s 00000000 00:01 4569 /memfd:heapprof-attach-wake "
        "(deleted)\n";
    assert_int_equal(svc__wake_page_addr(maps), 0x7f1c2d3e8000ull);
    assert_int_equal(svc__wake_page_addr("55d0a0000000-55d0a0001000 r--p 0 08:01 1 /x\n"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wake_look_states),
        cmocka_unit_test(test_wake_look_transparent_calls),
        cmocka_unit_test(test_wake_look_eintr_calls),
        cmocka_unit_test(test_wake_restart_rule),
        cmocka_unit_test(test_wake_page_in_maps),
    };
    return cmocka_run_group_tests_name("service_wake", tests, NULL, NULL);
}
