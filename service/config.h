/* service/config.h: the configuration of a profiling session (struct svc_config, field
 * names as Perfetto's HeapprofdConfig), the one table of its fields, its checks, and the
 * two ways it arrives from outside: a serialized HeapprofdConfig (service/config_proto.c)
 * and HeapprofdConfig in protobuf text format (service/config_text.c). A new field is
 * accepted from HeapprofdConfig bytes and text once it is in the struct and the table
 * (service/config.c), with its check if it needs one: all in service/. A command offers
 * it as a flag when its list of fields (cli/) names it; the flag and its --help come
 * from the table.
 *
 *     struct svc_config cfg;
 *     svc_config_init(&cfg);
 *     if (svc_config_load_file("heapprof.cfg", &cfg, err, sizeof(err)) < 0 ||
 *         svc_config_check(&cfg, err, sizeof(err)) < 0) ...;
 *     svc_config_done(&cfg);
 *
 * Not thread-safe: a configuration has one owner; the table is constant.
 */
#ifndef HP_SERVICE_CONFIG_H
#define HP_SERVICE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

#define SVC_MAX_TARGETS 64
/* Heaps a session may name (heaps), and their longest name with its NUL: as the client
 * takes them (shmem_ring/wire.h, WIRE_MAX_HEAP_SELECT and WIRE_HEAP_NAME_MAX). */
#define SVC_MAX_HEAPS 32
#define SVC_HEAP_NAME_MAX 64

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
    /* Heaps recorded: every one (all_heaps), the ones named, or with none named only
     * "libc.malloc" (the malloc family; heapprofd's default). */
    char heaps[SVC_MAX_HEAPS][SVC_HEAP_NAME_MAX];
    size_t n_heaps;
    bool all_heaps;
    bool no_startup; /* do not profile processes that connect at startup */
    bool no_running; /* do not attach running processes */
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
    /* Not a configuration field: a process that changes its user or group ids after it
     * connected stays profiled whatever its new uid (heapprof record as root: the
     * processes it started itself). */
    bool follow_any_ids;
    /* Not a configuration field: how to follow the children of fork() a session did not
     * follow, for the messages that count them (NULL: "use --follow-fork"). */
    const char *fork_hint;
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
    SVC_FIELD_HEAPS,    /* repeated string: appends to heaps[] (a flag's value: a list) */
    SVC_FIELD_ACCEPTED, /* a bool that is accepted and has no effect */
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

/* True when a process with @pid, name @comm (/proc/PID/comm; NULL: unknown) and
 * @cmdline (NUL-separated, @len bytes) is a target: `all`, its pid is listed, or a
 * process_cmdline entry equals, or matches as a glob, one of: its comm, its argv[0], the
 * basename of its argv[0], or its title (the command line as `ps` and `pgrep -f` show
 * it, svc_cmdline_title()). So `nginx` finds a master retitled "nginx: master process
 * /usr/sbin/nginx" by its comm, as `pgrep nginx` does, and 'postgres: *' finds every
 * retitled postgres child by its title. */
bool svc_config_matches(const struct svc_config *cfg, int32_t pid, const char *comm,
                        const char *cmdline, size_t len);
/* The title of a process from its @cmdline (@len bytes of /proc/PID/cmdline): the
 * arguments joined by spaces, without the padding a retitled process leaves (trailing
 * NULs or spaces). Writes at most @buf_len - 1 characters and a NUL; returns the count. */
size_t svc_cmdline_title(const char *cmdline, size_t len, char *buf, size_t buf_len);
/* True when the session records heap @name: all_heaps, named in heaps, or "libc.malloc"
 * when none is named. */
bool svc_config_records_heap(const struct svc_config *cfg, const char *name);
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

/* ---- HeapprofdConfig in protobuf text format (service/config_text.c) --------------- */

/* Parses a HeapprofdConfig in protobuf text format (field names as Perfetto's, e.g.
 * `sampling_interval_bytes: 4096`, `process_cmdline: "myapp"`,
 * `continuous_dump_config { dump_phase_ms: 0 dump_interval_ms: 1000 }`) into @cfg, on top
 * of what it holds. Unknown fields, bad values and syntax errors fail with -EINVAL and a
 * message "FILE:LINE: ..." in @err. */
int svc_config_parse_text(const char *text, size_t len, const char *filename,
                          struct svc_config *cfg, char *err, size_t err_len) HP_WARN_UNUSED;
/* Reads the file at @path (at most 1 MiB) and parses it as svc_config_parse_text() does. */
int svc_config_load_file(const char *path, struct svc_config *cfg, char *err,
                         size_t err_len) HP_WARN_UNUSED;

#endif
