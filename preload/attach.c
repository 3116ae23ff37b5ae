/* preload/attach.c: the session thread, which handshakes when an attacher woke the
 * client and watches a session until it ends (and records the frees the program's
 * threads hold in batches, preload/client.h).
 *
 * Dormant means free: while no session runs the process has no thread of ours, so a
 * single-threaded program stays single-threaded (glibc keeps its single-thread fast
 * paths: stdio without locks, malloc without atomic operations; unshare(CLONE_NEWUSER)
 * works). A session needs a thread: the handshake must happen promptly also in a process
 * blocked in read(2) that never allocates, outside the code that woke us (it blocks on
 * the service, and the wake may have stopped any code of the program), and someone must
 * notice when the service goes away. Alternatives weighed: the handshake inside the wake
 * call (blocking I/O on whatever thread the attacher stopped, and still no watcher
 * afterwards); the next allocation doing it (never comes in a blocked process); a pthread
 * created from the wake call (pthread_create is not async-signal-safe, and a thread glibc
 * knows turns the fast paths off while it lives).
 *
 * The way in (preload/wake.c, service/wake.c): the attacher stops one thread with ptrace
 * and makes it call client_wake_entry(), whose address the client advertises in a
 * read-only memfd page; the entry only starts the session thread, then the attacher puts
 * the thread back as it was, its interrupted system call included. An attach signal
 * (SIGRTMIN+4, until this) did the same from a handler, but a signal is the program's
 * business: it made epoll_wait and sigtimedwait fail with EINTR, reached programs that
 * sigwait() or read a signalfd, fired a handler of the program's own for that signal,
 * and stayed pending across exec when blocked. No signal is involved any more.
 *
 * So the wake starts a raw clone(2) thread, the session thread: CLONE_VM | CLONE_FS |
 * CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, every signal blocked, its
 * own mmap'd stack, and CLONE_SETTLS to a small private thread control block. glibc never
 * learns of it and still takes the process for single-threaded; that is correct only
 * because the thread never enters glibc where it could matter: it makes raw system calls
 * (common/sys.h: no errno, no cancellation, no lock), and calls nothing that takes a lock
 * or uses thread-local storage. Its control block holds a copy of the stack protector's
 * canary and pointer guard; below it lies zeroed memory as large as the static TLS
 * offsets we know of (errno's, ours), so that even a glibc wrapper that set errno on
 * failure (the sampled-address set's mmap, preload/freeset.c) would write there and not
 * into another thread. It exits (SYS_exit, CLONE_CHILD_CLEARTID clears its word) when the
 * session ends: the process is back to the dormant cost.
 *
 * What a raw thread must mind:
 *   fork      the child has no session thread (client__sthread_forget() in the atfork
 *             handler); its copy of the stack is free to reuse. A child made without
 *             the handler (_Fork, raw clone) does the same when first woken (wake.c).
 *   vfork     the child shares our memory: the wake entry ignores a call there (pid check).
 *   exec      kills every thread; the new image starts from scratch.
 *   setuid    glibc changes the ids of the threads it knows (its setxid broadcast), not
 *             ours: the session thread compares its ids with the process's every round
 *             and takes the new ones, for the service to check (preload/ids.c); it ends
 *             the session when it cannot.
 *   exit      exit_group ends the thread wherever it is; the service sees the hang-up.
 *
 * Descriptors: the session's socket is moved high (F_DUPFD_CLOEXEC) and its identity
 * (st_dev, st_ino) recorded; the thread checks it with fstat before every use and never
 * closes a descriptor that is no longer ours. It never reads or writes the socket after
 * the handshake (the ring wakes the service through a futex, shmem_ring/ring.h): it only
 * polls it for a hang-up. When the program closed or reused it, the client says so in the
 * ring (RING_END_CONN_TAKEN) and the session ends, visibly.
 *
 * Advertising: the page (common/wake.h) is mapped once the client is initialised and
 * the direct slots are set up; /proc/PID/maps then shows
 * "/memfd:heapprof-attach-wake (deleted)", which service/targets.c looks for. Attachers
 * read the entry's address there (it is not exported: the library exports allocator
 * entry points only).
 */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/macros.h"
#include "common/paths.h"
#include "common/sys.h"
#include "common/wake.h"
#include "preload/peer.h"
#include "shmem_ring/wire.h"

_Atomic uint64_t client_stat_sthread_failures = 0;

