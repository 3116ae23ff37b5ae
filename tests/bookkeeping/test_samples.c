/* tests/bookkeeping/test_samples.c: the HeapSample encoders of bookkeeping/samples.c.
 * Random sites (fixed seeds) whose values sit at and around every varint length
 * boundary, each peak mode: the scalar encoder's bytes decode to the sites' values, and
 * the vector encoder writes exactly the scalar one's bytes, including the samples it
 * hands back to the scalar one. Buffers are allocated to the documented room only, so
 * the sanitizer builds catch a store past it. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bookkeeping/samples.h"
#include "common/containers.h"
#include "common/macros.h"
#include "common/pbwire.h"

#define N_SITES 20000

static uint64_t rng_state;

/* splitmix64: the hash of a counter. */
static uint64_t rng(void)
{
    return hp_hash_u64(rng_state += 0x9e3779b97f4a7c15ull);
}

/* A value at or near a varint length boundary, or in a length class, mostly small. */
static uint64_t any_value(void)
{
    static const uint64_t edges[] = {
        0,        1,         0x7f,       0x80,       0x3fff,         0x4000,     0x1fffff,
        0x200000, 0xfffffff, 0x10000000, 0xffffffff, 0x100000000ull, 1ull << 62, UINT64_MAX};
    uint64_t r = rng();
    switch (r % 8) {
    case 0:
        return edges[(r >> 8) % (sizeof(edges) / sizeof(edges[0]))];
    case 1:
        return (r >> 8) & 0x7f;
    case 2:
    case 3:
        return (r >> 8) & 0x3fff;
    case 4:
    case 5:
        return (r >> 8) & 0x1fffff;
    case 6:
        return (r >> 8) & 0xfffffff;
    default:
        return r >> (r % 64);
    }
}

struct sites {
    struct bk_site *sites;
    struct bk_site_max *maxes;
};

/* Sites as bookkeeping keeps them (freed <= allocated, free_count <= alloc_count), but
 * for one in 64, whose live values wrap; half stamped with @stamp. */
static struct sites make_sites(uint64_t seed, uint32_t stamp)
{
    rng_state = seed;
    struct sites s = {calloc(N_SITES, sizeof(*s.sites)), calloc(N_SITES, sizeof(*s.maxes))};
    assert_non_null(s.sites);
    assert_non_null(s.maxes);
    for (size_t i = 0; i < N_SITES; i++) {
        uint64_t al = any_value(), ac = any_value();
        uint64_t fr = al ? rng() % (al + (al < UINT64_MAX)) : 0;
        uint64_t fc = ac ? rng() % (ac + (ac < UINT64_MAX)) : 0;
        if (rng() % 64 == 0) {
            fr = al + 1 + rng() % 1000; /* live bytes wrap */
            fc = ac + 1;
        }
        s.sites[i] = (struct bk_site){
            .allocated = al,
            .freed = fr,
            .alloc_count = ac,
            .free_count = fc,
            .callstack_id = (uint32_t)any_value(),
            .max_stamp = rng() % 2 ? stamp : stamp - 1 - (uint32_t)(rng() % 3),
            .est_allocs = any_value(),
        };
        s.maxes[i] = (struct bk_site_max){any_value(), any_value()};
    }
    return s;
}

static uint8_t *room_for(size_t n)
{
    uint8_t *p = malloc(n * BK_SAMPLE_MAX_BYTES + BK_SAMPLE_SLACK);
    assert_non_null(p);
    return p;
}

/* The fields sample @i of @in must hold: their values by field number in @ret_want,
 * and a mask of which fields there are. */
