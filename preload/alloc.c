/* preload/alloc.c: finding the program's allocator, and the functions it lacks. See
 * alloc.h. Hook-safe: reads loaded objects' dynamic sections, no allocation, no dlsym. */
#include "preload/alloc.h"

#include <errno.h>
#include <link.h>
#include <string.h>
#include <unistd.h>

#include "common/macros.h"
#include "preload/client.h"
#include "preload/elfobj.h"
#include "preload/got.h"

const char *const client_fn_names[CLIENT_N_FN] = {
    [CLIENT_FN_MALLOC] = "malloc",
    [CLIENT_FN_FREE] = "free",
    [CLIENT_FN_CALLOC] = "calloc",
    [CLIENT_FN_REALLOC] = "realloc",
    [CLIENT_FN_REALLOCARRAY] = "reallocarray",
    [CLIENT_FN_MEMALIGN] = "memalign",
    [CLIENT_FN_ALIGNED_ALLOC] = "aligned_alloc",
    [CLIENT_FN_POSIX_MEMALIGN] = "posix_memalign",
    [CLIENT_FN_VALLOC] = "valloc",
    [CLIENT_FN_PVALLOC] = "pvalloc",
    [CLIENT_FN_FREE_SIZED] = "free_sized",
    [CLIENT_FN_FREE_ALIGNED_SIZED] = "free_aligned_sized",
    [CLIENT_FN_CXX_NEW] = "_Znwm",
    [CLIENT_FN_CXX_NEW_ARRAY] = "_Znam",
    [CLIENT_FN_CXX_NEW_NOTHROW] = "_ZnwmRKSt9nothrow_t",
    [CLIENT_FN_CXX_NEW_ARRAY_NOTHROW] = "_ZnamRKSt9nothrow_t",
    [CLIENT_FN_CXX_NEW_ALIGNED] = "_ZnwmSt11align_val_t",
    [CLIENT_FN_CXX_NEW_ARRAY_ALIGNED] = "_ZnamSt11align_val_t",
    [CLIENT_FN_CXX_NEW_ALIGNED_NOTHROW] = "_ZnwmSt11align_val_tRKSt9nothrow_t",
    [CLIENT_FN_CXX_NEW_ARRAY_ALIGNED_NOTHROW] = "_ZnamSt11align_val_tRKSt9nothrow_t",
    [CLIENT_FN_CXX_DELETE] = "_ZdlPv",
    [CLIENT_FN_CXX_DELETE_ARRAY] = "_ZdaPv",
    [CLIENT_FN_CXX_DELETE_SIZED] = "_ZdlPvm",
    [CLIENT_FN_CXX_DELETE_ARRAY_SIZED] = "_ZdaPvm",
    [CLIENT_FN_CXX_DELETE_ALIGNED] = "_ZdlPvSt11align_val_t",
    [CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED] = "_ZdaPvSt11align_val_t",
    [CLIENT_FN_CXX_DELETE_SIZED_ALIGNED] = "_ZdlPvmSt11align_val_t",
    [CLIENT_FN_CXX_DELETE_ARRAY_SIZED_ALIGNED] = "_ZdaPvmSt11align_val_t",
    [CLIENT_FN_CXX_DELETE_NOTHROW] = "_ZdlPvRKSt9nothrow_t",
    [CLIENT_FN_CXX_DELETE_ARRAY_NOTHROW] = "_ZdaPvRKSt9nothrow_t",
    [CLIENT_FN_CXX_DELETE_ALIGNED_NOTHROW] = "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    [CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED_NOTHROW] = "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

client_fn_t client_alloc_own[CLIENT_N_FN];
_Atomic int client_alloc_route = CLIENT_ROUTE_UNRESOLVED;
bool client_alloc_cxx;

/* 0: nothing published yet; 1: one thread is publishing client_alloc_own and the route;
 * 2: done (release: client_alloc_own is complete). */
static _Atomic int alloc_state;
/* Set while this thread resolves: a hook called now (from the resolving code itself or
 * a signal handler) is served from the bootstrap buffer. */
static __thread bool alloc_resolving __attribute__((tls_model("initial-exec")));
static size_t alloc_page = 4096;

/* Last resort when no loaded object defines malloc (which glibc always does). */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *p);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

