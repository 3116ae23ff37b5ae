/* preload/session.c: the client's half of the handshake, and the sessions it opens and
 * closes (owner only: see preload/client.h for who owns them). Not hook-safe (it blocks
 * on the service): runs in the initialising thread, the session thread or a forked
 * child's atfork handler. Raw system calls only (common/sys.h): the session thread has no
 * glibc thread state (preload/attach.c). */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "common/macros.h"
#include "common/paths.h"
#include "common/sys.h"
#include "preload/direct.h"
#include "preload/env.h"
#include "preload/got.h"
#include "preload/peer.h"
#include "preload/pyheap.h"
#include "preload/python.h"
#include "preload/title.h"
#include "shmem_ring/wire.h"

/* Descriptors the client keeps (the session's socket, preload/direct.c's /proc/self/mem)
 * are moved to a number at least this high (or half the descriptor limit, if lower), away
 * from the numbers programs open, dup2 onto or close in loops. */
#define CLIENT_SOCK_FLOOR 1024

static uint64_t client_session_gen; /* owner only */
static unsigned client_next_slot;   /* owner only */

/* Features this client speaks. */
#define CLIENT_FEATURES                                                                            \
    (WIRE_FEATURE_REGS_X86_64 | WIRE_FEATURE_FOLLOW_FORK | WIRE_FEATURE_UNWIND_TABLE |             \
     WIRE_FEATURE_PYFRAMES | WIRE_FEATURE_HEAPS | WIRE_FEATURE_TITLE | WIRE_FEATURE_FREE_BATCH)

/* ---- handshake ------------------------------------------------------------------- */

/* Connects to @path, with send and receive timeouts of @timeout_ms. Returns the socket
 * or -errno. */
static long client_connect(const char *path, uint32_t timeout_ms)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if (len >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, len);
    long sa_len = sizeof(sa);
    if (path[0] == HP_ABSTRACT_PREFIX) {
        sa.sun_path[0] = '\0'; /* abstract: the name is the bytes after it, exactly */
        sa_len = (long)(offsetof(struct sockaddr_un, sun_path) + len);
    }

    long sock = hp_sys3(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return sock;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    long r = hp_sys6(SYS_setsockopt, sock, SOL_SOCKET, SO_RCVTIMEO, (long)&tv, sizeof(tv), 0);
    if (r == 0)
        r = hp_sys6(SYS_setsockopt, sock, SOL_SOCKET, SO_SNDTIMEO, (long)&tv, sizeof(tv), 0);
    if (r == 0)
        r = hp_sys3(SYS_connect, sock, (long)&sa, sa_len);
    if (r < 0) {
        (void)hp_sys_close((int)sock);
        return r;
    }
    return sock;
}

/* Our /proc fds let the peer read all our memory: only to a peer preload/peer.h allows,
 * for a handshake of @reason that only @want_pid (> 0, or CLIENT_PEER_HIDDEN) may answer. Returns 0
 * with the peer's pid in *@ret_pid, -EPERM (another user), -EACCES (not the process that woke us,
 * or not one Yama would let trace us) or -errno. */
static long client_check_peer(long sock, uint32_t reason, pid_t want_pid, pid_t *ret_pid)
{
    struct ucred cred;
    socklen_t cred_len = sizeof(cred);
    long r =
        hp_sys6(SYS_getsockopt, sock, SOL_SOCKET, SO_PEERCRED, (long)&cred, (long)&cred_len, 0);
    if (r < 0)
        return r;
    if (cred_len != sizeof(cred))
        return -EPERM;
    struct client_peer p = {
        .self_uid = (uid_t)hp_sys0(SYS_getuid),
        .uid = cred.uid,
        .pid = cred.pid,
        .want_pid = want_pid,
        .woken = reason == WIRE_REASON_ATTACH,
        .yama_scope = -1,
    };
    if (p.uid != p.self_uid && p.uid != 0)
        return -EPERM;
    if (p.woken && want_pid == 0)
        p.yama_scope = client_peer_yama_scope();
    if (client_peer_needs_ptrace_facts(&p)) {
        p.cap_ptrace = client_peer_has_cap_ptrace(p.pid);
        p.ancestor = !p.cap_ptrace && client_peer_is_ancestor(p.pid);
    }
    if (!client_peer_trusted(&p))
        return -EACCES;
    *ret_pid = cred.pid;
    return 0;
}

