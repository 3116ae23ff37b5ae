/* tests/producer/fake_traced.c: see fake_traced.h. Field numbers are written out here
 * from Perfetto's protos (not taken from heapprof's generated headers), so a wrong
 * number in protos/ fails the tests instead of agreeing with itself. */
#include "tests/producer/fake_traced.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "common/pbwire.h"

#define MAX_FRAME (128u * 1024u)
#define SEND_TIMEOUT_MS 10
#define MAX_SESSIONS 16
#define MAX_WRITER 32767
#define DROP_SENTINEL 0x0fffffffu

/* ProducerPort methods in the declaration order of Perfetto v58.2. */
static const char *const methods[] = {
    "InitializeConnection",
    "RegisterDataSource",
    "UnregisterDataSource",
    "CommitData",
    "GetAsyncCommand",
    "RegisterTraceWriter",
    "UnregisterTraceWriter",
    "NotifyDataSourceStarted",
    "NotifyDataSourceStopped",
    "ActivateTriggers",
    "Sync",
    "UpdateDataSource",
};
enum {
    M_INIT,
    M_REGISTER_DS,
    M_UNREGISTER_DS,
    M_COMMIT,
    M_ASYNC,
    M_REGISTER_WRITER,
    M_UNREGISTER_WRITER,
    M_NOTIFY_STARTED,
    M_NOTIFY_STOPPED,
    M_TRIGGERS,
    M_SYNC,
    M_UPDATE_DS,
    N_METHODS
};

/* TracePacket fields a producer may not write (traced's packet stream validator). */
static const uint32_t reserved_fields[] = {3, 10, 33, 35, 36, 50, 69, 79, 98, 124, 125, 133};

struct chunk {
    uint64_t conn; /* connection generation: writer ids are per producer connection */
    uint16_t writer, flags, count;
    uint32_t id;
    bool needs_patch;
    uint32_t size; /* payload bytes */
    uint8_t *data;
};

struct session {
    bool used, stopped;
    uint32_t buffer;
    uint64_t instance; /* 0: no instance on the current connection */
    bool stopping, stop_acked;
    uint8_t *cfg;
    size_t cfg_len;
    char *output;
    uint32_t stop_timeout_ms;
    struct chunk *chunks;
    size_t n_chunks, cap_chunks;
};

struct held_commit {
    uint64_t req;
    bool drop_reply;
    uint8_t *args;
    size_t len;
};

struct ft {
    struct ft_options o;
    char path[108];
    char ds_name[64];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int listen_fd, client_fd, wake_fd;
    bool quit;
    uint32_t method_id[N_METHODS];

    /* the connection */
    uint64_t conn;
    int peer_uid, peer_pid;
    uint8_t *rx;
    size_t rx_len;
    bool initialized, registered;
    uint64_t async_req; /* 0: GetAsyncCommand not called */
    int smb_fd;
    uint8_t *smb;
    size_t smb_size, page_size;
    uint32_t writer_buffer[MAX_WRITER + 1];
    uint64_t last_flush_ack;

    struct session sessions[MAX_SESSIONS];
    uint32_t next_buffer;
    uint64_t next_instance, next_flush;
    bool stall;
    struct held_commit *held;
    size_t n_held;
    struct ft_stats st;
};

static uint64_t now_ms(void)
{
    return hp_clock_ns(CLOCK_MONOTONIC) / 1000000;
}

/* ---- sending ----------------------------------------------------------------------- */

static void drop_client_locked(ft_t *ft);