/* ---- the bootstrap buffer ------------------------------------------------------------ */

#define ALLOC_BOOT_BYTES (64u << 10)
#define ALLOC_BOOT_HDR 16u
static _Alignas(4096) char alloc_boot[ALLOC_BOOT_BYTES];
static _Atomic size_t alloc_boot_used;

static bool alloc_boot_owns(const void *p)
{
    return (uintptr_t)p - (uintptr_t)alloc_boot < ALLOC_BOOT_BYTES;
}

static size_t alloc_boot_size(const void *p)
{
    size_t n;
    memcpy(&n, (const char *)p - sizeof(n), sizeof(n));
    return n;
}

/* Never reused, so its bytes are zero (calloc). NULL with ENOMEM when full. */
static void *alloc_boot_get(size_t size, size_t align)
{
    align = HP_MAX(align, (size_t)ALLOC_BOOT_HDR);
    if (size > ALLOC_BOOT_BYTES || align > 4096 || (align & (align - 1)) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    size_t off = atomic_load_explicit(&alloc_boot_used, memory_order_relaxed), start, end;
    do {
        start = HP_ALIGN_UP(off + ALLOC_BOOT_HDR, align);
        end = start + HP_ALIGN_UP(HP_MAX(size, (size_t)1), (size_t)ALLOC_BOOT_HDR);
        if (end > ALLOC_BOOT_BYTES) {
            errno = ENOMEM;
            return NULL;
        }
    } while (!atomic_compare_exchange_weak_explicit(&alloc_boot_used, &off, end,
                                                    memory_order_relaxed, memory_order_relaxed));
    memcpy(alloc_boot + start - sizeof(size), &size, sizeof(size));
    return alloc_boot + start;
}

static void *alloc_boot_realloc(void *p, size_t size)
{
    void *q = alloc_boot_get(size, ALLOC_BOOT_HDR);
    if (q && p && alloc_boot_owns(p))
        memcpy(q, p, HP_MIN(size, alloc_boot_size(p)));
    return q;
}

static bool alloc_mul(size_t n, size_t size, size_t *ret)
{
    if (__builtin_mul_overflow(n, size, ret)) {
        errno = ENOMEM;
        return false;
    }
    return true;
}

/* ---- bootstrap entries: resolve, then call the resolved function ------------------------ */

static void *boot_malloc(size_t size)
{
    if (alloc_resolving)
        return alloc_boot_get(size, ALLOC_BOOT_HDR);
    client_alloc_resolve();
    return CLIENT_REAL(MALLOC, client_malloc_fn)(size);
}

static void boot_free(void *p)
{
    if (alloc_resolving)
        return; /* only bootstrap blocks can exist yet: kept */
    client_alloc_resolve();
    CLIENT_REAL(FREE, client_free_fn)(p);
}

static void *boot_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (alloc_resolving)
        return alloc_mul(n, size, &bytes) ? alloc_boot_get(bytes, ALLOC_BOOT_HDR) : NULL;
    client_alloc_resolve();
    return CLIENT_REAL(CALLOC, client_calloc_fn)(n, size);
}

static void *boot_realloc(void *p, size_t size)
{
    if (alloc_resolving)
        return alloc_boot_realloc(p, size);
    client_alloc_resolve();
    return CLIENT_REAL(REALLOC, client_realloc_fn)(p, size);
}

static void *boot_reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (alloc_resolving)
        return alloc_mul(n, size, &bytes) ? alloc_boot_realloc(p, bytes) : NULL;
    client_alloc_resolve();
    return CLIENT_REAL(REALLOCARRAY, client_reallocarray_fn)(p, n, size);
}

