/* preload/hook.c: the exported malloc family and the sampled path behind it.
 *
 * Hook-safe throughout: no allocation, no stdio, no locks; system calls only on the
 * sampled path (a FUTEX_WAKE when the service sleeps, the stack lookup once per thread)
 * and never ones that are cancellation points. errno is preserved around everything we do besides
 * the real call.
 *
 * Fast path of an allocation: one relaxed load of the interval, one TLS decrement and a
 * branch, then the real call (malloc: a tail call). Fast path of a free: one load of client_current
 * and, while profiling, one probe of the sampled-address set. No atomic read-modify-write and no
 * system call unless a sample is taken (fork is noticed by the atfork handler; a child
 * made without it, by the getpid() check on the sampled path).
 *
 * Every call is forwarded to the program's own allocator (preload/alloc.h), never to
 * glibc's by name. free_sized/free_aligned_sized (C23, glibc 2.39) are exported too: our
 * exports are unversioned, and an unversioned definition binds a versioned reference
 * (free_sized@GLIBC_2.39) just as it binds malloc@GLIBC_2.2.5.
 *
 * Each exported function is an alias of a local hook_*() function, whose address
 * preload/got.c installs in GOT slots when the allocator comes before us (our exported
 * symbols then resolve to the allocator's, even inside this library).
 */
#include "preload/client.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "preload/alloc.h"
#include "preload/got.h"
#include "preload/walk.h"
#include "shmem_ring/wire.h"

/* The loader's record of the stack pointer at the program's entry (ld.so, GLIBC_2.2.5). */
extern void *__libc_stack_end;
#define HOOK_ENTRY_SLACK 256u

__thread struct client_tls client_tls __attribute__((tls_model("initial-exec")));

/* ---- recording -------------------------------------------------------------------- */

/* Sequence numbers of the process's records (allocations and frees alike). */
static _Alignas(64) _Atomic uint64_t hook_seq;

/* After a record could not be written (the ring is full): make sure a sleeping reader
 * hears about it. ring_end_write() wakes the reader itself; this costs a system call only
 * when the reader sleeps. No descriptor: the program cannot make us write into one of
 * its own (see shmem_ring/ring.h). */
static void hook_poke(struct client_session *s)
{
    ring_wake_reader(s->ring);
}

/* The ring was full: make sure a sleeping reader hears about it, but at most once per
 * HOOK_FULL_POKE_NS for the process. With a stopped or hung reader every sample finds
 * the ring full; a system call per dropped record would slow the program down for as
 * long as the reader stays away. */
#define HOOK_FULL_POKE_NS (1000u * 1000u)
static void hook_poke_full(struct client_session *s)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t last = atomic_load_explicit(&s->full_poke_ns, memory_order_relaxed);
    if (now - last < HOOK_FULL_POKE_NS ||
        !atomic_compare_exchange_strong_explicit(&s->full_poke_ns, &last, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    hook_poke(s);
}

/* True in a child made without our atfork handler (_Fork, clone): it must not write
 * into the parent's ring, nor change the shared state. */
static bool hook_foreign_pid(const struct client_session *s)
{
    if (HP_LIKELY(s->fork_token != NULL)) {
        if (HP_LIKELY(atomic_load_explicit(s->fork_token, memory_order_relaxed) == s->gen))
            return false;
    } else if (getpid() == s->pid) {
        return false;
    }
    atomic_fetch_add_explicit(&client_stat_foreign_pid_samples, 1, memory_order_relaxed);
    return true;
}

/* A vfork child runs on its parent's thread state: it must not leave its tid there. */
static uint32_t hook_tid(struct client_tls *t, const struct client_session *s)
{
    if (HP_LIKELY(t->tid != 0))
        return t->tid;
    uint32_t tid = (uint32_t)syscall(SYS_gettid);
    if (getpid() == s->pid)
        t->tid = tid;
    return tid;
}

/* The stack we copy belongs to the application; under AddressSanitizer parts of it are
 * poisoned redzones, and fortified memcpy checks object sizes. rep movsb is neither. */
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

/* The head of a sampled allocation record. */
static void hook_fill_head(struct wire_alloc_head *ret, struct client_tls *t,
                           const struct client_session *s, void *p, size_t size,
                           uint64_t sample_size)
{
    *ret = (struct wire_alloc_head){
        /* Taken after the real malloc and the reservation: see DESIGN.md (sequence
         * numbers settle races with a free of the same address in another thread). */
        .seq = atomic_fetch_add_explicit(&hook_seq, 1, memory_order_relaxed) + 1,
        .addr = (uint64_t)(uintptr_t)p,
        .size = size,
        .sample_size = sample_size,
        .ts_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE),
        .heap_id = 0,
        .tid = hook_tid(t, s),
    };
}

