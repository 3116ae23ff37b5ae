/* service/queue.c: batches of messages from the unwinder threads to the bookkeeping
 * thread, bounded with back-pressure (service/queue.h, struct svc_bkq). */
#include "service/queue.h"

#include <stdlib.h>
#include <string.h>

void svc__bkq_init(struct svc_bkq *q)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->max_queued = SVC_BKQ_MAX_BATCHES;
}

void svc__bkq_done(struct svc_bkq *q)
{
    struct svc_batch *b = q->head;
    while (b) {
        struct svc_batch *n = b->next;
        free(b);
        b = n;
    }
    q->head = q->tail = NULL;
    while (q->pool) {
        struct svc_batch *n = q->pool->next;
        free(q->pool);
        q->pool = n;
    }
    q->n_pool = 0;
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
}

void svc__bkq_post(struct svc_bkq *q, struct svc_batch *b)
{
    b->next = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = b;
    else
        q->head = b;
    q->tail = b;
    /* Relaxed: svc__bkq_full() reads it as a hint and checks again under the lock. */
    atomic_store_explicit(&q->n_queued,
                          atomic_load_explicit(&q->n_queued, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

bool svc__bkq_full(struct svc_bkq *q)
{
    if (atomic_load_explicit(&q->n_queued, memory_order_relaxed) < q->max_queued)
        return false;
    pthread_mutex_lock(&q->lock);
    bool full = atomic_load_explicit(&q->n_queued, memory_order_relaxed) >= q->max_queued;
    if (full && !q->producers_waiting) {
        q->producers_waiting = true;
        atomic_fetch_add_explicit(&q->full_events, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&q->lock);
    return full;
}

void svc__bkq_quit(struct svc_bkq *q)
{
    pthread_mutex_lock(&q->lock);
    q->quit = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

struct svc_batch *svc__bkq_take(struct svc_bkq *q)
{
    pthread_mutex_lock(&q->lock);
    while (!q->head && !q->quit)
        pthread_cond_wait(&q->cond, &q->lock);
    struct svc_batch *b = q->head;
    bool room = false;
    if (b) {
        q->head = b->next;
        if (!q->head)
            q->tail = NULL;
        unsigned n = atomic_load_explicit(&q->n_queued, memory_order_relaxed) - 1;
        atomic_store_explicit(&q->n_queued, n, memory_order_relaxed);
        /* Producers resume once half the queue is free: not after every batch. */
        if (q->producers_waiting && n <= q->max_queued / 2) {
            q->producers_waiting = false;
            room = true;
        }
    }
    pthread_mutex_unlock(&q->lock);
    if (room && q->on_room)
        q->on_room(q->on_room_ctx);
    return b;
}

void svc__bkq_recycle(struct svc_bkq *q, struct svc_batch *b)
{
    pthread_mutex_lock(&q->lock);
    if (q->n_pool < SVC_BATCH_POOL_MAX) {
        b->next = q->pool;
        q->pool = b;
        q->n_pool++;
        b = NULL;
    }
    pthread_mutex_unlock(&q->lock);
    free(b);
}

static struct svc_batch *bkq_new_batch(struct svc_bkq *q)
{
    pthread_mutex_lock(&q->lock);
    struct svc_batch *b = q->pool;
    if (b) {
        q->pool = b->next;
        q->n_pool--;
    }
    pthread_mutex_unlock(&q->lock);
    return b ? b : malloc(sizeof(*b));
}

void *svc__batch_add(struct svc_batcher *b, uint32_t type, pid_t pid, size_t len)
{
    len = HP_ALIGN_UP(len, (size_t)8);
    if (len > SVC_BATCH_BYTES)
        return NULL;
    if (b->cur && SVC_BATCH_BYTES - b->cur->used < len)
        svc__batch_post(b);
    if (!b->cur) {
        b->cur = bkq_new_batch(b->q);
        if (!b->cur)
            return NULL;
        b->cur->used = 0;
        b->cur->next = NULL;
    }
    struct svc_msg *m = (struct svc_msg *)(b->cur->data + b->cur->used);
    memset(m, 0, len);
    m->type = type;
    m->len = (uint32_t)len;
    m->pid = pid;
    b->cur->used += len;
    return m;
}

void svc__batch_post(struct svc_batcher *b)
{
    if (!b->cur || b->cur->used == 0)
        return;
    svc__bkq_post(b->q, b->cur);
    b->cur = NULL;
}

void svc__batch_flush(struct svc_batcher *b)
{
    /* A full queue gets no batch that still has room: what is written meanwhile (a few
     * control messages) fills this one, so the queue grows by the bytes of the messages,
     * not by a batch per flush. */
    if (b->cur && b->cur->used < SVC_BATCH_BYTES / 2 && svc__bkq_full(b->q))
        return;
    svc__batch_post(b);
}
