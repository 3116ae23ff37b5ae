/* bookkeeping/state.h: the state behind bk_t, shared by bookkeeping/bookkeeping.c (record
 * application) and bookkeeping/dump.c (TracePacket encoding). Internal to bookkeeping/.
 *
 * Per process, and in it per heap (live allocations and sites):
 *
 *     records --> reorder heap (by seq) --> apply --> live: addr -> (site, size, seq)
 *                                                      sites: callstack -> counters
 *
 * A site holds cumulative allocated/freed bytes and counts of one callstack in one
 * heap of a process (its live bytes/count are the differences), and, with dump_at_max,
 * its live bytes/count at the heap's peak. The peak values are kept lazily: `peak_id`
 * counts new peaks; a site saves its live values into its entry of `maxes` (stamped
 * with the current peak id) just before its first change after a peak, so a site whose
 * stamp differs from the peak id has not changed since the peak and its live values
 * are the peak values. O(1) per record. Stamps hold the low 32 bits of the peak id;
 * peak ids skip those whose low bits are 0 (0 means "never stamped"), and every stamp is
 * cleared when the low bits wrap, so an old stamp never passes for a new one.
 *
 *     struct bk_proc *p = bk__find_proc(bk, pid);
 *     bk__flush_pending(bk, p);      // apply what waits (reorder heap, ready queue)
 *     int r = bk__dump_proc(bk, p, false);  // then write its dump
 *
 * Bookkeeping thread only.
 */
#ifndef HP_BOOKKEEPING_STATE_H
#define HP_BOOKKEEPING_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/intern.h"
#include "common/containers.h"
#include "common/pbwire.h"

/* Records pending beyond this many force the oldest one through (a seq gap). */
#define BK_REORDER_WINDOW 1024
/* Records in order applied this many records later (a power of two). */
#define BK_READY 8
/* Sizes whose allocation weight a process keeps at hand (a power of two). */
#define BK_WEIGHT_CACHE 256
/* Dumps are split so that no TracePacket exceeds this many bytes. */
#define BK_MAX_PACKET_BYTES (400 * 1000)
#define BK_HEAP_NAME "libc.malloc"
/* Longest heap name, with its NUL (the client's WIRE_HEAP_NAME_MAX). */
#define BK_HEAP_NAME_MAX 64

/* The name a process gave one of its heaps (bk_heap_name()). */
struct bk_heap_label {
    uint32_t heap_id;
    char name[BK_HEAP_NAME_MAX];
};

/* The heap of allocations whose free may have been lost (bk_mark_possibly_freed()),
 * written as PF_HEAP_POSSIBLY_FREED; records of clients never name it. */
#define BK_HEAP_POSSIBLY_FREED UINT32_MAX

enum bk_rec_kind { BK_REC_ALLOC = 1, BK_REC_FREE = 2 };

struct bk_pending {
    uint64_t seq;
    uint64_t addr;
    uint64_t size; /* sample_size of an allocation */
    uint32_t callstack;
    uint32_t heap_id;
    uint32_t kind;
    uint32_t weight; /* allocations this one stands for, in BK_WEIGHT_ONE units */
};

/* Estimated allocation counts are kept in fixed point: 1 is BK_WEIGHT_ONE. */
#define BK_WEIGHT_ONE 256u

/* A live allocation: 16 bytes of value per map slot. Sizes of 4 GiB and more are rare;
 * they keep BK_LIVE_BIG_SIZE here and the real size in the heap's big_sizes map. */
struct bk_live {
    uint64_t seq;
    uint32_t site;
    uint32_t size;
};
#define BK_LIVE_BIG_SIZE UINT32_MAX

/* 48 bytes: a dump streams through all sites of a heap, and the apply path touches one
 * per record. The live bytes and count are allocated - freed and alloc_count -
 * free_count (a late record adds to both sides). est_allocs is the number of
 * allocations the sampled ones stand for (sum of 1 / P(sampled) from each one's real
 * size), in BK_WEIGHT_ONE units: it is written as HeapSample.est_alloc_count. */
struct bk_site {
    uint64_t allocated, freed, alloc_count, free_count;
    uint32_t callstack_id;
    uint32_t max_stamp; /* the peak scheme above; 0: never stamped */
    uint64_t est_allocs;
};
_Static_assert(sizeof(struct bk_site) == 48, "bk_site stays small");

/* HeapSample.est_alloc_count of @s: its estimate rounded to whole allocations. */
static inline uint64_t bk__site_est_allocs(const struct bk_site *s)
{
    return (s->est_allocs + BK_WEIGHT_ONE / 2) / BK_WEIGHT_ONE;
}

