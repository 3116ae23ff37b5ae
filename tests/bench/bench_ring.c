/* tests/bench/bench_ring.c: shared-memory ring benchmarks (scripts/bench.sh ring).
 *
 *   ring_4k_vs_memcpy        one writer, 4 KiB records (a typical stack copy) into an
 *                            8 MiB ring: payload bytes/s as a ratio of plain memcpy() of
 *                            4 KiB blocks into the same data area (writes timed only; the
 *                            ring is drained between laps, outside the clock)
 *   ring_free_records_per_s  one writer, 40-byte records (a free), timed the same way
 *   ring_2w_records_per_s    two writer processes each writing 40-byte and occasional
 *                            4 KiB records as fast as they can for one second, one reader
 *                            process draining (copying every record out, as the service
 *                            does): records published per second
 *   ring_2w_drop_ratio       records dropped because the ring was full / records offered
 *
 * Each figure is the best of several trials (the machines are shared and noisy).
 *
 *     build-release/tests/bench/bench_ring
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/ring.h"

#define BENCH_RING_SIZE RING_DEFAULT_SIZE
#define BENCH_TRIALS 7
#define BENCH_LAPS 16 /* ring laps per trial */

static uint8_t bench_src[4096];

static uint64_t now_ns(void)
{
    return hp_clock_ns(CLOCK_MONOTONIC);
}

/* Drains everything published; returns the number of records. */
static uint64_t drain(ring_t *rd)
{
    struct ring_rspan rs;
    uint64_t n = 0;
    while (ring_begin_read(rd, &rs) == 0) {
        ring_end_read(rd, &rs);
        n++;
    }
    return n;
}

/* Nanoseconds spent writing @laps ring-fulls of @len-byte records (draining untimed);
 * @ret_records gets the number of records written. */
static uint64_t time_ring_writes(ring_t *w, ring_t *rd, size_t len, int laps, uint64_t *ret_records)
{
    uint64_t spent = 0, records = 0;
    for (int lap = 0; lap < laps; lap++) {
        uint64_t t0 = now_ns();
        for (;;) {
            struct ring_wspan ws;
            if (ring_try_begin_write(w, 2, len, &ws) < 0)
                break;
            memcpy(ws.data, bench_src, len);
            (void)ring_end_write(w, &ws);
            records++;
        }
        spent += now_ns() - t0;
        (void)drain(rd);
    }
    *ret_records = records;
    return spent;
}

/* Nanoseconds memcpy() takes to write the same number of 4 KiB blocks into the area. */
static uint64_t time_memcpy(uint8_t *area, size_t area_len, uint64_t blocks)
{
    uint64_t t0 = now_ns();
    size_t off = 0;
    for (uint64_t i = 0; i < blocks; i++) {
        memcpy(area + off, bench_src, sizeof(bench_src));
        off += sizeof(bench_src);
        if (off + sizeof(bench_src) > area_len)
            off = 0;
    }
    /* Keep the copies from being optimised away. */
    __asm__ volatile("" : : "r"(area) : "memory");
    return now_ns() - t0;
}

static void bench_single_writer(void)
{
    int fd = -1;
    ring_t *w = NULL, *rd = NULL;
    if (ring_create(BENCH_RING_SIZE, &fd) < 0 || ring_map(fd, RING_ROLE_WRITER, &w) < 0 ||
        ring_map(fd, RING_ROLE_READER, &rd) < 0) {
        fprintf(stderr, "bench_ring: cannot set up a ring\n");
        exit(1);
    }
    for (size_t i = 0; i < sizeof(bench_src); i++)
        bench_src[i] = (uint8_t)(i * 31u + 7u);

    /* memcpy baseline target: a separate shared mapping of the same data pages. */
    uint8_t *area = mmap(NULL, BENCH_RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096);
    if (area == MAP_FAILED) {
        perror("bench_ring: mmap");
        exit(1);
    }
    uint64_t recs;
    (void)time_ring_writes(w, rd, 4096, 2, &recs); /* fault the pages in */
    (void)time_memcpy(area, BENCH_RING_SIZE, recs);

    double best_ring = 0, best_memcpy = 0, best_free = 0;
    for (int t = 0; t < BENCH_TRIALS; t++) {
        uint64_t ns = time_ring_writes(w, rd, 4096, BENCH_LAPS, &recs);
        double ring_bps = (double)recs * 4096 / ((double)ns / 1e9);
        ns = time_memcpy(area, BENCH_RING_SIZE, recs);
        double memcpy_bps = (double)recs * 4096 / ((double)ns / 1e9);
        if (ring_bps > best_ring)
            best_ring = ring_bps;
        if (memcpy_bps > best_memcpy)
            best_memcpy = memcpy_bps;
        ns = time_ring_writes(w, rd, 40, BENCH_LAPS / 4, &recs);
        double rps = (double)recs / ((double)ns / 1e9);
        if (rps > best_free)
            best_free = rps;
    }
    printf("bench: ring_4k_vs_memcpy %.3f ratio\n", best_ring / best_memcpy);
    printf("# ring 4k: %.2f GB/s, memcpy: %.2f GB/s\n", best_ring / 1e9, best_memcpy / 1e9);
    printf("bench: ring_free_records_per_s %.0f records/s\n", best_free);
    fflush(stdout);
    (void)munmap(area, BENCH_RING_SIZE);
    rd = ring_unmap(rd);
    w = ring_unmap(w);
    (void)close(fd);
}

