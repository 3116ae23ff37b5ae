#include "bookkeeping/bookkeeping.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bookkeeping/state.h"

int bk_new(const struct bk_config *cfg, bk_t **ret)
{
    bk_t *bk = calloc(1, sizeof(*bk));
    if (!bk)
        return -ENOMEM;
    bk->out_fd = cfg->out_fd;
    bk->sequence_id = cfg->sequence_id ? cfg->sequence_id : 1;
    bk->dump_at_max = cfg->dump_at_max;
    bk->max_packet_bytes = BK_MAX_PACKET_BYTES;
    bk__map_init(&bk->proc_index, sizeof(uint64_t));
    int r = bk__intern_init(&bk->in);
    if (r < 0) {
        bk__map_done(&bk->proc_index);
        free(bk);
        return r;
    }
    r = bk__write_start(bk);
    if (r < 0) {
        bk_free(bk);
        return r;
    }
    *ret = bk;
    return 0;
}

static struct bk_proc *proc_free(struct bk_proc *p)
{
    if (!p)
        return NULL;
    free(p->cmdline);
    free(p->heap);
    bk__map_done(&p->live);
    bk__map_done(&p->site_index);
    free(p->sites);
    free(p);
    return NULL;
}

bk_t *bk_free(bk_t *bk)
{
    if (!bk)
        return NULL;
    for (size_t i = 0; i < bk->n_procs; i++)
        proc_free(bk->procs[i]);
    free(bk->procs);
    bk__map_done(&bk->proc_index);
    bk__intern_done(&bk->in);
    free(bk->buf.p);
    free(bk);
    return NULL;
}

struct bk_proc *bk__find_proc(bk_t *bk, int32_t pid)
{
    uint64_t *idx = bk__map_get(&bk->proc_index, (uint64_t)(uint32_t)pid);
    return idx ? bk->procs[*idx] : NULL;
}

int bk_process_start(bk_t *bk, int32_t pid, const char *cmdline, size_t cmdline_len,
                     bool from_startup, uint64_t sampling_interval_bytes)
{
    if (bk__find_proc(bk, pid))
        return -EEXIST;
    int r = bk__grow((void **)&bk->procs, &bk->cap_procs, bk->n_procs + 1, sizeof(*bk->procs));
    if (r < 0)
        return r;
    struct bk_proc *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->pid = pid;
    p->from_startup = from_startup;
    p->sampling_interval_bytes = sampling_interval_bytes;
    p->next_seq = 1;
    bk__map_init(&p->live, sizeof(struct bk_live));
    bk__map_init(&p->site_index, sizeof(uint64_t));
    p->cmdline = malloc(cmdline_len + 1);
    if (!p->cmdline) {
        proc_free(p);
        return -ENOMEM;
    }
    if (cmdline_len)
        memcpy(p->cmdline, cmdline, cmdline_len);
    p->cmdline[cmdline_len] = '\0';
    p->cmdline_len = cmdline_len;

    uint64_t *idx;
    r = bk__map_put(&bk->proc_index, (uint64_t)(uint32_t)pid, (void **)&idx);
    if (r < 0) {
        proc_free(p);
        return r;
    }
    *idx = bk->n_procs;
    bk->procs[bk->n_procs++] = p;
    return bk__write_process_tree(bk, p);
}

static void proc_forget(bk_t *bk, struct bk_proc *p)
{
    uint64_t *idx = bk__map_get(&bk->proc_index, (uint64_t)(uint32_t)p->pid);
    size_t i = (size_t)*idx;
    bk__map_remove(&bk->proc_index, (uint64_t)(uint32_t)p->pid);
    struct bk_proc *last = bk->procs[--bk->n_procs];
    if (last != p) {
        /* Keep procs dense: the last process takes the hole. */
        bk->procs[i] = last;
        uint64_t *li = bk__map_get(&bk->proc_index, (uint64_t)(uint32_t)last->pid);
        *li = i;
    }
    proc_free(p);
}

/* ---- applying records ---- */

static struct bk_site *site_get(struct bk_proc *p, uint32_t callstack, uint32_t *ret_idx)
{
    uint64_t *idx;
    int r = bk__map_put(&p->site_index, callstack, (void **)&idx);
    if (r < 0)
        return NULL;
    if (r == 1) {
        if (bk__grow((void **)&p->sites, &p->cap_sites, p->n_sites + 1, sizeof(*p->sites)) < 0) {
            bk__map_remove(&p->site_index, callstack);
            return NULL;
        }
        *idx = p->n_sites;
        p->sites[p->n_sites++] = (struct bk_site){.callstack_id = callstack};
    }
    *ret_idx = (uint32_t)*idx;
    return &p->sites[*idx];
}

/* Called before a site's live values change: see the peak scheme in state.h. */
static void site_touch(const struct bk_proc *p, struct bk_site *s)
{
    if (p->peak_id && s->max_peak != p->peak_id) {
        s->max_bytes = s->live_bytes;
        s->max_count = s->live_count;
        s->max_peak = p->peak_id;
    }
}

static void site_free(struct bk_proc *p, struct bk_site *s, uint64_t size)
{
    site_touch(p, s);
    s->freed += size;
    s->free_count++;
    s->live_bytes -= size;
    s->live_count--;
    p->live_total -= size;
}

static void apply_alloc(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    uint32_t si;
    struct bk_site *s = site_get(p, r->callstack, &si);
    if (!s)
        return;
    struct bk_live *live;
    int found = bk__map_put(&p->live, r->addr, (void **)&live);
    if (found < 0)
        return;
    if (found == 0) {
        if (live->seq > r->seq) {
            /* A late record: the address was reused by a newer allocation, so this
             * one was freed in between (its free, seen first, was an unknown free). */
            s->allocated += r->size;
            s->alloc_count++;
            s->freed += r->size;
            s->free_count++;
            return;
        }
        /* A live address allocated again: the free between was lost. */
        bk->counters.replaced_allocs++;
        site_free(p, &p->sites[live->site], live->size);
    }
    site_touch(p, s);
    s->allocated += r->size;
    s->alloc_count++;
    s->live_bytes += r->size;
    s->live_count++;
    p->live_total += r->size;
    *live = (struct bk_live){.size = r->size, .seq = r->seq, .site = si};
    if (p->live_total > p->peak_total) {
        p->peak_total = p->live_total;
        p->peak_id++;
    }
}

static void apply_free(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    struct bk_live *live = bk__map_get(&p->live, r->addr);
    if (!live || live->seq > r->seq) {
        /* Never sampled, or a free older than the allocation now at the address. */
        bk->counters.unknown_frees++;
        return;
    }
    site_free(p, &p->sites[live->site], live->size);
    bk__map_remove(&p->live, r->addr);
}

static void apply(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    bk->counters.records_applied++;
    if (r->kind == BK_REC_ALLOC)
        apply_alloc(bk, p, r);
    else
        apply_free(bk, p, r);
}

/* ---- reorder heap ---- */

static bool heap_less(const struct bk_pending *a, const struct bk_pending *b)
{
    return a->seq < b->seq;
}

static int heap_push(struct bk_proc *p, const struct bk_pending *r)
{
    int e = bk__grow((void **)&p->heap, &p->cap_heap, p->n_heap + 1, sizeof(*p->heap));
    if (e < 0)
        return e;
    size_t i = p->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(r, &p->heap[parent]))
            break;
        p->heap[i] = p->heap[parent];
        i = parent;
    }
    p->heap[i] = *r;
    return 0;
}

static struct bk_pending heap_pop(struct bk_proc *p)
{
    struct bk_pending top = p->heap[0];
    struct bk_pending last = p->heap[--p->n_heap];
    size_t n = p->n_heap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&p->heap[c + 1], &p->heap[c]))
            c++;
        if (!heap_less(&p->heap[c], &last))
            break;
        p->heap[i] = p->heap[c];
        i = c;
    }
    if (n)
        p->heap[i] = last;
    return top;
}

