/* tests/fuzz/fuzz_srcline.c: source lines and inline chains (unwinder/srcline.c) from a
 * file a client named: the DWARF is untrusted. Every lookup must return, with at most
 * UNWINDER_MAX_INLINE_DEPTH lines, each with a file and a function name (maybe ""), and
 * never crash, hang or fault.
 *
 * Input layout:
 *   bytes 0-7    first pc looked up (little endian)
 *   bytes 8-11   stride between pcs
 *   byte 12      pcs looked up (0..31)
 *   bytes 13-15  unused
 *   the rest     the file (an ELF object with DWARF), written to a temporary file
 * Each input gets a fresh unwinder (the caches key files by path).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unwinder/unwinder.h"
#include "unwinder/unwinder_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEAD 16

static char g_path[64];

static bool write_file(const uint8_t *data, size_t len)
{
    if (!g_path[0])
        (void)snprintf(g_path, sizeof(g_path), "/tmp/heapprof-fuzz-srcline.%d", (int)getpid());
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return false;
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n <= 0) {
            (void)close(fd);
            return false;
        }
        data += n;
        len -= (size_t)n;
    }
    return close(fd) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEAD || !write_file(data + HEAD, size - HEAD))
        return 0;
    uint64_t pc;
    uint32_t stride;
    memcpy(&pc, data, sizeof(pc));
    memcpy(&stride, data + 8, sizeof(stride));
    unsigned count = data[12] % 32;

    if (unwinder_global_init() < 0)
        abort();
    unwinder_set_source_lines(true);
    struct hp_mapping m = {.path = unwinder__intern(g_path, strlen(g_path))};
    if (!m.path)
        abort();
    for (unsigned i = 0; i < count; i++, pc += stride) {
        const struct hp_source_line *lines;
        size_t n;
        if (unwinder_source_lines(&m, pc, &lines, &n) < 0)
            continue;
        if (n == 0 || n > UNWINDER_MAX_INLINE_DEPTH)
            abort();
        for (size_t k = 0; k < n; k++)
            if (!lines[k].file || !lines[k].function_name)
                abort();
    }
    unwinder_global_done();
    (void)unlink(g_path);
    return 0;
}
