/* preload/heapapi.c: the heaps of the program's own (include file preload/include/heapprof.h):
 * registration by name, the exported report calls, and what a session needs of them.
 *
 * A heap is an id (1..CLIENT_MAX_HEAPS) and a name, kept for the life of the process (a
 * child of fork inherits them). A session records a heap when the service's selection
 * (struct wire_heaps, sent at the handshake) names it or says "all"; the client learns it
 * when the session opens, for the heaps registered so far, and at registration, for a heap
 * registered during the session. Each registered heap's name goes into the ring once per
 * session (WIRE_HEAP_NAME), so that the trace names its samples: written by the sampled
 * path before a sample (client__heap_names_flush()), as no sample means nothing to name.
 *
 * Reports take the malloc path's sampler (the thread's, with the session's interval):
 *
 *   dormant         one load of client_fast_interval and a branch
 *   not selected    and one load of client_heaps_fast and a branch
 *   unsampled       and the sampler's countdown
 *   sampled         a tail call to client_heap_tramp (the stack starts at the program's
 *                   call), then preload/record.c records it like a malloc() block, into
 *                   the heap's own set of sampled blocks so that its report_free is seen.
 *
 * Registration: lock-free readers, one spinlock among registering threads (no system call,
 * allocation or call under it). The report calls are hook-safe; registration is not
 * async-signal-safe (a handler that registers while it interrupted a registration would
 * spin for good).
 */
#include "preload/client.h"

#include <stdatomic.h>
#include <string.h>

#include "common/macros.h"
#include "preload/include/heapprof.h"
#include "preload/pyheap.h"

_Atomic uint64_t client_heaps_fast = 0;

/* Names of the heaps registered, id i + 1 at [i]; entries below client_heap_count are
 * written once (before the store of client_heap_count that publishes them) and never
 * change. */
static char heap_names[CLIENT_MAX_HEAPS][WIRE_HEAP_NAME_MAX];
static uint8_t heap_name_lens[CLIENT_MAX_HEAPS];
_Atomic uint32_t client_heap_count = 0;
static atomic_flag heap_lock = ATOMIC_FLAG_INIT;

/* True when selection @sel names @name (@len bytes). */
static bool heap_in_selection(const struct wire_heaps *sel, const char *name, size_t len)
{
    if (sel->flags & WIRE_HEAPS_ALL)
        return true;
    uint32_t n = sel->n < WIRE_MAX_HEAP_SELECT ? sel->n : WIRE_MAX_HEAP_SELECT;
    for (uint32_t i = 0; i < n; i++)
        if (strnlen(sel->names[i], WIRE_HEAP_NAME_MAX) == len && !memcmp(sel->names[i], name, len))
            return true;
    return false;
}

/* Tells @s about heap @id: records it when the selection names it. The caller is inside
 * @s or owns it. Only atomics: also on the raw session thread, which must not write
 * into the ring (the ring writer's thread-local state is not set up there). */
static void heap_tell(struct client_session *s, uint32_t id)
{
    if (heap_in_selection(&s->heap_select, heap_names[id - 1], heap_name_lens[id - 1])) {
        uint64_t bit = (uint64_t)1 << id;
        atomic_fetch_or_explicit(&s->heaps_on, bit, memory_order_relaxed);
        atomic_fetch_or_explicit(&client_heaps_fast, bit, memory_order_relaxed);
    }
}

void client__heap_names_flush(struct client_session *s)
{
    uint32_t n = atomic_load_explicit(&client_heap_count, memory_order_acquire);
    uint32_t k = atomic_load_explicit(&s->heap_names_sent, memory_order_relaxed);
    while (k < n) {
        /* One thread writes each name; a failed exchange reloads k. */
        if (!atomic_compare_exchange_weak_explicit(&s->heap_names_sent, &k, k + 1,
                                                   memory_order_relaxed, memory_order_relaxed))
            continue;
        struct ring_wspan w;
        /* Lost when the ring is full: the trace then says "heap_<id>". */
        if (ring_try_begin_write(s->ring, WIRE_HEAP_NAME, sizeof(struct wire_heap_name), &w) == 0) {
            wire_encode_heap_name(w.data, k + 1, heap_names[k], heap_name_lens[k]);
            (void)ring_end_write(s->ring, &w);
        }
        k++;
    }
}

/* A heap registered now: the current session, if any, hears of it. seq_cst pairs with
 * client__heaps_announce(): a session published before our store of client_heap_count is seen
 * here, or the session's opener sees the heap. */
static void heap_announce(uint32_t id)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_seq_cst);
    /* Entered: a slot reused meanwhile for a session that did not select the heap stays
     * as its opener set it. */
    if (s && client_session_enter(s)) {
        heap_tell(s, id);
        client_session_leave(s);
    }
}

