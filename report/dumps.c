/* report/dumps.c: ProfilePackets. Each process's part of the dump in progress on a
 * sequence (struct rd_pdump) collects its samples and header; when the dump is
 * complete (a packet without `continued`), the dump selected by the options is
 * resolved and replaces the callsites of that (pid, program, heap) (struct rd_proc),
 * or, with all_dumps, is added to its list. A gap in `index` drops the dump in
 * progress.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/pbwire.h"

/* ---- the dump in progress ---- */

static void pdump_done(struct rd_pdump *d)
{
    hp_map_done(&d->index);
    free(d->samples);
}

void rp__chain_drop(struct rd_seq *seq)
{
    for (size_t i = 0; i < seq->n_chain; i++)
        pdump_done(&seq->chain[i]);
    seq->n_chain = 0;
    hp_idtab_done(&seq->chain_index);
    hp_idtab_init(&seq->chain_index);
}

/* ---- profile packets ---- */

static int parse_stats(struct rd_header *h, const uint8_t *buf, size_t len)
{
    static const struct rd_varint fields[] = {
        {PF_STATS(unwinding_errors), RD_U64(struct rd_header, unwinding_errors)},
        {PF_STATS(heap_samples), RD_U64(struct rd_header, heap_samples)},
        {PF_STATS(map_reparses), RD_U64(struct rd_header, map_reparses)},
        {PF_STATS(total_unwinding_time_us), RD_U64(struct rd_header, total_unwinding_time_us)},
        {PF_STATS(client_spinlock_blocked_us),
         RD_U64(struct rd_header, client_spinlock_blocked_us)},
        {PF_STATS(frees_lost), RD_U64(struct rd_header, frees_lost)},
        {PF_STATS(writer_stalls), RD_U64(struct rd_header, writer_stalls)},
        {PF_STATS(profile_start_timestamp), RD_U64(struct rd_header, profile_start_ts)},
        {PF_STATS(process_start_timestamp), RD_U64(struct rd_header, process_start_ts)},
        {PF_STATS(stalled_records_skipped), RD_U64(struct rd_header, stalled_records_skipped)},
#define LOSS(f, member) {PF_STATS(f), RD_U64(struct rd_header, losses.member)}
        LOSS(records_dropped, records_dropped),
        LOSS(reserve_failures, reserve_failures),
        LOSS(freeset_full, freeset_full),
        LOSS(records_unread, records_unread),
        LOSS(records_lost_in_service, records_lost_in_service),
        LOSS(records_refused, records_refused),
        LOSS(unknown_frees, unknown_frees),
        LOSS(seq_gaps, seq_gaps),
        LOSS(stacks_truncated, stacks_truncated),
        LOSS(unknown_stacks, unknown_stacks),
        LOSS(map_reparses_deferred, map_reparses_deferred),
        LOSS(unseen_call_slots, unseen_call_slots),
#undef LOSS
    };
    h->unwinding_errors = h->heap_samples = h->map_reparses = 0;
    h->total_unwinding_time_us = h->client_spinlock_blocked_us = h->frees_lost = 0;
    h->writer_stalls = h->stalled_records_skipped = h->profile_start_ts = 0;
    h->process_start_ts = 0;
    h->losses = (struct rp_trace_losses){0};
    return rp__parse_varints(buf, len, fields, HP_ARRAY_SIZE(fields), h);
}

