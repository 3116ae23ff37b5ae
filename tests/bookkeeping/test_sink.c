/* tests/bookkeeping/test_sink.c: dumps written to a sink (a traced writer) instead of a
 * file: the packet format traced wants (no trusted_packet_sequence_id, no clock
 * snapshot, first_packet_on_sequence), and the restarts of the interned data after a
 * dropped packet or a ClearIncrementalState, read back with the trace reader after the
 * test's sink stamped each packet as traced would (sequence id 2). */
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

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"
#include "common/pbwire.h"
#include "report/report.h"

#define SITES 200
#define PID 42

struct test_sink {
    struct hp_pbw out; /* the Trace as traced would write it */
    unsigned packets;  /* handed to the sink, dropped or not */
    unsigned drop_at;  /* 1-based packet number to drop (0: none) */
    bool clear;        /* take_clear_request answers this once */
    unsigned seq_id_fields, clock_snapshots, first_flags;
};

static int sink_write(void *ctx, const struct iovec *iov, int n, size_t len)
{
    struct test_sink *s = ctx;
    s->packets++;
    if (s->packets == s->drop_at)
        return -ENOBUFS;
    struct hp_pbw pkt = {0};
    for (int i = 0; i < n; i++)
        hp_pbw_bytes(&pkt, iov[i].iov_base, iov[i].iov_len);
    assert_int_equal(pkt.len, len);
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, pkt.p, pkt.len);
    while (hp_pb_next(&it, &f)) {
        s->seq_id_fields += f.num == 10;
        s->clock_snapshots += f.num == 6;
        s->first_flags += f.num == 87 && f.varint == 1;
    }
    assert_false(it.error);
    hp_pbw_uint_always(&pkt, 10, 2); /* traced's stamp */
    hp_pbw_msg(&s->out, 1, &pkt);
    free(pkt.p);
    return 0;
}

static bool sink_clear(void *ctx)
{
    struct test_sink *s = ctx;
    bool c = s->clear;
    s->clear = false;
    return c;
}

static const struct hp_mapping lib = {.start = 0x400000,
                                      .end = 0x500000,
                                      .path = "/usr/bin/app",
                                      .build_id_len = 2,
                                      .build_id = {0x12, 0x34}};
static char names[SITES][16];

static void fill(bk_t *bk, unsigned round)
{
    for (unsigned k = 0; k < SITES; k++) {
        snprintf(names[k], sizeof(names[k]), "site_%u", k);
        struct hp_frame f[2] = {{&lib, names[k], 0x1000 + k}, {&lib, "main", 0x10}};
        uint64_t seq = (uint64_t)round * SITES + k + 1;
        bk_record_alloc(bk, PID, 0, seq, 0x10000000ull + seq * 64, 100 + k, 100 + k, f, 2);
    }
}

static bk_t *new_sink_bk(struct test_sink *s)
{
    bk_t *bk;
    const struct bk_sink sink = {sink_write, sink_clear, s};
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = -1, .sink = &sink}, &bk), 0);
    bk__set_max_packet_bytes(bk, 1500); /* a dump of many packets */
    assert_int_equal(bk_process_start(bk, PID, "app\0", 4, true, 1), 0);
    return bk;
}

/* Every site's allocated bytes, from the trace the sink received. */
static void check_sites(const struct test_sink *s, unsigned rounds)
{
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(s->out.p, s->out.len, &(struct rp_trace_options){0}, &t),
                     0);
    const struct rp_trace_process *p = NULL;
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].pid == PID)
            p = &t->processes[i];
    assert_non_null(p);
    assert_int_equal(p->n_callsites, SITES);
    for (size_t c = 0; c < p->n_callsites; c++) {
        const struct rp_trace_callsite *cs = &p->callsites[c];
        assert_int_equal(cs->n_frames, 2);
        unsigned k = (unsigned)atoi(cs->frames[1].function_name + 5);
        assert_string_equal(cs->frames[1].function_name, names[k]);
        assert_string_equal(cs->frames[0].function_name, "main");
        assert_int_equal(cs->self_allocated, (uint64_t)(100 + k) * rounds);
    }
    rp_trace_free(t);
}

/* The ProfilePacket.index of the first profile packet after each restart of the
 * sequence (sequence_flags 1), in order; returns how many restarts were seen. */
