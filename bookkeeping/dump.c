/* bookkeeping/dump.c: turns bookkeeping state into TracePackets, encoded with nanopb and
 * written one at a time.
 *
 * A dump of one process is a run of TracePackets, each of them
 *
 *     TracePacket { timestamp (BOOTTIME), trusted_packet_sequence_id,
 *                   sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE,
 *                   interned_data { function_names, mapping_paths, build_ids,
 *                                   mappings, frames, callstacks }     (new entries only)
 *                   profile_packet { index, continued,
 *                                    process_dumps { pid, heap_name, ..., samples } } }
 *
 * filled from seven sources in this order: the three string tables, mappings, frames,
 * callstacks, then the process's samples. Every packet is planned before it is encoded:
 * items are taken in order while their exact encoded sizes fit the packet budget, so a
 * packet is complete when written and everything it refers to was defined in it or
 * before it. Flags and stats go in the last packet of the dump only, so readers that
 * add them up per packet count each once.
 *
 * nanopb encodes a submessage twice (once to size it, once to write it), so the
 * callbacks below must produce the same bytes on every call: they only read state.
 */
#include "bookkeeping/pbwire.h"
#include "bookkeeping/state.h"
#include "common/clock.h"
#include "protos/trace_packet.pb.h"

#include <errno.h>
#include <pb_encode.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SEQ_INCREMENTAL_STATE_CLEARED 1u
#define SEQ_NEEDS_INCREMENTAL_STATE 2u
/* Room for the Trace framing in front of the encoded packet. */
#define FRAME_HEADROOM (1 + BK_PB_VARINT_MAX)
/* Bytes the nested length prefixes may grow by beyond the planned sizes. */
#define PLAN_SLACK 24

typedef perfetto_protos_ProfilePacket_HeapSample heap_sample_t;
typedef perfetto_protos_ProfilePacket_ProcessHeapSamples process_heap_samples_t;

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

/* Field numbers, for the planned size of each item's tag. */
static const uint32_t src_field[] = {
    [SRC_FUNCTION_NAMES] = 5, [SRC_MAPPING_PATHS] = 17, [SRC_BUILD_IDS] = 16, [SRC_MAPPINGS] = 19,
    [SRC_FRAMES] = 6,         [SRC_CALLSTACKS] = 7,     [SRC_SAMPLES] = 2,
};

struct dump_ctx;

struct src_arg {
    struct dump_ctx *d;
    enum src src;
};

struct dump_ctx {
    bk_t *bk;
    struct bk_proc *p; /* NULL outside dumps */
    struct bk_heap *h; /* the heap being dumped */
    size_t begin[SRC_COUNT], end[SRC_COUNT], limit[SRC_COUNT];
    struct src_arg args[SRC_COUNT];
    bool last; /* this packet ends the dump: flags and stats go in it */
    uint64_t ts_coarse_ns;
};

union item {
    perfetto_protos_InternedString str;
    perfetto_protos_Mapping mapping;
    perfetto_protos_Frame frame;
    perfetto_protos_Callstack callstack;
    heap_sample_t sample;
};

/* What the nested callbacks of one item read; lives as long as the item. */
struct item_aux {
    const bk_t *bk;
    struct bk_str str;
    const struct bk_mapping *mapping;
    uint32_t callstack;
};

/* ---- nested callbacks ---- */

static bool encode_str_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct item_aux *aux = *arg;
    return pb_encode_tag_for_field(s, field) &&
           pb_encode_string(s, (const pb_byte_t *)aux->str.s, aux->str.len);
}

/* Repeated integers are written unpacked, as proto2 (and Perfetto's readers) expect. */
static bool encode_path_ids_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct item_aux *aux = *arg;
    for (uint32_t i = 0; i < aux->mapping->n_comps; i++) {
        if (!pb_encode_tag_for_field(s, field) || !pb_encode_varint(s, aux->mapping->comps[i]))
            return false;
    }
    return true;
}

static bool encode_frame_ids_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct item_aux *aux = *arg;
    uint32_t ids[BK_MAX_FRAMES];
    size_t n = bk__intern_callstack_frames(&aux->bk->in, aux->callstack, ids);
    for (size_t i = 0; i < n; i++) {
        if (!pb_encode_tag_for_field(s, field) || !pb_encode_varint(s, ids[i]))
            return false;
    }
    return true;
}

