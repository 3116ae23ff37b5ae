/* service/handshake.c: the service's half of the handshake: check the peer and its
 * hello, decide whether it is a target, build its client (unwinder state, ring, unwind
 * table) and answer with the client configuration. Every byte from the peer is
 * untrusted. Main thread only. */
#include "service/svc_internal.h"

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
#include "common/procfs.h"
#include "service/svc.h"
#include "service/targets.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

/* True when @fd (received from a client) is /proc/@pid/@what. The client opened
 * /proc/self/@what, which the kernel resolves to the pid's own directory: in a container,
 * in its own /proc, where @pid is its pid in its pid namespace. */
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
    if (!svc__uid_allowed(cred.uid, allow_other_users, false)) {
        hp_log_warn("pid %d: handshake: client of uid %u rejected", (int)cred.pid,
                    (unsigned)cred.uid);
        goto fail;
    }
    r = -EPERM;
    /* A client in a pid namespace of its own (a container) says its pid there, and opened
     * its /proc files in its own /proc (or, without one mounted, in ours). */
    pid_t self_pid = hello.pid == cred.pid ? cred.pid : hp_proc_ns_pid(cred.pid);
    bool maps_ok = fd_is_proc_file(fds[0], self_pid, "maps") ||
                   (self_pid != cred.pid && fd_is_proc_file(fds[0], cred.pid, "maps"));
    bool mem_ok = fd_is_proc_file(fds[1], self_pid, "mem") ||
                  (self_pid != cred.pid && fd_is_proc_file(fds[1], cred.pid, "mem"));
    if (hello.pid != self_pid || !maps_ok || !mem_ok) {
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
    /* Best effort: the client is dropped either way. */
    (void)!hp_send_fds(sock, &cfg, sizeof(cfg), NULL, 0);
}

/* A client of the peer that said @hello (pid @pid), with the descriptors in @fds (taken:
 * set to -1), the session's settings and the process's cmdline. NULL when out of memory;
 * @fds are then left to the caller. */
static struct svc_client *client_from_hello(const struct svc *s, const struct wire_hello *hello,
                                            pid_t pid, int fds[2])
{
    struct svc_client *c = svc__client_new(pid);
    if (!c)
        return NULL;
    c->maps_fd = fds[0];
    c->mem_fd = fds[1];
    fds[0] = fds[1] = -1;
    /* Not fatal: without it a connection closed by the program looks like an exit. */
    c->image_fd = fcntl(c->maps_fd, F_DUPFD_CLOEXEC, 0);
    c->max_stack_bytes = svc_config_max_stack(&s->cfg);
    c->sampling_interval_bytes = s->cfg.sampling_interval_bytes;
    c->from_startup = hello->reason == WIRE_REASON_STARTUP;
    if (svc__read_cmdline(c->pid, &c->cmdline, &c->cmdline_len) < 0) {
        c->cmdline = NULL;
        c->cmdline_len = 0;
    }
    svc__client_set_title(c);
    c->process_start_ts = svc__process_start_ts(c->pid);
    return c;
}

/* True when @c is a target of the session: every client is when the session names none
 * (heapprof record's private socket). */
static bool is_target(const struct svc *s, const struct svc_client *c)
{
    if (!svc_config_has_targets(&s->cfg))
        return true;
    char comm[SVC_COMM_LEN];
    bool target = svc_config_matches(&s->cfg, c->pid, svc_proc_comm(c->pid, comm, sizeof(comm)),
                                     c->cmdline, c->cmdline_len);
    if (c->from_startup && s->cfg.no_startup)
        target = false;
    return target;
}

/* True when @c is not profiled for a guardrail (logged): the session hit a guardrail, or
 * this ring would take the service past its memory guardrail. In the second case the
 * processes profiled already carry on. Every ring counts whole, touched or not: a client
 * may fill its own at any time. */
static bool over_guardrail(struct svc *s, const struct svc_client *c)
{
    bool over = atomic_load_explicit(&s->guardrail_fired, memory_order_acquire);
    if (!over && s->cfg.max_heapprofd_memory_kb) {
        struct svc_memory mem;
        svc__memory(&mem);
        uint64_t ring_kb = svc__client_mem_bytes(s) >> 10;
        uint64_t kb = mem.rss_kb - HP_MIN(mem.shmem_kb, mem.rss_kb) + mem.swap_kb +
                      (atomic_load_explicit(&s->client_mem_bytes, memory_order_relaxed) >> 10);
        over = kb + ring_kb > s->cfg.max_heapprofd_memory_kb;
        if (over)
            hp_log_warn("pid %d (%s): not profiled: its %llu KiB buffer would take the service "
                        "(%llu KiB) past its memory guardrail (%llu KiB)",
                        (int)c->pid, svc__client_name(c), (unsigned long long)ring_kb,
                        (unsigned long long)kb, (unsigned long long)s->cfg.max_heapprofd_memory_kb);
    } else if (over) {
        hp_log_info("pid %d: the session hit a guardrail; left unprofiled", (int)c->pid);
    }
    if (over && s->cfg.log_processes)
        hp_log_note("pid %d (%s): not profiled (memory guardrail)", (int)c->pid,
                    svc__client_name(c));
    return over;
}

