/* bookkeeping/samples.c: the HeapSample encoders (see samples.h).
 *
 * Both are measured by tests/bench/bench_bookkeeping.c (dump_encode_vs_sol,
 * samples_simd_vs_scalar). The scalar loop is bound by its instruction count: about 90
 * per sample of a big 4 KiB profile (a tag byte and 1 to 3 value bytes for each of
 * eight fields, each length class a branch). The vector one takes a sample's eight
 * values as 32-bit lanes of one AVX2 register,
 *
 *     lane:   0   1   2   3  |  4   5   6   7
 *            cs  al  fr  ac  | fc  mb  mc  ea     (ea: est_alloc_count)
 *
 * spreads each value's 7-bit groups into bytes, sets the continuation bits from two
 * compares, puts each field's tag below its bytes, and packs each half's used bytes
 * together with one byte shuffle, whose control comes from a table indexed by the
 * halves' length classes.
 */
#include "bookkeeping/samples.h"

#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "common/macros.h"
#include "common/pbwire.h"
#include "protos/fields.h"

/* Tag bytes, one byte each: fields below 16. */
#define SAMPLES_TAG (PF_DUMP(samples) << 3 | HP_PB_LEN)
#define TAG(f) (PF_SAMPLE(f) << 3 | HP_PB_VARINT)
_Static_assert(PF_DUMP(samples) < 16 && PF_SAMPLE(callstack_id) < 16 &&
                   PF_SAMPLE(self_allocated) < 16 && PF_SAMPLE(self_freed) < 16 &&
                   PF_SAMPLE(alloc_count) < 16 && PF_SAMPLE(free_count) < 16 &&
                   PF_SAMPLE(est_alloc_count) < 16 && PF_SAMPLE(self_max) < 16 &&
                   PF_SAMPLE(self_max_count) < 16,
               "one-byte tags");

_Static_assert(BK_SAMPLE_MAX_BYTES - 2 < 0x80, "a sample's length fits one byte");

/* ---- scalar ---- */

/* Tag byte @tag and varint @v. Values below 2^21 take one unaligned store of the tag and
 * their bytes (which may write past them). pre: HP_PB_VARINT_MAX + 2 bytes of room. */
static inline uint8_t *tput(uint8_t *q, uint8_t tag, uint64_t v)
{
    if (HP_LIKELY(v < 0x80)) {
        uint16_t w = (uint16_t)(tag | v << 8);
        memcpy(q, &w, sizeof(w));
        return q + 2;
    }
    if (HP_LIKELY(v < 0x4000)) {
        uint32_t w = tag | (uint32_t)((v & 0x7f) | 0x80) << 8 | (uint32_t)(v >> 7) << 16;
        memcpy(q, &w, sizeof(w));
        return q + 3;
    }
    if (HP_LIKELY(v < 0x200000)) {
        uint32_t w = tag | (uint32_t)((v & 0x7f) | 0x80) << 8 |
                     (uint32_t)((v >> 7 & 0x7f) | 0x80) << 16 | (uint32_t)(v >> 14) << 24;
        memcpy(q, &w, sizeof(w));
        return q + 4;
    }
    *q++ = tag;
    return q + hp_pb_put_varint(q, v);
}

/* One sample; the bytes put_item in bookkeeping/dump.c would write. */
static HP_ALWAYS_INLINE uint8_t *put_sample(uint8_t *q, const struct bk_samples *in, size_t k)
{
    /* Read before the stores, which could alias them as far as the compiler knows. */
    const struct bk_site *s = &in->sites[k];
    const uint64_t al = s->allocated, fr = s->freed, ac = s->alloc_count, fc = s->free_count;
    const uint32_t cs = s->callstack_id, st = s->max_stamp;
    const uint64_t ea = bk__site_est_allocs(s);
    q[0] = SAMPLES_TAG;
    uint8_t *len = q + 1;
    q += 2;
    q = tput(q, TAG(callstack_id), cs);
    q = tput(q, TAG(self_allocated), al);
    q = tput(q, TAG(self_freed), fr);
    q = tput(q, TAG(alloc_count), ac);
    q = tput(q, TAG(free_count), fc);
    if (in->mode != BK_PEAK_NONE) {
        /* bk__site_at_peak() */
        uint64_t mb = al - fr, mc = ac - fc;
        if (in->mode == BK_PEAK_ZERO) {
            mb = mc = 0;
        } else if (st == in->stamp) {
            mb = in->maxes[k].bytes;
            mc = in->maxes[k].count;
        }
        q = tput(q, TAG(self_max), mb);
        q = tput(q, TAG(self_max_count), mc);
    }
    q = tput(q, TAG(est_alloc_count), ea);
    *len = (uint8_t)(q - len - 1);
    return q;
}

uint8_t *bk__encode_samples_scalar(uint8_t *q, const struct bk_samples *in, size_t k, size_t end)
{
    /* A copy in a local: stores through byte pointers would make the compiler reload
     * its fields after each one. */
    const struct bk_samples loc = *in;
    for (; k < end; k++)
        q = put_sample(q, &loc, k);
    return q;
}

