/* tests/e2e/e2e_util.h: helpers for end-to-end tests that run real programs under
 * `heapprof record` and check the decoded trace. */
#ifndef HP_TESTS_E2E_UTIL_H
#define HP_TESTS_E2E_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
 * CHECK_TRACE) on @trace; returns its exit status (0: every rule holds). */
int e2e_check_rules(const char *trace);

/* Decodes @trace with `protoc --decode=perfetto.protos.Trace` against protos/ (PROTOC,
 * PROTOS_DIR, TRACE_PROTO); returns system()'s status (0 also when protoc is absent). */
int e2e_check_protoc(const char *trace);

/* The number right before @what in @text (e.g. 12 in "12 walks audited"), or -1. */
long long e2e_number_before(const char *text, const char *what);

/* A fresh temporary file path (malloc'd) ending in @suffix. */
char *e2e_tmp_path(const char *suffix);

/* Path from the environment variable @var, failing the test when unset. */
const char *e2e_env(const char *var);

#endif
