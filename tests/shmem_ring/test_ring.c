/* tests/shmem_ring/test_ring.c: unit tests of the shared-memory ring. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "common/clock.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/ring_layout.h"

#define SMALL RING_MIN_SIZE
/* What records other than frees may fill of it: they leave the urgent reserve. */
#define SMALL_SAMPLES (SMALL - (SMALL >> RING_URGENT_RESERVE_SHIFT))

/* ThreadSanitizer tracks synchronisation by virtual address; tests where the reader and
 * the writers use separate mappings of the same pages (as separate processes do) are
 * skipped under it (see test_ring_concurrent_writers), as are tests that read through one
 * process's mapping what another process wrote. */
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() skip()
#else
#define SKIP_UNDER_TSAN()                                                                          \
    do {                                                                                           \
    } while (0)
#endif

struct fixture {
    int fd;
    ring_t *reader;
    ring_t *writer;
};

static int setup_ring(struct fixture *f, size_t size)
{
    f->fd = -1;
    f->reader = f->writer = NULL;
    if (ring_create(size, &f->fd) < 0)
        return -1;
    if (ring_map(f->fd, RING_ROLE_READER, &f->reader) < 0)
        return -1;
    if (ring_map(f->fd, RING_ROLE_WRITER, &f->writer) < 0)
        return -1;
    return 0;
}

static int setup_small(void **state)
{
    static struct fixture f;
    *state = &f;
    return setup_ring(&f, SMALL);
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    f->reader = ring_unmap(f->reader);
    f->writer = ring_unmap(f->writer);
    if (f->fd >= 0)
        (void)close(f->fd);
    return 0;
}

static uint8_t pattern_byte(uint64_t tag, size_t i)
{
    uint64_t x = tag * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
    return (uint8_t)(x >> 56);
}

static void fill_pattern(void *p, size_t len, uint64_t tag)
{
    uint8_t *b = p;
    for (size_t i = 0; i < len; i++)
        b[i] = pattern_byte(tag, i);
}

static bool check_pattern(const void *p, size_t len, uint64_t tag)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern_byte(tag, i))
            return false;
    return true;
}

/* Writes one record of @len payload bytes filled with the pattern of @tag. */
/* As write_one(), through ring_try_begin_write_nowait() when @urgent. */
static int write_one_as(ring_t *w, uint16_t type, size_t len, uint64_t tag, bool urgent)
{
    struct ring_wspan ws;
    int r = urgent ? ring_try_begin_write_nowait(w, type, len, &ws)
                   : ring_try_begin_write(w, type, len, &ws);
    if (r < 0)
        return r;
    assert_int_equal(ws.len, len);
    assert_int_equal((uintptr_t)ws.data % 8, 0);
    fill_pattern(ws.data, len, tag);
    (void)ring_end_write(w, &ws);
    return 0;
}

static int write_one(ring_t *w, uint16_t type, size_t len, uint64_t tag)
{
    return write_one_as(w, type, len, tag, false);
}

static void read_one_expect(ring_t *rd, uint16_t type, size_t len, uint64_t tag)
{
    struct ring_rspan rs;
    assert_int_equal(ring_begin_read(rd, &rs), 0);
    assert_int_equal(rs.type, type);
    assert_int_equal(rs.len, len);
    assert_true(check_pattern(rs.data, rs.len, tag));
    ring_end_read(rd, &rs);
}

static void test_ring_create_rejects_bad_sizes(void **state)
{
    (void)state;
    int fd = -1;
    assert_int_equal(ring_create(0, &fd), -EINVAL);
    assert_int_equal(ring_create(RING_MIN_SIZE / 2, &fd), -EINVAL);
    assert_int_equal(ring_create(RING_MIN_SIZE + 4096, &fd), -EINVAL);
    assert_int_equal(ring_create((size_t)RING_MAX_SIZE * 2, &fd), -EINVAL);
    assert_int_equal(fd, -1);
}

static void test_ring_map_rejects_foreign_fds(void **state)
{
    (void)state;
    ring_t *r = NULL;

    /* Right size, no seals, no magic. */
    int fd = memfd_create("not-a-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, RING_HEADER_SIZE + SMALL), 0);
    assert_int_equal(ring_map(fd, RING_ROLE_READER, &r), -EPERM);
    assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), -EPERM);
    /* Wrong size. */
    assert_int_equal(ftruncate(fd, RING_HEADER_SIZE + SMALL + 8), 0);
    assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), -EBADMSG);
    assert_int_equal(ftruncate(fd, 100), 0);
    assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), -EBADMSG);
    assert_null(r);
    (void)close(fd);

    /* A real ring is sealed: it can no longer be shrunk. */
    assert_int_equal(ring_create(SMALL, &fd), 0);
    assert_int_equal(ftruncate(fd, 4096), -1);
    assert_int_equal(errno, EPERM);
    (void)close(fd);
}

/* A memfd of a ring's size with a valid header, sealed with @seals (0: none), as a peer
 * posing as the service could send it. */
static int ring_fake_fd(unsigned seals)
{
    int fd = memfd_create("fake-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, RING_HEADER_SIZE + SMALL), 0);
    struct ring_shared *h = mmap(NULL, RING_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    h->magic = RING_HEADER_MAGIC;
    h->data_size = SMALL;
    assert_int_equal(munmap(h, RING_HEADER_SIZE), 0);
    if (seals)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
}

/* The writer, in the program, maps only what the service seals (shrink, grow and the seals
 * themselves): a peer that kept the right to truncate the file would make the program's
 * malloc die of SIGBUS. Both roles, whatever subset is missing. */
static void test_ring_bug_writer_maps_unsealed(void **state)
{
    (void)state;
    static const unsigned partial[] = {0, F_SEAL_SHRINK, F_SEAL_SHRINK | F_SEAL_GROW,
                                       F_SEAL_GROW | F_SEAL_SEAL};
    for (size_t i = 0; i < sizeof(partial) / sizeof(partial[0]); i++) {
        ring_t *r = NULL;
        int fd = ring_fake_fd(partial[i]);
        assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), -EPERM);
        assert_int_equal(ring_map(fd, RING_ROLE_READER, &r), -EPERM);
        assert_null(r);
        (void)close(fd);
    }
    /* Sealed as ring_create() seals: mapped. */
    ring_t *r = NULL;
    int fd = ring_fake_fd(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), 0);
    r = ring_unmap(r);
    (void)close(fd);
}

static void test_ring_empty_and_full(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    struct ring_stats st;
    const size_t len = 992; /* 1016 bytes with the 24-byte header */
    size_t n = 0;

    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    /* Samples stop short of the reserve, in block mode or not; frees (urgent) fill the
     * rest. */
    while (write_one(f->writer, 7, len, n) == 0)
        n++;
    assert_int_equal(n, SMALL_SAMPLES / 1016);
    assert_int_equal(write_one(f->writer, 7, len, 0), -EAGAIN);
    while (write_one_as(f->writer, 7, len, n, true) == 0)
        n++;
    assert_int_equal(n, SMALL / 1016);
    assert_int_equal(write_one_as(f->writer, 7, len, 0, true), -EAGAIN);
    ring_get_stats(f->writer, &st);
    assert_int_equal(st.records_read, 0);
    assert_int_equal(st.records_dropped, 4);
    assert_int_equal(st.max_fill_bytes, n * 1016);
    assert_int_equal(st.size_bytes, SMALL);

    /* One record read frees room for exactly one more. */
    read_one_expect(f->reader, 7, len, 0);
    assert_int_equal(write_one_as(f->writer, 7, len, n, true), 0);
    assert_int_equal(write_one_as(f->writer, 7, len, 0, true), -EAGAIN);
    for (size_t i = 1; i <= n; i++)
        read_one_expect(f->reader, 7, len, i);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    /* The reader counts what it consumed. */
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.records_read, n + 1);
    assert_int_equal(st.bytes_read, (n + 1) * 1016);
}

/* A mark taken while writers keep writing bounds the reader to what came before it. */
static void test_ring_mark_bounds_a_drain(void **state)
{
    struct fixture *f = *state;
    const size_t len = 100;
    uint64_t empty = ring_mark(f->reader);
    assert_true(ring_reached(f->reader, empty));
    for (uint64_t i = 0; i < 5; i++)
        assert_int_equal(write_one(f->writer, 3, len, i), 0);
    uint64_t mark = ring_mark(f->reader);
    assert_false(ring_reached(f->reader, mark));
    for (uint64_t i = 5; i < 9; i++)
        assert_int_equal(write_one(f->writer, 3, len, i), 0);
    uint64_t i = 0;
    while (!ring_reached(f->reader, mark))
        read_one_expect(f->reader, 3, len, i++);
    assert_int_equal(i, 5);
    /* The rest is still there, past the mark. */
    assert_true(ring_reached(f->reader, mark));
    while (i < 9)
        read_one_expect(f->reader, 3, len, i++);
    assert_true(ring_reached(f->reader, ring_mark(f->reader)));
}

/* A writer waits until the reader has read past its record; the reader tells it at once
 * with ring_flush_read_pos() (it publishes its position only in steps otherwise). */
static void test_ring_wait_consumed(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan w;
    struct ring_rspan rs;
    assert_int_equal(ring_try_begin_write(f->writer, 5, 0, &w), 0);
    (void)ring_end_write(f->writer, &w);
    assert_int_equal(ring_wait_consumed(f->writer, &w, 1000), -ETIMEDOUT);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    assert_int_equal(rs.type, 5);
    assert_int_equal(rs.len, 0);
    ring_end_read(f->reader, &rs);
    /* Read, but not published yet: one small record is far from a publishing step. */
    assert_int_equal(ring_wait_consumed(f->writer, &w, 1000), -ETIMEDOUT);
    ring_flush_read_pos(f->reader);
    assert_int_equal(ring_wait_consumed(f->writer, &w, 0), 0);
    /* A reader gone: no waiting for it. */
    assert_int_equal(ring_try_begin_write(f->writer, 5, 0, &w), 0);
    (void)ring_end_write(f->writer, &w);
    ring_set_detached(f->reader);
    assert_int_equal(ring_wait_consumed(f->writer, &w, 10u * 1000u * 1000u), -EPIPE);
}

/* A writer that loaded code asks for a maps read and, in block mode, waits until the
 * reader answered that ask or a later one (within the block timeout). */
static void test_ring_maps_read_asked_and_answered(void **state)
{
    struct fixture *f = *state;
    uint64_t a1 = ring_ask_maps_read(f->writer);
    uint64_t a2 = ring_ask_maps_read(f->writer);
    assert_int_equal(a2, a1 + 1);
    assert_int_equal(ring_wait_maps_read(f->writer, a1), -EAGAIN); /* not in block mode */
    ring_set_blocking(f->writer, true, 1000);
    assert_int_equal(ring_wait_maps_read(f->writer, a1), -ETIMEDOUT);
    /* A wait that ran out ends blocking, as one for room does. */
    assert_int_equal(ring_wait_maps_read(f->writer, a1), -EAGAIN);
    ring_set_blocking(f->writer, true, 1000);
    ring_maps_read_done(f->reader, a1);
    assert_int_equal(ring_wait_maps_read(f->writer, a1), 0);
    assert_int_equal(ring_wait_maps_read(f->writer, a2), -ETIMEDOUT);
    ring_set_blocking(f->writer, true, 1000);
    ring_maps_read_done(f->reader, a2);
    assert_int_equal(ring_wait_maps_read(f->writer, a1), 0);
    assert_int_equal(ring_wait_maps_read(f->writer, a2), 0);
    /* A reader gone: no waiting for it. */
    ring_set_blocking(f->writer, true, 10u * 1000u * 1000u);
    uint64_t a3 = ring_ask_maps_read(f->writer);
    ring_set_detached(f->reader);
    assert_int_equal(ring_wait_maps_read(f->writer, a3), -EPIPE);
}

static void test_ring_too_large_rejected(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    struct ring_wspan ws;
    struct ring_stats st;

    assert_int_equal(ring_try_begin_write(f->writer, 1, SMALL, &ws), -EMSGSIZE);
    assert_int_equal(ring_try_begin_write(f->writer, 1, SMALL - 8, &ws), -EMSGSIZE);
    assert_int_equal(ring_try_begin_write(f->writer, 1, (size_t)RING_MAX_PAYLOAD + 1, &ws),
                     -EMSGSIZE);
    assert_int_equal(ring_try_begin_write(f->writer, 1, SIZE_MAX, &ws), -EMSGSIZE);
    ring_get_stats(f->writer, &st);
    assert_int_equal(st.records_dropped, 4);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    /* The largest record that fits the ring is accepted (as an urgent one; other
     * records leave the reserve). */
    assert_int_equal(write_one(f->writer, 1, SMALL_SAMPLES - 24 + 8, 5), -EMSGSIZE);
    assert_int_equal(write_one(f->writer, 1, SMALL_SAMPLES - 24, 5), 0);
    read_one_expect(f->reader, 1, SMALL_SAMPLES - 24, 5);
    assert_int_equal(write_one_as(f->writer, 1, SMALL - 24, 5, true), 0);
    read_one_expect(f->reader, 1, SMALL - 24, 5);
}

static void test_ring_wrap_at_every_offset(void **state)
{
    struct fixture *f = *state;
    const size_t sizes[] = {0, 1, 7, 8, 9, 24, 100, 200, 4096 + 3};
    uint64_t tag = 1;

    /* Move the write position to SMALL - k for every k in [8, 512] (step 8), then write
     * a record that straddles the end of the data area and read it back. */
    for (size_t si = 0; si < HP_ARRAY_SIZE(sizes); si++) {
        for (uint64_t k = 8; k <= 512; k += 8) {
            uint64_t pos = f->reader->lane[0].read_pos;
            uint64_t target = (pos & ~f->reader->mask) + SMALL - k;
            if (target < pos)
                target += SMALL;
            /* Advance with filler records; a filler never has fewer than 24 bytes. */
            while (pos != target) {
                uint64_t gap = target - pos;
                size_t chunk = gap > 2048 ? 2000 : (gap >= 24 ? (size_t)gap - 24 : 0);
                if (gap < 24) {
                    target += SMALL;
                    continue;
                }
                assert_int_equal(write_one(f->writer, 3, chunk, tag), 0);
                read_one_expect(f->reader, 3, chunk, tag);
                tag++;
                pos = f->reader->lane[0].read_pos;
            }
            assert_int_equal(write_one(f->writer, 4, sizes[si], tag), 0);
            read_one_expect(f->reader, 4, sizes[si], tag);
            tag++;
        }
    }
}

static void test_ring_many_sizes(void **state)
{
    struct fixture *f = *state;
    size_t wlen = 0, rlen = 0;
    uint64_t wtag = 0, rtag = 0;

    /* Keep the ring partly full while sizes sweep 0..3000: exercises every alignment. */
    while (rlen <= 3000) {
        while (wlen <= 3000 && write_one(f->writer, 9, wlen, wtag) == 0) {
            wlen++;
            wtag++;
        }
        for (int i = 0; i < 5 && rlen < wlen; i++) {
            read_one_expect(f->reader, 9, rlen, rtag);
            rlen++;
            rtag++;
        }
        if (wlen > 3000 && rlen == wlen)
            break;
    }
    assert_int_equal(rlen, 3001);
}

/* Writes a record of @len bytes whose first and last 8 bytes (or whole payload, when
 * shorter than 16) carry @tag, and reads it back. */
static void write_read_marked(ring_t *w, ring_t *rd, size_t len, uint64_t tag)
{
    struct ring_wspan ws;
    struct ring_rspan rs;
    /* Urgent: the only records that may take the whole ring. */
    assert_int_equal(ring_try_begin_write_nowait(w, 6, len, &ws), 0);
    if (len < 16) {
        fill_pattern(ws.data, len, tag);
    } else {
        memcpy(ws.data, &tag, 8);
        uint64_t t2 = ~tag;
        memcpy((uint8_t *)ws.data + len - 8, &t2, 8);
    }
    (void)ring_end_write(w, &ws);
    assert_int_equal(ring_begin_read(rd, &rs), 0);
    assert_int_equal(rs.type, 6);
    assert_int_equal(rs.len, len);
    if (len < 16) {
        assert_true(check_pattern(rs.data, len, tag));
    } else {
        uint64_t a, b;
        memcpy(&a, rs.data, 8);
        memcpy(&b, (const uint8_t *)rs.data + len - 8, 8);
        assert_int_equal(a, tag);
        assert_int_equal(b, ~tag);
    }
    ring_end_read(rd, &rs);
}

static void test_ring_every_size_up_to_the_ring(void **state)
{
    struct fixture *f = *state;
    /* Every payload size a 64 KiB ring takes, at the ever-moving offsets the previous
     * records leave (every record starts somewhere else, many straddle the end). */
    for (size_t len = 0; len <= SMALL - sizeof(struct ring_rec); len++)
        write_read_marked(f->writer, f->reader, len, len * 2654435761u + 1);
    struct ring_wspan ws;
    assert_int_equal(ring_try_begin_write(f->writer, 6, SMALL - sizeof(struct ring_rec) + 1, &ws),
                     -EMSGSIZE);
}

static void test_ring_every_size_up_to_max_payload(void **state)
{
    (void)state;
    struct fixture f;
    struct ring_wspan ws;
    struct ring_stats st;

    /* The smallest ring that takes RING_MAX_PAYLOAD: sizes near the maximum, each once
     * at the start and once straddling the end of the data area. */
    assert_int_equal(setup_ring(&f, 2u << 20), 0);
    for (size_t len = RING_MAX_PAYLOAD - 64; len <= RING_MAX_PAYLOAD; len++)
        write_read_marked(f.writer, f.reader, len, len);
    assert_int_equal(write_one(f.writer, 1, RING_MAX_PAYLOAD, 99), 0);
    read_one_expect(f.reader, 1, RING_MAX_PAYLOAD, 99);
    assert_int_equal(ring_try_begin_write(f.writer, 1, (size_t)RING_MAX_PAYLOAD + 1, &ws),
                     -EMSGSIZE);
    assert_int_equal(ring_try_begin_write(f.writer, 1, (size_t)4 << 20, &ws), -EMSGSIZE);
    ring_get_stats(f.writer, &st);
    assert_int_equal(st.records_dropped, 2);
    ring_get_stats(f.reader, &st);
    assert_int_equal(st.records_read, 66);
    (void)teardown(&(void *){&f});
}

/* ---- concurrency ---------------------------------------------------------------- */

