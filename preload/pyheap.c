/* preload/pyheap.c: the python.objects heap, see pyheap.h. */
#include "preload/pyheap.h"

#include <stddef.h>

#include "common/macros.h"
#include "preload/client.h"
#include "preload/include/heapprof.h"
#include "preload/python.h"

/* PyMemAllocatorDomain (Include/cpython/pymem.h) */
#define PY_DOMAIN_RAW 0
#define PY_DOMAIN_OBJ 2

/* PyMemAllocatorEx */
struct py_allocator {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t size);
    void (*free)(void *ctx, void *ptr);
};
typedef void (*py_allocator_fn)(int domain, struct py_allocator *allocator);

_Atomic uint64_t client_stat_pyheap_skipped = 0;

/* The allocator the wrapper calls: written before the wrapper is installed, by a thread
 * that holds the GIL (or the only thread), read by the wrapper's callers, which hold it. */
static struct py_allocator pyheap_old;
static _Atomic uint32_t pyheap_id;
static _Atomic bool pyheap_on;
static void *pyheap_skipped_malloc;

static void *pyheap_malloc(void *ctx, size_t size);

/* The heap's id, registered on first use; 0 when the registry is full. */
static uint32_t pyheap_heap(void)
{
    uint32_t id = atomic_load_explicit(&pyheap_id, memory_order_relaxed);
    if (!id) {
        id = heapprof_register_heap(CLIENT_PYHEAP_NAME);
        atomic_store_explicit(&pyheap_id, id, memory_order_relaxed);
    }
    return id;
}

/* The session ended: the saved allocator goes back, unless another one was put in front
 * of ours since (it calls ours: left as it is). Called by the wrapper, under the GIL. */
static HP_NOINLINE void pyheap_dormant(void)
{
    const struct client_py_mem *m = client_py_mem();
    if (atomic_load_explicit(&client_current, memory_order_acquire) != NULL || !m)
        return;
    struct py_allocator cur;
    ((py_allocator_fn)m->get_allocator)(PY_DOMAIN_OBJ, &cur);
    atomic_store_explicit(&pyheap_on, false, memory_order_relaxed);
    if (cur.malloc != pyheap_malloc)
        return;
    struct py_allocator old = pyheap_old;
    ((py_allocator_fn)m->set_allocator)(PY_DOMAIN_OBJ, &old);
}

static void pyheap_report(void *p, size_t size)
{
    if (HP_UNLIKELY(atomic_load_explicit(&client_fast_interval, memory_order_relaxed) ==
                    CLIENT_FAST_OFF)) {
        if (atomic_load_explicit(&pyheap_on, memory_order_relaxed))
            pyheap_dormant();
        return;
    }
    (void)heapprof_report_allocation(atomic_load_explicit(&pyheap_id, memory_order_relaxed),
                                     (uint64_t)(uintptr_t)p, size);
}

/* Marks the thread as inside the object allocator for a block of @size bytes (the malloc
 * hooks leave a block of that size to python.objects: client_tls.pyobj_size); returns
 * the mark it replaces. CPython's raw allocator asks malloc for 1 byte where it is asked
 * for 0 (Objects/obmalloc.c, _PyMem_RawMalloc). */
static inline uint64_t pyheap_enter(struct client_tls *t, size_t size)
{
    uint64_t was = t->pyobj_size;
    t->pyobj_size = size ? size : 1;
    return was;
}

static void *pyheap_malloc(void *ctx, size_t size)
{
    struct client_tls *t = &client_tls;
    uint64_t was = pyheap_enter(t, size);
    void *p = pyheap_old.malloc(ctx, size);
    t->pyobj_size = was;
    if (HP_LIKELY(p != NULL))
        pyheap_report(p, size);
    return p;
}

static void *pyheap_calloc(void *ctx, size_t nelem, size_t elsize)
{
    struct client_tls *t = &client_tls;
    /* No overflow: CPython checked the product before calling. */
    uint64_t was = pyheap_enter(t, nelem * elsize);
    void *p = pyheap_old.calloc(ctx, nelem, elsize);
    t->pyobj_size = was;
    if (HP_LIKELY(p != NULL))
        pyheap_report(p, nelem * elsize);
    return p;
}

