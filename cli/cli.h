/* cli/cli.h: the subcommands of `heapprof` and helpers they share. */
#ifndef HP_CLI_CLI_H
#define HP_CLI_CLI_H

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

/* Parses a HeapprofdConfig in protobuf text format (field names as Perfetto's, e.g.
 * `sampling_interval_bytes: 4096`, `process_cmdline: "myapp"`,
 * `continuous_dump_config { dump_phase_ms: 0 dump_interval_ms: 1000 }`) into @cfg, on top
 * of what it holds. Unknown fields, bad values and syntax errors fail with -EINVAL and a
 * message "FILE:LINE: ..." in @err. */
int svc_config_parse_text(const char *text, size_t len, const char *filename,
                          struct svc_config *cfg, char *err, size_t err_len) HP_WARN_UNUSED;
int svc_config_load_file(const char *path, struct svc_config *cfg, char *err,
                         size_t err_len) HP_WARN_UNUSED;

/* Parses a byte count ("4096", "64k", "8M", "1G"); rejects 0, garbage and overflow.
 * Returns 0 or -EINVAL. */
int svc_parse_bytes(const char *s, uint64_t *ret) HP_WARN_UNUSED;

#endif
