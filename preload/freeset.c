/* preload/freeset.c: see freeset.h. Hook-safe. */
#include "preload/freeset.h"

#include <errno.h>
#include <sys/mman.h>

int client_freeset_init(struct client_freeset *s, unsigned log2_slots)
{
    size_t bytes = ((size_t)1 << log2_slots) * sizeof(uint64_t);
    /* Pages are touched only as slots get used. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    s->slots = p;
    s->mask = ((uint64_t)1 << log2_slots) - 1;
    s->shift = 64 - log2_slots;
    return 0;
}

int client_freeset_insert(struct client_freeset *s, uint64_t addr)
{
    uint64_t i = client_freeset_hash(s, addr);
    for (unsigned n = 0; n < CLIENT_FREESET_PROBES; n++, i = (i + 1) & s->mask) {
        uint64_t v = atomic_load_explicit(&s->slots[i], memory_order_relaxed);
        if (v != CLIENT_FREESET_EMPTY && v != CLIENT_FREESET_TOMB)
            continue;
        if (atomic_compare_exchange_strong_explicit(&s->slots[i], &v, addr, memory_order_relaxed,
                                                    memory_order_relaxed))
            return 0;
    }
    return -ENOSPC;
}
