/* producer/producer.h: heapprof as a producer of Perfetto's tracing service (traced).
 *
 * A prod_t keeps one connection to traced's producer socket: it binds the ProducerPort,
 * registers one data source (e.g. "android.heapprofd"), receives the session commands
 * (setup, start, stop, flush, clear incremental state) and turns them into callbacks,
 * and reconnects with backoff whenever traced goes away. Packets go into the shared
 * memory buffer (SMB) traced hands over, through one prod_writer_t per data source
 * instance (one packet sequence): each packet is copied into chunks of the SMB as
 * fragments whose sizes are known when written, so no chunk ever needs patching;
 * completed chunks are committed to traced by the connection's thread.
 *
 *     prod_t *p;
 *     prod_new(&(struct prod_options){.data_source_name = "android.heapprofd"}, &cb, ctx, &p);
 *     for (;;) { poll(fds from prod_pollfds(p, ...), prod_timeout_ms(p)); prod_dispatch(p); }
 *     // in cb.setup: keep the writer (prod_writer_ref) and hand it to the bookkeeping
 *     // thread, which calls prod_writer_write(w, iov, n, len) per TracePacket.
 *
 * Threads: the owner thread (the one that calls prod_new) calls everything on prod_t and
 * gets the callbacks; it never waits for SMB space. A writer is written by one thread at
 * a time (its user), which may wait there, bounded, for traced to free chunks; the owner
 * thread completes a writer's chunk for a flush only under the writer's lock, without
 * waiting for it (see producer/writer.c).
 */
#ifndef HP_PRODUCER_PRODUCER_H
#define HP_PRODUCER_PRODUCER_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/macros.h"

typedef struct prod prod_t;
typedef struct prod_writer prod_writer_t;

/* The DataSourceConfig of an instance, as traced sent it. Borrowed for the callback. */
struct prod_ds_config {
    uint64_t instance_id;
    uint32_t target_buffer;     /* traced's global buffer id: where the writer commits */
    uint32_t stop_timeout_ms;   /* 0: not given (traced waits 5000 ms) */
    uint32_t trace_duration_ms; /* 0: until stopped */
    uint64_t tracing_session_id;
    bool enable_extra_guardrails;
    const uint8_t *heapprofd_config; /* raw HeapprofdConfig bytes (NULL: none) */
    size_t heapprofd_config_len;
};

struct prod_callbacks {
    /* The connection is up and the data source registered. May be NULL. */
    void (*connected)(void *ctx);
    /* A session wants an instance of the data source, with its own writer @w (borrowed;
     * prod_writer_ref() to keep it). Return 0 to accept, or -errno to refuse (then the
     * instance gets no data and its stop is acknowledged at once). */
    int (*setup)(void *ctx, const struct prod_ds_config *cfg, prod_writer_t *w);
    void (*start)(void *ctx, uint64_t instance_id);
    /* End the instance: write its last packets, prod_writer_finish() its writer, then call
     * prod_instance_stopped() on the owner thread; traced waits up to stop_timeout_ms. */
    void (*stop)(void *ctx, uint64_t instance_id);
    /* The connection is gone, and with it every instance (their writers now drop what
     * they are given). prod_instance_stopped() is not expected for them. */
    void (*disconnected)(void *ctx);
};

struct prod_options {
    /* NULL: $PERFETTO_PRODUCER_SOCK_NAME (its first entry), else
     * /run/perfetto/traced-producer.sock when /run/perfetto/ is accessible, else
     * /tmp/perfetto-producer. A leading '@' names an abstract socket. */
    const char *socket_name;
    const char *producer_name;    /* NULL: "heapprof" */
    const char *data_source_name; /* NULL: "android.heapprofd" */
    /* SMB hints for traced (0: traced's defaults, 256 KiB of 4 KiB pages). */
    uint32_t smb_size_hint_bytes, smb_page_size_hint_bytes;
    /* Longest a writer waits for a free chunk for one packet before it drops the packet
     * (0: 2000 ms). */
    uint32_t stall_budget_ms;
};

/* Starts connecting (at once, then with backoff). Returns 0, -ENOMEM, -errno. */
int prod_new(const struct prod_options *o, const struct prod_callbacks *cb, void *ctx,
             prod_t **ret) HP_WARN_UNUSED;
/* Closes the connection; instances end as on a disconnection (no callbacks). Accepts
 * NULL. */
prod_t *prod_free(prod_t *p);

/* The descriptors to poll (at most PROD_MAX_POLLFDS): fills @fds, returns their count. */
#define PROD_MAX_POLLFDS 2
size_t prod_pollfds(prod_t *p, struct pollfd *fds);
/* Milliseconds until prod_dispatch() has timed work (a reconnection), or -1. */
int prod_timeout_ms(prod_t *p);
/* Serves the connection: reads and answers traced, commits completed chunks, acks
 * flushes, reconnects when due. Never blocks. */
void prod_dispatch(prod_t *p);

/* After the stop callback: the instance's last packets are written and its writer
 * finished. Commits what is left, then tells traced the instance stopped. */
void prod_instance_stopped(prod_t *p, uint64_t instance_id);

bool prod_connected(const prod_t *p);
/* The socket name in use (borrowed; valid until prod_free()). */
const char *prod_socket_name(const prod_t *p);

struct prod_stats {
    uint64_t connections;  /* successful connections so far */
    uint64_t instances;    /* instances set up */
    uint64_t commits;      /* CommitData requests sent */
    uint64_t chunks_moved; /* chunks committed */
    uint64_t flushes_acked;
};
void prod_get_stats(const prod_t *p, struct prod_stats *ret);

/* ---- writers ----------------------------------------------------------------------- */

/* Appends one TracePacket of @len bytes given in @n pieces. Returns 0; -ENOBUFS when it
 * was dropped because no chunk came free within the stall budget, or -EPIPE when the
 * connection or the instance is gone (dropped too). After a drop the next packet
 * written carries previous_packet_dropped, and the caller should make it restart its
 * interned state. One thread at a time. */
int prod_writer_write(prod_writer_t *w, const struct iovec *iov, int n, size_t len) HP_WARN_UNUSED;
/* True once after traced asked the instance to clear its incremental state
 * (ClearIncrementalState): the next packet should restart the interned data. Any
 * thread. */
bool prod_writer_take_clear_request(prod_writer_t *w);
/* Completes the writer's current chunk, so what was written is committed. The writing
 * thread. */
void prod_writer_finish(prod_writer_t *w);

struct prod_writer_stats {
    uint64_t packets, bytes, chunks;
    uint64_t packets_dropped;
    uint64_t stall_us; /* time spent waiting for free chunks */
};
void prod_writer_get_stats(prod_writer_t *w, struct prod_writer_stats *ret);

prod_writer_t *prod_writer_ref(prod_writer_t *w);
/* Accepts NULL; returns NULL. */
prod_writer_t *prod_writer_unref(prod_writer_t *w);

#endif
