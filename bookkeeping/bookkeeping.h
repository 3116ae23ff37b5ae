/* bookkeeping/bookkeeping.h: all profile state of a session, and the dumps that turn it
 * into Perfetto TracePackets.
 *
 * Interns mappings, frames and callstacks (a callstack is a path in a trie of frames,
 * root first), tracks live sampled allocations per (process, heap, address), keeps
 * per-(heap, callstack) cumulative allocated/freed bytes and counts, and on dump streams
 * TracePackets (Trace.packet, field 1, length-delimited) to the output fd, each packet
 * written as soon as it is encoded.
 *
 * Records of a process are applied in sequence-number order: out-of-order records wait
 * in a bounded reorder window; a gap older than the window is skipped and counted.
 *
 *     bk_t *bk;
 *     bk_new(&(struct bk_config){.out_fd = fd, .sequence_id = 1}, &bk);
 *     bk_process_start(bk, pid, "app\0arg\0", 8, true, 4096);
 *     bk_record_alloc(bk, pid, 0, seq, addr, size, size, frames, n);   // leaf first
 *     bk_record_free(bk, pid, 0, seq + 1, addr);
 *     bk_process_end(bk, pid, &stats, BK_FLAG_DISCONNECTED);   // final dump of pid
 *     bk = bk_free(bk);
 *
 * Bookkeeping thread only (not thread-safe; one owner).
 */
#ifndef HP_BOOKKEEPING_BOOKKEEPING_H
#define HP_BOOKKEEPING_BOOKKEEPING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/frame.h"
#include "common/macros.h"

typedef struct bk bk_t;

/* Where TracePackets go instead of a file: a writer of Perfetto's tracing service
 * (traced), which frames the packets and stamps their sequence itself. Packets written
 * to a sink carry no trusted_packet_sequence_id (traced rejects packets that do) and no
 * clock snapshots (traced writes its own); the sequence's first packet sets
 * first_packet_on_sequence. */
struct bk_sink {
    /* Writes one TracePacket of @len bytes given in @n (at most 4) pieces. Returns 0;
     * -ENOBUFS when the packet was dropped (the sink is full): the next packet restarts
     * the sequence's interned data and the dump in progress is abandoned; any other
     * -errno breaks the output for good. */
    int (*write_packet)(void *ctx, const struct iovec *iov, int n, size_t len);
    /* True, once, when the reader asked for the interned data again (traced's
     * ClearIncrementalState); checked before each dump. May be NULL. */
    bool (*take_clear_request)(void *ctx);
    void *ctx;
};

struct bk_config {
    int out_fd;                 /* borrowed; TracePackets are appended with write(2) */
    const struct bk_sink *sink; /* non-NULL: packets go there, not to out_fd (copied) */
    uint32_t sequence_id;       /* trusted_packet_sequence_id, non-zero; 0 means 1 */
    bool dump_at_max;           /* dumps show self_max/self_max_count at the peak */
    /* The session leaves the malloc heap out (its selection of heaps does not name it): a
     * process's heap 0 is not dumped while it holds no samples and another heap does. */
    bool no_malloc_heap;
    /* Source positions of the code at @rel_pc in @m, for Perfetto ModuleSymbols packets
     * (the UI shows them with the frames): innermost first, one per function inlined
     * at the pc, the last one the function the code belongs to (see hp_source_line).
     * Called lazily, once per unique frame, by the dump that first writes the frame.
     * Returns 0 with *ret_lines (*ret_n >= 1 of them, borrowed until the call returns)
     * set, or < 0 when unknown. Without @wait it may return -EAGAIN (the lines are being
     * read): the frame is offered again at the next dump, with @wait at a process's
     * final one. NULL: no source lines. */
    int (*source_lines)(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                        const struct hp_source_line **ret_lines, size_t *ret_n);
    void *source_lines_ctx;
};

/* ProcessHeapSamples flags for a process's dumps. */
#define BK_FLAG_DISCONNECTED (1u << 0)
#define BK_FLAG_BUFFER_OVERRAN (1u << 1)
#define BK_FLAG_BUFFER_CORRUPTED (1u << 2)
#define BK_FLAG_HIT_GUARDRAIL (1u << 3)
#define BK_FLAG_CLIENT_ERROR (1u << 4)
/* A writer held a record unpublished for the stall timeout: stopped (waited for), gone
 * (its record skipped) or running (the client was cut off); not corruption. */
#define BK_FLAG_WRITER_STALLED (1u << 5)
/* The program closed (or reused) the profiler's connection while it kept running:
 * profiling of it stopped there. */
