/* service/svc.h: the profiling service, as embedded by `heapprof record` and run by the
 * daemon: a listening socket served by the calling thread, unwinder threads owning the
 * clients after their handshake, and one bookkeeping thread owning all profile state and
 * the output file.
 *
 *     struct svc_config cfg;
 *     svc_config_init(&cfg);
 *     svc_t *s;
 *     svc_new(&cfg, out_fd, &s);             // creates socket dir, threads
 *     ... svc_socket_path(s) ...             // give it to clients
 *     while (!done) svc_poll(s, 100);        // accept + handshake
 *     svc_finish(s);                         // drain, final dumps, join threads
 *     s = svc_free(s);
 *
 * Not thread-safe: the owner thread calls everything.
 *
 * The public API of the service is this header and the three it includes: the
 * configuration (service/config.h), several sessions behind one socket
 * (service/multi.h) and the discovery and signalling of targets (service/targets.h).
 */
#ifndef HP_SERVICE_SVC_H
#define HP_SERVICE_SVC_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"
#include "service/config.h"
#include "service/multi.h"
#include "service/targets.h"

struct bk_sink;

typedef struct svc svc_t;

/* Session-wide counters, valid after svc_finish(). */
struct svc_summary {
    uint64_t processes;
    uint64_t samples;
    uint64_t frees;
    uint64_t records_dropped;
    uint64_t unwinding_errors;
    uint64_t handshakes_rejected;
    uint64_t corrupt_clients;
    uint64_t walked_samples;   /* samples whose stack the app walked itself (unwind table) */
    uint64_t audits;           /* such walks checked against an unwind of a stack copy */
    uint64_t audit_mismatches; /* ... that differed (the table was reset each time) */
    uint64_t frees_lost;       /* frees of sampled blocks the clients could not record */
    /* the programs' call slots of the allocator the clients could not switch to their
     * hooks: the calls through them are missing */
    uint64_t unseen_call_slots;
    uint64_t clients_timed_out; /* clients that stopped waiting for a stalled service */
    uint64_t conn_closed;       /* processes that closed the profiler's connection, running */
    /* children of fork() of profiled processes, not profiled (no follow_fork), less those
     * that exec'd a program that connected itself */
    uint64_t forks_unfollowed;
    const char *fork_hint;  /* how to follow them (the configuration's, or the default) */
    uint64_t stall_waits;   /* times a stopped writer held a ring (waited for) */
    uint64_t stall_skips;   /* records of writers gone mid-record, skipped */
    uint64_t stall_cutoffs; /* clients cut off: a writer kept a record while running */
    /* samples whose stack went on past what their record held (copy cut short at
     * max_stack_bytes, foreign stack of unknown end); their stacks end in a
     * "ERROR STACK_TRUNCATED" frame; not counted as unwinding errors */
    uint64_t truncated_stacks;
    /* Python frames put into stacks (CPython 3.11): named, unnamed ("<python frame>"),
     * and stacks whose Python frames did not pair with the interpreter's (kept native) */
    uint64_t python_frames, python_unnamed, python_mismatches;
    /* WIRE_PY_CODE records that failed validation (ignored; the frames are read then) */
    uint64_t python_codes_rejected;
    /* Records lost on the way, beyond records_dropped (the clients' full rings): */
    uint64_t reserve_failures;     /* given up by the clients after lost reservation races */
    uint64_t records_unread;       /* left in rings when sessions ended (time budget) */
    uint64_t records_lost_service; /* the service out of memory */
    uint64_t records_refused;      /* the bookkeeping could not place (caps, probe bounds) */
    uint64_t records_no_process;   /* of processes the bookkeeping could not start */
    uint64_t queue_full_events;    /* times the unwinders waited for the bookkeeping */
    uint64_t output_bytes;
    int write_error; /* 0 or -errno */
};

/* Creates the socket and starts the threads. @out_fd is borrowed; the bookkeeping
 * thread writes the trace to it until svc_finish() returns. Returns 0, -EADDRINUSE when
 * a live service answers on the socket (not logged: the caller says so), or -errno. */
int svc_new(const struct svc_config *cfg, int out_fd, svc_t **ret) HP_WARN_UNUSED;
/* As svc_new(), writing the TracePackets to @sink (copied; its context must outlive the
 * service) in the format of a writer of Perfetto's tracing service (bookkeeping.h). */
int svc_new_sink(const struct svc_config *cfg, const struct bk_sink *sink,
                 svc_t **ret) HP_WARN_UNUSED;
/* Borrowed; valid until svc_free(). */
const char *svc_socket_path(svc_t *s);
/* Hands a connection accepted elsewhere (a socket several sessions share) to the
 * handshake, as if it had been accepted on the service's own socket. Takes @fd. */
void svc_adopt(svc_t *s, int fd);
/* A socket for the client of process @pid (uid @uid) that cannot reach the service's own
 * (it lives in another mount, network or pid namespace: a container,
 * svc_proc_in_container()): bound inside the process's root, in its /tmp (else its
 * /dev/shm; every path resolved inside that root), owned by @uid. svc_poll() accepts its
 * first connection like one on the service's own socket, then closes it and removes the
 * file; so do svc_unlisten_in() and svc_finish(). Its path as the process sees it in
 * @ret_path (@len bytes, HP_WAKE_PATH_MAX will do). Returns 0 or -errno. */
int svc_listen_in(svc_t *s, pid_t pid, uid_t uid, char *ret_path, size_t len) HP_WARN_UNUSED;
/* Closes and removes @pid's socket of svc_listen_in(), if it still has one. */
void svc_unlisten_in(svc_t *s, pid_t pid);
/* A descriptor that is readable when svc_poll() has work (an epoll fd). */
int svc_fd(svc_t *s);
/* Records in the trace that @pid is not profiled because another session profiles it
 * (rejected_concurrent, as Perfetto's heapprofd). Returns 0 or -ENOMEM. */
