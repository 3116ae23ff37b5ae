/* tests/preload/bump_alloc.c: a malloc whose every function is async-signal-safe (a bump
 * pointer in one big mapping; free does nothing), preloaded after libheapprof.so by
 * tests/preload/test_client.c so that a signal handler may free() while the program is
 * inside malloc(). Each block has a 16-byte header with its size (for realloc).
 */
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ARENA_BYTES (1ull << 34)

static _Atomic uintptr_t next, end;

static void *bump(size_t size, size_t align)
{
    if (align < 16)
        align = 16;
    if (!atomic_load(&end)) {
        void *p = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        uintptr_t zero = 0;
        if (atomic_compare_exchange_strong(&next, &zero, (uintptr_t)p))
            atomic_store(&end, (uintptr_t)p + ARENA_BYTES);
        else
            (void)munmap(p, ARENA_BYTES);
        while (!atomic_load(&end))
            ;
    }
    if (size > ARENA_BYTES) {
        errno = ENOMEM;
        return NULL;
    }
    uintptr_t cur = atomic_load(&next), start;
    do {
        start = (cur + 16 + align - 1) & ~(uintptr_t)(align - 1);
        if (start + size > atomic_load(&end)) {
            errno = ENOMEM;
            return NULL;
        }
    } while (!atomic_compare_exchange_weak(&next, &cur, start + size));
    memcpy((char *)start - sizeof(size), &size, sizeof(size));
    return (void *)start;
}

void *malloc(size_t size)
{
    return bump(size, 16);
}

void free(void *p)
{
    (void)p;
}

void *calloc(size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return bump(bytes, 16); /* fresh pages: zero */
}

void *realloc(void *p, size_t size)
{
    void *q = bump(size, 16);
    if (q && p) {
        size_t old;
        memcpy(&old, (char *)p - sizeof(old), sizeof(old));
        memcpy(q, p, old < size ? old : size);
    }
    return q;
}

void *memalign(size_t alignment, size_t size)
{
    return bump(size, alignment);
}

void *aligned_alloc(size_t alignment, size_t size)
{
    return bump(size, alignment);
}

int posix_memalign(void **ret, size_t alignment, size_t size)
{
    void *p = bump(size, alignment);
    if (!p)
        return ENOMEM;
    *ret = p;
    return 0;
}

size_t malloc_usable_size(void *p)
{
    size_t n = 0;
    if (p)
        memcpy(&n, (char *)p - sizeof(n), sizeof(n));
    return n;
}