/* ---- the session thread -------------------------------------------------------------- */

#define STHREAD_GUARD 4096u
#define STHREAD_STACK (64u << 10)
#define STHREAD_TCB 4096u
/* At most this much room below the thread pointer for the static TLS of the process. */
#define STHREAD_MAX_SLACK (256u << 10)
/* How often the thread checks the socket's identity and the process's ids, and records
 * the frees left in batches (client.h). */
#define STHREAD_WATCH_MS 200
/* How often it looks for the service's asks for the frees in batches. */
#define STHREAD_ASK_MS 10

/* x86_64 glibc's tcbhead_t: the fields the compiler's code reads (tcb and self, the stack
 * protector's canary, the pointer guard). */
#define TCB_SELF_OFF 16
#define TCB_CANARY_OFF 0x28
#define TCB_PTR_GUARD_OFF 0x30

/* Who answers attach requests: STHREAD_NONE (the handler starts a thread), STHREAD_RUNNING
 * (a session thread runs and will look at requests before it exits), STHREAD_PENDING (it
 * runs and a request came meanwhile). The thread leaves only by a compare-and-swap from
 * RUNNING to NONE, so no request is ever lost between its last look and its exit. */
#define STHREAD_NONE 0
#define STHREAD_RUNNING 1
#define STHREAD_PENDING 2
static _Atomic int client_sthread_state;
_Atomic bool client__attaching;
static _Atomic int client_sthread_mode_arg; /* the first order of a new thread */

static void client_sleep_ms(unsigned ms);

/* The latest attach request: who woke us, and the socket it made for us (path[0] == 0:
 * none, the attacher's own). Written by a wake entry, taken by the session thread, each
 * holding client_request_lock, a flag taken by compare-and-swap: an entry that finds it
 * taken answers busy and never waits; the thread waits for an entry, which holds it for
 * the copy of a path. */
struct client_request {
    int attacher; /* 0: none, the daemon socket, or (with a path) outside our pid namespace */
    char path[HP_WAKE_PATH_MAX];
};
static _Atomic bool client_request_lock;
static struct client_request client_request;

/* Stores a request; -EBUSY when another one is being stored or taken. Async-signal-safe. */
static int client_request_put(int attacher, const char *path)
{
    bool expected = false;
    if (!atomic_compare_exchange_strong_explicit(&client_request_lock, &expected, true,
                                                 memory_order_acquire, memory_order_relaxed))
        return -EBUSY;
    size_t n = 0;
    while (path && n < sizeof(client_request.path) && path[n])
        n++;
    int r = 0;
    if (path && n == sizeof(client_request.path)) {
        r = -ENAMETOOLONG;
    } else {
        client_request.attacher = attacher;
        memcpy(client_request.path, path ? path : "", n);
        client_request.path[n] = '\0';
    }
    /* Release pairs with the acquire of client_request_take(). */
    atomic_store_explicit(&client_request_lock, false, memory_order_release);
    return r;
}

/* Takes the latest request into @ret and clears it. Session thread only. */
static void client_request_take(struct client_request *ret)
{
    for (;;) {
        bool expected = false;
        if (atomic_compare_exchange_strong_explicit(&client_request_lock, &expected, true,
                                                    memory_order_acquire, memory_order_relaxed))
            break;
        client_sleep_ms(1);
    }
    *ret = client_request;
    client_request = (struct client_request){0};
    atomic_store_explicit(&client_request_lock, false, memory_order_release);
}

/* Two stacks: a thread that just gave up its role may still be on its way out of its own
 * when the next one starts. Each slot's word is nonzero from the start of a thread until
 * the kernel saw it exit (CLONE_CHILD_CLEARTID). */
struct client_sthread_slot {
    _Atomic int word;
    uint8_t *map; /* guard, stack, TLS slack, TCB; kept for reuse */
};
static struct client_sthread_slot client_sthread_slots[2];
static size_t client_sthread_slack;

/* Starts @fn(@arg) on a new thread (clone(2) with @flags) whose stack ends at @stack_top
 * and thread pointer is @tls; the thread exits when @fn returns. Returns its id or
 * -errno. */
