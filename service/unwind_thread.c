/* service/unwind_thread.c: an unwinder thread. It owns the clients handed to it: their
 * sockets, rings and unwinder state. It drains each ring (the records themselves:
 * service/unwind_records.c), starts and ends the clients' sessions within their budgets,
 * answers dump requests, and posts each client's statistics to the bookkeeping thread.
 *
 * It sleeps in futex_waitv(2) on its own wake word and on the futex word of every ring
 * it has drained (writers wake it there: no descriptor, see shmem_ring/ring.h). A
 * client's hang-up is seen by the main thread's epoll (svc__unwinder_hangup()), and once
 * a second by a poll of the sockets here. Without futex_waitv (Linux < 5.16), or for the
 * rings beyond the first SVC_WAITV_MAX - 1, the rings are polled every POLL_MS. */
#include "service/svc_internal.h"

#include <assert.h>
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
/* How long a dump waits for the clients to record the frees they hold in batches (they
 * look every 10 ms; a busy machine, or a sanitizer build, may keep them longer). The rings
 * are read meanwhile. */
#define DUMP_FLUSH_WAIT_NS (200ull * 1000 * 1000)
/* A client's title is read again every RETITLE_EARLY_NS for its first
 * RETITLE_EARLY_FOR_NS (look_again()). */
#define RETITLE_EARLY_NS (100ull * 1000 * 1000)
#define RETITLE_EARLY_FOR_NS (3000ull * 1000 * 1000)
/* futex_waitv(2) takes at most 128 words: ours and 127 rings. */
#define SVC_WAITV_MAX 128
/* An ending session (EOF, detach, a client given up on, a new session of its pid) has
 * its records read up to where its ring ended when the end began. No writer adds any
 * then (the ring is detached), so the work is bounded by the ring's size; it runs for
 * END_BUDGET_NS, and again for as long while the last budget read records, up to
 * END_MAX_NS in all, so that a machine busy enough to slow the reading (other clients
 * ending at once, a sanitizer build, a loaded host) loses nothing; what is left then is
 * skipped and counted. Other clients are served meanwhile: an ending one holds nobody.
 * HEAPPROF_TEST_END_BUDGET_MS replaces END_BUDGET_NS (tests of the renewal). */
#define END_BUDGET_NS (3000ull * 1000 * 1000)
#define END_MAX_NS (60000ull * 1000 * 1000)
/* svc_finish(): every client ends within this, so that the daemon stops within a second
 * of SIGINT whatever its clients do (the bookkeeping thread's final dumps come after). */
#define STOP_BUDGET_NS (400ull * 1000 * 1000)
/* Read at each end and renewal: rare, and nothing in the service sets the environment. */
static uint64_t end_budget_ns(void)
{
    const char *e = getenv("HEAPPROF_TEST_END_BUDGET_MS");
    long ms = e ? atol(e) : 0;
    return ms > 0 ? (uint64_t)ms * 1000000u : END_BUDGET_NS;
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
    ret->unseen_call_slots = rs.unseen_slots;
    ret->frees_lost = rs.frees_lost + c->frees_unread + c->frees_lost_service;
    uint32_t flags = c->flags;
    /* Records lost on their way, whatever the cause (each is counted by cause). */
    if (rs.records_dropped || rs.reserve_failures || c->stats.records_unread ||
        c->stats.records_lost_service)
        flags |= BK_FLAG_BUFFER_OVERRAN;
    /* The client stopped waiting for room (a block timed out) and did not wait again
     * since (the service has not caught up yet, or it gave up for good): Perfetto's
     * CLIENT_ERROR_HIT_TIMEOUT in the dump. A client that waits again lost only the
     * samples of the pause (buffer_overran, records_dropped). */
    if (rs.block_timeouts > rs.block_resumes || rs.block_given_up)
        flags |= BK_FLAG_CLIENT_ERROR | BK_FLAG_BUFFER_OVERRAN;
    *ret_flags = flags;
}