/* Puts sampled address @p in the set free() watches, before its record is written (no
 * other thread can free @p before the hook returns it). False when the set could not
 * take it (every level full, or no memory for the next): the sample is then dropped and
 * counted, so that no free of it can go unrecorded. */
static bool hook_watch_free(struct client_session *s, void *p)
{
    if (HP_LIKELY(client_freeset_insert(&s->freeset, (uint64_t)(uintptr_t)p) == 0))
        return true;
    atomic_fetch_add_explicit(&client_stat_freeset_overflows, 1, memory_order_relaxed);
    ring_count_freeset_full(s->ring);
    return false;
}

/* The record of @p was not written: nothing to watch. */
static void hook_unwatch_free(struct client_session *s, void *p, int r)
{
    (void)client_freeset_remove(&s->freeset, (uint64_t)(uintptr_t)p);
    if (r == -EAGAIN)
        hook_poke_full(s);
}

/* pre: client_session_enter(s) succeeded. */
static HP_NOINLINE void hook_record_alloc(struct client_tls *t, struct client_session *s, void *p,
                                          size_t size, uint64_t sample_size, const uint64_t *regs)
{
    /* The service ended the session (its socket closes next; the session thread ends it). */
    if (hook_foreign_pid(s) || ring_is_detached(s->ring))
        return;
    uint64_t sp = regs[WIRE_REG_RSP];
    uint64_t end, avail;
    uint32_t flags = 0;
    int r = client_stack_lookup(&t->stack, sp, &end);
    if (r == 0) {
        /* glibc puts a thread's descriptor (the TCB, ~2 KiB, at the thread pointer) at
         * the top of its stack mapping: no frame lives there. */
        uint64_t tp = (uint64_t)(uintptr_t)__builtin_thread_pointer();
        if (tp > sp && tp < end)
            end = tp;
        /* On the main thread, what lies above the stack pointer the program started
         * with (argv, the environment, the aux vector: often kilobytes) holds no frame
         * either; a little is kept for the entry code's own frame. */
        uint64_t start_sp = (uint64_t)(uintptr_t)__libc_stack_end + HOOK_ENTRY_SLACK;
        if (start_sp > sp && start_sp < end)
            end = start_sp;
        avail = end - sp;
    } else {
        /* Not the thread's own stack (signal stack, fiber, ucontext), or no answer from
         * /proc: copy what is there, or at least the rest of sp's page (mapped). */
        flags |= WIRE_ALLOC_UNKNOWN_STACK;
        atomic_fetch_add_explicit(&client_stat_unknown_stacks, 1, memory_order_relaxed);
        avail = r > 0 ? end - sp : 4096 - (sp & 4095);
    }
    ring_t *ring = s->ring;
    struct ring_wspan w;

    /* With the service's unwind table, walk the stack here and send its return
     * addresses: a few hundred bytes instead of a copy of the whole stack (often
     * kilobytes), and no unwinding in the service. Every audit_every-th walk is sent
     * with the copy too, for the service to check. */
    uint64_t pcs[CLIENT_WALK_MAX_FRAMES];
    size_t n_pcs = 0;
    bool audit = false;
    if (s->utable.hdr && r == 0 &&
        utable_gen(&s->utable) != atomic_load_explicit(&s->walk_hold_gen, memory_order_relaxed)) {
        n_pcs = client_walk(&s->utable, regs, end, pcs, CLIENT_WALK_MAX_FRAMES);
        audit = n_pcs > 0 && s->audit_every && ++t->walks % s->audit_every == 0;
    }
    if (!hook_watch_free(s, p))
        return;
    if (n_pcs > 0 && !audit) {
        r = ring_try_begin_write(ring, WIRE_ALLOC_PCS, wire_alloc_pcs_len(n_pcs), &w);
        if (r < 0) {
            hook_unwatch_free(s, p, r);
            return;
        }
        struct wire_alloc_head head;
        hook_fill_head(&head, t, s, p, size, sample_size);
        wire_encode_alloc_pcs(w.data, &head, pcs, n_pcs);
        if (ring_end_write(ring, &w))
            hook_poke(s);
        return;
    }

    uint64_t len = avail;
    if (len > s->max_stack_bytes) {
        len = s->max_stack_bytes;
        flags |= WIRE_ALLOC_STACK_TRUNCATED;
    }
    size_t n_audit = audit ? n_pcs : 0;
    r = ring_try_begin_write(ring, WIRE_ALLOC, wire_alloc_len(len, n_audit), &w);
    if (r < 0) {
        hook_unwatch_free(s, p, r);
        return;
    }
    struct wire_alloc_head head;
    hook_fill_head(&head, t, s, p, size, sample_size);
    void *stack = wire_encode_alloc(w.data, &head, sp, len, flags, regs, pcs, n_audit);
    hook_copy_stack(stack, (const void *)(uintptr_t)sp, (size_t)len);
    if (ring_end_write(ring, &w))
        hook_poke(s);
}