/* One frame in one sendmsg, with an optional fd, bounded by traced's 10 ms timeout. */
static void send_frame(ft_t *ft, const struct hp_pbw *f, int fd)
{
    if (ft->client_fd < 0 || f->oom)
        return;
    size_t total = 4 + f->len;
    uint8_t *buf = malloc(total);
    if (!buf)
        return;
    buf[0] = (uint8_t)f->len;
    buf[1] = (uint8_t)(f->len >> 8);
    buf[2] = (uint8_t)(f->len >> 16);
    buf[3] = (uint8_t)(f->len >> 24);
    memcpy(buf + 4, f->p, f->len);
    size_t off = 0;
    bool first = true;
    while (off < total) {
        struct iovec iov = {buf + off, total - off};
        union {
            char b[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (first && fd >= 0) {
            mh.msg_control = cm.b;
            mh.msg_controllen = sizeof(cm.b);
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        ssize_t n = sendmsg(ft->client_fd, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                ft->st.send_timeouts++;
            drop_client_locked(ft);
            break;
        }
        first = false;
        off += (size_t)n;
    }
    free(buf);
}

static void reply(ft_t *ft, uint64_t req, bool success, const struct hp_pbw *body, bool has_more,
                  int fd)
{
    struct hp_pbw r = {0}, f = {0};
    if (success)
        hp_pbw_uint(&r, 1, 1);
    if (has_more)
        hp_pbw_uint(&r, 2, 1);
    if (success)
        hp_pbw_len(&r, 3, body ? body->p : NULL, body ? body->len : 0);
    hp_pbw_uint_always(&f, 2, req);
    hp_pbw_msg(&f, 6, &r);
    send_frame(ft, &f, fd);
    free(r.p);
    free(f.p);
}

/* One GetAsyncCommandResponse with @cmd as oneof field @field. */
static void send_command(ft_t *ft, uint32_t field, struct hp_pbw *cmd, int fd)
{
    if (!ft->async_req)
        return; /* traced drops commands for producers without the stream */
    struct hp_pbw r = {0};
    hp_pbw_msg(&r, field, cmd);
    reply(ft, ft->async_req, true, &r, true, fd);
    free(r.p);
}

/* ---- SMB and sessions ----------------------------------------------------------------- */

static int make_smb(ft_t *ft)
{
    int fd = memfd_create("perfetto_shmem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)ft->smb_size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        (void)close(fd);
        return -errno;
    }
    void *m = mmap(NULL, ft->smb_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        (void)close(fd);
        return -errno;
    }
    ft->smb_fd = fd;
    ft->smb = m;
    return 0;
}

/* traced's choice of the SMB geometry: the trace config's (the fake's options), else the
 * producer's hints, else 256 KiB in 4 KiB pages; a page above 32 KiB is clamped, and so
 * is a size above 32 MiB; an invalid pair falls back to the defaults as a whole. */
static void choose_smb(ft_t *ft, uint64_t page_hint, uint64_t size_hint)
{
    uint64_t page = ft->o.page_size_bytes ? ft->o.page_size_bytes : page_hint;
    uint64_t size = ft->o.smb_size_bytes ? ft->o.smb_size_bytes : size_hint;
    if (page == 0)
        page = 4096;
    if (size == 0)
        size = 256u << 10;
    page = HP_MIN(page, (uint64_t)32768);
    size = HP_MIN(size, (uint64_t)32 << 20);
    uint64_t units = page / 4096;
    bool ok =
        page % 4096 == 0 && units && (units & (units - 1)) == 0 && size >= page && size % page == 0;
    ft->page_size = ok ? page : 4096;
    ft->smb_size = ok ? size : 256u << 10;
}

static void setup_instance(ft_t *ft, struct session *s)
{
    if (!ft->registered || s->stopped || s->instance || !ft->async_req)
        return;
    if (!ft->smb) {
        if (make_smb(ft) < 0)
            return;
        struct hp_pbw st = {0};
        hp_pbw_uint(&st, 1, ft->page_size / 1024);
        send_command(ft, 3, &st, ft->smb_fd);
        free(st.p);
    }
    s->instance = ++ft->next_instance;
    ft->st.instances++;
    struct hp_pbw cfg = {0}, cmd = {0};
    hp_pbw_len(&cfg, 1, ft->ds_name, strlen(ft->ds_name));
    hp_pbw_uint(&cfg, 2, s->buffer);
    hp_pbw_uint(&cfg, 4, 1000 + (uint64_t)(s - ft->sessions));
    hp_pbw_uint(&cfg, 7, s->stop_timeout_ms);
    if (s->cfg_len)
        hp_pbw_len(&cfg, 105, s->cfg, s->cfg_len);
    hp_pbw_uint(&cmd, 1, s->instance);
    struct hp_pbw copy = {0};
    hp_pbw_bytes(&copy, cfg.p, cfg.len);
    hp_pbw_msg(&cmd, 2, &cfg);
    send_command(ft, 6, &cmd, -1); /* SetupDataSource */
    hp_pbw_uint(&cmd, 1, s->instance);
    hp_pbw_msg(&cmd, 2, &copy);
    send_command(ft, 1, &cmd, -1); /* StartDataSource */
    free(cmd.p);
    free(cfg.p);
    free(copy.p);
}

static struct session *session_by_buffer(ft_t *ft, uint32_t buffer)
{
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (ft->sessions[i].used && ft->sessions[i].buffer == buffer)
            return &ft->sessions[i];
    return NULL;
}

static void drop_client_locked(ft_t *ft)
{
    if (ft->client_fd < 0)
        return;
    (void)close(ft->client_fd);
    ft->client_fd = -1;
    ft->initialized = ft->registered = false;
    ft->async_req = 0;
    ft->rx_len = 0;
    if (ft->smb) {
        (void)munmap(ft->smb, ft->smb_size);
        (void)close(ft->smb_fd);
        ft->smb = NULL;
        ft->smb_fd = -1;
    }
    memset(ft->writer_buffer, 0, sizeof(ft->writer_buffer));
    /* A producer that goes away has stopped all its instances. */
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = &ft->sessions[i];
        if (s->instance && s->stopping)
            s->stop_acked = true;
        s->instance = 0;
    }
    for (size_t i = 0; i < ft->n_held; i++)
        free(ft->held[i].args);
    ft->n_held = 0;
    pthread_cond_broadcast(&ft->cond);
}

/* ---- CommitData --------------------------------------------------------------------- */

static size_t layout_chunks(unsigned layout)
{
    static const size_t n[8] = {0, 1, 2, 4, 7, 14, 0, 0};
    return n[layout & 7];
}

static void store_chunk(ft_t *ft, uint32_t buffer, uint32_t id, uint16_t writer, uint16_t packets,
                        const uint8_t *payload, size_t size)
{
    if (writer == 0 || writer > MAX_WRITER) {
        ft->st.bad_writer_ids++;
        return;
    }
    struct session *s = session_by_buffer(ft, buffer);
    if (!s) {
        ft->st.chunks_discarded++;
        return;
    }
    if (s->stopped || s->stop_acked) {
        ft->st.late_chunks++;
        return;
    }
    if (ft->writer_buffer[writer] && ft->writer_buffer[writer] != buffer) {
        ft->st.chunks_discarded++;
        return;
    }
    for (size_t i = 0; i < s->n_chunks; i++) {
        const struct chunk *c = &s->chunks[i];
        if (c->conn == ft->conn && c->writer == writer && c->id == id) {
            ft->st.abi_violations++; /* a re-commit of a chunk already in the buffer */
            return;
        }
    }
    if (s->n_chunks == s->cap_chunks) {
        s->cap_chunks = s->cap_chunks ? s->cap_chunks * 2 : 256;
        s->chunks = realloc(s->chunks, s->cap_chunks * sizeof(*s->chunks));
    }
    struct chunk *c = &s->chunks[s->n_chunks++];
    *c = (struct chunk){.conn = ft->conn,
                        .writer = writer,
                        .id = id,
                        .count = packets & 0x3ff,
                        .flags = packets >> 10,
                        .size = (uint32_t)size};
    c->needs_patch = (c->flags & 4) != 0;
    c->data = malloc(size);
    memcpy(c->data, payload, size);
    ft->st.chunks_moved++;
}

/* Moves chunk @chunk of page @page as traced does: Complete -> BeingRead by CAS, copy,
 * clear the header, BeingRead -> Free, and the page word back to 0 once all are free. */
static void move_chunk(ft_t *ft, uint64_t page, uint64_t chunk, uint32_t buffer)
{
    size_t n_pages = ft->smb_size / ft->page_size;
    if (page >= n_pages) {
        ft->st.bad_commit_index++;
        return;
    }
    uint32_t *w = (uint32_t *)(void *)(ft->smb + page * ft->page_size);
    uint32_t old = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    unsigned layout = (old >> 28) & 7;
    size_t n = layout_chunks(layout);
    if (chunk >= n) {
        ft->st.bad_commit_index++;
        return;
    }
    unsigned sh = 2 * (unsigned)chunk;
    for (;;) {
        if (((old >> sh) & 3) != 3) {
            ft->st.not_complete_commits++; /* traced skips it silently */
            return;
        }
        uint32_t nw = (old & ~(3u << sh)) | 2u << sh;
        if (__atomic_compare_exchange_n(w, &old, nw, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            break;
    }
    size_t csize = ((ft->page_size - 8) / n) & ~(size_t)3;
    uint8_t *start = ft->smb + page * ft->page_size + 8 + chunk * csize;
    uint32_t id = __atomic_load_n((uint32_t *)(void *)start, __ATOMIC_RELAXED);
    uint16_t writer = __atomic_load_n((uint16_t *)(void *)(start + 4), __ATOMIC_RELAXED);
    uint16_t packets = __atomic_load_n((uint16_t *)(void *)(start + 6), __ATOMIC_ACQUIRE);
    store_chunk(ft, buffer, id, writer, packets, start + 8, csize - 8);
    __atomic_store_n((uint32_t *)(void *)start, 0, __ATOMIC_RELAXED);
    __atomic_store_n((uint16_t *)(void *)(start + 4), 0, __ATOMIC_RELAXED);
    __atomic_store_n((uint16_t *)(void *)(start + 6), 0, __ATOMIC_RELEASE);
    old = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t nw = old & ~(3u << sh);
        if ((nw & 0x0fffffffu) == 0)
            nw = 0; /* every chunk free: the page is unpartitioned again */
        if (__atomic_compare_exchange_n(w, &old, nw, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            break;
    }
}

static void apply_patch(ft_t *ft, const uint8_t *p, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t buffer = 0, writer = 0, id = 0;
    bool more = false;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_VARINT)
            continue;
        if (f.num == 1)
            buffer = f.varint;
        else if (f.num == 2)
            writer = f.varint;
        else if (f.num == 3)
            id = f.varint;
        else if (f.num == 5)
            more = f.varint != 0;
    }
    struct session *s = session_by_buffer(ft, (uint32_t)buffer);
    if (it.error || !s || writer == 0 || writer > MAX_WRITER) {
        ft->st.patches_discarded++;
        return;
    }
    struct chunk *c = NULL;
    for (size_t i = 0; i < s->n_chunks && !c; i++)
        if (s->chunks[i].conn == ft->conn && s->chunks[i].writer == writer && s->chunks[i].id == id)
            c = &s->chunks[i];
    if (!c) {
        ft->st.patches_failed++;
        return;
    }
    unsigned n = 0;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != 4 || f.wire_type != HP_PB_LEN)
            continue;
        uint64_t off = UINT64_MAX;
        const uint8_t *data = NULL;
        size_t dlen = 0;
        struct hp_pb_iter pi;
        struct hp_pb_field pf;
        hp_pb_iter_init(&pi, f.ptr, f.len);
        while (hp_pb_next(&pi, &pf)) {
            if (pf.num == 1 && pf.wire_type == HP_PB_VARINT)
                off = pf.varint;
            else if (pf.num == 2 && pf.wire_type == HP_PB_LEN) {
                data = pf.ptr;
                dlen = pf.len;
            }
        }
        if (++n > 1024 || dlen != 4 || off > c->size || c->size - off < 4) {
            ft->st.patches_discarded++;
            continue;
        }
        memcpy(c->data + off, data, 4);
    }
    if (!more)
        c->needs_patch = false;
}

static void commit(ft_t *ft, uint64_t req, bool drop_reply, const uint8_t *p, size_t len)
{
    ft->st.commits++;
    if (!ft->smb) {
        if (!drop_reply)
            reply(ft, req, false, NULL, false, -1);
        return;
    }
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t flush_id = 0;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 1 && f.wire_type == HP_PB_LEN) {
            uint64_t v[3] = {UINT64_MAX, UINT64_MAX, 0};
            struct hp_pb_iter mi;
            struct hp_pb_field mf;
            hp_pb_iter_init(&mi, f.ptr, f.len);
            while (hp_pb_next(&mi, &mf))
                if (mf.num >= 1 && mf.num <= 3 && mf.wire_type == HP_PB_VARINT)
                    v[mf.num - 1] = mf.varint;
            move_chunk(ft, v[0], v[1], (uint32_t)v[2]);
        } else if (f.num == 3 && f.wire_type == HP_PB_VARINT) {
            flush_id = f.varint;
        }
    }
    /* Patches after the moves of the same request. */
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f))
        if (f.num == 2 && f.wire_type == HP_PB_LEN)
            apply_patch(ft, f.ptr, f.len);
    if (it.error)
        ft->st.bad_requests++;
    if (flush_id > ft->last_flush_ack)
        ft->last_flush_ack = flush_id;
    if (!drop_reply)
        reply(ft, req, true, NULL, false, -1);
    pthread_cond_broadcast(&ft->cond);
}

