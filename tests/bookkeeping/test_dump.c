/* tests/bookkeeping/test_dump.c: dumps written by bookkeeping, checked byte by byte with
 * the wire helpers and read back with rp_trace_load(): values, packet splitting, index
 * and continued flags, interning order, clock snapshots, truncated files, write errors,
 * hostile input, and the varint/framing helpers themselves. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"
#include "common/pbwire.h"
#include "report/report.h"

#define SEQ_ID 7
#define SITES 300
#define MAX_PACKET 2000
#define PID_A 100
#define PID_B 200

/* ---- the workload and its model ---- */

static const struct hp_mapping libs[3] = {
    {.start = 0x7f0000000000,
     .end = 0x7f0000100000,
     .exact_offset = 0x1000,
     .path = "/usr/lib/libc.so.6",
     .build_id_len = 3,
     .build_id = {0xab, 0xcd, 0xef}},
    {.start = 0x7f0000200000, .end = 0x7f0000300000, .path = "/opt/lib/libfoo.so"},
    {.start = 0x400000, .end = 0x500000, .load_bias = 0x1000, .path = "/usr/bin/app"},
};

struct model_site {
    uint64_t allocated, freed, alloc_count, free_count;
};

struct model {
    struct model_site site[2][SITES]; /* [process][k] */
    /* Live bytes/blocks now and at each process's heap peak (copied at every new peak). */
    uint64_t live[2][SITES], live_n[2][SITES], total[2], peak[2];
    uint64_t at_peak[2][SITES], at_peak_n[2][SITES];
};

static char leaf_names[SITES][24];
static char mid_names[10][16];

/* Stack k, leaf first: leaf_k (in libs[k % 3]), [extra (k % 4 == 0)], mid_(k % 10), main. */
static size_t make_stack(unsigned k, struct hp_frame *f)
{
    size_t n = 0;
    snprintf(leaf_names[k], sizeof(leaf_names[k]), "leaf_%u", k);
    snprintf(mid_names[k % 10], sizeof(mid_names[0]), "mid_%u", k % 10);
    f[n++] = (struct hp_frame){&libs[k % 3], leaf_names[k], 0x1000 + k};
    if (k % 4 == 0)
        f[n++] = (struct hp_frame){&libs[1], "_ZN5extra4stepEi", 0x77};
    f[n++] = (struct hp_frame){&libs[2], mid_names[k % 10], 0x200 + k % 10};
    f[n++] = (struct hp_frame){&libs[2], "main", 0x10};
    return n;
}

static uint64_t addr_of(int proc, unsigned k, unsigned j)
{
    return 0x100000000ull * (uint64_t)(proc + 1) + k * 64 + j * 16;
}

static uint64_t size_of(int proc, unsigned k)
{
    return (k + 1) * 16 * (uint64_t)(proc + 1);
}

static void do_alloc(bk_t *bk, struct model *m, int proc, uint64_t *seq, unsigned k, unsigned j)
{
    struct hp_frame f[4];
    size_t n = make_stack(k, f);
    int32_t pid = proc ? PID_B : PID_A;
    bk_record_alloc(bk, pid, 0, ++*seq, addr_of(proc, k, j), 1, size_of(proc, k), f, n);
    m->site[proc][k].allocated += size_of(proc, k);
    m->site[proc][k].alloc_count++;
    m->live[proc][k] += size_of(proc, k);
    m->live_n[proc][k]++;
    m->total[proc] += size_of(proc, k);
    if (m->total[proc] > m->peak[proc]) {
        m->peak[proc] = m->total[proc];
        memcpy(m->at_peak[proc], m->live[proc], sizeof(m->live[proc]));
        memcpy(m->at_peak_n[proc], m->live_n[proc], sizeof(m->live_n[proc]));
    }
}

static void do_free(bk_t *bk, struct model *m, int proc, uint64_t *seq, unsigned k, unsigned j)
{
    int32_t pid = proc ? PID_B : PID_A;
    bk_record_free(bk, pid, 0, ++*seq, addr_of(proc, k, j));
    m->site[proc][k].freed += size_of(proc, k);
    m->site[proc][k].free_count++;
    m->live[proc][k] -= size_of(proc, k);
    m->live_n[proc][k]--;
    m->total[proc] -= size_of(proc, k);
}

struct written {
    struct model dump1, dump2;
    int fd;
    char path[64];
};

static int memfd_path(struct written *w)
{
    w->fd = memfd_create("trace", MFD_CLOEXEC);
    if (w->fd < 0)
        return -1;
    snprintf(w->path, sizeof(w->path), "/proc/self/fd/%d", w->fd);
    return 0;
}

/* Writes to @fd: two processes, SITES stacks each, two dumps each (A's second one at
 * its end), in packets of at most @max_packet bytes (0: the default bound). */
static void write_workload_to(int fd, struct written *w, bool dump_at_max, size_t max_packet)
{
    w->fd = fd;
    bk_t *bk;
    assert_int_equal(
        bk_new(
            &(struct bk_config){.out_fd = w->fd, .sequence_id = SEQ_ID, .dump_at_max = dump_at_max},
            &bk),
        0);
    if (max_packet)
        bk__set_max_packet_bytes(bk, max_packet);
    assert_int_equal(bk_process_start(bk, PID_A, "app\0--mode\0fast\0", 16, true, 4096), 0);
    assert_int_equal(bk_process_start(bk, PID_B, "daemon", 6, false, 512), 0);
    struct model m = {0};
    uint64_t seq[2] = {0, 0};
    for (int proc = 0; proc < 2; proc++) {
        for (unsigned k = 0; k < SITES; k++) {
            do_alloc(bk, &m, proc, &seq[proc], k, 0);
            do_alloc(bk, &m, proc, &seq[proc], k, 1);
            if (k % 3 == 0)
                do_free(bk, &m, proc, &seq[proc], k, 0);
        }
    }
    assert_int_equal(bk_dump_all(bk), 0);
    w->dump1 = m;
    for (int proc = 0; proc < 2; proc++) {
        for (unsigned k = 0; k < SITES; k++) {
            if (k % 5 == 0)
                do_free(bk, &m, proc, &seq[proc], k, 1);
            if (k < 50)
                do_alloc(bk, &m, proc, &seq[proc], k, 2);
        }
    }
    struct bk_process_stats st = {.unwinding_errors = 3,
                                  .heap_samples = 1234,
                                  .map_reparses = 2,
                                  .total_unwinding_time_us = 777,
                                  .client_spinlock_blocked_us = 5,
                                  .unwinding_time_hist = {1, 2, 3, 4, 5, 6, 7, 8}};
    assert_int_equal(
        bk_process_end(bk, PID_A, &st,
                       BK_FLAG_DISCONNECTED | BK_FLAG_HIT_GUARDRAIL | BK_FLAG_CONN_LOST),
        0);
    bk_process_update(bk, PID_B, &(struct bk_process_stats){.records_dropped = 9}, 0);
    assert_int_equal(bk_dump_all(bk), 0);
    w->dump2 = m;
    struct bk_counters c;
    bk_get_counters(bk, &c);
    assert_int_equal(c.dumps, 4);
    assert_int_equal(c.last_write_error, 0);
    assert_int_equal(c.seq_gaps, 0);
    struct stat sb;
    assert_int_equal(fstat(w->fd, &sb), 0);
    if (S_ISREG(sb.st_mode))
        assert_int_equal(c.bytes_written, (uint64_t)sb.st_size);
    bk_free(bk);
}