static size_t indices_after_restarts(const struct test_sink *s, uint64_t *ret, size_t cap)
{
    struct hp_pb_iter it, pi, pp;
    struct hp_pb_field f, pf, ppf;
    size_t n = 0;
    bool want = false;
    hp_pb_iter_init(&it, s->out.p, s->out.len);
    while (hp_pb_next(&it, &f)) {
        hp_pb_iter_init(&pi, f.ptr, f.len);
        while (hp_pb_next(&pi, &pf)) {
            if (pf.num == 13 && pf.varint == 1)
                want = true;
            if (pf.num == 37 && want && n < cap) {
                hp_pb_iter_init(&pp, pf.ptr, pf.len);
                uint64_t index = 0;
                while (hp_pb_next(&pp, &ppf))
                    if (ppf.num == 7)
                        index = ppf.varint;
                ret[n++] = index;
                want = false;
            }
        }
    }
    return n;
}

static void test_sink_packet_format(void **state)
{
    (void)state;
    struct test_sink s = {0};
    bk_t *bk = new_sink_bk(&s);
    fill(bk, 0);
    assert_int_equal(bk_dump_all(bk), 0);
    assert_int_equal(bk_process_rejected(bk, 77, 0), 0);
    assert_true(s.packets > 5);
    assert_int_equal(s.seq_id_fields, 0);
    assert_int_equal(s.clock_snapshots, 0);
    assert_int_equal(s.first_flags, 1);
    /* The first packet clears the incremental state and says it is the first. */
    struct hp_pb_iter it, pi;
    struct hp_pb_field f, pf;
    hp_pb_iter_init(&it, s.out.p, s.out.len);
    assert_true(hp_pb_next(&it, &f));
    uint64_t flags = 0, first = 0;
    hp_pb_iter_init(&pi, f.ptr, f.len);
    while (hp_pb_next(&pi, &pf)) {
        if (pf.num == 13)
            flags = pf.varint;
        if (pf.num == 87)
            first = pf.varint;
    }
    assert_int_equal(flags, 1);
    assert_int_equal(first, 1);
    check_sites(&s, 1);
    bk_free(bk);
    free(s.out.p);
}

/* A packet dropped in the middle of a dump: that dump is abandoned (a gap in the
 * ProfilePacket indices), and the next dump writes the interned data again, so every
 * site still resolves. */
static void test_sink_drop_restarts_interning(void **state)
{
    (void)state;
    struct test_sink s = {.drop_at = 4};
    bk_t *bk = new_sink_bk(&s);
    fill(bk, 0);
    assert_int_equal(bk_dump_all(bk), -ENOBUFS);
    fill(bk, 1);
    assert_int_equal(bk_dump_all(bk), 0);
    struct bk_counters c;
    bk_get_counters(bk, &c);
    assert_int_equal(c.packets_dropped, 1);
    assert_int_equal(c.sequence_resets, 1);
    assert_int_equal(s.first_flags, 1);
    /* After the loss the indices go on (with their gap): Perfetto's reader counts the
     * missing packet from the restarted sequence's first index. */
    uint64_t idx[4];
    assert_int_equal(indices_after_restarts(&s, idx, 4), 2);
    assert_int_equal(idx[0], 0);
    assert_true(idx[1] >= 2);
    check_sites(&s, 2);
    bk_free(bk);
    free(s.out.p);
}

/* traced's ClearIncrementalState: the next dump starts the interned data over. */
static void test_sink_clear_request(void **state)
{
    (void)state;
    struct test_sink s = {0};
    bk_t *bk = new_sink_bk(&s);
    fill(bk, 0);
    assert_int_equal(bk_dump_all(bk), 0);
    size_t first_dump = s.out.len;
    /* Only what the second dump writes: it must stand on its own. */
    s.clear = true;
    fill(bk, 1);
    assert_int_equal(bk_dump_all(bk), 0);
    struct bk_counters c;
    bk_get_counters(bk, &c);
    assert_int_equal(c.sequence_resets, 1);
    /* Nothing was lost: the new generation counts from 0, as Perfetto's reader expects
     * (it counted a missing packet for every cleared sequence before). */
    uint64_t idx[4];
    assert_int_equal(indices_after_restarts(&s, idx, 4), 2);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 0);
    struct test_sink second = s;
    second.out.p = s.out.p + first_dump;
    second.out.len = s.out.len - first_dump;
    check_sites(&second, 2);
    bk_free(bk);
    free(s.out.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sink_packet_format),
        cmocka_unit_test(test_sink_drop_restarts_interning),
        cmocka_unit_test(test_sink_clear_request),
    };
    return cmocka_run_group_tests_name("bookkeeping_sink", tests, NULL, NULL);
}
