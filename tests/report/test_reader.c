/* tests/report/test_reader.c: semantics against a model under random operations,
 * trace-processor import rules across dumps, report diffs, pprof and reader selection. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <malloc.h>
#include <sys/stat.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"
#include "common/pbwire.h"
#include "protos/fields.h"
#include "report/report.h"

#define PID 4242
#define N_SITES 16
#define N_ADDRS 64
#define N_HEAPS 2

static const struct hp_mapping lib = {.start = 0x7f0000000000,
                                      .end = 0x7f0000100000,
                                      .path = "/lib/libx.so",
                                      .build_id_len = 2,
                                      .build_id = {0xab, 0xcd}};
static const char *const site_names[N_SITES] = {"s0",  "s1",  "s2",  "s3", "s4",  "s5",
                                                "s6",  "s7",  "s8",  "s9", "s10", "s11",
                                                "s12", "s13", "s14", "s15"};

/* Site k: main > mid(k % 4) > s<k>, leaf first. */
static void site_stack(unsigned k, struct hp_frame f[3])
{
    static const char *const mids[4] = {"m0", "m1", "m2", "m3"};
    f[0] = (struct hp_frame){&lib, site_names[k], 0x1000 + k};
    f[1] = (struct hp_frame){&lib, mids[k % 4], 0x200 + k % 4};
    f[2] = (struct hp_frame){&lib, "main", 0x10};
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct op {
    uint64_t seq, addr, size;
    uint32_t heap;
    int site; /* -1: free */
};

struct model_site {
    uint64_t allocated, freed, alloc_count, free_count;
};

struct model {
    struct model_site site[N_HEAPS][N_SITES];
    struct {
        bool live;
        int site;
        uint64_t size;
    } addr[N_HEAPS][N_ADDRS];
    uint64_t unknown_frees, replaced;
};

/* The specification: records in seq order; a free of an unknown address is ignored, an
 * allocation at a live address first frees the old one. */
static void model_apply(struct model *m, const struct op *o)
{
    __typeof__(m->addr[0][0]) *a = &m->addr[o->heap][o->addr / 16];
    if (o->site < 0) {
        if (!a->live) {
            m->unknown_frees++;
            return;
        }
        m->site[o->heap][a->site].freed += a->size;
        m->site[o->heap][a->site].free_count++;
        a->live = false;
        return;
    }
    if (a->live) {
        m->replaced++;
        m->site[o->heap][a->site].freed += a->size;
        m->site[o->heap][a->site].free_count++;
    }
    m->site[o->heap][o->site].allocated += o->size;
    m->site[o->heap][o->site].alloc_count++;
    a->live = true;
    a->site = o->site;
    a->size = o->size;
}

static void submit(bk_t *bk, const struct op *o)
{
    if (o->site < 0) {
        bk_record_free(bk, PID, o->heap, o->seq, o->addr);
    } else {
        struct hp_frame f[3];
        site_stack((unsigned)o->site, f);
        bk_record_alloc(bk, PID, o->heap, o->seq, o->addr, o->size, o->size, f, 3);
    }
}

static void check_against_model(bk_t *bk, const struct model *m)
{
    struct bk_proc *p = bk__find_proc(bk, PID);
    assert_non_null(p);
    bk__flush_pending(bk, p);
    for (uint32_t h = 0; h < N_HEAPS; h++) {
        struct bk_heap *heap = bk__find_heap(p, h);
        for (unsigned k = 0; k < N_SITES; k++) {
            struct hp_frame f[3];
            site_stack(k, f);
            uint32_t cs;
            assert_int_equal(bk__intern_stack(&bk->in, f, 3, &cs), 0);
            /* Heaps beside malloc's: under a leaf frame that names the heap. */
            char name[BK_HEAP_NAME_MAX];
            bk__heap_name(p, h, name, sizeof(name));
            if (h != 0)
                assert_int_equal(
                    bk__intern_leaf(&bk->in, cs, &(struct hp_frame){.function_name = name}, &cs),
                    0);
            int64_t idx = heap ? bk__site_find(heap, cs) : -1;
            struct bk_site s = idx >= 0 ? heap->sites[idx] : (struct bk_site){0};
            const struct model_site *ms = &m->site[h][k];
            assert_int_equal(s.allocated, ms->allocated);
            assert_int_equal(s.freed, ms->freed);
            assert_int_equal(s.alloc_count, ms->alloc_count);
            assert_int_equal(s.free_count, ms->free_count);
        }
    }
}

/* Seeded random sequences (seeds 1..40, 3000 records each) with address reuse, records
 * shuffled within blocks smaller than the reorder window, and dropped records (gaps):
 * the counters must equal the model's, which applies the surviving records in order. */
static void test_reader_property_random_ops(void **state)
{
    (void)state;
    enum { N_OPS = 3000, BLOCK = 48 };
    static struct op ops[N_OPS];
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t s = seed * 0x9e3779b97f4a7c15ull;
        int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        bk_t *bk;
        assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
        assert_int_equal(bk_process_start(bk, PID, "p", 1, true, 4096), 0);
        static struct model m;
        memset(&m, 0, sizeof(m));
        size_t n = 0;
        for (uint64_t seq = 1; seq <= N_OPS; seq++) {
            struct op o = {.seq = seq,
                           .addr = (rng_next(&s) % N_ADDRS) * 16,
                           .heap = (uint32_t)(rng_next(&s) % N_HEAPS),
                           .size = 16 + rng_next(&s) % 5000,
                           .site = rng_next(&s) % 3 == 0 ? -1 : (int)(rng_next(&s) % N_SITES)};
            if (rng_next(&s) % 50 == 0)
                continue; /* lost in the ring: a gap */
            model_apply(&m, &o);
            ops[n++] = o;
        }
        /* Shuffle within blocks. */
        for (size_t b = 0; b < n; b += BLOCK) {
            size_t len = n - b < BLOCK ? n - b : BLOCK;
            for (size_t i = len; i > 1; i--) {
                size_t j = rng_next(&s) % i;
                struct op t = ops[b + i - 1];
                ops[b + i - 1] = ops[b + j];
                ops[b + j] = t;
            }
        }
        for (size_t i = 0; i < n; i++)
            submit(bk, &ops[i]);
        check_against_model(bk, &m);
        struct bk_counters c;
        bk_get_counters(bk, &c);
        assert_int_equal(c.unknown_frees, m.unknown_frees);
        assert_int_equal(c.replaced_allocs, m.replaced);
        assert_true(c.seq_gaps > 0);
        bk = bk_free(bk);
        close(fd);
    }
}