/* ---- AVX2 ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define SIMD_TARGET __attribute__((target("avx2,popcnt")))

_Static_assert(offsetof(struct bk_site, allocated) == 0 && offsetof(struct bk_site, freed) == 8 &&
                   offsetof(struct bk_site, alloc_count) == 16 &&
                   offsetof(struct bk_site, free_count) == 24,
               "the four counters load as one 32-byte vector");
_Static_assert(sizeof(struct bk_site_max) == 16, "a site's peak values load as one 16-byte vector");

/* Lanes each half uses: the low half always all four; the high half fc and ea, and
 * with the self_max fields mb and mc too. */
enum { HALF_LOW, HALF_HIGH_MAX, HALF_HIGH_NONE, HALF_KINDS };
static const unsigned half_lanes[HALF_KINDS] = {0xf, 0xf, 0x9};

/* Per half kind and length classes (bit i: lane i's value >= 2^7; bit 4 + i: >= 2^14),
 * the byte shuffle that packs the used lanes' tag and value bytes. */
static uint8_t shuffles[HALF_KINDS][256][16] __attribute__((aligned(16)));
static pthread_once_t shuffles_once = PTHREAD_ONCE_INIT;

static void build_shuffles(void)
{
    for (int h = 0; h < HALF_KINDS; h++)
        for (unsigned idx = 0; idx < 256; idx++) {
            uint8_t *t = shuffles[h][idx];
            memset(t, 0x80, 16); /* 0x80: a zero byte */
            int o = 0;
            for (int lane = 0; lane < 4; lane++) {
                if (!(half_lanes[h] >> lane & 1))
                    continue;
                int n = 2 + (idx >> lane & 1) + (idx >> (4 + lane) & 1);
                for (int b = 0; b < n && o < 16; b++)
                    t[o++] = (uint8_t)(4 * lane + b);
            }
        }
}

/* Encodes sites from @k on while each fits the vector path (all values below 2^21,
 * peak values included); returns the index of the first one that does not, or @end.
 * *@qp advances. A constant @mode makes one loop per mode. */
