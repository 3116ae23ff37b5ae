/* bookkeeping/dump.c: turns bookkeeping state into TracePackets, written one at a time.
 *
 * A dump of one heap of one process is a run of TracePackets, each of them
 *
 *     TracePacket { timestamp (BOOTTIME), trusted_packet_sequence_id (not with a sink),
 *                   sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE,
 *                   interned_data { function_names, mapping_paths, build_ids,
 *                                   mappings, frames, callstacks }     (new entries only)
 *                   profile_packet { index, continued,
 *                                    process_dumps { pid, heap_name, ..., samples } } }
 *
 * filled from seven sources in this order: the three string tables, mappings, frames,
 * callstacks, then the heap's samples, while each item's size bound fits the packet
 * budget, so a packet is complete when written and everything it refers to was defined
 * in it or before it. Flags and stats go in the last packet of the dump only, so
 * readers that add them up per packet count each once. After the dump, ModuleSymbols
 * packets give source lines of the new frames (bookkeeping/symbols.c); the packets go
 * out through bookkeeping/output.c.
 *
 * Profile packets are encoded by hand in one pass (the bench measured nanopb's
 * size-then-write passes at hundreds of times a copy of the same bytes); the rare small
 * packets (clock snapshots, process tree, the first packet) use nanopb. Callstacks are
 * encoded once, when interned (struct bk_emit); a packet is written with writev() from
 * its buffer and from there, so they are not copied again.
 */
#include "bookkeeping/state.h"

#include <errno.h>
#include <pb_encode.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bookkeeping/samples.h"
#include "common/clock.h"
#include "common/pbwire.h"
#include "protos/fields.h"
#include "protos/trace_packet.pb.h"

_Static_assert(HP_PB_TRACE_PACKET_TAG == (PF_TRACE(packet) << 3 | HP_PB_LEN),
               "the Trace framing is Trace.packet");

/* ---- direct encoding ----
 *
 * Profile packets are encoded straight into bk->buf, one pass per item, without sizing
 * anything twice: a submessage gets a 4-byte redundant varint length (as protozero
 * writes them) patched when it is closed, and a small item gets a 1-byte length that
 * is widened by a memmove in the rare case its body reached 128 bytes. */

/* Length field of an open submessage: 4 bytes hold lengths below 2^28. */
#define LEN4 4
#define MAX_LEN4 ((1u << 28) - 1)

enum src {
    SRC_FUNCTION_NAMES,
    SRC_MAPPING_PATHS,
    SRC_BUILD_IDS,
    SRC_MAPPINGS,
    SRC_FRAMES,
    SRC_CALLSTACKS,
    SRC_SAMPLES,
    SRC_COUNT
};

static const enum bk_str_kind src_str_kind[] = {
    [SRC_FUNCTION_NAMES] = BK_STR_FUNCTION,
    [SRC_MAPPING_PATHS] = BK_STR_PATH,
    [SRC_BUILD_IDS] = BK_STR_BUILD_ID,
};

/* InternedData field of each source (samples go in ProcessHeapSamples.samples). */
static const uint32_t src_field[] = {
    [SRC_FUNCTION_NAMES] = PF_INTERNED(function_names),
    [SRC_MAPPING_PATHS] = PF_INTERNED(mapping_paths),
    [SRC_BUILD_IDS] = PF_INTERNED(build_ids),
    [SRC_MAPPINGS] = PF_INTERNED(mappings),
    [SRC_FRAMES] = PF_INTERNED(frames),
    [SRC_CALLSTACKS] = PF_INTERNED(callstacks),
    [SRC_SAMPLES] = PF_DUMP(samples),
};

struct enc {
    uint8_t *p; /* bk->buf.p; may move when grown */
    size_t len;
    bool oom;
    /* Pre-encoded callstacks the packet holds at offset ext_at of p, written from where
     * the interning keeps them instead of being copied in (see put_callstacks). */
    const uint8_t *ext;
    size_t ext_at, ext_len;
};

static inline bool enc_reserve(bk_t *bk, struct enc *e, size_t n)
{
    if (HP_LIKELY(e->len + n <= bk->buf.cap))
        return true;
    if (hp_grow((void **)&bk->buf.p, &bk->buf.cap, e->len + n, 1) < 0) {
        e->oom = true;
        return false;
    }
    e->p = bk->buf.p;
    return true;
}

