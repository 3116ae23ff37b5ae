/* service/svc.c: the session: private socket directory, listening socket, handshakes
 * (peer checks, ring creation), and the unwinder and bookkeeping threads. */
#include "service/svc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include "service/svc_internal.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

#define HANDSHAKE_TIMEOUT_MS 2000
#define MAX_CMDLINE 4096
#define MAX_UNWINDERS 8

struct svc_client *svc__client_free(struct svc_client *c)
{
    if (!c)
        return NULL;
    if (c->sock >= 0)
        (void)close(c->sock);
    if (c->maps_fd >= 0)
        (void)close(c->maps_fd);
    if (c->mem_fd >= 0)
        (void)close(c->mem_fd);
    c->unw = unwinder_process_free(c->unw);
    c->ring = ring_unmap(c->ring);
    free(c->cmdline);
    free(c);
    return NULL;
}

void svc__mark_done(struct svc *s, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    if (s->n_done == s->cap_done) {
        size_t cap = s->cap_done ? s->cap_done * 2 : 16;
        pid_t *p = realloc(s->done_pids, cap * sizeof(*p));
        if (p) {
            s->done_pids = p;
            s->cap_done = cap;
        }
    }
    if (s->n_done < s->cap_done)
        s->done_pids[s->n_done++] = pid;
    pthread_mutex_unlock(&s->done_lock);
}

bool svc_client_done(svc_t *s, pid_t pid)
{
    bool done = false;
    pthread_mutex_lock(&s->done_lock);
    for (size_t i = 0; i < s->n_done && !done; i++)
        done = s->done_pids[i] == pid;
    pthread_mutex_unlock(&s->done_lock);
    return done;
}

static void mark_seen(struct svc *s, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    if (s->n_seen == s->cap_seen) {
        size_t cap = s->cap_seen ? s->cap_seen * 2 : 16;
        pid_t *p = realloc(s->seen_pids, cap * sizeof(*p));
        if (p) {
            s->seen_pids = p;
            s->cap_seen = cap;
        }
    }
    if (s->n_seen < s->cap_seen)
        s->seen_pids[s->n_seen++] = pid;
    pthread_mutex_unlock(&s->done_lock);
}

bool svc_client_seen(svc_t *s, pid_t pid)
{
    bool seen = false;
    pthread_mutex_lock(&s->done_lock);
    for (size_t i = 0; i < s->n_seen && !seen; i++)
        seen = s->seen_pids[i] == pid;
    pthread_mutex_unlock(&s->done_lock);
    return seen;
}

void svc_get_status(svc_t *s, struct svc_status *ret)
{
    ret->live_processes = atomic_load_explicit(&s->live_clients, memory_order_relaxed);
    ret->processes = atomic_load_explicit(&s->processes, memory_order_relaxed);
    ret->samples = atomic_load_explicit(&s->samples, memory_order_relaxed);
    ret->records_dropped = atomic_load_explicit(&s->drops, memory_order_relaxed);
    ret->dumps = atomic_load_explicit(&s->stat_dumps, memory_order_relaxed);
    ret->output_bytes = atomic_load_explicit(&s->stat_bytes, memory_order_relaxed);
}

int svc_dump_now(svc_t *s)
{
    if (s->n_unwinders == 0) {
        struct svc_msg *m = svc__batch_add(&s->ctl, sizeof(*m));
        if (!m)
            return -ENOMEM;
        m->type = SVC_MSG_DUMP_ALL;
        svc__batch_flush(&s->ctl);
        return 0;
    }
    /* Through the unwinders: records still in the rings (a polled ring is read a few
     * milliseconds late) make it into the dump. */
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->dump_requests++;
        pthread_mutex_unlock(&u->lock);
        uint64_t one = 1;
        (void)!write(u->wake_fd, &one, sizeof(one));
    }
    return 0;
}