static int memfd(void)
{
    int fd = memfd_create("trace", MFD_CLOEXEC);
    assert_true(fd >= 0);
    return fd;
}

static void fd_path(int fd, char *buf, size_t len)
{
    snprintf(buf, len, "/proc/self/fd/%d", fd);
}

/* Cumulative values never decrease from one dump to the next (trace processor derives
 * per-dump deltas from them), for every callsite of every heap. */
static void test_reader_cumulative_values_never_decrease(void **state)
{
    (void)state;
    int fd = memfd();
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd, .dump_at_max = true}, &bk), 0);
    bk__set_max_packet_bytes(bk, 600);
    assert_int_equal(bk_process_start(bk, PID, "p", 1, true, 4096), 0);
    uint64_t s = 7, seq = 0;
    enum { DUMPS = 6 };
    for (int d = 0; d < DUMPS; d++) {
        for (int i = 0; i < 400; i++) {
            struct op o = {.seq = ++seq,
                           .addr = (rng_next(&s) % N_ADDRS) * 16,
                           .heap = (uint32_t)(rng_next(&s) % N_HEAPS),
                           .size = 100,
                           .site = rng_next(&s) % 2 ? -1 : (int)(rng_next(&s) % N_SITES)};
            submit(bk, &o);
        }
        assert_int_equal(bk_dump_all(bk), 0);
    }
    bk = bk_free(bk);
    char path[64];
    fd_path(fd, path, sizeof(path));
    uint64_t prev[N_HEAPS][N_SITES][4];
    memset(prev, 0, sizeof(prev));
    for (int d = 1; d <= DUMPS; d++) {
        struct rp_trace *t;
        assert_int_equal(rp_trace_load(path, &(struct rp_trace_options){.dump_index = d}, &t), 0);
        assert_true(t->has_clock_snapshot);
        assert_int_equal(t->n_processes, N_HEAPS);
        for (size_t i = 0; i < t->n_processes; i++) {
            const struct rp_trace_process *p = &t->processes[i];
            int h = strcmp(p->heap_name, "libc.malloc") ? 1 : 0;
            assert_int_equal(p->n_dumps, DUMPS);
            for (size_t j = 0; j < p->n_callsites; j++) {
                const struct rp_trace_callsite *c = &p->callsites[j];
                int k = atoi(c->frames[c->n_frames - 1].function_name + 1);
                uint64_t v[4] = {c->self_allocated, c->self_freed, c->alloc_count, c->free_count};
                for (int x = 0; x < 4; x++) {
                    assert_true(v[x] >= prev[h][k][x]);
                    prev[h][k][x] = v[x];
                }
                assert_true(c->self_freed <= c->self_allocated);
            }
        }
        rp_trace_free(t);
    }
    close(fd);
}

