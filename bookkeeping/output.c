/* bookkeeping/output.c: the trace as bytes: each TracePacket framed as a Trace.packet
 * and written whole (writev, short writes and EINTR handled), and the small packets that
 * nanopb encodes (the first packet, clock snapshots, the process tree). */
#include "bookkeeping/state.h"

#include <errno.h>
#include <pb_encode.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/pbwire.h"
#include "protos/fields.h"
#include "protos/trace_packet.pb.h"

/* ---- output ---- */

static bool buf_write_cb(pb_ostream_t *s, const pb_byte_t *b, size_t n)
{
    struct bk_buf *buf = s->state;
    if (hp_grow((void **)&buf->p, &buf->cap, buf->len + n, 1) < 0)
        return false;
    memcpy(buf->p + buf->len, b, n);
    buf->len += n;
    return true;
}

/* Writes all bytes of @iov[0..@n) (pipes and sockets may take part of them per call);
 * @iov is consumed. */
static int writev_all(int fd, struct iovec *iov, int n)
{
    for (;;) {
        while (n > 0 && iov->iov_len == 0) {
            iov++;
            n--;
        }
        if (n == 0)
            return 0;
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        for (size_t left = (size_t)w; left;) {
            size_t k = HP_MIN(left, iov->iov_len);
            iov->iov_base = (uint8_t *)iov->iov_base + k;
            iov->iov_len -= k;
            left -= k;
            if (iov->iov_len == 0) {
                iov++;
                n--;
            }
        }
    }
}

/* A sink's next packet must be preceded by the one that restarts the interned data:
 * written first, before the next packet is encoded (both use bk->buf). */
static int sequence_ready(bk_t *bk)
{
    return bk->has_sink && bk->needs_reset && !bk->in_reset ? bk__write_start(bk) : 0;
}

/* Hands one packet to the sink. A dropped packet is counted and makes the next one
 * restart the interned data. */
static int write_sink(bk_t *bk, const struct iovec *iov, int n, size_t len)
{
    int r = bk->sink.write_packet(bk->sink.ctx, iov, n, len);
    if (r == -ENOBUFS) {
        bk->counters.packets_dropped++;
        bk->needs_reset = true;
        bk->index_gap = true;
        return r;
    }
    if (r < 0) {
        bk->counters.last_write_error = r;
        bk->out_broken = true;
        return r;
    }
    bk->counters.packets_written++;
    bk->counters.bytes_written += len;
    return 0;
}

/* Appends one Trace.packet: the frame header for @len bytes of packet, then the packet,
 * in the pieces @iov[1..@n) (iov[0] is the header's). After a failed write nothing more
 * is written, so the file stays a valid trace up to a possibly truncated last packet
 * (which readers skip). */
int bk__write_framed(bk_t *bk, struct iovec *iov, int n, size_t len)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    if (bk->has_sink)
        return write_sink(bk, iov + 1, n - 1, len);
    uint8_t hdr[BK_FRAME_HEADROOM];
    size_t hlen = hp_pb_put_packet_header(hdr, len);
    iov[0] = (struct iovec){hdr, hlen};
    int r = writev_all(bk->out_fd, iov, n);
    if (r < 0) {
        bk->counters.last_write_error = r;
        bk->out_broken = true;
        return r;
    }
    bk->counters.packets_written++;
    bk->counters.bytes_written += hlen + len;
    return 0;
}

/* Encodes @pkt and appends it to the output as one Trace.packet field. */
static int write_packet(bk_t *bk, const perfetto_protos_TracePacket *pkt)
{
    if (bk->out_broken)
        return bk->counters.last_write_error;
    int r = sequence_ready(bk);
    if (r < 0)
        return r;
    struct bk_buf *buf = &bk->buf;
    buf->len = 0;
    pb_ostream_t os = {.callback = buf_write_cb, .state = buf, .max_size = SIZE_MAX};
    if (!pb_encode(&os, perfetto_protos_TracePacket_fields, pkt))
        return -ENOMEM; /* the only way a growable buffer fails */
    struct iovec iov[2] = {{0}, {buf->p, buf->len}};
    return bk__write_framed(bk, iov, 2, buf->len);
}