/* pre: room reserved. */
static inline void put_varint(struct enc *e, uint64_t v)
{
    e->len += hp_pb_put_varint(e->p + e->len, v);
}

static inline void put_tag(struct enc *e, uint32_t field, uint32_t wt)
{
    if (HP_LIKELY(field < 16))
        e->p[e->len++] = (uint8_t)(field << 3 | wt);
    else
        put_varint(e, (uint64_t)field << 3 | wt);
}

static inline void put_uint(struct enc *e, uint32_t field, uint64_t v)
{
    put_tag(e, field, HP_PB_VARINT);
    put_varint(e, v);
}

/* Opens submessage @field with a 4-byte length; returns where the length goes. */
static inline size_t open4(struct enc *e, uint32_t field)
{
    put_tag(e, field, HP_PB_LEN);
    size_t at = e->len;
    e->len += LEN4;
    return at;
}

static inline void close4(struct enc *e, size_t at)
{
    size_t n = e->len - at - LEN4;
    if (e->ext && at < e->ext_at)
        n += e->ext_len; /* it holds the callstacks written in place */
    hp_pb_put_varint4(e->p + at, (uint32_t)n);
}

/* Opens a small submessage with a 1-byte length. */
static inline size_t open1(struct enc *e, uint32_t field)
{
    put_tag(e, field, HP_PB_LEN);
    return e->len++;
}

/* pre: HP_PB_VARINT_MAX bytes of room beyond the body. */
static inline void close1(struct enc *e, size_t at)
{
    size_t n = e->len - at - 1;
    if (HP_LIKELY(n < 0x80)) {
        e->p[at] = (uint8_t)n;
        return;
    }
    size_t w = hp_pb_varint_size(n);
    memmove(e->p + at + w, e->p + at + 1, n);
    size_t end = at + w + n;
    e->len = at;
    put_varint(e, n);
    e->len = end;
}

/* Room reserved per sample. */
#define SAMPLE_BOUND 112
_Static_assert(SAMPLE_BOUND >= BK_SAMPLE_MAX_BYTES, "a sample fits its bound");

/* An upper bound of the encoded size of item @i of @src. */
static size_t item_bound(const bk_t *bk, enum src src, size_t i)
{
    const struct bk_intern *in = &bk->in;
    switch (src) {
    case SRC_FUNCTION_NAMES:
    case SRC_MAPPING_PATHS:
    case SRC_BUILD_IDS:
        return 32 + in->str[src_str_kind[src]].v[i].len;
    case SRC_MAPPINGS:
        return 96 + (size_t)in->mappings[i].n_comps * 12;
    case SRC_FRAMES:
        return 48;
    case SRC_CALLSTACKS: /* put_callstacks() */
    case SRC_SAMPLES:
        return SAMPLE_BOUND;
    case SRC_COUNT:
        break;
    }
    return 0;
}