/* ---- items ---- */

static const pb_msgdesc_t *build_item(const struct dump_ctx *d, enum src src, size_t i,
                                      union item *it, struct item_aux *aux)
{
    const bk_t *bk = d->bk;
    const struct bk_intern *in = &bk->in;
    memset(it, 0, sizeof(*it));
    *aux = (struct item_aux){.bk = bk};
    switch (src) {
    case SRC_FUNCTION_NAMES:
    case SRC_MAPPING_PATHS:
    case SRC_BUILD_IDS:
        aux->str = in->str[src_str_kind[src]].v[i];
        it->str.has_iid = true;
        it->str.iid = i;
        it->str.str.funcs.encode = encode_str_cb;
        it->str.str.arg = aux;
        return perfetto_protos_InternedString_fields;
    case SRC_MAPPINGS: {
        const struct bk_mapping *m = &in->mappings[i];
        aux->mapping = m;
        it->mapping = (perfetto_protos_Mapping){
            .has_iid = true,
            .iid = i,
            .has_build_id = true,
            .build_id = m->build_id,
            .has_start_offset = true,
            .start_offset = m->start_offset,
            .has_start = true,
            .start = m->start,
            .has_end = true,
            .end = m->end,
            .has_load_bias = true,
            .load_bias = m->load_bias,
            .has_exact_offset = true,
            .exact_offset = m->exact_offset,
        };
        it->mapping.path_string_ids.funcs.encode = encode_path_ids_cb;
        it->mapping.path_string_ids.arg = aux;
        return perfetto_protos_Mapping_fields;
    }
    case SRC_FRAMES: {
        const struct bk_frame *f = &in->frames[i];
        it->frame = (perfetto_protos_Frame){
            .has_iid = true,
            .iid = i,
            .has_function_name_id = true,
            .function_name_id = f->function_name_id,
            .has_mapping_id = true,
            .mapping_id = f->mapping_id,
            .has_rel_pc = true,
            .rel_pc = f->rel_pc,
        };
        return perfetto_protos_Frame_fields;
    }
    case SRC_CALLSTACKS:
        aux->callstack = in->emit[i];
        it->callstack.has_iid = true;
        it->callstack.iid = in->emit[i];
        it->callstack.frame_ids.funcs.encode = encode_frame_ids_cb;
        it->callstack.frame_ids.arg = aux;
        return perfetto_protos_Callstack_fields;
    case SRC_SAMPLES: {
        const struct bk_site *s = &d->h->sites[i];
        it->sample = (heap_sample_t){
            .has_callstack_id = true,
            .callstack_id = s->callstack_id,
            .has_self_allocated = true,
            .self_allocated = s->allocated,
            .has_self_freed = true,
            .self_freed = s->freed,
            .has_alloc_count = true,
            .alloc_count = s->alloc_count,
            .has_free_count = true,
            .free_count = s->free_count,
        };
        if (bk->dump_at_max) {
            it->sample.has_self_max = it->sample.has_self_max_count = true;
            bk__site_at_peak(d->h, s, &it->sample.self_max, &it->sample.self_max_count);
        }
        return perfetto_protos_ProfilePacket_HeapSample_fields;
    }
    case SRC_COUNT:
        break;
    }
    return NULL;
}

static size_t item_size(const struct dump_ctx *d, enum src src, size_t i)
{
    union item it;
    struct item_aux aux;
    const pb_msgdesc_t *desc = build_item(d, src, i, &it, &aux);
    size_t body = 0;
    if (!pb_get_encoded_size(&body, desc, &it))
        return SIZE_MAX / 4; /* cannot happen: sizing streams do not fail */
    return bk__pb_varint_size((uint64_t)src_field[src] << 3) + bk__pb_varint_size(body) + body;
}

/* Encodes the items [begin, end) of one source as repeated submessages of @field. */
static bool encode_src_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct src_arg *a = *arg;
    const struct dump_ctx *d = a->d;
    for (size_t i = d->begin[a->src]; i < d->end[a->src]; i++) {
        union item it;
        struct item_aux aux;
        const pb_msgdesc_t *desc = build_item(d, a->src, i, &it, &aux);
        if (!pb_encode_tag_for_field(s, field) || !pb_encode_submessage(s, desc, &it))
            return false;
    }
    return true;
}