static int parse_sample(struct rd_pdump *d, const uint8_t *buf, size_t len)
{
    static const struct rd_varint fields[] = {
        {PF_SAMPLE(callstack_id), RD_U64(struct rd_sample, callstack_id)},
        {PF_SAMPLE(self_allocated), RD_U64(struct rd_sample, self_allocated)},
        {PF_SAMPLE(self_freed), RD_U64(struct rd_sample, self_freed)},
        {PF_SAMPLE(alloc_count), RD_U64(struct rd_sample, alloc_count)},
        {PF_SAMPLE(free_count), RD_U64(struct rd_sample, free_count)},
        {PF_SAMPLE(self_max), RD_U64(struct rd_sample, self_max)},
        {PF_SAMPLE(self_max_count), RD_U64(struct rd_sample, self_max_count)},
        {PF_SAMPLE(est_alloc_count), RD_U64(struct rd_sample, est_alloc_count)},
    };
    struct rd_sample s = {0};
    int r = rp__parse_varints(buf, len, fields, HP_ARRAY_SIZE(fields), &s);
    if (r < 0)
        return r;
    uint64_t *idx;
    r = hp_map_put(&d->index, s.callstack_id, (void **)&idx);
    if (r < 0)
        return r;
    if (r == 0) {
        /* The same callstack twice in one dump: add up (values are per callstack). */
        struct rd_sample *o = &d->samples[*idx];
        o->self_allocated += s.self_allocated;
        o->self_freed += s.self_freed;
        o->alloc_count += s.alloc_count;
        o->free_count += s.free_count;
        o->self_max += s.self_max;
        o->self_max_count += s.self_max_count;
        o->est_alloc_count += s.est_alloc_count;
        return 0;
    }
    if (hp_grow((void **)&d->samples, &d->cap_samples, d->n_samples + 1, sizeof(s)) < 0) {
        hp_map_remove(&d->index, s.callstack_id);
        return -ENOMEM;
    }
    *idx = d->n_samples;
    d->samples[d->n_samples++] = s;
    return 0;
}

struct chain_key {
    const struct rd_seq *seq;
    uint64_t pid;
    const char *heap_name;
};

static bool chain_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct chain_key *k = key;
    (void)ctx;
    return k->seq->chain[id].pid == k->pid && k->seq->chain[id].heap_name == k->heap_name;
}

/* The part of (@pid, @heap_name) in the dump in progress: a hash lookup, since one dump
 * may hold many processes. */
static struct rd_pdump *chain_get(struct rd *rd, struct rd_seq *seq, uint64_t pid,
                                  const char *heap_name)
{
    struct chain_key k = {seq, pid, heap_name};
    uint64_t h = rp__hash(rd, (uint64_t[]){pid, (uintptr_t)heap_name}, 2);
    int64_t id = hp_idtab_find(&seq->chain_index, h, chain_eq, NULL, &k);
    if (id >= 0)
        return &seq->chain[id];
    if (seq->n_chain >= UINT32_MAX - 1 ||
        hp_grow((void **)&seq->chain, &seq->cap_chain, seq->n_chain + 1, sizeof(*seq->chain)) < 0 ||
        hp_idtab_add(&seq->chain_index, h, (uint32_t)seq->n_chain) < 0)
        return NULL;
    struct rd_pdump *d = &seq->chain[seq->n_chain++];
    *d = (struct rd_pdump){.pid = pid, .heap_name = heap_name};
    hp_map_init(&d->index, sizeof(uint64_t));
    return d;
}

static int parse_process_dump(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    uint64_t pid;
    const uint8_t *heap;
    size_t heap_len;
    int r =
        rp__parse_id_bytes(buf, len, PF_DUMP(pid), PF_DUMP(heap_name), 256, &pid, &heap, &heap_len);
    if (r < 0)
        return r;
    const char *heap_name = rp__intern(rd, heap ? (const char *)heap : "", heap_len);
    if (!heap_name)
        return -ENOMEM;
    struct rd_pdump *d = chain_get(rd, seq, pid, heap_name);
    if (!d)
        return -ENOMEM;
    struct rd_header *h = &d->hdr;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type == HP_PB_LEN) {
            if (f.num == PF_DUMP(samples))
                r = parse_sample(d, f.ptr, f.len);
            else if (f.num == PF_DUMP(stats))
                r = parse_stats(h, f.ptr, f.len);
        } else if (f.wire_type == HP_PB_VARINT) {
            bool b = f.varint != 0;
            switch (f.num) {
            case PF_DUMP(from_startup):
                h->from_startup |= b;
                break;
            case PF_DUMP(disconnected):
                h->disconnected |= b;
                break;
            case PF_DUMP(buffer_overran):
                h->buffer_overran |= b;
                break;
            case PF_DUMP(buffer_corrupted):
                h->buffer_corrupted |= b;
                break;
            case PF_DUMP(timestamp):
                h->timestamp = f.varint;
                break;
            case PF_DUMP(hit_guardrail):
                h->hit_guardrail |= b;
                break;
            case PF_DUMP(sampling_interval_bytes):
                h->sampling_interval_bytes = f.varint;
                break;
            case PF_DUMP(client_error):
                h->client_error |= b;
                break;
            case PF_DUMP(writer_stalled):
                h->writer_stalled |= b;
                break;
            case PF_DUMP(connection_closed_by_program):
                h->connection_closed_by_program |= b;
                break;
            case PF_DUMP(connection_lost):
                h->connection_lost |= b;
                break;
            }
        }
        if (r < 0)
            return r;
    }
    return it.error ? -EBADMSG : 0;
}

