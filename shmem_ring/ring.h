/* shmem_ring/ring.h: the shared-memory ring between a profiled process (many writers:
 * every thread of the app) and the service (one reader: the unwinder thread owning the
 * client).
 *
 * The ring lives in a memfd the service creates (close-on-exec, sealed against resizing)
 * and sends to the client; both sides map it. Its data area may be cut into lanes, one
 * per CPU (ring_create_lanes()), so that threads recording at once share no line; each
 * lane is mapped twice back to back so every record is contiguous. Writers reserve space
 * in their CPU's lane with a compare-and-swap of its write position and last stamp (no
 * lock held while copying), fill the record, then publish it with a release store of its
 * commit tag. The reader consumes the records in the order they were reserved: along a
 * lane by position, across lanes by stamp (shmem_ring/ring_layout.h).
 *
 *     service:  ring_create_lanes(8 << 20, ring_lanes_for(8 << 20, max), &fd);
 *               ring_map(fd, RING_ROLE_READER, &r);
 *     client:   ring_map(fd, RING_ROLE_WRITER, &r);
 *               if (ring_try_begin_write(r, WIRE_FREE, sizeof(f), &w) == 0) {
 *                   memcpy(w.data, &f, sizeof(f));
 *                   ring_end_write(r, &w); // wakes a sleeping reader itself
 *               }
 *     reader:   while (ring_begin_read(r, &rd) == 0) { use(rd.type, rd.data, rd.len);
 *                                                       ring_end_read(r, &rd); }
 *               ring_set_reader_idle(r, true); (drain once more); ring_wait(r, 1000);
 *
 * The reader sleeps on a futex word in the shared header, which writers wake: no
 * descriptor is involved, so nothing a program does to its descriptors can make a writer
 * write into the wrong one.
 *
 * Writer calls are hook-safe (no allocation, no locks, no syscalls except a FUTEX_WAKE
 * when the reader sleeps, the thread id once per thread and ring, and the waits of
 * block_client mode). Reader calls: one reader thread per ring; not thread-safe.
 */
#ifndef HP_SHMEM_RING_RING_H
#define HP_SHMEM_RING_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

typedef struct ring ring_t;

#define RING_DEFAULT_SIZE (8u << 20)
#define RING_MIN_SIZE (64u << 10)
/* The smallest lane of a ring cut into lanes (ring_create_lanes()). */
#define RING_MIN_LANE_SIZE RING_MIN_SIZE
#define RING_MAX_SIZE (1u << 30)
/* The longest block_client wait ring_set_blocking() accepts: a reader that made no room
 * for that long is stopped, hung or far behind, and the program must not pause longer
 * for it (a wait that runs out ends blocking until the client turns it on again, see
 * preload/blockstate.h). Sanitizer builds of the service stall for
 * more than a second now and then, which shorter caps turn into drops. */
#define RING_MAX_BLOCK_TIMEOUT_US (10u * 1000u * 1000u)
/* ring_try_begin_write() leaves this share of the ring (1/8: 1 MiB, 32 k frees, of the
 * default 8 MiB) to ring_try_begin_write_nowait(), in block mode and out of it: frees
 * find room while samples wait for it or are dropped. */
#define RING_URGENT_RESERVE_SHIFT 3
/* Largest payload a single record may carry (a 64 KiB stack plus the alloc header fits). */
#define RING_MAX_PAYLOAD ((1u << 20) - 64u)
/* A reserved record unpublished for this long makes ring_begin_read() report a stalled
 * writer (-ETIMEDOUT). */
#define RING_DEFAULT_STALL_TIMEOUT_US (2u * 1000u * 1000u)

enum ring_role { RING_ROLE_READER = 0, RING_ROLE_WRITER = 1 };

/* Why a client ended its session itself (ring_set_client_ended()). */
enum ring_end_reason {
    RING_END_NONE = 0,
    RING_END_CONN_TAKEN = 1,  /* the program closed or reused the client's connection */
    RING_END_CREDENTIALS = 2, /* the process changed its user or group ids */
};

/* A reserved, not yet published record. */
struct ring_wspan {
    void *data;    /* payload; 8-byte aligned; valid until ring_end_write() */
    size_t len;    /* payload bytes reserved */
    uint64_t pos;  /* internal */
    uint32_t lane; /* internal */
};

/* A record to read. */
struct ring_rspan {
    const void *data; /* payload, borrowed; valid until ring_end_read(); shared memory:
                         copy what you validate */
    size_t len;       /* payload bytes */
    uint16_t type;    /* enum wire_type, unvalidated */
    uint64_t pos;     /* internal */
    size_t total;     /* internal */
    uint32_t lane;    /* internal */
    uint64_t stamp;   /* internal */
};

struct ring_stats {
    uint64_t records_read;    /* reader side: records consumed (0 on the writer side) */
    uint64_t bytes_read;      /* reader side: bytes of those records, headers and padding
                                 included */
    uint64_t records_dropped; /* dropped because the ring was full or the record too big */
    uint64_t reserve_failures;
    uint64_t client_spinlock_blocked_us;
    uint64_t max_fill_bytes;
    uint64_t size_bytes;      /* data area size */
    uint64_t frees_lost;      /* frees of sampled blocks the client could not record */
    uint64_t block_timeouts;  /* block waits that ran out; each ended blocking for a while */
    uint64_t block_resumes;   /* times the client turned blocking on again after one */
    uint64_t block_given_up;  /* 1: the client stopped waiting for good (reader stuck) */
    uint64_t records_skipped; /* reader side: records of writers gone mid-record */
    uint64_t freeset_full;    /* of records_dropped, samples whose address the client could
                                 not watch for its free (its set was full) */
    uint64_t unseen_slots;    /* the program's call slots of the allocator the client left
                                 pointing at it: calls through them are not recorded */
};

/* Service: creates a ring memfd with a data area of @data_size_bytes (power of two,
 * RING_MIN_SIZE..RING_MAX_SIZE; else -EINVAL). Returns the fd in @ret_fd. */
int ring_create(size_t data_size_bytes, int *ret_fd) HP_WARN_UNUSED;
/* Service: as ring_create(), with the data area cut into @lanes lanes (a power of two up
 * to 8, each at least RING_MIN_LANE_SIZE; else -EINVAL) that writers on different CPUs
 * fill side by side, and the reader merges in the order the records were reserved
 * (ring_layout.h). */
int ring_create_lanes(size_t data_size_bytes, unsigned lanes, int *ret_fd) HP_WARN_UNUSED;
/* Whether a ring of @data_size_bytes may be cut into @lanes lanes (as ring_create_lanes()
 * asks). */
bool ring_lanes_valid(uint64_t data_size_bytes, uint32_t lanes);
/* Service: the lanes for a ring of @data_size_bytes on this machine, whose largest record
 * is @max_record_bytes: one per CPU up to 8, fewer when a lane would not take such a
 * record beside the share frees keep, and 1 when the time stamp counter cannot order
 * records across CPUs (the kernel does not use it as its clock). */
unsigned ring_lanes_for(size_t data_size_bytes, size_t max_record_bytes);

/* Both sides: maps the ring in @fd (borrowed; may be closed afterwards). Validates the
 * seals ring_create() puts on (-EPERM without them: a file that could shrink under us),
 * the size from fstat and the header written by ring_create (-EBADMSG). */
int ring_map(int fd, enum ring_role role, ring_t **ret) HP_WARN_UNUSED;
/* Unmaps; accepts NULL; returns NULL. */
ring_t *ring_unmap(ring_t *r);

/* Writer, hook-safe: reserves a record of @payload_len bytes of type @type. Returns 0,
 * -EAGAIN when full (record dropped and counted in records_dropped) or when it lost too
 * many reservation races (counted in reserve_failures), -EMSGSIZE when larger than
 * RING_MAX_PAYLOAD or the ring (dropped and counted), -EPIPE when the reader detached
 * (ring_set_detached()) or in a child forked after ring_map() (not counted; the data
 * area is not touched). In block mode (ring_set_blocking) waits for space up to the
 * timeout before giving up; the time spent waiting adds to client_spinlock_blocked_us. */
