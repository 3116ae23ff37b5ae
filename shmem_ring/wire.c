/* shmem_ring/wire.c: the decoders of the records a client writes into its ring. Every
 * byte is untrusted (shmem_ring/wire.h): the fixed part is copied out of shared memory
 * once and only the copy is checked and used. */
#include "shmem_ring/wire.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

int wire_decode_alloc(const uint8_t *data, size_t len, uint64_t max_stack_bytes,
                      struct wire_alloc *ret, const uint8_t **ret_stack, uint64_t *ret_pcs,
                      size_t *ret_n_pcs)
{
    struct wire_alloc a;
    if (len < sizeof(a))
        return -EBADMSG;
    memcpy(&a, data, sizeof(a)); /* one copy out of shared memory, then validate */
    uint64_t stack_len = a.stack_len;
    if (stack_len > len - sizeof(a) || stack_len > max_stack_bytes)
        return -EBADMSG;
    size_t n_pcs = 0;
    size_t rest = len - sizeof(a) - (size_t)stack_len;
    if (a.flags & WIRE_ALLOC_AUDIT) {
        /* The client's own walk of this stack: a count, then that many pcs. */
        uint64_t n;
        if (rest < sizeof(n))
            return -EBADMSG;
        memcpy(&n, data + sizeof(a) + stack_len, sizeof(n));
        if (n == 0 || n > WIRE_MAX_PCS || rest - sizeof(n) < n * sizeof(uint64_t))
            return -EBADMSG;
        memcpy(ret_pcs, data + sizeof(a) + stack_len + sizeof(n), n * sizeof(uint64_t));
        n_pcs = (size_t)n;
    }
    *ret = a;
    *ret_stack = data + sizeof(a);
    *ret_n_pcs = n_pcs;
    return 0;
}

int wire_decode_alloc_pcs(const uint8_t *data, size_t len, struct wire_alloc_pcs *ret,
                          uint64_t *ret_pcs)
{
    struct wire_alloc_pcs a;
    if (len < sizeof(a))
        return -EBADMSG;
    memcpy(&a, data, sizeof(a));
    if (a.n_pcs == 0 || a.n_pcs > WIRE_MAX_PCS || len < wire_alloc_pcs_len(a.n_pcs))
        return -EBADMSG;
    memcpy(ret_pcs, data + sizeof(a), (size_t)a.n_pcs * sizeof(uint64_t));
    *ret = a;
    return 0;
}

int wire_decode_free(const uint8_t *data, size_t len, struct wire_free *ret)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    return 0;
}

int wire_decode_frees(const uint8_t *data, size_t len, struct wire_frees *ret, uint64_t *ret_addrs)
{
    struct wire_frees f;
    if (len < sizeof(f))
        return -EBADMSG;
    memcpy(&f, data, sizeof(f));
    if (f.n == 0 || f.n > WIRE_MAX_FREES || len < wire_frees_len(f.n))
        return -EBADMSG;
    memcpy(ret_addrs, data + sizeof(f), (size_t)f.n * sizeof(uint64_t));
    *ret = f;
    return 0;
}

int wire_decode_heap_name(const uint8_t *data, size_t len, struct wire_heap_name *ret)
{
    struct wire_heap_name h;
    if (len < sizeof(h))
        return -EBADMSG;
    memcpy(&h, data, sizeof(h));
    if (h.heap_id == 0 || h.len == 0 || h.len >= WIRE_HEAP_NAME_MAX)
        return -EBADMSG;
    h.name[h.len] = '\0';
    if (strlen(h.name) != h.len)
        return -EBADMSG;
    *ret = h;
    return 0;
}

int wire_decode_maps_changed(const uint8_t *data, size_t len, struct wire_maps_changed *ret)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    return 0;
}

int wire_decode_py(const uint8_t *data, size_t len, struct wire_py_tail *ret_tail,
                   struct wire_py_frame *ret_frames, size_t *ret_len)
{
    struct wire_py_tail t;
    if (len < sizeof(t))
        return -EBADMSG;
    memcpy(&t, data + len - sizeof(t), sizeof(t));
    if (t.n_frames > WIRE_MAX_PY_FRAMES || len < wire_py_len(t.n_frames))
        return -EBADMSG;
    size_t rest = len - wire_py_len(t.n_frames);
    memcpy(ret_frames, data + rest, t.n_frames * sizeof(*ret_frames));
    *ret_tail = t;
    *ret_len = rest;
    return 0;
}

static bool wire_printable(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return false;
    return true;
}

int wire_decode_py_code(const uint8_t *data, size_t len, struct wire_py_code *ret,
                        const char **ret_qualname, const char **ret_filename,
                        const uint8_t **ret_linetable)
{
    struct wire_py_code c;
    if (len < sizeof(c))
        return -EBADMSG;
    memcpy(&c, data, sizeof(c));
    /* Each bound first: their sum then cannot wrap. */
    if (c.qualname_len == 0 || c.qualname_len > WIRE_PY_NAME_MAX || c.filename_len == 0 ||
        c.filename_len > WIRE_PY_PATH_MAX || c.linetable_len > WIRE_PY_LINETABLE_MAX ||
        c.check >> 24 != 0 || c.reserved != 0 ||
        len != sizeof(c) + c.qualname_len + c.filename_len + c.linetable_len)
        return -EBADMSG;
    const uint8_t *q = data + sizeof(c), *f = q + c.qualname_len;
    if (!wire_printable(q, c.qualname_len) || !wire_printable(f, c.filename_len))
        return -EBADMSG;
    *ret = c;
    *ret_qualname = (const char *)q;
    *ret_filename = (const char *)f;
    *ret_linetable = f + c.filename_len;
    return 0;
}

int wire_decode_py_runtime(const uint8_t *data, size_t len, struct wire_py_runtime *ret)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    return 0;
}