static SIMD_TARGET HP_ALWAYS_INLINE size_t simd_run(uint8_t **qp, const struct bk_samples *in,
                                                    size_t k, size_t end, enum bk_peak_mode mode)
{
    /* Few constants, so that all stay in registers (GCC rebuilds the others in the loop
     * from immediates, which costs more than the work itself). */
    __m256i lo7 = _mm256_set1_epi32(0x7f), two_bytes = _mm256_set1_epi32(0x3fff),
            cont = _mm256_set1_epi32(0x8000), above21 = _mm256_set1_epi32((int)0xffe00000);
    __m256i tags = _mm256_setr_epi32(TAG(callstack_id), TAG(self_allocated), TAG(self_freed),
                                     TAG(alloc_count), TAG(free_count), TAG(self_max),
                                     TAG(self_max_count), TAG(est_alloc_count));
    __m256i too_big = _mm256_set1_epi64x(~(int64_t)0x1fffff);
    /* Lanes al fr ac fc from the 64-bit counters, then al ac fr in lanes 5 to 7 (lane 0
     * gets the callstack id, lanes 5 and 6 the peak values, lane 7 ea). */
    __m256i to_lanes = _mm256_setr_epi32(0, 0, 2, 4, 6, 0, 4, 2);
    /* Opaque to the optimizer from here on, so it keeps them in registers. */
    __asm__(""
            : "+x"(lo7), "+x"(two_bytes), "+x"(cont), "+x"(above21), "+x"(tags), "+x"(too_big),
              "+x"(to_lanes));
    const unsigned high_lanes = half_lanes[mode == BK_PEAK_NONE ? HALF_HIGH_NONE : HALF_HIGH_MAX];
    const unsigned high_mask = high_lanes | high_lanes << 4;
    const unsigned high_fixed = 2 * (unsigned)__builtin_popcount(high_lanes);
    const uint8_t(*const high_table)[16] =
        shuffles[mode == BK_PEAK_NONE ? HALF_HIGH_NONE : HALF_HIGH_MAX];
    const struct bk_site *const sites = in->sites;
    const struct bk_site_max *const maxes = in->maxes;
    const uint32_t stamp = in->stamp;
    uint8_t *q = *qp;
    for (; k < end; k++) {
        const struct bk_site *s = &sites[k];
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)s);
        if (!_mm256_testz_si256(v, too_big))
            break;
        __m256i x = _mm256_permutevar8x32_epi32(v, to_lanes);
        if (mode == BK_PEAK_ZERO) {
            x = _mm256_blend_epi32(x, _mm256_setzero_si256(), 0x60);
        } else if (mode == BK_PEAK_STAMPED) {
            __m256i peak;
            if (s->max_stamp == stamp) {
                /* bytes and count, 64 bits each, in both halves; their low 32 bits to
                 * lanes 5 and 6 */
                __m256i m = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(const void *)&maxes[k]));
                if (!_mm256_testz_si256(m, too_big))
                    break;
                peak = _mm256_shuffle_epi32(m, _MM_SHUFFLE(0, 2, 0, 0));
            } else {
                /* al - fr and ac - fc: fr and fc (lanes 7 and 4) below al and ac.
                 * freed > allocated never happens; if it did, the difference wraps
                 * and the check below sends the sample to the scalar path, which
                 * writes the wrapped 64-bit value. */
                peak = _mm256_sub_epi32(x, _mm256_shuffle_epi32(x, _MM_SHUFFLE(0, 0, 3, 0)));
            }
            x = _mm256_blend_epi32(x, peak, 0x60);
        }
        x = _mm256_blend_epi32(x, _mm256_set1_epi32((int)s->callstack_id), 0x01);
        /* ea after the peak values, which use fr in lane 7. */
        const uint64_t ea = bk__site_est_allocs(s);
        if (ea >> 21)
            break;
        x = _mm256_blend_epi32(x, _mm256_set1_epi32((int)ea), 0x80);
        if (!_mm256_testz_si256(x, above21))
            break;

        /* The 7-bit groups a + 2^7 b + 2^14 c spread to a + 2^8 b + 2^16 c, shifted above
         * the tag byte, with the continuation bits of values >= 2^7 and >= 2^14. */
        __m256i b = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_andnot_si256(lo7, x)),
                                     _mm256_slli_epi32(_mm256_andnot_si256(two_bytes, x), 1));
        __m256i ge7 = _mm256_cmpgt_epi32(x, lo7), ge14 = _mm256_cmpgt_epi32(x, two_bytes);
        b = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(b, 8), tags),
                            _mm256_or_si256(_mm256_and_si256(ge7, cont),
                                            _mm256_slli_epi32(_mm256_and_si256(ge14, cont), 8)));

        /* The compares narrowed to bytes: mask bits 0..7 are the low half's ge7 and
         * ge14 lanes, bits 16..23 the high half's, as the tables index them. */
        __m256i narrow = _mm256_packs_epi16(_mm256_packs_epi32(ge7, ge14), _mm256_setzero_si256());
        unsigned mask = (unsigned)_mm256_movemask_epi8(narrow);
        unsigned lo_idx = mask & 0xff, hi_idx = mask >> 16 & high_mask;
        unsigned lo_len = 8 + (unsigned)__builtin_popcount(lo_idx);
        unsigned hi_len = high_fixed + (unsigned)__builtin_popcount(hi_idx);
        __m128i lo = _mm_shuffle_epi8(
            _mm256_castsi256_si128(b),
            _mm_load_si128((const __m128i *)(const void *)shuffles[HALF_LOW][lo_idx]));
        __m128i hi =
            _mm_shuffle_epi8(_mm256_extracti128_si256(b, 1),
                             _mm_load_si128((const __m128i *)(const void *)high_table[hi_idx]));
        q[0] = SAMPLES_TAG;
        q[1] = (uint8_t)(lo_len + hi_len);
        _mm_storeu_si128((__m128i *)(void *)(q + 2), lo);
        _mm_storeu_si128((__m128i *)(void *)(q + 2 + lo_len), hi);
        q += 2 + lo_len + hi_len;
    }
    *qp = q;
    return k;
}

#define DEFINE_SIMD_RUN(name, mode)                                                                \
    static SIMD_TARGET HP_NOINLINE size_t name(uint8_t **qp, const struct bk_samples *in,          \
                                               size_t k, size_t end)                               \
    {                                                                                              \
        return simd_run(qp, in, k, end, mode);                                                     \
    }
DEFINE_SIMD_RUN(simd_run_none, BK_PEAK_NONE)
DEFINE_SIMD_RUN(simd_run_zero, BK_PEAK_ZERO)
DEFINE_SIMD_RUN(simd_run_stamped, BK_PEAK_STAMPED)

bool bk__encode_samples_simd_ok(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
}

uint8_t *bk__encode_samples_simd(uint8_t *q, const struct bk_samples *in, size_t k, size_t end)
{
    (void)pthread_once(&shuffles_once, build_shuffles);
    size_t (*run)(uint8_t **, const struct bk_samples *, size_t, size_t) =
        in->mode == BK_PEAK_NONE   ? simd_run_none
        : in->mode == BK_PEAK_ZERO ? simd_run_zero
                                   : simd_run_stamped;
    while (k < end) {
        k = run(&q, in, k, end);
        if (k < end) {
            q = put_sample(q, in, k); /* a value the vector path does not take */
            k++;
        }
    }
    return q;
}

#else

bool bk__encode_samples_simd_ok(void)
{
    return false;
}

uint8_t *bk__encode_samples_simd(uint8_t *q, const struct bk_samples *in, size_t k, size_t end)
{
    return bk__encode_samples_scalar(q, in, k, end);
}

#endif

uint8_t *bk__encode_samples(uint8_t *q, const struct bk_samples *in, size_t k, size_t end)
{
    return bk__encode_samples_simd_ok() ? bk__encode_samples_simd(q, in, k, end)
                                        : bk__encode_samples_scalar(q, in, k, end);
}