void svc_detach_all(svc_t *s, uint32_t flags)
{
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->detach = true;
        u->detach_flags |= flags;
        pthread_mutex_unlock(&u->lock);
        uint64_t one = 1;
        (void)!write(u->wake_fd, &one, sizeof(one));
    }
}

/* Resident memory of this process in KiB, from /proc/self/statm. */
static uint64_t self_rss_kb(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    (void)close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    unsigned long long size = 0, resident = 0;
    if (sscanf(buf, "%llu %llu", &size, &resident) != 2)
        return 0;
    return resident * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

bool svc_check_guardrails(svc_t *s)
{
    if (s->guardrail_fired)
        return false;
    const char *what = NULL;
    uint64_t value = 0, limit = 0;
    if (s->cfg.max_heapprofd_memory_kb) {
        value = self_rss_kb();
        limit = s->cfg.max_heapprofd_memory_kb;
        if (value > limit)
            what = "memory (KiB)";
    }
    if (!what && s->cfg.max_heapprofd_cpu_secs) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) {
            value = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec);
            limit = s->cfg.max_heapprofd_cpu_secs;
            if (value >= limit)
                what = "CPU time (s)";
        }
    }
    if (!what)
        return false;
    s->guardrail_fired = true;
    hp_log_warn("guardrail hit: service %s %llu > limit %llu; profiling stopped, data dumped", what,
                (unsigned long long)value, (unsigned long long)limit);
    svc_detach_all(s, BK_FLAG_HIT_GUARDRAIL);
    return true;
}

unsigned svc_live_clients(svc_t *s)
{
    return atomic_load_explicit(&s->live_clients, memory_order_relaxed);
}

const char *svc_socket_path(svc_t *s)
{
    return s->sock_path;
}

