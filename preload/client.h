/* preload/client.h: state shared by the files of libheapprof.so (internal).
 *
 * Life of the client:
 *
 *   UNINIT -> INITIALIZING -> DORMANT <-> ACTIVE
 *                               attach signal / detach (socket closed)
 *
 * INITIALIZING: one thread reads the environment and, when asked to, does the startup
 * handshake (the others pass through meanwhile). DORMANT: no session and no thread of
 * ours; the exported functions load one global and jump to glibc; the attach signal's
 * handler starts the session thread (preload/attach.c), which handshakes and makes the
 * client ACTIVE. ACTIVE: sampling into the session's ring; the session thread watches the
 * connection, and when the service closes it (end of session, service death), or the
 * program closes or reuses its descriptor, ends the session, returns the client to
 * DORMANT (attachable again) and exits. A failed or refused startup handshake also leaves
 * the client DORMANT. PASSTHROUGH (nothing will ever be profiled) is kept for callers
 * that need it; nothing enters it today.
 *
 * Sessions live in a small static array and are never freed while a hook may use them:
 *
 *     struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
 *     if (s && client_session_enter(s)) { use(s->ring); client_session_leave(s); }
 *
 * Everything here is hook-safe unless said otherwise.
 */
#ifndef HP_PRELOAD_CLIENT_H
#define HP_PRELOAD_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/paths.h"
#include "preload/blockstate.h"
#include "preload/freeset.h"
#include "preload/sample.h"
#include "preload/stack.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

#pragma GCC visibility push(hidden)

enum client_state {
    CLIENT_UNINIT = 0,
    CLIENT_INITIALIZING = 1,
    CLIENT_DORMANT = 2,
    CLIENT_ACTIVE = 3,
    CLIENT_PASSTHROUGH = 4,
};

/* client_fast_interval outside ACTIVE. OFF: the hooks forward at once, touching no
 * per-thread state (DORMANT, PASSTHROUGH). UNINIT: every allocation takes the slow path,
 * which initialises. WARM_UP: the first CLIENT_WARM_UP_MS of an attached session, every
 * allocation takes the slow path, so that threads whose counter is left over from an
 * earlier session (with another interval) reseed at once; a thread that does not
 * allocate then keeps its old distance, which is unbiased when the interval is the same
 * (the geometric distribution has no memory). */
#define CLIENT_FAST_OFF 0u
#define CLIENT_FAST_UNINIT 1u
#define CLIENT_FAST_WARM_UP 1u
#define CLIENT_WARM_UP_MS 10
#define CLIENT_DEFAULT_INIT_TIMEOUT_MS 5000u
/* HEAPPROF_STARTUP unset and the socket exists: a short, silent attempt. */
#define CLIENT_OPTIONAL_TIMEOUT_MS 1000u
/* Sessions kept at once: the current one plus detached ones whose ring a late writer may
 * still hold. */
#define CLIENT_MAX_SESSIONS 4
/* A detach waits this long for in-flight writers before giving the slot up for good. */
#define CLIENT_DETACH_WAIT_MS 5000u

/* Heaps of the program's own (include/heapprof.h, preload/heapapi.c): ids 1..this. */
#define CLIENT_MAX_HEAPS 32
/* First level of such a heap's sampled-block set: smaller than malloc's (2^16 slots, half
 * a MiB of address space), mapped on the heap's first sample in a slot. python.objects
 * takes malloc's size (client_heap_set_ready()). */
#define CLIENT_HEAP_FREESET_LOG2 16

/* Per-thread state; initial-exec TLS, keep it small (DESIGN.md: under 1 KiB in all). */
struct client_tls {
    struct client_sampler sampler; /* bytes_left first: the fast path's only access */
    struct client_stack_cache stack;
    uint64_t gen;          /* session the sampler is seeded for; 0: none */
    uint32_t tid;          /* 0 until needed */
    uint32_t walks;        /* stacks walked with the unwind table, for the audit rate */
    uint8_t writer_shard;  /* 1 + its line of client_session.writers; 0: none yet */
    uint16_t freebuf;      /* 1 + its batch of frees in client_freebufs; 0: none yet */
    bool freebuf_none;     /* none was free: frees are recorded one by one until... */
    uint32_t freebuf_back; /* ...client_freebufs_back differs from this */
    bool freebuf_busy;     /* in its batch: a free in a signal handler records at once */
    uint32_t freebuf_tid;  /* the tid it took its batch with (the batch's owner) */
    bool in_hook;          /* reentrancy guard: inside, forward to glibc at once */
    bool in_sample;        /* recording a sample: an allocation now is a bug (see trap below) */
    /* While the python.objects wrapper is in the object allocator (preload/pyheap.c): the
     * size of the malloc-family block that serves the object when pymalloc does not (as
     * CPython asks it, 0 counted as 1), whose sample python.objects owns; else 0. */
    uint64_t pyobj_size;
};
extern __thread struct client_tls client_tls __attribute__((tls_model("initial-exec")));

