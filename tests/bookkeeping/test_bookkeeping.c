/* tests/bookkeeping/test_bookkeeping.c: semantics of record application: counters,
 * unknown frees, replaced allocations, sequence reordering and gaps, peak (dump_at_max)
 * values. The state is inspected through bookkeeping/state.h. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"

#define PID 42

static const struct hp_mapping app = {.start = 0x400000, .end = 0x500000, .path = "/bin/app"};

/* Stack number @k: leaf "site<k>" called from main. */
static void make_stack(struct hp_frame f[2], unsigned k, char name[16])
{
    snprintf(name, 16, "site%u", k);
    f[0] = (struct hp_frame){.map = &app, .function_name = name, .rel_pc = 0x100 + k};
    f[1] = (struct hp_frame){.map = &app, .function_name = "main", .rel_pc = 0x10};
}

struct fixture {
    int fd;
    bk_t *bk;
};

static int setup_cfg(void **state, bool dump_at_max)
{
    struct fixture *fx = test_calloc(1, sizeof(*fx));
    fx->fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fx->fd < 0 ||
        bk_new(&(struct bk_config){.out_fd = fx->fd, .dump_at_max = dump_at_max}, &fx->bk) < 0 ||
        bk_process_start(fx->bk, PID, "app", 3, true, 4096) < 0)
        return -1;
    *state = fx;
    return 0;
}

static int setup(void **state)
{
    return setup_cfg(state, false);
}

static int setup_max(void **state)
{
    return setup_cfg(state, true);
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    fx->bk = bk_free(fx->bk);
    close(fx->fd);
    test_free(fx);
    return 0;
}

static void alloc(bk_t *bk, uint64_t seq, uint64_t addr, uint64_t size, unsigned site)
{
    struct hp_frame f[2];
    char name[16];
    make_stack(f, site, name);
    bk_record_alloc(bk, PID, 0, seq, addr, size, size, f, 2);
}

static uint32_t callstack_of(bk_t *bk, unsigned site)
{
    struct hp_frame f[2];
    char name[16];
    make_stack(f, site, name);
    uint32_t id;
    assert_int_equal(bk__intern_stack(&bk->in, f, 2, &id), 0);
    return id;
}

/* Heap @heap_id of @pid with the records in order so far applied (records wait in a
 * short queue before they are). */
static struct bk_heap *heap_now(bk_t *bk, int32_t pid, uint32_t heap_id)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    assert_non_null(p);
    bk__flush_ready(bk, p);
    struct bk_heap *h = bk__find_heap(p, heap_id);
    assert_non_null(h);
    return h;
}

/* The index of @site in heap 0 of PID, or -1 if it never allocated. */
static int64_t site_index_of(bk_t *bk, unsigned site)
{
    return bk__site_find(heap_now(bk, PID, 0), callstack_of(bk, site));
}

/* The counters of @site in PID; a zeroed site if it never allocated. */
static struct bk_site site_of(bk_t *bk, unsigned site)
{
    int64_t i = site_index_of(bk, site);
    return i >= 0 ? heap_now(bk, PID, 0)->sites[i] : (struct bk_site){0};
}

static struct bk_counters counters(bk_t *bk)
{
    struct bk_counters c;
    bk_get_counters(bk, &c);
    return c;
}

