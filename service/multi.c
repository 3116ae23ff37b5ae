/* service/multi.c: several profiling sessions at once behind the daemon's one socket, as
 * `heapprofd --producer` runs them (one per data source instance of Perfetto's tracing
 * service). Each session is a svc_t of its own (threads, bookkeeping, output); this file
 * owns the daemon socket and routes every connection to one session:
 *
 *     client --connect--> daemon socket --SO_PEERCRED pid, /proc/PID/cmdline--+
 *                                                                              |
 *       the session that signalled that pid, else the oldest whose targets match
 *       (the others record rejected_concurrent for it); none: "not profiled"
 *
 * as Perfetto's heapprofd does in central mode: a process is profiled by one session at
 * a time. A session ends on a thread of its own (final dumps may take a while and write
 * into a shared memory buffer that only the owner thread's commits free), which calls
 * back when the session's last packet is written.
 *
 * Main thread only, but for the end callbacks (see svc_multi_stop()).
 */
#include "service/multi.h"

#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/containers.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "shmem_ring/wire.h"

#define MAX_CMDLINE 4096
/* How long a signalled process has to connect before its route is forgotten. */
#define ATTACH_ROUTE_MS 5000
#define MAX_REJECTED 256

struct multi_session {
    uint64_t id;
    svc_t *s;
    struct svc_config cfg; /* owned (process_cmdline strings) */
    uint64_t next_dump_ns, next_guard_ns;
    pid_t rejected[MAX_REJECTED]; /* pids already recorded as rejected_concurrent */
    size_t n_rejected;
    /* Ending: the stop thread owns s from svc_multi_stop() on. */
    bool stopping, has_thread;
    pthread_t thread;
    _Atomic bool thread_done;
    void (*done)(void *ctx, uint64_t id);
    void *done_ctx;
};

/* A pid signalled for a session, until it connects. */
struct attach_route {
    pid_t pid;
    uint64_t session;
    uint64_t until_ns;
};

struct svc_multi {
    int listen_fd;
    char *path;
    struct multi_session **sessions; /* in start order */
    size_t n_sessions, cap_sessions;
    struct attach_route *routes;
    size_t n_routes, cap_routes;
};

static int listen_on(const char *path, int *ret_fd)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path))
        return -ENAMETOOLONG;
    strcpy(a.sun_path, path);
    HP_CLEANUP_CLOSE int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    /* Never steal the socket of a live service; a stale file goes. */
    HP_CLEANUP_CLOSE int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof(a)) == 0)
        return -EADDRINUSE;
    (void)unlink(path);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 128) < 0)
        return -errno;
    *ret_fd = HP_TAKE_FD(fd);
    return 0;
}

int svc_multi_new(const char *socket_path, svc_multi_t **ret)
{
    svc_multi_t *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->listen_fd = -1;
    m->path = strdup(socket_path);
    int r = m->path ? listen_on(socket_path, &m->listen_fd) : -ENOMEM;
    if (r < 0) {
        free(m->path);
        free(m);
        return r;
    }
    *ret = m;
    return 0;
}

static struct multi_session *find(svc_multi_t *m, uint64_t id)
{
    for (size_t i = 0; i < m->n_sessions; i++)
        if (m->sessions[i]->id == id)
            return m->sessions[i];
    return NULL;
}

/* True when @pid is profiled by a live session other than @except. */
static struct multi_session *profiled_by(svc_multi_t *m, pid_t pid,
                                         const struct multi_session *except)
{
    for (size_t i = 0; i < m->n_sessions; i++) {
        struct multi_session *ms = m->sessions[i];
        if (ms != except && !ms->stopping && svc_client_seen(ms->s, pid) &&
            !svc_client_done(ms->s, pid))
            return ms;
    }
    return NULL;
}

static void reject(struct multi_session *ms, pid_t pid)
{
    for (size_t i = 0; i < ms->n_rejected; i++)
        if (ms->rejected[i] == pid)
            return;
    if (ms->n_rejected < MAX_REJECTED)
        ms->rejected[ms->n_rejected++] = pid;
    hp_log_info("pid %d: profiled by another session; rejected in session %llu", (int)pid,
                (unsigned long long)ms->id);
    if (svc_reject_concurrent(ms->s, pid) < 0)
        hp_log_warn("pid %d: cannot record rejected_concurrent", (int)pid);
}

struct scan_ctx {
    svc_multi_t *m;
    struct multi_session *ms;
};

static void route_add(svc_multi_t *m, pid_t pid, uint64_t session)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (size_t i = 0; i < m->n_routes;) {
        if (m->routes[i].until_ns < now || m->routes[i].pid == pid)
            m->routes[i] = m->routes[--m->n_routes];
        else
            i++;
    }
    if (hp_grow((void **)&m->routes, &m->cap_routes, m->n_routes + 1, sizeof(*m->routes)) < 0)
        return; /* routed by its targets alone */
    m->routes[m->n_routes++] =
        (struct attach_route){pid, session, now + (uint64_t)ATTACH_ROUTE_MS * 1000000u};
}

