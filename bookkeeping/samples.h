/* bookkeeping/samples.h: encodes a heap's sites as ProfilePacket.ProcessHeapSamples
 * .samples fields, the bulk of a big dump (bookkeeping/dump.c). Internal to bookkeeping/.
 *
 *     struct bk_samples in = bk__heap_samples(h, bk->dump_at_max);
 *     q = bk__encode_samples(q, &in, first, end);   // room: see below
 *
 * Each sample is field 2 with a 1-byte length, then callstack_id, self_allocated,
 * self_freed, alloc_count, free_count, est_alloc_count and, with dump_at_max, self_max
 * and self_max_count, as minimal varints. Two encoders write the same bytes: a scalar one,
 * and on x86-64 with AVX2 one that encodes the fields of a sample side by side and
 * packs them with a byte shuffle (values below 2^21; any other sample goes through the
 * scalar one). Not thread-safe; caller serialises (the tables are built once,
 * thread-safely).
 */
#ifndef HP_BOOKKEEPING_SAMPLES_H
#define HP_BOOKKEEPING_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bookkeeping/state.h"

/* What samples carry besides the cumulative fields: nothing, self_max fields of 0 (no
 * peak yet), or the values at the peak (bk__site_at_peak()). */
enum bk_peak_mode { BK_PEAK_NONE, BK_PEAK_ZERO, BK_PEAK_STAMPED };

struct bk_samples {
    const struct bk_site *sites;     /* borrowed */
    const struct bk_site_max *maxes; /* borrowed; read with BK_PEAK_STAMPED only */
    uint32_t stamp;                  /* the heap's peak id, low 32 bits */
    enum bk_peak_mode mode;
};

/* The samples of heap @h as a dump writes them (with the self_max fields when
 * @dump_at_max). */
static inline struct bk_samples bk__heap_samples(const struct bk_heap *h, bool dump_at_max)
{
    return (struct bk_samples){
        .sites = h->sites,
        .maxes = h->maxes,
        .stamp = (uint32_t)h->peak_id,
        .mode = !(dump_at_max && h->track_peak) ? BK_PEAK_NONE
                : h->peak_id == 0               ? BK_PEAK_ZERO
                                                : BK_PEAK_STAMPED,
    };
}

/* Most bytes one sample takes: its tag and length, then field 1 (uint32) and seven
 * uint64 fields with one-byte tags. */
#define BK_SAMPLE_MAX_BYTES (2 + 1 + 5 + 7 * (1 + 10))
/* Bytes the encoders may store past the end of what they write. */
#define BK_SAMPLE_SLACK 32

/* Encodes sites [@k, @end) at @q and returns the end of what it wrote.
 * pre: (@end - @k) * BK_SAMPLE_MAX_BYTES + BK_SAMPLE_SLACK bytes of room at @q. */
uint8_t *bk__encode_samples(uint8_t *q, const struct bk_samples *in, size_t k, size_t end);

/* The same with the scalar encoder, or with the vector one (and the scalar one for the
 * samples it cannot take); the latter only when bk__encode_samples_simd_ok(). For
 * tests and benchmarks. */
uint8_t *bk__encode_samples_scalar(uint8_t *q, const struct bk_samples *in, size_t k, size_t end);
uint8_t *bk__encode_samples_simd(uint8_t *q, const struct bk_samples *in, size_t k, size_t end);
bool bk__encode_samples_simd_ok(void);

#endif