#define CONC_WRITERS 4
#if defined(__SANITIZE_THREAD__)
#define CONC_RECORDS 10000
#else
#define CONC_RECORDS 40000
#endif

struct conc_hdr {
    uint32_t writer;
    uint32_t len;
    uint64_t seq;
};

static void *conc_writer(void *arg)
{
    ring_t *w = ((void **)arg)[0];
    uint32_t id = (uint32_t)(uintptr_t)((void **)arg)[1];
    unsigned seed = id * 7919u + 1;

    for (uint64_t seq = 0; seq < CONC_RECORDS; seq++) {
        size_t extra = (size_t)(rand_r(&seed) % 300);
        size_t len = sizeof(struct conc_hdr) + extra;
        struct ring_wspan ws;
        while (ring_try_begin_write(w, 2, len, &ws) < 0)
            sched_yield();
        struct conc_hdr h = {.writer = id, .len = (uint32_t)len, .seq = seq};
        memcpy(ws.data, &h, sizeof(h));
        fill_pattern((uint8_t *)ws.data + sizeof(h), extra, ((uint64_t)id << 32) | seq);
        (void)ring_end_write(w, &ws);
    }
    return NULL;
}

/* Four writer threads, one reader verifying every byte of every record, each writer's
 * records in its reservation order. @rd and @w may be the same mapping. */
static void run_concurrent_writers(ring_t *rd, ring_t *w)
{
    pthread_t th[CONC_WRITERS];
    void *args[CONC_WRITERS][2];
    uint64_t next_seq[CONC_WRITERS] = {0};
    uint64_t total = 0;

    for (uintptr_t i = 0; i < CONC_WRITERS; i++) {
        args[i][0] = w;
        args[i][1] = (void *)i;
        assert_int_equal(pthread_create(&th[i], NULL, conc_writer, args[i]), 0);
    }
    while (total < (uint64_t)CONC_WRITERS * CONC_RECORDS) {
        struct ring_rspan rs;
        int r = ring_begin_read(rd, &rs);
        if (r == -EAGAIN) {
            sched_yield();
            continue;
        }
        assert_int_equal(r, 0);
        assert_int_equal(rs.type, 2);
        struct conc_hdr h;
        assert_true(rs.len >= sizeof(h));
        memcpy(&h, rs.data, sizeof(h));
        assert_true(h.writer < CONC_WRITERS);
        assert_int_equal(h.len, rs.len);
        /* Each writer's records appear in the order it reserved them. */
        assert_int_equal(h.seq, next_seq[h.writer]);
        next_seq[h.writer]++;
        assert_true(check_pattern((const uint8_t *)rs.data + sizeof(h), rs.len - sizeof(h),
                                  ((uint64_t)h.writer << 32) | h.seq));
        ring_end_read(rd, &rs);
        total++;
    }
    for (int i = 0; i < CONC_WRITERS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    struct ring_rspan rs;
    assert_int_equal(ring_begin_read(rd, &rs), -EAGAIN);
    struct ring_stats st;
    ring_get_stats(rd, &st);
    assert_int_equal(st.records_read, total);
}

/* Reader and writers share one mapping: this is the variant ThreadSanitizer checks. It
 * tracks memory and synchronisation by virtual address, so with two mappings of the same
 * pages in one process (next test) it cannot link a writer's release of a commit tag,
 * seen by the reader through its own mapping, to the reader's release of read_pos that
 * lets the next writer reuse the bytes, and reports the reuse (writer A's payload, then
 * writer B's header at the same offset one lap later) as a race. In production the
 * reader is another process, where the same release/acquire chain holds through the
 * shared pages; the one-mapping variant has the identical chain in a form TSan sees. */
static void test_ring_concurrent_writers(void **state)
{
    struct fixture *f = *state;
    run_concurrent_writers(f->writer, f->writer);
}

static void test_ring_concurrent_writers_two_mappings(void **state)
{
    struct fixture *f = *state;
    SKIP_UNDER_TSAN();
    run_concurrent_writers(f->reader, f->writer);
}

static void test_ring_writer_in_other_process(void **state)
{
    struct fixture *f = *state;
    const uint64_t n = 20000;

    SKIP_UNDER_TSAN();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ring_t *w = NULL;
        if (ring_map(f->fd, RING_ROLE_WRITER, &w) < 0)
            _exit(2);
        for (uint64_t i = 0; i < n; i++) {
            size_t len = 8 + (size_t)(i % 500);
            struct ring_wspan ws;
            while (ring_try_begin_write(w, 5, len, &ws) < 0)
                sched_yield();
            memcpy(ws.data, &i, 8);
            fill_pattern((uint8_t *)ws.data + 8, len - 8, i);
            (void)ring_end_write(w, &ws);
        }
        _exit(0);
    }
    for (uint64_t i = 0; i < n;) {
        struct ring_rspan rs;
        int r = ring_begin_read(f->reader, &rs);
        if (r == -EAGAIN) {
            sched_yield();
            continue;
        }
        assert_int_equal(r, 0);
        uint64_t got;
        assert_int_equal(rs.len, 8 + i % 500);
        memcpy(&got, rs.data, 8);
        assert_int_equal(got, i);
        assert_true(check_pattern((const uint8_t *)rs.data + 8, rs.len - 8, i));
        ring_end_read(f->reader, &rs);
        i++;
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- corrupt shared data -------------------------------------------------------- */

static struct ring_rec *rec_at(ring_t *w, uint64_t pos)
{
    return (struct ring_rec *)(w->lane[0].data + (pos & w->mask));
}

static void test_ring_corrupt_header_fields(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    struct ring_rec *rec = rec_at(f->writer, 0);

    assert_int_equal(write_one(f->writer, 1, 40, 1), 0);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);

    rec->len_total = 0;
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->len_total = 8;
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->len_total = 60; /* not a multiple of 8 */
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->len_total = 72; /* longer than what was reserved */
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->len_total = 0xfffffff8u;
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->len_total = 64;
    rec->flags = 0x100;
    assert_int_equal(ring_begin_read(f->reader, &rs), -EBADMSG);
    rec->flags = 0;
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    assert_int_equal(rs.len, 40);

    /* Tag of another lap: not published yet. */
    atomic_store(&rec->commit_tag, (0 + SMALL) ^ RING_TAG_MAGIC);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    atomic_store(&rec->commit_tag, 0 ^ RING_TAG_MAGIC);

    /* Positions a hostile writer may leave. The reader loads write_pos again once it has
     * read up to the position it saw last; forget that snapshot before each store. */
    struct ring_shared *h = f->writer->hdr;
    ring_t *rd = f->reader;
    rd->lane[0].seen_write_pos = rd->lane[0].read_pos;
    atomic_store(&h->write_pos, (uint64_t)SMALL * 2);
    assert_int_equal(ring_begin_read(rd, &rs), -EBADMSG);
    rd->lane[0].seen_write_pos = rd->lane[0].read_pos;
    atomic_store(&h->write_pos, 60);
    assert_int_equal(ring_begin_read(rd, &rs), -EBADMSG);
    rd->lane[0].seen_write_pos = rd->lane[0].read_pos;
    atomic_store(&h->write_pos, 8);
    assert_int_equal(ring_begin_read(rd, &rs), -EBADMSG);
    rd->lane[0].seen_write_pos = rd->lane[0].read_pos;
    atomic_store(&h->write_pos, UINT64_MAX - 7);
    assert_int_equal(ring_begin_read(rd, &rs), -EBADMSG);
    /* read_pos in shared memory is not trusted by the reader. */
    rd->lane[0].seen_write_pos = rd->lane[0].read_pos;
    atomic_store(&h->write_pos, 64);
    atomic_store(&h->read_pos, 12345);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    assert_int_equal(rs.len, 40);
    ring_end_read(f->reader, &rs);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

static void test_ring_corrupt_random_bytes_never_crash(void **state)
{
    struct fixture *f = *state;
    /* Seed 12345; 300 rounds of random garbage in the data area and positions. */
    unsigned seed = 12345;
    struct ring_shared *h = f->writer->hdr;
    uint64_t *words = (uint64_t *)f->writer->lane[0].data;
    size_t nwords = SMALL / 8;
    int ok = 0, bad = 0, again = 0;

    for (int round = 0; round < 300; round++) {
        for (size_t i = 0; i < 64; i++) {
            size_t at = (size_t)rand_r(&seed) % nwords;
            uint64_t v = ((uint64_t)rand_r(&seed) << 33) ^ (uint64_t)rand_r(&seed);
            if (rand_r(&seed) % 2) {
                /* Plausible header: valid tag for the reader's position, random length. */
                uint64_t rp = f->reader->lane[0].read_pos;
                uint64_t len = 8 * (uint64_t)(rand_r(&seed) % 64);
                uint64_t pad = (uint64_t)(rand_r(&seed) % 8);
                at = (size_t)(rp & f->reader->mask) / 8;
                words[at] = rp ^ RING_TAG_MAGIC;
                words[(at + 1) % nwords] = rand_r(&seed) % 4 ? len | pad << 48 : v;
            } else {
                words[at] = v;
            }
        }
        uint64_t rp = f->reader->lane[0].read_pos;
        uint64_t span = (uint64_t)rand_r(&seed) % (3 * SMALL);
        atomic_store(&h->write_pos, rp + (rand_r(&seed) % 2 ? span & ~7ull : span));
        f->reader->lane[0].seen_write_pos = rp; /* as if it had caught up: it loads write_pos */
        for (int i = 0; i < 20; i++) {
            struct ring_rspan rs;
            int r = ring_begin_read(f->reader, &rs);
            if (r == 0) {
                /* The record must lie inside the mapping of the data area. */
                const uint8_t *p = rs.data;
                assert_true(p >= f->reader->lane[0].data);
                assert_true(p + rs.len <= f->reader->lane[0].data + 2 * SMALL);
                volatile uint8_t sink = 0;
                for (size_t j = 0; j < rs.len; j++)
                    sink ^= p[j];
                (void)sink;
                ring_end_read(f->reader, &rs);
                ok++;
            } else if (r == -EBADMSG) {
                bad++;
                break;
            } else {
                assert_int_equal(r, -EAGAIN);
                again++;
                break;
            }
        }
    }
    assert_true(bad > 0);
    assert_true(ok > 0);
    (void)again;
}

/* ---- writers that never publish ------------------------------------------------ */

/* Calls ring_begin_read() until it stops returning -EAGAIN or @limit_ms passed. */
static int read_until_not_again(ring_t *rd, struct ring_rspan *rs, uint64_t limit_ms,
                                uint64_t *ret_waited_ms)
{
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    int r;
    while ((r = ring_begin_read(rd, rs)) == -EAGAIN &&
           hp_clock_ns(CLOCK_MONOTONIC) - t0 < limit_ms * 1000000u)
        usleep(1000);
    *ret_waited_ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000u;
    return r;
}

static void test_ring_stalled_record_names_its_writer(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws, ws2;
    struct ring_rspan rs;
    uint64_t waited_ms;

    ring_set_stall_timeout(f->reader, 50000);
    /* A slow writer that publishes within the timeout is waited for. */
    assert_int_equal(ring_try_begin_write(f->writer, 1, 24, &ws), 0);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    usleep(30000);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    (void)ring_end_write(f->writer, &ws);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);

    /* The timeout restarts for each record: waiting 30 ms again is fine. */
    assert_int_equal(ring_try_begin_write(f->writer, 1, 24, &ws), 0);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    usleep(30000);
    (void)ring_end_write(f->writer, &ws);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);

    /* A reserved record never published, with later ones published behind it: after the
     * stall timeout the reader is told (not "corrupt"), with the writer's thread id. */
    assert_int_equal(ring_try_begin_write(f->writer, 1, 24, &ws), 0);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 24, &ws2), 0);
    (void)ring_end_write(f->writer, &ws2);
    assert_int_equal(read_until_not_again(f->reader, &rs, 5000, &waited_ms), -ETIMEDOUT);
    assert_true(waited_ms >= 50);
    assert_true(waited_ms < 2000);
    assert_int_equal(ring_stalled_writer(f->reader), (uint32_t)gettid());
    /* It says so again until the caller decides; waiting on restarts the timeout. */
    assert_int_equal(ring_begin_read(f->reader, &rs), -ETIMEDOUT);
    ring_stall_rearm(f->reader);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    assert_int_equal(read_until_not_again(f->reader, &rs, 5000, &waited_ms), -ETIMEDOUT);
    assert_true(waited_ms >= 40);
    /* Published at last: read as usual, then the record behind it. */
    (void)ring_end_write(f->writer, &ws);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