static void put_item(bk_t *bk, struct enc *e, enum src src, size_t i, const struct bk_heap *h)
{
    const struct bk_intern *in = &bk->in;
    size_t at = open1(e, src_field[src]);
    switch (src) {
    case SRC_FUNCTION_NAMES:
    case SRC_MAPPING_PATHS:
    case SRC_BUILD_IDS: {
        const struct bk_str *str = &in->str[src_str_kind[src]].v[i];
        put_uint(e, PF_STRING(iid), i);
        put_tag(e, PF_STRING(str), HP_PB_LEN);
        put_varint(e, str->len);
        memcpy(e->p + e->len, str->s, str->len);
        e->len += str->len;
        break;
    }
    case SRC_MAPPINGS: {
        const struct bk_mapping *m = &in->mappings[i];
        put_uint(e, PF_MAPPING(iid), i);
        put_uint(e, PF_MAPPING(build_id), m->build_id);
        put_uint(e, PF_MAPPING(start_offset), m->start_offset);
        put_uint(e, PF_MAPPING(start), m->start);
        put_uint(e, PF_MAPPING(end), m->end);
        put_uint(e, PF_MAPPING(load_bias), m->load_bias);
        /* Repeated integers unpacked, as proto2 (and Perfetto's readers) expect. */
        for (uint32_t c = 0; c < m->n_comps; c++)
            put_uint(e, PF_MAPPING(path_string_ids), m->comps[c]);
        put_uint(e, PF_MAPPING(exact_offset), m->exact_offset);
        break;
    }
    case SRC_FRAMES: {
        const struct bk_frame *f = &in->frames[i];
        put_uint(e, PF_FRAME(iid), i);
        put_uint(e, PF_FRAME(function_name_id), f->function_name_id);
        put_uint(e, PF_FRAME(mapping_id), f->mapping_id);
        put_uint(e, PF_FRAME(rel_pc), f->rel_pc);
        break;
    }
    case SRC_CALLSTACKS: /* put_callstacks() */
        break;
    case SRC_SAMPLES: {
        const struct bk_site *s = &h->sites[i];
        put_uint(e, PF_SAMPLE(callstack_id), s->callstack_id);
        put_uint(e, PF_SAMPLE(self_allocated), s->allocated);
        put_uint(e, PF_SAMPLE(self_freed), s->freed);
        put_uint(e, PF_SAMPLE(alloc_count), s->alloc_count);
        put_uint(e, PF_SAMPLE(free_count), s->free_count);
        if (bk->dump_at_max && h->track_peak) {
            uint64_t mb, mc;
            bk__site_at_peak(h, i, &mb, &mc);
            put_uint(e, PF_SAMPLE(self_max), mb);
            put_uint(e, PF_SAMPLE(self_max_count), mc);
        }
        put_uint(e, PF_SAMPLE(est_alloc_count), bk__site_est_allocs(s));
        break;
    }
    case SRC_COUNT:
        break;
    }
    close1(e, at);
}

/* ---- the two big sources, in bulk ----
 *
 * A dump of many callsites is mostly callstacks and samples: samples are encoded by
 * bookkeeping/samples.c with room reserved once per run of items; callstacks were
 * encoded when interned. The bytes are those put_item writes. */

/* Encodes samples [*@i, @limit) of @h, each while @used plus an item's bound stays
 * within @budget (the first one regardless when !@any), as put_item would one by one.
 * Returns false when out of memory. */
static bool put_samples(bk_t *bk, struct enc *e, const struct bk_heap *h, size_t *i, size_t limit,
                        size_t *used, size_t budget, bool *any)
{
    const size_t bound = item_bound(bk, SRC_SAMPLES, 0);
    const struct bk_samples in = bk__heap_samples(h, bk->dump_at_max);
    while (*i < limit) {
        size_t n = *used + bound <= budget ? (budget - *used) / bound : !*any;
        if (n == 0)
            break;
        n = HP_MIN(n, limit - *i);
        if (!enc_reserve(bk, e, n * bound + BK_SAMPLE_SLACK))
            return false;
        uint8_t *const q0 = e->p + e->len;
        uint8_t *q = bk__encode_samples(q0, &in, *i, *i + n);
        *i += n;
        *used += (size_t)(q - q0);
        e->len += (size_t)(q - q0);
        *any = true;
    }
    return true;
}

/* Takes pre-encoded callstacks (struct bk_emit) from entry *@i at byte offset *@off,
 * as many whole entries as keep @used within @budget (at least one when !@any), into
 * the packet at its current end. The bytes are not copied: the packet is written with
 * them in place (e->ext), so nothing may follow them in the buffer but the closing of
 * the interned data and the profile packet. */
static void put_callstacks(bk_t *bk, struct enc *e, size_t *i, size_t *off, size_t *used,
                           size_t budget, bool *any)
{
    const struct bk_emit *em = &bk->in.emit;
    size_t room = budget > *used ? budget - *used : 0;
    size_t idx = *i, end = *off;
    /* Whole groups of entries up to the last mark that fits, then entry by entry. */
    for (size_t m = idx / BK_EMIT_MARK_EVERY + 1; m < em->n_marks && em->marks[m] - *off <= room;
         m++) {
        idx = m * BK_EMIT_MARK_EVERY;
        end = em->marks[m];
    }
    while (idx < em->n) {
        size_t size = bk__emit_entry_size(em->p + end);
        if (end + size - *off > room && (*any || end > *off))
            break;
        end += size;
        idx++;
    }
    size_t n = end - *off;
    if (n == 0)
        return;
    e->ext = em->p + *off;
    e->ext_at = e->len;
    e->ext_len = n;
    *used += n;
    *any = true;
    *i = idx;
    *off = end;
}

