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

static const uint64_t hist_bounds[] = BK_UNWIND_HIST_BOUNDS;

static void post_start(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc_msg_proc_start *m =
        svc__batch_add(&u->batcher, SVC_MSG_PROC_START, c->pid, sizeof(*m) + c->cmdline_len);
    if (!m)
        return;
    m->cmdline_len = (uint32_t)c->cmdline_len;
    m->sampling_interval_bytes = c->sampling_interval_bytes;
    m->from_startup = c->from_startup;
    if (c->cmdline_len)
        memcpy(m + 1, c->cmdline, c->cmdline_len);
    c->started = true;
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

    struct svc_msg_alloc *m = svc__batch_add(&u->batcher, SVC_MSG_ALLOC, c->pid,
                                             sizeof(*m) + n * sizeof(struct hp_frame));
    if (!m)
        return;
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
    struct svc_msg_free *m = svc__batch_add(&u->batcher, SVC_MSG_FREE, c->pid, sizeof(*m));
    if (!m)
        return;
    m->heap_id = f.heap_id;
    m->seq = f.seq;
    m->addr = f.addr;
    c->frees++;
}

/* Acts on the WIRE_MAPS_CHANGED records read since the last sample: one reread of the
 * maps for a run of them (a flood costs one reread per sample at most). */
