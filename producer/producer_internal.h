/* producer/producer_internal.h: the parts of producer/ its files share: the shared memory
 * buffer's ABI (smb.c), the writers' state (writer.c), the IPC codec (ipc.c) that the
 * connection and the fuzz targets use, and the connection's state (struct prod), which
 * conn.c, request.c and data_source.c share. Internal to producer/.
 *
 * The SMB, as traced lays it out (Perfetto's shared memory ABI):
 *
 *     page 0                        page 1               ...   page n-1
 *     +--------+------------------+ +--------+---------+
 *     | header | chunk 0 ... k    | | header | chunk 0 |
 *     +--------+------------------+ +--------+---------+
 *     header: u32 word (bits 2i..2i+1: state of chunk i, bits 28-30: layout), u32 0
 *     chunk:  u32 chunk_id, u16 writer_id, u16 packets (bits 0-9 count, 10-15 flags),
 *             then fragments [varint size (<= 4 bytes)][size bytes] ...
 *
 * traced changes page words concurrently (it frees chunks it has copied): every update of
 * a page word is a 32-bit compare-and-swap, and a chunk is touched only while this
 * process holds it in state BeingWritten.
 */
#ifndef HP_PRODUCER_PRODUCER_INTERNAL_H
#define HP_PRODUCER_PRODUCER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "producer/producer.h"

struct hp_pbw;

/* ---- the SMB ABI (smb.c) ------------------------------------------------------------ */

#define PROD_PAGE_HEADER_BYTES 8
#define PROD_CHUNK_HEADER_BYTES 8
#define PROD_MIN_PAGE_BYTES 4096
#define PROD_MAX_PAGE_BYTES 65536
#define PROD_MAX_SMB_BYTES (64u << 20)

enum prod_chunk_state {
    PROD_CHUNK_FREE = 0,
    PROD_CHUNK_BEING_WRITTEN = 1,
    PROD_CHUNK_BEING_READ = 2,
    PROD_CHUNK_COMPLETE = 3,
};

/* Chunk flags (bits 10-15 of the packets word). */
#define PROD_CHUNK_CONT_FROM_PREV 1u /* the first fragment continues the previous chunk's */
#define PROD_CHUNK_CONT_ON_NEXT 2u   /* the last fragment continues in the next chunk */
#define PROD_CHUNK_NEEDS_PATCHING 4u

#define PROD_LAYOUT_DIV1 1u
#define PROD_LAYOUT_SHIFT 28
#define PROD_MAX_CHUNKS_PER_PAGE 14
/* The C++ writer stops at 1022 packets per chunk (the count has 10 bits). */
#define PROD_MAX_PACKETS_PER_CHUNK 1022
/* A fragment of a packet a writer had to abandon (4-byte redundant varint 2^28 - 1). */
#define PROD_DROP_SENTINEL 0x0fffffffu

/* Chunks per page of each layout (0 and 6, 7: none). */
extern const uint8_t prod__layout_chunks[8];

/* A chunk that was completed and waits to be committed. */
struct prod__move {
    uint32_t page, chunk, target_buffer;
};

/* One mapped SMB, shared by the connection (its owner thread) and the writers of its
 * instances; freed with its last reference. The commit queue and the counters below
 * are protected by @lock. */
struct prod__smb {
    _Atomic unsigned refs;
    uint8_t *base;
    size_t size, page_size, n_pages;
    int wake_fd;                /* eventfd: writers wake the owner thread */
    _Atomic unsigned next_page; /* where writers start looking for a free chunk */
    pthread_mutex_t lock;
    pthread_cond_t freed; /* signalled when traced freed chunks, or the SMB died */
    struct prod__move *moves;
    size_t n_moves, cap_moves;
    size_t commit_batch; /* queued moves that wake the owner */
    uint64_t freed_gen;  /* +1 per CommitData reply (the chunks it named are free) */
    bool starved;        /* a writer found no free chunk */
    bool dead;           /* the connection is gone: nobody frees chunks any more */
};

