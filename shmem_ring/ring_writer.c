/* shmem_ring/ring_writer.c: the writer side of the ring. Hook-safe: runs inside the
 * profiled application's malloc hooks, from any thread, so it never allocates and never
 * takes a lock. System calls (raw: no errno): a FUTEX_WAKE when the reader sleeps, gettid
 * once per thread and ring, and the waits of block_client mode. */
#include "shmem_ring/ring_layout.h"

#include <cpuid.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>

#include "common/clock.h"
#include "common/sys.h"
#include "shmem_ring/ring.h"

/* Spins on sched_yield() this many times before sleeping between retries. */
#define RING_BLOCK_YIELDS 16
#define RING_BLOCK_SLEEP_NS 20000

/* The calling thread's id, cached per ring mapping (struct ring.map_id): a fresh mapping
 * (a new session, or any ring of a forked child, whose thread inherited this cache) takes
 * it once more. Initial-exec TLS: 16 bytes. */
static __thread struct {
    uint64_t map_id;
    uint32_t tid;
    uint32_t lane; /* without rdpid: the thread's lane in that mapping */
} ring_self __attribute__((tls_model("initial-exec")));

/* Whether this CPU has rdpid: 0 not known yet, 1 yes, 2 no. */
static _Atomic int ring_has_rdpid;

static bool ring_rdpid(void)
{
    int v = atomic_load_explicit(&ring_has_rdpid, memory_order_relaxed);
    if (HP_UNLIKELY(v == 0)) {
        unsigned a, b, c, d;
        bool yes = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22));
        v = yes ? 1 : 2;
        atomic_store_explicit(&ring_has_rdpid, v, memory_order_relaxed);
    }
    return v == 1;
}

/* Tests: the lane every record of this thread goes to (-1: its CPU's). */
static __thread int ring_forced_lane __attribute__((tls_model("initial-exec"))) = -1;

void ring__set_writer_lane(int lane)
{
    ring_forced_lane = lane;
}

static void ring_writer_fresh(ring_t *r)
{
    if (HP_UNLIKELY(ring_self.map_id != r->map_id)) {
        ring_self.tid = (uint32_t)hp_sys0(SYS_gettid);
        ring_self.lane = atomic_fetch_add_explicit(&r->next_lane, 1, memory_order_relaxed);
        ring_self.map_id = r->map_id;
    }
}

static uint32_t ring_writer_tid(ring_t *r)
{
    ring_writer_fresh(r);
    return ring_self.tid;
}

static void ring_futex_wake(struct ring_shared *h)
{
    /* Not FUTEX_PRIVATE_FLAG: the reader is another process. */
    (void)hp_sys3(SYS_futex, (long)&h->reader_idle, FUTEX_WAKE, 1);
}

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

/* Claims the record reserved at @w of lane @lane for the calling thread and fills its
 * head; @ret is the span of its payload. */
static HP_ALWAYS_INLINE void ring_open_record(ring_t *r, uint32_t lane, uint64_t w, uint64_t total,
                                              uint16_t type, size_t payload_len, uint64_t stamp,
                                              struct ring_wspan *ret)
{
    struct ring_rec *rec = ring__rec(r, lane, w);
    /* The stamp before the tag that says who holds the record until it is published (see
     * ring_stalled_writer()): a reader that sees the tag knows the stamp of a record still
     * being written, and reads other lanes' older records meanwhile. */
    rec->stamp = stamp;
    atomic_store_explicit(&rec->commit_tag, RING_TAG_RESERVED | ring_writer_tid(r),
                          memory_order_release);
    size_t pad = (size_t)(total - sizeof(*rec) - payload_len);
    rec->len_total = (uint32_t)total;
    rec->type = type;
    rec->flags = (uint16_t)pad;
    if (pad > 0)
        memset((uint8_t *)(rec + 1) + payload_len, 0, pad);
    ret->data = rec + 1;
    ret->len = payload_len;
    ret->pos = w;
    ret->lane = lane;
}