/* Records the free of sampled address @p (already taken out of the set). Never waits:
 * free() must not block on the service, whatever block_client says, and this may run in
 * a signal handler that interrupted a hook of this thread, even one writing into the
 * same ring (a reservation is one compare-and-swap; the interrupted record is published
 * when the hook resumes). A free that finds no room is counted as lost: the block stays
 * live in the profile (a phantom leak), and the service says so. */
void client_record_free(struct client_session *s, void *p)
{
    struct client_tls *t = &client_tls;
    int saved_errno = errno;
    bool was_in_hook = t->in_hook, was_in_sample = t->in_sample;

    t->in_hook = true;
    t->in_sample = true;
    if (client_session_enter(s)) {
        if (!hook_foreign_pid(s)) {
            ring_t *ring = s->ring;
            struct ring_wspan w;
            int r = ring_try_begin_write_nowait(ring, WIRE_FREE, sizeof(struct wire_free), &w);
            if (r == 0) {
                wire_encode_free(w.data,
                                 atomic_fetch_add_explicit(&hook_seq, 1, memory_order_relaxed) + 1,
                                 (uint64_t)(uintptr_t)p, 0);
                if (ring_end_write(ring, &w))
                    hook_poke(s);
            } else if (r == -EAGAIN) {
                ring_count_free_lost(ring);
                hook_poke_full(s);
            }
        }
        client_session_leave(s);
    }
    t->in_sample = was_in_sample;
    t->in_hook = was_in_hook;
    errno = saved_errno;
}

/* ---- slow path -------------------------------------------------------------------- */

static void hook_seed_thread(struct client_tls *t, const struct client_session *s)
{
    uint64_t n = atomic_fetch_add_explicit(&client_thread_counter, 1, memory_order_relaxed);
    client_sampler_init(&t->sampler, &s->params, client_seed ^ client_mix64(n + 1));
    t->gen = s->gen;
}

