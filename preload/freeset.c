/* preload/freeset.c: see freeset.h. Hook-safe. */
#include "preload/freeset.h"

#include <errno.h>
#include <sys/mman.h>

int client_freeset_init(struct client_freeset *s, unsigned log2_slots)
{
    size_t bytes = CLIENT_FREESET_MAP_BYTES(log2_slots);
    /* Pages are touched only as slots get used. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    s->slots = p;
    s->filter = (_Atomic uint8_t *)((char *)p + ((size_t)8 << log2_slots));
    s->mask = ((uint64_t)1 << log2_slots) - 1;
    s->shift = 64 - log2_slots;
    return 0;
}

static void freeset_filter_inc(struct client_freeset *s, uint64_t home)
{
    _Atomic uint8_t *c = &s->filter[home >> CLIENT_FREESET_LINE_LOG2];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    while (v != CLIENT_FREESET_FILTER_SAT &&
           !atomic_compare_exchange_weak_explicit(c, &v, (uint8_t)(v + 1), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void client_freeset_filter_dec(struct client_freeset *s, uint64_t home)
{
    _Atomic uint8_t *c = &s->filter[home >> CLIENT_FREESET_LINE_LOG2];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    while (v != 0 && v != CLIENT_FREESET_FILTER_SAT &&
           !atomic_compare_exchange_weak_explicit(c, &v, (uint8_t)(v - 1), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void client_freeset_saturate(struct client_freeset *s)
{
    size_t n = (size_t)((s->mask + 1) >> CLIENT_FREESET_LINE_LOG2);
    for (size_t i = 0; i < n; i++)
        atomic_store_explicit(&s->filter[i], CLIENT_FREESET_FILTER_SAT, memory_order_relaxed);
}

int client_freeset_insert(struct client_freeset *s, uint64_t addr)
{
    uint64_t home = client_freeset_hash(s, addr), i = home;
    /* Raised first: whoever can see the entry sees a non-zero counter. */
    freeset_filter_inc(s, home);
    for (unsigned n = 0; n < CLIENT_FREESET_PROBES; n++, i = (i + 1) & s->mask) {
        uint64_t v = atomic_load_explicit(&s->slots[i], memory_order_relaxed);
        if (v != CLIENT_FREESET_EMPTY && v != CLIENT_FREESET_TOMB)
            continue;
        if (atomic_compare_exchange_strong_explicit(&s->slots[i], &v, addr, memory_order_relaxed,
                                                    memory_order_relaxed))
            return 0;
    }
    client_freeset_filter_dec(s, home);
    return -ENOSPC;
}
