/* service/svc_internal.h: the state of a session and of its threads: budgets, the client
 * object, the unwinder threads, struct svc, and the prototypes the service's files share.
 * Threads exchange messages only (service/queue.h): a client object moves from the main
 * thread to one unwinder thread (which then owns it), and unwinder threads post batches
 * of records to the bookkeeping thread. */
#ifndef HP_SERVICE_SVC_INTERNAL_H
#define HP_SERVICE_SVC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "bookkeeping/bookkeeping.h"
#include "common/containers.h"
#include "common/frame.h"
#include "service/queue.h"
#include "service/svc.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/wire.h"
#include "unwinder/unwinder.h"

/* ---- Budgets of time ------------------------------------------------------------ */

/* A share of the time passing that something may take (a token bucket of nanoseconds):
 * credit grows by 1/share of the time that passes, up to @burst_ns, and what is done is
 * paid for afterwards, so one costly step may take the credit below zero. Not
 * thread-safe; one owner. */
struct svc_budget {
    int64_t credit_ns;
    uint64_t at_ns;
};
void svc__budget_init(struct svc_budget *b, uint64_t now_ns, int64_t burst_ns);
/* Adds the credit earned since the last call; true when some is left. */
bool svc__budget_allows(struct svc_budget *b, uint64_t now_ns, unsigned share, int64_t burst_ns);
void svc__budget_spend(struct svc_budget *b, uint64_t ns);

/* Counts @n samples that took @ns together in @st: heap_samples, the histogram (each at
 * the mean) and total_unwinding_time_us, kept to the nanosecond in @total_ns (adding
 * whole microseconds per sample would drop most of the time of samples that take less). */
void svc__count_unwind_time(struct bk_process_stats *st, uint64_t *total_ns, uint64_t ns,
                            uint64_t n);

/* ---- Clients --------------------------------------------------------------------- */

/* A profiled process after its handshake. Owned by the main thread until handed to an
 * unwinder thread, then by that thread alone. */
struct svc_client {
    struct svc_client *next; /* hand-off list / unwinder thread's list */
    uint64_t id;             /* unique in the session: SVC_CLIENT_ID() */
    pid_t pid;
    int sock;
    int maps_fd, mem_fd; /* moved into the unwinder process state */
    /* A second descriptor of the client's /proc/PID/maps: readable while the address
     * space the client handshook from lives (it no longer does once the process exited
     * or exec'd), which tells a connection the program closed from a process that went
     * away. */
    int image_fd;
    ring_t *ring;
    unwinder_process_t *unw;
    uint64_t max_stack_bytes;
    uint64_t sampling_interval_bytes;
    uint32_t features;  /* WIRE_FEATURE_* accepted that change what records hold */
    uint32_t flush_ask; /* the last ask for its frees in batches (ring_ask_flush()) */
    bool flush_waiting; /* a dump waits for the answer */
    bool from_startup;
    bool started;          /* PROC_START posted */
    bool has_work;         /* ring not known to be empty */
    bool polling;          /* the ring is polled (ring_set_reader_polling), not sleeping */
    unsigned quiet_polls;  /* polls in a row that found nothing */
    uint64_t records;      /* records read */
    uint64_t drains;       /* reads of its ring the bookkeeping queue did not hold up */
    uint64_t unwinding_ns; /* stats.total_unwinding_time_us, to the nanosecond */
    /* The sequence number of the last sample or free posted: the service numbers them in
     * ring order (wire_alloc_head.unused0 says why that order is right). Records lost on
     * the way (records_lost_service) take none: the bookkeeping sees no gap. */
    uint64_t seq;
    uint32_t flags; /* BK_FLAG_* */
    char *cmdline;
    size_t cmdline_len;
    char title[64];            /* a retitled process's title ("nginx: master process ..."), or "" */
    uint64_t process_start_ts; /* svc__process_start_ts() at the handshake */
    /* When its title is read again next, and since when it is served (CLOCK_MONOTONIC_COARSE,
     * the unwinder thread's): often at first (a forked child names its role right away),
     * then once a second. */
    uint64_t retitle_due_ns, served_since_ns;
    struct bk_process_stats stats;
    uint64_t frees;
    uint64_t frees_unread;       /* frees among stats.records_unread */
    uint64_t frees_lost_service; /* frees the service could not pass on */
    /* Frees lost so far (the client's frees_lost and frees_lost_service) as last seen,
     * and, while pf_armed, the end of the ring when more were seen: once every record
     * before pf_mark is read, every allocation whose free may be among them has been
     * posted, and all live ones are marked possibly freed (watch_lost_frees() in
     * service/unwind_records.c). */
    uint64_t frees_lost_seen;
    uint64_t pf_mark;
    bool pf_armed;
    /* WIRE_MAPS_CHANGED read but not acted on yet: SVC_MAPS_CHANGED | WIRE_MAPS_UNLOADED
     * (svc__drain_upto() in service/unwind_records.c). */
    uint32_t maps_changed;
    /* The time the rereads those records ask for may take (apply_maps_changed() in
     * service/unwind_records.c), and whether a sample waits for it. */
    struct svc_budget reread;
    bool throttled;
    /* Ending (begin_end() in service/unwind_thread.c): the writers were told to stop, the
     * records reserved before end_mark are read until end_deadline_ns (CLOCK_MONOTONIC;
     * renewed unless the ring was read since the last renewal, at end_records and
     * end_drains, and gave nothing; up to a limit from end_begun_ns), the rest is skipped
     * and counted. */
    bool ending;
    uint32_t end_flags; /* BK_FLAG_* of the end */
    const char *end_why;
    bool end_abrupt; /* it went away without a word (killed, crashed, _exit) */
    uint64_t end_mark, end_deadline_ns, end_begun_ns, end_records, end_drains;
    uint64_t mem_bytes;        /* counted in svc.client_mem_bytes */
    uint64_t audit_mismatches; /* audited walks that disagreed with our unwind */
    /* Mappings the unwinder keeps after they went (unwinder_retired_seq()): the count
     * last seen, and up to which count they may go once the ring is read up to where it
     * ended when that count was seen (track_retired() in service/unwind_records.c). */
    uint64_t retired_seen;
    uint32_t maps_ask; /* of the WIRE_MAPS_CHANGED records not acted on yet (0: none) */
    struct {
        uint64_t seq, mark;
    } retired[8];
    unsigned n_retired;
    bool hung_up;      /* the socket reported a hang-up (svc__unwinder_hangup()) */
    bool cut_off;      /* given up on: a writer held a record while running */
    bool in_stall;     /* a stopped writer holds the next record (counted once) */
    uint32_t ids_seen; /* the ring's count of id changes last checked (service/ids.c) */
    /* Children of fork() the process did not follow, as they told us (service/ids.c):
     * the ring's count last seen, their pids, and those beyond the room for pids. */
    uint64_t forks_seen;
    pid_t *forked;
    size_t n_forked, cap_forked;
    uint64_t forked_unlisted;
};

/* service/ids.c: whether this service profiles a process of effective uid @uid: our own
 * uid's, any as root with @allow_other_users, and any with @follow_any (a process that
 * changed to @uid after it connected, under a service that follows every change). */
bool svc__uid_allowed(uid_t uid, bool allow_other_users, bool follow_any);
/* service/ids.c, unwinder thread: reads the messages waiting on @c's socket (its ring's
 * counts moved past c->ids_seen or c->forks_seen, or its session ends): the new ids of
 * a process that changed them, checked (false, said why once, @ret_why set: end its
 * session), and the children of fork() it did not follow, noted in c->forked. */
bool svc__client_messages(const struct svc *s, struct svc_client *c, const char **ret_why);
/* service/ids.c: how to follow the children of fork() not followed ("use --follow-fork"
 * unless @cfg says otherwise). */
const char *svc__fork_hint(const struct svc_config *cfg);
/* service/ids.c: how many of @c's children of fork() it did not follow never connected
 * themselves (after an exec). */
uint64_t svc__forks_unfollowed(struct svc *s, const struct svc_client *c);

/* Client ids: the unwinder thread's index above SVC_CLIENT_ID_SHIFT. The main thread's
 * epoll finds a client's hang-up by this id (svc_poll()), never by a pointer the unwinder
 * may have freed meanwhile. */
#define SVC_CLIENT_ID_SHIFT 48
#define SVC_CLIENT_ID(unwinder, seq) ((uint64_t)(unwinder) << SVC_CLIENT_ID_SHIFT | (seq))
/* epoll data of a client's socket in the main thread's epoll (other entries hold a
 * descriptor number, whose upper half is 0). */
