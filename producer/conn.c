/* producer/conn.c: the connection to traced's producer socket and its state machine.
 *
 *     idle --connect--> binding --BindServiceReply--> initializing --init reply--> ready
 *       ^                  (InitializeConnection and GetAsyncCommand sent back to back)   |
 *       +------------- EOF, error, refused request: disconnect, retry after backoff ------+
 *
 * In `ready` the GetAsyncCommand stream brings SetupTracing (with the SMB's fd),
 * SetupDataSource, StartDataSource, StopDataSource, Flush and ClearIncrementalState:
 * SetupTracing maps the SMB here, the others go to the data source's instances
 * (data_source.c), which also commit the chunks the writers completed and acknowledge
 * flushes. The frames sent and the requests awaiting replies are kept by request.c.
 * Everything runs on the owner thread and nothing here waits: the socket is non-blocking
 * (traced drops a producer whose socket stays full for 10 ms), writes that do not fit
 * are queued.
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
#include "protos/data_source.pb.h"
#include "protos/ipc_frame.pb.h"
#include "protos/producer_port.pb.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 30000
/* Bytes queued for traced beyond which it is considered stuck. */
#define TX_MAX (8u << 20)
/* Descriptors taken per recvmsg (traced sends one, with SetupTracing); more are closed. */
#define MAX_RX_FDS 4

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

/* ---- connection lifecycle ------------------------------------------------------------ */

static void disconnect(prod_t *p, const char *why)
{
    if (p->fd < 0)
        return;
    bool had_session = p->state == PROD_CONN_READY;
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
    p->state = PROD_CONN_IDLE;
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
    p->state = PROD_CONN_BINDING;
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
        prod__send_frame(p, &fr);
    prod__track_req(p, id, PROD_REQ_BIND);
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
    prod__invoke(p, PROD_M_INITIALIZE_CONNECTION, &a, false, PROD_REQ_INIT);
    /* Pipelined, as Perfetto's client does: commands may follow the init reply at once. */
    prod__invoke(p, PROD_M_GET_ASYNC_COMMAND, &a, false, PROD_REQ_ASYNC);
}

static void send_register(prod_t *p)
{
    struct hp_pbw d = {0}, a = {0};
    hp_pbw_len(&d, perfetto_protos_DataSourceDescriptor_name_tag, p->ds_name, strlen(p->ds_name));
    hp_pbw_uint(&d, perfetto_protos_DataSourceDescriptor_will_notify_on_stop_tag, 1);
    hp_pbw_uint(&d, perfetto_protos_DataSourceDescriptor_handles_incremental_state_clear_tag, 1);
    hp_pbw_msg(&a, perfetto_protos_RegisterDataSourceRequest_data_source_descriptor_tag, &d);
    free(d.p);
    prod__invoke(p, PROD_M_REGISTER_DATA_SOURCE, &a, false, PROD_REQ_REGISTER);
}

/* ---- commands ------------------------------------------------------------------------ */

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

static void handle_command(prod_t *p, const struct prod__command *c)
{
    if (c->kind == PROD_CMD_SETUP_TRACING)
        setup_tracing(p, c);
    else
        prod__ds_command(p, c);
}

/* ---- receiving ----------------------------------------------------------------------- */

static void handle_frame(void *ctx, const uint8_t *b, size_t len)
{
    prod_t *p = ctx;
    if (p->fd < 0)
        return; /* disconnected by an earlier frame of the same read */
    struct prod__frame f;
    enum prod__req_kind kind;
    /* Undecodable frames are dropped, as Perfetto's IPC client does. */
    if (prod__decode_frame(b, len, &f) < 0 || !prod__take_req(p, f.request_id, &kind))
        return;
    if (f.kind == PROD_FRAME_BIND_REPLY && kind == PROD_REQ_BIND) {
        if (prod__decode_bind_reply(f.msg, f.msg_len, &p->service_id, p->methods) < 0) {
            disconnect(p, "the service has no usable ProducerPort");
            return;
        }
        p->state = PROD_CONN_INITIALIZING;
        send_init(p);
        return;
    }
    bool ok = f.kind == PROD_FRAME_INVOKE_REPLY && f.success;
    switch (kind) {
    case PROD_REQ_BIND:
        disconnect(p, "bind failed");
        break;
    case PROD_REQ_INIT:
        if (!ok) {
            disconnect(p, "InitializeConnection refused");
            break;
        }
        send_register(p);
        p->state = PROD_CONN_READY;
        p->backoff_ms = BACKOFF_MIN_MS;
        p->stats.connections++;
        hp_log_info("producer: connected to %s, data source %s registered", p->sock_name,
                    p->ds_name);
        if (p->cb.connected)
            p->cb.connected(p->ctx);
        break;
    case PROD_REQ_REGISTER:
        if (!ok)
            disconnect(p, "RegisterDataSource refused");
        break;
    case PROD_REQ_ASYNC: {
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
            prod__invoke(p, PROD_M_GET_ASYNC_COMMAND, &a, false, PROD_REQ_ASYNC);
        }
        break;
    }
    case PROD_REQ_COMMIT:
        /* Answered (even a refusal): writers waiting for room look again. */
        if (p->smb)
            prod__smb_chunks_freed(p->smb);
        break;
    case PROD_REQ_NONE:
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
    if (p->state != PROD_CONN_IDLE)
        return -1;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    if (now >= p->reconnect_at_ns)
        return 0;
    return (int)((p->reconnect_at_ns - now + 999999) / 1000000);
}

void prod_dispatch(prod_t *p)
{
    if (p->state == PROD_CONN_IDLE && hp_clock_ns(CLOCK_MONOTONIC) >= p->reconnect_at_ns)
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
        prod__check_flushes(p);
        prod__send_commits(p, 0);
    }
    if (p->fd >= 0 && p->tx_len)
        write_socket(p);
}

bool prod_connected(const prod_t *p)
{
    return p->state == PROD_CONN_READY;
}

const char *prod_socket_name(const prod_t *p)
{
    return p->sock_name;
}

void prod_get_stats(const prod_t *p, struct prod_stats *ret)
{
    *ret = p->stats;
}
