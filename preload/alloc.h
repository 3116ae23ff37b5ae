/* preload/alloc.h: the allocator the program would use without us, which every hook
 * forwards to.
 *
 * Which object provides the allocator: the first object of the global lookup scope
 * (the executable, the LD_PRELOAD libraries in order, then the DT_NEEDED libraries,
 * breadth first; libheapprof.so itself left out) that defines malloc. Every other
 * function of the family is taken from that same object when it defines it; one it lacks
 * (jemalloc has no reallocarray or pvalloc, glibc 2.36 no free_sized) is implemented
 * here on top of that object's functions, so that one pointer never meets two
 * allocators. free and realloc, without which nothing can be built, come from the first
 * object defining them when the allocator's object does not.
 *
 * Resolved once, at the first call of any hook or in the constructor, whichever comes
 * first, by reading the loaded objects' dynamic symbol tables (preload/elfobj.h): no
 * dlsym, so resolving allocates nothing. Until then every entry of client_real is a
 * bootstrap function that resolves, then calls the resolved one. Should resolving ever
 * call back into a hook on the same thread (an interposed dl_iterate_phdr that
 * allocates), that call is served from a small static buffer; once one such block
 * exists, free and realloc recognise and keep those blocks.
 *
 * When the allocator's object comes before us in the lookup order (preloaded before us,
 * or the executable itself), the program's calls bind to it, not to our exports: the
 * hooks are then installed in the GOT slots of the other objects (preload/got.c).
 *
 *     void *p = CLIENT_REAL(MALLOC, client_malloc_fn)(size);
 *
 * Hook-safe.
 */
#ifndef HP_PRELOAD_ALLOC_H
#define HP_PRELOAD_ALLOC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

enum client_fn {
    CLIENT_FN_MALLOC,
    CLIENT_FN_FREE,
    CLIENT_FN_CALLOC,
    CLIENT_FN_REALLOC,
    CLIENT_FN_REALLOCARRAY,
    CLIENT_FN_MEMALIGN,
    CLIENT_FN_ALIGNED_ALLOC,
    CLIENT_FN_POSIX_MEMALIGN,
    CLIENT_FN_VALLOC,
    CLIENT_FN_PVALLOC,
    CLIENT_FN_FREE_SIZED,
    CLIENT_FN_FREE_ALIGNED_SIZED,
    CLIENT_N_FN
};

typedef void (*client_fn_t)(void);
typedef void *(*client_malloc_fn)(size_t);
typedef void (*client_free_fn)(void *);
typedef void *(*client_calloc_fn)(size_t, size_t);
typedef void *(*client_realloc_fn)(void *, size_t);
typedef void *(*client_reallocarray_fn)(void *, size_t, size_t);
typedef void *(*client_memalign_fn)(size_t, size_t);
typedef int (*client_posix_memalign_fn)(void **, size_t, size_t);
typedef void (*client_free_sized_fn)(void *, size_t);
typedef void (*client_free_aligned_sized_fn)(void *, size_t, size_t);

/* The function names, in enum client_fn order. */
extern const char *const client_fn_names[CLIENT_N_FN];

/* What the hooks call, by enum client_fn. Relaxed loads: every value ever stored is a
 * complete function (a bootstrap one or the resolved one). */
extern _Atomic(client_fn_t) client_real[CLIENT_N_FN];
#define CLIENT_REAL(fn, type)                                                                      \
    ((type)atomic_load_explicit(&client_real[CLIENT_FN_##fn], memory_order_relaxed))

/* The allocator's own function for each name (NULL: it lacks it), after resolving. */
extern client_fn_t client_alloc_own[CLIENT_N_FN];

/* How the program reaches the hooks; set by client_alloc_resolve(). */
enum client_alloc_route {
    CLIENT_ROUTE_UNRESOLVED = 0,
    CLIENT_ROUTE_EXPORTS, /* the allocator comes after us: our exports are what binds */
    CLIENT_ROUTE_GOT,     /* it comes first: hooks go into the other objects' GOT slots */
};
extern _Atomic int client_alloc_route;

/* Resolves the allocator (once; later calls return at once). Not reentrant in a way
 * that matters: a nested call on the same thread returns without resolving and the
 * hook it serves uses the bootstrap buffer. */
void client_alloc_resolve(void);

/* The hooks, as installed in GOT slots (preload/hook.c; by enum client_fn). */
extern const client_fn_t client_hook_fns[CLIENT_N_FN];

#pragma GCC visibility pop

#endif
