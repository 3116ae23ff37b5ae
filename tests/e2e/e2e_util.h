/* tests/e2e/e2e_util.h: helpers for end-to-end tests that run real programs under
 * `heapprof record` and check the decoded trace. */
#ifndef HP_TESTS_E2E_UTIL_H
#define HP_TESTS_E2E_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "report/report.h"

#define E2E_MAX_TRUTH 16

struct e2e_truth {
    char name[64];
    uint64_t alloc_bytes, alloc_count, free_bytes, free_count;
};

struct e2e_run {
    int status; /* exit code, or 128 + signal */
    char *out;  /* captured stdout (malloc'd, NUL-terminated) */
    char *err;  /* captured stderr */
};

/* Runs @argv (NULL-terminated) with extra environment entries @env (NULL-terminated or
 * NULL), capturing stdout and stderr. Returns 0 or -errno. */
int e2e_run(char *const argv[], char *const env[], struct e2e_run *ret);
void e2e_run_free(struct e2e_run *r);

/* Runs @argv with a new pseudo-terminal as its stdin, stdout and stderr (what a user's
 * terminal gives), everything it writes there in ret->out (ret->err stays empty).
 * Returns 0 or -errno. */
int e2e_run_pty(char *const argv[], struct e2e_run *ret);

/* Parses "truth NAME A B C D" lines. Returns the count. */
size_t e2e_parse_truth(const char *out, struct e2e_truth *t, size_t max);

/* Sums the callsites of @p with a frame whose (demangled) name contains @fn. */
struct e2e_sums {
    uint64_t alloc_bytes, alloc_count, free_bytes, free_count, callsites;
};
void e2e_sum_function(const struct rp_trace_process *p, const char *fn, struct e2e_sums *ret);

/* The process whose cmdline contains @needle, or NULL. */
const struct rp_trace_process *e2e_find_process(const struct rp_trace *t, const char *needle);

/* Runs the trace-processor import rule checker (tests/report/check_trace.c, path in
 * CHECK_TRACE) on @trace, then Perfetto's trace_processor_shell where present
 * (TRACE_PROCESSOR): returns 0 when every rule holds and Perfetto's processor reports no
 * error stat. */
int e2e_check_rules(const char *trace);
/* The answer of Perfetto's trace processor (TRACE_PROCESSOR, where present) to @sql on
 * @trace, as CSV lines with a header (malloc'd; a line in parentheses when it failed);
 * NULL when it is absent. */
char *e2e_trace_processor_query(const char *trace, const char *sql);

/* Decodes @trace with `protoc --decode=perfetto.protos.Trace` against protos/ (PROTOC,
 * PROTOS_DIR, TRACE_PROTO); returns system()'s status (0 also when protoc is absent). */
int e2e_check_protoc(const char *trace);

/* The number right before @what in @text (e.g. 12 in "12 walks audited"), or -1. */
long long e2e_number_before(const char *text, const char *what);

/* A fresh temporary file path (malloc'd) ending in @suffix. */
char *e2e_tmp_path(const char *suffix);

/* Path from the environment variable @var, failing the test when unset. */
const char *e2e_env(const char *var);

/* Sleeps @ms, EINTR or not. */
void e2e_sleep_ms(long ms);
/* waitpid: exit code, or 128 + signal. */
int e2e_wait_status(pid_t pid);
/* True while @pid (a child) has not exited; reaps it when it has. */
bool e2e_alive(pid_t pid);
/* The file's contents (at most 1 MiB), "" if missing. Caller frees. */
char *e2e_read_file(const char *path);
/* Makes a fresh runtime directory /tmp/heapprof-e2e-@tag-XXXXXX into @buf and points
 * XDG_RUNTIME_DIR at it: attachers and targets find the session sockets there. Returns
 * 0 or -1. */
int e2e_runtime_dir_make(char *buf, size_t size, const char *tag);
/* Removes it with everything inside: 0 or -1. */
int e2e_runtime_dir_remove(const char *dir);

/* A program started by e2e_target_start(): its pid, the write end of its stdin, the file
 * of its stdout and stderr. */
struct e2e_target {
    pid_t pid;
    int in;
    char out[256];
};
/* Starts @argv (argv[0] a path), stdin a pipe, stdout and stderr to a new file in @dir;
 * with @preload, LD_PRELOAD=@preload and HEAPPROF_STARTUP=0 (the library dormant). Waits
 * up to 10 s for @ready_text in its output (NULL: does not wait). Returns 0 or -1. */
int e2e_target_start(struct e2e_target *t, const char *dir, char *const argv[], const char *preload,
                     const char *ready_text);
/* Ends @t: signal @sig (0: none), EOF on its stdin; returns its exit status (128 +
 * signal), or -1. */
int e2e_target_finish(struct e2e_target *t, int sig);

#endif
