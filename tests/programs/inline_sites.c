/* tests/programs/inline_sites.c: an allocation inlined two levels deep, for the source
 * lines of inlined frames. grow_buffer() (static, always inlined) calls malloc;
 * make_record() (static, always inlined) calls grow_buffer(); build_table() (never
 * inlined) calls make_record(). Built -O2 -g: the malloc call's return address lies in
 * build_table's code, in the lines of grow_buffer. The tests find the lines by the
 * markers in the comments.
 * Usage: inline_sites [count] */
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
#define ALWAYS_INLINE inline __attribute__((always_inline))

static void *volatile sink;

/* Not static: its name must appear in the profile's stacks. */
void build_table(int n);

static ALWAYS_INLINE char *grow_buffer(size_t n)
{
    char *p = malloc(n); /* @grow_buffer_malloc */
    if (p)
        p[n - 1] = 1;
    return p;
}

static ALWAYS_INLINE char *make_record(int i)
{
    char *p = grow_buffer(64 + (size_t)(i & 7)); /* @make_record_call */
    if (p)
        p[0] = (char)i;
    return p;
}

NOINLINE void build_table(int n)
{
    for (int i = 0; i < n; i++)
        sink = make_record(i); /* @build_table_call */
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    build_table(n);
    return 0;
}
