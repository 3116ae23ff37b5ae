/* tests/bookkeeping/test_snapshot.c: a snapshot of one process (bk_snapshot_process())
 * reads back as a trace of its own with that process's current profile, and leaves the
 * session's own trace as if it had not been taken: callstacks interned before it and
 * still unwritten there are written by the session's next dump. Also the list of the
 * processes (bk_process_summary()). */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"
#include "report/report.h"

#define PID_A 42
#define PID_B 43

static const struct hp_mapping app = {.start = 0x400000, .end = 0x500000, .path = "/bin/app"};

/* One sampled allocation of @size at leaf "site<k>" called from main. */
static void alloc(bk_t *bk, int32_t pid, uint64_t seq, uint64_t addr, uint64_t size, unsigned k)
{
    char name[16];
    snprintf(name, sizeof(name), "site%u", k);
    struct hp_frame f[2] = {
        {.map = &app, .function_name = name, .rel_pc = 0x100 + k},
        {.map = &app, .function_name = "main", .rel_pc = 0x10},
    };
    bk_record_alloc(bk, pid, 0, seq, addr, size, size, f, 2);
}

/* The trace written to memfd @fd so far, read back. */
static struct rp_trace *load_fd(int fd)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true(st.st_size > 0);
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(m != MAP_FAILED);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load_buffer(m, (size_t)st.st_size, &(struct rp_trace_options){0}, &t),
                     0);
    munmap(m, (size_t)st.st_size);
    return t;
}

static const struct rp_trace_process *find(const struct rp_trace *t, int32_t pid)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == pid && t->processes[i].selected)
            return &t->processes[i];
    return NULL;
}

/* Unreleased bytes of leaf "site<k>" in @p; -1 when it has no such site. */
static int64_t live_of(const struct rp_trace_process *p, unsigned k)
{
    char name[16];
    snprintf(name, sizeof(name), "site%u", k);
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        if (c->n_frames == 2 && strcmp(c->frames[1].function_name, name) == 0 &&
            strcmp(c->frames[0].function_name, "main") == 0)
            return (int64_t)(c->self_allocated - c->self_freed);
    }
    return -1;
}

struct fixture {
    int session_fd;
    bk_t *bk;
};

static int setup(void **state)
{
    struct fixture *fx = test_calloc(1, sizeof(*fx));
    fx->session_fd = memfd_create("session", MFD_CLOEXEC);
    if (fx->session_fd < 0 || bk_new(&(struct bk_config){.out_fd = fx->session_fd}, &fx->bk) < 0 ||
        bk_process_start(fx->bk, PID_A, "app\0-x", 7, true, 4096) < 0 ||
        bk_process_start(fx->bk, PID_B, "other", 5, true, 4096) < 0)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    fx->bk = bk_free(fx->bk);
    close(fx->session_fd);
    test_free(fx);
    return 0;
}

/* Sites 0..4 of A and 10..12 of B dumped by the session; then site 5 of A (a callstack
 * the session's trace has not written yet); then the snapshot of A. */
static void take_snapshot(struct fixture *fx, int snap_fd)
{
    uint64_t seq_a = 1, seq_b = 1;
    for (unsigned k = 0; k < 5; k++)
        alloc(fx->bk, PID_A, seq_a++, 0x1000 + k * 0x100, 100 * (k + 1), k);
    bk_record_free(fx->bk, PID_A, 0, seq_a++, 0x1000); /* site 0 freed */
    for (unsigned k = 10; k < 13; k++)
        alloc(fx->bk, PID_B, seq_b++, 0x9000 + k * 0x100, 7, k);
    assert_int_equal(bk_dump_all(fx->bk), 0);
    alloc(fx->bk, PID_A, seq_a++, 0x5000, 555, 5);
    struct bk_counters before, after;
    bk_get_counters(fx->bk, &before);
    assert_int_equal(bk_snapshot_process(fx->bk, PID_A, snap_fd), 0);
    bk_get_counters(fx->bk, &after);
    assert_int_equal(after.dumps, before.dumps);
    assert_int_equal(after.bytes_written, before.bytes_written);
    alloc(fx->bk, PID_A, seq_a++, 0x6000, 666, 6);
}