/* Lines of client_session.writers: threads recording at once each count on their own
 * up to this many threads. */
#define CLIENT_WRITER_SHARDS 16
struct client_writers {
    _Alignas(64) _Atomic uint64_t n;
};

/* Frees of sampled blocks recorded in batches (WIRE_FEATURE_FREE_BATCH, preload/record.c,
 * preload/freeset.h): a free turns the block's entry in the set PENDING and puts the
 * entry's slot in its thread's batch; the thread records the batch as one WIRE_FREES
 * record when it is full; the session thread records what every batch holds every round
 * (an idle thread's frees are late by one round at most, STHREAD_WATCH_MS) and when the
 * service asks (before a dump or a query); exit(), _exit() and _Exit() record all of
 * them. Batches belong to threads (by tid) across sessions: a slot is only a hint of where
 * to look, the set says whether its free is still to be recorded. A thread that finds all
 * CLIENT_FREEBUFS taken records its frees one by one until the session thread takes back
 * the batch of a thread that has gone. */
#define CLIENT_FREEBUF_LEN 16
#define CLIENT_FREEBUFS 256
struct client_freebuf {
    _Alignas(64) _Atomic uint32_t owner; /* tid; 0: nobody's */
    _Atomic uint32_t n;                  /* entries in it; written by the owner only */
    uint32_t epoch;                      /* owner only: batches recorded, for the tag */
    /* Where each free's entry is in the malloc family's set (a PENDING entry with the
     * batch's tag, preload/freeset.h, unless it moved on since). */
    _Atomic uint64_t slot[CLIENT_FREEBUF_LEN];
};
extern struct client_freebuf client_freebufs[CLIENT_FREEBUFS];
/* Batches taken back from threads that have gone, so far: a thread that found none free
 * looks again when this moves. */
extern _Atomic uint32_t client_freebufs_back;

/* One handshake's worth of state. Written by the thread that owns the sessions (the
 * initialising thread, the session thread, or the child in its atfork handler) before
 * being published in client_current (release). */