/* Sends the hello, with descriptors of our /proc/self/maps and /proc/self/mem. Returns
 * >= 0 or -errno. */
static long client_send_hello(long sock, uint32_t reason)
{
    int fds[2] = {-1, -1};
    long r = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
    if (r < 0)
        return r;
    fds[0] = (int)r;
    r = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/mem", O_RDONLY | O_CLOEXEC, 0);
    if (r < 0) {
        (void)hp_sys_close(fds[0]);
        return r;
    }
    fds[1] = (int)r;
    struct wire_hello hello = {
        .magic = WIRE_HELLO_MAGIC,
        .features = CLIENT_FEATURES,
        .pid = (int32_t)hp_sys0(SYS_getpid),
        .reason = reason,
    };
    r = hp_send_fds((int)sock, &hello, sizeof(hello), fds, 2);
    (void)hp_sys_close(fds[0]);
    (void)hp_sys_close(fds[1]);
    return r;
}

/* True when @cfg, a PROFILE answer that came with @ring_fd and @utable_fd (-1: none), is
 * one this client can use. */
static bool client_config_usable(const struct wire_client_config *cfg, int ring_fd, int utable_fd)
{
    bool with_table = (cfg->features & WIRE_FEATURE_UNWIND_TABLE) != 0;
    return cfg->status == WIRE_STATUS_PROFILE && ring_fd >= 0 &&
           cfg->sampling_interval_bytes != 0 && cfg->max_stack_bytes % 8 == 0 &&
           cfg->max_stack_bytes <= RING_MAX_PAYLOAD - sizeof(struct wire_alloc) -
                                       (1 + WIRE_MAX_PCS) * sizeof(uint64_t) &&
           (cfg->features & ~(uint32_t)CLIENT_FEATURES) == 0 && with_table == (utable_fd >= 0);
}

/* With WIRE_FEATURE_HEAPS, the selection of heaps that follows the config on @sock. */
static long client_recv_heaps(long sock, struct wire_heaps *ret)
{
    int none[1];
    size_t nfds = 0;
    long r = hp_recv_fds((int)sock, ret, sizeof(*ret), none, 0, &nfds);
    if (r < 0)
        return r;
    return ret->n <= WIRE_MAX_HEAP_SELECT ? 0 : -EPROTO;
}

/* The handshake on @path for @reason, with process @want_pid only when > 0. Returns 0
 * with a ring fd, an unwind table fd (-1 when the service sends none), the socket, the
 * peer's pid and, when the config says WIRE_FEATURE_HEAPS, the selection of heaps in
 * @ret_heaps (PROFILE), 1 when the service answered NOT_PROFILED, or -errno (-EPERM: the
 * peer is neither our uid nor root; -EACCES: not the peer the session is for). */
static int client_handshake(const char *path, uint32_t reason, pid_t want_pid, uint32_t timeout_ms,
                            struct wire_client_config *ret_cfg, int *ret_sock, int *ret_ring_fd,
                            int *ret_utable_fd, pid_t *ret_peer_pid, struct wire_heaps *ret_heaps)
{
    struct wire_client_config cfg;
    int rx[2] = {-1, -1};
    int ring_fd = -1, utable_fd = -1;
    size_t nfds = 0;
    pid_t peer_pid = 0;

    long sock = client_connect(path, timeout_ms);
    if (sock < 0)
        return (int)sock;
    long r = client_check_peer(sock, reason, want_pid, &peer_pid);
    if (r < 0)
        goto fail;
    r = client_send_hello(sock, reason);
    if (r < 0)
        goto fail;

    r = hp_recv_fds((int)sock, &cfg, sizeof(cfg), rx, 2, &nfds);
    if (r < 0)
        goto fail;
    ring_fd = nfds > 0 ? rx[0] : -1;
    utable_fd = nfds > 1 ? rx[1] : -1;
    r = -EPROTO;
    if (cfg.magic != WIRE_CONFIG_MAGIC)
        goto fail;
    if (cfg.status == WIRE_STATUS_NOT_PROFILED) {
        if (ring_fd >= 0)
            (void)hp_sys_close(ring_fd);
        if (utable_fd >= 0)
            (void)hp_sys_close(utable_fd);
        (void)hp_sys_close((int)sock);
        return 1;
    }
    if (!client_config_usable(&cfg, ring_fd, utable_fd))
        goto fail;
    if ((cfg.features & WIRE_FEATURE_HEAPS) && (r = client_recv_heaps(sock, ret_heaps)) < 0)
        goto fail;

    *ret_cfg = cfg;
    *ret_sock = (int)sock;
    *ret_ring_fd = ring_fd;
    *ret_utable_fd = utable_fd;
    *ret_peer_pid = peer_pid;
    return 0;

fail:
    if (ring_fd >= 0)
        (void)hp_sys_close(ring_fd);
    if (utable_fd >= 0)
        (void)hp_sys_close(utable_fd);
    (void)hp_sys_close((int)sock);
    return (int)r;
}