uintptr_t client_alloc_slow(uintptr_t p, size_t size, uintptr_t ret, const uint64_t *regs)
{
    struct client_tls *t = &client_tls;

    if (t->in_hook) {
        if (HP_UNLIKELY(t->in_sample && client_trap_reentry))
            abort();
        return ret;
    }
    t->in_hook = true;
    int saved_errno = errno;

    if (HP_UNLIKELY(atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_UNINIT))
        client_init();
    /* Acquire pairs with the release store publishing the session. */
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    /* Entered before reading the session: its fields stay as they are while we are
     * inside (a slot is reused only once no hook is in it). */
    if (s && client_session_enter(s)) {
        /* Reached because the size is at least the interval (the counter was not
         * touched), the counter ran out (it was), or during a warm-up (it was not, and
         * is still positive). */
        uint64_t sample_size;
        if (t->gen != s->gen) {
            hook_seed_thread(t, s);
            sample_size = client_sampler_step(&t->sampler, &s->params, size);
        } else if (size >= s->params.interval) {
            sample_size = size;
        } else if (t->sampler.bytes_left <= 0) {
            sample_size = client_sampler_refill(&t->sampler, &s->params);
        } else {
            sample_size = client_sampler_step(&t->sampler, &s->params, size);
        }
        if (sample_size > 0 && p != 0) {
            /* Code loaded since the last look gets the hooks in its GOT slots too (only
             * when the allocator comes before us; rate-limited). */
            client_got_check();
            t->in_sample = true;
            hook_record_alloc(t, s, (void *)p, size, sample_size, regs);
            t->in_sample = false;
        }
        client_session_leave(s);
    }

    errno = saved_errno;
    t->in_hook = false;
    return ret;
}

/* ---- dlopen and dlclose -------------------------------------------------------------
 *
 * Loading and unloading code changes what the service must know to name frames, and
 * what the unwind table may say:
 *
 *   dlopen   after it: WIRE_MAPS_CHANGED, so the service rereads the maps before the
 *            new code's first samples (its rate limit on rereads would otherwise leave
 *            a library loaded and unloaded within it unnamed);
 *   dlclose  before it: WIRE_SYNC, and a wait until the service has read it (bounded
 *            by block_client's timeout, else by CLIENT_SYNC_TIMEOUT_US),
 *            so every sample taken while the code was there is named while it still is;
 *            after it: WIRE_MAPS_CHANGED with WIRE_MAPS_UNLOADED, and no walk with the
 *            table until the service started its next generation (other code may come
 *            at the addresses whose rules the table holds).
 *
 * Only with a service that speaks these records (it gave us an unwind table). The
 * wrappers themselves, which call dlsym, are in preload/dl.c: no allocator hook reaches
 * them. */

void client_dl_event(enum client_dl_event ev)
{
    struct client_tls *t = &client_tls;
    if (t->in_hook)
        return;
    t->in_hook = true;
    int saved_errno = errno;
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (s && client_session_enter(s)) {
        if (s->utable.hdr && !hook_foreign_pid(s)) {
            struct ring_wspan w;
            if (ev == CLIENT_DL_CLOSING) {
                if (ring_try_begin_write(s->ring, WIRE_SYNC, 0, &w) == 0) {
                    (void)ring_end_write(s->ring, &w);
                    hook_poke(s);
                    /* Late or gone: the samples before may then miss the code's names. */
                    int late = ring_wait_consumed(s->ring, &w, s->sync_timeout_us);
                    (void)late;
                }
            } else {
                if (ev == CLIENT_DL_CLOSED)
                    atomic_store_explicit(&s->walk_hold_gen, utable_gen(&s->utable),
                                          memory_order_relaxed);
                /* Lost (full ring): the maps are reread at least every second while
                 * samples come, and a reread that finds code gone starts a new
                 * generation, which ends the hold. */
                if (ring_try_begin_write(s->ring, WIRE_MAPS_CHANGED,
                                         sizeof(struct wire_maps_changed), &w) == 0) {
                    wire_encode_maps_changed(w.data,
                                             ev == CLIENT_DL_CLOSED ? WIRE_MAPS_UNLOADED : 0);
                    (void)ring_end_write(s->ring, &w);
                    hook_poke(s);
                }
            }
        }
        client_session_leave(s);
    }
    errno = saved_errno;
    t->in_hook = false;
}