struct client_session {
    ring_t *ring; /* NULL: slot free */
    /* The connection to the service: moved to a high number, and ours only while
     * (sock_dev, sock_ino) still name it (client__sock_ours()): the program may close
     * or reuse any descriptor. Nothing is ever sent on it after the handshake. */
    int sock;
    uint64_t sock_dev, sock_ino;
    pid_t pid;
    uint32_t features; /* accepted by the service */
    uint64_t gen;      /* > 0, unique per session */
    uint64_t max_stack_bytes;
    struct client_sampler_params params;
    /* The unwind table (WIRE_FEATURE_UNWIND_TABLE), mapped read-only; hdr NULL: none.
     * Every audit_every-th walk of a thread is sent with the stack copy too (0: never). */
    struct utable utable;
    uint32_t audit_every;
    /* After code was unloaded, the table generation of that moment: its rules may
     * describe code that is gone, so no walk uses it (hook_record_alloc); the service
     * starts a new generation once it has reread the maps (WIRE_MAPS_CHANGED with
     * WIRE_MAPS_UNLOADED, preload/record.c). 0: no hold. */
    _Atomic uint64_t walk_hold_gen;
    /* glibc's counts of objects loaded and unloaded (client_dl_counts()) when the sampled
     * path last told the service (or at the handshake). */
    _Atomic uint64_t dl_adds, dl_subs; /* CLIENT_DL_UNKNOWN: not read yet (attach) */
    /* Changes counted there whose WIRE_MAPS_CHANGED found no room in the ring, as its
     * WIRE_MAPS_* flags and CLIENT_UNTOLD_LOADED: told by the next sample. */
    _Atomic uint32_t dl_untold;
    struct client_freeset freeset; /* mapped once per slot, cleared on reuse */
    /* New frees of the malloc family go into batches (WIRE_FEATURE_FREE_BATCH accepted,
     * until exit() recorded the batches). */
    _Atomic bool frees_batched;
    /* The heaps the session records (WIRE_FEATURE_HEAPS; without it, malloc only):
     * malloc_on for the malloc family; bit h of heaps_on for the program's heap h (set
     * when the heap is registered, before or during the session: preload/heapapi.c). */
    bool malloc_on;
    _Atomic uint64_t heaps_on;
    struct wire_heaps heap_select;    /* the service's selection, for heaps registered later */
    _Atomic uint32_t heap_names_sent; /* heaps whose name is in the ring (ids 1..this) */
    /* Per heap of the program's own: its sampled blocks, mapped on its first sample
     * (client_heap_set_ready()), cleared on reuse like freeset. */
    struct client_freeset heap_sets[CLIENT_MAX_HEAPS];
    /* Hooks inside client_session_enter/leave. Written twice by every record: each
     * thread counts on a line of its own (client_tls.writer_shard; threads beyond
     * CLIENT_WRITER_SHARDS share), so that threads recording at once do not take one
     * line from each other, and away from the fields every free() reads. */
    struct client_writers writers[CLIENT_WRITER_SHARDS];
    bool stuck; /* writers never drained: slot kept mapped for good */
    /* Block mode after a wait ran out: when to wait again (preload/blockstate.h), and
     * the wait the service asked for. */
    struct client_block block;
    uint32_t block_timeout_us;
    /* CLOCK_MONOTONIC_COARSE of the last poke for a full ring (preload/record.c). */
    _Atomic uint64_t full_poke_ns;
    /* A page the kernel zeroes in a child of fork (MADV_WIPEONFORK): while *fork_token
     * == gen we are the process that did the handshake, however the child was made
     * (_Fork, clone without CLONE_VM), with no system call. Children sharing our memory
     * (vfork, CLONE_VM) see the token and write into the ring: that is their parent's
     * memory, the records are as valid as the parent's. NULL: use getpid(). */
    _Atomic uint64_t *fork_token;
    /* WIRE_PY_RUNTIME written in this session's ring (preload/record.c). */
    _Atomic bool py_told;
    char path[HP_PATH_MAX]; /* socket of the session (follow forks) */
    pid_t peer_pid;         /* the service's pid (SO_PEERCRED): a followed fork's only peer */
};

extern struct client_session client_sessions[CLIENT_MAX_SESSIONS];
/* The ACTIVE session, or NULL. Stored with release (seq_cst on detach); loaded with
 * acquire by the hooks. */
extern _Atomic(struct client_session *) client_current;
extern _Atomic int client_state;
/* Sampling interval for the fast path while ACTIVE; else a CLIENT_FAST_* value. */
extern _Atomic uint64_t client_fast_interval;
extern uint64_t client_seed;
/* HEAPPROF_TRAP_REENTRY=1 (tests): abort when the sampled path itself allocates, which
 * would be a hook-safety bug (with interval 1 every allocation reaches the check). */
extern bool client_trap_reentry;

extern _Atomic uint64_t client_thread_counter;

/* Statistics (relaxed counters, for tests and debugging). */
extern _Atomic uint64_t client_stat_unknown_stacks;
extern _Atomic uint64_t client_stat_freeset_overflows; /* samples dropped: set full */
extern _Atomic uint64_t client_stat_foreign_pid_samples;

/* The calling thread's line of @s->writers, given on its first record. A signal handler
 * that interrupts the choice may make another one: enter and leave each read it, and the
 * handler leaves what it entered before the interrupted code goes on. */
static inline _Atomic uint64_t *client_writer_count(struct client_session *s)
{
    unsigned k = client_tls.writer_shard;
    if (__builtin_expect(k == 0, 0)) {
        k = 1 +
            (unsigned)(atomic_fetch_add_explicit(&client_thread_counter, 1, memory_order_relaxed) %
                       CLIENT_WRITER_SHARDS);
        client_tls.writer_shard = (uint8_t)k;
    }
    return &s->writers[k - 1].n;
}