static void *boot_memalign(size_t alignment, size_t size)
{
    if (alloc_resolving)
        return alloc_boot_get(size, alignment);
    client_alloc_resolve();
    return CLIENT_REAL(MEMALIGN, client_memalign_fn)(alignment, size);
}

static void *boot_aligned_alloc(size_t alignment, size_t size)
{
    if (alloc_resolving)
        return alloc_boot_get(size, alignment);
    client_alloc_resolve();
    return CLIENT_REAL(ALIGNED_ALLOC, client_memalign_fn)(alignment, size);
}

static int boot_posix_memalign(void **ret, size_t alignment, size_t size)
{
    if (alloc_resolving) {
        void *p = alloc_boot_get(size, alignment);
        if (!p)
            return ENOMEM;
        *ret = p;
        return 0;
    }
    client_alloc_resolve();
    return CLIENT_REAL(POSIX_MEMALIGN, client_posix_memalign_fn)(ret, alignment, size);
}

static void *boot_valloc(size_t size)
{
    if (alloc_resolving)
        return alloc_boot_get(size, 4096);
    client_alloc_resolve();
    return CLIENT_REAL(VALLOC, client_malloc_fn)(size);
}

static void *boot_pvalloc(size_t size)
{
    if (alloc_resolving)
        return alloc_boot_get(HP_ALIGN_UP(HP_MAX(size, (size_t)1), (size_t)4096), 4096);
    client_alloc_resolve();
    return CLIENT_REAL(PVALLOC, client_malloc_fn)(size);
}

static void boot_free_sized(void *p, size_t size)
{
    if (alloc_resolving)
        return;
    client_alloc_resolve();
    CLIENT_REAL(FREE_SIZED, client_free_sized_fn)(p, size);
}

static void boot_free_aligned_sized(void *p, size_t alignment, size_t size)
{
    if (alloc_resolving)
        return;
    client_alloc_resolve();
    CLIENT_REAL(FREE_ALIGNED_SIZED, client_free_aligned_sized_fn)(p, alignment, size);
}

#define BOOT(fn) ((client_fn_t)(fn))
/* The bootstrap entries, by enum client_fn: what client_real starts with, and what
 * alloc_publish() replaces. */
#define ALLOC_BOOT_TABLE                                                                           \
    {                                                                                              \
        [CLIENT_FN_MALLOC] = BOOT(boot_malloc), [CLIENT_FN_FREE] = BOOT(boot_free),                \
        [CLIENT_FN_CALLOC] = BOOT(boot_calloc), [CLIENT_FN_REALLOC] = BOOT(boot_realloc),          \
        [CLIENT_FN_REALLOCARRAY] = BOOT(boot_reallocarray),                                        \
        [CLIENT_FN_MEMALIGN] = BOOT(boot_memalign),                                                \
        [CLIENT_FN_ALIGNED_ALLOC] = BOOT(boot_aligned_alloc),                                      \
        [CLIENT_FN_POSIX_MEMALIGN] = BOOT(boot_posix_memalign),                                    \
        [CLIENT_FN_VALLOC] = BOOT(boot_valloc), [CLIENT_FN_PVALLOC] = BOOT(boot_pvalloc),          \
        [CLIENT_FN_FREE_SIZED] = BOOT(boot_free_sized),                                            \
        [CLIENT_FN_FREE_ALIGNED_SIZED] = BOOT(boot_free_aligned_sized),                            \
    }
static const client_fn_t alloc_boot_fns[CLIENT_N_FN] = ALLOC_BOOT_TABLE;
_Atomic(client_fn_t) client_real[CLIENT_N_FN] = ALLOC_BOOT_TABLE;

/* ---- what the allocator lacks, built on what it has ------------------------------------- */

/* The allocator's own functions, for the fallbacks and the bootstrap-aware wrappers
 * (written before any of those is published; read with acquire). */