#define BK_FLAG_CONN_CLOSED (1u << 6)
/* The profiler lost the process while it ran (corrupt buffer, a writer cut off, the
 * connection closed by the program, changed credentials): profiling stopped before the
 * process did. BK_FLAG_DISCONNECTED alone is a process that exited or exec'd. */
#define BK_FLAG_CONN_LOST (1u << 7)

/* Per-process statistics reported in ProcessStats (as counted by the unwinder side, as of
 * the dump that carries them). Every record lost on the way is counted here by cause. */
struct bk_process_stats {
    uint64_t unwinding_errors;
    uint64_t heap_samples;
    uint64_t map_reparses;
    uint64_t total_unwinding_time_us;
    uint64_t client_spinlock_blocked_us;
    uint64_t records_dropped; /* by the client: ring full, record too big, watched set full */
    /* Frees of sampled blocks lost anywhere before the bookkeeping (the client's ring
     * full, left unread at the end, the service out of memory): phantom leaks. */
    uint64_t frees_lost;
    uint64_t writer_stalls;           /* times a stopped writer held the next record (waited for) */
    uint64_t stalled_records_skipped; /* records of writers gone mid-record, skipped */
    uint64_t reserve_failures;        /* by the client: records lost to reservation races */
    uint64_t freeset_full;            /* of records_dropped: samples whose free could not be
                                         watched (the client's set was full) */
    uint64_t records_unread;          /* left in the ring when the session ended (time budget) */
    uint64_t records_lost_service;    /* the service could not pass on (out of memory) */
    uint64_t stacks_truncated;        /* samples whose stack copy stopped at max_stack_bytes */
    uint64_t unknown_stacks;          /* samples taken on a stack not the thread's own */
    uint64_t map_reparses_deferred;   /* times samples waited for the rate limit of rereads */
    uint64_t unseen_call_slots;       /* the client's slots left unswitched: calls not seen */
    /* unwinding time histogram, bucket upper bounds in us: BK_UNWIND_HIST_BOUNDS */
    uint64_t unwinding_time_hist[8];
};
#define BK_UNWIND_HIST_BOUNDS                                                                      \
    {                                                                                              \
        1, 2, 5, 10, 50, 100, 1000, UINT64_MAX                                                     \
    }

int bk_new(const struct bk_config *cfg, bk_t **ret) HP_WARN_UNUSED;
/* Frees all state; does not dump and does not close out_fd. Accepts NULL. */
bk_t *bk_free(bk_t *bk);

/* A new process. @cmdline: @cmdline_len bytes of NUL-separated arguments as in
 * /proc/PID/cmdline (copied). Writes its process_tree packet. */
int bk_process_start(bk_t *bk, int32_t pid, const char *cmdline, size_t cmdline_len,
                     bool from_startup, uint64_t sampling_interval_bytes) HP_WARN_UNUSED;

/* The process retitled itself (setproctitle, a forked child naming its role): its
 * @cmdline now (as bk_process_start() takes it). Writes a process_tree packet with it when
 * it differs, so that the process is named by its latest title from here on (readers
 * tell a rename from an exec by the exec's final dump of the old program before it). */
int bk_process_rename(bk_t *bk, int32_t pid, const char *cmdline,
                      size_t cmdline_len) HP_WARN_UNUSED;

/* When the process started, on the clock of the dumps' timestamps (CLOCK_MONOTONIC_COARSE):
 * written in every dump (ProcessStats.process_start_timestamp) so that the report can say
 * how long after its start the profile began. 0: unknown. */
void bk_process_set_start_time(bk_t *bk, int32_t pid, uint64_t start_ts);

/* A sampled allocation in heap @heap_id (wire heap_id; 0 = "libc.malloc", others are
 * written under the name bk_heap_name() gave them, else "heap_<id>"): @frames leaf first
 * (as the unwinder returns them; copied). */
void bk_record_alloc(bk_t *bk, int32_t pid, uint32_t heap_id, uint64_t seq, uint64_t addr,
                     uint64_t size, uint64_t sample_size, const struct hp_frame *frames,
                     size_t n_frames);
/* Names heap @heap_id (> 0) of process @pid @name (NUL-terminated, untrusted: cut to
 * BK_HEAP_NAME_MAX - 1 bytes, bytes that are not printable ASCII or are spaces become
 * '_'), before or after its first record; a later name replaces an earlier one. Returns 0,
 * -ESRCH (no such process), -EINVAL (heap 0 or an empty name), -ENOSPC (too many names)
 * or -ENOMEM. */
int bk_heap_name(bk_t *bk, int32_t pid, uint32_t heap_id, const char *name);
/* A free in heap @heap_id. Unknown addresses are ignored and counted. */
void bk_record_free(bk_t *bk, int32_t pid, uint32_t heap_id, uint64_t seq, uint64_t addr);

