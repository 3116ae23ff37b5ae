/* report/report.h: a streaming reader of heapprof (and heapprofd) Perfetto traces,
 * and the text report built on it.
 *
 * Reads the file packet by packet with bounded buffers; keeps the interned tables needed
 * to resolve callstacks and, per process, the samples of its latest dump (or of dump
 * number N). Used by `heapprof report`, `heapprof record`'s summary and the tests.
 *
 *     struct rp_trace *t;
 *     if (rp_trace_load("out.pftrace", &(struct rp_trace_options){0}, &t) == 0) {
 *         rp_report_print(stdout, t, &(struct rp_report_options){.top_n = 10});
 *         t = rp_trace_free(t);
 *     }
 */
#ifndef HP_REPORT_REPORT_H
#define HP_REPORT_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/macros.h"

struct rp_trace_frame {
    const char *function_name; /* as stored (possibly mangled); "" when unknown */
    const char *mapping_path;  /* "" when unknown */
    uint64_t rel_pc;
    /* The frame's mapping: build id in lower-case hex ("" when unknown), range in the
     * process, file offset of its start, load bias. Strings live as long as the trace. */
    const char *build_id;
    uint64_t map_start, map_end, map_offset, map_load_bias;
};

/* One callstack's cumulative values in the selected dump. */
struct rp_trace_callsite {
    uint64_t callstack_id;
    size_t n_frames;
    const struct rp_trace_frame *frames; /* root first */
    uint64_t self_allocated;
    uint64_t self_freed;
    uint64_t alloc_count;
    uint64_t free_count;
    uint64_t self_max;
    uint64_t self_max_count;
};

struct rp_trace_process {
    int32_t pid;
    const char *cmdline; /* arguments joined by spaces; "" if no process_tree packet */
    const char *heap_name;
    uint64_t sampling_interval_bytes;
    uint64_t timestamp; /* of the selected dump */
    uint32_t n_dumps;   /* complete dumps seen */
    bool from_startup, disconnected, buffer_overran, buffer_corrupted, hit_guardrail, client_error;
    /* heapprof's own flags: a writer stalled; the program closed the connection. */
    bool writer_stalled, connection_closed_by_program;
    /* ProcessStats */
    uint64_t unwinding_errors, heap_samples, map_reparses, total_unwinding_time_us,
        client_spinlock_blocked_us, writer_stalls, stalled_records_skipped;
    size_t n_callsites;
    struct rp_trace_callsite *callsites;
};

struct rp_trace {
    size_t n_processes;
    struct rp_trace_process *processes;
    uint64_t n_packets;
    uint64_t n_profile_packets;
    bool has_clock_snapshot;
};

struct rp_trace_options {
    int dump_index; /* 0: latest complete dump per process; N>0: the Nth (1-based) */
    int32_t pid;    /* 0: every process; else only this one */
};

/* Reads the trace in the @len bytes at @buf (borrowed), as rp_trace_load(). */
int rp_trace_load_buffer(const void *buf, size_t len, const struct rp_trace_options *opt,
                         struct rp_trace **ret) HP_WARN_UNUSED;

/* Reads @path. Returns 0, -ENOENT/-errno for I/O errors, -EBADMSG for a malformed trace
 * (a truncated last packet is tolerated and ignored). */
int rp_trace_load(const char *path, const struct rp_trace_options *opt,
                  struct rp_trace **ret) HP_WARN_UNUSED;
struct rp_trace *rp_trace_free(struct rp_trace *t);

struct rp_report_options {
    int top_n;            /* sites per table; 0 means 10 */
    bool demangle;        /* demangle C++ names (default on in the CLI) */
    bool no_stacks;       /* one line per site instead of full stacks */
    bool unreleased_only; /* only the table of sites by unreleased bytes */
};

/* Prints, per process: top sites by unreleased bytes, top sites by allocated bytes, with
 * counts and full stacks, then the stats. */
void rp_report_print(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt);

/* Prints the growth per callsite from @base to @t (unreleased and allocated bytes),
 * callsites matched across the two traces by their frames (function names, mapping
 * paths and rel_pcs; ids differ between traces), processes by pid when both have it,
 * else in order. */
void rp_report_print_diff(FILE *out, const struct rp_trace *base, const struct rp_trace *t,
                          const struct rp_report_options *opt);

/* Writes process @p's selected dump of @t to @fd as a gzipped pprof Profile
 * (perftools.profiles) with sample types alloc_objects/count, alloc_space/bytes,
 * inuse_objects/count, inuse_space/bytes. Returns 0 or -errno. */
int rp_pprof_write(const struct rp_trace *t, const struct rp_trace_process *p,
                   int fd) HP_WARN_UNUSED;

/* Exports every dump (or dump @dump_index when > 0) of every process (or of @pid when
 * non-zero) of the trace at @trace_path, one gzipped pprof file per (dump, process,
 * heap): "@out.pid<PID>.<heap>.dump<N>.pb.gz", or @out itself when it ends in ".pb.gz"
 * and exactly one profile is selected. Names the files written on @log (may be NULL).
 * Returns 0, -ENODATA when nothing matched, or -errno. */
int rp_pprof_export(const char *trace_path, const char *out, int dump_index, int32_t pid,
                    FILE *log) HP_WARN_UNUSED;

/* Demangles @name into @buf (truncating); returns @buf, or @name if it is not mangled. */
const char *rp_demangle(const char *name, char *buf, size_t buf_len);

#endif