static void test_bookkeeping_alloc_free_counters(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0x1000, 100, 1);
    alloc(bk, 2, 0x2000, 200, 1);
    alloc(bk, 3, 0x3000, 4096, 2);
    bk_record_free(bk, PID, 0, 4, 0x1000);
    bk_record_free(bk, PID, 0, 5, 0x3000);
    alloc(bk, 6, 0x1000, 50, 2); /* the freed address reused */

    struct bk_site s1 = site_of(bk, 1), s2 = site_of(bk, 2);
    assert_int_equal(s1.allocated, 300);
    assert_int_equal(s1.alloc_count, 2);
    assert_int_equal(s1.freed, 100);
    assert_int_equal(s1.free_count, 1);
    assert_int_equal(bk__site_live_bytes(&s1), 200);
    assert_int_equal(s2.allocated, 4146);
    assert_int_equal(s2.alloc_count, 2);
    assert_int_equal(s2.freed, 4096);
    assert_int_equal(s2.free_count, 1);
    assert_int_equal(bk__site_live_count(&s2), 1);
    assert_int_equal(heap_now(bk, PID, 0)->live_total, 250);
    struct bk_counters c = counters(bk);
    assert_int_equal(c.records_applied, 6);
    assert_int_equal(c.unknown_frees, 0);
    assert_int_equal(c.replaced_allocs, 0);
    assert_int_equal(c.seq_gaps, 0);

    /* Records of processes never started are dropped, not applied. */
    bk_record_free(bk, PID + 1, 0, 1, 0x2000);
    assert_int_equal(counters(bk).records_applied, 6);
}

/* The weight of an allocation is 1 / P(sampled), in BK_WEIGHT_ONE units, whatever the
 * sizes that came before (the weights of recent sizes are kept, by size, in a small
 * table): 200 sizes, more than the table holds, each allocated twice at its own site,
 * in two orders. */
static void test_bookkeeping_weights_by_size(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    const double log_keep = log1p(-1.0 / 4096.0);
    uint64_t seq = 1, addr = 0x100000;
    for (int round = 0; round < 2; round++)
        for (unsigned i = 0; i < 200; i++) {
            unsigned k = round == 0 ? i : 199 - i;
            alloc(bk, seq++, addr, 8 + 8 * k, 10 + k);
            addr += 0x1000;
        }
    alloc(bk, seq++, addr, 8192, 300); /* at least the interval: weight one */
    for (unsigned k = 0; k < 200; k++) {
        double w = -1.0 / expm1((double)(8 + 8 * k) * log_keep) * BK_WEIGHT_ONE + 0.5;
        assert_int_equal(site_of(bk, 10 + k).est_allocs, 2 * (uint64_t)w);
    }
    assert_int_equal(site_of(bk, 300).est_allocs, BK_WEIGHT_ONE);
}

static void test_bookkeeping_unknown_free_ignored(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0x1000, 100, 1);
    bk_record_free(bk, PID, 0, 2, 0xdead);
    bk_record_free(bk, PID, 0, 3, 0x1000);
    bk_record_free(bk, PID, 0, 4, 0x1000); /* double free of a sampled address */
    struct bk_site s1 = site_of(bk, 1);
    assert_int_equal(s1.freed, 100);
    assert_int_equal(s1.free_count, 1);
    assert_int_equal(counters(bk).unknown_frees, 2);
    assert_int_equal(counters(bk).records_applied, 4);
}

static void test_bookkeeping_replace_at_live_address(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0x1000, 100, 1);
    alloc(bk, 2, 0x1000, 300, 2); /* the free of the first one was lost */
    struct bk_site s1 = site_of(bk, 1), s2 = site_of(bk, 2);
    assert_int_equal(counters(bk).replaced_allocs, 1);
    assert_int_equal(s1.allocated, 100);
    assert_int_equal(s1.freed, 100);
    assert_int_equal(s1.free_count, 1);
    assert_int_equal(bk__site_live_bytes(&s1), 0);
    assert_int_equal(s2.allocated, 300);
    assert_int_equal(s2.alloc_count, 1);
    assert_int_equal(bk__site_live_bytes(&s2), 300);
    assert_int_equal(heap_now(bk, PID, 0)->live_total, 300);
    bk_record_free(bk, PID, 0, 3, 0x1000);
    assert_int_equal(site_of(bk, 2).freed, 300);
    assert_int_equal(site_of(bk, 1).free_count, 1);
}

/* A deterministic workload: allocations on 8 sites over 64 addresses with frees of live
 * ones, so addresses are reused and order matters. */