/* Maps @fd (borrowed) of @size bytes in pages of @page_size. Returns 0, -EINVAL (a size
 * or page size the ABI does not allow), -errno. */
int prod__smb_new(int fd, size_t size, size_t page_size, struct prod__smb **ret) HP_WARN_UNUSED;
struct prod__smb *prod__smb_ref(struct prod__smb *s);
struct prod__smb *prod__smb_unref(struct prod__smb *s);
/* Marks the SMB dead and wakes every waiting writer. */
void prod__smb_kill(struct prod__smb *s);
/* Owner thread: a CommitData was answered; wakes writers waiting for chunks. */
void prod__smb_chunks_freed(struct prod__smb *s);

static inline uint32_t *prod__page_word(const struct prod__smb *s, size_t page)
{
    return (uint32_t *)(void *)(s->base + page * s->page_size);
}
/* Bytes of each chunk of @layout in pages of @page_size (header included). */
size_t prod__chunk_size(size_t page_size, unsigned layout);
/* Takes a free chunk: partitions a free page (Div1) or takes a free chunk of a
 * partitioned one, with a compare-and-swap to BeingWritten. Returns 0 with the page,
 * the chunk index and its start, or -ENOBUFS when every chunk is taken. */
int prod__smb_try_acquire(struct prod__smb *s, uint32_t *ret_page, uint32_t *ret_chunk,
                          uint8_t **ret_start, size_t *ret_size) HP_WARN_UNUSED;
/* BeingWritten -> Complete. After this the chunk is traced's. */
void prod__smb_complete(struct prod__smb *s, uint32_t page, uint32_t chunk);
/* Wakes the owner thread: it commits every queued move. */
void prod__smb_wake(struct prod__smb *s);
/* Queues a completed chunk for the owner thread to commit (waking it once a batch is
 * queued). */
void prod__smb_queue_move(struct prod__smb *s, const struct prod__move *m);
/* Owner thread: takes the queued moves (caller frees *@ret with free()). */
size_t prod__smb_take_moves(struct prod__smb *s, struct prod__move **ret);
/* Owner thread: true once after a writer found no free chunk. */
bool prod__smb_take_starved(struct prod__smb *s);

/* ---- writers (writer.c) ------------------------------------------------------------- */

struct prod_writer {
    _Atomic unsigned refs;
    struct prod__smb *smb; /* a reference */
    uint16_t id;
    uint32_t target_buffer;
    uint32_t stall_budget_ms;
    /* Held by the thread writing, and by the owner thread (try-lock only) to complete the
     * current chunk for a flush. Everything below up to the atomics is under it. */
    pthread_mutex_t lock;
    uint32_t next_chunk_id;
    uint8_t *chunk; /* the chunk being written, or NULL */
    uint32_t page, chunk_index;
    size_t pos, end; /* write position and end, offsets in the chunk */
    uint16_t count;  /* fragments in the chunk */
    uint16_t flags;  /* PROD_CHUNK_* */
    bool orphan;     /* a packet was cut after a fragment that continues: the next chunk must
                        end it with the drop sentinel */
    bool lost;       /* packets were dropped: the next one says so */
    struct prod_writer_stats stats;
    /* Flush requests (ids) of the owner thread that found the writer busy, and the last
     * one done; the owner reads flushed (acquire) after the writer queued its chunk. */
    _Atomic uint64_t flush_req, flushed;
    _Atomic bool clear_req; /* ClearIncrementalState arrived */
    _Atomic bool detached;  /* the instance is gone: writes fail with -EPIPE */
};

/* Creates writer @id for @target_buffer on @smb (takes a reference). */
int prod__writer_new(struct prod__smb *smb, uint16_t id, uint32_t target_buffer,
                     uint32_t stall_budget_ms, prod_writer_t **ret) HP_WARN_UNUSED;
