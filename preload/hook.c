/* preload/hook.c: the exported malloc family and C++'s operators new and delete. What
 * happens when an allocation is sampled is in preload/record.c.
 *
 * Hook-safe throughout: no allocation, no stdio, no locks of ours and no system call
 * here; the sampled path (preload/record.c) says which system calls and which lock it
 * takes. errno is preserved around everything we do besides the real call.
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
 * symbols then resolve to the allocator's, even inside this library). The hooks of C++'s
 * operators new and delete are never exported, only installed in GOT slots, when the
 * allocator defines the program's operator new (preload/alloc.h).
 */
#include "preload/client.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/macros.h"
#include "preload/alloc.h"

__thread struct client_tls client_tls __attribute__((tls_model("initial-exec")));

/* ---- the exported entry points ---------------------------------------------------- */

/* malloc() and free() start on a cache line, so that each one's fast path (under 64
 * bytes) sits in one line and one fetch wherever the linker places this file: one that
 * straddled two lines cost a cycle per malloc/free pair in bench_client. */
#define HOOK_LINE_ALIGNED __attribute__((aligned(64)))

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
    uint64_t a = (uint64_t)(uintptr_t)p;
    /* In a batch (client.h): the entry turns PENDING, the free is recorded later. */
    if (atomic_load_explicit(&s->frees_batched, memory_order_relaxed) &&
        (a & ~CLIENT_FREESET_ADDR_BITS) == 0) {
        client_free_batched(s, a);
    } else if (client_freeset_remove(&s->freeset, a)) {
        client_record_free(s, 0, a);
    }
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

HOOK_LINE_ALIGNED static void *hook_malloc(size_t size)
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

HOOK_LINE_ALIGNED static void hook_free(void *p)
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

/* ---- C++'s operators new and delete ----------------------------------------------- */

/* Installed only in GOT slots, and only when the program's operator new is the
 * allocator's own (client_alloc_cxx, preload/alloc.h): jemalloc's, tcmalloc's and
 * mimalloc's never call malloc. Never exported: libstdc++'s and libc++'s operators call
 * malloc, whose hook counts their blocks already.
 *
 * Each new hook calls the allocator's operator before touching any state of ours: a
 * throwing operator new (std::bad_alloc, after the program's new_handler gave up) unwinds
 * through the hook's frame, which has unwind information like all our code and nothing to
 * clean up, and leaves no flag set and no byte counted. The block is then sampled as a
 * malloc() block is, the trampoline reached by a tail call so that the stack starts at the
 * program's call. A nothrow operator's NULL is not recorded. Each delete hook takes a
 * sampled block out of the set and records its free before the allocator's delete. */
static HP_ALWAYS_INLINE void *hook_new_done(void *p, size_t size)
{
    if (!p || hook_unsampled(size))
        return p;
    return client_sample_tramp(p, size, p);
}

#define HOOK_CXX_NEW(name, fn, type, params, args)                                                 \
    static void *name params                                                                       \
    {                                                                                              \
        if (hook_off())                                                                            \
            return CLIENT_REAL(fn, type) args;                                                     \
        return hook_new_done(CLIENT_REAL(fn, type) args, size);                                    \
    }

HOOK_CXX_NEW(hook_new, CXX_NEW, client_malloc_fn, (size_t size), (size))
HOOK_CXX_NEW(hook_new_array, CXX_NEW_ARRAY, client_malloc_fn, (size_t size), (size))
HOOK_CXX_NEW(hook_new_nothrow, CXX_NEW_NOTHROW, client_new_nothrow_fn,
             (size_t size, const void *nt), (size, nt))
HOOK_CXX_NEW(hook_new_array_nothrow, CXX_NEW_ARRAY_NOTHROW, client_new_nothrow_fn,
             (size_t size, const void *nt), (size, nt))
HOOK_CXX_NEW(hook_new_aligned, CXX_NEW_ALIGNED, client_new_aligned_fn,
             (size_t size, size_t alignment), (size, alignment))
HOOK_CXX_NEW(hook_new_array_aligned, CXX_NEW_ARRAY_ALIGNED, client_new_aligned_fn,
             (size_t size, size_t alignment), (size, alignment))
HOOK_CXX_NEW(hook_new_aligned_nothrow, CXX_NEW_ALIGNED_NOTHROW, client_new_aligned_nothrow_fn,
             (size_t size, size_t alignment, const void *nt), (size, alignment, nt))
HOOK_CXX_NEW(hook_new_array_aligned_nothrow, CXX_NEW_ARRAY_ALIGNED_NOTHROW,
             client_new_aligned_nothrow_fn, (size_t size, size_t alignment, const void *nt),
             (size, alignment, nt))

/* Out of line: the common delete is a check and a tail call. */
static HP_NOINLINE void hook_delete_watched(struct client_session *s, void *p)
{
    hook_free_watched(s, p);
}

