/* preload/client.c: the client's state, its initialisation (environment, startup handshake),
 * and fork. The handshake and sessions are in preload/session.c, attaching in attach.c.
 *
 * Initialisation runs once, inside the first hook call or the library's constructor
 * (whichever comes first), possibly before main(): the environment is read by walking
 * environ (once: later changes by the application are not seen), files are opened with
 * plain system calls, and nothing here uses stdio. Whatever this code calls that
 * allocates (pthread_atfork, pthread_create) is served by glibc directly, because the
 * calling thread's in_hook flag is set.
 *
 * Who owns the sessions (client_sessions[], client_current): the initialising thread
 * until the session thread exists, then the session thread; in a forked child, the
 * child's atfork handler until it starts the child's session thread. The hooks only read
 * them.
 *
 * The session thread (preload/attach.c) exists only while a session does: started by the
 * attach signal's handler (it then handshakes, reason WIRE_REASON_ATTACH) or after a
 * startup handshake, it watches the session's socket and ends the session when the
 * service closes it (end of session, service death) or the program closed or reused the
 * descriptor; the client goes back to DORMANT, with no thread of ours, and can be
 * attached again with a new ring. A ring is unmapped only once no hook is inside it.
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
 * fork(): the child never touches the parent's ring, and closes the parent's socket only
 * while it is still ours. Unless the session asked to follow forks
 * (WIRE_FEATURE_FOLLOW_FORK), the child is DORMANT (attachable); with it, the child
 * handshakes again at once in the atfork handler (reason WIRE_REASON_STARTUP), before
 * fork() returns in the child, and starts its own session thread.
 */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
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
#include "common/sys.h"
#include "preload/alloc.h"
#include "preload/direct.h"
#include "preload/elfobj.h"
#include "preload/env.h"
#include "preload/title.h"
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
char client__env_socket[HP_PATH_MAX]; /* HEAPPROF_SOCKET, "" when unset */
bool client__env_socket_too_long;
char client__env_xdg[HP_PATH_MAX]; /* XDG_RUNTIME_DIR (longer: unusable anyway) */
bool client__env_xdg_set;
uint32_t client__timeout_ms = CLIENT_DEFAULT_INIT_TIMEOUT_MS;
bool client__attach_enabled;

/* Attach machinery. */
bool client__attach_installed; /* our handler is in place */
_Atomic int client__owner_pid;
_Atomic bool client__adopt_pending;
_Atomic uint64_t client_stat_attach_unavailable = 0;
bool client__sweep_off;

/* The variables the client reads, removed from environ by HEAPPROF_FOLLOW_EXEC=0. */
static const char *const client_env_names[] = {
    "HEAPPROF_SOCKET",
    "HEAPPROF_STARTUP",
    "HEAPPROF_SEED",
    "HEAPPROF_INIT_TIMEOUT_MS",
    "HEAPPROF_ATTACH",
    "HEAPPROF_ATTACH_SIGNAL",
    "HEAPPROF_TRAP_REENTRY",
    "HEAPPROF_FOLLOW_EXEC",
    "HEAPPROF_DORMANT_DIRECT",
    "HEAPPROF_TEST_SWEEP",
    NULL,
};

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
void client__say(const char *first, ...)
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

const char *client__strerror(int err)
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

/* ---- fork ------------------------------------------------------------------------- */

/* Ends slot @s, which a child of fork inherited with a ring: the socket is closed if it
 * is still ours, the ring and the table are unmapped when nobody is inside (@in_use), or
 * the slot is kept as it is for good. The ring's own pages were not copied
 * (shmem_ring/ring_layout.h): only the table is really unmapped. */
static void client_forget_slot(struct client_session *s, bool in_use)
{
    if (client__sock_ours(s))
        (void)hp_sys_close(s->sock);
    s->sock = -1;
    if (in_use) {
        s->stuck = true;
        return;
    }
    s->ring = ring_unmap(s->ring);
    utable_unmap(&s->utable);
    s->stuck = false;
}