int ring_try_begin_write(ring_t *r, uint16_t type, size_t payload_len,
                         struct ring_wspan *ret) HP_WARN_UNUSED;
/* Writer, hook-safe: as ring_try_begin_write(), but never waits, whatever the block mode
 * (frees, and writes from a signal handler that may have interrupted a writer), and may
 * use the last 1/2^RING_URGENT_RESERVE_SHIFT of the ring, which ring_try_begin_write()
 * leaves free in block mode: frees find room while samples wait for it. */
int ring_try_begin_write_nowait(ring_t *r, uint16_t type, size_t payload_len,
                                struct ring_wspan *ret) HP_WARN_UNUSED;
/* Writer, hook-safe: counts a free of a sampled block that could not be recorded. */
void ring_count_free_lost(ring_t *r);
/* Writer, hook-safe: counts a record the writer dropped before asking for room. */
void ring_count_drop(ring_t *r);
/* Writer, hook-safe: counts a sample dropped because the client could not watch its
 * address for the free (in records_dropped and freeset_full). */
void ring_count_freeset_full(ring_t *r);
/* Writer: @n call slots of the program were left pointing at the allocator for this
 * session (their calls are not recorded). */
void ring_set_unseen_slots(ring_t *r, uint64_t n);
/* Writer, hook-safe: the process is exiting normally; the end of its connection that
 * follows is not a loss (ring_client_exiting()). Wakes nobody. */
void ring_set_client_exiting(ring_t *r);
/* Writer, hook-safe: publishes the record. When the reader said it is idle (and, if it
 * polls, enough is waiting), wakes it (FUTEX_WAKE on the shared header) and returns
 * true. */
bool ring_end_write(ring_t *r, struct ring_wspan *w);
/* Writer, hook-safe: wakes the reader if it announced sleep (no system call otherwise),
 * e.g. after ring_try_begin_write() found the ring full. */
void ring_wake_reader(ring_t *r);
/* Writer: the client ends the session itself for @reason (enum ring_end_reason); records
 * it in the shared header and wakes the reader. */
void ring_set_client_ended(ring_t *r, uint32_t reason);
/* Writer, after ring_end_write(@w): waits until the reader has read past the record
 * @w, for at most @timeout_us (sleeping in steps; a system call per step). Returns 0,
 * -ETIMEDOUT, or -EPIPE when the reader detached. The reader publishes how far it read
 * lazily: the service calls ring_flush_read_pos() for the records a writer waits on. */
int ring_wait_consumed(ring_t *r, const struct ring_wspan *w, uint32_t timeout_us) HP_WARN_UNUSED;
/* Writer, hook-safe: the process loaded code; the next number of a maps read it asks of
 * the reader, which the writer sends in a record (WIRE_MAPS_CHANGED) and may wait for
 * with ring_wait_maps_read(). */
uint64_t ring_ask_maps_read(ring_t *r);
/* Writer: the process changed its user or group ids and the client took the new ones,
 * after telling the service on the socket (struct wire_ids): counts it and wakes the
 * reader, which then checks them (ring_ids_changes()). */
void ring_note_ids_changed(ring_t *r);
/* Writer, hook-safe: a child of fork() the session does not follow. */
void ring_count_fork_unfollowed(ring_t *r);
/* Writer: in block mode, waits until the reader read the maps for the ask @ask (or a later
 * one), at most the block timeout (sleeping in steps; a system call per step), which
 * like a wait for space that runs out ends blocking for good. Compares the low 32 bits
 * (a record carries those). Returns 0, -EAGAIN (not in block mode), -ETIMEDOUT, or -EPIPE
 * when the reader detached. */
int ring_wait_maps_read(ring_t *r, uint64_t ask) HP_WARN_UNUSED;
/* Writer: make ring_try_begin_write() wait up to @timeout_us (at most
 * RING_MAX_BLOCK_TIMEOUT_US) for space. A wait that runs out ends blocking: the reader is
 * stopped, hung or far behind, and every later record would wait as long; from then on
 * records are dropped (counted), and block_timeouts tells the reader, until the writer
 * turns blocking on again (the client does once the reader caught up:
 * preload/blockstate.h). Hook-safe (relaxed stores). */
