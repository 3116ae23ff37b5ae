/* tests/bench/bench_producer.c: the cost of writing a dump into traced's shared memory
 * buffer instead of a file.
 *
 *   producer_dump_vs_file_ratio   wall time of one dump of the 1M-call-site state
 *                                 (tests/bench/dump_state.h, 36 MB of packets) written
 *                                 through a producer writer into the SMB heapprofd
 *                                 --producer asks traced for (1 MiB in 16 KiB pages),
 *                                 over the same dump written to a file (a fresh file in
 *                                 $TMPDIR or /tmp); best of 3 each, interleaved
 *   producer_dump_vs_file_ratio_smb256k   the same into traced's default SMB (256 KiB
 *                                 in 4 KiB pages: what a trace config that sets
 *                                 producers { shm_size_kb: 256 page_size_kb: 4 } gives)
 *   producer_dump_s               the SMB dump's best wall time (1 MiB SMB)
 *   producer_dump_stall_share     of that, the share the writer spent waiting for free
 *                                 chunks
 *
 * The service end is the test suite's fake traced (tests/producer/fake_traced.h) on a
 * thread of this process: it copies every committed chunk out as traced does, so the
 * producer's side (encoding, copying into chunks, commits and their round trips) is
 * what is measured, plus one copy. Wall time, because the point is how long the
 * bookkeeping thread is busy while its dump drains through a buffer 160 times smaller
 * than the dump: waiting counts. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "common/clock.h"
#include "producer/producer.h"
#include "tests/bench/dump_state.h"
#include "tests/producer/fake_traced.h"

#define RUNS 3

static const struct hp_mapping maps[3] = {
    {.start = 0x400000, .end = 0x4f0000, .path = "/usr/lib/libbench.so", .build_id_len = 20},
    {.start = 0x500000, .end = 0x5f0000, .path = "/usr/lib/libbench.so", .build_id_len = 20},
    {.start = 0x600000, .end = 0x6f0000, .path = "/usr/lib/libbench.so", .build_id_len = 20},
};

static double now_s(void)
{
    return (double)hp_clock_ns(CLOCK_MONOTONIC) / 1e9;
}

struct env {
    ft_t *ft;
    prod_t *p;
    pthread_t loop;
    _Atomic bool quit;
    _Atomic(prod_writer_t *) w;
};

static int on_setup(void *ctx, const struct prod_ds_config *cfg, prod_writer_t *w)
{
    struct env *e = ctx;
    (void)cfg;
    atomic_store(&e->w, prod_writer_ref(w));
    return 0;
}

static void on_stop(void *ctx, uint64_t id)
{
    struct env *e = ctx;
    prod_instance_stopped(e->p, id);
}

static void *loop_main(void *arg)
{
    struct env *e = arg;
    while (!atomic_load(&e->quit)) {
        struct pollfd fds[PROD_MAX_POLLFDS];
        size_t n = prod_pollfds(e->p, fds);
        (void)poll(fds, n, 10);
        prod_dispatch(e->p);
    }
    return NULL;
}

static int sink_write(void *ctx, const struct iovec *iov, int n, size_t len)
{
    return prod_writer_write(ctx, iov, n, len);
}

static double dump_to_file(const char *dir, size_t *ret_bytes)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/bench-producer-%d.pftrace", dir, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    bk_t *bk = bench_dump_state(&(struct bk_config){.out_fd = fd, .dump_at_max = true}, maps);
    struct bk_counters c0, c1;
    bk_get_counters(bk, &c0);
    double t0 = now_s();
    if (bk_dump_all(bk) < 0)
        exit(1);
    double t = now_s() - t0;
    bk_get_counters(bk, &c1);
    *ret_bytes = c1.bytes_written - c0.bytes_written;
    bk_free(bk);
    close(fd);
    unlink(path);
    return t;
}

static double dump_to_smb(const char *dir, uint32_t smb_kb, uint32_t page_kb, double *ret_stall_s)
{
    struct env e = {0};
    char sock[512], out[512];
    snprintf(sock, sizeof(sock), "%s/bench-producer-%d.sock", dir, (int)getpid());
    snprintf(out, sizeof(out), "%s/bench-producer-%d-smb.pftrace", dir, (int)getpid());
    if (ft_new(&(struct ft_options){.socket_path = sock,
                                    .smb_size_bytes = smb_kb << 10,
                                    .page_size_bytes = page_kb << 10},
               &e.ft) < 0)
        exit(1);
    struct prod_callbacks cb = {.setup = on_setup, .stop = on_stop};
    if (prod_new(&(struct prod_options){.socket_name = sock, .stall_budget_ms = 60000}, &cb, &e,
                 &e.p) < 0 ||
        pthread_create(&e.loop, NULL, loop_main, &e) != 0 || !ft_wait_producer(e.ft, 5000))
        exit(1);
    int s = ft_start_session(e.ft, &(struct ft_session_config){.output = NULL});
    while (!atomic_load(&e.w))
        usleep(1000);
    prod_writer_t *w = atomic_load(&e.w);
    const struct bk_sink sink = {sink_write, NULL, w};
    bk_t *bk = bench_dump_state(&(struct bk_config){.sink = &sink, .dump_at_max = true}, maps);
    struct prod_writer_stats w0, w1;
    prod_writer_get_stats(w, &w0);
    double t0 = now_s();
    if (bk_dump_all(bk) < 0) {
        fprintf(stderr, "dump into the SMB failed\n");
        exit(1);
    }
    prod_writer_finish(w);
    double t = now_s() - t0;
    prod_writer_get_stats(w, &w1);
    *ret_stall_s = (double)(w1.stall_us - w0.stall_us) / 1e6;
    if (w1.packets_dropped)
        fprintf(stderr, "%llu packets dropped\n", (unsigned long long)w1.packets_dropped);
    bk_free(bk);
    (void)ft_stop_session(e.ft, s);
    atomic_store(&e.quit, true);
    pthread_join(e.loop, NULL);
    prod_writer_unref(w);
    prod_free(e.p);
    ft_free(e.ft);
    (void)out;
    return t;
}

int main(void)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    /* What heapprofd --producer asks traced for (cli/cmd_producer.c), and traced's default. */
    static const uint32_t smb[2][2] = {{1024, 16}, {256, 4}};
    double best_file = 1e9, best[2] = {1e9, 1e9}, stall_at_best[2] = {0, 0};
    size_t bytes = 0;
    for (int r = 0; r < RUNS; r++) {
        double f = dump_to_file(dir, &bytes);
        best_file = f < best_file ? f : best_file;
        for (int k = 0; k < 2; k++) {
            double stall;
            double m = dump_to_smb(dir, smb[k][0], smb[k][1], &stall);
            fprintf(stderr, "run %d: file %.3f s, SMB %u KiB/%u KiB %.3f s (%.3f s waiting)\n", r,
                    f, smb[k][0], smb[k][1], m, stall);
            if (m < best[k]) {
                best[k] = m;
                stall_at_best[k] = stall;
            }
        }
    }
    printf("bench: producer_dump_bytes %zu bytes\n", bytes);
    printf("bench: producer_dump_s %.4f s\n", best[0]);
    printf("bench: producer_dump_stall_share %.2f ratio\n", stall_at_best[0] / best[0]);
    printf("bench: producer_dump_vs_file_ratio %.2f ratio\n", best[0] / best_file);
    printf("bench: producer_dump_vs_file_ratio_smb256k %.2f ratio\n", best[1] / best_file);
    return 0;
}