/* Owner thread: completes the writer's chunk for flush @req if the writer is idle;
 * otherwise leaves the request for the writer to serve when its packet is done.
 * Returns true when served now (or nothing to do). */
bool prod__writer_flush(prod_writer_t *w, uint64_t req);
/* Owner thread: the flush request @req was served. */
bool prod__writer_flushed(prod_writer_t *w, uint64_t req);
/* Owner thread: completes the chunk of an idle writer (a starved writer needs room). */
void prod__writer_release_idle(prod_writer_t *w);

/* ---- IPC codec (ipc.c) -------------------------------------------------------------- */

/* A frame is a u32 little-endian length and that many bytes of IPCFrame; header and
 * payload together at most 128 KiB (Perfetto's kIPCBufferSize). */
#define PROD_IPC_MAX_FRAME (128u * 1024u)
#define PROD_IPC_HEADER 4

enum prod_frame_kind {
    PROD_FRAME_NONE = 0, /* no msg set */
    PROD_FRAME_BIND,
    PROD_FRAME_BIND_REPLY,
    PROD_FRAME_INVOKE,
    PROD_FRAME_INVOKE_REPLY,
    PROD_FRAME_REQUEST_ERROR,
};

/* A decoded IPCFrame; pointers are borrowed from the frame's bytes. */
struct prod__frame {
    uint64_t request_id;
    enum prod_frame_kind kind;
    const uint8_t *msg; /* the body of the oneof msg */
    size_t msg_len;
    /* PROD_FRAME_INVOKE_REPLY */
    bool success, has_more;
    const uint8_t *reply;
    size_t reply_len;
};
int prod__decode_frame(const uint8_t *p, size_t len, struct prod__frame *ret) HP_WARN_UNUSED;

/* The methods heapprof calls, looked up by name in the bind reply. */
enum prod_method {
    PROD_M_INITIALIZE_CONNECTION,
    PROD_M_REGISTER_DATA_SOURCE,
    PROD_M_COMMIT_DATA,
    PROD_M_GET_ASYNC_COMMAND,
    PROD_M_REGISTER_TRACE_WRITER,
    PROD_M_UNREGISTER_TRACE_WRITER,
    PROD_M_NOTIFY_DATA_SOURCE_STOPPED,
    PROD_M_COUNT
};
extern const char *const prod__method_names[PROD_M_COUNT];
/* Reads a BindServiceReply: success, service id and the ids of our methods (0: absent).
 * Returns 0, -EBADMSG, or -ENOENT when the service refused the bind or a method is
 * missing. */
int prod__decode_bind_reply(const uint8_t *p, size_t len, uint32_t *ret_service_id,
                            uint32_t method_ids[PROD_M_COUNT]) HP_WARN_UNUSED;

enum prod_cmd_kind {
    PROD_CMD_UNKNOWN = 0,
    PROD_CMD_SETUP_TRACING,
    PROD_CMD_SETUP_DS,
    PROD_CMD_START_DS,
    PROD_CMD_STOP_DS,
    PROD_CMD_FLUSH,
    PROD_CMD_CLEAR_STATE,
};

#define PROD_MAX_CMD_IDS 64
struct prod__command {
    enum prod_cmd_kind kind;
    uint32_t page_size_kb;          /* SETUP_TRACING */
    struct prod_ds_config config;   /* SETUP_DS, START_DS (instance_id too); STOP_DS: id */
    uint64_t request_id, flags;     /* FLUSH */
    uint64_t ids[PROD_MAX_CMD_IDS]; /* FLUSH, CLEAR_STATE */
    size_t n_ids;
    bool ids_truncated; /* more ids than PROD_MAX_CMD_IDS */
};
/* Decodes a GetAsyncCommandResponse. An unknown command is PROD_CMD_UNKNOWN (newer
 * services may send commands heapprof does not know). Returns 0 or -EBADMSG. */