static void set_src(struct dump_ctx *d, pb_callback_t *cb, enum src src)
{
    d->args[src] = (struct src_arg){.d = d, .src = src};
    if (d->end[src] > d->begin[src]) {
        cb->funcs.encode = encode_src_cb;
        cb->arg = &d->args[src];
    }
}

/* Fills @pkt's interned_data from the current ranges of @d; false when it is empty. */
static bool set_interned(struct dump_ctx *d, perfetto_protos_TracePacket *pkt)
{
    perfetto_protos_InternedData *id = &pkt->interned_data;
    set_src(d, &id->function_names, SRC_FUNCTION_NAMES);
    set_src(d, &id->mapping_paths, SRC_MAPPING_PATHS);
    set_src(d, &id->build_ids, SRC_BUILD_IDS);
    set_src(d, &id->mappings, SRC_MAPPINGS);
    set_src(d, &id->frames, SRC_FRAMES);
    set_src(d, &id->callstacks, SRC_CALLSTACKS);
    bool any = false;
    for (int s = 0; s < SRC_SAMPLES; s++)
        any |= d->end[s] > d->begin[s];
    pkt->has_interned_data = any;
    return any;
}

/* ---- process dumps ---- */

static void fill_stats(const struct bk_proc *p, perfetto_protos_ProfilePacket_ProcessStats *st)
{
    static const uint64_t bounds[] = BK_UNWIND_HIST_BOUNDS;
    _Static_assert(HP_ARRAY_SIZE(bounds) == HP_ARRAY_SIZE(p->stats.unwinding_time_hist),
                   "one bound per histogram bucket");
    _Static_assert(HP_ARRAY_SIZE(bounds) <= HP_ARRAY_SIZE(st->unwinding_time_us.buckets),
                   "protos/profile_packet.options holds every bucket");
    const struct bk_process_stats *s = &p->stats;
    *st = (perfetto_protos_ProfilePacket_ProcessStats){
        .has_unwinding_errors = true,
        .unwinding_errors = s->unwinding_errors,
        .has_heap_samples = true,
        .heap_samples = s->heap_samples,
        .has_map_reparses = true,
        .map_reparses = s->map_reparses,
        .has_unwinding_time_us = true,
        .has_total_unwinding_time_us = true,
        .total_unwinding_time_us = s->total_unwinding_time_us,
        .has_client_spinlock_blocked_us = true,
        .client_spinlock_blocked_us = s->client_spinlock_blocked_us,
    };
    size_t n = HP_ARRAY_SIZE(bounds);
    st->unwinding_time_us.buckets_count = (pb_size_t)n;
    for (size_t i = 0; i < n; i++) {
        perfetto_protos_ProfilePacket_Histogram_Bucket *b = &st->unwinding_time_us.buckets[i];
        if (bounds[i] == UINT64_MAX) {
            b->has_max_bucket = true;
            b->max_bucket = true;
        } else {
            b->has_upper_limit = true;
            b->upper_limit = bounds[i];
        }
        b->has_count = true;
        b->count = s->unwinding_time_hist[i];
    }
}