struct op {
    bool is_free;
    uint64_t addr, size;
    unsigned site;
};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t make_workload(struct op *ops, size_t n, uint64_t seed)
{
    bool live[64] = {0};
    for (size_t i = 0; i < n; i++) {
        unsigned a = (unsigned)(rng_next(&seed) % 64);
        if (live[a] && rng_next(&seed) % 2) {
            ops[i] = (struct op){.is_free = true, .addr = 0x10000 + a * 16};
            live[a] = false;
        } else {
            ops[i] = (struct op){.addr = 0x10000 + a * 16,
                                 .size = 16 + rng_next(&seed) % 1000,
                                 .site = (unsigned)(rng_next(&seed) % 8)};
            live[a] = true;
        }
    }
    return n;
}

static void submit_op(bk_t *bk, const struct op *o, uint64_t seq)
{
    if (o->is_free)
        bk_record_free(bk, PID, 0, seq, o->addr);
    else
        alloc(bk, seq, o->addr, o->size, o->site);
}

static void test_bookkeeping_reorder_within_window(void **state)
{
    struct fixture *fx = *state;
    enum { N = 3000, BLOCK = 500 }; /* shuffled blocks stay below the window */
    static struct op ops[N];
    static size_t order[N];
    const uint64_t seed = 0x5eed1234; /* workload and shuffle seed */
    make_workload(ops, N, seed);

    bk_t *shuffled;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fx->fd}, &shuffled), 0);
    assert_int_equal(bk_process_start(shuffled, PID, "app", 3, true, 4096), 0);
    for (size_t i = 0; i < N; i++)
        order[i] = i;
    uint64_t s = seed;
    for (size_t b = 0; b < N; b += BLOCK) {
        for (size_t i = BLOCK - 1; i > 0; i--) {
            size_t j = (size_t)(rng_next(&s) % (i + 1));
            size_t t = order[b + i];
            order[b + i] = order[b + j];
            order[b + j] = t;
        }
    }
    for (size_t i = 0; i < N; i++) {
        submit_op(fx->bk, &ops[i], i + 1);
        submit_op(shuffled, &ops[order[i]], order[i] + 1);
    }
    /* Everything arrived: nothing waits, nothing was skipped. */
    assert_int_equal(bk__find_proc(shuffled, PID)->n_heap, 0);
    struct bk_counters a = counters(fx->bk), b;
    bk_get_counters(shuffled, &b);
    assert_int_equal(b.seq_gaps, 0);
    assert_int_equal(b.records_applied, N);
    assert_int_equal(a.unknown_frees, b.unknown_frees);
    assert_int_equal(a.replaced_allocs, b.replaced_allocs);
    for (unsigned k = 0; k < 8; k++) {
        struct bk_site x = site_of(fx->bk, k), y;
        uint32_t cs;
        struct hp_frame f[2];
        char name[16];
        make_stack(f, k, name);
        assert_int_equal(bk__intern_stack(&shuffled->in, f, 2, &cs), 0);
        struct bk_heap *h = heap_now(shuffled, PID, 0);
        int64_t idx = bk__site_find(h, cs);
        assert_true(idx >= 0);
        y = h->sites[idx];
        assert_true(x.alloc_count > 0);
        assert_int_equal(x.allocated, y.allocated);
        assert_int_equal(x.freed, y.freed);
        assert_int_equal(x.alloc_count, y.alloc_count);
        assert_int_equal(x.free_count, y.free_count);
        assert_int_equal(bk__site_live_bytes(&x), bk__site_live_bytes(&y));
    }
    bk_free(shuffled);
}

