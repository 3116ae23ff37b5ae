/* shmem_ring/ring_reader.c: the reader side of the ring (the service's unwinder thread).
 * Everything in the shared mapping is untrusted: positions and record headers are copied
 * into locals once, validated, and only then used. Whatever the bytes, the reader only
 * touches [data, data + 2N), which is mapped. */
#include "shmem_ring/ring_layout.h"

#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "common/clock.h"
#include "shmem_ring/ring.h"

/* Before calling a stalled ring corrupt, the reader re-checks the record this long: a
 * process resumed after SIGSTOP gets the chance to finish the record it was writing. */
#define RING_STALL_GRACE_NS (2u * 1000u * 1000u)

/* The record at @rp is reserved (write_pos is past it) but not published. Returns -EAGAIN
 * while that lasts less than the stall timeout, then -EBADMSG: a writer that died in the
 * middle of a record, or a client that moved write_pos without writing, would otherwise
 * block the reader forever. */
static int ring_stalled(ring_t *r, uint64_t rp, const struct ring_rec *rec)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);

    if (r->stall_since_ns == 0 || r->stall_pos != rp) {
        r->stall_pos = rp;
        r->stall_since_ns = now;
        return -EAGAIN;
    }
    if (now - r->stall_since_ns < r->stall_timeout_ns)
        return -EAGAIN;
    for (uint64_t t = now; t - now < RING_STALL_GRACE_NS; t = hp_clock_ns(CLOCK_MONOTONIC)) {
        if (atomic_load_explicit(&rec->commit_tag, memory_order_relaxed) == (rp ^ RING_TAG_MAGIC))
            return -EAGAIN; /* published after all; the next call reads it */
        (void)sched_yield();
    }
    return -EBADMSG;
}

/* Tells the writers how far we have read. Release pairs with the acquire load of read_pos
 * in ring_try_begin_write(): we are done with the records' bytes before a writer may
 * reuse them. */
static void ring_publish_read_pos(ring_t *r)
{
    if (r->published_read_pos == r->read_pos)
        return;
    r->published_read_pos = r->read_pos;
    atomic_store_explicit(&r->hdr->read_pos, r->read_pos, memory_order_release);
}

int ring_begin_read(ring_t *r, struct ring_rspan *ret)
{
    uint64_t rp = r->read_pos;
    uint64_t wp = r->seen_write_pos;

    if (wp == rp) {
        /* Caught up with what we saw: look again. Acquire is not needed for the record
         * bytes (the commit tag orders them) but keeps the snapshot of write_pos no older
         * than what writers published before it. */
        wp = atomic_load_explicit(&r->hdr->write_pos, memory_order_acquire);
        r->seen_write_pos = wp;
        if (wp == rp) {
            ring_publish_read_pos(r);
            return -EAGAIN;
        }
    }
    uint64_t avail = wp - rp;
    if (avail > r->size || avail < sizeof(struct ring_rec) || (avail & 7u) != 0 || (rp & 7u) != 0)
        return -EBADMSG;

    const struct ring_rec *rec = (const struct ring_rec *)(r->data + (rp & r->mask));
    /* Acquire pairs with the release store in ring_end_write(). */
    uint64_t tag = atomic_load_explicit(&rec->commit_tag, memory_order_acquire);
    if (tag != (rp ^ RING_TAG_MAGIC)) {
        ring_publish_read_pos(r);
        return ring_stalled(r, rp, rec); /* reserved, still being written */
    }
    r->stall_since_ns = 0;

    const volatile struct ring_rec *vrec = (const volatile struct ring_rec *)rec;
    uint32_t len = vrec->len_total;
    uint16_t type = vrec->type;
    uint16_t flags = vrec->flags;
    if (len < sizeof(struct ring_rec) || (len & 7u) != 0 || len > avail)
        return -EBADMSG;
    if ((flags & ~RING_REC_PAD_MASK) != 0)
        return -EBADMSG;
    uint32_t pad = flags & RING_REC_PAD_MASK;
    if (len - sizeof(struct ring_rec) < pad)
        return -EBADMSG;
    size_t payload = len - sizeof(struct ring_rec) - pad;
    if (payload > RING_MAX_PAYLOAD)
        return -EBADMSG;

    ret->data = rec + 1;
    ret->len = payload;
    ret->type = type;
    ret->pos = rp;
    ret->total = len;
    return 0;
}

void ring_end_read(ring_t *r, const struct ring_rspan *rd)
{
    assert(rd->pos == r->read_pos);
    r->read_pos = rd->pos + rd->total;
    r->records_read++;
    r->bytes_read += rd->total;
    /* Every store to read_pos takes the line away from the writers, who read it on every
     * reservation: publish in steps of an eighth of the ring, or at once while the ring
     * is crowded (writers may be waiting for room), and whenever the reader runs out of
     * records (ring_begin_read()). */
    if (r->read_pos - r->published_read_pos >= r->size / 8 ||
        r->seen_write_pos - r->published_read_pos > r->size / 2)
        ring_publish_read_pos(r);
}

void ring_flush_read_pos(ring_t *r)
{
    ring_publish_read_pos(r);
}

uint64_t ring_mark(ring_t *r)
{
    /* Acquire, as in ring_begin_read(): the mark is no older than what writers reserved
     * before the caller's request. */
    return atomic_load_explicit(&r->hdr->write_pos, memory_order_acquire);
}

bool ring_reached(const ring_t *r, uint64_t mark)
{
    return (int64_t)(r->read_pos - mark) >= 0;
}

void ring_set_reader_idle(ring_t *r, bool idle)
{
    ring_publish_read_pos(r);
    atomic_store_explicit(&r->hdr->reader_idle, idle ? RING_READER_SLEEPING : RING_READER_AWAKE,
                          memory_order_relaxed);
    /* Matches the fence in ring_end_write(): after this, either our next ring_begin_read()
     * sees a record published before the fence, or its writer sees the flag. */
    if (idle)
        atomic_thread_fence(memory_order_seq_cst);
}

void ring_set_reader_polling(ring_t *r, uint64_t wake_fill)
{
    ring_publish_read_pos(r);
    if (wake_fill == 0 || wake_fill > r->size)
        wake_fill = r->size / 4;
    atomic_store_explicit(&r->hdr->wake_fill, wake_fill, memory_order_relaxed);
    /* Release: a writer that sees POLLING sees this wake_fill. */
    atomic_store_explicit(&r->hdr->reader_idle, RING_READER_POLLING, memory_order_release);
}

void ring_set_stall_timeout(ring_t *r, uint64_t timeout_us)
{
    if (timeout_us == 0)
        timeout_us = RING_DEFAULT_STALL_TIMEOUT_US;
    r->stall_timeout_ns = timeout_us > UINT64_MAX / 1000u ? UINT64_MAX : timeout_us * 1000u;
}

void ring_set_detached(ring_t *r)
{
    /* Relaxed: writers only need to see it eventually; nothing is published with it. */
    atomic_store_explicit(&r->hdr->detached, 1u, memory_order_relaxed);
}

void ring_maps_read_done(ring_t *r, uint64_t ask)
{
    /* Release: the maps were read before a waiting writer goes on. */
    atomic_store_explicit(&r->hdr->maps_read, ask, memory_order_release);
}