/* ---- frames from the producer ----------------------------------------------------- */

static bool str_eq(const struct hp_pb_field *f, const char *s)
{
    return f->len == strlen(s) && memcmp(f->ptr, s, f->len) == 0;
}

static void invoke(ft_t *ft, uint64_t req, uint64_t method_id, const uint8_t *args, size_t len,
                   bool drop_reply)
{
    int m = -1;
    for (int i = 0; i < N_METHODS; i++)
        if (ft->method_id[i] == method_id)
            m = i;
    if (m < 0) {
        ft->st.bad_requests++;
        reply(ft, req, false, NULL, false, -1);
        return;
    }
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, args, len);
    while (hp_pb_next(&it, &f))
        ;
    if (it.error) {
        ft->st.bad_requests++;
        reply(ft, req, false, NULL, false, -1);
        return;
    }
    if (m != M_INIT && !ft->initialized) {
        ft->st.calls_before_init++;
        reply(ft, req, false, NULL, false, -1);
        return;
    }
    bool ok = true;
    switch (m) {
    case M_INIT: {
        if (ft->initialized) {
            ft->st.bad_requests++;
            ok = false;
            break;
        }
        ft->initialized = true;
        uint64_t page_hint = 0, size_hint = 0;
        hp_pb_iter_init(&it, args, len);
        while (hp_pb_next(&it, &f)) {
            if (f.num == 1 && f.wire_type == HP_PB_VARINT)
                page_hint = f.varint;
            else if (f.num == 2 && f.wire_type == HP_PB_VARINT)
                size_hint = f.varint;
        }
        choose_smb(ft, page_hint, size_hint);
        struct hp_pbw r = {0};
        hp_pbw_uint_always(&r, 1, 0);
        hp_pbw_uint_always(&r, 2, 1); /* direct_smb_patching_supported */
        hp_pbw_uint_always(&r, 3, 0);
        if (!drop_reply)
            reply(ft, req, true, &r, false, -1);
        free(r.p);
        return;
    }
    case M_REGISTER_DS:
        hp_pb_iter_init(&it, args, len);
        while (hp_pb_next(&it, &f)) {
            if (f.num != 1 || f.wire_type != HP_PB_LEN)
                continue;
            struct hp_pb_iter di;
            struct hp_pb_field df;
            hp_pb_iter_init(&di, f.ptr, f.len);
            while (hp_pb_next(&di, &df))
                if (df.num == 1 && df.wire_type == HP_PB_LEN && str_eq(&df, ft->ds_name))
                    ft->registered = true;
        }
        break;
    case M_UNREGISTER_DS:
        ft->registered = false;
        break;
    case M_COMMIT:
        if (ft->stall) {
            ft->held = realloc(ft->held, (ft->n_held + 1) * sizeof(*ft->held));
            struct held_commit *h = &ft->held[ft->n_held++];
            h->req = req;
            h->drop_reply = drop_reply;
            h->args = malloc(len ? len : 1);
            memcpy(h->args, args, len);
            h->len = len;
            return;
        }
        commit(ft, req, drop_reply, args, len);
        return;
    case M_ASYNC:
        ft->async_req = req;
        return; /* answered by commands */
    case M_REGISTER_WRITER:
    case M_UNREGISTER_WRITER: {
        uint64_t id = 0, buffer = 0;
        hp_pb_iter_init(&it, args, len);
        while (hp_pb_next(&it, &f)) {
            if (f.num == 1 && f.wire_type == HP_PB_VARINT)
                id = f.varint;
            else if (f.num == 2 && f.wire_type == HP_PB_VARINT)
                buffer = f.varint;
        }
        if (id == 0 || id > MAX_WRITER) {
            ft->st.bad_writer_ids++;
            ok = false;
        } else {
            ft->writer_buffer[id] = m == M_REGISTER_WRITER ? (uint32_t)buffer : 0;
        }
        break;
    }
    case M_NOTIFY_STOPPED: {
        uint64_t id = 0;
        hp_pb_iter_init(&it, args, len);
        while (hp_pb_next(&it, &f))
            if (f.num == 1 && f.wire_type == HP_PB_VARINT)
                id = f.varint;
        bool found = false;
        for (int i = 0; i < MAX_SESSIONS; i++) {
            struct session *s = &ft->sessions[i];
            if (s->used && s->instance == id && s->stopping) {
                s->stop_acked = true;
                found = true;
                ft->st.stops_acked++;
            }
        }
        if (!found)
            ft->st.unknown_stop_acks++;
        break;
    }
    default:
        break;
    }
    if (!drop_reply)
        reply(ft, req, ok, NULL, false, -1);
    if (m == M_REGISTER_DS && ft->registered)
        for (int i = 0; i < MAX_SESSIONS; i++)
            if (ft->sessions[i].used)
                setup_instance(ft, &ft->sessions[i]);
    pthread_cond_broadcast(&ft->cond);
}

