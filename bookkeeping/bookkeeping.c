/* bookkeeping/bookkeeping.c: the profile state of a session: processes, heaps, live allocations,
 * counters (bookkeeping.h). */
#include "bookkeeping/bookkeeping.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bookkeeping/state.h"
#include "common/clock.h"
#include "protos/fields.h"

int bk_new(const struct bk_config *cfg, bk_t **ret)
{
    bk_t *bk = calloc(1, sizeof(*bk));
    if (!bk)
        return -ENOMEM;
    bk->out_fd = cfg->out_fd;
    bk->sequence_id = cfg->sequence_id ? cfg->sequence_id : 1;
    bk->dump_at_max = cfg->dump_at_max;
    bk->no_malloc_heap = cfg->no_malloc_heap;
    bk->source_lines = cfg->source_lines;
    bk->source_lines_ctx = cfg->source_lines_ctx;
    bk->max_packet_bytes = BK_MAX_PACKET_BYTES;
    if (cfg->sink) {
        bk->has_sink = true;
        bk->sink = *cfg->sink;
    }
    hp_map_init(&bk->proc_index, sizeof(uint64_t));
    int r = bk__intern_init(&bk->in);
    if (r < 0) {
        hp_map_done(&bk->proc_index);
        free(bk);
        return r;
    }
    /* A sink's sequence starts with its first packet (nothing may be written now). */
    bk->needs_reset = bk->has_sink;
    r = bk->has_sink ? 0 : bk__write_start(bk);
    if (r < 0) {
        bk_free(bk);
        return r;
    }
    *ret = bk;
    return 0;
}

static struct bk_heap *heap_free(struct bk_heap *h)
{
    if (!h)
        return NULL;
    hp_map_done(&h->live);
    hp_map_done(&h->big_sizes);
    for (size_t i = 0; i < h->n_site_pages; i++)
        free(h->site_pages[i]);
    free(h->site_pages);
    free(h->sites);
    free(h->maxes);
    free(h);
    return NULL;
}

static struct bk_proc *proc_free(struct bk_proc *p)
{
    if (!p)
        return NULL;
    free(p->cmdline);
    free(p->heap);
    for (size_t i = 0; i < p->n_heaps; i++)
        heap_free(p->heaps[i]);
    free(p->heaps);
    free(p->labels);
    free(p);
    return NULL;
}

struct bk_heap *bk__find_heap(const struct bk_proc *p, uint32_t heap_id)
{
    for (size_t i = 0; i < p->n_heaps; i++)
        if (p->heaps[i]->heap_id == heap_id)
            return p->heaps[i];
    return NULL;
}

/* Caps the heaps a client can make us track per process. */
#define BK_MAX_HEAPS 64

static struct bk_heap *heap_get(const bk_t *bk, struct bk_proc *p, uint32_t heap_id)
{
    if (HP_LIKELY(p->n_heaps && p->heaps[0]->heap_id == heap_id))
        return p->heaps[0];
    struct bk_heap *h = bk__find_heap(p, heap_id);
    if (h || p->n_heaps >= BK_MAX_HEAPS)
        return h;
    if (hp_grow((void **)&p->heaps, &p->cap_heaps, p->n_heaps + 1, sizeof(*p->heaps)) < 0)
        return NULL;
    h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->heap_id = heap_id;
    h->track_peak = bk->dump_at_max;
    hp_map_init(&h->live, sizeof(struct bk_live));
    hp_map_init(&h->big_sizes, sizeof(uint64_t));
    p->heaps[p->n_heaps++] = h;
    return h;
}

static struct bk_heap_label *label_find(const struct bk_proc *p, uint32_t heap_id)
{
    for (size_t i = 0; i < p->n_labels; i++)
        if (p->labels[i].heap_id == heap_id)
            return &p->labels[i];
    return NULL;
}

