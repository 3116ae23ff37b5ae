/* preload/client.c: initialisation, handshakes, the attach signal, the helper thread,
 * detach and fork.
 *
 * Initialisation runs once, inside the first hook call or the library's constructor
 * (whichever comes first), possibly before main(): the environment is read by walking
 * environ (once: later changes by the application are not seen), files are opened with
 * plain system calls, and nothing here uses stdio. Whatever this code calls that
 * allocates (pthread_atfork, pthread_create) is served by glibc directly, because the
 * calling thread's in_hook flag is set.
 *
 * Who owns the sessions (client_sessions[], client_current): the initialising thread
 * until the helper thread exists, then the helper thread; in a forked child, the child's
 * atfork handler until it starts the child's helper. The hooks only read them.
 *
 * The helper thread (one per process, all signals blocked, created by the constructor
 * and again in a forked child) sleeps in poll(2) on the wake pipe and the session's
 * socket. The attach signal's handler writes a byte to the pipe; the helper then
 * handshakes (reason WIRE_REASON_ATTACH). When the service closes the socket (end of
 * session, service death) the helper detaches: the client goes back to DORMANT and can
 * be attached again with a new ring. A ring is unmapped only once no hook is inside it.
 *
 * exec: the new image loads the library again (when LD_PRELOAD still names it) and starts
 * from UNINIT, a new session for the same pid. HEAPPROF_FOLLOW_EXEC=0 asks for the
 * opposite: client_init() takes the library out of LD_PRELOAD and removes the client's
 * HEAPPROF_* variables from environ (preload/env.h) before main() runs, whether or not a
 * session starts, so that the programs this one executes start without the profiler.
 * Out of our hands: a program that passes execve() an environment of its own making, a
 * program that saved LD_PRELOAD itself (it sees the edited value only from its main()
 * on), /etc/ld.so.preload; setuid programs never get LD_PRELOAD from the loader anyway.
 *
 * fork(): the child never touches the parent's ring or socket. Unless the session asked
 * to follow forks (WIRE_FEATURE_FOLLOW_FORK), the child is DORMANT with a helper of its
 * own (attachable); with it, the child handshakes again at once in the atfork handler
 * (reason WIRE_REASON_STARTUP), before fork() returns in the child.
 */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
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
#include "preload/env.h"
#include "shmem_ring/wire.h"

extern char **environ;

struct client_session client_sessions[CLIENT_MAX_SESSIONS];
/* Read by every hook call: aligned so that no counter written on sampled calls shares
 * their cache line. */
_Alignas(64) _Atomic(struct client_session *) client_current = NULL;
_Atomic uint64_t client_fast_interval = CLIENT_FAST_UNINIT;
_Atomic int client_state = CLIENT_UNINIT;
uint64_t client_seed;
bool client_trap_reentry;
_Atomic uint64_t client_thread_counter = 0;
_Alignas(64) _Atomic uint64_t client_stat_unknown_stacks = 0;
_Atomic uint64_t client_stat_freeset_overflows = 0;
_Atomic uint64_t client_stat_foreign_pid_samples = 0;

/* Read once from the environment by client_init(). */
static char client_env_socket[HP_PATH_MAX]; /* HEAPPROF_SOCKET, "" when unset */
static bool client_env_socket_too_long;
static char client_env_xdg[HP_PATH_MAX]; /* XDG_RUNTIME_DIR (longer: unusable anyway) */
static bool client_env_xdg_set;
static uint32_t client_timeout_ms = CLIENT_DEFAULT_INIT_TIMEOUT_MS;
static int client_attach_signo; /* 0: no attach support */
static bool client_attach_signo_explicit;

/* Attach machinery. */
static _Atomic int client_attach_pid;   /* si_value of the last attach signal */
static _Atomic int client_wake_wr = -1; /* the handler writes here */
static int client_wake_rd = -1;         /* the helper reads here */
static bool client_attach_installed;    /* our handler is in place */
static bool client_helper_running;      /* a helper thread exists in this process */
static uint64_t client_session_gen;     /* owner only */
static unsigned client_next_slot;       /* owner only */
_Atomic uint64_t client_stat_attach_unavailable = 0;