/* A hook announces itself before using @s; false when @s is no longer current (the
 * caller must not touch it). seq_cst pairs with the detaching thread's store of
 * client_current and loads of s->writers (a Dekker handshake, per line: a writer that
 * counts itself after the detacher read its line sees the store and backs out). */
static inline bool client_session_enter(struct client_session *s)
{
    _Atomic uint64_t *n = client_writer_count(s);
    atomic_fetch_add_explicit(n, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&client_current, memory_order_seq_cst) == s)
        return true;
    atomic_fetch_sub_explicit(n, 1, memory_order_release);
    return false;
}

static inline void client_session_leave(struct client_session *s)
{
    /* Release: our ring writes happen before the detaching thread sees zero. */
    atomic_fetch_sub_explicit(client_writer_count(s), 1, memory_order_release);
}

/* True while a hook is inside @s (seq_cst loads: see client_session_enter()). */
static inline bool client_session_busy(struct client_session *s)
{
    for (unsigned i = 0; i < CLIENT_WRITER_SHARDS; i++)
        if (atomic_load_explicit(&s->writers[i].n, memory_order_seq_cst) != 0)
            return true;
    return false;
}

/* Every line of @s->writers to 0 (a new session, or a child of fork). */
static inline void client_session_writers_reset(struct client_session *s)
{
    for (unsigned i = 0; i < CLIENT_WRITER_SHARDS; i++)
        atomic_store_explicit(&s->writers[i].n, 0, memory_order_relaxed);
}

/* Reads the environment and does the startup handshake when asked to; runs once. Called
 * with the caller's in_hook set, from the constructor or the first hook call, whichever
 * comes first. Not hook-safe in the strict sense: blocks up to HEAPPROF_INIT_TIMEOUT_MS. */
void client_init(void);

/* Slow path of the allocation hooks (preload/record.c), reached through
 * client_sample_tramp (preload/tramp_x86_64.S) with the caller's registers in @regs.
 * Returns @ret. */
uintptr_t client_alloc_slow(uintptr_t p, size_t size, uintptr_t ret, const uint64_t *regs);
/* Trampolines: tail-called from the exported functions, they capture the registers of
 * the application's frame and call client_alloc_slow(). Both return @ret. */
void *client_sample_tramp(void *p, size_t size, void *ret);
int client_sample_tramp_int(void *p, size_t size, int ret);
/* Records the free of sampled block @addr of @heap (taken out of its set already). */
void client_record_free(struct client_session *s, uint32_t heap, uint64_t addr);
/* Records the free of @addr of the malloc family (aligned to 4, below 2^48) when it was
 * sampled: into the thread's batch, or at once. */
void client_free_batched(struct client_session *s, uint64_t addr);
/* Records the frees still to be recorded in every thread's batch; takes back the batches
 * of threads that have gone when @reclaim (session thread). Hook-safe. */
void client__freebufs_sweep(struct client_session *s, bool reclaim);
/* In a child of fork, alone: no batch is anybody's (the parent's threads are not here). */
void client__freebufs_forget(void);
/* The heap API's slow path (preload/record.c), reached through client_heap_tramp with
 * the caller's registers in @regs: samples (@sample_size 0: with the thread's sampler) and
 * records a block of the program's heap @heap. True when recorded. */
bool client_heap_slow(uint32_t heap, uint64_t id, uint64_t size, uint64_t sample_size,
                      const uint64_t *regs);
bool client_heap_tramp(uint32_t heap, uint64_t id, uint64_t size, uint64_t sample_size);

/* ---- the program's own heaps (preload/heapapi.c) ---- */

/* Bit h: heap h may be recorded (some session selected it). The heap API's fast path
 * reads it after client_fast_interval; the slow path asks client_heap_selected(). A bit
 * may stay set after its session (a registration racing the end): it costs the slow path,
 * never a record. */
extern _Atomic uint64_t client_heaps_fast;
/* True when @s records @heap (1..CLIENT_MAX_HEAPS). Hook-safe. */
static inline bool client_heap_selected(struct client_session *s, uint32_t heap)
{
    return heap >= 1 && heap <= CLIENT_MAX_HEAPS &&
           ((atomic_load_explicit(&s->heaps_on, memory_order_relaxed) >> heap) & 1);
}
/* The block @id of @heap was freed: recorded when it was sampled (heapprof_report_free()).
 * Inline for python.objects' wrapper (preload/pyheap.c), which calls it on every object
 * free. Hook-safe. */