void bk__heap_name(const struct bk_proc *p, uint32_t heap_id, char *buf, size_t len)
{
    const struct bk_heap_label *l = heap_id && p ? label_find(p, heap_id) : NULL;
    if (heap_id == 0)
        snprintf(buf, len, "%s", BK_HEAP_NAME);
    else if (heap_id == BK_HEAP_POSSIBLY_FREED)
        snprintf(buf, len, "%s", PF_HEAP_POSSIBLY_FREED);
    else if (l)
        snprintf(buf, len, "%s", l->name);
    else
        snprintf(buf, len, "heap_%" PRIu32, heap_id);
}

int bk_heap_name(bk_t *bk, int32_t pid, uint32_t heap_id, const char *name)
{
    if (heap_id == 0 || !name[0])
        return -EINVAL;
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return -ESRCH;
    struct bk_heap_label *l = label_find(p, heap_id);
    if (!l) {
        if (p->n_labels >= BK_MAX_HEAPS)
            return -ENOSPC;
        if (hp_grow((void **)&p->labels, &p->cap_labels, p->n_labels + 1, sizeof(*p->labels)) < 0)
            return -ENOMEM;
        l = &p->labels[p->n_labels++];
        l->heap_id = heap_id;
    }
    size_t n = strnlen(name, sizeof(l->name) - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        l->name[i] = c > ' ' && c < 0x7f ? (char)c : '_';
    }
    l->name[n] = '\0';
    return 0;
}

bk_t *bk_free(bk_t *bk)
{
    if (!bk)
        return NULL;
    for (size_t i = 0; i < bk->n_procs; i++)
        proc_free(bk->procs[i]);
    free(bk->procs);
    hp_map_done(&bk->proc_index);
    bk__intern_done(&bk->in);
    free(bk->buf.p);
    free(bk->frame_offered);
    free(bk->frames_later);
    free(bk);
    return NULL;
}

struct bk_proc *bk__find_proc(bk_t *bk, int32_t pid)
{
    /* Records come in runs of one process: remember the last one found. */
    if (HP_LIKELY(bk->last_proc && bk->last_proc->pid == pid))
        return bk->last_proc;
    uint64_t *idx = hp_map_get(&bk->proc_index, (uint64_t)(uint32_t)pid);
    bk->last_proc = idx ? bk->procs[*idx] : NULL;
    return bk->last_proc;
}

int bk_process_start(bk_t *bk, int32_t pid, const char *cmdline, size_t cmdline_len,
                     bool from_startup, uint64_t sampling_interval_bytes)
{
    if (bk__find_proc(bk, pid))
        return -EEXIST;
    int r = hp_grow((void **)&bk->procs, &bk->cap_procs, bk->n_procs + 1, sizeof(*bk->procs));
    if (r < 0)
        return r;
    struct bk_proc *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->pid = pid;
    p->from_startup = from_startup;
    p->start_ts = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    p->sampling_interval_bytes = sampling_interval_bytes;
    p->log_keep = sampling_interval_bytes > 1 ? log1p(-1.0 / (double)sampling_interval_bytes) : 0;
    p->next_seq = 1;
    p->cmdline = malloc(cmdline_len + 1);
    if (!p->cmdline || !heap_get(bk, p, 0)) {
        proc_free(p);
        return -ENOMEM;
    }
    if (cmdline_len)
        memcpy(p->cmdline, cmdline, cmdline_len);
    p->cmdline[cmdline_len] = '\0';
    p->cmdline_len = cmdline_len;

    uint64_t *idx;
    r = hp_map_put(&bk->proc_index, (uint64_t)(uint32_t)pid, (void **)&idx);
    if (r < 0) {
        proc_free(p);
        return r;
    }
    *idx = bk->n_procs;
    bk->procs[bk->n_procs++] = p;
    return bk__write_process_tree(bk, p);
}

int bk_process_rename(bk_t *bk, int32_t pid, const char *cmdline, size_t cmdline_len)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return -ESRCH;
    if (cmdline_len == p->cmdline_len && memcmp(cmdline, p->cmdline, cmdline_len) == 0)
        return 0;
    char *c = malloc(cmdline_len + 1);
    if (!c)
        return -ENOMEM;
    memcpy(c, cmdline, cmdline_len);
    c[cmdline_len] = '\0';
    free(p->cmdline);
    p->cmdline = c;
    p->cmdline_len = cmdline_len;
    return bk__write_process_tree(bk, p);
}