static int make_dir(const struct svc_config *cfg, char **ret)
{
    char tmpl[PATH_MAX];
    if (cfg->socket_dir) {
        if (mkdir(cfg->socket_dir, 0700) < 0 && errno != EEXIST)
            return -errno;
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

static int listen_on(const char *path, int *ret_fd)
{
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
    if (bind(fd, (struct sockaddr *)&tmp, sizeof(tmp)) < 0)
        return -errno;
    if (listen(fd, 128) < 0 || (strcmp(tmp.sun_path, path) && rename(tmp.sun_path, path) < 0)) {
        int r = -errno;
        (void)unlink(tmp.sun_path);
        return r;
    }
    *ret_fd = HP_TAKE_FD(fd);
    return 0;
}

static int start_unwinder(struct svc *s, struct svc_unwinder *u)
{
    u->svc = s;
    u->epfd = u->wake_fd = -1;
    pthread_mutex_init(&u->lock, NULL);
    u->batcher.q = &s->bkq;
    u->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (u->epfd < 0)
        return -errno;
    u->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (u->wake_fd < 0)
        return -errno;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(u->epfd, EPOLL_CTL_ADD, u->wake_fd, &ev) < 0)
        return -errno;
    int r = pthread_create(&u->thread, NULL, svc__unwinder_main, u);
    return -r;
}

/* Source file and line of a frame for the dump's ModuleSymbols (bookkeeping thread). */
static int source_line(void *ctx, const struct hp_mapping *m, uint64_t rel_pc,
                       const char **ret_file, uint32_t *ret_line)
{
    (void)ctx;
    return unwinder_source_line(m, rel_pc, ret_file, ret_line);
}

int svc_new(const struct svc_config *cfg, int out_fd, svc_t **ret)
{
    char err[256];
    int r = svc_config_check(cfg, err, sizeof(err));
    if (r < 0) {
        hp_log_error("%s", err);
        return r;
    }
    struct svc *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    s->out_fd = out_fd;
    s->listen_fd = s->epfd = -1;
    pthread_mutex_init(&s->done_lock, NULL);
    svc__bkq_init(&s->bkq);
    s->ctl.q = &s->bkq;

    r = cfg->socket_path ? 0 : make_dir(cfg, &s->dir);
    if (r < 0) {
        hp_log_error("cannot create the socket directory: %s", strerror(-r));
        goto fail;
    }
    if (cfg->socket_path) {
        s->sock_path = strdup(cfg->socket_path);
        if (!s->sock_path) {
            r = -ENOMEM;
            goto fail;
        }
    } else if (asprintf(&s->sock_path, "%s/heapprofd.sock", s->dir) < 0) {
        s->sock_path = NULL;
        r = -ENOMEM;
        goto fail;
    }
    r = listen_on(s->sock_path, &s->listen_fd);
    if (r < 0) {
        if (r == -EADDRINUSE)
            hp_log_error("another heapprof service is already listening on %s", s->sock_path);
        else
            hp_log_error("cannot listen on %s: %s", s->sock_path, strerror(-r));
        goto fail;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        r = -errno;
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s->listen_fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) < 0) {
        r = -errno;
        goto fail;
    }

    r = unwinder_global_init();
    if (r < 0) {
        hp_log_error("cannot initialise the unwinder: %s", strerror(-r));
        goto fail;
    }
    unwinder_set_source_lines(!cfg->no_source_lines);
    r = bk_new(&(struct bk_config){.out_fd = out_fd,
                                   .sequence_id = 1,
                                   .dump_at_max = cfg->dump_at_max,
                                   .source_line = source_line},
               &s->bk);
    if (r < 0)
        goto fail;
    s->dump_barriers = calloc(MAX_UNWINDERS, sizeof(*s->dump_barriers));
    if (!s->dump_barriers) {
        r = -ENOMEM;
        goto fail;
    }
    r = -pthread_create(&s->bk_thread, NULL, svc__bk_main, s);
    if (r < 0)
        goto fail;
    s->bk_started = true;

    unsigned n = cfg->unwinder_threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
    }
    if (n > MAX_UNWINDERS)
        n = MAX_UNWINDERS;
    s->unwinders = calloc(n, sizeof(*s->unwinders));
    if (!s->unwinders) {
        r = -ENOMEM;
        goto fail;
    }
    /* Read by the bk thread, already running: set before any unwinder can answer. */
    s->n_dump_barriers = n;
    for (unsigned i = 0; i < n; i++) {
        s->unwinders[i].index = i;
        r = start_unwinder(s, &s->unwinders[i]);
        if (r < 0) {
            s->unwinders[i].svc = NULL;
            goto fail;
        }
        s->n_unwinders++;
    }
    *ret = s;
    return 0;
fail:
    svc_free(s);
    return r;
}

