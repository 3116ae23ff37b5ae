/* tests/fuzz/fuzz_producer_frames.c: what the producer reads from traced's socket, on
 * arbitrary bytes: the frame splitter, IPCFrame, the bind reply, the async commands and
 * the DataSourceConfig inside them. */
#include <stddef.h>
#include <stdint.h>

#include "producer/producer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void frame(void *ctx, const uint8_t *p, size_t len)
{
    (void)ctx;
    struct prod__frame f;
    if (prod__decode_frame(p, len, &f) < 0)
        return;
    uint32_t service, methods[PROD_M_COUNT];
    if (f.kind == PROD_FRAME_BIND_REPLY &&
        prod__decode_bind_reply(f.msg, f.msg_len, &service, methods) == 0 && service == 0xffffffffu)
        return; /* any id is fine; the call must just be bounded */
    static struct prod__command c;
    if (f.kind == PROD_FRAME_INVOKE_REPLY && f.reply &&
        prod__decode_command(f.reply, f.reply_len, &c) == 0 && c.config.heapprofd_config) {
        /* The config's bytes stay inside the frame. */
        const uint8_t *end = p + len;
        if (c.config.heapprofd_config < p ||
            c.config.heapprofd_config + c.config.heapprofd_config_len > end)
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Split anywhere: the stream may come in pieces. */
    size_t cut = size ? data[0] % (size + 1) : 0;
    long used = prod__split_frames(data, cut, frame, NULL);
    if (used >= 0)
        (void)prod__split_frames(data + used, size - (size_t)used, frame, NULL);
    return 0;
}