static void *pyheap_realloc(void *ctx, void *ptr, size_t size)
{
    /* Before the call: the block may be reused by then. Lost (the block counts as
     * freed) when realloc fails, which leaves it. */
    if (ptr) {
        client_pycodes_forget(&client_py_codes, (uint64_t)(uintptr_t)ptr);
        client_heap_free(atomic_load_explicit(&pyheap_id, memory_order_relaxed),
                         (uint64_t)(uintptr_t)ptr);
    }
    struct client_tls *t = &client_tls;
    uint64_t was = pyheap_enter(t, size);
    void *p = pyheap_old.realloc(ctx, ptr, size);
    t->pyobj_size = was;
    if (HP_LIKELY(p != NULL))
        pyheap_report(p, size);
    return p;
}

static void pyheap_free(void *ctx, void *ptr)
{
    if (ptr) {
        /* A code object checked by a sample may go (preload/pycodes.h). */
        client_pycodes_forget(&client_py_codes, (uint64_t)(uintptr_t)ptr);
        client_heap_free(atomic_load_explicit(&pyheap_id, memory_order_relaxed),
                         (uint64_t)(uintptr_t)ptr);
    }
    pyheap_old.free(ctx, ptr);
}

/* Puts the wrapper in front of the object allocator when it fits; the caller made the
 * write safe (pyheap.h). */
static void pyheap_install(const struct client_py_mem *m)
{
    py_allocator_fn get = (py_allocator_fn)m->get_allocator;
    struct py_allocator cur, raw;
    get(PY_DOMAIN_OBJ, &cur);
    if (cur.malloc == pyheap_malloc) {
        atomic_store_explicit(&pyheap_on, true, memory_order_relaxed);
        return;
    }
    get(PY_DOMAIN_RAW, &raw);
    /* pymalloc has no context; the debug hooks and other wrappers do. */
    if (cur.ctx != NULL || cur.malloc == raw.malloc) {
        if (pyheap_skipped_malloc != (void *)cur.malloc) {
            pyheap_skipped_malloc = (void *)cur.malloc;
            atomic_fetch_add_explicit(&client_stat_pyheap_skipped, 1, memory_order_relaxed);
        }
        return;
    }
    pyheap_old = cur;
    struct py_allocator w = {
        .ctx = cur.ctx,
        .malloc = pyheap_malloc,
        .calloc = pyheap_calloc,
        .realloc = pyheap_realloc,
        .free = pyheap_free,
    };
    /* Frees made while it was not in place went unseen: code objects are checked anew. */
    client_pycodes_clear(&client_py_codes);
    atomic_store_explicit(&pyheap_on, true, memory_order_relaxed);
    ((py_allocator_fn)m->set_allocator)(PY_DOMAIN_OBJ, &w);
}

/* The allocator API when @s records python.objects, else NULL. */
static const struct client_py_mem *pyheap_wanted(struct client_session *s)
{
    if (client_py_state() != CLIENT_PY_READY)
        return NULL;
    const struct client_py_mem *m = client_py_mem();
    if (!m)
        return NULL;
    uint32_t id = pyheap_heap();
    return id && client_heap_selected(s, id) ? m : NULL;
}

void client__pyheap_open(struct client_session *s, bool single_threaded)
{
    const struct client_py_mem *m = pyheap_wanted(s);
    if (m && single_threaded)
        pyheap_install(m);
}

void client_pyheap_poll(struct client_session *s)
{
    const struct client_py_mem *m = pyheap_wanted(s);
    /* Checked again while installed: the interpreter's start (PYTHONMALLOC) may have put
     * its own allocator in place of ours since. */
    if (m && client_py_holds_gil())
        pyheap_install(m);
}

uint32_t client_pyheap_id(void)
{
    return atomic_load_explicit(&pyheap_id, memory_order_relaxed);
}

bool client_pyheap_installed(void)
{
    return atomic_load_explicit(&pyheap_on, memory_order_relaxed);
}