/* Writes a trace where sites @sites[i] allocate @sizes[i] bytes, interning the sites in
 * the given order so that ids differ between traces. */
static void write_trace(int fd, int32_t pid, const unsigned *sites, const uint64_t *sizes, size_t n)
{
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
    assert_int_equal(bk_process_start(bk, pid, "app", 3, true, 4096), 0);
    for (size_t i = 0; i < n; i++) {
        struct hp_frame f[3];
        site_stack(sites[i], f);
        bk_record_alloc(bk, pid, 0, i + 1, 0x1000 + i * 16, sizes[i], sizes[i], f, 3);
    }
    assert_int_equal(bk_dump_all(bk), 0);
    bk_free(bk);
}

static void test_reader_diff_matches_sites_by_frames(void **state)
{
    (void)state;
    int a = memfd(), b = memfd();
    write_trace(a, 10, (unsigned[]){1, 2, 3}, (uint64_t[]){100, 200, 300}, 3);
    /* Another run: other pid, other interning order, site 2 grew, site 5 is new,
     * site 3 is gone. */
    write_trace(b, 20, (unsigned[]){5, 2, 1}, (uint64_t[]){50, 1200, 100}, 3);
    char pa[64], pb[64];
    fd_path(a, pa, sizeof(pa));
    fd_path(b, pb, sizeof(pb));
    struct rp_trace *ta, *tb;
    assert_int_equal(rp_trace_load(pa, NULL, &ta), 0);
    assert_int_equal(rp_trace_load(pb, NULL, &tb), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    rp_report_print_diff(out, ta, tb, &(struct rp_report_options){.top_n = 10, .no_stacks = true});
    fclose(out);
    assert_non_null(strstr(text, "unreleased +750 B (+750 bytes), allocated +750 B (+750 bytes)"));
    const char *first = strstr(text, "#1  unreleased +1000 B (+1000 bytes)");
    assert_non_null(first);
    assert_non_null(strstr(first, "s2"));
    const char *second = strstr(text, "#2  unreleased +50 B (+50 bytes)");
    assert_non_null(second);
    assert_non_null(strstr(second, "s5"));
    assert_null(strstr(text, "#3")); /* site 1 did not grow, site 3 shrank */
    free(text);
    rp_trace_free(ta);
    rp_trace_free(tb);
    close(a);
    close(b);
}

static uint8_t *read_fd(int fd, size_t *ret_len)
{
    off_t n = lseek(fd, 0, SEEK_END);
    assert_true(n > 0);
    uint8_t *buf = malloc((size_t)n);
    assert_int_equal(pread(fd, buf, (size_t)n, 0), n);
    *ret_len = (size_t)n;
    return buf;
}

static void test_reader_buffer_and_selection(void **state)
{
    (void)state;
    int fd = memfd();
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
    assert_int_equal(bk_process_start(bk, 1, "a", 1, true, 4096), 0);
    assert_int_equal(bk_process_start(bk, 2, "b", 1, true, 4096), 0);
    struct hp_frame f[3];
    site_stack(0, f);
    bk_record_alloc(bk, 1, 0, 1, 0x10, 10, 10, f, 3);
    bk_record_alloc(bk, 2, 0, 1, 0x10, 20, 20, f, 3);
    assert_int_equal(bk_dump_all(bk), 0);
    bk_free(bk);
    size_t len;
    uint8_t *buf = read_fd(fd, &len);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(buf, len, &(struct rp_trace_options){.pid = 2}, &t), 0);
    assert_int_equal(t->n_processes, 1);
    assert_int_equal(t->processes[0].pid, 2);
    assert_int_equal(t->processes[0].callsites[0].self_allocated, 20);
    const struct rp_trace_frame *leaf = &t->processes[0].callsites[0].frames[2];
    assert_string_equal(leaf->build_id, "abcd");
    assert_string_equal(leaf->mapping_path, "/lib/libx.so");
    assert_int_equal(leaf->map_start, lib.start);
    rp_trace_free(t);
    /* Every prefix of a valid trace loads (a truncated last packet is dropped). */
    for (size_t n = 0; n < len; n += 7) {
        assert_int_equal(rp_trace_load_buffer(buf, n, NULL, &t), 0);
        rp_trace_free(t);
    }
    free(buf);
    close(fd);
}

