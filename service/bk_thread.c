/* service/bk_thread.c: the bookkeeping thread. It owns the bk_t and the output file and
 * applies the batches the unwinder threads post, in the order each thread posted them. */
#include "common/log.h"
#include "service/svc_internal.h"

#include <stdlib.h>
#include <string.h>

static void apply(struct svc *s, const struct svc_msg *m)
{
    const uint8_t *payload = (const uint8_t *)(m + 1);
    int r;

    switch (m->type) {
    case SVC_MSG_PROC_START:
        r = bk_process_start(s->bk, m->pid, (const char *)payload, m->n, m->size != 0,
                             m->sample_size);
        if (r < 0)
            hp_log_warn("pid %d: cannot start bookkeeping: %s", m->pid, strerror(-r));
        break;
    case SVC_MSG_ALLOC:
        /* struct svc_msg carries no heap id yet: every record goes to heap 0. */
        bk_record_alloc(s->bk, m->pid, 0, m->seq, m->addr, m->size, m->sample_size,
                        (const struct hp_frame *)payload, m->n);
        break;
    case SVC_MSG_FREE:
        bk_record_free(s->bk, m->pid, 0, m->seq, m->addr);
        break;
    case SVC_MSG_PROC_END: {
        struct bk_process_stats st;
        memcpy(&st, payload, sizeof(st));
        r = bk_process_end(s->bk, m->pid, &st, m->n);
        if (r < 0)
            hp_log_warn("pid %d: final dump failed: %s", m->pid, strerror(-r));
        svc__mark_done(s, m->pid);
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

    while ((b = svc__bkq_take(&s->bkq)) != NULL) {
        size_t off = 0;
        while (off + sizeof(struct svc_msg) <= b->used) {
            const struct svc_msg *m = (const struct svc_msg *)(b->data + off);
            apply(s, m);
            off += m->len;
        }
        free(b);
    }
    int r = bk_dump_all(s->bk);
    if (r < 0)
        hp_log_warn("final dump failed: %s", strerror(-r));
    bk_get_counters(s->bk, &s->bk_counters);
    return NULL;
}
