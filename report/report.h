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

/* A complete dump's totals over all its callsites, kept for every dump. */
struct rp_trace_dump_total {
    uint64_t timestamp;
    uint64_t unreleased_bytes, allocated_bytes;
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
    /* Their sites (the possibly freed heap's callsites in the selected dump: bytes still
     * possibly freed are self_allocated - self_freed), for a table apart. */
    size_t n_possibly_freed_sites;
    struct rp_trace_callsite *possibly_freed_sites;
    /* When the profile began, and when the process started, on the clock of timestamp;
     * 0: not in the trace. */
    uint64_t profile_start_ts, process_start_ts;
    struct rp_trace_losses losses;
    size_t n_callsites;
    struct rp_trace_callsite *callsites;
    /* With rp_trace_options.all_dumps: every complete dump, in order (n_dumps of them). */
    const struct rp_trace_dump *dumps;
    /* Every complete dump's totals, in order (n_dumps of them; with or without
     * all_dumps): the heap over time at little cost. */
    const struct rp_trace_dump_total *dump_totals;
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
    bool demangle;        /* demangle C++ and Rust names (default on in the CLI) */
    bool no_stacks;       /* one line per site instead of full stacks */
    bool unreleased_only; /* only the table of sites by unreleased bytes */
    bool no_lines;        /* frames as module+offset, without source lines */
    /* rp_report_print(): first a header (peak, totals), the table of processes and the
     * top functions, flat and cumulative. */
    bool summary;
    /* rp_report_print(): the per-site detail only for this many processes, those with
     * the most unreleased bytes (the others counted); 0: every process. */
    size_t max_processes;
    bool focused; /* a --focus dropped stacks: the peak is said to be the whole heap's */
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

/* What a folded stack's value is: bytes, or allocations (estimated as the report
 * estimates them, rp_callsite_count_scale()), unreleased at the dump or allocated. */
enum rp_folded_value {
    RP_FOLDED_UNRELEASED,
    RP_FOLDED_ALLOCATED,
    RP_FOLDED_UNRELEASED_COUNT,
    RP_FOLDED_ALLOCATED_COUNT,
};
/* "unreleased", "allocated", "unreleased-count", "allocated-count": 0 or -EINVAL. */
int rp_folded_value_parse(const char *s, enum rp_folded_value *ret) HP_WARN_UNUSED;
/* Callsite @c's value of kind @v. */
uint64_t rp_folded_value_of(const struct rp_trace_callsite *c, enum rp_folded_value v);

/* Prints the selected dump of every process of @t as folded stacks ("root;...;leaf
 * VALUE", one line per distinct stack with a value, as flamegraph.pl, inferno and
 * speedscope read them; report/folded.c says how names are written). With several
 * processes each stack starts with a frame "PROGRAM (PID)". Returns 0 or -ENOMEM. */
int rp_report_print_folded(FILE *out, const struct rp_trace *t, enum rp_folded_value v,
                           const struct rp_report_options *opt) HP_WARN_UNUSED;

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

/* A site's change from a base process to a process: the sites of both with equal frames
 * (function names, mapping paths and rel_pcs; callstack ids differ between traces),
 * added up per side ([0] the base, [1] the process; counts estimated). */
struct rp_diff_site {
    const struct rp_trace_callsite *c; /* one of them, for its frames */
    uint64_t unreleased[2], allocated[2], alloc_count[2];
    int64_t d_unreleased, d_allocated, d_alloc_count;
};

/* The process of @base that process @p (the @idx-th of its trace) is compared with: the
 * same pid, program and heap, else the same command line and heap, else the @idx-th;
 * NULL when none. */
const struct rp_trace_process *rp_diff_base_process(const struct rp_trace *base,
                                                    const struct rp_trace_process *p, size_t idx);

/* The sites of @base (may be NULL: all of @p is growth) and @p matched as
 * rp_report_print_diff() matches them, by unreleased growth then allocated growth,
 * descending, in *@ret (caller frees; frames borrowed from the traces). Returns 0 or
 * -ENOMEM. */
int rp_diff_sites(const struct rp_trace_process *base, const struct rp_trace_process *p,
                  struct rp_diff_site **ret, size_t *ret_n) HP_WARN_UNUSED;

/* A site followed over the dumps of a process, as rp_report_print_growth() ranks it. */
struct rp_growth_site {
    const struct rp_trace_callsite *c; /* its latest occurrence, for frames and counts */
    double *y;                         /* unreleased bytes at each dump */
    double slope;                      /* least squares, bytes per x unit */
    double z;                          /* slope / its standard error (INFINITY: exact) */
    double last;                       /* unreleased bytes at the last dump */
};

struct rp_growth {
    size_t n_dumps;
    bool timed;    /* x in seconds since the first dump; else dump numbers from 0 */
    double *x;     /* per dump */
    double *total; /* per dump: the process's unreleased bytes */
    size_t n_sites;
    struct rp_growth_site *sites; /* by z, then slope, descending */
};

/* The growth of every site of @p (loaded with all_dumps) over its dumps: least-squares
 * slope of its unreleased bytes and the slope's z score, with the sampling variance as
 * the floor of each point's. Returns 0, -ENODATA when @p has no dumps kept, -ENOMEM. */
int rp_growth_compute(const struct rp_trace_process *p, struct rp_growth *ret) HP_WARN_UNUSED;
void rp_growth_done(struct rp_growth *g);

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
/* The same with another default sample type, one of the four (Go's heap and allocs
 * profiles carry the same values and differ in it: "inuse_space", "alloc_space"). */
int rp_pprof_write_dump_as(const struct rp_trace_process *p, const struct rp_trace_dump *d,
                           const char *default_sample_type, int fd) HP_WARN_UNUSED;

/* Exports every dump (or dump @dump_index when > 0) of every process (or of @pid when
 * non-zero) of the trace at @trace_path, read once, one gzipped pprof file per (dump,
 * process, heap): "@out.pid<PID>[.exec<K>].<heap>.dump<N>.pb.gz" (the heap name with
 * anything but letters, digits, '.', '-' and '_' replaced by '_'), or @out itself when
 * it ends in ".pb.gz" and exactly one profile is selected. Names the files written on
 * @log (may be NULL). Returns 0, -ENODATA when nothing matched, or -errno; a truncated
 * trace is exported as far as it goes and flagged in *@ret_truncated (may be NULL). */
int rp_pprof_export(const char *trace_path, const char *out, int dump_index, int32_t pid, FILE *log,
                    bool *ret_truncated) HP_WARN_UNUSED;

/* ---- stack filters (report/filter.c): what every view shows of a stack ---------------
 *
 * Four rules, applied to a callsite's frames in this order:
 * - focus (--focus RE): the stack is dropped unless one of its frames matches;
 * - entry (unless full_stacks): frames on the root side of the outermost `main` are
 *   cut, or, without `main`, the thread and process entry frames at the root
 *   (`_start`, `__libc_start_main`, `start_thread`, `clone3`, ...);
 * - hide (--hide RE): matching frames are removed, the stack merging into the caller;
 * - fold (unless no_fold): allocator wrappers (`operator new`, `malloc`, `alloc::`,
 *   `std::allocator`, `g_malloc`, ... and fold[]) at the leaf end are folded into their
 *   callers, so the site is the first frame that is not a wrapper; a stack of nothing
 *   but wrappers keeps its outermost one.
 * Patterns are POSIX extended regular expressions, unanchored (use ^ and $), matched
 * against the demangled function name ("<unknown>" for a frame without one) of each
 * frame and of each function inlined into it: an inlined function that matches hide is
 * removed from the frame's inlined list, and wrappers inlined at the leaf end are
 * trimmed as frames are.
 *
 *     char err[256];
 *     rp_filter_t *f = rp_filter_new(&(struct rp_filter_options){.hide = res, .n_hide = 1},
 *                                    err, sizeof(err));
 *     if (!f) { fprintf(stderr, "%s\n", err); return 1; }
 *     struct rp_trace_frame *kept = malloc(c->n_frames * sizeof(*kept));
 *     size_t n;
 *     if (rp_filter_stack(f, c->frames, c->n_frames, kept, &n)) ...;  // kept[0..n)
 *     f = rp_filter_free(f);
 */
struct rp_filter_options {
    const char *const *hide; /* patterns of frames to remove */
    size_t n_hide;
    const char *const *focus; /* keep only stacks with a frame matching one of these */
    size_t n_focus;
    const char *const *fold; /* more allocator wrappers, beside the default ones */
    size_t n_fold;
    bool no_fold;     /* keep the default wrappers' frames (fold[] still applies) */
    bool full_stacks; /* keep the frames below main and thread entry points */
};

typedef struct rp_filter rp_filter_t;

/* A filter for @opt (NULL: the defaults: wrappers folded, entry frames cut). Returns
 * NULL and a one-line reason in @err (e.g. "bad --hide pattern 'a(': Missing ')'")
 * for a pattern that does not compile or out of memory. Caller frees with
 * rp_filter_free(). The patterns are copied. */
rp_filter_t *rp_filter_new(const struct rp_filter_options *opt, char *err, size_t errlen);
rp_filter_t *rp_filter_free(rp_filter_t *f);

/* Copies the frames @f keeps of @frames[0..@n) (root first) to @ret_frames (room for
 * @n), root first, their inlined lists possibly shortened (pointing into @frames' own or
 * into memory of @f), and their number to *@ret_n (0 when every frame was hidden).
 * Returns false, writing nothing, when focus drops the stack. Matches are cached by
 * the address of each function name (a loaded trace's names are interned), so a name's
 * string must not change while @f lives; inlined lists the filter shortened live in
 * @f until rp_filter_free(). Not thread-safe (the cache); one filter per thread. */
bool rp_filter_stack(rp_filter_t *f, const struct rp_trace_frame *frames, size_t n,
                     struct rp_trace_frame *ret_frames, size_t *ret_n);

/* Whether @function_name (as stored; demangled here) is an allocator wrapper that @f
 * folds, for views that show wrappers collapsed rather than cut. */
bool rp_filter_is_wrapper(rp_filter_t *f, const char *function_name);

/* The default wrapper patterns, NULL-terminated (for help texts and other views). */
extern const char *const rp_filter_default_wrappers[];

/* Rewrites every process of @t (each dump too) to what @f keeps: each callsite's frames
 * filtered, callsites dropped by focus removed, and callsites that end up with equal
 * frames merged (their values added). Equal filtered stacks share one frame array
 * within a process, as the reader's stacks do. Returns 0 or -ENOMEM (@t is then
 * unchanged, or changed for some processes only: still valid). */
int rp_trace_filter(struct rp_trace *t, rp_filter_t *f) HP_WARN_UNUSED;

/* rp_pprof_export() of the stacks @f keeps (NULL: all, as they are). */
int rp_pprof_export_filtered(const char *trace_path, const char *out, int dump_index, int32_t pid,
                             rp_filter_t *f, FILE *log, bool *ret_truncated) HP_WARN_UNUSED;

struct rp_html_options {
    bool demangle;          /* demangle C++ and Rust names */
    int dump_index;         /* the dump shown first (1-based); 0: the last */
    const char *title;      /* the trace's name, shown in the page */
    const char *base_title; /* the base's name (with a base) */
};

/* Writes @t (loaded with all_dumps for the views over time; else its selected dumps) to
 * @out as one self-contained HTML page: a summary per process, a flame graph per process
 * and dump, the heap over time and the sites by growth (continuous dumps), and with
 * @base (may be NULL; its selected dumps) the growth from @base per site, matched as
 * rp_report_print_diff() matches them. Returns the number of distinct stacks in the page,
 * or -ENOMEM, -EIO (@out failed). */
int rp_html_write(FILE *out, const struct rp_trace *t, const struct rp_trace *base,
                  const struct rp_html_options *opt) HP_WARN_UNUSED;

/* Demangles @name (C++, Rust legacy or v0) into @buf (truncating); returns @buf, or @name
 * if it is not mangled. */
const char *rp_demangle(const char *name, char *buf, size_t buf_len);

#endif