struct calls {
    unsigned n;
    uint64_t pcs[64];
};

static int count_source_line(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                             const struct hp_source_line **ret_lines, size_t *ret_n)
{
    (void)wait;
    static struct hp_source_line l;
    struct calls *c = ctx;
    assert_ptr_equal(m, &lib);
    for (unsigned i = 0; i < c->n; i++)
        assert_true(c->pcs[i] != rel_pc); /* once per unique frame */
    c->pcs[c->n++] = rel_pc;
    if (rel_pc == 0x10)
        return -ENOENT; /* main: no debug info */
    l = (struct hp_source_line){.function_name = "", .file = "src/x.c", .line = (uint32_t)rel_pc};
    *ret_lines = &l;
    *ret_n = 1;
    return 0;
}

/* The callback runs lazily: once per new frame at the dump that writes it. */
static void test_reader_source_lines_once_per_frame(void **state)
{
    (void)state;
    int fd = memfd();
    struct calls calls = {0};
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd,
                                                .source_lines = count_source_line,
                                                .source_lines_ctx = &calls},
                            &bk),
                     0);
    assert_int_equal(bk_process_start(bk, PID, "p", 1, true, 4096), 0);
    struct hp_frame f[3];
    site_stack(0, f);
    bk_record_alloc(bk, PID, 0, 1, 0x10, 10, 10, f, 3);
    assert_int_equal(calls.n, 0); /* nothing before a dump */
    assert_int_equal(bk_dump_all(bk), 0);
    assert_int_equal(calls.n, 3);
    assert_int_equal(bk_dump_all(bk), 0);
    assert_int_equal(calls.n, 3);
    site_stack(5, f); /* new leaf and mid frames, same main */
    bk_record_alloc(bk, PID, 0, 2, 0x20, 10, 10, f, 3);
    assert_int_equal(bk_dump_all(bk), 0);
    assert_int_equal(calls.n, 5);
    struct bk_counters c;
    bk_get_counters(bk, &c);
    assert_int_equal(c.source_lines, 4);
    bk_free(bk);
    close(fd);
}

/* Items of 128 bytes and more take the widened-length path of the encoder: a 1500-frame
 * stack (kept to BK_MAX_FRAMES), a 3000-byte name, a long path, under a packet bound
 * smaller than some of the items. */
static void test_reader_big_items_roundtrip(void **state)
{
    (void)state;
    static char long_name[3001], long_path[1001];
    memset(long_name, 'n', 3000);
    memset(long_path, 'p', 1000);
    long_path[0] = '/';
    const struct hp_mapping m = {.start = 0x1000, .end = 0x2000, .path = long_path};
    static struct hp_frame deep[1500];
    for (size_t i = 0; i < HP_ARRAY_SIZE(deep); i++)
        deep[i] = (struct hp_frame){&m, i == 0 ? long_name : "f", 0x10 + i};
    int fd = memfd();
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
    bk__set_max_packet_bytes(bk, 2000);
    assert_int_equal(bk_process_start(bk, 1, "a", 1, true, 4096), 0);
    bk_record_alloc(bk, 1, 0, 1, 0x10, 10, 777, deep, HP_ARRAY_SIZE(deep));
    assert_int_equal(bk_dump_all(bk), 0);
    bk_free(bk);
    size_t len;
    uint8_t *buf = read_fd(fd, &len);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(buf, len, NULL, &t), 0);
    assert_int_equal(t->n_processes, 1);
    const struct rp_trace_callsite *c = &t->processes[0].callsites[0];
    assert_int_equal(c->self_allocated, 777);
    assert_int_equal(c->n_frames, BK_MAX_FRAMES);
    assert_string_equal(c->frames[c->n_frames - 1].function_name, long_name);
    assert_int_equal(c->frames[c->n_frames - 1].rel_pc, 0x10);
    assert_int_equal(c->frames[0].rel_pc, 0x10 + BK_MAX_FRAMES - 1);
    assert_string_equal(c->frames[0].mapping_path, long_path);
    rp_trace_free(t);
    free(buf);
    close(fd);
}

/* ---- crafted traces ---- */

