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
 * hooks are then installed in the GOT slots of the other objects (preload/got.c). So are
 * the hooks of C++'s operator new and delete when the allocator defines the program's
 * own (client_alloc_cxx), in either order.
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
    /* C++'s replaceable operators (Itanium names below), hooked only when the program's
     * operator new is the allocator's own (see client_alloc_cxx). */
    CLIENT_FN_CXX_NEW, /* the first of them */
    CLIENT_FN_CXX_NEW_ARRAY,
    CLIENT_FN_CXX_NEW_NOTHROW,
    CLIENT_FN_CXX_NEW_ARRAY_NOTHROW,
    CLIENT_FN_CXX_NEW_ALIGNED,
    CLIENT_FN_CXX_NEW_ARRAY_ALIGNED,
    CLIENT_FN_CXX_NEW_ALIGNED_NOTHROW,
    CLIENT_FN_CXX_NEW_ARRAY_ALIGNED_NOTHROW,
    CLIENT_FN_CXX_DELETE,
    CLIENT_FN_CXX_DELETE_ARRAY,
    CLIENT_FN_CXX_DELETE_SIZED,
    CLIENT_FN_CXX_DELETE_ARRAY_SIZED,
    CLIENT_FN_CXX_DELETE_ALIGNED,
    CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED,
    CLIENT_FN_CXX_DELETE_SIZED_ALIGNED,
    CLIENT_FN_CXX_DELETE_ARRAY_SIZED_ALIGNED,
    CLIENT_FN_CXX_DELETE_NOTHROW,
    CLIENT_FN_CXX_DELETE_ARRAY_NOTHROW,
    CLIENT_FN_CXX_DELETE_ALIGNED_NOTHROW,
    CLIENT_FN_CXX_DELETE_ARRAY_ALIGNED_NOTHROW,
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
/* C++ operators: std::align_val_t is a size_t, a std::nothrow_t reference a pointer. */
typedef void *(*client_new_nothrow_fn)(size_t, const void *);
typedef void *(*client_new_aligned_fn)(size_t, size_t);
typedef void *(*client_new_aligned_nothrow_fn)(size_t, size_t, const void *);
typedef void (*client_delete_fn)(void *);
typedef void (*client_delete_sized_fn)(void *, size_t);
typedef void (*client_delete_sized_aligned_fn)(void *, size_t, size_t);
typedef void (*client_delete_nothrow_fn)(void *, const void *);
typedef void (*client_delete_aligned_nothrow_fn)(void *, size_t, const void *);

/* The function names, in enum client_fn order. */
extern const char *const client_fn_names[CLIENT_N_FN];

/* What the hooks call, by enum client_fn. Relaxed loads: every value ever stored is a
 * complete function (a bootstrap one or the resolved one). */
extern _Atomic(client_fn_t) client_real[CLIENT_N_FN];
#define CLIENT_REAL(fn, type)                                                                      \
    ((type)atomic_load_explicit(&client_real[CLIENT_FN_##fn], memory_order_relaxed))

/* The allocator's own function for each name (NULL: it lacks it), after resolving. The
 * C++ entries are set only when client_alloc_cxx is. */
extern client_fn_t client_alloc_own[CLIENT_N_FN];

/* The program's operator new (the first definition of _Znwm in the lookup scope) is the
 * allocator's object's own: jemalloc, tcmalloc and mimalloc define the operators without
 * calling malloc, so new/delete are hooked too, in the GOT slots of the other objects
 * whatever the route (we do not export them: libstdc++'s and libc++'s operators call
 * malloc, which is hooked already; exporting new would count those twice). False with
 * glibc's malloc, or when the first operator new is another object's. Set with the
 * route (read it after an acquire load of client_alloc_route). */
extern bool client_alloc_cxx;

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
