/* unwinder/maps.h: parser for the text of /proc/PID/maps (internal to unwinder/).
 *
 * One line per mapping:
 *
 *     start-end perms offset major:minor inode      path
 *     7f1c2a021000-7f1c2a1b6000 r-xp 00026000 fe:00 332835  /usr/lib/x86_64-linux-gnu/libc.so.6
 *
 * The text is untrusted (it is also a fuzz target): any bytes are accepted, lines that do
 * not parse are skipped and counted, and the result is a sorted array of disjoint
 * mappings, so a lookup is one binary search. Paths may contain spaces and end with
 * " (deleted)"; anonymous mappings have path "".
 *
 *     struct unwinder__maps m;
 *     if (unwinder__maps_read(maps_fd, &m) == 0) {
 *         ssize_t i = unwinder__maps_find(&m, pc);   // -1: no mapping holds pc
 *         unwinder__maps_done(&m);
 *     }
 *
 * Not thread-safe; one owner.
 */
#ifndef HP_UNWINDER_MAPS_H
#define HP_UNWINDER_MAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"

/* Upper bound of the maps text we read; a process with more is not profiled sensibly
 * anyway, and the cap keeps a hostile or huge file from exhausting the service. */
#define UNWINDER_MAPS_MAX_BYTES (64u << 20)

#define UNWINDER_PERM_READ (1u << 0)
#define UNWINDER_PERM_WRITE (1u << 1)
#define UNWINDER_PERM_EXEC (1u << 2)
#define UNWINDER_PERM_SHARED (1u << 3)

struct unwinder__map {
    uint64_t start; /* first address */
    uint64_t end;   /* one past the last address; start < end */
    uint64_t pgoff; /* file offset of @start */
    uint64_t inode;
    uint32_t dev_major, dev_minor;
    uint32_t perms;    /* UNWINDER_PERM_* */
    uint32_t path_len; /* strlen(path) */
    const char *path;  /* NUL-terminated, points into the owning maps' text; "" if none */
};

struct unwinder__maps {
    struct unwinder__map *v; /* sorted by start, disjoint */
    size_t n;
    size_t bad_lines; /* lines skipped because they did not parse or overlapped */
    char *text;       /* owned; the paths point into it */
};

/* Parses @len bytes of maps text (copied; need not be NUL-terminated). On success fills
 * @ret, which the caller releases with unwinder__maps_done(). -ENOMEM, -EFBIG. */
int unwinder__maps_parse(const char *text, size_t len, struct unwinder__maps *ret) HP_WARN_UNUSED;

/* Reads the whole file behind @fd (borrowed) with pread from offset 0, then parses it. */
int unwinder__maps_read(int fd, struct unwinder__maps *ret) HP_WARN_UNUSED;

/* Releases what unwinder__maps_parse/read allocated; @m is left empty. Accepts an empty or
 * zeroed struct. */
void unwinder__maps_done(struct unwinder__maps *m);

/* Index of the mapping that holds @addr, or -1. */
ssize_t unwinder__maps_find(const struct unwinder__maps *m, uint64_t addr);

/* True for the path of the dynamic loader (by its file name). */
bool unwinder__is_loader_path(const char *path);

#endif
