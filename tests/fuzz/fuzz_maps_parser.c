/* tests/fuzz/fuzz_maps_parser.c: the /proc/PID/maps parser on arbitrary text. Checks the
 * parser's promises: sorted, disjoint, non-empty mappings with NUL-terminated paths of
 * the stated length, each found again by a lookup of its first and last address. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "unwinder/maps.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct unwinder__maps m;
    if (unwinder__maps_parse((const char *)data, size, &m) < 0)
        return 0;
    for (size_t i = 0; i < m.n; i++) {
        const struct unwinder__map *e = &m.v[i];
        if (e->start >= e->end || (i > 0 && m.v[i - 1].end > e->start))
            abort();
        if (!e->path || strlen(e->path) != e->path_len)
            abort();
        if (unwinder__maps_find(&m, e->start) != (ssize_t)i ||
            unwinder__maps_find(&m, e->end - 1) != (ssize_t)i)
            abort();
    }
    if (m.n > 0 && m.v[0].start > 0 && unwinder__maps_find(&m, m.v[0].start - 1) >= 0)
        abort();
    unwinder__maps_done(&m);
    return 0;
}