static void frame(ft_t *ft, const uint8_t *p, size_t len)
{
    ft->st.frames_in++;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint64_t req = 0;
    const uint8_t *bind = NULL, *inv = NULL;
    size_t bind_len = 0, inv_len = 0;
    bool any = false;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 2 && f.wire_type == HP_PB_VARINT)
            req = f.varint;
        else if (f.num == 3 && f.wire_type == HP_PB_LEN) {
            bind = f.ptr;
            bind_len = f.len;
            inv = NULL;
            any = true;
        } else if (f.num == 5 && f.wire_type == HP_PB_LEN) {
            inv = f.ptr;
            inv_len = f.len;
            bind = NULL;
            any = true;
        } else if (f.num >= 4 && f.num <= 7) {
            any = true; /* host-to-client messages: not ours to receive */
        }
    }
    if (it.error) {
        ft->st.bad_requests++; /* traced drops the frame silently */
        return;
    }
    if (!any) {
        struct hp_pbw e = {0}, fr = {0};
        static const char msg[] = "unknown request";
        hp_pbw_len(&e, 1, msg, sizeof(msg) - 1);
        hp_pbw_uint_always(&fr, 2, req);
        hp_pbw_msg(&fr, 7, &e);
        send_frame(ft, &fr, -1);
        free(e.p);
        free(fr.p);
        ft->st.bad_requests++;
        return;
    }
    if (bind) {
        bool ok = false;
        hp_pb_iter_init(&it, bind, bind_len);
        while (hp_pb_next(&it, &f))
            if (f.num == 1 && f.wire_type == HP_PB_LEN && str_eq(&f, "ProducerPort"))
                ok = true;
        struct hp_pbw r = {0}, mi = {0}, fr = {0};
        if (ok) {
            hp_pbw_uint(&r, 1, 1);
            hp_pbw_uint(&r, 2, 1);
            for (int i = 0; i < N_METHODS; i++) {
                hp_pbw_uint(&mi, 1, ft->method_id[i]);
                hp_pbw_len(&mi, 2, methods[i], strlen(methods[i]));
                hp_pbw_msg(&r, 3, &mi);
            }
        } else {
            ft->st.bad_requests++;
        }
        hp_pbw_uint_always(&fr, 2, req);
        hp_pbw_msg(&fr, 4, &r);
        send_frame(ft, &fr, -1);
        free(r.p);
        free(mi.p);
        free(fr.p);
        return;
    }
    if (!inv) {
        ft->st.bad_requests++;
        return;
    }
    uint64_t service = 0, method = 0;
    const uint8_t *args = NULL;
    size_t args_len = 0;
    bool drop_reply = false;
    hp_pb_iter_init(&it, inv, inv_len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == 1 && f.wire_type == HP_PB_VARINT)
            service = f.varint;
        else if (f.num == 2 && f.wire_type == HP_PB_VARINT)
            method = f.varint;
        else if (f.num == 3 && f.wire_type == HP_PB_LEN) {
            args = f.ptr;
            args_len = f.len;
        } else if (f.num == 4 && f.wire_type == HP_PB_VARINT)
            drop_reply = f.varint != 0;
    }
    if (it.error || service != 1) {
        ft->st.bad_requests++;
        reply(ft, req, false, NULL, false, -1);
        return;
    }
    invoke(ft, req, method, args ? args : (const uint8_t *)"", args_len, drop_reply);
}