/* The variables the client reads, removed from environ by HEAPPROF_FOLLOW_EXEC=0. */
static const char *const client_env_names[] = {
    "HEAPPROF_SOCKET",        "HEAPPROF_STARTUP",
    "HEAPPROF_SEED",          "HEAPPROF_INIT_TIMEOUT_MS",
    "HEAPPROF_ATTACH_SIGNAL", "HEAPPROF_TRAP_REENTRY",
    "HEAPPROF_FOLLOW_EXEC",   NULL,
};

/* Features this client speaks. */
#define CLIENT_FEATURES                                                                            \
    (WIRE_FEATURE_REGS_X86_64 | WIRE_FEATURE_FOLLOW_FORK | WIRE_FEATURE_UNWIND_TABLE)

/* ---- small helpers (no allocation, no stdio) ------------------------------------- */

static const char *client_getenv(const char *name)
{
    size_t n = strlen(name);
    if (!environ)
        return NULL;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* Decimal, or hexadecimal with 0x. Returns false on anything else or overflow. */
static bool client_parse_u64(const char *s, uint64_t *ret)
{
    uint64_t v = 0;
    unsigned base = 10;
    if (!s || !*s)
        return false;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
        if (!*s)
            return false;
    }
    for (; *s; s++) {
        unsigned d;
        if (*s >= '0' && *s <= '9')
            d = (unsigned)(*s - '0');
        else if (base == 16 && *s >= 'a' && *s <= 'f')
            d = (unsigned)(*s - 'a' + 10);
        else if (base == 16 && *s >= 'A' && *s <= 'F')
            d = (unsigned)(*s - 'A' + 10);
        else
            return false;
        if (v > (UINT64_MAX - d) / base)
            return false;
        v = v * base + d;
    }
    *ret = v;
    return true;
}

