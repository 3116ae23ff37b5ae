/* tests/bookkeeping/test_intern.c: interning of strings, mappings, frames and the
 * callstack trie (bookkeeping/intern.h). */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bookkeeping/intern.h"
#include "common/pbwire.h"
#include "tests/programs/unhash.h"

static int setup(void **state)
{
    struct bk_intern *in = test_malloc(sizeof(*in));
    if (bk__intern_init(in) < 0) {
        test_free(in);
        return -1;
    }
    *state = in;
    return 0;
}

static int teardown(void **state)
{
    struct bk_intern *in = *state;
    bk__intern_done(in);
    test_free(in);
    return 0;
}

static uint32_t str_id(struct bk_intern *in, enum bk_str_kind k, const char *s)
{
    uint32_t id = UINT32_MAX;
    assert_int_equal(bk__intern_string(in, k, s, strlen(s), &id), 0);
    return id;
}

static uint32_t mapping_id(struct bk_intern *in, const struct hp_mapping *m)
{
    uint32_t id = 0;
    assert_int_equal(bk__intern_mapping(in, m, &id), 0);
    assert_true(id > 0);
    return id;
}

static uint32_t frame_id(struct bk_intern *in, const struct hp_mapping *m, const char *name,
                         uint64_t rel_pc)
{
    struct hp_frame f = {.map = m, .function_name = name, .rel_pc = rel_pc};
    uint32_t id = 0;
    assert_int_equal(bk__intern_frame(in, &f, &id), 0);
    assert_true(id > 0);
    return id;
}

static uint32_t stack_id(struct bk_intern *in, const struct hp_frame *frames, size_t n)
{
    uint32_t id = 0;
    assert_int_equal(bk__intern_stack(in, frames, n, &id), 0);
    assert_true(id > 0);
    return id;
}

static void test_intern_strings_separate_id_spaces(void **state)
{
    struct bk_intern *in = *state;
    for (int k = 0; k < BK_STR_KINDS; k++)
        assert_int_equal(str_id(in, (enum bk_str_kind)k, ""), 0);
    assert_int_equal(str_id(in, BK_STR_FUNCTION, "main"), 1);
    assert_int_equal(str_id(in, BK_STR_FUNCTION, "run"), 2);
    assert_int_equal(str_id(in, BK_STR_FUNCTION, "main"), 1);
    /* Each table numbers on its own, as Perfetto's InternedData tables do. */
    assert_int_equal(str_id(in, BK_STR_PATH, "main"), 1);
    assert_int_equal(str_id(in, BK_STR_BUILD_ID, "run"), 1);
    assert_int_equal(in->str[BK_STR_FUNCTION].n, 3);
    assert_string_equal(in->str[BK_STR_FUNCTION].v[2].s, "run");

    /* Build ids are binary: embedded NULs are content. */
    uint32_t a, b;
    assert_int_equal(bk__intern_string(in, BK_STR_BUILD_ID, "a\0b", 3, &a), 0);
    assert_int_equal(bk__intern_string(in, BK_STR_BUILD_ID, "a\0c", 3, &b), 0);
    assert_int_not_equal(a, b);
    assert_int_equal(in->str[BK_STR_BUILD_ID].v[a].len, 3);
}

static void test_intern_strings_truncated(void **state)
{
    struct bk_intern *in = *state;
    static char big[BK_MAX_STRING_BYTES + 100];
    memset(big, 'x', sizeof(big) - 1);
    uint32_t id;
    assert_int_equal(bk__intern_string(in, BK_STR_FUNCTION, big, strlen(big), &id), 0);
    assert_int_equal(in->str[BK_STR_FUNCTION].v[id].len, BK_MAX_STRING_BYTES);
}