/* ---- process dumps ---- */

static void put_stats(struct enc *e, const struct bk_proc *p)
{
    static const uint64_t bounds[] = BK_UNWIND_HIST_BOUNDS;
    _Static_assert(HP_ARRAY_SIZE(bounds) == HP_ARRAY_SIZE(p->stats.unwinding_time_hist),
                   "one bound per histogram bucket");
    const struct bk_process_stats *s = &p->stats;
    size_t st = open4(e, PF_DUMP(stats));
    put_uint(e, PF_STATS(unwinding_errors), s->unwinding_errors);
    put_uint(e, PF_STATS(heap_samples), s->heap_samples);
    put_uint(e, PF_STATS(map_reparses), s->map_reparses);
    size_t hist = open4(e, PF_STATS(unwinding_time_us));
    for (size_t i = 0; i < HP_ARRAY_SIZE(bounds); i++) {
        size_t b = open4(e, PF_HISTOGRAM(buckets));
        if (bounds[i] == UINT64_MAX)
            put_uint(e, PF_BUCKET(max_bucket), 1);
        else
            put_uint(e, PF_BUCKET(upper_limit), bounds[i]);
        put_uint(e, PF_BUCKET(count), s->unwinding_time_hist[i]);
        close4(e, b);
    }
    close4(e, hist);
    put_uint(e, PF_STATS(total_unwinding_time_us), s->total_unwinding_time_us);
    put_uint(e, PF_STATS(client_spinlock_blocked_us), s->client_spinlock_blocked_us);
    /* heapprof's own fields: only when something happened. */
    const struct {
        uint32_t field;
        uint64_t v;
    } own[] = {
        {PF_STATS(frees_lost), s->frees_lost},
        {PF_STATS(records_dropped), s->records_dropped},
        {PF_STATS(reserve_failures), s->reserve_failures},
        {PF_STATS(freeset_full), s->freeset_full},
        {PF_STATS(records_unread), s->records_unread},
        {PF_STATS(records_lost_in_service), s->records_lost_service},
        {PF_STATS(records_refused), p->refused},
        {PF_STATS(unknown_frees), p->unknown_frees},
        {PF_STATS(seq_gaps), p->seq_gaps},
        {PF_STATS(stacks_truncated), s->stacks_truncated},
        {PF_STATS(unknown_stacks), s->unknown_stacks},
        {PF_STATS(map_reparses_deferred), s->map_reparses_deferred},
        {PF_STATS(unseen_call_slots), s->unseen_call_slots},
        {PF_STATS(profile_start_timestamp), p->start_ts},
        {PF_STATS(process_start_timestamp), p->process_start_ts},
        {PF_STATS(writer_stalls), s->writer_stalls},
        {PF_STATS(stalled_records_skipped), s->stalled_records_skipped},
    };
    for (size_t i = 0; i < HP_ARRAY_SIZE(own); i++)
        if (own[i].v)
            put_uint(e, own[i].field, own[i].v);
    close4(e, st);
}

/* Bytes put_flags_stats may write: the histogram, then at most 32 varint fields (flags
 * and stats, each a tag of up to 2 bytes and a varint of up to 10). */
#define FLAGS_STATS_BOUND (64 + 8 * 32 + 32 * 12)

static void put_flags_stats(struct enc *e, const struct bk_proc *p)
{
    bool overran = (p->flags & BK_FLAG_BUFFER_OVERRAN) || p->stats.records_dropped;
    put_uint(e, PF_DUMP(disconnected), !!(p->flags & BK_FLAG_DISCONNECTED));
    put_uint(e, PF_DUMP(buffer_overran), overran);
    put_uint(e, PF_DUMP(buffer_corrupted), !!(p->flags & BK_FLAG_BUFFER_CORRUPTED));
    put_uint(e, PF_DUMP(hit_guardrail), !!(p->flags & BK_FLAG_HIT_GUARDRAIL));
    if (p->flags & BK_FLAG_WRITER_STALLED)
        put_uint(e, PF_DUMP(writer_stalled), 1);
    if (p->flags & BK_FLAG_CONN_CLOSED)
        put_uint(e, PF_DUMP(connection_closed_by_program), 1);
    if (p->flags & BK_FLAG_CONN_LOST)
        put_uint(e, PF_DUMP(connection_lost), 1);
    if (p->flags & BK_FLAG_CLIENT_ERROR) {
        /* As heapprofd: a client error with dropped records is a timeout of a blocking
         * client (it stopped waiting, and dropped what found no room since); any other
         * one is a bad stack. */
        put_uint(
            e, PF_DUMP(client_error),
            overran
                ? perfetto_protos_ProfilePacket_ProcessHeapSamples_ClientError_CLIENT_ERROR_HIT_TIMEOUT
                : perfetto_protos_ProfilePacket_ProcessHeapSamples_ClientError_CLIENT_ERROR_INVALID_STACK_BOUNDS);
    }
    put_stats(e, p);
}