/* ---- the exported entry points ---------------------------------------------------- */

/* True when the allocation is not sampled (one load and a branch while dormant). The slow path is
 * reached by a tail call to the trampoline, so that it sees the application's registers. */
static HP_ALWAYS_INLINE bool hook_unsampled_at(size_t size, uint64_t interval)
{
    return HP_LIKELY(size < interval) &&
           HP_LIKELY((client_tls.sampler.bytes_left -= (int64_t)size) > 0);
}

static HP_ALWAYS_INLINE bool hook_unsampled(size_t size)
{
    return hook_unsampled_at(size,
                             atomic_load_explicit(&client_fast_interval, memory_order_relaxed));
}

/* Dormant or passthrough: the exported functions then jump straight to the allocator (no
 * frame). A session starting between this test and the allocation only misses that
 * allocation. */
static HP_ALWAYS_INLINE bool hook_off(void)
{
    return atomic_load_explicit(&client_fast_interval, memory_order_relaxed) == CLIENT_FAST_OFF;
}

/* While a session is active: records the free of a sampled address, before the real
 * free (see hook_realloc). Also from a signal handler that interrupted one of our hooks:
 * client_record_free() never waits, and counts what it cannot record. */
static HP_ALWAYS_INLINE void hook_free_watched(struct client_session *s, void *p)
{
    if (client_freeset_remove(&s->freeset, (uint64_t)(uintptr_t)p))
        client_record_free(s, p);
}

static HP_ALWAYS_INLINE void hook_before_free(void *p)
{
    /* Acquire pairs with the release store publishing the session (its set is mapped). */
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (HP_UNLIKELY(s != NULL))
        hook_free_watched(s, p);
}

/* Out of line, so that free() needs no stack frame on its common paths: every path of
 * free() ends in a tail call. */
static HP_NOINLINE void hook_free_active(struct client_session *s, void *p)
{
    hook_free_watched(s, p);
    CLIENT_REAL(FREE, client_free_fn)(p);
}

/* The sampled case of malloc(), out of line so that malloc() itself needs no frame: it
 * is reached by a tail call, and tail-calls the trampoline in turn. */
static HP_NOINLINE void *hook_malloc_sampled(size_t size)
{
    void *p = CLIENT_REAL(MALLOC, client_malloc_fn)(size);
    return client_sample_tramp(p, size, p);
}

static void *hook_malloc(size_t size)
{
    /* The sampler counts the bytes before the allocation is made: an unsampled malloc()
     * is a tail call to the allocator's. (A failed allocation still counts; it is not
     * recorded.) */
    uint64_t interval = atomic_load_explicit(&client_fast_interval, memory_order_relaxed);
    if (interval == CLIENT_FAST_OFF || hook_unsampled_at(size, interval))
        return CLIENT_REAL(MALLOC, client_malloc_fn)(size);
    return hook_malloc_sampled(size);
}

/* True when the free of @p need not be looked at: no session, or certainly unsampled. */
static HP_ALWAYS_INLINE bool hook_free_unwatched(struct client_session *s, void *p)
{
    return HP_LIKELY(s == NULL) ||
           HP_LIKELY(!client_freeset_maybe(&s->freeset, (uint64_t)(uintptr_t)p));
}

static void hook_free(void *p)
{
    /* Acquire pairs with the release store publishing the session (its set is mapped). */
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (hook_free_unwatched(s, p))
        CLIENT_REAL(FREE, client_free_fn)(p);
    else
        hook_free_active(s, p);
}

/* C23's sized frees: recorded like free(), then passed on with their arguments (the
 * allocator may use the size; preload/alloc.c gives free() one that lacks them). */