/* A site's live bytes and count at the last peak, when its stamp is the peak's. */
struct bk_site_max {
    uint64_t bytes, count;
};

static inline uint64_t bk__site_live_bytes(const struct bk_site *s)
{
    return s->allocated - s->freed;
}

static inline uint64_t bk__site_live_count(const struct bk_site *s)
{
    return s->alloc_count - s->free_count;
}

/* One heap of one process: its live allocations, sites and peak. */
struct bk_heap {
    uint64_t last_dump_ts; /* MONOTONIC_COARSE of the last dump; dumps stay increasing */
    uint32_t heap_id;
    struct hp_map live;      /* addr -> struct bk_live */
    struct hp_map big_sizes; /* addr -> uint64_t, for live sizes >= BK_LIVE_BIG_SIZE */
    /* Callstack id -> index of its site + 1 (0: none), in pages of BK_SITE_PAGE
     * entries allocated as ids are used: callstack ids are small and dense, so a lookup
     * is two loads instead of a hash probe. */
    uint32_t **site_pages;
    size_t n_site_pages;
    struct bk_site *sites;
    struct bk_site_max *maxes; /* beside sites (cap_sites entries), only if track_peak */
    size_t n_sites, cap_sites;
    bool track_peak;           /* dump_at_max */
    size_t n_sites_symbolized; /* sites whose frames were offered to source_lines */
    uint64_t live_total, peak_total, peak_id;
};

struct bk_proc {
    int32_t pid;
    bool from_startup;
    uint64_t start_ts;         /* CLOCK_MONOTONIC_COARSE at bk_process_start(): the profile began */
    uint64_t process_start_ts; /* the same clock: the process started (0: unknown) */
    uint64_t sampling_interval_bytes;
    double log_keep; /* log(1 - 1 / interval): P(a byte is not picked), for the weights */
    /* The weights of recent sizes below the interval (alloc_weight(): an expm1() per
     * sample was 3% of the service's time under churn), direct-mapped by size; size 0:
     * empty. */
    struct {
        uint32_t size, weight;
    } weights[BK_WEIGHT_CACHE];
    char *cmdline;
    size_t cmdline_len;
    struct bk_process_stats stats;
    uint32_t flags;
    /* What the bookkeeping could not use of the process's records, for its dumps'
     * ProcessStats (also in bk_counters for the whole session): frees of addresses not
     * live, sequence gaps skipped, records refused (heaps past the cap, a table's probe
     * bound, out of memory). */
    uint64_t unknown_frees, seq_gaps, refused;

    uint64_t next_seq;
    struct bk_pending *heap; /* min-heap by seq */
    size_t n_heap, cap_heap;
    /* Records in order wait here for BK_READY more before they are applied: the live
     * table is large and hit at random, and the slot of each one is prefetched as it
     * comes in. */
    struct bk_pending ready[BK_READY];
    uint32_t ready_head, n_ready;

    /* The BK_HEAP_POSSIBLY_FREED heap, once made (also in heaps), or NULL. */
    struct bk_heap *pf_heap;
    /* Heaps in order of first use; heaps[0] exists from the start (heap id 0). */
    struct bk_heap **heaps;
    size_t n_heaps, cap_heaps;
    /* Names of heaps other than 0, as the process registered them (any order; at most
     * BK_MAX_HEAPS). */
    struct bk_heap_label *labels;
    size_t n_labels, cap_labels;
};

struct bk_buf {
    uint8_t *p;
    size_t len, cap;
};

struct bk {
    int out_fd;
    uint32_t sequence_id;
    /* With a sink: the packet format of a traced writer (struct bk_sink). */
    bool has_sink;
    struct bk_sink sink;
    bool sequence_started; /* the sink got its first packet */
    bool needs_reset;      /* write the interned data again before the next use of it */
    bool in_reset;
    bool dump_at_max;
    bool no_malloc_heap; /* bk_config.no_malloc_heap */

    struct bk_intern in;
    struct bk_counters counters;

    struct bk_proc **procs;
    size_t n_procs, cap_procs;
    struct hp_map proc_index;  /* pid -> index in procs */
    struct bk_proc *last_proc; /* bk__find_proc's last answer, or NULL */

    /* What the trace already defines: entries below these are not written again. */
    size_t emitted_str[BK_STR_KINDS];
    size_t emitted_mappings, emitted_frames;
    size_t emitted_callstacks, emitted_callstacks_off; /* entry and byte in in.emit */
    /* Per frame id: 1 once offered to source_lines (bookkeeping/symbols.c). */
    uint8_t *frame_offered;
    size_t cap_frame_offered;
    int (*source_lines)(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                        const struct hp_source_line **ret_lines, size_t *ret_n);
    /* Frame ids offered whose lines were not ready (-EAGAIN): offered again next dump. */
    uint32_t *frames_later;
    size_t n_frames_later, cap_frames_later;
    void *source_lines_ctx;
    uint64_t next_packet_index; /* ProfilePacket.index */
    /* A packet was dropped since the sequence last restarted: the restart keeps counting
     * (Perfetto's reader sees a first index that is not 0 and counts a missing packet);
     * a restart without a loss (traced asked to clear the incremental state) counts from
     * 0 again, as that reader expects of every new generation of the sequence. */
    bool index_gap;

