/* service/unwind_thread.c: an unwinder thread. It owns the clients handed to it: their
 * sockets, rings and unwinder state. It drains each ring, unwinds every sampled stack and
 * posts compact records to the bookkeeping thread.
 *
 * It sleeps in futex_waitv(2) on its own wake word and on the futex word of every ring
 * it has drained (writers wake it there: no descriptor, see shmem_ring/ring.h). A
 * client's hang-up is seen by the main thread's epoll (svc__unwinder_hangup()), and once
 * a second by a poll of the sockets here. Without futex_waitv (Linux < 5.16), or for the
 * rings beyond the first SVC_WAITV_MAX - 1, the rings are polled every POLL_MS. */
#include "service/svc_internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>

#include "common/clock.h"
#include "common/containers.h"
#include "common/log.h"
#include "common/sys.h"
#include "shmem_ring/wire.h"

/* Records handled per client before looking at the others, so one busy process cannot
 * starve the rest. */
#define DRAIN_BUDGET 4096
/* A ring that had records is polled this often instead of asking its writers for a poke
 * per record (a system call in the app and a wakeup here); after QUIET_POLLS empty polls
 * in a row the reader sleeps until poked. Writers still poke when a quarter of the ring
 * is waiting. */
#define POLL_MS 5
#define QUIET_POLLS 8
/* A dump request drains each ring up to where it ended when the request came, at most
 * this many budgets (the end of a ring is at most its size away). */
#define DUMP_DRAIN_ROUNDS 64
/* futex_waitv(2) takes at most 128 words: ours and 127 rings. */
#define SVC_WAITV_MAX 128
/* An ending session (EOF, detach, a client given up on, a new session of its pid) has
 * its records read up to where its ring ended when the end began, for at most this long;
 * what is left then is skipped and counted. Other clients are served meanwhile: a
 * client that keeps writing into its ring holds nobody. */
#define END_BUDGET_NS (3000ull * 1000 * 1000)
/* svc_finish(): every client ends within this, so that the daemon stops within a second
 * of SIGINT whatever its clients do (the bookkeeping thread's final dumps come after). */
#define STOP_BUDGET_NS (400ull * 1000 * 1000)
/* The rereads of the maps a client asks for (WIRE_MAPS_CHANGED) may take 1/REREAD_SHARE
 * of the time, with REREAD_BURST_NS saved up: a process of 20 000 mappings (a reread of
 * milliseconds) cannot make its thread do nothing else. A sample that needs a reread the
 * budget holds back waits in the ring (its writers block or drop, counted), so no sample
 * is named with maps older than it. */
#define REREAD_SHARE 8
#define REREAD_BURST_NS (50ll * 1000 * 1000)

static const uint64_t hist_bounds[] = BK_UNWIND_HIST_BOUNDS;

static bool post_start(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc_msg_proc_start *m =
        svc__batch_add(&u->batcher, SVC_MSG_PROC_START, c->pid, sizeof(*m) + c->cmdline_len);
    if (!m)
        return false;
    m->cmdline_len = (uint32_t)c->cmdline_len;
    m->sampling_interval_bytes = c->sampling_interval_bytes;
    m->from_startup = c->from_startup;
    if (c->cmdline_len)
        memcpy(m + 1, c->cmdline, c->cmdline_len);
    c->started = true;
    return true;
}

/* A message of @type for @c, its process's start posted first if it could not be yet
 * (out of memory: every record would be refused for want of it). NULL when out of
 * memory: the caller counts what is lost. */
static void *post(struct svc_unwinder *u, struct svc_client *c, uint32_t type, size_t len)
{
    if (!c->started && !post_start(u, c))
        return NULL;
    return svc__batch_add(&u->batcher, type, c->pid, len);
}

/* The common end of both kinds of sampled allocation: statistics, then the frames in
 * u->frames (@n of them; @r < 0: none) go to the bookkeeping thread. */
static void post_sample(struct svc_unwinder *u, struct svc_client *c, int r, size_t n,
                        const struct unwinder_result *res, const struct wire_alloc_head *h)
{
    /* One clock read per sample: the time since the previous sample's end (or the start
     * of the drain) counts, which adds the decoding of the records in between. */
    uint64_t t1 = hp_clock_ns(CLOCK_MONOTONIC);
    uint64_t us = (t1 - u->clock_ns) / 1000;
    u->clock_ns = t1;
    if (r < 0)
        n = 0;
    c->stats.heap_samples++;
    c->stats.total_unwinding_time_us += us;
    for (size_t i = 0; i < HP_ARRAY_SIZE(hist_bounds); i++) {
        if (us <= hist_bounds[i]) {
            c->stats.unwinding_time_hist[i]++;
            break;
        }
    }
    if (res->error || r < 0) {
        c->stats.unwinding_errors++;
        atomic_fetch_add_explicit(&u->svc->unwind_errors, 1, memory_order_relaxed);
    } else if (res->copy_truncated) {
        /* Not an unwinding error: the stack went on past what the record holds. */
        atomic_fetch_add_explicit(&u->svc->truncated_stacks, 1, memory_order_relaxed);
    }
    if (res->reparsed_maps)
        c->stats.map_reparses++;
    /* Files new in stacks get their debug info opened in the background for the dump. */
    for (size_t i = 0; i < n; i++) {
        const struct hp_mapping *map = u->frames[i].map;
        size_t k = ((uintptr_t)map >> 4) % HP_ARRAY_SIZE(u->seen_maps);
        if (map && u->seen_maps[k] != map) {
            u->seen_maps[k] = map;
            unwinder_source_prefetch(map);
        }
    }

    struct svc_msg_alloc *m = post(u, c, SVC_MSG_ALLOC, sizeof(*m) + n * sizeof(struct hp_frame));
    if (!m) {
        c->stats.records_lost_service++;
        return;
    }
    m->heap_id = h->heap_id;
    m->n_frames = (uint32_t)n;
    m->seq = h->seq;
    m->addr = h->addr;
    m->size = h->size;
    m->sample_size = h->sample_size;
    memcpy(m + 1, u->frames, n * sizeof(struct hp_frame));
    atomic_fetch_add_explicit(&u->svc->samples, 1, memory_order_relaxed);
}