static bool encode_process_dump_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    struct dump_ctx *d = *arg;
    const struct bk_proc *p = d->p;
    process_heap_samples_t h = {
        .has_pid = true,
        .pid = (uint64_t)(uint32_t)p->pid,
        .has_from_startup = true,
        .from_startup = p->from_startup,
        .has_timestamp = true,
        .timestamp = d->ts_coarse_ns,
        .has_heap_name = true,
        .has_sampling_interval_bytes = true,
        .sampling_interval_bytes = p->sampling_interval_bytes,
        /* Equal to the interval: it was not adjusted. Perfetto's trace processor also
         * reads this as "self_max_count is trustworthy". */
        .has_orig_sampling_interval_bytes = true,
        .orig_sampling_interval_bytes = p->sampling_interval_bytes,
    };
    bk__heap_name(d->h->heap_id, h.heap_name, sizeof(h.heap_name));
    if (d->last) {
        bool overran = (p->flags & BK_FLAG_BUFFER_OVERRAN) || p->stats.records_dropped;
        h.has_disconnected = h.has_buffer_overran = h.has_buffer_corrupted = true;
        h.has_hit_guardrail = true;
        h.disconnected = p->flags & BK_FLAG_DISCONNECTED;
        h.buffer_overran = overran;
        h.buffer_corrupted = p->flags & BK_FLAG_BUFFER_CORRUPTED;
        h.hit_guardrail = p->flags & BK_FLAG_HIT_GUARDRAIL;
        if (p->flags & BK_FLAG_CLIENT_ERROR) {
            /* As heapprofd: a client error with dropped records is a timeout of a
             * blocking client; any other one is a bad stack. */
            h.has_client_error = true;
            h.client_error =
                overran
                    ? perfetto_protos_ProfilePacket_ProcessHeapSamples_ClientError_CLIENT_ERROR_HIT_TIMEOUT
                    : perfetto_protos_ProfilePacket_ProcessHeapSamples_ClientError_CLIENT_ERROR_INVALID_STACK_BOUNDS;
        }
        h.has_stats = true;
        fill_stats(p, &h.stats);
    }
    set_src(d, &h.samples, SRC_SAMPLES);
    return pb_encode_tag_for_field(s, field) &&
           pb_encode_submessage(s, perfetto_protos_ProfilePacket_ProcessHeapSamples_fields, &h);
}

/* ---- output ---- */

static bool buf_write_cb(pb_ostream_t *s, const pb_byte_t *b, size_t n)
{
    struct bk_buf *buf = s->state;
    if (bk__grow((void **)&buf->p, &buf->cap, buf->len + n, 1) < 0)
        return false;
    memcpy(buf->p + buf->len, b, n);
    buf->len += n;
    return true;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Encodes @pkt and appends it to the output as one Trace.packet field. After a failed
 * write nothing more is written, so the file stays a valid trace up to a possibly
 * truncated last packet (which readers skip). */
static int write_packet(bk_t *bk, const perfetto_protos_TracePacket *pkt)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    struct bk_buf *buf = &bk->buf;
    if (bk__grow((void **)&buf->p, &buf->cap, FRAME_HEADROOM, 1) < 0)
        return -ENOMEM;
    buf->len = FRAME_HEADROOM;
    pb_ostream_t os = {.callback = buf_write_cb, .state = buf, .max_size = SIZE_MAX};
    if (!pb_encode(&os, perfetto_protos_TracePacket_fields, pkt))
        return -ENOMEM; /* the only way a growable buffer fails */
    size_t len = buf->len - FRAME_HEADROOM;
    uint8_t hdr[FRAME_HEADROOM];
    size_t hlen = bk__pb_put_packet_header(hdr, len);
    uint8_t *start = buf->p + FRAME_HEADROOM - hlen;
    memcpy(start, hdr, hlen);
    int r = write_all(bk->out_fd, start, hlen + len);
    if (r < 0) {
        bk->counters.last_write_error = r;
        bk->out_broken = true;
        return r;
    }
    bk->counters.packets_written++;
    bk->counters.bytes_written += hlen + len;
    return 0;
}

static perfetto_protos_TracePacket packet_new(const bk_t *bk, uint64_t ts_boot_ns)
{
    perfetto_protos_TracePacket pkt = perfetto_protos_TracePacket_init_zero;
    pkt.has_timestamp = true;
    pkt.timestamp = ts_boot_ns;
    pkt.has_trusted_packet_sequence_id = true;
    pkt.trusted_packet_sequence_id = bk->sequence_id;
    return pkt;
}