/* A writer that will never come back (its thread is gone): the reader steps over its
 * record, counts it, and reads on. */
static void test_ring_stalled_record_skipped(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws;
    struct ring_rspan rs;
    uint64_t waited_ms;

    ring_set_stall_timeout(f->reader, 20000);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 40, &ws), 0);
    assert_int_equal(write_one(f->writer, 2, 24, 7), 0);
    assert_int_equal(read_until_not_again(f->reader, &rs, 5000, &waited_ms), -ETIMEDOUT);
    assert_int_equal(ring_skip_stalled(f->reader), 0);
    read_one_expect(f->reader, 2, 24, 7);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    struct ring_stats st;
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.records_skipped, 1);
    assert_int_equal(st.records_read, 1);
    /* Nothing to skip while nothing stalls. */
    assert_int_equal(ring_skip_stalled(f->reader), -EAGAIN);
}

static void test_ring_stalled_by_hostile_write_pos(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    uint64_t waited_ms;

    /* write_pos moved ahead with no record behind it: a stall whose writer is unnamed,
     * and whose header (zeros) cannot be skipped. */
    ring_set_stall_timeout(f->reader, 20000);
    atomic_store(&f->writer->hdr->write_pos, 4096);
    assert_int_equal(read_until_not_again(f->reader, &rs, 5000, &waited_ms), -ETIMEDOUT);
    assert_true(waited_ms >= 20);
    assert_int_equal(ring_stalled_writer(f->reader), 0);
    assert_int_equal(ring_skip_stalled(f->reader), -EBADMSG);
}

static void test_ring_writer_died_mid_record(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    uint64_t waited_ms;

    SKIP_UNDER_TSAN();
    ring_set_stall_timeout(f->reader, 50000);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ring_t *w = NULL;
        struct ring_wspan ws;
        if (ring_map(f->fd, RING_ROLE_WRITER, &w) < 0)
            _exit(2);
        for (int i = 0; i < 10; i++) {
            if (ring_try_begin_write(w, 1, 100, &ws) < 0)
                _exit(3);
            memset(ws.data, i, 100);
            if (i != 5) /* dies with record 5 reserved but not published */
                (void)ring_end_write(w, &ws);
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        assert_int_equal(((const uint8_t *)rs.data)[99], i);
        ring_end_read(f->reader, &rs);
    }
    assert_int_equal(read_until_not_again(f->reader, &rs, 5000, &waited_ms), -ETIMEDOUT);
    assert_true(waited_ms >= 50);
    /* The child's only thread held it; once skipped, its later records are all there. */
    assert_int_equal(ring_stalled_writer(f->reader), (uint32_t)pid);
    assert_int_equal(ring_skip_stalled(f->reader), 0);
    for (int i = 6; i < 10; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        assert_int_equal(((const uint8_t *)rs.data)[99], i);
        ring_end_read(f->reader, &rs);
    }
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

/* ---- waking the reader (futex) ---------------------------------------------------- */

struct waiter {
    ring_t *r;
    int ret;
    uint64_t waited_ms;
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    w->ret = ring_wait(w->r, 5000);
    w->waited_ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000u;
    return NULL;
}

/* A sleeping reader is woken by the first record (no descriptor involved), and by a
 * client that ends the session itself, whose reason it then reads. */
static void test_ring_futex_wakes_reader(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws;
    struct ring_rspan rs;
    pthread_t th;
    struct waiter w = {.r = f->reader};

    /* Nothing written: the wait times out. */
    ring_set_reader_idle(f->reader, true);
    assert_int_equal(ring_wait(f->reader, 20), -ETIMEDOUT);

    assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0);
    usleep(50000);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws), 0);
    assert_true(ring_end_write(f->writer, &ws));
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(w.ret, 0);
    assert_true(w.waited_ms < 2000);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);

    /* Woken already: the next wait returns at once. */
    ring_set_reader_idle(f->reader, true);
    ring_wake_reader(f->writer);
    assert_int_equal(ring_wait(f->reader, 5000), 0);

    assert_int_equal(ring_client_ended(f->reader), RING_END_NONE);
    ring_set_reader_idle(f->reader, true);
    w = (struct waiter){.r = f->reader};
    assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0);
    usleep(50000);
    ring_set_client_ended(f->writer, RING_END_CONN_TAKEN);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(w.ret, 0);
    assert_true(w.waited_ms < 2000);
    assert_int_equal(ring_client_ended(f->reader), RING_END_CONN_TAKEN);
}

/* ---- reader idle / wakeup ------------------------------------------------------- */

static void test_ring_reader_idle_wakeup(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws;
    struct ring_rspan rs;

    /* Not idle: no poke. */
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws), 0);
    assert_false(ring_end_write(f->writer, &ws));
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    ring_end_read(f->reader, &rs);

    /* Idle: exactly the first writer afterwards pokes. */
    ring_set_reader_idle(f->reader, true);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws), 0);
    struct ring_wspan ws2;
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws2), 0);
    assert_true(ring_end_write(f->writer, &ws));
    assert_false(ring_end_write(f->writer, &ws2));

    /* The reader clears the flag itself when it wakes for another reason. */
    ring_set_reader_idle(f->reader, true);
    ring_set_reader_idle(f->reader, false);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws), 0);
    assert_false(ring_end_write(f->writer, &ws));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        ring_end_read(f->reader, &rs);
    }
}

struct wake_ctx {
    ring_t *w;
    int pipe_w;
    int n;
};

static void *wake_writer(void *arg)
{
    struct wake_ctx *c = arg;
    for (int i = 0; i < c->n; i++) {
        struct ring_wspan ws;
        while (ring_try_begin_write(c->w, 1, 16, &ws) < 0)
            sched_yield();
        memcpy(ws.data, &i, sizeof(i));
        if (ring_end_write(c->w, &ws)) {
            char b = 1;
            assert_int_equal(write(c->pipe_w, &b, 1), 1);
        }
        if (i % 64 == 0)
            usleep(50);
    }
    return NULL;
}

/* The reader tells the writers its position in steps (each store takes the line from
 * them): after an eighth of the ring, at once while the ring is crowded, and whenever it
 * runs out of records. */