/* Writes the NULL-terminated pieces to stderr as one line, in one write(2). */
static void client_say(const char *first, ...)
{
    char buf[512];
    size_t n = 0;
    __builtin_va_list ap;
    __builtin_va_start(ap, first);
    for (const char *s = first; s; s = __builtin_va_arg(ap, const char *)) {
        size_t l = strlen(s);
        if (l > sizeof(buf) - 1 - n)
            l = sizeof(buf) - 1 - n;
        memcpy(buf + n, s, l);
        n += l;
    }
    __builtin_va_end(ap);
    buf[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(STDERR_FILENO, buf + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
}

static const char *client_strerror(int err)
{
    switch (err) {
    case EAGAIN:
        return "timed out";
    case EPROTO:
        return "invalid answer from the service";
    case ENAMETOOLONG:
        return "socket path too long";
    case EPERM:
        return "the service runs as another user";
    default: {
        /* strerrordesc_np: a constant string, no locale, no allocation. */
        const char *s = strerrordesc_np(err);
        return s ? s : "unknown error";
    }
    }
}

static uint64_t client_random_seed(void)
{
    uint64_t seed = 0;
    long n = syscall(SYS_getrandom, &seed, sizeof(seed), GRND_NONBLOCK);
    if (n == (long)sizeof(seed))
        return seed;
    return hp_clock_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&n;
}

/* ---- handshake ------------------------------------------------------------------- */

/* Returns 0 with a ring fd, an unwind table fd (-1 when the service sends none) and the
 * socket (PROFILE), 1 when the service answered NOT_PROFILED, or -errno (-EPERM: the peer
 * is neither our uid nor root). */
static int client_handshake(const char *path, uint32_t reason, uint32_t timeout_ms,
                            struct wire_client_config *ret_cfg, int *ret_sock, int *ret_ring_fd,
                            int *ret_utable_fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct wire_client_config cfg;
    int fds[2] = {-1, -1};
    int rx[2] = {-1, -1};
    int ring_fd = -1, utable_fd = -1;
    size_t nfds = 0;
    int sock = -1;
    int r;

    size_t len = strlen(path);
    if (len >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, len);

    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -errno;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
        goto fail_errno;
    if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        goto fail_errno;

    /* Our /proc fds let the peer read all our memory: only to our own uid or root. */
    struct ucred cred;
    socklen_t cred_len = sizeof(cred);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0)
        goto fail_errno;
    r = -EPERM;
    if (cred_len != sizeof(cred) || (cred.uid != getuid() && cred.uid != 0))
        goto fail;

    fds[0] = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fds[0] < 0)
        goto fail_errno;
    fds[1] = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (fds[1] < 0)
        goto fail_errno;
    struct wire_hello hello = {
        .magic = WIRE_HELLO_MAGIC,
        .features = CLIENT_FEATURES,
        .pid = getpid(),
        .reason = reason,
    };
    r = hp_send_fds(sock, &hello, sizeof(hello), fds, 2);
    (void)close(fds[0]);
    (void)close(fds[1]);
    fds[0] = fds[1] = -1;
    if (r < 0)
        goto fail;

    r = hp_recv_fds(sock, &cfg, sizeof(cfg), rx, 2, &nfds);
    if (r < 0)
        goto fail;
    ring_fd = nfds > 0 ? rx[0] : -1;
    utable_fd = nfds > 1 ? rx[1] : -1;
    r = -EPROTO;
    if (cfg.magic != WIRE_CONFIG_MAGIC)
        goto fail;
    if (cfg.status == WIRE_STATUS_NOT_PROFILED) {
        if (ring_fd >= 0)
            (void)close(ring_fd);
        if (utable_fd >= 0)
            (void)close(utable_fd);
        (void)close(sock);
        return 1;
    }
    bool with_table = (cfg.features & WIRE_FEATURE_UNWIND_TABLE) != 0;
    if (cfg.status != WIRE_STATUS_PROFILE || ring_fd < 0 || cfg.sampling_interval_bytes == 0 ||
        cfg.max_stack_bytes % 8 != 0 ||
        cfg.max_stack_bytes >
            RING_MAX_PAYLOAD - sizeof(struct wire_alloc) - (1 + WIRE_MAX_PCS) * sizeof(uint64_t) ||
        (cfg.features & ~(uint32_t)CLIENT_FEATURES) != 0 || with_table != (utable_fd >= 0))
        goto fail;

    /* From now on the socket only carries pokes, which must never block. */
    int fl = fcntl(sock, F_GETFL);
    if (fl < 0 || fcntl(sock, F_SETFL, fl | O_NONBLOCK) < 0)
        goto fail_errno;

    *ret_cfg = cfg;
    *ret_sock = sock;
    *ret_ring_fd = ring_fd;
    *ret_utable_fd = utable_fd;
    return 0;

fail_errno:
    r = -errno;
fail:
    if (fds[0] >= 0)
        (void)close(fds[0]);
    if (fds[1] >= 0)
        (void)close(fds[1]);
    if (ring_fd >= 0)
        (void)close(ring_fd);
    if (utable_fd >= 0)
        (void)close(utable_fd);
    (void)close(sock);
    return r;
}

/* ---- sessions (owner only) --------------------------------------------------------- */

static size_t client_freeset_bytes(void)
{
    return CLIENT_FREESET_MAP_BYTES(CLIENT_FREESET_LOG2);
}

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

/* Handshakes on @path and, when the service profiles us, publishes the new session and
 * makes the client ACTIVE. Returns 0 (ACTIVE), 1 (NOT_PROFILED) or -errno. */