/* write_workload_to() a new memfd, in packets of at most MAX_PACKET bytes. */
static void write_workload(struct written *w, bool dump_at_max)
{
    assert_int_equal(memfd_path(w), 0);
    write_workload_to(w->fd, w, dump_at_max, MAX_PACKET);
}

static uint8_t *read_all(int fd, size_t *ret_len)
{
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    uint8_t *buf = malloc((size_t)sb.st_size + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)sb.st_size, 0), sb.st_size);
    *ret_len = (size_t)sb.st_size;
    return buf;
}

static const struct rp_trace_process *find_proc(const struct rp_trace *t, int32_t pid)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == pid)
            return &t->processes[i];
    fail_msg("pid %d not in the trace", pid);
    return NULL;
}

/* Checks every callsite of @p against the model of @proc (values and full stacks). */
static void check_process(const struct rp_trace_process *p, const struct model *m, int proc)
{
    size_t expected_sites = 0;
    for (unsigned k = 0; k < SITES; k++)
        expected_sites += m->site[proc][k].alloc_count > 0;
    assert_int_equal(p->n_callsites, expected_sites);
    bool seen[SITES] = {0};
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        assert_true(c->n_frames >= 3);
        const struct rp_trace_frame *leaf = &c->frames[c->n_frames - 1];
        unsigned k;
        assert_int_equal(sscanf(leaf->function_name, "leaf_%u", &k), 1);
        assert_true(k < SITES);
        assert_false(seen[k]);
        seen[k] = true;
        struct hp_frame f[4];
        size_t n = make_stack(k, f);
        assert_int_equal(c->n_frames, n);
        for (size_t j = 0; j < n; j++) { /* callsite frames are root first */
            const struct hp_frame *e = &f[n - 1 - j];
            assert_string_equal(c->frames[j].function_name, e->function_name);
            assert_string_equal(c->frames[j].mapping_path, e->map->path);
            assert_int_equal(c->frames[j].rel_pc, e->rel_pc);
        }
        const struct model_site *s = &m->site[proc][k];
        assert_int_equal(c->self_allocated, s->allocated);
        assert_int_equal(c->self_freed, s->freed);
        assert_int_equal(c->alloc_count, s->alloc_count);
        assert_int_equal(c->free_count, s->free_count);
    }
}

/* ---- tests ---- */

static void test_dump_roundtrip_values(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, false);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){0}, &t), 0);
    assert_true(t->has_clock_snapshot);
    assert_int_equal(t->n_processes, 2);
    assert_true(t->n_profile_packets > 4); /* the dumps were split */

    const struct rp_trace_process *a = find_proc(t, PID_A), *b = find_proc(t, PID_B);
    assert_string_equal(a->cmdline, "app --mode fast");
    assert_string_equal(b->cmdline, "daemon");
    assert_string_equal(a->heap_name, "libc.malloc");
    assert_int_equal(a->sampling_interval_bytes, 4096);
    assert_int_equal(b->sampling_interval_bytes, 512);
    assert_int_equal(a->n_dumps, 2);
    assert_int_equal(b->n_dumps, 2);
    assert_true(a->from_startup);
    assert_false(b->from_startup);
    assert_true(a->disconnected);
    assert_true(a->connection_lost);
    assert_true(a->hit_guardrail);
    assert_false(a->buffer_overran);
    assert_false(a->buffer_corrupted);
    assert_false(a->client_error);
    assert_false(b->disconnected);
    assert_false(b->connection_lost);
    assert_true(b->buffer_overran); /* records were dropped */
    assert_int_equal(a->unwinding_errors, 3);
    assert_int_equal(a->heap_samples, 1234);
    assert_int_equal(a->map_reparses, 2);
    assert_int_equal(a->total_unwinding_time_us, 777);
    assert_int_equal(a->client_spinlock_blocked_us, 5);
    assert_true(a->timestamp > 0);
    check_process(a, &w.dump2, 0);
    check_process(b, &w.dump2, 1);
    t = rp_trace_free(t);

    /* The first dump, by number. */
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){.dump_index = 1}, &t), 0);
    check_process(find_proc(t, PID_A), &w.dump1, 0);
    check_process(find_proc(t, PID_B), &w.dump1, 1);
    assert_false(find_proc(t, PID_A)->disconnected);
    t = rp_trace_free(t);

    /* A dump that does not exist: the processes are listed, without samples. */
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){.dump_index = 3}, &t), 0);
    assert_int_equal(find_proc(t, PID_A)->n_dumps, 2);
    assert_int_equal(find_proc(t, PID_A)->n_callsites, 0);
    t = rp_trace_free(t);
    close(w.fd);
}

/* Every dump carries the statistics and flags of its moment, not only a process's last
 * one: what the unwinder side counted (posted before each dump), and what the
 * bookkeeping itself could not use (frees of addresses not live, sequence gaps, records
 * refused past the cap of heaps). Each loss has its own field. */
