/* tests/bench/bench_unwind.c: unwinder benchmarks (scripts/bench.sh unwind).
 *
 *   unwind_warm_d26_median_us  median of single warm unwinds of a 26-frame stack of this
 *                              process (captured and copied once, as a client would);
 *                              with the baseline: the same unwind with libunwind's
 *                              signal-mask syscalls left in place
 *   unwinder_samples_per_s     records one thread turns into unwound frames: wire_alloc
 *                              records with real stack copies written into a ring made by
 *                              ring_create(), then read, validated, unwound and posted on
 *                              one thread (only the reading side is timed)
 *   unwinder_first_sample_us   unwinder_process_new() plus the first unwind of a new
 *                              process: with cold global caches (ELF files parsed, symbol
 *                              indexes built) and with warm ones (another process already
 *                              met the same files)
 *
 *     build-release/tests/bench/bench_unwind [iterations [warm]]
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/wire.h"
#include "tests/support/regs.h"
#include "unwinder/sigmask.h"
#include "unwinder/unwinder.h"

#define STACK_CAP (64 * 1024)
/* main, __libc_start_call_main, __libc_start_main and _start make 4 more frames. */
#define DEPTH 21
#define WANT_FRAMES 26

static uint64_t g_regs[HP_NREGS];
static uint64_t g_sp;
static size_t g_len;
static uint8_t g_stack[STACK_CAP];
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];
static uint64_t g_unwind_us_total; /* keeps the per-record timing of samples_per_s() */

static uint64_t stack_end(uint64_t sp)
{
    FILE *f = fopen("/proc/self/maps", "re");
    unsigned long long lo, hi, end = 0;
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%llx-%llx", &lo, &hi) == 2 && sp >= lo && sp < hi)
            end = hi;
    }
    if (f)
        fclose(f);
    return end;
}

void bench_recurse(int depth);

__attribute__((noinline)) void bench_recurse(int depth)
{
    if (depth == 0) {
        hp_capture_regs(g_regs);
        g_sp = g_regs[HP_REG_RSP];
        uint64_t end = stack_end(g_sp);
        g_len = end > g_sp ? (size_t)HP_MIN(end - g_sp, (uint64_t)STACK_CAP) : 0;
        memcpy(g_stack, (const void *)(uintptr_t)g_sp, g_len);
    } else {
        bench_recurse(depth - 1);
    }
    __asm__ volatile("" ::: "memory");
}

static unwinder_process_t *self_process(void)
{
    unwinder_process_t *p;
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (unwinder_process_new(getpid(), maps_fd, mem_fd, &p) < 0) {
        fprintf(stderr, "bench_unwind: unwinder_process_new failed\n");
        exit(1);
    }
    return p;
}

static bool unwind_once(unwinder_process_t *p)
{
    size_t n = 0;
    struct unwinder_result res;
    if (unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, g_frames, UNWINDER_MAX_FRAMES, &n, &res) <
        0)
        return false;
    return n == WANT_FRAMES && !res.error;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median_us(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    return (double)v[n / 2] / 1000.0;
}

/* Median over @iters single unwinds, each timed on its own. */
static double warm_median_us(unwinder_process_t *p, long iters)
{
    uint64_t *t = calloc((size_t)iters, sizeof(*t));
    if (!t)
        exit(1);
    for (long i = 0; i < iters; i++) {
        uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
        (void)unwind_once(p);
        t[i] = hp_clock_ns(CLOCK_MONOTONIC) - t0;
    }
    double m = median_us(t, (size_t)iters);
    free(t);
    return m;
}

/* Samples per second through the ring, as the service's unwinder thread takes them: a
 * ring made by ring_create() is filled with wire_alloc records carrying the real stack
 * copy (untimed, writer side mapped in this process), then drained on this thread (timed):
 * read the record, copy its header out of shared memory and validate it, unwind the stack
 * in place, time the unwind as the service does, and copy the frames into a posted
 * message. Repeated until @iters records went through. */
