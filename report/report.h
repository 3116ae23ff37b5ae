/* report/report.h: a streaming reader of heapprof (and heapprofd) Perfetto traces,
 * and the text report, growth report and pprof export built on it.
 *
 * Reads the file packet by packet with bounded buffers; keeps the interned tables needed
 * to resolve callstacks and, per process, the samples of its latest dump (or of dump
 * number N, or of every dump). Each callstack is resolved once per packet sequence and
 * shared by every sample that uses it, and what the reader keeps is bounded by a budget
 * proportional to the input (-EFBIG past it). Source lines (ModuleSymbols) are attached
 * to the frames, inlined functions included. Programs exec'd in one pid are separate
 * processes (exec_index 0, 1, ...), each named by its own command line. Used by
 * `heapprof report` and `pprof`, `heapprof record`'s summary and the tests.
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

/* A source position: the function, its file and line. */
struct rp_trace_line {
    const char *function_name; /* "" when unknown */
    const char *file;          /* "" when unknown */
    uint32_t line;             /* 0 when unknown */
};

struct rp_trace_frame {
    const char *function_name; /* as stored (possibly mangled); "" when unknown */
    const char *mapping_path;  /* "" when unknown */
    uint64_t rel_pc;
    /* The frame's mapping: build id in lower-case hex ("" when unknown), range in the
     * process, file offset of its start, load bias. Strings live as long as the trace. */
    const char *build_id;
    uint64_t map_start, map_end, map_offset, map_load_bias;
    /* From the trace's ModuleSymbols: the frame's own source position (its function's
     * code at rel_pc, or the call of the outermost inlined function), "" and 0 when the
     * trace has none; and the functions inlined at rel_pc, innermost first (the frame's
     * own function calls inlined[n_inlined - 1], which calls ..., inlined[0]). */
    const char *file;
    uint32_t line;
    uint32_t n_inlined;
    const struct rp_trace_line *inlined;
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
    /* Allocations the samples stand for, estimated by the writer from each sampled
     * allocation's real size (heapprof traces); 0 when the trace has no estimate. Counts
     * above are sampled allocations. */
    uint64_t est_alloc_count;
};

/* Estimated allocations per sampled allocation of @c under the sampling model (>= 1):
 * counts times this are estimates of real counts, as Go's runtime scales its sampled
 * heap profiles. 1 when the trace carries no estimate (counts stay sample counts). */
double rp_callsite_count_scale(const struct rp_trace_callsite *c);

/* One complete dump of a process (kept with rp_trace_options.all_dumps). */
struct rp_trace_dump {
    uint64_t timestamp;
    uint64_t sampling_interval_bytes;
    size_t n_callsites;
    struct rp_trace_callsite *callsites;
};

/* Records lost on their way to a dump, by cause (heapprof's own ProcessStats fields,
 * protos/profile_packet.proto; 0 in traces of other writers). */
struct rp_trace_losses {
    uint64_t records_dropped;  /* the client's ring full, a record too big, freeset_full */
    uint64_t reserve_failures; /* contention on the client's ring */
    uint64_t freeset_full;     /* of records_dropped: the client's watched set full */
    uint64_t records_unread;   /* left in the ring when the session ended */
    uint64_t records_lost_in_service;
    uint64_t records_refused; /* by the bookkeeping: caps, probe bounds, memory */
    uint64_t unknown_frees;
    uint64_t seq_gaps;
    uint64_t stacks_truncated; /* copies stopped at max_stack_bytes */
    uint64_t unknown_stacks;   /* samples on stacks not the thread's own */
    uint64_t map_reparses_deferred;
    uint64_t unseen_call_slots; /* the program's allocator call slots left unswitched */
};

struct rp_trace_process {
    int32_t pid;
    /* Programs run in this pid before this one (exec): 0 for the first. */
    uint32_t exec_index;
    const char *cmdline; /* arguments joined by spaces; "" if no process_tree packet */
    const char *heap_name;
    uint64_t sampling_interval_bytes;
    uint64_t timestamp; /* of the selected dump */
    uint32_t n_dumps;   /* complete dumps seen */
    bool selected;      /* the dump asked for exists (callsites and header are its) */
    bool from_startup, disconnected, buffer_overran, buffer_corrupted, hit_guardrail, client_error;
    /* heapprof's own flags: a writer stalled; the program closed the connection; the
     * profiler lost the process while it ran (disconnected alone: it exited). */
    bool writer_stalled, connection_closed_by_program, connection_lost;
    /* ProcessStats */
    uint64_t unwinding_errors, heap_samples, map_reparses, total_unwinding_time_us,
        client_spinlock_blocked_us, writer_stalls, stalled_records_skipped;
    uint64_t frees_lost; /* frees lost on the way: their bytes show as unreleased */
    /* Live allocations of the selected dump whose free may have been lost (heapprof's
     * heap PF_HEAP_POSSIBLY_FREED, folded into the process's other heap and not listed
     * as a process of its own): sampled allocations and their bytes, not in callsites. */
    uint64_t possibly_freed_count, possibly_freed_bytes;
    /* When the profile began, on the clock of timestamp; 0: not in the trace. */
    uint64_t profile_start_ts;
    struct rp_trace_losses losses;
    size_t n_callsites;
    struct rp_trace_callsite *callsites;
    /* With rp_trace_options.all_dumps: every complete dump, in order (n_dumps of them). */
    const struct rp_trace_dump *dumps;
};

