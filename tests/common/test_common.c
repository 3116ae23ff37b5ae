/* tests/common/test_common.c: fd passing, the string interner, register capture. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/fdpass.h"
#include "common/paths.h"
#include "common/procfs.h"
#include "common/strtab.h"
#include "tests/support/regs.h"

static void test_fdpass_roundtrip(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    uint64_t msg = 0x1122334455667788ull, got = 0;
    int fds[2] = {fd, fd};
    assert_int_equal(hp_send_fds(sv[0], &msg, sizeof(msg), fds, 2), 0);
    int rfds[2] = {-1, -1};
    size_t n = 0;
    assert_int_equal(hp_recv_fds(sv[1], &got, sizeof(got), rfds, 2, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(got, msg);
    struct stat a, b;
    assert_int_equal(fstat(fd, &a), 0);
    assert_int_equal(fstat(rfds[0], &b), 0);
    assert_int_equal(a.st_ino, b.st_ino);
    assert_true(fcntl(rfds[0], F_GETFD) & FD_CLOEXEC);
    close(rfds[0]);
    close(rfds[1]);
    close(fd);
    close(sv[0]);
    close(sv[1]);
}

static void test_fdpass_extra_fds_closed(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    uint32_t msg = 7, got;
    int fds[3] = {fd, fd, fd};
    assert_int_equal(hp_send_fds(sv[0], &msg, sizeof(msg), fds, 3), 0);
    int rfds[1] = {-1};
    size_t n = 0;
    assert_int_equal(hp_recv_fds(sv[1], &got, sizeof(got), rfds, 1, &n), 0);
    assert_int_equal(n, 1);
    close(rfds[0]);
    close(fd);
    close(sv[0]);
    close(sv[1]);
}

static void test_fdpass_short_and_eof(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    uint16_t small = 1;
    assert_int_equal(hp_send_fds(sv[0], &small, sizeof(small), NULL, 0), 0);
    close(sv[0]);
    uint64_t got;
    int rfds[1];
    size_t n;
    assert_int_equal(hp_recv_fds(sv[1], &got, sizeof(got), rfds, 1, &n), -EBADMSG);
    assert_int_equal(hp_recv_fds(sv[1], &got, sizeof(got), rfds, 1, &n), -ECONNRESET);
    close(sv[1]);
    /* A peer that went away: EPIPE, and no SIGPIPE kills us. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    close(sv[1]);
    assert_int_equal(hp_send_fds(sv[0], &got, sizeof(got), NULL, 0), -EPIPE);
    close(sv[0]);
}

static void *intern_thread(void *arg)
{
    hp_strtab_t *t = arg;
    for (int i = 0; i < 5000; i++) {
        char buf[32];
        int n = snprintf(buf, sizeof(buf), "name-%d", i % 1000);
        if (!hp_strtab_intern(t, buf, (size_t)n))
            return (void *)1;
    }
    return NULL;
}

static void test_strtab_intern(void **state)
{
    (void)state;
    hp_strtab_t *t = hp_strtab_new();
    assert_non_null(t);
    const char *a = hp_strtab_intern(t, "malloc", 6);
    const char *b = hp_strtab_intern(t, "mallocx", 6);
    const char *c = hp_strtab_intern(t, "free", 4);
    const char *e = hp_strtab_intern(t, "", 0);
    assert_ptr_equal(a, b);
    assert_string_equal(a, "malloc");
    assert_string_equal(c, "free");
    assert_string_equal(e, "");
    assert_ptr_not_equal(a, c);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, intern_thread, t), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    const char *x = hp_strtab_intern(t, "name-999", 8);
    assert_ptr_equal(x, hp_strtab_intern(t, "name-999", 8));
    assert_true(hp_strtab_bytes(t) > 1000);
    t = hp_strtab_free(t);
    assert_null(t);
}

__attribute__((noinline)) static void capture_here(uint64_t *regs, void **ret_pc)
{
    hp_capture_regs(regs);
    *ret_pc = __builtin_return_address(0);
    __asm__ volatile("" ::: "memory");
}

static void test_regs_capture(void **state)
{
    (void)state;
    uint64_t regs[HP_NREGS] = {0};
    void *pc;
    int local = 0;
    capture_here(regs, &pc);
    /* rip is inside capture_here, before its own return address; rsp is on our stack. */
    assert_true(regs[HP_REG_RIP] != 0);
    assert_true(regs[HP_REG_RSP] < (uint64_t)(uintptr_t)&local);
    assert_true((uint64_t)(uintptr_t)&local - regs[HP_REG_RSP] < 4096);
    assert_true(regs[HP_REG_RIP] < (uint64_t)(uintptr_t)pc ||
                regs[HP_REG_RIP] > (uint64_t)(uintptr_t)pc + 64);
}

static void test_paths_runtime_dir(void **state)
{
    (void)state;
    char buf[HP_PATH_MAX];
    assert_int_equal(hp_runtime_dir("/run/user/1000", 1000, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/user/1000/heapprof");
    assert_int_equal(hp_runtime_dir(NULL, 1234, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/heapprof-1234");
    assert_int_equal(hp_runtime_dir("relative/dir", 0, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/heapprof-0");
    assert_int_equal(hp_socket_path(NULL, 5, 0, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/heapprof-5/heapprofd.sock");
    assert_int_equal(hp_socket_path("/run/user/5", 5, 4242, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/user/5/heapprof/attach-4242.sock");
    char longdir[200];
    memset(longdir, 'a', sizeof(longdir));
    longdir[0] = '/';
    longdir[199] = '\0';
    assert_int_equal(hp_socket_path(longdir, 5, 1, buf, sizeof(buf)), -ENAMETOOLONG);
    char tiny[8];
    assert_int_equal(hp_runtime_dir(NULL, 1234, tiny, sizeof(tiny)), -ENAMETOOLONG);
}

/* The pid in the innermost namespace: the last of NSpid; the fallback without the line
 * or with garbage in it; and this process's own, which is its getpid() here. */
static void test_procfs_ns_pid(void **state)
{
    (void)state;
    const char nested[] = "Name:\tsh\nPid:\t4242\nNSpid:\t4242\t17\t1\nNSpgid:\t9\n";
    assert_int_equal(hp_status_ns_pid(nested, strlen(nested), 4242), 1);
    const char flat[] = "Pid:\t77\nNSpid:\t77\n";
    assert_int_equal(hp_status_ns_pid(flat, strlen(flat), 5), 77);
    const char none[] = "Name:\tx\nPid:\t77\n";
    assert_int_equal(hp_status_ns_pid(none, strlen(none), 5), 5);
    const char junk[] = "NSpid:\t77\tabc\n";
    assert_int_equal(hp_status_ns_pid(junk, strlen(junk), 5), 5);
    const char huge[] = "NSpid:\t99999999999999999999\n";
    assert_int_equal(hp_status_ns_pid(huge, strlen(huge), 5), 5);
    /* Cut inside the line: what is there counts. */
    assert_int_equal(hp_status_ns_pid(nested, strlen("Name:\tsh\nPid:\t4242\nNSpid:\t4242\t17"), 3),
                     17);
    assert_int_equal(hp_proc_ns_pid(getpid()), getpid());
    assert_int_equal(hp_proc_ns_pid(-1), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fdpass_roundtrip),     cmocka_unit_test(test_fdpass_extra_fds_closed),
        cmocka_unit_test(test_fdpass_short_and_eof), cmocka_unit_test(test_strtab_intern),
        cmocka_unit_test(test_regs_capture),         cmocka_unit_test(test_paths_runtime_dir),
        cmocka_unit_test(test_procfs_ns_pid),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
