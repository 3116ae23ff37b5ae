/* bookkeeping/intern.h: the interning tables of a session (one Perfetto packet sequence).
 *
 * Ids are small integers assigned in order of first use and stable for the session, one
 * id space per table as in Perfetto's InternedData:
 *
 *     function_names, mapping_paths, build_ids   id 0 = "" (pre-defined), then 1, 2, ...
 *     mappings    by content (path, build id, start, end, offsets, load bias), from 1
 *     frames      by (mapping id, rel_pc, function name), from 1
 *     callstacks  nodes of a trie keyed by (parent callstack, frame), from 1
 *
 * A callstack is the path from the trie's root (outermost frame) to a node:
 *
 *     (root) --main--> [1] --run--> [2] --malloc_wrapper--> [3]
 *                        \--init--> [4]
 *
 * so [3] is main > run > malloc_wrapper, and interning a stack costs one lookup per
 * frame while shared prefixes are stored once. Only nodes that are the full stack of
 * some allocation are written to the trace, with their frames root first: each is
 * encoded once, when first used as a full stack, into the `emit` buffer (see struct
 * bk_emit), which the next dump copies out.
 *
 * A frame's name is part of its key because error frames ("ERROR <reason>") on the
 * unknown mapping differ only by name. A NULL hp_frame.map is the unknown mapping: one
 * interned empty mapping (no path, no build id, zero range).
 *
 *     struct bk_intern in;
 *     bk__intern_init(&in);
 *     uint32_t cs;
 *     if (bk__intern_stack(&in, frames, n, &cs) == 0) ...   // frames leaf first
 *     bk__intern_done(&in);
 *
 * Bookkeeping thread only.
 */
#ifndef HP_BOOKKEEPING_INTERN_H
#define HP_BOOKKEEPING_INTERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/containers.h"
#include "common/frame.h"
#include "common/macros.h"

/* Longer strings are truncated; deeper stacks keep their leaf-most frames. */
#define BK_MAX_STRING_BYTES 4096
#define BK_MAX_FRAMES 1024
/* A callstack's depth at most: its frames and up to two leaf frames that name heaps
 * (bk__intern_leaf()). */
#define BK_MAX_DEPTH (BK_MAX_FRAMES + 2)
#define BK_MAX_PATH_COMPONENTS 256

enum bk_str_kind {
    BK_STR_FUNCTION = 0,
    BK_STR_PATH = 1, /* one component of a mapping path */
    BK_STR_BUILD_ID = 2,
    BK_STR_KINDS
};

struct bk_str {
    const char *s; /* NUL-terminated copy (build ids may contain NULs: use len) */
    uint32_t len;
};

struct bk_strtab {
    struct hp_idtab index;
    struct bk_str *v; /* by id */
    size_t n, cap;
};

struct bk_mapping {
    uint64_t start, end, exact_offset, start_offset, load_bias;
    uint32_t build_id;     /* BK_STR_BUILD_ID id */
    uint32_t n_comps;      /* path components ... */
    const uint32_t *comps; /* ... as BK_STR_PATH ids, in the arena */
    const char *path;      /* the full path, for the content key */
    uint32_t path_len;
};

struct bk_frame {
    uint64_t rel_pc;
    uint32_t mapping_id;
    uint32_t function_name_id;
    /* The mapping object it was first interned from, for source lines. */
    const struct hp_mapping *src_map;
};

struct bk_cs_node {
    uint32_t parent; /* 0: the root */
    uint32_t frame_id;
    uint32_t depth;  /* frames from the root, >= 1 */
    bool queued;     /* already in the emit buffer (or written) */
    bool symbolized; /* its frames were offered for source lines (bookkeeping/symbols.c) */
};

/* Callstacks not yet written to the trace, already encoded: each entry is one
 * InternedData.callstacks field (tag, length, {iid, frame_ids root first}), as a dump
 * writes it, in order of first use. Encoding a callstack when it is interned, where its
 * frame ids are at hand, turns that part of a dump into a copy. The offset of every
 * BK_EMIT_MARK_EVERY-th entry is kept, so that a dump cuts the run into packets
 * without walking every entry. Entries already written are dropped by
 * bk__intern_emit_written(). */
#define BK_EMIT_MARK_EVERY 64
struct bk_emit {
    uint8_t *p;
    size_t len, cap;
    size_t n;        /* entries */
    uint64_t *marks; /* marks[k]: offset of entry k * BK_EMIT_MARK_EVERY */
    size_t n_marks, cap_marks;
};

/* Recently seen hp_mapping objects: the unwinder hands out the same immutable objects
 * again and again, so a hit (validated against the stored content, never trusted by
 * pointer alone) skips hashing the path and build id. */
#define BK_MAPPING_CACHE_SLOTS 64
struct bk_mapping_cache {
    const struct hp_mapping *ptr;
    uint32_t id;
};

/* Whole stacks seen recently: a hit skips the per-frame interning and the trie walk.
 * Each entry keeps a copy of the input frames it was interned from (leaf first), and a
 * hit is confirmed by comparing the input with that copy byte for byte (memcmp of one
 * contiguous array): exact, never by hash alone, and without chasing frame or node
 * ids. Comparing pointers is sound because mappings and function names are immutable and
 * live for the whole session (common/frame.h); a frame met again through other pointers
 * merely misses. Sets of BK_STACK_CACHE_WAYS entries, least recently used out. Memory is
 * bounded by the slots: at most BK_STACK_CACHE_SLOTS copies of at most
 * BK_STACK_CACHE_FRAMES frames (24 bytes each). */