static void test_ring_read_pos_published_in_steps(void **state)
{
    struct fixture *f = *state;
    struct ring_shared *h = f->writer->hdr;
    struct ring_rspan rs;
    const size_t len = 992; /* 1016 bytes */
    size_t step = SMALL / 8 / 1016 + 1;

    for (size_t i = 0; i < step + 2; i++)
        assert_int_equal(write_one(f->writer, 7, len, i), 0);
    read_one_expect(f->reader, 7, len, 0);
    assert_int_equal(atomic_load(&h->read_pos), 0);
    for (size_t i = 1; i < step; i++)
        read_one_expect(f->reader, 7, len, i);
    assert_int_equal(atomic_load(&h->read_pos), step * 1016);
    read_one_expect(f->reader, 7, len, step);
    assert_int_equal(atomic_load(&h->read_pos), step * 1016);
    read_one_expect(f->reader, 7, len, step + 1);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    assert_int_equal(atomic_load(&h->read_pos), (step + 2) * 1016);

    /* Crowded (more than half full when last looked at): every record read is
     * published. */
    size_t n = 0;
    while (write_one(f->writer, 7, len, n) == 0)
        n++;
    uint64_t base = (step + 2) * 1016;
    read_one_expect(f->reader, 7, len, 0);
    assert_int_equal(atomic_load(&h->read_pos), base + 1016);
    read_one_expect(f->reader, 7, len, 1);
    assert_int_equal(atomic_load(&h->read_pos), base + 2 * 1016);
    assert_int_equal(write_one(f->writer, 7, len, n), 0);
}

/* Polling: no pokes while fewer than wake_fill bytes wait; the write that reaches it pokes,
 * once; an idle (sleeping) reader is poked by the next record as before. */
static void test_ring_reader_polling_pokes_at_fill(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws;
    struct ring_rspan rs;

    ring_set_reader_polling(f->reader, 4 * 64);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ring_try_begin_write(f->writer, 1, 48, &ws), 0); /* 64 B */
        assert_false(ring_end_write(f->writer, &ws));
    }
    assert_int_equal(ring_try_begin_write(f->writer, 1, 48, &ws), 0);
    assert_true(ring_end_write(f->writer, &ws)); /* 256 B waiting */
    assert_int_equal(ring_try_begin_write(f->writer, 1, 48, &ws), 0);
    assert_false(ring_end_write(f->writer, &ws)); /* already poked */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        ring_end_read(f->reader, &rs);
    }

    /* Drained ring, polling again: the threshold counts from the read position. */
    ring_set_reader_polling(f->reader, 2 * 64);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 48, &ws), 0);
    assert_false(ring_end_write(f->writer, &ws));
    assert_int_equal(ring_try_begin_write(f->writer, 1, 48, &ws), 0);
    assert_true(ring_end_write(f->writer, &ws));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        ring_end_read(f->reader, &rs);
    }

    /* 0 means a quarter of the ring. */
    ring_set_reader_polling(f->reader, 0);
    size_t n = 0;
    bool poked = false;
    while (!poked) {
        assert_int_equal(ring_try_begin_write(f->writer, 1, 1000, &ws), 0);
        poked = ring_end_write(f->writer, &ws);
        n++;
    }
    assert_int_equal(n, (SMALL / 4 + ring__record_total(1000) - 1) / ring__record_total(1000));
    while (ring_begin_read(f->reader, &rs) == 0)
        ring_end_read(f->reader, &rs);

    /* From polling to sleeping: the next record pokes. */
    ring_set_reader_polling(f->reader, 0);
    ring_set_reader_idle(f->reader, true);
    assert_int_equal(ring_try_begin_write(f->writer, 1, 8, &ws), 0);
    assert_true(ring_end_write(f->writer, &ws));
}

static void test_ring_reader_idle_no_lost_wakeup(void **state)
{
    struct fixture *f = *state;
    struct wake_ctx c = {.w = f->writer, .n = 3000};
    int p[2];
    pthread_t th;
    int got = 0;

    assert_int_equal(pipe(p), 0);
    c.pipe_w = p[1];
    assert_int_equal(pthread_create(&th, NULL, wake_writer, &c), 0);
    /* The reader sleeps in read() on the pipe; a lost wakeup would hang here (the test
     * harness timeout then fails the test). */
    while (got < c.n) {
        struct ring_rspan rs;
        int r = ring_begin_read(f->reader, &rs);
        if (r == 0) {
            ring_end_read(f->reader, &rs);
            got++;
            continue;
        }
        assert_int_equal(r, -EAGAIN);
        ring_set_reader_idle(f->reader, true);
        r = ring_begin_read(f->reader, &rs);
        if (r == 0) {
            ring_set_reader_idle(f->reader, false);
            ring_end_read(f->reader, &rs);
            got++;
            continue;
        }
        char b;
        assert_int_equal(read(p[0], &b, 1), 1);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    (void)close(p[0]);
    (void)close(p[1]);
}

/* ---- blocking mode -------------------------------------------------------------- */

static void test_ring_blocking_times_out(void **state)
{
    struct fixture *f = *state;
    struct ring_stats st;

    while (write_one(f->writer, 1, 4000, 0) == 0) {
    }
    ring_set_blocking(f->writer, true, 3000);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    assert_int_equal(write_one(f->writer, 1, 4000, 0), -EAGAIN);
    uint64_t waited = hp_clock_ns(CLOCK_MONOTONIC) - t0;
    assert_true(waited >= 3000000u);
    ring_get_stats(f->writer, &st);
    assert_true(st.client_spinlock_blocked_us >= 3000);
    assert_int_equal(st.records_dropped, 2);
}

/* The bug: with a stopped reader every record waited out the whole timeout, for as long
 * as the reader stayed stopped (a malloc loop fell to ~600 per second). Now the first
 * wait that runs out ends blocking: the next writes fail at once, and the reader learns
 * it from block_timeouts. A timeout above RING_MAX_BLOCK_TIMEOUT_US is capped. */
static void test_ring_bug_stopped_reader_blocks_every_record(void **state)
{
    struct fixture *f = *state;
    struct ring_stats st;

    ring_set_blocking(f->writer, true, UINT32_MAX);
    assert_int_equal(atomic_load(&f->writer->block_timeout_us), RING_MAX_BLOCK_TIMEOUT_US);
    ring_set_blocking(f->writer, false, 0);
    while (write_one(f->writer, 1, 4000, 0) == 0) {
    }
    ring_set_blocking(f->writer, true, 200u * 1000u);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    assert_int_equal(write_one(f->writer, 1, 4000, 0), -EAGAIN);
    uint64_t waited = hp_clock_ns(CLOCK_MONOTONIC) - t0;
    assert_true(waited >= 200u * 1000u * 1000u);
    t0 = hp_clock_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < 100; i++)
        assert_int_equal(write_one(f->writer, 1, 4000, 0), -EAGAIN);
    assert_true(hp_clock_ns(CLOCK_MONOTONIC) - t0 < 100u * 1000u * 1000u);
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.block_timeouts, 1);
    assert_int_equal(st.records_dropped, 102);
}

/* Frees never wait, whatever the block mode; they find room in the share of the ring
 * samples leave them; a free that finds none is counted. */
static void test_ring_nowait_never_waits(void **state)
{
    struct fixture *f = *state;
    struct ring_stats st;
    struct ring_wspan w;

    ring_set_blocking(f->writer, true, 1000);
    while (write_one(f->writer, 1, 16, 0) == 0) {
    }
    ring_set_blocking(f->writer, true, 500000);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    size_t urgent = 0;
    while (ring_try_begin_write_nowait(f->writer, 2, 16, &w) == 0) {
        (void)ring_end_write(f->writer, &w);
        urgent++;
    }
    ring_count_free_lost(f->writer);
    assert_true(hp_clock_ns(CLOCK_MONOTONIC) - t0 < 100u * 1000u * 1000u);
    /* 40-byte records in what the samples left: the reserved eighth of the ring, and
     * what was too short for one more sample below it. */
    assert_int_equal(urgent, (SMALL - SMALL_SAMPLES / 40 * 40) / 40);
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.frees_lost, 1);
    assert_int_equal(st.block_timeouts, 1); /* the filling write that waited 1 ms */
}

/* Reads enough 4000-byte records for one more, besides the share a blocking writer leaves
 * to frees (RING_URGENT_RESERVE_SHIFT). */
static void *slow_drain(void *arg)
{
    ring_t *rd = arg;
    struct ring_rspan rs;
    usleep(2000);
    for (unsigned n = 0; n < 1 + (SMALL >> RING_URGENT_RESERVE_SHIFT) / 4000 + 1; n++) {
        while (ring_begin_read(rd, &rs) != 0)
            sched_yield();
        ring_end_read(rd, &rs);
    }
    return NULL;
}

/* A blocking writer waits for room instead of dropping, and its wait is counted. The
 * reader drains 2 ms after it was started, which is after the writer began to wait unless
 * the writer was kept off the CPU all that time (a busy machine): such a round, which
 * waited less than 1 ms, is played again, up to 20 times. Every round must write without
 * a drop beyond the one that found the ring full. */