static _Atomic(client_fn_t) alloc_base[CLIENT_N_FN];
#define BASE(fn, type)                                                                             \
    ((type)atomic_load_explicit(&alloc_base[CLIENT_FN_##fn], memory_order_acquire))

static void *fb_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (!alloc_mul(n, size, &bytes))
        return NULL;
    void *p = CLIENT_REAL(MALLOC, client_malloc_fn)(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

static void *fb_reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (!alloc_mul(n, size, &bytes))
        return NULL;
    return CLIENT_REAL(REALLOC, client_realloc_fn)(p, bytes);
}

/* memalign from posix_memalign or aligned_alloc, with glibc's rounding of the alignment
 * (up to a power of two, at least a pointer). Without either: ENOMEM (an aligned block
 * cannot be carved out of malloc without another allocator freeing it). */
static void *fb_memalign(size_t alignment, size_t size)
{
    size_t a = sizeof(void *);
    while (a < alignment && a <= (SIZE_MAX >> 1))
        a <<= 1;
    client_posix_memalign_fn pm = BASE(POSIX_MEMALIGN, client_posix_memalign_fn);
    if (pm) {
        void *p = NULL;
        int r = pm(&p, a, size);
        if (r != 0) {
            errno = r;
            return NULL;
        }
        return p;
    }
    client_memalign_fn aa = BASE(ALIGNED_ALLOC, client_memalign_fn);
    size_t rounded;
    if (aa && size <= SIZE_MAX - a) {
        /* C11 asks for a size that is a multiple of the alignment. */
        rounded = HP_ALIGN_UP(size, a);
        return aa(a, rounded);
    }
    errno = ENOMEM;
    return NULL;
}

static void *fb_aligned_alloc(size_t alignment, size_t size)
{
    return CLIENT_REAL(MEMALIGN, client_memalign_fn)(alignment, size);
}

static int fb_posix_memalign(void **ret, size_t alignment, size_t size)
{
    /* glibc's checks: a power-of-two multiple of sizeof(void *); errno untouched. */
    size_t w = alignment / sizeof(void *);
    if (alignment % sizeof(void *) != 0 || w == 0 || (w & (w - 1)) != 0)
        return EINVAL;
    int saved = errno;
    void *p = CLIENT_REAL(MEMALIGN, client_memalign_fn)(alignment, size);
    errno = saved;
    if (!p)
        return ENOMEM;
    *ret = p;
    return 0;
}

static void *fb_valloc(size_t size)
{
    return CLIENT_REAL(MEMALIGN, client_memalign_fn)(alloc_page, size);
}

static void *fb_pvalloc(size_t size)
{
    /* glibc: the size rounded up to whole pages, one page for 0; ENOMEM on overflow. */
    if (size > SIZE_MAX - alloc_page) {
        errno = ENOMEM;
        return NULL;
    }
    size_t rounded = size ? HP_ALIGN_UP(size, alloc_page) : alloc_page;
    return CLIENT_REAL(MEMALIGN, client_memalign_fn)(alloc_page, rounded);
}

static void fb_free_sized(void *p, size_t size)
{
    (void)size;
    CLIENT_REAL(FREE, client_free_fn)(p);
}

static void fb_free_aligned_sized(void *p, size_t alignment, size_t size)
{
    (void)alignment;
    (void)size;
    CLIENT_REAL(FREE, client_free_fn)(p);
}

static const client_fn_t alloc_fallback_fns[CLIENT_N_FN] = {
    [CLIENT_FN_CALLOC] = BOOT(fb_calloc),
    [CLIENT_FN_REALLOCARRAY] = BOOT(fb_reallocarray),
    [CLIENT_FN_MEMALIGN] = BOOT(fb_memalign),
    [CLIENT_FN_ALIGNED_ALLOC] = BOOT(fb_aligned_alloc),
    [CLIENT_FN_POSIX_MEMALIGN] = BOOT(fb_posix_memalign),
    [CLIENT_FN_VALLOC] = BOOT(fb_valloc),
    [CLIENT_FN_PVALLOC] = BOOT(fb_pvalloc),
    [CLIENT_FN_FREE_SIZED] = BOOT(fb_free_sized),
    [CLIENT_FN_FREE_ALIGNED_SIZED] = BOOT(fb_free_aligned_sized),
};

/* ---- bootstrap blocks met after resolving ------------------------------------------------ */

static void bw_free(void *p)
{
    if (!alloc_boot_owns(p))
        BASE(FREE, client_free_fn)(p);
}

static void *bw_realloc(void *p, size_t size)
{
    if (!alloc_boot_owns(p))
        return BASE(REALLOC, client_realloc_fn)(p, size);
    void *q = CLIENT_REAL(MALLOC, client_malloc_fn)(size);
    if (q)
        memcpy(q, p, HP_MIN(size, alloc_boot_size(p)));
    return q;
}

static void *bw_reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (!alloc_boot_owns(p))
        return BASE(REALLOCARRAY, client_reallocarray_fn)(p, n, size);
    return alloc_mul(n, size, &bytes) ? bw_realloc(p, bytes) : NULL;
}

static void bw_free_sized(void *p, size_t size)
{
    if (!alloc_boot_owns(p))
        BASE(FREE_SIZED, client_free_sized_fn)(p, size);
}

static void bw_free_aligned_sized(void *p, size_t alignment, size_t size)
{
    if (!alloc_boot_owns(p))
        BASE(FREE_ALIGNED_SIZED, client_free_aligned_sized_fn)(p, alignment, size);
}

static const client_fn_t alloc_boot_aware_fns[CLIENT_N_FN] = {
    [CLIENT_FN_FREE] = BOOT(bw_free),
    [CLIENT_FN_REALLOC] = BOOT(bw_realloc),
    [CLIENT_FN_REALLOCARRAY] = BOOT(bw_reallocarray),
    [CLIENT_FN_FREE_SIZED] = BOOT(bw_free_sized),
    [CLIENT_FN_FREE_ALIGNED_SIZED] = BOOT(bw_free_aligned_sized),
};

/* ---- resolving ------------------------------------------------------------------------ */

struct alloc_scan {
    unsigned index;      /* objects seen so far */
    unsigned self_index; /* libheapprof.so's position */
    unsigned alloc_index;
    unsigned cxx_index; /* the first object defining operator new(size_t) */
    bool found;
    client_fn_t own[CLIENT_N_FN];   /* the allocator object's functions */
    client_fn_t first[CLIENT_N_FN]; /* the first definition of each, anywhere but in us */
};

static int alloc_scan_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct alloc_scan *sc = arg;
    unsigned index = sc->index++;
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) < 0)
        return 0;
    if (client_elfobj_contains(&o, (uintptr_t)&client_alloc_resolve)) {
        sc->self_index = index;
        return 0;
    }
    bool is_alloc = false;
    if (!sc->found && client_elfobj_lookup(&o, "malloc")) {
        sc->found = is_alloc = true;
        sc->alloc_index = index;
    }
    for (unsigned i = 0; i < CLIENT_N_FN; i++) {
        if (sc->first[i] && !is_alloc)
            continue;
        void *f = client_elfobj_lookup(&o, client_fn_names[i]);
        if (!f)
            continue;
        if (!sc->first[i])
            sc->first[i] = (client_fn_t)(uintptr_t)f;
        if (is_alloc)
            sc->own[i] = (client_fn_t)(uintptr_t)f;
        if (i == CLIENT_FN_CXX_NEW && sc->cxx_index == ~0u)
            sc->cxx_index = index;
    }
    return 0;
}

