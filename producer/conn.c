/* producer/conn.c: the connection to traced's producer socket and its state machine.
 *
 *     idle --connect--> binding --BindServiceReply--> initializing --init reply--> ready
 *       ^                  (InitializeConnection and GetAsyncCommand sent back to back)   |
 *       +------------- EOF, error, refused request: disconnect, retry after backoff ------+
 *
 * In `ready` the GetAsyncCommand stream brings SetupTracing (with the SMB's fd),
 * SetupDataSource, StartDataSource, StopDataSource, Flush and ClearIncrementalState.
 * Completed chunks queued by the writers are committed here; a flush is acknowledged
 * once every writer it names has completed its chunk, in the same CommitData as (or
 * after) the moves of those chunks. Everything runs on the owner thread and nothing
 * here waits: the socket is non-blocking (traced drops a producer whose socket stays
 * full for 10 ms), writes that do not fit are queued.
 */
#include "producer/producer.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/containers.h"
#include "common/log.h"
#include "common/pbwire.h"
#include "producer/producer_internal.h"
#include "protos/commit_data.pb.h"
#include "protos/data_source.pb.h"
#include "protos/ipc_frame.pb.h"
#include "protos/producer_port.pb.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 30000
/* Moves per CommitData: ~12 bytes each keeps a frame far below 128 KiB. */
#define MOVES_PER_COMMIT 4096
/* Bytes queued for traced beyond which it is considered stuck. */
#define TX_MAX (8u << 20)
#define MAX_WRITER_ID 32767
/* Descriptors taken per recvmsg (traced sends one, with SetupTracing); more are closed. */
#define MAX_RX_FDS 4

enum state { ST_IDLE, ST_BINDING, ST_INITIALIZING, ST_READY };

enum req_kind {
    REQ_NONE = 0, /* no reply wanted */
    REQ_BIND,
    REQ_INIT,
    REQ_REGISTER,
    REQ_ASYNC,
    REQ_COMMIT,
};

struct pending_req {
    uint64_t id;
    enum req_kind kind;
};

struct instance {
    uint64_t id;
    prod_writer_t *w; /* NULL when refused */
    bool started, stopping;
};

struct flush {
    uint64_t req;
    uint64_t ids[PROD_MAX_CMD_IDS];
    size_t n_ids;
};

