/* producer/writer.c: a trace writer: one packet sequence of one data source instance,
 * written into the SMB.
 *
 * A packet is copied into the current chunk as fragments:
 *
 *     chunk N      [..packets..][size|first bytes]      flags: CONT_ON_NEXT
 *     chunk N+1    [size|middle bytes]                  flags: CONT_FROM_PREV | CONT_ON_NEXT
 *     chunk N+2    [size|last bytes][next packet]...    flags: CONT_FROM_PREV
 *
 * Every size is known when it is written (the packet was encoded whole before), so no
 * chunk needs patching. A fragment that fills the rest of its chunk gets a 4-byte
 * (redundant varint) size, a small whole packet a 1-byte one. Chunk ids count up from
 * 0 without gaps: an id is taken only with a chunk.
 *
 * When no chunk is free the writer waits, bounded by its stall budget, for the owner
 * thread's commits to free some (it never holds a chunk while it waits). Past the
 * budget the packet is dropped: a packet already begun in an earlier chunk is closed
 * by a fragment of the drop size sentinel at the start of the next chunk (traced counts
 * it as trace_writer_packet_loss), and the next packet written carries
 * previous_packet_dropped (SMB full).
 *
 * Threads: the writing thread holds @lock for each packet; the owner thread only
 * try-locks it, to complete the current chunk for a flush or for a starved writer.
 */
#include "producer/producer_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "common/pbwire.h"
#include "protos/trace_packet.pb.h"

/* previous_packet_dropped = DATA_LOSS_PRESENT | DATA_LOSS_SMB_FULL (1 | 256), appended
 * to the packet after a loss: field 42, varint. */
#define LOSS_VALUE 257u
#define LOSS_TAG ((uint32_t)perfetto_protos_TracePacket_previous_packet_dropped_tag << 3)
static const uint8_t loss_trailer[4] = {(uint8_t)(LOSS_TAG | 0x80), (uint8_t)(LOSS_TAG >> 7),
                                        (uint8_t)(LOSS_VALUE | 0x80), (uint8_t)(LOSS_VALUE >> 7)};
_Static_assert(LOSS_TAG >= 128 && LOSS_TAG < 16384 && LOSS_VALUE >= 128 && LOSS_VALUE < 16384,
               "two-byte varints");

/* A fragment starts only with room for its size and one byte (the C++ writer's rule). */
#define MIN_FRAGMENT_ROOM 5

int prod__writer_new(struct prod__smb *smb, uint16_t id, uint32_t target_buffer,
                     uint32_t stall_budget_ms, prod_writer_t **ret)
{
    prod_writer_t *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    atomic_init(&w->refs, 1);
    w->smb = prod__smb_ref(smb);
    w->id = id;
    w->target_buffer = target_buffer;
    w->stall_budget_ms = stall_budget_ms;
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->flush_req, 0);
    atomic_init(&w->flushed, 0);
    atomic_init(&w->clear_req, false);
    atomic_init(&w->detached, false);
    *ret = w;
    return 0;
}

prod_writer_t *prod_writer_ref(prod_writer_t *w)
{
    atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
    return w;
}

prod_writer_t *prod_writer_unref(prod_writer_t *w)
{
    if (!w || atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) != 1)
        return NULL;
    /* A chunk still held goes back as Complete (it may be empty): traced frees it when it
     * is committed, or the SMB dies with the connection. */
    if (w->chunk) {
        prod__smb_complete(w->smb, w->page, w->chunk_index);
        prod__smb_queue_move(w->smb,
                             &(struct prod__move){w->page, w->chunk_index, w->target_buffer});
    }
    prod__smb_unref(w->smb);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return NULL;
}

static inline uint16_t *packets_word(const prod_writer_t *w)
{
    return (uint16_t *)(void *)(w->chunk + 6);
}

static void store_packets_word(prod_writer_t *w)
{
    __atomic_store_n(packets_word(w), (uint16_t)(w->count | w->flags << 10), __ATOMIC_RELEASE);
}

/* Completes the current chunk and queues it for commit. pre: lock held, chunk held. */
static void complete_chunk(prod_writer_t *w)
{
    store_packets_word(w);
    prod__smb_complete(w->smb, w->page, w->chunk_index);
    prod__smb_queue_move(w->smb, &(struct prod__move){w->page, w->chunk_index, w->target_buffer});
    w->chunk = NULL;
    w->stats.chunks++;
}

static bool gone(prod_writer_t *w)
{
    return atomic_load_explicit(&w->detached, memory_order_acquire);
}

