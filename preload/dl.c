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
 * Hook path: the counts come from dl_iterate_phdr(), which takes the loader's recursive
 * dl_load_write_lock for the duration of the call (a few nanoseconds here: the callback
 * reads the first object and stops). Waiting for that lock inside malloc would add a
 * malloc -> loader lock edge to the program's lock order: a program whose
 * dl_iterate_phdr() callback takes a mutex that another thread holds while it allocates
 * (a logger, a crash reporter's module list) is correct with any malloc, and would
 * deadlock for good. So the hooks never wait for it: they take it only when it is free
 * (pthread_mutex_trylock(), glibc's own mutex and protocol), then call dl_iterate_phdr(),
 * which takes it again recursively without waiting; when another thread holds it, the
 * sample goes without the counts (preload/record.c: its stack is copied, not walked, and
 * the next sample looks again). The same thread may hold it already (a malloc from inside
 * the loader or from a callback): the trylock of a recursive mutex succeeds then. No
 * allocation.
 *
 * Where the lock is: glibc does not export it. client_dl_init() finds it once, at
 * initialisation (a thread glibc knows, before any session): inside a dl_iterate_phdr()
 * callback it looks in the loader's writable segment (AT_BASE) for the recursive
 * mutexes this thread owns, and keeps the one whose count went down by one when
 * dl_iterate_phdr() returned. Nothing found, or more than one: the counts are unknown
 * (CLIENT_DL_NONE) for the life of the process, and samples copy their stacks, with no
 * walk by the client's table, which could describe code since unloaded. The session
 * thread cannot take part: it has no glibc thread state, and glibc, taking the process
 * for single-threaded, would lock with plain stores (preload/attach.c).
 */
#include "preload/client.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macros.h"

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

/* ---- the loader's lock, taken only when free ---------------------------------------- */

/* glibc's dl_load_write_lock, which dl_iterate_phdr() takes; NULL: not found (every
 * client_dl_counts() then answers CLIENT_DL_NONE). Set once by client_dl_init(). */
static pthread_mutex_t *dl_write_lock;

#define DL_FIND_MAX 4
struct dl_find {
    pid_t tid;
    pthread_mutex_t *cand[DL_FIND_MAX];
    unsigned count_in[DL_FIND_MAX];
    unsigned n;
    bool scanned;
};

/* Recursive mutexes in [@lo, @hi) that @f->tid holds. */
static void dl_find_scan(struct dl_find *f, uintptr_t lo, uintptr_t hi)
{
    for (uintptr_t a = HP_ALIGN_UP(lo, (uintptr_t)8); a + sizeof(pthread_mutex_t) <= hi; a += 8) {
        pthread_mutex_t *m = (pthread_mutex_t *)a;
        if (m->__data.__owner != f->tid || m->__data.__kind != PTHREAD_MUTEX_RECURSIVE_NP ||
            m->__data.__count == 0)
            continue;
        if (f->n == DL_FIND_MAX) {
            f->n++; /* too many: none is taken */
            return;
        }
        f->cand[f->n] = m;
        f->count_in[f->n++] = m->__data.__count;
    }
}

/* Inside dl_iterate_phdr(), with the lock held: the writable segment of the loader
 * (AT_BASE), where its globals are. */
static int dl_find_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct dl_find *f = data;
    (void)size;
    uintptr_t base = (uintptr_t)getauxval(AT_BASE);
    if (!base || info->dlpi_addr != base)
        return 0;
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W))
            dl_find_scan(f, base + ph->p_vaddr, base + ph->p_vaddr + ph->p_memsz);
    }
    f->scanned = true;
    return 1;
}

void client_dl_init(void)
{
    struct dl_find f = {.tid = (pid_t)syscall(SYS_gettid)};
    (void)dl_iterate_phdr(dl_find_cb, &f);
    if (!f.scanned || f.n > DL_FIND_MAX)
        return;
    /* The one whose count went down by one when dl_iterate_phdr() returned (the loader
     * may hold others of its locks in this thread, around an allocation of its own). */
    pthread_mutex_t *found = NULL;
    for (unsigned i = 0; i < f.n; i++) {
        unsigned now = f.cand[i]->__data.__count;
        bool released =
            f.count_in[i] == 1 ? f.cand[i]->__data.__owner != f.tid : now == f.count_in[i] - 1;
        if (!released)
            continue;
        if (found)
            return; /* two: none is taken */
        found = f.cand[i];
    }
    dl_write_lock = found;
}

bool client_dl_lock_try(void)
{
    return dl_write_lock && pthread_mutex_trylock(dl_write_lock) == 0;
}

void client_dl_unlock(void)
{
    (void)pthread_mutex_unlock(dl_write_lock);
}

int client_dl_counts(uint64_t *ret_adds, uint64_t *ret_subs)
{
    if (!dl_write_lock)
        return CLIENT_DL_NONE;
    if (!client_dl_lock_try())
        return CLIENT_DL_BUSY;
    /* Takes the lock again, recursively: it does not wait. */
    struct dl_counts c;
    int r = dl_iterate_phdr(dl_counts_cb, &c);
    client_dl_unlock();
    if (r != 1)
        return CLIENT_DL_NONE;
    *ret_adds = c.adds;
    *ret_subs = c.subs;
    return CLIENT_DL_OK;
}