/* The lines the next record will most likely take (the one after @end): asked for with
 * intent to write, long before the next sample comes. A ring is far larger than a core's
 * cache and a position is reused only a lap later, so without this every record's first
 * stores miss, and the locked instruction that follows them (the session's writer count)
 * waits for them. Only a hint: another writer may take those lines first. Past the end of
 * the data area is its second mapping (ring_layout.h), so every line asked for is mapped. */
#define RING_PREFETCH_BYTES 256u
static HP_ALWAYS_INLINE void ring_prefetch_next(const ring_t *r, uint32_t lane, uint64_t end)
{
    const uint8_t *p = r->lane[lane].data + (end & r->mask);
    for (unsigned off = 0; off < RING_PREFETCH_BYTES; off += RING_CACHE_LINE)
        __builtin_prefetch(p + off, 1, 3);
}

/* The lane a record reserved now goes to: the CPU's, or without rdpid the thread's. */
static HP_ALWAYS_INLINE uint32_t ring_writer_lane(ring_t *r)
{
    if (r->lanes == 1)
        return 0;
    if (HP_UNLIKELY(ring_forced_lane >= 0))
        return (uint32_t)ring_forced_lane & (r->lanes - 1);
    if (HP_LIKELY(ring_rdpid()))
        return ring__cpu() & (r->lanes - 1);
    ring_writer_fresh(r);
    return ring_self.lane & (r->lanes - 1);
}

/* @lane, or when it has no room for @total bytes below @limit the next lane that has
 * (any lane keeps the order, ring_layout.h); r->lanes when no lane has room. */
static uint32_t ring_lane_with_room(ring_t *r, uint32_t lane, uint64_t total, uint64_t limit)
{
    for (uint32_t k = 0; k < r->lanes; k++) {
        uint32_t i = (lane + k) & (r->lanes - 1);
        uint64_t w = atomic_load_explicit(&r->lane[i].word[0], memory_order_relaxed);
        uint64_t rp = atomic_load_explicit(r->lane[i].shared_read_pos, memory_order_relaxed);
        if ((int64_t)(w - rp) >= 0 && w - rp + total <= limit)
            return i;
    }
    return r->lanes;
}

/* The lane's position and last stamp into @cur. Two loads: a torn pair only fails the
 * compare-and-swap, which then reads it whole. */
static HP_ALWAYS_INLINE void ring_lane_words(const struct ring_lane *l, uint64_t cur[2])
{
    cur[0] = atomic_load_explicit(&l->word[0], memory_order_relaxed);
    cur[1] = atomic_load_explicit(&l->word[1], memory_order_relaxed);
}

/* @urgent: never wait, and may use the last RING_URGENT_RESERVE_SHIFT-th of the lane,
 * which other records leave free. */
static int ring_begin_write(ring_t *r, uint16_t type, size_t payload_len, bool urgent,
                            struct ring_wspan *ret)
{
    struct ring_shared *h = r->hdr;
    uint64_t total, rp;
    uint64_t t_start = 0, deadline_ns = 0;
    unsigned cas_failures = 0, block_rounds = 0, lane_moves = 0;
    int err = 0;

    /* hdr is NULL in a child forked after ring_map() (the private page is wiped). */
    if (HP_UNLIKELY(h == NULL || atomic_load_explicit(&h->detached, memory_order_relaxed)))
        return -EPIPE;
    /* Frees (urgent) must not be crowded out by samples, whether these wait for room or
     * are dropped: a lost free is a phantom leak, a lost sample only a smaller sample. */
    uint64_t limit = r->lane_size;
    if (!urgent)
        limit -= r->lane_size >> RING_URGENT_RESERVE_SHIFT;
    if (payload_len > RING_MAX_PAYLOAD || ring__record_total(payload_len) > limit) {
        ring_count(&h->stats.records_dropped, 1);
        return -EMSGSIZE;
    }
    total = ring__record_total(payload_len);