void bk_process_set_start_time(bk_t *bk, int32_t pid, uint64_t start_ts)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (p)
        p->process_start_ts = start_ts;
}

static void proc_forget(bk_t *bk, struct bk_proc *p)
{
    bk->last_proc = NULL;
    uint64_t *idx = hp_map_get(&bk->proc_index, (uint64_t)(uint32_t)p->pid);
    size_t i = (size_t)*idx;
    hp_map_remove(&bk->proc_index, (uint64_t)(uint32_t)p->pid);
    struct bk_proc *last = bk->procs[--bk->n_procs];
    if (last != p) {
        /* Keep procs dense: the last process takes the hole. */
        bk->procs[i] = last;
        uint64_t *li = hp_map_get(&bk->proc_index, (uint64_t)(uint32_t)last->pid);
        *li = i;
    }
    proc_free(p);
}

/* ---- applying records ---- */

/* The index of the site of @callstack in @h, created when new; < 0 on failure. */
static int64_t site_get(struct bk_heap *h, uint32_t callstack)
{
    size_t page = callstack / BK_SITE_PAGE;
    if (HP_LIKELY(page < h->n_site_pages && h->site_pages[page])) {
        uint32_t v = h->site_pages[page][callstack % BK_SITE_PAGE];
        if (HP_LIKELY(v))
            return (int64_t)v - 1;
    } else {
        if (page >= h->n_site_pages) {
            size_t n = h->n_site_pages;
            if (hp_grow((void **)&h->site_pages, &n, page + 1, sizeof(*h->site_pages)) < 0)
                return -ENOMEM;
            memset(h->site_pages + h->n_site_pages, 0,
                   (n - h->n_site_pages) * sizeof(*h->site_pages));
            h->n_site_pages = n;
        }
        h->site_pages[page] = calloc(BK_SITE_PAGE, sizeof(**h->site_pages));
        if (!h->site_pages[page])
            return -ENOMEM;
    }
    size_t cap = h->cap_sites;
    if (h->n_sites >= UINT32_MAX - 1 ||
        hp_grow((void **)&h->sites, &cap, h->n_sites + 1, sizeof(*h->sites)) < 0)
        return -ENOMEM;
    if (h->track_peak) {
        size_t cap_max = h->cap_sites;
        if (hp_grow((void **)&h->maxes, &cap_max, cap, sizeof(*h->maxes)) < 0)
            return -ENOMEM;
    }
    h->cap_sites = cap;
    size_t i = h->n_sites++;
    h->sites[i] = (struct bk_site){.callstack_id = callstack};
    h->site_pages[page][callstack % BK_SITE_PAGE] = (uint32_t)i + 1;
    return (int64_t)i;
}

/* Called before the live values of site @i change: see the peak scheme in state.h. */
static void site_touch(struct bk_heap *h, size_t i)
{
    struct bk_site *s = &h->sites[i];
    uint32_t stamp = (uint32_t)h->peak_id;
    if (h->track_peak && h->peak_id && s->max_stamp != stamp) {
        h->maxes[i] = (struct bk_site_max){bk__site_live_bytes(s), bk__site_live_count(s)};
        s->max_stamp = stamp;
    }
}

/* A new peak of live bytes. */
static void heap_new_peak(struct bk_heap *h)
{
    h->peak_total = h->live_total;
    if ((uint32_t)++h->peak_id == 0) {
        /* The stamps' 32 bits wrap: clear them all, so none can pass for a later peak's
         * (every site's live values are its values at this new peak anyway). */
        for (size_t i = 0; i < h->n_sites; i++)
            h->sites[i].max_stamp = 0;
        h->peak_id++;
    }
}

static void site_free(struct bk_heap *h, size_t i, uint64_t size)
{
    site_touch(h, i);
    struct bk_site *s = &h->sites[i];
    s->freed += size;
    s->free_count++;
    h->live_total -= size;
}