static long client_clone(unsigned long flags, void *stack_top, _Atomic int *ctid, void *tls,
                         void (*fn)(void *), void *arg)
{
    void **sp = stack_top;
    *--sp = arg;
    *--sp = (void *)fn;
    register long r10 __asm__("r10") = (long)ctid;
    register long r8 __asm__("r8") = (long)tls;
    long ret;
    /* The child starts on @sp with nothing of this frame: it pops fn and arg, aligns its
     * stack for the call and never returns here. */
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t"
                     "pop %%rax\n\t"
                     "pop %%rdi\n\t"
                     "and $-16, %%rsp\n\t"
                     "call *%%rax\n\t"
                     "mov %[nr_exit], %%eax\n\t"
                     "xor %%edi, %%edi\n\t"
                     "syscall\n\t"
                     "hlt\n"
                     "1:"
                     : "=a"(ret)
                     : "a"(SYS_clone), "D"(flags), "S"(sp), "d"(0L), "r"(r10),
                       "r"(r8), [nr_exit] "i"(SYS_exit)
                     : "rcx", "r11", "memory");
    return ret;
}

static void client_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    (void)hp_sys2(SYS_nanosleep, (long)&ts, 0);
}

/* Handshakes after a wake from @req->attacher (0: the daemon). Returns 0 when profiling. */
static int client_attach(const struct client_request *req)
{
    char path[HP_PATH_MAX];
    const char *xdg = client__env_xdg_set ? client__env_xdg : NULL;
    uid_t uid = (uid_t)hp_sys0(SYS_getuid);
    int attacher = req->attacher;
    int r;

    /* A socket the attacher made for us (it lives in other namespaces: a container): that
     * one only, and its peer must be the attacher (or, outside our pid namespace, a
     * process we cannot see: preload/peer.h). */
    if (req->path[0]) {
        r = client__session_open(req->path, WIRE_REASON_ATTACH,
                                 attacher > 0 ? attacher : CLIENT_PEER_HIDDEN, client__timeout_ms,
                                 true);
        if (r != 0)
            return r < 0 ? r : -EPERM;
        goto warm_up;
    }
    if (attacher > 0)
        r = hp_socket_path(xdg, uid, attacher, path, sizeof(path));
    else if (client__env_socket[0])
        r = (memcpy(path, client__env_socket, sizeof(path)), 0);
    else
        r = hp_socket_path(xdg, uid, 0, path, sizeof(path));
    if (r < 0)
        return r;
    /* Failures are silent: the attacher reports them. */
    r = client__session_open(path, WIRE_REASON_ATTACH, attacher > 0 ? attacher : 0,
                             client__timeout_ms, true);
    /* Not there for us (another user's attacher, root with --allow-other-users, whose
     * runtime directory we cannot enter): its abstract socket (common/paths.h). */
    if (attacher > 0 && (r == -ENOENT || r == -EACCES || r == -ECONNREFUSED || r == -ENOTDIR) &&
        hp_attach_abstract_name(attacher, path, sizeof(path)) == 0)
        r = client__session_open(path, WIRE_REASON_ATTACH, attacher, client__timeout_ms, true);
    if (r != 0)
        return r < 0 ? r : -EPERM;
warm_up:
    /* Threads that allocate during the warm-up reseed for this session (see
     * CLIENT_FAST_WARM_UP); then the fast path takes over. */
    client_sleep_ms(CLIENT_WARM_UP_MS);
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_relaxed);
    uint64_t expected = CLIENT_FAST_WARM_UP;
    if (s)
        (void)atomic_compare_exchange_strong_explicit(&client_fast_interval, &expected,
                                                      s->params.interval, memory_order_relaxed,
                                                      memory_order_relaxed);
    return 0;
}

/* Waits up to STHREAD_WATCH_MS for a hang-up of @s's socket; the ppoll(2) result. With
 * frees in batches (client.h) it waits in steps of STHREAD_ASK_MS, and between them
 * records what the batches hold when the service asked for it (@flush_seen: the last ask
 * answered). The wait stays on the socket all along: a program that closes it while we
 * wait is seen by us first, as a hang-up is not (the descriptor keeps it open). */