static void test_intern_mapping_keyed_by_content(void **state)
{
    struct bk_intern *in = *state;
    char path1[] = "/usr/lib/libc.so.6";
    char path2[] = "/usr/lib/libc.so.6";
    struct hp_mapping m1 = {.start = 0x1000,
                            .end = 0x2000,
                            .exact_offset = 0x100,
                            .start_offset = 0x10,
                            .load_bias = 0x5,
                            .path = path1,
                            .build_id_len = 2,
                            .build_id = {1, 2}};
    struct hp_mapping m2 = m1;
    m2.path = path2; /* equal content, different storage */
    uint32_t id = mapping_id(in, &m1);
    assert_int_equal(mapping_id(in, &m2), id);

    /* Every part of the key matters. */
    struct hp_mapping v;
    uint32_t seen[8];
    size_t n = 0;
    seen[n++] = id;
#define EXPECT_NEW(mutation)                                                                       \
    do {                                                                                           \
        v = m1;                                                                                    \
        mutation;                                                                                  \
        uint32_t x = mapping_id(in, &v);                                                           \
        for (size_t i = 0; i < n; i++)                                                             \
            assert_int_not_equal(x, seen[i]);                                                      \
        seen[n++] = x;                                                                             \
        assert_int_equal(mapping_id(in, &v), x);                                                   \
    } while (0)
    EXPECT_NEW(v.start = 0x1001);
    EXPECT_NEW(v.end = 0x3000);
    EXPECT_NEW(v.exact_offset = 0);
    EXPECT_NEW(v.start_offset = 0);
    EXPECT_NEW(v.load_bias = 0);
    EXPECT_NEW(v.build_id[1] = 3);
    EXPECT_NEW(v.path = "/usr/lib/libm.so.6");
#undef EXPECT_NEW

    /* The path is stored as its components, each interned once. */
    const struct bk_mapping *e = &in->mappings[id];
    assert_int_equal(e->n_comps, 3);
    assert_string_equal(in->str[BK_STR_PATH].v[e->comps[0]].s, "usr");
    assert_string_equal(in->str[BK_STR_PATH].v[e->comps[1]].s, "lib");
    assert_string_equal(in->str[BK_STR_PATH].v[e->comps[2]].s, "libc.so.6");
    assert_string_equal(in->str[BK_STR_BUILD_ID].v[e->build_id].s, "\x01\x02");
    struct hp_mapping slashes = m1;
    slashes.path = "//usr///lib/x";
    const struct bk_mapping *s = &in->mappings[mapping_id(in, &slashes)];
    assert_int_equal(s->n_comps, 3);
    assert_int_equal(s->comps[0], e->comps[0]);
}

static void test_intern_mapping_cache_checks_content(void **state)
{
    struct bk_intern *in = *state;
    /* The same object with new content is a new mapping: the cache by pointer must not
     * answer with the old id. */
    char path[32] = "/lib/a.so";
    struct hp_mapping m = {.start = 0x1000, .end = 0x2000, .path = path};
    uint32_t a = mapping_id(in, &m);
    assert_int_equal(mapping_id(in, &m), a);
    m.end = 0x3000;
    uint32_t b = mapping_id(in, &m);
    assert_int_not_equal(b, a);
    m.end = 0x2000;
    assert_int_equal(mapping_id(in, &m), a);
    strcpy(path, "/lib/a.so.1");
    uint32_t c = mapping_id(in, &m);
    assert_int_not_equal(c, a);
    path[9] = '\0'; /* "/lib/a.so" again */
    assert_int_equal(mapping_id(in, &m), a);
    m.build_id_len = 1;
    assert_int_not_equal(mapping_id(in, &m), a);
}

static void test_intern_unknown_mapping_is_empty(void **state)
{
    struct bk_intern *in = *state;
    uint32_t u = mapping_id(in, NULL);
    assert_int_equal(mapping_id(in, NULL), u);
    const struct bk_mapping *e = &in->mappings[u];
    assert_int_equal(e->n_comps, 0);
    assert_int_equal(e->build_id, 0);
    assert_int_equal(e->start, 0);
    assert_int_equal(e->end, 0);
    struct hp_mapping anon = {.start = 0x1000, .end = 0x2000, .path = ""};
    assert_int_not_equal(mapping_id(in, &anon), u);
}

static void test_intern_frames_by_mapping_pc_and_name(void **state)
{
    struct bk_intern *in = *state;
    struct hp_mapping m = {.start = 0x400000, .end = 0x500000, .path = "/bin/app"};
    uint32_t f1 = frame_id(in, &m, "main", 0x10);
    assert_int_equal(frame_id(in, &m, "main", 0x10), f1);
    uint32_t f2 = frame_id(in, &m, "main", 0x11);
    assert_int_not_equal(f1, f2);
    /* Error frames on the unknown mapping differ only by name. */
    uint32_t e1 = frame_id(in, NULL, "ERROR bad memory", 0);
    uint32_t e2 = frame_id(in, NULL, "ERROR no unwind info", 0);
    assert_int_not_equal(e1, e2);
    assert_int_equal(frame_id(in, NULL, "ERROR bad memory", 0), e1);
    /* NULL names are unknown names, i.e. "" with id 0. */
    uint32_t n = frame_id(in, &m, NULL, 0x20);
    assert_int_equal(in->frames[n].function_name_id, 0);
    assert_int_equal(frame_id(in, &m, "", 0x20), n);

    const struct bk_frame *e = &in->frames[f2];
    assert_int_equal(e->rel_pc, 0x11);
    assert_int_equal(e->mapping_id, mapping_id(in, &m));
    assert_string_equal(in->str[BK_STR_FUNCTION].v[e->function_name_id].s, "main");
}