int prod__decode_command(const uint8_t *p, size_t len, struct prod__command *ret) HP_WARN_UNUSED;
/* Decodes a DataSourceConfig into @ret (pointers borrowed). Returns 0 or -EBADMSG. */
int prod__decode_ds_config(const uint8_t *p, size_t len, struct prod_ds_config *ret) HP_WARN_UNUSED;

/* Splits a byte stream into frames: call with each chunk received; for every complete
 * frame @fn gets its payload. Returns the bytes consumed from @p (the rest begins a
 * frame), or -EMSGSIZE for a frame longer than PROD_IPC_MAX_FRAME. */
long prod__split_frames(const uint8_t *p, size_t len,
                        void (*fn)(void *ctx, const uint8_t *frame, size_t len), void *ctx);

/* ---- the connection (conn.c, request.c, data_source.c) ------------------------------ */

enum prod__conn_state {
    PROD_CONN_IDLE,
    PROD_CONN_BINDING,
    PROD_CONN_INITIALIZING,
    PROD_CONN_READY,
};

enum prod__req_kind {
    PROD_REQ_NONE = 0, /* no reply wanted */
    PROD_REQ_BIND,
    PROD_REQ_INIT,
    PROD_REQ_REGISTER,
    PROD_REQ_ASYNC,
    PROD_REQ_COMMIT,
};

struct prod__req {
    uint64_t id;
    enum prod__req_kind kind;
};

/* A data source instance traced set up on this connection (data_source.c). */
struct prod__instance {
    uint64_t id;
    prod_writer_t *w; /* NULL when refused */
    bool started, stopping;
};

/* A Flush not yet acknowledged: it waits for the writers of @ids. */
struct prod__flush {
    uint64_t req;
    uint64_t ids[PROD_MAX_CMD_IDS];
    size_t n_ids;
};

/* prod_t: one connection to traced and what lives on it. Owner thread only. */
struct prod {
    struct prod_callbacks cb;
    void *ctx;
    char sock_name[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *producer_name, *ds_name;
    uint32_t smb_size_hint, smb_page_hint, stall_budget_ms;

    enum prod__conn_state state;
    int fd;
    int received_fd; /* the last fd traced sent, until SetupTracing takes it */
    uint8_t *rx;
    size_t rx_len;
    uint8_t *tx;
    size_t tx_len, tx_cap;
    uint64_t next_req;
    uint32_t service_id, methods[PROD_M_COUNT];
    struct prod__req *reqs;
    size_t n_reqs, cap_reqs;

    struct prod__smb *smb;
    struct prod__instance *inst;
    size_t n_inst, cap_inst;
    struct prod__flush *flushes;
    size_t n_flushes, cap_flushes;
    uint16_t next_writer_id;

    uint64_t reconnect_at_ns;
    uint32_t backoff_ms;
    struct prod_stats stats;
};

/* Appends one IPCFrame (@frame) to the send queue (request.c). */
void prod__send_frame(prod_t *p, const struct hp_pbw *frame);
/* Remembers that the reply to request @id is wanted, as @kind. */
void prod__track_req(prod_t *p, uint64_t id, enum prod__req_kind kind);
/* Invokes @m with the serialized request @args (emptied). Returns the request id. */
uint64_t prod__invoke(prod_t *p, enum prod_method m, struct hp_pbw *args, bool drop_reply,
                      enum prod__req_kind kind);
/* Finds the request a reply answers: its kind in *@ret; a stream's request stays. */
bool prod__take_req(prod_t *p, uint64_t id, enum prod__req_kind *ret);

/* Sends the moves the writers queued and, with @flush_id, the flush ack (data_source.c). */
void prod__send_commits(prod_t *p, uint64_t flush_id);
/* Acknowledges the flushes done, oldest first. */
void prod__check_flushes(prod_t *p);
/* Handles a command about the data source's instances (every kind but SetupTracing). */
void prod__ds_command(prod_t *p, const struct prod__command *c);

#endif