struct prod {
    struct prod_callbacks cb;
    void *ctx;
    char sock_name[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *producer_name, *ds_name;
    uint32_t smb_size_hint, smb_page_hint, stall_budget_ms;

    enum state state;
    int fd;
    int received_fd; /* the last fd traced sent, until SetupTracing takes it */
    uint8_t *rx;
    size_t rx_len;
    uint8_t *tx;
    size_t tx_len, tx_cap;
    uint64_t next_req;
    uint32_t service_id, methods[PROD_M_COUNT];
    struct pending_req *reqs;
    size_t n_reqs, cap_reqs;

    struct prod__smb *smb;
    struct instance *inst;
    size_t n_inst, cap_inst;
    struct flush *flushes;
    size_t n_flushes, cap_flushes;
    uint16_t next_writer_id;

    uint64_t reconnect_at_ns;
    uint32_t backoff_ms;
    struct prod_stats stats;
};

/* ---- socket name ------------------------------------------------------------------- */

static void resolve_name(const char *given, char *buf, size_t len)
{
    const char *env = getenv("PERFETTO_PRODUCER_SOCK_NAME");
    if (given && *given) {
        snprintf(buf, len, "%s", given);
    } else if (env && *env) {
        /* traced may listen on several sockets (a comma-separated list): the first. */
        snprintf(buf, len, "%.*s", (int)strcspn(env, ","), env);
    } else if (access("/run/perfetto/", X_OK) == 0) {
        snprintf(buf, len, "/run/perfetto/traced-producer.sock");
    } else {
        snprintf(buf, len, "/tmp/perfetto-producer");
    }
}

static socklen_t make_addr(const char *name, struct sockaddr_un *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (name[0] == '@') {
        /* Abstract: a leading NUL and the name without '@', no terminator. */
        n = HP_MIN(n - 1, sizeof(addr->sun_path) - 1);
        memcpy(addr->sun_path + 1, name + 1, n);
        return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    }
    n = HP_MIN(n, sizeof(addr->sun_path) - 1);
    memcpy(addr->sun_path, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
}

/* ---- sending ----------------------------------------------------------------------- */

static bool tx_reserve(prod_t *p, size_t n)
{
    return hp_grow((void **)&p->tx, &p->tx_cap, p->tx_len + n, 1) == 0;
}

static void track(prod_t *p, uint64_t id, enum req_kind kind)
{
    if (hp_grow((void **)&p->reqs, &p->cap_reqs, p->n_reqs + 1, sizeof(*p->reqs)) < 0)
        return; /* the reply will be dropped as unknown */
    p->reqs[p->n_reqs++] = (struct pending_req){id, kind};
}

/* Appends one frame holding @frame (an IPCFrame) to the send queue. Out of memory the
 * frame is lost whole (the request goes unanswered), never cut. */
static void send_frame(prod_t *p, const struct hp_pbw *frame)
{
    if (!tx_reserve(p, PROD_IPC_HEADER + frame->len))
        return;
    uint8_t *q = p->tx + p->tx_len;
    q[0] = (uint8_t)frame->len;
    q[1] = (uint8_t)(frame->len >> 8);
    q[2] = (uint8_t)(frame->len >> 16);
    q[3] = (uint8_t)(frame->len >> 24);
    memcpy(q + PROD_IPC_HEADER, frame->p, frame->len);
    p->tx_len += PROD_IPC_HEADER + frame->len;
}

/* Invokes @method with the serialized request @args (emptied). Returns the request id. */
static uint64_t invoke(prod_t *p, enum prod_method m, struct hp_pbw *args, bool drop_reply,
                       enum req_kind kind)
{
    struct hp_pbw inv = {0}, fr = {0};
    uint64_t id = p->next_req++;
    hp_pbw_uint_always(&inv, perfetto_protos_IPCFrame_InvokeMethod_service_id_tag, p->service_id);
    hp_pbw_uint_always(&inv, perfetto_protos_IPCFrame_InvokeMethod_method_id_tag, p->methods[m]);
    hp_pbw_len(&inv, perfetto_protos_IPCFrame_InvokeMethod_args_proto_tag, args->p, args->len);
    if (drop_reply)
        hp_pbw_uint(&inv, perfetto_protos_IPCFrame_InvokeMethod_drop_reply_tag, 1);
    hp_pbw_uint_always(&fr, perfetto_protos_IPCFrame_request_id_tag, id);
    hp_pbw_msg(&fr, perfetto_protos_IPCFrame_msg_invoke_method_tag, &inv);
    if (!fr.oom && !args->oom)
        send_frame(p, &fr);
    if (!drop_reply)
        track(p, id, kind);
    free(inv.p);
    free(fr.p);
    free(args->p);
    *args = (struct hp_pbw){0};
    return id;
}

/* ---- connection lifecycle ------------------------------------------------------------ */

static void disconnect(prod_t *p, const char *why)
{
    if (p->fd < 0)
        return;
    bool had_session = p->state == ST_READY;
    if (had_session && p->cb.disconnected)
        hp_log_warn("producer: connection to %s lost: %s; reconnecting", p->sock_name, why);
    else
        hp_log_debug("producer: %s: %s", p->sock_name, why);
    (void)close(p->fd);
    p->fd = -1;
    if (p->received_fd >= 0)
        (void)close(p->received_fd);
    p->received_fd = -1;
    if (p->smb)
        prod__smb_kill(p->smb);
    for (size_t i = 0; i < p->n_inst; i++) {
        if (p->inst[i].w) {
            atomic_store_explicit(&p->inst[i].w->detached, true, memory_order_release);
            prod_writer_unref(p->inst[i].w);
        }
    }
    p->n_inst = 0;
    p->smb = prod__smb_unref(p->smb);
    p->n_flushes = p->n_reqs = 0;
    p->rx_len = p->tx_len = 0;
    p->state = ST_IDLE;
    p->reconnect_at_ns = hp_clock_ns(CLOCK_MONOTONIC) + (uint64_t)p->backoff_ms * 1000000u;
    p->backoff_ms = HP_MIN(p->backoff_ms * 2, (uint32_t)BACKOFF_MAX_MS);
    if (had_session && p->cb.disconnected)
        p->cb.disconnected(p->ctx);
}

static void try_connect(prod_t *p)
{
    struct sockaddr_un addr;
    socklen_t alen = make_addr(p->sock_name, &addr);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, alen) < 0) {
        int e = errno;
        if (fd >= 0)
            (void)close(fd);
        hp_log_debug("producer: cannot connect to %s: %s", p->sock_name, strerror(e));
        p->reconnect_at_ns = hp_clock_ns(CLOCK_MONOTONIC) + (uint64_t)p->backoff_ms * 1000000u;
        p->backoff_ms = HP_MIN(p->backoff_ms * 2, (uint32_t)BACKOFF_MAX_MS);
        return;
    }
    p->fd = fd;
    p->state = ST_BINDING;
    p->next_req = 1;
    p->next_writer_id = 1;
    struct hp_pbw bind = {0}, fr = {0};
    static const char service[] = "ProducerPort";
    hp_pbw_len(&bind, perfetto_protos_IPCFrame_BindService_service_name_tag, service,
               sizeof(service) - 1);
    uint64_t id = p->next_req++;
    hp_pbw_uint_always(&fr, perfetto_protos_IPCFrame_request_id_tag, id);
    hp_pbw_msg(&fr, perfetto_protos_IPCFrame_msg_bind_service_tag, &bind);
    if (!fr.oom)
        send_frame(p, &fr);
    track(p, id, REQ_BIND);
    free(bind.p);
    free(fr.p);
}

static void send_init(prod_t *p)
{
    struct hp_pbw a = {0};
    if (p->smb_page_hint)
        hp_pbw_uint(
            &a, perfetto_protos_InitializeConnectionRequest_shared_memory_page_size_hint_bytes_tag,
            p->smb_page_hint);
    if (p->smb_size_hint)
        hp_pbw_uint(&a,
                    perfetto_protos_InitializeConnectionRequest_shared_memory_size_hint_bytes_tag,
                    p->smb_size_hint);
    hp_pbw_len(&a, perfetto_protos_InitializeConnectionRequest_producer_name_tag, p->producer_name,
               strlen(p->producer_name));
    static const char sdk[] = "heapprof";
    hp_pbw_len(&a, perfetto_protos_InitializeConnectionRequest_sdk_version_tag, sdk,
               sizeof(sdk) - 1);
    invoke(p, PROD_M_INITIALIZE_CONNECTION, &a, false, REQ_INIT);
    /* Pipelined, as Perfetto's client does: commands may follow the init reply at once. */
    invoke(p, PROD_M_GET_ASYNC_COMMAND, &a, false, REQ_ASYNC);
}

static void send_register(prod_t *p)
{
    struct hp_pbw d = {0}, a = {0};
    hp_pbw_len(&d, perfetto_protos_DataSourceDescriptor_name_tag, p->ds_name, strlen(p->ds_name));
    hp_pbw_uint(&d, perfetto_protos_DataSourceDescriptor_will_notify_on_stop_tag, 1);
    hp_pbw_uint(&d, perfetto_protos_DataSourceDescriptor_handles_incremental_state_clear_tag, 1);
    hp_pbw_msg(&a, perfetto_protos_RegisterDataSourceRequest_data_source_descriptor_tag, &d);
    free(d.p);
    invoke(p, PROD_M_REGISTER_DATA_SOURCE, &a, false, REQ_REGISTER);
}

/* ---- instances, commits, flushes ---------------------------------------------------- */

static struct instance *find_instance(prod_t *p, uint64_t id)
{
    for (size_t i = 0; i < p->n_inst; i++)
        if (p->inst[i].id == id)
            return &p->inst[i];
    return NULL;
}

static void remove_instance(prod_t *p, struct instance *in)
{
    if (in->w) {
        atomic_store_explicit(&in->w->detached, true, memory_order_release);
        prod_writer_unref(in->w);
    }
    *in = p->inst[--p->n_inst];
}

/* Sends the queued moves (several frames when many) and, with @flush_id, the flush ack
 * in the last one. */