int client__fd_move_high(int fd)
{
    struct rlimit rl;
    if (hp_sys4(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, (long)&rl) < 0)
        return fd;
    uint64_t floor = HP_MIN((uint64_t)rl.rlim_cur / 2, (uint64_t)CLIENT_SOCK_FLOOR);
    if (floor <= (uint64_t)fd)
        return fd;
    long hi = hp_sys3(SYS_fcntl, fd, F_DUPFD_CLOEXEC, (long)floor);
    if (hi < 0)
        return fd;
    (void)hp_sys_close(fd);
    return (int)hi;
}

/* Checked before every use of a session's socket after the handshake (the session
 * thread's polls, the closes here and in a forked child): the program may have closed
 * or reused the descriptor. */
bool client__sock_ours(const struct client_session *s)
{
    struct stat st;
    return s->sock >= 0 && hp_sys2(SYS_fstat, s->sock, (long)&st) == 0 &&
           (uint64_t)st.st_dev == s->sock_dev && (uint64_t)st.st_ino == s->sock_ino;
}

/* ---- sessions (owner only) --------------------------------------------------------- */

static struct client_session *client_free_slot(void)
{
    for (unsigned n = 0; n < CLIENT_MAX_SESSIONS; n++) {
        unsigned i = (client_next_slot + n) % CLIENT_MAX_SESSIONS;
        struct client_session *s = &client_sessions[i];
        if (!s->ring && !s->stuck) {
            client_next_slot = i + 1;
            return s;
        }
    }
    return NULL;
}

/* On the first use of slot @s: its sampled-address set, and the page that tells a child
 * of fork from us (MADV_WIPEONFORK; without it fork_token stays NULL and getpid() is
 * compared instead). Returns 0 or -errno. */
static int client_slot_prepare(struct client_session *s)
{
    if (s->freeset.lv[0].slots)
        return 0;
    int r = client_freeset_init(&s->freeset, CLIENT_FREESET_LOG2);
    if (r < 0)
        return r;
    void *page =
        hp_sys_mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!hp_sys_failed((long)page) && hp_sys3(SYS_madvise, (long)page, 4096, MADV_WIPEONFORK) == 0)
        s->fork_token = page;
    else if (!hp_sys_failed((long)page))
        (void)hp_sys_munmap(page, 4096);
    return 0;
}

/* The rest of slot @s for a session on @path that the service configured with @cfg (its
 * socket, ring and table are in place already). */
