/* tests/fuzz/fuzz_ring_reader.c: the ring reader on arbitrary shared memory. A client
 * controls the whole shared header and data area; whatever it writes, the reader must
 * only return records lying inside the data area's double mapping, never loop, and end
 * with -EAGAIN or -EBADMSG after at most one record per 16 bytes of data it was shown.
 *
 * Input: read_pos (8 bytes, the reader's own position, as if it got there by reading),
 * write_pos - read_pos (8), a second write_pos - read_pos stored after the first record
 * (8: positions may change between two calls), a mode byte, then bytes copied over the
 * data area from read_pos on (wrapping). Mode bit 0: an all-zero 8-byte word becomes the
 * commit tag valid at its position, so inputs reach the header checks easily. Mode bit 1:
 * the end of a session instead of reads: ring_discard() up to ring_mark() must stop at
 * the mark or at a bad header, count at most a record per 16 bytes and never read
 * outside the data area. Mode bit 2: a ring of two lanes (each of the size above), the
 * input laid over both (the second from its middle on), the second lane's write_pos the
 * second one: the merge by stamp must end the same way whatever the stamps say, and
 * read every record of both lanes at most once. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shmem_ring/ring.h"
#include "shmem_ring/ring_layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_RING_SIZE RING_MIN_SIZE
#define FUZZ_PREFIX 25

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static ring_t *fuzz_reader, *fuzz_writer;
static ring_t *fuzz_lanes_reader, *fuzz_lanes_writer;

static void fuzz_ring_pair(unsigned lanes, ring_t **ret_reader, ring_t **ret_writer)
{
    int fd = -1;
    if (ring_create_lanes(FUZZ_RING_SIZE * lanes, lanes, &fd) < 0 ||
        ring_map(fd, RING_ROLE_READER, ret_reader) < 0 ||
        ring_map(fd, RING_ROLE_WRITER, ret_writer) < 0)
        abort();
    /* Unpublished records stay -EAGAIN: the stall timeout is exercised by the unit tests;
     * here it would only make slow inputs. */
    ring_set_stall_timeout(*ret_reader, UINT64_MAX / 2000u);
}

static void fuzz_ring_init(void)
{
    fuzz_ring_pair(1, &fuzz_reader, &fuzz_writer);
    fuzz_ring_pair(2, &fuzz_lanes_reader, &fuzz_lanes_writer);
}

/* Lays @n bytes of @data over lane @lane of the writer's mapping from @rp on; mode bit 0
 * turns zero words into valid commit tags. */
static void fuzz_lay(ring_t *writer, unsigned lane, uint64_t rp, const uint8_t *data, size_t n,
                     uint8_t mode)
{
    uint8_t *area = writer->lane[lane].data;
    const uint64_t mask = FUZZ_RING_SIZE - 1;
    memset(area, 0, FUZZ_RING_SIZE);
    if (n > FUZZ_RING_SIZE)
        n = FUZZ_RING_SIZE;
    memcpy(area + (rp & mask), data, n);
    if (mode & 1) {
        /* Offsets within the input, so positions near UINT64_MAX wrap like the ring's. */
        for (size_t i = (size_t)((8 - (rp & 7)) & 7); i + 8 <= n; i += 8) {
            uint8_t *w = area + ((rp + i) & mask);
            if (get_u64(w) == 0) {
                uint64_t tag = (rp + i) ^ RING_TAG_MAGIC;
                memcpy(w, &tag, sizeof(tag));
            }
        }
    }
}

/* Aborts unless record @rs lies inside lane @lane's double mapping of @rd; reads all of
 * its payload. */
static void fuzz_check_record(const ring_t *rd, const struct ring_rspan *rs)
{
    const uint8_t *lo = rd->lane[rs->lane].data, *hi = lo + 2 * FUZZ_RING_SIZE;
    const uint8_t *p = rs->data;
    if (p < lo || p > hi || rs->len > (size_t)(hi - p) || rs->len > RING_MAX_PAYLOAD)
        abort();
    if (rs->total < sizeof(struct ring_rec) + rs->len || rs->total > FUZZ_RING_SIZE)
        abort();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < rs->len; i++)
        sink ^= p[i];
    (void)sink;
}

/* Mode bit 2: reads a ring of two lanes to its end. */
/* A ring_discard() count that reads every byte of a published record's payload (the
 * sanitizers catch a span outside the ring) and counts one per record. */