static void test_bookkeeping_gap_skipped_after_window(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0x1000, 100, 1);
    /* seq 2 is missing; 3 .. 3 + WINDOW - 1 wait for it. */
    for (uint64_t s = 3; s < 3 + BK_REORDER_WINDOW; s++)
        alloc(bk, s, 0x100000 + s * 16, 10, 2);
    assert_int_equal(counters(bk).records_applied, 1);
    assert_int_equal(bk__find_proc(bk, PID)->n_heap, BK_REORDER_WINDOW);
    /* One more overflows the window: the gap is skipped and everything applies. */
    alloc(bk, 3 + BK_REORDER_WINDOW, 0x2000, 10, 2);
    struct bk_counters c = counters(bk);
    assert_int_equal(c.seq_gaps, 1);
    assert_int_equal(c.records_applied, 2 + BK_REORDER_WINDOW);
    assert_int_equal(bk__find_proc(bk, PID)->n_heap, 0);
    assert_int_equal(site_of(bk, 2).alloc_count, BK_REORDER_WINDOW + 1);
    /* Then seq 2 arrives late: it is applied at once (the free of seq 1's block). */
    bk_record_free(bk, PID, 0, 2, 0x1000);
    assert_int_equal(site_of(bk, 1).freed, 100);
    /* The sequence continues after the highest seq seen. */
    alloc(bk, 4 + BK_REORDER_WINDOW, 0x3000, 10, 3);
    assert_int_equal(site_of(bk, 3).alloc_count, 1);
    assert_int_equal(counters(bk).seq_gaps, 1);
}

static void test_bookkeeping_dump_flushes_pending(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0x1000, 100, 1);
    alloc(bk, 5, 0x2000, 200, 2); /* waits for 2..4 */
    bk_record_free(bk, PID, 0, 3, 0x1000);
    assert_int_equal(counters(bk).records_applied, 1);
    assert_int_equal(bk_dump_process(bk, PID), 0);
    struct bk_counters c = counters(bk);
    assert_int_equal(c.records_applied, 3);
    assert_int_equal(c.seq_gaps, 2); /* before 3 and before 5 */
    assert_int_equal(c.dumps, 1);
    assert_int_equal(site_of(bk, 1).freed, 100);
    assert_int_equal(site_of(bk, 2).allocated, 200);
    assert_int_equal(bk_dump_process(bk, PID + 1), -ESRCH);
}

static void test_bookkeeping_late_records_respect_newer_state(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    /* Truth: 1 alloc X (site 1), 2 free X, 3 alloc X (site 2). Seq 1 comes last. */
    bk_record_free(bk, PID, 0, 2, 0x1000);
    alloc(bk, 3, 0x1000, 300, 2);
    assert_int_equal(bk_dump_process(bk, PID), 0); /* skips the gap at 1 */
    assert_int_equal(counters(bk).unknown_frees, 1);
    alloc(bk, 1, 0x1000, 100, 1); /* late, superseded by seq 3 */
    struct bk_site s1 = site_of(bk, 1), s2 = site_of(bk, 2);
    assert_int_equal(s1.allocated, 100);
    assert_int_equal(s1.freed, 100); /* it must have been freed before seq 3 */
    assert_int_equal(bk__site_live_bytes(&s1), 0);
    assert_int_equal(bk__site_live_bytes(&s2), 300);
    assert_int_equal(s2.freed, 0);
    /* A late free older than the allocation at the address does not free it. */
    alloc(bk, 10, 0x5000, 50, 3);
    assert_int_equal(bk_dump_process(bk, PID), 0);
    bk_record_free(bk, PID, 0, 7, 0x5000);
    struct bk_site s3 = site_of(bk, 3);
    assert_int_equal(bk__site_live_bytes(&s3), 50);
    assert_int_equal(counters(bk).unknown_frees, 2);
}

static void peak_of(bk_t *bk, unsigned site, uint64_t *bytes, uint64_t *count)
{
    int64_t i = site_index_of(bk, site);
    if (i < 0) {
        *bytes = *count = 0;
        return;
    }
    bk__site_at_peak(heap_now(bk, PID, 0), (size_t)i, bytes, count);
}