void client__forget_parent(bool alone, bool keep_rings)
{
    /* The child must never write into the parent's ring nor keep its connection open. */
    atomic_store_explicit(&client_fast_interval, CLIENT_FAST_OFF, memory_order_relaxed);
    atomic_store_explicit(&client_current, NULL, memory_order_seq_cst);
    /* Whoever held the lock of the direct slots at the fork was a thread of the parent;
     * here the sessions' owner is the caller, the only one to take it. */
    client_direct_atfork_child();
    for (unsigned i = 0; i < CLIENT_MAX_SESSIONS; i++) {
        struct client_session *s = &client_sessions[i];
        /* Alone, nobody is inside a ring unless fork() was called by a signal handler
         * that interrupted one of our hooks. Not alone, a thread inside shows in the
         * counts (seq_cst: see client_session_enter()), and so does one of the parent's
         * that the fork copied inside, whose count never drops: kept either way. */
        bool in_use = keep_rings || (!alone && client_session_busy(s));
        if (s->ring)
            client_forget_slot(s, in_use);
        if (alone || !in_use) {
            client_session_writers_reset(s);
            if (s->freeset.lv[0].slots)
                client_freeset_clear(&s->freeset);
            client__heap_sets_clear(s);
        }
    }
    client__heaps_close();
    int state = atomic_load_explicit(&client_state, memory_order_relaxed);
    if (state == CLIENT_ACTIVE)
        atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);
}

/* In the parent after fork(): a child the session does not follow is counted, which
 * tells the service to read the child's word on the socket (client_tell_forked()). */
static void client_atfork_parent(void)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (s && !(s->features & WIRE_FEATURE_FOLLOW_FORK) && client_session_enter(s)) {
        ring_count_fork_unfollowed(s->ring);
        client_session_leave(s);
    }
}

/* In a child of fork() the session @s does not follow: says so on the parent's socket
 * (struct wire_forked), for the service's count of children not followed. Best effort:
 * never waits. */
static void client_tell_forked(const struct client_session *s)
{
    if (!s || (s->features & WIRE_FEATURE_FOLLOW_FORK) || !client__sock_ours(s))
        return;
    struct wire_forked msg = {.magic = WIRE_FORKED_MAGIC, .pid = (int32_t)hp_sys0(SYS_getpid)};
    (void)hp_sys6(SYS_sendto, s->sock, (long)&msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT, 0, 0);
}

static void client_atfork_child(void)
{
    struct client_tls *t = &client_tls;
    bool was_in_hook = t->in_hook;
    struct client_session *cur = atomic_load_explicit(&client_current, memory_order_relaxed);
    bool follow = cur && (cur->features & WIRE_FEATURE_FOLLOW_FORK);
    char path[HP_PATH_MAX] = "";
    pid_t peer_pid = follow ? cur->peer_pid : 0;

    t->in_hook = true;
    atomic_store_explicit(&client__owner_pid, (int)hp_sys0(SYS_getpid), memory_order_relaxed);
    client__fork_owner_arm();
    /* The parent's session thread was not copied. */
    client__sthread_forget();
    client_tell_forked(cur);
    if (follow)
        memcpy(path, cur->path, sizeof(path));
    client__forget_parent(true, was_in_hook);
    t->tid = 0;
    t->gen = 0;
    client__freebufs_forget();
    t->sampler.bytes_left = 0;

    if (follow &&
        client__session_open(path, WIRE_REASON_STARTUP, peer_pid, client__timeout_ms, false) == 0 &&
        client__sthread_start(CLIENT_STHREAD_WATCH, 0, NULL) < 0) {
        /* Nobody would notice the end of the session: better none. */
        client__session_close(atomic_load_explicit(&client_current, memory_order_relaxed), true);
    }
    t->in_hook = was_in_hook;
}

/* ---- initialisation --------------------------------------------------------------- */