/* Applies the oldest pending record whatever its seq, skipping a gap before it. */
static void apply_oldest(bk_t *bk, struct bk_proc *p)
{
    struct bk_pending r = heap_pop(p);
    if (r.seq > p->next_seq)
        bk->counters.seq_gaps++;
    apply(bk, p, &r);
    if (r.seq >= p->next_seq)
        p->next_seq = r.seq + 1;
}

/* Applies pending records as long as they are next in sequence (or late). */
static void drain(bk_t *bk, struct bk_proc *p)
{
    while (p->n_heap && p->heap[0].seq <= p->next_seq)
        apply_oldest(bk, p);
}

static void submit(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    if (r->seq <= p->next_seq) {
        /* The next record, or a late one whose gap was already skipped: the seq
         * stamps on live allocations keep late records from undoing newer state. */
        apply(bk, p, r);
        if (r->seq == p->next_seq) {
            p->next_seq++;
            drain(bk, p);
        }
        return;
    }
    if (heap_push(p, r) < 0) {
        apply(bk, p, r); /* no memory to wait: apply out of order rather than lose it */
        return;
    }
    while (p->n_heap > BK_REORDER_WINDOW) {
        apply_oldest(bk, p);
        drain(bk, p);
    }
}

void bk__flush_pending(bk_t *bk, struct bk_proc *p)
{
    while (p->n_heap)
        apply_oldest(bk, p);
}

void bk_record_alloc(bk_t *bk, int32_t pid, uint64_t seq, uint64_t addr, uint64_t size,
                     uint64_t sample_size, const struct hp_frame *frames, size_t n_frames)
{
    (void)size; /* the real size is not reported; sample_size is the unbiased estimate */
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return;
    uint32_t cs;
    if (bk__intern_stack(&bk->in, frames, n_frames, &cs) < 0)
        return;
    struct bk_pending r = {
        .seq = seq, .addr = addr, .size = sample_size, .callstack = cs, .kind = BK_REC_ALLOC};
    submit(bk, p, &r);
}

void bk_record_free(bk_t *bk, int32_t pid, uint64_t seq, uint64_t addr)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return;
    struct bk_pending r = {.seq = seq, .addr = addr, .kind = BK_REC_FREE};
    submit(bk, p, &r);
}

void bk_process_update(bk_t *bk, int32_t pid, const struct bk_process_stats *stats, uint32_t flags)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return;
    if (stats)
        p->stats = *stats;
    p->flags |= flags;
}

int bk_dump_process(bk_t *bk, int32_t pid)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return -ESRCH;
    bk__flush_pending(bk, p);
    int r = bk__write_clock_snapshot(bk);
    if (r < 0)
        return r;
    return bk__dump_proc(bk, p);
}

int bk_dump_all(bk_t *bk)
{
    int r = bk__write_clock_snapshot(bk);
    for (size_t i = 0; i < bk->n_procs && r >= 0; i++) {
        bk__flush_pending(bk, bk->procs[i]);
        r = bk__dump_proc(bk, bk->procs[i]);
    }
    return r;
}

int bk_process_end(bk_t *bk, int32_t pid, const struct bk_process_stats *stats, uint32_t flags)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return -ESRCH;
    bk_process_update(bk, pid, stats, flags);
    bk__flush_pending(bk, p);
    int r = bk__write_clock_snapshot(bk);
    if (r >= 0)
        r = bk__dump_proc(bk, p);
    proc_forget(bk, p);
    return r;
}

void bk_get_counters(bk_t *bk, struct bk_counters *ret)
{
    *ret = bk->counters;
}

void bk__set_max_packet_bytes(bk_t *bk, size_t n)
{
    bk->max_packet_bytes = n;
}
