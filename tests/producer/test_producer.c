/* tests/producer/test_producer.c: the producer (producer/) against the fake tracing
 * service (fake_traced.h), in one process: the producer's owner loop runs on a thread of
 * its own, the test thread writes packets as a bookkeeping thread would.
 *
 * Packets are TracePackets of random sizes (xorshift, fixed seeds) carrying their index
 * (timestamp, field 8) and a pattern derived from it (an unknown field, 2000): the trace
 * the fake writes must hold exactly the packets written, in order, with the trusted
 * fields appended, and the fake must count no violation of the protocol or the SMB ABI.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/pbwire.h"
#include "producer/producer.h"
#include "producer/producer_internal.h"
#include "tests/producer/fake_traced.h"

#define PATTERN_FIELD 2000

struct harness {
    char dir[64], sock[128], trace[128];
    ft_t *ft;
    prod_t *p;
    pthread_t loop;
    int wake_fd;
    pthread_mutex_t lock;
    _Atomic bool quit;
    _Atomic bool paused; /* the owner loop stops serving (a producer that does not read) */
    /* set by the callbacks (loop thread) */
    prod_writer_t *w;
    _Atomic int setups, starts, stops, disconnects, connects;
    int setup_result;
};

static void on_connected(void *ctx)
{
    struct harness *h = ctx;
    atomic_fetch_add(&h->connects, 1);
}

static int on_setup(void *ctx, const struct prod_ds_config *cfg, prod_writer_t *w)
{
    struct harness *h = ctx;
    (void)cfg;
    atomic_fetch_add(&h->setups, 1);
    if (h->setup_result < 0)
        return h->setup_result;
    pthread_mutex_lock(&h->lock);
    prod_writer_unref(h->w);
    h->w = prod_writer_ref(w);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

static void on_start(void *ctx, uint64_t id)
{
    struct harness *h = ctx;
    (void)id;
    atomic_fetch_add(&h->starts, 1);
}

/* The test thread has finished writing before it stops a session. */
static void on_stop(void *ctx, uint64_t id)
{
    struct harness *h = ctx;
    atomic_fetch_add(&h->stops, 1);
    pthread_mutex_lock(&h->lock);
    if (h->w)
        prod_writer_finish(h->w);
    pthread_mutex_unlock(&h->lock);
    prod_instance_stopped(h->p, id);
}

static void on_disconnected(void *ctx)
{
    struct harness *h = ctx;
    atomic_fetch_add(&h->disconnects, 1);
}

static void *loop_main(void *arg)
{
    struct harness *h = arg;
    while (!atomic_load(&h->quit)) {
        struct pollfd fds[PROD_MAX_POLLFDS + 1];
        size_t n = 0;
        if (!atomic_load(&h->paused))
            n = prod_pollfds(h->p, fds);
        fds[n++] = (struct pollfd){h->wake_fd, POLLIN, 0};
        int t = prod_timeout_ms(h->p);
        (void)poll(fds, n, t < 0 || t > 20 ? 20 : t);
        uint64_t v;
        (void)!read(h->wake_fd, &v, sizeof(v));
        if (!atomic_load(&h->paused))
            prod_dispatch(h->p);
    }
    return NULL;
}

static void harness_start(struct harness *h, const struct ft_options *fo, uint32_t stall_ms)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->dir, sizeof(h->dir), "/tmp/hp-prodtest-XXXXXX");
    assert_non_null(mkdtemp(h->dir));
    snprintf(h->sock, sizeof(h->sock), "%s/producer.sock", h->dir);
    snprintf(h->trace, sizeof(h->trace), "%s/trace.pftrace", h->dir);
    struct ft_options o = *fo;
    o.socket_path = h->sock;
    assert_int_equal(ft_new(&o, &h->ft), 0);
    pthread_mutex_init(&h->lock, NULL);
    h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct prod_callbacks cb = {.connected = on_connected,
                                .setup = on_setup,
                                .start = on_start,
                                .stop = on_stop,
                                .disconnected = on_disconnected};
    assert_int_equal(
        prod_new(&(struct prod_options){.socket_name = h->sock, .stall_budget_ms = stall_ms}, &cb,
                 h, &h->p),
        0);
    assert_int_equal(pthread_create(&h->loop, NULL, loop_main, h), 0);
    assert_true(ft_wait_producer(h->ft, 5000));
}