static void test_ring_blocking_waits_for_space(void **state)
{
    struct fixture *f = *state;
    struct ring_stats st;
    uint64_t blocked_us = 0;

    ring_get_stats(f->writer, &st);
    uint64_t dropped = st.records_dropped, blocked = st.client_spinlock_blocked_us;
    for (int round = 0; round < 20 && blocked_us < 1000; round++) {
        pthread_t th;
        while (write_one(f->writer, 1, 4000, 0) == 0) {
        }
        ring_set_blocking(f->writer, true, 2000000);
        assert_int_equal(pthread_create(&th, NULL, slow_drain, f->reader), 0);
        assert_int_equal(write_one(f->writer, 1, 4000, 0), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        ring_get_stats(f->writer, &st);
        assert_int_equal(st.records_dropped - dropped, 1);
        blocked_us = st.client_spinlock_blocked_us - blocked;
        dropped = st.records_dropped;
        blocked = st.client_spinlock_blocked_us;
        if (blocked_us < 1000)
            print_message("  round %d waited only %llu us: played again\n", round,
                          (unsigned long long)blocked_us);
    }
    assert_true(blocked_us >= 1000);
}

/* ---- end of session, fork ------------------------------------------------------ */

static void test_ring_detached_stops_writers(void **state)
{
    struct fixture *f = *state;
    struct ring_wspan ws;
    struct ring_rspan rs;
    struct ring_stats st;
    static uint8_t before[SMALL];

    assert_false(ring_is_detached(f->writer));
    assert_int_equal(write_one(f->writer, 1, 40, 1), 0);
    assert_int_equal(ring_try_begin_write(f->writer, 2, 100, &ws), 0);
    fill_pattern(ws.data, 100, 2);

    ring_set_detached(f->reader);
    assert_true(ring_is_detached(f->writer));
    uint64_t wp = atomic_load(&f->writer->hdr->write_pos);
    memcpy(before, f->writer->lane[0].data, SMALL);
    struct ring_wspan ws2;
    for (size_t len = 0; len < 5000; len += 333)
        assert_int_equal(ring_try_begin_write(f->writer, 3, len, &ws2), -EPIPE);
    assert_int_equal(ring_try_begin_write(f->writer, 3, SIZE_MAX, &ws2), -EPIPE);
    /* Neither the data area nor the positions moved; nothing is counted as dropped. */
    assert_memory_equal(before, f->writer->lane[0].data, SMALL);
    assert_int_equal(atomic_load(&f->writer->hdr->write_pos), wp);
    ring_get_stats(f->writer, &st);
    assert_int_equal(st.records_dropped, 0);

    /* A record reserved before the detach is still published and drained. */
    (void)ring_end_write(f->writer, &ws);
    read_one_expect(f->reader, 1, 40, 1);
    read_one_expect(f->reader, 2, 100, 2);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

/* The end of a session: what lies before the mark is stepped over and counted, records
 * still being written (reserved, never published) included, without reading any. */
static void test_ring_discard_counts_what_is_left(void **state)
{
    struct fixture *f = *state;
    uint64_t n = 0, frees = 0;
    for (int i = 0; i < 10; i++)
        assert_int_equal(write_one(f->writer, i % 3 == 0 ? 2 : 1, 24 + (size_t)i * 8, (uint64_t)i),
                         0);
    read_one_expect(f->reader, 2, 24, 0);
    struct ring_wspan ws;
    assert_int_equal(ring_try_begin_write(f->writer, 2, 24, &ws), 0); /* never published */
    ring_set_detached(f->reader);
    uint64_t mark = ring_mark(f->reader);
    /* A writer that ignores the detached flag writes on: not before the mark. */
    atomic_store(&f->writer->hdr->detached, 0u);
    assert_int_equal(write_one(f->writer, 2, 24, 99), 0);
    assert_int_equal(ring_discard(f->reader, mark, 1u << 2, NULL, NULL, &n, &frees), 0);
    assert_int_equal(n, 10);    /* 9 published after the one read, and the unpublished one */
    assert_int_equal(frees, 4); /* records 3, 6, 9 and the unpublished one */
    assert_true(ring_reached(f->reader, mark));
    /* Nothing before the mark is left; the one after it is still there. */
    read_one_expect(f->reader, 2, 24, 99);
    assert_int_equal(ring_discard(f->reader, ring_mark(f->reader), 1u << 2, NULL, NULL, &n, &frees),
                     0);
    assert_int_equal(n, 0);
}

/* What a record holds, counted by the caller's function: its payload when published,
 * NULL when not (its bytes may be anything). */
static uint64_t count_payload(uint16_t type, const void *payload, size_t len, void *arg)
{
    (void)arg;
    if (type != 2)
        return 0;
    if (!payload)
        return 1000;
    for (uint64_t tag = 1; tag <= 5; tag += 2)
        if (check_pattern(payload, len, tag))
            return tag;
    return 0;
}

static void test_ring_discard_counts_with_a_function(void **state)
{
    struct fixture *f = *state;
    uint64_t n = 0, counted = 0;
    for (int i = 0; i < 6; i++)
        assert_int_equal(write_one(f->writer, i % 2 ? 2 : 1, 24, (uint64_t)i), 0);
    struct ring_wspan ws;
    assert_int_equal(ring_try_begin_write(f->writer, 2, 24, &ws), 0); /* never published */
    ring_set_detached(f->reader);
    uint64_t mark = ring_mark(f->reader);
    assert_int_equal(
        ring_discard(f->reader, mark, 1u << 1 | 1u << 2, count_payload, NULL, &n, &counted), 0);
    assert_int_equal(n, 7);
    assert_int_equal(counted, 1 + 3 + 5 + 1000);
}

/* A mark the client forged (beyond the ring, unaligned) or a header it broke ends the
 * discard without reading outside the ring. */
static void test_ring_discard_hostile(void **state)
{
    struct fixture *f = *state;
    uint64_t n = 0, frees = 0;
    assert_int_equal(write_one(f->writer, 1, 40, 1), 0);
    assert_int_equal(
        ring_discard(f->reader, ring_mark(f->reader) + SMALL * 4, 1u << 1, NULL, NULL, &n, &frees),
        -EBADMSG);
    assert_int_equal(
        ring_discard(f->reader, ring_mark(f->reader) + 4, 1u << 1, NULL, NULL, &n, &frees),
        -EBADMSG);
    assert_int_equal(write_one(f->writer, 1, 40, 2), 0);
    uint64_t mark = ring_mark(f->reader);
    rec_at(f->writer, mark - 64)->len_total = 0x7ffffff8u;
    assert_int_equal(ring_discard(f->reader, mark, 1u << 1, NULL, NULL, &n, &frees), -EBADMSG);
    assert_int_equal(n, 1);
}

/* The client's word that its process exits, the samples it dropped because it could not
 * watch their addresses, and the call slots it could not switch reach the reader. */
static void test_ring_exit_and_freeset_counted(void **state)
{
    struct fixture *f = *state;
    struct ring_stats st;
    assert_false(ring_client_exiting(f->reader));
    ring_set_client_exiting(f->writer);
    assert_true(ring_client_exiting(f->reader));
    ring_count_freeset_full(f->writer);
    ring_count_freeset_full(f->writer);
    ring_count_drop(f->writer);
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.freeset_full, 2);
    assert_int_equal(st.records_dropped, 3);
    assert_int_equal(st.unseen_slots, 0);
    ring_set_unseen_slots(f->writer, 4);
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.unseen_slots, 4);
}

static void *detach_later(void *arg)
{
    usleep(20000);
    ring_set_detached(arg);
    return NULL;
}

static void test_ring_detached_releases_blocked_writer(void **state)
{
    struct fixture *f = *state;
    pthread_t th;

    while (write_one(f->writer, 1, 4000, 0) == 0) {
    }
    ring_set_blocking(f->writer, true, 10 * 1000 * 1000);
    assert_int_equal(pthread_create(&th, NULL, detach_later, f->reader), 0);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    assert_int_equal(write_one(f->writer, 1, 4000, 0), -EPIPE);
    uint64_t waited_ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000u;
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(waited_ms < 5000);
    struct ring_stats st;
    ring_get_stats(f->writer, &st);
    assert_true(st.client_spinlock_blocked_us > 0);
}

