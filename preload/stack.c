/* preload/stack.c: see stack.h. Hook-safe: raw system calls (syscall(2) is no
 * cancellation point, unlike read(2)), a small buffer on the stack, no allocation. */
#include "preload/stack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <unistd.h>

enum maps_state { MAPS_START, MAPS_END, MAPS_SKIP };

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int client_find_mapping(uint64_t addr, uint64_t *ret_start, uint64_t *ret_end)
{
    char buf[1024];
    enum maps_state st = MAPS_START;
    uint64_t start = 0, end = 0;
    int r = -ENOENT;

    long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    for (;;) {
        long n = syscall(SYS_read, (int)fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            break;
        }
        if (n == 0)
            break;
        /* "start-end perms offset dev inode path\n", parsed as a stream: lines may be
         * split across reads and only the two addresses matter. */
        for (long i = 0; i < n; i++) {
            char c = buf[i];
            if (c == '\n') {
                st = MAPS_START;
                start = end = 0;
                continue;
            }
            int v = hexval(c);
            if (st == MAPS_START) {
                if (v >= 0)
                    start = start << 4 | (uint64_t)v;
                else
                    st = c == '-' ? MAPS_END : MAPS_SKIP;
            } else if (st == MAPS_END) {
                if (v >= 0) {
                    end = end << 4 | (uint64_t)v;
                } else {
                    st = MAPS_SKIP;
                    if (addr >= start && addr < end) {
                        *ret_start = start;
                        *ret_end = end;
                        r = 0;
                        goto out;
                    }
                }
            }
        }
    }
out:
    (void)syscall(SYS_close, (int)fd);
    return r;
}

int client_stack_lookup(struct client_stack_cache *cache, uint64_t sp, uint64_t *ret_end)
{
    uint64_t lo, hi;

    if (HP_LIKELY(cache->hi != 0 && sp >= cache->lo && sp < cache->hi)) {
        *ret_end = cache->hi;
        return 0;
    }
    int r = client_find_mapping(sp, &lo, &hi);
    if (r < 0)
        return r;
    /* First lookup of the thread, or its stack grew down: cache. Another stack
     * (sigaltstack, fiber): answer without caching, since that mapping may go away. */
    *ret_end = hi;
    if (cache->hi == 0 || hi == cache->hi) {
        cache->lo = lo;
        cache->hi = hi;
        return 0;
    }
    return 1;
}
