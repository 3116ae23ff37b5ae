/* preload/hook.c: the exported malloc family and the sampled path behind it.
 *
 * Hook-safe throughout: no allocation, no stdio, no locks; system calls only on the
 * sampled path (the poke, the stack lookup once per thread) and never ones that are
 * cancellation points. errno is preserved around everything we do besides the real call.
 *
 * Fast path of an allocation: the real call, one relaxed load of the interval, one TLS
 * decrement and a branch. Fast path of a free: one relaxed load and, while profiling, one
 * probe of the sampled-address set.
 */
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "common/regs.h"
#include "preload/client.h"
#include "shmem_ring/wire.h"

/* glibc's allocator entry points (exported by libc.so.6 for exactly this purpose). */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *p);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

__thread struct client_tls client_tls __attribute__((tls_model("initial-exec")));

/* ---- recording -------------------------------------------------------------------- */

static void hook_poke(void)
{
    static const char byte = 0;
    /* sendto via syscall(2): send(2) is a cancellation point, malloc must not be one. */
    long n = syscall(SYS_sendto, client_cfg.sock, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0);
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
        client_go_passthrough();
    /* EAGAIN: the socket buffer is full of pokes already; the reader is awake. */
}

/* True in a child forked without our atfork handler running (_Fork, raw clone). */
static bool hook_forked_child(void)
{
    if (HP_LIKELY(getpid() == client_cfg.pid))
        return false;
    client_go_passthrough();
    return true;
}

static uint32_t hook_tid(struct client_tls *t)
{
    if (HP_UNLIKELY(t->tid == 0))
        t->tid = (uint32_t)syscall(SYS_gettid);
    return t->tid;
}

/* The stack we copy belongs to the application; under AddressSanitizer parts of it are
 * poisoned redzones. rep movsb is never instrumented. */
__attribute__((no_sanitize("address"))) static void hook_copy_stack(void *dst, const void *src,
                                                                    size_t len)
{
#if defined(__x86_64__)
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(len) : : "memory");
#else
    volatile const uint8_t *s = src;
    uint8_t *d = dst;
    for (size_t i = 0; i < len; i++)
        d[i] = s[i];
#endif
}

/* @safe_top: an address above the stack pointer up to which the stack is certainly
 * mapped (the slow path's own frame), used when the stack mapping is unknown. */
static HP_NOINLINE void hook_record_alloc(struct client_tls *t, void *p, size_t size,
                                          uint64_t sample_size, uint64_t safe_top)
{
    uint64_t regs[HP_NREGS];
    hp_capture_regs(regs);

    if (hook_forked_child())
        return;
    uint64_t sp = regs[HP_REG_RSP];
    uint64_t end, avail;
    uint32_t flags = 0;
    if (client_stack_lookup(&t->stack, sp, &end) == 0) {
        avail = end - sp;
    } else {
        flags |= WIRE_ALLOC_UNKNOWN_STACK;
        avail = safe_top > sp ? safe_top - sp : 0;
    }
    uint64_t len = avail;
    if (len > client_cfg.max_stack_bytes) {
        len = client_cfg.max_stack_bytes;
        flags |= WIRE_ALLOC_STACK_TRUNCATED;
    }

    ring_t *ring = client_cfg.ring;
    struct ring_wspan w;
    int r = ring_try_begin_write(ring, WIRE_ALLOC, sizeof(struct wire_alloc) + len, &w);
    if (r < 0) {
        /* Full: make sure a sleeping reader hears about it (and notice a dead peer). */
        if (r == -EAGAIN)
            hook_poke();
        return;
    }
    struct wire_alloc *a = w.data;
    /* Taken after the reservation: see DESIGN.md (sequence numbers settle races). */
    a->seq = atomic_fetch_add_explicit(&client_seq, 1, memory_order_relaxed) + 1;
    a->addr = (uint64_t)(uintptr_t)p;
    a->size = size;
    a->sample_size = sample_size;
    a->ts_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    a->heap_id = 0;
    a->tid = hook_tid(t);
    a->stack_ptr = sp;
    a->stack_len = (uint32_t)len;
    a->flags = flags;
    memcpy(a->regs, regs, sizeof(a->regs));
    hook_copy_stack(a + 1, (const void *)(uintptr_t)sp, (size_t)len);
    if (ring_end_write(ring, &w))
        hook_poke();

    if (client_freeset_insert(&client_freeset, (uint64_t)(uintptr_t)p) < 0) {
        atomic_fetch_add_explicit(&client_freeset_overflows, 1, memory_order_relaxed);
        atomic_store_explicit(&client_send_all_frees, true, memory_order_relaxed);
    }
}

void client_record_free(void *p)
{
    struct client_tls *t = &client_tls;
    int saved_errno = errno;

    t->in_hook = true;
    if (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_ACTIVE &&
        !hook_forked_child()) {
        ring_t *ring = client_cfg.ring;
        struct ring_wspan w;
        int r = ring_try_begin_write(ring, WIRE_FREE, sizeof(struct wire_free), &w);
        if (r == 0) {
            struct wire_free *f = w.data;
            f->seq = atomic_fetch_add_explicit(&client_seq, 1, memory_order_relaxed) + 1;
            f->addr = (uint64_t)(uintptr_t)p;
            f->heap_id = 0;
            f->reserved = 0;
            if (ring_end_write(ring, &w))
                hook_poke();
        } else if (r == -EAGAIN) {
            hook_poke();
        }
    }
    t->in_hook = false;
    errno = saved_errno;
}