/* Takes a chunk, waiting for the owner's commits to free one up to the stall budget
 * (counted from @deadline_ns). Writes its header with @flags. Returns 0, -ENOBUFS (no
 * chunk in time) or -EPIPE (the SMB or the instance is gone). pre: lock held, no chunk
 * held. */
static int acquire_chunk(prod_writer_t *w, uint16_t flags, uint64_t *deadline_ns)
{
    struct prod__smb *s = w->smb;
    uint8_t *start;
    size_t size;
    uint64_t wait_start = 0;
    int r;
    for (;;) {
        if (gone(w))
            return -EPIPE;
        r = prod__smb_try_acquire(s, &w->page, &w->chunk_index, &start, &size);
        if (r == 0)
            break;
        uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
        if (!wait_start)
            wait_start = now;
        if (*deadline_ns == 0)
            *deadline_ns = now + (uint64_t)w->stall_budget_ms * 1000000u;
        if (now >= *deadline_ns) {
            w->stats.stall_us += (now - wait_start) / 1000;
            return -ENOBUFS;
        }
        /* Ask the owner to commit (and to complete chunks idle writers hold), then wait
         * for a CommitData reply, rechecking every few ms in case chunks came free
         * otherwise (another writer's commit). */
        pthread_mutex_lock(&s->lock);
        if (s->dead) {
            pthread_mutex_unlock(&s->lock);
            return -EPIPE;
        }
        uint64_t gen = s->freed_gen;
        bool wake_owner = !s->starved;
        s->starved = true;
        pthread_mutex_unlock(&s->lock);
        if (wake_owner) {
            uint64_t one = 1;
            (void)!write(s->wake_fd, &one, sizeof(one));
        }
        uint64_t until = HP_MIN(*deadline_ns, now + 5000000u);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t rel = until - now;
        ts.tv_sec += (time_t)(rel / 1000000000u);
        ts.tv_nsec += (long)(rel % 1000000000u);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&s->lock);
        while (s->freed_gen == gen && !s->dead &&
               pthread_cond_timedwait(&s->freed, &s->lock, &ts) == 0)
            ;
        pthread_mutex_unlock(&s->lock);
    }
    if (wait_start)
        w->stats.stall_us += (hp_clock_ns(CLOCK_MONOTONIC) - wait_start) / 1000;
    w->chunk = start;
    w->pos = PROD_CHUNK_HEADER_BYTES;
    w->end = size;
    w->count = 0;
    w->flags = flags;
    uint32_t id = w->next_chunk_id++;
    __atomic_store_n((uint32_t *)(void *)start, id, __ATOMIC_RELAXED);
    __atomic_store_n((uint16_t *)(void *)(start + 4), w->id, __ATOMIC_RELAXED);
    store_packets_word(w);
    return 0;
}

/* A packet was cut after a fragment that continues: the next chunk of the sequence
 * starts with a continuation whose size is the drop sentinel, alone in its chunk (traced
 * ignores whatever follows the sentinel). pre: lock held, no chunk held. */
static int close_orphan(prod_writer_t *w, uint64_t *deadline_ns)
{
    int r = acquire_chunk(w, PROD_CHUNK_CONT_FROM_PREV, deadline_ns);
    if (r < 0)
        return r;
    hp_pb_put_varint4(w->chunk + w->pos, PROD_DROP_SENTINEL);
    w->pos += 4;
    w->count = 1;
    complete_chunk(w);
    w->orphan = false;
    return 0;
}

/* A cursor over the packet's pieces (and the loss trailer). */
struct src {
    const struct iovec *iov;
    int n, i;
    size_t off;
};

static void src_copy(struct src *s, uint8_t *dst, size_t len)
{
    while (len) {
        const struct iovec *v = &s->iov[s->i];
        size_t k = HP_MIN(len, v->iov_len - s->off);
        memcpy(dst, (const uint8_t *)v->iov_base + s->off, k);
        dst += k;
        len -= k;
        s->off += k;
        if (s->off == v->iov_len) {
            s->i++;
            s->off = 0;
        }
    }
}

/* Serves the owner's flush request left while the writer was busy. pre: lock held. */
static void serve_flush(prod_writer_t *w)
{
    uint64_t req = atomic_load_explicit(&w->flush_req, memory_order_acquire);
    if (req <= atomic_load_explicit(&w->flushed, memory_order_relaxed))
        return;
    if (w->chunk)
        complete_chunk(w);
    /* release: the owner sees the queued move once it sees the flush done. */
    atomic_store_explicit(&w->flushed, req, memory_order_release);
    uint64_t one = 1;
    (void)!write(w->smb->wake_fd, &one, sizeof(one));
}