static void test_dump_losses_in_every_dump(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd, .sequence_id = SEQ_ID}, &bk), 0);
    assert_int_equal(bk_process_start(bk, PID_A, "app", 3, true, 4096), 0);
    struct hp_frame f[4];
    size_t n = make_stack(1, f);
    uint64_t seq = 0;
    /* 70 heaps: the 6 past the cap of 64 are refused. */
    for (uint32_t h = 0; h < 70; h++)
        bk_record_alloc(bk, PID_A, h, ++seq, 0x1000 + h * 16, 16, 16, f, n);
    bk_record_free(bk, PID_A, 0, ++seq, 0xdead0); /* not live */
    seq += 5000;                                  /* a gap past the reorder window */
    bk_record_alloc(bk, PID_A, 0, ++seq, 0x9000, 16, 16, f, n);
    for (unsigned i = 0; i < 1100; i++)
        bk_record_alloc(bk, PID_A, 0, seq + 2 + i, 0x20000 + i * 16, 16, 16, f, n);
    struct bk_process_stats st = {.heap_samples = 10,
                                  .records_dropped = 21,
                                  .frees_lost = 22,
                                  .reserve_failures = 23,
                                  .freeset_full = 24,
                                  .records_unread = 25,
                                  .records_lost_service = 26,
                                  .stacks_truncated = 27,
                                  .unknown_stacks = 28,
                                  .map_reparses_deferred = 29,
                                  .unseen_call_slots = 30};
    bk_process_update(bk, PID_A, &st, BK_FLAG_BUFFER_OVERRAN);
    assert_int_equal(bk_dump_all(bk), 0);
    /* A later dump: the statistics of its own moment. */
    bk_record_free(bk, PID_A, 0, seq + 2000, 0xbeef0);
    st.heap_samples = 11;
    st.records_dropped = 31;
    bk_process_update(bk, PID_A, &st, 0);
    assert_int_equal(bk_dump_all(bk), 0);
    struct bk_counters c;
    bk_get_counters(bk, &c);
    assert_int_equal(c.dropped_records, 6);
    assert_int_equal(c.unknown_frees, 2);
    assert_true(c.seq_gaps >= 1);
    /* Records of a process it does not know are counted too. */
    bk_record_alloc(bk, 4242, 0, 1, 0x1000, 16, 16, f, n);
    bk_record_free(bk, 4242, 0, 2, 0x1000);
    bk_get_counters(bk, &c);
    assert_int_equal(c.records_no_process, 2);
    bk_free(bk);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){.dump_index = 1}, &t), 0);
    const struct rp_trace_process *p = find_proc(t, PID_A);
    assert_int_equal(p->heap_samples, 10);
    assert_true(p->buffer_overran);
    assert_int_equal(p->frees_lost, 22);
    const struct rp_trace_losses *l = &p->losses;
    assert_int_equal(l->records_dropped, 21);
    assert_int_equal(l->reserve_failures, 23);
    assert_int_equal(l->freeset_full, 24);
    assert_int_equal(l->records_unread, 25);
    assert_int_equal(l->records_lost_in_service, 26);
    assert_int_equal(l->stacks_truncated, 27);
    assert_int_equal(l->unknown_stacks, 28);
    assert_int_equal(l->map_reparses_deferred, 29);
    assert_int_equal(l->unseen_call_slots, 30);
    assert_int_equal(l->records_refused, 6);
    assert_int_equal(l->unknown_frees, 1);
    assert_true(l->seq_gaps >= 1);
    uint64_t gaps = l->seq_gaps;
    t = rp_trace_free(t);
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){.dump_index = 2}, &t), 0);
    p = find_proc(t, PID_A);
    assert_int_equal(p->heap_samples, 11);
    assert_int_equal(p->losses.records_dropped, 31);
    assert_int_equal(p->losses.unknown_frees, 2);
    assert_true(p->losses.seq_gaps >= gaps);
    assert_true(p->buffer_overran); /* flags stay set */
    t = rp_trace_free(t);
    (void)close(w.fd);
}

static void test_dump_self_max_at_peak(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, true);
    struct rp_trace *t;
    for (int dump = 1; dump <= 2; dump++) {
        const struct model *m = dump == 1 ? &w.dump1 : &w.dump2;
        assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){.dump_index = dump}, &t),
                         0);
        for (int proc = 0; proc < 2; proc++) {
            const struct rp_trace_process *p = find_proc(t, proc ? PID_B : PID_A);
            check_process(p, m, proc);
            uint64_t sum = 0;
            for (size_t i = 0; i < p->n_callsites; i++) {
                const struct rp_trace_callsite *c = &p->callsites[i];
                unsigned k;
                assert_int_equal(sscanf(c->frames[c->n_frames - 1].function_name, "leaf_%u", &k),
                                 1);
                assert_int_equal(c->self_max, m->at_peak[proc][k]);
                assert_int_equal(c->self_max_count, m->at_peak_n[proc][k]);
                sum += c->self_max;
            }
            assert_int_equal(sum, m->peak[proc]);
        }
        t = rp_trace_free(t);
    }
    close(w.fd);
}

/* Ids referenced by a packet must be defined by it or an earlier packet. */
struct defined {
    bool fn[4096], path[64], bid[64], mapping[64], frame[4096], callstack[4096];
};

static bool *def_slot(bool *table, size_t n, uint64_t iid)
{
    assert_true(iid < n);
    return &table[iid];
}

#define DEF(d, tbl, iid) def_slot((d)->tbl, HP_ARRAY_SIZE((d)->tbl), (iid))

static uint64_t field_varint(const uint8_t *p, size_t len, uint32_t num)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    uint64_t v = UINT64_MAX;
    while (hp_pb_next(&it, &f))
        if (f.num == num && f.wire_type == HP_PB_VARINT)
            v = f.varint;
    assert_false(it.error);
    return v;
}

static void define_interned(struct defined *d, const uint8_t *p, size_t len, bool first)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        assert_int_equal(f.wire_type, HP_PB_LEN);
        uint64_t iid = field_varint(f.ptr, f.len, 1);
        assert_int_not_equal(iid, UINT64_MAX);
        bool *slot = NULL;
        switch (f.num) {
        case 5:
            slot = DEF(d, fn, iid);
            break;
        case 17:
            slot = DEF(d, path, iid);
            break;
        case 16:
            slot = DEF(d, bid, iid);
            break;
        case 19:
            slot = DEF(d, mapping, iid);
            break;
        case 6:
            slot = DEF(d, frame, iid);
            break;
        case 7:
            slot = DEF(d, callstack, iid);
            break;
        default:
            fail_msg("unexpected interned field %u", f.num);
        }
        assert_false(*slot); /* each entry is written once */
        *slot = true;
        /* Only the first packet defines the empty strings, and ids 0 only there. */
        assert_true((iid == 0) == (first && (f.num == 5 || f.num == 16 || f.num == 17)));
    }
    assert_false(it.error);
}

static void check_refs(struct defined *d, const uint8_t *p, size_t len)
{
    struct hp_pb_iter it, sub;
    struct hp_pb_field f, g;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        hp_pb_iter_init(&sub, f.ptr, f.len);
        while (hp_pb_next(&sub, &g)) {
            if (f.num == 19 && g.num == 2)
                assert_true(*DEF(d, bid, g.varint));
            if (f.num == 19 && g.num == 7) {
                assert_int_equal(g.wire_type, HP_PB_VARINT); /* unpacked */
                assert_true(*DEF(d, path, g.varint));
            }
            if (f.num == 6 && g.num == 2)
                assert_true(*DEF(d, fn, g.varint));
            if (f.num == 6 && g.num == 3)
                assert_true(*DEF(d, mapping, g.varint));
            if (f.num == 7 && g.num == 2) {
                assert_int_equal(g.wire_type, HP_PB_VARINT);
                assert_true(*DEF(d, frame, g.varint));
            }
        }
        assert_false(sub.error);
    }
}

