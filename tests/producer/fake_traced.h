/* tests/producer/fake_traced.h: a fake of Perfetto's tracing service (traced), producer
 * side only, for heapprof's tests. Written from Perfetto's protocol as documented
 * (frames, ProducerPort, the shared memory ABI, traced's validation), independently of
 * producer/ so that a misreading on one side is not mirrored on the other.
 *
 * It is strict where traced is: the method table comes by name (ids can be shuffled),
 * frames above 128 KiB drop the connection, calls before InitializeConnection fail, it
 * sends every frame with a 10 ms timeout and drops a producer that does not read, it
 * moves only Complete chunks (CAS to BeingRead, copy, clear, CAS to Free, page word
 * reset), applies patches after moves, acknowledges flushes by request id, and at the
 * end reassembles each writer's packets as TraceBufferV1 does (chunk ids without gaps,
 * fragment continuation flags, sizes of at most 4 varint bytes, the drop sentinel,
 * chunks waiting for patches), validates each packet's top level and reserved fields,
 * stamps trusted_uid, trusted_packet_sequence_id (2, 3, ... per writer), trusted_pid and
 * previous_packet_dropped on each sequence's first packet, and writes the trace file:
 * a clock snapshot, the producer's packets, then trace_stats. Where traced is silent
 * (a commit of a chunk that is not Complete, a writer id outside 1..32767, an
 * acknowledgement of an unknown instance, chunks committed after the stop ack) it also
 * counts a violation, so tests can insist on none.
 *
 *     ft_t *ft;
 *     ft_new(&(struct ft_options){.socket_path = path}, &ft);
 *     ft_wait_producer(ft, 5000);
 *     int s = ft_start_session(ft, &(struct ft_session_config){.heapprofd_config = cfg, ...});
 *     ... ft_flush(ft, s, 5000) ...
 *     ft_stop_session(ft, s);          // flush, stop, wait for the ack, write the trace
 *     ft = ft_free(ft);
 *
 * Thread-safe: the fake serves its socket on a thread of its own.
 */
#ifndef HP_TESTS_PRODUCER_FAKE_TRACED_H
#define HP_TESTS_PRODUCER_FAKE_TRACED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ft ft_t;

struct ft_options {
    const char *socket_path;
    uint32_t smb_size_bytes;   /* 0: 256 KiB */
    uint32_t page_size_bytes;  /* 0: 4 KiB */
    bool shuffle_methods;      /* method ids in reverse declaration order */
    uint32_t flush_timeout_ms; /* 0: 5000 */
    uint32_t stop_timeout_ms;  /* 0: 5000 (also sent as DataSourceConfig.stop_timeout_ms) */
    const char *data_source;   /* 0: "android.heapprofd" */
};

struct ft_session_config {
    const uint8_t *heapprofd_config; /* HeapprofdConfig bytes (copied) */
    size_t heapprofd_config_len;
    const char *output;       /* trace file written at the stop */
    uint32_t stop_timeout_ms; /* 0: the fake's */
};

/* Counters; a correct producer leaves every field below "violations" at 0. */
struct ft_stats {
    uint64_t connections, frames_in, commits, chunks_moved, chunks_read, packets, sequences,
        flushes_acked, flushes_failed, stops_acked, stops_timed_out, trace_writer_packet_loss,
        previous_packet_dropped, instances;
    /* violations */
    uint64_t frame_too_large, calls_before_init, bad_requests, not_complete_commits,
        bad_commit_index, chunks_discarded, bad_writer_ids, abi_violations, invalid_packets,
        reserved_fields, sequence_gaps, unpatched_chunks, patches_discarded, patches_failed,
        reassembly_failures, late_chunks, unknown_stop_acks, send_timeouts;
};

int ft_new(const struct ft_options *o, ft_t **ret);
ft_t *ft_free(ft_t *ft);

/* Waits until a producer has registered the data source; false on timeout. */
bool ft_wait_producer(ft_t *ft, int timeout_ms);
/* A new tracing session with the data source: it gets a buffer, and the producer (now
 * or when it registers) an instance. Returns the session's index (>= 0) or -1. */
int ft_start_session(ft_t *ft, const struct ft_session_config *cfg);
/* Sends Flush to the session's instance; true when acknowledged in time. */
bool ft_flush(ft_t *ft, int session, int timeout_ms);
/* Sends ClearIncrementalState to the session's instance. */
void ft_clear_incremental_state(ft_t *ft, int session);
/* Ends the session as traced does: Flush, StopDataSource, waits for
 * NotifyDataSourceStopped (stop timeout), then reassembles the buffer and writes the
 * trace file. Returns true when the stop was acknowledged in time. */
bool ft_stop_session(ft_t *ft, int session);
/* Pauses (true) or resumes the handling of CommitData: while paused no chunk is freed
 * and no commit answered, as with a traced that cannot keep up. */
void ft_stall_commits(ft_t *ft, bool stall);
/* Closes the producer's connection (its instances end; it may reconnect). */
void ft_drop_producer(ft_t *ft);
/* Sends @n Flush commands without waiting (to fill a producer's socket). */
void ft_flood_flushes(ft_t *ft, int session, int n);
void ft_get_stats(ft_t *ft, struct ft_stats *ret);
/* Violations counted so far (the sum of the violation fields). */
uint64_t ft_violations(const struct ft_stats *s);
/* Writes the nonzero stats as "name=value" lines. */
void ft_print_stats(const struct ft_stats *s, void (*out)(void *ctx, const char *line), void *ctx);

/* For the fuzz target: treats @data as the SMB of a connection (4 KiB pages; the tail
 * that is not a whole page is dropped) in which every chunk is committed to one session,
 * then reads that session's buffer back and writes its trace to /dev/null: the fake's
 * chunk, fragment and packet parsing on arbitrary bytes. */
void ft_fuzz_smb(const uint8_t *data, size_t len);

#endif
