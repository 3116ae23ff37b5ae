/* preload/attach.c: the attach signal's handler and the helper thread that handshakes
 * when it fires and notices when the service closes the session. */
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

static _Atomic int client_attach_pid; /* si_value of the last attach signal */

/* ---- attach signal and helper thread ---------------------------------------------- */

/* Async-signal-safe: an atomic store and a write(2), errno preserved. */
static void client_attach_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    int saved_errno = errno;
    int pid = si && si->si_code == SI_QUEUE ? si->si_value.sival_int : 0;
    atomic_store_explicit(&client_attach_pid, pid, memory_order_relaxed);
    int fd = atomic_load_explicit(&client__wake_wr, memory_order_relaxed);
    if (fd >= 0) {
        static const char byte = 1;
        (void)!write(fd, &byte, 1); /* full pipe: a wakeup is pending already */
    }
    errno = saved_errno;
}

static void client_attach(int pid)
{
    char path[HP_PATH_MAX];
    const char *xdg = client__env_xdg_set ? client__env_xdg : NULL;
    int r;

    if (pid > 0)
        r = hp_socket_path(xdg, getuid(), pid, path, sizeof(path));
    else if (client__env_socket[0])
        r = (memcpy(path, client__env_socket, sizeof(path)), 0);
    else
        r = hp_socket_path(xdg, getuid(), 0, path, sizeof(path));
    if (r < 0)
        return;
    /* Failures are silent: the attacher reports them. */
    if (client__session_open(path, WIRE_REASON_ATTACH, client__timeout_ms, true) != 0)
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
    while (read(client__wake_rd, buf, sizeof(buf)) > 0)
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
            {.fd = client__wake_rd, .events = POLLIN},
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
                client__session_close(s);
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
void client__helper_start(void)
{
    sigset_t all, old;
    pthread_attr_t attr;
    pthread_t th;

    if (client__helper_running || client__wake_rd < 0)
        return;
    (void)sigfillset(&all);
    if (pthread_attr_init(&attr) != 0)
        return;
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    (void)pthread_attr_setstacksize(&attr, 128 << 10);
    (void)pthread_sigmask(SIG_SETMASK, &all, &old);
    client__helper_running = pthread_create(&th, &attr, client_helper_main, NULL) == 0;
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    (void)pthread_attr_destroy(&attr);
}

int client__wake_pipe_open(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    client__wake_rd = p[0];
    atomic_store_explicit(&client__wake_wr, p[1], memory_order_relaxed);
    return 0;
}

/* Installs the attach handler unless the application has its own. */
void client__attach_install(void)
{
    struct sigaction old, sa;

    if (client__attach_signo <= 0 || client__attach_installed)
        return;
    if (sigaction(client__attach_signo, NULL, &old) < 0)
        return;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
        atomic_fetch_add_explicit(&client_stat_attach_unavailable, 1, memory_order_relaxed);
        if (client__attach_signo_explicit)
            client__say("heapprof: the attach signal has a handler already; attaching to this "
                        "process is disabled",
                        NULL);
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = client_attach_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    (void)sigfillset(&sa.sa_mask);
    client__attach_installed = sigaction(client__attach_signo, &sa, NULL) == 0;
}