static void test_dump_packet_structure(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, false);
    size_t len;
    uint8_t *buf = read_all(w.fd, &len);
    static struct defined d;
    memset(&d, 0, sizeof(d));
    struct hp_pb_iter it;
    struct hp_pb_field pkt;
    size_t n_packets = 0, n_profile = 0, n_dumps = 0, n_clock = 0;
    uint64_t next_index = 0;
    int64_t chain_pid = -1;
    const uint8_t *prev_end = buf;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &pkt)) {
        /* Trace framing: field 1, length-delimited, and nothing else. */
        assert_int_equal(pkt.num, 1);
        assert_int_equal(pkt.wire_type, HP_PB_LEN);
        size_t framed = (size_t)(pkt.ptr + pkt.len - prev_end);
        prev_end = pkt.ptr + pkt.len;
        assert_true(framed <= MAX_PACKET);
        bool first = n_packets++ == 0;

        struct hp_pb_iter pi;
        struct hp_pb_field f;
        const uint8_t *profile = NULL, *interned = NULL;
        size_t profile_len = 0, interned_len = 0;
        uint64_t flags = 0, seq_id = 0, ts = 0;
        bool clock = false;
        hp_pb_iter_init(&pi, pkt.ptr, pkt.len);
        while (hp_pb_next(&pi, &f)) {
            if (f.num == 10)
                seq_id = f.varint;
            else if (f.num == 13)
                flags = f.varint;
            else if (f.num == 8)
                ts = f.varint;
            else if (f.num == 6)
                clock = true;
            else if (f.num == 12) {
                interned = f.ptr;
                interned_len = f.len;
            } else if (f.num == 37) {
                profile = f.ptr;
                profile_len = f.len;
            }
        }
        assert_false(pi.error);
        assert_int_equal(seq_id, SEQ_ID);
        assert_true(ts > 0);
        n_clock += clock;
        if (first) {
            assert_true(clock);
            assert_int_equal(flags, 1); /* SEQ_INCREMENTAL_STATE_CLEARED */
            assert_non_null(interned);
        }
        if (interned) {
            define_interned(&d, interned, interned_len, first);
            check_refs(&d, interned, interned_len);
        }
        if (!profile)
            continue;
        n_profile++;
        assert_int_equal(flags, 2); /* SEQ_NEEDS_INCREMENTAL_STATE */
        assert_int_equal(field_varint(profile, profile_len, 7), next_index++);
        bool continued = field_varint(profile, profile_len, 6) == 1;
        hp_pb_iter_init(&pi, profile, profile_len);
        size_t n_dumps_in_packet = 0;
        while (hp_pb_next(&pi, &f)) {
            if (f.num != 5)
                continue;
            n_dumps_in_packet++;
            int64_t pid = (int64_t)field_varint(f.ptr, f.len, 1);
            assert_true(pid == PID_A || pid == PID_B);
            if (chain_pid >= 0)
                assert_int_equal(pid, chain_pid); /* one process per dump */
            chain_pid = pid;
            /* Stats and flags only in the last packet of a dump. */
            assert_int_equal(field_varint(f.ptr, f.len, 6) != UINT64_MAX, !continued);
            struct hp_pb_iter si;
            struct hp_pb_field s;
            hp_pb_iter_init(&si, f.ptr, f.len);
            while (hp_pb_next(&si, &s))
                if (s.num == 2)
                    assert_true(*DEF(&d, callstack, field_varint(s.ptr, s.len, 1)));
            assert_false(si.error);
        }
        assert_int_equal(n_dumps_in_packet, 1);
        if (!continued) {
            n_dumps++;
            chain_pid = -1;
        }
    }
    assert_false(it.error);
    assert_int_equal(n_dumps, 4);
    assert_true(n_profile > 2 * n_dumps);
    assert_int_equal(chain_pid, -1); /* the last dump is complete */
    assert_int_equal(n_clock, 4);    /* the first packet and one per dump call */
    /* Exactly the full stacks were written, each once. */
    size_t n_cs = 0;
    for (size_t i = 0; i < HP_ARRAY_SIZE(d.callstack); i++)
        n_cs += d.callstack[i];
    assert_int_equal(n_cs, SITES);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
    assert_int_equal(t->n_packets, n_packets);
    assert_int_equal(t->n_profile_packets, n_profile);
    rp_trace_free(t);
    free(buf);
    close(w.fd);
}

static void test_dump_truncated_last_packet(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, false);
    size_t len;
    uint8_t *buf = read_all(w.fd, &len);
    /* Find where the last packet starts. */
    struct hp_pb_iter it;
    struct hp_pb_field f;
    size_t last_start = 0, start = 0;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        last_start = start;
        start = (size_t)(f.ptr + f.len - buf);
    }
    assert_int_equal(start, len);
    /* The last packet ends B's second dump: cut it in the middle, after its header
     * byte, and just before it. */
    size_t cuts[] = {last_start + (len - last_start) / 2, last_start + 1, last_start};
    for (size_t i = 0; i < HP_ARRAY_SIZE(cuts); i++) {
        assert_int_equal(ftruncate(w.fd, (off_t)cuts[i]), 0);
        struct rp_trace *t;
        assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
        const struct rp_trace_process *a = find_proc(t, PID_A), *b = find_proc(t, PID_B);
        assert_int_equal(a->n_dumps, 2);
        check_process(a, &w.dump2, 0);
        assert_int_equal(b->n_dumps, 1); /* its second dump is incomplete */
        check_process(b, &w.dump1, 1);
        rp_trace_free(t);
    }
    free(buf);
    close(w.fd);
}

/* Writes one dump of @pid with a single allocation at a stack whose leaf is @leaf. */
static void write_one(bk_t *bk, int32_t pid, const char *leaf, uint64_t size)
{
    struct hp_frame f[2] = {{&libs[0], leaf, 0x10}, {&libs[2], "main", 0x20}};
    assert_int_equal(bk_process_start(bk, pid, "p", 1, true, 4096), 0);
    bk_record_alloc(bk, pid, 0, 1, 0x1000, size, size, f, 2);
    assert_int_equal(bk_dump_process(bk, pid), 0);
}

static void check_one(const struct rp_trace *t, int32_t pid, const char *leaf, uint64_t size)
{
    const struct rp_trace_process *p = find_proc(t, pid);
    assert_int_equal(p->n_callsites, 1);
    assert_int_equal(p->callsites[0].self_allocated, size);
    assert_int_equal(p->callsites[0].n_frames, 2);
    assert_string_equal(p->callsites[0].frames[1].function_name, leaf);
    assert_string_equal(p->callsites[0].frames[0].function_name, "main");
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

struct slow_reader {
    int rfd, out_fd;
};

/* Copies the pipe to the file in small reads, pausing between them, so the writer waits
 * on a full pipe most of the time. */
static void *read_slowly(void *arg)
{
    const struct slow_reader *r = arg;
    char b[1500];
    ssize_t n;
    while ((n = read(r->rfd, b, sizeof(b))) > 0) {
        assert_int_equal(write(r->out_fd, b, (size_t)n), n);
        usleep(20);
    }
    return NULL;
}

/* Packets larger than the pipe written while a timer interrupts the writer: the writes
 * come back short or with EINTR, and every packet still arrives whole and in order. */
static void test_dump_partial_writes(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    (void)fcntl(p[1], F_SETPIPE_SZ, 4096);
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    struct slow_reader r = {.rfd = p[0], .out_fd = w.fd};
    /* The timer's signal goes to this thread only, and interrupts its writes. */
    sigset_t alrm, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &alrm, &old), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_slowly, &r), 0);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
    struct sigaction sa = {.sa_handler = on_alarm}, old_sa; /* no SA_RESTART */
    assert_int_equal(sigaction(SIGALRM, &sa, &old_sa), 0);
    struct itimerval every = {{0, 300}, {0, 300}}, off = {0};
    alarms = 0;
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);

    struct written sent;
    write_workload_to(p[1], &sent, true, 0);

    assert_int_equal(setitimer(ITIMER_REAL, &off, NULL), 0);
    assert_int_equal(sigaction(SIGALRM, &old_sa, NULL), 0);
    close(p[1]);
    assert_int_equal(pthread_join(t, NULL), 0);
    close(p[0]);
    assert_true(alarms > 0);
    struct rp_trace *tr;
    assert_int_equal(rp_trace_load(w.path, NULL, &tr), 0);
    const struct rp_trace_process *a = find_proc(tr, PID_A), *b = find_proc(tr, PID_B);
    assert_int_equal(a->n_dumps, 2);
    assert_int_equal(b->n_dumps, 2);
    check_process(a, &sent.dump2, 0);
    check_process(b, &sent.dump2, 1);
    rp_trace_free(tr);
    close(w.fd);
}