static void harness_stop(struct harness *h)
{
    atomic_store(&h->quit, true);
    uint64_t one = 1;
    (void)!write(h->wake_fd, &one, sizeof(one));
    pthread_join(h->loop, NULL);
    h->w = prod_writer_unref(h->w);
    h->p = prod_free(h->p);
    h->ft = ft_free(h->ft);
    (void)close(h->wake_fd);
    unlink(h->trace);
    rmdir(h->dir);
    pthread_mutex_destroy(&h->lock);
}

static prod_writer_t *wait_writer(struct harness *h, int setups)
{
    for (int i = 0; i < 500 && atomic_load(&h->setups) < setups; i++)
        usleep(10000);
    assert_true(atomic_load(&h->setups) >= setups);
    pthread_mutex_lock(&h->lock);
    prod_writer_t *w = h->w;
    pthread_mutex_unlock(&h->lock);
    return w;
}

/* ---- packets ------------------------------------------------------------------------ */

static uint64_t rng_state;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint8_t pattern(uint64_t index, size_t i)
{
    return (uint8_t)(index * 131 + i * 7 + (i >> 9));
}

/* Packet @index with @body bytes of pattern: {8: index, 2000: pattern}. */
static size_t make_packet(uint64_t index, size_t body, uint8_t **ret)
{
    uint8_t *p = malloc(body + 32);
    size_t n = 0;
    p[n++] = 8 << 3;
    n += hp_pb_put_varint(p + n, index);
    n += hp_pb_put_varint(p + n, (uint64_t)PATTERN_FIELD << 3 | HP_PB_LEN);
    n += hp_pb_put_varint(p + n, body);
    for (size_t i = 0; i < body; i++)
        p[n + i] = pattern(index, i);
    *ret = p;
    return n + body;
}

/* Writes @n packets of random sizes up to @max_body, the i-th in one to three pieces.
 * Returns how many were written (not dropped). */
static size_t write_packets(prod_writer_t *w, uint64_t first, size_t n, size_t max_body,
                            uint64_t *written_mask_out)
{
    size_t ok = 0;
    for (size_t k = 0; k < n; k++) {
        size_t body = (size_t)(rng() % (max_body + 1));
        if (rng() % 4 == 0)
            body %= 64; /* many small ones too */
        uint8_t *p;
        size_t len = make_packet(first + k, body, &p);
        size_t cut1 = len ? (size_t)(rng() % len) : 0, cut2 = cut1 + (len - cut1) / 2;
        struct iovec iov[3] = {{p, cut1}, {p + cut1, cut2 - cut1}, {p + cut2, len - cut2}};
        if (prod_writer_write(w, iov, 3, len) == 0) {
            ok++;
            if (written_mask_out)
                written_mask_out[(first + k) / 64] |= 1ull << ((first + k) % 64);
        }
        free(p);
    }
    return ok;
}

struct readback {
    uint64_t packets, next_index, seq1_packets, first_flags_ok, previous_dropped;
    uint64_t max_seq;
    bool bad;
};

/* Reads the trace the fake wrote: the producer's packets must be our packets, whole,
 * with the indices in @expect (bit mask; NULL: 0..n-1 in order). */
static void read_trace(const char *path, const uint64_t *expect, struct readback *rb)
{
    memset(rb, 0, sizeof(*rb));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    struct stat st;
    assert_int_equal(fstat(fileno(f), &st), 0);
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    assert_int_equal(fread(buf, 1, (size_t)st.st_size, f), (size_t)st.st_size);
    fclose(f);
    struct hp_pb_iter it;
    struct hp_pb_field pkt;
    hp_pb_iter_init(&it, buf, (size_t)st.st_size);
    uint64_t expect_index = 0;
    while (hp_pb_next(&it, &pkt)) {
        assert_int_equal(pkt.num, 1);
        struct hp_pb_iter pi;
        struct hp_pb_field fl;
        uint64_t seq = 0, index = UINT64_MAX, body_len = 0;
        const uint8_t *body = NULL;
        bool dropped = false;
        hp_pb_iter_init(&pi, pkt.ptr, pkt.len);
        while (hp_pb_next(&pi, &fl)) {
            if (fl.num == 10)
                seq = fl.varint;
            else if (fl.num == 8)
                index = fl.varint;
            else if (fl.num == 42 && fl.varint == 257)
                dropped = true;
            else if (fl.num == PATTERN_FIELD) {
                body = fl.ptr;
                body_len = fl.len;
            }
        }
        assert_false(pi.error);
        if (seq == 1) {
            rb->seq1_packets++;
            continue;
        }
        assert_true(seq >= 2);
        rb->max_seq = seq > rb->max_seq ? seq : rb->max_seq;
        rb->previous_dropped += dropped;
        if (expect) {
            while (!(expect[expect_index / 64] >> (expect_index % 64) & 1))
                expect_index++;
        }
        assert_int_equal(index, expect_index);
        assert_non_null(body);
        for (size_t i = 0; i < body_len; i++)
            if (body[i] != pattern(index, i)) {
                print_message("packet %llu: byte %zu differs\n", (unsigned long long)index, i);
                fail();
            }
        expect_index++;
        rb->packets++;
    }
    assert_false(it.error);
    free(buf);
}