static bool same_frames(const struct hp_frame *a, size_t na, const struct hp_frame *b, size_t nb)
{
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++)
        if (a[i].map != b[i].map || a[i].rel_pc != b[i].rel_pc ||
            a[i].function_name != b[i].function_name)
            return false;
    return true;
}

/* An audited sample: the client's own walk of the stack (@pcs) must give the frames our
 * unwind of the copy gave (u->frames, @n). A difference means a rule in the client's
 * table is wrong for its code now: the table is flushed (the rules come back from the
 * next unwinds) and the difference counted. The copy's frames are the ones kept. A copy
 * cut short holds only the innermost part of the stack: only that part is compared (the
 * walk, which read the live stack, goes on where the copy stops). */
static void audit_walk(struct svc_unwinder *u, struct svc_client *c, const uint64_t *pcs,
                       size_t n_pcs, size_t n, const struct unwinder_result *res)
{
    size_t na = 0;
    struct unwinder_result ra;
    atomic_fetch_add_explicit(&u->svc->audits, 1, memory_order_relaxed);
    if (res->error || unwinder_resolve_pcs(c->unw, pcs, n_pcs, u->audit_frames, UNWINDER_MAX_FRAMES,
                                           &na, &ra) < 0)
        return;
    if (res->copy_truncated) {
        n--; /* the truncation frame */
        if (na > n)
            na = n;
    }
    if (same_frames(u->frames, n, u->audit_frames, na))
        return;
    c->audit_mismatches++;
    atomic_fetch_add_explicit(&u->svc->audit_mismatches, 1, memory_order_relaxed);
    if (c->audit_mismatches == 1)
        hp_log_warn("pid %d: a stack the client walked differs from its unwind (%zu vs %zu "
                    "frames); its unwind table is reset",
                    c->pid, na, n);
    unwinder_table_reset(c->unw);
}

/* The stack copies that did not hold the whole stack, by the client's flags. */
static void count_stack_flags(struct svc_client *c, uint32_t flags)
{
    if (flags & WIRE_ALLOC_STACK_TRUNCATED)
        c->stats.stacks_truncated++;
    if (flags & WIRE_ALLOC_UNKNOWN_STACK)
        c->stats.unknown_stacks++;
}

