/* service/records.c: validation of the records a client writes into its ring. Every
 * byte is untrusted (shmem_ring/wire.h): the fixed part is copied out of shared memory
 * once and only the copy is checked and used. */
#include <errno.h>
#include <string.h>

#include "service/svc_internal.h"

int svc__decode_alloc(const uint8_t *data, size_t len, uint64_t max_stack_bytes,
                      struct wire_alloc *ret, const uint8_t **ret_stack)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    uint64_t stack_len = ret->stack_len;
    if (stack_len > len - sizeof(*ret) || stack_len > max_stack_bytes)
        return -EBADMSG;
    *ret_stack = data + sizeof(*ret);
    return 0;
}

int svc__decode_free(const uint8_t *data, size_t len, struct wire_free *ret)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    return 0;
}