#define HOOK_CXX_DELETE(name, fn, type, params, args)                                              \
    static void name params                                                                        \
    {                                                                                              \
        struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);    \
        if (!hook_free_unwatched(s, p))                                                            \
            hook_delete_watched(s, p);                                                             \
        CLIENT_REAL(fn, type) args;                                                                \
    }

HOOK_CXX_DELETE(hook_delete, CXX_DELETE, client_delete_fn, (void *p), (p))
HOOK_CXX_DELETE(hook_delete_array, CXX_DELETE_ARRAY, client_delete_fn, (void *p), (p))
HOOK_CXX_DELETE(hook_delete_sized, CXX_DELETE_SIZED, client_delete_sized_fn, (void *p, size_t size),
                (p, size))
HOOK_CXX_DELETE(hook_delete_array_sized, CXX_DELETE_ARRAY_SIZED, client_delete_sized_fn,
                (void *p, size_t size), (p, size))
HOOK_CXX_DELETE(hook_delete_aligned, CXX_DELETE_ALIGNED, client_delete_sized_fn,
                (void *p, size_t alignment), (p, alignment))
HOOK_CXX_DELETE(hook_delete_array_aligned, CXX_DELETE_ARRAY_ALIGNED, client_delete_sized_fn,
                (void *p, size_t alignment), (p, alignment))
HOOK_CXX_DELETE(hook_delete_sized_aligned, CXX_DELETE_SIZED_ALIGNED, client_delete_sized_aligned_fn,
                (void *p, size_t size, size_t alignment), (p, size, alignment))
HOOK_CXX_DELETE(hook_delete_array_sized_aligned, CXX_DELETE_ARRAY_SIZED_ALIGNED,
                client_delete_sized_aligned_fn, (void *p, size_t size, size_t alignment),
                (p, size, alignment))
HOOK_CXX_DELETE(hook_delete_nothrow, CXX_DELETE_NOTHROW, client_delete_nothrow_fn,
                (void *p, const void *nt), (p, nt))
HOOK_CXX_DELETE(hook_delete_array_nothrow, CXX_DELETE_ARRAY_NOTHROW, client_delete_nothrow_fn,
                (void *p, const void *nt), (p, nt))
HOOK_CXX_DELETE(hook_delete_aligned_nothrow, CXX_DELETE_ALIGNED_NOTHROW,
                client_delete_aligned_nothrow_fn, (void *p, size_t alignment, const void *nt),
                (p, alignment, nt))
HOOK_CXX_DELETE(hook_delete_array_aligned_nothrow, CXX_DELETE_ARRAY_ALIGNED_NOTHROW,
                client_delete_aligned_nothrow_fn, (void *p, size_t alignment, const void *nt),
                (p, alignment, nt))

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
    [CLIENT_FN_CXX_NEW] = HOOK_FN(hook_new),
    [CLIENT_FN_CXX_NEW_ARRAY] = HOOK_FN(hook_new_array),
    [CLIENT_FN_CXX_NEW_NOTHROW] = HOOK_FN(hook_new_nothrow),
    [CLIENT_FN_CXX_NEW_ARRAY_NOTHROW] = HOOK_FN(hook_new_array_nothrow),
    [CLIENT_FN_CXX_NEW_ALIGNED] = HOOK_FN(hook_new_aligned),
    [CLIENT_FN_CXX_NEW_ARRAY_ALIGNED] = HOOK_FN(hook_new_array_aligned),
    [CLIENT_FN_CXX_NEW_ALIGNED_NOTHROW] = HOOK_FN(hook_new_aligned_nothrow),
    [CLIENT_FN_CXX_NEW_ARRAY_ALIGNED_NOTHROW] = HOOK_FN(hook_new_array_aligned_nothrow),
    [CLIENT_FN_CXX_DELETE] = HOOK_FN(hook_delete),
    [CLIENT_FN_CXX_DELETE_ARRAY] = HOOK_FN(hook_delete_array),
    [CLIENT_FN_CXX_DELETE_SIZED] = HOOK_FN(hook_delete_sized),
    [CLIENT_FN_CXX_DELETE_ARRAY_SIZED] = HOOK_FN(hook_delete_array_sized),
    [CLIENT_FN_CXX_DELETE_ALIGNED] = HOOK_FN(hook_delete_aligned),
    [CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED] = HOOK_FN(hook_delete_array_aligned),
    [CLIENT_FN_CXX_DELETE_SIZED_ALIGNED] = HOOK_FN(hook_delete_sized_aligned),
    [CLIENT_FN_CXX_DELETE_ARRAY_SIZED_ALIGNED] = HOOK_FN(hook_delete_array_sized_aligned),
    [CLIENT_FN_CXX_DELETE_NOTHROW] = HOOK_FN(hook_delete_nothrow),
    [CLIENT_FN_CXX_DELETE_ARRAY_NOTHROW] = HOOK_FN(hook_delete_array_nothrow),
    [CLIENT_FN_CXX_DELETE_ALIGNED_NOTHROW] = HOOK_FN(hook_delete_aligned_nothrow),
    [CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED_NOTHROW] = HOOK_FN(hook_delete_array_aligned_nothrow),
};
