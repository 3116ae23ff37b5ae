/* service/records.c: validation of the records a client writes into its ring. Every
 * byte is untrusted (shmem_ring/wire.h): the fixed part is copied out of shared memory
 * once and only the copy is checked and used. */
#include <errno.h>
#include <string.h>

#include "service/svc_internal.h"

int svc__decode_alloc(const uint8_t *data, size_t len, uint64_t max_stack_bytes,
                      struct wire_alloc *ret, const uint8_t **ret_stack)
{
    struct wire_alloc a;
    if (len < sizeof(a))
        return -EBADMSG;
    memcpy(&a, data, sizeof(a)); /* one copy out of shared memory, then validate */
    uint64_t stack_len = a.stack_len;
    if (stack_len > len - sizeof(a) || stack_len > max_stack_bytes)
        return -EBADMSG;
    *ret = a;
    *ret_stack = data + sizeof(a);
    return 0;
}

int svc__decode_free(const uint8_t *data, size_t len, struct wire_free *ret)
{
    if (len < sizeof(*ret))
        return -EBADMSG;
    memcpy(ret, data, sizeof(*ret));
    return 0;
}