/* Decodes the emit buffer: the callstack ids of its entries, in order; each entry's
 * frame ids must be those of its callstack, root first. Returns the entries. */
static size_t emitted(const struct bk_intern *in, uint32_t *ids, size_t max)
{
    size_t n = 0, off = 0, marks = 0;
    while (off < in->emit.len) {
        if (n % BK_EMIT_MARK_EVERY == 0) {
            assert_true(marks < in->emit.n_marks);
            assert_int_equal(in->emit.marks[marks++], off);
        }
        struct hp_pb_iter it;
        struct hp_pb_field f;
        size_t size = bk__emit_entry_size(in->emit.p + off);
        hp_pb_iter_init(&it, in->emit.p + off, size);
        assert_true(hp_pb_next(&it, &f));
        assert_int_equal(f.num, 7);
        assert_int_equal(f.wire_type, HP_PB_LEN);
        struct hp_pb_iter body;
        hp_pb_iter_init(&body, f.ptr, f.len);
        uint32_t want[BK_MAX_FRAMES];
        size_t depth = 0, k = 0;
        int64_t cs = -1;
        while (hp_pb_next(&body, &f)) {
            if (f.num == 1) {
                cs = (int64_t)f.varint;
                depth = bk__intern_callstack_frames(in, (uint32_t)cs, want);
            } else {
                assert_int_equal(f.num, 2);
                assert_true(k < depth);
                assert_int_equal(f.varint, want[k]);
                k++;
            }
        }
        assert_false(body.error);
        assert_true(cs > 0);
        assert_int_equal(k, depth);
        assert_false(hp_pb_next(&it, &f)); /* exactly one field */
        assert_false(it.error);
        assert_true(n < max);
        ids[n++] = (uint32_t)cs;
        off += size;
    }
    assert_int_equal(off, in->emit.len);
    assert_int_equal(n, in->emit.n);
    return n;
}

static void test_intern_callstack_trie_shares_prefixes(void **state)
{
    struct bk_intern *in = *state;
    struct hp_mapping m = {.start = 0x400000, .end = 0x500000, .path = "/bin/app"};
    /* Leaf first, as the unwinder hands them over. */
    struct hp_frame a[] = {{&m, "leaf_a", 3}, {&m, "mid", 2}, {&m, "main", 1}};
    struct hp_frame b[] = {{&m, "leaf_b", 4}, {&m, "mid", 2}, {&m, "main", 1}};
    uint32_t sa = stack_id(in, a, 3);
    uint32_t sb = stack_id(in, b, 3);
    assert_int_not_equal(sa, sb);
    assert_int_equal(in->nodes[sa].parent, in->nodes[sb].parent);
    assert_int_equal(in->nodes[sa].depth, 3);
    assert_int_equal(stack_id(in, a, 3), sa); /* stable */

    /* Frames come back root first. */
    uint32_t ids[BK_MAX_FRAMES];
    assert_int_equal(bk__intern_callstack_frames(in, sa, ids), 3);
    assert_int_equal(ids[0], frame_id(in, &m, "main", 1));
    assert_int_equal(ids[1], frame_id(in, &m, "mid", 2));
    assert_int_equal(ids[2], frame_id(in, &m, "leaf_a", 3));

    /* Only full stacks are queued for the trace, once, in order of first use, encoded
     * with their frames root first. */
    uint32_t em[8];
    assert_int_equal(emitted(in, em, 8), 2);
    assert_int_equal(em[0], sa);
    assert_int_equal(em[1], sb);
    uint32_t prefix = stack_id(in, a + 1, 2); /* mid <- main: an inner node until now */
    assert_int_equal(prefix, in->nodes[sa].parent);
    assert_int_equal(emitted(in, em, 8), 3);
    assert_int_equal(em[2], prefix);
    assert_int_equal(stack_id(in, a + 1, 2), prefix);
    assert_int_equal(emitted(in, em, 8), 3);

    /* Once all were written the buffer starts over; written stacks are not queued
     * again. */
    bk__intern_emit_written(in, 2, 0); /* not all: kept */
    assert_int_equal(in->emit.n, 3);
    bk__intern_emit_written(in, in->emit.n, in->emit.len);
    assert_int_equal(in->emit.n, 0);
    assert_int_equal(in->emit.len, 0);
    assert_int_equal(stack_id(in, a, 3), sa);
    assert_int_equal(in->emit.n, 0);
    struct hp_frame c[] = {{&m, "leaf_c", 5}, {&m, "mid", 2}, {&m, "main", 1}};
    uint32_t sc = stack_id(in, c, 3);
    assert_int_equal(emitted(in, em, 8), 1);
    assert_int_equal(em[0], sc);
}

