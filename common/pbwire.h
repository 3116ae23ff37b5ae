/* common/pbwire.h: the protobuf wire format at the byte level.
 *
 * Varints and the Trace framing (each TracePacket is field 1, length-delimited) for the
 * writer, and a field iterator for the reader. The iterator never reads outside the
 * buffer it was given and reports malformed input instead of guessing: a truncated
 * varint, a length past the end, a field number 0, groups (wire types 3 and 4) and
 * unknown wire types all stop it with `error` set.
 *
 *     struct hp_pb_iter it;
 *     struct hp_pb_field f;
 *     hp_pb_iter_init(&it, buf, len);
 *     while (hp_pb_next(&it, &f))
 *         if (f.num == 8 && f.wire_type == HP_PB_VARINT) ts = f.varint;
 *     if (it.error) return -EBADMSG;
 *
 * Pure functions on caller buffers; thread-safe.
 */
#ifndef HP_COMMON_PBWIRE_H
#define HP_COMMON_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HP_PB_VARINT 0
#define HP_PB_FIXED64 1
#define HP_PB_LEN 2
#define HP_PB_FIXED32 5

#define HP_PB_VARINT_MAX 10
/* Tag byte of Trace.packet (field 1, length-delimited). */
#define HP_PB_TRACE_PACKET_TAG 0x0a

size_t hp_pb_varint_size(uint64_t v);

/* Writes @v at @buf (room for HP_PB_VARINT_MAX bytes); returns the bytes written. The one
 * varint writer of the project; inline, because the dump encoders call it per field. */
static inline size_t hp_pb_put_varint(uint8_t *buf, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        buf[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    buf[n++] = (uint8_t)v;
    return n;
}

/* Writes @v (< 2^28) at @buf as a varint of exactly 4 bytes, the first three with the
 * continuation bit even where a shorter form exists (decoders accept it): a length
 * written after its message, in the room left before it. */
static inline void hp_pb_put_varint4(uint8_t *buf, uint32_t v)
{
    buf[0] = (uint8_t)(v | 0x80);
    buf[1] = (uint8_t)(v >> 7 | 0x80);
    buf[2] = (uint8_t)(v >> 14 | 0x80);
    buf[3] = (uint8_t)(v >> 21);
}
/* Reads a varint from [*p, end); advances *p. Returns 0, -EAGAIN when the input ends
 * inside the varint, -EBADMSG when it is longer than 10 bytes. */
int hp_pb_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret);

/* Writes the Trace framing (tag and length) of a packet of @packet_len bytes at @buf
 * (room for 1 + HP_PB_VARINT_MAX bytes); returns the bytes written. */
size_t hp_pb_put_packet_header(uint8_t *buf, size_t packet_len);

struct hp_pb_field {
    uint32_t num;
    uint8_t wire_type;
    uint64_t varint;    /* HP_PB_VARINT, HP_PB_FIXED64, HP_PB_FIXED32 */
    const uint8_t *ptr; /* HP_PB_LEN: borrowed from the iterated buffer */
    size_t len;
};

struct hp_pb_iter {
    const uint8_t *p, *end;
    bool error;
};

void hp_pb_iter_init(struct hp_pb_iter *it, const void *buf, size_t len);
/* Returns true with the next field, false at the end or on malformed input (error). */
bool hp_pb_next(struct hp_pb_iter *it, struct hp_pb_field *ret);

/* Iterates the integers of a repeated varint field that may be packed (one HP_PB_LEN
 * field) or not (one HP_PB_VARINT field per value): call with each occurrence of the
 * field. Returns false at the end of @f's values or on malformed input (*@error set). */
struct hp_pb_ints {
    const uint8_t *p, *end;
    uint64_t single;
    int state; /* 0: single value pending, 1: packed, 2: done */
};
void hp_pb_ints_init(struct hp_pb_ints *it, const struct hp_pb_field *f);
bool hp_pb_ints_next(struct hp_pb_ints *it, uint64_t *ret, bool *error);

/* An append-only protobuf writer into a growable buffer. Submessages are built in a
 * second writer and appended with their length (hp_pbw_msg). Out of memory sets @oom
 * and makes later calls no-ops, so callers check once at the end. */
struct hp_pbw {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};
void hp_pbw_bytes(struct hp_pbw *w, const void *b, size_t n);
void hp_pbw_varint(struct hp_pbw *w, uint64_t v);
/* Field @field = @v as a varint; nothing for 0 (proto3 default). */
void hp_pbw_uint(struct hp_pbw *w, uint32_t field, uint64_t v);
/* Field @field = @v as a varint, even when 0 (proto2 presence). */
void hp_pbw_uint_always(struct hp_pbw *w, uint32_t field, uint64_t v);
void hp_pbw_len(struct hp_pbw *w, uint32_t field, const void *b, size_t n);
/* Appends @sub as submessage @field of @w and empties @sub for reuse. */
void hp_pbw_msg(struct hp_pbw *w, uint32_t field, struct hp_pbw *sub);

#endif
