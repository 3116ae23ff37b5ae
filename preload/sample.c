/* preload/sample.c: see sample.h. Hook-safe: arithmetic and log() only. */
#include "preload/sample.h"

#include <math.h>

void client_sampler_params_init(struct client_sampler_params *p, uint64_t interval)
{
    p->interval = interval;
    p->log_keep = interval > 1 ? log1p(-1.0 / (double)interval) : 0.0;
    p->inv_log_keep = interval > 1 ? 1.0 / p->log_keep : 0.0;
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoroshiro128** */
static uint64_t sampler_next(struct client_sampler *s)
{
    uint64_t s0 = s->rng[0], s1 = s->rng[1];
    uint64_t result = rotl(s0 * 5, 7) * 9;
    s1 ^= s0;
    s->rng[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    s->rng[1] = rotl(s1, 37);
    return result;
}

/* A geometric distance on {1, 2, ...} with success probability 1/interval. */
static int64_t sampler_next_gap(struct client_sampler *s, const struct client_sampler_params *p)
{
    if (p->interval <= 1)
        return 1;
    /* u uniform in (0, 1]: never log(0). */
    double u = (double)((sampler_next(s) >> 11) + 1) * 0x1.0p-53;
    /* log(u) <= 0 and inv_log_keep < 0: failures >= 0, so the conversion's truncation is
     * the floor. */
    double failures = log(u) * p->inv_log_keep;
    /* u >= 2^-53 bounds failures by about 37 * interval; the cap only guards overflow. */
    if (!(failures < 4.0e18))
        failures = 4.0e18;
    return (int64_t)failures + 1;
}

void client_sampler_init(struct client_sampler *s, const struct client_sampler_params *p,
                         uint64_t seed)
{
    s->rng[0] = client_mix64(seed);
    s->rng[1] = client_mix64(seed ^ 0x6a09e667f3bcc909ull);
    if (s->rng[0] == 0 && s->rng[1] == 0)
        s->rng[1] = 1;
    s->bytes_left = sampler_next_gap(s, p);
}

uint64_t client_sampler_refill(struct client_sampler *s, const struct client_sampler_params *p)
{
    uint64_t k = 0;
    while (s->bytes_left <= 0) {
        s->bytes_left += sampler_next_gap(s, p);
        k++;
    }
    return k * p->interval;
}