#define SVC_EV_CLIENT (1ull << 63)
/* epoll data of a socket made inside a process's root (svc_listen_in()), with its fd. */
#define SVC_EV_LISTEN_IN (1ull << 62)

/* service/client.c: a client of @pid with no descriptors yet (all -1), or NULL when out
 * of memory. Freed with svc__client_free(), which accepts NULL and a half-built client
 * and closes what it holds. */
struct svc_client *svc__client_new(pid_t pid);
struct svc_client *svc__client_free(struct svc_client *c);
/* The name of @c's program (the basename of its argv[0]; "?"), for log lines. */
const char *svc__client_name(const struct svc_client *c);

/* svc_client.maps_changed: a reread is due (beside WIRE_MAPS_UNLOADED). */
#define SVC_MAPS_CHANGED (1u << 31)

/* ---- Handshake (validation of untrusted input) ---------------------------------- */

/* Receives a client's hello on @sock (blocking within the socket's timeouts) and checks
 * it against the peer: magic, two descriptors, uid (another uid only as root with
 * @allow_other_users), the pid from SO_PEERCRED, and the descriptors being that pid's
 * /proc maps and mem. Logs why a client is refused. On success fills @ret_hello and
 * @ret_cred and hands the descriptors to @ret_fds (owned by the caller); on failure
 * closes them. Returns 0, or -EBADMSG/-ECONNRESET/-errno (no valid hello), -EPROTO (bad
 * magic or descriptors), -EACCES (other uid), -EPERM (pid or descriptors not the
 * peer's). */
int svc__handshake_hello(int sock, bool allow_other_users, struct wire_hello *ret_hello,
                         struct ucred *ret_cred, int ret_fds[2]);

struct svc;

/* An unwinder thread. */
#define SVC_MAX_UNWINDERS 8
struct svc_unwinder {
    struct svc *svc;
    pthread_t thread;
    /* Bumped by svc__unwinder_wake(); the thread sleeps on it (a futex) together with its
     * clients' ring words (futex_waitv). */
    _Atomic uint32_t wake_word;
    bool no_waitv; /* futex_waitv(2) missing (Linux < 5.16): rings are polled */
    pthread_mutex_t lock;
    struct svc_client *incoming; /* handed over, protected by lock */
    uint64_t *hangups;           /* ids of clients whose socket hung up, protected by lock */
    size_t n_hangups, cap_hangups;
    bool stop;              /* protected by lock */
    bool detach;            /* protected by lock: end every client */
    uint32_t detach_flags;  /* protected by lock */
    uint32_t dump_requests; /* protected by lock: drain, then post a dump barrier */
    /* Syncs before a query (svc__sync_unwinders()): asked (protected by lock), and the
     * last one whose records are posted to the bookkeeping thread; seen by the thread. */
    uint32_t sync_asked;
    _Atomic uint32_t sync_done;
    uint32_t sync_seen;
    unsigned index; /* in svc.unwinders */
    /* The samples handled since the clock was last read (CLOCK_MONOTONIC, clock_ns),
     * timed together (end_span() in service/unwind_records.c); walked ones among them. */
    uint64_t clock_ns;
    uint32_t span_samples, span_walked;
    const struct hp_mapping *seen_maps[64]; /* handed to unwinder_source_prefetch() */
    struct svc_client *clients;             /* owned by the thread */
    /* New sessions of a pid whose previous session is still ending there: adopted once it
     * has ended, so the bookkeeping thread sees the end before the start. */
    struct svc_client *deferred;
    _Atomic unsigned nclients;
    /* Stopping (svc_finish()): every client ends, its records read until this deadline
     * (CLOCK_MONOTONIC), the rest skipped and counted. */
    bool stopping;
    uint64_t stop_deadline_ns;
    struct svc_batcher batcher;
    struct hp_frame frames[UNWINDER_MAX_FRAMES + 1];
    struct hp_frame audit_frames[UNWINDER_MAX_FRAMES + 1];
};

/* An accepted connection whose hello has not fully arrived yet. */
struct svc_pending_hello {
    int fd;
    uint64_t deadline_ms; /* CLOCK_MONOTONIC */
};

#define SVC_MAX_PENDING_HELLOS 64