/* ---- one heap's dump, packet by packet ---- */

/* One heap's dump in progress: what is left of each source, and what every packet of
 * the dump repeats. */
struct dump_run {
    struct bk_proc *p;
    struct bk_heap *heap;
    /* Items [begin, limit) of each source are left to go out. */
    size_t begin[SRC_COUNT], limit[SRC_COUNT];
    size_t cs_off; /* byte offset of callstack begin[SRC_CALLSTACKS] in bk->in.emit */
    int src;       /* the first source with items left */
    uint64_t ts_boot, ts_coarse;
    char heap_name[64];
    size_t heap_name_len;
    /* Bytes of a packet outside its items (headers, the ProcessHeapSamples fields, flags
     * and stats, with room to spare), and the budget of its items. */
    size_t fixed, budget;
};

/* With a sink, before anything is encoded: a restart it asks for, or one pending,
 * re-emits every interned entry. */
static int sink_restart(bk_t *bk)
{
    if (bk->sink.take_clear_request && bk->sink.take_clear_request(bk->sink.ctx))
        bk->needs_reset = true;
    return bk->needs_reset ? bk__write_start(bk) : 0;
}

/* Starts @d: the entries interned since the last dump and all the heap's samples, the
 * timestamps and heap name of its packets, and their budget. */
static void dump_begin(bk_t *bk, struct dump_run *d, struct bk_proc *p, struct bk_heap *heap)
{
    const struct bk_intern *in = &bk->in;
    d->p = p;
    d->heap = heap;
    d->src = 0;
    for (int s = SRC_FUNCTION_NAMES; s <= SRC_BUILD_IDS; s++) {
        d->begin[s] = bk->emitted_str[src_str_kind[s]];
        d->limit[s] = in->str[src_str_kind[s]].n;
    }
    d->begin[SRC_MAPPINGS] = HP_MAX(bk->emitted_mappings, (size_t)1);
    d->limit[SRC_MAPPINGS] = in->n_mappings;
    d->begin[SRC_FRAMES] = HP_MAX(bk->emitted_frames, (size_t)1);
    d->limit[SRC_FRAMES] = in->n_frames;
    d->begin[SRC_CALLSTACKS] = bk->emitted_callstacks;
    d->limit[SRC_CALLSTACKS] = in->emit.n;
    d->cs_off = bk->emitted_callstacks_off;
    d->begin[SRC_SAMPLES] = 0;
    d->limit[SRC_SAMPLES] = heap->n_sites;

    d->ts_boot = hp_clock_ns(CLOCK_BOOTTIME);
    /* The coarse clock ticks every few ms: keep each heap's dump timestamps strictly
     * increasing so every dump is its own slice. */
    d->ts_coarse = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    if (d->ts_coarse <= heap->last_dump_ts)
        d->ts_coarse = heap->last_dump_ts + 1;
    heap->last_dump_ts = d->ts_coarse;
    bk__heap_name(p, heap->heap_id, d->heap_name, sizeof(d->heap_name));
    d->heap_name_len = strlen(d->heap_name);
    d->fixed = BK_FRAME_HEADROOM + 128 + d->heap_name_len + FLAGS_STATS_BOUND;
    d->budget = bk->max_packet_bytes > d->fixed ? bk->max_packet_bytes - d->fixed : 0;
}

/* The TracePacket's own fields, at the start of an empty buffer. False when out of
 * memory. */
static bool put_header(bk_t *bk, struct enc *e, const struct dump_run *d)
{
    if (!enc_reserve(bk, e, d->fixed + 64))
        return false;
    put_uint(e, PF_PACKET(timestamp), d->ts_boot);
    if (!bk->has_sink)
        put_uint(e, PF_PACKET(trusted_packet_sequence_id), bk->sequence_id);
    put_uint(e, PF_PACKET(sequence_flags), PF_SEQ_NEEDS_INCREMENTAL_STATE);
    return true;
}

