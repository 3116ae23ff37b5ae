/* tests/preload/dl_lib.c: a module that attach_prog dlopens and dlcloses in a loop. */
#include <stdlib.h>
#include <string.h>

int dl_lib_allocate(int n);

__attribute__((visibility("default"))) int dl_lib_allocate(int n)
{
    char *p = malloc(64 + (size_t)n);
    if (!p)
        return -1;
    memset(p, 1, 64);
    free(p);
    return n;
}
