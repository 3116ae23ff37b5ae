/* service/bk_thread.c: the bookkeeping thread. It owns the bk_t and the output file and
 * applies the batches the unwinder threads post, in the order each thread posted them. */
#include "service/svc_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* Every unwinder drains its rings before it answers a dump request, so a dump taken once
 * all have answered holds every record written before the request. Requests that piled
 * up (the unwinders answer them together once a full queue has room) make one dump: the
 * ones in between would show the same state. */
static void dump_after_barrier(struct svc *s, unsigned from, uint32_t n)
{
    s->dump_barriers[from] += n;
    uint32_t all = UINT32_MAX;
    for (unsigned i = 0; i < s->n_dump_barriers; i++)
        all = HP_MIN(all, s->dump_barriers[i]);
    if (all == 0)
        return;
    for (unsigned i = 0; i < s->n_dump_barriers; i++)
        s->dump_barriers[i] -= all;
    int r = bk_dump_all(s->bk);
    if (r < 0)
        hp_log_warn("dump failed: %s", strerror(-r));
}

static void apply(struct svc *s, const struct svc_msg *m)
{
    int r;

    switch (m->type) {
    case SVC_MSG_PROC_START: {
        const struct svc_msg_proc_start *ps = (const void *)m;
        r = bk_process_start(s->bk, m->pid, (const char *)(ps + 1), ps->cmdline_len,
                             ps->from_startup, ps->sampling_interval_bytes);
        if (r < 0)
            hp_log_warn("pid %d: cannot start bookkeeping: %s", m->pid, strerror(-r));
        else
            bk_process_set_start_time(s->bk, m->pid, ps->process_start_ts);
        break;
    }
    case SVC_MSG_PROC_RENAME: {
        const struct svc_msg_proc_rename *rn = (const void *)m;
        r = bk_process_rename(s->bk, m->pid, (const char *)(rn + 1), rn->cmdline_len);
        if (r < 0 && r != -ESRCH)
            hp_log_warn("pid %d: cannot write its new name: %s", m->pid, strerror(-r));
        break;
    }
    case SVC_MSG_ALLOC: {
        const struct svc_msg_alloc *a = (const void *)m;
        bk_record_alloc(s->bk, m->pid, a->heap_id, a->seq, a->addr, a->size, a->sample_size,
                        (const struct hp_frame *)(a + 1), a->n_frames);
        break;
    }
    case SVC_MSG_FREE: {
        const struct svc_msg_free *f = (const void *)m;
        bk_record_free(s->bk, m->pid, f->heap_id, f->seq, f->addr);
        break;
    }
    case SVC_MSG_HEAP_NAME: {
        const struct svc_msg_heap_name *hn = (const void *)m;
        r = bk_heap_name(s->bk, m->pid, hn->heap_id, hn->name);
        if (r < 0 && r != -ESRCH)
            hp_log_info("pid %d: heap %u not named: %s", m->pid, hn->heap_id, strerror(-r));
        break;
    }
    case SVC_MSG_PROC_END: {
        const struct svc_msg_proc_end *e = (const void *)m;
        r = bk_process_end(s->bk, m->pid, &e->stats, e->flags);
        if (r < 0)
            hp_log_warn("pid %d: final dump failed: %s", m->pid, strerror(-r));
        svc__mark_done(s, m->pid);
        break;
    }
    case SVC_MSG_DUMP_ALL:
        r = bk_dump_all(s->bk);
        if (r < 0)
            hp_log_warn("dump failed: %s", strerror(-r));
        break;
    case SVC_MSG_PROC_STATS: {
        const struct svc_msg_proc_end *e = (const void *)m;
        bk_process_update(s->bk, m->pid, &e->stats, e->flags);
        break;
    }
    case SVC_MSG_POSSIBLY_FREED:
        bk_mark_possibly_freed(s->bk, m->pid);
        break;
    case SVC_MSG_REJECTED: {
        const struct svc_msg_rejected *rj = (const void *)m;
        r = bk_process_rejected(s->bk, m->pid, rj->flags);
        if (r < 0)
            hp_log_warn("pid %d: cannot write that it is not profiled: %s", m->pid, strerror(-r));
        break;
    }
    case SVC_MSG_QUERY:
        svc__answer_query(s, (const struct svc_msg_query *)m);
        break;
    case SVC_MSG_DUMP_BARRIER: {
        const struct svc_msg_dump_barrier *d = (const void *)m;
        if (d->unwinder < s->n_dump_barriers && s->dump_barriers)
            dump_after_barrier(s, d->unwinder, d->n);
        break;
    }
    default:
        break;
    }
}

void *svc__bk_main(void *arg)
{
    struct svc *s = arg;
    struct svc_batch *b;

    unsigned since_check = 0;
    while ((b = svc__bkq_take(&s->bkq)) != NULL) {
        size_t off = 0;
        while (off + sizeof(struct svc_msg) <= b->used) {
            const struct svc_msg *m = (const struct svc_msg *)(b->data + off);
            apply(s, m);
            off += m->len;
        }
        svc__bkq_recycle(&s->bkq, b);
        /* What the batches make us keep (interned stacks, live allocations) counts
         * against the memory guardrail too: checked here as it grows, not only by the
         * main thread's tick, and ahead of it: the tables grow by doubling, and the ones
         * the next batches may make grow count as if they had (the guardrail fires before
         * a table's growth would take the service past the limit). */
        if (s->cfg.max_heapprofd_memory_kb && ++since_check >= SVC_GUARDRAIL_CHECK_BATCHES) {
            since_check = 0;
            struct svc_memory mem;
            svc__memory(&mem);
            uint64_t kb =
                mem.rss_kb + mem.swap_kb + bk_grow_ahead(s->bk, SVC_GUARDRAIL_CHECK_ENTRIES) / 1024;
            if (kb > s->cfg.max_heapprofd_memory_kb)
                (void)svc__guardrail_fire(s, "memory (KiB, with the growth ahead)", kb,
                                          s->cfg.max_heapprofd_memory_kb);
        }
        /* Published after whole messages only, so stat_bytes is a packet boundary. */
        struct bk_counters c;
        bk_get_counters(s->bk, &c);
        atomic_store_explicit(&s->stat_dumps, c.dumps, memory_order_relaxed);
        atomic_store_explicit(&s->stat_bytes, c.bytes_written, memory_order_relaxed);
        atomic_store_explicit(&s->stat_live_bytes, c.live_bytes, memory_order_relaxed);
    }
    int r = bk_dump_all(s->bk);
    if (r < 0)
        hp_log_warn("final dump failed: %s", strerror(-r));
    bk_get_counters(s->bk, &s->bk_counters);
    atomic_store_explicit(&s->stat_dumps, s->bk_counters.dumps, memory_order_relaxed);
    atomic_store_explicit(&s->stat_bytes, s->bk_counters.bytes_written, memory_order_relaxed);
    return NULL;
}
