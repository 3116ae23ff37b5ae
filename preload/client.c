/* preload/client.c: initialisation, handshake with the service, passthrough and fork.
 *
 * Runs once, inside the first hook call or the library's constructor (whichever comes
 * first), possibly before main(): the environment is read by walking environ, files are
 * opened with plain system calls, and nothing here uses stdio. Whatever this code calls
 * that allocates (pthread_atfork) is served by glibc directly, because the calling
 * thread's in_hook flag is set.
 */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fdpass.h"
#include "common/macros.h"
#include "shmem_ring/wire.h"

extern char **environ;

struct client_config client_cfg = {.sock = -1};
_Atomic int client_state = CLIENT_UNINIT;
_Atomic uint64_t client_fast_interval = UINT64_MAX;
_Atomic bool client_free_watch = false;
_Atomic bool client_send_all_frees = false;
_Atomic uint64_t client_freeset_overflows = 0;
struct client_freeset client_freeset;
_Atomic uint64_t client_seq = 0;
uint64_t client_seed;
_Atomic uint64_t client_thread_counter = 0;

/* Features this client speaks. */
#define CLIENT_FEATURES WIRE_FEATURE_REGS_X86_64

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

/* Returns 0 with a ring fd and the socket (PROFILE), 1 when the service answered
 * NOT_PROFILED, or -errno. */
static int client_handshake(const char *path, uint32_t timeout_ms,
                            struct wire_client_config *ret_cfg, int *ret_sock, int *ret_ring_fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct wire_client_config cfg;
    int fds[2] = {-1, -1};
    int ring_fd = -1;
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
        .reason = WIRE_REASON_STARTUP,
    };
    r = hp_send_fds(sock, &hello, sizeof(hello), fds, 2);
    (void)close(fds[0]);
    (void)close(fds[1]);
    fds[0] = fds[1] = -1;
    if (r < 0)
        goto fail;

    r = hp_recv_fds(sock, &cfg, sizeof(cfg), &ring_fd, 1, &nfds);
    if (r < 0)
        goto fail;
    if (nfds == 0)
        ring_fd = -1;
    r = -EPROTO;
    if (cfg.magic != WIRE_CONFIG_MAGIC)
        goto fail;
    if (cfg.status == WIRE_STATUS_NOT_PROFILED) {
        if (ring_fd >= 0)
            (void)close(ring_fd);
        (void)close(sock);
        return 1;
    }
    if (cfg.status != WIRE_STATUS_PROFILE || ring_fd < 0 || cfg.sampling_interval_bytes == 0 ||
        cfg.max_stack_bytes % 8 != 0 ||
        cfg.max_stack_bytes > RING_MAX_PAYLOAD - sizeof(struct wire_alloc) ||
        (cfg.features & ~(uint32_t)CLIENT_FEATURES) != 0)
        goto fail;

    /* From now on the socket only carries pokes, which must never block. */
    int fl = fcntl(sock, F_GETFL);
    if (fl < 0 || fcntl(sock, F_SETFL, fl | O_NONBLOCK) < 0)
        goto fail_errno;

    *ret_cfg = cfg;
    *ret_sock = sock;
    *ret_ring_fd = ring_fd;
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
    (void)close(sock);
    return r;
}

/* ---- state changes ---------------------------------------------------------------- */

void client_go_passthrough(void)
{
    atomic_store_explicit(&client_fast_interval, UINT64_MAX, memory_order_relaxed);
    atomic_store_explicit(&client_free_watch, false, memory_order_relaxed);
    atomic_store_explicit(&client_state, CLIENT_PASSTHROUGH, memory_order_release);
    /* The socket stays open: another thread may be poking it right now, and closing it
     * could hand its number to an unrelated file of the application. */
}

static void client_atfork_child(void)
{
    /* The child must never write into the parent's ring. Not unmapped either: the child
     * may hold pointers into it in the middle of a hook. */
    client_go_passthrough();
    if (client_cfg.sock >= 0)
        (void)close(client_cfg.sock); /* single-threaded here: no one else uses it */
    client_cfg.sock = -1;
}

