/* tests/programs/hostile_names.c: allocates through functions whose symbol names are
 * markup ("</script><img ...>", an HTML comment opener, quotes), as a hostile or merely
 * unusual program may have, for the HTML page's escaping (tests/e2e/test_html.c).
 * The names are assembler labels; everything else is ordinary C. Prints "ok". */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
#define BARRIER() __asm__ volatile("" ::: "memory")

static void *volatile keep[2];

NOINLINE void *tag_alloc(size_t n) __asm__("\"</script><img src=x onerror=alert(1)>\"");
NOINLINE void *comment_alloc(size_t n) __asm__("\"<!--<script>'&amp;\"");

NOINLINE void *tag_alloc(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *comment_alloc(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

int main(void)
{
    keep[0] = tag_alloc(1 << 20);
    keep[1] = comment_alloc(1 << 19);
    puts(keep[0] && keep[1] ? "ok" : "no memory");
    return 0;
}