static int client_session_open(const char *path, uint32_t reason, uint32_t timeout_ms, bool warm_up)
{
    struct wire_client_config cfg = {0};
    int sock = -1, ring_fd = -1, utable_fd = -1;

    struct client_session *s = client_free_slot();
    if (!s)
        return -EBUSY;
    if (!s->freeset.slots) {
        int r = client_freeset_init(&s->freeset, CLIENT_FREESET_LOG2);
        if (r < 0)
            return r;
        void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page != MAP_FAILED && madvise(page, 4096, MADV_WIPEONFORK) == 0)
            s->fork_token = page;
        else if (page != MAP_FAILED)
            (void)munmap(page, 4096);
    }
    int r = client_handshake(path, reason, timeout_ms, &cfg, &sock, &ring_fd, &utable_fd);
    if (r != 0)
        return r;
    ring_t *ring = NULL;
    r = ring_map(ring_fd, RING_ROLE_WRITER, &ring);
    (void)close(ring_fd);
    struct utable table = {0};
    if (r >= 0 && utable_fd >= 0) {
        /* Without a usable table the session still works: every sample copies its
         * stack. */
        if (utable_map(utable_fd, false, &table) < 0)
            table = (struct utable){0};
    }
    if (utable_fd >= 0)
        (void)close(utable_fd);
    if (r < 0) {
        (void)close(sock);
        return r == -EBADMSG ? -EPROTO : r;
    }
    ring_set_blocking(ring, cfg.block_client != 0, cfg.block_client_timeout_us);

    s->ring = ring;
    s->utable = table;
    s->audit_every = cfg.audit_every;
    atomic_store_explicit(&s->walk_hold_gen, 0, memory_order_relaxed);
    s->sync_timeout_us = cfg.block_client ? cfg.block_client_timeout_us : CLIENT_SYNC_TIMEOUT_US;
    s->sock = sock;
    s->pid = getpid();
    s->features = cfg.features;
    s->gen = ++client_session_gen;
    s->max_stack_bytes = cfg.max_stack_bytes;
    client_sampler_params_init(&s->params, cfg.sampling_interval_bytes);
    atomic_store_explicit(&s->writers, 0, memory_order_relaxed);
    atomic_store_explicit(&s->send_all_frees, false, memory_order_relaxed);
    s->stuck = false;
    if (s->fork_token)
        atomic_store_explicit(s->fork_token, s->gen, memory_order_relaxed);
    size_t plen = strlen(path);
    memcpy(s->path, path, plen + 1 <= sizeof(s->path) ? plen + 1 : 0);

    /* Release pairs with the acquire loads of client_current in the hooks: the session
     * and its set are in place before anyone uses them. */
    atomic_store_explicit(&client_current, s, memory_order_release);
    atomic_store_explicit(&client_fast_interval,
                          warm_up ? CLIENT_FAST_WARM_UP : cfg.sampling_interval_bytes,
                          memory_order_relaxed);
    atomic_store_explicit(&client_state, CLIENT_ACTIVE, memory_order_release);
    return 0;
}

/* Ends the current session @s: back to DORMANT. Unmaps the ring and closes the socket
 * once no hook is inside the session (waits up to CLIENT_DETACH_WAIT_MS; after that the
 * slot is kept mapped for good). */
static void client_session_close(struct client_session *s)
{
    atomic_store_explicit(&client_fast_interval, CLIENT_FAST_OFF, memory_order_relaxed);
    /* seq_cst: see client_session_enter(). */
    atomic_store_explicit(&client_current, NULL, memory_order_seq_cst);
    atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);
    /* Writers waiting for space (block_client) would wait for a reader that is gone: the
     * flag is atomic and read on every round of their wait. */
    ring_set_blocking(s->ring, false, 0);

    for (uint32_t waited = 0; atomic_load_explicit(&s->writers, memory_order_seq_cst) != 0;
         waited++) {
        if (waited >= CLIENT_DETACH_WAIT_MS) {
            s->stuck = true;
            return;
        }
        struct timespec ms = {0, 1000000};
        (void)nanosleep(&ms, NULL);
    }
    s->ring = ring_unmap(s->ring);
    utable_unmap(&s->utable);
    if (s->sock >= 0)
        (void)close(s->sock);
    s->sock = -1;
    /* A hook that loaded @s before the detach may still probe the set: it stays mapped;
     * zero pages make it empty for the slot's next session. */
    (void)madvise(s->freeset.slots, client_freeset_bytes(), MADV_DONTNEED);
}

/* ---- attach signal and helper thread ---------------------------------------------- */

/* Async-signal-safe: an atomic store and a write(2), errno preserved. */
static void client_attach_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    int saved_errno = errno;
    int pid = si && si->si_code == SI_QUEUE ? si->si_value.sival_int : 0;
    atomic_store_explicit(&client_attach_pid, pid, memory_order_relaxed);
    int fd = atomic_load_explicit(&client_wake_wr, memory_order_relaxed);
    if (fd >= 0) {
        static const char byte = 1;
        (void)!write(fd, &byte, 1); /* full pipe: a wakeup is pending already */
    }
    errno = saved_errno;
}