static void test_bookkeeping_peak_values(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    uint64_t b, n;
    alloc(bk, 1, 0xa, 100, 1);
    alloc(bk, 2, 0xb, 50, 2); /* total 150: a peak */
    bk_record_free(bk, PID, 0, 3, 0xa);
    alloc(bk, 4, 0xc, 60, 2); /* 110 */
    peak_of(bk, 1, &b, &n);
    assert_int_equal(b, 100);
    assert_int_equal(n, 1);
    peak_of(bk, 2, &b, &n);
    assert_int_equal(b, 50);
    assert_int_equal(n, 1);
    alloc(bk, 5, 0xd, 200, 1); /* 310: the new peak */
    bk_record_free(bk, PID, 0, 6, 0xd);
    bk_record_free(bk, PID, 0, 7, 0xb);
    alloc(bk, 8, 0xe, 10, 3); /* 70 */
    struct bk_heap *h = heap_now(bk, PID, 0);
    assert_int_equal(h->peak_total, 310);
    peak_of(bk, 1, &b, &n);
    assert_int_equal(b, 200);
    assert_int_equal(n, 1);
    peak_of(bk, 2, &b, &n);
    assert_int_equal(b, 110);
    assert_int_equal(n, 2);
    peak_of(bk, 3, &b, &n);
    assert_int_equal(b, 0);
    assert_int_equal(n, 0);
    /* A dump does not reset the peak. */
    assert_int_equal(bk_dump_process(bk, PID), 0);
    peak_of(bk, 1, &b, &n);
    assert_int_equal(b, 200);
}

/* Lazy peak bookkeeping against a model that copies every site at every new peak.
 * @first_peak_id: where the heap's peak ids start (to cross the stamps' wrap). */
static void peak_model(struct fixture *fx, uint64_t first_peak_id)
{
    enum { N = 4000, SITES = 8 };
    static struct op ops[N];
    const uint64_t seed = 0xfeedbeef; /* deterministic workload */
    make_workload(ops, N, seed);
    heap_now(fx->bk, PID, 0)->peak_id = first_peak_id;
    uint64_t live_addr_size[64] = {0};
    unsigned live_addr_site[64] = {0};
    int64_t live[SITES] = {0}, live_n[SITES] = {0};
    int64_t at_peak[SITES] = {0}, at_peak_n[SITES] = {0};
    uint64_t total = 0, peak = 0;
    for (size_t i = 0; i < N; i++) {
        const struct op *o = &ops[i];
        unsigned a = (unsigned)((o->addr - 0x10000) / 16);
        if (live_addr_size[a]) { /* a free, or a replacing allocation */
            live[live_addr_site[a]] -= (int64_t)live_addr_size[a];
            live_n[live_addr_site[a]]--;
            total -= live_addr_size[a];
            live_addr_size[a] = 0;
        }
        if (!o->is_free) {
            live[o->site] += (int64_t)o->size;
            live_n[o->site]++;
            total += o->size;
            live_addr_size[a] = o->size;
            live_addr_site[a] = o->site;
        }
        if (total > peak) {
            peak = total;
            memcpy(at_peak, live, sizeof(live));
            memcpy(at_peak_n, live_n, sizeof(live_n));
        }
        submit_op(fx->bk, o, i + 1);
    }
    assert_int_equal(heap_now(fx->bk, PID, 0)->peak_total, peak);
    for (unsigned k = 0; k < SITES; k++) {
        uint64_t b, n;
        peak_of(fx->bk, k, &b, &n);
        assert_int_equal(b, at_peak[k]);
        assert_int_equal(n, at_peak_n[k]);
    }
}

static void test_bookkeeping_peak_matches_model(void **state)
{
    peak_model(*state, 0);
}

/* Stamps keep 32 bits of the peak id: a run crossing their wrap (peak ids from just
 * below 2^32, then 2^32 + 1, ...) must still match the model, and the heap's peak id
 * never has 0 in its low bits. */