static long client_watch_wait(struct client_session *s, uint32_t *flush_seen)
{
    bool batches = (s->features & WIRE_FEATURE_FREE_BATCH) != 0;
    unsigned steps = batches ? STHREAD_WATCH_MS / STHREAD_ASK_MS : 1;
    long step_ms = batches ? STHREAD_ASK_MS : STHREAD_WATCH_MS;
    for (unsigned i = 0; i < steps; i++) {
        uint32_t asked = batches ? ring_flush_asked(s->ring) : *flush_seen;
        if (asked != *flush_seen) {
            client__freebufs_sweep(s, false);
            ring_flush_answer(s->ring, asked);
            *flush_seen = asked;
        }
        /* Only a hang-up is asked for: polling takes nothing from the socket, even if its
         * number was reused since it was looked at. */
        struct pollfd pf = {.fd = s->sock, .events = POLLRDHUP};
        struct timespec ts = {0, step_ms * 1000000L};
        long n = hp_sys6(SYS_ppoll, (long)&pf, 1, (long)&ts, 0, 0, 0);
        if (n != 0)
            return n;
    }
    return 0;
}

/* Watches the current session until it ends. */
static void client_watch(void)
{
    uint32_t flush_seen = 0; /* the last ask for the frees in batches answered */
    for (;;) {
        struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
        if (!s)
            return;
        if (!client__sock_ours(s)) {
            /* The program closed or reused our descriptor: its number is not ours to
             * touch. Say why, for the service, which may not have seen a hang-up (the
             * socket may live on in a child). */
            ring_set_client_ended(s->ring, RING_END_CONN_TAKEN);
            client__session_close(s, false);
            return;
        }
        if (client__ids_follow(s) < 0) {
            ring_set_client_ended(s->ring, RING_END_CREDENTIALS);
            client__session_close(s, true);
            return;
        }
        /* The frees left in the batches of threads that went idle or away. */
        if ((s->features & WIRE_FEATURE_FREE_BATCH) && !client__sweep_off)
            client__freebufs_sweep(s, true);
        if (client_watch_wait(s, &flush_seen) <= 0)
            continue;
        if (!client__sock_ours(s))
            continue; /* said above, next round */
        /* The service ended the session (or died): it sends nothing after the
         * handshake. */
        client__session_close(s, true);
        return;
    }
}

/* client_attach(), flagged for client_wake_entry(): a request that comes meanwhile is
 * answered "busy", not queued behind this one (which it would find profiling). */
static int client_serve_handshake(const struct client_request *req)
{
    atomic_store_explicit(&client__attaching, true, memory_order_release);
    int r = client_attach(req);
    atomic_store_explicit(&client__attaching, false, memory_order_release);
    return r;
}

/* A request to attach: handshake (unless profiling already) and watch the session. */
static void client_serve_attach(void)
{
    struct client_request req;
    client_request_take(&req);
    /* A child of fork the wake adopted (preload/wake.c): its sessions are its parent's. */
    if (atomic_exchange_explicit(&client__adopt_pending, false, memory_order_acquire))
        client__forget_parent(false, false);
    /* A request while profiling is ignored. */
    if (!atomic_load_explicit(&client_current, memory_order_relaxed) &&
        atomic_load_explicit(&client_state, memory_order_relaxed) == CLIENT_DORMANT &&
        client_serve_handshake(&req) == 0)
        client_watch();
}