static void signal_running(void *ctx, const struct svc_proc *p)
{
    struct scan_ctx *c = ctx;
    if (profiled_by(c->m, p->pid, c->ms)) {
        reject(c->ms, p->pid);
        return;
    }
    route_add(c->m, p->pid, c->ms->id);
    char why[768];
    why[0] = '\0';
    int r = svc_proc_attach_daemon(c->ms->s, p, c->ms->cfg.allow_other_users, why, sizeof(why));
    if (r < 0)
        hp_log_warn("pid %d (%s) %s; not attached", (int)p->pid, p->name,
                    why[0] ? why : strerror(-r));
    else
        hp_log_info("pid %d (%s): woken to attach for session %llu", (int)p->pid, p->name,
                    (unsigned long long)c->ms->id);
}

int svc_multi_start(svc_multi_t *m, uint64_t id, struct svc_config *cfg, const struct bk_sink *sink)
{
    if (find(m, id))
        return -EEXIST;
    if (hp_grow((void **)&m->sessions, &m->cap_sessions, m->n_sessions + 1, sizeof(*m->sessions)) <
        0)
        return -ENOMEM;
    struct multi_session *ms = calloc(1, sizeof(*ms));
    if (!ms)
        return -ENOMEM;
    ms->id = id;
    ms->cfg = *cfg;
    /* The session's clients come through the daemon socket: its own socket is private. */
    ms->cfg.socket_path = ms->cfg.socket_dir = NULL;
    int r = svc_new_sink(&ms->cfg, sink, &ms->s);
    if (r < 0) {
        free(ms);
        return r;
    }
    /* Taken: the strings now belong to the session. */
    cfg->n_process_cmdline = 0;
    atomic_init(&ms->thread_done, false);
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    ms->next_dump_ns =
        ms->cfg.dump_interval_ms ? now + (uint64_t)ms->cfg.dump_phase_ms * 1000000u : UINT64_MAX;
    ms->next_guard_ns = now;
    m->sessions[m->n_sessions++] = ms;
    if (!ms->cfg.no_running)
        svc_proc_scan_targets(&ms->cfg, signal_running, &(struct scan_ctx){m, ms});
    return 0;
}

static void *stop_main(void *arg)
{
    struct multi_session *ms = arg;
    struct svc_summary sum;
    int r = svc_finish(ms->s, &sum);
    if (r < 0)
        hp_log_warn("session %llu: writing its trace failed: %s", (unsigned long long)ms->id,
                    strerror(-r));
    hp_log_info("session %llu ended: %llu processes, %llu samples, %llu dropped",
                (unsigned long long)ms->id, (unsigned long long)sum.processes,
                (unsigned long long)sum.samples, (unsigned long long)sum.records_dropped);
    ms->s = svc_free(ms->s);
    if (ms->done)
        ms->done(ms->done_ctx, ms->id);
    atomic_store_explicit(&ms->thread_done, true, memory_order_release);
    return NULL;
}

int svc_multi_stop(svc_multi_t *m, uint64_t id, void (*done)(void *ctx, uint64_t id), void *ctx)
{
    struct multi_session *ms = find(m, id);
    if (!ms || ms->stopping)
        return -ENOENT;
    ms->stopping = true;
    ms->done = done;
    ms->done_ctx = ctx;
    ms->has_thread = pthread_create(&ms->thread, NULL, stop_main, ms) == 0;
    if (!ms->has_thread)
        stop_main(ms); /* no thread: end it here, the owner waits (rare) */
    return 0;
}

/* Forgets the sessions whose stop thread has finished. */
static void reap(svc_multi_t *m, bool wait)
{
    for (size_t i = 0; i < m->n_sessions;) {
        struct multi_session *ms = m->sessions[i];
        if (!ms->stopping ||
            (!wait && !atomic_load_explicit(&ms->thread_done, memory_order_acquire))) {
            i++;
            continue;
        }
        if (ms->has_thread)
            pthread_join(ms->thread, NULL);
        svc_config_done(&ms->cfg);
        free(ms);
        memmove(&m->sessions[i], &m->sessions[i + 1],
                (m->n_sessions - i - 1) * sizeof(*m->sessions));
        m->n_sessions--;
    }
}

/* Which session gets the connection of @pid: the one that signalled it, else the oldest
 * whose targets match; every other live session that matches records the pid as
 * rejected. NULL: none. */
