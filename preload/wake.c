/* preload/wake.c: how an attacher wakes a dormant client: the entry it calls remotely,
 * and the page that tells it where that entry is.
 *
 * The attacher (service/wake.c) stops one thread of ours with ptrace, makes it call
 * client_wake_entry(attacher pid) with every signal but SIGTRAP blocked, catches the
 * return at client_wake_trap (preload/wake_x86_64.S) and puts the thread back exactly
 * as it was, its system call included. No signal is sent: a program that waits for
 * signals (sigwaitinfo, signalfd), handles the old attach signal itself, or treats EINTR
 * as fatal sees nothing. The entry runs on whatever thread was stopped, at whatever
 * point it was (not inside an rseq critical section, with stack to spare): it obeys the
 * rules of a signal handler (raw system calls, no lock, no allocation, errno kept), and
 * only starts the session thread (preload/attach.c), which does the handshake.
 *
 * The advertisement: one read-only page of a memfd named HP_WAKE_MEMFD_NAME, written
 * with pwrite before it is mapped (common/wake.h). HEAPPROF_ATTACH=0 means "never
 * attachable": no page. */
#include "preload/client.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>

#include "common/sys.h"
#include "common/wake.h"

/* The remote call's entry (preload/wake.c) and its return trap (wake_x86_64.S). Not
 * exported: the attacher finds both through the advertisement page. */
int client_wake_entry(int attacher_pid, const char *sock_path);
void client_wake_trap(void);

/* True when the service has hung up on @s (or its descriptor is no longer valid): the
 * session thread is about to end it. Polling takes nothing from the socket. */
static bool client_session_hung_up(const struct client_session *s)
{
    struct pollfd pf = {.fd = s->sock, .events = POLLRDHUP};
    struct timespec zero = {0, 0};
    return hp_sys6(SYS_ppoll, (long)&pf, 1, (long)&zero, 0, 0, 0) > 0;
}

/* The pid of the process our client state belongs to, in a page the kernel zeroes in a
 * child of fork (MADV_WIPEONFORK) but not in a child that runs on our memory (vfork,
 * clone with CLONE_VM). A child made without our atfork handler (_Fork, clone or
 * syscall(SYS_fork) without CLONE_VM) inherits client__owner_pid, and with it state that
 * names its parent: a session thread that is not there (client_sthread_state), a session
 * whose ring it does not have, a lock a thread of the parent may have held at the fork
 * (preload/direct.c). Its wake entry tells it by the zero here, and adopts that state
 * (client_wake_adopt()). NULL: no MADV_WIPEONFORK (Linux before 4.14); such children stay
 * unattachable, and harmless. */
static _Atomic int *client_fork_owner;

void client__fork_owner_arm(void)
{
    if (client_fork_owner)
        atomic_store_explicit(client_fork_owner, (int)hp_sys0(SYS_getpid), memory_order_relaxed);
}

/* Maps and arms the page of client_fork_owner. */
static void client_fork_owner_init(void)
{
    void *p = hp_sys_mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hp_sys_failed((long)p))
        return;
    if (hp_sys3(SYS_madvise, (long)p, 4096, MADV_WIPEONFORK) < 0) {
        (void)hp_sys_munmap(p, 4096);
        return;
    }
    client_fork_owner = p;
    client__fork_owner_arm();
}

/* In process @pid, not the owner of the client state: true when this is a child of fork
 * with a copy of our memory that no atfork handler of ours saw, which now owns that copy;
 * its session thread forgets the parent's sessions first (client__forget_parent()). False
 * in a child that runs on another process's memory (vfork): nothing there is ours to
 * change. One of two threads woken at once adopts; the other's request is dropped (its
 * attacher times out). A vfork child of a child not adopted yet adopts memory that is
 * not its own: at worst that child is left unattachable, as all were before. */
static bool client_wake_adopt(int pid)
{
    int zero = 0;
    if (!client_fork_owner ||
        !atomic_compare_exchange_strong_explicit(client_fork_owner, &zero, pid,
                                                 memory_order_acq_rel, memory_order_relaxed))
        return false;
    /* No thread of ours was copied: the parent's session thread is not here. */
    client__sthread_forget();
    atomic_store_explicit(&client__adopt_pending, true, memory_order_relaxed);
    /* Release pairs with the acquire load of a wake on another thread: it sees the
     * forgotten thread state once it sees itself as the owner. */
    atomic_store_explicit(&client__owner_pid, pid, memory_order_release);
    return true;
}