static void client_slot_configure(struct client_session *s, const struct wire_client_config *cfg,
                                  const char *path, uint32_t reason)
{
    s->audit_every = cfg->audit_every;
    atomic_store_explicit(&s->walk_hold_gen, 0, memory_order_relaxed);
    /* The service reads the maps at the handshake: what is loaded now is known. Not on
     * attach: the attach thread has no glibc thread block, through which dl_iterate_phdr
     * reads the executable's TLS (a SIGSEGV in any program with a __thread variable in
     * its executable); the first sample takes the counts then (CLIENT_DL_UNKNOWN). */
    uint64_t adds = CLIENT_DL_UNKNOWN, subs = CLIENT_DL_UNKNOWN;
    if (reason != WIRE_REASON_ATTACH)
        (void)client_dl_counts(&adds, &subs);
    /* CPython is looked for here too, for the same reason not on attach (the first
     * sample looks then, preload/record.c). */
    if (reason != WIRE_REASON_ATTACH && (cfg->features & WIRE_FEATURE_PYFRAMES))
        client_py_detect(0);
    atomic_store_explicit(&s->py_told, false, memory_order_relaxed);
    /* The service of this session has been told no code object yet (pycodes.h). */
    client_pycodes_unmark_all(&client_py_codes);
    atomic_store_explicit(&s->dl_adds, adds, memory_order_relaxed);
    atomic_store_explicit(&s->dl_subs, subs, memory_order_relaxed);
    atomic_store_explicit(&s->dl_untold, 0, memory_order_relaxed);
    if (cfg->features & WIRE_FEATURE_TITLE)
        client__title_learn();
    s->pid = (pid_t)hp_sys0(SYS_getpid);
    s->features = cfg->features;
    atomic_store_explicit(&s->frees_batched, (cfg->features & WIRE_FEATURE_FREE_BATCH) != 0,
                          memory_order_relaxed);
    s->gen = ++client_session_gen;
    s->max_stack_bytes = cfg->max_stack_bytes;
    client_sampler_params_init(&s->params, cfg->sampling_interval_bytes);
    client_session_writers_reset(s);
    atomic_store_explicit(&s->full_poke_ns, 0, memory_order_relaxed);
    s->stuck = false;
    if (s->fork_token)
        atomic_store_explicit(s->fork_token, s->gen, memory_order_relaxed);
    size_t plen = strlen(path);
    memcpy(s->path, path, plen + 1 <= sizeof(s->path) ? plen + 1 : 0);
}

/* Maps the ring and the unwind table (@utable_fd -1: none) a service sent, and closes
 * both descriptors. Returns 0, -EPROTO (not what a service sends: the wrong size, header
 * or seals) or -errno. */
static int client_map_files(int ring_fd, int utable_fd, ring_t **ret_ring, struct utable *ret_table)
{
    ring_t *ring = NULL;
    struct utable table = {0};
    int r = ring_map(ring_fd, RING_ROLE_WRITER, &ring);
    (void)hp_sys_close(ring_fd);
    if (r >= 0 && utable_fd >= 0) {
        /* Without a usable table the session still works: every sample copies its
         * stack. Not with one the peer could shrink under our walks, inside malloc: no
         * service sends that. */
        int t = utable_map(utable_fd, false, &table);
        if (t == -EPERM) {
            ring = ring_unmap(ring);
            r = t;
        } else if (t < 0) {
            table = (struct utable){0};
        }
    }
    if (utable_fd >= 0)
        (void)hp_sys_close(utable_fd);
    if (r < 0)
        return r == -EBADMSG || r == -EPERM ? -EPROTO : r;
    *ret_ring = ring;
    *ret_table = table;
    return 0;
}

/* Handshakes on @path and, when the service profiles us, publishes the new session and
 * makes the client ACTIVE. Returns 0 (ACTIVE), 1 (NOT_PROFILED) or -errno. */
