/* tests/bench/bench_bookkeeping.c: bookkeeping throughput, dump cost and memory.
 *
 *   bk_apply_records_per_s   records applied per second (best of 3 runs): 26-frame
 *                            stacks drawn from 4096 callsites sharing 64 prefixes of 20
 *                            frames, 1/3 frees, most of recent allocations (see
 *                            run_apply); and the same with uniformly random frees
 *                            (bk_apply_records_per_s_uniform_frees)
 *   bk_bytes_per_live_alloc  service memory per live sampled allocation, after the
 *                            apply run (~1.4M live)
 *   bk_bytes_per_callsite    interning + per-site memory per callsite (1M callsites)
 *   dump_1m_callsites_s      one dump of 1M callsites of which 500k hold live memory
 *                            (best of 3)
 *   dump_1m_callsites_bytes  its size
 *   dump_encode_vs_sol       its time over a speed-of-light copy of the same bytes in
 *                            the same packet-sized buffer and writes (see sol_copy)
 *   samples_simd_vs_scalar   encoding the samples of those 1M callsites: the AVX2
 *                            encoder's time over the scalar one's (best of 5 each,
 *                            interleaved; not printed without AVX2)
 *
 * Seeded (xorshift, seed 42) so every run does the same work; times are the thread's
 * CPU time. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/samples.h"
#include "bookkeeping/state.h"
#include "common/clock.h"
#include "tests/bench/dump_state.h"

#define N_MAPS 8
#define N_PREFIXES 64
#define PREFIX_DEPTH 20
#define N_CALLSITES 4096
#define STACK_DEPTH 26
#define N_RECORDS (4u << 20)
#define APPLY_RUNS 3

static uint64_t rng = 42;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static struct hp_mapping maps[N_MAPS];
static char names[N_CALLSITES * STACK_DEPTH][24];

/* CPU time of this thread: the machines are shared, and time spent descheduled is not
 * bookkeeping's. */
static double now_s(void)
{
    return (double)hp_clock_ns(CLOCK_THREAD_CPUTIME_ID) / 1e9;
}

static bk_t *new_bk(int fd)
{
    bk_t *bk;
    if (bk_new(&(struct bk_config){.out_fd = fd, .dump_at_max = true}, &bk) < 0 ||
        bk_process_start(bk, 1, "bench", 5, true, 4096) < 0) {
        fprintf(stderr, "bk_new failed\n");
        exit(1);
    }
    return bk;
}

/* Memory of the live tables of every heap, and of interning plus sites. */
static void memory_of(bk_t *bk, size_t *ret_live, size_t *ret_sites)
{
    size_t live = 0, sites = 0;
    const struct bk_intern *in = &bk->in;
    sites += in->cap_nodes * sizeof(*in->nodes) + in->cs_index.cap * sizeof(*in->cs_index.slots) +
             in->emit.cap + in->emit.cap_marks * sizeof(*in->emit.marks) +
             in->cap_frames * sizeof(*in->frames) +
             in->frame_index.cap * sizeof(*in->frame_index.slots) + in->arena.bytes;
    for (size_t i = 0; i < bk->n_procs; i++) {
        const struct bk_proc *p = bk->procs[i];
        for (size_t j = 0; j < p->n_heaps; j++) {
            const struct bk_heap *h = p->heaps[j];
            live += h->live.cap * h->live.stride + h->big_sizes.cap * h->big_sizes.stride;
            sites += h->cap_sites * sizeof(*h->sites) + h->n_site_pages * sizeof(*h->site_pages);
            for (size_t k = 0; k < h->n_site_pages; k++)
                sites += h->site_pages[k] ? BK_SITE_PAGE * sizeof(**h->site_pages) : 0;
        }
    }
    *ret_live = live;
    *ret_sites = sites;
}

struct op {
    uint64_t addr;
    uint32_t site; /* UINT32_MAX: a free */
};

/* Applies N_RECORDS records: 2/3 allocations at one of N_CALLSITES stacks, 1/3 frees.
 * @recent: frees mostly hit recent allocations and freed addresses come back, as heap
 * lifetimes do (most objects die young; malloc reuses chunks); else frees pick any live
 * allocation uniformly and addresses are never reused (the worst case for the caches). */