static void send_commits(prod_t *p, uint64_t flush_id)
{
    struct prod__move *moves = NULL;
    size_t n = p->smb ? prod__smb_take_moves(p->smb, &moves) : 0;
    size_t i = 0;
    do {
        size_t k = HP_MIN(n - i, (size_t)MOVES_PER_COMMIT);
        bool last = i + k == n;
        if (k == 0 && !(last && flush_id))
            break;
        struct hp_pbw a = {0}, m = {0};
        for (size_t j = i; j < i + k; j++) {
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_page_tag,
                               moves[j].page);
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_chunk_tag,
                               moves[j].chunk);
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_target_buffer_tag,
                               moves[j].target_buffer);
            hp_pbw_msg(&a, perfetto_protos_CommitDataRequest_chunks_to_move_tag, &m);
        }
        free(m.p);
        if (last && flush_id)
            hp_pbw_uint(&a, perfetto_protos_CommitDataRequest_flush_request_id_tag, flush_id);
        /* A reply tells the writers waiting for room that the moved chunks are free. */
        invoke(p, PROD_M_COMMIT_DATA, &a, k == 0, REQ_COMMIT);
        p->stats.commits++;
        p->stats.chunks_moved += k;
        i += k;
    } while (i < n);
    free(moves);
}

static bool flush_done(prod_t *p, const struct flush *f)
{
    for (size_t i = 0; i < f->n_ids; i++) {
        struct instance *in = find_instance(p, f->ids[i]);
        if (in && in->w && !prod__writer_flushed(in->w, f->req))
            return false;
    }
    return true;
}

/* Acknowledges the flushes done, oldest first (an ack covers every earlier id). */
static void check_flushes(prod_t *p)
{
    size_t k = 0;
    while (k < p->n_flushes && flush_done(p, &p->flushes[k]))
        k++;
    if (k == 0)
        return;
    send_commits(p, p->flushes[k - 1].req);
    p->stats.flushes_acked += k;
    memmove(p->flushes, p->flushes + k, (p->n_flushes - k) * sizeof(*p->flushes));
    p->n_flushes -= k;
}

static void notify_stopped(prod_t *p, uint64_t id)
{
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_NotifyDataSourceStoppedRequest_data_source_id_tag, id);
    invoke(p, PROD_M_NOTIFY_DATA_SOURCE_STOPPED, &a, true, REQ_NONE);
}

static void unregister_writer(prod_t *p, const prod_writer_t *w)
{
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_UnregisterTraceWriterRequest_trace_writer_id_tag, w->id);
    invoke(p, PROD_M_UNREGISTER_TRACE_WRITER, &a, true, REQ_NONE);
}

void prod_instance_stopped(prod_t *p, uint64_t instance_id)
{
    struct instance *in = find_instance(p, instance_id);
    if (!in || p->state != ST_READY)
        return;
    /* Socket order is enough: traced has moved the chunks before it reads the ack. */
    send_commits(p, 0);
    notify_stopped(p, instance_id);
    if (in->w)
        unregister_writer(p, in->w);
    remove_instance(p, in);
    check_flushes(p);
}

static uint16_t new_writer_id(prod_t *p)
{
    for (int tries = 0; tries < MAX_WRITER_ID; tries++) {
        uint16_t id = p->next_writer_id;
        p->next_writer_id = id >= MAX_WRITER_ID ? 1 : (uint16_t)(id + 1);
        bool used = false;
        for (size_t i = 0; i < p->n_inst && !used; i++)
            used = p->inst[i].w && p->inst[i].w->id == id;
        if (!used)
            return id;
    }
    return 0;
}

static void setup_tracing(prod_t *p, const struct prod__command *c)
{
    int fd = p->received_fd;
    p->received_fd = -1;
    if (p->smb) {
        /* traced sends it once per connection; a second one is ignored. */
        if (fd >= 0)
            (void)close(fd);
        return;
    }
    if (fd < 0) {
        disconnect(p, "SetupTracing came without the shared memory buffer");
        return;
    }
    struct stat st = {0};
    int r = fstat(fd, &st) < 0 ? -errno : 0;
    if (r == 0)
        r = prod__smb_new(fd, (size_t)st.st_size, (size_t)c->page_size_kb * 1024, &p->smb);
    (void)close(fd);
    if (r < 0) {
        char why[128];
        snprintf(why, sizeof(why), "unusable shared memory buffer (%lld bytes, %u KiB pages): %s",
                 (long long)st.st_size, c->page_size_kb, strerror(-r));
        disconnect(p, why);
        return;
    }
    hp_log_info("producer: shared memory buffer of %zu KiB in %zu KiB pages", p->smb->size >> 10,
                p->smb->page_size >> 10);
}