#define BK_STACK_CACHE_SLOTS 16384 /* a power of two */
/* 8 ways: with 4, as many hot stacks as sets (4096) overflow some sets, whose stacks then
 * miss on every use (bench: apply +5-15% with 8; 16 gain nothing more). */
#define BK_STACK_CACHE_WAYS 8    /* a power of two */
#define BK_STACK_CACHE_FRAMES 64 /* deeper stacks are not cached */
/* 16 bytes, so a set of 8 ways is two cache lines (the table is aligned to 64). */
struct bk_stack_cache_slot {
    uint32_t tag;                     /* high half of the hash */
    uint32_t id;                      /* callstack id; 0: empty */
    struct bk_stack_cache_copy *copy; /* owned */
};
struct bk_stack_cache_copy {
    uint64_t n;               /* frames */
    struct hp_frame frames[]; /* the input, leaf first */
};

struct bk_intern {
    struct bk_stack_cache_slot *stack_cache; /* allocated on first use; NULL if that failed */
    bool stack_cache_failed;
    struct hp_arena arena;
    struct bk_mapping_cache mapping_cache[BK_MAPPING_CACHE_SLOTS];
    struct bk_strtab str[BK_STR_KINDS];
    struct hp_idtab mapping_index, frame_index, cs_index;
    struct bk_mapping *mappings; /* by id; [0] unused */
    size_t n_mappings, cap_mappings;
    struct bk_frame *frames; /* by id; [0] unused */
    size_t n_frames, cap_frames;
    struct bk_cs_node *nodes; /* by id; [0] unused */
    size_t n_nodes, cap_nodes;
    struct bk_emit emit;
    int64_t unknown_mapping; /* id of the empty mapping, -1 until needed */
    /* Keys every hash of the tables and the stack cache: the content comes from clients
     * (pcs, paths, symbol names), who must not be able to aim at one slot. */
    uint64_t seed;
};

int bk__intern_init(struct bk_intern *in) HP_WARN_UNUSED;
void bk__intern_done(struct bk_intern *in);

int bk__intern_string(struct bk_intern *in, enum bk_str_kind kind, const char *s, size_t len,
                      uint32_t *ret_id) HP_WARN_UNUSED;
/* @m NULL: the unknown mapping. */
int bk__intern_mapping(struct bk_intern *in, const struct hp_mapping *m,
                       uint32_t *ret_id) HP_WARN_UNUSED;
int bk__intern_frame(struct bk_intern *in, const struct hp_frame *f,
                     uint32_t *ret_id) HP_WARN_UNUSED;
int bk__intern_node(struct bk_intern *in, uint32_t parent, uint32_t frame_id,
                    uint32_t *ret_id) HP_WARN_UNUSED;
/* Interns a whole stack given leaf first (n == 0 becomes one unknown frame) and queues
 * its callstack for emission when new. */
int bk__intern_stack(struct bk_intern *in, const struct hp_frame *frames, size_t n,
                     uint32_t *ret_id) HP_WARN_UNUSED;
/* Interns callstack @cs with @leaf below its leaf and queues it for emission when new.
 * pre: @cs is at most BK_MAX_DEPTH - 1 deep. */
int bk__intern_leaf(struct bk_intern *in, uint32_t cs, const struct hp_frame *leaf,
                    uint32_t *ret_id) HP_WARN_UNUSED;

/* Size of the emit buffer entry at @p (tag, length and body). pre: a whole entry. */
static inline size_t bk__emit_entry_size(const uint8_t *p)
{
    size_t len = 0, i = 1;
    unsigned shift = 0;
    uint8_t b;
    do {
        b = p[i++];
        len |= (size_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    return i + len;
}
/* Every entry of the emit buffer up to entry @n (at byte offset @off) was written:
 * when that is all of them, the buffer is emptied. */
void bk__intern_emit_written(struct bk_intern *in, size_t n, size_t off);

/* Queues every callstack ever queued for emission again (the interned data restarts on a
 * new packet sequence state). Returns 0 or -ENOMEM. */
int bk__intern_emit_all(struct bk_intern *in) HP_WARN_UNUSED;

/* Appends callstack @cs to @em (not the session's emit buffer: e.g. one of a snapshot,
 * bookkeeping/snapshot.c), as the interning queues it. Returns 0 or -ENOMEM. */
int bk__intern_emit_into(const struct bk_intern *in, struct bk_emit *em,
                         uint32_t cs) HP_WARN_UNUSED;

/* Writes the frame ids of callstack @cs root first into @buf (BK_MAX_DEPTH entries);
 * returns their number. */
size_t bk__intern_callstack_frames(const struct bk_intern *in, uint32_t cs, uint32_t *buf);

/* Number of ids in use per table (i.e. the next id to be assigned). */
static inline size_t bk__intern_n_strings(const struct bk_intern *in, enum bk_str_kind k)
{
    return in->str[k].n;
}

#endif