    /* With one lane the stamp only counts; with more it is the TSC. A sample's is read
     * after everything before completed (its allocation returned); a free's (urgent) may
     * be read early: it only has to come before the free. */
    uint64_t tsc = r->lanes == 1 ? 0 : urgent ? ring__tsc() : ring__tsc_ordered();
    /* The CPU's lane first; one without room sends us on to the next that has (below). */
    uint32_t lane = ring_writer_lane(r);
    struct ring_lane *l = &r->lane[lane];
    uint64_t cur[2];
    ring_lane_words(l, cur);
    uint64_t w, stamp = 0;
    for (;;) {
        w = cur[0];
        /* Acquire pairs with the release store in ring_end_read(): the reader is done with
         * every byte below read_pos, so we may overwrite them. */
        rp = atomic_load_explicit(l->shared_read_pos, memory_order_acquire);
        if ((int64_t)(w - rp) < 0) {
            /* Our copy of write_pos is older than the reader's position: reload. */
            ring_lane_words(l, cur);
            if (++cas_failures >= RING_MAX_CAS_RETRIES) {
                err = -EAGAIN;
                ring_count(&h->stats.reserve_failures, 1);
                break;
            }
            continue;
        }
        if (w - rp + total > limit) {
            /* The next lane with room, if any, before a drop or a wait: a thread that
             * fills its CPU's lane (a program of one busy thread, a reader behind) has the
             * whole ring, and a lane that other writers filled since we looked is left
             * for one that has room (frees, whose samples were reserved in any lane,
             * crowd the lanes of the CPUs they run on up to the end of the frees'
             * reserve). A few times: the lanes change under us. */
            if (r->lanes > 1 && lane_moves < 2 * r->lanes) {
                uint32_t room = ring_lane_with_room(r, lane, total, limit);
                if (room < r->lanes) {
                    lane_moves++;
                    lane = room;
                    l = &r->lane[lane];
                    ring_lane_words(l, cur);
                    continue;
                }
            }
            if (urgent || !atomic_load_explicit(&r->blocking, memory_order_relaxed)) {
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
                /* No room for the whole timeout: the reader is stopped, hung or far
                 * behind, and every record would now wait as long. Stop blocking (every
                 * writer thread of this process sees the flag on its next round) until
                 * the client turns it on again (ring_set_blocking(), once the reader
                 * caught up); the reader learns it from block_timeouts. */
                atomic_store_explicit(&r->blocking, false, memory_order_relaxed);
                ring_count(&h->stats.block_timeouts, 1);
                err = -EAGAIN;
                ring_count(&h->stats.records_dropped, 1);
                break;
            }
            ring_block_pause(block_rounds++);
            if (r->lanes > 1) {
                /* The reader frees the lanes in stamp order: the first to have room
                 * again may be another one (this one may hold the newest records). */
                uint32_t room = ring_lane_with_room(r, lane, total, limit);
                if (room < r->lanes)
                    lane = room;
                l = &r->lane[lane];
                tsc = ring__tsc_ordered();
            }
            ring_lane_words(l, cur);
            continue;
        }
        /* Position and stamp move together: stamps grow along the lane whoever reserves
         * (ring_layout.h). The compare-and-swap orders the reservation against the reader
         * through read_pos (acquired above) and the commit tag (released in
         * ring_end_write()). */
        uint64_t want[2] = {w + total, tsc > cur[1] ? tsc : cur[1] + 1};
        if (HP_LIKELY(r->cas16) ? ring__cas16(l->word, cur, want)
                                : atomic_compare_exchange_weak_explicit(
                                      &l->word[0], &cur[0], w + total, memory_order_relaxed,
                                      memory_order_relaxed)) {
            /* (Without cmpxchg16b, one lane: the position alone orders the records.) */
            stamp = want[1];
            break;
        }
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
    ring_open_record(r, lane, w, total, type, payload_len, stamp, ret);
    return 0;
}

int ring_try_begin_write(ring_t *r, uint16_t type, size_t payload_len, struct ring_wspan *ret)
{
    return ring_begin_write(r, type, payload_len, false, ret);
}

int ring_try_begin_write_nowait(ring_t *r, uint16_t type, size_t payload_len,
                                struct ring_wspan *ret)
{
    return ring_begin_write(r, type, payload_len, true, ret);
}

void ring_count_free_lost(ring_t *r)
{
    if (r->hdr)
        ring_count(&r->hdr->stats.frees_lost, 1);
}

void ring_count_drop(ring_t *r)
{
    if (r->hdr)
        ring_count(&r->hdr->stats.records_dropped, 1);
}

void ring_count_freeset_full(ring_t *r)
{
    if (r->hdr) {
        ring_count(&r->hdr->stats.freeset_full, 1);
        ring_count(&r->hdr->stats.records_dropped, 1);
    }
}

void ring_set_unseen_slots(ring_t *r, uint64_t n)
{
    if (r->hdr)
        atomic_store_explicit(&r->hdr->stats.unseen_slots, n, memory_order_relaxed);
}

void ring_set_client_exiting(ring_t *r)
{
    /* Relaxed: the reader reads it once the connection ended, long after. */
    if (r->hdr)
        atomic_store_explicit(&r->hdr->client_exiting, 1u, memory_order_relaxed);
}

bool ring_end_write(ring_t *r, struct ring_wspan *w)
{
    struct ring_shared *h = r->hdr;
    struct ring_rec *rec = ring__rec(r, w->lane, w->pos);
    uint64_t total = rec->len_total;

    /* Release pairs with the acquire load of the tag in ring_begin_read(): the reader sees
     * the whole record once it sees the tag. */
    atomic_store_explicit(&rec->commit_tag, w->pos ^ RING_TAG_MAGIC, memory_order_release);
    ring_prefetch_next(r, w->lane, w->pos + total);

    /* Store-load ordering between our tag store and the idle flag load, matching the
     * fence in ring_set_reader_idle(): either the reader's re-check sees this record or
     * we see its idle flag. */
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t idle = atomic_load_explicit(&h->reader_idle, memory_order_relaxed);
    if (idle == RING_READER_AWAKE)
        return false;
    if (idle == RING_READER_POLLING) {
        /* The reader comes by on its own; wake it early only when the ring fills up. */
        uint64_t fill =
            w->pos + total -
            atomic_load_explicit(r->lane[w->lane].shared_read_pos, memory_order_relaxed);
        if (fill < atomic_load_explicit(&h->wake_fill, memory_order_relaxed))
            return false;
    }
    /* Only the writer that clears the flag wakes the reader. */
    if (atomic_exchange_explicit(&h->reader_idle, RING_READER_AWAKE, memory_order_acq_rel) ==
        RING_READER_AWAKE)
        return false;
    ring_futex_wake(h);
    return true;
}

void ring_wake_reader(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    if (!h || atomic_load_explicit(&h->reader_idle, memory_order_relaxed) == RING_READER_AWAKE)
        return;
    if (atomic_exchange_explicit(&h->reader_idle, RING_READER_AWAKE, memory_order_acq_rel) !=
        RING_READER_AWAKE)
        ring_futex_wake(h);
}

void ring_set_client_ended(ring_t *r, uint32_t reason)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return;
    /* Release pairs with the reader's acquire load: whatever we wrote before is visible
     * with the reason. The reader may be awake and about to sleep: wake it regardless. */
    atomic_store_explicit(&h->client_ended, reason, memory_order_release);
    atomic_store_explicit(&h->reader_idle, RING_READER_AWAKE, memory_order_seq_cst);
    ring_futex_wake(h);
}