static uint64_t live_size(struct bk_heap *h, uint64_t addr, const struct bk_live *l)
{
    if (HP_LIKELY(l->size != BK_LIVE_BIG_SIZE))
        return l->size;
    uint64_t *big = hp_map_get(&h->big_sizes, addr);
    return big ? *big : BK_LIVE_BIG_SIZE;
}

/* Forgets the live allocation at @addr, whose entry in h->live is @l. */
static void live_remove(struct bk_heap *h, uint64_t addr, struct bk_live *l)
{
    if (l->size == BK_LIVE_BIG_SIZE)
        hp_map_remove(&h->big_sizes, addr);
    hp_map_remove_value(&h->live, l);
}

/* A record the bookkeeping cannot use (out of memory, a heap past the cap, a table's
 * probe bound): counted for the process and the session. */
static void refuse(bk_t *bk, struct bk_proc *p)
{
    bk->counters.dropped_records++;
    p->refused++;
}

static void apply_alloc(bk_t *bk, struct bk_proc *p, struct bk_heap *h, const struct bk_pending *r)
{
    int64_t site = site_get(h, r->callstack);
    if (site < 0) {
        refuse(bk, p);
        return;
    }
    uint32_t si = (uint32_t)site;
    struct bk_site *s = &h->sites[si];
    struct bk_live *live;
    /* -ENOSPC (an address the keyed live table cannot place) or -ENOMEM: dropped. */
    int found = hp_map_put(&h->live, r->addr, (void **)&live);
    if (found < 0) {
        refuse(bk, p);
        return;
    }
    if (found == 0) {
        if (live->seq > r->seq) {
            /* A late record: the address was reused by a newer allocation, so this
             * one was freed in between (its free, seen first, was an unknown free). */
            s->allocated += r->size;
            s->alloc_count++;
            s->est_allocs += r->weight;
            s->freed += r->size;
            s->free_count++;
            return;
        }
        /* A live address allocated again: the free between was lost. */
        bk->counters.replaced_allocs++;
        site_free(h, live->site, live_size(h, r->addr, live));
    }
    uint32_t small = r->size < BK_LIVE_BIG_SIZE ? (uint32_t)r->size : BK_LIVE_BIG_SIZE;
    if (small == BK_LIVE_BIG_SIZE) {
        uint64_t *big;
        if (hp_map_put(&h->big_sizes, r->addr, (void **)&big) < 0) {
            hp_map_remove(&h->live, r->addr);
            refuse(bk, p);
            return;
        }
        *big = r->size;
    } else if (found == 0 && live->size == BK_LIVE_BIG_SIZE) {
        hp_map_remove(&h->big_sizes, r->addr);
    }
    site_touch(h, si);
    s->allocated += r->size;
    s->alloc_count++;
    s->est_allocs += r->weight;
    h->live_total += r->size;
    *live = (struct bk_live){.seq = r->seq, .site = si, .size = small};
    if (h->live_total > h->peak_total)
        heap_new_peak(h);
}

/* A free of @addr (record @seq), or an allocation at it, ends the allocation there that
 * was marked possibly freed before, if any: it was freed. Returns whether there was one. */
static bool pf_take(struct bk_proc *p, uint64_t addr, uint64_t seq)
{
    struct bk_heap *pf = p->pf_heap;
    if (HP_LIKELY(!pf || pf->live.count == 0))
        return false;
    struct bk_live *live = hp_map_get(&pf->live, addr);
    if (!live || live->seq > seq)
        return false;
    site_free(pf, live->site, live_size(pf, addr, live));
    live_remove(pf, addr, live);
    return true;
}

static void apply_free(bk_t *bk, struct bk_proc *p, struct bk_heap *h, const struct bk_pending *r)
{
    struct bk_live *live = hp_map_get(&h->live, r->addr);
    if (!live || live->seq > r->seq) {
        if (pf_take(p, r->addr, r->seq))
            return;
        /* Never sampled, or a free older than the allocation now at the address. */
        bk->counters.unknown_frees++;
        p->unknown_frees++;
        return;
    }
    site_free(h, live->site, live_size(h, r->addr, live));
    live_remove(h, r->addr, live);
}