int client__session_open(const char *path, uint32_t reason, pid_t peer_pid, uint32_t timeout_ms,
                         bool warm_up)
{
    struct wire_client_config cfg = {0};
    struct wire_heaps heaps;
    int sock = -1, ring_fd = -1, utable_fd = -1;

    struct client_session *s = client_free_slot();
    if (!s)
        return -EBUSY;
    int r = client_slot_prepare(s);
    if (r < 0)
        return r;
    r = client_handshake(path, reason, peer_pid, timeout_ms, &cfg, &sock, &ring_fd, &utable_fd,
                         &peer_pid, &heaps);
    if (r != 0)
        return r;
    ring_t *ring = NULL;
    struct utable table = {0};
    r = client_map_files(ring_fd, utable_fd, &ring, &table);
    struct stat st = {0};
    if (r >= 0) {
        sock = client__fd_move_high(sock);
        long e = hp_sys2(SYS_fstat, sock, (long)&st);
        if (e < 0) {
            ring = ring_unmap(ring);
            utable_unmap(&table);
            r = (int)e;
        }
    }
    if (r < 0) {
        /* Closing tells the peer we refused. */
        (void)hp_sys_close(sock);
        return r;
    }
    /* Capped (RING_MAX_BLOCK_TIMEOUT_US) by the ring, whatever the service asks; a wait
     * that runs out ends blocking until the service caught up (preload/blockstate.h). */
    ring_set_blocking(ring, cfg.block_client != 0, cfg.block_client_timeout_us);
    s->block_timeout_us = cfg.block_client_timeout_us;
    client_block_init(&s->block, cfg.block_client != 0);

    /* The socket first: a fork now (atfork handler) closes it only if it is ours. */
    s->sock = sock;
    s->sock_dev = (uint64_t)st.st_dev;
    s->sock_ino = (uint64_t)st.st_ino;
    s->ring = ring;
    s->utable = table;
    s->peer_pid = peer_pid;
    client_slot_configure(s, &cfg, path, reason);
    client__heaps_open(s, (cfg.features & WIRE_FEATURE_HEAPS) ? &heaps : NULL);

    /* The program's calls reach the hooks again before the session is there to see them
     * (preload/direct.h). */
    client_direct_hold();
    /* Slots left direct, and slots the GOT patcher could not write: the service shows
     * their calls as missing. */
    ring_set_unseen_slots(
        ring, atomic_load_explicit(&client_stat_direct_unseen, memory_order_relaxed) +
                  (uint32_t)atomic_load_explicit(&client_stat_got_failures, memory_order_relaxed));
    /* Release pairs with the acquire loads of client_current in the hooks: the session
     * and its set are in place before anyone uses them. */
    atomic_store_explicit(&client_current, s, memory_order_release);
    client__heaps_announce(s);
    /* Only the constructor's thread, or the child of fork's, opens a startup session. */
    client__pyheap_open(s, reason == WIRE_REASON_STARTUP);
    atomic_store_explicit(&client_fast_interval,
                          warm_up ? CLIENT_FAST_WARM_UP : cfg.sampling_interval_bytes,
                          memory_order_relaxed);
    atomic_store_explicit(&client_state, CLIENT_ACTIVE, memory_order_release);
    return 0;
}

/* Ends the current session @s: back to DORMANT. Unmaps the ring, and closes the socket
 * (when @close_sock and it is still ours), once no hook is inside the session (waits up
 * to CLIENT_DETACH_WAIT_MS; after that the slot is kept mapped for good). */
void client__session_close(struct client_session *s, bool close_sock)
{
    atomic_store_explicit(&client_fast_interval, CLIENT_FAST_OFF, memory_order_relaxed);
    client__heaps_close();
    /* seq_cst: see client_session_enter(). */
    atomic_store_explicit(&client_current, NULL, memory_order_seq_cst);
    atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);
    /* Back to the dormant cost: the program's calls skip the hooks. */
    client_direct_release();
    /* Writers waiting for space (block_client) would wait for a reader that is gone: the
     * flag is atomic and read on every round of their wait. A hook that turns it on again
     * meanwhile (hook_block_poll(), preload/record.c) finds the mode off first, or waits
     * on a ring that refuses it once the reader detached. */
    atomic_store_explicit(&s->block.mode, CLIENT_BLOCK_OFF, memory_order_relaxed);
    ring_set_blocking(s->ring, false, 0);
    if (close_sock && client__sock_ours(s))
        (void)hp_sys_close(s->sock);
    s->sock = -1;

    for (uint32_t waited = 0; client_session_busy(s); waited++) {
        if (waited >= CLIENT_DETACH_WAIT_MS) {
            s->stuck = true;
            return;
        }
        struct timespec ms = {0, 1000000};
        (void)hp_sys2(SYS_nanosleep, (long)&ms, 0);
    }
    s->ring = ring_unmap(s->ring);
    utable_unmap(&s->utable);
    /* A hook that loaded @s before the detach may still probe the set: it stays mapped;
     * zero pages make it empty for the slot's next session. */
    client_freeset_clear(&s->freeset);
    client__heap_sets_clear(s);
}