void ring_note_ids_changed(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return;
    /* Release: the message on the socket was sent before; the reader reads it after. */
    atomic_fetch_add_explicit(&h->ids_changes, 1, memory_order_release);
    atomic_store_explicit(&h->reader_idle, RING_READER_AWAKE, memory_order_seq_cst);
    ring_futex_wake(h);
}

void ring_count_fork_unfollowed(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    if (h)
        atomic_fetch_add_explicit(&h->forks_unfollowed, 1, memory_order_relaxed);
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
    return ring_wait_reader(h, r->lane[w->lane].shared_read_pos, w->pos + 1, 64, timeout_us);
}

void ring_count_block_resume(ring_t *r)
{
    if (r->hdr)
        ring_count(&r->hdr->block_resumes, 1);
}

void ring_set_block_given_up(ring_t *r)
{
    if (r->hdr)
        atomic_store_explicit(&r->hdr->block_given_up, 1, memory_order_relaxed);
}

bool ring_is_blocking(ring_t *r)
{
    return atomic_load_explicit(&r->blocking, memory_order_relaxed);
}

void ring_writer_progress(ring_t *r, uint64_t *ret_read_pos, uint64_t *ret_fill)
{
    struct ring_shared *h = r->hdr;
    if (!h) {
        *ret_read_pos = *ret_fill = 0;
        return;
    }
    /* The sum of the lanes' positions moves whenever the reader reads; the fullest lane
     * is what a writer may wait on. */
    uint64_t sum = 0, fill = 0;
    for (uint32_t i = 0; i < r->lanes; i++) {
        uint64_t rp = atomic_load_explicit(r->lane[i].shared_read_pos, memory_order_relaxed);
        uint64_t wp = atomic_load_explicit(&r->lane[i].word[0], memory_order_relaxed);
        sum += rp;
        /* Loaded apart: a reader that moved in between reads as an empty lane. */
        if ((int64_t)(wp - rp) > 0 && wp - rp > fill)
            fill = wp - rp;
    }
    *ret_read_pos = sum;
    *ret_fill = fill;
}