static struct multi_session *route(svc_multi_t *m, pid_t pid)
{
    char path[64], cmd[MAX_CMDLINE];
    size_t len = 0;
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n;
        while (len < sizeof(cmd) && (n = read(fd, cmd + len, sizeof(cmd) - len)) > 0)
            len += (size_t)n;
        (void)close(fd);
    }
    char comm_buf[SVC_COMM_LEN];
    const char *comm = svc_proc_comm(pid, comm_buf, sizeof(comm_buf));
    struct multi_session *to = profiled_by(m, pid, NULL);
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (size_t i = 0; i < m->n_routes && !to; i++) {
        if (m->routes[i].pid == pid && m->routes[i].until_ns >= now) {
            struct multi_session *ms = find(m, m->routes[i].session);
            if (ms && !ms->stopping)
                to = ms;
            m->routes[i] = m->routes[--m->n_routes];
        }
    }
    for (size_t i = 0; i < m->n_sessions; i++) {
        struct multi_session *ms = m->sessions[i];
        if (ms->stopping || !svc_config_matches(&ms->cfg, pid, comm, cmd, len))
            continue;
        if (!to)
            to = ms;
        else if (ms != to)
            reject(ms, pid);
    }
    return to;
}

static int dump_all_sessions(void *ctx)
{
    svc_multi_dump_now(ctx);
    return 0;
}

static void accept_all(svc_multi_t *m)
{
    for (;;) {
        int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        /* `heapprof dump` asks on this socket too: its request is sent right after the
         * connect, as a client's hello is; wait for it briefly before routing. */
        struct pollfd pf = {fd, POLLIN, 0};
        (void)poll(&pf, 1, 50);
        if (svc__is_control(fd)) {
            svc__control_answer(fd, dump_all_sessions, m);
            continue;
        }
        struct ucred cr;
        socklen_t cl = sizeof(cr);
        struct multi_session *ms = NULL;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
            ms = route(m, cr.pid);
        if (ms) {
            svc_adopt(ms->s, fd);
            continue;
        }
        /* No session wants it: the clear answer, and it stays passthrough. */
        struct wire_client_config no = {.magic = WIRE_CONFIG_MAGIC,
                                        .status = WIRE_STATUS_NOT_PROFILED};
        struct timeval tv = {0, 100000};
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        (void)!hp_send_fds(fd, &no, sizeof(no), NULL, 0); /* best effort: dropped anyway */
        (void)close(fd);
    }
}

size_t svc_multi_pollfds(svc_multi_t *m, struct pollfd *fds, size_t max)
{
    size_t n = 0;
    if (n < max)
        fds[n++] = (struct pollfd){m->listen_fd, POLLIN, 0};
    for (size_t i = 0; i < m->n_sessions && n < max; i++)
        if (!m->sessions[i]->stopping)
            fds[n++] = (struct pollfd){svc_fd(m->sessions[i]->s), POLLIN, 0};
    return n;
}

int svc_multi_timeout_ms(svc_multi_t *m)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC), next = UINT64_MAX;
    for (size_t i = 0; i < m->n_sessions; i++) {
        const struct multi_session *ms = m->sessions[i];
        if (ms->stopping) {
            next = now + 10000000u; /* reap it soon */
            continue;
        }
        next = HP_MIN(next, ms->next_dump_ns);
        next = HP_MIN(next, ms->next_guard_ns);
    }
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)HP_MIN((next - now + 999999) / 1000000, (uint64_t)INT32_MAX);
}

void svc_multi_dispatch(svc_multi_t *m)
{
    accept_all(m);
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (size_t i = 0; i < m->n_sessions; i++) {
        struct multi_session *ms = m->sessions[i];
        if (ms->stopping)
            continue;
        int r = svc_poll(ms->s, 0);
        if (r < 0)
            hp_log_warn("session %llu: accepting clients: %s", (unsigned long long)ms->id,
                        strerror(-r));
        if (now >= ms->next_dump_ns) {
            if (svc_dump_now(ms->s) < 0)
                hp_log_warn("session %llu: cannot schedule a dump", (unsigned long long)ms->id);
            ms->next_dump_ns += (uint64_t)ms->cfg.dump_interval_ms * 1000000u;
            if (ms->next_dump_ns < now)
                ms->next_dump_ns = now + (uint64_t)ms->cfg.dump_interval_ms * 1000000u;
        }
        if (now >= ms->next_guard_ns) {
            ms->next_guard_ns = now + 100000000u;
            (void)svc_check_guardrails(ms->s);
        }
    }
    reap(m, false);
}

void svc_multi_dump_now(svc_multi_t *m)
{
    for (size_t i = 0; i < m->n_sessions; i++)
        if (!m->sessions[i]->stopping && svc_dump_now(m->sessions[i]->s) < 0)
            hp_log_warn("session %llu: cannot schedule a dump",
                        (unsigned long long)m->sessions[i]->id);
}

size_t svc_multi_sessions(const svc_multi_t *m)
{
    return m->n_sessions;
}

svc_multi_t *svc_multi_free(svc_multi_t *m)
{
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->n_sessions; i++)
        if (!m->sessions[i]->stopping)
            (void)svc_multi_stop(m, m->sessions[i]->id, NULL, NULL);
    reap(m, true);
    if (m->listen_fd >= 0)
        (void)close(m->listen_fd);
    (void)unlink(m->path);
    free(m->path);
    free(m->sessions);
    free(m->routes);
    free(m);
    return NULL;
}