/* The pid of the service at the other end of @s's socket, or HP_WAKE_PROFILED when it
 * cannot be told (the program reused the descriptor's number). */
static int client_session_peer(const struct client_session *s)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (!client__sock_ours(s) ||
        hp_sys6(SYS_getsockopt, s->sock, SOL_SOCKET, SO_PEERCRED, (long)&cred, (long)&len, 0) < 0 ||
        cred.pid <= 0)
        return HP_WAKE_PROFILED;
    return (int)cred.pid;
}

/* A request to attach from process @attacher_pid (0: the daemon socket), to connect to
 * @sock_path when not NULL (an attacher in other namespaces made it for us; then
 * @attacher_pid 0 is one outside our pid namespace: common/wake.h). Called by the
 * attacher on a thread it stopped, with signals blocked. Async-signal-safe: raw system
 * calls only, errno kept. Returns an HP_WAKE_* answer, which the attacher reports: a
 * request while profiling is refused with the service's pid. */
int client_wake_entry(int attacher_pid, const char *sock_path)
{
    int saved_errno = errno;
    int r = HP_WAKE_NOT_OWNER;
    int pid = (int)hp_sys0(SYS_getpid);
    bool adopted = false;
    /* In a vfork child (our memory, another process) the state is the parent's. */
    if (pid != atomic_load_explicit(&client__owner_pid, memory_order_acquire)) {
        adopted = client_wake_adopt(pid);
        if (!adopted)
            goto out;
    }
    /* An adopted child's session is its parent's: the session thread forgets it first
     * (also when the first thread could not be started). */
    if (atomic_load_explicit(&client__adopt_pending, memory_order_relaxed))
        adopted = true;
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (!adopted) {
        /* A request while profiling is refused with the service's pid; one that comes as
         * the service hangs up is served once the session thread has ended that session. */
        if (s && !client_session_hung_up(s)) {
            r = client_session_peer(s);
            goto out;
        }
        r = HP_WAKE_BUSY; /* a session is being set up (for another attacher) or taken down */
        if (!s && (atomic_load_explicit(&client_state, memory_order_relaxed) != CLIENT_DORMANT ||
                   atomic_load_explicit(&client__attaching, memory_order_acquire)))
            goto out;
    }
    int st = client__sthread_start(CLIENT_STHREAD_ATTACH, attacher_pid > 0 ? attacher_pid : 0,
                                   sock_path);
    r = st == 0 ? HP_WAKE_STARTED : st == -EBUSY ? HP_WAKE_BUSY : HP_WAKE_FAILED;
out:
    errno = saved_errno;
    return r;
}

/* Maps the advertisement page, for attachers to find in our maps. */
static void client_advertise(void)
{
    long fd = hp_sys2(SYS_memfd_create, (long)HP_WAKE_MEMFD_NAME, MFD_CLOEXEC);
    if (fd < 0)
        return;
    struct hp_wake_page pg = {
        .magic = HP_WAKE_MAGIC,
        .version = HP_WAKE_VERSION,
        .size = sizeof(pg),
        .entry = (uint64_t)(uintptr_t)client_wake_entry,
        .trap = (uint64_t)(uintptr_t)client_wake_trap,
        .features = HP_WAKE_FEATURE_PATH,
    };
    if (hp_sys2(SYS_ftruncate, fd, 4096) == 0 &&
        hp_sys4(SYS_pwrite64, fd, (long)&pg, sizeof(pg), 0) == (long)sizeof(pg)) {
        void *p = hp_sys_mmap(NULL, 4096, PROT_READ, MAP_SHARED, (int)fd, 0);
        /* kept for the life of the image; inherited by forked children, whose entry
         * checks the pid */
        client__attach_installed = !hp_sys_failed((long)p);
    }
    (void)hp_sys_close((int)fd);
}

/* Advertises the wake entry, unless HEAPPROF_ATTACH=0 turned attaching off. No
 * signal handler: none is needed, and the program keeps its signals to itself. */
void client__attach_install(void)
{
    if (!client__attach_enabled || client__attach_installed)
        return;
    client_fork_owner_init();
    client_advertise();
}
