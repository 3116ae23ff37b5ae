/* tests/unwinder/bench_unwind.c: how long a warm unwind of a 20-frame stack takes, and how
 * many sigprocmask calls libunwind makes per unwind (counted by interposing sigprocmask,
 * which libunwind-x86_64.so imports from libc).
 *
 *     build/tests/unwinder/bench_unwind [iterations]
 *
 * Not registered as a test: timings on shared machines are noise for pass/fail.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/regs.h"
#include "unwinder/unwinder.h"

#define STACK_CAP (64 * 1024)
/* main, __libc_start_call_main, __libc_start_main and _start make 4 more frames. */
#define DEPTH 15
#define WANT_FRAMES 20

static uint64_t g_regs[HP_NREGS];
static uint64_t g_sp;
static size_t g_len;
static uint8_t g_stack[STACK_CAP];
static atomic_ulong g_sigprocmask_calls;
/* Set for a second timed loop: what the unwind would cost without those syscalls. */
static atomic_bool g_sigprocmask_nop;

int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    atomic_fetch_add_explicit(&g_sigprocmask_calls, 1, memory_order_relaxed);
    if (atomic_load_explicit(&g_sigprocmask_nop, memory_order_relaxed))
        return 0;
    return (int)syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8);
}

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

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    if (iters <= 0)
        iters = 20000;
    bench_recurse(DEPTH);
    if (unwinder_global_init() < 0)
        return 1;
    unwinder_process_t *p;
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (unwinder_process_new(getpid(), maps_fd, mem_fd, &p) < 0)
        return 1;

    static struct hp_frame frames[UNWINDER_MAX_FRAMES];
    size_t n = 0;
    struct unwinder_result res;
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    (void)unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, frames, UNWINDER_MAX_FRAMES, &n, &res);
    uint64_t cold_ns = hp_clock_ns(CLOCK_MONOTONIC) - t0;
    if (n != WANT_FRAMES || res.error) {
        fprintf(stderr, "bench_unwind: expected %d frames without error, got %zu (error %d)\n",
                WANT_FRAMES, n, res.error);
        return 1;
    }

    unsigned long sig0 = atomic_load_explicit(&g_sigprocmask_calls, memory_order_relaxed);
    t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < iters; i++)
        (void)unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, frames, UNWINDER_MAX_FRAMES, &n,
                              &res);
    uint64_t warm_ns = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / (uint64_t)iters;
    unsigned long sigs = atomic_load_explicit(&g_sigprocmask_calls, memory_order_relaxed) - sig0;

    atomic_store_explicit(&g_sigprocmask_nop, true, memory_order_relaxed);
    t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < iters; i++)
        (void)unwinder_unwind(p, g_regs, g_sp, g_stack, g_len, frames, UNWINDER_MAX_FRAMES, &n,
                              &res);
    uint64_t nop_ns = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / (uint64_t)iters;
    atomic_store_explicit(&g_sigprocmask_nop, false, memory_order_relaxed);

    printf("bench: unwind_cold_20_frames_us %.1f us\n", (double)cold_ns / 1000.0);
    printf("bench: unwind_warm_20_frames_ns %llu ns\n", (unsigned long long)warm_ns);
    printf("bench: unwind_warm_per_frame_ns %llu ns\n",
           (unsigned long long)(warm_ns / WANT_FRAMES));
    printf("bench: unwind_warm_20_frames_without_sigprocmask_ns %llu ns\n",
           (unsigned long long)nop_ns);
    printf("bench: unwind_sigprocmask_per_unwind %.1f calls\n", (double)sigs / (double)iters);
    p = unwinder_process_free(p);
    unwinder_global_done();
    return 0;
}
