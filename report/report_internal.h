/* report/report_internal.h: what the files of the trace reader share (internal to
 * report/; the API is report/report.h).
 *
 * The reader keeps, while it reads a trace (struct rd):
 * - per packet sequence (struct rd_seq, trusted_packet_sequence_id): the interning
 *   tables and the dump in progress (ProfilePackets linked by `continued`);
 * - per (pid, heap) (struct rd_proc): the number of complete dumps and the raw samples
 *   of the selected one, resolved to frames and strings when their sequence's tables
 *   are about to be cleared, or at the end.
 *
 *     reader.c    the file, its packets, the sequences and the result
 *     interned.c  interned data: strings, mappings, frames, callstacks
 *     dumps.c     ProfilePackets: per-process dumps, complete ones selected
 *     resolve.c   raw samples of a selected dump -> struct rp_trace_callsite
 *
 *     struct rd_seq *seq = ...;                    // reader.c: one per sequence
 *     r = rp__parse_interned(rd, seq, buf, len);   // TracePacket.interned_data
 *     r = rp__resolve_seq(rd, seq);                // before its tables change
 *
 * Not thread-safe; one struct rd per load.
 */
#ifndef HP_REPORT_REPORT_INTERNAL_H
#define HP_REPORT_REPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/containers.h"
#include "common/strtab.h"
#include "protos/fields.h"
#include "report/report.h"

#define READ_MAX_PACKET_BYTES (64u * 1024 * 1024)
#define READ_MAX_STRING_BYTES 4096
#define READ_MAX_COMPONENTS 256
#define READ_MAX_FRAMES 4096

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
    uint64_t self_allocated, self_freed, alloc_count, free_count, self_max, self_max_count;
};

struct rd_header {
    uint64_t timestamp, sampling_interval_bytes;
    bool from_startup, disconnected, buffer_overran, buffer_corrupted, hit_guardrail, client_error;
    uint64_t unwinding_errors, heap_samples, map_reparses, total_unwinding_time_us,
        client_spinlock_blocked_us, frees_lost;
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
    struct hp_arena arena;
    struct hp_map strs[STR_KINDS]; /* iid -> struct rd_str */
    struct hp_map mappings;        /* iid -> struct rd_mapping */
    struct hp_map frames;          /* iid -> struct rd_frame */
    struct hp_map callstacks;      /* iid -> struct rd_callstack */
    struct hp_map path_cache;      /* mapping iid -> struct rd_mapping_info */
    bool have_index;
    uint64_t next_index;
    struct rd_pdump *chain; /* the dump in progress */
    size_t n_chain, cap_chain;
};

struct rd_proc {
    int32_t pid;
    const char *heap_name;
    uint32_t n_dumps;
    bool selected;
    struct rd_header hdr;
    struct rd_seq *seq; /* whose tables the raw samples refer to */
    struct rd_sample *raw;
    size_t n_raw;
    bool resolved;
    struct rp_trace_callsite *callsites; /* in the trace's arena */
    size_t n_callsites;
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
    struct rd_proc *procs;
    size_t n_procs, cap_procs;
    struct hp_map cmdlines; /* pid -> const char * (strtab) */
    uint64_t *tmp;          /* scratch for id lists */
    size_t cap_tmp;
};

/* reader.c: @s interned in the trace's strings (lives as long as the trace); NULL when
 * out of memory. */
const char *rp__intern(struct rd *rd, const char *s, size_t len);

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

/* dumps.c: drops the dump in progress on @seq. */
void rp__chain_drop(struct rd_seq *seq);
/* The entry of (@pid, @heap_name), added when new; NULL when out of memory. */
struct rd_proc *rp__proc_get(struct rd *rd, int32_t pid, const char *heap_name);
/* Parses TracePacket.profile_packet (message at @buf) of sequence @seq; a complete dump
 * replaces the selected one of each process it holds. */
int rp__parse_profile_packet(struct rd *rd, struct rd_seq *seq, const uint8_t *buf, size_t len);

/* resolve.c: resolves the selected dump of @p with its sequence's tables (once). */
int rp__resolve(struct rd *rd, struct rd_proc *p);
/* The tables of @seq are about to change meaning: resolves what refers to them. */
int rp__resolve_seq(struct rd *rd, struct rd_seq *seq);

#endif