/* Many entries: the marks stay in step with the entries, deep stacks take multi-byte
 * lengths. */
static void test_intern_emit_marks(void **state)
{
    struct bk_intern *in = *state;
    struct hp_mapping m = {.start = 0x400000, .end = 0x500000, .path = "/bin/app"};
    static struct hp_frame f[40];
    static uint32_t ids[1000];
    for (size_t i = 0; i < 1000; i++) {
        size_t depth = 1 + i % 40;
        for (size_t d = 0; d < depth; d++)
            f[d] = (struct hp_frame){&m, "f", 0x1000 * (d + 1) + (d == 0 ? i : 0)};
        (void)stack_id(in, f, depth);
    }
    assert_int_equal(emitted(in, ids, 1000), 1000);
    assert_int_equal(in->emit.n_marks, (1000 + BK_EMIT_MARK_EVERY - 1) / BK_EMIT_MARK_EVERY);
}

static void test_intern_empty_and_deep_stacks(void **state)
{
    struct bk_intern *in = *state;
    uint32_t e = stack_id(in, NULL, 0);
    uint32_t ids[BK_MAX_FRAMES];
    assert_int_equal(bk__intern_callstack_frames(in, e, ids), 1);
    assert_int_equal(in->frames[ids[0]].mapping_id, mapping_id(in, NULL));

    static struct hp_frame deep[BK_MAX_FRAMES + 500];
    for (size_t i = 0; i < HP_ARRAY_SIZE(deep); i++)
        deep[i] = (struct hp_frame){.function_name = "f", .rel_pc = i};
    uint32_t d = stack_id(in, deep, HP_ARRAY_SIZE(deep));
    assert_int_equal(bk__intern_callstack_frames(in, d, ids), BK_MAX_FRAMES);
    /* The leaf side is kept: the last (leaf) frame is deep[0]. */
    assert_int_equal(in->frames[ids[BK_MAX_FRAMES - 1]].rel_pc, 0);
    assert_int_equal(in->frames[ids[0]].rel_pc, BK_MAX_FRAMES - 1);
}

static void test_intern_many_entries_stay_distinct(void **state)
{
    struct bk_intern *in = *state;
    /* Enough to grow every index several times. */
    struct hp_mapping m = {.start = 1, .end = 2, .path = "/x"};
    uint32_t first = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        uint32_t id = frame_id(in, &m, "f", i);
        if (i == 0)
            first = id;
        assert_int_equal(id, first + i);
    }
    for (uint64_t i = 0; i < 20000; i += 997)
        assert_int_equal(frame_id(in, &m, "f", i), first + i);
}

/* The map against a plain array under seeded random puts and removes (seed 99), half
 * of the removes by key and half by value pointer, with the special keys 0 and
 * UINT64_MAX among them, and iteration seeing each key once. */
static void test_intern_map_matches_reference(void **state)
{
    (void)state;
    enum { KEYS = 300 };
    static uint64_t ref[KEYS];
    static bool present[KEYS];
    memset(present, 0, sizeof(present));
    struct hp_map m;
    hp_map_init(&m, sizeof(uint64_t) * 2);
    uint64_t s = 99;
    for (int i = 0; i < 20000; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        unsigned k = (unsigned)(s % KEYS);
        uint64_t key = k == 0 ? UINT64_MAX : k == 1 ? 0 : (uint64_t)k * 0x10000;
        if ((s >> 20) % 3 == 0) {
            if ((s >> 30) & 1) {
                void *v = hp_map_get(&m, key);
                assert_int_equal(v != NULL, present[k]);
                if (v)
                    hp_map_remove_value(&m, v);
            } else {
                assert_int_equal(hp_map_remove(&m, key), present[k]);
            }
            present[k] = false;
        } else {
            uint64_t *v;
            int r = hp_map_put(&m, key, (void **)&v);
            assert_int_equal(r, present[k] ? 0 : 1);
            if (r == 1)
                assert_int_equal(v[0] | v[1], 0);
            else
                assert_int_equal(v[0], ref[k]);
            v[0] = ref[k] = s;
            present[k] = true;
        }
    }
    size_t n = 0, pos = 0;
    uint64_t key;
    void *val;
    while (hp_map_next(&m, &pos, &key, &val))
        n++;
    size_t want = 0;
    for (unsigned k = 0; k < KEYS; k++) {
        want += present[k];
        uint64_t key2 = k == 0 ? UINT64_MAX : k == 1 ? 0 : (uint64_t)k * 0x10000;
        uint64_t *v = hp_map_get(&m, key2);
        assert_int_equal(v != NULL, present[k]);
        if (v)
            assert_int_equal(*v, ref[k]);
    }
    assert_int_equal(n, want);
    assert_int_equal(m.count, want);
    hp_map_done(&m);
}

