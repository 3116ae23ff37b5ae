/* tests/bench/bench_client.c: cost of the preload client's hooks, in one run.
 *
 * Re-executes itself under LD_PRELOAD=libheapprof.so (HEAPPROF_LIB, else the library
 * beside this build) with no session, so the client starts DORMANT. It then measures:
 *   glibc_pair_ns                  malloc(64)+free through __libc_malloc/__libc_free
 *   client_dormant_pair_extra_ns   the hooked pair while dormant, minus glibc's
 *   client_heap_api_dormant_ns     one heapprof_report_allocation() (64 bytes) while dormant
 *   client_heap_api_ns             the same while a session records the heap, unsampled
 *                                  (the interval of the pair below): the sampler's countdown
 *   client_unsampled_pair_extra_ns the hooked pair while a session is active with an
 *                                  interval no 64-byte allocation reaches, minus glibc's
 *   client_sampled_d{20,200}_{median,p99}_ns
 *                                  one sampled malloc(64) at stack depth 20/200 (every
 *                                  allocation sampled), minus glibc's median malloc: the
 *                                  stack is copied (no unwind table)
 *   client_sampled_walk_d{20,200}_{median,p99}_ns
 *                                  the same with the session's unwind table filled: the
 *                                  client walks its stack and sends return addresses
 *   client_sampled_fiber_d20_median_ns, client_sampled_fiber_vs_thread_ratio
 *                                  one sampled malloc(64) at depth 20 on a ucontext fiber
 *                                  (a 256 KiB mmap'd stack with a guard page, as
 *                                  coroutine libraries make them; a stack the client
 *                                  knows nothing of), and its median over the thread
 *                                  stack's at the same depth, in the same session (with
 *                                  an unwind table, as `heapprof record` runs); also
 *                                  client_sampled_fiber_copy_vs_thread_ratio, without a
 *                                  table (every stack copied)
 * The session comes from a fake service inside this process: it listens on
 * attach-<pid>.sock in a private XDG_RUNTIME_DIR, sends itself the attach signal, and a
 * reader thread drains the ring (the sampled figures measure the client only). With an
 * unwind table, the reader unwinds the copies it reads as the service does, which
 * publishes the rules the client's walks then use.
 * Pair loops alternate baseline and hooked rounds and compare the best of each; sampled
 * figures are percentiles of individually timed calls.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "common/paths.h"
#include "common/wake.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"
#include "unwinder/unwinder.h"

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *p);

#define PAIRS 100000
#define ROUNDS 41

typedef void *(*alloc_fn)(size_t);
typedef void (*free_fn)(void *);

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static __attribute__((noinline)) double pair_loop_ns(alloc_fn am, free_fn fr)
{
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < PAIRS; i++) {
        void *volatile p = am(64);
        fr(p);
    }
    return (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / PAIRS;
}

/* Best hooked round minus best glibc round, over alternating rounds: the machine is
 * shared, and preemption only ever adds time, so the minimum is the robust estimate. */
static double extra_pair_ns(double *ret_glibc)
{
    double best_base = 1e9, best_hooked = 1e9;
    (void)pair_loop_ns(malloc, free); /* warm up */
    for (int r = 0; r < ROUNDS; r++) {
        double b = pair_loop_ns(__libc_malloc, __libc_free);
        double h = pair_loop_ns(malloc, free);
        if (getenv("BENCH_VERBOSE"))
            fprintf(stderr, "round %d: glibc %.2f hooked %.2f\n", r, b, h);
        best_base = b < best_base ? b : best_base;
        best_hooked = h < best_hooked ? h : best_hooked;
    }
    if (ret_glibc)
        *ret_glibc = best_base;
    return best_hooked - best_base;
}

/* ---- the fake service ------------------------------------------------------------ */

static char xdg[64];
static int lsock = -1;
static _Atomic bool reader_stop;

struct session {
    int sock;
    ring_t *ring;
    pthread_t reader;
    unwinder_process_t *unw; /* with an unwind table: unwinds the copies it reads */
    _Atomic unsigned unwound;
};