static void read_client(ft_t *ft)
{
    for (;;) {
        ssize_t n = recv(ft->client_fd, ft->rx + ft->rx_len, MAX_FRAME - ft->rx_len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            drop_client_locked(ft);
            return;
        }
        ft->rx_len += (size_t)n;
        size_t off = 0;
        while (ft->rx_len - off >= 4) {
            const uint8_t *h = ft->rx + off;
            uint32_t len =
                (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
            if ((uint64_t)len + 4 > MAX_FRAME) {
                ft->st.frame_too_large++; /* "IPC Frame too large": connection dropped */
                drop_client_locked(ft);
                return;
            }
            if (ft->rx_len - off - 4 < len)
                break;
            if (len)
                frame(ft, h + 4, len);
            if (ft->client_fd < 0)
                return;
            off += 4 + len;
        }
        memmove(ft->rx, ft->rx + off, ft->rx_len - off);
        ft->rx_len -= off;
    }
}

static void *serve(void *arg)
{
    ft_t *ft = arg;
    for (;;) {
        struct pollfd pfd[3] = {{ft->wake_fd, POLLIN, 0}, {ft->listen_fd, POLLIN, 0}, {-1, 0, 0}};
        pthread_mutex_lock(&ft->lock);
        if (ft->quit) {
            pthread_mutex_unlock(&ft->lock);
            return NULL;
        }
        pfd[2].fd = ft->client_fd;
        pfd[2].events = POLLIN;
        pthread_mutex_unlock(&ft->lock);
        if (poll(pfd, 3, 100) < 0 && errno != EINTR)
            return NULL;
        pthread_mutex_lock(&ft->lock);
        if (pfd[0].revents) {
            uint64_t v;
            (void)!read(ft->wake_fd, &v, sizeof(v));
        }
        if (pfd[1].revents & POLLIN) {
            int fd = accept4(ft->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0 && ft->client_fd >= 0) {
                (void)close(fd); /* one producer at a time */
            } else if (fd >= 0) {
                struct ucred cr;
                socklen_t cl = sizeof(cr);
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0) {
                    ft->peer_uid = (int)cr.uid;
                    ft->peer_pid = (int)cr.pid;
                }
                struct timeval tv = {0, SEND_TIMEOUT_MS * 1000};
                (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
                ft->client_fd = fd;
                ft->conn++;
                ft->st.connections++;
            }
        }
        if (ft->client_fd >= 0 && pfd[2].fd == ft->client_fd && pfd[2].revents)
            read_client(ft);
        pthread_cond_broadcast(&ft->cond);
        pthread_mutex_unlock(&ft->lock);
    }
}

/* ---- reading the buffer back ------------------------------------------------------- */

struct out {
    FILE *f;
    ft_t *ft;
};

static void write_packet(FILE *f, const uint8_t *p, size_t len)
{
    uint8_t hdr[1 + HP_PB_VARINT_MAX];
    size_t h = hp_pb_put_packet_header(hdr, len);
    fwrite(hdr, 1, h, f);
    fwrite(p, 1, len, f);
}

static bool is_reserved(uint32_t num)
{
    for (size_t i = 0; i < HP_ARRAY_SIZE(reserved_fields); i++)
        if (reserved_fields[i] == num)
            return true;
    return false;
}

/* Validates a reassembled packet and writes it with the trusted fields. */
static void emit(struct out *o, uint32_t seq, bool first, const uint8_t *p, size_t len)
{
    ft_t *ft = o->ft;
    if (len == 0)
        return;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    bool bad = false, dropped = false;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (is_reserved(f.num)) {
            ft->st.reserved_fields++;
            bad = true;
        }
        if (f.num == 42 && f.wire_type == HP_PB_VARINT && f.varint)
            dropped = true;
    }
    if (bad || it.error) {
        ft->st.invalid_packets++;
        return;
    }
    ft->st.previous_packet_dropped += dropped;
    struct hp_pbw w = {0};
    hp_pbw_bytes(&w, p, len);
    hp_pbw_uint_always(&w, 3, (uint64_t)(uint32_t)ft->peer_uid);
    hp_pbw_uint_always(&w, 10, seq);
    hp_pbw_uint_always(&w, 79, (uint64_t)(uint32_t)ft->peer_pid);
    if (first)
        hp_pbw_uint_always(&w, 42, 1);
    write_packet(o->f, w.p, w.len);
    free(w.p);
    ft->st.packets++;
}

