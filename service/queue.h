/* service/queue.h: what the service's threads send one another: the messages an unwinder
 * thread (or the session's owner thread) posts to the bookkeeping thread, the batches that
 * carry them, and the bounded queue of batches between them (service/queue.c). Messages
 * are plain data: no pointer into another thread's state crosses the queue.
 *
 *     struct svc_batcher b = {.q = &s->bkq};
 *     struct svc_msg_free *m = svc__batch_add(&b, SVC_MSG_FREE, pid, sizeof(*m));
 *     if (m) m->addr = addr;
 *     svc__batch_flush(&b);            // the bookkeeping thread: svc__bkq_take()
 */
#ifndef HP_SERVICE_QUEUE_H
#define HP_SERVICE_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bookkeeping/bookkeeping.h"

/* ---- Messages to the bookkeeping thread ---------------------------------------- */

enum svc_msg_type {
    SVC_MSG_PROC_START = 1,
    SVC_MSG_ALLOC = 2,
    SVC_MSG_FREE = 3,
    SVC_MSG_PROC_END = 4,
    SVC_MSG_DUMP_ALL = 5,
    /* From an unwinder thread: it has drained every ring after @n dump requests
     * (svc_dump_now); the dump happens once every unwinder has answered. */
    SVC_MSG_DUMP_BARRIER = 6,
    /* The process is not profiled: another session profiles it (svc_reject_concurrent),
     * or its ring would have taken the service past its memory guardrail. */
    SVC_MSG_REJECTED = 7,
    /* The process's statistics and flags as of now, for the dump that follows. */
    SVC_MSG_PROC_STATS = 8,
    /* The process retitled itself: its command line now. */
    SVC_MSG_PROC_RENAME = 9,
    /* A question of another thread about the profiles (svc_query()), answered in turn. */
    SVC_MSG_QUERY = 10,
    /* The process named one of its heaps (WIRE_HEAP_NAME). */
    SVC_MSG_HEAP_NAME = 11,
    /* Frees of the process's sampled blocks were lost: every allocation posted so far may
     * have been freed (bk_mark_possibly_freed()). No body. */
    SVC_MSG_POSSIBLY_FREED = 12,
};

/* Messages are 8-byte aligned and packed in a batch one after another. Each starts with
 * this head; the type says which struct it is. */
struct svc_msg {
    uint32_t type; /* enum svc_msg_type */
    uint32_t len;  /* bytes of the whole message, aligned to 8 */
    int32_t pid;
    uint32_t reserved;
};

/* A process's session started; followed by its cmdline (cmdline_len bytes).
 * process_start_ts: when the process started (the dumps' clock; 0: unknown). */
struct svc_msg_proc_start {
    struct svc_msg h;
    uint64_t sampling_interval_bytes;
    uint64_t process_start_ts;
    uint32_t cmdline_len;
    bool from_startup;
};

/* SVC_MSG_PROC_RENAME: followed by the new cmdline (cmdline_len bytes). */
struct svc_msg_proc_rename {
    struct svc_msg h;
    uint32_t cmdline_len;
    uint32_t reserved;
};

/* A sampled allocation, unwound; followed by its frames (n_frames, leaf first). */
struct svc_msg_alloc {
    struct svc_msg h;
    uint32_t heap_id; /* the client's heap id (untrusted) */
    uint32_t n_frames;
    uint64_t seq, addr, size, sample_size;
};

/* SVC_MSG_HEAP_NAME: heap @heap_id (> 0) is called @name (NUL-terminated). */
struct svc_msg_heap_name {
    struct svc_msg h;
    uint32_t heap_id;
    char name[64];
    uint32_t reserved;
};

/* The free of a sampled allocation. */
struct svc_msg_free {
    struct svc_msg h;
    uint32_t heap_id;
    uint32_t reserved;
    uint64_t seq, addr;
};

/* The session ended: final dump with @flags (BK_FLAG_*) and the process's statistics.
 * SVC_MSG_PROC_STATS has the same layout: the statistics and flags so far. */