static void run_apply(struct hp_frame (*stacks)[STACK_DEPTH], bool recent)
{
    struct op *ops = malloc(N_RECORDS * sizeof(*ops));
    uint64_t *live = malloc(N_RECORDS * sizeof(*live));
    uint64_t *freed = malloc(N_RECORDS * sizeof(*freed));
    size_t n_live = 0, n_freed = 0;
    uint64_t next_addr = 0x10000000;
    for (size_t i = 0; i < N_RECORDS; i++) {
        if (n_live && next_rand() % 3 == 0) {
            size_t k = next_rand() % n_live;
            if (recent && next_rand() % 4 != 0 && n_live > 256)
                k = n_live - 1 - next_rand() % 256;
            ops[i] = (struct op){.addr = live[k], .site = UINT32_MAX};
            freed[n_freed++] = live[k];
            live[k] = live[--n_live];
        } else {
            uint64_t addr;
            if (recent && n_freed && next_rand() % 2 == 0) {
                addr = freed[--n_freed];
            } else {
                addr = next_addr;
                next_addr += 16 * (1 + next_rand() % 64);
            }
            ops[i] = (struct op){.addr = addr, .site = (uint32_t)(next_rand() % N_CALLSITES)};
            live[n_live++] = addr;
        }
    }
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    bk_t *bk = NULL;
    /* Best of APPLY_RUNS, each on a new bookkeeping state: the CPU time of a run only
     * grows with what else the machine does. */
    double best = 1e9;
    for (int run = 0; run < APPLY_RUNS; run++) {
        bk = bk_free(bk);
        bk = new_bk(fd);
        double t0 = now_s();
        for (size_t i = 0; i < N_RECORDS; i++) {
            if (ops[i].site == UINT32_MAX)
                bk_record_free(bk, 1, 0, i + 1, ops[i].addr);
            else
                bk_record_alloc(bk, 1, 0, i + 1, ops[i].addr, 64, 4096, stacks[ops[i].site],
                                STACK_DEPTH);
        }
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    printf("bench: bk_apply_records_per_s%s %.0f records/s\n", recent ? "" : "_uniform_frees",
           N_RECORDS / best);
    if (recent) {
        size_t live_mem, site_mem;
        memory_of(bk, &live_mem, &site_mem);
        printf("bench: bk_bytes_per_live_alloc %.1f bytes\n",
               (double)live_mem / (double)bk->procs[0]->heaps[0]->live.count);
    }
    bk = bk_free(bk);
    close(fd);
    free(ops);
    free(live);
    free(freed);
}

static void bench_apply(void)
{
    static struct hp_frame stacks[N_CALLSITES][STACK_DEPTH]; /* leaf first */
    static struct hp_frame prefixes[N_PREFIXES][PREFIX_DEPTH];
    for (int i = 0; i < N_MAPS; i++)
        maps[i] = (struct hp_mapping){.start = 0x400000 + (uint64_t)i * 0x100000,
                                      .end = 0x4f0000 + (uint64_t)i * 0x100000,
                                      .path = "/usr/lib/libbench.so",
                                      .build_id_len = 20,
                                      .build_id = {(uint8_t)i}};
    size_t nn = 0;
    for (int p = 0; p < N_PREFIXES; p++)
        for (int d = 0; d < PREFIX_DEPTH; d++) {
            /* Prefixes share their outermost frames too: a tree, not 64 separate chains. */
            int shared = d < 4 ? 0 : d < 10 ? p / 16 : p;
            /* Names are interned by the unwinder: one pointer per distinct name. */
            const char *name = NULL;
            snprintf(names[nn], sizeof(names[nn]), "fn_%d_%d", shared, d);
            for (size_t k = 0; k < nn && !name; k++)
                if (!strcmp(names[k], names[nn]))
                    name = names[k];
            if (!name)
                name = names[nn++];
            prefixes[p][d] =
                (struct hp_frame){.map = &maps[(shared + d) % N_MAPS],
                                  .function_name = name,
                                  .rel_pc = 0x1000u + (uint64_t)shared * 64 + (uint64_t)d};
        }
    for (int c = 0; c < N_CALLSITES; c++) {
        int p = (int)(next_rand() % N_PREFIXES);
        for (int d = 0; d < STACK_DEPTH - PREFIX_DEPTH; d++) {
            snprintf(names[nn], sizeof(names[nn]), "leaf_%d_%d", c, d);
            stacks[c][d] = (struct hp_frame){.map = &maps[c % N_MAPS],
                                             .function_name = names[nn++],
                                             .rel_pc = 0x90000u + (uint64_t)c * 16 + (uint64_t)d};
        }
        /* root first in prefixes[], leaf first in stacks[] */
        for (int d = 0; d < PREFIX_DEPTH; d++)
            stacks[c][STACK_DEPTH - 1 - d] = prefixes[p][d];
    }
    run_apply(stacks, true);
    run_apply(stacks, false);
}

/* The state of tests/bench/dump_state.h. */
#define DUMP_RUNS 3

static bk_t *new_dump_state(int fd)
{
    return bench_dump_state(&(struct bk_config){.out_fd = fd, .dump_at_max = true}, maps);
}

/* Speed of light: produce @bytes the way the dump does, minus the encoding: copy them
 * packet by packet (BK_MAX_PACKET_BYTES) from @src, where they are ready, into one
 * packet-sized buffer @dst and write each packet to @fd, as the dump encodes into its
 * reused packet buffer and writes it. The dump runs with its inputs (sites, callstack
 * nodes: more bytes than the output) out of the caches, so the copy starts with its
 * source out of the caches too: @scratch, twice the last-level cache, is written over
 * first. Returns the CPU time. */
static double sol_copy(int fd, const char *src, char *dst, size_t bytes, char *scratch,
                       size_t scratch_len)
{
    memset(scratch, (int)bytes, scratch_len);
    __asm__ volatile("" : : "r"(scratch) : "memory");
    double s0 = now_s();
    for (size_t off = 0; off < bytes; off += BK_MAX_PACKET_BYTES) {
        size_t n = bytes - off < BK_MAX_PACKET_BYTES ? bytes - off : BK_MAX_PACKET_BYTES;
        memcpy(dst, src + off, n);
        __asm__ volatile("" : : "r"(dst) : "memory");
        if (write(fd, dst, n) != (ssize_t)n)
            exit(1);
    }
    return now_s() - s0;
}

/* Encodes all samples of @h packet by packet into @buf, as the dump does; returns the
 * CPU time. */
static double encode_all(const struct bk_heap *h, uint8_t *buf, bool simd)
{
    const struct bk_samples in = bk__heap_samples(h, true); /* the dump state's mode */
    const size_t per_packet = BK_MAX_PACKET_BYTES / BK_SAMPLE_MAX_BYTES;
    double t0 = now_s();
    for (size_t k = 0; k < h->n_sites; k += per_packet) {
        size_t end = HP_MIN(k + per_packet, h->n_sites);
        uint8_t *q = simd ? bk__encode_samples_simd(buf, &in, k, end)
                          : bk__encode_samples_scalar(buf, &in, k, end);
        __asm__ volatile("" : : "r"(q) : "memory");
    }
    return now_s() - t0;
}

static void bench_samples(const bk_t *bk)
{
    if (!bk__encode_samples_simd_ok())
        return;
    const struct bk_heap *h = bk->procs[0]->heaps[0];
    uint8_t *buf = malloc(BK_MAX_PACKET_BYTES + BK_SAMPLE_SLACK);
    double best_scalar = 1e9, best_simd = 1e9;
    for (int r = 0; r < 5; r++) {
        best_scalar = HP_MIN(best_scalar, encode_all(h, buf, false));
        best_simd = HP_MIN(best_simd, encode_all(h, buf, true));
    }
    printf("bench: samples_simd_vs_scalar %.2f ratio\n", best_simd / best_scalar);
    free(buf);
}

/* DUMP_RUNS dumps, each of its own state built beforehand, between speed-of-light
 * copies of the same bytes, so both see the same machine; the ratio is of the best of
 * each. */
static void bench_dump(void)
{
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    bk_t *bks[DUMP_RUNS];
    for (int k = 0; k < DUMP_RUNS; k++)
        bks[k] = new_dump_state(fd);
    size_t live_mem, site_mem;
    memory_of(bks[0], &live_mem, &site_mem);
    printf("bench: bk_bytes_per_callsite %.1f bytes\n", (double)site_mem / DUMP_SITES);
    bench_samples(bks[0]);

    size_t scratch_len = 64u << 20, bytes = 0;
    char *scratch = malloc(scratch_len), *src = NULL, *dst = malloc(BK_MAX_PACKET_BYTES);
    double best = 1e9, best_sol = 1e9;
    for (int k = 0; k < DUMP_RUNS; k++) {
        struct bk_counters c0, c1;
        bk_get_counters(bks[k], &c0);
        memset(scratch, k, scratch_len);
        __asm__ volatile("" : : "r"(scratch) : "memory");
        double t0 = now_s();
        if (bk_dump_all(bks[k]) < 0) {
            fprintf(stderr, "dump failed\n");
            exit(1);
        }
        double t = now_s() - t0;
        best = t < best ? t : best;
        bk_get_counters(bks[k], &c1);
        bks[k] = bk_free(bks[k]);
        if (!src) {
            bytes = c1.bytes_written - c0.bytes_written;
            src = malloc(bytes);
            memset(src, 1, bytes);
            (void)sol_copy(fd, src, dst, bytes, scratch, scratch_len); /* touches pages */
        }
        for (int r = 0; r < 2; r++) {
            double d = sol_copy(fd, src, dst, bytes, scratch, scratch_len);
            best_sol = d < best_sol ? d : best_sol;
        }
    }
    printf("bench: dump_1m_callsites_s %.4f s\n", best);
    printf("bench: dump_1m_callsites_bytes %zu bytes\n", bytes);
    printf("bench: dump_encode_vs_sol %.2f ratio\n", best / best_sol);
    free(scratch);
    free(src);
    free(dst);
    close(fd);
}

/* Arguments "apply" or "dump" run one part only (for profiling); none runs both. */
int main(int argc, char **argv)
{
    bool all = argc < 2;
    if (all || !strcmp(argv[1], "apply"))
        bench_apply();
    if (all || !strcmp(argv[1], "dump"))
        bench_dump();
    return 0;
}