/* Publishes @f as entry @i unless a resolved value is there already. */
static void alloc_publish(unsigned i, client_fn_t f)
{
    client_fn_t expected = alloc_boot_fns[i];
    (void)atomic_compare_exchange_strong_explicit(&client_real[i], &expected, f,
                                                  memory_order_release, memory_order_relaxed);
}

void client_alloc_resolve(void)
{
    if (HP_LIKELY(atomic_load_explicit(&alloc_state, memory_order_acquire) == 2) || alloc_resolving)
        return;
    alloc_resolving = true;
    int saved_errno = errno;
    alloc_page = (size_t)getpagesize();

    struct alloc_scan sc = {.self_index = ~0u, .cxx_index = ~0u};
    (void)dl_iterate_phdr(alloc_scan_cb, &sc);
    client_fn_t base[CLIENT_N_FN];
    if (!sc.found || !sc.own[CLIENT_FN_MALLOC]) {
        /* Nothing defines malloc besides us: glibc's own entry points. */
        memset(base, 0, sizeof(base));
        base[CLIENT_FN_MALLOC] = (client_fn_t)__libc_malloc;
        base[CLIENT_FN_FREE] = (client_fn_t)__libc_free;
        base[CLIENT_FN_CALLOC] = (client_fn_t)__libc_calloc;
        base[CLIENT_FN_REALLOC] = (client_fn_t)__libc_realloc;
        base[CLIENT_FN_MEMALIGN] = (client_fn_t)__libc_memalign;
        sc.alloc_index = ~0u;
    } else {
        memcpy(base, sc.own, sizeof(base));
        if (!base[CLIENT_FN_FREE])
            base[CLIENT_FN_FREE] = sc.first[CLIENT_FN_FREE];
        if (!base[CLIENT_FN_REALLOC])
            base[CLIENT_FN_REALLOC] = sc.first[CLIENT_FN_REALLOC];
    }
    /* C++'s operators are hooked only when the program's operator new is the allocator's
     * own: libstdc++'s and libc++'s call malloc, whose hook sees their blocks already.
     * Each operator the allocator lacks stays unhooked (libstdc++'s then calls the
     * allocator's through its own GOT slots, which get the hooks). */
    bool cxx = sc.found && sc.cxx_index == sc.alloc_index && base[CLIENT_FN_CXX_NEW] != NULL;
    if (!cxx)
        for (unsigned i = CLIENT_FN_CXX_NEW; i < CLIENT_N_FN; i++)
            base[i] = NULL;
    for (unsigned i = 0; i < CLIENT_N_FN; i++)
        atomic_store_explicit(&alloc_base[i], base[i], memory_order_release);
    for (unsigned i = 0; i < CLIENT_N_FN; i++)
        alloc_publish(i, base[i] ? base[i] : alloc_fallback_fns[i]);

    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&alloc_state, &expected, 1, memory_order_acq_rel,
                                                memory_order_acquire)) {
        memcpy(client_alloc_own, base, sizeof(base));
        client_alloc_cxx = cxx;
        bool got = sc.alloc_index < sc.self_index;
        atomic_store_explicit(&client_alloc_route, got ? CLIENT_ROUTE_GOT : CLIENT_ROUTE_EXPORTS,
                              memory_order_release);
        atomic_store_explicit(&alloc_state, 2, memory_order_release);
        /* Loaded late (an attach loaded us): the hooks go in when a session starts
         * (preload/direct.c), and come out when it ends. */
        if ((got || cxx) && !client__late)
            client_got_patch_loaded();
    }
    /* Bootstrap blocks exist (a hook ran while resolving): from now on the frees and
     * reallocations recognise them. */
    if (atomic_load_explicit(&alloc_boot_used, memory_order_relaxed) != 0)
        for (unsigned i = 0; i < CLIENT_N_FN; i++)
            if (alloc_boot_aware_fns[i] && base[i])
                atomic_store_explicit(&client_real[i], alloc_boot_aware_fns[i],
                                      memory_order_release);
    errno = saved_errno;
    alloc_resolving = false;
}