/* Posts @c's statistics and flags so far: the dump that follows shows them. */
static void post_stats(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc_msg_proc_end *m = svc__post(u, c, SVC_MSG_PROC_STATS, sizeof(*m));
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
    /* Its title at the end, for its last dump and the log, while the process may still
     * be there to read it from (a stop, a detach; an exited one keeps the last seen). */
    if (c->started)
        svc__client_retitle(u, c);
    ring_set_detached(c->ring);
    c->ending = true;
    c->end_flags = flags;
    c->end_why = why;
    c->end_mark = ring_mark(c->ring);
    c->end_begun_ns = hp_clock_ns(CLOCK_MONOTONIC);
    c->end_records = c->records;
    c->end_drains = c->drains;
    c->end_deadline_ns = c->end_begun_ns + end_budget_ns();
    if (u->stopping && c->end_deadline_ns > u->stop_deadline_ns)
        c->end_deadline_ns = u->stop_deadline_ns;
    /* Over its memory guardrail the service keeps nothing more: what the ring holds is
     * counted, not read. */
    if (flags & BK_FLAG_HIT_GUARDRAIL)
        c->end_deadline_ns = 0;
    c->has_work = true;
    c->throttled = false;
    atomic_fetch_add_explicit(&u->svc->ending_clients, 1, memory_order_relaxed);
    svc__mark_ending(u->svc, c->pid);
}

/* True when the end of @c is complete: nothing before its mark is left to read, or its
 * time is up. The time is renewed when the ring gave records since it was last renewed, or
 * was not read since (the other clients, or the bookkeeping queue, kept us): only a ring
 * read and found stuck ends early. Not when the service stops, nor for an end cut short
 * (a guardrail: deadline 0). */
static bool end_due(const struct svc_unwinder *u, struct svc_client *c, uint64_t now)
{
    if (svc__client_over(c) || ring_reached(c->ring, c->end_mark))
        return true;
    if (now < c->end_deadline_ns)
        return false;
    if (u->stopping || !c->end_deadline_ns || now - c->end_begun_ns >= END_MAX_NS ||
        (c->records == c->end_records && c->drains != c->end_drains))
        return true;
    c->end_records = c->records;
    c->end_drains = c->drains;
    c->end_deadline_ns = now + end_budget_ns();
    return false;
}

/* The frees a record left unread holds (ring_count_fn): its own (WIRE_FREE), a batch's
 * (WIRE_FREES: its addresses but the ones left out), the one a sampled allocation carries
 * (WIRE_HEAD_FREE_FIRST, clients that batch frees). A record never published may hold
 * one: 1. Read from the ring as it is: a bound, not a decode. */
static uint64_t frees_in(uint16_t type, const void *payload, size_t len, void *arg)
{
    const struct svc_client *c = arg;
    bool batching = (c->features & WIRE_FEATURE_FREE_BATCH) != 0;
    if (!payload)
        return type == WIRE_FREE || batching;
    if (type == WIRE_FREE)
        return 1;
    if (type == WIRE_FREES) {
        struct wire_frees f;
        uint64_t addrs[WIRE_MAX_FREES];
        if (wire_decode_frees(payload, len, &f, addrs) < 0)
            return 1;
        uint64_t n = 0;
        for (uint32_t i = 0; i < f.n; i++)
            n += addrs[i] != 0;
        return n;
    }
    struct wire_alloc_head h;
    if (!batching || len < sizeof(h))
        return 0;
    memcpy(&h, payload, sizeof(h));
    return (h.head_flags & WIRE_HEAD_FREE_FIRST) != 0;
}

/* Skips and counts what is left before the end mark, posts the end of the process with
 * its last statistics and frees the client. */