struct svc_msg_proc_end {
    struct svc_msg h;
    uint32_t flags;
    uint32_t reserved;
    struct bk_process_stats stats;
};

/* SVC_MSG_REJECTED: why. */
struct svc_msg_rejected {
    struct svc_msg h;
    uint32_t flags; /* BK_FLAG_HIT_GUARDRAIL, or 0: another session profiles it */
    uint32_t reserved;
};

/* SVC_MSG_DUMP_BARRIER: see enum svc_msg_type. */
struct svc_msg_dump_barrier {
    struct svc_msg h;
    uint32_t unwinder;
    uint32_t n;
};

/* SVC_MSG_QUERY: the descriptors are the message's own (duplicates the bookkeeping
 * thread closes once it has answered), so the thread that asked may give up and close
 * its own at any time. */
struct svc_msg_query {
    struct svc_msg h;
    uint32_t kind; /* enum svc_query_kind */
    int32_t out_fd;
    int32_t done_fd;
    uint32_t reserved;
};

#define SVC_BATCH_BYTES (256u << 10)

struct svc_batch {
    struct svc_batch *next;
    size_t used;
    uint8_t data[SVC_BATCH_BYTES];
};

/* Multi-producer queue of batches for the bookkeeping thread. Thread-safe.
 *
 * Bounded with back-pressure: once SVC_BKQ_MAX_BATCHES wait, svc__bkq_full() says so
 * and the unwinder threads stop reading rings (so the rings fill up, and the clients
 * drop and count what finds no room, where the dumps show it) until the bookkeeping
 * thread has taken the queue below half of that; then it calls @on_room. Posting itself
 * never fails or waits: a producer finishes the message it is writing, and the few
 * control messages (a process's start, end, statistics, dump barriers) still go through,
 * so the queue holds at most SVC_BKQ_MAX_BATCHES plus one batch per producer. */
struct svc_bkq {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct svc_batch *head, *tail;
    bool quit;
    /* Applied batches kept for reuse (their pages stay mapped and touched). */
    struct svc_batch *pool;
    unsigned n_pool;
    /* Batches waiting; written under the lock, read without it by svc__bkq_full(). */
    _Atomic unsigned n_queued;
    unsigned max_queued;    /* the bound (tests set a smaller one) */
    bool producers_waiting; /* svc__bkq_full() said yes since the last @on_room */
    void (*on_room)(void *ctx);
    void *on_room_ctx;
    _Atomic uint64_t full_events; /* times the queue filled up */
};

#define SVC_BATCH_POOL_MAX 8
/* 8 MiB of messages: a few hundred ms of the bookkeeping thread's work. */
#define SVC_BKQ_MAX_BATCHES 32

void svc__bkq_init(struct svc_bkq *q);
void svc__bkq_done(struct svc_bkq *q);
/* Takes ownership of @b. */
void svc__bkq_post(struct svc_bkq *q, struct svc_batch *b);
/* True when the queue is full: producers stop taking new records until @on_room. */
bool svc__bkq_full(struct svc_bkq *q);
void svc__bkq_quit(struct svc_bkq *q);
/* Blocks until a batch or quit; returns NULL on quit with an empty queue. */
struct svc_batch *svc__bkq_take(struct svc_bkq *q);
/* Takes ownership of an applied batch: kept for svc__batch_add() or freed. */
void svc__bkq_recycle(struct svc_bkq *q, struct svc_batch *b);

/* A producer's current batch. Not thread-safe; one per unwinder thread. */
struct svc_batcher {
    struct svc_bkq *q;
    struct svc_batch *cur;
};
/* Reserves a message of @type for @pid of @len bytes (aligned to 8) in the current
 * batch, posting it first when full; zeroed but for its head. Returns NULL on allocation
 * failure. */
void *svc__batch_add(struct svc_batcher *b, uint32_t type, pid_t pid, size_t len);
/* Posts the current batch, unless the queue is full and the batch still has room (it is
 * posted by a later flush, or when full). */
void svc__batch_flush(struct svc_batcher *b);
/* Posts the current batch whatever the queue holds. */
void svc__batch_post(struct svc_batcher *b);

#endif