static void test_ring_fork_child_never_writes(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;

    assert_int_equal(write_one(f->writer, 1, 16, 1), 0);
    uint64_t wp = atomic_load(&f->writer->hdr->write_pos);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child inherited the parent's ring_t pointer: it must see a dead ring. */
        struct ring_wspan ws;
        struct ring_stats st;
        int bad = 0;
        bad |= !ring_is_detached(f->writer) << 0;
        bad |= (ring_try_begin_write(f->writer, 1, 16, &ws) != -EPIPE) << 1;
        ring_get_stats(f->writer, &st);
        bad |= (st.records_dropped != 0 || st.size_bytes != 0) << 2;
        f->writer = ring_unmap(f->writer);
        _exit(bad);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's ring is intact and still usable. */
    assert_false(ring_is_detached(f->writer));
    assert_int_equal(atomic_load(&f->writer->hdr->write_pos), wp);
    assert_int_equal(write_one(f->writer, 1, 16, 2), 0);
    read_one_expect(f->reader, 1, 16, 1);
    read_one_expect(f->reader, 1, 16, 2);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

/* ---- lanes ------------------------------------------------------------------------- */

#define LANES_SIZE (2 * SMALL) /* two lanes of SMALL */

static int setup_lanes(void **state)
{
    static struct fixture f;
    *state = &f;
    f.fd = -1;
    f.reader = f.writer = NULL;
    if (ring_create_lanes(LANES_SIZE, 2, &f.fd) < 0)
        return -1;
    if (ring_map(f.fd, RING_ROLE_READER, &f.reader) < 0 ||
        ring_map(f.fd, RING_ROLE_WRITER, &f.writer) < 0)
        return -1;
    return 0;
}

static int teardown_lanes(void **state)
{
    ring__set_writer_lane(-1);
    return teardown(state);
}

/* Reserves a record of @len bytes in lane @lane, filled with @tag's pattern, unpublished. */
static void reserve_in(ring_t *w, unsigned lane, size_t len, uint64_t tag, struct ring_wspan *ws)
{
    ring__set_writer_lane((int)lane);
    assert_int_equal(ring_try_begin_write(w, 1, len, ws), 0);
    assert_int_equal(ws->lane, lane);
    fill_pattern(ws->data, len, tag);
}

static void write_in(ring_t *w, unsigned lane, size_t len, uint64_t tag)
{
    struct ring_wspan ws;
    reserve_in(w, lane, len, tag, &ws);
    (void)ring_end_write(w, &ws);
}

/* Lane counts and sizes the creator and the mapper accept: a power of two up to
 * RING_MAX_LANES, lanes of RING_MIN_LANE_SIZE or more. A header that says otherwise (a
 * peer posing as the service) is not mapped. */
static void test_ring_lanes_geometry(void **state)
{
    (void)state;
    int fd = -1;
    assert_int_equal(ring_create_lanes(SMALL, 2, &fd), -EINVAL);
    assert_int_equal(ring_create_lanes(4 * SMALL, 3, &fd), -EINVAL);
    assert_int_equal(ring_create_lanes(16 * SMALL, 16, &fd), -EINVAL);
    assert_int_equal(ring_create_lanes(4 * SMALL, 0, &fd), -EINVAL);
    assert_int_equal(fd, -1);
    assert_int_equal(ring_create_lanes(8 * SMALL, 8, &fd), 0);
    ring_t *r = NULL;
    assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), 0);
    assert_int_equal(ring_size(r), SMALL);
    r = ring_unmap(r);
    (void)close(fd);

    static const uint32_t bad[] = {3, 16, 2};
    for (size_t i = 0; i < HP_ARRAY_SIZE(bad); i++) {
        fd = ring_fake_fd(F_SEAL_SHRINK | F_SEAL_GROW); /* SMALL bytes: 2 lanes too small */
        struct ring_shared *h =
            mmap(NULL, RING_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(h != MAP_FAILED);
        h->lanes = bad[i];
        assert_int_equal(munmap(h, RING_HEADER_SIZE), 0);
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0);
        assert_int_equal(ring_map(fd, RING_ROLE_WRITER, &r), -EBADMSG);
        assert_int_equal(ring_map(fd, RING_ROLE_READER, &r), -EBADMSG);
        (void)close(fd);
    }
}

/* Records written one after another into either lane come out in the order they were
 * written, however the lanes alternate. */
static void test_ring_lanes_merge_in_write_order(void **state)
{
    struct fixture *f = *state;
    static const unsigned pattern[] = {0, 0, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1};
    for (int round = 0; round < 50; round++) {
        for (size_t i = 0; i < HP_ARRAY_SIZE(pattern); i++)
            write_in(f->writer, pattern[i], 24 + i * 8, (uint64_t)round * 100 + i);
        for (size_t i = 0; i < HP_ARRAY_SIZE(pattern); i++) {
            struct ring_rspan rs;
            assert_int_equal(ring_begin_read(f->reader, &rs), 0);
            assert_int_equal(rs.lane, pattern[i]);
            assert_int_equal(rs.len, 24 + i * 8);
            assert_true(check_pattern(rs.data, rs.len, (uint64_t)round * 100 + i));
            ring_end_read(f->reader, &rs);
        }
        struct ring_rspan rs;
        assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    }
    struct ring_stats st;
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.records_read, 50 * HP_ARRAY_SIZE(pattern));
}

/* A record reserved but not published holds back the records of other lanes written
 * after it (they may tell what happened after it), not those written before. */
static void test_ring_lanes_unpublished_holds_later_records(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    struct ring_wspan held;

    write_in(f->writer, 0, 8, 1);
    reserve_in(f->writer, 1, 8, 2, &held);
    write_in(f->writer, 0, 8, 3);
    read_one_expect(f->reader, 1, 8, 1);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    (void)ring_end_write(f->writer, &held);
    read_one_expect(f->reader, 1, 8, 2);
    read_one_expect(f->reader, 1, 8, 3);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);

    /* Held past the stall timeout, it is reported like any stalled record and can be
     * skipped; the rest follows in order. */
    ring_set_stall_timeout(f->reader, 1000);
    reserve_in(f->writer, 1, 8, 4, &held);
    write_in(f->writer, 0, 8, 5);
    int r;
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    while ((r = ring_begin_read(f->reader, &rs)) == -EAGAIN)
        assert_true(hp_clock_ns(CLOCK_MONOTONIC) - t0 < 10ull * 1000 * 1000 * 1000);
    assert_int_equal(r, -ETIMEDOUT);
    assert_int_equal(ring_stalled_writer(f->reader), (uint32_t)syscall(SYS_gettid));
    assert_int_equal(ring_skip_stalled(f->reader), 0);
    read_one_expect(f->reader, 1, 8, 5);
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
}

/* An empty lane lets the others be read once the reader raised its horizon: whatever is
 * reserved there afterwards is stamped above what was read. */
static void test_ring_lanes_empty_lane_horizon(void **state)
{
    struct fixture *f = *state;
    struct ring_rspan rs;
    write_in(f->writer, 0, 8, 1);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    uint64_t first = rs.stamp;
    ring_end_read(f->reader, &rs);
    /* Lane 1's last stamp was raised to the reader's clock, above the record read. */
    assert_true(atomic_load(&f->writer->lane[1].word[1]) >= first);
    write_in(f->writer, 1, 8, 2);
    assert_int_equal(ring_begin_read(f->reader, &rs), 0);
    assert_true(rs.stamp > first);
    assert_int_equal(rs.lane, 1);
    ring_end_read(f->reader, &rs);

    /* A mark taken now is reached once the lanes are empty and raised past it. */
    uint64_t mark = ring_mark(f->reader);
    assert_true(ring_reached(f->reader, mark));
    write_in(f->writer, 0, 8, 3);
    assert_false(ring_reached(f->reader, ring_mark(f->reader)));
    read_one_expect(f->reader, 1, 8, 3);
    assert_true(ring_reached(f->reader, mark));
}

/* Stamps a client broke (from the future, going backwards) change the order of its own
 * records at most: every record is read once and the reader never waits for ever. */
static void test_ring_lanes_hostile_stamps(void **state)
{
    struct fixture *f = *state;
    for (uint64_t i = 0; i < 8; i++)
        write_in(f->writer, (unsigned)(i & 1), 8, i);
    static const uint64_t stamps[] = {UINT64_MAX, 5, 0, UINT64_MAX - 1, 3, 2, 1, 0};
    uint64_t pos[2] = {0, 0};
    for (size_t i = 0; i < 8; i++) {
        unsigned lane = (unsigned)(i & 1);
        struct ring_rec *rec = (struct ring_rec *)(f->writer->lane[lane].data + pos[lane]);
        rec->stamp = stamps[i];
        pos[lane] += rec->len_total;
    }
    atomic_store(&f->writer->lane[0].word[1], UINT64_MAX);
    bool seen[8] = {false};
    struct ring_rspan rs;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        uint64_t tag = UINT64_MAX;
        for (uint64_t t = 0; t < 8; t++)
            if (check_pattern(rs.data, rs.len, t))
                tag = t;
        assert_true(tag < 8 && !seen[tag]);
        seen[tag] = true;
        ring_end_read(f->reader, &rs);
    }
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    /* Lane 0's stamp stays at the top: the writer's next records there still go. */
    write_in(f->writer, 0, 8, 9);
    read_one_expect(f->reader, 1, 8, 9);
}

/* A writer whose lane is full goes on in the next: one busy thread has the whole ring
 * before it waits or drops, and its records still come out in order. */
static void test_ring_lanes_full_lane_spills(void **state)
{
    struct fixture *f = *state;
    const size_t len = 992; /* 1016 bytes with the header */
    uint64_t n = 0;
    ring__set_writer_lane(0);
    while (write_one(f->writer, 7, len, n) == 0)
        n++;
    assert_int_equal(n, 2 * (SMALL_SAMPLES / 1016));
    bool lane1 = false;
    for (uint64_t i = 0; i < n; i++) {
        struct ring_rspan rs;
        assert_int_equal(ring_begin_read(f->reader, &rs), 0);
        assert_true(check_pattern(rs.data, rs.len, i));
        lane1 |= rs.lane == 1;
        ring_end_read(f->reader, &rs);
    }
    assert_true(lane1);
    struct ring_stats st;
    ring_get_stats(f->reader, &st);
    assert_int_equal(st.records_dropped, 1);
}

struct blocked_writer {
    ring_t *w;
    int r;
};

static void *blocked_writer_thread(void *arg)
{
    struct blocked_writer *b = arg;
    ring__set_writer_lane(0);
    b->r = write_one(b->w, 7, 992, 999);
    return NULL;
}

