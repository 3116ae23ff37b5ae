/* common/format.h: numbers as people read them, one format for every command and report.
 *
 *     char b[32];
 *     puts(hp_format_bytes(3 << 20, b, sizeof(b)));   // "3.0 MiB"
 */
#ifndef HP_COMMON_FORMAT_H
#define HP_COMMON_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* "512 B", "1.5 KiB", "3.0 MiB", ... up to PiB. Returns @buf. */
const char *hp_format_bytes(uint64_t bytes, char *buf, size_t len);

#endif