static void client_sthread_main(void *arg)
{
    (void)arg;
    if (atomic_load_explicit(&client_sthread_mode_arg, memory_order_relaxed) ==
        CLIENT_STHREAD_ATTACH)
        client_serve_attach();
    else
        client_watch();
    /* Requests that came while we were busy, then leave. */
    for (;;) {
        int expected = STHREAD_PENDING;
        if (atomic_compare_exchange_strong_explicit(&client_sthread_state, &expected,
                                                    STHREAD_RUNNING, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            client_serve_attach();
            continue;
        }
        expected = STHREAD_RUNNING;
        if (atomic_compare_exchange_strong_explicit(&client_sthread_state, &expected, STHREAD_NONE,
                                                    memory_order_acq_rel, memory_order_relaxed))
            return;
    }
}

/* The room the static TLS of the process needs below the thread pointer: as far as the
 * farthest variable we know of (errno, ours), rounded up. */
static size_t client_tls_slack(void)
{
    uintptr_t tp = (uintptr_t)__builtin_thread_pointer();
    uintptr_t lo = HP_MIN((uintptr_t)&errno, (uintptr_t)&client_tls);
    size_t need = tp > lo ? tp - lo + 64 : 4096;
    return HP_ALIGN_UP(need, (size_t)4096);
}

/* Starts a thread on a free slot. pre: the caller moved client_sthread_state from NONE. */
static int client_sthread_spawn(void)
{
    struct client_sthread_slot *slot = NULL;
    for (unsigned i = 0; i < HP_ARRAY_SIZE(client_sthread_slots) && !slot; i++) {
        int expected = 0;
        if (atomic_compare_exchange_strong_explicit(&client_sthread_slots[i].word, &expected, -1,
                                                    memory_order_acquire, memory_order_relaxed))
            slot = &client_sthread_slots[i];
    }
    if (!slot)
        return -EBUSY; /* two threads still on their way out: not in practice */
    if (!slot->map) {
        if (!client_sthread_slack)
            client_sthread_slack = client_tls_slack();
        if (client_sthread_slack > STHREAD_MAX_SLACK)
            goto fail_nomem;
        size_t len = STHREAD_GUARD + STHREAD_STACK + client_sthread_slack + STHREAD_TCB;
        uint8_t *m = hp_sys_mmap(NULL, len, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (hp_sys_failed((long)m))
            goto fail_nomem;
        (void)hp_sys3(SYS_mprotect, (long)m, STHREAD_GUARD, PROT_NONE);
        slot->map = m;
    }
    uint8_t *stack_top = slot->map + STHREAD_GUARD + STHREAD_STACK;
    uint8_t *tp = stack_top + client_sthread_slack;
    memset(stack_top, 0, client_sthread_slack + STHREAD_TCB);
    uint64_t canary, ptr_guard;
    __asm__("mov %%fs:%c1, %0" : "=r"(canary) : "i"(TCB_CANARY_OFF));
    __asm__("mov %%fs:%c1, %0" : "=r"(ptr_guard) : "i"(TCB_PTR_GUARD_OFF));
    *(void **)tp = tp;
    *(void **)(tp + TCB_SELF_OFF) = tp;
    memcpy(tp + TCB_CANARY_OFF, &canary, sizeof(canary));
    memcpy(tp + TCB_PTR_GUARD_OFF, &ptr_guard, sizeof(ptr_guard));

    /* Every signal blocked in the new thread (it inherits the mask): signals are the
     * program's business, and a handler must never run on a thread without glibc state. */
    uint64_t all = ~0ull, old;
    (void)hp_sys4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)&old, 8);
    long r = client_clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                              CLONE_SYSVSEM | CLONE_SETTLS | CLONE_CHILD_CLEARTID,
                          stack_top, &slot->word, tp, client_sthread_main, NULL);
    (void)hp_sys4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&old, 0, 8);
    if (r < 0) {
        atomic_store_explicit(&slot->word, 0, memory_order_release);
        return (int)r;
    }
    return 0;

fail_nomem:
    atomic_store_explicit(&slot->word, 0, memory_order_release);
    return -ENOMEM;
}

int client__sthread_start(enum client_sthread_mode mode, int attacher, const char *sock_path)
{
    if (mode == CLIENT_STHREAD_ATTACH) {
        int r = client_request_put(attacher, sock_path);
        if (r < 0)
            return r;
    }
    for (;;) {
        int st = atomic_load_explicit(&client_sthread_state, memory_order_acquire);
        if (st == STHREAD_NONE) {
            if (!atomic_compare_exchange_weak_explicit(&client_sthread_state, &st, STHREAD_RUNNING,
                                                       memory_order_acq_rel, memory_order_relaxed))
                continue;
            atomic_store_explicit(&client_sthread_mode_arg, (int)mode, memory_order_relaxed);
            int r = client_sthread_spawn();
            if (r < 0) {
                atomic_fetch_add_explicit(&client_stat_sthread_failures, 1, memory_order_relaxed);
                atomic_store_explicit(&client_sthread_state, STHREAD_NONE, memory_order_release);
            }
            return r;
        }
        /* A thread runs: it looks at an attach request before it leaves; a thread that
         * watches already is all a startup session needs. */
        if (mode != CLIENT_STHREAD_ATTACH || st == STHREAD_PENDING)
            return -EBUSY;
        if (atomic_compare_exchange_weak_explicit(&client_sthread_state, &st, STHREAD_PENDING,
                                                  memory_order_acq_rel, memory_order_relaxed))
            return 0;
    }
}

void client__sthread_forget(void)
{
    atomic_store_explicit(&client_sthread_state, STHREAD_NONE, memory_order_relaxed);
    for (unsigned i = 0; i < HP_ARRAY_SIZE(client_sthread_slots); i++)
        atomic_store_explicit(&client_sthread_slots[i].word, 0, memory_order_relaxed);
}
