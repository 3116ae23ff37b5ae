/* tests/programs/harm/slowctor_lib.c: a library whose constructor takes a second (it
 * opens a database, warms a cache...), or SLOWCTOR_MS milliseconds. A program linked with
 * it maps a preloaded libheapprof.so from its start, but runs libheapprof's constructor
 * only afterwards. */
#include <stdlib.h>
#include <time.h>

int slowctor_ready;

__attribute__((constructor)) static void slowctor_init(void)
{
    const char *env = getenv("SLOWCTOR_MS");
    long ms = env ? atol(env) : 1000;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0)
        ;
    slowctor_ready = 1;
}