void ring_set_blocking(ring_t *r, bool block, uint32_t timeout_us);
/* Writer, hook-safe: true in block mode (not ended by a timeout). */
bool ring_is_blocking(ring_t *r);
/* Writer, hook-safe: the reader's published position (it moves while the reader reads)
 * and the bytes reserved beyond it. Untrusted hints: both change at any time. */
void ring_writer_progress(ring_t *r, uint64_t *ret_read_pos, uint64_t *ret_fill);
/* Either side: a lane's size (the data area's, with one lane): what the writers of one CPU
 * fill, and what fills and positions of ring_writer_progress() compare with. */
uint64_t ring_size(const ring_t *r);
/* Writer, hook-safe: counts blocking turned on again after a timeout (block_resumes). */
void ring_count_block_resume(ring_t *r);
/* Writer, hook-safe: the client stopped waiting for the reader for good (block_given_up). */
void ring_set_block_given_up(ring_t *r);
/* Writer, hook-safe: true once the reader detached (the session is over: stop writing
 * and go passthrough), or in a child forked after ring_map(). One relaxed load. */
bool ring_is_detached(ring_t *r);

/* Reader: returns 0 with the next record, -EAGAIN when there is none yet (empty, or the
 * next record is still being written), -EBADMSG when the shared data is corrupt (the
 * reader must then give up on this ring). Never reads outside the mapping and never
 * loops. A record reserved but still unpublished after the stall timeout
 * (RING_DEFAULT_STALL_TIMEOUT_US unless changed) returns -ETIMEDOUT: its writer is
 * stopped (debugger, SIGSTOP, freezer), gone, or hostile. The caller then looks at the
 * writer (ring_stalled_writer()) and keeps waiting (ring_stall_rearm()), skips the record
 * (ring_skip_stalled()) or gives up on the ring; until then every call returns
 * -ETIMEDOUT again. */
int ring_begin_read(ring_t *r, struct ring_rspan *ret) HP_WARN_UNUSED;
/* Reader, after -ETIMEDOUT: the thread id the stalled record's writer stored in it, or 0
 * when it holds none (its writer stopped before storing it, or a hostile client).
 * Untrusted. */
uint32_t ring_stalled_writer(ring_t *r);
/* Reader, after -ETIMEDOUT: wait another stall timeout before reporting it again. */
void ring_stall_rearm(ring_t *r);
/* Reader, after -ETIMEDOUT, once its writer is known to be gone: steps over the stalled
 * record (counted in records_skipped). Returns 0, -EAGAIN when it was published after
 * all (read it as usual), or -EBADMSG when its header is not valid (give up on the
 * ring). */
int ring_skip_stalled(ring_t *r) HP_WARN_UNUSED;
void ring_end_read(ring_t *r, const struct ring_rspan *rd);
/* Reader: the maps were read for the ask @ask (from the record that carried it) and every
 * one before it. */
void ring_maps_read_done(ring_t *r, uint64_t ask);
/* Reader: tells the writers at once how far it has read (ring_end_read() publishes it in
 * steps), for a writer in ring_wait_consumed(). */
void ring_flush_read_pos(ring_t *r);
/* Reader: a mark at the current end of the ring (every record reserved so far lies
 * before it), for ring_reached(). Lets the reader drain what was written up to a moment,
 * such as a dump request, without chasing writers that keep writing. Untrusted like the
 * rest of the shared header: use it as a bound only. */
uint64_t ring_mark(ring_t *r);
/* Reader: true once every record before @mark has been read. With lanes the mark is a
 * stamp, and a ring whose lanes are all empty may have the reader raise their horizons
 * (ring_layout.h) to tell. */