/* A writer that waits for room in its lane, which holds the newest records, gets it in
 * another lane as soon as the reader frees that one: the reader frees the lanes in stamp
 * order, and waiting for this lane would take reading the others first. */
static void test_ring_lanes_waiter_takes_any_lane(void **state)
{
    struct fixture *f = *state;
    ring__set_writer_lane(1); /* lane 1 first, then (spilling) lane 0: both full */
    uint64_t n = 0;
    while (write_one(f->writer, 7, 992, n) == 0)
        n++;
    ring_set_blocking(f->writer, true, 500000);
    struct blocked_writer b = {.w = f->writer, .r = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, blocked_writer_thread, &b), 0);
    usleep(20000);
    /* The oldest record, in lane 1: room there, none in lane 0. One mapping for both
     * sides: ThreadSanitizer follows synchronisation by address. */
    struct ring_rspan rs;
    assert_int_equal(ring_begin_read(f->writer, &rs), 0);
    assert_int_equal(rs.lane, 1);
    ring_end_read(f->writer, &rs);
    ring_flush_read_pos(f->writer);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(b.r, 0);
    struct ring_stats st;
    ring_get_stats(f->writer, &st);
    assert_int_equal(st.block_timeouts, 0);
}

struct crowding_writer {
    ring_t *w;
    _Atomic bool *stop;
    uint64_t written;
};

/* Writes frees (urgent, never waiting) in lane 0 until any writer finds no room. */
static void *crowding_writer_thread(void *arg)
{
    struct crowding_writer *c = arg;
    ring__set_writer_lane(0);
    while (!atomic_load(c->stop)) {
        if (write_one_as(c->w, 2, 24, c->written, true) != 0) {
            atomic_store(c->stop, true);
            break;
        }
        c->written++;
    }
    return NULL;
}

/* A free is dropped only when no lane has room for it. Writers that crowd one lane (the
 * frees of a CPU, whose samples went to other lanes) fill it between a writer's look for
 * room and its reservation: that writer must go on in a lane with room, not drop. Each
 * round, four writers fill lane 0 until the first drop; one more free must then find no
 * room in either lane. The window is narrow: 200 rounds (a writer that dropped there
 * did so within them in every run seen). */
static void test_ring_lanes_crowded_lane_moves_on(void **state)
{
    struct fixture *f = *state;
    for (int round = 0; round < 200; round++) {
        _Atomic bool stop = false;
        struct crowding_writer c[4];
        pthread_t t[4];
        for (int i = 0; i < 4; i++) {
            c[i] = (struct crowding_writer){.w = f->writer, .stop = &stop};
            assert_int_equal(pthread_create(&t[i], NULL, crowding_writer_thread, &c[i]), 0);
        }
        uint64_t written = 0;
        for (int i = 0; i < 4; i++) {
            assert_int_equal(pthread_join(t[i], NULL), 0);
            written += c[i].written;
        }
        ring__set_writer_lane(1);
        assert_int_equal(write_one_as(f->writer, 2, 24, 0, true), -EAGAIN);
        /* Both lanes full: all but the header's worth of a record of each (48 bytes). */
        assert_true(written * 48 > LANES_SIZE - 2 * 48);
        struct ring_rspan rs;
        for (uint64_t i = 0; i < written; i++) {
            assert_int_equal(ring_begin_read(f->reader, &rs), 0);
            ring_end_read(f->reader, &rs);
        }
        assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    }
}

/* What a session's end counts: every record left in every lane. */
static void test_ring_lanes_discard(void **state)
{
    struct fixture *f = *state;
    for (uint64_t i = 0; i < 9; i++)
        write_in(f->writer, (unsigned)(i % 3 == 0), 8 + 8 * (i % 4), i);
    read_one_expect(f->reader, 1, 8, 0);
    uint64_t n = 0, frees = 0;
    assert_int_equal(ring_discard(f->reader, ring_mark(f->reader), 1u << 1, NULL, NULL, &n, &frees),
                     0);
    assert_int_equal(n, 8);
    assert_int_equal(frees, 8);
    struct ring_rspan rs;
    assert_int_equal(ring_begin_read(f->reader, &rs), -EAGAIN);
    uint64_t rp = 0, fill = 1;
    ring_writer_progress(f->writer, &rp, &fill);
    assert_int_equal(fill, 0);
}

/* The order the client relies on: thread A records the free of block i before it really
 * frees it; thread B records the allocation of block i only after it got that block,
 * that is after A's free. In lanes of their own (the allocations in the lane a reader
 * would look at first), at any pace, the reader sees every free before the allocation
 * that reused its block. */
#define CAUSAL_ROUNDS 20000
struct causal {
    ring_t *w;
    _Atomic uint64_t freed; /* blocks A has freed: B may take them */
};

static void *causal_free_thread(void *arg)
{
    struct causal *c = arg;
    ring__set_writer_lane(1);
    for (uint64_t i = 1; i <= CAUSAL_ROUNDS; i++) {
        struct ring_wspan ws;
        while (ring_try_begin_write_nowait(c->w, 2, 8, &ws) != 0)
            sched_yield();
        memcpy(ws.data, &i, 8);
        (void)ring_end_write(c->w, &ws);
        atomic_store_explicit(&c->freed, i, memory_order_release);
    }
    return NULL;
}

static void *causal_alloc_thread(void *arg)
{
    struct causal *c = arg;
    ring__set_writer_lane(0);
    for (uint64_t i = 1; i <= CAUSAL_ROUNDS; i++) {
        while (atomic_load_explicit(&c->freed, memory_order_acquire) < i)
            ;
        struct ring_wspan ws;
        while (ring_try_begin_write(c->w, 3, 8, &ws) != 0)
            sched_yield();
        memcpy(ws.data, &i, 8);
        (void)ring_end_write(c->w, &ws);
    }
    return NULL;
}

static void test_ring_lanes_free_before_reuse(void **state)
{
    struct fixture *f = *state;
    /* Two threads on two CPUs: their stamps compare only where the kernel found the
     * CPUs' counters in step (where it does not, the service makes one lane). */
    if (!ring__tsc_is_clock())
        skip();
    /* One mapping for both sides: ThreadSanitizer follows synchronisation by address. */
    struct causal c = {.w = f->writer};
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, causal_free_thread, &c), 0);
    assert_int_equal(pthread_create(&b, NULL, causal_alloc_thread, &c), 0);
    uint64_t frees = 0, allocs = 0;
    while (allocs < CAUSAL_ROUNDS) {
        struct ring_rspan rs;
        int r = ring_begin_read(f->writer, &rs);
        if (r == -EAGAIN) {
            sched_yield();
            continue;
        }
        assert_int_equal(r, 0);
        uint64_t i;
        memcpy(&i, rs.data, 8);
        if (rs.type == 2) {
            assert_int_equal(i, frees + 1);
            frees = i;
        } else {
            assert_int_equal(rs.type, 3);
            assert_int_equal(i, allocs + 1);
            assert_true(i <= frees); /* its free came first */
            allocs = i;
        }
        ring_end_read(f->writer, &rs);
    }
    assert_int_equal(pthread_join(a, NULL), 0);
    assert_int_equal(pthread_join(b, NULL), 0);
    assert_int_equal(frees, CAUSAL_ROUNDS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_create_rejects_bad_sizes),
        cmocka_unit_test(test_ring_lanes_geometry),
        cmocka_unit_test_setup_teardown(test_ring_lanes_merge_in_write_order, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_unpublished_holds_later_records,
                                        setup_lanes, teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_empty_lane_horizon, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_hostile_stamps, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_discard, setup_lanes, teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_crowded_lane_moves_on, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_full_lane_spills, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_waiter_takes_any_lane, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test_setup_teardown(test_ring_lanes_free_before_reuse, setup_lanes,
                                        teardown_lanes),
        cmocka_unit_test(test_ring_map_rejects_foreign_fds),
        cmocka_unit_test(test_ring_bug_writer_maps_unsealed),
        cmocka_unit_test_setup_teardown(test_ring_empty_and_full, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_discard_counts_what_is_left, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_discard_hostile, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_discard_counts_with_a_function, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_exit_and_freeset_counted, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_mark_bounds_a_drain, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_maps_read_asked_and_answered, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_wait_consumed, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_too_large_rejected, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_wrap_at_every_offset, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_many_sizes, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_every_size_up_to_the_ring, setup_small, teardown),
        cmocka_unit_test(test_ring_every_size_up_to_max_payload),
        cmocka_unit_test_setup_teardown(test_ring_concurrent_writers, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_concurrent_writers_two_mappings, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_writer_in_other_process, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_corrupt_header_fields, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_corrupt_random_bytes_never_crash, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_stalled_record_skipped, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_futex_wakes_reader, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_stalled_record_names_its_writer, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_stalled_by_hostile_write_pos, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_writer_died_mid_record, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_reader_idle_wakeup, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_reader_polling_pokes_at_fill, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_read_pos_published_in_steps, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_reader_idle_no_lost_wakeup, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_blocking_times_out, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_bug_stopped_reader_blocks_every_record,
                                        setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_nowait_never_waits, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_blocking_waits_for_space, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_detached_stops_writers, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_ring_detached_releases_blocked_writer, setup_small,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ring_fork_child_never_writes, setup_small, teardown),
    };
    return cmocka_run_group_tests_name("ring", tests, NULL, NULL);
}
