/* common/clock.h: clock reads in nanoseconds. Hook-safe (clock_gettime is vDSO and
 * async-signal-safe).
 *
 *     uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
 */
#ifndef HP_COMMON_CLOCK_H
#define HP_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t hp_clock_ns(clockid_t clk)
{
    struct timespec ts;
    if (clock_gettime(clk, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