int svc_reject_concurrent(svc_t *s, pid_t pid) HP_WARN_UNUSED;
/* Serves the listening socket for up to @timeout_ms (accepting and handshaking clients).
 * Returns 0 or -errno. */
int svc_poll(svc_t *s, int timeout_ms) HP_WARN_UNUSED;
/* Also wakes svc_poll() when @fd (borrowed) is readable: e.g. a signalfd. Returns 0 or
 * -errno. Call svc_unwatch_fd() before closing @fd. */
int svc_watch_fd(svc_t *s, int fd) HP_WARN_UNUSED;
void svc_unwatch_fd(svc_t *s, int fd);

/* Number of clients handed to unwinder threads that have not yet disconnected. */
unsigned svc_live_clients(svc_t *s);
/* True once the client with @pid connected and has since disconnected and been fully
 * drained. */
bool svc_client_done(svc_t *s, pid_t pid);
/* Live figures for a status line. Thread-safe reads of counters. */
struct svc_status {
    unsigned live_processes;
    uint64_t processes;
    uint64_t samples;
    uint64_t records_dropped;
    uint64_t dumps;
    uint64_t output_bytes;     /* complete packets written so far */
    uint64_t live_bytes;       /* sampled heap bytes live in the profiled processes */
    unsigned ending_processes; /* of live_processes, those whose last records are read */
};
void svc_get_status(svc_t *s, struct svc_status *ret);

/* Asks the bookkeeping thread to dump every profiled process now (continuous dumps,
 * SIGUSR1). Returns 0 or -ENOMEM. */
int svc_dump_now(svc_t *s) HP_WARN_UNUSED;

/* Ends the profiling of every connected process: their rings are drained, they get a
 * final dump with @flags (BK_FLAG_*) and their connection is closed, which returns them
 * to dormant passthrough. New clients are still accepted. */
void svc_detach_all(svc_t *s, uint32_t flags);

/* True when a client with @pid has completed the handshake at any time. */
bool svc_client_seen(svc_t *s, pid_t pid);
/* True once a session of @pid began to end (its last records are read, or all were): a
 * process that exited is no longer counted as running from then on. */
bool svc_client_ended(svc_t *s, pid_t pid);

/* Checks the guardrails (max_heapprofd_memory_kb, max_heapprofd_cpu_secs) of the
 * service's own process; when one is exceeded, detaches every process with
 * hit_guardrail. Returns true when a guardrail fired (once per session). */
bool svc_check_guardrails(svc_t *s);

/* Questions other threads (the daemon's HTTP endpoint) ask about the profiles. The
 * bookkeeping thread answers them in turn, from the records it has applied: a record a
 * process wrote a moment ago may still be in its ring. */
enum svc_query_kind {
    /* A trace of its own (TracePackets as in a trace file) holding the profile of one
     * process as it stands (bk_snapshot_process()); ESRCH: the pid is not profiled. */
    SVC_QUERY_PROFILE = 1,
    /* The processes profiled now: an array of struct svc_proc_info. */
    SVC_QUERY_PROCESSES = 2,
};

/* One process of SVC_QUERY_PROCESSES. */
struct svc_proc_info {
    int32_t pid;
    uint32_t cmdline_len; /* bytes of cmdline used */
    uint64_t samples;     /* sampled allocations */
    uint64_t allocated_bytes;
    uint64_t live_bytes; /* sampled bytes not freed: unreleased */
    char cmdline[496];   /* NUL-separated arguments, cut at a whole one when long */
};

/* At most this many queries wait for their answer (those whose askers gave up included):
 * more get -EBUSY. */
#define SVC_MAX_QUERIES 8

/* Asks the bookkeeping thread @kind (about @pid for SVC_QUERY_PROFILE). The answer is
 * written to @out_fd from its current offset (a memfd, say); then @done_fd, an eventfd,
 * is written 1 + the errno of the outcome (1: answered). Both are duplicated: the caller
 * keeps its own and may close them at any time. Never blocks. Thread-safe. Returns 0, or
 * -EBUSY (SVC_MAX_QUERIES wait), -ENOMEM, -errno (nothing asked). */
int svc_query(svc_t *s, enum svc_query_kind kind, pid_t pid, int out_fd,
              int done_fd) HP_WARN_UNUSED;
/* The outcome of a query from its @done_fd (non-blocking): 0 answered, -EAGAIN not yet,
 * else the -errno of the answer. */
int svc_query_result(int done_fd) HP_WARN_UNUSED;

/* Stops accepting, drains every ring, writes the final dumps, joins the threads. */
int svc_finish(svc_t *s, struct svc_summary *ret_summary) HP_WARN_UNUSED;
/* Removes the socket and its directory, frees everything; accepts NULL. */
svc_t *svc_free(svc_t *s);

/* `heapprof dump`: asks the service listening on @socket_path (and, if @want > 0, only if
 * that is process @want) to dump every profiled process now: a control request on its
 * socket, answered. Returns 0 with the pid of the service that answered in @ret_pid,
 * -ENOENT / -ECONNREFUSED when nothing listens there, -ESRCH when the listener is another
 * process than @want (its pid in @ret_pid, nothing asked), -EPROTO when what answered is
 * not a heapprof service, -EACCES when it runs as another user (and we are not root),
 * -ETIMEDOUT, or -errno. */
int svc_control_dump(const char *socket_path, pid_t want, pid_t *ret_pid) HP_WARN_UNUSED;

#endif