static void complete_end(struct svc_unwinder *u, struct svc_client *c)
{
    struct svc *s = u->svc;
    if (!svc__client_over(c) && !ring_reached(c->ring, c->end_mark)) {
        uint64_t n = 0, frees = 0;
        uint32_t types =
            1u << WIRE_FREE | 1u << WIRE_FREES | 1u << WIRE_ALLOC | 1u << WIRE_ALLOC_PCS;
        if (ring_discard(c->ring, c->end_mark, types, frees_in, c, &n, &frees) < 0)
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
    /* Frees lost (or left unread just now): every allocation still live may have been
     * freed, and the last dump must not rank them as unreleased. */
    svc__watch_lost_frees(u, c);
    if (c->pf_armed || c->frees_unread)
        (void)svc__post(u, c, SVC_MSG_POSSIBLY_FREED, sizeof(struct svc_msg));
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
    struct svc_msg_proc_end *m = svc__post(u, c, SVC_MSG_PROC_END, sizeof(*m));
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
    atomic_fetch_add_explicit(&s->unseen_call_slots, st.unseen_call_slots, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->reserve_failures, st.reserve_failures, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->records_unread, st.records_unread, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->records_lost_service, st.records_lost_service,
                              memory_order_relaxed);
    if (flags & BK_FLAG_CLIENT_ERROR)
        atomic_fetch_add_explicit(&s->timed_out, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->frees, c->frees, memory_order_relaxed);
    const char *why;
    (void)svc__client_messages(s, c, &why); /* the children's last words */
    uint64_t unfollowed = svc__forks_unfollowed(s, c);
    atomic_fetch_add_explicit(&s->forks_unfollowed, unfollowed, memory_order_relaxed);
    if (s->cfg.log_processes) {
        uint64_t lost =
            st.records_dropped + st.reserve_failures + st.records_unread + st.records_lost_service;
        char extra[192] = "";
        size_t n = 0;
        if (lost)
            n = (size_t)snprintf(extra, sizeof(extra), ", %llu lost (dropped or unread)",
                                 (unsigned long long)lost);
        if (unfollowed && n < sizeof(extra))
            snprintf(extra + n, sizeof(extra) - n,
                     "; %llu child%s forked from it not followed (%s)",
                     (unsigned long long)unfollowed, unfollowed == 1 ? "" : "ren",
                     svc__fork_hint(&s->cfg));
        hp_log_note("pid %d (%s): %s %s: %llu samples%s", c->pid, svc__client_name(c),
                    svc__client_over(c) || (flags & BK_FLAG_CONN_LOST) || c->end_abrupt ? "dropped"
                                                                                        : "ended",
                    c->end_why ? c->end_why : "", (unsigned long long)st.heap_samples, extra);
    }
    svc__batch_flush(&u->batcher);
    atomic_fetch_sub_explicit(&u->nclients, 1, memory_order_relaxed);
    /* Live first, then ending (release): see svc_get_status(). */
    atomic_fetch_sub_explicit(&s->live_clients, 1, memory_order_release);
    atomic_fetch_sub_explicit(&s->ending_clients, 1, memory_order_release);
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
    (void)svc__post_start(u, c); /* retried with its first record (svc__post()) */
    if (u->stopping)
        begin_end(u, c, 0, "profiling stopped");
}

static void adopt(struct svc_unwinder *u, struct svc_client *c)
{
    /* A new session of a pid we still serve: the process exec'd (or died and its number
     * was reused), so nothing writes into the old ring any more. The old session ends
     * first: its last records and its end reach the bookkeeping thread before the new
     * start (the main thread hands every session of a pid to the same thread). Its final
     * dump is marked disconnected, as every end of a process's session is (readers tell
     * an exec from a retitle by it). */
    for (struct svc_client *old = u->clients; old; old = old->next)
        if (old->pid == c->pid)
            begin_end(u, old, BK_FLAG_DISCONNECTED, "exec'd");
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
        hp_log_warn("pid %d (%s) changed its user or group ids and its client could not "
                    "take them; it is not profiled from there on",
                    c->pid, svc__client_name(c));
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
     * heapprofd sets it); not a loss of the profiler's. Without an exit no code of the
     * client's ran at the end: the frees its threads held in batches (at most one round
     * of its session thread, 200 ms, of them) went with it. */
    bool batches = (c->features & WIRE_FEATURE_FREE_BATCH) != 0;
    if (ring_client_exiting(c->ring))
        *ret_why = "(exited)";
    else if (svc__process_alive(c->pid))
        *ret_why = batches ? "(exec'd; frees of its last 200 ms may be missing)" : "(exec'd)";
    else {
        *ret_why = batches ? "(went away without exiting: killed, crashed or _exit; frees of "
                             "its last 200 ms may be missing)"
                           : "(went away without exiting: killed, crashed or _exit)";
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

void svc__sync_unwinders(struct svc *s)
{
    uint32_t asked[SVC_MAX_UNWINDERS];
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        asked[i] = ++u->sync_asked;
        pthread_mutex_unlock(&u->lock);
        svc__unwinder_wake(u);
    }
    uint64_t deadline = hp_clock_ns(CLOCK_MONOTONIC) + SVC_SYNC_WAIT_MS * 1000000ull;
    for (unsigned i = 0; i < s->n_unwinders; i++)
        while ((int32_t)(atomic_load_explicit(&s->unwinders[i].sync_done, memory_order_acquire) -
                         asked[i]) < 0 &&
               hp_clock_ns(CLOCK_MONOTONIC) < deadline) {
            struct timespec ts = {0, 500 * 1000};
            (void)nanosleep(&ts, NULL);
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
        if (svc__client_over(c)) {
            /* The service and the other clients carry on. */
            begin_end(u, c, BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST,
                      c->cut_off ? "(a thread kept a record unpublished while running)"
                                 : "(corrupt data in the shared buffer)");
        } else if ((ring_ids_changes(c->ring) != c->ids_seen ||
                    ring_forks_unfollowed(c->ring) != c->forks_seen) &&
                   !svc__client_messages(u->svc, c, &why)) {
            /* Its new user is not ours to profile: what came before is kept. (Checked
             * after a hang-up too: the message outlives the connection, and what the
             * process wrote after the change must be judged before it is read.) */
            begin_end(u, c, BK_FLAG_DISCONNECTED | BK_FLAG_CONN_LOST, why);
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
        if (c->ending && end_due(u, c, now)) {
            unlink_client(u, c);
            complete_end(u, c);
        }
    }
    adopt_deferred(u);
}

/* Frees the clients hold in batches (WIRE_FEATURE_FREE_BATCH) go into the dump: each
 * client is asked to record them, and all are given DUMP_FLUSH_WAIT_NS together to answer
 * (the client's session thread looks every few milliseconds). One that does not
 * (stopped, busy) is dumped as it is: its frees of the last moments (at most one round of
 * its session thread, 200 ms) come in the next dump. */
static void ask_flushes(struct svc_unwinder *u)
{
    unsigned waiting = 0;
    for (struct svc_client *c = u->clients; c; c = c->next) {
        c->flush_waiting = (c->features & WIRE_FEATURE_FREE_BATCH) && !c->ending;
        if (c->flush_waiting) {
            c->flush_ask = ring_ask_flush(c->ring);
            waiting++;
        }
    }
    uint64_t deadline = hp_clock_ns(CLOCK_MONOTONIC) + DUMP_FLUSH_WAIT_NS;
    while (waiting > 0 && hp_clock_ns(CLOCK_MONOTONIC) < deadline) {
        /* Meanwhile the rings are read as usual (a full one would make its writers drop
         * samples); with nothing to read, a short sleep. */
        uint64_t read = 0;
        for (struct svc_client *c = u->clients; c; c = c->next) {
            uint64_t before = c->records;
            if (!c->ending)
                (void)svc__drain_upto(u, c, DRAIN_BUDGET, NULL);
            read += c->records - before;
        }
        if (read == 0) {
            struct timespec ts = {0, 200 * 1000};
            (void)nanosleep(&ts, NULL);
        }
        for (struct svc_client *c = u->clients; c; c = c->next)
            if (c->flush_waiting && ring_flush_answered(c->ring, c->flush_ask)) {
                c->flush_waiting = false;
                waiting--;
            }
    }
}

/* Asks for the frees in batches, then reads each ring up to where it ended then (an
 * ending one: up to its end). */
static void drain_to_now(struct svc_unwinder *u)
{
    ask_flushes(u);
    /* Only what was written before the request: a process that keeps its ring full would
     * otherwise hold the dump (and every other client) back for as long as it can refill
     * the ring faster than we read it. */
    for (struct svc_client *c = u->clients; c; c = c->next) {
        uint64_t mark = c->ending ? c->end_mark : ring_mark(c->ring);
        for (unsigned i = 0;
             i < DUMP_DRAIN_ROUNDS && svc__drain_upto(u, c, DRAIN_BUDGET, &mark) == SVC_DRAIN_MORE;
             i++)
            ;
    }
}

/* Reads each ring up to when the dump was asked for, then posts every client's
 * statistics and the barrier that lets the dump go. */
static void drain_for_dump(struct svc_unwinder *u, uint32_t dump_requests)
{
    drain_to_now(u);
    /* Each process is named in each dump by its title at the time. */
    for (struct svc_client *c = u->clients; c; c = c->next) {
        svc__client_retitle(u, c);
        post_stats(u, c);
    }
    struct svc_msg_dump_barrier *m =
        svc__batch_add(&u->batcher, SVC_MSG_DUMP_BARRIER, 0, sizeof(*m));
    if (m) {
        m->unwinder = u->index;
        m->n = dump_requests;
    }
}

/* ---- The thread's loop ------------------------------------------------------------- *
 *
 * One pass:
 *
 *     take_requests()      new clients, hang-ups, stop, detach, dumps (under u->lock)
 *     begin_ends()         sessions over or asked to end begin their end
 *     drain_clients()      a budget of records per client; each one's next step
 *     answer_dumps()       or put them back until the queue has room
 *     complete_ends()      ends whose records are read (or whose time is up)
 *     sleep_until_work()   unless a ring may hold more
 *     look_again()         rings polled every POLL_MS; every ring and socket once a second
 *
 * Invariant, after each pass: every client is draining (has_work: read next pass),
 * polling (polling: read again within POLL_MS) or announced idle (its ring's reader is
 * idle, so the next record a writer publishes wakes us through the ring's word). A client
 * in none of the three would hold its records until the once-a-second scan. after_drain()
 * is the one place that picks among them. */

/* What the owner of the thread asked for that the rest of the pass acts on. */
struct requests {
    bool detach; /* end every client, with detach_flags */
    uint32_t detach_flags;
    uint32_t dump_requests;
    uint32_t sync_asked;
};

/* Stopping (svc_finish()): every client ends by the stop deadline, the ones already
 * ending included. */
static void begin_stop(struct svc_unwinder *u)
{
    u->stopping = true;
    u->stop_deadline_ns = hp_clock_ns(CLOCK_MONOTONIC) + STOP_BUDGET_NS;
    for (struct svc_client *c = u->clients; c; c = c->next)
        if (c->ending && c->end_deadline_ns > u->stop_deadline_ns)
            c->end_deadline_ns = u->stop_deadline_ns;
}

/* Takes what was asked of the thread since the last pass, under its lock, and acts on what
 * concerns the clients themselves: the stop, new clients (adopted), hang-ups (marked). The
 * detach and the dump requests go to @ret for the steps that follow. */
static void take_requests(struct svc_unwinder *u, struct requests *ret)
{
    pthread_mutex_lock(&u->lock);
    struct svc_client *in = u->incoming;
    u->incoming = NULL;
    bool stop = u->stop;
    ret->detach = u->detach;
    ret->detach_flags = u->detach_flags;
    ret->dump_requests = u->dump_requests;
    u->dump_requests = 0;
    ret->sync_asked = u->sync_asked;
    u->detach = false;
    u->detach_flags = 0;
    uint64_t *hangups = u->hangups;
    size_t n_hangups = u->n_hangups;
    u->hangups = NULL;
    u->n_hangups = u->cap_hangups = 0;
    pthread_mutex_unlock(&u->lock);
    if (stop && !u->stopping)
        begin_stop(u);
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
}

/* What a pass over the rings found. */
struct pass {
    bool busy;       /* a ring may hold more: no sleep before the next pass */
    bool polling;    /* a ring is polled: sleep at most POLL_MS */
    bool queue_full; /* the queue to the bookkeeping thread is full: no more draining */
};

/* @c's ring stayed empty for QUIET_POLLS polls: its reader announces that it sleeps (from
 * now on writers poke), then looks once more, since a record published before the
 * announcement poked nobody. Returns true when the client is left asleep. */
static bool go_idle(struct svc_unwinder *u, struct svc_client *c, struct pass *p)
{
    c->polling = false;
    ring_set_reader_idle(c->ring, true);
    /* Re-check after announcing idleness so no wakeup is lost. */
    enum svc_drain_result dr = svc__drain_upto(u, c, DRAIN_BUDGET, NULL);
    c->has_work = dr == SVC_DRAIN_MORE;
    if (dr == SVC_DRAIN_DONE)
        return true;
    ring_set_reader_idle(c->ring, false);
    p->busy |= c->has_work;
    c->polling = p->polling = dr == SVC_DRAIN_HELD;
    return false;
}

/* Picks @c's next step after a drain that left @dr (@before: c->records before it):
 * draining on, polling, or asleep until a writer pokes. Returns true when asleep. */
static bool after_drain(struct svc_unwinder *u, struct svc_client *c, enum svc_drain_result dr,
                        uint64_t before, struct pass *p)
{
    switch (dr) {
    case SVC_DRAIN_MORE:
        /* The budget ran out: the others have their turn, then this one again. */
        p->busy = true;
        c->polling = false;
        return false;
    case SVC_DRAIN_HELD:
        /* A reread held back, or the queue filled up: look again soon. */
        p->queue_full = svc__bkq_full(u->batcher.q);
        c->has_work = false;
        c->polling = p->polling = true;
        return false;
    case SVC_DRAIN_DONE:
        break;
    }
    c->has_work = false;
    if (c->ending) {
        /* At the mark it ends below; else a record is still being written: look again
         * soon, until the deadline. */
        c->polling = p->polling = true;
        return false;
    }
    if (c->records != before)
        c->quiet_polls = 0;
    else
        c->quiet_polls++;
    if (c->quiet_polls < QUIET_POLLS) {
        /* Records came in lately: look again in POLL_MS. */
        if (!c->polling)
            ring_set_reader_polling(c->ring, 0);
        c->polling = true;
        p->polling = true;
        return false;
    }
    return go_idle(u, c, p);
}

/* Drains the rings that have work, a bounded amount per client; none while the queue to
 * the bookkeeping thread is full (their rings fill up instead, and their writers count
 * what they drop). */
static struct pass drain_clients(struct svc_unwinder *u)
{
    struct pass p = {.queue_full = svc__bkq_full(u->batcher.q)};
    for (struct svc_client *c = u->clients; c && !p.queue_full; c = c->next) {
        if (!c->has_work) {
            p.polling |= c->polling;
            continue;
        }
        uint64_t before = c->records;
        enum svc_drain_result dr =
            svc__drain_upto(u, c, DRAIN_BUDGET, c->ending ? &c->end_mark : NULL);
        bool asleep = after_drain(u, c, dr, before, &p);
        assert(c->has_work || c->polling || asleep); /* the loop's invariant, above */
        (void)asleep;
    }
    return p;
}

/* Answers the dump requests taken this pass; while the queue is full they wait for room
 * (put back under the lock), and the requests that come meanwhile make one dump: the
 * bookkeeping thread is behind anyway. */
static void answer_dumps(struct svc_unwinder *u, uint32_t dump_requests)
{
    if (dump_requests > 0 && svc__bkq_full(u->batcher.q)) {
        pthread_mutex_lock(&u->lock);
        u->dump_requests += dump_requests;
        pthread_mutex_unlock(&u->lock);
    } else if (dump_requests > 0) {
        drain_for_dump(u, dump_requests);
    }
}

/* Milliseconds until look_again() has something to do, at most @ms: the first client's
 * title to read again, or the scan of every ring a second after @last_scan_ns (which
 * finds a record a stopped writer holds: the stall timeout counts from the scans). */
static unsigned until_look_again_ms(const struct svc_unwinder *u, uint64_t last_scan_ns,
                                    unsigned ms)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t due = last_scan_ns + 1000000000u;
    for (const struct svc_client *c = u->clients; c; c = c->next)
        if (c->started && !c->ending && c->retitle_due_ns < due)
            due = c->retitle_due_ns;
    uint64_t left = due > now ? due - now : 0;
    if (left / 1000000u < ms)
        ms = (unsigned)(left / 1000000u) + 1; /* not before it */
    return ms;
}

