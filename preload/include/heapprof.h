/* heapprof.h: report the blocks of your own allocators (arenas, pools, object caches) to
 * heapprof, each allocator as a heap of its own beside "libc.malloc".
 *
 * The calls are exported by libheapprof.so. heapprof samples what you report as it
 * samples malloc(): with the session's sampling interval and the calling thread's
 * sampler, a block being recorded with the stack of the call that reported it. A session
 * records a heap only when it selects it (`heapprof record --heaps arena.small,...` or
 * `--all-heaps`; by default only "libc.malloc"). Cost while no session records the heap:
 * a load and a branch; while one does, the sampler's countdown, as malloc.
 *
 *   heapprof_register_heap(name)    an id for the heap called @name (1 to 63 bytes, not
 *                                   "libc.malloc"); the same id for the same name; 0 when
 *                                   no more heaps can be registered (32 per process) or the
 *                                   name is not valid. Register once, before the reports;
 *                                   heaps registered before or during a session are both
 *                                   recorded.
 *   heapprof_report_allocation(heap, id, size)
 *                                   a block of @size bytes was allocated; @id names it until
 *                                   it is freed (its address, say; any value but 0 and 1,
 *                                   unique among the heap's live blocks). True when it was
 *                                   sampled (recorded).
 *   heapprof_report_free(heap, id)  the block @id was freed. Only sampled blocks are
 *                                   recorded; calling it for every block is cheap.
 *   heapprof_report_sample(heap, id, size, sample_size)
 *                                   for a heap that samples itself: the block is recorded
 *                                   as is, standing for @sample_size bytes (0: @size).
 *
 * All four are thread-safe; the report calls are also async-signal-safe.
 * heapprof_register_heap() is not (call it from a signal handler only if no other call of
 * it can be interrupted).
 *
 * Programs that run without heapprof too. Nothing needs libheapprof.so at link time:
 *
 * 1. Weak symbols (the library preloaded from the start: `heapprof record`, the daemon's
 *    HEAPPROF_STARTUP, or LD_PRELOAD for a later `heapprof attach`). Define HEAPPROF_WEAK
 *    before the include; without the library the functions are NULL. Built as PIE (the
 *    default of most distributions) or shared object, so that the loader resolves them.
 *
 *        #define HEAPPROF_WEAK
 *        #include <heapprof.h>
 *        #include <stdlib.h>
 *
 *        static uint32_t arena_heap; // 0: not profiled
 *
 *        void arena_init(void)
 *        {
 *            if (heapprof_register_heap)
 *                arena_heap = heapprof_register_heap("arena");
 *        }
 *        void *arena_alloc(size_t n)
 *        {
 *            void *p = malloc(n); // your allocator's work
 *            if (arena_heap)
 *                heapprof_report_allocation(arena_heap, (uintptr_t)p, n);
 *            return p;
 *        }
 *        void arena_free(void *p)
 *        {
 *            if (arena_heap)
 *                heapprof_report_free(arena_heap, (uintptr_t)p);
 *            free(p);
 *        }
 *
 * 2. Looked up at run time (also a library loaded into the running program by
 *    `heapprof attach`, which weak symbols never see: the loader resolved them to NULL at
 *    the start). Define HEAPPROF_DYNAMIC before the include for heapprof_api_load(),
 *    which finds the library among those loaded (dlopen with RTLD_NOLOAD: it never loads
 *    it). As the library may come any time, look again now and then while it is absent,
 *    off the hot path (when an arena grows, say):
 *
 *        #define HEAPPROF_DYNAMIC
 *        #include <heapprof.h>
 *
 *        static struct heapprof_api api;
 *        static uint32_t arena_heap;
 *
 *        void arena_grow(void)
 *        {
 *            if (!arena_heap && heapprof_api_load(&api))
 *                arena_heap = api.register_heap("arena");
 *        }
 *        // on allocation: if (arena_heap) api.report_allocation(arena_heap, id, n);
 *
 *    Publish api before arena_heap where other threads read them (an atomic store with
 *    release order, or a lock). The library is never unloaded once loaded.
 */
#ifndef HEAPPROF_H
#define HEAPPROF_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef HEAPPROF_WEAK
#define HEAPPROF_DECL __attribute__((weak))
#else
#define HEAPPROF_DECL
#endif

HEAPPROF_DECL uint32_t heapprof_register_heap(const char *name);
HEAPPROF_DECL bool heapprof_report_allocation(uint32_t heap, uint64_t id, uint64_t size);
HEAPPROF_DECL void heapprof_report_free(uint32_t heap, uint64_t id);
HEAPPROF_DECL bool heapprof_report_sample(uint32_t heap, uint64_t id, uint64_t size,
                                          uint64_t sample_size);

#ifdef HEAPPROF_DYNAMIC
#include <dlfcn.h>

/* The calls, found at run time (heapprof_api_load()). */
struct heapprof_api {
    uint32_t (*register_heap)(const char *name);
    bool (*report_allocation)(uint32_t heap, uint64_t id, uint64_t size);
    void (*report_free)(uint32_t heap, uint64_t id);
    bool (*report_sample)(uint32_t heap, uint64_t id, uint64_t size, uint64_t sample_size);
};

/* Fills @api when libheapprof.so is loaded in the process (never loads it); false, and
 * @api untouched, when it is not. Not async-signal-safe (dlopen). */
static inline bool heapprof_api_load(struct heapprof_api *api)
{
    void *h = dlopen("libheapprof.so", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return false;
    struct heapprof_api a;
    *(void **)&a.register_heap = dlsym(h, "heapprof_register_heap");
    *(void **)&a.report_allocation = dlsym(h, "heapprof_report_allocation");
    *(void **)&a.report_free = dlsym(h, "heapprof_report_free");
    *(void **)&a.report_sample = dlsym(h, "heapprof_report_sample");
    /* Our reference only: whoever loaded the library keeps it. */
    (void)dlclose(h);
    if (!a.register_heap || !a.report_allocation || !a.report_free || !a.report_sample)
        return false;
    *api = a;
    return true;
}
#endif

#ifdef __cplusplus
}
#endif

#endif