static int by_writer_then_id(const void *a, const void *b)
{
    const struct chunk *x = a, *y = b;
    if (x->conn != y->conn)
        return x->conn < y->conn ? -1 : 1;
    if (x->writer != y->writer)
        return x->writer < y->writer ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Reads one writer's chunks [@from, @to) (sorted by id) as TraceBufferV1 does. */
static void read_sequence(struct out *o, uint32_t seq, struct chunk *c, size_t n)
{
    ft_t *ft = o->ft;
    uint8_t *partial = NULL;
    size_t partial_len = 0;
    bool have_partial = false, first = true;
    for (size_t k = 0; k < n; k++) {
        const struct chunk *ch = &c[k];
        if (k > 0 && ch->id != c[k - 1].id + 1) {
            ft->st.sequence_gaps++; /* later chunks stay unread */
            break;
        }
        if (ch->needs_patch) {
            ft->st.unpatched_chunks++;
            break;
        }
        ft->st.chunks_read++;
        size_t pos = 0;
        for (unsigned i = 0; i < ch->count; i++) {
            if (pos >= ch->size) {
                ft->st.abi_violations++;
                break;
            }
            uint64_t size = 0;
            size_t h = 0;
            bool more = true;
            while (more && h < 4 && pos + h < ch->size) {
                uint8_t b = ch->data[pos + h];
                size |= (uint64_t)(b & 0x7f) << (7 * h);
                more = b & 0x80;
                h++;
            }
            if (more) {
                ft->st.abi_violations++; /* a size of more than 4 bytes, or cut */
                break;
            }
            if (size == DROP_SENTINEL) {
                ft->st.trace_writer_packet_loss++;
                have_partial = false;
                partial_len = 0;
                break;
            }
            if (size > ch->size - pos - h) {
                ft->st.abi_violations++;
                break;
            }
            const uint8_t *frag = ch->data + pos + h;
            pos += h + size;
            bool is_first = i == 0, is_last = i + 1 == ch->count;
            bool cont_from = is_first && (ch->flags & 1);
            bool cont_on = is_last && (ch->flags & 2);
            if (cont_from) {
                if (!have_partial) {
                    ft->st.reassembly_failures++; /* continuation of nothing */
                    continue;
                }
            } else if (have_partial) {
                ft->st.reassembly_failures++; /* the previous chunk promised more */
                have_partial = false;
                partial_len = 0;
            }
            if (cont_from || cont_on) {
                partial = realloc(partial, partial_len + size + 1);
                memcpy(partial + partial_len, frag, size);
                partial_len += size;
                have_partial = true;
                if (cont_on)
                    continue;
                emit(o, seq, first, partial, partial_len);
                first = false;
                have_partial = false;
                partial_len = 0;
                continue;
            }
            emit(o, seq, first, frag, size);
            first = false;
        }
    }
    if (have_partial)
        ft->st.reassembly_failures++; /* the sequence ends inside a packet */
    free(partial);
}

static void write_trace(ft_t *ft, struct session *s)
{
    if (!s->output)
        return;
    FILE *f = fopen(s->output, "we");
    if (!f)
        return;
    struct out o = {f, ft};
    uint64_t boot = hp_clock_ns(CLOCK_BOOTTIME);
    uint64_t coarse = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t mono = hp_clock_ns(CLOCK_MONOTONIC);
    /* traced's own sequence 1: a clock snapshot, with Perfetto's BuiltinClock ids: BOOTTIME
     * (6), MONOTONIC_COARSE (4), MONOTONIC (3). */
    struct hp_pbw pkt = {0}, cs = {0}, clk = {0};
    const uint64_t clocks[3][2] = {{6, boot}, {4, coarse}, {3, mono}};
    for (int i = 0; i < 3; i++) {
        hp_pbw_uint_always(&clk, 1, clocks[i][0]);
        hp_pbw_uint_always(&clk, 2, clocks[i][1]);
        hp_pbw_msg(&cs, 1, &clk);
    }
    hp_pbw_uint_always(&cs, 2, 6);
    hp_pbw_uint_always(&pkt, 8, boot);
    hp_pbw_msg(&pkt, 6, &cs);
    hp_pbw_uint_always(&pkt, 10, 1);
    hp_pbw_uint_always(&pkt, 3, (uint64_t)getuid());
    /* Heapprof's trace checker wants every sequence to start with a cleared state. */
    hp_pbw_uint_always(&pkt, 13, 1);
    write_packet(f, pkt.p, pkt.len);
    free(pkt.p);
    free(cs.p);
    free(clk.p);
    pkt = (struct hp_pbw){0};

    if (s->n_chunks)
        qsort(s->chunks, s->n_chunks, sizeof(*s->chunks), by_writer_then_id);
    uint32_t seq = 2;
    for (size_t i = 0; i < s->n_chunks;) {
        size_t j = i;
        while (j < s->n_chunks && s->chunks[j].conn == s->chunks[i].conn &&
               s->chunks[j].writer == s->chunks[i].writer)
            j++;
        read_sequence(&o, seq++, s->chunks + i, j - i);
        ft->st.sequences++;
        i = j;
    }

    /* trace_stats (field 35) on sequence 1. */
    struct hp_pbw ts = {0}, bs = {0};
    hp_pbw_uint_always(&bs, 2, s->n_chunks);
    hp_pbw_uint_always(&bs, 17, ft->st.chunks_read);
    hp_pbw_uint_always(&bs, 9, ft->st.abi_violations);
    hp_pbw_uint_always(&bs, 19, ft->st.trace_writer_packet_loss);
    hp_pbw_uint_always(&bs, 6, ft->st.patches_failed);
    hp_pbw_msg(&ts, 1, &bs);
    hp_pbw_uint_always(&ts, 8, ft->st.chunks_discarded);
    hp_pbw_uint_always(&ts, 9, ft->st.patches_discarded);
    hp_pbw_uint_always(&ts, 10, ft->st.invalid_packets);
    hp_pbw_uint_always(&ts, 13, ft->st.flushes_acked);
    hp_pbw_uint_always(&ts, 14, ft->st.flushes_failed);
    hp_pbw_uint_always(&pkt, 8, hp_clock_ns(CLOCK_BOOTTIME));
    hp_pbw_msg(&pkt, 35, &ts);
    hp_pbw_uint_always(&pkt, 10, 1);
    write_packet(f, pkt.p, pkt.len);
    free(pkt.p);
    free(ts.p);
    free(bs.p);
    fclose(f);
}

/* ---- control ----------------------------------------------------------------------- */

static bool wait_until(ft_t *ft, uint64_t deadline_ms, bool (*cond)(ft_t *ft, void *arg), void *arg)
{
    while (!cond(ft, arg)) {
        uint64_t now = now_ms();
        if (now >= deadline_ms)
            return false;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t rel = HP_MIN(deadline_ms - now, (uint64_t)50);
        ts.tv_nsec += (long)(rel * 1000000);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&ft->cond, &ft->lock, &ts);
    }
    return true;
}