    size_t max_packet_bytes;
    bool out_broken; /* a write failed: later packets are not written */
    struct bk_buf buf;
};

/* Live bytes and count of site @i of @h at the heap's peak. pre: h->track_peak. */
static inline void bk__site_at_peak(const struct bk_heap *h, size_t i, uint64_t *ret_bytes,
                                    uint64_t *ret_count)
{
    const struct bk_site *s = &h->sites[i];
    if (h->peak_id == 0) {
        *ret_bytes = *ret_count = 0;
    } else if (s->max_stamp == (uint32_t)h->peak_id) {
        *ret_bytes = h->maxes[i].bytes;
        *ret_count = h->maxes[i].count;
    } else {
        *ret_bytes = bk__site_live_bytes(s);
        *ret_count = bk__site_live_count(s);
    }
}

#define BK_SITE_PAGE 512

/* The index of the site of callstack @cs in @h, or -1. */
static inline int64_t bk__site_find(const struct bk_heap *h, uint32_t cs)
{
    size_t page = cs / BK_SITE_PAGE;
    if (page >= h->n_site_pages || !h->site_pages[page])
        return -1;
    return (int64_t)h->site_pages[page][cs % BK_SITE_PAGE] - 1;
}

/* bookkeeping/bookkeeping.c */
struct bk_proc *bk__find_proc(bk_t *bk, int32_t pid);
/* The heap @heap_id of @p, or NULL when it has none. */
struct bk_heap *bk__find_heap(const struct bk_proc *p, uint32_t heap_id);
/* The name heap @heap_id of @p is written under: 0 is "libc.malloc", others are as the
 * process named them (bk_heap_name()), else "heap_<id>". Writes at most @len bytes. */
void bk__heap_name(const struct bk_proc *p, uint32_t heap_id, char *buf, size_t len);
/* Applies every pending record of @p in seq order. */
void bk__flush_pending(bk_t *bk, struct bk_proc *p);
/* Applies the records in order that wait in @p's ready queue (not the reorder heap). */
void bk__flush_ready(bk_t *bk, struct bk_proc *p);

/* bookkeeping/dump.c */
struct iovec;

/* Room for the Trace framing (tag and length) in front of an encoded packet. */
#define BK_FRAME_HEADROOM (1 + HP_PB_VARINT_MAX)

/* bookkeeping/output.c: writes the Trace.packet framing and the @n parts of @iov (@len
 * bytes in all) as one packet; on a write error the output is marked broken. */
int bk__write_framed(bk_t *bk, struct iovec *iov, int n, size_t len) HP_WARN_UNUSED;
/* Writes @body, a complete encoded TracePacket, as one packet. */
int bk__write_raw_packet(bk_t *bk, const uint8_t *body, size_t len) HP_WARN_UNUSED;
/* bookkeeping/symbols.c: ModuleSymbols for the frames @p's dump just used. */
int bk__write_source_lines(bk_t *bk, struct bk_proc *p, bool final) HP_WARN_UNUSED;
/* The first packet: clock snapshot, SEQ_INCREMENTAL_STATE_CLEARED, iid 0 = "". With a
 * sink it also restarts the interned data (every entry is written again by the next
 * dump) and is written whenever needs_reset is set. */
int bk__write_start(bk_t *bk) HP_WARN_UNUSED;
int bk__write_clock_snapshot(bk_t *bk) HP_WARN_UNUSED;
int bk__write_process_tree(bk_t *bk, const struct bk_proc *p) HP_WARN_UNUSED;
/* Writes one dump of @p, one ProfilePacket chain per heap (pending records must have
 * been flushed), then the source lines of its new frames; @final: @p's last dump, which
 * waits for every source line still being read. */
int bk__dump_proc(bk_t *bk, struct bk_proc *p, bool final) HP_WARN_UNUSED;
/* Writes the dump of one heap of @p (its ProfilePackets, no source lines). */
int bk__dump_heap(bk_t *bk, struct bk_proc *p, struct bk_heap *heap) HP_WARN_UNUSED;

/* For tests: split dumps into packets of at most @n bytes (items permitting). */
void bk__set_max_packet_bytes(bk_t *bk, size_t n);

#endif
