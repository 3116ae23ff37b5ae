/* common/pbwire.h: the protobuf wire format at the byte level.
 *
 * Varints and the Trace framing (each TracePacket is field 1, length-delimited) for the
 * writer, and a field iterator for the reader. The iterator never reads outside the
 * buffer it was given and reports malformed input instead of guessing: a truncated
 * varint, a length past the end, a field number 0, groups (wire types 3 and 4) and
 * unknown wire types all stop it with `error` set.
 *
 *     struct bk_pb_iter it;
 *     struct bk_pb_field f;
 *     bk__pb_iter_init(&it, buf, len);
 *     while (bk__pb_next(&it, &f))
 *         if (f.num == 8 && f.wire_type == BK_PB_VARINT) ts = f.varint;
 *     if (it.error) return -EBADMSG;
 *
 * Pure functions on caller buffers; thread-safe.
 */
#ifndef HP_COMMON_PBWIRE_H
#define HP_COMMON_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BK_PB_VARINT 0
#define BK_PB_FIXED64 1
#define BK_PB_LEN 2
#define BK_PB_FIXED32 5

#define BK_PB_VARINT_MAX 10
/* Tag byte of Trace.packet (field 1, length-delimited). */
#define BK_PB_TRACE_PACKET_TAG 0x0a

size_t bk__pb_varint_size(uint64_t v);
/* Writes @v at @buf (room for BK_PB_VARINT_MAX bytes); returns the bytes written. */
size_t bk__pb_put_varint(uint8_t *buf, uint64_t v);
/* Reads a varint from [*p, end); advances *p. Returns 0, -EAGAIN when the input ends
 * inside the varint, -EBADMSG when it is longer than 10 bytes. */
int bk__pb_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret);

/* Writes the Trace framing (tag and length) of a packet of @packet_len bytes at @buf
 * (room for 1 + BK_PB_VARINT_MAX bytes); returns the bytes written. */
size_t bk__pb_put_packet_header(uint8_t *buf, size_t packet_len);

struct bk_pb_field {
    uint32_t num;
    uint8_t wire_type;
    uint64_t varint;    /* BK_PB_VARINT, BK_PB_FIXED64, BK_PB_FIXED32 */
    const uint8_t *ptr; /* BK_PB_LEN: borrowed from the iterated buffer */
    size_t len;
};

struct bk_pb_iter {
    const uint8_t *p, *end;
    bool error;
};

void bk__pb_iter_init(struct bk_pb_iter *it, const void *buf, size_t len);
/* Returns true with the next field, false at the end or on malformed input (error). */
bool bk__pb_next(struct bk_pb_iter *it, struct bk_pb_field *ret);

/* Iterates the integers of a repeated varint field that may be packed (one BK_PB_LEN
 * field) or not (one BK_PB_VARINT field per value): call with each occurrence of the
 * field. Returns false at the end of @f's values or on malformed input (*@error set). */
struct bk_pb_ints {
    const uint8_t *p, *end;
    uint64_t single;
    int state; /* 0: single value pending, 1: packed, 2: done */
};
void bk__pb_ints_init(struct bk_pb_ints *it, const struct bk_pb_field *f);
bool bk__pb_ints_next(struct bk_pb_ints *it, uint64_t *ret, bool *error);

/* An append-only protobuf writer into a growable buffer. Submessages are built in a
 * second writer and appended with their length (bk__pbw_msg). Out of memory sets @oom
 * and makes later calls no-ops, so callers check once at the end. */
struct bk_pbw {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};
void bk__pbw_bytes(struct bk_pbw *w, const void *b, size_t n);
void bk__pbw_varint(struct bk_pbw *w, uint64_t v);
/* Field @field = @v as a varint; nothing for 0 (proto3 default). */
void bk__pbw_uint(struct bk_pbw *w, uint32_t field, uint64_t v);
/* Field @field = @v as a varint, even when 0 (proto2 presence). */
void bk__pbw_uint_always(struct bk_pbw *w, uint32_t field, uint64_t v);
void bk__pbw_len(struct bk_pbw *w, uint32_t field, const void *b, size_t n);
/* Appends @sub as submessage @field of @w and empties @sub for reuse. */
void bk__pbw_msg(struct bk_pbw *w, uint32_t field, struct bk_pbw *sub);

#endif
