/* service/unwind_records.c: what an unwinder thread does with the records of a client's
 * ring: reads them in order (within a budget, up to a mark), unwinds each sampled stack
 * (or takes the pcs the program walked, auditing some), acts on maps changes within the
 * client's reread budget, and posts compact messages to the bookkeeping thread. The
 * thread's loop, the clients' starts and ends are service/unwind_thread.c's. */
#include "service/svc_internal.h"

#include <errno.h>
#include <string.h>

#include "common/clock.h"
#include "common/containers.h"
#include "common/log.h"
#include "shmem_ring/wire.h"

bool svc__post_start(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc_msg_proc_start *m =
        svc__batch_add(&u->batcher, SVC_MSG_PROC_START, c->pid, sizeof(*m) + c->cmdline_len);
    if (!m)
        return false;
    m->cmdline_len = (uint32_t)c->cmdline_len;
    m->sampling_interval_bytes = c->sampling_interval_bytes;
    m->from_startup = c->from_startup;
    m->process_start_ts = c->process_start_ts;
    if (c->cmdline_len)
        memcpy(m + 1, c->cmdline, c->cmdline_len);
    c->started = true;
    return true;
}

/* A message of @type for @c, its process's start posted first if it could not be yet
 * (out of memory: every record would be refused for want of it). NULL when out of
 * memory: the caller counts what is lost. */
void *svc__post(struct svc_unwinder *u, struct svc_client *c, uint32_t type, size_t len)
{
    if (!c->started && !svc__post_start(u, c))
        return NULL;
    return svc__batch_add(&u->batcher, type, c->pid, len);
}

/* Samples are timed in spans: the time since the clock was last read (the start of the
 * drain, or the end of the previous span) is spread evenly over the samples of the span,
 * which adds the decoding of the records in between. A walked stack only has its pcs
 * named (well under a microsecond): SPAN_WALKED of them share a clock read. A stack copy
 * (libunwind's work, microseconds to milliseconds) is timed alone. */
#define SPAN_WALKED 16

/* Ends the current span of @c's samples and restarts the clock. */
static void end_span(struct svc_unwinder *u, struct svc_client *c)
{
    uint64_t t1 = hp_clock_ns(CLOCK_MONOTONIC);
    if (u->span_samples) {
        svc__count_unwind_time(&c->stats, &c->unwinding_ns, t1 - u->clock_ns, u->span_samples);
        atomic_fetch_add_explicit(&u->svc->samples, u->span_samples, memory_order_relaxed);
        if (u->span_walked)
            atomic_fetch_add_explicit(&u->svc->walked, u->span_walked, memory_order_relaxed);
        u->span_samples = u->span_walked = 0;
    }
    u->clock_ns = t1;
}

/* The common end of both kinds of sampled allocation: statistics, then the frames in
 * u->frames (@n of them; @r < 0: none) go to the bookkeeping thread. */
static void post_sample(struct svc_unwinder *u, struct svc_client *c, int r, size_t n,
                        const struct unwinder_result *res, const struct wire_alloc_head *h,
                        bool walked)
{
    u->span_samples++;
    u->span_walked += walked;
    if (!walked || u->span_samples >= SPAN_WALKED)
        end_span(u, c);
    if (r < 0)
        n = 0;
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

    struct svc_msg_alloc *m =
        svc__post(u, c, SVC_MSG_ALLOC, sizeof(*m) + n * sizeof(struct hp_frame));
    if (!m) {
        c->stats.records_lost_service++;
        return;
    }
    m->heap_id = h->heap_id;
    m->n_frames = (uint32_t)n;
    m->seq = ++c->seq;
    m->addr = h->addr;
    m->size = h->size;
    m->sample_size = h->sample_size;
    memcpy(m + 1, u->frames, n * sizeof(struct hp_frame));
}

/* The free of @addr of @heap_id, for the bookkeeping thread. */
static void post_free(struct svc_unwinder *u, struct svc_client *c, uint32_t heap_id, uint64_t addr)
{
    struct svc_msg_free *m = svc__post(u, c, SVC_MSG_FREE, sizeof(*m));
    if (!m) {
        c->stats.records_lost_service++;
        c->frees_lost_service++;
        return;
    }
    m->heap_id = heap_id;
    m->seq = ++c->seq;
    m->addr = addr;
    c->frees++;
}

