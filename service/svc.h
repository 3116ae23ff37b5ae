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
 */
#ifndef HP_SERVICE_SVC_H
#define HP_SERVICE_SVC_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"

struct bk_sink;

#define SVC_MAX_TARGETS 64

/* Field names follow Perfetto's HeapprofdConfig. */
struct svc_config {
    uint64_t sampling_interval_bytes; /* >= 1; default 4096 */
    uint64_t shmem_size_bytes;        /* power of two; default 8 MiB */
    uint64_t max_stack_bytes;         /* cap of a stack copy; 0: svc_config_max_stack() */
    bool block_client;
    uint32_t block_client_timeout_us;
    bool dump_at_max;
    unsigned unwinder_threads; /* 0: number of CPUs, capped */
    const char *socket_dir;    /* NULL: private dir under $XDG_RUNTIME_DIR or /tmp */
    const char *socket_path;   /* NULL: <socket_dir>/heapprofd.sock */

    /* Targets (daemon and attach). With none and !all, every client that connects is
     * profiled (heapprof record's private socket). */
    int32_t pid[SVC_MAX_TARGETS];
    size_t n_pid;
    char *process_cmdline[SVC_MAX_TARGETS]; /* exact, basename or glob; owned */
    size_t n_process_cmdline;
    bool all;
    bool no_startup; /* do not profile processes that connect at startup */
    bool no_running; /* do not signal running processes */
    /* continuous_dump_config */
    uint32_t dump_phase_ms;
    uint32_t dump_interval_ms; /* 0: no continuous dumps */
    /* guardrails: 0 = none */
    uint64_t max_heapprofd_memory_kb;
    uint64_t max_heapprofd_cpu_secs;
    bool disable_fork_teardown;
    /* Not in HeapprofdConfig: a service running as root also profiles other users'
     * processes (by default only its own uid's). */
    bool allow_other_users;
    /* Children of fork() handshake again and are profiled as processes of their own. */
    bool follow_fork;
    /* No source files and lines in the trace (faster dumps). */
    bool no_source_lines;
    /* No unwind tables: clients copy every sampled stack (WIRE_FEATURE_UNWIND_TABLE
     * off). */
    bool no_fast_unwind;
    /* With unwind tables: every audit_every-th stack a client thread walks itself comes
     * with its copy, which the service unwinds to check the walk (0: never; default
     * 1024). */
    uint32_t audit_every;
    /* Not a configuration field: one line on stderr per process connected, ended or
     * dropped (the daemon's log). */
    bool log_processes;
};

/* One table of the configuration's fields: the config-file parser, every command's flags
 * and their --help come from it (cli/), so a field has one name, one range and one
 * meaning everywhere. Fields of Perfetto's HeapprofdConfig keep its names and field
 * numbers (proto_id); heapprof's own have proto_id 0.
 *
 *     const struct svc_config_field *f = svc_config_field_find("sampling_interval_bytes");
 *     if (svc_config_set_text(&cfg, f, "512k", err, sizeof(err)) < 0) ...;
 */
enum svc_field_type {
    SVC_FIELD_BOOL,     /* bool at offset */
    SVC_FIELD_UINT,     /* uint32_t or uint64_t at offset (width), min..max */
    SVC_FIELD_BYTES,    /* like UINT; as a flag it takes k, M, G suffixes */
    SVC_FIELD_PIDS,     /* repeated: appends to pid[] */
    SVC_FIELD_CMDLINES, /* repeated string: appends to process_cmdline[] */
    SVC_FIELD_HEAPS,    /* repeated string: only the malloc heap exists */
    SVC_FIELD_ACCEPTED, /* a bool that is accepted and has no effect (all_heaps) */
};
#define SVC_FIELD_POW2 (1u << 0)        /* the value must be a power of two */
#define SVC_FIELD_NONZERO (1u << 1)     /* 0 is refused (as a flag: "must be at least 1") */
#define SVC_FIELD_NESTED_DUMP (1u << 2) /* inside continuous_dump_config */

struct svc_config_field {
    const char *name;  /* HeapprofdConfig field name (or heapprof's own) */
    uint32_t proto_id; /* field number in HeapprofdConfig (in ContinuousDumpConfig when
                          SVC_FIELD_NESTED_DUMP); 0: not a HeapprofdConfig field */
    enum svc_field_type type;
    uint32_t flags; /* SVC_FIELD_* */
    size_t offset;  /* in struct svc_config */
    uint8_t width;  /* bytes of the integer at offset */
    uint64_t min, max;
    const char *flag;     /* long option of the commands (NULL: config file only) */
    char short_flag;      /* 0: none */
    const char *no_flag;  /* BOOL: long option that clears it (NULL: none) */
    const char *what;     /* for messages: "sampling interval" */
    const char *arg_help; /* "N", "PID", ... (NULL for a bool) */
    const char *help;     /* one line for --help */
};

extern const struct svc_config_field svc_config_fields[];
extern const size_t svc_n_config_fields;