static inline void client_heap_free(uint32_t heap, uint64_t id)
{
    /* Acquire pairs with the release store publishing the session (its sets are set). */
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (HP_LIKELY(s == NULL) || heap - 1 >= CLIENT_MAX_HEAPS)
        return;
    struct client_freeset *set = &s->heap_sets[heap - 1];
    /* Acquire pairs with the release store of nlevels when the set was mapped. */
    if (atomic_load_explicit(&set->nlevels, memory_order_acquire) == 0 ||
        HP_LIKELY(!client_freeset_maybe(set, id)))
        return;
    if (client_freeset_remove(set, id))
        client_record_free(s, heap, id);
}
/* Maps @heap's set of sampled blocks in @s on its first sample; false when it cannot be
 * used now (another thread is mapping it, or the mapping failed: the sample is dropped
 * and counted). Hook-safe. */
bool client_heap_set_ready(struct client_session *s, uint32_t heap);
/* Heaps registered so far (ids 1..this). */
extern _Atomic uint32_t client_heap_count;
/* A new session @s: which heaps it records (@sel: the service's selection; NULL: malloc
 * only, an older service). Owner only, before @s is published. */
void client__heaps_open(struct client_session *s, const struct wire_heaps *sel);
/* After @s is published: the heaps registered so far are recorded when @s selects them.
 * Owner only; also on the raw session thread (atomics only). */
void client__heaps_announce(struct client_session *s);
/* Writes the names of the heaps registered since the last call into @s's ring. Sampled
 * path, inside @s, before a sample. */
void client__heap_names_flush(struct client_session *s);
/* The session ends: no heap is recorded. */
void client__heaps_close(void);
/* Empties the heap sets of @s mapped so far, for the slot's next session (as
 * client_freeset_clear()). Owner only, no hook inside @s. */
void client__heap_sets_clear(struct client_session *s);

/* Finds the loader's lock (preload/dl.c). Once, at initialisation, from a thread glibc
 * knows; not hook-safe (it waits for the lock). */
void client_dl_init(void);
/* What client_dl_counts() found. */
enum { CLIENT_DL_OK, CLIENT_DL_BUSY, CLIENT_DL_NONE };
/* glibc's counts of objects added to and removed from the link maps so far
 * (preload/dl.c). Hook-safe: never waits for the loader's lock. CLIENT_DL_BUSY: another
 * thread holds it (loading, unloading, or listing objects); CLIENT_DL_NONE: unknown
 * here. */
int client_dl_counts(uint64_t *ret_adds, uint64_t *ret_subs);
/* Takes the loader's lock when no other thread holds it (true), never waiting; false
 * also when it was not found. client_dl_unlock() gives it back. Hook-safe. */
bool client_dl_lock_try(void);
void client_dl_unlock(void);
/* client_session.dl_untold: code was loaded (WIRE_MAPS_* flags use the low bits). */
#define CLIENT_UNTOLD_LOADED (1u << 31)
/* client_session.dl_adds and dl_subs before they were read. */
#define CLIENT_DL_UNKNOWN UINT64_MAX

/* ---- shared by the files of the client (preload/client.c, session.c, attach.c) ---- */

/* Read once from the environment by client_init(). */
extern char client__env_socket[HP_PATH_MAX]; /* HEAPPROF_SOCKET, "" when unset */
extern bool client__env_socket_too_long;
extern char client__env_xdg[HP_PATH_MAX]; /* XDG_RUNTIME_DIR (longer: unusable anyway) */
extern bool client__env_xdg_set;
extern uint32_t client__timeout_ms;
/* Loaded into a running program (dlopen'ed after the C library: heapprof attach loads it
 * so, service/inject.c), not preloaded: no startup handshake. Set by client_init(). */
extern bool client__late;
/* Sets client__late, once (the constructor, first thing; client_init()). */
void client__late_init(void);
/* HEAPPROF_TEST_SWEEP=0 (tests): the session thread records the batches of frees only
 * when the service asks, never on its own. */