/* A socket made for one process inside its root (svc_listen_in()): listening until its
 * first connection, then closed and its file removed; also when the process is gone, or
 * has not connected by until_ns (CLOCK_MONOTONIC). */
struct svc_listen_in {
    int fd;
    int dirfd; /* the directory it is in, inside the process's root (O_PATH) */
    pid_t pid;
    char name[64];
    uint64_t until_ns;
};
#define SVC_MAX_LISTEN_IN 64
/* How long a woken process has to connect to its socket inside its root: its session
 * thread connects as soon as it runs, and does not try again. heapprof attach gives up
 * sooner (10 s) with a message of its own; this ends the wait of a daemon, which has
 * none. */
#define SVC_LISTEN_IN_TIMEOUT_MS 15000
/* How long a client has to complete its hello, and the socket timeouts of the
 * handshake. */
#define SVC_HANDSHAKE_TIMEOUT_MS 2000
/* How long a handshake may spend loading the files of the client's code before it
 * answers (unwinder_process_warm()): well below the shortest wait of a client for the
 * answer (1 s, a connection it was not asked to make). */
#define SVC_WARM_BUDGET_MS 400
/* Only files with this much code or more are read then (unwinder_process_warm()): they
 * take tens of milliseconds (node: 26.5 MB of code, 40 to 80 ms), which the ring would
 * have to hold; smaller ones take a few, which it holds with ease, and the program need
 * not wait for them. */
#define SVC_WARM_MIN_CODE_BYTES (8ull << 20)

struct svc {
    struct svc_config cfg;
    int out_fd;
    char *dir;
    char *sock_path;
    int listen_fd;
    int epfd;
    /* sockets made inside the roots of processes in containers; the main thread's */
    struct svc_listen_in ins[SVC_MAX_LISTEN_IN];
    unsigned n_ins;
    /* connections waiting for their hello, watched by epfd; the main thread's */
    struct svc_pending_hello pending[SVC_MAX_PENDING_HELLOS];
    unsigned n_pending;
    struct svc_bkq bkq;
    pthread_t bk_thread;
    bool bk_started;
    bk_t *bk;
    unsigned n_unwinders; /* <= SVC_MAX_UNWINDERS */
    struct svc_unwinder *unwinders;
    unsigned next_unwinder;
    /* The main thread's: every session of a pid goes to the same unwinder thread, so a
     * new session (the process exec'd) is started only after the old one ended. pid ->
     * unwinder index (uint64_t); keyed hash maps, as pids come and go by the thousand
     * under a busy daemon and a list would make each handshake scan them all. */
    struct hp_map routes;
    /* Sets of pids (no values): whose clients are fully drained (written by the
     * bookkeeping thread), that completed a handshake (main thread), and whose session
     * began to end (unwinder threads); all protected by done_lock */
    pthread_mutex_t done_lock;
    struct hp_map done, seen, ending;
    /* Children of fork() of profiled processes that were not profiled. */
    _Atomic uint64_t forks_unfollowed;
    _Atomic unsigned live_clients;
    /* the owner thread's own producer, for control messages (dumps) */
    struct svc_batcher ctl;
    uint64_t next_client_seq; /* the main thread's, for SVC_CLIENT_ID() */
    /* The bk thread's count of dump barriers per unwinder not yet turned into dumps. */
    uint32_t *dump_barriers;
    unsigned n_dump_barriers; /* the number of unwinders, fixed before any thread starts */
    /* A guardrail fired (svc__guardrail_fire(): any thread, once). */
    _Atomic bool guardrail_fired;
    _Atomic uint64_t stat_dumps, stat_bytes; /* published by the bk thread */
    _Atomic uint64_t stat_live_bytes;        /* published by the bk thread */
    /* summary counters, atomics updated by the threads */
    _Atomic uint64_t processes, samples, frees, drops, unwind_errors, rejected, corrupt;
    _Atomic uint64_t walked, audits, audit_mismatches, truncated_stacks;
    _Atomic uint64_t python_frames, python_unnamed, python_mismatches, python_codes_rejected;
    _Atomic uint64_t frees_lost, timed_out; /* clients that stopped blocking */
    _Atomic uint64_t conn_closed, stall_waits, stall_skips, stall_cutoffs;
    _Atomic uint64_t reserve_failures, records_unread, records_lost_service;
    _Atomic uint64_t unseen_call_slots;
    _Atomic unsigned ending_clients; /* clients whose end is under way */
    /* Bytes of the rings and unwind tables of the clients profiled now (each may be
     * touched whole at any time: counted whole for the guardrail). */
    _Atomic uint64_t client_mem_bytes;
    struct bk_counters bk_counters; /* written by the bk thread before it exits */
    _Atomic unsigned queries;       /* svc_query()s posted and not answered */
};