/* A sampled allocation whose record carries the free of its address first
 * (WIRE_HEAD_FREE_FIRST): that free, before the allocation is posted. */
static void head_free_first(struct svc_unwinder *u, struct svc_client *c,
                            const struct wire_alloc_head *h)
{
    if ((c->features & WIRE_FEATURE_FREE_BATCH) && (h->head_flags & WIRE_HEAD_FREE_FIRST))
        post_free(u, c, h->heap_id, h->addr);
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

/* The Python frames at the end of a record whose flags say it has them (@with): split
 * off into @py, @ret_tail, the record's length without them into @len. False: corrupt. */
static bool take_py(struct svc_client *c, const uint8_t *data, size_t *len, bool with,
                    struct wire_py_frame *py, struct wire_py_tail *ret_tail)
{
    *ret_tail = (struct wire_py_tail){0};
    if (!with)
        return true;
    if (!(c->features & WIRE_FEATURE_PYFRAMES) ||
        wire_decode_py(data, *len, ret_tail, py, len) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return false;
    }
    return true;
}

/* Puts the record's Python frames into the native ones (u->frames, *@n). */
static void merge_py(struct svc_unwinder *u, struct svc_client *c, size_t *n,
                     const struct wire_py_frame *py, const struct wire_py_tail *tail)
{
    if (!c->unw || (tail->n_frames == 0 && tail->flags == 0))
        return;
    struct unwinder_py_result pr;
    (void)unwinder_py_merge(c->unw, u->frames, n, UNWINDER_MAX_FRAMES, py, tail->n_frames,
                            tail->flags, &pr);
    if (pr.named)
        atomic_fetch_add_explicit(&u->svc->python_frames, pr.named, memory_order_relaxed);
    if (pr.unnamed)
        atomic_fetch_add_explicit(&u->svc->python_unnamed, pr.unnamed, memory_order_relaxed);
    if (pr.mismatch)
        atomic_fetch_add_explicit(&u->svc->python_mismatches, 1, memory_order_relaxed);
}

/* WIRE_PY_RUNTIME: the CPython the client found, named once per process. */
static void handle_py_runtime(struct svc_client *c, const uint8_t *data, size_t len)
{
    struct wire_py_runtime rt;
    if (!(c->features & WIRE_FEATURE_PYFRAMES) || wire_decode_py_runtime(data, len, &rt) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    if (!c->unw || unwinder_py_runtime(c->unw, &rt) != 1)
        return;
    static const char *const why[] = {"", "a version other than 3.11", "a debug build",
                                      "a layout other than 3.11's"};
    unsigned v = rt.hexversion;
    if (rt.status != WIRE_PY_OK)
        hp_log_info("pid %d: Python %u.%u.%u is %s: its frames are not shown (only 3.11 "
                    "release builds are read)",
                    c->pid, v >> 24, v >> 16 & 0xff, v >> 8 & 0xff,
                    rt.status < HP_ARRAY_SIZE(why) ? why[rt.status] : "not supported");
}

/* WIRE_PY_CODE: what names a code object, kept for the process's frames. A record that
 * fails validation is counted and ignored: its frames are read from the process. */
static void handle_py_code(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                           size_t len)
{
    struct wire_py_code w;
    const char *qualname, *filename;
    const uint8_t *table;
    if (!(c->features & WIRE_FEATURE_PYFRAMES) ||
        wire_decode_py_code(data, len, &w, &qualname, &filename, &table) < 0) {
        atomic_fetch_add_explicit(&u->svc->python_codes_rejected, 1, memory_order_relaxed);
        return;
    }
    if (c->unw && w.code != 0 && unwinder_py_code(c->unw, &w, qualname, filename, table) == -ENOMEM)
        hp_log_warn("pid %d: out of memory for a Python code object's name", c->pid);
}

static void handle_alloc(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                         size_t len)
{
    struct wire_alloc a;
    const uint8_t *stack;
    uint64_t pcs[WIRE_MAX_PCS];
    size_t n_pcs = 0;
    struct wire_py_frame py[WIRE_MAX_PY_FRAMES];
    struct wire_py_tail tail;
    /* The flags are read from the record's fixed part before it is copied: the copy
     * below checks them again. */
    uint32_t flags = 0;
    if (len >= sizeof(a))
        memcpy(&flags, data + offsetof(struct wire_alloc, flags), sizeof(flags));
    if (!take_py(c, data, &len, (flags & WIRE_ALLOC_PY) != 0, py, &tail))
        return;
    if (wire_decode_alloc(data, len, c->max_stack_bytes, &a, &stack, pcs, &n_pcs) < 0 ||
        (a.flags & WIRE_ALLOC_PY) != (flags & WIRE_ALLOC_PY)) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    count_stack_flags(c, a.flags);
    size_t n = 0;
    struct unwinder_result res = {0};
    int r = -ENOENT;
    if (u->span_samples)
        end_span(u, c); /* the walked samples before this one: timed apart */
    /* A copy that stops short of the stack, or of a stack not the thread's own, is not
     * completed from the process's memory: that has changed since. */
    if (c->unw)
        r = unwinder_unwind_copy(c->unw, a.regs, a.stack_ptr, stack, (size_t)a.stack_len,
                                 unwinder_copy_of(a.flags), u->frames, UNWINDER_MAX_FRAMES, &n,
                                 &res);
    if (n_pcs > 0 && r >= 0)
        audit_walk(u, c, pcs, n_pcs, n, &res);
    if (r >= 0)
        merge_py(u, c, &n, py, &tail);
    /* struct wire_alloc starts with the fields of a struct wire_alloc_head (wire.h). */
    struct wire_alloc_head h;
    memcpy(&h, &a, sizeof(h));
    head_free_first(u, c, &h);
    post_sample(u, c, r, n, &res, &h, false);
}

/* A stack the client walked itself with its unwind table: only the frames to name. */
static void handle_alloc_pcs(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                             size_t len)
{
    struct wire_alloc_pcs a;
    uint64_t pcs[WIRE_MAX_PCS];
    struct wire_py_frame py[WIRE_MAX_PY_FRAMES];
    struct wire_py_tail tail;
    uint32_t flags = 0;
    if (len >= sizeof(a))
        memcpy(&flags, data + offsetof(struct wire_alloc_pcs, flags), sizeof(flags));
    if (!take_py(c, data, &len, (flags & WIRE_PCS_PY) != 0, py, &tail))
        return;
    if (wire_decode_alloc_pcs(data, len, &a, pcs) < 0 ||
        (a.flags & WIRE_PCS_PY) != (flags & WIRE_PCS_PY)) {
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
        if (r >= 0)
            merge_py(u, c, &n, py, &tail);
    }
    head_free_first(u, c, &a.head);
    post_sample(u, c, r, n, &res, &a.head, true);
}

static void handle_free(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                        size_t len)
{
    struct wire_free f;
    if (wire_decode_free(data, len, &f) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    post_free(u, c, f.heap_id, f.addr);
}

/* Frees in a batch (WIRE_FEATURE_FREE_BATCH), in their order. */
static void handle_frees(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                         size_t len)
{
    struct wire_frees f;
    uint64_t addrs[WIRE_MAX_FREES];
    if (!(c->features & WIRE_FEATURE_FREE_BATCH) || wire_decode_frees(data, len, &f, addrs) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    /* 0: a free the client took out after it reserved the record (recorded elsewhere). */
    for (uint32_t i = 0; i < f.n; i++)
        if (addrs[i] != 0)
            post_free(u, c, f.heap_id, addrs[i]);
}

/* A heap's name: for the bookkeeping thread, which names the heap's dumps by it. */
static void handle_heap_name(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                             size_t len)
{
    struct wire_heap_name h;
    if (wire_decode_heap_name(data, len, &h) < 0) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    struct svc_msg_heap_name *m = svc__post(u, c, SVC_MSG_HEAP_NAME, sizeof(*m));
    if (!m)
        return;
    _Static_assert(sizeof(m->name) == sizeof(h.name), "heap name sizes");
    m->heap_id = h.heap_id;
    memcpy(m->name, h.name, sizeof(m->name));
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
bool svc__client_over(const struct svc_client *c)
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

static enum svc_drain_result drain(struct svc_unwinder *u, struct svc_client *c, unsigned budget,
                                   const uint64_t *mark)
{
    for (unsigned i = 0; i < budget; i++) {
        if (mark && ring_reached(c->ring, *mark))
            break;
        if (svc__bkq_full(u->batcher.q))
            return SVC_DRAIN_HELD;
        struct ring_rspan rd;
        int r = ring_begin_read(c->ring, &rd);
        if (r == -ETIMEDOUT) {
            if (stalled(u, c))
                continue;
            return SVC_DRAIN_DONE;
        }
        if (r == -EAGAIN)
            break;
        if (r < 0) {
            c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            return SVC_DRAIN_DONE;
        }
        c->in_stall = false;
        bool sync = false;
        switch (rd.type) {
        case WIRE_ALLOC:
            /* A sample waiting for a reread stays in the ring (read again later). */
            if (!apply_maps_changed(c))
                return SVC_DRAIN_HELD;
            handle_alloc(u, c, rd.data, rd.len);
            break;
        case WIRE_FREE:
            handle_free(u, c, rd.data, rd.len);
            break;
        case WIRE_FREES:
            handle_frees(u, c, rd.data, rd.len);
            break;
        case WIRE_ALLOC_PCS:
            if (!apply_maps_changed(c))
                return SVC_DRAIN_HELD;
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
        case WIRE_PY_RUNTIME:
            handle_py_runtime(c, rd.data, rd.len);
            break;
        case WIRE_PY_CODE:
            handle_py_code(u, c, rd.data, rd.len);
            break;
        case WIRE_HEAP_NAME:
            handle_heap_name(u, c, rd.data, rd.len);
            break;
        case WIRE_TITLE:
            svc__client_title_record(u, c, rd.data, rd.len);
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
            return SVC_DRAIN_DONE;
        if (i + 1 == budget)
            return SVC_DRAIN_MORE;
    }
    /* Caught up: a client waiting for a new table generation after an unload is
     * released now, not at its next sample. */
    bool applied = apply_maps_changed(c);
    track_retired(c);
    return applied ? SVC_DRAIN_DONE : SVC_DRAIN_HELD;
}

/* Frees of @c's sampled blocks lost (its ring was full even for frees, or we could not
 * pass one on) leave their allocations live: phantom leaks. Their allocation records
 * were reserved before the loss was counted, so once everything before the ring's end
 * of that moment is read, every allocation whose free was lost is live in the
 * bookkeeping, which then marks all live ones possibly freed (none is ranked as
 * unreleased memory). Called after each drain: a look at the ring's counters. */
void svc__watch_lost_frees(struct svc_unwinder *u, struct svc_client *c)
{
    struct ring_stats rs;
    ring_get_stats(c->ring, &rs);
    uint64_t lost = rs.frees_lost + c->frees_lost_service;
    if (lost != c->frees_lost_seen) {
        c->frees_lost_seen = lost;
        c->pf_mark = ring_mark(c->ring);
        c->pf_armed = true;
    }
    if (c->pf_armed && ring_reached(c->ring, c->pf_mark) &&
        svc__post(u, c, SVC_MSG_POSSIBLY_FREED, sizeof(struct svc_msg)))
        c->pf_armed = false;
}

/* Reads up to @budget records of @c, stopping at @mark (ring_mark()) if not NULL, and
 * before the next record when the queue to the bookkeeping thread is full. */
enum svc_drain_result svc__drain_upto(struct svc_unwinder *u, struct svc_client *c, unsigned budget,
                                      const uint64_t *mark)
{
    if (svc__client_over(c))
        return SVC_DRAIN_DONE;
    u->clock_ns = hp_clock_ns(CLOCK_MONOTONIC);
    enum svc_drain_result r = drain(u, c, budget, mark);
    if (r != SVC_DRAIN_HELD)
        c->drains++;
    svc__watch_lost_frees(u, c);
    end_span(u, c);
    return r;
}