static void test_dump_sequences_kept_apart(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    /* Two writers interleaved on one file, each with its own sequence (and so its own
     * ids, which collide), then a third one reusing sequence 1 from a cleared state. */
    bk_t *a, *b, *c;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd, .sequence_id = 1}, &a), 0);
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd, .sequence_id = 2}, &b), 0);
    write_one(a, 10, "from_a", 100);
    write_one(b, 20, "from_b", 200);
    a = bk_free(a);
    b = bk_free(b);
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd, .sequence_id = 1}, &c), 0);
    write_one(c, 30, "from_c", 300);
    c = bk_free(c);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
    assert_int_equal(t->n_processes, 3);
    check_one(t, 10, "from_a", 100);
    check_one(t, 20, "from_b", 200);
    check_one(t, 30, "from_c", 300);
    rp_trace_free(t);
    close(w.fd);
}

static void test_dump_write_error_is_kept(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd}, &bk), 0);
    assert_int_equal(bk_process_start(bk, PID_A, "a", 1, true, 4096), 0);
    struct hp_frame f[4];
    size_t n = make_stack(1, f);
    bk_record_alloc(bk, PID_A, 0, 1, 0x10, 16, 16, f, n);
    /* The output fd turns read-only: writes fail with EBADF. */
    int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(ro >= 0);
    assert_true(dup2(ro, w.fd) >= 0);
    close(ro);
    struct bk_counters before, after;
    bk_get_counters(bk, &before);
    assert_int_equal(bk_dump_process(bk, PID_A), -EBADF);
    bk_get_counters(bk, &after);
    assert_int_equal(after.last_write_error, -EBADF);
    assert_int_equal(after.packets_written, before.packets_written);
    assert_int_equal(after.bytes_written, before.bytes_written);
    /* Later calls report the same error and the state stays usable. */
    bk_record_free(bk, PID_A, 0, 2, 0x10);
    assert_int_equal(bk_dump_all(bk), -EBADF);
    assert_int_equal(bk_process_end(bk, PID_A, NULL, 0), -EBADF);
    bk_get_counters(bk, &after);
    assert_int_equal(after.records_applied, 2);
    bk_free(bk);
    close(w.fd);

    /* A bad fd from the start fails bk_new. */
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = -1}, &bk), -EBADF);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_dump_hostile_input(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, true);
    size_t len;
    uint8_t *orig = read_all(w.fd, &len);
    uint8_t *buf = malloc(len + 16);
    assert_non_null(buf);
    uint64_t seed = 0x0badc0de; /* mutation seed: 300 mutants, each must load or -EBADMSG */
    int ok = 0, bad = 0;
    for (int i = 0; i < 300; i++) {
        memcpy(buf, orig, len);
        size_t n = len;
        unsigned flips = 1 + (unsigned)(rng_next(&seed) % 8);
        for (unsigned j = 0; j < flips; j++)
            buf[rng_next(&seed) % n] ^= (uint8_t)(1 + rng_next(&seed) % 255);
        if (i % 10 == 0) { /* a huge length right after a packet tag */
            size_t at = rng_next(&seed) % (n - 12);
            buf[at] = HP_PB_TRACE_PACKET_TAG;
            memset(buf + at + 1, 0xff, 9);
            buf[at + 10] = 0x01;
        }
        if (i % 7 == 0)
            n = rng_next(&seed) % n;
        assert_int_equal(ftruncate(w.fd, 0), 0);
        assert_int_equal(pwrite(w.fd, buf, n, 0), (ssize_t)n);
        struct rp_trace *t = NULL;
        int r = rp_trace_load(w.path, NULL, &t);
        assert_true(r == 0 || r == -EBADMSG);
        if (r == 0) {
            ok++;
            FILE *devnull = fopen("/dev/null", "we");
            rp_report_print(devnull, t, &(struct rp_report_options){.demangle = true});
            fclose(devnull);
            rp_trace_free(t);
        } else {
            bad++;
        }
    }
    assert_true(ok > 0 && bad > 0);
    free(buf);
    free(orig);
    close(w.fd);
}

static void test_dump_report_text(void **state)
{
    (void)state;
    struct written w;
    write_workload(&w, false);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    assert_non_null(out);
    rp_report_print(out, t, &(struct rp_report_options){.top_n = 3, .demangle = true});
    fclose(out);
    assert_non_null(strstr(text, "Process 100: app --mode fast"));
    assert_non_null(strstr(text, "Top 3 sites by unreleased bytes"));
    assert_non_null(strstr(text, "Top 3 sites by allocated bytes"));
    assert_non_null(strstr(text, "extra::step(int)"));
    assert_non_null(strstr(text, "/usr/lib/libc.so.6+0x"));
    /* Lost, for A only. */
    const char *lost = strstr(text, "DISCONNECTED");
    assert_non_null(lost);
    assert_null(strstr(lost + 1, "DISCONNECTED"));
    assert_true(lost < strstr(text, "Process 200"));
    /* The biggest site of B by allocated bytes: k = 299, 2 blocks of 300 * 16 * 2. */
    assert_non_null(strstr(text, "#1  18.8 KiB ± "));
    assert_non_null(strstr(text, " (19200 bytes) allocated in ~"));
    assert_non_null(strstr(text, " allocations (2 sampled)"));
    free(text);
    rp_trace_free(t);
    close(w.fd);

    char buf[64];
    assert_string_equal(rp_demangle("_ZN3foo3barEv", buf, sizeof(buf)), "foo::bar()");
    assert_string_equal(rp_demangle("main", buf, sizeof(buf)), "main");
    assert_string_equal(rp_demangle("_Znot a name", buf, sizeof(buf)), "_Znot a name");
    assert_string_equal(rp_demangle("_ZN3foo3barEv", buf, 5), "foo:");
    /* Rust: legacy (escapes, hash, LLVM suffix dropped) and v0. */
    assert_string_equal(
        rp_demangle("_ZN5alloc7raw_vec19RawVec$LT$T$C$A$GT$4grow17h4c4a0e3b71bf1b0aE"
                    ".llvm.1234567890",
                    buf, sizeof(buf)),
        "alloc::raw_vec::RawVec<T,A>::grow");
    assert_string_equal(rp_demangle("_RNvCs1234abcd_7mycrate4main", buf, sizeof(buf)),
                        "mycrate::main");
    assert_string_equal(rp_demangle("_Rnot a name", buf, sizeof(buf)), "_Rnot a name");
    assert_int_equal(rp_trace_load("/nonexistent/trace", NULL, &t), -ENOENT);
}