static void client_unreachable(const char *path, int err)
{
    client__say("heapprof: cannot reach the profiling service at ", path, " (",
                client__strerror(err), "); running unprofiled", NULL);
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

/* Copies what the client needs from the environment into the client__* settings. */
static void client_read_env(void)
{
    const char *xdg = client_getenv("XDG_RUNTIME_DIR");
    uint64_t v;

    client_copy_env(client_getenv("HEAPPROF_SOCKET"), client__env_socket,
                    sizeof(client__env_socket), &client__env_socket_too_long);
    client__env_xdg_set = xdg != NULL;
    client_copy_env(xdg, client__env_xdg, sizeof(client__env_xdg), NULL);
    if (xdg && !client__env_xdg[0] && xdg[0])
        client__env_xdg_set = false; /* too long for a socket path: use the fallback dir */
    client__direct_disabled =
        client_parse_u64(client_getenv("HEAPPROF_DORMANT_DIRECT"), &v) && v == 0;
    client_trap_reentry = client_parse_u64(client_getenv("HEAPPROF_TRAP_REENTRY"), &v) && v == 1;
    client__sweep_off = client_parse_u64(client_getenv("HEAPPROF_TEST_SWEEP"), &v) && v == 0;
    if (client_parse_u64(client_getenv("HEAPPROF_SEED"), &v))
        client_seed = v;
    else
        client_seed = client_random_seed();
    if (client_parse_u64(client_getenv("HEAPPROF_INIT_TIMEOUT_MS"), &v) && v > 0 &&
        v <= 3600u * 1000u)
        client__timeout_ms = (uint32_t)v;
    /* HEAPPROF_ATTACH_SIGNAL is the name from when a signal woke the client: only its 0
     * still means something. */
    client__attach_enabled = true;
    const char *const off[] = {"HEAPPROF_ATTACH", "HEAPPROF_ATTACH_SIGNAL"};
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++)
        if (client_parse_u64(client_getenv(off[i]), &v) && v == 0)
            client__attach_enabled = false;
}

/* The startup handshake: on the socket HEAPPROF_SOCKET names, or else the default one.
 * @required: HEAPPROF_STARTUP=1 (failing says so on stderr); otherwise only when the
 * socket exists, with a shorter timeout, silently. */
static void client_startup_session(bool required)
{
    char path[HP_PATH_MAX];
    int r = 0;
    if (client__env_socket_too_long)
        r = -ENAMETOOLONG;
    else if (client__env_socket[0])
        memcpy(path, client__env_socket, sizeof(path));
    else
        r = hp_socket_path(client__env_xdg_set ? client__env_xdg : NULL, getuid(), 0, path,
                           sizeof(path));

    if (r < 0) {
        if (required)
            client_unreachable(client__env_socket_too_long ? "HEAPPROF_SOCKET" : "its socket", -r);
        return;
    }
    struct stat st;
    if (required)
        r = client__session_open(path, WIRE_REASON_STARTUP, 0, client__timeout_ms, false);
    else if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        r = client__session_open(path, WIRE_REASON_STARTUP, 0,
                                 HP_MIN(client__timeout_ms, CLIENT_OPTIONAL_TIMEOUT_MS), false);
    if (r < 0 && required)
        client_unreachable(path, -r);
    /* A session needs its thread, which watches it. */
    if (r == 0 && atomic_load_explicit(&client_current, memory_order_relaxed) &&
        client__sthread_start(CLIENT_STHREAD_WATCH, 0, NULL) < 0) {
        client__session_close(atomic_load_explicit(&client_current, memory_order_relaxed), true);
        if (required)
            client_unreachable(path, ENOMEM);
    }
}

bool client__late;

struct late_scan {
    unsigned index, self, libc;
};

static int late_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct late_scan *ls = arg;
    unsigned index = ls->index++;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) == 0 && client_elfobj_contains(&o, (uintptr_t)&client_init))
        ls->self = index;
    else if (strcmp(base, "libc.so.6") == 0)
        ls->libc = index;
    return 0;
}

/* Loaded after the C library: by a dlopen of the running program (heapprof attach loads
 * the library so: service/inject.c), not preloaded or linked (those come before it in
 * the loader's order). */
