/* tests/programs/dlloop_lib.c: the libraries tests/programs/dlloop.c loads and unloads in
 * turn. Built twice (DLLOOP_VARIANT 'a' and 'b'): the allocating function sits at the
 * same place in both, with its call to malloc at the same offset, but with frames of
 * different sizes, so that when one is loaded where the other was, the unwind rules of
 * the old one would misdescribe the new one's frames at the very same addresses. */
#include <stdlib.h>
#include <string.h>

#if DLLOOP_VARIANT == 'a'
#define DLLOOP_FN dlloop_alloc_a
#define DLLOOP_FRAME 256
#else
#define DLLOOP_FN dlloop_alloc_b
#define DLLOOP_FRAME 1024
#endif

void *DLLOOP_FN(size_t n);

__attribute__((visibility("default"), noinline)) void *DLLOOP_FN(size_t n)
{
    /* Both sizes take the same instruction encodings (32-bit immediates). */
    volatile char frame[DLLOOP_FRAME];
    frame[0] = (char)n;
    void *p = malloc(n);
    frame[1] = (char)n;
    __asm__ volatile("" ::: "memory");
    return frame[0] == frame[1] ? p : NULL;
}