/* The unwinder's state of @c's process, which takes its maps and mem descriptors. Read
 * now, while the client waits for our answer: a short-lived process may be gone by the
 * time its first record is unwound. Its big code files are loaded now too, while the
 * client waits: records that arrive while the unwinder reads a big binary (node's 90 MB)
 * fill the ring, and a client whose wait for room runs out drops samples. Returns 0 or
 * -errno (logged). */
static int start_unwinding(struct svc_client *c)
{
    int r = unwinder_process_new(c->pid, c->maps_fd, c->mem_fd, &c->unw);
    c->maps_fd = c->mem_fd = -1;
    if (r < 0) {
        hp_log_warn("pid %d: cannot set up unwinding: %s", (int)c->pid, strerror(-r));
        c->unw = NULL;
        return r;
    }
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    size_t n =
        unwinder_process_warm(c->unw, SVC_WARM_MIN_CODE_BYTES, SVC_WARM_BUDGET_MS * 1000000ull);
    hp_log_debug("pid %d: %zu files of code ready in %.1f ms", (int)c->pid, n,
                 (double)(hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
    return 0;
}

/* The lanes of the clients' rings (shmem_ring/ring.h): one per CPU, as the ring's size
 * and the largest record (a stack copy, its head and Python frames) allow. The
 * environment's HEAPPROF_RING_LANES, when set, replaces the number (a power of two up to
 * 8; benchmarks compare one lane with several). */
unsigned svc__ring_lanes(const struct svc *s)
{
    const char *env = getenv("HEAPPROF_RING_LANES");
    if (env && *env) {
        unsigned long n = strtoul(env, NULL, 10);
        if (n <= UINT32_MAX && ring_lanes_valid(s->cfg.shmem_size_bytes, (uint32_t)n))
            return (unsigned)n;
    }
    return ring_lanes_for(s->cfg.shmem_size_bytes, svc_config_max_stack(&s->cfg) + (16u << 10));
}

/* @c's ring, mapped here as its reader (idle until the first poke); the descriptor for
 * the client in @ret_fd (owned by the caller, also on failure). Returns 0 or -errno
 * (logged). */
static int make_ring(const struct svc *s, struct svc_client *c, int *ret_fd)
{
    int r = ring_create_lanes(s->cfg.shmem_size_bytes, svc__ring_lanes(s), ret_fd);
    if (r >= 0)
        r = ring_map(*ret_fd, RING_ROLE_READER, &c->ring);
    if (r < 0) {
        hp_log_warn("pid %d: cannot create the shared buffer: %s", (int)c->pid, strerror(-r));
        return r;
    }
    ring_set_reader_idle(c->ring, true);
    return 0;
}

/* The unwind table, when the client can walk its own stack (@features: its hello's): the
 * unwinder publishes into it, the client reads it. Returns WIRE_FEATURE_UNWIND_TABLE with
 * the table's descriptor in @ret_fd (owned by the caller), or 0: without one (old client,
 * or it failed) the client copies every stack. */
static uint32_t make_table(const struct svc *s, struct svc_client *c, uint32_t features,
                           int *ret_fd)
{
    if (!(features & WIRE_FEATURE_UNWIND_TABLE) || s->cfg.no_fast_unwind)
        return 0;
    int fd = -1;
    int r = utable_create(UTABLE_DEFAULT_SLOTS, &fd);
    if (r >= 0)
        r = unwinder_process_set_table(c->unw, fd);
    if (r >= 0) {
        *ret_fd = fd;
        return WIRE_FEATURE_UNWIND_TABLE;
    }
    hp_log_warn("pid %d: no unwind table: %s", (int)c->pid, strerror(-r));
    if (fd >= 0)
        (void)close(fd);
    return 0;
}

/* The session's selection of heaps, for a client that speaks WIRE_FEATURE_HEAPS. */
static void heaps_selection(const struct svc_config *cfg, struct wire_heaps *ret)
{
    _Static_assert(SVC_MAX_HEAPS == WIRE_MAX_HEAP_SELECT && SVC_HEAP_NAME_MAX == WIRE_HEAP_NAME_MAX,
                   "heap selections as the client takes them");
    memset(ret, 0, sizeof(*ret));
    ret->flags = cfg->all_heaps ? WIRE_HEAPS_ALL : 0;
    if (cfg->n_heaps == 0) {
        /* The default: malloc's, and CPython's objects (registered only in a Python
         * process, preload/pyheap.h). */
        ret->n = 2;
        memcpy(ret->names[0], WIRE_HEAP_MALLOC_NAME, sizeof(WIRE_HEAP_MALLOC_NAME));
        memcpy(ret->names[1], WIRE_HEAP_PYTHON_NAME, sizeof(WIRE_HEAP_PYTHON_NAME));
        return;
    }
    ret->n = (uint32_t)cfg->n_heaps;
    for (size_t i = 0; i < cfg->n_heaps; i++)
        memcpy(ret->names[i], cfg->heaps[i], sizeof(ret->names[i]));
}

/* Answers @hello on @sock with the client configuration, the ring (@ring_fd) and, when
 * @table, the unwind table (@utable_fd); both borrowed; then, to a client that speaks
 * WIRE_FEATURE_HEAPS, the heaps to record. Returns 0 or -errno. */
static int answer(const struct svc *s, int sock, const struct wire_hello *hello, uint32_t table,
                  int ring_fd, int utable_fd)
{
    struct wire_client_config cfg = {
        .magic = WIRE_CONFIG_MAGIC,
        .status = WIRE_STATUS_PROFILE,
        .features =
            hello->features & (WIRE_FEATURE_REGS_X86_64 | table | WIRE_FEATURE_PYFRAMES |
                               WIRE_FEATURE_HEAPS | WIRE_FEATURE_TITLE | WIRE_FEATURE_FREE_BATCH |
                               (s->cfg.follow_fork ? WIRE_FEATURE_FOLLOW_FORK : 0)),
        .block_client = s->cfg.block_client,
        .sampling_interval_bytes = s->cfg.sampling_interval_bytes,
        .max_stack_bytes = svc_config_max_stack(&s->cfg),
        .block_client_timeout_us = s->cfg.block_client_timeout_us,
        .audit_every = table ? s->cfg.audit_every : 0,
    };
    int send[2] = {ring_fd, utable_fd};
    int r = hp_send_fds(sock, &cfg, sizeof(cfg), send, table ? 2 : 1);
    if (r < 0 || !(cfg.features & WIRE_FEATURE_HEAPS))
        return r;
    struct wire_heaps heaps;
    heaps_selection(&s->cfg, &heaps);
    return hp_send_fds(sock, &heaps, sizeof(heaps), NULL, 0);
}

/* @c is profiled from now on: it takes @sock (non-blocking from here), and its ring
 * counts towards the service's memory. */
static void profiled(struct svc *s, struct svc_client *c, int sock)
{
    int fl = fcntl(sock, F_GETFL);
    if (fl >= 0)
        (void)fcntl(sock, F_SETFL, fl | O_NONBLOCK);
    c->sock = sock;
    c->mem_bytes = svc__client_mem_bytes(s);
    atomic_fetch_add_explicit(&s->client_mem_bytes, c->mem_bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->processes, 1, memory_order_relaxed);
    if (s->cfg.log_processes)
        hp_log_note("pid %d (%s): profiling (%s)", (int)c->pid, svc__client_name(c),
                    c->from_startup ? "from its start" : "attached while running");
    else
        hp_log_info("pid %d: profiling", (int)c->pid);
}

/* The steps, in order: the hello, the client, is it a target, the guardrails, the
 * unwinder's state of the process, its ring, its unwind table, the answer. A refusal on
 * the way sends "not profiled" (reject:) and counts it (drop:), unless the peer is simply
 * not a target (drop_quietly:). */
struct svc_client *svc__handshake(struct svc *s, int sock)
{
    struct timeval tv = {.tv_sec = SVC_HANDSHAKE_TIMEOUT_MS / 1000,
                         .tv_usec = (SVC_HANDSHAKE_TIMEOUT_MS % 1000) * 1000};
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

    c = client_from_hello(s, &hello, cred.pid, fds);
    if (!c)
        goto reject;
    if (!is_target(s, c)) {
        hp_log_debug("pid %d: not a target; left unprofiled", (int)c->pid);
        reject(sock);
        goto drop_quietly;
    }
    /* Not profiled, and the trace says so (hit_guardrail). */
    if (over_guardrail(s, c)) {
        reject(sock);
        struct svc_msg_rejected *m = svc__batch_add(&s->ctl, SVC_MSG_REJECTED, c->pid, sizeof(*m));
        if (m)
            m->flags = BK_FLAG_HIT_GUARDRAIL;
        svc__batch_post(&s->ctl);
        goto drop;
    }

    if (start_unwinding(c) < 0 || make_ring(s, c, &ring_fd) < 0)
        goto reject;
    uint32_t table = make_table(s, c, hello.features, &utable_fd);
    /* As answer() accepts them. */
    c->features = hello.features & (WIRE_FEATURE_PYFRAMES | WIRE_FEATURE_FREE_BATCH);
    /* A process that changes its ids sends the new ones as credentials (service/ids.c),
     * maybe before we get to profiled(): its ring's count starts at 0 (c->ids_seen). */
    int on = 1;
    (void)setsockopt(sock, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
    r = answer(s, sock, &hello, table, ring_fd, utable_fd);
    (void)close(ring_fd);
    ring_fd = -1;
    if (utable_fd >= 0)
        (void)close(utable_fd);
    utable_fd = -1;
    if (r < 0) {
        hp_log_warn("pid %d: handshake: cannot answer: %s", (int)c->pid, strerror(-r));
        goto drop;
    }
    profiled(s, c, sock);
    return c;

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
    return NULL;
}
