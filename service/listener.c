/* service/listener.c: the listening socket and the connections whose hello has not
 * fully arrived; complete hellos go to the handshake (service/handshake.c) and the
 * clients it builds to an unwinder thread. Main thread only. */
#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "common/paths.h"
#include "service/svc.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

static int make_dir(const struct svc_config *cfg, char **ret)
{
    char tmpl[PATH_MAX];
    if (cfg->socket_dir) {
        if (mkdir(cfg->socket_dir, 0700) < 0 && errno != EEXIST)
            return -errno;
        /* One that was there already must be ours alone, as a runtime directory must: a
         * directory another user prepared would let them replace our socket. */
        struct stat st;
        if (lstat(cfg->socket_dir, &st) < 0)
            return -errno;
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
            return -EPERM;
        snprintf(tmpl, sizeof(tmpl), "%s", cfg->socket_dir);
    } else {
        int r = hp_private_dir_new(tmpl, sizeof(tmpl));
        if (r < 0)
            return r;
    }
    char *d = strdup(tmpl);
    if (!d)
        return -ENOMEM;
    *ret = d;
    return 0;
}

/* With @for_everyone the socket file is made mode 0666 (connect(2) needs write
 * permission on it): bound under umask 0111, so no chmod of a path another user could
 * swap in between. The umask is the process's: this runs before any thread of ours. */
/* An abstract socket (@name, HP_ABSTRACT_PREFIX): no file, reachable from every user's
 * processes in our network namespace, who are checked at the handshake like any client
 * (heapprof attach --allow-other-users: the targets of another user cannot reach a
 * socket in our runtime directory). */
static int listen_abstract(const char *name, int *ret_fd)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(name);
    if (len >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    memcpy(addr.sun_path + 1, name + 1, len - 1); /* sun_path[0] stays 0 */
    HP_CLEANUP_CLOSE int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&addr,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0 ||
        listen(fd, 128) < 0)
        return -errno;
    *ret_fd = HP_TAKE_FD(fd);
    return 0;
}

static int listen_on(const char *path, bool for_everyone, int *ret_fd)
{
    if (path[0] == HP_ABSTRACT_PREFIX)
        return listen_abstract(path, ret_fd);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    strcpy(addr.sun_path, path);
    HP_CLEANUP_CLOSE int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    /* A live service answers on an existing socket: never steal it. A stale file is
     * removed. */
    HP_CLEANUP_CLOSE int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0)
        return -EADDRINUSE;
    /* Bound under a temporary name and renamed into place once listening, so a client
     * never finds the socket file before connections are accepted. */
    struct sockaddr_un tmp = {.sun_family = AF_UNIX};
    int n = snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp.sun_path))
        tmp = addr; /* no room for a temporary name: bind in place */
    (void)unlink(path);
    (void)unlink(tmp.sun_path);
    mode_t old_mask = for_everyone ? umask(0111) : 0;
    int b = bind(fd, (struct sockaddr *)&tmp, sizeof(tmp));
    int bind_errno = errno;
    if (for_everyone)
        (void)umask(old_mask);
    if (b < 0)
        return -bind_errno;
    if (listen(fd, 128) < 0 || (strcmp(tmp.sun_path, path) && rename(tmp.sun_path, path) < 0)) {
        int r = -errno;
        (void)unlink(tmp.sun_path);
        return r;
    }
    *ret_fd = HP_TAKE_FD(fd);
    return 0;
}

/* --allow-other-users: says when a directory above the socket keeps other users out
 * (connect(2) needs search permission on each). */
static void warn_unreachable(const char *sock_path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", sock_path);
    for (char *slash = strrchr(dir, '/'); slash; slash = strrchr(dir, '/')) {
        if (slash == dir)
            slash[1] = '\0'; /* "/" itself */
        else
            *slash = '\0';
        struct stat st;
        if (stat(dir, &st) == 0 && !(st.st_mode & S_IXOTH))
            hp_log_warn("--allow-other-users: %s (mode %04o) is not searchable by other users: "
                        "their processes cannot reach %s",
                        dir, (unsigned)(st.st_mode & 07777), sock_path);
        if (slash == dir)
            break;
    }
}