static int write_locked(prod_writer_t *w, const struct iovec *iov, int n, size_t len)
{
    uint64_t deadline = 0;
    int r;
    if (gone(w))
        return -EPIPE;
    if (w->orphan && (r = close_orphan(w, &deadline)) < 0)
        return r;
    struct iovec pieces[16];
    const struct iovec *v = iov;
    size_t total = len;
    if (w->lost) {
        /* Appending a field keeps the packet valid protobuf. */
        if (n + 1 > (int)HP_ARRAY_SIZE(pieces))
            return -EINVAL;
        memcpy(pieces, iov, (size_t)n * sizeof(*iov));
        pieces[n++] = (struct iovec){(void *)loss_trailer, sizeof(loss_trailer)};
        v = pieces;
        total += sizeof(loss_trailer);
    }
    struct src src = {v, n, 0, 0};
    while (src.i < src.n && src.iov[src.i].iov_len == 0)
        src.i++;
    size_t left = total;
    bool first = true;
    while (first || left) {
        if (w->chunk &&
            (w->end - w->pos < MIN_FRAGMENT_ROOM || w->count >= PROD_MAX_PACKETS_PER_CHUNK))
            complete_chunk(w);
        if (!w->chunk && (r = acquire_chunk(w, 0, &deadline)) < 0)
            return r;
        size_t room = w->end - w->pos;
        size_t frag;
        uint8_t *q = w->chunk + w->pos;
        if (left < 128 && left + 1 <= room) {
            frag = left;
            *q = (uint8_t)frag;
            w->pos += 1;
        } else {
            frag = HP_MIN(left, room - 4);
            hp_pb_put_varint4(q, (uint32_t)frag);
            w->pos += 4;
        }
        w->count++;
        store_packets_word(w);
        src_copy(&src, w->chunk + w->pos, frag);
        w->pos += frag;
        left -= frag;
        first = false;
        if (!left)
            break;
        /* The packet continues in the next chunk of the sequence. */
        w->flags |= PROD_CHUNK_CONT_ON_NEXT;
        complete_chunk(w);
        r = acquire_chunk(w, PROD_CHUNK_CONT_FROM_PREV, &deadline);
        if (r < 0) {
            w->orphan = true;
            return r;
        }
    }
    w->lost = false;
    w->stats.packets++;
    w->stats.bytes += total;
    return 0;
}

int prod_writer_write(prod_writer_t *w, const struct iovec *iov, int n, size_t len)
{
    pthread_mutex_lock(&w->lock);
    int r = write_locked(w, iov, n, len);
    if (r < 0) {
        w->lost = true;
        w->stats.packets_dropped++;
    }
    serve_flush(w);
    pthread_mutex_unlock(&w->lock);
    return r;
}

void prod_writer_finish(prod_writer_t *w)
{
    pthread_mutex_lock(&w->lock);
    if (w->chunk)
        complete_chunk(w);
    pthread_mutex_unlock(&w->lock);
    prod__smb_wake(w->smb);
}

bool prod_writer_take_clear_request(prod_writer_t *w)
{
    return atomic_exchange_explicit(&w->clear_req, false, memory_order_acq_rel);
}

void prod_writer_get_stats(prod_writer_t *w, struct prod_writer_stats *ret)
{
    pthread_mutex_lock(&w->lock);
    *ret = w->stats;
    pthread_mutex_unlock(&w->lock);
}

bool prod__writer_flush(prod_writer_t *w, uint64_t req)
{
    if (pthread_mutex_trylock(&w->lock) == 0) {
        if (w->chunk)
            complete_chunk(w);
        atomic_store_explicit(&w->flushed, req, memory_order_relaxed);
        pthread_mutex_unlock(&w->lock);
        return true;
    }
    /* Busy: the writer serves it when its packet is done (serve_flush). */
    uint64_t cur = atomic_load_explicit(&w->flush_req, memory_order_relaxed);
    while (cur < req && !atomic_compare_exchange_weak_explicit(
                            &w->flush_req, &cur, req, memory_order_release, memory_order_relaxed))
        ;
    return false;
}

bool prod__writer_flushed(prod_writer_t *w, uint64_t req)
{
    return atomic_load_explicit(&w->flushed, memory_order_acquire) >= req;
}

void prod__writer_release_idle(prod_writer_t *w)
{
    if (pthread_mutex_trylock(&w->lock) != 0)
        return;
    if (w->chunk && w->count > 0)
        complete_chunk(w);
    pthread_mutex_unlock(&w->lock);
}