HP_EXPORT uint32_t heapprof_register_heap(const char *name)
{
    if (!name)
        return 0;
    size_t len = strnlen(name, WIRE_HEAP_NAME_MAX);
    if (len == 0 || len >= WIRE_HEAP_NAME_MAX || !strcmp(name, WIRE_HEAP_MALLOC_NAME))
        return 0;
    while (atomic_flag_test_and_set_explicit(&heap_lock, memory_order_acquire))
        ;
    uint32_t n = atomic_load_explicit(&client_heap_count, memory_order_relaxed);
    uint32_t id = 0;
    for (uint32_t i = 0; i < n && !id; i++)
        if (heap_name_lens[i] == len && !memcmp(heap_names[i], name, len))
            id = i + 1;
    bool added = false;
    if (!id && n < CLIENT_MAX_HEAPS) {
        memcpy(heap_names[n], name, len);
        heap_names[n][len] = '\0';
        heap_name_lens[n] = (uint8_t)len;
        id = n + 1;
        added = true;
        atomic_store_explicit(&client_heap_count, n + 1, memory_order_seq_cst);
    }
    atomic_flag_clear_explicit(&heap_lock, memory_order_release);
    if (added)
        heap_announce(id);
    return id;
}

HP_EXPORT bool heapprof_report_allocation(uint32_t heap, uint64_t id, uint64_t size)
{
    uint64_t interval = atomic_load_explicit(&client_fast_interval, memory_order_relaxed);
    if (interval == CLIENT_FAST_OFF)
        return false;
    if (HP_LIKELY(
            !((atomic_load_explicit(&client_heaps_fast, memory_order_relaxed) >> (heap & 63)) & 1)))
        return false;
    if (HP_LIKELY(size < interval) &&
        HP_LIKELY((client_tls.sampler.bytes_left -= (int64_t)size) > 0))
        return false;
    return client_heap_tramp(heap, id, size, 0);
}

HP_EXPORT bool heapprof_report_sample(uint32_t heap, uint64_t id, uint64_t size,
                                      uint64_t sample_size)
{
    uint64_t interval = atomic_load_explicit(&client_fast_interval, memory_order_relaxed);
    if (interval == CLIENT_FAST_OFF)
        return false;
    if (!((atomic_load_explicit(&client_heaps_fast, memory_order_relaxed) >> (heap & 63)) & 1))
        return false;
    if (sample_size == 0)
        sample_size = size;
    if (sample_size == 0)
        return false;
    return client_heap_tramp(heap, id, size, sample_size);
}

HP_EXPORT void heapprof_report_free(uint32_t heap, uint64_t id)
{
    client_heap_free(heap, id);
}

bool client_heap_set_ready(struct client_session *s, uint32_t heap)
{
    /* python.objects frees millions of objects a second, each probing the set's filter
     * (freeset.h): at the heaps' 2^16 slots, with one counter per 32, nearly all of its
     * 2048 counters were raised by some 10^4 live samples (94% of the frees in bench
     * app_python_ratio_4k_pymalloc_heap probed the table, a cache miss each); 27% at
     * malloc's 2^19, 7% with a counter per 8 slots (64 KiB). */
    bool py = heap == client_pyheap_id();
    unsigned log2 = py ? CLIENT_FREESET_LOG2 : CLIENT_HEAP_FREESET_LOG2;
    unsigned line_log2 = py ? 3 : CLIENT_FREESET_LINE_LOG2;
    if (HP_LIKELY(client_freeset_init_once(&s->heap_sets[heap - 1], log2, line_log2) == 0))
        return true;
    atomic_fetch_add_explicit(&client_stat_freeset_overflows, 1, memory_order_relaxed);
    ring_count_freeset_full(s->ring);
    return false;
}

void client__heaps_open(struct client_session *s, const struct wire_heaps *sel)
{
    if (sel) {
        s->heap_select = *sel;
    } else {
        memset(&s->heap_select, 0, sizeof(s->heap_select));
        s->heap_select.n = 1;
        memcpy(s->heap_select.names[0], WIRE_HEAP_MALLOC_NAME, sizeof(WIRE_HEAP_MALLOC_NAME));
    }
    s->malloc_on = heap_in_selection(&s->heap_select, WIRE_HEAP_MALLOC_NAME,
                                     sizeof(WIRE_HEAP_MALLOC_NAME) - 1);
    atomic_store_explicit(&s->heaps_on, 0, memory_order_relaxed);
    atomic_store_explicit(&s->heap_names_sent, 0, memory_order_relaxed);
}

void client__heaps_announce(struct client_session *s)
{
    /* seq_cst: see heap_announce(); the session was published before this load. */
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t n = atomic_load_explicit(&client_heap_count, memory_order_seq_cst);
    for (uint32_t id = 1; id <= n; id++)
        heap_tell(s, id);
}

void client__heaps_close(void)
{
    atomic_store_explicit(&client_heaps_fast, 0, memory_order_relaxed);
}

void client__heap_sets_clear(struct client_session *s)
{
    for (unsigned i = 0; i < CLIENT_MAX_HEAPS; i++)
        if (s->heap_sets[i].lv[0].slots)
            client_freeset_clear(&s->heap_sets[i]);
}