static void fill_clock_snapshot(perfetto_protos_TracePacket *pkt)
{
    /* Read back to back so the three readings describe one instant. */
    uint64_t boot = hp_clock_ns(CLOCK_BOOTTIME);
    uint64_t coarse = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t mono = hp_clock_ns(CLOCK_MONOTONIC);
    pkt->timestamp = boot;
    pkt->which_data = perfetto_protos_TracePacket_clock_snapshot_tag;
    perfetto_protos_ClockSnapshot *cs = &pkt->data.clock_snapshot;
    *cs = (perfetto_protos_ClockSnapshot)perfetto_protos_ClockSnapshot_init_zero;
    cs->clocks_count = 3;
    cs->clocks[0] = (perfetto_protos_ClockSnapshot_Clock){
        true, perfetto_protos_BuiltinClock_BUILTIN_CLOCK_BOOTTIME, true, boot};
    cs->clocks[1] = (perfetto_protos_ClockSnapshot_Clock){
        true, perfetto_protos_BuiltinClock_BUILTIN_CLOCK_MONOTONIC_COARSE, true, coarse};
    cs->clocks[2] = (perfetto_protos_ClockSnapshot_Clock){
        true, perfetto_protos_BuiltinClock_BUILTIN_CLOCK_MONOTONIC, true, mono};
    cs->has_primary_trace_clock = true;
    cs->primary_trace_clock = perfetto_protos_BuiltinClock_BUILTIN_CLOCK_BOOTTIME;
}

int bk__write_start(bk_t *bk)
{
    perfetto_protos_TracePacket pkt = packet_new(bk, 0);
    fill_clock_snapshot(&pkt);
    pkt.has_sequence_flags = true;
    pkt.sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED;
    /* iid 0 = "" in each string table, as Perfetto's readers expect for "no name",
     * "no path" and "no build id". */
    struct dump_ctx d = {.bk = bk};
    for (int s = SRC_FUNCTION_NAMES; s <= SRC_BUILD_IDS; s++)
        d.end[s] = 1;
    set_interned(&d, &pkt);
    int r = write_packet(bk, &pkt);
    if (r < 0)
        return r;
    for (int k = 0; k < BK_STR_KINDS; k++)
        bk->emitted_str[k] = 1;
    return 0;
}

int bk__write_clock_snapshot(bk_t *bk)
{
    perfetto_protos_TracePacket pkt = packet_new(bk, 0);
    fill_clock_snapshot(&pkt);
    return write_packet(bk, &pkt);
}

static bool encode_cmdline_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct bk_proc *p = *arg;
    size_t i = 0;
    while (i < p->cmdline_len) {
        size_t n = strnlen(p->cmdline + i, p->cmdline_len - i);
        if (!pb_encode_tag_for_field(s, field) ||
            !pb_encode_string(s, (const pb_byte_t *)p->cmdline + i, n))
            return false;
        i += n + 1; /* a final NUL ends the last argument; it does not start another */
    }
    return true;
}

static bool encode_process_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    const struct bk_proc *p = *arg;
    perfetto_protos_ProcessTree_Process proc = perfetto_protos_ProcessTree_Process_init_zero;
    proc.has_pid = true;
    proc.pid = p->pid;
    proc.cmdline.funcs.encode = encode_cmdline_cb;
    proc.cmdline.arg = (void *)p;
    return pb_encode_tag_for_field(s, field) &&
           pb_encode_submessage(s, perfetto_protos_ProcessTree_Process_fields, &proc);
}

int bk__write_process_tree(bk_t *bk, const struct bk_proc *p)
{
    perfetto_protos_TracePacket pkt = packet_new(bk, hp_clock_ns(CLOCK_BOOTTIME));
    pkt.which_data = perfetto_protos_TracePacket_process_tree_tag;
    pkt.data.process_tree.processes.funcs.encode = encode_process_cb;
    pkt.data.process_tree.processes.arg = (void *)p;
    return write_packet(bk, &pkt);
}

/* The profile packet for the current ranges of @d. */
static perfetto_protos_TracePacket dump_packet(struct dump_ctx *d, uint64_t ts_boot_ns)
{
    perfetto_protos_TracePacket pkt = packet_new(d->bk, ts_boot_ns);
    pkt.has_sequence_flags = true;
    pkt.sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE;
    set_interned(d, &pkt);
    pkt.which_data = perfetto_protos_TracePacket_profile_packet_tag;
    perfetto_protos_ProfilePacket *pp = &pkt.data.profile_packet;
    pp->has_index = true;
    pp->index = d->bk->next_packet_index;
    pp->has_continued = true;
    pp->continued = !d->last;
    pp->process_dumps.funcs.encode = encode_process_dump_cb;
    pp->process_dumps.arg = d;
    return pkt;
}