static HP_NOINLINE void hook_free_sized_active(struct client_session *s, void *p, size_t size)
{
    hook_free_watched(s, p);
    CLIENT_REAL(FREE_SIZED, client_free_sized_fn)(p, size);
}

static void hook_free_sized(void *p, size_t size)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (hook_free_unwatched(s, p))
        CLIENT_REAL(FREE_SIZED, client_free_sized_fn)(p, size);
    else
        hook_free_sized_active(s, p, size);
}

static HP_NOINLINE void hook_free_aligned_sized_active(struct client_session *s, void *p,
                                                       size_t alignment, size_t size)
{
    hook_free_watched(s, p);
    CLIENT_REAL(FREE_ALIGNED_SIZED, client_free_aligned_sized_fn)(p, alignment, size);
}

static void hook_free_aligned_sized(void *p, size_t alignment, size_t size)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (hook_free_unwatched(s, p))
        CLIENT_REAL(FREE_ALIGNED_SIZED, client_free_aligned_sized_fn)(p, alignment, size);
    else
        hook_free_aligned_sized_active(s, p, alignment, size);
}

static void *hook_calloc(size_t n, size_t size)
{
    if (hook_off())
        return CLIENT_REAL(CALLOC, client_calloc_fn)(n, size);
    void *p = CLIENT_REAL(CALLOC, client_calloc_fn)(n, size);
    /* No overflow when the call succeeded (the allocator fails with ENOMEM otherwise). */
    if (!p || hook_unsampled(n * size))
        return p;
    return client_sample_tramp(p, n * size, p);
}

static HP_ALWAYS_INLINE bool hook_realloc_off(void)
{
    return hook_off() && !atomic_load_explicit(&client_current, memory_order_relaxed);
}

/* The old block is recorded as freed before it really is, so that a reuse of its address
 * by another thread gets a later sequence number. If the reallocation then fails, the
 * block stays live but unrecorded (an underestimate, only under OOM). realloc(p, 0) that
 * frees p and returns NULL records nothing more. */
static HP_ALWAYS_INLINE void *hook_do_realloc(void *p, size_t size)
{
    if (hook_realloc_off())
        return CLIENT_REAL(REALLOC, client_realloc_fn)(p, size);
    hook_before_free(p);
    void *q = CLIENT_REAL(REALLOC, client_realloc_fn)(p, size);
    if (!q || hook_unsampled(size))
        return q;
    return client_sample_tramp(q, size, q);
}

static void *hook_realloc(void *p, size_t size)
{
    return hook_do_realloc(p, size);
}

/* reallocarray is realloc with an overflow check, whatever the allocator: its own may
 * call realloc through the PLT (glibc's does), which would reach hook_realloc and record
 * the block twice. */
static void *hook_reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return hook_do_realloc(p, bytes);
}

static void *hook_memalign(size_t alignment, size_t size)
{
    if (hook_off())
        return CLIENT_REAL(MEMALIGN, client_memalign_fn)(alignment, size);
    void *p = CLIENT_REAL(MEMALIGN, client_memalign_fn)(alignment, size);
    if (!p || hook_unsampled(size))
        return p;
    return client_sample_tramp(p, size, p);
}

/* The allocator's own aligned_alloc: its checks are the program's (glibc 2.36 takes any
 * alignment, 2.38 refuses one that is not a power of two). */
static void *hook_aligned_alloc(size_t alignment, size_t size)
{
    if (hook_off())
        return CLIENT_REAL(ALIGNED_ALLOC, client_memalign_fn)(alignment, size);
    void *p = CLIENT_REAL(ALIGNED_ALLOC, client_memalign_fn)(alignment, size);
    if (!p || hook_unsampled(size))
        return p;
    return client_sample_tramp(p, size, p);
}