static void apply_now(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    bk->counters.records_applied++;
    struct bk_heap *h = r->heap_id != BK_HEAP_POSSIBLY_FREED ? heap_get(bk, p, r->heap_id) : NULL;
    if (!h) {
        refuse(bk, p);
        return;
    }
    if (r->kind == BK_REC_ALLOC) {
        /* The address is in use again: the allocation marked there was freed. */
        (void)pf_take(p, r->addr, r->seq);
        apply_alloc(bk, p, h, r);
    } else {
        apply_free(bk, p, h, r);
    }
}

/* Applies @r after the BK_READY records in order that follow it (see bk_proc.ready). */
static void apply(bk_t *bk, struct bk_proc *p, const struct bk_pending *r)
{
    if (HP_LIKELY(p->heaps[0]->heap_id == r->heap_id))
        hp_map_prefetch(&p->heaps[0]->live, r->addr);
    if (p->n_ready == BK_READY) {
        apply_now(bk, p, &p->ready[p->ready_head]);
        p->ready_head = (p->ready_head + 1) % BK_READY;
        p->n_ready--;
    }
    p->ready[(p->ready_head + p->n_ready++) % BK_READY] = *r;
}

void bk__flush_ready(bk_t *bk, struct bk_proc *p)
{
    for (; p->n_ready; p->n_ready--) {
        apply_now(bk, p, &p->ready[p->ready_head]);
        p->ready_head = (p->ready_head + 1) % BK_READY;
    }
}

/* ---- reorder heap ---- */

static bool heap_less(const struct bk_pending *a, const struct bk_pending *b)
{
    return a->seq < b->seq;
}

static int heap_push(struct bk_proc *p, const struct bk_pending *r)
{
    int e = hp_grow((void **)&p->heap, &p->cap_heap, p->n_heap + 1, sizeof(*p->heap));
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
    if (r.seq > p->next_seq) {
        bk->counters.seq_gaps++;
        p->seq_gaps++;
    }
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
    bk__flush_ready(bk, p);
}

/* The allocations a sampled one of @size bytes stands for, in BK_WEIGHT_ONE units:
 * 1 / P(sampled). The client picks each byte with probability 1 / interval and records
 * every allocation of at least the interval, so P = 1 - (1 - 1/interval)^size below it
 * (the Horvitz-Thompson weight; Go's runtime scales its heap profiles the same way). */
static uint32_t alloc_weight(struct bk_proc *p, uint64_t size)
{
    if (size >= p->sampling_interval_bytes || p->log_keep == 0 || size == 0)
        return BK_WEIGHT_ONE;
    /* Programs allocate few sizes often: their weights are looked up, not recomputed.
     * Consecutive sizes get slots of their own (a program of 256 sizes in a row misses
     * only when it starts). */
    size_t k = (size_t)(size + (size >> 8)) & (BK_WEIGHT_CACHE - 1);
    if (p->weights[k].size == size)
        return p->weights[k].weight;
    double w = -1.0 / expm1((double)size * p->log_keep) * BK_WEIGHT_ONE + 0.5;
    uint32_t weight = w < (double)UINT32_MAX ? (uint32_t)w : UINT32_MAX;
    if (size <= UINT32_MAX) {
        p->weights[k].size = (uint32_t)size;
        p->weights[k].weight = weight;
    }
    return weight;
}

/* Callstack @cs with a leaf frame naming heap @heap_id of @p (its name on the unknown
 * mapping), in *@ret_cs. Perfetto's trace processor keeps its running totals per
 * (process, callstack), whatever the heap: two heaps of a process must never share a
 * callstack, and they would (a heap's block reported from where a malloc() is called,
 * python.objects' blocks that pymalloc takes from malloc, the possibly freed heap's
 * copies of malloc's sites, two heaps reported from one call). Readers that show heaps
 * apart leave the frame out (report/dumps.c). The malloc heap has none: its stacks stay
 * as they always were. */