static uint32_t expected_fields(const struct bk_samples *in, size_t i, uint64_t ret_want[16])
{
    const struct bk_site *s = &in->sites[i];
    memset(ret_want, 0, 16 * sizeof(*ret_want));
    ret_want[15] = bk__site_est_allocs(s);
    ret_want[1] = s->callstack_id;
    ret_want[2] = s->allocated;
    ret_want[3] = s->freed;
    ret_want[5] = s->alloc_count;
    ret_want[6] = s->free_count;
    uint32_t fields = 1u << 1 | 1u << 2 | 1u << 3 | 1u << 5 | 1u << 6 | 1u << 15;
    if (in->mode == BK_PEAK_NONE)
        return fields;
    if (in->mode == BK_PEAK_STAMPED && s->max_stamp == in->stamp) {
        ret_want[8] = in->maxes[i].bytes;
        ret_want[9] = in->maxes[i].count;
    } else if (in->mode == BK_PEAK_STAMPED) {
        ret_want[8] = s->allocated - s->freed;
        ret_want[9] = s->alloc_count - s->free_count;
    }
    return fields | 1u << 8 | 1u << 9;
}

/* Decodes the samples at [@p, @end) and compares them with the sites they came from. */
static void check_decodes(const uint8_t *p, const uint8_t *end, const struct bk_samples *in,
                          size_t n)
{
    struct hp_pb_iter it;
    hp_pb_iter_init(&it, p, (size_t)(end - p));
    struct hp_pb_field f;
    size_t i = 0;
    while (hp_pb_next(&it, &f)) {
        assert_int_equal(f.num, 2);
        assert_int_equal(f.wire_type, HP_PB_LEN);
        assert_true(i < n);
        uint64_t want[16];
        uint32_t expect = expected_fields(in, i, want), seen = 0;
        struct hp_pb_iter sub;
        hp_pb_iter_init(&sub, f.ptr, f.len);
        struct hp_pb_field g;
        uint32_t prev = 0;
        while (hp_pb_next(&sub, &g)) {
            assert_int_equal(g.wire_type, HP_PB_VARINT);
            assert_true(g.num > prev); /* in field order */
            prev = g.num;
            assert_true(g.num < 16);
            assert_true(g.varint == want[g.num]);
            seen |= 1u << g.num;
        }
        assert_false(sub.error);
        assert_int_equal(seen, expect);
        i++;
    }
    assert_false(it.error);
    assert_int_equal(i, n);
}

/* Sum of the minimal varint sizes of the sample's values: the scalar encoder's output
 * must be exactly that long (no padded varints). */
static size_t minimal_size(const struct bk_samples *in, size_t n)
{
    uint8_t tmp[HP_PB_VARINT_MAX];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t want[16];
        uint32_t fields = expected_fields(in, i, want);
        size_t body = 0;
        for (uint32_t num = 1; num < 16; num++)
            if (fields >> num & 1)
                body += 1 + hp_pb_put_varint(tmp, want[num]);
        total += 2 + body;
    }
    return total;
}

static const enum bk_peak_mode modes[] = {BK_PEAK_NONE, BK_PEAK_ZERO, BK_PEAK_STAMPED};

static void test_samples_scalar_decodes(void **state)
{
    (void)state;
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        struct sites s = make_sites(0x5eed0001 + m, 77);
        struct bk_samples in = {s.sites, s.maxes, 77, modes[m]};
        uint8_t *buf = room_for(N_SITES);
        uint8_t *end = bk__encode_samples_scalar(buf, &in, 0, N_SITES);
        assert_int_equal((size_t)(end - buf), minimal_size(&in, N_SITES));
        check_decodes(buf, end, &in, N_SITES);
        free(buf);
        free(s.sites);
        free(s.maxes);
    }
}

