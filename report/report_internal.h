/* report/report_internal.h: what the files of the trace reader share (internal to
 * report/; the API is report/report.h).
 *
 * The reader keeps, while it reads a trace (struct rd):
 * - per packet sequence (struct rd_seq, trusted_packet_sequence_id): the interning
 *   tables and the dump in progress (ProfilePackets linked by `continued`);
 * - per (pid, program, heap) (struct rd_proc): the number of complete dumps and the
 *   callsites of the selected one (or of every one), resolved when the dump completes:
 *   each callstack once per sequence generation, its frames shared by every sample;
 * - per pid (struct rd_pid): which program (exec) the pid runs now, from ProcessTree;
 * - source lines of (module, address) from ModuleSymbols, attached to the frames at
 *   the end (they follow the dumps that use the frames).
 *
 *     reader.c    the file, its packets, the sequences, the processes and the result
 *     interned.c  interned data: strings, mappings, frames, callstacks
 *     dumps.c     ProfilePackets: per-process dumps, complete ones selected
 *     resolve.c   callstack ids -> shared frame arrays; ModuleSymbols -> source lines
 *
 *     struct rd_seq *seq = ...;                    // reader.c: one per sequence
 *     r = rp__parse_interned(rd, seq, buf, len);   // TracePacket.interned_data
 *     r = rp__resolve_stack(rd, seq, cs_id, &stk); // a callstack's frames, once
 *
 * Not thread-safe; one struct rd per load.
 */
#ifndef HP_REPORT_REPORT_INTERNAL_H
#define HP_REPORT_REPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/containers.h"
#include "common/strtab.h"
#include "protos/fields.h"
#include "report/report.h"

#define READ_MAX_PACKET_BYTES (64u * 1024 * 1024)
#define READ_MAX_STRING_BYTES 4096
#define READ_MAX_COMPONENTS 256
#define READ_MAX_FRAMES 4096
/* Source lines per address (inlined functions and the function itself). */
#define READ_MAX_LINES 64
/* What the reader keeps (resolved frames, callsites, source lines) stays below
 * READ_BUDGET_BASE + READ_BUDGET_PER_BYTE bytes per input byte; past it -EFBIG. */
#define READ_BUDGET_BASE (64u << 20)
#define READ_BUDGET_PER_BYTE 128u

enum { STR_FUNCTION, STR_PATH, STR_BUILD_ID, STR_KINDS };

struct rd_str {
    const char *s;
    size_t len;
};

struct rd_mapping {
    const uint64_t *comps;
    uint32_t n_comps;
    uint64_t build_id, start, end, exact_offset, load_bias;
};

struct rd_mapping_info {
    const char *path, *build_id; /* strtab */
};

struct rd_frame {
    uint64_t name_id, mapping_id, rel_pc;
};

struct rd_callstack {
    const uint64_t *frames;
    size_t n;
};

struct rd_sample {
    uint64_t callstack_id;
    uint64_t self_allocated, self_freed, alloc_count, free_count, self_max, self_max_count,
        est_alloc_count;
};

/* A callstack resolved once for its sequence generation; frames in the trace's arena. */
struct rd_stack {
    struct rp_trace_frame *frames; /* root first */
    size_t n;
};

struct rd_header {
    uint64_t timestamp, sampling_interval_bytes;
    bool from_startup, disconnected, buffer_overran, buffer_corrupted, hit_guardrail, client_error;
    bool writer_stalled, connection_closed_by_program, connection_lost;
    uint64_t unwinding_errors, heap_samples, map_reparses, total_unwinding_time_us,
        client_spinlock_blocked_us, frees_lost, writer_stalls, stalled_records_skipped;
    uint64_t profile_start_ts;
    uint64_t process_start_ts;
    struct rp_trace_losses losses;
};

/* One process's (and heap's) part of the dump in progress on a sequence. */
struct rd_pdump {
    uint64_t pid;
    const char *heap_name; /* in the trace's strtab */
    struct rd_header hdr;
    struct hp_map index; /* callstack id -> index in samples */
    struct rd_sample *samples;
    size_t n_samples, cap_samples;
};