static void assert_clean(ft_t *ft)
{
    struct ft_stats st;
    ft_get_stats(ft, &st);
    if (ft_violations(&st)) {
        print_message("fake traced counted violations:\n");
        ft_print_stats(&st, (void (*)(void *, const char *))(void *)print_message, NULL);
    }
    assert_int_equal(ft_violations(&st), 0);
    assert_int_equal(st.chunks_read, st.chunks_moved);
}

/* ---- tests --------------------------------------------------------------------------- */

/* Random packet sizes from 0 to 1 MB across page sizes 4-32 KiB, with method ids
 * shuffled (the producer must look them up by name) and flushes in between. */
static void test_producer_roundtrip_page_sizes(void **state)
{
    (void)state;
    static const uint32_t pages[] = {4096, 8192, 16384, 32768};
    for (size_t k = 0; k < HP_ARRAY_SIZE(pages); k++) {
        struct harness h;
        harness_start(&h,
                      &(struct ft_options){.page_size_bytes = pages[k],
                                           .smb_size_bytes = 64 * pages[k],
                                           .shuffle_methods = k % 2 == 1},
                      0);
        rng_state = 17 + k;
        int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
        prod_writer_t *w = wait_writer(&h, 1);
        size_t n = 0;
        for (int round = 0; round < 4; round++) {
            n += write_packets(w, n, 40, round == 3 ? 1000000 : 20000, NULL);
            assert_true(ft_flush(h.ft, s, 5000));
        }
        assert_int_equal(n, 160);
        assert_true(ft_stop_session(h.ft, s));
        struct readback rb;
        read_trace(h.trace, NULL, &rb);
        print_message("page %u KiB: %llu packets read back\n", pages[k] / 1024,
                      (unsigned long long)rb.packets);
        assert_int_equal(rb.packets, n);
        assert_int_equal(rb.seq1_packets, 2); /* clock snapshot, trace_stats */
        assert_int_equal(rb.max_seq, 2);
        assert_clean(h.ft);
        struct ft_stats st;
        ft_get_stats(h.ft, &st);
        assert_int_equal(st.flushes_acked, 5);
        assert_int_equal(st.stops_acked, 1);
        harness_stop(&h);
    }
}

/* An SMB of a single 4 KiB page: every packet longer than a chunk needs the chunk before
 * it committed and freed, one round trip per 4080 bytes. */
static void test_producer_tiny_smb(void **state)
{
    (void)state;
    struct harness h;
    harness_start(&h, &(struct ft_options){.page_size_bytes = 4096, .smb_size_bytes = 4096}, 0);
    rng_state = 99;
    int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    prod_writer_t *w = wait_writer(&h, 1);
    size_t n = write_packets(w, 0, 30, 300000, NULL);
    assert_int_equal(n, 30);
    assert_true(ft_stop_session(h.ft, s));
    struct readback rb;
    read_trace(h.trace, NULL, &rb);
    assert_int_equal(rb.packets, 30);
    assert_clean(h.ft);
    harness_stop(&h);
}

/* While the fake does not answer commits, a writer gives up after its stall budget: the
 * packet is dropped (a cut one is closed with the drop sentinel), the next packet says
 * so, and nothing else is lost or broken. */