int svc__listener_open(struct svc *s)
{
    int r;
    r = s->cfg.socket_path ? 0 : make_dir(&s->cfg, &s->dir);
    if (r < 0) {
        hp_log_error("cannot create the socket directory: %s", strerror(-r));
        return r;
    }
    if (s->cfg.socket_path) {
        s->sock_path = strdup(s->cfg.socket_path);
        if (!s->sock_path)
            return -ENOMEM;
    } else if (asprintf(&s->sock_path, "%s/heapprofd.sock", s->dir) < 0) {
        s->sock_path = NULL;
        return -ENOMEM;
    }
    r = listen_on(s->sock_path, s->cfg.allow_other_users, &s->listen_fd);
    if (r == 0 && s->cfg.allow_other_users && s->sock_path[0] != HP_ABSTRACT_PREFIX)
        warn_unreachable(s->sock_path);
    if (r < 0) {
        /* -EADDRINUSE is the caller's to tell: it knows the socket it asked for. */
        if (r != -EADDRINUSE)
            hp_log_error("cannot listen on %s: %s", s->sock_path, strerror(-r));
        return r;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0)
        return -errno;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint32_t)s->listen_fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) < 0)
        return -errno;
    return 0;
}

/* The unwinder of @pid's route, added (as @fallback) when missing; @fallback when out
 * of memory. */
static unsigned route_get(struct svc *s, pid_t pid, unsigned fallback)
{
    uint64_t *u;
    int r = hp_map_put(&s->routes, (uint64_t)(uint32_t)pid, (void **)&u);
    if (r < 0)
        return fallback;
    if (r == 1)
        *u = fallback;
    return (unsigned)*u;
}

static void hand_over(struct svc *s, struct svc_client *c)
{
    struct svc_unwinder *best = &s->unwinders[s->next_unwinder++ % s->n_unwinders];
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        if (atomic_load_explicit(&u->nclients, memory_order_relaxed) <
            atomic_load_explicit(&best->nclients, memory_order_relaxed))
            best = u;
    }
    /* A pid seen before (it exec'd, or its number was reused): the thread that had its
     * last session, which may still be live there; that thread ends it before starting
     * this one (svc__unwinder_main), so the bookkeeping thread sees them in order. */
    best = &s->unwinders[route_get(s, c->pid, (unsigned)(best - s->unwinders))];
    atomic_fetch_add_explicit(&best->nclients, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->live_clients, 1, memory_order_relaxed);
    c->id = SVC_CLIENT_ID(best - s->unwinders, ++s->next_client_seq);
    /* Its hang-up is ours to see (the unwinder sleeps on futex words, not on sockets).
     * One-shot: once reported the entry stays off, and it goes away with the socket,
     * which the unwinder thread closes. Failing that, the unwinder polls once a second. */
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT,
                             .data.u64 = SVC_EV_CLIENT | c->id};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, c->sock, &ev) < 0)
        hp_log_debug("pid %d: hang-ups polled: %s", (int)c->pid, strerror(errno));
    pthread_mutex_lock(&best->lock);
    c->next = best->incoming;
    best->incoming = c;
    pthread_mutex_unlock(&best->lock);
    svc__unwinder_wake(best);
}

/* Runs the handshake on @fd (taken) and hands the client it built to an unwinder
 * thread. */
static void admit(struct svc *s, int fd)
{
    if (svc__is_control(fd)) {
        svc__control(s, fd);
        return;
    }
    struct svc_client *c = svc__handshake(s, fd);
    if (!c)
        return;
    svc__mark_seen(s, c->pid);
    hand_over(s, c);
}

int svc_watch_fd(svc_t *s, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint32_t)fd};
    return epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

void svc_unwatch_fd(svc_t *s, int fd)
{
    (void)epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
}