/* Appends @pkt (a TracePacket, reset) to @trace as a Trace.packet. */
static void put_packet(struct hp_pbw *trace, struct hp_pbw *pkt)
{
    hp_pbw_msg(trace, PF_TRACE(packet), pkt);
}

/* TracePacket fields every packet of sequence 1 carries. */
static void packet_head(struct hp_pbw *pkt, bool clear)
{
    hp_pbw_uint_always(pkt, PF_PACKET(timestamp), 1);
    hp_pbw_uint(pkt, PF_PACKET(trusted_packet_sequence_id), 1);
    hp_pbw_uint(pkt, PF_PACKET(sequence_flags),
                (clear ? PF_SEQ_INCREMENTAL_STATE_CLEARED : 0) | PF_SEQ_NEEDS_INCREMENTAL_STATE);
}

/* One complete dump (index @index) of one sample of callstack @cs for @pid. */
static void put_dump_as(struct hp_pbw *trace, uint64_t index, uint64_t pid, uint64_t cs,
                        uint64_t bytes, bool disconnected)
{
    struct hp_pbw pkt = {0}, prof = {0}, dump = {0}, sample = {0};
    packet_head(&pkt, false);
    hp_pbw_uint(&sample, PF_SAMPLE(callstack_id), cs);
    hp_pbw_uint(&sample, PF_SAMPLE(self_allocated), bytes);
    hp_pbw_uint(&sample, PF_SAMPLE(alloc_count), 1);
    hp_pbw_uint(&dump, PF_DUMP(pid), pid);
    hp_pbw_msg(&dump, PF_DUMP(samples), &sample);
    hp_pbw_uint(&dump, PF_DUMP(sampling_interval_bytes), 4096);
    hp_pbw_uint(&dump, PF_DUMP(disconnected), disconnected);
    hp_pbw_msg(&prof, PF_PROFILE(process_dumps), &dump);
    hp_pbw_uint_always(&prof, PF_PROFILE(index), index);
    hp_pbw_msg(&pkt, PF_PACKET(profile_packet), &prof);
    put_packet(trace, &pkt);
    free(pkt.p);
    free(prof.p);
    free(dump.p);
    free(sample.p);
}

static void put_dump(struct hp_pbw *trace, uint64_t index, uint64_t pid, uint64_t cs,
                     uint64_t bytes)
{
    put_dump_as(trace, index, pid, cs, bytes, false);
}

/* Interned frame 1 ("leaf" in /bin/app at rel_pc 0x40) and callstack 1 of @n_frames
 * copies of it. */
static void put_interned(struct hp_pbw *trace, size_t n_frames)
{
    struct hp_pbw pkt = {0}, in = {0}, e = {0}, ids = {0};
    packet_head(&pkt, true);
    hp_pbw_uint_always(&e, PF_STRING(iid), 1);
    hp_pbw_len(&e, PF_STRING(str), "leaf", 4);
    hp_pbw_msg(&in, PF_INTERNED(function_names), &e);
    hp_pbw_uint_always(&e, PF_STRING(iid), 1);
    hp_pbw_len(&e, PF_STRING(str), "/bin/app", 8);
    hp_pbw_msg(&in, PF_INTERNED(mapping_paths), &e);
    hp_pbw_uint(&e, PF_MAPPING(iid), 1);
    hp_pbw_uint(&e, PF_MAPPING(path_string_ids), 1);
    hp_pbw_msg(&in, PF_INTERNED(mappings), &e);
    hp_pbw_uint(&e, PF_FRAME(iid), 1);
    hp_pbw_uint(&e, PF_FRAME(function_name_id), 1);
    hp_pbw_uint(&e, PF_FRAME(mapping_id), 1);
    hp_pbw_uint(&e, PF_FRAME(rel_pc), 0x40);
    hp_pbw_msg(&in, PF_INTERNED(frames), &e);
    for (size_t i = 0; i < n_frames; i++)
        hp_pbw_varint(&ids, 1);
    hp_pbw_uint(&e, PF_CALLSTACK(iid), 1);
    hp_pbw_len(&e, PF_CALLSTACK(frame_ids), ids.p, ids.len);
    hp_pbw_msg(&in, PF_INTERNED(callstacks), &e);
    hp_pbw_msg(&pkt, PF_PACKET(interned_data), &in);
    put_packet(trace, &pkt);
    free(pkt.p);
    free(in.p);
    free(e.p);
    free(ids.p);
}