static void client_attach(int pid)
{
    char path[HP_PATH_MAX];
    const char *xdg = client_env_xdg_set ? client_env_xdg : NULL;
    int r;

    if (pid > 0)
        r = hp_socket_path(xdg, getuid(), pid, path, sizeof(path));
    else if (client_env_socket[0])
        r = (memcpy(path, client_env_socket, sizeof(path)), 0);
    else
        r = hp_socket_path(xdg, getuid(), 0, path, sizeof(path));
    if (r < 0)
        return;
    /* Failures are silent: the attacher reports them. */
    if (client_session_open(path, WIRE_REASON_ATTACH, client_timeout_ms, true) != 0)
        return;
    /* Threads that allocate during the warm-up reseed for this session (see
     * CLIENT_FAST_WARM_UP); then the fast path takes over. */
    struct timespec warm = {0, CLIENT_WARM_UP_MS * 1000000};
    (void)nanosleep(&warm, NULL);
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_relaxed);
    uint64_t expected = CLIENT_FAST_WARM_UP;
    if (s)
        (void)atomic_compare_exchange_strong_explicit(&client_fast_interval, &expected,
                                                      s->params.interval, memory_order_relaxed,
                                                      memory_order_relaxed);
}

static void client_drain_wake(void)
{
    char buf[64];
    while (read(client_wake_rd, buf, sizeof(buf)) > 0)
        ;
}

static void *client_helper_main(void *arg)
{
    (void)arg;
    /* Nothing this thread allocates is profiled. */
    client_tls.in_hook = true;
    for (;;) {
        struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
        struct pollfd pf[2] = {
            {.fd = client_wake_rd, .events = POLLIN},
            {.fd = s ? s->sock : -1, .events = POLLIN},
        };
        int n = poll(pf, 2, 1000);
        if (n < 0) {
            struct timespec ten_ms = {0, 10000000};
            (void)nanosleep(&ten_ms, NULL);
            continue;
        }
        if (s && pf[1].revents) {
            /* The service sends nothing after the handshake: data is discarded, EOF or an
             * error ends the session. */
            char buf[64];
            ssize_t got = recv(s->sock, buf, sizeof(buf), MSG_DONTWAIT);
            bool gone = got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR) ||
                        (pf[1].revents & (POLLHUP | POLLERR | POLLNVAL));
            if (pf[1].revents & POLLNVAL)
                s->sock = -1; /* the application closed it: its number is not ours now */
            if (gone)
                client_session_close(s);
        }
        if (pf[0].revents & POLLNVAL)
            break; /* the application closed our pipe: no more attaching */
        if (pf[0].revents) {
            client_drain_wake();
            int pid = atomic_exchange_explicit(&client_attach_pid, 0, memory_order_relaxed);
            /* A signal while profiling is ignored. */
            if (!atomic_load_explicit(&client_current, memory_order_relaxed) &&
                atomic_load_explicit(&client_state, memory_order_relaxed) == CLIENT_DORMANT)
                client_attach(pid);
        }
    }
    return NULL;
}

/* Starts the helper thread with every signal blocked. Not from a hook. */
static void client_helper_start(void)
{
    sigset_t all, old;
    pthread_attr_t attr;
    pthread_t th;

    if (client_helper_running || client_wake_rd < 0)
        return;
    (void)sigfillset(&all);
    if (pthread_attr_init(&attr) != 0)
        return;
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    (void)pthread_attr_setstacksize(&attr, 128 << 10);
    (void)pthread_sigmask(SIG_SETMASK, &all, &old);
    client_helper_running = pthread_create(&th, &attr, client_helper_main, NULL) == 0;
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    (void)pthread_attr_destroy(&attr);
}

static int client_wake_pipe_open(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    client_wake_rd = p[0];
    atomic_store_explicit(&client_wake_wr, p[1], memory_order_relaxed);
    return 0;
}

/* Installs the attach handler unless the application has its own. */
static void client_attach_install(void)
{
    struct sigaction old, sa;

    if (client_attach_signo <= 0 || client_attach_installed)
        return;
    if (sigaction(client_attach_signo, NULL, &old) < 0)
        return;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
        atomic_fetch_add_explicit(&client_stat_attach_unavailable, 1, memory_order_relaxed);
        if (client_attach_signo_explicit)
            client_say("heapprof: the attach signal has a handler already; attaching to this "
                       "process is disabled",
                       NULL);
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = client_attach_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    (void)sigfillset(&sa.sa_mask);
    client_attach_installed = sigaction(client_attach_signo, &sa, NULL) == 0;
}