/* ---- two writer processes, one reader process ----------------------------------- */

#define TWO_W_SECONDS 1

/* Records each writer process published (shared with the parent). */
static _Atomic uint64_t *two_w_written;

static void two_w_writer(int fd, unsigned id)
{
    ring_t *w = NULL;
    if (ring_map(fd, RING_ROLE_WRITER, &w) < 0)
        _exit(2);
    uint64_t end = now_ns() + (uint64_t)TWO_W_SECONDS * 1000000000u;
    uint64_t i = 0, written = 0;
    for (;; i++) {
        /* One 4 KiB record (a sampled allocation) per 16 frees. */
        size_t len = (i & 15) == 15 ? 4096 : 40;
        struct ring_wspan ws;
        if (ring_try_begin_write(w, 2, len, &ws) == 0) {
            memcpy(ws.data, bench_src, len);
            memcpy(ws.data, &id, sizeof(id));
            (void)ring_end_write(w, &ws);
            written++;
        }
        if ((i & 255) == 0 && now_ns() >= end)
            break;
    }
    atomic_fetch_add(two_w_written, written);
    _exit(0);
}

static void two_w_reader(int fd)
{
    ring_t *rd = NULL;
    if (ring_map(fd, RING_ROLE_READER, &rd) < 0)
        _exit(2);
    /* Reads until the parent kills it; copies every record out as the service does. */
    static uint8_t copy[8192];
    volatile uint64_t sink = 0;
    for (;;) {
        struct ring_rspan rs;
        int r = ring_begin_read(rd, &rs);
        if (r == -EAGAIN) {
            sched_yield();
            continue;
        }
        if (r < 0 || rs.len > sizeof(copy))
            _exit(3);
        memcpy(copy, rs.data, rs.len);
        sink += copy[0];
        ring_end_read(rd, &rs);
    }
}

static void bench_two_writers(void)
{
    double best_rate = 0, best_drop = 1;
    two_w_written = mmap(NULL, sizeof(*two_w_written), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (two_w_written == MAP_FAILED) {
        fprintf(stderr, "bench_ring: mmap: %s\n", strerror(errno));
        exit(1);
    }
    for (int t = 0; t < 3; t++) {
        atomic_store(two_w_written, 0);
        int fd = -1;
        ring_t *view = NULL;
        if (ring_create(BENCH_RING_SIZE, &fd) < 0 || ring_map(fd, RING_ROLE_READER, &view) < 0) {
            fprintf(stderr, "bench_ring: cannot set up a ring\n");
            exit(1);
        }
        pid_t reader = fork();
        if (reader == 0)
            two_w_reader(fd);
        pid_t writers[2];
        uint64_t t0 = now_ns();
        for (unsigned i = 0; i < 2; i++) {
            writers[i] = fork();
            if (writers[i] == 0)
                two_w_writer(fd, i);
        }
        int ok = 1, status;
        for (int i = 0; i < 2; i++)
            ok &= waitpid(writers[i], &status, 0) == writers[i] && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0;
        double secs = (double)(now_ns() - t0) / 1e9;
        (void)kill(reader, SIGKILL);
        (void)waitpid(reader, &status, 0);
        if (!ok) {
            fprintf(stderr, "bench_ring: a writer failed\n");
            exit(1);
        }
        struct ring_stats st;
        ring_get_stats(view, &st);
        uint64_t written = atomic_load(two_w_written);
        double rate = (double)written / secs;
        double offered = (double)(written + st.records_dropped + st.reserve_failures);
        double drop =
            offered > 0 ? (double)(st.records_dropped + st.reserve_failures) / offered : 0;
        if (rate > best_rate) {
            best_rate = rate;
            best_drop = drop;
        }
        view = ring_unmap(view);
        (void)close(fd);
    }
    printf("bench: ring_2w_records_per_s %.0f records/s\n", best_rate);
    printf("bench: ring_2w_drop_ratio %.4f ratio\n", best_drop);
}

int main(void)
{
    bench_single_writer();
    bench_two_writers();
    return 0;
}