struct proc_key {
    const struct rd *rd;
    int32_t pid;
    uint32_t exec_index;
    const char *heap_name;
};

static bool proc_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct proc_key *k = key;
    const struct rd_proc *p = &k->rd->procs[id];
    (void)ctx;
    return p->pid == k->pid && p->exec_index == k->exec_index && p->heap_name == k->heap_name;
}

struct rd_proc *rp__proc_get(struct rd *rd, int32_t pid, uint32_t exec_index, const char *heap_name)
{
    struct proc_key k = {rd, pid, exec_index, heap_name};
    uint64_t h = rp__hash(rd, (uint64_t[]){(uint32_t)pid, exec_index, (uintptr_t)heap_name}, 3);
    int64_t id = hp_idtab_find(&rd->proc_index, h, proc_eq, NULL, &k);
    if (id >= 0)
        return &rd->procs[id];
    if (rd->n_procs >= UINT32_MAX - 1 ||
        hp_grow((void **)&rd->procs, &rd->cap_procs, rd->n_procs + 1, sizeof(*rd->procs)) < 0 ||
        hp_idtab_add(&rd->proc_index, h, (uint32_t)rd->n_procs) < 0 ||
        rp__keep(rd, sizeof(struct rd_proc) + sizeof(struct rp_trace_process)) < 0)
        return NULL;
    struct rd_proc *p = &rd->procs[rd->n_procs++];
    *p = (struct rd_proc){.pid = pid, .exec_index = exec_index, .heap_name = heap_name};
    return p;
}

/* The callsites of @d's samples, resolved with @seq's tables (malloc'd). */
static int resolve_dump(struct rd *rd, struct rd_seq *seq, const struct rd_pdump *d,
                        struct rp_trace_callsite **ret)
{
    *ret = NULL;
    if (!d->n_samples)
        return 0;
    int r = rp__keep(rd, d->n_samples * sizeof(struct rp_trace_callsite));
    if (r < 0)
        return r;
    struct rp_trace_callsite *cs = calloc(d->n_samples, sizeof(*cs));
    if (!cs)
        return -ENOMEM;
    for (size_t i = 0; i < d->n_samples; i++) {
        const struct rd_sample *s = &d->samples[i];
        const struct rd_stack *stk;
        r = rp__resolve_stack(rd, seq, s->callstack_id, &stk);
        if (r < 0) {
            free(cs);
            return r;
        }
        /* The leaf frame that names the heap (bookkeeping/bookkeeping.c, heap_mark()):
         * there for Perfetto's trace processor, which mixes heaps that share stacks; the
         * views show heaps apart already. */
        size_t n = stk->n;
        if (n > 1 && d->heap_name[0] && !stk->frames[n - 1].mapping_path[0] &&
            !strcmp(stk->frames[n - 1].function_name, d->heap_name))
            n--;
        cs[i] = (struct rp_trace_callsite){
            .callstack_id = s->callstack_id,
            .n_frames = n,
            .frames = stk->frames,
            .self_allocated = s->self_allocated,
            .self_freed = s->self_freed,
            .alloc_count = s->alloc_count,
            .free_count = s->free_count,
            .self_max = s->self_max,
            .self_max_count = s->self_max_count,
            .est_alloc_count = s->est_alloc_count,
        };
    }
    *ret = cs;
    return 0;
}

/* Adds the totals of @d, a complete dump, to @p's list. */
static int add_total(struct rd *rd, struct rd_proc *p, const struct rd_pdump *d)
{
    if (hp_grow((void **)&p->totals, &p->cap_totals, p->n_dumps, sizeof(*p->totals)) < 0 ||
        rp__keep(rd, sizeof(*p->totals)) < 0)
        return -ENOMEM;
    struct rp_trace_dump_total *t = &p->totals[p->n_dumps - 1];
    *t = (struct rp_trace_dump_total){.timestamp = d->hdr.timestamp};
    for (size_t i = 0; i < d->n_samples; i++) {
        const struct rd_sample *s = &d->samples[i];
        t->allocated_bytes += s->self_allocated;
        if (s->self_allocated > s->self_freed)
            t->unreleased_bytes += s->self_allocated - s->self_freed;
    }
    return 0;
}