static double samples_per_s(unwinder_process_t *p, long iters)
{
    int fd = -1;
    ring_t *rr = NULL, *rw = NULL;
    if (ring_create(RING_DEFAULT_SIZE, &fd) < 0 || ring_map(fd, RING_ROLE_READER, &rr) < 0 ||
        ring_map(fd, RING_ROLE_WRITER, &rw) < 0) {
        fprintf(stderr, "bench_unwind: cannot make a ring\n");
        exit(1);
    }
    (void)close(fd);
    const uint64_t max_stack = HP_ALIGN_UP((uint64_t)STACK_CAP, 8);
    static struct hp_frame post[UNWINDER_MAX_FRAMES + 8];
    size_t frames_total = 0, posted = 0;
    uint64_t seq = 0, dt = 0, bad = 0, unwind_us = 0;
    while ((long)posted < iters) {
        /* Fill. */
        for (;;) {
            struct ring_wspan w;
            if (ring_try_begin_write(rw, WIRE_ALLOC, sizeof(struct wire_alloc) + g_len, &w) < 0)
                break;
            struct wire_alloc a = {.addr = 0x1000 + seq * 64, .size = 64, .sample_size = 4096};
            seq++;
            a.stack_ptr = g_sp;
            a.stack_len = (uint32_t)g_len;
            memcpy(a.regs, g_regs, sizeof(a.regs));
            memcpy(w.data, &a, sizeof(a));
            memcpy((uint8_t *)w.data + sizeof(a), g_stack, g_len);
            (void)ring_end_write(rw, &w);
        }
        /* Drain. */
        uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
        struct ring_rspan rd;
        while (ring_begin_read(rr, &rd) == 0) {
            struct wire_alloc a;
            if (rd.type != WIRE_ALLOC || rd.len < sizeof(a)) {
                bad++;
                ring_end_read(rr, &rd);
                continue;
            }
            memcpy(&a, rd.data, sizeof(a));
            uint64_t stack_len = a.stack_len;
            if (stack_len > rd.len - sizeof(a) || stack_len > max_stack) {
                bad++;
                ring_end_read(rr, &rd);
                continue;
            }
            size_t n = 0;
            struct unwinder_result res;
            uint64_t u0 = hp_clock_ns(CLOCK_MONOTONIC);
            if (unwinder_unwind(p, a.regs, a.stack_ptr, (const uint8_t *)rd.data + sizeof(a),
                                (size_t)stack_len, g_frames, UNWINDER_MAX_FRAMES, &n, &res) < 0)
                n = 0; /* -EINVAL: the record is posted without frames */
            unwind_us += (hp_clock_ns(CLOCK_MONOTONIC) - u0) / 1000; /* ProcessStats */
            post[0].rel_pc = a.addr;
            memcpy(post + 1, g_frames, n * sizeof(*g_frames));
            ring_end_read(rr, &rd);
            frames_total += n;
            posted++;
        }
        dt += hp_clock_ns(CLOCK_MONOTONIC) - t0;
    }
    rr = ring_unmap(rr);
    rw = ring_unmap(rw);
    if (bad || frames_total != posted * WANT_FRAMES) {
        fprintf(stderr, "bench_unwind: unexpected records or frame counts in the ring loop\n");
        exit(1);
    }
    g_unwind_us_total = unwind_us;
    return (double)posted * 1e9 / (double)dt;
}

static double first_sample_us(bool cold)
{
    enum { N = 7 };
    uint64_t t[N];
    for (int i = 0; i < N; i++) {
        if (cold) {
            unwinder_global_done();
            if (unwinder_global_init() < 0)
                exit(1);
        }
        uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
        unwinder_process_t *p = self_process();
        bool ok = unwind_once(p);
        t[i] = hp_clock_ns(CLOCK_MONOTONIC) - t0;
        p = unwinder_process_free(p);
        if (!ok) {
            fprintf(stderr, "bench_unwind: first unwind failed\n");
            exit(1);
        }
    }
    return median_us(t, N);
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    if (iters <= 0)
        iters = 20000;
    bench_recurse(DEPTH);
    if (unwinder_global_init() < 0)
        return 1;
    unwinder_process_t *p = self_process();
    if (!unwind_once(p)) {
        size_t n = 0;
        struct unwinder_result res;
        int r = unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, g_frames, UNWINDER_MAX_FRAMES, &n,
                                &res);
        if (r < 0) {
            fprintf(stderr, "bench_unwind: unwinder_unwind: %s\n", strerror(-r));
            return 1;
        }
        fprintf(stderr, "bench_unwind: expected %d frames without error, got %zu (error %d)\n",
                WANT_FRAMES, n, res.error);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "  #%zu %s\n", i, g_frames[i].function_name);
        return 1;
    }
    if (!unwinder__sigmask_interposed())
        fprintf(stderr, "bench_unwind: warning: the sigprocmask bypass does not interpose\n");

    double warm = warm_median_us(p, iters);
    if (argc > 2 && strcmp(argv[2], "warm") == 0) {
        /* For profilers: only the warm unwinds. */
        printf("bench: unwind_warm_d26_median_us %.2f us\n", warm);
        p = unwinder_process_free(p);
        unwinder_global_done();
        return 0;
    }
    unwinder__sigmask_set_enabled(false);
    double warm_base = warm_median_us(p, iters / 4 + 1);
    unwinder__sigmask_set_enabled(true);
    double sps = samples_per_s(p, iters * 2);
    p = unwinder_process_free(p);
    double first_warm = first_sample_us(false);
    double first_cold = first_sample_us(true);

    printf("bench: unwind_warm_d26_median_us %.2f us\n", warm);
    printf("bench: unwind_warm_d26_median_with_sigprocmask_us %.2f us (baseline)\n", warm_base);
    printf("bench: unwinder_samples_per_s %.0f samples/s (ring records of %zu bytes, %zu frames;"
           " per-unwind timing %llu us in total)\n",
           sps, sizeof(struct wire_alloc) + g_len, (size_t)WANT_FRAMES,
           (unsigned long long)g_unwind_us_total);
    printf("bench: unwinder_first_sample_us %.0f us\n", first_cold);
    printf("bench: unwinder_first_sample_warm_caches_us %.0f us\n", first_warm);
    printf("bench: unwinder_global_bytes %zu bytes\n", unwinder_global_bytes());
    unwinder_global_done();
    return 0;
}
