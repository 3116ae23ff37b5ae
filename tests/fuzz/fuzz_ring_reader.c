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
 * outside the data area. */
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

static ring_t *fuzz_reader, *fuzz_writer;

static void fuzz_ring_init(void)
{
    int fd = -1;
    if (ring_create(FUZZ_RING_SIZE, &fd) < 0 || ring_map(fd, RING_ROLE_READER, &fuzz_reader) < 0 ||
        ring_map(fd, RING_ROLE_WRITER, &fuzz_writer) < 0)
        abort();
    /* Unpublished records stay -EAGAIN: the stall timeout is exercised by the unit tests;
     * here it would only make slow inputs. */
    ring_set_stall_timeout(fuzz_reader, UINT64_MAX / 2000u);
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
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

    /* Lay the input over the data area from rp on. Writing through the first copy plus
     * the second one handles the wrap. */
    uint8_t *area = fuzz_writer->lane[0].data;
    const uint64_t mask = FUZZ_RING_SIZE - 1;
    memset(area, 0, FUZZ_RING_SIZE);
    size_t n = size < FUZZ_RING_SIZE ? size : FUZZ_RING_SIZE;
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
    atomic_store(&fuzz_writer->hdr->write_pos, wp);
    fuzz_reader->lane[0].read_pos = rp;
    fuzz_reader->stall_since_ns = 0;

    if (mode & 2) {
        uint64_t mark = ring_mark(fuzz_reader), count = 0, of_type = 0;
        int r = ring_discard(fuzz_reader, mark, 2, &count, &of_type);
        if ((r != 0 && r != -EBADMSG) || of_type > count || count > FUZZ_RING_SIZE / 16)
            abort();
        if (r == 0 && !ring_reached(fuzz_reader, mark))
            abort();
        if ((int64_t)(fuzz_reader->lane[0].read_pos - rp) < 0 ||
            fuzz_reader->lane[0].read_pos - rp > FUZZ_RING_SIZE)
            abort();
        return 0;
    }

    const uint8_t *lo = fuzz_reader->lane[0].data, *hi = fuzz_reader->lane[0].data + 2 * FUZZ_RING_SIZE;
    uint64_t reads = 0, limit = 2 * (FUZZ_RING_SIZE / sizeof(struct ring_rec)) + 2;
    for (;;) {
        struct ring_rspan rs;
        int r = ring_begin_read(fuzz_reader, &rs);
        if (r == -EAGAIN || r == -EBADMSG)
            break;
        if (r != 0)
            abort();
        const uint8_t *p = rs.data;
        if (p < lo || p > hi || rs.len > (size_t)(hi - p) || rs.len > RING_MAX_PAYLOAD)
            abort();
        if (rs.total < sizeof(struct ring_rec) + rs.len || rs.total > FUZZ_RING_SIZE)
            abort();
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < rs.len; i++)
            sink ^= p[i];
        (void)sink;
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