static void test_bookkeeping_bug_peak_stamp_wrap(void **state)
{
    struct fixture *fx = *state;
    peak_model(fx, UINT32_MAX - 20);
    struct bk_heap *h = heap_now(fx->bk, PID, 0);
    assert_true(h->peak_id > UINT32_MAX);
    assert_int_not_equal((uint32_t)h->peak_id, 0);
}

/* A site never stamped (its stamp is 0) when the peak id's low 32 bits come to 0 must
 * not take the zeroed peak entry for its values. */
static void test_bookkeeping_bug_peak_stamp_zero(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    alloc(bk, 1, 0xa, 100, 1); /* before any peak: site 1 is never stamped */
    struct bk_heap *h = heap_now(bk, PID, 0);
    assert_int_equal(h->sites[site_index_of(bk, 1)].max_stamp, 0);
    h->peak_id = (uint64_t)UINT32_MAX - 1;
    alloc(bk, 2, 0xb, 10, 2);
    alloc(bk, 3, 0xc, 10, 2); /* two new peaks: the low bits pass 0 */
    assert_true(heap_now(bk, PID, 0)->peak_id > UINT32_MAX);
    uint64_t b, n;
    peak_of(bk, 1, &b, &n);
    assert_int_equal(b, 100);
    assert_int_equal(n, 1);
    peak_of(bk, 2, &b, &n);
    assert_int_equal(b, 20);
    assert_int_equal(n, 2);
}

static void test_bookkeeping_process_lifecycle(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    assert_int_equal(bk_process_start(bk, PID, "x", 1, false, 1), -EEXIST);
    assert_int_equal(bk_process_start(bk, PID + 1, "b", 1, false, 512), 0);
    assert_int_equal(bk_process_start(bk, PID + 2, "c", 1, false, 512), 0);
    alloc(bk, 1, 0x10, 10, 1);
    struct bk_process_stats st = {.heap_samples = 3, .records_dropped = 1};
    bk_process_update(bk, PID, &st, BK_FLAG_HIT_GUARDRAIL);
    struct bk_proc *p = bk__find_proc(bk, PID);
    assert_int_equal(p->stats.heap_samples, 3);
    assert_int_equal(p->flags, BK_FLAG_HIT_GUARDRAIL);
    assert_int_equal(bk_process_end(bk, PID, NULL, BK_FLAG_DISCONNECTED), 0);
    assert_null(bk__find_proc(bk, PID));
    /* The others are still found after the process table was compacted. */
    assert_int_equal(bk__find_proc(bk, PID + 1)->pid, PID + 1);
    assert_int_equal(bk__find_proc(bk, PID + 2)->pid, PID + 2);
    assert_int_equal(bk_process_end(bk, PID, NULL, 0), -ESRCH);
    assert_int_equal(bk_dump_all(bk), 0);
    assert_int_equal(counters(bk).dumps, 3);
    /* The pid may come back as a new process. */
    assert_int_equal(bk_process_start(bk, PID, "app", 3, true, 4096), 0);
    assert_int_equal(site_of(bk, 1).alloc_count, 0);
}

/* The same address in two heaps is two allocations; a free only ends the one of its
 * heap; sizes of 4 GiB and more survive the compact live table. */