/* Frees of the process's sampled blocks were lost (the client could not record them):
 * every allocation it holds live now, after the pending records, may have been freed.
 * They move to the heap PF_HEAP_POSSIBLY_FREED (protos/fields.h), counted as freed where
 * they were, so no report ranks them as unreleased; a free of one seen later (delivered
 * late, or the address allocated again) takes it out of there. */
void bk_mark_possibly_freed(bk_t *bk, int32_t pid);
/* Replaces the process's stats and ORs @flags into its ProcessHeapSamples flags. */
void bk_process_update(bk_t *bk, int32_t pid, const struct bk_process_stats *stats, uint32_t flags);

/* Dumps one process (all pending records applied first). */
int bk_dump_process(bk_t *bk, int32_t pid) HP_WARN_UNUSED;
/* Dumps every process. */
int bk_dump_all(bk_t *bk) HP_WARN_UNUSED;
/* The process is gone: applies pending records, updates stats/flags, writes its final
 * dump, and forgets it. */
int bk_process_end(bk_t *bk, int32_t pid, const struct bk_process_stats *stats,
                   uint32_t flags) HP_WARN_UNUSED;

/* Writes that process @pid was not profiled: because another session profiles it (a
 * ProcessHeapSamples with rejected_concurrent, as Perfetto's heapprofd writes), or, with
 * @flags BK_FLAG_HIT_GUARDRAIL, because profiling it would have taken the service past
 * its memory guardrail (hit_guardrail, no samples). */
int bk_process_rejected(bk_t *bk, int32_t pid, uint32_t flags) HP_WARN_UNUSED;

/* Writes to @fd (borrowed) a trace of its own holding process @pid's profile as it
 * stands: the first packet, its process tree and one dump of each of its heaps, with the
 * interned data they use (every string, mapping and frame of the session, the callstacks
 * of the process), framed as a trace file is, without source lines. The session's own
 * output sees nothing of it: the next dump continues the session's trace as if the
 * snapshot had not been taken (bookkeeping/snapshot.c). Pending records of @pid are
 * applied first. Returns 0, -ESRCH when @pid is not profiled, -ENOMEM or the -errno of
 * a write. */
int bk_snapshot_process(bk_t *bk, int32_t pid, int fd) HP_WARN_UNUSED;

/* What a list of the profiled processes shows of one. */
struct bk_proc_summary {
    int32_t pid;
    const char *cmdline; /* NUL-separated arguments; borrowed until bk changes */
    size_t cmdline_len;
    uint64_t samples;         /* sampled allocations, every heap */
    uint64_t allocated_bytes; /* sampled bytes allocated, every heap */
    uint64_t live_bytes;      /* sampled bytes not freed, every heap */
};
/* Number of processes profiled now. */
size_t bk_n_processes(const bk_t *bk);
/* Process @i (< bk_n_processes()) as it stands, its pending records applied first. */
void bk_process_summary(bk_t *bk, size_t i, struct bk_proc_summary *ret);

/* Counters for summaries and tests. */
struct bk_counters {
    uint64_t records_applied;
    uint64_t unknown_frees;
    uint64_t replaced_allocs;
    uint64_t seq_gaps;
    /* beyond the cap of heaps per process, out of memory, or refused by a table's probe
     * bound (hp_map_put(), hp_idtab_add(): -ENOSPC) */
    uint64_t dropped_records;
    /* records of a process the bookkeeping does not know (its start failed) */
    uint64_t records_no_process;
    uint64_t dumps;
    uint64_t packets_written;
    uint64_t source_lines; /* frames given source lines in ModuleSymbols */
    uint64_t bytes_written;
    uint64_t live_bytes;      /* sampled bytes live now, in every heap of every process */
    uint64_t packets_dropped; /* the sink was full (sink only) */
    uint64_t sequence_resets; /* interned data written again (sink only) */
    int last_write_error;     /* 0 or -errno of the last failed write */
};
/* Applies the records in order that wait to be (see bk_proc.ready in state.h) first. */
void bk_get_counters(bk_t *bk, struct bk_counters *ret);

/* The bytes the tables would take on (new hash slots held beside the old ones while they
 * are filled, grown arrays) if the next records brought @more new entries to each
 * interned table and to the tables of one process, and the other processes' tables each
 * their next doubling: what those records may cost, near enough, for a memory budget
 * checked now and then (tables grow by doubling, a big one by a big step).
 * Bookkeeping thread only. */
size_t bk_grow_ahead(const bk_t *bk, size_t more);

#endif