static void apply_maps_changed(struct svc_client *c)
{
    if (c->maps_changed && c->unw)
        unwinder_maps_changed(c->unw, (c->maps_changed & WIRE_MAPS_UNLOADED) != 0);
    /* A sample waits for this (the client loaded code it is about to sample). */
    if (c->maps_changed && c->maps_ask)
        ring_maps_read_done(c->ring, c->maps_ask);
    c->maps_changed = 0;
    c->maps_ask = 0;
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

/* Reads up to @budget records, stopping at @mark (ring_mark()) if not NULL. Returns true
 * when the ring may hold more (before @mark). */
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

static bool drain_upto(struct svc_unwinder *u, struct svc_client *c, unsigned budget,
                       const uint64_t *mark)
{
    if (client_over(c))
        return false;

    u->clock_ns = hp_clock_ns(CLOCK_MONOTONIC);
    for (unsigned i = 0; i < budget; i++) {
        if (mark && ring_reached(c->ring, *mark))
            break;
        struct ring_rspan rd;
        int r = ring_begin_read(c->ring, &rd);
        if (r == -ETIMEDOUT) {
            if (stalled(u, c))
                continue;
            return false;
        }
        if (r == -EAGAIN)
            break;
        if (r < 0) {
            c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            return false;
        }
        c->in_stall = false;
        bool sync = false;
        switch (rd.type) {
        case WIRE_ALLOC:
            apply_maps_changed(c);
            handle_alloc(u, c, rd.data, rd.len);
            break;
        case WIRE_FREE:
            handle_free(u, c, rd.data, rd.len);
            break;
        case WIRE_ALLOC_PCS:
            apply_maps_changed(c);
            handle_alloc_pcs(u, c, rd.data, rd.len);
            break;
        case WIRE_MAPS_CHANGED: {
            struct wire_maps_changed mc;
            if (wire_decode_maps_changed(rd.data, rd.len, &mc) < 0)
                c->flags |= BK_FLAG_BUFFER_CORRUPTED;
            else
                c->maps_changed |= SVC_MAPS_CHANGED | (mc.flags & WIRE_MAPS_UNLOADED);
            if (mc.ask)
                c->maps_ask = mc.ask;
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
            return false;
        if (i + 1 == budget)
            return true;
    }
    /* Caught up: a client waiting for a new table generation after an unload is
     * released now, not at its next sample. */
    apply_maps_changed(c);
    track_retired(c);
    return false;
}

static bool drain(struct svc_unwinder *u, struct svc_client *c, unsigned budget)
{
    return drain_upto(u, c, budget, NULL);
}

/* Drains what is left, posts the end of the process and frees the client. */
static void finish_client(struct svc_unwinder *u, struct svc_client *c, uint32_t flags)
{
    while (drain(u, c, DRAIN_BUDGET))
        ;
    if (c->flags & BK_FLAG_BUFFER_CORRUPTED) {
        atomic_fetch_add_explicit(&u->svc->corrupt, 1, memory_order_relaxed);
        hp_log_warn("pid %d: corrupt data in the shared buffer; client disconnected", c->pid);
    }
    if (flags & BK_FLAG_CONN_CLOSED) {
        atomic_fetch_add_explicit(&u->svc->conn_closed, 1, memory_order_relaxed);
        hp_log_warn("pid %d: the program closed the profiler's connection while running "
                    "(e.g. closefrom or close_range at start); it is not profiled from there on",
                    c->pid);
    }
    struct ring_stats rs;
    ring_get_stats(c->ring, &rs);
    c->stats.client_spinlock_blocked_us = rs.client_spinlock_blocked_us;
    c->stats.records_dropped = rs.records_dropped;
    c->stats.frees_lost = rs.frees_lost;
    if (rs.records_dropped) {
        c->flags |= BK_FLAG_BUFFER_OVERRAN;
        atomic_fetch_add_explicit(&u->svc->drops, rs.records_dropped, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&u->svc->frees_lost, rs.frees_lost, memory_order_relaxed);
    /* The client stopped waiting for room (a block timed out): Perfetto's
     * CLIENT_ERROR_HIT_TIMEOUT in the dump, a line in the summary. */
    if (rs.block_timeouts) {
        c->flags |= BK_FLAG_CLIENT_ERROR | BK_FLAG_BUFFER_OVERRAN;
        atomic_fetch_add_explicit(&u->svc->timed_out, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&u->svc->frees, c->frees, memory_order_relaxed);

    struct svc_msg_proc_end *m = svc__batch_add(&u->batcher, SVC_MSG_PROC_END, c->pid, sizeof(*m));
    if (m) {
        m->flags = c->flags | flags;
        m->stats = c->stats;
    }
    svc__batch_flush(&u->batcher);
    /* Writers stop before the socket closes, so nothing is written that nobody reads. */
    ring_set_detached(c->ring);
    atomic_fetch_sub_explicit(&u->nclients, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&u->svc->live_clients, 1, memory_order_relaxed);
    svc__client_free(c);
}

static void unlink_client(struct svc_unwinder *u, struct svc_client *c);

static void adopt(struct svc_unwinder *u, struct svc_client *c)
{
    /* A new session of a pid we still serve: the process exec'd (or died and its number
     * was reused), so nothing writes into the old ring any more. End the old session
     * first: its last records and its end reach the bookkeeping thread before the new
     * start (the main thread hands every session of a pid to the same thread). */
    for (struct svc_client *old = u->clients, *next; old; old = next) {
        next = old->next;
        if (old->pid == c->pid) {
            unlink_client(u, old);
            finish_client(u, old, BK_FLAG_DISCONNECTED);
        }
    }
    c->next = u->clients;
    u->clients = c;
    c->has_work = true;
    post_start(u, c);
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

/* Why the session of @c, whose socket hung up or who said it ended, is over: the
 * process exited or exec'd (its address space is gone), or it runs on and the program
 * closed our connection (or the client ended the session for a reason it gave). */
static uint32_t hangup_flags(struct svc_client *c)
{
    const uint32_t lost = BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST;
    uint32_t why = ring_client_ended(c->ring);
    if (why == RING_END_CONN_TAKEN)
        return lost | BK_FLAG_CONN_CLOSED;
    if (why == RING_END_CREDENTIALS) {
        hp_log_warn("pid %d changed its user or group ids; it is not profiled from there on",
                    c->pid);
        return lost;
    }
    /* At exit and at exec the kernel lets the address space go before it closes the
     * descriptors: a maps file still readable now means the same program still runs. */
    char b;
    if (c->image_fd >= 0 && pread(c->image_fd, &b, 1, 0) == 1)
        return lost | BK_FLAG_CONN_CLOSED;
    return BK_FLAG_DISCONNECTED; /* it exited or exec'd: not a loss */
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

        /* Drain rings, a bounded amount per client. */
        bool busy = false, polling = false;
        for (struct svc_client *c = u->clients; c; c = c->next) {
            if (!c->has_work) {
                polling |= c->polling;
                continue;
            }
            uint64_t before = c->records;
            if (drain(u, c, DRAIN_BUDGET)) {
                busy = true;
                c->polling = false;
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
            c->has_work = drain(u, c, DRAIN_BUDGET);
            if (c->has_work) {
                ring_set_reader_idle(c->ring, false);
                busy = true;
            }
        }
        if (dump_requests > 0) {
            /* Only what was written before the request: a process that keeps its ring
             * full would otherwise hold the dump (and every other client) back for as
             * long as it can refill the ring faster than we read it. */
            for (struct svc_client *c = u->clients; c; c = c->next) {
                uint64_t mark = ring_mark(c->ring);
                for (unsigned i = 0; i < DUMP_DRAIN_ROUNDS && drain_upto(u, c, DRAIN_BUDGET, &mark);
                     i++)
                    ;
            }
            struct svc_msg_dump_barrier *m =
                svc__batch_add(&u->batcher, SVC_MSG_DUMP_BARRIER, 0, sizeof(*m));
            if (m) {
                m->unwinder = u->index;
                m->n = dump_requests;
            }
        }
        svc__batch_flush(&u->batcher);

        /* Drop corrupt and cut-off clients (the service and other clients carry on), and
         * end the sessions whose socket hung up or whose client said it ended (after the
         * idle announcement above: a client that ends now also wakes the wait below). */
        for (struct svc_client *c = u->clients, *next; c; c = next) {
            next = c->next;
            if (client_over(c)) {
                unlink_client(u, c);
                finish_client(u, c, BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST);
            } else if (c->hung_up || ring_client_ended(c->ring) != RING_END_NONE) {
                /* EOF: the process can no longer write; drain the rest and end it. */
                unlink_client(u, c);
                finish_client(u, c, hangup_flags(c));
            }
        }

        if (detach) {
            while (u->clients) {
                struct svc_client *c = u->clients;
                u->clients = c->next;
                finish_client(u, c, detach_flags);
            }
        }

        if (stop) {
            while (u->clients) {
                struct svc_client *c = u->clients;
                u->clients = c->next;
                finish_client(u, c, 0);
            }
            break;
        }

        if (!busy)
            wait_for_work(u, wake_seen, polling ? POLL_MS : 1000);
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
    svc__batch_flush(&u->batcher);
    return NULL;
}