static void put_process_tree(struct hp_pbw *trace, uint64_t pid, const char *arg0, const char *arg1)
{
    struct hp_pbw pkt = {0}, tree = {0}, proc = {0};
    packet_head(&pkt, false);
    hp_pbw_uint(&proc, PF_PROCESS(pid), pid);
    hp_pbw_len(&proc, PF_PROCESS(cmdline), arg0, strlen(arg0));
    if (arg1)
        hp_pbw_len(&proc, PF_PROCESS(cmdline), arg1, strlen(arg1));
    hp_pbw_msg(&tree, PF_TREE(processes), &proc);
    hp_pbw_msg(&pkt, PF_PACKET(process_tree), &tree);
    put_packet(trace, &pkt);
    free(pkt.p);
    free(tree.p);
    free(proc.p);
}

/* Safety review item 16, reproducer A11: one interned 4096-frame callstack and 2000
 * process dumps of one sample each (a 28 KB trace) made the reader copy the frames per
 * sample: 525 MB. They are shared now, and what is kept stays proportional to the
 * input. */
static void test_reader_bug_shared_callstack_memory(void **state)
{
    (void)state;
    struct hp_pbw trace = {0};
    put_interned(&trace, 4096);
    for (uint64_t pid = 1; pid <= 2000; pid++)
        put_dump(&trace, pid - 1, pid, 1, 4096);
    assert_false(trace.oom);
    assert_true(trace.len < 100000);
    struct rp_trace *t;
    size_t before = mallinfo2().uordblks;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    size_t kept = mallinfo2().uordblks - before;
    assert_int_equal(t->n_processes, 2000);
    for (size_t i = 0; i < t->n_processes; i++) {
        assert_int_equal(t->processes[i].n_callsites, 1);
        assert_int_equal(t->processes[i].callsites[0].n_frames, 4096);
        /* One copy of the frames for every sample. */
        assert_ptr_equal(t->processes[i].callsites[0].frames, t->processes[0].callsites[0].frames);
    }
    /* Under ASan mallinfo2() counts nothing; elsewhere what the trace keeps is within
     * the reader's budget per input byte (525 MB before, ~19 000 bytes per byte). */
    assert_true(kept < 128 * trace.len + (1u << 20));
    rp_trace_free(t);
    free(trace.p);
}

/* A process that retitles itself while it runs (a forked child naming its role, as
 * postgres and nginx do) is one process, named by its latest title: a new process tree
 * between two of its dumps that are not its last is a rename, not an exec. */
static void test_reader_retitle_is_one_process(void **state)
{
    (void)state;
    struct hp_pbw trace = {0};
    put_interned(&trace, 3);
    put_process_tree(&trace, 77, "postgres", "-D /data");
    put_dump(&trace, 0, 77, 1, 100);
    put_process_tree(&trace, 77, "postgres: checkpointer", NULL);
    put_dump(&trace, 1, 77, 1, 300);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    assert_int_equal(t->n_processes, 1);
    assert_string_equal(t->processes[0].cmdline, "postgres: checkpointer");
    assert_int_equal(t->processes[0].n_dumps, 2);
    assert_int_equal(t->processes[0].callsites[0].self_allocated, 300);
    rp_trace_free(t);
    free(trace.p);
}

/* A command line with newlines (`python3 -c` with a script) is printed on one line, in
 * the process's header and in the table (it broke the table into pieces). */
static void test_reader_bug_cmdline_newlines_one_line(void **state)
{
    (void)state;
    struct hp_pbw trace = {0};
    put_interned(&trace, 3);
    put_process_tree(&trace, 77, "python3", "import x\nx.run()");
    put_dump(&trace, 0, 77, 1, 100);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    rp_report_print(f, t, &(struct rp_report_options){.top_n = 3});
    rp_report_print_summary(f, t, &(struct rp_report_options){.top_n = 3}, 1);
    fclose(f);
    assert_non_null(strstr(text, "Process 77: python3 import x x.run()\n"));
    assert_non_null(strstr(text, "  python3 import x x.run()\n"));
    assert_null(strstr(text, "x\nx"));
    free(text);
    rp_trace_free(t);
    free(trace.p);
}

/* A shell shim that execs python is two programs in one pid: each is a process of its
 * own, named by its own command line, with its own samples (they were merged under the
 * last command line). */
