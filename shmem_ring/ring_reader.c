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

/* The record at lane @lane's read position is reserved (write_pos is past it) but not
 * published. Returns -EAGAIN while that lasts less than the stall timeout, then
 * -ETIMEDOUT: the caller finds out why (a stopped, dead or hostile writer would otherwise
 * hold the reader forever without a word). */
static int ring_stalled(ring_t *r, uint32_t lane)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    uint64_t rp = r->lane[lane].read_pos;
    const struct ring_rec *rec = ring__rec(r, lane, rp);

    if (r->stall_since_ns == 0 || r->stall_pos != rp || r->stall_lane != lane) {
        r->stall_lane = lane;
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

/* The record header at lane @lane's read position, validated against @avail bytes
 * reserved. Returns its total length, or 0 when it is not valid. */
static uint32_t ring_rec_len(const ring_t *r, uint32_t lane, uint64_t avail, uint32_t *ret_pad,
                             uint16_t *ret_type)
{
    const volatile struct ring_rec *vrec = ring__rec(r, lane, r->lane[lane].read_pos);
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

/* Tells the writers of lane @lane how far we have read. Release pairs with the acquire
 * load of read_pos in ring_try_begin_write(): we are done with the records' bytes before
 * a writer may reuse them. */
static void ring_publish_lane(ring_t *r, uint32_t lane)
{
    struct ring_lane *l = &r->lane[lane];
    if (l->published_read_pos == l->read_pos)
        return;
    l->published_read_pos = l->read_pos;
    atomic_store_explicit(l->shared_read_pos, l->read_pos, memory_order_release);
}

static void ring_publish_read_pos(ring_t *r)
{
    for (uint32_t i = 0; i < r->lanes; i++)
        ring_publish_lane(r, i);
}

uint32_t ring_stalled_writer(ring_t *r)
{
    if (r->stall_since_ns == 0 || r->stall_pos != r->lane[r->stall_lane].read_pos)
        return 0;
    const struct ring_rec *rec = ring__rec(r, r->stall_lane, r->stall_pos);
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
    uint32_t lane = r->stall_lane;
    struct ring_lane *l = &r->lane[lane];
    uint64_t rp = l->read_pos, avail = l->seen_write_pos - rp;
    if (r->stall_since_ns == 0 || r->stall_pos != rp)
        return -EAGAIN;
    const struct ring_rec *rec = ring__rec(r, lane, rp);
    if (atomic_load_explicit(&rec->commit_tag, memory_order_acquire) == (rp ^ RING_TAG_MAGIC))
        return -EAGAIN;
    uint32_t pad;
    uint16_t type;
    uint32_t len = ring_rec_len(r, lane, avail, &pad, &type);
    if (len == 0)
        return -EBADMSG;
    l->read_pos = rp + len;
    l->head_ready = false;
    r->records_skipped++;
    r->stall_since_ns = 0;
    ring_publish_lane(r, lane);
    return 0;
}

enum ring_head { RING_HEAD_EMPTY, RING_HEAD_UNPUBLISHED, RING_HEAD_READY, RING_HEAD_BAD };

/* Looks at the next record of lane @lane: RING_HEAD_READY with it in *@ret when it is
 * published and valid. */
static enum ring_head ring_lane_head(ring_t *r, uint32_t lane, struct ring_rspan *ret)
{
    struct ring_lane *l = &r->lane[lane];
    uint64_t rp = l->read_pos;
    uint64_t wp = l->seen_write_pos;

    if (wp == rp) {
        /* Caught up with what we saw: look again. Acquire is not needed for the record
         * bytes (the commit tag orders them) but keeps the snapshot of write_pos no older
         * than what writers published before it. */
        wp = atomic_load_explicit(&l->word[0], memory_order_acquire);
        l->seen_write_pos = wp;
        if (wp == rp)
            return RING_HEAD_EMPTY;
    }
    uint64_t avail = wp - rp;
    if (avail > r->lane_size || avail < sizeof(struct ring_rec) || (avail & 7u) != 0 ||
        (rp & 7u) != 0)
        return RING_HEAD_BAD;

    const struct ring_rec *rec = ring__rec(r, lane, rp);
    /* Acquire pairs with the release store in ring_end_write(). */
    uint64_t tag = atomic_load_explicit(&rec->commit_tag, memory_order_acquire);
    if (tag != (rp ^ RING_TAG_MAGIC)) {
        /* Reserved, still being written. Its writer stored the stamp before the tag that
         * claims it (acquire pairs with that release): a lower bound for it until then. */
        ret->stamp = l->last_stamp;
        if ((tag & RING_TAG_RESERVED_MASK) == RING_TAG_RESERVED) {
            uint64_t stamp = ((const volatile struct ring_rec *)rec)->stamp;
            if (stamp > ret->stamp)
                ret->stamp = stamp;
        }
        return RING_HEAD_UNPUBLISHED;
    }

    uint32_t pad;
    uint16_t type;
    uint32_t len = ring_rec_len(r, lane, avail, &pad, &type);
    if (len == 0)
        return RING_HEAD_BAD;
    ret->data = rec + 1;
    ret->len = len - sizeof(struct ring_rec) - pad;
    ret->type = type;
    ret->pos = rp;
    ret->total = len;
    ret->lane = lane;
    ret->stamp = ((const volatile struct ring_rec *)rec)->stamp;
    /* Stamps only grow along a lane; a smaller one (a hostile writer's) reads as the
     * last, so that the merge below always moves on. */
    if (ret->stamp < l->last_stamp)
        ret->stamp = l->last_stamp;
    return RING_HEAD_READY;
}

/* A stamp below every record reserved in empty lane @lane from now on. */
static uint64_t ring_lane_bound(const struct ring_lane *l)
{
    return l->horizon > l->last_stamp ? l->horizon : l->last_stamp;
}

/* Moves the last stamp of each lane that @empty marks up to the TSC, so that what is
 * reserved there next is stamped above it (ring_layout.h). A lane where a writer
 * reserved meanwhile is looked at again by the next ring_lane_head(). */
static void ring_raise_horizons(ring_t *r, const bool *empty)
{
    uint64_t t0 = ring__tsc();
    for (uint32_t i = 0; i < r->lanes; i++) {
        struct ring_lane *l = &r->lane[i];
        if (!empty[i])
            continue;
        uint64_t cur[2] = {l->read_pos, atomic_load_explicit(&l->word[1], memory_order_relaxed)};
        uint64_t want[2] = {l->read_pos, cur[1] > t0 ? cur[1] : t0};
        if (ring__cas16(l->word, cur, want))
            l->horizon = want[1];
    }
}

/* ring_begin_read() of a ring of several lanes: the published head with the smallest
 * stamp, once no other lane can hold a smaller one (an unpublished head's stamp, or the
 * bound of its lane's stamps, is above it; an empty lane's horizon is). */
static int ring_merge(ring_t *r, struct ring_rspan *ret)
{
    enum ring_head st[RING_MAX_LANES];
    bool empty[RING_MAX_LANES];

    for (int round = 0;; round++) {
        int best = -1;
        uint64_t key = 0;
        for (uint32_t i = 0; i < r->lanes; i++) {
            struct ring_lane *l = &r->lane[i];
            st[i] = l->head_ready ? RING_HEAD_READY : ring_lane_head(r, i, &l->head);
            if (st[i] == RING_HEAD_BAD)
                return -EBADMSG;
            l->head_ready = st[i] == RING_HEAD_READY;
            if (l->head_ready && (best < 0 || l->head.stamp < key)) {
                best = (int)i;
                key = l->head.stamp;
            }
        }
        int stalled = -1;
        bool low_horizon = false;
        for (uint32_t i = 0; i < r->lanes; i++) {
            empty[i] = false;
            if (st[i] == RING_HEAD_EMPTY) {
                ring_publish_lane(r, i);
                empty[i] = best >= 0 && ring_lane_bound(&r->lane[i]) < key;
                low_horizon |= empty[i];
            } else if (st[i] == RING_HEAD_UNPUBLISHED && stalled < 0 &&
                       (best < 0 || r->lane[i].head.stamp <= key)) {
                /* Its record may be older than the best head. */
                stalled = (int)i;
            }
        }
        if (stalled >= 0) {
            ring_publish_lane(r, (uint32_t)stalled);
            return ring_stalled(r, (uint32_t)stalled);
        }
        if (best < 0)
            return -EAGAIN;
        /* After a fresh horizon a head still above it has a stamp from the future (a
         * hostile writer's, or counters that disagree): it is read all the same, or
         * nothing would be. */
        if (!low_horizon || round > 0) {
            *ret = r->lane[best].head;
            if (r->stall_lane == (uint32_t)best)
                r->stall_since_ns = 0;
            return 0;
        }
        ring_raise_horizons(r, empty);
    }
}

int ring_begin_read(ring_t *r, struct ring_rspan *ret)
{
    if (r->lanes > 1)
        return ring_merge(r, ret);
    switch (ring_lane_head(r, 0, ret)) {
    case RING_HEAD_READY:
        r->stall_since_ns = 0;
        return 0;
    case RING_HEAD_EMPTY:
        ring_publish_lane(r, 0);
        return -EAGAIN;
    case RING_HEAD_UNPUBLISHED:
        ring_publish_lane(r, 0);
        return ring_stalled(r, 0);
    case RING_HEAD_BAD:
        break;
    }
    return -EBADMSG;
}

void ring_end_read(ring_t *r, const struct ring_rspan *rd)
{
    struct ring_lane *l = &r->lane[rd->lane];
    assert(rd->lane < r->lanes && rd->pos == l->read_pos);
    l->read_pos = rd->pos + rd->total;
    l->head_ready = false;
    if (rd->stamp > l->last_stamp)
        l->last_stamp = rd->stamp;
    /* Every record stamped below this one was read before it. */
    if (rd->stamp > r->frontier)
        r->frontier = rd->stamp;
    r->records_read++;
    r->bytes_read += rd->total;
    /* Every store to read_pos takes the line away from the writers, who read it on every
     * reservation: publish in steps of an eighth of the lane, or at once while the lane
     * is crowded (writers may be waiting for room), and whenever the reader runs out of
     * records (ring_begin_read()). */
    if (l->read_pos - l->published_read_pos >= r->lane_size / 8 ||
        l->seen_write_pos - l->published_read_pos > r->lane_size / 2)
        ring_publish_lane(r, rd->lane);
}

void ring_flush_read_pos(ring_t *r)
{
    ring_publish_read_pos(r);
}

uint64_t ring_mark(ring_t *r)
{
    /* With lanes: a stamp above every record reserved before now. */
    if (r->lanes > 1)
        return ring__tsc();
    /* Acquire, as in ring_begin_read(): the mark is no older than what writers reserved
     * before the caller's request. */
    return atomic_load_explicit(&r->hdr->write_pos, memory_order_acquire);
}

bool ring_reached(ring_t *r, uint64_t mark)
{
    if (r->lanes == 1)
        return (int64_t)(r->lane[0].read_pos - mark) >= 0;
    if (r->frontier > mark)
        return true;
    /* Nothing stamped above the mark read yet: reached when every lane is empty and what
     * comes there next is stamped above it. */
    bool low[RING_MAX_LANES];
    bool any = false;
    for (uint32_t i = 0; i < r->lanes; i++) {
        struct ring_lane *l = &r->lane[i];
        if (atomic_load_explicit(&l->word[0], memory_order_acquire) != l->read_pos)
            return false;
        low[i] = ring_lane_bound(l) <= mark;
        any |= low[i];
    }
    if (any)
        ring_raise_horizons(r, low);
    for (uint32_t i = 0; i < r->lanes; i++)
        if (ring_lane_bound(&r->lane[i]) <= mark)
            return false;
    return true;
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
    if (wake_fill == 0 || wake_fill > r->lane_size)
        wake_fill = r->lane_size / 4;
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

/* Skips the records of lane @lane up to position @to, counting them and those of
 * @types (ring_discard()). */
static int ring_discard_lane(ring_t *r, uint32_t lane, uint64_t to, uint32_t types,
                             ring_count_fn count, void *arg, uint64_t *n, uint64_t *of_type)
{
    struct ring_lane *l = &r->lane[lane];
    int err = 0;
    /* Never more than a lane's worth: the position is as untrusted as the header. (Our
     * own position is a multiple of 8 unless the state was forged: the fuzz target.) */
    if ((int64_t)(to - l->read_pos) < 0 || to - l->read_pos > r->lane_size ||
        ((to - l->read_pos) & 7u) != 0 || (l->read_pos & 7u) != 0)
        return -EBADMSG;
    while (l->read_pos != to) {
        uint32_t pad;
        uint16_t t;
        uint32_t len = ring_rec_len(r, lane, to - l->read_pos, &pad, &t);
        if (len == 0) {
            err = -EBADMSG;
            break;
        }
        if (t < 32 && ((types >> t) & 1)) {
            if (!count) {
                (*of_type)++;
            } else {
                const struct ring_rec *rec = ring__rec(r, lane, l->read_pos);
                bool published = atomic_load_explicit(&rec->commit_tag, memory_order_acquire) ==
                                 (l->read_pos ^ RING_TAG_MAGIC);
                *of_type += count(t, published ? (const void *)(rec + 1) : NULL,
                                  len - sizeof(*rec) - pad, arg);
            }
        }
        l->read_pos += len;
        l->head_ready = false;
        (*n)++;
    }
    l->seen_write_pos = l->read_pos;
    ring_publish_lane(r, lane);
    return err;
}

int ring_discard(ring_t *r, uint64_t mark, uint32_t types, ring_count_fn count, void *arg,
                 uint64_t *ret_records, uint64_t *ret_of_type)
{
    /* Only up to what was reserved when the caller took @mark; with lanes (whose mark is
     * a stamp) all that is reserved now: the ring is detached when this is called. */
    uint64_t n = 0, of_type = 0;
    int err = 0;
    for (uint32_t i = 0; i < r->lanes && err == 0; i++) {
        uint64_t to =
            r->lanes == 1 ? mark : atomic_load_explicit(&r->lane[i].word[0], memory_order_acquire);
        err = ring_discard_lane(r, i, to, types, count, arg, &n, &of_type);
    }
    r->stall_since_ns = 0;
    *ret_records = n;
    *ret_of_type = of_type;
    return err;
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

uint32_t ring_ask_flush(ring_t *r)
{
    return atomic_fetch_add_explicit(&r->hdr->flush_asked, 1, memory_order_relaxed) + 1;
}

bool ring_flush_answered(ring_t *r, uint32_t n)
{
    /* Acquire pairs with the client's release: the flushed records are reserved. */
    uint32_t done = atomic_load_explicit(&r->hdr->flush_done, memory_order_acquire);
    return (int32_t)(done - n) >= 0;
}

void ring_maps_read_done(ring_t *r, uint64_t ask)
{
    /* Release: the maps were read before a waiting writer goes on. */
    atomic_store_explicit(&r->hdr->maps_read, ask, memory_order_release);
}