static int hook_posix_memalign(void **memptr, size_t alignment, size_t size)
{
    if (hook_off())
        return CLIENT_REAL(POSIX_MEMALIGN, client_posix_memalign_fn)(memptr, alignment, size);
    int r = CLIENT_REAL(POSIX_MEMALIGN, client_posix_memalign_fn)(memptr, alignment, size);
    if (r != 0 || hook_unsampled(size))
        return r;
    return client_sample_tramp_int(*memptr, size, 0);
}

static void *hook_valloc(size_t size)
{
    if (hook_off())
        return CLIENT_REAL(VALLOC, client_malloc_fn)(size);
    void *p = CLIENT_REAL(VALLOC, client_malloc_fn)(size);
    if (!p || hook_unsampled(size))
        return p;
    return client_sample_tramp(p, size, p);
}

/* pvalloc allocates whole pages (one for 0): those are the bytes sampled. */
static void *hook_pvalloc(size_t size)
{
    if (hook_off())
        return CLIENT_REAL(PVALLOC, client_malloc_fn)(size);
    void *p = CLIENT_REAL(PVALLOC, client_malloc_fn)(size);
    if (!p)
        return p;
    size_t page = (size_t)getpagesize();
    size_t bytes = size ? HP_ALIGN_UP(size, page) : page;
    if (hook_unsampled(bytes))
        return p;
    return client_sample_tramp(p, bytes, p);
}

/* The exported names are aliases: inside this library the local names always mean our
 * hooks, even when the global names resolve to an allocator loaded before us. */
HP_EXPORT void *malloc(size_t size) __attribute__((alias("hook_malloc")));
HP_EXPORT void free(void *p) __attribute__((alias("hook_free")));
HP_EXPORT void *calloc(size_t n, size_t size) __attribute__((alias("hook_calloc")));
HP_EXPORT void *realloc(void *p, size_t size) __attribute__((alias("hook_realloc")));
HP_EXPORT void *reallocarray(void *p, size_t n, size_t size)
    __attribute__((alias("hook_reallocarray")));
HP_EXPORT void *memalign(size_t alignment, size_t size) __attribute__((alias("hook_memalign")));
HP_EXPORT void *aligned_alloc(size_t alignment, size_t size)
    __attribute__((alias("hook_aligned_alloc")));
HP_EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size)
    __attribute__((alias("hook_posix_memalign")));
HP_EXPORT void *valloc(size_t size) __attribute__((alias("hook_valloc")));
HP_EXPORT void *pvalloc(size_t size) __attribute__((alias("hook_pvalloc")));
HP_EXPORT void free_sized(void *p, size_t size) __attribute__((alias("hook_free_sized")));
HP_EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size)
    __attribute__((alias("hook_free_aligned_sized")));

#define HOOK_FN(f) ((client_fn_t)(f))
const client_fn_t client_hook_fns[CLIENT_N_FN] = {
    [CLIENT_FN_MALLOC] = HOOK_FN(hook_malloc),
    [CLIENT_FN_FREE] = HOOK_FN(hook_free),
    [CLIENT_FN_CALLOC] = HOOK_FN(hook_calloc),
    [CLIENT_FN_REALLOC] = HOOK_FN(hook_realloc),
    [CLIENT_FN_REALLOCARRAY] = HOOK_FN(hook_reallocarray),
    [CLIENT_FN_MEMALIGN] = HOOK_FN(hook_memalign),
    [CLIENT_FN_ALIGNED_ALLOC] = HOOK_FN(hook_aligned_alloc),
    [CLIENT_FN_POSIX_MEMALIGN] = HOOK_FN(hook_posix_memalign),
    [CLIENT_FN_VALLOC] = HOOK_FN(hook_valloc),
    [CLIENT_FN_PVALLOC] = HOOK_FN(hook_pvalloc),
    [CLIENT_FN_FREE_SIZED] = HOOK_FN(hook_free_sized),
    [CLIENT_FN_FREE_ALIGNED_SIZED] = HOOK_FN(hook_free_aligned_sized),
};