/* Chooses the next packet's ranges: items in source order while they fit. */
static void plan_packet(struct dump_ctx *d, size_t budget)
{
    size_t used = 0;
    bool any = false;
    for (int s = 0; s < SRC_COUNT; s++)
        d->end[s] = d->begin[s];
    for (int s = 0; s < SRC_COUNT; s++) {
        while (d->end[s] < d->limit[s]) {
            size_t sz = item_size(d, (enum src)s, d->end[s]);
            /* An item bigger than a whole packet still goes, alone. */
            if (any && (sz > budget || used > budget - sz))
                goto done;
            used += sz;
            any = true;
            d->end[s]++;
        }
    }
done:
    d->last = true;
    for (int s = 0; s < SRC_COUNT; s++)
        d->last &= d->end[s] == d->limit[s];
}

static int dump_heap(bk_t *bk, struct bk_proc *p, struct bk_heap *heap)
{
    const struct bk_intern *in = &bk->in;
    struct dump_ctx d = {.bk = bk, .p = p, .h = heap};
    for (int s = SRC_FUNCTION_NAMES; s <= SRC_BUILD_IDS; s++) {
        d.begin[s] = bk->emitted_str[src_str_kind[s]];
        d.limit[s] = in->str[src_str_kind[s]].n;
    }
    d.begin[SRC_MAPPINGS] = HP_MAX(bk->emitted_mappings, (size_t)1);
    d.limit[SRC_MAPPINGS] = in->n_mappings;
    d.begin[SRC_FRAMES] = HP_MAX(bk->emitted_frames, (size_t)1);
    d.limit[SRC_FRAMES] = in->n_frames;
    d.begin[SRC_CALLSTACKS] = bk->emitted_callstacks;
    d.limit[SRC_CALLSTACKS] = in->n_emit;
    d.begin[SRC_SAMPLES] = 0;
    d.limit[SRC_SAMPLES] = heap->n_sites;

    uint64_t ts_boot = hp_clock_ns(CLOCK_BOOTTIME);
    d.ts_coarse_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE);

    /* The fixed part of every packet: headers, stats and flags, no items. */
    memcpy(d.end, d.begin, sizeof(d.end));
    d.last = true;
    perfetto_protos_TracePacket empty = dump_packet(&d, ts_boot);
    empty.has_interned_data = true;
    size_t base = 0;
    if (!pb_get_encoded_size(&base, perfetto_protos_TracePacket_fields, &empty))
        return -EINVAL;
    base += FRAME_HEADROOM + PLAN_SLACK;
    size_t budget = bk->max_packet_bytes > base ? bk->max_packet_bytes - base : 0;

    for (;;) {
        plan_packet(&d, budget);
        perfetto_protos_TracePacket pkt = dump_packet(&d, ts_boot);
        int r = write_packet(bk, &pkt);
        if (r < 0)
            return r;
        bk->next_packet_index++;
        for (int s = SRC_FUNCTION_NAMES; s <= SRC_BUILD_IDS; s++)
            bk->emitted_str[src_str_kind[s]] = d.end[s];
        bk->emitted_mappings = d.end[SRC_MAPPINGS];
        bk->emitted_frames = d.end[SRC_FRAMES];
        bk->emitted_callstacks = d.end[SRC_CALLSTACKS];
        if (d.last)
            break;
        memcpy(d.begin, d.end, sizeof(d.begin));
    }
    return 0;
}

/* ---- source lines: ModuleSymbols packets ---- */

#define TRACE_PACKET_MODULE_SYMBOLS 61

/* Appends @body (a complete TracePacket) to the output as one Trace.packet. */
static int write_raw_packet(bk_t *bk, const uint8_t *body, size_t len)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    uint8_t hdr[FRAME_HEADROOM];
    size_t hlen = bk__pb_put_packet_header(hdr, len);
    int r = write_all(bk->out_fd, hdr, hlen);
    if (r == 0)
        r = write_all(bk->out_fd, body, len);
    if (r < 0) {
        bk->counters.last_write_error = r;
        bk->out_broken = true;
        return r;
    }
    bk->counters.packets_written++;
    bk->counters.bytes_written += hlen + len;
    return 0;
}

/* The address_symbols of one mapping, as they are collected. */
struct module_syms {
    uint32_t mapping_id;
    struct bk_pbw syms;
};