/* Sleeps unless a ring may hold more: at most POLL_MS while a ring is polled, the thread
 * stops or the queue is full (woken when the bookkeeping thread made room,
 * svc_bkq.on_room), else until look_again() is due, up to a second. @wake_seen: the wake
 * word before the pass took its requests; @last_scan_ns: look_again()'s. */
static void sleep_until_work(struct svc_unwinder *u, uint32_t wake_seen, const struct pass *p,
                             uint64_t last_scan_ns)
{
    if (p->queue_full)
        wait_for_work(u, wake_seen, POLL_MS);
    else if (!p->busy)
        wait_for_work(
            u, wake_seen,
            until_look_again_ms(u, last_scan_ns, p->polling || u->stopping ? POLL_MS : 1000));
}

/* Gives the polled rings work every POLL_MS, even when writers of other rings keep waking
 * us up; and every second every ring, so a record left unpublished by a stalled or dead
 * writer is found, and every socket, for a hang-up the main thread could not tell us
 * about. @last_poll_ns, @last_scan_ns: CLOCK_MONOTONIC_COARSE, the thread's. */
static void look_again(struct svc_unwinder *u, bool polling, uint64_t *last_poll_ns,
                       uint64_t *last_scan_ns)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    if (polling && now - *last_poll_ns >= (uint64_t)POLL_MS * 1000000u) {
        *last_poll_ns = now;
        for (struct svc_client *c = u->clients; c; c = c->next)
            c->has_work |= c->polling;
    }
    /* Titles set after the start (a forked child naming its role) reach the log and the
     * final dump even without a dump in between: read every RETITLE_EARLY_NS in a
     * client's first RETITLE_EARLY_FOR_NS, then every second. */
    for (struct svc_client *c = u->clients; c; c = c->next) {
        if (!c->started || now < c->retitle_due_ns)
            continue;
        if (!c->served_since_ns)
            c->served_since_ns = now;
        svc__client_retitle(u, c);
        c->retitle_due_ns =
            now +
            (now - c->served_since_ns < RETITLE_EARLY_FOR_NS ? RETITLE_EARLY_NS : 1000000000u);
    }
    if (now - *last_scan_ns >= 1000000000u) {
        *last_scan_ns = now;
        for (struct svc_client *c = u->clients; c; c = c->next)
            c->has_work = true;
        poll_hangups(u);
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
        struct requests rq;
        take_requests(u, &rq);
        /* Sessions over (corrupt, cut off, hung up, ended by the client) or asked to end
         * (detach, stop) begin their end: read below like the others, with a deadline. */
        begin_ends(u, rq.detach, rq.detach_flags);
        struct pass p = drain_clients(u);
        answer_dumps(u, rq.dump_requests);
        bool sync = rq.sync_asked != u->sync_seen;
        if (sync)
            drain_to_now(u);
        svc__batch_flush(&u->batcher);
        if (sync) {
            u->sync_seen = rq.sync_asked;
            /* Release: pairs with svc__sync_unwinders(), which posts after. */
            atomic_store_explicit(&u->sync_done, rq.sync_asked, memory_order_release);
        }
        complete_ends(u);
        if (u->stopping && !u->clients && !u->deferred)
            break;
        sleep_until_work(u, wake_seen, &p, last_scan_ns);
        look_again(u, p.polling, &last_poll_ns, &last_scan_ns);
    }
    svc__batch_post(&u->batcher);
    return NULL;
}