static perfetto_protos_TracePacket packet_new(const bk_t *bk, uint64_t ts_boot_ns)
{
    perfetto_protos_TracePacket pkt = perfetto_protos_TracePacket_init_zero;
    pkt.has_timestamp = true;
    pkt.timestamp = ts_boot_ns;
    /* traced numbers a sink's sequence itself and rejects packets that do. */
    pkt.has_trusted_packet_sequence_id = !bk->has_sink;
    pkt.trusted_packet_sequence_id = bk->has_sink ? 0 : bk->sequence_id;
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

/* One InternedString {iid: 0, str: ""}. */
static bool encode_empty_string_cb(pb_ostream_t *s, const pb_field_iter_t *field, void *const *arg)
{
    (void)arg;
    static const uint8_t empty[] = {PF_STRING(iid) << 3 | HP_PB_VARINT, 0,
                                    PF_STRING(str) << 3 | HP_PB_LEN, 0};
    return pb_encode_tag_for_field(s, field) && pb_encode_string(s, empty, sizeof(empty));
}

int bk__write_start(bk_t *bk)
{
    perfetto_protos_TracePacket pkt = packet_new(bk, 0);
    if (bk->has_sink) {
        /* traced's clock snapshots cover BOOTTIME and MONOTONIC_COARSE. */
        pkt.timestamp = hp_clock_ns(CLOCK_BOOTTIME);
        pkt.has_first_packet_on_sequence = !bk->sequence_started;
        pkt.first_packet_on_sequence = !bk->sequence_started;
        int r = bk__intern_emit_all(&bk->in);
        if (r < 0)
            return r;
        bk->emitted_mappings = bk->emitted_frames = 0;
        bk->emitted_callstacks = bk->emitted_callstacks_off = 0;
        if (!bk->index_gap)
            bk->next_packet_index = 0;
        bk->index_gap = false;
        for (int k = 0; k < BK_STR_KINDS; k++)
            bk->emitted_str[k] = 0;
    } else {
        fill_clock_snapshot(&pkt);
    }
    pkt.has_sequence_flags = true;
    pkt.sequence_flags = PF_SEQ_INCREMENTAL_STATE_CLEARED;
    /* iid 0 = "" in each string table, as Perfetto's readers expect for "no name",
     * "no path" and "no build id". */
    pkt.has_interned_data = true;
    pkt.interned_data.function_names.funcs.encode = encode_empty_string_cb;
    pkt.interned_data.mapping_paths.funcs.encode = encode_empty_string_cb;
    pkt.interned_data.build_ids.funcs.encode = encode_empty_string_cb;
    bk->in_reset = true;
    int r = write_packet(bk, &pkt);
    bk->in_reset = false;
    if (r < 0)
        return r;
    for (int k = 0; k < BK_STR_KINDS; k++)
        bk->emitted_str[k] = 1;
    if (bk->has_sink) {
        bk->counters.sequence_resets += bk->sequence_started;
        bk->sequence_started = true;
        bk->needs_reset = false;
    }
    return 0;
}

int bk__write_clock_snapshot(bk_t *bk)
{
    if (bk->has_sink)
        return 0;
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

/* Appends @body (a complete TracePacket) to the output as one Trace.packet. */
int bk__write_raw_packet(bk_t *bk, const uint8_t *body, size_t len)
{
    int r = sequence_ready(bk);
    if (r < 0)
        return r;
    struct iovec iov[2] = {{0}, {(void *)body, len}};
    return bk__write_framed(bk, iov, 2, len);
}

int bk_process_rejected(bk_t *bk, int32_t pid, uint32_t flags)
{
    struct hp_pbw hs = {0}, pp = {0}, pkt = {0};
    hp_pbw_uint_always(&hs, PF_DUMP(pid), (uint64_t)(uint32_t)pid);
    if (flags & BK_FLAG_HIT_GUARDRAIL)
        hp_pbw_uint_always(&hs, PF_DUMP(hit_guardrail), 1);
    else
        hp_pbw_uint_always(&hs, PF_DUMP(rejected_concurrent), 1);
    hp_pbw_uint_always(&hs, PF_DUMP(timestamp), hp_clock_ns(CLOCK_MONOTONIC_COARSE));
    hp_pbw_msg(&pp, PF_PROFILE(process_dumps), &hs);
    hp_pbw_uint_always(&pp, PF_PROFILE(continued), 0);
    hp_pbw_uint_always(&pp, PF_PROFILE(index), bk->next_packet_index);
    hp_pbw_uint_always(&pkt, PF_PACKET(timestamp), hp_clock_ns(CLOCK_BOOTTIME));
    if (!bk->has_sink)
        hp_pbw_uint_always(&pkt, PF_PACKET(trusted_packet_sequence_id), bk->sequence_id);
    hp_pbw_uint_always(&pkt, PF_PACKET(sequence_flags), PF_SEQ_NEEDS_INCREMENTAL_STATE);
    hp_pbw_msg(&pkt, PF_PACKET(profile_packet), &pp);
    int r = pkt.oom || pp.oom || hs.oom ? -ENOMEM : bk__write_raw_packet(bk, pkt.p, pkt.len);
    if (r == 0)
        bk->next_packet_index++;
    free(hs.p);
    free(pp.p);
    free(pkt.p);
    return r;
}