/* The field named @name (HeapprofdConfig name, or "continuous_dump_config.dump_phase_ms"
 * for the nested ones), or NULL. */
const struct svc_config_field *svc_config_field_find(const char *name);

/* Sets an integer field (UINT, BYTES, PIDS) after checking it against the field's range
 * and flags; -EINVAL with a message "<name> must be ..." in @err. */
int svc_config_set_uint(struct svc_config *cfg, const struct svc_config_field *f, uint64_t v,
                        char *err, size_t err_len) HP_WARN_UNUSED;
/* Sets a BOOL (or ACCEPTED) field. */
void svc_config_set_bool(struct svc_config *cfg, const struct svc_config_field *f, bool v);
/* Sets a string field (CMDLINES appends a copy; HEAPS checks the name). -EINVAL or
 * -ENOMEM with a message in @err. */
int svc_config_set_string(struct svc_config *cfg, const struct svc_config_field *f, const char *v,
                          char *err, size_t err_len) HP_WARN_UNUSED;
/* Sets a field from a command-line value: numbers in decimal (BYTES also with a k, M or
 * G suffix, optionally followed by "iB"/"B"), strings as given. A BOOL field is set to
 * true. -EINVAL with a message in @err. */
int svc_config_set_text(struct svc_config *cfg, const struct svc_config_field *f, const char *text,
                        char *err, size_t err_len) HP_WARN_UNUSED;

/* The one parser of unsigned numbers from text: decimal digits only (no sign, no
 * spaces), with @suffixes also "4k", "8M", "1G", "64KiB", "2GB"; rejects overflow.
 * Returns 0 or -EINVAL. */
int svc_parse_uint(const char *s, bool suffixes, uint64_t *ret) HP_WARN_UNUSED;

void svc_config_init(struct svc_config *cfg);
/* Frees the strings the configuration owns (process_cmdline). */
void svc_config_done(struct svc_config *cfg);

/* True when a process with @pid and @cmdline (NUL-separated, @len bytes) is a target:
 * its pid is listed, its argv[0] equals a process_cmdline entry, or its basename does,
 * or matches it as a glob; or `all`. */
bool svc_config_matches(const struct svc_config *cfg, int32_t pid, const char *cmdline, size_t len);
/* True when the configuration names targets (pid, process_cmdline or all). */
bool svc_config_has_targets(const struct svc_config *cfg);

/* The cap of a stack copy when max_stack_bytes is not set: what fits a quarter of the
 * ring, at most this. */
#define SVC_DEFAULT_MAX_STACK_BYTES (512u << 10)
/* The cap of a stack copy the clients get: max_stack_bytes, or the default for the ring. */
uint64_t svc_config_max_stack(const struct svc_config *cfg);

/* Applies a serialized HeapprofdConfig (as Perfetto's tracing service hands it to the
 * data source android.heapprofd) on top of @cfg, field by field through the table:
 * fields are checked as their flags are. Returns 0, with in @err (else "") a note
 * naming the field numbers heapprof does not implement and ignored; or -EINVAL
 * (malformed bytes, a value out of range) or -ENOMEM with the reason in @err. */
int svc_config_from_proto(const void *buf, size_t len, struct svc_config *cfg, char *err,
                          size_t err_len) HP_WARN_UNUSED;

/* Checks a configuration; on error returns -EINVAL and a message in @err. */
int svc_config_check(const struct svc_config *cfg, char *err, size_t err_len) HP_WARN_UNUSED;

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
    uint64_t walked_samples;    /* samples whose stack the app walked itself (unwind table) */
    uint64_t audits;            /* such walks checked against an unwind of a stack copy */
    uint64_t audit_mismatches;  /* ... that differed (the table was reset each time) */
    uint64_t frees_lost;        /* frees of sampled blocks the clients could not record */
    uint64_t clients_timed_out; /* clients that stopped waiting for a stalled service */
    uint64_t conn_closed;       /* processes that closed the profiler's connection, running */
    uint64_t stall_waits;       /* times a stopped writer held a ring (waited for) */
    uint64_t stall_skips;       /* records of writers gone mid-record, skipped */
    uint64_t stall_cutoffs;     /* clients cut off: a writer kept a record while running */
    /* samples whose stack went on past what their record held (copy cut short at
     * max_stack_bytes, foreign stack of unknown end); their stacks end in a
     * "ERROR STACK_TRUNCATED" frame; not counted as unwinding errors */
    uint64_t truncated_stacks;
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
 * thread writes the trace to it until svc_finish() returns. */
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

/* Checks the guardrails (max_heapprofd_memory_kb, max_heapprofd_cpu_secs) of the
 * service's own process; when one is exceeded, detaches every process with
 * hit_guardrail. Returns true when a guardrail fired (once per session). */
bool svc_check_guardrails(svc_t *s);

/* Stops accepting, drains every ring, writes the final dumps, joins the threads. */
int svc_finish(svc_t *s, struct svc_summary *ret_summary) HP_WARN_UNUSED;
/* Removes the socket and its directory, frees everything; accepts NULL. */
svc_t *svc_free(svc_t *s);