static int read_cmdline(pid_t pid, char **ret, size_t *ret_len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char *buf = malloc(MAX_CMDLINE);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    while (len < MAX_CMDLINE) {
        ssize_t n = read(fd, buf + len, MAX_CMDLINE - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    *ret = buf;
    *ret_len = len;
    return 0;
}

/* True when @fd (received from a client) is /proc/@pid/@what. The client opened
 * /proc/self/@what, which the kernel resolves to the pid's own directory. */
static bool fd_is_proc_file(int fd, pid_t pid, const char *what)
{
    char link[64], target[128], want[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n < 0)
        return false;
    target[n] = '\0';
    snprintf(want, sizeof(want), "/proc/%d/%s", (int)pid, what);
    return strcmp(target, want) == 0;
}

int svc__handshake_hello(int sock, bool allow_other_users, struct wire_hello *ret_hello,
                         struct ucred *ret_cred, int ret_fds[2])
{
    struct wire_hello hello;
    int fds[2] = {-1, -1};
    size_t nfds = 0;
    int r = hp_recv_fds(sock, &hello, sizeof(hello), fds, 2, &nfds);
    if (r < 0) {
        hp_log_warn("handshake: no valid hello from a client: %s", strerror(-r));
        return r;
    }
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
        r = -errno;
        hp_log_warn("handshake: SO_PEERCRED: %s", strerror(-r));
        goto fail;
    }
    r = -EPROTO;
    if (hello.magic != WIRE_HELLO_MAGIC || nfds != 2) {
        hp_log_warn("pid %d: handshake: bad hello", (int)cred.pid);
        goto fail;
    }
    r = -EACCES;
    if (cred.uid != geteuid() && !(geteuid() == 0 && allow_other_users)) {
        hp_log_warn("pid %d: handshake: client of uid %u rejected", (int)cred.pid,
                    (unsigned)cred.uid);
        goto fail;
    }
    r = -EPERM;
    if (hello.pid != cred.pid || !fd_is_proc_file(fds[0], cred.pid, "maps") ||
        !fd_is_proc_file(fds[1], cred.pid, "mem")) {
        hp_log_warn("pid %d: handshake: pid or /proc descriptors do not match the peer",
                    (int)cred.pid);
        goto fail;
    }
    *ret_hello = hello;
    *ret_cred = cred;
    ret_fds[0] = fds[0];
    ret_fds[1] = fds[1];
    return 0;
fail:
    for (size_t i = 0; i < nfds && i < 2; i++)
        (void)close(fds[i]);
    return r;
}

static void reject(int sock)
{
    struct wire_client_config cfg = {.magic = WIRE_CONFIG_MAGIC,
                                     .status = WIRE_STATUS_NOT_PROFILED};
    (void)hp_send_fds(sock, &cfg, sizeof(cfg), NULL, 0);
}

/* The route of @pid, added (with unwinder @fallback) when missing; NULL when out of
 * memory. */
static struct svc_route *route_get(struct svc *s, pid_t pid, unsigned fallback)
{
    for (size_t i = 0; i < s->n_routes; i++)
        if (s->routes[i].pid == pid)
            return &s->routes[i];
    if (s->n_routes == s->cap_routes) {
        size_t cap = s->cap_routes ? s->cap_routes * 2 : 16;
        struct svc_route *r = realloc(s->routes, cap * sizeof(*r));
        if (!r)
            return NULL;
        s->routes = r;
        s->cap_routes = cap;
    }
    s->routes[s->n_routes] = (struct svc_route){.pid = pid, .unwinder = fallback};
    return &s->routes[s->n_routes++];
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
    struct svc_route *route = route_get(s, c->pid, (unsigned)(best - s->unwinders));
    if (route)
        best = &s->unwinders[route->unwinder];
    atomic_fetch_add_explicit(&best->nclients, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->live_clients, 1, memory_order_relaxed);
    pthread_mutex_lock(&best->lock);
    c->next = best->incoming;
    best->incoming = c;
    pthread_mutex_unlock(&best->lock);
    uint64_t one = 1;
    (void)!write(best->wake_fd, &one, sizeof(one));
}

/* Runs the handshake on a freshly accepted socket. Takes ownership of @sock. */
static void handshake(struct svc *s, int sock)
{
    struct timeval tv = {.tv_sec = HANDSHAKE_TIMEOUT_MS / 1000,
                         .tv_usec = (HANDSHAKE_TIMEOUT_MS % 1000) * 1000};
    struct wire_hello hello;
    int fds[2] = {-1, -1};
    struct svc_client *c = NULL;
    int ring_fd = -1, utable_fd = -1;
    int r;

    (void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct ucred cred;
    r = svc__handshake_hello(sock, s->cfg.allow_other_users, &hello, &cred, fds);
    if (r < 0)
        goto reject;

    c = calloc(1, sizeof(*c));
    if (!c)
        goto reject;
    c->sock = c->maps_fd = c->mem_fd = -1;
    c->pid = cred.pid;
    c->maps_fd = fds[0];
    c->mem_fd = fds[1];
    fds[0] = fds[1] = -1;
    c->max_stack_bytes = s->cfg.max_stack_bytes;
    c->sampling_interval_bytes = s->cfg.sampling_interval_bytes;
    c->from_startup = hello.reason == WIRE_REASON_STARTUP;
    if (read_cmdline(c->pid, &c->cmdline, &c->cmdline_len) < 0) {
        c->cmdline = NULL;
        c->cmdline_len = 0;
    }
    if (s->guardrail_fired) {
        hp_log_info("pid %d: the session hit a guardrail; left unprofiled", (int)c->pid);
        reject(sock);
        goto drop_quietly;
    }
    if (svc_config_has_targets(&s->cfg)) {
        bool target = svc_config_matches(&s->cfg, c->pid, c->cmdline, c->cmdline_len);
        if (c->from_startup && s->cfg.no_startup)
            target = false;
        if (!target) {
            hp_log_debug("pid %d: not a target; left unprofiled", (int)c->pid);
            reject(sock);
            goto drop_quietly;
        }
    }

    /* Read the maps now, while the client waits for our answer: a short-lived process
     * may be gone by the time its first record is unwound. */
    r = unwinder_process_new(c->pid, c->maps_fd, c->mem_fd, &c->unw);
    c->maps_fd = c->mem_fd = -1;
    if (r < 0) {
        hp_log_warn("pid %d: cannot set up unwinding: %s", (int)c->pid, strerror(-r));
        c->unw = NULL;
        goto reject;
    }

    r = ring_create(s->cfg.shmem_size_bytes, &ring_fd);
    if (r >= 0)
        r = ring_map(ring_fd, RING_ROLE_READER, &c->ring);
    if (r < 0) {
        hp_log_warn("pid %d: cannot create the shared buffer: %s", (int)c->pid, strerror(-r));
        goto reject;
    }
    ring_set_reader_idle(c->ring, true);

    /* The unwind table, when the client can walk its own stack: the unwinder publishes
     * into it, the client reads it. Without one (old client, or it failed) the client
     * copies every stack. */
    uint32_t table = 0;
    if ((hello.features & WIRE_FEATURE_UNWIND_TABLE) && !s->cfg.no_fast_unwind) {
        r = utable_create(UTABLE_DEFAULT_SLOTS, &utable_fd);
        if (r >= 0)
            r = unwinder_process_set_table(c->unw, utable_fd);
        if (r >= 0) {
            table = WIRE_FEATURE_UNWIND_TABLE;
        } else {
            hp_log_warn("pid %d: no unwind table: %s", (int)c->pid, strerror(-r));
            if (utable_fd >= 0)
                (void)close(utable_fd);
            utable_fd = -1;
        }
    }

    struct wire_client_config cfg = {
        .magic = WIRE_CONFIG_MAGIC,
        .status = WIRE_STATUS_PROFILE,
        .features = hello.features & (WIRE_FEATURE_REGS_X86_64 | table |
                                      (s->cfg.follow_fork ? WIRE_FEATURE_FOLLOW_FORK : 0)),
        .block_client = s->cfg.block_client,
        .sampling_interval_bytes = s->cfg.sampling_interval_bytes,
        .max_stack_bytes = s->cfg.max_stack_bytes,
        .block_client_timeout_us = s->cfg.block_client_timeout_us,
        .audit_every = table ? s->cfg.audit_every : 0,
    };
    int send[2] = {ring_fd, utable_fd};
    r = hp_send_fds(sock, &cfg, sizeof(cfg), send, table ? 2 : 1);
    (void)close(ring_fd);
    ring_fd = -1;
    if (utable_fd >= 0)
        (void)close(utable_fd);
    utable_fd = -1;
    if (r < 0) {
        hp_log_warn("pid %d: handshake: cannot answer: %s", (int)c->pid, strerror(-r));
        goto drop;
    }
    int fl = fcntl(sock, F_GETFL);
    if (fl >= 0)
        (void)fcntl(sock, F_SETFL, fl | O_NONBLOCK);
    c->sock = sock;
    atomic_fetch_add_explicit(&s->processes, 1, memory_order_relaxed);
    mark_seen(s, c->pid);
    hp_log_info("pid %d: profiling", (int)c->pid);
    hand_over(s, c);
    return;

reject:
    reject(sock);
drop:
    atomic_fetch_add_explicit(&s->rejected, 1, memory_order_relaxed);
drop_quietly:
    if (ring_fd >= 0)
        (void)close(ring_fd);
    if (utable_fd >= 0)
        (void)close(utable_fd);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            (void)close(fds[i]);
    svc__client_free(c);
    (void)close(sock);
}

int svc_watch_fd(svc_t *s, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
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
        handshake(s, fd);
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
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        handshake(s, fd); /* cannot wait: fall back to the blocking read */
        return;
    }
    s->pending[s->n_pending++] =
        (struct svc_pending_hello){.fd = fd, .deadline_ms = now_ms() + HANDSHAKE_TIMEOUT_MS};
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
        handshake(s, fd);
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

int svc_finish(svc_t *s, struct svc_summary *ret_summary)
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
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->stop = true;
        pthread_mutex_unlock(&u->lock);
        uint64_t one = 1;
        (void)!write(u->wake_fd, &one, sizeof(one));
    }
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_join(u->thread, NULL);
        /* clients handed over but never adopted */
        while (u->incoming) {
            struct svc_client *c = u->incoming;
            u->incoming = c->next;
            svc__client_free(c);
        }
        if (u->batcher.cur)
            free(u->batcher.cur);
        (void)close(u->epfd);
        (void)close(u->wake_fd);
        pthread_mutex_destroy(&u->lock);
    }
    s->n_unwinders = 0;
    if (s->bk_started) {
        svc__bkq_quit(&s->bkq);
        pthread_join(s->bk_thread, NULL);
        s->bk_started = false;
    }
    if (ret_summary) {
        memset(ret_summary, 0, sizeof(*ret_summary));
        ret_summary->processes = atomic_load(&s->processes);
        ret_summary->samples = atomic_load(&s->samples);
        ret_summary->frees = atomic_load(&s->frees);
        ret_summary->records_dropped = atomic_load(&s->drops);
        ret_summary->unwinding_errors = atomic_load(&s->unwind_errors);
        ret_summary->handshakes_rejected = atomic_load(&s->rejected);
        ret_summary->corrupt_clients = atomic_load(&s->corrupt);
        ret_summary->walked_samples = atomic_load(&s->walked);
        ret_summary->audits = atomic_load(&s->audits);
        ret_summary->audit_mismatches = atomic_load(&s->audit_mismatches);
        ret_summary->output_bytes = s->bk_counters.bytes_written;
        ret_summary->write_error = s->bk_counters.last_write_error;
    }
    return s->bk_counters.last_write_error;
}

svc_t *svc_free(svc_t *s)
{
    if (!s)
        return NULL;
    if (s->n_unwinders || s->bk_started) {
        int ignored = svc_finish(s, NULL);
        (void)ignored;
    }
    free(s->unwinders);
    free(s->dump_barriers);
    s->bk = bk_free(s->bk);
    unwinder_global_done();
    if (s->listen_fd >= 0)
        (void)close(s->listen_fd);
    if (s->epfd >= 0)
        (void)close(s->epfd);
    if (s->sock_path)
        (void)unlink(s->sock_path);
    if (s->dir && !s->cfg.socket_dir && !s->cfg.socket_path)
        (void)rmdir(s->dir);
    free(s->sock_path);
    free(s->dir);
    free(s->done_pids);
    free(s->seen_pids);
    free(s->routes);
    free(s->ctl.cur);
    svc__bkq_done(&s->bkq);
    pthread_mutex_destroy(&s->done_lock);
    free(s);
    return NULL;
}
