/* tests/bench/bench_unwind.c: unwinder benchmarks (scripts/bench.sh unwind).
 *
 *   unwind_warm_d26_median_us  median of single warm unwinds of a 26-frame stack of this
 *                              process (captured and copied once, as a client would);
 *                              with the baseline: the same unwind with libunwind's
 *                              signal-mask syscalls left in place
 *   unwinder_samples_per_s     records one thread turns into unwound frames: a batch of
 *                              wire_alloc records with real stack copies, laid out back to
 *                              back as in the ring's data area, each validated, copied
 *                              out of the buffer and unwound (the ring itself is not in
 *                              the loop: the shared-memory ring is built elsewhere)
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
#include "common/regs.h"
#include "shmem_ring/wire.h"
#include "unwinder/sigmask.h"
#include "unwinder/unwinder.h"

#define STACK_CAP (64 * 1024)
/* main, __libc_start_call_main, __libc_start_main and _start make 4 more frames. */
#define DEPTH 21
#define WANT_FRAMES 26
#define BATCH 64

static uint64_t g_regs[HP_NREGS];
static uint64_t g_sp;
static size_t g_len;
static uint8_t g_stack[STACK_CAP];
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];

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
    (void)unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, g_frames, UNWINDER_MAX_FRAMES, &n, &res);
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

/* Samples per second through the record path: validate the header, copy it out of the
 * shared buffer, unwind the stack in place. */
static double samples_per_s(unwinder_process_t *p, long iters)
{
    size_t rec_len = HP_ALIGN_UP(sizeof(struct wire_alloc) + g_len, (size_t)8);
    uint8_t *buf = malloc(rec_len * BATCH);
    if (!buf)
        exit(1);
    for (size_t i = 0; i < BATCH; i++) {
        struct wire_alloc a = {.seq = i, .addr = 0x1000 + i * 64, .size = 64, .sample_size = 4096};
        a.stack_ptr = g_sp;
        a.stack_len = (uint32_t)g_len;
        memcpy(a.regs, g_regs, sizeof(a.regs));
        memcpy(buf + i * rec_len, &a, sizeof(a));
        memcpy(buf + i * rec_len + sizeof(a), g_stack, g_len);
    }
    size_t frames_total = 0;
    long rounds = HP_MAX(iters / BATCH, 1L);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (long r = 0; r < rounds; r++) {
        for (size_t i = 0; i < BATCH; i++) {
            const uint8_t *data = buf + i * rec_len;
            struct wire_alloc a;
            memcpy(&a, data, sizeof(a));
            if (a.stack_len > rec_len - sizeof(a))
                exit(1);
            size_t n = 0;
            struct unwinder_result res;
            (void)unwinder_unwind(p, a.regs, a.stack_ptr, data + sizeof(a), a.stack_len, g_frames,
                                  UNWINDER_MAX_FRAMES, &n, &res);
            frames_total += n;
        }
    }
    uint64_t dt = hp_clock_ns(CLOCK_MONOTONIC) - t0;
    free(buf);
    if (frames_total != (size_t)rounds * BATCH * WANT_FRAMES) {
        fprintf(stderr, "bench_unwind: unexpected frame count in the record loop\n");
        exit(1);
    }
    return (double)rounds * BATCH * 1e9 / (double)dt;
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
        (void)unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, g_frames, UNWINDER_MAX_FRAMES, &n,
                              &res);
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
    printf("bench: unwinder_samples_per_s %.0f samples/s\n", sps);
    printf("bench: unwinder_first_sample_us %.0f us\n", first_cold);
    printf("bench: unwinder_first_sample_warm_caches_us %.0f us\n", first_warm);
    printf("bench: unwinder_global_bytes %zu bytes\n", unwinder_global_bytes());
    unwinder_global_done();
    return 0;
}
