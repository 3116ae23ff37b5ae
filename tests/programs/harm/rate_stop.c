/* tests/programs/harm/rate_stop.c: a malloc(64)+free loop whose profiling service is
 * stopped for 2 s (tests/e2e/test_every_program.c, scripts/bench.sh client).
 *
 * Runs for 4 s. When its parent is `heapprof record` (the service), it stops the parent
 * with SIGSTOP at 1.0 s and continues it at 3.0 s; under any other parent it stops
 * nothing. stdout: one fixed line. stderr: the loop's rate before the stop (0.2-1.0 s),
 * during the stop from 1 s after it on (2.0-3.0 s), and after it (3.2-4.0 s), as
 *   rate_stop: before R/s during R/s after R/s ratio X
 * where ratio is during / before.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parent_is_heapprof(void)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)getppid());
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = 0;
    fclose(f);
    return strcmp(comm, "heapprof\n") == 0;
}

int main(void)
{
    pid_t service = parent_is_heapprof() ? getppid() : 0;
    /* Pairs counted in each phase: before, during (from 1 s after the stop), after. */
    uint64_t count[3] = {0, 0, 0};
    const double from[3] = {0.2, 2.0, 3.2}, to[3] = {1.0, 3.0, 4.0};
    int stopped = 0, continued = 0;
    double t0 = now_s(), t = 0;
    while (t < 4.0) {
        /* 1000 pairs between clock reads: about 10-50 us. */
        for (int i = 0; i < 1000; i++) {
            void *volatile p = malloc(64);
            free(p);
        }
        t = now_s() - t0;
        for (int k = 0; k < 3; k++)
            if (t >= from[k] && t < to[k])
                count[k] += 1000;
        if (service && !stopped && t >= 1.0) {
            (void)kill(service, SIGSTOP);
            stopped = 1;
        }
        if (service && stopped && !continued && t >= 3.0) {
            (void)kill(service, SIGCONT);
            continued = 1;
        }
    }
    if (service && stopped && !continued)
        (void)kill(service, SIGCONT);
    double rate[3];
    for (int k = 0; k < 3; k++)
        rate[k] = (double)count[k] / (to[k] - from[k]);
    fprintf(stderr, "rate_stop: before %.0f/s during %.0f/s after %.0f/s ratio %.3f\n", rate[0],
            rate[1], rate[2], rate[0] > 0 ? rate[1] / rate[0] : 0);
    printf("rate_stop: 4 s of malloc(64)+free\n");
    return 0;
}