struct rd_seq {
    uint32_t id;
    struct hp_map resolved; /* callstack iid -> struct rd_stack */
    struct hp_arena arena;
    struct hp_map strs[STR_KINDS]; /* iid -> struct rd_str */
    struct hp_map mappings;        /* iid -> struct rd_mapping */
    struct hp_map frames;          /* iid -> struct rd_frame */
    struct hp_map callstacks;      /* iid -> struct rd_callstack */
    struct hp_map path_cache;      /* mapping iid -> struct rd_mapping_info */
    bool have_index;
    uint64_t next_index;
    bool in_dump;           /* the last ProfilePacket had `continued` */
    struct rd_pdump *chain; /* the dump in progress */
    size_t n_chain, cap_chain;
    struct hp_idtab chain_index; /* (pid, heap) -> index in chain */
};

/* What ProcessTree said of a pid: its current program and whether that one was dumped
 * (a new command line after a dump is the next program exec'd in the pid). */
struct rd_pid {
    uint32_t exec_index;
    bool dumped;
    bool ended;          /* its latest dump was its last (disconnected): it exited or exec'd */
    const char *cmdline; /* strtab */
};

struct rd_proc {
    int32_t pid;
    uint32_t exec_index;
    const char *heap_name;
    const char *cmdline;
    uint32_t n_dumps;
    bool selected;
    struct rd_header hdr;
    struct rp_trace_callsite *callsites; /* malloc'd; owned by the trace once selected */
    size_t n_callsites;
    struct rp_trace_dump *dumps; /* all_dumps: every complete dump (malloc'd) */
    size_t cap_dumps;
    struct rp_trace_dump_total *totals; /* every complete dump (malloc'd) */
    size_t cap_totals;
};

/* Source lines of an address of a module (ModuleSymbols). */
struct rd_syms {
    const char *path, *build_id; /* strtab: the mapping's path and hex build id */
    uint64_t address;
    uint32_t n_lines;
    struct rp_trace_line *lines; /* innermost first; in the trace's arena */
};

struct trace_priv {
    struct rp_trace pub; /* first: rp_trace_free() casts back */
    hp_strtab_t *strings;
    struct hp_arena arena;
};

struct rd {
    const struct rp_trace_options *opt;
    struct trace_priv *tp;
    struct rd_seq **seqs;
    size_t n_seqs, cap_seqs;
    struct hp_map seq_index; /* sequence id -> index in seqs */
    struct rd_seq *last_seq;
    struct rd_proc *procs;
    size_t n_procs, cap_procs;
    struct hp_idtab proc_index; /* (pid, exec_index, heap) -> index in procs */
    struct hp_map pids;         /* pid -> struct rd_pid */
    struct rd_syms *syms;
    size_t n_syms, cap_syms;
    struct hp_idtab sym_index; /* (path, build id, address) -> index in syms */
    struct rd_stack *stacks;   /* every resolved callstack, for the source lines */
    size_t n_stacks, cap_stacks;
    uint64_t hash_seed; /* per load: hostile input cannot aim at hash collisions */
    uint64_t kept_bytes, budget_bytes;
    uint64_t *tmp; /* scratch for id lists */
    size_t cap_tmp;
};

/* reader.c: @s interned in the trace's strings (lives as long as the trace); NULL when
 * out of memory. */
const char *rp__intern(struct rd *rd, const char *s, size_t len);
/* Counts @n more bytes kept for the result; -EFBIG past the budget. */
int rp__keep(struct rd *rd, uint64_t n) HP_WARN_UNUSED;

/* interned.c: reads varint field @id_num and length-delimited field @bytes_num (cut to
 * @max bytes; borrowed from @buf) of the message at @buf, the last of each; 0 and NULL
 * when absent. Returns 0 or -EBADMSG. */
int rp__parse_id_bytes(const uint8_t *buf, size_t len, uint32_t id_num, uint32_t bytes_num,
                       size_t max, uint64_t *ret_id, const uint8_t **ret_bytes, size_t *ret_len);
/* A varint field and where it is stored: RD_U64(type, member) gives the offset of a
 * uint64_t member (one of any other type does not compile). */
struct rd_varint {
    uint32_t num;
    uint32_t offset;
};
#define RD_U64(type, member) _Generic(((type *)0)->member, uint64_t : offsetof(type, member))
/* Stores each varint field of the message at @buf that @fields[0..@n) lists (the last
 * occurrence wins) in its member of @dst; skips all other fields. Returns 0 or
 * -EBADMSG. */