static int heap_mark(bk_t *bk, const struct bk_proc *p, uint32_t heap_id, uint32_t cs,
                     uint32_t *ret_cs)
{
    char name[BK_HEAP_NAME_MAX];
    bk__heap_name(p, heap_id, name, sizeof(name));
    struct hp_frame f = {.function_name = name};
    return bk__intern_leaf(&bk->in, cs, &f, ret_cs);
}

void bk_record_alloc(bk_t *bk, int32_t pid, uint32_t heap_id, uint64_t seq, uint64_t addr,
                     uint64_t size, uint64_t sample_size, const struct hp_frame *frames,
                     size_t n_frames)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p) {
        bk->counters.records_no_process++;
        return;
    }
    uint32_t cs;
    if (bk__intern_stack(&bk->in, frames, n_frames, &cs) < 0 ||
        (heap_id != 0 && heap_mark(bk, p, heap_id, cs, &cs) < 0)) {
        refuse(bk, p);
        return;
    }
    struct bk_pending r = {.seq = seq,
                           .addr = addr,
                           .size = sample_size,
                           .callstack = cs,
                           .heap_id = heap_id,
                           .kind = BK_REC_ALLOC,
                           .weight = alloc_weight(p, size)};
    submit(bk, p, &r);
}

void bk_record_free(bk_t *bk, int32_t pid, uint32_t heap_id, uint64_t seq, uint64_t addr)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p) {
        bk->counters.records_no_process++;
        return;
    }
    struct bk_pending r = {.seq = seq, .addr = addr, .heap_id = heap_id, .kind = BK_REC_FREE};
    submit(bk, p, &r);
}

/* Moves every live allocation of @h to @pf (p->pf_heap): freed in @h, live in @pf. */
static void pf_move_heap(bk_t *bk, struct bk_proc *p, struct bk_heap *h, struct bk_heap *pf)
{
    size_t pos = 0;
    uint64_t addr;
    void *val;
    while (hp_map_next(&h->live, &pos, &addr, &val)) {
        const struct bk_live *l = val;
        uint64_t size = live_size(h, addr, l);
        uint32_t cs = h->sites[l->site].callstack_id;
        /* Out of memory: the site's own stack (trace processor then rejects it). */
        if (heap_mark(bk, p, BK_HEAP_POSSIBLY_FREED, cs, &cs) < 0)
            cs = h->sites[l->site].callstack_id;
        struct bk_pending r = {.seq = l->seq,
                               .addr = addr,
                               .size = size,
                               .callstack = cs,
                               .heap_id = BK_HEAP_POSSIBLY_FREED,
                               .kind = BK_REC_ALLOC};
        /* No weight: the estimate of allocations made stays with @h. */
        apply_alloc(bk, p, pf, &r);
        site_free(h, l->site, size);
    }
    /* Emptied as a whole: removing entries while iterating would move later ones. */
    hp_map_done(&h->live);
    hp_map_done(&h->big_sizes);
    hp_map_init(&h->live, sizeof(struct bk_live));
    hp_map_init(&h->big_sizes, sizeof(uint64_t));
}

void bk_mark_possibly_freed(bk_t *bk, int32_t pid)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return;
    bk__flush_pending(bk, p);
    if (!p->pf_heap)
        p->pf_heap = heap_get(bk, p, BK_HEAP_POSSIBLY_FREED);
    struct bk_heap *pf = p->pf_heap;
    if (!pf)
        return; /* no memory, or the cap of heaps: they stay where they are */
    for (size_t i = 0; i < p->n_heaps; i++)
        if (p->heaps[i] != pf)
            pf_move_heap(bk, p, p->heaps[i], pf);
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
    return bk__dump_proc(bk, p, false);
}

