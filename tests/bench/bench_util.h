/* tests/bench/bench_util.h: what the benchmarks that run heapprof as a command share. */
#ifndef HP_TESTS_BENCH_BENCH_UTIL_H
#define HP_TESTS_BENCH_BENCH_UTIL_H

#include <stddef.h>

/* The build tree to measure: HEAPPROF_BUILD, else the one holding this executable
 * (<build>/tests/bench/<name>). Returns 0 or -1. */
int bench_build_dir(char *buf, size_t len);

/* Runs @argv (NULL-terminated) with stdout to /dev/null and its stderr into @out
 * (NUL-terminated, at most @cap - 1 bytes). Returns the exit status, -1 on failure to run
 * or on a death by signal. */
int bench_run_stderr(char *const argv[], char *out, size_t cap);

/* A fresh temporary file name for a trace, in @buf (at least 32 bytes). Returns 0 or -1. */
int bench_tmp_trace(char *buf, size_t len);

#endif
