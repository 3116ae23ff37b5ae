/* tests/fuzz/fuzz_perfmap.c: the perf map reader (unwinder/perfmap.c) on arbitrary file
 * contents, read in two parts as a growing file is. Checks its promises: the ranges kept
 * stay sorted, disjoint and bounded, and the last line parsed names its own start (the
 * later line wins). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "unwinder/unwinder_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The last line of @data[0..size) that parses: its start and name. */
static bool last_line(const uint8_t *data, size_t size, uint64_t *start, const char **name,
                      size_t *name_len)
{
    bool found = false;
    size_t pos = 0;
    while (pos < size) {
        const uint8_t *nl = memchr(data + pos, '\n', size - pos);
        if (!nl)
            break;
        size_t len = (size_t)(nl - (data + pos)), off, nlen;
        uint64_t s, sz;
        if (unwinder__perfmap_parse_line((const char *)data + pos, len, &s, &sz, &off, &nlen) ==
            0) {
            found = true;
            *start = s;
            *name = (const char *)data + pos + off;
            *name_len = nlen;
        }
        pos += len + 1;
    }
    return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("perfmap", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t half = size / 2;
    if (write(fd, data, half) != (ssize_t)half) {
        close(fd);
        return 0;
    }
    struct unwinder__perfmap *pm = unwinder__perfmap_new(fd);
    if (!pm)
        return 0;
    (void)unwinder__perfmap_read(pm);
    if (!unwinder__perfmap_valid(pm))
        abort();
    if (pwrite(fd, data + half, size - half, (off_t)half) == (ssize_t)(size - half)) {
        while (unwinder__perfmap_read(pm)) {
        }
    }
    if (!unwinder__perfmap_valid(pm))
        abort();
    uint64_t start;
    const char *want, *got;
    size_t want_len, got_len;
    if (last_line(data, size, &start, &want, &want_len)) {
        got = unwinder__perfmap_lookup(pm, start, &got_len);
        if (!got || got_len != want_len || memcmp(got, want, want_len) != 0)
            abort();
    }
    unwinder__perfmap_free(pm);
    return 0;
}