static void test_producer_stalled_service_drops(void **state)
{
    (void)state;
    struct harness h;
    harness_start(&h, &(struct ft_options){.page_size_bytes = 4096, .smb_size_bytes = 16384}, 150);
    rng_state = 5;
    int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    prod_writer_t *w = wait_writer(&h, 1);
    uint64_t mask[4] = {0};
    assert_int_equal(write_packets(w, 0, 3, 2000, mask), 3);
    ft_stall_commits(h.ft, true);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    /* 40 KB do not fit 16 KiB: the packet is cut after its first chunks. */
    uint8_t *p;
    size_t len = make_packet(3, 40000, &p);
    struct iovec iov = {p, len};
    assert_int_equal(prod_writer_write(w, &iov, 1, len), -ENOBUFS);
    free(p);
    uint64_t ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000;
    print_message("dropped after %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 140 && ms < 2000);
    ft_stall_commits(h.ft, false);
    assert_int_equal(write_packets(w, 4, 3, 2000, mask), 3);
    struct prod_writer_stats ws;
    prod_writer_get_stats(w, &ws);
    assert_int_equal(ws.packets_dropped, 1);
    assert_true(ft_stop_session(h.ft, s));
    struct readback rb;
    read_trace(h.trace, mask, &rb);
    assert_int_equal(rb.packets, 6);
    assert_int_equal(rb.previous_dropped, 1);
    struct ft_stats st;
    ft_get_stats(h.ft, &st);
    assert_int_equal(st.trace_writer_packet_loss, 1);
    assert_clean(h.ft);
    harness_stop(&h);
}

/* The service drops the connection: the producer reports it, reconnects with backoff,
 * and a new session on the new connection works (new SMB, writer ids and chunk ids from
 * the start). */
static void test_producer_reconnects(void **state)
{
    (void)state;
    struct harness h;
    harness_start(&h, &(struct ft_options){0}, 0);
    rng_state = 3;
    int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    prod_writer_t *w = wait_writer(&h, 1);
    assert_int_equal(write_packets(w, 0, 5, 5000, NULL), 5);
    ft_drop_producer(h.ft);
    for (int i = 0; i < 200 && atomic_load(&h.disconnects) == 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&h.disconnects), 1);
    uint8_t *p;
    size_t len = make_packet(9, 10, &p);
    struct iovec iov = {p, len};
    assert_int_equal(prod_writer_write(w, &iov, 1, len), -EPIPE);
    free(p);
    (void)ft_stop_session(h.ft, s);
    assert_true(ft_wait_producer(h.ft, 5000));
    assert_true(atomic_load(&h.connects) >= 2);
    s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    w = wait_writer(&h, 2);
    assert_int_equal(write_packets(w, 0, 5, 5000, NULL), 5);
    assert_true(ft_stop_session(h.ft, s));
    struct readback rb;
    read_trace(h.trace, NULL, &rb);
    assert_int_equal(rb.packets, 5);
    assert_clean(h.ft);
    harness_stop(&h);
}

/* A refused instance gets its stop acknowledged at once; ClearIncrementalState reaches
 * the writer once. */
static void test_producer_refused_and_clear(void **state)
{
    (void)state;
    struct harness h;
    harness_start(&h, &(struct ft_options){0}, 0);
    h.setup_result = -EINVAL;
    int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    for (int i = 0; i < 200 && atomic_load(&h.setups) == 0; i++)
        usleep(10000);
    assert_true(ft_stop_session(h.ft, s));
    assert_int_equal(atomic_load(&h.starts), 0);
    assert_int_equal(atomic_load(&h.stops), 0);
    h.setup_result = 0;
    s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    prod_writer_t *w = wait_writer(&h, 2);
    assert_false(prod_writer_take_clear_request(w));
    ft_clear_incremental_state(h.ft, s);
    bool got = false;
    for (int i = 0; i < 200 && !got; i++) {
        got = prod_writer_take_clear_request(w);
        if (!got)
            usleep(5000);
    }
    assert_true(got);
    assert_false(prod_writer_take_clear_request(w));
    assert_true(ft_stop_session(h.ft, s));
    assert_clean(h.ft);
    harness_stop(&h);
}

/* A producer that stops reading while the service sends is dropped by the service after
 * its 10 ms send timeout (the fake is as strict as traced), and reconnects once it reads
 * again. */
