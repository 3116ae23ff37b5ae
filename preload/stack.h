/* preload/stack.h: where the current thread's stack ends, for the raw stack copy.
 *
 * The end of the mapping that contains the stack pointer is found once per thread by
 * scanning /proc/self/maps with raw system calls (no stdio, no allocation) and cached in
 * the thread's TLS. When the stack pointer later lies outside the cached range the maps
 * are scanned again: the main thread's stack grew (same end: the cache is extended), or
 * the thread runs on another stack (sigaltstack, a fiber: the answer is not cached).
 *
 *     uint64_t end;
 *     if (client_stack_lookup(&cache, sp, &end) >= 0) copy(sp, min(end - sp, cap));
 *
 * Hook-safe.
 */
#ifndef HP_PRELOAD_STACK_H
#define HP_PRELOAD_STACK_H

#include <stdint.h>

#include "common/macros.h"

struct client_stack_cache {
    uint64_t lo, hi; /* [lo, hi) of the thread's stack mapping; hi == 0: unknown */
};

/* Scans /proc/self/maps for the mapping holding @addr. Returns 0, -ENOENT when no mapping
 * holds it, or -errno. */
int client_find_mapping(uint64_t addr, uint64_t *ret_start, uint64_t *ret_end) HP_WARN_UNUSED;

/* Returns 0 with the end of the thread's stack mapping holding @sp (using and updating
 * @cache), 1 with the end of another mapping holding @sp (a stack we do not know: signal
 * stack, fiber; not cached), or -ENOENT / -errno. */
int client_stack_lookup(struct client_stack_cache *cache, uint64_t sp,
                        uint64_t *ret_end) HP_WARN_UNUSED;

#endif