static void setup_ds(prod_t *p, const struct prod__command *c)
{
    const struct prod_ds_config *cfg = &c->config;
    if (find_instance(p, cfg->instance_id))
        return;
    if (hp_grow((void **)&p->inst, &p->cap_inst, p->n_inst + 1, sizeof(*p->inst)) < 0)
        return; /* unknown to us: its stop is acknowledged at once */
    struct instance *in = &p->inst[p->n_inst++];
    *in = (struct instance){.id = cfg->instance_id};
    p->stats.instances++;
    uint16_t wid = new_writer_id(p);
    if (!p->smb || !wid || cfg->target_buffer == 0 ||
        prod__writer_new(p->smb, wid, cfg->target_buffer, p->stall_budget_ms, &in->w) < 0) {
        hp_log_warn("producer: instance %llu: cannot set up a writer (%s)",
                    (unsigned long long)cfg->instance_id,
                    !p->smb ? "no shared memory buffer" : "no buffer or writer id");
        in->w = NULL;
        return;
    }
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_RegisterTraceWriterRequest_trace_writer_id_tag, wid);
    hp_pbw_uint_always(&a, perfetto_protos_RegisterTraceWriterRequest_target_buffer_tag,
                       cfg->target_buffer);
    invoke(p, PROD_M_REGISTER_TRACE_WRITER, &a, true, REQ_NONE);
    prod_writer_t *w = in->w;
    uint64_t id = cfg->instance_id;
    int r = p->cb.setup ? p->cb.setup(p->ctx, cfg, w) : -ENOTSUP;
    in = find_instance(p, id);
    if (r < 0 && in && in->w) {
        unregister_writer(p, in->w);
        atomic_store_explicit(&in->w->detached, true, memory_order_release);
        in->w = prod_writer_unref(in->w);
    }
}

static void handle_command(prod_t *p, const struct prod__command *c)
{
    struct instance *in;
    switch (c->kind) {
    case PROD_CMD_SETUP_TRACING:
        setup_tracing(p, c);
        break;
    case PROD_CMD_SETUP_DS:
        setup_ds(p, c);
        break;
    case PROD_CMD_START_DS:
        in = find_instance(p, c->config.instance_id);
        if (in && in->w && !in->started) {
            in->started = true;
            if (p->cb.start)
                p->cb.start(p->ctx, in->id);
        }
        break;
    case PROD_CMD_STOP_DS:
        in = find_instance(p, c->config.instance_id);
        if (in && in->w && !in->stopping) {
            in->stopping = true;
            if (p->cb.stop)
                p->cb.stop(p->ctx, in->id);
        } else if (!in || !in->w) {
            /* Unknown or refused: nothing to finish. */
            notify_stopped(p, c->config.instance_id);
            if (in)
                remove_instance(p, in);
        }
        break;
    case PROD_CMD_FLUSH: {
        if (hp_grow((void **)&p->flushes, &p->cap_flushes, p->n_flushes + 1, sizeof(*p->flushes)) <
            0)
            break; /* unacknowledged: traced counts the flush as failed */
        struct flush *f = &p->flushes[p->n_flushes++];
        f->req = c->request_id;
        f->n_ids = c->n_ids;
        memcpy(f->ids, c->ids, c->n_ids * sizeof(*c->ids));
        for (size_t i = 0; i < c->n_ids; i++) {
            in = find_instance(p, c->ids[i]);
            if (in && in->w)
                (void)prod__writer_flush(in->w, c->request_id);
        }
        check_flushes(p);
        break;
    }
    case PROD_CMD_CLEAR_STATE:
        for (size_t i = 0; i < c->n_ids; i++) {
            in = find_instance(p, c->ids[i]);
            if (in && in->w)
                atomic_store_explicit(&in->w->clear_req, true, memory_order_release);
        }
        break;
    case PROD_CMD_UNKNOWN:
        break;
    }
}