static void test_producer_send_timeout(void **state)
{
    (void)state;
    struct harness h;
    harness_start(&h, &(struct ft_options){0}, 0);
    int s = ft_start_session(h.ft, &(struct ft_session_config){.output = h.trace});
    (void)wait_writer(&h, 1);
    atomic_store(&h.paused, true);
    usleep(50000);
    ft_flood_flushes(h.ft, s, 400);
    struct ft_stats st;
    ft_get_stats(h.ft, &st);
    assert_true(st.send_timeouts >= 1);
    atomic_store(&h.paused, false);
    (void)ft_stop_session(h.ft, s);
    assert_true(ft_wait_producer(h.ft, 5000));
    assert_true(atomic_load(&h.connects) >= 2);
    harness_stop(&h);
}

/* ---- the fake's own strictness, with a hand-made client ---------------------------- */

static int raw_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void raw_send(int fd, const uint8_t *b, size_t n)
{
    assert_int_equal(send(fd, b, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads one frame; returns its payload length (0 on EOF). */
static size_t raw_recv(int fd, uint8_t *buf, size_t cap)
{
    uint8_t h[4];
    if (recv(fd, h, 4, MSG_WAITALL) != 4)
        return 0;
    size_t n = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
    assert_true(n <= cap);
    assert_int_equal(recv(fd, buf, n, MSG_WAITALL), (ssize_t)n);
    return n;
}

/* The frames Perfetto's heapprofd sent to traced v58.2, as captured (the protocol note):
 * our decoders read the service's side of the same exchange. */
static void test_producer_golden_frames(void **state)
{
    (void)state;
    /* S->P InitializeConnection reply. */
    static const uint8_t init_reply[] = {0x10, 0x02, 0x32, 0x0c, 0x08, 0x01, 0x10, 0x00,
                                         0x1a, 0x06, 0x08, 0x00, 0x10, 0x01, 0x18, 0x00};
    struct prod__frame f;
    assert_int_equal(prod__decode_frame(init_reply, sizeof(init_reply), &f), 0);
    assert_int_equal(f.request_id, 2);
    assert_int_equal(f.kind, PROD_FRAME_INVOKE_REPLY);
    assert_true(f.success);
    assert_false(f.has_more);
    assert_int_equal(f.reply_len, 6);
    /* S->P SetupTracing (page 4 KiB). */
    static const uint8_t setup[] = {0x10, 0x03, 0x32, 0x0a, 0x08, 0x01, 0x10,
                                    0x01, 0x1a, 0x04, 0x1a, 0x02, 0x08, 0x04};
    struct prod__command c;
    assert_int_equal(prod__decode_frame(setup, sizeof(setup), &f), 0);
    assert_true(f.has_more);
    assert_int_equal(prod__decode_command(f.reply, f.reply_len, &c), 0);
    assert_int_equal(c.kind, PROD_CMD_SETUP_TRACING);
    assert_int_equal(c.page_size_kb, 4);
    /* S->P Flush (ds 1, flush id 1, flags 0x11). */
    static const uint8_t flush[] = {0x10, 0x03, 0x32, 0x0e, 0x08, 0x01, 0x10, 0x01, 0x1a,
                                    0x08, 0x2a, 0x06, 0x08, 0x01, 0x10, 0x01, 0x18, 0x11};
    assert_int_equal(prod__decode_frame(flush, sizeof(flush), &f), 0);
    assert_int_equal(prod__decode_command(f.reply, f.reply_len, &c), 0);
    assert_int_equal(c.kind, PROD_CMD_FLUSH);
    assert_int_equal(c.n_ids, 1);
    assert_int_equal(c.ids[0], 1);
    assert_int_equal(c.request_id, 1);
    assert_int_equal(c.flags, 0x11);
    /* S->P StopDataSource (instance 1). */
    static const uint8_t stop[] = {0x10, 0x03, 0x32, 0x0a, 0x08, 0x01, 0x10,
                                   0x01, 0x1a, 0x04, 0x12, 0x02, 0x08, 0x01};
    assert_int_equal(prod__decode_frame(stop, sizeof(stop), &f), 0);
    assert_int_equal(prod__decode_command(f.reply, f.reply_len, &c), 0);
    assert_int_equal(c.kind, PROD_CMD_STOP_DS);
    assert_int_equal(c.config.instance_id, 1);
    /* Non-minimal varints, as traced writes some lengths: 4-byte length of a message. */
    static const uint8_t padded[] = {0x10, 0x03, 0x32, 0x8d, 0x80, 0x80, 0x00, 0x08, 0x01, 0x10,
                                     0x01, 0x1a, 0x07, 0x12, 0x82, 0x80, 0x80, 0x00, 0x08, 0x07};
    assert_int_equal(prod__decode_frame(padded, sizeof(padded), &f), 0);
    assert_int_equal(prod__decode_command(f.reply, f.reply_len, &c), 0);
    assert_int_equal(c.kind, PROD_CMD_STOP_DS);
    assert_int_equal(c.config.instance_id, 7);

    /* P->S: the producer's first frame is BindService{"ProducerPort"}, byte for byte. */
    char dir[] = "/tmp/hp-golden-XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/sock", dir);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 1), 0);
    prod_t *p;
    struct prod_callbacks cb = {0};
    assert_int_equal(prod_new(&(struct prod_options){.socket_name = path}, &cb, NULL, &p), 0);
    prod_dispatch(p);
    int c_fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c_fd >= 0);
    uint8_t got[64];
    assert_int_equal(recv(c_fd, got, sizeof(got), 0), 22);
    static const uint8_t bind_frame[] = {0x12, 0x00, 0x00, 0x00, 0x10, 0x01, 0x1a, 0x0e,
                                         0x0a, 0x0c, 'P',  'r',  'o',  'd',  'u',  'c',
                                         'e',  'r',  'P',  'o',  'r',  't'};
    assert_memory_equal(got, bind_frame, sizeof(bind_frame));
    prod_free(p);
    (void)close(c_fd);
    (void)close(l);
    unlink(path);
    rmdir(dir);
}