/* Source lines for every frame: "x.c", line rel_pc. */
static int every_line(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                      const struct hp_source_line **ret_lines, size_t *ret_n)
{
    (void)wait;
    static struct hp_source_line l;
    (void)ctx;
    (void)m;
    l = (struct hp_source_line){.function_name = "", .file = "x.c", .line = (uint32_t)rel_pc};
    *ret_lines = &l;
    *ret_n = 1;
    return 0;
}

/* The addresses of every ModuleSymbols packet in @buf. */
static size_t symbol_addresses(const uint8_t *buf, size_t len, uint64_t *ret, size_t max)
{
    struct hp_pb_iter t, pk, ms;
    struct hp_pb_field f, g, h;
    size_t n = 0;
    hp_pb_iter_init(&t, buf, len);
    while (hp_pb_next(&t, &f)) {
        hp_pb_iter_init(&pk, f.ptr, f.len);
        while (hp_pb_next(&pk, &g)) {
            if (g.num != 61 || g.wire_type != HP_PB_LEN) /* TracePacket.module_symbols */
                continue;
            hp_pb_iter_init(&ms, g.ptr, g.len);
            while (hp_pb_next(&ms, &h)) {
                if (h.num != 3 || h.wire_type != HP_PB_LEN) /* address_symbols */
                    continue;
                struct hp_pb_iter as;
                struct hp_pb_field a;
                hp_pb_iter_init(&as, h.ptr, h.len);
                while (hp_pb_next(&as, &a))
                    if (a.num == 1 && n < max) /* address */
                        ret[n++] = a.varint;
            }
        }
    }
    return n;
}

static bool has_address(const uint64_t *v, size_t n, uint64_t addr)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == addr)
            return true;
    return false;
}

/* Lines of every frame, but "still being read" (-EAGAIN) for the pc @ctx names while
 * the caller does not wait; counts the calls that waited. */
struct later_lines {
    uint64_t not_ready_pc;
    int waited;
};

static int later_lines(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                       const struct hp_source_line **ret_lines, size_t *ret_n)
{
    struct later_lines *c = ctx;
    if (wait)
        c->waited++;
    else if (rel_pc == c->not_ready_pc)
        return -EAGAIN;
    return every_line(NULL, m, rel_pc, wait, ret_lines, ret_n);
}

static size_t addresses_written(int fd, uint64_t *addrs, size_t max)
{
    size_t len;
    uint8_t *buf = read_all(fd, &len);
    size_t n = symbol_addresses(buf, len, addrs, max);
    free(buf);
    return n;
}

/* A dump on schedule does not wait for lines still being read (a dump waited seconds for
 * a nice-19 reader on a busy machine): the frame is offered again at the next dump, and
 * a process's final dump waits for it. */
static void test_dump_lines_not_ready_offered_again(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    struct later_lines c = {.not_ready_pc = 0x111};
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd,
                                                .sequence_id = 1,
                                                .source_lines = later_lines,
                                                .source_lines_ctx = &c},
                            &bk),
                     0);
    assert_int_equal(bk_process_start(bk, PID_A, "a", 1, true, 4096), 0);
    struct hp_frame fa[2] = {{&libs[0], "a_leaf", 0x111}, {&libs[2], "main", 0x10}};
    bk_record_alloc(bk, PID_A, 0, 1, 0x1000, 64, 64, fa, 2);
    assert_int_equal(bk_dump_process(bk, PID_A), 0);
    uint64_t addrs[16];
    size_t n = addresses_written(w.fd, addrs, 16);
    assert_true(has_address(addrs, n, 0x10));
    assert_false(has_address(addrs, n, 0x111));

    c.not_ready_pc = 0; /* read now */
    assert_int_equal(bk_dump_process(bk, PID_A), 0);
    n = addresses_written(w.fd, addrs, 16);
    assert_true(has_address(addrs, n, 0x111));
    assert_int_equal(n, 2); /* each once */
    assert_int_equal(c.waited, 0);

    /* Never ready before the process ends: its final dump waits. */
    c.not_ready_pc = 0x222;
    struct hp_frame fb[2] = {{&libs[1], "b_leaf", 0x222}, {&libs[2], "main", 0x10}};
    bk_record_alloc(bk, PID_A, 0, 2, 0x2000, 64, 64, fb, 2);
    struct bk_process_stats st = {0};
    assert_int_equal(bk_process_end(bk, PID_A, &st, 0), 0);
    n = addresses_written(w.fd, addrs, 16);
    assert_true(has_address(addrs, n, 0x222));
    assert_int_equal(n, 3);
    assert_int_equal(c.waited, 1);
    bk = bk_free(bk);
    close(w.fd);
}

/* Two processes' allocations come in interleaved and A ends first: A's dump writes the
 * interned data of both (one packet sequence), but its ModuleSymbols may name only the
 * frames A's samples use. The trace processor creates frames only when it resolves a
 * finished dump's callstacks, and counts any other address as
 * stackprofile_invalid_frame_id (seen with short-lived children of a shell). */
static void test_dump_bug_symbols_of_frames_no_dump_used(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(
        bk_new(&(struct bk_config){.out_fd = w.fd, .sequence_id = 1, .source_lines = every_line},
               &bk),
        0);
    assert_int_equal(bk_process_start(bk, PID_A, "a", 1, true, 4096), 0);
    assert_int_equal(bk_process_start(bk, PID_B, "b", 1, true, 4096), 0);
    struct hp_frame fa[2] = {{&libs[0], "a_leaf", 0x111}, {&libs[2], "main", 0x10}};
    struct hp_frame fb[2] = {{&libs[1], "b_leaf", 0x222}, {&libs[2], "main", 0x20}};
    bk_record_alloc(bk, PID_A, 0, 1, 0x1000, 64, 64, fa, 2);
    bk_record_alloc(bk, PID_B, 0, 1, 0x2000, 64, 64, fb, 2);
    struct bk_process_stats st = {0};
    assert_int_equal(bk_process_end(bk, PID_A, &st, 0), 0);

    size_t len;
    uint64_t addrs[16];
    uint8_t *buf = read_all(w.fd, &len);
    size_t n = symbol_addresses(buf, len, addrs, 16);
    free(buf);
    assert_true(has_address(addrs, n, 0x111));
    assert_true(has_address(addrs, n, 0x10));
    assert_false(has_address(addrs, n, 0x222)); /* B's: no dump used them yet */
    assert_false(has_address(addrs, n, 0x20));

    assert_int_equal(bk_process_end(bk, PID_B, &st, 0), 0);
    buf = read_all(w.fd, &len);
    n = symbol_addresses(buf, len, addrs, 16);
    free(buf);
    assert_true(has_address(addrs, n, 0x222)); /* after B's own dump */
    assert_true(has_address(addrs, n, 0x20));
    bk = bk_free(bk);
    close(w.fd);
}

