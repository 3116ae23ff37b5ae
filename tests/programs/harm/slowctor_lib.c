/* tests/programs/harm/slowctor_lib.c: a library whose constructor takes a second (it
 * opens a database, warms a cache...). A program linked with it maps a preloaded
 * libheapprof.so from its start, but runs libheapprof's constructor only afterwards. */
#include <time.h>

int slowctor_ready;

__attribute__((constructor)) static void slowctor_init(void)
{
    struct timespec ts = {1, 0};
    while (nanosleep(&ts, &ts) != 0)
        ;
    slowctor_ready = 1;
}