/* Opens the packet's InternedData at *@interned, unless it is open already. */
static bool open_interned(bk_t *bk, struct enc *e, size_t *interned)
{
    if (*interned != SIZE_MAX)
        return true;
    if (!enc_reserve(bk, e, 16))
        return false;
    *interned = open4(e, PF_PACKET(interned_data));
    return true;
}

/* Adds the items left of interned source d->src while they fit (@used of the budget so
 * far; the first item of the packet regardless, then @any is set). 1 when all went in,
 * 0 when the packet is full, -ENOMEM. */
static int put_source(bk_t *bk, struct enc *e, struct dump_run *d, size_t *interned, size_t *used,
                      bool *any)
{
    const int src = d->src;
    if (src == SRC_CALLSTACKS && d->begin[src] < d->limit[src]) {
        if (!open_interned(bk, e, interned))
            return -ENOMEM;
        put_callstacks(bk, e, &d->begin[src], &d->cs_off, used, d->budget, any);
        return d->begin[src] >= d->limit[src];
    }
    for (; d->begin[src] < d->limit[src]; d->begin[src]++) {
        size_t bound = item_bound(bk, (enum src)src, d->begin[src]);
        if (*any && *used + bound > d->budget)
            return 0;
        if (!open_interned(bk, e, interned))
            return -ENOMEM;
        if (!enc_reserve(bk, e, bound + HP_PB_VARINT_MAX))
            return -ENOMEM;
        size_t before = e->len;
        put_item(bk, e, (enum src)src, d->begin[src], d->heap);
        *used += e->len - before;
        *any = true;
    }
    return 1;
}

/* The packet's InternedData: the new strings, mappings, frames and callstacks, in that
 * order, while they fit. 0, or -ENOMEM. */
static int put_interned(bk_t *bk, struct enc *e, struct dump_run *d, size_t *used, bool *any)
{
    size_t interned = SIZE_MAX;
    for (; d->src < SRC_SAMPLES; d->src++) {
        int r = put_source(bk, e, d, &interned, used, any);
        if (r < 0)
            return r;
        if (r == 0)
            break;
    }
    if (interned != SIZE_MAX)
        close4(e, interned);
    return 0;
}

/* The ProcessHeapSamples fields every packet of the dump repeats. pre: room reserved. */
static void put_dump_fields(struct enc *e, const struct dump_run *d)
{
    const struct bk_proc *p = d->p;
    put_uint(e, PF_DUMP(pid), (uint64_t)(uint32_t)p->pid);
    put_uint(e, PF_DUMP(from_startup), p->from_startup);
    put_uint(e, PF_DUMP(timestamp), d->ts_coarse);
    put_tag(e, PF_DUMP(heap_name), HP_PB_LEN);
    put_varint(e, d->heap_name_len);
    memcpy(e->p + e->len, d->heap_name, d->heap_name_len);
    e->len += d->heap_name_len;
    put_uint(e, PF_DUMP(sampling_interval_bytes), p->sampling_interval_bytes);
    /* Equal to the interval: it was not adjusted. Perfetto's trace processor also
     * reads this as "self_max_count is trustworthy". */
    put_uint(e, PF_DUMP(orig_sampling_interval_bytes), p->sampling_interval_bytes);
}

/* The packet's ProfilePacket: the dump's fields, the samples that fit once the interned
 * data is out, and in the last packet of the dump (*@ret_last) the flags and stats.
 * 0, or -ENOMEM. */
static int put_profile(bk_t *bk, struct enc *e, struct dump_run *d, size_t *used, bool *any,
                       bool *ret_last)
{
    if (!enc_reserve(bk, e, 64 + d->heap_name_len))
        return -ENOMEM;
    size_t pp = open4(e, PF_PACKET(profile_packet));
    size_t hs = open4(e, PF_PROFILE(process_dumps));
    put_dump_fields(e, d);
    if (d->src == SRC_SAMPLES && !put_samples(bk, e, d->heap, &d->begin[SRC_SAMPLES],
                                              d->limit[SRC_SAMPLES], used, d->budget, any))
        return -ENOMEM;
    bool last = d->src == SRC_SAMPLES && d->begin[SRC_SAMPLES] == d->limit[SRC_SAMPLES];
    if (!enc_reserve(bk, e, FLAGS_STATS_BOUND + 32))
        return -ENOMEM;
    if (last)
        put_flags_stats(e, d->p);
    close4(e, hs);
    put_uint(e, PF_PROFILE(continued), !last);
    put_uint(e, PF_PROFILE(index), bk->next_packet_index);
    close4(e, pp);
    *ret_last = last;
    return 0;
}