/* Lines of a pc in inlined code: innermost first, as Perfetto's AddressSymbols.lines. */
static int inlined_lines(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                         const struct hp_source_line **ret_lines, size_t *ret_n)
{
    (void)wait;
    static const struct hp_source_line chain[3] = {
        {"vec_grow", "vec.h", 10}, {"vec_push", "vec.h", 20}, {"dwarf_name", "app.c", 30}};
    static const struct hp_source_line unnamed[2] = {{"inl", "u.h", 5}, {"u_outer", "u.c", 6}};
    (void)ctx;
    (void)m;
    if (rel_pc == 0x111) {
        *ret_lines = chain;
        *ret_n = 3;
    } else {
        *ret_lines = unnamed;
        *ret_n = 2;
    }
    return 0;
}

/* Each Line a callback gives goes to the frame's AddressSymbols in its order; the last
 * (the frame's own function) is named as the frame is, unless the frame has no name. */
static void test_dump_inlined_lines(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(
        bk_new(&(struct bk_config){.out_fd = w.fd, .source_lines = inlined_lines}, &bk), 0);
    assert_int_equal(bk_process_start(bk, PID_A, "a", 1, true, 4096), 0);
    struct hp_frame f[2] = {{&libs[0], "app_add", 0x111}, {&libs[2], "", 0x10}};
    bk_record_alloc(bk, PID_A, 0, 1, 0x1000, 64, 64, f, 2);
    assert_int_equal(bk_process_end(bk, PID_A, NULL, 0), 0);
    bk = bk_free(bk);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, &(struct rp_trace_options){0}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    assert_int_equal(t->processes[0].n_callsites, 1);
    const struct rp_trace_callsite *c = &t->processes[0].callsites[0];
    assert_int_equal(c->n_frames, 2);
    const struct rp_trace_frame *leaf = &c->frames[1], *root = &c->frames[0];
    assert_string_equal(leaf->function_name, "app_add");
    assert_string_equal(leaf->file, "app.c");
    assert_int_equal(leaf->line, 30);
    assert_int_equal(leaf->n_inlined, 2);
    assert_string_equal(leaf->inlined[0].function_name, "vec_grow");
    assert_int_equal(leaf->inlined[0].line, 10);
    assert_string_equal(leaf->inlined[1].function_name, "vec_push");
    assert_int_equal(leaf->inlined[1].line, 20);
    /* No ELF name: the DWARF's. */
    assert_string_equal(root->function_name, "u_outer");
    assert_int_equal(root->n_inlined, 1);
    assert_string_equal(root->inlined[0].function_name, "inl");
    rp_trace_free(t);
    close(w.fd);
}

/* User trial: "disconnected" was printed for every process that exited normally, so it
 * could not flag a lost connection. A process that exits is disconnected for Perfetto
 * (it ended before the session), and says nothing in the report; one the profiler lost
 * is marked. */
/* Frees lost: the allocations live when they were marked go to the heap of possibly
 * freed ones (counted as freed in libc.malloc), a late free or a reuse of the address
 * takes one out of it, allocations made after the mark stay unreleased, and the report
 * shows the possibly freed apart, never ranked as unreleased. */
static void test_dump_possibly_freed_apart(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd}, &bk), 0);
    struct hp_frame lost[1] = {{&libs[2], "phantom_site", 0x10}};
    struct hp_frame kept[1] = {{&libs[2], "real_leak_site", 0x20}};
    assert_int_equal(bk_process_start(bk, PID_A, "lossy", 5, true, 1), 0);
    uint64_t seq = 0;
    for (uint64_t i = 0; i < 10; i++)
        bk_record_alloc(bk, PID_A, 0, ++seq, 0x1000 + i * 0x100, 1000, 1000, lost, 1);
    bk_record_free(bk, PID_A, 0, ++seq, 0x1000); /* recorded: freed for sure */
    bk_mark_possibly_freed(bk, PID_A);
    bk_record_free(bk, PID_A, 0, ++seq, 0x1100);                       /* a free delivered late */
    bk_record_alloc(bk, PID_A, 0, ++seq, 0x1200, 1000, 1000, lost, 1); /* address reused */
    bk_record_alloc(bk, PID_A, 0, ++seq, 0x9000, 77, 77, kept, 1);
    /* Records of a client never name the heap. */
    bk_record_alloc(bk, PID_A, BK_HEAP_POSSIBLY_FREED, ++seq, 0xa000, 5, 5, kept, 1);
    assert_int_equal(bk_process_end(bk, PID_A, NULL, BK_FLAG_DISCONNECTED), 0);
    bk = bk_free(bk);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
    assert_int_equal(t->n_processes, 1); /* the heap of possibly freed is folded in */
    const struct rp_trace_process *p = find_proc(t, PID_A);
    assert_string_equal(p->heap_name, "libc.malloc");
    /* 10 allocated, 1 freed, 1 freed late, 1 replaced: 7 possibly freed. */
    assert_int_equal(p->possibly_freed_count, 7);
    assert_int_equal(p->possibly_freed_bytes, 7000);
    uint64_t live = 0;
    for (size_t i = 0; i < p->n_callsites; i++)
        live += p->callsites[i].self_allocated - p->callsites[i].self_freed;
    assert_int_equal(live, 1000 + 77); /* the reused address and the real leak */
    /* Their site, for a table apart. */
    uint64_t pf_live = 0;
    for (size_t i = 0; i < p->n_possibly_freed_sites; i++) {
        const struct rp_trace_callsite *c = &p->possibly_freed_sites[i];
        pf_live += c->self_allocated - c->self_freed;
        if (c->self_allocated > c->self_freed)
            assert_string_equal(c->frames[c->n_frames - 1].function_name, "phantom_site");
    }
    assert_int_equal(pf_live, 7000);
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    assert_non_null(out);
    rp_report_print(out, t, &(struct rp_report_options){.top_n = 5});
    fclose(out);
    assert_non_null(strstr(text, "Possibly freed: 7 sampled allocations"));
    assert_non_null(strstr(text, "unreleased 1.1 KiB (1077 bytes)"));
    const char *pf_table = strstr(text, "Top 5 sites by possibly freed bytes");
    assert_non_null(pf_table);
    assert_non_null(strstr(pf_table, "(7000 bytes) possibly freed in 7 allocations"));
    assert_non_null(strstr(pf_table, "phantom_site"));
    free(text);
    rp_trace_free(t);
    close(w.fd);
}

