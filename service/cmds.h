/* service/cmds.h: the subcommands of `heapprof` and helpers they share. */
#ifndef HP_SERVICE_CMDS_H
#define HP_SERVICE_CMDS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "service/svc.h"

/* Exit codes (documented in --help). */
#define EXIT_USAGE 2
#define EXIT_PROFILER 3
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND 127

/* Prints the end-of-session summary (counters, top @top sites by unreleased bytes read
 * back from the trace, its path) on stderr. */
void svc_print_summary(const char *out_path, const struct svc_summary *sum, int top);

/* "INTERVAL_MS[,PHASE_MS]" into cfg->dump_interval_ms/dump_phase_ms; -EINVAL. */
int parse_continuous_dump(const char *arg, struct svc_config *cfg);

int cmd_attach(int argc, char **argv);
int cmd_dump(int argc, char **argv);
int cmd_daemon(int argc, char **argv, const char *prog_name);

/* Creates (if needed) and checks the runtime directory (common/paths.h): a directory
 * owned by us with mode 0700. Writes its path to @buf. Returns 0 or -errno with a
 * message in @err. */
int svc_runtime_dir_prepare(char *buf, size_t len, char *err, size_t err_len);

/* Target discovery for attach. */
struct svc_proc {
    pid_t pid;
    char name[64];  /* basename of argv[0] */
    bool preloaded; /* libheapprof.so mapped */
    bool same_user;
};
/* Reads /proc/@pid: 0, -ENOENT (gone), -errno. */
int svc_proc_inspect(pid_t pid, struct svc_proc *ret);
/* Calls @fn for every running process but ours that matches @cfg's targets and has
 * libheapprof.so mapped. */
void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx);
/* Sends the attach signal carrying @attacher (0: the daemon). Returns 0 or -errno. */
int svc_proc_signal_attach(pid_t pid, pid_t attacher);
/* The attach signal: HEAPPROF_ATTACH_SIGNAL or SIGRTMIN+4. */
int svc_attach_signal(void);

#endif