static struct hp_frame reader_frames[UNWINDER_MAX_FRAMES];

/* Reads one record (0) or none (-1); stack copies are unwound when the session has an
 * unwind table, which publishes the rules of their frames. */
static int read_one(struct session *s)
{
    struct ring_rspan rs;
    if (ring_begin_read(s->ring, &rs) < 0)
        return -1;
    /* Enough copies to publish the rules of the stacks measured; unwinding every copy of
     * a 200-frame stack would slow the reader down until the client waits for room. */
    if (s->unw && s->unwound < 1000 && rs.type == WIRE_ALLOC &&
        rs.len >= sizeof(struct wire_alloc)) {
        s->unwound++;
        struct wire_alloc a;
        memcpy(&a, rs.data, sizeof(a));
        size_t n;
        struct unwinder_result res;
        /* Unwound only for the rules it publishes; a failed unwind publishes none. */
        if (a.stack_len <= rs.len - sizeof(a))
            (void)!unwinder_unwind_copy(
                s->unw, a.regs, a.stack_ptr, (const uint8_t *)rs.data + sizeof(a), a.stack_len,
                unwinder_copy_of(a.flags), reader_frames, UNWINDER_MAX_FRAMES, &n, &res);
    }
    ring_end_read(s->ring, &rs);
    return 0;
}

static void *reader_main(void *arg)
{
    struct session *s = arg;
    /* As the service does: drain, announce idleness, drain again, sleep until woken. */
    while (!atomic_load(&reader_stop)) {
        while (read_one(s) == 0)
            ;
        ring_set_reader_idle(s->ring, true);
        while (read_one(s) == 0)
            ;
        (void)ring_wait(s->ring, 10);
        ring_set_reader_idle(s->ring, false);
    }
    return NULL;
}

/* Calls the wake entry our client advertises, as `heapprof attach` does remotely: the
 * client connects to our own attach socket. */
static int wake_self(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    char line[512];
    unsigned long lo = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, HP_WAKE_MEMFD_NAME) && sscanf(line, "%lx-", &lo) == 1)
            break;
    fclose(f);
    const struct hp_wake_page *pg = (const struct hp_wake_page *)lo;
    if (!pg || pg->magic != HP_WAKE_MAGIC || pg->version != HP_WAKE_VERSION)
        return -1;
    int (*entry)(int, const char *) = (int (*)(int, const char *))(uintptr_t)pg->entry;
    return entry(getpid(), NULL) == HP_WAKE_STARTED ? 0 : -1;
}

