/* shmem_ring/ring_writer.c: the writer side of the ring. Hook-safe: runs inside the
 * profiled application's malloc hooks, from any thread, so it never allocates, never takes
 * a lock and makes no system call except while waiting in block_client mode. */
#include "shmem_ring/ring_layout.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/ring.h"

/* Spins on sched_yield() this many times before sleeping between retries. */
#define RING_BLOCK_YIELDS 16
#define RING_BLOCK_SLEEP_NS 20000

static void ring_count(_Atomic uint64_t *counter, uint64_t n)
{
    atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

static void ring_update_max_fill(struct ring_shared *h, uint64_t fill)
{
    uint64_t cur = atomic_load_explicit(&h->stats.max_fill_bytes, memory_order_relaxed);
    while (cur < fill &&
           !atomic_compare_exchange_weak_explicit(&h->stats.max_fill_bytes, &cur, fill,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

static void ring_block_pause(unsigned round)
{
    if (round < RING_BLOCK_YIELDS) {
        (void)sched_yield();
    } else {
        /* Through syscall(2): nanosleep(3) is a cancellation point and this runs inside
         * malloc, which must not be one. */
        struct timespec ts = {.tv_sec = 0, .tv_nsec = RING_BLOCK_SLEEP_NS};
        (void)syscall(SYS_nanosleep, &ts, NULL);
    }
}

int ring_try_begin_write(ring_t *r, uint16_t type, size_t payload_len, struct ring_wspan *ret)
{
    struct ring_shared *h = r->hdr;
    uint64_t total, w, rp;
    uint64_t t_start = 0, deadline_ns = 0;
    unsigned cas_failures = 0, block_rounds = 0;
    int err = 0;

    /* hdr is NULL in a child forked after ring_map() (the private page is wiped). */
    if (HP_UNLIKELY(h == NULL || atomic_load_explicit(&h->detached, memory_order_relaxed)))
        return -EPIPE;
    if (payload_len > RING_MAX_PAYLOAD || ring__record_total(payload_len) > r->size) {
        ring_count(&h->stats.records_dropped, 1);
        return -EMSGSIZE;
    }
    total = ring__record_total(payload_len);

    w = atomic_load_explicit(&h->write_pos, memory_order_relaxed);
    for (;;) {
        /* Acquire pairs with the release store in ring_end_read(): the reader is done with
         * every byte below read_pos, so we may overwrite them. */
        rp = atomic_load_explicit(&h->read_pos, memory_order_acquire);
        if ((int64_t)(w - rp) < 0) {
            /* Our copy of write_pos is older than the reader's position: reload. */
            w = atomic_load_explicit(&h->write_pos, memory_order_relaxed);
            if (++cas_failures >= RING_MAX_CAS_RETRIES) {
                err = -EAGAIN;
                ring_count(&h->stats.reserve_failures, 1);
                break;
            }
            continue;
        }
        if (w - rp + total > r->size) {
            if (!atomic_load_explicit(&r->blocking, memory_order_relaxed)) {
                err = -EAGAIN;
                ring_count(&h->stats.records_dropped, 1);
                break;
            }
            uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
            if (atomic_load_explicit(&h->detached, memory_order_relaxed)) {
                /* The session ended while we waited: no point in waiting on. */
                err = -EPIPE;
                break;
            }
            if (block_rounds == 0) {
                t_start = now;
                deadline_ns = now + (uint64_t)atomic_load_explicit(&r->block_timeout_us,
                                                                   memory_order_relaxed) *
                                        1000u;
            } else if (now >= deadline_ns) {
                err = -EAGAIN;
                ring_count(&h->stats.records_dropped, 1);
                break;
            }
            ring_block_pause(block_rounds++);
            w = atomic_load_explicit(&h->write_pos, memory_order_relaxed);
            continue;
        }
        /* Relaxed is enough: the reservation only orders against the reader through
         * read_pos (acquired above) and the commit tag (released in ring_end_write()). */
        if (atomic_compare_exchange_weak_explicit(&h->write_pos, &w, w + total,
                                                  memory_order_relaxed, memory_order_relaxed))
            break;
        if (++cas_failures >= RING_MAX_CAS_RETRIES) {
            err = -EAGAIN;
            ring_count(&h->stats.reserve_failures, 1);
            break;
        }
    }
    if (block_rounds > 0) {
        uint64_t waited_ns = hp_clock_ns(CLOCK_MONOTONIC) - t_start;
        ring_count(&h->stats.client_spinlock_blocked_us, waited_ns / 1000u);
    }
    if (err < 0)
        return err;

    ring_update_max_fill(h, w + total - rp);

    struct ring_rec *rec = (struct ring_rec *)(r->data + (w & r->mask));
    size_t pad = (size_t)(total - sizeof(*rec) - payload_len);
    rec->len_total = (uint32_t)total;
    rec->type = type;
    rec->flags = (uint16_t)pad;
    if (pad > 0)
        memset((uint8_t *)(rec + 1) + payload_len, 0, pad);
    ret->data = rec + 1;
    ret->len = payload_len;
    ret->pos = w;
    return 0;
}

bool ring_end_write(ring_t *r, struct ring_wspan *w)
{
    struct ring_shared *h = r->hdr;
    struct ring_rec *rec = (struct ring_rec *)(r->data + (w->pos & r->mask));
    uint64_t total = rec->len_total;

    /* Release pairs with the acquire load of the tag in ring_begin_read(): the reader sees
     * the whole record once it sees the tag. */
    atomic_store_explicit(&rec->commit_tag, w->pos ^ RING_TAG_MAGIC, memory_order_release);

    /* Store-load ordering between our tag store and the idle flag load, matching the
     * fence in ring_set_reader_idle(): either the reader's re-check sees this record or
     * we see its idle flag. */
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t idle = atomic_load_explicit(&h->reader_idle, memory_order_relaxed);
    if (idle == RING_READER_AWAKE)
        return false;
    if (idle == RING_READER_POLLING) {
        /* The reader comes by on its own; wake it early only when the ring fills up. */
        uint64_t fill = w->pos + total - atomic_load_explicit(&h->read_pos, memory_order_relaxed);
        if (fill < atomic_load_explicit(&h->wake_fill, memory_order_relaxed))
            return false;
    }
    /* Only the writer that clears the flag pokes the reader. */
    return atomic_exchange_explicit(&h->reader_idle, RING_READER_AWAKE, memory_order_acq_rel) !=
           RING_READER_AWAKE;
}

/* Waits until the reader's counter @at has reached @target, compared on its low @bits
 * bits (wrap-around safe), for at most @timeout_us. 0, -ETIMEDOUT, or -EPIPE when the
 * reader detached. */
static int ring_wait_reader(struct ring_shared *h, const _Atomic uint64_t *at, uint64_t target,
                            unsigned bits, uint64_t timeout_us)
{
    uint64_t deadline = hp_clock_ns(CLOCK_MONOTONIC) + timeout_us * 1000u;
    for (unsigned round = 0;; round++) {
        /* Acquire pairs with the reader's release store of the counter. */
        uint64_t v = atomic_load_explicit(at, memory_order_acquire);
        if ((int64_t)((v - target) << (64 - bits)) >= 0)
            return 0;
        if (atomic_load_explicit(&h->detached, memory_order_relaxed))
            return -EPIPE;
        if (hp_clock_ns(CLOCK_MONOTONIC) >= deadline)
            return -ETIMEDOUT;
        ring_block_pause(round);
    }
}

int ring_wait_consumed(ring_t *r, const struct ring_wspan *w, uint32_t timeout_us)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return -EPIPE;
    /* The reader's position only stops at record boundaries, so past the record's
     * start means past the record (whose bytes other writers may reuse by now). */
    return ring_wait_reader(h, &h->read_pos, w->pos + 1, 64, timeout_us);
}

bool ring_is_detached(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    return h == NULL || atomic_load_explicit(&h->detached, memory_order_relaxed) != 0;
}

void ring_set_blocking(ring_t *r, bool block, uint32_t timeout_us)
{
    atomic_store_explicit(&r->block_timeout_us, timeout_us, memory_order_relaxed);
    atomic_store_explicit(&r->blocking, block, memory_order_relaxed);
}

uint64_t ring_ask_maps_read(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return 0;
    return atomic_fetch_add_explicit(&h->maps_asked, 1, memory_order_relaxed) + 1;
}

int ring_wait_maps_read(ring_t *r, uint64_t ask)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return -EPIPE;
    if (!atomic_load_explicit(&r->blocking, memory_order_relaxed))
        return -EAGAIN;
    return ring_wait_reader(h, &h->maps_read, ask, 32,
                            atomic_load_explicit(&r->block_timeout_us, memory_order_relaxed));
}