static uint64_t fuzz_touch(uint16_t type, const void *payload, size_t len, void *arg)
{
    (void)type;
    (void)arg;
    volatile uint8_t sum = 0;
    for (size_t i = 0; payload && i < len; i++)
        sum += ((const uint8_t *)payload)[i];
    (void)sum;
    return 1;
}

static void fuzz_lanes(uint64_t rp, uint64_t wp, uint64_t wp2, const uint8_t *data, size_t size,
                       uint8_t mode)
{
    ring_t *rd = fuzz_lanes_reader, *wr = fuzz_lanes_writer;
    fuzz_lay(wr, 0, rp, data, size / 2, mode);
    fuzz_lay(wr, 1, rp, data + size / 2, size - size / 2, mode);
    /* The lanes' last stamps from the input's last word. */
    uint64_t last = size >= 8 ? get_u64(data + size - 8) : 0;
    for (unsigned i = 0; i < 2; i++) {
        atomic_store(&wr->lane[i].word[0], i == 0 ? wp : wp2);
        atomic_store(&wr->lane[i].word[1], last >> i);
        rd->lane[i].read_pos = rd->lane[i].seen_write_pos = rd->lane[i].published_read_pos = rp;
        rd->lane[i].last_stamp = rd->lane[i].horizon = 0;
        rd->lane[i].head_ready = false;
    }
    rd->stall_since_ns = 0;
    rd->frontier = 0;

    if (mode & 2) {
        uint64_t mark = ring_mark(rd), count = 0, of_type = 0;
        int r = ring_discard(rd, mark, 1u << 2, fuzz_touch, NULL, &count, &of_type);
        if ((r != 0 && r != -EBADMSG) || of_type > count ||
            count > 2 * FUZZ_RING_SIZE / sizeof(struct ring_rec))
            abort();
        return;
    }
    uint64_t reads = 0, limit = 2 * (FUZZ_RING_SIZE / sizeof(struct ring_rec)) + 2;
    for (;;) {
        struct ring_rspan rs;
        int r = ring_begin_read(rd, &rs);
        if (r == -EAGAIN || r == -EBADMSG)
            break;
        if (r != 0 || rs.lane > 1)
            abort();
        fuzz_check_record(rd, &rs);
        ring_end_read(rd, &rs);
        /* Each lane moves by at least a header per record. */
        if (++reads > limit)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fuzz_reader)
        fuzz_ring_init();
    if (size < FUZZ_PREFIX)
        return 0;

    uint64_t rp = get_u64(data);
    uint64_t wp = rp + get_u64(data + 8);
    uint64_t wp2 = rp + get_u64(data + 16);
    uint8_t mode = data[24];
    data += FUZZ_PREFIX;
    size -= FUZZ_PREFIX;

    if (mode & 4) {
        fuzz_lanes(rp, wp, wp2, data, size, mode);
        return 0;
    }
    /* Lay the input over the data area from rp on. */
    fuzz_lay(fuzz_writer, 0, rp, data, size, mode);
    atomic_store(&fuzz_writer->hdr->write_pos, wp);
    fuzz_reader->lane[0].read_pos = rp;
    fuzz_reader->stall_since_ns = 0;

    if (mode & 2) {
        uint64_t mark = ring_mark(fuzz_reader), count = 0, of_type = 0;
        int r = ring_discard(fuzz_reader, mark, 1u << 2, fuzz_touch, NULL, &count, &of_type);
        if ((r != 0 && r != -EBADMSG) || of_type > count || count > FUZZ_RING_SIZE / 16)
            abort();
        if (r == 0 && !ring_reached(fuzz_reader, mark))
            abort();
        if ((int64_t)(fuzz_reader->lane[0].read_pos - rp) < 0 ||
            fuzz_reader->lane[0].read_pos - rp > FUZZ_RING_SIZE)
            abort();
        return 0;
    }

    uint64_t reads = 0, limit = 2 * (FUZZ_RING_SIZE / sizeof(struct ring_rec)) + 2;
    for (;;) {
        struct ring_rspan rs;
        int r = ring_begin_read(fuzz_reader, &rs);
        if (r == -EAGAIN || r == -EBADMSG)
            break;
        if (r != 0 || rs.lane != 0)
            abort();
        fuzz_check_record(fuzz_reader, &rs);
        ring_end_read(fuzz_reader, &rs);
        if (reads == 0)
            atomic_store(&fuzz_writer->hdr->write_pos, wp2);
        /* Every record moves read_pos by at least a header: the two write positions
         * bound the number of records. */
        if (++reads > limit)
            abort();
    }
    return 0;
}
