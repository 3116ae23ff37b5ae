/* preload/dl.c: whether code came or went since the session last looked, from glibc's
 * counters of objects added to and removed from the link maps (dlpi_adds, dlpi_subs of
 * dl_iterate_phdr(3)). They count every load and unload: dlopen, dlmopen into any
 * namespace, glibc's own (NSS, iconv modules), whoever the caller, so nothing needs to
 * be wrapped, and dlopen() keeps finding what the application's own caller would find
 * (DT_RUNPATH, $ORIGIN, namespaces: a wrapper that called glibc's dlopen made glibc
 * resolve those for libheapprof.so instead).
 *
 * dlopen is still exported, as a jump (preload/tramp_x86_64.S) to what
 * client_dl_open_target() returns: glibc's dlopen, with the application's return address
 * on the stack, so nothing changes for the call. Only with the GOT route (an allocator
 * that comes before us, preload/got.h) does it return a wrapper that gives the new
 * objects' GOT slots the hooks as soon as dlopen returns, before they allocate unseen:
 * then glibc resolves DT_RUNPATH and $ORIGIN for libheapprof.so, as before (a plugin
 * found only through its caller's DT_RUNPATH does not load with such an allocator).
 * Hooks of C++ operators alone (an allocator after us whose operator new is the
 * program's, preload/alloc.h) do not make it wrap dlopen: new objects get them at the
 * next sample instead (preload/got.h), their calls meanwhile going to the same allocator.
 *
 * Hook path, with one exception to the rules: dl_iterate_phdr() takes the loader's
 * recursive dl_load_write_lock for the duration of the call (a few nanoseconds here:
 * the callback reads the first object and stops). No allocation. A thread that holds the
 * lock (the loader adding or removing an object, or another dl_iterate_phdr() caller
 * inside its callback) is waited for; the same thread may hold it already (a malloc from
 * inside the loader or from a callback), which the recursive lock allows. The only way
 * to a deadlock is a callback of the application's that blocks on a lock another thread
 * holds while it allocates: the callback's author would be waiting for a malloc, which
 * the allocator never promised not to take (the loader's own allocations hold it too). */
#include "preload/client.h"

#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "preload/alloc.h"
#include "preload/got.h"

void *client_dl_open_target(void);

typedef void *(*dl_open_fn)(const char *, int);
static _Atomic(dl_open_fn) dl_real_open;

static void *dl_open_none(const char *file, int mode)
{
    (void)file;
    (void)mode;
    return NULL; /* no dlopen after us: nothing can be loaded */
}

/* With the GOT route: the new objects' slots get the hooks as soon as they are relocated. */
static void *dl_open_patching(const char *file, int mode)
{
    void *h = atomic_load_explicit(&dl_real_open, memory_order_acquire)(file, mode);
    if (h)
        client_got_after_dlopen();
    return h;
}

/* Where the exported dlopen jumps (from the application's context, not a hook: dlsym is
 * fine, once). */
void *client_dl_open_target(void)
{
    dl_open_fn real = atomic_load_explicit(&dl_real_open, memory_order_acquire);
    if (!real) {
        real = (dl_open_fn)(uintptr_t)dlsym(RTLD_NEXT, "dlopen");
        if (!real)
            return (void *)(uintptr_t)dl_open_none;
        atomic_store_explicit(&dl_real_open, real, memory_order_release);
    }
    /* Acquire pairs with the release store of the route. */
    if (atomic_load_explicit(&client_alloc_route, memory_order_acquire) == CLIENT_ROUTE_GOT)
        return (void *)(uintptr_t)dl_open_patching;
    return (void *)(uintptr_t)real;
}

struct dl_counts {
    uint64_t adds, subs;
};

static int dl_counts_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct dl_counts *c = data;
    /* dlpi_adds and dlpi_subs came with glibc 2.4; older callers pass a shorter struct. */
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
        return -1;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    return 1;
}

bool client_dl_counts(uint64_t *ret_adds, uint64_t *ret_subs)
{
    struct dl_counts c;
    if (dl_iterate_phdr(dl_counts_cb, &c) != 1)
        return false;
    *ret_adds = c.adds;
    *ret_subs = c.subs;
    return true;
}
