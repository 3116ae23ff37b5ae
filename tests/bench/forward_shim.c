/* tests/bench/forward_shim.c: the least an interposing malloc can do: forward malloc()
 * and free() to glibc's through pointers, as libheapprof.so does while dormant. The
 * dormant benchmark runs with it preloaded as its floor: what any preloaded allocator
 * wrapper costs (an extra jump through a pointer on each call), so that what is left of
 * client_dormant_bigalloc_ratio above client_dormant_bigalloc_floor_ratio is ours. */
#include <stddef.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *p);

/* volatile: a load and an indirect jump per call, as the hooks' resolved pointers. */
static void *(*volatile forward_malloc)(size_t) = __libc_malloc;
static void (*volatile forward_free)(void *) = __libc_free;

__attribute__((visibility("default"))) void *malloc(size_t size)
{
    return forward_malloc(size);
}

__attribute__((visibility("default"))) void free(void *p)
{
    forward_free(p);
}