uint64_t ring_size(const ring_t *r)
{
    return r->lane_size;
}

bool ring_is_detached(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    return h == NULL || atomic_load_explicit(&h->detached, memory_order_relaxed) != 0;
}

void ring_set_blocking(ring_t *r, bool block, uint32_t timeout_us)
{
    atomic_store_explicit(&r->block_timeout_us, HP_MIN(timeout_us, RING_MAX_BLOCK_TIMEOUT_US),
                          memory_order_relaxed);
    atomic_store_explicit(&r->blocking, block, memory_order_relaxed);
}

uint64_t ring_ask_maps_read(ring_t *r)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return 0;
    return atomic_fetch_add_explicit(&h->maps_asked, 1, memory_order_relaxed) + 1;
}

uint32_t ring_flush_asked(ring_t *r)
{
    return r->hdr ? atomic_load_explicit(&r->hdr->flush_asked, memory_order_relaxed) : 0;
}

void ring_flush_answer(ring_t *r, uint32_t n)
{
    /* Release: the records of the flush were reserved before. */
    atomic_store_explicit(&r->hdr->flush_done, n, memory_order_release);
}

int ring_wait_maps_read(ring_t *r, uint64_t ask)
{
    struct ring_shared *h = r->hdr;
    if (!h)
        return -EPIPE;
    if (!atomic_load_explicit(&r->blocking, memory_order_relaxed))
        return -EAGAIN;
    int err = ring_wait_reader(h, &h->maps_read, ask, 32,
                               atomic_load_explicit(&r->block_timeout_us, memory_order_relaxed));
    if (err == -ETIMEDOUT) {
        /* As a wait for room that runs out: the reader is stopped or hung. */
        atomic_store_explicit(&r->blocking, false, memory_order_relaxed);
        ring_count(&h->stats.block_timeouts, 1);
    }
    return err;
}