static void handle_alloc(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                         size_t len)
{
    struct wire_alloc a;
    const uint8_t *stack;
    uint64_t pcs[WIRE_MAX_PCS];
    size_t n_pcs = 0;
    if (wire_decode_alloc(data, len, c->max_stack_bytes, &a, &stack, pcs, &n_pcs) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    count_stack_flags(c, a.flags);
    size_t n = 0;
    struct unwinder_result res = {0};
    int r = -ENOENT;
    /* A copy that stops short of the stack, or of a stack not the thread's own, is not
     * completed from the process's memory: that has changed since. */
    if (c->unw)
        r = unwinder_unwind_copy(c->unw, a.regs, a.stack_ptr, stack, (size_t)a.stack_len,
                                 unwinder_copy_of(a.flags), u->frames, UNWINDER_MAX_FRAMES, &n,
                                 &res);
    if (n_pcs > 0 && r >= 0)
        audit_walk(u, c, pcs, n_pcs, n, &res);
    /* struct wire_alloc starts with the fields of a struct wire_alloc_head (wire.h). */
    struct wire_alloc_head h;
    memcpy(&h, &a, sizeof(h));
    post_sample(u, c, r, n, &res, &h);
}

/* A stack the client walked itself with its unwind table: only the frames to name. */
static void handle_alloc_pcs(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                             size_t len)
{
    struct wire_alloc_pcs a;
    uint64_t pcs[WIRE_MAX_PCS];
    if (wire_decode_alloc_pcs(data, len, &a, pcs) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    size_t n = 0;
    struct unwinder_result res = {0};
    int r = -ENOENT;
    if (c->unw) {
        r = unwinder_resolve_pcs(c->unw, pcs, a.n_pcs, u->frames, UNWINDER_MAX_FRAMES, &n, &res);
        /* The walk stopped before the end (the table changed under it): say so. */
        if (r >= 0 && (a.flags & WIRE_PCS_PARTIAL) && !res.error)
            unwinder_mark_truncated(u->frames, &n, UNWINDER_MAX_FRAMES, &res);
    }
    atomic_fetch_add_explicit(&u->svc->walked, 1, memory_order_relaxed);
    post_sample(u, c, r, n, &res, &a.head);
}

static void handle_free(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                        size_t len)
{
    struct wire_free f;
    if (wire_decode_free(data, len, &f) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    struct svc_msg_free *m = post(u, c, SVC_MSG_FREE, sizeof(*m));
    if (!m) {
        c->stats.records_lost_service++;
        c->frees_lost_service++;
        return;
    }
    m->heap_id = f.heap_id;
    m->seq = f.seq;
    m->addr = f.addr;
    c->frees++;
}

/* Acts on the WIRE_MAPS_CHANGED records read since the last sample: one reread of the
 * maps for a run of them, within the client's budget for rereads (REREAD_SHARE). Returns
 * false when the budget holds the reread back: the sample waits (c->throttled). An
 * ending client does not wait: its last samples are named with the maps as they are. */
static bool apply_maps_changed(struct svc_client *c)
{
    if (!c->maps_changed)
        return true;
    if (c->unw) {
        uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
        if (!svc__budget_allows(&c->reread, t0, REREAD_SHARE, REREAD_BURST_NS)) {
            if (c->ending)
                return true;
            if (!c->throttled)
                c->stats.map_reparses_deferred++;
            c->throttled = true;
            return false;
        }
        unwinder_maps_changed(c->unw, (c->maps_changed & WIRE_MAPS_UNLOADED) != 0);
        svc__budget_spend(&c->reread, hp_clock_ns(CLOCK_MONOTONIC) - t0);
        c->stats.map_reparses++;
    }
    /* A sample waits for this (the client loaded code it is about to sample). */
    if (c->maps_ask)
        ring_maps_read_done(c->ring, c->maps_ask);
    c->maps_changed = 0;
    c->maps_ask = 0;
    c->throttled = false;
    return true;
}

/* The unwinder keeps the mappings a reread no longer shows (an unloaded library) for the
 * records written before they went. Which records those are is known only as a bound:
 * every record reserved when the reread found them gone lies before the ring's end at
 * that moment, so they go once the reader is there. Checked after every record (a load
 * and a compare). */
static void track_retired(struct svc_client *c)
{
    if (!c->unw)
        return;
    uint64_t seq = unwinder_retired_seq(c->unw);
    if (seq != c->retired_seen) {
        c->retired_seen = seq;
        /* Full: the newest bound covers the last one's mappings too (kept longer). */
        unsigned i = c->n_retired < HP_ARRAY_SIZE(c->retired) ? c->n_retired++ : c->n_retired - 1;
        c->retired[i].seq = seq;
        c->retired[i].mark = ring_mark(c->ring);
    }
    while (c->n_retired > 0 && ring_reached(c->ring, c->retired[0].mark)) {
        unwinder_retired_drop(c->unw, c->retired[0].seq);
        c->n_retired--;
        memmove(&c->retired[0], &c->retired[1], c->n_retired * sizeof(c->retired[0]));
    }
}

/* Given up on: corrupt data, or a writer that kept a record while it ran. */
static bool client_over(const struct svc_client *c)
{
    return (c->flags & BK_FLAG_BUFFER_CORRUPTED) || c->cut_off;
}

/* The next record of @c has been reserved and left unpublished for the stall timeout.
 * Returns true when the reader may read on (the record was skipped). */
static bool stalled(struct svc_unwinder *u, struct svc_client *c)
{
    uint32_t tid = ring_stalled_writer(c->ring);
    enum svc_thread_state st = svc__thread_state(c->pid, (pid_t)tid);
    c->flags |= BK_FLAG_WRITER_STALLED;
    if (st == SVC_THREAD_STOPPED) {
        /* A debugger, SIGSTOP or the freezer: the record comes once the thread runs
         * again. The other clients are served meanwhile. */
        if (!c->in_stall) {
            c->in_stall = true;
            c->stats.writer_stalls++;
            atomic_fetch_add_explicit(&u->svc->stall_waits, 1, memory_order_relaxed);
            hp_log_info("pid %d: thread %u is stopped in the middle of a record (debugger, "
                        "SIGSTOP or freezer); waiting for it",
                        c->pid, tid);
        }
        ring_stall_rearm(c->ring);
        return false;
    }
    if (st == SVC_THREAD_GONE && tid != 0) {
        /* The thread is gone: nobody will ever publish the record. */
        int r = ring_skip_stalled(c->ring);
        if (r == -EBADMSG) {
            c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            return false;
        }
        if (r == 0) {
            c->stats.stalled_records_skipped++;
            atomic_fetch_add_explicit(&u->svc->stall_skips, 1, memory_order_relaxed);
        }
        return true;
    }
    /* Running (or nobody named): a thread that keeps a record for that long while it
     * runs is not coming back to it. */
    hp_log_warn("pid %d: %s%u kept a record unpublished for %u s while running; client "
                "disconnected",
                c->pid, tid ? "thread " : "an unnamed writer", tid,
                RING_DEFAULT_STALL_TIMEOUT_US / 1000000u);
    atomic_fetch_add_explicit(&u->svc->stall_cutoffs, 1, memory_order_relaxed);
    c->cut_off = true;
    return false;
}

/* What a drain left. */
enum drain_result {
    DRAIN_DONE, /* caught up, at the mark, or given up on the client */
    DRAIN_MORE, /* the budget ran out: the ring may hold more */
    DRAIN_HELD, /* records wait: a reread the rate limit holds back, or a full queue */
};

/* Reads up to @budget records of @c, stopping at @mark (ring_mark()) if not NULL, and
 * before the next record when the queue to the bookkeeping thread is full. */
static enum drain_result drain_upto(struct svc_unwinder *u, struct svc_client *c, unsigned budget,
                                    const uint64_t *mark)
{
    if (client_over(c))
        return DRAIN_DONE;
    u->clock_ns = hp_clock_ns(CLOCK_MONOTONIC);
    for (unsigned i = 0; i < budget; i++) {
        if (mark && ring_reached(c->ring, *mark))
            break;
        if (svc__bkq_full(u->batcher.q))
            return DRAIN_HELD;
        struct ring_rspan rd;
        int r = ring_begin_read(c->ring, &rd);
        if (r == -ETIMEDOUT) {
            if (stalled(u, c))
                continue;
            return DRAIN_DONE;
        }
        if (r == -EAGAIN)
            break;
        if (r < 0) {
            c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            return DRAIN_DONE;
        }
        c->in_stall = false;
        bool sync = false;
        switch (rd.type) {
        case WIRE_ALLOC:
            /* A sample waiting for a reread stays in the ring (read again later). */
            if (!apply_maps_changed(c))
                return DRAIN_HELD;
            handle_alloc(u, c, rd.data, rd.len);
            break;
        case WIRE_FREE:
            handle_free(u, c, rd.data, rd.len);
            break;
        case WIRE_ALLOC_PCS:
            if (!apply_maps_changed(c))
                return DRAIN_HELD;
            handle_alloc_pcs(u, c, rd.data, rd.len);
            break;
        case WIRE_MAPS_CHANGED: {
            struct wire_maps_changed mc;
            if (wire_decode_maps_changed(rd.data, rd.len, &mc) < 0) {
                c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            } else {
                c->maps_changed |= SVC_MAPS_CHANGED | (mc.flags & WIRE_MAPS_UNLOADED);
                if (mc.ask)
                    c->maps_ask = mc.ask;
            }
            break;
        }
        case WIRE_SYNC:
            sync = true;
            break;
        default:
            c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            break;
        }
        ring_end_read(c->ring, &rd);
        /* A writer waits until we have read past it (WIRE_SYNC; today's clients do not
         * send it): tell it now. */
        if (sync)
            ring_flush_read_pos(c->ring);
        track_retired(c);
        c->records++;
        if (c->flags & BK_FLAG_BUFFER_CORRUPTED)
            return DRAIN_DONE;
        if (i + 1 == budget)
            return DRAIN_MORE;
    }
    /* Caught up: a client waiting for a new table generation after an unload is
     * released now, not at its next sample. */
    bool applied = apply_maps_changed(c);
    track_retired(c);
    return applied ? DRAIN_DONE : DRAIN_HELD;
}

/* A snapshot of @c's statistics and flags, the ring's counters included (the client
 * writes those: they are as untrusted as the rest, and only ever shown as its own). */
static void client_stats(const struct svc_client *c, struct bk_process_stats *ret,
                         uint32_t *ret_flags)
{
    struct ring_stats rs;
    ring_get_stats(c->ring, &rs);
    *ret = c->stats;
    ret->client_spinlock_blocked_us = rs.client_spinlock_blocked_us;
    ret->records_dropped = rs.records_dropped;
    ret->reserve_failures = rs.reserve_failures;
    ret->freeset_full = rs.freeset_full;
    ret->frees_lost = rs.frees_lost + c->frees_unread + c->frees_lost_service;
    uint32_t flags = c->flags;
    /* Records lost on their way, whatever the cause (each is counted by cause). */
    if (rs.records_dropped || rs.reserve_failures || c->stats.records_unread ||
        c->stats.records_lost_service)
        flags |= BK_FLAG_BUFFER_OVERRAN;
    /* The client stopped waiting for room (a block timed out): Perfetto's
     * CLIENT_ERROR_HIT_TIMEOUT in the dump. */
    if (rs.block_timeouts)
        flags |= BK_FLAG_CLIENT_ERROR | BK_FLAG_BUFFER_OVERRAN;
    *ret_flags = flags;
}

/* Posts @c's statistics and flags so far: the dump that follows shows them. */
static void post_stats(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc_msg_proc_end *m = post(u, c, SVC_MSG_PROC_STATS, sizeof(*m));
    if (m)
        client_stats(c, &m->stats, &m->flags);
}

/* Ends @c's session: its writers stop (a detached ring refuses them), and the records
 * reserved before now are read, a budget at a time with the other clients, until
 * @c->end_deadline_ns; then complete_end(). @flags: BK_FLAG_* for its last dump; @why:
 * for the log. */
static void begin_end(struct svc_unwinder *u, struct svc_client *c, uint32_t flags, const char *why)
{
    if (c->ending)
        return;
    ring_set_detached(c->ring);
    c->ending = true;
    c->end_flags = flags;
    c->end_why = why;
    c->end_mark = ring_mark(c->ring);
    c->end_deadline_ns = hp_clock_ns(CLOCK_MONOTONIC) + END_BUDGET_NS;
    if (u->stopping && c->end_deadline_ns > u->stop_deadline_ns)
        c->end_deadline_ns = u->stop_deadline_ns;
    /* Over its memory guardrail the service keeps nothing more: what the ring holds is
     * counted, not read. */
    if (flags & BK_FLAG_HIT_GUARDRAIL)
        c->end_deadline_ns = 0;
    c->has_work = true;
    c->throttled = false;
    atomic_fetch_add_explicit(&u->svc->ending_clients, 1, memory_order_relaxed);
}

/* True when the end of @c is complete: nothing before its mark is left to read, or its
 * time is up. */
static bool end_due(const struct svc_client *c, uint64_t now)
{
    return client_over(c) || ring_reached(c->ring, c->end_mark) || now >= c->end_deadline_ns;
}

/* Skips and counts what is left before the end mark, posts the end of the process with
 * its last statistics and frees the client. */
static void complete_end(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc *s = u->svc;
    if (!client_over(c) && !ring_reached(c->ring, c->end_mark)) {
        uint64_t n = 0, frees = 0;
        if (ring_discard(c->ring, c->end_mark, WIRE_FREE, &n, &frees) < 0)
            n++; /* at least the record whose header is not valid */
        c->stats.records_unread += n;
        c->frees_unread += frees;
        hp_log_warn("pid %d: %llu records left unread when its session ended %s; counted "
                    "as dropped",
                    c->pid, (unsigned long long)n,
                    c->end_flags & BK_FLAG_HIT_GUARDRAIL
                        ? "(the service hit its memory guardrail)"
                        : "(it kept writing, or they took too long to read)");
    }
    if (c->flags & BK_FLAG_BUFFER_CORRUPTED) {
        atomic_fetch_add_explicit(&s->corrupt, 1, memory_order_relaxed);
        hp_log_warn("pid %d: corrupt data in the shared buffer; client disconnected", c->pid);
    }
    if (c->end_flags & BK_FLAG_CONN_CLOSED) {
        atomic_fetch_add_explicit(&s->conn_closed, 1, memory_order_relaxed);
        hp_log_warn("pid %d: the program closed the profiler's connection while running "
                    "(e.g. closefrom or close_range at start); it is not profiled from there on",
                    c->pid);
    }
    struct svc_msg_proc_end *m = post(u, c, SVC_MSG_PROC_END, sizeof(*m));
    struct bk_process_stats st;
    uint32_t flags;
    client_stats(c, &st, &flags);
    flags |= c->end_flags;
    if (m) {
        m->flags = flags;
        m->stats = st;
    }
    atomic_fetch_add_explicit(&s->drops, st.records_dropped, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->frees_lost, st.frees_lost, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->reserve_failures, st.reserve_failures, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->records_unread, st.records_unread, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->records_lost_service, st.records_lost_service,
                              memory_order_relaxed);
    if (flags & BK_FLAG_CLIENT_ERROR)
        atomic_fetch_add_explicit(&s->timed_out, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->frees, c->frees, memory_order_relaxed);
    if (s->cfg.log_processes) {
        uint64_t lost =
            st.records_dropped + st.reserve_failures + st.records_unread + st.records_lost_service;
        char extra[96] = "";
        if (lost)
            snprintf(extra, sizeof(extra), ", %llu lost (dropped or unread)",
                     (unsigned long long)lost);
        hp_log_note("pid %d (%s): %s %s: %llu samples%s", c->pid, svc__client_name(c),
                    client_over(c) || (flags & BK_FLAG_CONN_LOST) || c->end_abrupt ? "dropped"
                                                                                   : "ended",
                    c->end_why ? c->end_why : "", (unsigned long long)st.heap_samples, extra);
    }
    svc__batch_flush(&u->batcher);
    atomic_fetch_sub_explicit(&u->nclients, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->live_clients, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->ending_clients, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->client_mem_bytes, c->mem_bytes, memory_order_relaxed);
    svc__client_free(c);
}

static void unlink_client(struct svc_unwinder *u, struct svc_client *c)
{
    for (struct svc_client **pp = &u->clients; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            return;
        }
    }
}

static bool pid_served(const struct svc_unwinder *u, pid_t pid)
{
    for (const struct svc_client *c = u->clients; c; c = c->next)
        if (c->pid == pid)
            return true;
    return false;
}

static void start(struct svc_unwinder *u, struct svc_client *c)
{
    c->next = u->clients;
    u->clients = c;
    c->has_work = true;
    svc__budget_init(&c->reread, hp_clock_ns(CLOCK_MONOTONIC), REREAD_BURST_NS);
    (void)post_start(u, c); /* retried with its first record (post()) */
    if (u->stopping)
        begin_end(u, c, 0, "profiling stopped");
}

static void adopt(struct svc_unwinder *u, struct svc_client *c)
{
    /* A new session of a pid we still serve: the process exec'd (or died and its number
     * was reused), so nothing writes into the old ring any more. The old session ends
     * first: its last records and its end reach the bookkeeping thread before the new
     * start (the main thread hands every session of a pid to the same thread). */
    for (struct svc_client *old = u->clients; old; old = old->next)
        if (old->pid == c->pid)
            begin_end(u, old, 0, "exec'd");
    if (pid_served(u, c->pid)) {
        c->next = u->deferred;
        u->deferred = c;
        return;
    }
    start(u, c);
}

/* Starts the deferred sessions whose pid's previous session has ended. */
static void adopt_deferred(struct svc_unwinder *u)
{
    for (struct svc_client **pp = &u->deferred; *pp;) {
        struct svc_client *c = *pp;
        if (pid_served(u, c->pid)) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        start(u, c);
    }
}

/* Why the session of @c, whose socket hung up or who said it ended, is over: the
 * process exited (it said so at exit()) or exec'd (it lives on, its address space
 * replaced), or it went away unexpectedly (killed, crashed, _exit: no word from it), or
 * it runs on and the program closed our connection (or the client ended the session for
 * a reason it gave). Only the unexpected ends are "disconnected". */
static uint32_t hangup_flags(struct svc_client *c, const char **ret_why)
{
    const uint32_t lost = BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST;
    uint32_t why = ring_client_ended(c->ring);
    if (why == RING_END_CONN_TAKEN) {
        *ret_why = "(the program closed the profiler's connection)";
        return lost | BK_FLAG_CONN_CLOSED;
    }
    if (why == RING_END_CREDENTIALS) {
        hp_log_warn("pid %d changed its user or group ids; it is not profiled from there on",
                    c->pid);
        *ret_why = "(it changed its user or group ids)";
        return lost;
    }
    /* At exit and at exec the kernel lets the address space go before it closes the
     * descriptors: a maps file still readable now means the same program still runs. */
    char b;
    if (c->image_fd >= 0 && pread(c->image_fd, &b, 1, 0) == 1) {
        *ret_why = "(the program closed the profiler's connection)";
        return lost | BK_FLAG_CONN_CLOSED;
    }
    /* Perfetto's disconnected: the process's session ended, whatever the reason (as
     * heapprofd sets it); not a loss of the profiler's. */
    if (ring_client_exiting(c->ring))
        *ret_why = "(exited)";
    else if (svc__process_alive(c->pid))
        *ret_why = "(exec'd)";
    else {
        *ret_why = "(went away without exiting: killed, crashed or _exit)";
        c->end_abrupt = true;
    }
    return BK_FLAG_DISCONNECTED;
}

/* Once a second: a hang-up the main thread's epoll could not report to us. */
static void poll_hangups(struct svc_unwinder *u)
{
    struct pollfd pf[64];
    struct svc_client *cs[64];
    struct svc_client *c = u->clients;
    while (c) {
        nfds_t n = 0;
        for (; c && n < HP_ARRAY_SIZE(pf); c = c->next, n++) {
            pf[n] = (struct pollfd){.fd = c->sock, .events = POLLRDHUP};
            cs[n] = c;
        }
        if (poll(pf, n, 0) <= 0)
            continue;
        for (nfds_t i = 0; i < n; i++)
            if (pf[i].revents)
                cs[i]->hung_up = true;
    }
}

void svc__unwinder_wake(struct svc_unwinder *u)
{
    /* Release pairs with the acquire load before the thread looks at its requests. */
    atomic_fetch_add_explicit(&u->wake_word, 1, memory_order_release);
    (void)hp_sys3(SYS_futex, (long)&u->wake_word, FUTEX_WAKE_PRIVATE, 1);
}

void svc__unwinder_hangup(struct svc *s, uint64_t id)
{
    unsigned k = (unsigned)(id >> SVC_CLIENT_ID_SHIFT);
    if (k >= s->n_unwinders)
        return;
    struct svc_unwinder *u = &s->unwinders[k];
    pthread_mutex_lock(&u->lock);
    if (hp_grow((void **)&u->hangups, &u->cap_hangups, u->n_hangups + 1, sizeof(*u->hangups)) == 0)
        u->hangups[u->n_hangups++] = id;
    pthread_mutex_unlock(&u->lock);
    svc__unwinder_wake(u);
}

/* Sleeps until a ring or a request wakes the thread, or @timeout_ms pass; clients whose
 * ring was written meanwhile get has_work. @wake_seen: the wake word before the requests
 * were taken. */
static void wait_for_work(struct svc_unwinder *u, uint32_t wake_seen, unsigned timeout_ms)
{
    struct futex_waitv w[SVC_WAITV_MAX];
    struct svc_client *cs[SVC_WAITV_MAX];
    unsigned n = 0;
    bool unwatched = false;
    w[n++] = (struct futex_waitv){.uaddr = (uintptr_t)&u->wake_word,
                                  .val = wake_seen,
                                  .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
    for (struct svc_client *c = u->clients; c; c = c->next) {
        if (c->has_work)
            continue;
        if (n == SVC_WAITV_MAX || u->no_waitv) {
            unwatched = true;
            continue;
        }
        uint32_t val;
        const void *word = ring_reader_word(c->ring, &val);
        cs[n] = c;
        w[n++] = (struct futex_waitv){.uaddr = (uintptr_t)word, .val = val, .flags = FUTEX_32};
    }
    if (unwatched && timeout_ms > POLL_MS)
        timeout_ms = POLL_MS;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    long r = -ENOSYS;
    if (!u->no_waitv) {
        r = hp_sys6(SYS_futex_waitv, (long)w, n, 0, (long)&ts, CLOCK_MONOTONIC, 0);
        if (r == -ENOSYS) {
            u->no_waitv = true;
            hp_log_info("futex_waitv is missing (Linux < 5.16): rings are polled every %d ms",
                        POLL_MS);
        }
    }
    if (r == -ENOSYS) {
        /* Only our own word: the rings are looked at after a short sleep. */
        struct timespec rel = {0, POLL_MS * 1000000L};
        (void)hp_sys4(SYS_futex, (long)&u->wake_word, FUTEX_WAIT_PRIVATE, wake_seen, (long)&rel);
        unwatched = true;
    }
    for (unsigned i = 1; i < n; i++) {
        uint32_t val;
        const void *word = ring_reader_word(cs[i]->ring, &val);
        if (atomic_load_explicit((const _Atomic uint32_t *)word, memory_order_relaxed) != val) {
            /* A writer woke us: the ring is awake (the writer said so). */
            cs[i]->has_work = true;
            cs[i]->polling = false;
            ring_set_reader_idle(cs[i]->ring, false);
        }
    }
    if (unwatched)
        for (struct svc_client *c = u->clients; c; c = c->next)
            c->has_work = true;
}

/* Begins the end of every session that is over or asked to end. */
static void begin_ends(struct svc_unwinder *u, bool detach, uint32_t detach_flags)
{
    for (struct svc_client *c = u->clients; c; c = c->next) {
        if (c->ending)
            continue;
        const char *why;
        if (client_over(c)) {
            /* The service and the other clients carry on. */
            begin_end(u, c, BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST,
                      c->cut_off ? "(a thread kept a record unpublished while running)"
                                 : "(corrupt data in the shared buffer)");
        } else if (c->hung_up || ring_client_ended(c->ring) != RING_END_NONE) {
            /* EOF: the process can no longer write; read the rest and end it. */
            uint32_t flags = hangup_flags(c, &why);
            begin_end(u, c, flags, why);
        } else if (detach) {
            begin_end(u, c, detach_flags,
                      detach_flags & BK_FLAG_HIT_GUARDRAIL ? "(the service hit its guardrail)"
                                                           : "(detached)");
        } else if (u->stopping) {
            begin_end(u, c, 0, "(profiling stopped)");
        }
    }
}

/* Completes the ends that are due. */
static void complete_ends(struct svc_unwinder *u)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (struct svc_client *c = u->clients, *next; c; c = next) {
        next = c->next;
        if (c->ending && end_due(c, now)) {
            unlink_client(u, c);
            complete_end(u, c);
        }
    }
    adopt_deferred(u);
}

/* Reads each ring up to where it ended when the dump was asked for (an ending one: up to
 * its end), then posts every client's statistics and the barrier that lets the dump go. */
static void answer_dumps(struct svc_unwinder *u, uint32_t dump_requests)
{
    /* Only what was written before the request: a process that keeps its ring full would
     * otherwise hold the dump (and every other client) back for as long as it can refill
     * the ring faster than we read it. */
    for (struct svc_client *c = u->clients; c; c = c->next) {
        uint64_t mark = c->ending ? c->end_mark : ring_mark(c->ring);
        for (unsigned i = 0;
             i < DUMP_DRAIN_ROUNDS && drain_upto(u, c, DRAIN_BUDGET, &mark) == DRAIN_MORE; i++)
            ;
    }
    for (struct svc_client *c = u->clients; c; c = c->next)
        post_stats(u, c);
    struct svc_msg_dump_barrier *m =
        svc__batch_add(&u->batcher, SVC_MSG_DUMP_BARRIER, 0, sizeof(*m));
    if (m) {
        m->unwinder = u->index;
        m->n = dump_requests;
    }
}

void *svc__unwinder_main(void *arg)
{
    struct svc_unwinder *u = arg;
    /* No signal handler runs on this thread: the unwinder skips libunwind's signal-mask
     * syscalls, which only matter to handlers that unwind (unwinder/sigmask.h). Except
     * SIGBUS: the unwinder's handler turns a fault on a cached file truncated behind our
     * back into a failed read (unwinder/elf_cache.h), and a blocked SIGBUS would kill. */
    sigset_t all;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    (void)pthread_sigmask(SIG_BLOCK, &all, NULL);

    uint64_t last_scan_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE), last_poll_ns = last_scan_ns;
    for (;;) {
        /* Before the requests: a wake after this load makes the wait below return. */
        uint32_t wake_seen = atomic_load_explicit(&u->wake_word, memory_order_acquire);
        /* Take over new clients. */
        pthread_mutex_lock(&u->lock);
        struct svc_client *in = u->incoming;
        u->incoming = NULL;
        bool stop = u->stop;
        bool detach = u->detach;
        uint32_t detach_flags = u->detach_flags;
        uint32_t dump_requests = u->dump_requests;
        u->dump_requests = 0;
        u->detach = false;
        u->detach_flags = 0;
        uint64_t *hangups = u->hangups;
        size_t n_hangups = u->n_hangups;
        u->hangups = NULL;
        u->n_hangups = u->cap_hangups = 0;
        pthread_mutex_unlock(&u->lock);
        if (stop && !u->stopping) {
            u->stopping = true;
            u->stop_deadline_ns = hp_clock_ns(CLOCK_MONOTONIC) + STOP_BUDGET_NS;
            for (struct svc_client *c = u->clients; c; c = c->next)
                if (c->ending && c->end_deadline_ns > u->stop_deadline_ns)
                    c->end_deadline_ns = u->stop_deadline_ns;
        }
        while (in) {
            struct svc_client *next = in->next;
            adopt(u, in);
            in = next;
        }
        for (size_t i = 0; i < n_hangups; i++)
            for (struct svc_client *c = u->clients; c; c = c->next)
                if (c->id == hangups[i])
                    c->hung_up = true;
        free(hangups);

        /* Sessions over (corrupt, cut off, hung up, ended by the client) or asked to end
         * (detach, stop) begin their end: read below like the others, with a deadline. */
        begin_ends(u, detach, detach_flags);

        /* Drain rings, a bounded amount per client; none while the queue to the
         * bookkeeping thread is full (its rings fill up instead, and their writers count
         * what they drop). */
        bool busy = false, polling = false;
        bool queue_full = svc__bkq_full(u->batcher.q);
        uint64_t now_ns = hp_clock_ns(CLOCK_MONOTONIC);
        for (struct svc_client *c = u->clients; c && !queue_full; c = c->next) {
            if (!c->has_work) {
                polling |= c->polling;
                continue;
            }
            if (c->ending && now_ns >= c->end_deadline_ns)
                continue; /* its time is up: the rest is counted below */
            uint64_t before = c->records;
            enum drain_result dr = drain_upto(u, c, DRAIN_BUDGET, c->ending ? &c->end_mark : NULL);
            if (dr == DRAIN_MORE) {
                busy = true;
                c->polling = false;
                continue;
            }
            if (dr == DRAIN_HELD) {
                /* A reread held back, or the queue filled up: look again soon. */
                queue_full = svc__bkq_full(u->batcher.q);
                c->has_work = false;
                c->polling = polling = true;
                continue;
            }
            if (c->ending) {
                /* At the mark it ends below; else a record is still being written:
                 * look again soon, until the deadline. */
                c->has_work = false;
                c->polling = polling = true;
                continue;
            }
            c->has_work = false;
            if (c->records != before)
                c->quiet_polls = 0;
            else
                c->quiet_polls++;
            if (c->quiet_polls < QUIET_POLLS) {
                /* Records came in lately: look again in POLL_MS. */
                if (!c->polling)
                    ring_set_reader_polling(c->ring, 0);
                c->polling = true;
                polling = true;
                continue;
            }
            c->polling = false;
            ring_set_reader_idle(c->ring, true);
            /* Re-check after announcing idleness so no wakeup is lost. */
            dr = drain_upto(u, c, DRAIN_BUDGET, NULL);
            c->has_work = dr == DRAIN_MORE;
            if (dr != DRAIN_DONE) {
                ring_set_reader_idle(c->ring, false);
                busy |= c->has_work;
                c->polling = polling = dr == DRAIN_HELD;
            }
        }
        if (dump_requests > 0 && svc__bkq_full(u->batcher.q)) {
            /* Answered once there is room: requests that came meanwhile make one dump
             * (the bookkeeping thread is behind anyway). */
            pthread_mutex_lock(&u->lock);
            u->dump_requests += dump_requests;
            pthread_mutex_unlock(&u->lock);
        } else if (dump_requests > 0) {
            answer_dumps(u, dump_requests);
        }
        svc__batch_flush(&u->batcher);

        /* Ends whose records are read (or whose time is up). */
        complete_ends(u);
        if (u->stopping && !u->clients && !u->deferred)
            break;

        if (queue_full) {
            /* Woken when the bookkeeping thread made room (svc_bkq.on_room). */
            wait_for_work(u, wake_seen, POLL_MS);
        } else if (!busy) {
            wait_for_work(u, wake_seen, polling || u->stopping ? POLL_MS : 1000);
        }
        uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
        if (polling && now - last_poll_ns >= (uint64_t)POLL_MS * 1000000u) {
            /* Even when writers of other rings keep waking us up. */
            last_poll_ns = now;
            for (struct svc_client *c = u->clients; c; c = c->next)
                c->has_work |= c->polling;
        }
        if (now - last_scan_ns >= 1000000000u) {
            /* Every second: look at every ring once more, so a record left unpublished
             * by a stalled or dead writer is found; and at every socket, for a hang-up
             * the main thread could not tell us about. */
            last_scan_ns = now;
            for (struct svc_client *c = u->clients; c; c = c->next)
                c->has_work = true;
            poll_hangups(u);
        }
    }
    svc__batch_post(&u->batcher);
    return NULL;
}
