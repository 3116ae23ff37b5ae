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

#include <linux/futex.h>

#include "common/clock.h"
#include "common/sys.h"
#include "shmem_ring/ring.h"

/* Before reporting a stalled writer, the reader re-checks the record this long: a
 * process resumed after SIGSTOP gets the chance to finish the record it was writing. */
#define RING_STALL_GRACE_NS (2u * 1000u * 1000u)

/* The record at @rp is reserved (write_pos is past it) but not published. Returns -EAGAIN
 * while that lasts less than the stall timeout, then -ETIMEDOUT: the caller finds out why
 * (a stopped, dead or hostile writer would otherwise hold the reader forever without a
 * word). */
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
    return -ETIMEDOUT;
}

/* The record header at the reader's position, validated against @avail bytes reserved.
 * Returns its total length, or 0 when it is not valid. */
static uint32_t ring_rec_len(const ring_t *r, uint64_t avail, uint32_t *ret_pad, uint16_t *ret_type)
{
    const volatile struct ring_rec *vrec =
        (const volatile struct ring_rec *)(r->data + (r->read_pos & r->mask));
    uint32_t len = vrec->len_total;
    uint16_t type = vrec->type;
    uint16_t flags = vrec->flags;
    if (len < sizeof(struct ring_rec) || (len & 7u) != 0 || len > avail)
        return 0;
    if ((flags & ~RING_REC_PAD_MASK) != 0)
        return 0;
    uint32_t pad = flags & RING_REC_PAD_MASK;
    if (len - sizeof(struct ring_rec) < pad)
        return 0;
    if (len - sizeof(struct ring_rec) - pad > RING_MAX_PAYLOAD)
        return 0;
    *ret_pad = pad;
    *ret_type = type;
    return len;
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

uint32_t ring_stalled_writer(ring_t *r)
{
    if (r->stall_since_ns == 0 || r->stall_pos != r->read_pos)
        return 0;
    const struct ring_rec *rec = (const struct ring_rec *)(r->data + (r->read_pos & r->mask));
    uint64_t tag = atomic_load_explicit(&rec->commit_tag, memory_order_relaxed);
    return (tag & RING_TAG_RESERVED_MASK) == RING_TAG_RESERVED ? (uint32_t)tag : 0;
}

void ring_stall_rearm(ring_t *r)
{
    if (r->stall_since_ns != 0)
        r->stall_since_ns = hp_clock_ns(CLOCK_MONOTONIC);
}

int ring_skip_stalled(ring_t *r)
{
    uint64_t rp = r->read_pos, avail = r->seen_write_pos - rp;
    if (r->stall_since_ns == 0 || r->stall_pos != rp)
        return -EAGAIN;
    const struct ring_rec *rec = (const struct ring_rec *)(r->data + (rp & r->mask));
    if (atomic_load_explicit(&rec->commit_tag, memory_order_acquire) == (rp ^ RING_TAG_MAGIC))
        return -EAGAIN;
    uint32_t pad;
    uint16_t type;
    uint32_t len = ring_rec_len(r, avail, &pad, &type);
    if (len == 0)
        return -EBADMSG;
    r->read_pos = rp + len;
    r->records_skipped++;
    r->stall_since_ns = 0;
    ring_publish_read_pos(r);
    return 0;
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

    uint32_t pad;
    uint16_t type;
    uint32_t len = ring_rec_len(r, avail, &pad, &type);
    if (len == 0)
        return -EBADMSG;
    size_t payload = len - sizeof(struct ring_rec) - pad;

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
    r->idle_word = idle ? RING_READER_SLEEPING : RING_READER_AWAKE;
    atomic_store_explicit(&r->hdr->reader_idle, r->idle_word, memory_order_relaxed);
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
    r->idle_word = RING_READER_POLLING;
    atomic_store_explicit(&r->hdr->reader_idle, RING_READER_POLLING, memory_order_release);
}

const void *ring_reader_word(ring_t *r, uint32_t *ret_val)
{
    *ret_val = r->idle_word;
    return &r->hdr->reader_idle;
}

int ring_wait(ring_t *r, uint32_t timeout_ms)
{
    struct timespec ts = {.tv_sec = timeout_ms / 1000,
                          .tv_nsec = (long)(timeout_ms % 1000) * 1000000};
    /* Relative timeout; a word already changed returns -EAGAIN at once: woken. */
    long e = hp_sys4(SYS_futex, (long)&r->hdr->reader_idle, FUTEX_WAIT, r->idle_word, (long)&ts);
    if (e == -ETIMEDOUT || e == -EINTR)
        return (int)e;
    return 0;
}

uint32_t ring_ids_changes(ring_t *r)
{
    /* Acquire pairs with the release in ring_note_ids_changed(). */
    return atomic_load_explicit(&r->hdr->ids_changes, memory_order_acquire);
}

uint64_t ring_forks_unfollowed(ring_t *r)
{
    return atomic_load_explicit(&r->hdr->forks_unfollowed, memory_order_relaxed);
}

uint32_t ring_client_ended(ring_t *r)
{
    /* Acquire pairs with the release store in ring_set_client_ended(). */
    return atomic_load_explicit(&r->hdr->client_ended, memory_order_acquire);
}

bool ring_client_exiting(ring_t *r)
{
    return atomic_load_explicit(&r->hdr->client_exiting, memory_order_relaxed) != 0;
}

int ring_discard(ring_t *r, uint64_t mark, uint16_t type, uint64_t *ret_records,
                 uint64_t *ret_of_type)
{
    /* Only up to what was reserved when the caller took @mark, and never more than a
     * ring's worth: the mark is as untrusted as the positions it came from. */
    uint64_t n = 0, of_type = 0;
    int r_ = 0;
    if ((int64_t)(mark - r->read_pos) < 0 || mark - r->read_pos > r->size ||
        ((mark - r->read_pos) & 7u) != 0) {
        r_ = -EBADMSG;
        goto out;
    }
    while (r->read_pos != mark) {
        uint32_t pad;
        uint16_t t;
        uint32_t len = ring_rec_len(r, mark - r->read_pos, &pad, &t);
        if (len == 0) {
            r_ = -EBADMSG;
            break;
        }
        r->read_pos += len;
        n++;
        of_type += t == type;
    }
    r->stall_since_ns = 0;
    r->seen_write_pos = r->read_pos;
    ring_publish_read_pos(r);
out:
    *ret_records = n;
    *ret_of_type = of_type;
    return r_;
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