static uint64_t now_ms(void)
{
    return hp_clock_ns(CLOCK_MONOTONIC) / 1000000;
}

/* Bytes queued on @fd, or -1 on error. */
static int queued_bytes(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) < 0 ? -1 : n;
}

static void pending_remove(struct svc *s, unsigned i)
{
    (void)epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->pending[i].fd, NULL);
    s->pending[i] = s->pending[--s->n_pending];
}

static void pending_drop(struct svc *s, unsigned i, const char *why)
{
    int fd = s->pending[i].fd;
    pending_remove(s, i);
    hp_log_warn("handshake: no valid hello from a client: %s", why);
    atomic_fetch_add_explicit(&s->rejected, 1, memory_order_relaxed);
    (void)close(fd);
}

/* A freshly accepted connection: handshake at once when its whole hello is queued, else
 * wait for it without blocking the other clients (a client that stalls mid-handshake
 * must not hold up the ones behind it). Takes ownership of @fd. */
static void accepted(struct svc *s, int fd)
{
    if (queued_bytes(fd) >= (int)sizeof(struct wire_hello)) {
        admit(s, fd);
        return;
    }
    if (s->n_pending == SVC_MAX_PENDING_HELLOS) {
        unsigned oldest = 0;
        for (unsigned i = 1; i < s->n_pending; i++)
            if (s->pending[i].deadline_ms < s->pending[oldest].deadline_ms)
                oldest = i;
        pending_drop(s, oldest, "too many connections waiting");
    }
    /* Edge-triggered: a partial hello left in the socket must not wake us in a loop. */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = (uint32_t)fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        admit(s, fd); /* cannot wait: fall back to the blocking read */
        return;
    }
    s->pending[s->n_pending++] =
        (struct svc_pending_hello){.fd = fd, .deadline_ms = now_ms() + SVC_HANDSHAKE_TIMEOUT_MS};
}

void svc_adopt(svc_t *s, int fd)
{
    accepted(s, fd);
}

static void pending_event(struct svc *s, int fd, uint32_t events)
{
    unsigned i = 0;
    while (i < s->n_pending && s->pending[i].fd != fd)
        i++;
    if (i == s->n_pending)
        return;
    int q = queued_bytes(fd);
    if (q >= (int)sizeof(struct wire_hello)) {
        pending_remove(s, i);
        admit(s, fd);
    } else if (q < 0 || (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
        pending_drop(s, i, "connection closed mid-hello");
    }
}

static void pending_expire(struct svc *s)
{
    uint64_t now = now_ms();
    for (unsigned i = 0; i < s->n_pending;) {
        if (s->pending[i].deadline_ms <= now)
            pending_drop(s, i, "timed out");
        else
            i++;
    }
}

int svc_poll(svc_t *s, int timeout_ms)
{
    struct epoll_event evs[16];
    if (s->n_pending && (timeout_ms < 0 || timeout_ms > 100))
        timeout_ms = 100;
    int n = epoll_wait(s->epfd, evs, HP_ARRAY_SIZE(evs), timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    int ret = 0;
    for (int e = 0; e < n; e++) {
        if (evs[e].data.u64 & SVC_EV_CLIENT) {
            svc__unwinder_hangup(s, evs[e].data.u64 & ~SVC_EV_CLIENT);
            continue;
        }
        if (evs[e].data.fd != s->listen_fd) {
            pending_event(s, evs[e].data.fd, evs[e].events);
            continue;
        }
        for (;;) {
            int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    ret = -errno;
                break;
            }
            accepted(s, fd);
        }
    }
    pending_expire(s);
    return ret;
}

void svc__listener_close(struct svc *s)
{
    while (s->n_pending) {
        int fd = s->pending[0].fd;
        pending_remove(s, 0);
        (void)close(fd);
    }
    if (s->listen_fd >= 0) {
        (void)close(s->listen_fd);
        s->listen_fd = -1;
    }
}