/* ---- hash flooding (issue 16, case 1) ---- */

/* Keys are crafted the way a client would against the unkeyed hashes the tables used:
 * inputs of splitmix64's finalizer chosen so that its outputs share their low 32 bits,
 * i.e. one home slot in any table smaller than 2^32. Runs of occupied slots then measure
 * what every insert and lookup walks: one run as long as the keys (quadratic time) with
 * the unkeyed hash, a few dozen slots with random ones. */

/* Longest run of occupied slots of an hp_map (wrapping around). */
static size_t map_longest_run(const struct hp_map *m)
{
    size_t best = 0, run = 0;
    for (size_t i = 0; i < 2 * m->cap; i++) {
        uint64_t k;
        memcpy(&k, m->slots + (i % m->cap) * m->stride, sizeof(k));
        run = k == UINT64_MAX ? 0 : run + 1;
        best = run > best ? run : best;
    }
    return best > m->cap ? m->cap : best;
}

static size_t idtab_longest_run(const struct hp_idtab *t)
{
    size_t best = 0, run = 0;
    for (size_t i = 0; i < 2 * t->cap; i++) {
        run = t->slots[i % t->cap].id ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best > t->cap ? t->cap : best;
}

/* Runs this long do not happen with random keys at these sizes (a few dozen to a few
 * hundred slots; the odds of 2000 are far below 1e-30); the crafted keys make one run of
 * all of them under the unkeyed hash. */
#define FLOOD_MAX_RUN 2000

static void test_intern_bug_map_flood_unkeyed_hash(void **state)
{
    (void)state;
    enum { N = 50000 };
    struct hp_map m;
    hp_map_init(&m, sizeof(uint64_t));
    for (uint64_t i = 1; i <= N; i++) {
        uint64_t *v;
        assert_int_equal(hp_map_put(&m, hp_test_unhash(i << 32), (void **)&v), 1);
        *v = i;
    }
    size_t run = map_longest_run(&m);
    print_message("  %d crafted keys: longest run %zu slots of %zu\n", N, run, m.cap);
    assert_true(run < FLOOD_MAX_RUN);
    for (uint64_t i = 1; i <= N; i++) {
        uint64_t *v = hp_map_get(&m, hp_test_unhash(i << 32));
        assert_non_null(v);
        assert_int_equal(*v, i);
    }
    hp_map_done(&m);
}

/* Keys aimed at the map's current seed (as if it had leaked): the insert that would go
 * past HP_MAP_MAX_PROBE rehashes under a new seed when enough inserts paid for it, and
 * is refused (-ENOSPC) otherwise; nothing already in the map is lost either way, and no
 * key ever lies further than the bound from its home. */
static void test_intern_map_probe_bound_rekeys_or_refuses(void **state)
{
    (void)state;
    struct hp_map m;
    hp_map_init(&m, sizeof(uint64_t));
    uint64_t *v;
    /* 200 random keys: cap 256 after the last growth, so the budget of cap / 16 inserts
     * since that rehash is met. */
    uint64_t x = 7;
    for (int i = 0; i < 200; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        assert_true(hp_map_put(&m, x, (void **)&v) >= 0);
    }
    /* Aim each key at home slot 0 of the seed in use when it is inserted: they fill one
     * run until the table grows (a new seed) or a key would land past the bound, which
     * rehashes under a new seed (a rekey). */
    size_t aimed = 0, refused = 0;
    for (uint64_t i = 1; i <= 3000; i++) {
        uint64_t key = hp_test_unhash(i << 32) ^ m.seed;
        int r = hp_map_put(&m, key, (void **)&v);
        assert_true(r == 1 || r == -ENOSPC);
        if (r == 1) {
            *v = key;
            aimed++;
        } else {
            refused++;
        }
    }
    print_message("  aimed at the seed: %zu in, %zu refused, %llu rekeys, cap %zu\n", aimed,
                  refused, (unsigned long long)m.rekeys, m.cap);
    /* Every key sits within the bound of its home under the seed now in use. */
    for (size_t i = 0; i < m.cap; i++) {
        uint64_t k;
        memcpy(&k, m.slots + i * m.stride, sizeof(k));
        if (k == UINT64_MAX)
            continue;
        size_t home = hp_hash_keyed(m.seed, k) & (m.cap - 1);
        assert_true(((i - home) & (m.cap - 1)) <= HP_MAP_MAX_PROBE);
    }
    assert_true(m.rekeys > 0);
    assert_int_equal(m.count, 200 + aimed);
    hp_map_done(&m);

    /* A big map whose last rehash was recent cannot pay for another: a key aimed past
     * the bound is refused and nothing else changes. */
    hp_map_init(&m, sizeof(uint64_t));
    for (uint64_t i = 1; i <= 30000; i++)
        assert_int_equal(hp_map_put(&m, hp_hash_u64(i), (void **)&v), 1);
    size_t cap = m.cap, count = m.count;
    uint64_t seed = m.seed;
    assert_true(m.inserts < m.cap / 16);
    refused = 0;
    for (uint64_t i = 1; i <= HP_MAP_MAX_PROBE + 200 && m.seed == seed; i++) {
        int r = hp_map_put(&m, hp_test_unhash(i << 32) ^ seed, (void **)&v);
        assert_true(r == 1 || r == -ENOSPC);
        refused += r == -ENOSPC;
    }
    assert_true(refused > 0);
    assert_int_equal(m.cap, cap);
    assert_int_equal(m.rekeys, 0);
    for (uint64_t i = 1; i <= 30000; i++)
        assert_non_null(hp_map_get(&m, hp_hash_u64(i)));
    assert_true(m.count > count);
    hp_map_done(&m);
}

/* The frame index, under pcs crafted for the unkeyed hash of (mapping id, rel_pc) it
 * used: hp_hash_combine(hp_hash_u64(mapping_id), rel_pc). */
static void test_intern_bug_frame_flood_unkeyed_hash(void **state)
{
    struct bk_intern *in = *state;
    enum { N = 20000 };
    struct hp_mapping m = {.start = 0x1000, .end = 1ull << 40, .path = "/evil"};
    uint64_t mid = mapping_id(in, &m);
    uint64_t h0 = hp_hash_u64(mid);
    for (uint64_t i = 1; i <= N; i++) {
        /* hp_hash_combine(h0, pc) == hp_hash_u64(h0 ^ (pc + c + (h0 << 6) + (h0 >> 2))) */
        uint64_t pc =
            (hp_test_unhash(i << 32) ^ h0) - 0x9e3779b97f4a7c15ull - (h0 << 6) - (h0 >> 2);
        (void)frame_id(in, &m, "f", pc);
    }
    size_t run = idtab_longest_run(&in->frame_index);
    print_message("  %d crafted pcs: longest run %zu slots of %zu\n", N, run, in->frame_index.cap);
    assert_true(run < FLOOD_MAX_RUN);
}

/* Function names crafted against the multiply-rotate string hash the tables used: in
 * each 16-byte block, flipping bit 7 of byte 7 flips exactly bit 63 of the product
 * (adding 2^63 times an odd constant), the rotation by 29 moves it to bit 28, and
 * flipping bit 4 of byte 11 cancels it: 2^k strings of k blocks with one 64-bit hash
 * whatever the seed. Keyed SipHash spreads them. */
static void test_intern_bug_string_flood_multicollision(void **state)
{
    struct bk_intern *in = *state;
    enum { K = 12, N = 1 << K, LEN = 16 * K };
    static char name[LEN];
    for (unsigned v = 0; v < N; v++) {
        memset(name, 'a', sizeof(name));
        for (unsigned b = 0; b < K; b++) {
            if (v >> b & 1) {
                name[16 * b + 7] = (char)('a' | 0x80);
                name[16 * b + 11] = (char)('a' ^ 0x10);
            }
        }
        uint32_t id;
        assert_int_equal(bk__intern_string(in, BK_STR_FUNCTION, name, LEN, &id), 0);
        assert_int_equal(id, v + 1); /* all distinct */
    }
    size_t run = idtab_longest_run(&in->str[BK_STR_FUNCTION].index);
    print_message("  %d crafted names: longest run %zu slots of %zu\n", N, run,
                  in->str[BK_STR_FUNCTION].index.cap);
    assert_true(run < FLOOD_MAX_RUN / 4);
}

/* The stack cache answers exactly what the trie walk answers: seeded random stacks
 * (seed 5) from a small pool of frames, with colliding sets, evictions, equal pcs under
 * other names and mappings, depths around the cache's limit, all checked against a walk
 * that bypasses the cache. */
static void test_intern_stack_cache_matches_walk(void **state)
{
    struct bk_intern *in = *state;
    static const struct hp_mapping maps[2] = {{.start = 1, .end = 2, .path = "/a"},
                                              {.start = 3, .end = 4, .path = "/b"}};
    static const char *const names[3] = {"x", "y", "z"};
    uint64_t s = 5;
    static struct hp_frame f[BK_STACK_CACHE_FRAMES + 4];
    for (int round = 0; round < 30000; round++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        size_t n = 1 + (s % 5 == 0 ? BK_STACK_CACHE_FRAMES + 2 - (s >> 8) % 4 : (s >> 8) % 6);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = (s >> (i % 40)) ^ (i * 0x9e37);
            f[i] = (struct hp_frame){&maps[r & 1], names[(r >> 1) % 3], (r >> 3) % 4};
        }
        uint32_t got = stack_id(in, f, n);
        uint32_t want = 0;
        for (size_t i = n; i-- > 0;) {
            uint32_t fid;
            assert_int_equal(bk__intern_frame(in, &f[i], &fid), 0);
            assert_int_equal(bk__intern_node(in, want, fid, &want), 0);
        }
        assert_int_equal(got, want);
    }
}