int ft_new(const struct ft_options *o, ft_t **ret)
{
    ft_t *ft = calloc(1, sizeof(*ft));
    if (!ft)
        return -ENOMEM;
    ft->o = *o;
    snprintf(ft->path, sizeof(ft->path), "%s", o->socket_path);
    snprintf(ft->ds_name, sizeof(ft->ds_name), "%s",
             o->data_source ? o->data_source : "android.heapprofd");
    choose_smb(ft, 0, 0);
    ft->client_fd = ft->smb_fd = -1;
    ft->next_buffer = 1;
    for (int i = 0; i < N_METHODS; i++)
        ft->method_id[i] = o->shuffle_methods ? (uint32_t)(N_METHODS - i) : (uint32_t)(i + 1);
    ft->rx = malloc(MAX_FRAME);
    pthread_mutex_init(&ft->lock, NULL);
    pthread_cond_init(&ft->cond, NULL);
    ft->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ft->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", ft->path);
    (void)unlink(ft->path);
    if (!ft->rx || ft->wake_fd < 0 || ft->listen_fd < 0 ||
        bind(ft->listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ft->listen_fd, 8) < 0 ||
        pthread_create(&ft->thread, NULL, serve, ft) != 0) {
        int r = -errno;
        if (ft->listen_fd >= 0)
            (void)close(ft->listen_fd);
        if (ft->wake_fd >= 0)
            (void)close(ft->wake_fd);
        free(ft->rx);
        free(ft);
        return r ? r : -EIO;
    }
    *ret = ft;
    return 0;
}

ft_t *ft_free(ft_t *ft)
{
    if (!ft)
        return NULL;
    pthread_mutex_lock(&ft->lock);
    ft->quit = true;
    pthread_mutex_unlock(&ft->lock);
    uint64_t one = 1;
    (void)!write(ft->wake_fd, &one, sizeof(one));
    pthread_join(ft->thread, NULL);
    drop_client_locked(ft);
    (void)close(ft->listen_fd);
    (void)unlink(ft->path);
    (void)close(ft->wake_fd);
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = &ft->sessions[i];
        for (size_t k = 0; k < s->n_chunks; k++)
            free(s->chunks[k].data);
        free(s->chunks);
        free(s->cfg);
        free(s->output);
    }
    free(ft->held);
    free(ft->rx);
    pthread_cond_destroy(&ft->cond);
    pthread_mutex_destroy(&ft->lock);
    free(ft);
    return NULL;
}

static bool is_registered(ft_t *ft, void *arg)
{
    (void)arg;
    return ft->registered;
}

bool ft_wait_producer(ft_t *ft, int timeout_ms)
{
    pthread_mutex_lock(&ft->lock);
    bool ok = wait_until(ft, now_ms() + (uint64_t)timeout_ms, is_registered, NULL);
    pthread_mutex_unlock(&ft->lock);
    return ok;
}

int ft_start_session(ft_t *ft, const struct ft_session_config *cfg)
{
    pthread_mutex_lock(&ft->lock);
    int idx = -1;
    for (int i = 0; i < MAX_SESSIONS && idx < 0; i++)
        if (!ft->sessions[i].used)
            idx = i;
    if (idx >= 0) {
        struct session *s = &ft->sessions[idx];
        memset(s, 0, sizeof(*s));
        s->used = true;
        s->buffer = ft->next_buffer++;
        s->stop_timeout_ms = cfg->stop_timeout_ms    ? cfg->stop_timeout_ms
                             : ft->o.stop_timeout_ms ? ft->o.stop_timeout_ms
                                                     : 5000;
        if (cfg->heapprofd_config_len) {
            s->cfg = malloc(cfg->heapprofd_config_len);
            memcpy(s->cfg, cfg->heapprofd_config, cfg->heapprofd_config_len);
            s->cfg_len = cfg->heapprofd_config_len;
        }
        s->output = cfg->output ? strdup(cfg->output) : NULL;
        setup_instance(ft, s);
    }
    pthread_mutex_unlock(&ft->lock);
    return idx;
}

struct flush_wait {
    uint64_t id;
    uint64_t conn;
};

static bool flush_acked(ft_t *ft, void *arg)
{
    const struct flush_wait *w = arg;
    return ft->last_flush_ack >= w->id || ft->conn != w->conn || ft->client_fd < 0;
}

/* pre: lock held. */
static bool flush_locked(ft_t *ft, struct session *s, uint64_t flags, int timeout_ms)
{
    if (!s->instance || ft->client_fd < 0)
        return false;
    struct flush_wait w = {++ft->next_flush, ft->conn};
    struct hp_pbw fl = {0};
    hp_pbw_uint_always(&fl, 1, s->instance); /* repeated, unpacked */
    hp_pbw_uint_always(&fl, 2, w.id);
    hp_pbw_uint_always(&fl, 3, flags);
    send_command(ft, 5, &fl, -1);
    free(fl.p);
    bool ok = wait_until(ft, now_ms() + (uint64_t)timeout_ms, flush_acked, &w) &&
              ft->last_flush_ack >= w.id;
    if (ok)
        ft->st.flushes_acked++;
    else
        ft->st.flushes_failed++;
    return ok;
}

bool ft_flush(ft_t *ft, int session, int timeout_ms)
{
    pthread_mutex_lock(&ft->lock);
    /* Flags 0x14: reason explicit (4), initiator traced (1 << 4). */
    bool ok = flush_locked(ft, &ft->sessions[session], 0x14, timeout_ms);
    pthread_mutex_unlock(&ft->lock);
    return ok;
}

void ft_flood_flushes(ft_t *ft, int session, int n)
{
    pthread_mutex_lock(&ft->lock);
    struct session *s = &ft->sessions[session];
    for (int i = 0; i < n && s->instance && ft->client_fd >= 0; i++) {
        struct hp_pbw fl = {0};
        hp_pbw_uint_always(&fl, 1, s->instance);
        hp_pbw_uint_always(&fl, 2, ++ft->next_flush);
        /* Padding in an unknown field makes each command big. */
        static uint8_t pad[4096];
        hp_pbw_len(&fl, 100, pad, sizeof(pad));
        send_command(ft, 5, &fl, -1);
        free(fl.p);
    }
    pthread_mutex_unlock(&ft->lock);
}

