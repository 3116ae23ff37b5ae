/* tests/fuzz/fuzz_record_decoder.c: the service's validation of ring records
 * (svc__decode_alloc, svc__decode_free) on arbitrary payloads, and the unwinding of every
 * accepted WIRE_ALLOC against a synthetic process (this process's own maps and memory),
 * as the unwinder thread does it. A record is accepted only when its stack fits both the
 * payload and the cap; an accepted one must unwind to at least one frame and never crash.
 *
 * Input layout:
 *   byte 0       record type (low bits: 1 WIRE_ALLOC, 2 WIRE_FREE, others unknown)
 *   byte 1       the max_stack_bytes cap, in KiB (0..255)
 *   the rest     the payload, copied to a buffer of exactly its size
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service/svc_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unwinder_process_t *g_p;
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];

static void setup(void)
{
    if (g_p)
        return;
    if (unwinder_global_init() < 0)
        abort();
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (unwinder_process_new(getpid(), maps_fd, mem_fd, &g_p) < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size < 2)
        return 0;
    unsigned type = data[0] & 3;
    uint64_t max_stack = (uint64_t)data[1] << 10;
    size_t len = size - 2;
    /* An exact-size copy, so reading past the payload is caught by the sanitizers. */
    uint8_t *payload = malloc(len ? len : 1);
    if (!payload)
        return 0;
    memcpy(payload, data + 2, len);

    if (type == WIRE_ALLOC) {
        struct wire_alloc a;
        const uint8_t *stack = NULL;
        int r = svc__decode_alloc(payload, len, max_stack, &a, &stack);
        bool valid = len >= sizeof(a);
        if (valid) {
            struct wire_alloc raw;
            memcpy(&raw, payload, sizeof(raw));
            valid = raw.stack_len <= len - sizeof(raw) && raw.stack_len <= max_stack;
        }
        if ((r == 0) != valid)
            abort();
        if (r == 0) {
            if (stack != payload + sizeof(a))
                abort();
            size_t n = 0;
            struct unwinder_result res;
            if (unwinder_unwind(g_p, a.regs, a.stack_ptr, stack, a.stack_len, g_frames,
                                UNWINDER_MAX_FRAMES, &n, &res) == 0 &&
                (n < 1 || n > UNWINDER_MAX_FRAMES))
                abort();
        }
    } else if (type == WIRE_FREE) {
        struct wire_free f;
        int r = svc__decode_free(payload, len, &f);
        if ((r == 0) != (len >= sizeof(f)))
            abort();
        if (r == 0 && memcmp(&f, payload, sizeof(f)) != 0)
            abort();
    }
    free(payload);
    return 0;
}