/* ---- growth ahead, for the service's memory budget ---- */

/* Keys (and idtab hashes) that rehash nothing by themselves: distinct, never the map's
 * UINT64_MAX key. */
static uint64_t grow_key(uint64_t i)
{
    return hp_hash_u64(i) & ~(1ull << 63);
}

/* hp_map_grow_ahead(@more) against the slots hp_map_put() really allocates over @more
 * inserts, from @start keys; hp_map_room() against the inserts before the first
 * doubling. */
static void map_ahead_case(size_t start, size_t more)
{
    struct hp_map m;
    hp_map_init(&m, 24);
    uint64_t i = 1, *v;
    for (; i <= start; i++)
        assert_int_equal(hp_map_put(&m, grow_key(i), (void **)&v), 1);
    size_t ahead = hp_map_grow_ahead(&m, more), room = hp_map_room(&m);
    size_t cap = m.cap, grown = 0, first = SIZE_MAX;
    for (size_t k = 0; k < more; k++, i++) {
        assert_int_equal(hp_map_put(&m, grow_key(i), (void **)&v), 1);
        if (m.cap != cap) {
            if (first == SIZE_MAX)
                first = k; /* inserts that fitted */
            assert_int_equal(m.cap, cap ? 2 * cap : 16);
            cap = m.cap;
            grown += cap * m.stride;
        }
    }
    assert_int_equal(ahead, grown);
    if (first != SIZE_MAX)
        assert_int_equal(room, first);
    else
        assert_true(room >= more);
    hp_map_done(&m);
}