static void test_samples_simd_matches_scalar(void **state)
{
    (void)state;
    if (!bk__encode_samples_simd_ok()) {
        /* Nothing to compare: bk__encode_samples() takes the scalar path. */
        fprintf(stderr, "# no AVX2 here: the vector encoder is not used\n");
        skip();
    }
    for (int round = 0; round < 4; round++) {
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
            /* Rounds 1 to 3: only values the vector path takes, then stamps that all or
             * none match, so long runs stay in the vector loop. */
            uint32_t stamp = 1000 + (uint32_t)round;
            struct sites s = make_sites(0xabcd0000 + (uint64_t)round * 16 + m, stamp);
            for (size_t i = 0; round > 0 && i < N_SITES; i++) {
                struct bk_site *t = &s.sites[i];
                t->allocated &= 0x1fffff;
                t->freed = t->allocated ? t->freed % (t->allocated + 1) : 0;
                t->alloc_count &= 0x1fffff;
                t->free_count = t->alloc_count ? t->free_count % (t->alloc_count + 1) : 0;
                t->callstack_id &= 0x1fffff;
                s.maxes[i].bytes &= 0x1fffff;
                s.maxes[i].count &= 0x1fffff;
                t->est_allocs &= (uint64_t)0x1fffff * BK_WEIGHT_ONE;
                if (round == 2)
                    t->max_stamp = stamp;
                if (round == 3)
                    t->max_stamp = stamp + 1;
            }
            struct bk_samples in = {s.sites, s.maxes, stamp, modes[m]};
            uint8_t *a = room_for(N_SITES), *b = room_for(N_SITES);
            /* Odd ranges too: the loops must start and stop anywhere. */
            size_t from = (size_t)round * 3, to = N_SITES - (size_t)round;
            uint8_t *ea = bk__encode_samples_scalar(a, &in, from, to);
            uint8_t *eb = bk__encode_samples_simd(b, &in, from, to);
            assert_int_equal(ea - a, eb - b);
            assert_memory_equal(a, b, (size_t)(ea - a));
            /* bk__encode_samples() is one of the two. */
            uint8_t *ec = bk__encode_samples(b, &in, from, to);
            assert_int_equal(ea - a, ec - b);
            assert_memory_equal(a, b, (size_t)(ea - a));
            free(a);
            free(b);
            free(s.sites);
            free(s.maxes);
        }
    }
}

/* One sample of each length class per field, one at a time, each in a buffer of exactly
 * the documented room. */
static void test_samples_single_in_exact_room(void **state)
{
    (void)state;
    static const uint64_t vals[] = {0, 0x7f, 0x80, 0x3fff, 0x4000, 0x1fffff, 0x200000, UINT64_MAX};
    const size_t nv = sizeof(vals) / sizeof(vals[0]);
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
        for (size_t field = 0; field < 7; field++)
            for (size_t j = 0; j < nv; j++) {
                struct bk_site site = {0};
                struct bk_site_max max = {0};
                uint64_t v = vals[j];
                switch (field) {
                case 0:
                    site.callstack_id = (uint32_t)HP_MIN(v, UINT32_MAX);
                    break;
                case 1:
                    site.allocated = v;
                    break;
                case 2:
                    site.allocated = site.freed = v;
                    break;
                case 3:
                    site.alloc_count = v;
                    break;
                case 4:
                    site.alloc_count = site.free_count = v;
                    break;
                case 5:
                    max.bytes = v;
                    site.max_stamp = 5;
                    break;
                default:
                    max.count = v;
                    site.max_stamp = 5;
                    break;
                }
                struct bk_samples in = {&site, &max, 5, modes[m]};
                uint8_t *a = room_for(1), *b = room_for(1);
                uint8_t *ea = bk__encode_samples_scalar(a, &in, 0, 1);
                check_decodes(a, ea, &in, 1);
                uint8_t *eb = bk__encode_samples(b, &in, 0, 1);
                assert_int_equal(ea - a, eb - b);
                assert_memory_equal(a, b, (size_t)(ea - a));
                if (bk__encode_samples_simd_ok()) {
                    eb = bk__encode_samples_simd(b, &in, 0, 1);
                    assert_int_equal(ea - a, eb - b);
                    assert_memory_equal(a, b, (size_t)(ea - a));
                }
                free(a);
                free(b);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_scalar_decodes),
        cmocka_unit_test(test_samples_simd_matches_scalar),
        cmocka_unit_test(test_samples_single_in_exact_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