static void client_unreachable(const char *path, int err)
{
    client_say("heapprof: cannot reach the profiling service at ", path, " (", client_strerror(err),
               "); running unprofiled", NULL);
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

    const char *socket_path = client_getenv("HEAPPROF_SOCKET");
    const char *startup = client_getenv("HEAPPROF_STARTUP");
    const char *timeout_env = client_getenv("HEAPPROF_INIT_TIMEOUT_MS");
    uint64_t v;

    if (client_parse_u64(client_getenv("HEAPPROF_SEED"), &v))
        client_seed = v;
    else
        client_seed = client_random_seed();

    (void)pthread_atfork(NULL, NULL, client_atfork_child);

    if (!startup || strcmp(startup, "1") != 0) {
        /* Dormant: a later attach (signal) may still start profiling. */
        atomic_store_explicit(&client_state, CLIENT_DORMANT, memory_order_release);
        return;
    }
    if (!socket_path || !*socket_path) {
        client_say("heapprof: HEAPPROF_STARTUP=1 but HEAPPROF_SOCKET is not set; "
                   "running unprofiled",
                   NULL);
        atomic_store_explicit(&client_state, CLIENT_PASSTHROUGH, memory_order_release);
        return;
    }
    uint32_t timeout_ms = CLIENT_DEFAULT_INIT_TIMEOUT_MS;
    if (client_parse_u64(timeout_env, &v) && v > 0 && v <= 3600u * 1000u)
        timeout_ms = (uint32_t)v;

    struct wire_client_config cfg = {0};
    int sock = -1, ring_fd = -1;
    int r = client_handshake(socket_path, timeout_ms, &cfg, &sock, &ring_fd);
    if (r == 1) {
        atomic_store_explicit(&client_state, CLIENT_PASSTHROUGH, memory_order_release);
        return;
    }
    if (r < 0) {
        client_unreachable(socket_path, -r);
        atomic_store_explicit(&client_state, CLIENT_PASSTHROUGH, memory_order_release);
        return;
    }
    ring_t *ring = NULL;
    r = ring_map(ring_fd, RING_ROLE_WRITER, &ring);
    (void)close(ring_fd);
    if (r < 0) {
        client_unreachable(socket_path, r == -EBADMSG ? EPROTO : -r);
        (void)close(sock);
        atomic_store_explicit(&client_state, CLIENT_PASSTHROUGH, memory_order_release);
        return;
    }
    ring_set_blocking(ring, cfg.block_client != 0, cfg.block_client_timeout_us);
    if (client_freeset_init(&client_freeset, CLIENT_FREESET_LOG2) < 0) {
        /* No memory for the table: a tiny static one, and record every free. */
        static _Atomic uint64_t fallback[64];
        client_freeset.slots = fallback;
        client_freeset.mask = 63;
        client_freeset.shift = 58;
        atomic_store_explicit(&client_send_all_frees, true, memory_order_relaxed);
    }

    client_cfg.ring = ring;
    client_cfg.sock = sock;
    client_cfg.pid = getpid();
    client_cfg.max_stack_bytes = cfg.max_stack_bytes;
    client_sampler_params_init(&client_cfg.params, cfg.sampling_interval_bytes);

    /* Release pairs with the acquire loads of client_state and client_free_watch in the
     * hooks: the configuration and the set are in place before anyone uses them. */
    atomic_store_explicit(&client_free_watch, true, memory_order_release);
    atomic_store_explicit(&client_fast_interval, cfg.sampling_interval_bytes, memory_order_relaxed);
    atomic_store_explicit(&client_state, CLIENT_ACTIVE, memory_order_release);
}

/* Initialise before main() even if nothing allocates before it. */
__attribute__((constructor)) static void client_ctor(void)
{
    struct client_tls *t = &client_tls;
    bool was_in_hook = t->in_hook;
    int saved_errno = errno;

    t->in_hook = true;
    if (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_UNINIT) {
        client_init();
        t->seeded = false;
        t->sampler.bytes_left = 0;
    }
    t->in_hook = was_in_hook;
    errno = saved_errno;
}