/* The dump in progress on @seq is complete. */
static int chain_commit(struct rd *rd, struct rd_seq *seq)
{
    int r = 0;
    for (size_t i = 0; i < seq->n_chain && r == 0; i++) {
        struct rd_pdump *d = &seq->chain[i];
        int32_t pid = (int32_t)d->pid;
        struct rd_pid *pi;
        r = hp_map_put(&rd->pids, (uint64_t)(uint32_t)pid, (void **)&pi);
        if (r < 0)
            break;
        r = 0;
        pi->dumped = true;
        pi->ended = d->hdr.disconnected;
        if (rd->opt->pid && pid != rd->opt->pid)
            continue;
        struct rd_proc *p = rp__proc_get(rd, pid, pi->exec_index, d->heap_name);
        if (!p) {
            r = -ENOMEM;
            break;
        }
        if (pi->cmdline)
            p->cmdline = pi->cmdline;
        p->n_dumps++;
        r = add_total(rd, p, d);
        if (r < 0)
            break;
        int want = rd->opt->dump_index;
        if (!rd->opt->all_dumps && want > 0 && p->n_dumps != (uint32_t)want)
            continue;
        struct rp_trace_callsite *cs;
        r = resolve_dump(rd, seq, d, &cs);
        if (r < 0)
            break;
        if (rd->opt->all_dumps) {
            if (hp_grow((void **)&p->dumps, &p->cap_dumps, p->n_dumps, sizeof(*p->dumps)) < 0 ||
                rp__keep(rd, sizeof(*p->dumps)) < 0) {
                free(cs);
                r = -ENOMEM;
                break;
            }
            p->dumps[p->n_dumps - 1] = (struct rp_trace_dump){
                .timestamp = d->hdr.timestamp,
                .sampling_interval_bytes = d->hdr.sampling_interval_bytes,
                .n_callsites = d->n_samples,
                .callsites = cs,
            };
            if (want > 0 && p->n_dumps != (uint32_t)want)
                continue;
        } else {
            free(p->callsites);
        }
        p->selected = true;
        p->hdr = d->hdr;
        p->callsites = cs;
        p->n_callsites = d->n_samples;
    }
    rp__chain_drop(seq);
    return r;
}

int rp__parse_profile_packet(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    bool continued = false, has_index = false;
    uint64_t index = 0;
    int r = 0;
    /* First pass: scalars, and the legacy (Android Q) interning tables, which share one
     * string table for names, paths and build ids. */
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f) && r == 0) {
        if (f.wire_type == HP_PB_VARINT) {
            if (f.num == PF_PROFILE(continued))
                continued = f.varint != 0;
            else if (f.num == PF_PROFILE(index)) {
                has_index = true;
                index = f.varint;
            }
        } else if (f.wire_type == HP_PB_LEN) {
            switch (f.num) {
            case PF_PROFILE(strings):
                for (int k = 0; k < STR_KINDS && r == 0; k++)
                    r = rp__parse_string(seq, &seq->strs[k], f.ptr, f.len);
                break;
            case PF_PROFILE(frames):
                r = rp__parse_frame(seq, f.ptr, f.len);
                break;
            case PF_PROFILE(callstacks):
                r = rp__parse_callstack(rd, seq, f.ptr, f.len);
                break;
            case PF_PROFILE(mappings):
                r = rp__parse_mapping(rd, seq, f.ptr, f.len);
                break;
            }
        }
    }
    if (r < 0)
        return r;
    if (it.error)
        return -EBADMSG;
    if (has_index) {
        /* A gap in the index means lost packets: the dump in progress is incomplete. */
        if (seq->have_index && index != seq->next_index)
            rp__chain_drop(seq);
        seq->have_index = true;
        seq->next_index = index + 1;
    }
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f) && r == 0) {
        if (f.num == PF_PROFILE(process_dumps) && f.wire_type == HP_PB_LEN)
            r = parse_process_dump(rd, seq, f.ptr, f.len);
    }
    if (r < 0)
        return r;
    if (it.error)
        return -EBADMSG;
    seq->in_dump = continued;
    return continued ? 0 : chain_commit(rd, seq);
}