static int flush_module(bk_t *bk, struct module_syms *ms)
{
    const struct bk_intern *in = &bk->in;
    const struct bk_mapping *m = &in->mappings[ms->mapping_id];
    const struct bk_str *bid = &in->str[BK_STR_BUILD_ID].v[m->build_id];
    struct bk_pbw mod = {0}, pkt = {0};
    bk__pbw_len(&mod, 1, m->path, m->path_len);
    /* Raw build id bytes, as Perfetto's ModuleSymbols.build_id wants them. */
    if (bid->len)
        bk__pbw_len(&mod, 2, bid->s, bid->len);
    bk__pbw_bytes(&mod, ms->syms.p, ms->syms.len);
    mod.oom |= ms->syms.oom;
    ms->syms.len = 0;
    bk__pbw_uint_always(&pkt, 8, hp_clock_ns(CLOCK_BOOTTIME));
    bk__pbw_uint_always(&pkt, 10, bk->sequence_id);
    bk__pbw_msg(&pkt, TRACE_PACKET_MODULE_SYMBOLS, &mod);
    int r = pkt.oom ? -ENOMEM : write_raw_packet(bk, pkt.p, pkt.len);
    free(mod.p);
    free(pkt.p);
    return r;
}

/* Offers the frames written since the last call to the source_line callback and writes
 * what it knows as ModuleSymbols packets, one or more per mapping, each below the packet
 * size bound. */
static int write_source_lines(bk_t *bk)
{
    struct bk_intern *in = &bk->in;
    size_t end = bk->emitted_frames;
    if (!bk->source_line || bk->symbolized_frames >= end) {
        bk->symbolized_frames = HP_MAX(bk->symbolized_frames, end);
        return 0;
    }
    struct module_syms *mods = NULL;
    size_t n_mods = 0, cap_mods = 0;
    struct bk_map index; /* mapping id -> index in mods */
    bk__map_init(&index, sizeof(uint64_t));
    struct bk_pbw sym = {0}, line = {0};
    int r = 0;
    for (size_t i = bk->symbolized_frames; i < end && r == 0; i++) {
        const struct bk_frame *f = &in->frames[i];
        const char *file = NULL;
        uint32_t lineno = 0;
        if (!f->src_map ||
            bk->source_line(bk->source_line_ctx, f->src_map, f->rel_pc, &file, &lineno) < 0 ||
            !file)
            continue;
        const struct bk_str *name = &in->str[BK_STR_FUNCTION].v[f->function_name_id];
        if (name->len)
            bk__pbw_len(&line, 1, name->s, name->len);
        bk__pbw_len(&line, 2, file, strnlen(file, BK_MAX_STRING_BYTES));
        bk__pbw_uint_always(&line, 3, lineno);
        bk__pbw_uint_always(&sym, 1, f->rel_pc);
        bk__pbw_msg(&sym, 2, &line);

        uint64_t *slot;
        int put = bk__map_put(&index, f->mapping_id, (void **)&slot);
        if (put < 0) {
            r = put;
            break;
        }
        if (put == 1) {
            r = bk__grow((void **)&mods, &cap_mods, n_mods + 1, sizeof(*mods));
            if (r < 0)
                break;
            mods[n_mods] = (struct module_syms){.mapping_id = f->mapping_id};
            *slot = n_mods++;
        }
        struct module_syms *ms = &mods[*slot];
        bk__pbw_msg(&ms->syms, 3, &sym);
        bk->counters.source_lines++;
        if (ms->syms.len + 2 * BK_MAX_STRING_BYTES > bk->max_packet_bytes)
            r = flush_module(bk, ms);
    }
    for (size_t i = 0; i < n_mods; i++) {
        if (r == 0 && (mods[i].syms.len || mods[i].syms.oom))
            r = flush_module(bk, &mods[i]);
        free(mods[i].syms.p);
    }
    free(mods);
    free(sym.p);
    free(line.p);
    bk__map_done(&index);
    bk->symbolized_frames = end;
    return r;
}

int bk__dump_proc(bk_t *bk, struct bk_proc *p)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    for (size_t i = 0; i < p->n_heaps; i++) {
        int r = dump_heap(bk, p, p->heaps[i]);
        if (r < 0)
            return r;
    }
    bk->counters.dumps++;
    return write_source_lines(bk);
}
