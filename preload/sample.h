/* preload/sample.h: the allocation sampler (pure; no globals, no system calls).
 *
 * Poisson sampling over bytes: every allocated byte is picked independently with
 * probability 1/interval. A thread keeps the distance to the next picked byte; the
 * distances are geometric with mean @interval (the discrete form of the exponential).
 * An allocation holding k picked bytes is attributed interval * k bytes, which makes the
 * estimate unbiased: E[interval * k] = size. Allocations of at least @interval bytes are
 * always recorded with their exact size and do not move the counter. Interval 1 thus
 * records every allocation of one byte or more exactly.
 *
 *     struct client_sampler_params p; client_sampler_params_init(&p, 4096);
 *     struct client_sampler s;        client_sampler_init(&s, &p, seed);
 *     uint64_t attributed = client_sampler_step(&s, &p, size);   // 0: not sampled
 *
 * Not thread-safe: one struct client_sampler per thread. Hook-safe.
 */
#ifndef HP_PRELOAD_SAMPLE_H
#define HP_PRELOAD_SAMPLE_H

#include <stdint.h>

#include "common/macros.h"

struct client_sampler_params {
    uint64_t interval;
    double log_keep;     /* log(1 - 1/interval); 0 when interval == 1 */
    double inv_log_keep; /* 1 / log_keep: a draw multiplies (a division took ~4 ns) */
};

struct client_sampler {
    int64_t bytes_left; /* bytes until the next picked byte (the picked one included) */
    uint64_t rng[2];    /* xoroshiro128** state, never all zero */
};

/* pre: interval >= 1. */
void client_sampler_params_init(struct client_sampler_params *p, uint64_t interval);
/* Seeds the generator from @seed and draws the distance to the first picked byte. */
void client_sampler_init(struct client_sampler *s, const struct client_sampler_params *p,
                         uint64_t seed);
/* Draws distances until the counter is above 0 again; returns interval * (draws).
 * Call when bytes_left <= 0 after subtracting an allocation smaller than the interval. */
uint64_t client_sampler_refill(struct client_sampler *s, const struct client_sampler_params *p);
/* One allocation of @size bytes: returns the bytes attributed to it, 0 when unsampled. */
static inline uint64_t client_sampler_step(struct client_sampler *s,
                                           const struct client_sampler_params *p, uint64_t size)
{
    if (size >= p->interval)
        return size;
    s->bytes_left -= (int64_t)size;
    if (HP_LIKELY(s->bytes_left > 0))
        return 0;
    return client_sampler_refill(s, p);
}

/* splitmix64: mixes a seed into a well-spread 64-bit value. */
static inline uint64_t client_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif
