/* tests/programs/static_prog.c: a statically linked program heapprof must refuse. */
#include <stdio.h>

int main(void)
{
    puts("static");
    return 0;
}