static void check_snapshot(int snap_fd)
{
    struct rp_trace *t = load_fd(snap_fd);
    const struct rp_trace_process *a = find(t, PID_A);
    assert_non_null(a);
    assert_null(find(t, PID_B));
    assert_string_equal(a->cmdline, "app -x");
    assert_int_equal(live_of(a, 0), 0);
    for (unsigned k = 1; k < 5; k++)
        assert_int_equal(live_of(a, k), 100 * (k + 1));
    assert_int_equal(live_of(a, 5), 555);
    assert_int_equal(live_of(a, 6), -1); /* after the snapshot */
    t = rp_trace_free(t);
}

static void test_snapshot_is_its_own_trace(void **state)
{
    struct fixture *fx = *state;
    int snap = memfd_create("snap", MFD_CLOEXEC);
    assert_true(snap >= 0);
    take_snapshot(fx, snap);
    check_snapshot(snap);
    close(snap);
}

/* Split into many packets, each item in its own: the same profile. */
static void test_snapshot_split_in_packets(void **state)
{
    struct fixture *fx = *state;
    bk__set_max_packet_bytes(fx->bk, 64);
    int snap = memfd_create("snap", MFD_CLOEXEC);
    assert_true(snap >= 0);
    take_snapshot(fx, snap);
    check_snapshot(snap);
    close(snap);
}

static void test_snapshot_leaves_the_session_trace(void **state)
{
    struct fixture *fx = *state;
    int snap = memfd_create("snap", MFD_CLOEXEC);
    assert_true(snap >= 0);
    take_snapshot(fx, snap);
    close(snap);
    assert_int_equal(bk_dump_all(fx->bk), 0);
    struct rp_trace *t = load_fd(fx->session_fd);
    assert_false(t->truncated);
    assert_int_equal(t->incomplete_dumps, 0);
    const struct rp_trace_process *a = find(t, PID_A);
    assert_non_null(a);
    assert_int_equal(a->n_dumps, 2);
    assert_int_equal(live_of(a, 5), 555); /* its callstack written by the session itself */
    assert_int_equal(live_of(a, 6), 666);
    assert_int_equal(live_of(find(t, PID_B), 11), 7);
    t = rp_trace_free(t);
}

static void test_snapshot_unknown_pid(void **state)
{
    struct fixture *fx = *state;
    int snap = memfd_create("snap", MFD_CLOEXEC);
    assert_int_equal(bk_snapshot_process(fx->bk, 999, snap), -ESRCH);
    struct stat st;
    assert_int_equal(fstat(snap, &st), 0);
    assert_int_equal(st.st_size, 0);
    close(snap);
}

static void test_snapshot_process_summary(void **state)
{
    struct fixture *fx = *state;
    int snap = memfd_create("snap", MFD_CLOEXEC);
    take_snapshot(fx, snap);
    close(snap);
    assert_int_equal(bk_n_processes(fx->bk), 2);
    struct bk_proc_summary s;
    bk_process_summary(fx->bk, 0, &s);
    assert_int_equal(s.pid, PID_A);
    assert_int_equal(s.cmdline_len, 7);
    assert_memory_equal(s.cmdline, "app\0-x", 7);
    /* Records wait in a short queue before they apply: 7 allocations in all. */
    assert_int_equal(s.samples, 7);
    assert_int_equal(s.allocated_bytes, 100 + 200 + 300 + 400 + 500 + 555 + 666);
    assert_int_equal(s.live_bytes, 200 + 300 + 400 + 500 + 555 + 666);
    bk_process_summary(fx->bk, 1, &s);
    assert_int_equal(s.pid, PID_B);
    assert_int_equal(s.live_bytes, 21);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_snapshot_is_its_own_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_split_in_packets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_leaves_the_session_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_unknown_pid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_process_summary, setup, teardown),
    };
    return cmocka_run_group_tests_name("snapshot", tests, NULL, NULL);
}