/* service/listener.c: creates the socket directory (unless a socket path is configured)
 * and listens. Returns 0, -EADDRINUSE (a live service answers there; not logged), or
 * -errno (logged). */
int svc__listener_open(struct svc *s) HP_WARN_UNUSED;
/* Stops accepting: closes the connections still in their hello and the listening socket. */
void svc__listener_close(struct svc *s);
/* service/handshake.c: runs the handshake on a freshly accepted socket (taken): checks
 * the peer, and for a target builds its client (unwinder state, ring, unwind table) and
 * answers with the configuration. Returns the client, owned by the caller, or NULL when
 * the peer was refused, is not a target or failed (logged and counted). */
struct svc_client *svc__handshake(struct svc *s, int sock);
/* service/control.c: true when what waits on the freshly accepted @fd is a control
 * request, not a hello; svc__control() answers it and closes @fd (taken). */
bool svc__is_control(int fd);
void svc__control(struct svc *s, int fd);
/* Answers the control request on @fd (taken) with @dump(@ctx) for a dump request: the
 * same as svc__control() for a service that is not one session (service/multi.c). */
void svc__control_answer(int fd, int (*dump)(void *ctx), void *ctx);
/* service/registry.c: records that @pid completed a handshake (svc_client_seen()). */
void svc__mark_seen(struct svc *s, pid_t pid);

void *svc__unwinder_main(void *arg);
/* Wakes the unwinder thread (it looks at its requests). Thread-safe. */
void svc__unwinder_wake(struct svc_unwinder *u);
/* Before a query: each unwinder asks its clients for the frees they hold in batches,
 * reads their rings up to now and posts what it read; waits for them, at most
 * SVC_SYNC_WAIT_MS. Any thread but the unwinders'. */
#define SVC_SYNC_WAIT_MS 200
void svc__sync_unwinders(struct svc *s);
/* The socket of the client with @id hung up (main thread, from its epoll). Thread-safe. */
void svc__unwinder_hangup(struct svc *s, uint64_t id);

/* service/procstate.c: what a client's threads are doing, from /proc. */
enum svc_thread_state {
    SVC_THREAD_RUNNING, /* running or sleeping: not paused from outside */
    SVC_THREAD_STOPPED, /* stopped by a signal or a tracer, or frozen (cgroup freezer) */
    SVC_THREAD_GONE,    /* no such thread in the process */
};
/* The state of thread @tid of process @pid; @tid 0: STOPPED when any thread of the
 * process is, else RUNNING (GONE when the process is). */
enum svc_thread_state svc__thread_state(pid_t pid, pid_t tid);
/* True while process @pid exists, is not a zombie and has not begun to exit. */
bool svc__process_alive(pid_t pid);
/* The same, of the text of a /proc/PID/stat file. */
bool svc__stat_alive(const char *stat);
/* When process @pid started, on CLOCK_MONOTONIC_COARSE (the dumps' clock; from its
 * starttime in /proc, clock ticks since boot); 0 when unknown. */
uint64_t svc__process_start_ts(pid_t pid);
/* The command line of @pid (/proc/PID/cmdline, at most 4 KiB), without the padding a
 * retitled process leaves after its title (trailing NULs and spaces; one NUL ends it).
 * Returns 0 with *@ret malloc'd (*@ret_len may be 0), or -errno. */
int svc__read_cmdline(pid_t pid, char **ret, size_t *ret_len);
/* c->title from c->cmdline: the title of a process that retitled itself (spaces in
 * argv[0]), else "". */
void svc__client_set_title(struct svc_client *c);
/* Reads @c's command line again (a program retitles itself: setproctitle, a forked child
 * naming its role): when it changed, takes it (c->cmdline, c->title) and tells the
 * bookkeeping thread (SVC_MSG_PROC_RENAME) so the trace names the process by it. */