/* ---- fork ------------------------------------------------------------------------- */

static void client_atfork_child(void)
{
    struct client_tls *t = &client_tls;
    bool was_in_hook = t->in_hook;
    struct client_session *cur = atomic_load_explicit(&client_current, memory_order_relaxed);
    bool follow = cur && (cur->features & WIRE_FEATURE_FOLLOW_FORK);
    char path[HP_PATH_MAX] = "";

    t->in_hook = true;
    if (follow)
        memcpy(path, cur->path, sizeof(path));
    /* The child must never write into the parent's ring nor keep its connection open. */
    atomic_store_explicit(&client_fast_interval, CLIENT_FAST_OFF, memory_order_relaxed);
    atomic_store_explicit(&client_current, NULL, memory_order_seq_cst);
    for (unsigned i = 0; i < CLIENT_MAX_SESSIONS; i++) {
        struct client_session *s = &client_sessions[i];
        if (s->ring) {
            (void)close(s->sock);
            s->sock = -1;
            /* Only this thread exists; unless fork() was called by a signal handler
             * that interrupted one of our hooks, nobody is inside the ring. */
            if (!was_in_hook) {
                s->ring = ring_unmap(s->ring);
                utable_unmap(&s->utable);
                s->stuck = false;
            } else {
                s->stuck = true;
            }
        }
        atomic_store_explicit(&s->writers, 0, memory_order_relaxed);
        if (s->freeset.slots)
            (void)madvise(s->freeset.slots, client_freeset_bytes(), MADV_DONTNEED);
    }
    t->tid = 0;
    t->gen = 0;
    t->sampler.bytes_left = 0;

    int state = atomic_load_explicit(&client_state, memory_order_relaxed);
    if (state == CLIENT_ACTIVE)
        atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);

    /* The pipe is shared with the parent: a signal to the parent must not wake us. */
    client_helper_running = false;
    if (client_wake_rd >= 0) {
        (void)close(client_wake_rd);
        (void)close(atomic_load_explicit(&client_wake_wr, memory_order_relaxed));
        client_wake_rd = -1;
        atomic_store_explicit(&client_wake_wr, -1, memory_order_relaxed);
        (void)client_wake_pipe_open();
    }
    if (follow)
        (void)client_session_open(path, WIRE_REASON_STARTUP, client_timeout_ms, false);
    if (client_attach_installed || atomic_load_explicit(&client_current, memory_order_relaxed))
        client_helper_start();
    t->in_hook = was_in_hook;
}

/* ---- initialisation --------------------------------------------------------------- */

static void client_unreachable(const char *path, int err)
{
    client_say("heapprof: cannot reach the profiling service at ", path, " (", client_strerror(err),
               "); running unprofiled", NULL);
}

static void client_copy_env(const char *v, char *buf, size_t len, bool *too_long)
{
    size_t n = v ? strlen(v) : 0;
    buf[0] = '\0';
    if (n >= len) {
        if (too_long)
            *too_long = true;
        return;
    }
    if (n)
        memcpy(buf, v, n + 1);
}

