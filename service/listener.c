/* service/listener.c: the listening socket and the connections whose hello has not
 * fully arrived; complete hellos go to the handshake (service/handshake.c) and the
 * clients it builds to an unwinder thread. Main thread only. */
#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/openat2.h>

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

/* ---- sockets inside the roots of processes in containers ------------------------------ */

static void listen_in_drop(struct svc *s, unsigned i)
{
    struct svc_listen_in *in = &s->ins[i];
    if (s->epfd >= 0)
        (void)epoll_ctl(s->epfd, EPOLL_CTL_DEL, in->fd, NULL);
    (void)close(in->fd);
    /* Through the directory we hold: also when the process is gone (its /proc/PID/root
     * with it). */
    if (unlinkat(in->dirfd, in->name, 0) < 0 && errno != ENOENT)
        hp_log_warn("pid %d: cannot remove the socket /.../%s made inside its root: %s",
                    (int)in->pid, in->name, strerror(errno));
    (void)close(in->dirfd);
    s->ins[i] = s->ins[--s->n_ins];
}

/* Opens @rel (a directory) inside @root, resolving every component inside it: a symlink
 * of the container's never leads out. Returns an O_PATH fd or -errno. */
static int listen_in_dir(int root, const char *rel)
{
    struct open_how how = {
        .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    int fd = (int)syscall(SYS_openat2, root, rel, &how, sizeof(how));
    return fd < 0 ? -errno : fd;
}

/* Binds and listens on a fresh name in @dirfd; the name in @name (@len bytes). */
static int listen_in_bind(int dirfd, char *name, size_t len, int *ret_fd)
{
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        rnd = hp_clock_ns(CLOCK_MONOTONIC);
    snprintf(name, len, "heapprof-%d-%016llx.sock", (int)getpid(), (unsigned long long)rnd);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    /* bind(2) takes no directory fd: the magic link names that very directory. */
    int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "/proc/self/fd/%d/%s", dirfd, name);
    if (n < 0 || (size_t)n >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    HP_CLEANUP_CLOSE int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        return -errno;
    if (listen(fd, 8) < 0) {
        int r = -errno;
        (void)unlinkat(dirfd, name, 0);
        return r;
    }
    *ret_fd = HP_TAKE_FD(fd);
    return 0;
}

int svc_listen_in(svc_t *s, pid_t pid, uid_t uid, char *ret_path, size_t len)
{
    static const char *const dirs[] = {"tmp", "dev/shm"};
    svc_unlisten_in(s, pid);
    if (s->n_ins == SVC_MAX_LISTEN_IN || s->epfd < 0)
        return -EMFILE;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/root", (int)pid);
    HP_CLEANUP_CLOSE int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return -errno;
    int r = -ENOENT;
    for (size_t d = 0; d < HP_ARRAY_SIZE(dirs); d++) {
        HP_CLEANUP_CLOSE int dirfd = listen_in_dir(root, dirs[d]);
        if (dirfd < 0) {
            r = dirfd;
            continue;
        }
        struct svc_listen_in in = {.fd = -1, .dirfd = -1, .pid = pid};
        r = listen_in_bind(dirfd, in.name, sizeof(in.name), &in.fd);
        if (r < 0)
            continue; /* read-only, full: the next one */
        /* connect(2) needs write permission on the file: the process's user gets it. The
         * sticky /tmp lets nobody but root (ours, or the container's) replace it. */
        if (uid != geteuid() && fchownat(dirfd, in.name, uid, (gid_t)-1, AT_SYMLINK_NOFOLLOW) < 0)
            r = -errno;
        int n = snprintf(ret_path, len, "/%s/%s", dirs[d], in.name);
        if (r == 0 && (n < 0 || (size_t)n >= len))
            r = -ENAMETOOLONG;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = SVC_EV_LISTEN_IN | (uint32_t)in.fd};
        if (r == 0 && epoll_ctl(s->epfd, EPOLL_CTL_ADD, in.fd, &ev) < 0)
            r = -errno;
        if (r < 0) {
            (void)close(in.fd);
            (void)unlinkat(dirfd, in.name, 0);
            return r;
        }
        in.dirfd = HP_TAKE_FD(dirfd);
        in.until_ns = hp_clock_ns(CLOCK_MONOTONIC) + (uint64_t)SVC_LISTEN_IN_TIMEOUT_MS * 1000000u;
        s->ins[s->n_ins++] = in;
        return 0;
    }
    return r;
}

void svc_unlisten_in(svc_t *s, pid_t pid)
{
    for (unsigned i = 0; i < s->n_ins; i++)
        if (s->ins[i].pid == pid) {
            listen_in_drop(s, i);
            return;
        }
}

static void accepted(struct svc *s, int fd);

/* A connection on a socket of svc_listen_in(): handshaken as any, and the socket goes. */
static void listen_in_event(struct svc *s, int fd)
{
    unsigned i = 0;
    while (i < s->n_ins && s->ins[i].fd != fd)
        i++;
    if (i == s->n_ins)
        return;
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        return; /* EAGAIN, ECONNABORTED: the next event */
    listen_in_drop(s, i);
    accepted(s, c);
}

/* Removes the sockets of processes that are gone, or that have had their time to
 * connect (SVC_LISTEN_IN_TIMEOUT_MS), saying so: the daemon's only word on a woken
 * process that never connected. */
static void listen_in_expire(struct svc *s)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (unsigned i = 0; i < s->n_ins;) {
        const struct svc_listen_in *in = &s->ins[i];
        bool gone = kill(in->pid, 0) < 0 && errno == ESRCH;
        if (!gone && now < in->until_ns) {
            i++;
            continue;
        }
        if (!gone)
            hp_log_warn("pid %d: woken, but it did not connect to the socket made for it "
                        "inside its root within %d s (a busy machine? or a security profile "
                        "of its container that keeps it from connecting there); not attached",
                        (int)in->pid, SVC_LISTEN_IN_TIMEOUT_MS / 1000);
        listen_in_drop(s, i);
    }
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
    if ((s->n_pending || s->n_ins) && (timeout_ms < 0 || timeout_ms > 100))
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
        if (evs[e].data.u64 & SVC_EV_LISTEN_IN) {
            listen_in_event(s, (int)(uint32_t)evs[e].data.u64);
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
    if (s->n_ins)
        listen_in_expire(s);
    return ret;
}

void svc__listener_close(struct svc *s)
{
    while (s->n_ins)
        listen_in_drop(s, 0);
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