bool ring_reached(ring_t *r, uint64_t mark);
/* Reader: announce that the reader is about to sleep (idle: every writer's record may
 * wake it; the first writer to see the flag clears it and pokes) or that it is awake
 * (!idle: no pokes). After announcing sleep the reader must call ring_begin_read() once
 * more before sleeping, so no wakeup is lost. */
void ring_set_reader_idle(ring_t *r, bool idle);
/* Reader: announce that the reader will look at the ring again on its own within a short
 * time, so writers poke only once @wake_fill bytes (0: a quarter of the ring) are
 * waiting. Saves the app a system call and the service a wakeup per record when records
 * trickle in. Cleared like the idle flag (by the poking writer or ring_set_reader_idle). */
void ring_set_reader_polling(ring_t *r, uint64_t wake_fill);
/* Reader: the futex word writers wake (a 32-bit word in the shared mapping: wait on it
 * without FUTEX_PRIVATE_FLAG) and, in @ret_val, the value it holds while nobody woke the
 * reader since its last ring_set_reader_idle() or ring_set_reader_polling(). For
 * futex_waitv(2) over many rings. */
const void *ring_reader_word(ring_t *r, uint32_t *ret_val);
/* Reader: sleeps until a writer wakes it or @timeout_ms pass (at once if one did
 * already). Returns 0 when woken, -ETIMEDOUT, or -EINTR. */
int ring_wait(ring_t *r, uint32_t timeout_ms);
/* Reader: why the client ended the session itself (enum ring_end_reason; RING_END_NONE:
 * it did not say). Untrusted. */
uint32_t ring_client_ended(ring_t *r);
/* Reader: how often the client said its process changed ids (ring_note_ids_changed()).
 * Untrusted: only a change tells the reader to look at the socket. */
uint32_t ring_ids_changes(ring_t *r);
/* Reader: children of fork() the client did not follow. Untrusted. */
uint64_t ring_forks_unfollowed(ring_t *r);
/* Reader: true when the client said its process was exiting normally. Untrusted. */
bool ring_client_exiting(ring_t *r);
/* What ring_discard() counts of a record of a type in its mask: @payload (@len bytes, as
 * untrusted as the rest of the ring) when the record was published, NULL when it was
 * reserved and never published. */
typedef uint64_t (*ring_count_fn)(uint16_t type, const void *payload, size_t len, void *arg);
/* Reader, once the session is over (ring_set_detached()): steps over every record
 * before @mark (ring_mark()) without reading it, published or not, and counts them in
 * @ret_records; adds to @ret_of_type for each record of a type in the mask @types (bit
 * 1 << type) 1, or what @count (if not NULL) says of it. Returns 0 once at @mark, or
 * -EBADMSG at a record whose header is not valid (the rest is not counted). */
int ring_discard(ring_t *r, uint64_t mark, uint32_t types, ring_count_fn count, void *arg,
                 uint64_t *ret_records, uint64_t *ret_of_type) HP_WARN_UNUSED;

/* Reader: how long ring_begin_read() waits for a reserved record to be published before
 * returning -EBADMSG (0: the default). */
void ring_set_stall_timeout(ring_t *r, uint64_t timeout_us);
/* Reader: tells the writers the session is over (before the service closes the client's
 * socket); from then on ring_try_begin_write() returns -EPIPE. Records already reserved
 * may still be published and can be drained. */
void ring_set_detached(ring_t *r);

/* Frees held in batches by the client (WIRE_FEATURE_FREE_BATCH), recorded when asked.
 * Reader: counts an ask (the client's session thread looks every few milliseconds);
 * returns its number. */
uint32_t ring_ask_flush(ring_t *r);
/* Reader: true once the client answered ask @n or a later one (an untrusted hint). */
bool ring_flush_answered(ring_t *r, uint32_t n);
/* Writer: the last ask. */
uint32_t ring_flush_asked(ring_t *r);
/* Writer: the records for ask @n are reserved. */
void ring_flush_answer(ring_t *r, uint32_t n);

/* Either side: a snapshot of the shared statistics (unvalidated on the reader side). */
void ring_get_stats(ring_t *r, struct ring_stats *ret);

#endif