extern bool client__sweep_off;
/* HEAPPROF_ATTACH=0 (or its older name HEAPPROF_ATTACH_SIGNAL=0) turns attaching off. */
extern bool client__attach_enabled;
/* Attach machinery (preload/attach.c). */
extern bool client__attach_installed; /* the wake entry is advertised */
/* The process the client state belongs to (set at init and in a forked child): the wake
 * entry ignores calls in a vfork child, which shares our memory. */
extern _Atomic int client__owner_pid;
/* A child of fork adopted at a wake (preload/wake.c): its session thread calls
 * client__forget_parent() before anything else. */
extern _Atomic bool client__adopt_pending;
/* The session thread is handshaking after a wake (the wake entry answers "busy"). */
extern _Atomic bool client__attaching;
extern _Atomic uint64_t client_stat_attach_unavailable;
extern _Atomic uint64_t client_stat_sthread_failures;

/* Writes the NULL-terminated pieces to stderr as one line, in one write(2). */
void client__say(const char *first, ...);
/* A constant description of @err (no locale, no allocation). */
const char *client__strerror(int err);
/* Handshakes on @path and, when the service profiles us, publishes the new session and
 * makes the client ACTIVE. @peer_pid > 0: only that process may answer (the attacher that
 * woke us, a followed fork's service); who else may, preload/peer.h. Returns 0 (ACTIVE),
 * 1 (NOT_PROFILED) or -errno. Owner only. */
int client__session_open(const char *path, uint32_t reason, pid_t peer_pid, uint32_t timeout_ms,
                         bool warm_up);
/* Ends @s: the client goes DORMANT, the ring is unmapped once no hook is inside; the
 * socket is closed when @close_sock and it is still ours. */
void client__session_close(struct client_session *s, bool close_sock);
/* Moves @fd (taken) to a high number (F_DUPFD_CLOEXEC); returns the descriptor to use:
 * @fd itself when it cannot be moved. Raw system calls. */
int client__fd_move_high(int fd);
/* True while @s->sock is still the connection the handshake made (fstat: same device
 * and inode). Async-signal-safe, no errno. */
bool client__sock_ours(const struct client_session *s);
/* Advertises the wake entry for attachers, unless attaching is off (preload/wake.c). */
void client__attach_install(void);

/* The session thread (preload/attach.c): what it does first. */
enum client_sthread_mode {
    CLIENT_STHREAD_ATTACH, /* handshake (WIRE_REASON_ATTACH), then watch */
    CLIENT_STHREAD_WATCH,  /* watch the session in client_current */
};
/* Starts the session thread: a clone(2) thread that never enters glibc. @attacher: the
 * pid of the attacher that woke us (0: none, the daemon socket); @sock_path (NULL: none;
 * copied, at most HP_WAKE_PATH_MAX bytes with its NUL): the socket it made for us, where
 * @attacher 0 means an attacher outside our pid namespace (common/wake.h). Returns 0,
 * -EBUSY when one runs already (or another request is being stored), -ENAMETOOLONG, or
 * -errno. Async-signal-safe; hook-safe. */
int client__sthread_start(enum client_sthread_mode mode, int attacher, const char *sock_path);
/* The session thread, each round (preload/ids.c): when the process's user or group ids
 * are no longer the thread's, takes them and tells the service. Returns 0 (unchanged),
 * 1 (followed) or -errno (could not follow: end the session). */
int client__ids_follow(struct client_session *s);
/* In a forked child (atfork): no session thread exists there. */
void client__sthread_forget(void);
/* Writes our pid into the page that tells children of fork from us (preload/wake.c): at
 * advertising, and in a child our atfork handler saw. */
void client__fork_owner_arm(void);
/* In a child of fork: ends what it inherited of its parent's sessions (the slots, the
 * current session, the direct slots' lock) and makes the client DORMANT. @alone: the
 * caller is the only thread (the atfork handler); @keep_rings: a hook of ours was
 * interrupted by the fork (fork() called from a signal handler): the rings stay mapped.
 * Not @alone (a child adopted at a wake, on its session thread): other threads may be
 * inside our hooks, and a slot one of them is in is kept, for good. Owner of the
 * sessions only. */
void client__forget_parent(bool alone, bool keep_rings);

#pragma GCC visibility pop

#endif