struct rp_trace {
    size_t n_processes;
    struct rp_trace_process *processes;
    uint64_t n_packets;
    uint64_t n_profile_packets;
    uint64_t n_source_lines; /* addresses given source lines by ModuleSymbols */
    bool has_clock_snapshot;
    /* The file ends inside a packet (at byte truncated_at; file_bytes in all) or inside
     * a dump (incomplete_dumps of them, dropped): what is read is all before it. */
    bool truncated;
    uint64_t truncated_at, file_bytes;
    uint32_t incomplete_dumps;
};

struct rp_trace_options {
    int dump_index; /* 0: latest complete dump per process; N>0: the Nth (1-based) */
    int32_t pid;    /* 0: every process; else only this one (every program it ran) */
    bool all_dumps; /* keep every complete dump in rp_trace_process.dumps */
};

/* Reads the trace in the @len bytes at @buf (borrowed), as rp_trace_load(). */
int rp_trace_load_buffer(const void *buf, size_t len, const struct rp_trace_options *opt,
                         struct rp_trace **ret) HP_WARN_UNUSED;

/* Reads @path. Returns 0, -ENOENT/-errno for I/O errors (-EISDIR for a directory),
 * -EBADMSG for a malformed trace, -EFBIG when keeping what it asks for would take more
 * memory than the budget for its size. A file that ends inside a packet or a dump is
 * read up to there and flagged (rp_trace.truncated). */
int rp_trace_load(const char *path, const struct rp_trace_options *opt,
                  struct rp_trace **ret) HP_WARN_UNUSED;
struct rp_trace *rp_trace_free(struct rp_trace *t);

struct rp_report_options {
    int top_n;            /* sites per table; 0 means 10 */
    bool demangle;        /* demangle C++ names (default on in the CLI) */
    bool no_stacks;       /* one line per site instead of full stacks */
    bool unreleased_only; /* only the table of sites by unreleased bytes */
    bool no_lines;        /* frames as module+offset, without source lines */
};

/* Prints, per process: top sites by unreleased bytes, top sites by allocated bytes, with
 * estimated counts (and sample counts), error bars and full stacks, then the stats.
 * Processes without the selected dump are skipped. */
void rp_report_print(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt);

/* Prints the record summary for many processes: a table of every process (pid,
 * program, samples, allocated, unreleased), then the top sites of the @n_largest ones
 * with the most unreleased bytes. */
void rp_report_print_summary(FILE *out, const struct rp_trace *t,
                             const struct rp_report_options *opt, size_t n_largest);

/* Prints, per process of @t (loaded with all_dumps), its unreleased bytes at each dump
 * as a text chart, and the call sites ranked by how steadily their unreleased bytes
 * grow: least-squares slope per second and its z score under the sampling model. */
void rp_report_print_growth(FILE *out, const struct rp_trace *t,
                            const struct rp_report_options *opt);

/* Prints the growth per callsite from @base to @t (unreleased and allocated bytes),
 * callsites matched across the two traces by their frames (function names, mapping
 * paths and rel_pcs; ids differ between traces), processes by pid when both have it,
 * else in order. */
void rp_report_print_diff(FILE *out, const struct rp_trace *base, const struct rp_trace *t,
                          const struct rp_report_options *opt);

/* Writes process @p's selected dump of @t to @fd as a gzipped pprof Profile
 * (perftools.profiles) with sample types alloc_objects/count, alloc_space/bytes,
 * inuse_objects/count, inuse_space/bytes (counts estimated as rp_callsite_count_scale()
 * says; inuse_space by default). The main executable is the first mapping; frames keep
 * their own addresses; source lines and inlined functions become Lines. Returns 0 or
 * -errno. */
int rp_pprof_write(const struct rp_trace *t, const struct rp_trace_process *p,
                   int fd) HP_WARN_UNUSED;
/* The same for dump @d of @p. */
int rp_pprof_write_dump(const struct rp_trace_process *p, const struct rp_trace_dump *d,
                        int fd) HP_WARN_UNUSED;

/* Exports every dump (or dump @dump_index when > 0) of every process (or of @pid when
 * non-zero) of the trace at @trace_path, read once, one gzipped pprof file per (dump,
 * process, heap): "@out.pid<PID>[.exec<K>].<heap>.dump<N>.pb.gz" (the heap name with
 * anything but letters, digits, '.', '-' and '_' replaced by '_'), or @out itself when
 * it ends in ".pb.gz" and exactly one profile is selected. Names the files written on
 * @log (may be NULL). Returns 0, -ENODATA when nothing matched, or -errno; a truncated
 * trace is exported as far as it goes and flagged in *@ret_truncated (may be NULL). */
int rp_pprof_export(const char *trace_path, const char *out, int dump_index, int32_t pid, FILE *log,
                    bool *ret_truncated) HP_WARN_UNUSED;

/* Demangles @name into @buf (truncating); returns @buf, or @name if it is not mangled. */
const char *rp_demangle(const char *name, char *buf, size_t buf_len);

#endif