static void test_reader_bug_exec_in_one_pid(void **state)
{
    (void)state;
    struct hp_pbw trace = {0};
    put_interned(&trace, 3);
    put_process_tree(&trace, 77, "/bin/sh", "shim");
    put_dump_as(&trace, 0, 77, 1, 100, true); /* its last: the session ended at the exec */
    put_process_tree(&trace, 77, "python3", "x.py");
    put_dump(&trace, 1, 77, 1, 5000);
    put_dump(&trace, 2, 77, 1, 6000);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    assert_int_equal(t->n_processes, 2);
    assert_string_equal(t->processes[0].cmdline, "/bin/sh shim");
    assert_int_equal(t->processes[0].exec_index, 0);
    assert_int_equal(t->processes[0].n_dumps, 1);
    assert_int_equal(t->processes[0].callsites[0].self_allocated, 100);
    assert_string_equal(t->processes[1].cmdline, "python3 x.py");
    assert_int_equal(t->processes[1].exec_index, 1);
    assert_int_equal(t->processes[1].n_dumps, 2);
    assert_int_equal(t->processes[1].callsites[0].self_allocated, 6000);
    t = rp_trace_free(t);
    /* --dump 2 exists for the second program only. */
    assert_int_equal(
        rp_trace_load_buffer(trace.p, trace.len, &(struct rp_trace_options){.dump_index = 2}, &t),
        0);
    assert_false(t->processes[0].selected);
    assert_true(t->processes[1].selected);
    assert_int_equal(t->processes[1].callsites[0].self_allocated, 6000);
    rp_trace_free(t);
    free(trace.p);
}

/* A trace cut inside a packet, or inside a dump, was read as if complete. */
static void test_reader_bug_truncation_flagged(void **state)
{
    (void)state;
    struct hp_pbw trace = {0};
    put_interned(&trace, 3);
    put_dump(&trace, 0, 5, 1, 100);
    size_t whole = trace.len;
    put_dump(&trace, 1, 5, 1, 200);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    assert_false(t->truncated);
    t = rp_trace_free(t);
    assert_int_equal(rp_trace_load_buffer(trace.p, whole + 5, NULL, &t), 0);
    assert_true(t->truncated);
    assert_int_equal(t->truncated_at, whole);
    assert_int_equal(t->file_bytes, whole + 5);
    assert_int_equal(t->processes[0].n_dumps, 1);
    assert_int_equal(t->processes[0].callsites[0].self_allocated, 100);
    t = rp_trace_free(t);

    /* A dump whose last packet (continued = false) is missing. */
    struct hp_pbw pkt = {0}, prof = {0};
    packet_head(&pkt, false);
    hp_pbw_uint_always(&prof, PF_PROFILE(index), 2);
    hp_pbw_uint(&prof, PF_PROFILE(continued), 1);
    hp_pbw_msg(&pkt, PF_PACKET(profile_packet), &prof);
    put_packet(&trace, &pkt);
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    assert_true(t->truncated);
    assert_int_equal(t->incomplete_dumps, 1);
    assert_int_equal(t->processes[0].n_dumps, 2);
    rp_trace_free(t);
    free(pkt.p);
    free(prof.p);
    free(trace.p);
}

/* A directory was read as an I/O error ("Input/output error"). */
static void test_reader_bug_directory(void **state)
{
    (void)state;
    struct rp_trace *t;
    assert_int_equal(rp_trace_load("/", NULL, &t), -EISDIR);
}

/* ModuleSymbols with three lines for an address: two inlined functions (innermost
 * first) and the frame's own function; the report prints them leaf first, with
 * file:line. */