/* ---- receiving ----------------------------------------------------------------------- */

static bool take_req(prod_t *p, uint64_t id, enum req_kind *ret)
{
    for (size_t i = 0; i < p->n_reqs; i++) {
        if (p->reqs[i].id != id)
            continue;
        *ret = p->reqs[i].kind;
        if (*ret != REQ_ASYNC) /* a stream answers many times */
            p->reqs[i] = p->reqs[--p->n_reqs];
        return true;
    }
    return false;
}

static void handle_frame(void *ctx, const uint8_t *b, size_t len)
{
    prod_t *p = ctx;
    if (p->fd < 0)
        return; /* disconnected by an earlier frame of the same read */
    struct prod__frame f;
    enum req_kind kind;
    /* Undecodable frames are dropped, as Perfetto's IPC client does. */
    if (prod__decode_frame(b, len, &f) < 0 || !take_req(p, f.request_id, &kind))
        return;
    if (f.kind == PROD_FRAME_BIND_REPLY && kind == REQ_BIND) {
        if (prod__decode_bind_reply(f.msg, f.msg_len, &p->service_id, p->methods) < 0) {
            disconnect(p, "the service has no usable ProducerPort");
            return;
        }
        p->state = ST_INITIALIZING;
        send_init(p);
        return;
    }
    bool ok = f.kind == PROD_FRAME_INVOKE_REPLY && f.success;
    switch (kind) {
    case REQ_BIND:
        disconnect(p, "bind failed");
        break;
    case REQ_INIT:
        if (!ok) {
            disconnect(p, "InitializeConnection refused");
            break;
        }
        send_register(p);
        p->state = ST_READY;
        p->backoff_ms = BACKOFF_MIN_MS;
        p->stats.connections++;
        hp_log_info("producer: connected to %s, data source %s registered", p->sock_name,
                    p->ds_name);
        if (p->cb.connected)
            p->cb.connected(p->ctx);
        break;
    case REQ_REGISTER:
        if (!ok)
            disconnect(p, "RegisterDataSource refused");
        break;
    case REQ_ASYNC: {
        if (!ok) {
            disconnect(p, "GetAsyncCommand failed");
            break;
        }
        struct prod__command *c = malloc(sizeof(*c));
        if (c && prod__decode_command(f.reply, f.reply_len, c) == 0)
            handle_command(p, c);
        free(c);
        if (p->fd >= 0 && !f.has_more) {
            /* The stream ended (traced never does that while connected): ask again. */
            for (size_t i = 0; i < p->n_reqs; i++)
                if (p->reqs[i].id == f.request_id)
                    p->reqs[i] = p->reqs[--p->n_reqs];
            struct hp_pbw a = {0};
            invoke(p, PROD_M_GET_ASYNC_COMMAND, &a, false, REQ_ASYNC);
        }
        break;
    }
    case REQ_COMMIT:
        /* Answered (even a refusal): writers waiting for room look again. */
        if (p->smb)
            prod__smb_chunks_freed(p->smb);
        break;
    case REQ_NONE:
        break;
    }
}

static void read_socket(prod_t *p)
{
    for (;;) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * MAX_RX_FDS)];
            struct cmsghdr align;
        } cm;
        struct iovec iov = {p->rx + p->rx_len, PROD_IPC_MAX_FRAME - p->rx_len};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm)};
        ssize_t n = recvmsg(p->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            disconnect(p, strerror(errno));
            return;
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            const int *fds = (const int *)(void *)CMSG_DATA(c);
            for (size_t i = 0; i < nfds; i++) {
                /* Only the last one counts (Perfetto's client keeps the last fd). */
                if (p->received_fd >= 0)
                    (void)close(p->received_fd);
                p->received_fd = fds[i];
            }
        }
        if (n == 0) {
            disconnect(p, "closed by the service");
            return;
        }
        if (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) {
            disconnect(p, "truncated message");
            return;
        }
        p->rx_len += (size_t)n;
        long used = prod__split_frames(p->rx, p->rx_len, handle_frame, p);
        if (p->fd < 0)
            return;
        if (used < 0) {
            disconnect(p, "frame larger than 128 KiB");
            return;
        }
        memmove(p->rx, p->rx + used, p->rx_len - (size_t)used);
        p->rx_len -= (size_t)used;
    }
}