/* What a written packet carried counts as emitted; callstacks all written are released
 * from the emit buffer. */
static void mark_emitted(bk_t *bk, struct dump_run *d)
{
    for (int s = SRC_FUNCTION_NAMES; s <= SRC_BUILD_IDS; s++)
        bk->emitted_str[src_str_kind[s]] = d->begin[s];
    bk->emitted_mappings = d->begin[SRC_MAPPINGS];
    bk->emitted_frames = d->begin[SRC_FRAMES];
    bk->emitted_callstacks = d->begin[SRC_CALLSTACKS];
    bk->emitted_callstacks_off = d->cs_off;
    if (bk->emitted_callstacks == bk->in.emit.n) {
        bk__intern_emit_written(&bk->in, bk->emitted_callstacks, d->cs_off);
        bk->emitted_callstacks = bk->emitted_callstacks_off = d->cs_off = 0;
        d->begin[SRC_CALLSTACKS] = d->limit[SRC_CALLSTACKS] = 0;
    }
}

/* Writes the packet encoded in @e (from @start on, after its header) with its Trace
 * framing, the callstacks it holds in place included, and counts it. */
static int write_packet(bk_t *bk, struct dump_run *d, const struct enc *e, size_t start)
{
    if (e->len + e->ext_len - start > MAX_LEN4)
        return -E2BIG; /* cannot happen: items are bounded and so is the budget */
    struct iovec iov[4] = {{0},
                           {e->p, e->ext ? e->ext_at : e->len},
                           {(void *)e->ext, e->ext_len},
                           {e->p + e->ext_at, e->ext ? e->len - e->ext_at : 0}};
    int r = bk__write_framed(bk, iov, 4, e->len + e->ext_len);
    if (r == -ENOBUFS)
        bk->next_packet_index++; /* the gap tells readers a packet is missing */
    if (r < 0)
        return r;
    bk->next_packet_index++;
    mark_emitted(bk, d);
    return 0;
}

/* Encodes and writes one heap's dump: packets filled with, in order, the new strings,
 * mappings, frames and callstacks, then the heap's samples, each packet closed when the
 * next item would pass the size bound (an item bigger than a whole packet goes alone).
 * Everything a packet refers to is defined in it or before it; flags and stats go in
 * the last packet only, so readers that add them up per packet count each once. */
int bk__dump_heap(bk_t *bk, struct bk_proc *p, struct bk_heap *heap)
{
    if (bk->has_sink) {
        int r = sink_restart(bk);
        if (r < 0)
            return r;
    }
    struct dump_run d;
    dump_begin(bk, &d, p, heap);
    for (;;) {
        struct enc e = {.p = bk->buf.p};
        if (!put_header(bk, &e, &d))
            return -ENOMEM;
        const size_t start = e.len;
        size_t used = 0;
        bool any = false, last = false;
        int r = put_interned(bk, &e, &d, &used, &any);
        if (r == 0)
            r = put_profile(bk, &e, &d, &used, &any, &last);
        if (r == 0)
            r = write_packet(bk, &d, &e, start);
        if (r < 0)
            return r;
        if (last)
            return 0;
    }
}

int bk__dump_proc(bk_t *bk, struct bk_proc *p, bool final)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    for (size_t i = 0; i < p->n_heaps; i++) {
        /* A heap the session does not record, kept only because it is heaps[0]. */
        if (bk->no_malloc_heap && p->heaps[i]->heap_id == 0 && p->heaps[i]->n_sites == 0 &&
            p->n_heaps > 1)
            continue;
        int r = bk__dump_heap(bk, p, p->heaps[i]);
        if (r < 0)
            return r;
    }
    bk->counters.dumps++;
    return bk__write_source_lines(bk, p, final);
}