/* @walk: give the client an unwind table. */
static int attach_session(uint64_t interval, bool walk, struct session *s)
{
    s->unw = NULL;
    s->unwound = 0;
    if (wake_self() < 0)
        return -1;
    struct pollfd p = {.fd = lsock, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return -1;
    s->sock = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
    struct wire_hello hello;
    int fds[2];
    size_t nfds = 0;
    if (s->sock < 0 || hp_recv_fds(s->sock, &hello, sizeof(hello), fds, 2, &nfds) < 0 || nfds != 2)
        return -1;
    int tfd = -1;
    walk = walk && (hello.features & WIRE_FEATURE_UNWIND_TABLE);
    if (walk) {
        /* The hello's /proc fds are this process's own: unwind ourselves, as the service
         * unwinds a client. */
        if (unwinder_process_new(getpid(), fds[0], fds[1], &s->unw) < 0 ||
            utable_create(UTABLE_DEFAULT_SLOTS, &tfd) < 0 ||
            unwinder_process_set_table(s->unw, tfd) < 0)
            return -1;
    } else {
        for (size_t i = 0; i < nfds; i++)
            (void)close(fds[i]);
    }
    struct wire_client_config cfg = {
        .magic = WIRE_CONFIG_MAGIC,
        .status = WIRE_STATUS_PROFILE,
        .features = hello.features & (WIRE_FEATURE_REGS_X86_64 | WIRE_FEATURE_HEAPS |
                                      (walk ? WIRE_FEATURE_UNWIND_TABLE : 0)),
        .block_client = 1,
        .sampling_interval_bytes = interval,
        .max_stack_bytes = 64 << 10,
        .block_client_timeout_us = 1000000,
    };
    int rfd;
    if (ring_create(8u << 20, &rfd) < 0 || ring_map(rfd, RING_ROLE_READER, &s->ring) < 0)
        return -1;
    int send[2] = {rfd, tfd};
    if (hp_send_fds(s->sock, &cfg, sizeof(cfg), send, walk ? 2 : 1) < 0)
        return -1;
    /* Every heap recorded (all_heaps). */
    struct wire_heaps heaps = {.flags = WIRE_HEAPS_ALL};
    if ((cfg.features & WIRE_FEATURE_HEAPS) &&
        hp_send_fds(s->sock, &heaps, sizeof(heaps), NULL, 0) < 0)
        return -1;
    (void)close(rfd);
    if (tfd >= 0)
        (void)close(tfd);
    atomic_store(&reader_stop, false);
    if (pthread_create(&s->reader, NULL, reader_main, s) != 0)
        return -1;
    /* The client is ACTIVE once the helper has its answer: give it a moment. */
    struct timespec ms = {0, 20 * 1000000};
    nanosleep(&ms, NULL);
    return 0;
}

static void detach_session(struct session *s)
{
    atomic_store(&reader_stop, true);
    (void)pthread_join(s->reader, NULL);
    (void)close(s->sock);
    struct timespec ms = {0, 50 * 1000000};
    nanosleep(&ms, NULL);
    s->ring = ring_unmap(s->ring);
    s->unw = unwinder_process_free(s->unw);
}

/* ---- sampled path ----------------------------------------------------------------- */

#define SAMPLES 20000
static uint64_t times[SAMPLES];

static __attribute__((noinline)) uint64_t timed_malloc(alloc_fn am, free_fn fr)
{
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    void *volatile p = am(64);
    uint64_t t1 = hp_clock_ns(CLOCK_MONOTONIC);
    fr(p);
    return t1 - t0;
}

static __attribute__((noinline)) uint64_t at_depth(int depth, alloc_fn am, free_fn fr)
{
    if (depth > 1) {
        uint64_t r = at_depth(depth - 1, am, fr);
        __asm__ volatile("" ::: "memory"); /* no tail call: keep the frame */
        return r;
    }
    return timed_malloc(am, fr);
}

/* ---- on a fiber -------------------------------------------------------------------- */

static ucontext_t fiber_caller, fiber_ctx;
static struct {
    int depth, count;
    alloc_fn am;
    free_fn fr;
    uint64_t *out;
} fiber_job;
static char *fiber_stack;
#define FIBER_STACK (256u << 10)

static void fiber_entry(void)
{
    for (int i = 0; i < fiber_job.count; i++)
        fiber_job.out[i] = at_depth(fiber_job.depth, fiber_job.am, fiber_job.fr);
}

/* Runs @count timed calls at @depth on the fiber stack, into @out. */
static void on_fiber(int depth, alloc_fn am, free_fn fr, uint64_t *out, int count)
{
    if (!fiber_stack) {
        char *m = mmap(NULL, FIBER_STACK + 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || mprotect(m, 4096, PROT_NONE) != 0)
            abort();
        fiber_stack = m + 4096;
    }
    fiber_job.depth = depth;
    fiber_job.count = count;
    fiber_job.am = am;
    fiber_job.fr = fr;
    fiber_job.out = out;
    if (getcontext(&fiber_ctx) != 0)
        abort();
    fiber_ctx.uc_stack.ss_sp = fiber_stack;
    fiber_ctx.uc_stack.ss_size = FIBER_STACK;
    fiber_ctx.uc_link = &fiber_caller;
    makecontext(&fiber_ctx, fiber_entry, 0);
    if (swapcontext(&fiber_caller, &fiber_ctx) != 0)
        abort();
}

static uint64_t fiber_times[SAMPLES];

/* Median cost of a sampled malloc at @depth on the thread's stack and on a fiber, in the
 * current session (minus glibc's median malloc, measured the same way), alternating
 * batches so that the machine's noise falls on both. */
static double fiber_vs_thread(struct session *s, int depth, const char *name)
{
    static uint64_t base[SAMPLES / 4];
    const int batch = SAMPLES / 10;
    for (int i = 0; i < SAMPLES / 4; i++)
        base[i] = at_depth(depth, __libc_malloc, __libc_free);
    /* Warm-up on both stacks: with an unwind table, the first copies publish the rules. */
    atomic_store(&s->unwound, 0);
    for (int i = 0; i < 200; i++)
        (void)at_depth(depth, malloc, free);
    on_fiber(depth, malloc, free, fiber_times, 200);
    struct timespec ms = {0, 20 * 1000000};
    nanosleep(&ms, NULL);
    for (int b = 0; b < 10; b++) {
        for (int i = 0; i < batch; i++)
            times[b * batch + i] = at_depth(depth, malloc, free);
        on_fiber(depth, malloc, free, fiber_times + b * batch, batch);
    }
    qsort(base, SAMPLES / 4, sizeof(uint64_t), cmp_u64);
    qsort(times, SAMPLES, sizeof(uint64_t), cmp_u64);
    qsort(fiber_times, SAMPLES, sizeof(uint64_t), cmp_u64);
    uint64_t b0 = base[SAMPLES / 8];
    uint64_t t = times[SAMPLES / 2] > b0 ? times[SAMPLES / 2] - b0 : 1;
    uint64_t f = fiber_times[SAMPLES / 2] > b0 ? fiber_times[SAMPLES / 2] - b0 : 0;
    if (name)
        printf("bench: client_sampled_fiber_d%d_median_ns %llu ns\n", depth, (unsigned long long)f);
    if (getenv("BENCH_VERBOSE"))
        fprintf(stderr, "fiber %llu thread %llu (p99 %llu / %llu)\n", (unsigned long long)f,
                (unsigned long long)t, (unsigned long long)fiber_times[SAMPLES * 99 / 100],
                (unsigned long long)times[SAMPLES * 99 / 100]);
    return (double)f / (double)t;
}

static void sampled(int depth, const char *kind)
{
    /* Not on the stack: 40 KB of the harness below main would be copied with every sample
     * and dwarf the 20 frames being measured. */
    static uint64_t base[SAMPLES / 4];
    for (int i = 0; i < SAMPLES / 4; i++)
        base[i] = at_depth(depth, __libc_malloc, __libc_free);
    /* Warm-up: with an unwind table, the first copies publish the rules. */
    for (int i = 0; i < 200; i++)
        (void)at_depth(depth, malloc, free);
    struct timespec ms = {0, 20 * 1000000};
    nanosleep(&ms, NULL);
    for (int i = 0; i < SAMPLES; i++)
        times[i] = at_depth(depth, malloc, free);
    qsort(base, SAMPLES / 4, sizeof(uint64_t), cmp_u64);
    qsort(times, SAMPLES, sizeof(uint64_t), cmp_u64);
    uint64_t b = base[SAMPLES / 8];
    uint64_t med = times[SAMPLES / 2], p99 = times[SAMPLES * 99 / 100];
    printf("bench: client_sampled_%sd%d_median_ns %llu ns\n", kind, depth,
           (unsigned long long)(med > b ? med - b : 0));
    printf("bench: client_sampled_%sd%d_p99_ns %llu ns\n", kind, depth,
           (unsigned long long)(p99 > b ? p99 - b : 0));
}

/* ---- the heap API ------------------------------------------------------------------ */

typedef bool (*report_fn)(uint32_t heap, uint64_t id, uint64_t size);
#define API_CALLS 1000000

/* ns per heapprof_report_allocation(@heap, id, 64): the best of 7 rounds. */
static double heap_api_ns(report_fn report, uint32_t heap)
{
    double best = 1e9;
    for (int round = 0; round < 7; round++) {
        uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
        for (uint64_t i = 0; i < API_CALLS; i++) {
            bool r = report(heap, 0x10000 + 64 * i, 64);
            __asm__ volatile("" : : "r"(r) : "memory");
        }
        double ns = (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / API_CALLS;
        best = ns < best ? ns : best;
    }
    return best;
}

static int measure(void)
{
    char dir[128], path[HP_PATH_MAX];
    const char *x = getenv("XDG_RUNTIME_DIR");
    snprintf(xdg, sizeof(xdg), "%s", x ? x : "");
    if (hp_runtime_dir(xdg, getuid(), dir, sizeof(dir)) < 0 || mkdir(dir, 0700) < 0 ||
        hp_socket_path(xdg, getuid(), getpid(), path, sizeof(path)) < 0)
        return 1;
    lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (bind(lsock, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lsock, 4) < 0)
        return 1;

    double glibc;
    double dormant = extra_pair_ns(&glibc);
    printf("bench: glibc_pair_ns %.2f ns\n", glibc);
    printf("bench: client_dormant_pair_extra_ns %.2f ns\n", dormant);

    /* The preloaded library's exports (preload/include/heapprof.h). */
    uint32_t (*reg)(const char *) =
        (uint32_t(*)(const char *))dlsym(RTLD_DEFAULT, "heapprof_register_heap");
    report_fn report = (report_fn)dlsym(RTLD_DEFAULT, "heapprof_report_allocation");
    uint32_t heap = reg && report ? reg("bench.arena") : 0;
    if (!heap) {
        fprintf(stderr, "bench_client: no heap API\n");
        return 1;
    }
    printf("bench: client_heap_api_dormant_ns %.2f ns\n", heap_api_ns(report, heap));

    struct session s;
    if (attach_session(UINT64_C(1) << 40, false, &s) < 0) {
        fprintf(stderr, "bench_client: attach failed\n");
        return 1;
    }
    printf("bench: client_heap_api_ns %.2f ns\n", heap_api_ns(report, heap));
    printf("bench: client_unsampled_pair_extra_ns %.2f ns\n", extra_pair_ns(NULL));
    detach_session(&s);

    if (attach_session(1, false, &s) < 0) {
        fprintf(stderr, "bench_client: second attach failed\n");
        return 1;
    }
    sampled(20, "");
    sampled(200, "");
    double copy_ratio = fiber_vs_thread(&s, 20, NULL);
    detach_session(&s);

    if (unwinder_global_init() < 0 || attach_session(1, true, &s) < 0) {
        fprintf(stderr, "bench_client: attach with an unwind table failed\n");
        return 1;
    }
    sampled(20, "walk_");
    sampled(200, "walk_");
    double ratio = fiber_vs_thread(&s, 20, "fiber");
    printf("bench: client_sampled_fiber_vs_thread_ratio %.3f ratio\n", ratio);
    printf("bench: client_sampled_fiber_copy_vs_thread_ratio %.3f ratio\n", copy_ratio);
    detach_session(&s);
    unwinder_global_done();
    (void)unlink(path);
    (void)rmdir(dir);
    (void)rmdir(xdg);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("BENCH_CLIENT_CHILD"))
        return measure();

    char lib[8192], self[4096], tmpl[] = "/tmp/heapprof-bench-XXXXXX";
    const char *env_lib = getenv("HEAPPROF_LIB");
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = 0;
    if (env_lib) {
        snprintf(lib, sizeof(lib), "%s", env_lib);
    } else {
        /* <build>/tests/bench/bench_client -> <build>/preload/libheapprof.so */
        char *slash = strrchr(self, '/');
        *slash = 0;
        snprintf(lib, sizeof(lib), "%s/../../preload/libheapprof.so", self);
        *slash = '/';
    }
    if (!mkdtemp(tmpl))
        return 1;
    setenv("LD_PRELOAD", lib, 1);
    setenv("XDG_RUNTIME_DIR", tmpl, 1);
    setenv("BENCH_CLIENT_CHILD", "1", 1);
    unsetenv("HEAPPROF_SOCKET");
    setenv("HEAPPROF_STARTUP", "0", 1);
    setenv("HEAPPROF_SEED", "1", 1);
    execv(self, argv);
    perror("bench_client: exec");
    return 1;
}
