/* tests/programs/harm/slowctor.c: linked with a library whose constructor takes a second
 * (slowctor_lib.c); then prints "ready", allocates a little every 50 ms in leak_site()
 * for the number of milliseconds given (default 1500), and prints "done". */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern int slowctor_ready;

static void *volatile kept[1024];

static __attribute__((noinline)) void leak_site(int i)
{
    kept[i % 1024] = malloc(5000);
}

int main(int argc, char **argv)
{
    long ms = argc > 1 ? atol(argv[1]) : 1500;
    printf("ready %d\n", slowctor_ready);
    fflush(stdout);
    for (long t = 0, i = 0; t < ms; t += 50, i++) {
        leak_site((int)i);
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    printf("done\n");
    return 0;
}