static void write_socket(prod_t *p)
{
    size_t off = 0;
    while (off < p->tx_len) {
        ssize_t n = send(p->fd, p->tx + off, p->tx_len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            disconnect(p, n < 0 ? strerror(errno) : "send failed");
            return;
        }
        off += (size_t)n;
    }
    memmove(p->tx, p->tx + off, p->tx_len - off);
    p->tx_len -= off;
    if (p->tx_len > TX_MAX)
        disconnect(p, "the service stopped reading");
}

/* ---- public ------------------------------------------------------------------------ */

int prod_new(const struct prod_options *o, const struct prod_callbacks *cb, void *ctx, prod_t **ret)
{
    prod_t *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fd = p->received_fd = -1;
    p->cb = *cb;
    p->ctx = ctx;
    resolve_name(o->socket_name, p->sock_name, sizeof(p->sock_name));
    p->producer_name = strdup(o->producer_name ? o->producer_name : "heapprof");
    p->ds_name = strdup(o->data_source_name ? o->data_source_name : "android.heapprofd");
    p->rx = malloc(PROD_IPC_MAX_FRAME);
    if (!p->producer_name || !p->ds_name || !p->rx) {
        prod_free(p);
        return -ENOMEM;
    }
    p->smb_size_hint = o->smb_size_hint_bytes;
    p->smb_page_hint = o->smb_page_size_hint_bytes;
    p->stall_budget_ms = o->stall_budget_ms ? o->stall_budget_ms : 2000;
    p->backoff_ms = BACKOFF_MIN_MS;
    p->reconnect_at_ns = 0; /* at once */
    *ret = p;
    return 0;
}

prod_t *prod_free(prod_t *p)
{
    if (!p)
        return NULL;
    p->cb.disconnected = NULL;
    if (p->fd >= 0 && p->tx_len)
        write_socket(p); /* last acks, best effort */
    disconnect(p, "closing");
    free(p->producer_name);
    free(p->ds_name);
    free(p->rx);
    free(p->tx);
    free(p->reqs);
    free(p->inst);
    free(p->flushes);
    free(p);
    return NULL;
}

size_t prod_pollfds(prod_t *p, struct pollfd *fds)
{
    size_t n = 0;
    if (p->fd >= 0)
        fds[n++] = (struct pollfd){p->fd, (short)(POLLIN | (p->tx_len ? POLLOUT : 0)), 0};
    if (p->smb)
        fds[n++] = (struct pollfd){p->smb->wake_fd, POLLIN, 0};
    return n;
}

int prod_timeout_ms(prod_t *p)
{
    if (p->state != ST_IDLE)
        return -1;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    if (now >= p->reconnect_at_ns)
        return 0;
    return (int)((p->reconnect_at_ns - now + 999999) / 1000000);
}

void prod_dispatch(prod_t *p)
{
    if (p->state == ST_IDLE && hp_clock_ns(CLOCK_MONOTONIC) >= p->reconnect_at_ns)
        try_connect(p);
    if (p->fd >= 0)
        read_socket(p);
    if (p->smb) {
        uint64_t v;
        (void)!read(p->smb->wake_fd, &v, sizeof(v));
        /* A writer waits for room: chunks idle writers keep half written go out now. */
        if (prod__smb_take_starved(p->smb))
            for (size_t i = 0; i < p->n_inst; i++)
                if (p->inst[i].w)
                    prod__writer_release_idle(p->inst[i].w);
        check_flushes(p);
        send_commits(p, 0);
    }
    if (p->fd >= 0 && p->tx_len)
        write_socket(p);
}

bool prod_connected(const prod_t *p)
{
    return p->state == ST_READY;
}

const char *prod_socket_name(const prod_t *p)
{
    return p->sock_name;
}

void prod_get_stats(const prod_t *p, struct prod_stats *ret)
{
    *ret = p->stats;
}