void ft_clear_incremental_state(ft_t *ft, int session)
{
    pthread_mutex_lock(&ft->lock);
    struct session *s = &ft->sessions[session];
    if (s->instance) {
        struct hp_pbw c = {0};
        hp_pbw_uint_always(&c, 1, s->instance);
        send_command(ft, 7, &c, -1);
        free(c.p);
    }
    pthread_mutex_unlock(&ft->lock);
}

static bool stop_acked(ft_t *ft, void *arg)
{
    const struct session *s = arg;
    (void)ft;
    return s->stop_acked;
}

bool ft_stop_session(ft_t *ft, int session)
{
    pthread_mutex_lock(&ft->lock);
    struct session *s = &ft->sessions[session];
    bool ok = true;
    if (s->instance && ft->client_fd >= 0) {
        /* As traced ends a session: a final flush (reason trace stop, initiator traced),
         * then StopDataSource, then the wait for the producer's ack. */
        uint32_t flush_ms = ft->o.flush_timeout_ms ? ft->o.flush_timeout_ms : 5000;
        (void)flush_locked(ft, s, 0x12, (int)flush_ms);
        s->stopping = true;
        struct hp_pbw st = {0};
        hp_pbw_uint_always(&st, 1, s->instance);
        send_command(ft, 2, &st, -1);
        free(st.p);
        ok = wait_until(ft, now_ms() + s->stop_timeout_ms, stop_acked, s);
        if (!ok)
            ft->st.stops_timed_out++;
    }
    s->stop_acked = true; /* later commits are late */
    s->stopped = true;
    write_trace(ft, s);
    for (size_t k = 0; k < s->n_chunks; k++)
        free(s->chunks[k].data);
    s->n_chunks = 0;
    s->instance = 0;
    pthread_mutex_unlock(&ft->lock);
    return ok;
}

void ft_stall_commits(ft_t *ft, bool stall)
{
    pthread_mutex_lock(&ft->lock);
    ft->stall = stall;
    if (!stall) {
        for (size_t i = 0; i < ft->n_held && ft->client_fd >= 0; i++)
            commit(ft, ft->held[i].req, ft->held[i].drop_reply, ft->held[i].args, ft->held[i].len);
        for (size_t i = 0; i < ft->n_held; i++)
            free(ft->held[i].args);
        ft->n_held = 0;
    }
    pthread_mutex_unlock(&ft->lock);
}

void ft_drop_producer(ft_t *ft)
{
    pthread_mutex_lock(&ft->lock);
    drop_client_locked(ft);
    pthread_mutex_unlock(&ft->lock);
}

void ft_get_stats(ft_t *ft, struct ft_stats *ret)
{
    pthread_mutex_lock(&ft->lock);
    *ret = ft->st;
    pthread_mutex_unlock(&ft->lock);
}

#define STAT_FIELDS(X)                                                                             \
    X(connections)                                                                                 \
    X(frames_in)                                                                                   \
    X(commits)                                                                                     \
    X(chunks_moved)                                                                                \
    X(chunks_read)                                                                                 \
    X(packets)                                                                                     \
    X(sequences)                                                                                   \
    X(flushes_acked)                                                                               \
    X(flushes_failed)                                                                              \
    X(stops_acked)                                                                                 \
    X(stops_timed_out)                                                                             \
    X(trace_writer_packet_loss)                                                                    \
    X(previous_packet_dropped)                                                                     \
    X(instances)                                                                                   \
    X(frame_too_large)                                                                             \
    X(calls_before_init)                                                                           \
    X(bad_requests)                                                                                \
    X(not_complete_commits)                                                                        \
    X(bad_commit_index)                                                                            \
    X(chunks_discarded)                                                                            \
    X(bad_writer_ids)                                                                              \
    X(abi_violations)                                                                              \
    X(invalid_packets)                                                                             \
    X(reserved_fields)                                                                             \
    X(sequence_gaps)                                                                               \
    X(unpatched_chunks)                                                                            \
    X(patches_discarded)                                                                           \
    X(patches_failed)                                                                              \
    X(reassembly_failures)                                                                         \
    X(late_chunks)                                                                                 \
    X(unknown_stop_acks)                                                                           \
    X(send_timeouts)

uint64_t ft_violations(const struct ft_stats *s)
{
    return s->frame_too_large + s->calls_before_init + s->bad_requests + s->not_complete_commits +
           s->bad_commit_index + s->chunks_discarded + s->bad_writer_ids + s->abi_violations +
           s->invalid_packets + s->reserved_fields + s->sequence_gaps + s->unpatched_chunks +
           s->patches_discarded + s->patches_failed + s->reassembly_failures + s->late_chunks +
           s->unknown_stop_acks + s->send_timeouts;
}

void ft_print_stats(const struct ft_stats *s, void (*out)(void *ctx, const char *line), void *ctx)
{
    char line[96];
#define X(name)                                                                                    \
    if (s->name) {                                                                                 \
        snprintf(line, sizeof(line), #name "=%llu", (unsigned long long)s->name);                  \
        out(ctx, line);                                                                            \
    }
    STAT_FIELDS(X)
#undef X
}

void ft_fuzz_smb(const uint8_t *data, size_t len)
{
    static ft_t ft;
    memset(&ft, 0, sizeof(ft));
    ft.page_size = 4096;
    ft.smb_size = len / ft.page_size * ft.page_size;
    if (ft.smb_size == 0)
        return;
    ft.smb = malloc(ft.smb_size);
    memcpy(ft.smb, data, ft.smb_size);
    ft.client_fd = -1;
    ft.conn = 1;
    struct session *s = &ft.sessions[0];
    s->used = true;
    s->buffer = 1;
    s->output = strdup("/dev/null");
    /* Whatever state the pages claim: commit every chunk index of every page. */
    for (size_t page = 0; page < ft.smb_size / ft.page_size; page++)
        for (uint64_t chunk = 0; chunk < 14; chunk++)
            move_chunk(&ft, page, chunk, 1);
    write_trace(&ft, s);
    for (size_t k = 0; k < s->n_chunks; k++)
        free(s->chunks[k].data);
    free(s->chunks);
    free(s->output);
    free(ft.smb);
}