void svc__client_retitle(struct svc_unwinder *u, struct svc_client *c);
/* A WIRE_TITLE record of @c (@len bytes at @data): the title its process had at exit,
 * taken as svc__client_retitle() takes one it read. */
void svc__client_title_record(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                              size_t len);
void *svc__bk_main(void *arg);
/* service/query.c: answers a SVC_MSG_QUERY (bookkeeping thread). */
void svc__answer_query(struct svc *s, const struct svc_msg_query *q);

/* service/memory.c: the memory the service uses (of the whole process: every session,
 * thread, queue, table and the clients' rings mapped here), in KiB, from /proc/self/status;
 * zeros when unknown. max_heapprofd_memory_kb holds rss + swap. */
struct svc_memory {
    uint64_t rss_kb;   /* VmRSS: anonymous, file and shared (the rings' touched pages) */
    uint64_t shmem_kb; /* RssShmem: of rss, the rings' and unwind tables' pages */
    uint64_t swap_kb;  /* VmSwap */
};
void svc__memory(struct svc_memory *ret);
/* What a client's ring and unwind table may take once its writers touch every page. */
uint64_t svc__client_mem_bytes(const struct svc *s);
/* Fires the guardrail (once, from any thread): every process is detached with
 * hit_guardrail and no more are profiled. Returns true when this call fired it. */
bool svc__guardrail_fire(struct svc *s, const char *what, uint64_t value, uint64_t limit);
/* The bookkeeping thread checks the memory guardrail every this many batches applied,
 * counting the growth of its tables that as many batches may cause (bk_grow_ahead()):
 * at most an entry per frame of their messages (a struct hp_frame, 24 bytes) in every
 * interned table and in the tables of a process. */
#define SVC_GUARDRAIL_CHECK_BATCHES 8
#define SVC_GUARDRAIL_CHECK_ENTRIES (SVC_GUARDRAIL_CHECK_BATCHES * (SVC_BATCH_BYTES / 24))
/* service/registry.c: records that @pid's clients are fully drained (svc_client_done()). */
void svc__mark_done(struct svc *s, pid_t pid);
/* A session of @pid began to end (svc_client_ended()). Any thread. */
void svc__mark_ending(struct svc *s, pid_t pid);

/* ---- reading a client's ring (service/unwind_records.c) ---------------------------- */

/* The rereads of the maps a client asks for (WIRE_MAPS_CHANGED) may take 1/REREAD_SHARE
 * of the time, with REREAD_BURST_NS saved up: a process of 20 000 mappings (a reread of
 * milliseconds) cannot make its thread do nothing else. A sample that needs a reread the
 * budget holds back waits in the ring (its writers block or drop, counted), so no sample
 * is named with maps older than it. */
#define REREAD_SHARE 8
#define REREAD_BURST_NS (50ll * 1000 * 1000)

/* What a drain left. */
enum svc_drain_result {
    SVC_DRAIN_DONE, /* caught up, at the mark, or given up on the client */
    SVC_DRAIN_MORE, /* the budget ran out: the ring may hold more */
    SVC_DRAIN_HELD, /* records wait: a reread the rate limit holds back, or a full queue */
};

/* Posts the start of @c's process to the bookkeeping thread (c->started); false when out
 * of memory. */
bool svc__post_start(struct svc_unwinder *u, struct svc_client *c);
/* A message of @type for @c, its process's start posted first if it could not be yet.
 * NULL when out of memory: the caller counts what is lost. */
void *svc__post(struct svc_unwinder *u, struct svc_client *c, uint32_t type, size_t len);
/* Given up on: corrupt data, or a writer that kept a record while it ran. */
bool svc__client_over(const struct svc_client *c);
/* The lanes of a client's ring (service/handshake.c). */
unsigned svc__ring_lanes(const struct svc *s);
/* After a drain: frees of @c's sampled blocks lost since the last look make the
 * bookkeeping mark its live allocations possibly freed once the records before the loss
 * are read (SVC_MSG_POSSIBLY_FREED). */
void svc__watch_lost_frees(struct svc_unwinder *u, struct svc_client *c);
/* Reads up to @budget records of @c, stopping at @mark (ring_mark()) if not NULL, and
 * before the next record when the queue to the bookkeeping thread is full. */
enum svc_drain_result svc__drain_upto(struct svc_unwinder *u, struct svc_client *c, unsigned budget,
                                      const uint64_t *mark);

#endif