static void test_intern_map_grow_ahead_matches_growth(void **state)
{
    (void)state;
    static const size_t starts[] = {0, 1, 12, 13, 14, 100, 207, 208, 1000, 6000};
    static const size_t mores[] = {0, 1, 2, 3, 13, 50, 500, 5000, 20000};
    for (size_t a = 0; a < sizeof(starts) / sizeof(starts[0]); a++)
        for (size_t b = 0; b < sizeof(mores) / sizeof(mores[0]); b++)
            map_ahead_case(starts[a], mores[b]);
    /* The next doubling alone, and what cannot be counted. */
    struct hp_map m;
    hp_map_init(&m, 8);
    assert_int_equal(hp_map_room(&m), 0);
    assert_int_equal(hp_map_grow_ahead(&m, 1), 16 * m.stride);
    uint64_t *v;
    for (uint64_t i = 1; i <= 300; i++)
        assert_int_equal(hp_map_put(&m, grow_key(i), (void **)&v), 1);
    assert_int_equal(m.cap, 512);
    assert_int_equal(hp_map_room(&m), 512 / 16 * 13 - 300);
    assert_int_equal(hp_map_grow_ahead(&m, hp_map_room(&m)), 0);
    assert_int_equal(hp_map_grow_ahead(&m, hp_map_room(&m) + 1), 1024 * m.stride);
    assert_int_equal(hp_map_grow_ahead(&m, SIZE_MAX), SIZE_MAX);
    assert_int_equal(hp_map_grow_ahead(&m, SIZE_MAX / 16), SIZE_MAX);
    hp_map_done(&m);
}