static bool client_loaded_late(void)
{
    struct late_scan ls = {0, ~0u, ~0u};
    (void)dl_iterate_phdr(late_cb, &ls);
    return ls.self != ~0u && ls.libc != ~0u && ls.self > ls.libc;
}

void client__late_init(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    client__late = client_loaded_late();
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

    client_read_env();
    client__late_init();
    client_dl_init();
    atomic_store_explicit(&client__owner_pid, (int)hp_sys0(SYS_getpid), memory_order_relaxed);
    /* HEAPPROF_STARTUP: "1" required, "0" never, unset: if the socket exists. */
    const char *startup = client_getenv("HEAPPROF_STARTUP");
    bool required = startup && strcmp(startup, "1") == 0;
    /* Loaded into a running program: it is being attached, and the constructor runs
     * inside the dlopen of a thread taken for it, which must not wait for a socket. */
    bool never = (startup && strcmp(startup, "0") == 0) || client__late;

    /* HEAPPROF_FOLLOW_EXEC=0: the programs we execute start without the profiler. Done
     * now, before the handshake, so that it holds whatever happens to the session. Every
     * value the client needs was copied above. The strings edited are the ones the kernel
     * put on the stack at exec (or setenv's copies): writable. This runs before main() (in
     * our constructor, or in an allocation made earlier by the loader or another
     * library's constructor), while the program itself does not read its environment. */
    const char *follow_exec = client_getenv("HEAPPROF_FOLLOW_EXEC");
    if (follow_exec && strcmp(follow_exec, "0") == 0)
        (void)client_env_scrub(environ, client_env_names, CLIENT_LIB_NAME);

    (void)pthread_atfork(NULL, client_atfork_parent, client_atfork_child);

    if (!never)
        client_startup_session(required);
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
    /* Before resolving: a library loaded late installs no hook until a session starts. */
    client__late_init();
    /* With an allocator loaded before us no hook may have run yet: resolving now also
     * installs the hooks in the GOT slots (preload/alloc.h). */
    client_alloc_resolve();
    if (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_UNINIT)
        client_init();
    /* Another thread may be initialising: the handler is installed after it. */
    while (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_INITIALIZING) {
        struct timespec ms = {0, 1000000};
        (void)nanosleep(&ms, NULL);
    }
    int state = atomic_load_explicit(&client_state, memory_order_acquire);
    if (state == CLIENT_DORMANT || state == CLIENT_ACTIVE) {
        /* Before the attach handler: no session can start meanwhile but a startup one. */
        client_direct_init();
        client__attach_install();
    }
    t->in_hook = was_in_hook;
    errno = saved_errno;
}

/* exit() or a return from main: the service is told before the connection ends, so that
 * the profile does not say the process went away unexpectedly (killed, crashed, _exit),
 * and is given the title the process had (preload/title.h).
 * A child of fork() has no ring mapped here (ring_set_client_exiting() does nothing). */
__attribute__((destructor)) static void client_dtor(void)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (s && client_session_enter(s)) {
        /* Frees from here on (later destructors, other threads) are recorded one by one;
         * those in batches now, here. */
        atomic_store_explicit(&s->frees_batched, false, memory_order_relaxed);
        client__freebufs_sweep(s, false);
        client__title_send(s);
        ring_set_client_exiting(s->ring);
        client_session_leave(s);
    }
}

/* _exit() and _Exit(), which run no exit handler (a child of fork ending, Python's
 * os._exit): the frees the threads hold in batches are recorded first, as client_dtor()
 * records them for exit(); then the process ends as glibc's _exit ends it (exit_group).
 * Async-signal-safe, as _exit must be: atomics and records that never wait. glibc's own
 * calls (exit() ends in them) do not come here. */
HP_EXPORT void _exit(int status)
{
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (s && client_session_enter(s)) {
        client__freebufs_sweep(s, false);
        client_session_leave(s);
    }
    for (;;)
        (void)hp_sys1(SYS_exit_group, status);
}
HP_EXPORT void _Exit(int status) __attribute__((alias("_exit")));