static void test_bookkeeping_heaps_are_separate(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    struct hp_frame f[2];
    char name[16];
    make_stack(f, 1, name);
    const uint64_t big = 5ull << 30;
    bk_record_alloc(bk, PID, 0, 1, 0x1000, 100, 100, f, 2);
    bk_record_alloc(bk, PID, 7, 2, 0x1000, big, big, f, 2);
    assert_int_equal(heap_now(bk, PID, 0)->live_total, 100);
    assert_int_equal(heap_now(bk, PID, 7)->live_total, big);
    assert_int_equal(counters(bk).replaced_allocs, 0);
    bk_record_free(bk, PID, 7, 3, 0x1000);
    assert_int_equal(heap_now(bk, PID, 7)->live_total, 0);
    assert_int_equal(heap_now(bk, PID, 7)->sites[0].freed, big);
    assert_int_equal(heap_now(bk, PID, 0)->live_total, 100);
    bk_record_free(bk, PID, 7, 4, 0x1000);
    assert_int_equal(counters(bk).unknown_frees, 1);
    bk_record_free(bk, PID, 0, 5, 0x1000);
    assert_int_equal(heap_now(bk, PID, 0)->live_total, 0);
    char buf[64];
    struct bk_proc *p = bk__find_proc(bk, PID);
    bk__heap_name(p, 0, buf, sizeof(buf));
    assert_string_equal(buf, "libc.malloc");
    bk__heap_name(p, 7, buf, sizeof(buf));
    assert_string_equal(buf, "heap_7");
    /* Named by the process: cut, and cleaned of what is not printable. */
    assert_int_equal(bk_heap_name(bk, PID, 7, "arena small\x01"), 0);
    bk__heap_name(p, 7, buf, sizeof(buf));
    assert_string_equal(buf, "arena_small_");
    assert_int_equal(bk_heap_name(bk, PID, 7, "arena.big"), 0);
    bk__heap_name(p, 7, buf, sizeof(buf));
    assert_string_equal(buf, "arena.big");
    char longname[100];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(bk_heap_name(bk, PID, 8, longname), 0);
    bk__heap_name(p, 8, buf, sizeof(buf));
    assert_int_equal(strlen(buf), 63);
    assert_int_equal(bk_heap_name(bk, PID, 0, "x"), -EINVAL);
    assert_int_equal(bk_heap_name(bk, PID + 1000, 7, "x"), -ESRCH);
}

/* bk_grow_ahead(): nothing while no entry comes; more with more entries; and a record
 * is of one process, so idle processes add their next doubling each, not the growth of
 * every entry to come (counted for each of them, 40 idle processes weighed 40 times what
 * the records could cost, and fired the service's guardrail by themselves). */
static void test_bookkeeping_bug_grow_ahead_counts_records_once(void **state)
{
    struct fixture *fx = *state;
    bk_t *bk = fx->bk;
    for (unsigned i = 1; i <= 100; i++)
        alloc(bk, i, 0x1000 + 16 * i, 16, i);
    const size_t more = 65536;
    size_t one = bk_grow_ahead(bk, more);
    assert_int_equal(bk_grow_ahead(bk, 0), 0);
    assert_true(bk_grow_ahead(bk, 1) <= bk_grow_ahead(bk, more / 2));
    assert_true(bk_grow_ahead(bk, more / 2) <= one);
    /* At least the live table of the busy process growing to hold them all. */
    assert_true(one >= more * 16);
    struct hp_frame f[2];
    char name[16];
    make_stack(f, 1, name);
    for (int32_t pid = PID + 1; pid <= PID + 40; pid++) {
        assert_int_equal(bk_process_start(bk, pid, "idle", 4, true, 4096), 0);
        bk_record_alloc(bk, pid, 0, 1, 0x1000, 16, 16, f, 2);
    }
    size_t forty = bk_grow_ahead(bk, more);
    print_message("  %zu entries ahead: %zu KiB with one process, %zu KiB with 40 idle ones "
                  "beside it\n",
                  more, one >> 10, forty >> 10);
    assert_true(forty >= one);
    /* A next doubling of an almost empty process is a few KiB. */
    assert_true(forty - one <= 40 * (64u << 10));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bookkeeping_weights_by_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_alloc_free_counters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_unknown_free_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_replace_at_live_address, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_reorder_within_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_gap_skipped_after_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_dump_flushes_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_late_records_respect_newer_state, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_peak_values, setup_max, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_peak_matches_model, setup_max, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_bug_peak_stamp_wrap, setup_max, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_bug_peak_stamp_zero, setup_max, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_process_lifecycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_heaps_are_separate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bookkeeping_bug_grow_ahead_counts_records_once, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("bookkeeping", tests, NULL, NULL);
}
