/* cli/cli.h: the subcommands of `heapprof` and helpers they share. */
#ifndef HP_CLI_CLI_H
#define HP_CLI_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "cli/loop.h"
#include "service/svc.h"

/* Exit codes (documented in --help). */
#define EXIT_USAGE 2
#define EXIT_PROFILER 3
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND 127

/* Prints the end-of-session summary (counters, top @top sites by unreleased bytes read
 * back from the trace, its path) on stderr. */
void cli_print_summary(const char *out_path, const struct svc_summary *sum, int top);

/* ---- one session (cli/session.c) ------------------------------------------------- */

struct cli_session {
    const char *prog;             /* for messages: "heapprof record" */
    const struct svc_config *cfg; /* checked already */
    const char *output;           /* trace file */
    bool output_made_up;          /* a default name: never an existing file (cli/output.c) */
    char *output_opened;          /* NULL, or PATH_MAX bytes for the path opened (a made-up name
                                     may get a number), written before started() runs */
    bool quiet;                   /* no summary */
    bool drop_if_empty;           /* no process profiled: remove the trace, no summary */
    int top;                      /* sites in the summary */
    struct cli_loop_opts loop;    /* the dump schedule is taken from @cfg */
    /* Once the service listens (signal targets, let a child run); < 0 skips the loop. */
    int (*started)(void *ctx, svc_t *s);
    /* After the loop, before the final dumps. */
    void (*stopping)(void *ctx, const struct cli_loop_result *res);
    void *ctx;
    uint64_t *ret_processes; /* NULL, or where to store how many processes were profiled */
};

/* Opens the output, starts the service, runs the loop, finishes (final dumps), closes the
 * output and prints the summary. Returns 0 or EXIT_PROFILER after a message on stderr;
 * the loop's outcome in @ret_res. */
int cli_session_run(const struct cli_session *cs, struct cli_loop_result *ret_res);

/* ---- the trace file (cli/output.c) ------------------------------------------------ */

/* Opens the trace file @path for writing without following a symlink someone else
 * planted or truncating a file that is not ours. A new file is created (O_EXCL, mode
 * 0644). @made_up (a default name): an existing file is never reused, the next free
 * "<stem>.N<ext>" (N <= 99) is taken. Otherwise an existing name is written to when it
 * is a regular file owned by our effective uid with one link (then truncated), or a
 * FIFO or character device, reached directly or through a symlink owned by us or root.
 * The path opened goes to @ret_path (@path_len bytes). Returns the fd, or -errno with a
 * message in @err. */
int cli_output_open(const char *path, bool made_up, char *ret_path, size_t path_len, char *err,
                    size_t err_len) HP_WARN_UNUSED;

/* ---- heapprofd --producer (cli/cmd_producer.c) ------------------------------------- */

struct cli_producer_opts {
    const struct svc_config *base; /* heapprof's own fields, for every session */
    const char *daemon_socket;     /* where processes with the library connect */
    const char *producer_socket;   /* NULL: Perfetto's default (producer/producer.h) */
    const char *data_source;       /* NULL: "android.heapprofd" */
    uint32_t smb_size_hint_bytes, smb_page_size_hint_bytes; /* 0: 1 MiB, 16 KiB pages */
    void (*started)(void *ctx);                             /* once listening; may be NULL */
    void *ctx;
};

/* Runs the daemon as a data source of Perfetto's tracing service until SIGINT/SIGTERM
 * (then every session's final dumps are written and acknowledged, within 10 s). Returns
 * 0 or EXIT_PROFILER after a message on stderr. */
int cli_producer_run(const struct cli_producer_opts *o);

int cmd_record(int argc, char **argv);
/* libheapprof.so: HEAPPROF_LIB when set, else next to this binary (the build tree's
 * ../preload/, or installed); malloc'd, or NULL when none is readable. */
char *cli_find_library(void);
/* Tells the service which library to load into processes started without it
 * (service/inject.h): attach and heapprofd call it before attaching anything. */
void cli_set_inject_library(void);
int cmd_report(int argc, char **argv);
int cmd_pprof(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_dump(int argc, char **argv);
int cmd_daemon(int argc, char **argv);
int cmd_html(int argc, char **argv);

/* ---- options for configuration fields (cli/options.c) ------------------------------ */

/* A configuration field a command offers as an option. @flag overrides the table's long
 * option (with @short_flag; NULL: the table's). The name "continuous_dump_config" stands
 * for "--continuous-dump INTERVAL_MS[,PHASE_MS]". A list ends with {NULL}. */
struct cli_field {
    const char *name;
    const char *flag;
    char short_flag;
};

/* getopt_long returns these for field options (index into the command's field list). */
#define CLI_OPT_FIELD 0x1000
#define CLI_OPT_FIELD_NEG 0x2000

struct cli_opts {
    struct option *longopts; /* the command's own options, then the fields' */
    char shortopts[64];
    const struct svc_config_field **fields; /* NULL for continuous_dump_config */
    const char **flags;                     /* long option of each field */
    int short_map[256];                     /* short option -> field index + 1 */
    size_t n_fields;
};

/* Builds the option arrays from the command's own options (@own, ending with {0}; their
 * short letters in @own_short, getopt syntax) and @fields. Returns 0, -ENOMEM, or -ENOENT
 * for a field name the table does not have. Free with cli_opts_done(). */
int cli_opts_build(struct cli_opts *o, const struct option *own, const char *own_short,
                   const struct cli_field *fields) HP_WARN_UNUSED;
void cli_opts_done(struct cli_opts *o);
/* Applies option @c with @arg to @cfg when it is a field's: returns 1, or -1 after printing
 * "<prog>: invalid <what> '<arg>': <why>" on stderr; 0 when @c is not a field option. */
int cli_opts_apply(const struct cli_opts *o, int c, const char *arg, struct svc_config *cfg,
                   const char *prog);
/* Prints the --help lines of the fields' options. */
void cli_opts_help(FILE *f, const struct cli_opts *o);

/* A decimal number in [@min, @max] (svc_parse_uint()); -EINVAL otherwise. */
int cli_parse_range(const char *s, uint64_t min, uint64_t max, uint64_t *ret) HP_WARN_UNUSED;

/* "INTERVAL_MS[,PHASE_MS]" into cfg->dump_interval_ms/dump_phase_ms; -EINVAL. */
int cli_parse_continuous_dump(const char *arg, struct svc_config *cfg) HP_WARN_UNUSED;

/* The options `heapprof record`, `heapprof attach` and heapprofd share, each offered by
 * some: -o/--output FILE, --status, --no-status, --top N, -q/--quiet. Their getopt_long
 * values are 'o', 'q' and these (a command's own options count from 256). */
enum { CLI_OPT_STATUS = 0x800, CLI_OPT_NO_STATUS, CLI_OPT_TOP };

struct cli_common_opts {
    const char *output; /* NULL: the command makes a name up */
    bool status_line;   /* a live status line, if stderr is a terminal */
    bool quiet;         /* no summary */
    uint64_t top;       /* sites in the summary */
};

/* Applies option @c with @arg to @co when it is one of the shared options: returns 1, or
 * -1 after printing "<prog>: invalid --top '<arg>'" on stderr; 0 when it is not. */
int cli_common_apply(struct cli_common_opts *co, int c, const char *arg, const char *prog);

#endif
