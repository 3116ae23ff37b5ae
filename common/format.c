/* common/format.c: numbers as people read them (format.h). */
#include "common/format.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/macros.h"

const char *hp_format_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", bytes);
        return buf;
    }
    double d = (double)bytes;
    size_t u = 0;
    while (d >= 1024 && u + 1 < HP_ARRAY_SIZE(units)) {
        d /= 1024;
        u++;
    }
    snprintf(buf, len, "%.1f %s", d, units[u]);
    return buf;
}