static void test_dump_bug_disconnected_on_normal_exit(void **state)
{
    (void)state;
    struct written w;
    assert_int_equal(memfd_path(&w), 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = w.fd}, &bk), 0);
    struct hp_frame f[1] = {{&libs[2], "main", 0x10}};
    assert_int_equal(bk_process_start(bk, PID_A, "exits", 5, true, 4096), 0);
    assert_int_equal(bk_process_start(bk, PID_B, "lost", 4, true, 4096), 0);
    bk_record_alloc(bk, PID_A, 0, 1, 0x1000, 64, 64, f, 1);
    bk_record_alloc(bk, PID_B, 0, 1, 0x1000, 64, 64, f, 1);
    assert_int_equal(bk_process_end(bk, PID_A, NULL, BK_FLAG_DISCONNECTED), 0);
    assert_int_equal(bk_process_end(bk, PID_B, NULL, BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST), 0);
    bk = bk_free(bk);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(w.path, NULL, &t), 0);
    assert_true(find_proc(t, PID_A)->disconnected);
    assert_false(find_proc(t, PID_A)->connection_lost);
    assert_true(find_proc(t, PID_B)->connection_lost);
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    assert_non_null(out);
    rp_report_print(out, t, &(struct rp_report_options){.top_n = 1});
    fclose(out);
    const char *a = strstr(text, "Process 100: exits"), *b = strstr(text, "Process 200: lost");
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a < b);
    const char *d = strstr(a, "isconnected"), *D = strstr(a, "DISCONNECTED");
    assert_true(d == NULL || d > b);
    assert_true(D != NULL && D > b);
    free(text);
    rp_trace_free(t);
    close(w.fd);
}

static void test_dump_varint_and_framing(void **state)
{
    (void)state;
    static const uint64_t values[] = {0,     1,     127,        128,        300,
                                      16383, 16384, UINT32_MAX, 1ull << 63, UINT64_MAX};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 2, 3, 5, 10, 10};
    for (size_t i = 0; i < HP_ARRAY_SIZE(values); i++) {
        uint8_t b[HP_PB_VARINT_MAX];
        size_t n = hp_pb_put_varint(b, values[i]);
        assert_int_equal(n, sizes[i]);
        assert_int_equal(hp_pb_varint_size(values[i]), n);
        const uint8_t *p = b;
        uint64_t v;
        assert_int_equal(hp_pb_get_varint(&p, b + n, &v), 0);
        assert_int_equal(v, values[i]);
        assert_ptr_equal(p, b + n);
        p = b;
        if (n > 1)
            assert_int_equal(hp_pb_get_varint(&p, b + n - 1, &v), -EAGAIN);
    }
    static const uint8_t too_long[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0x81, 0x00};
    static const uint8_t overflow[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    const uint8_t *p = too_long;
    uint64_t v;
    assert_int_equal(hp_pb_get_varint(&p, too_long + sizeof(too_long), &v), -EBADMSG);
    p = overflow;
    assert_int_equal(hp_pb_get_varint(&p, overflow + sizeof(overflow), &v), -EBADMSG);

    uint8_t hdr[1 + HP_PB_VARINT_MAX];
    assert_int_equal(hp_pb_put_packet_header(hdr, 300), 3);
    assert_memory_equal(hdr, "\x0a\xac\x02", 3);

    /* The iterator: every wire type, then malformed inputs. */
    static const uint8_t msg[] = {0x08, 0x96, 0x01,                         /* 1: varint 150 */
                                  0x12, 0x03, 'a',  'b',  'c',              /* 2: "abc" */
                                  0x1d, 0x01, 0x00, 0x00, 0x00,             /* 3: fixed32 1 */
                                  0x21, 2,    0,    0,    0,    0, 0, 0, 0, /* 4: fixed64 2 */
                                  0x2a, 0x03, 0x01, 0xac, 0x02};            /* 5: packed 1, 300 */
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, msg, sizeof(msg));
    assert_true(hp_pb_next(&it, &f));
    assert_true(f.num == 1 && f.wire_type == HP_PB_VARINT && f.varint == 150);
    assert_true(hp_pb_next(&it, &f));
    assert_true(f.num == 2 && f.len == 3 && memcmp(f.ptr, "abc", 3) == 0);
    assert_true(hp_pb_next(&it, &f));
    assert_true(f.num == 3 && f.varint == 1);
    assert_true(hp_pb_next(&it, &f));
    assert_true(f.num == 4 && f.varint == 2);
    assert_true(hp_pb_next(&it, &f));
    struct hp_pb_ints ints;
    bool err = false;
    hp_pb_ints_init(&ints, &f);
    assert_true(hp_pb_ints_next(&ints, &v, &err) && v == 1);
    assert_true(hp_pb_ints_next(&ints, &v, &err) && v == 300);
    assert_false(hp_pb_ints_next(&ints, &v, &err));
    assert_false(err);
    assert_false(hp_pb_next(&it, &f));
    assert_false(it.error);

    static const uint8_t *const bad[] = {
        (const uint8_t *)"\x12\x05"
                         "abc",          /* length past the end */
        (const uint8_t *)"\x0b\x01",     /* wire type 3 (group) */
        (const uint8_t *)"\x00\x01",     /* field 0 */
        (const uint8_t *)"\x21\x01\x02", /* truncated fixed64 */
        (const uint8_t *)"\x08\x80",     /* truncated varint */
    };
    static const size_t bad_len[] = {5, 2, 2, 3, 2};
    for (size_t i = 0; i < HP_ARRAY_SIZE(bad); i++) {
        hp_pb_iter_init(&it, bad[i], bad_len[i]);
        while (hp_pb_next(&it, &f))
            ;
        assert_true(it.error);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_roundtrip_values),
        cmocka_unit_test(test_dump_losses_in_every_dump),
        cmocka_unit_test(test_dump_self_max_at_peak),
        cmocka_unit_test(test_dump_packet_structure),
        cmocka_unit_test(test_dump_truncated_last_packet),
        cmocka_unit_test(test_dump_partial_writes),
        cmocka_unit_test(test_dump_sequences_kept_apart),
        cmocka_unit_test(test_dump_write_error_is_kept),
        cmocka_unit_test(test_dump_hostile_input),
        cmocka_unit_test(test_dump_report_text),
        cmocka_unit_test(test_dump_varint_and_framing),
        cmocka_unit_test(test_dump_bug_symbols_of_frames_no_dump_used),
        cmocka_unit_test(test_dump_lines_not_ready_offered_again),
        cmocka_unit_test(test_dump_inlined_lines),
        cmocka_unit_test(test_dump_bug_disconnected_on_normal_exit),
        cmocka_unit_test(test_dump_possibly_freed_apart),
    };
    return cmocka_run_group_tests_name("bookkeeping_dump", tests, NULL, NULL);
}