static void test_producer_fake_is_strict(void **state)
{
    (void)state;
    char dir[] = "/tmp/hp-strict-XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/sock", dir);
    ft_t *ft;
    assert_int_equal(ft_new(&(struct ft_options){.socket_path = path}, &ft), 0);
    int fd = raw_connect(path);
    uint8_t buf[4096];
    /* Bind. */
    static const uint8_t bind_frame[] = {0x12, 0x00, 0x00, 0x00, 0x10, 0x01, 0x1a, 0x0e,
                                         0x0a, 0x0c, 'P',  'r',  'o',  'd',  'u',  'c',
                                         'e',  'r',  'P',  'o',  'r',  't'};
    raw_send(fd, bind_frame, sizeof(bind_frame));
    assert_true(raw_recv(fd, buf, sizeof(buf)) > 0);
    /* CommitData (method 4) before InitializeConnection: refused and counted. */
    static const uint8_t early_commit[] = {0x0a, 0x00, 0x00, 0x00, 0x10, 0x02, 0x2a,
                                           0x06, 0x08, 0x01, 0x10, 0x04, 0x1a, 0x00};
    raw_send(fd, early_commit, sizeof(early_commit));
    size_t n = raw_recv(fd, buf, sizeof(buf));
    struct prod__frame f;
    assert_int_equal(prod__decode_frame(buf, n, &f), 0);
    assert_false(f.success);
    /* A frame of 128 KiB + 1 byte: the connection is dropped. */
    uint8_t big[4] = {0xfd, 0xff, 0x01, 0x00}; /* 131069 + 4 = 131073 */
    raw_send(fd, big, 4);
    static uint8_t filler[131069];
    (void)send(fd, filler, sizeof(filler), MSG_NOSIGNAL);
    assert_int_equal(raw_recv(fd, buf, sizeof(buf)), 0);
    struct ft_stats st;
    ft_get_stats(ft, &st);
    assert_int_equal(st.calls_before_init, 1);
    assert_int_equal(st.frame_too_large, 1);
    (void)close(fd);
    ft_free(ft);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_producer_golden_frames),
        cmocka_unit_test(test_producer_fake_is_strict),
        cmocka_unit_test(test_producer_roundtrip_page_sizes),
        cmocka_unit_test(test_producer_tiny_smb),
        cmocka_unit_test(test_producer_stalled_service_drops),
        cmocka_unit_test(test_producer_reconnects),
        cmocka_unit_test(test_producer_refused_and_clear),
        cmocka_unit_test(test_producer_send_timeout),
    };
    return cmocka_run_group_tests_name("producer", tests, NULL, NULL);
}
