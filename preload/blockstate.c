/* preload/blockstate.c: see blockstate.h. Hook-safe: no calls at all. */
#include "preload/blockstate.h"

void client_block_init(struct client_block *b, bool blocking)
{
    atomic_store_explicit(&b->mode, blocking ? CLIENT_BLOCK_ON : CLIENT_BLOCK_OFF,
                          memory_order_relaxed);
    atomic_store_explicit(&b->busy, false, memory_order_relaxed);
    atomic_store_explicit(&b->next_check_ns, 0, memory_order_relaxed);
    b->paused_read_pos = b->last_read_pos = b->progress_ns = 0;
}

static enum client_block_action block_paused(struct client_block *b,
                                             const struct client_block_view *v)
{
    if (v->read_pos != b->last_read_pos) {
        b->last_read_pos = v->read_pos;
        b->progress_ns = v->now_ns;
    }
    /* Caught up: it read since the pause (it runs), and half the ring is free again, so
     * the samples that wait next find room soon. A slow reader never sees the ring below
     * half while samples that do not wait fill what it frees: one that read a quarter of
     * the ring since the pause keeps making room, and waiting for it costs the program
     * at most one more timeout per quarter ring read. */
    uint64_t moved = v->read_pos - b->paused_read_pos;
    if (moved != 0 && (v->fill <= v->size / 2 || moved >= v->size / 4)) {
        atomic_store_explicit(&b->mode, CLIENT_BLOCK_ON, memory_order_relaxed);
        return CLIENT_BLOCK_RESUME;
    }
    if (v->now_ns - b->progress_ns >= CLIENT_BLOCK_GIVE_UP_NS) {
        atomic_store_explicit(&b->mode, CLIENT_BLOCK_GIVEN_UP, memory_order_relaxed);
        return CLIENT_BLOCK_GIVE_UP;
    }
    return CLIENT_BLOCK_NONE;
}

enum client_block_action client_block_step(struct client_block *b,
                                           const struct client_block_view *v)
{
    switch (atomic_load_explicit(&b->mode, memory_order_relaxed)) {
    case CLIENT_BLOCK_ON:
        if (v->ring_blocking)
            return CLIENT_BLOCK_NONE;
        /* A wait ran out (for room, or for a maps read). */
        atomic_store_explicit(&b->mode, CLIENT_BLOCK_PAUSED, memory_order_relaxed);
        b->paused_read_pos = b->last_read_pos = v->read_pos;
        b->progress_ns = v->now_ns;
        return CLIENT_BLOCK_NONE;
    case CLIENT_BLOCK_PAUSED:
        return block_paused(b, v);
    default:
        return CLIENT_BLOCK_NONE;
    }
}