static void test_intern_idtab_grow_ahead_matches_growth(void **state)
{
    (void)state;
    static const size_t starts[] = {0, 1, 47, 48, 49, 500, 3072, 5000};
    static const size_t mores[] = {0, 1, 2, 48, 49, 1000, 20000};
    for (size_t a = 0; a < sizeof(starts) / sizeof(starts[0]); a++) {
        for (size_t b = 0; b < sizeof(mores) / sizeof(mores[0]); b++) {
            struct hp_idtab t;
            hp_idtab_init(&t);
            uint32_t id = 0;
            for (; id < starts[a]; id++)
                assert_int_equal(hp_idtab_add(&t, grow_key(id + 1), id), 0);
            size_t ahead = hp_idtab_grow_ahead(&t, mores[b]);
            size_t cap = t.cap, grown = 0;
            for (size_t k = 0; k < mores[b]; k++, id++) {
                assert_int_equal(hp_idtab_add(&t, grow_key(id + 1), id), 0);
                if (t.cap != cap) {
                    assert_int_equal(t.cap, cap ? 2 * cap : 64);
                    cap = t.cap;
                    grown += cap * sizeof(struct hp_idtab_slot);
                }
            }
            assert_int_equal(ahead, grown);
            hp_idtab_done(&t);
        }
    }
    struct hp_idtab t;
    hp_idtab_init(&t);
    assert_int_equal(hp_idtab_grow_ahead(&t, 0), 0);
    assert_int_equal(hp_idtab_grow_ahead(&t, 48), 64 * sizeof(struct hp_idtab_slot));
    assert_int_equal(hp_idtab_grow_ahead(&t, 49), (64 + 128) * sizeof(struct hp_idtab_slot));
    assert_int_equal(hp_idtab_grow_ahead(&t, SIZE_MAX), SIZE_MAX);
    hp_idtab_done(&t);
}

/* hp_grow_ahead() against the capacity hp_grow() gives (the array takes on the
 * difference; realloc may move it). */
static void test_intern_array_grow_ahead_matches_growth(void **state)
{
    (void)state;
    static const size_t caps[] = {0, 16, 32, 1024};
    static const size_t mores[] = {0, 1, 15, 16, 17, 1000, 100000};
    for (size_t a = 0; a < sizeof(caps) / sizeof(caps[0]); a++) {
        for (size_t b = 0; b < sizeof(mores) / sizeof(mores[0]); b++) {
            size_t cap = caps[a];
            for (size_t n = cap ? cap / 2 : 0; n <= cap; n += cap ? cap / 4 : 1) {
                size_t ahead = hp_grow_ahead(n, cap, 24, mores[b]);
                void *p = NULL;
                size_t to = cap;
                assert_int_equal(hp_grow(&p, &to, n + mores[b], 24), 0);
                free(p);
                assert_int_equal(ahead, (to - cap) * 24);
            }
        }
    }
    assert_int_equal(hp_grow_ahead(10, 16, 8, 6), 0);
    assert_int_equal(hp_grow_ahead(10, 16, 8, 7), 16 * 8);
    /* Where hp_grow() would fail, or the bytes overflow: all there is. */
    assert_int_equal(hp_grow_ahead(0, 0, 8, SIZE_MAX / 2), SIZE_MAX);
    assert_int_equal(hp_grow_ahead(SIZE_MAX, 16, 1, 1), SIZE_MAX);
    assert_int_equal(hp_grow_ahead(0, 0, 1, SIZE_MAX), SIZE_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intern_map_matches_reference),
        cmocka_unit_test(test_intern_bug_map_flood_unkeyed_hash),
        cmocka_unit_test(test_intern_map_probe_bound_rekeys_or_refuses),
        cmocka_unit_test(test_intern_map_grow_ahead_matches_growth),
        cmocka_unit_test(test_intern_idtab_grow_ahead_matches_growth),
        cmocka_unit_test(test_intern_array_grow_ahead_matches_growth),
        cmocka_unit_test_setup_teardown(test_intern_bug_frame_flood_unkeyed_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_bug_string_flood_multicollision, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_intern_stack_cache_matches_walk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_strings_separate_id_spaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_strings_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_mapping_keyed_by_content, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_mapping_cache_checks_content, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_unknown_mapping_is_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_frames_by_mapping_pc_and_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_callstack_trie_shares_prefixes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_intern_emit_marks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_empty_and_deep_stacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intern_many_entries_stay_distinct, setup, teardown),
    };
    return cmocka_run_group_tests_name("bookkeeping_intern", tests, NULL, NULL);
}