int rp__parse_varints(const uint8_t *buf, size_t len, const struct rd_varint *fields, size_t n,
                      void *dst);
/* The tables of @seq, empty; rp__seq_tables_done() also frees its arena. */
void rp__seq_tables_init(struct rd_seq *seq);
void rp__seq_tables_done(struct rd_seq *seq);
/* Each parses one interned entry (message at @buf) into the tables of @seq. */
int rp__parse_string(struct rd_seq *seq, struct hp_map *table, const uint8_t *buf, size_t len);
int rp__parse_mapping(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len);
int rp__parse_callstack(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len);
int rp__parse_frame(struct rd_seq *seq, const uint8_t *buf, size_t len);
/* Parses TracePacket.interned_data (message at @buf) into the tables of @seq. */
int rp__parse_interned(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len);

/* dumps.c: drops the dump in progress on @seq (its chain array stays). */
void rp__chain_drop(struct rd_seq *seq);
/* The entry of (@pid, @exec_index, @heap_name), added when new; NULL when out of
 * memory. */
struct rd_proc *rp__proc_get(struct rd *rd, int32_t pid, uint32_t exec_index,
                             const char *heap_name);
/* Parses TracePacket.profile_packet (message at @buf) of sequence @seq; a complete dump
 * replaces the selected one of each process it holds. */
int rp__parse_profile_packet(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len);

/* resolve.c: the frames of callstack @cs_id of @seq, resolved on first use and shared
 * (an unknown callstack has no frames). */
int rp__resolve_stack(struct rd *rd, struct rd_seq *seq, uint64_t cs_id,
                      const struct rd_stack **ret) HP_WARN_UNUSED;
/* Forgets the resolved callstacks of @seq (its tables are being cleared). */
void rp__seq_resolved_done(struct rd_seq *seq);
/* Parses TracePacket.module_symbols (message at @buf). */
int rp__parse_module_symbols(struct rd *rd, const uint8_t *buf, size_t len) HP_WARN_UNUSED;
/* Attaches the source lines read to every resolved frame. */
int rp__attach_lines(struct rd *rd) HP_WARN_UNUSED;
/* A hash of @n 64-bit words, seeded per load. */
uint64_t rp__hash(const struct rd *rd, const uint64_t *words, size_t n);

/* ---- the text report (report.c), shared with the comparisons (compare.c) ---------- */

/* A site's bytes allocated and not freed (0 when more were freed). */
uint64_t rp__unreleased(const struct rp_trace_callsite *c);
/* True when processes[@i] of @t is the first selected entry of its process (pid and
 * exec_index): a process with several heaps has an entry per heap, each with the
 * process's statistics. */
bool rp__first_of_process(const struct rp_trace *t, size_t i);
/* True when the heap of @p is named beside its program (the process table): any heap but
 * malloc's, so that a trace of malloc alone reads as before. */
bool rp__heap_named(const struct rp_trace_process *p);
/* @samples scaled by @scale (rp_callsite_count_scale()), rounded. */
uint64_t rp__est_count(uint64_t samples, double scale);
/* One standard deviation of @bytes estimated at sampling interval @interval. */
double rp__sd_bytes(uint64_t bytes, uint64_t interval);
/* A site's frames, a line each, as the report prints them. */
void rp__print_stack(FILE *out, const struct rp_trace_callsite *c,
                     const struct rp_report_options *opt);
/* The table of processes: pid, samples, allocated, unreleased, program. */
void rp__print_process_table(FILE *out, const struct rp_trace *t);

/* overview.c: the header line of totals over the selected processes of @t. */
void rp__print_header(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt);
/* The top functions of the selected processes of @t by unreleased (and allocated)
 * bytes, flat and cumulative. */
void rp__print_functions(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt);

/* "Process PID: name" and, for an exec'd program, which one. */
void rp__print_process_header(FILE *out, const struct rp_trace_process *p);

/* ---- the HTML page (html.c) -------------------------------------------------------- */

/* Writes @s[0..@len) as a JSON string safe inside an HTML <script> element: '<', '>'
 * and '&' escaped, invalid UTF-8 replaced by U+FFFD. */
void rp__html_json_str(FILE *o, const char *s, size_t len);

#endif