static void test_reader_module_symbols_inlined(void **state)
{
    (void)state;
    struct hp_pbw trace = {0}, pkt = {0}, mod = {0}, addr = {0}, line = {0};
    put_interned(&trace, 2);
    put_dump(&trace, 0, 9, 1, 4096);
    packet_head(&pkt, false);
    hp_pbw_len(&mod, PF_MODULE(path), "/bin/app", 8);
    hp_pbw_uint_always(&addr, PF_ADDRESS(address), 0x40);
    static const char *const fns[] = {"inner", "middle", "leaf"};
    static const char *const files[] = {"vec.h", "util.h", "app.c"};
    for (int i = 0; i < 3; i++) {
        hp_pbw_len(&line, PF_LINE(function_name), fns[i], strlen(fns[i]));
        hp_pbw_len(&line, PF_LINE(source_file_name), files[i], strlen(files[i]));
        hp_pbw_uint(&line, PF_LINE(line_number), 10 + (uint64_t)i);
        hp_pbw_msg(&addr, PF_ADDRESS(lines), &line);
    }
    hp_pbw_msg(&mod, PF_MODULE(address_symbols), &addr);
    hp_pbw_msg(&pkt, PF_PACKET(module_symbols), &mod);
    put_packet(&trace, &pkt);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load_buffer(trace.p, trace.len, NULL, &t), 0);
    assert_int_equal(t->n_source_lines, 1);
    const struct rp_trace_frame *f = &t->processes[0].callsites[0].frames[1];
    assert_string_equal(f->function_name, "leaf");
    assert_string_equal(f->file, "app.c");
    assert_int_equal(f->line, 12);
    assert_int_equal(f->n_inlined, 2);
    assert_string_equal(f->inlined[0].function_name, "inner");
    assert_string_equal(f->inlined[0].file, "vec.h");
    assert_int_equal(f->inlined[0].line, 10);
    assert_string_equal(f->inlined[1].function_name, "middle");
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    rp_report_print(out, t, &(struct rp_report_options){.top_n = 1});
    fclose(out);
    const char *a = strstr(text, "inner  vec.h:10  (inlined)");
    const char *b = strstr(text, "middle  util.h:11  (inlined)");
    const char *c = strstr(text, "leaf  app.c:12");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(a < b && b < c);
    free(text);
    rp_trace_free(t);
    free(trace.p);
    free(pkt.p);
    free(mod.p);
    free(addr.p);
    free(line.p);
}

/* The heap name comes from the trace: "../x/y" must not leave the output directory. */
static void test_reader_bug_pprof_heap_name_path(void **state)
{
    (void)state;
    char dir[] = "/tmp/hp_pprof_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct hp_pbw trace = {0}, pkt = {0}, prof = {0}, dump = {0}, sample = {0};
    put_interned(&trace, 1);
    packet_head(&pkt, false);
    hp_pbw_uint(&sample, PF_SAMPLE(callstack_id), 1);
    hp_pbw_uint(&sample, PF_SAMPLE(self_allocated), 10);
    hp_pbw_uint(&dump, PF_DUMP(pid), 3);
    hp_pbw_len(&dump, PF_DUMP(heap_name), "../x/y", 6);
    hp_pbw_msg(&dump, PF_DUMP(samples), &sample);
    hp_pbw_msg(&prof, PF_PROFILE(process_dumps), &dump);
    hp_pbw_uint_always(&prof, PF_PROFILE(index), 0);
    hp_pbw_msg(&pkt, PF_PACKET(profile_packet), &prof);
    put_packet(&trace, &pkt);
    char path[256], out[256], want[300];
    snprintf(path, sizeof(path), "%s/t.pftrace", dir);
    snprintf(out, sizeof(out), "%s/p", dir);
    FILE *fp = fopen(path, "we");
    assert_non_null(fp);
    assert_int_equal(fwrite(trace.p, 1, trace.len, fp), trace.len);
    fclose(fp);
    assert_int_equal(rp_pprof_export(path, out, 0, 0, NULL, NULL), 0);
    snprintf(want, sizeof(want), "%s/p.pid3..._x_y.dump1.pb.gz", dir);
    struct stat st;
    assert_int_equal(stat(want, &st), 0);
    assert_int_equal(unlink(want), 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0); /* nothing else was written in it */
    free(trace.p);
    free(pkt.p);
    free(prof.p);
    free(dump.p);
    free(sample.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_property_random_ops),
        cmocka_unit_test(test_reader_cumulative_values_never_decrease),
        cmocka_unit_test(test_reader_diff_matches_sites_by_frames),
        cmocka_unit_test(test_reader_buffer_and_selection),
        cmocka_unit_test(test_reader_source_lines_once_per_frame),
        cmocka_unit_test(test_reader_big_items_roundtrip),
        cmocka_unit_test(test_reader_bug_shared_callstack_memory),
        cmocka_unit_test(test_reader_bug_exec_in_one_pid),
        cmocka_unit_test(test_reader_retitle_is_one_process),
        cmocka_unit_test(test_reader_bug_cmdline_newlines_one_line),
        cmocka_unit_test(test_reader_bug_truncation_flagged),
        cmocka_unit_test(test_reader_bug_directory),
        cmocka_unit_test(test_reader_module_symbols_inlined),
        cmocka_unit_test(test_reader_bug_pprof_heap_name_path),
    };
    return cmocka_run_group_tests_name("reader", tests, NULL, NULL);
}
