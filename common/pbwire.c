/* common/pbwire.c: protobuf wire format helpers (pbwire.h). */
#include "common/pbwire.h"

#include <errno.h>
#include <string.h>

#include "common/containers.h"

size_t hp_pb_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

int hp_pb_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
    const uint8_t *q = *p;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (q >= end)
            return -EAGAIN;
        uint8_t b = *q++;
        /* The 10th byte may only carry the top bit of a uint64_t. */
        if (shift == 63 && b > 1)
            return -EBADMSG;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *p = q;
            *ret = v;
            return 0;
        }
    }
    return -EBADMSG;
}

size_t hp_pb_put_packet_header(uint8_t *buf, size_t packet_len)
{
    buf[0] = HP_PB_TRACE_PACKET_TAG;
    return 1 + hp_pb_put_varint(buf + 1, packet_len);
}

void hp_pb_iter_init(struct hp_pb_iter *it, const void *buf, size_t len)
{
    it->p = buf;
    it->end = it->p + len;
    it->error = false;
}

bool hp_pb_next(struct hp_pb_iter *it, struct hp_pb_field *ret)
{
    if (it->error || it->p >= it->end)
        return false;
    uint64_t tag, v;
    const uint8_t *p = it->p;
    if (hp_pb_get_varint(&p, it->end, &tag) < 0 || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
        goto bad;
    struct hp_pb_field f = {.num = (uint32_t)(tag >> 3), .wire_type = (uint8_t)(tag & 7)};
    switch (f.wire_type) {
    case HP_PB_VARINT:
        if (hp_pb_get_varint(&p, it->end, &f.varint) < 0)
            goto bad;
        break;
    case HP_PB_FIXED64:
    case HP_PB_FIXED32: {
        size_t n = f.wire_type == HP_PB_FIXED64 ? 8 : 4;
        if ((size_t)(it->end - p) < n)
            goto bad;
        for (size_t i = 0; i < n; i++)
            f.varint |= (uint64_t)p[i] << (8 * i);
        p += n;
        break;
    }
    case HP_PB_LEN:
        if (hp_pb_get_varint(&p, it->end, &v) < 0 || v > (uint64_t)(it->end - p))
            goto bad;
        f.ptr = p;
        f.len = (size_t)v;
        p += v;
        break;
    default:
        goto bad;
    }
    it->p = p;
    *ret = f;
    return true;
bad:
    it->error = true;
    return false;
}

void hp_pb_ints_init(struct hp_pb_ints *it, const struct hp_pb_field *f)
{
    *it = (struct hp_pb_ints){0};
    if (f->wire_type == HP_PB_LEN) {
        it->p = f->ptr;
        it->end = f->ptr + f->len;
        it->state = 1;
    } else if (f->wire_type == HP_PB_VARINT) {
        it->single = f->varint;
        it->state = 0;
    } else {
        it->state = 2;
    }
}

bool hp_pb_ints_next(struct hp_pb_ints *it, uint64_t *ret, bool *error)
{
    switch (it->state) {
    case 0:
        it->state = 2;
        *ret = it->single;
        return true;
    case 1:
        if (it->p >= it->end)
            return false;
        if (hp_pb_get_varint(&it->p, it->end, ret) < 0) {
            *error = true;
            it->state = 2;
            return false;
        }
        return true;
    default:
        return false;
    }
}

/* ---- append-only writer ---- */

void hp_pbw_bytes(struct hp_pbw *w, const void *b, size_t n)
{
    if (w->oom || hp_grow((void **)&w->p, &w->cap, w->len + n, 1) < 0) {
        w->oom = true;
        return;
    }
    if (n)
        memcpy(w->p + w->len, b, n);
    w->len += n;
}

void hp_pbw_varint(struct hp_pbw *w, uint64_t v)
{
    uint8_t b[HP_PB_VARINT_MAX];
    hp_pbw_bytes(w, b, hp_pb_put_varint(b, v));
}

void hp_pbw_uint_always(struct hp_pbw *w, uint32_t field, uint64_t v)
{
    hp_pbw_varint(w, (uint64_t)field << 3 | HP_PB_VARINT);
    hp_pbw_varint(w, v);
}

void hp_pbw_uint(struct hp_pbw *w, uint32_t field, uint64_t v)
{
    if (v)
        hp_pbw_uint_always(w, field, v);
}

void hp_pbw_len(struct hp_pbw *w, uint32_t field, const void *b, size_t n)
{
    hp_pbw_varint(w, (uint64_t)field << 3 | HP_PB_LEN);
    hp_pbw_varint(w, n);
    hp_pbw_bytes(w, b, n);
}

void hp_pbw_msg(struct hp_pbw *w, uint32_t field, struct hp_pbw *sub)
{
    w->oom |= sub->oom;
    hp_pbw_len(w, field, sub->p, sub->len);
    sub->len = 0;
    sub->oom = false;
}