void client_init(void)
{
    int expected = CLIENT_UNINIT;
    if (!atomic_compare_exchange_strong_explicit(&client_state, &expected, CLIENT_INITIALIZING,
                                                 memory_order_acq_rel, memory_order_acquire))
        return;
    if (!environ) {
        /* Too early (before libc set up the environment): try again later. */
        atomic_store_explicit(&client_state, CLIENT_UNINIT, memory_order_release);
        return;
    }

    const char *startup = client_getenv("HEAPPROF_STARTUP");
    const char *xdg = client_getenv("XDG_RUNTIME_DIR");
    uint64_t v;

    client_copy_env(client_getenv("HEAPPROF_SOCKET"), client_env_socket, sizeof(client_env_socket),
                    &client_env_socket_too_long);
    client_env_xdg_set = xdg != NULL;
    client_copy_env(xdg, client_env_xdg, sizeof(client_env_xdg), NULL);
    if (xdg && !client_env_xdg[0] && xdg[0])
        client_env_xdg_set = false; /* too long for a socket path: use the fallback dir */
    client_trap_reentry = client_parse_u64(client_getenv("HEAPPROF_TRAP_REENTRY"), &v) && v == 1;
    if (client_parse_u64(client_getenv("HEAPPROF_SEED"), &v))
        client_seed = v;
    else
        client_seed = client_random_seed();
    if (client_parse_u64(client_getenv("HEAPPROF_INIT_TIMEOUT_MS"), &v) && v > 0 &&
        v <= 3600u * 1000u)
        client_timeout_ms = (uint32_t)v;
    client_attach_signo = SIGRTMIN + 4;
    const char *sig = client_getenv("HEAPPROF_ATTACH_SIGNAL");
    if (sig) {
        client_attach_signo_explicit = true;
        if (client_parse_u64(sig, &v) && v <= (uint64_t)SIGRTMAX && v != SIGKILL && v != SIGSTOP)
            client_attach_signo = (int)v;
    }

    /* HEAPPROF_STARTUP: "1" required, "0" never, unset: if the socket exists. */
    bool required = startup && strcmp(startup, "1") == 0;
    bool never = startup && strcmp(startup, "0") == 0;

    /* HEAPPROF_FOLLOW_EXEC=0: the programs we execute start without the profiler. Done
     * now, before the handshake, so that it holds whatever happens to the session. Every
     * value the client needs was copied above. The strings edited are the ones the kernel
     * put on the stack at exec (or setenv's copies): writable. This runs before main() (in
     * our constructor, or in an allocation made earlier by the loader or another
     * library's constructor), while the program itself does not read its environment. */
    const char *follow_exec = client_getenv("HEAPPROF_FOLLOW_EXEC");
    if (follow_exec && strcmp(follow_exec, "0") == 0)
        (void)client_env_scrub(environ, client_env_names, CLIENT_LIB_NAME);

    (void)pthread_atfork(NULL, NULL, client_atfork_child);

    char path[HP_PATH_MAX];
    int r = 0;
    if (client_env_socket_too_long)
        r = -ENAMETOOLONG;
    else if (client_env_socket[0])
        memcpy(path, client_env_socket, sizeof(path));
    else
        r = hp_socket_path(client_env_xdg_set ? client_env_xdg : NULL, getuid(), 0, path,
                           sizeof(path));

    if (!never && r < 0 && required) {
        client_unreachable(client_env_socket_too_long ? "HEAPPROF_SOCKET" : "its socket", -r);
    } else if (!never && r == 0) {
        struct stat st;
        if (required)
            r = client_session_open(path, WIRE_REASON_STARTUP, client_timeout_ms, false);
        else if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode))
            r = client_session_open(path, WIRE_REASON_STARTUP,
                                    HP_MIN(client_timeout_ms, CLIENT_OPTIONAL_TIMEOUT_MS), false);
        if (r < 0 && required)
            client_unreachable(path, -r);
    }
    /* Not profiled: dormant, a later attach signal may still start profiling. */
    if (!atomic_load_explicit(&client_current, memory_order_relaxed)) {
        atomic_store_explicit(&client_fast_interval, CLIENT_FAST_OFF, memory_order_relaxed);
        atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);
    }
}

/* Initialise before main() even if nothing allocates before it, and set up attaching. */
__attribute__((constructor)) static void client_ctor(void)
{
    struct client_tls *t = &client_tls;
    bool was_in_hook = t->in_hook;
    int saved_errno = errno;

    t->in_hook = true;
    if (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_UNINIT)
        client_init();
    /* Another thread may be initialising: the helper starts after it. */
    while (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_INITIALIZING) {
        struct timespec ms = {0, 1000000};
        (void)nanosleep(&ms, NULL);
    }
    int state = atomic_load_explicit(&client_state, memory_order_acquire);
    if (state == CLIENT_DORMANT || state == CLIENT_ACTIVE) {
        if (client_wake_rd < 0)
            (void)client_wake_pipe_open();
        if (client_wake_rd >= 0)
            client_attach_install();
        if (client_attach_installed || atomic_load_explicit(&client_current, memory_order_relaxed))
            client_helper_start();
    }
    t->in_hook = was_in_hook;
    errno = saved_errno;
}