/* ---- slow path -------------------------------------------------------------------- */

static void hook_seed_thread(struct client_tls *t)
{
    uint64_t n = atomic_fetch_add_explicit(&client_thread_counter, 1, memory_order_relaxed);
    client_sampler_init(&t->sampler, &client_cfg.params, client_seed ^ client_mix64(n + 1));
    t->seeded = true;
}

/* Reached when the fast path's counter ran out or the size is at least the interval. */
HP_NOINLINE void *client_alloc_slow(void *p, size_t size)
{
    struct client_tls *t = &client_tls;

    if (t->in_hook)
        return p;
    t->in_hook = true;
    int saved_errno = errno;

    int state = atomic_load_explicit(&client_state, memory_order_acquire);
    if (HP_UNLIKELY(state == CLIENT_UNINIT)) {
        client_init();
        state = atomic_load_explicit(&client_state, memory_order_acquire);
        t->seeded = false;
    }
    if (state != CLIENT_ACTIVE) {
        if (state == CLIENT_DORMANT)
            t->sampler.bytes_left = CLIENT_DORMANT_RECHECK_BYTES;
        else if (state == CLIENT_PASSTHROUGH)
            t->sampler.bytes_left = INT64_MAX / 2;
        else
            t->sampler.bytes_left = 0; /* initialising elsewhere: look again next time */
    } else {
        uint64_t sample_size;
        if (!t->seeded) {
            hook_seed_thread(t);
            sample_size = client_sampler_step(&t->sampler, &client_cfg.params, size);
        } else if (size >= client_cfg.params.interval) {
            sample_size = size;
        } else {
            sample_size = client_sampler_refill(&t->sampler, &client_cfg.params);
        }
        if (sample_size > 0 && p != NULL)
            hook_record_alloc(t, p, size, sample_size,
                              (uint64_t)(uintptr_t)__builtin_frame_address(0) + 16);
    }

    errno = saved_errno;
    t->in_hook = false;
    return p;
}

/* ---- the exported entry points ---------------------------------------------------- */

static HP_ALWAYS_INLINE void *hook_after_alloc(void *p, size_t size)
{
    if (HP_LIKELY(size < atomic_load_explicit(&client_fast_interval, memory_order_relaxed)) &&
        HP_LIKELY((client_tls.sampler.bytes_left -= (int64_t)size) > 0))
        return p;
    return client_alloc_slow(p, size);
}

static HP_ALWAYS_INLINE void hook_before_free(void *p)
{
    /* Acquire pairs with the release store in client_init(): the set is mapped. */
    if (HP_UNLIKELY(atomic_load_explicit(&client_free_watch, memory_order_acquire)) && p &&
        !client_tls.in_hook) {
        if (client_freeset_remove(&client_freeset, (uint64_t)(uintptr_t)p) ||
            HP_UNLIKELY(atomic_load_explicit(&client_send_all_frees, memory_order_relaxed)))
            client_record_free(p);
    }
}

HP_EXPORT void *malloc(size_t size)
{
    return hook_after_alloc(__libc_malloc(size), size);
}

HP_EXPORT void free(void *p)
{
    hook_before_free(p);
    __libc_free(p);
}

HP_EXPORT void *calloc(size_t n, size_t size)
{
    void *p = __libc_calloc(n, size);
    /* No overflow when the call succeeded (glibc fails with ENOMEM otherwise). */
    return p ? hook_after_alloc(p, n * size) : p;
}

static HP_ALWAYS_INLINE void *hook_realloc(void *p, size_t size)
{
    /* The old block is recorded as freed before it really is, so that a reuse of its
     * address by another thread gets a later sequence number. If the reallocation then
     * fails, the block stays live but unrecorded (an underestimate, only under OOM). */
    hook_before_free(p);
    void *q = __libc_realloc(p, size);
    /* realloc(p, 0) frees p and returns NULL (glibc: REALLOC_ZERO_BYTES_FREES). */
    return q ? hook_after_alloc(q, size) : q;
}

HP_EXPORT void *realloc(void *p, size_t size)
{
    return hook_realloc(p, size);
}

HP_EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    /* glibc: ENOMEM on overflow, otherwise exactly realloc(). */
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return hook_realloc(p, bytes);
}

HP_EXPORT void *memalign(size_t alignment, size_t size)
{
    void *p = __libc_memalign(alignment, size);
    return p ? hook_after_alloc(p, size) : p;
}

/* glibc 2.36 defines aligned_alloc as an alias of memalign (no alignment check). */
HP_EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    void *p = __libc_memalign(alignment, size);
    return p ? hook_after_alloc(p, size) : p;
}

HP_EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size)
{
    /* glibc's checks: a power-of-two multiple of sizeof(void *); errno untouched. */
    if (alignment % sizeof(void *) != 0 ||
        ((alignment / sizeof(void *)) & (alignment / sizeof(void *) - 1)) != 0 || alignment == 0)
        return EINVAL;
    void *p = __libc_memalign(alignment, size);
    if (p == NULL)
        return ENOMEM;
    *memptr = hook_after_alloc(p, size);
    return 0;
}

HP_EXPORT void *valloc(size_t size)
{
    void *p = __libc_valloc(size);
    return p ? hook_after_alloc(p, size) : p;
}

HP_EXPORT void *pvalloc(size_t size)
{
    void *p = __libc_pvalloc(size);
    return p ? hook_after_alloc(p, size) : p;
}