/* ---- several sessions behind the daemon socket (service/multi.c) ------------------ *
 *
 * heapprofd --producer runs one session per data source instance of Perfetto's tracing
 * service, at the same time, behind its one socket: each connection goes to one session
 * (the one that signalled the process, else the oldest whose targets match); the other
 * matching sessions record the process as rejected_concurrent, as Perfetto's heapprofd.
 *
 *     svc_multi_t *m;
 *     svc_multi_new(path, &m);
 *     svc_multi_start(m, id, &cfg, &sink);         // signals running targets
 *     loop: poll(svc_multi_pollfds(), svc_multi_timeout_ms()); svc_multi_dispatch(m);
 *     svc_multi_stop(m, id, done, ctx);           // final dumps on a thread, then done()
 *
 * Main thread only (done() runs on the session's stop thread). */
typedef struct svc_multi svc_multi_t;

/* Listens on @socket_path. Returns 0, -EADDRINUSE (a live service answers there), -errno. */
int svc_multi_new(const char *socket_path, svc_multi_t **ret) HP_WARN_UNUSED;
/* Starts session @id with @cfg (checked; its process_cmdline strings are taken, @cfg
 * keeps none) writing to @sink (copied; its context must live until done()). Unless
 * no_running, signals the running targets that have the library. */
int svc_multi_start(svc_multi_t *m, uint64_t id, struct svc_config *cfg,
                    const struct bk_sink *sink) HP_WARN_UNUSED;
/* Ends session @id on a thread of its own: its clients are drained and detached, their
 * final dumps written, its threads joined; then @done(@ctx, @id) runs on that thread
 * (no packet of the session is written after it). Returns 0 or -ENOENT. */
int svc_multi_stop(svc_multi_t *m, uint64_t id, void (*done)(void *ctx, uint64_t id), void *ctx);
/* The descriptors to poll (the daemon socket, each session's): returns their count. */
size_t svc_multi_pollfds(svc_multi_t *m, struct pollfd *fds, size_t max);
/* Milliseconds until the next continuous dump or check, or -1. */
int svc_multi_timeout_ms(svc_multi_t *m);
/* Accepts and routes connections, serves handshakes, continuous dumps, guardrails, and
 * forgets the sessions that have ended. Never blocks for long. */
void svc_multi_dispatch(svc_multi_t *m);
/* Dumps every live session now (SIGUSR1). */
void svc_multi_dump_now(svc_multi_t *m);
/* Sessions started and not yet forgotten (those ending included). */
size_t svc_multi_sessions(const svc_multi_t *m);
/* Ends the sessions still live (without callbacks), waits for every stop thread, removes
 * the socket. Accepts NULL. */
svc_multi_t *svc_multi_free(svc_multi_t *m);

/* Target discovery for attach. A process is attachable once its client installed the
 * attach handler: the client then maps a memfd named "heapprof-attach-<signo>" (see
 * preload/attach.c), so we signal only processes that show it, with that signal, and only
 * while the signal is caught. */
struct svc_proc {
    pid_t pid;
    char name[64];  /* basename of argv[0] */
    bool preloaded; /* libheapprof.so mapped */
    bool same_user;
    int attach_signo;    /* the signal its attach handler was installed for; 0: none yet */
    bool attach_ready;   /* attach_signo advertised, and caught (SigCgt) */
    uint64_t start_time; /* /proc/PID/stat starttime: the process's identity with its pid */
};
/* Reads /proc/@pid: 0, -ENOENT (gone), -errno. */
int svc_proc_inspect(pid_t pid, struct svc_proc *ret);
/* Calls @fn for every running process but ours that matches @cfg's targets and has
 * libheapprof.so mapped (ready to attach or not). */
void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx);
/* Sends the process @p describes its advertised attach signal, carrying @attacher (0:
 * the daemon) with SI_QUEUE, through a pidfd, after checking that the pid still names
 * the process inspected (its start time) and that the handler is still there. Returns 0,
 * -EAGAIN (no handler installed: still starting, disabled, or another handler), -ESRCH
 * (gone, or its pid now names another process), or -errno. */
int svc_proc_signal_attach(const struct svc_proc *p, pid_t attacher);

/* `heapprof dump`: asks the service listening on @socket_path (and, if @want > 0, only if
 * that is process @want) to dump every profiled process now: a control request on its
 * socket, answered. Returns 0 with the pid of the service that answered in @ret_pid,
 * -ENOENT / -ECONNREFUSED when nothing listens there, -ESRCH when the listener is another
 * process than @want (its pid in @ret_pid, nothing asked), -EPROTO when what answered is
 * not a heapprof service, -EACCES when it runs as another user (and we are not root),
 * -ETIMEDOUT, or -errno. */
int svc_control_dump(const char *socket_path, pid_t want, pid_t *ret_pid) HP_WARN_UNUSED;

#endif
