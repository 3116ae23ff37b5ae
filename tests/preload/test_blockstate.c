/* tests/preload/test_blockstate.c: when a client in block mode waits for the service
 * again after a wait ran out (preload/blockstate.h): a service that catches up gets
 * waited for again, a stopped one is given up on after CLIENT_BLOCK_GIVE_UP_NS, and a
 * slow one that keeps reading is not given up on. */
#include <stdbool.h>
#include <stdint.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include "preload/blockstate.h"

#define MS (1000ull * 1000)
#define RING (8ull << 20)

/* The view of a ring of RING bytes at @now_ms, read up to @rp, with @fill bytes waiting. */
static struct client_block_view view(uint64_t now_ms, uint64_t rp, uint64_t fill, bool blocking)
{
    return (struct client_block_view){.now_ns = now_ms * MS,
                                      .read_pos = rp,
                                      .fill = fill,
                                      .size = RING,
                                      .ring_blocking = blocking};
}

static enum client_block_mode mode(struct client_block *b)
{
    return (enum client_block_mode)atomic_load(&b->mode);
}

static void test_off_stays_off(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, false);
    struct client_block_view v = view(1, 0, RING, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_OFF);
}

static void test_on_while_blocking(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, true);
    struct client_block_view v = view(1, 100, RING, true);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_ON);
}

/* A 200 ms stop of the service: the ring ends blocking, and once the service reads
 * again and the ring is half empty, blocking comes back. */
static void test_resumes_when_caught_up(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, true);
    struct client_block_view v = view(100, 4096, RING - 64, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_PAUSED);
    /* Stopped: no move, still full. */
    v = view(200, 4096, RING - 64, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    /* Emptied without reading is impossible; a ring half empty whose reader did not move
     * since the pause (a stale view) does not resume. */
    v = view(250, 4096, RING / 4, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_PAUSED);
    /* Reading, but still more than half full: not yet. */
    v = view(300, 4096 + 1024, RING - 1024, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_PAUSED);
    /* Caught up. */
    v = view(310, 4096 + RING / 8, RING / 2, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_RESUME);
    assert_int_equal(mode(&b), CLIENT_BLOCK_ON);
    /* The caller turned blocking on again: nothing more to do... */
    v = view(320, 4096 + RING / 8, RING / 2, true);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    /* ...until the next wait runs out, which pauses again (no limit on the cycles). */
    v = view(900, 8 * RING, RING - 64, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_PAUSED);
    v = view(950, 8 * RING + RING / 2, RING / 3, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_RESUME);
}

/* A slow service whose ring stays full (samples that do not wait fill what it frees)
 * resumes once it read a quarter of the ring since the pause. */
static void test_resumes_slow_reader(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, true);
    struct client_block_view v = view(0, 0, RING, false);
    (void)client_block_step(&b, &v);
    uint64_t rp = 0, t = 0;
    enum client_block_action a = CLIENT_BLOCK_NONE;
    while (a == CLIENT_BLOCK_NONE) {
        t += 1;
        rp += 64 << 10; /* 64 KiB a millisecond, the ring full throughout */
        v = view(t, rp, RING - 64, false);
        a = client_block_step(&b, &v);
        assert_true(rp <= RING / 4);
    }
    assert_int_equal(a, CLIENT_BLOCK_RESUME);
    assert_int_equal(rp, RING / 4);
}

/* A service stopped for good: given up on after CLIENT_BLOCK_GIVE_UP_NS without a move,
 * and never waited for again, whatever the ring shows later. */
static void test_gives_up_on_stopped(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, true);
    uint64_t t0 = 1000;
    struct client_block_view v = view(t0, 512, RING, false);
    (void)client_block_step(&b, &v);
    for (uint64_t t = t0 + 1; (t - t0) * MS < CLIENT_BLOCK_GIVE_UP_NS; t += 7) {
        v = view(t, 512, RING, false);
        assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    }
    v = view(t0 + CLIENT_BLOCK_GIVE_UP_NS / MS, 512, RING, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_GIVE_UP);
    assert_int_equal(mode(&b), CLIENT_BLOCK_GIVEN_UP);
    v = view(t0 + 2 * CLIENT_BLOCK_GIVE_UP_NS / MS, RING, 0, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    assert_int_equal(mode(&b), CLIENT_BLOCK_GIVEN_UP);
}

/* Progress restarts the give-up clock: a service that reads a little now and then (too
 * little to resume) is not given up on. */
static void test_progress_keeps_hope(void **state)
{
    (void)state;
    struct client_block b;
    client_block_init(&b, true);
    struct client_block_view v = view(0, 0, RING, false);
    (void)client_block_step(&b, &v);
    uint64_t step_ms = CLIENT_BLOCK_GIVE_UP_NS / MS - 1;
    for (uint64_t i = 1; i <= 4; i++) {
        v = view(i * step_ms, i * 64, RING, false);
        assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_NONE);
    }
    assert_int_equal(mode(&b), CLIENT_BLOCK_PAUSED);
    v = view(5 * step_ms + 2, 4 * 64, RING, false);
    assert_int_equal(client_block_step(&b, &v), CLIENT_BLOCK_GIVE_UP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_stays_off),          cmocka_unit_test(test_on_while_blocking),
        cmocka_unit_test(test_resumes_when_caught_up), cmocka_unit_test(test_resumes_slow_reader),
        cmocka_unit_test(test_gives_up_on_stopped),    cmocka_unit_test(test_progress_keeps_hope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