int bk_dump_all(bk_t *bk)
{
    int r = bk__write_clock_snapshot(bk);
    for (size_t i = 0; i < bk->n_procs && r >= 0; i++) {
        bk__flush_pending(bk, bk->procs[i]);
        r = bk__dump_proc(bk, bk->procs[i], false);
        /* A full sink dropped that dump: the next process's starts the sequence over. */
        if (r == -ENOBUFS && i + 1 < bk->n_procs)
            r = 0;
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
        r = bk__dump_proc(bk, p, true);
    proc_forget(bk, p);
    return r;
}

void bk_get_counters(bk_t *bk, struct bk_counters *ret)
{
    uint64_t live = 0;
    for (size_t i = 0; i < bk->n_procs; i++) {
        bk__flush_ready(bk, bk->procs[i]);
        for (size_t k = 0; k < bk->procs[i]->n_heaps; k++)
            live += bk->procs[i]->heaps[k]->live_total;
    }
    *ret = bk->counters;
    ret->live_bytes = live;
}

/* *@b += @n, saturating: the helpers say SIZE_MAX for what cannot be counted. */
static void add_bytes(size_t *b, size_t n)
{
    *b = *b > SIZE_MAX - n ? SIZE_MAX : *b + n;
}

/* What @h's tables take on if @more of the next records are its own; with @next_only,
 * each table at most its next doubling. */
static size_t heap_grow_ahead(const struct bk_heap *h, size_t more, bool next_only)
{
    size_t live = more, sites = more, b = 0;
    if (next_only) {
        live = HP_MIN(more, hp_map_room(&h->live) + 1);
        sites = HP_MIN(more, h->cap_sites - h->n_sites + 1);
    }
    add_bytes(&b, hp_map_grow_ahead(&h->live, live));
    add_bytes(&b, hp_grow_ahead(h->n_sites, h->cap_sites, sizeof(struct bk_site), sites));
    if (h->track_peak)
        add_bytes(&b, hp_grow_ahead(h->n_sites, h->cap_sites, sizeof(struct bk_site_max), sites));
    return b;
}

size_t bk_grow_ahead(const bk_t *bk, size_t more)
{
    const struct bk_intern *in = &bk->in;
    size_t b = 0;
    /* Every frame of a record may be new to every interned table at once (a new
     * mapping, function name, frame and callstack node). */
    for (int k = 0; k < BK_STR_KINDS; k++) {
        add_bytes(&b, hp_idtab_grow_ahead(&in->str[k].index, more));
        add_bytes(&b, hp_grow_ahead(in->str[k].n, in->str[k].cap, sizeof(struct bk_str), more));
    }
    add_bytes(&b, hp_idtab_grow_ahead(&in->mapping_index, more));
    add_bytes(&b, hp_idtab_grow_ahead(&in->frame_index, more));
    add_bytes(&b, hp_idtab_grow_ahead(&in->cs_index, more));
    add_bytes(&b, hp_grow_ahead(in->n_mappings, in->cap_mappings, sizeof(struct bk_mapping), more));
    add_bytes(&b, hp_grow_ahead(in->n_frames, in->cap_frames, sizeof(struct bk_frame), more));
    add_bytes(&b, hp_grow_ahead(in->n_nodes, in->cap_nodes, sizeof(struct bk_cs_node), more));
    /* An encoded callstack entry takes a few bytes per frame. */
    add_bytes(&b, hp_grow_ahead(in->emit.len, in->emit.cap, 1, 16 * more));
    /* But a record is of one process: the heap whose tables would grow most takes all
     * @more, every other one at most its next doubling (a few records each may reach
     * it). Counting @more for each would count the same records once per process: an
     * idle process would weigh ~10 MB, and a few dozen of them would fire the guardrail
     * on their own. */
    size_t most = 0;
    for (size_t i = 0; i < bk->n_procs; i++) {
        const struct bk_proc *p = bk->procs[i];
        for (size_t k = 0; k < p->n_heaps; k++) {
            size_t next = heap_grow_ahead(p->heaps[k], more, true);
            size_t all = heap_grow_ahead(p->heaps[k], more, false);
            add_bytes(&b, next);
            most = HP_MAX(most, all - next);
        }
    }
    add_bytes(&b, most);
    return b;
}

void bk__set_max_packet_bytes(bk_t *bk, size_t n)
{
    bk->max_packet_bytes = n;
}
