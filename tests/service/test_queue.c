/* tests/service/test_queue.c: the queue from the unwinder threads to the bookkeeping
 * thread (service/queue.c: bounded, with back-pressure) and the budgets of time that
 * rate-limit a client's maps rereads and count the samples' unwinding time
 * (service/budget.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "service/svc_internal.h"

#define MS (1000ull * 1000)

/* A job of 10 ms at a share of 1/8 with 50 ms saved up: five at once, then one per 80 ms,
 * whatever the caller's pace. */
static void test_budget_share_of_time(void **state)
{
    (void)state;
    struct svc_budget b;
    uint64_t t = 1000 * MS;
    svc__budget_init(&b, t, 50 * MS);
    int runs = 0;
    for (; svc__budget_allows(&b, t, 8, 50 * MS); runs++)
        svc__budget_spend(&b, 10 * MS);
    assert_int_equal(runs, 5);
    /* Asked every millisecond for 10 s: 10 000 / 80 = 125 more runs. */
    for (int i = 0; i < 10000; i++) {
        t += MS;
        if (svc__budget_allows(&b, t, 8, 50 * MS)) {
            svc__budget_spend(&b, 10 * MS);
            runs++;
        }
    }
    assert_in_range(runs, 5 + 124, 5 + 126);
    /* Left alone for an hour, it holds the burst and no more. */
    t += 3600000 * MS;
    runs = 0;
    for (; svc__budget_allows(&b, t, 8, 50 * MS); runs++)
        svc__budget_spend(&b, 10 * MS);
    assert_int_equal(runs, 5);
    /* One step far beyond the credit: a long wait, not a wrap. */
    svc__budget_spend(&b, UINT64_MAX);
    assert_false(svc__budget_allows(&b, t + 3600000 * MS, 8, 50 * MS));
    /* A clock that goes back earns nothing. */
    assert_false(svc__budget_allows(&b, t - MS, 8, 50 * MS));
}

static atomic_int rooms;

static void on_room(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&rooms, 1);
}

static struct svc_batch *batch(void)
{
    struct svc_batch *b = malloc(sizeof(*b));
    assert_non_null(b);
    b->used = 0;
    return b;
}

/* The queue says it is full at its bound, keeps taking what is posted (control messages,
 * the message a producer was writing), and calls on_room once, when the consumer has
 * taken it down to half. */
/* A million samples of 400 ns each (walked stacks) took 400 ms: the total says so, not
 * 0 (whole microseconds per sample did), and each goes to the <= 1 us bucket; 1.5 us goes
 * to (1, 2] and 20 ms to the last bucket. */
static void test_unwind_time_keeps_sub_microsecond_samples(void **state)
{
    (void)state;
    struct bk_process_stats st = {0};
    uint64_t total_ns = 0;
    for (int i = 0; i < 62500; i++)
        svc__count_unwind_time(&st, &total_ns, 16 * 400, 16);
    assert_int_equal(st.heap_samples, 1000000);
    assert_int_equal(st.total_unwinding_time_us, 400000);
    assert_int_equal(st.unwinding_time_hist[0], 1000000);

    svc__count_unwind_time(&st, &total_ns, 3000, 2);
    assert_int_equal(st.unwinding_time_hist[0], 1000000);
    assert_int_equal(st.unwinding_time_hist[1], 2);
    svc__count_unwind_time(&st, &total_ns, 20 * MS, 1);
    assert_int_equal(st.unwinding_time_hist[7], 1);
    assert_int_equal(st.heap_samples, 1000003);
    assert_int_equal(st.total_unwinding_time_us, 400000 + 3 + 20000);
    svc__count_unwind_time(&st, &total_ns, 5000, 0); /* nothing */
    assert_int_equal(st.heap_samples, 1000003);
}

static void test_queue_bound_and_room(void **state)
{
    (void)state;
    struct svc_bkq q;
    svc__bkq_init(&q);
    assert_int_equal(q.max_queued, SVC_BKQ_MAX_BATCHES);
    q.max_queued = 4;
    q.on_room = on_room;
    atomic_store(&rooms, 0);
    for (int i = 0; i < 3; i++) {
        svc__bkq_post(&q, batch());
        assert_false(svc__bkq_full(&q));
    }
    svc__bkq_post(&q, batch());
    assert_true(svc__bkq_full(&q));
    assert_true(svc__bkq_full(&q));
    svc__bkq_post(&q, batch()); /* beyond the bound: taken */
    assert_int_equal(atomic_load(&q.n_queued), 5);
    assert_int_equal(atomic_load(&q.full_events), 1);
    /* 5 -> 4 -> 3: still full or not yet half empty: no call. */
    for (int i = 0; i < 2; i++) {
        free(svc__bkq_take(&q));
        assert_int_equal(atomic_load(&rooms), 0);
    }
    assert_false(svc__bkq_full(&q));
    free(svc__bkq_take(&q)); /* 2: half */
    assert_int_equal(atomic_load(&rooms), 1);
    free(svc__bkq_take(&q));
    free(svc__bkq_take(&q));
    assert_int_equal(atomic_load(&rooms), 1);
    svc__bkq_quit(&q);
    assert_null(svc__bkq_take(&q));
    svc__bkq_done(&q);
}

/* Producers that stop while it is full (as the unwinder threads do) and resume on_room
 * never lose a wakeup: every batch gets through, and the queue never holds more than the
 * bound plus one per producer. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static unsigned g_room_gen;
static atomic_uint g_max_seen;

static void on_room_signal(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&g_lock);
    g_room_gen++;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

#define PER_PRODUCER 2000

static void *producer(void *arg)
{
    struct svc_bkq *q = arg;
    for (int i = 0; i < PER_PRODUCER; i++) {
        pthread_mutex_lock(&g_lock);
        unsigned gen = g_room_gen;
        pthread_mutex_unlock(&g_lock);
        if (svc__bkq_full(q)) {
            pthread_mutex_lock(&g_lock);
            while (g_room_gen == gen)
                pthread_cond_wait(&g_cond, &g_lock);
            pthread_mutex_unlock(&g_lock);
        }
        svc__bkq_post(q, batch());
        unsigned n = atomic_load(&q->n_queued), m = atomic_load(&g_max_seen);
        while (n > m && !atomic_compare_exchange_weak(&g_max_seen, &m, n))
            ;
    }
    return NULL;
}

static void test_queue_back_pressure_threads(void **state)
{
    (void)state;
    struct svc_bkq q;
    svc__bkq_init(&q);
    q.max_queued = 8;
    q.on_room = on_room_signal;
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, producer, &q), 0);
    unsigned got = 0;
    while (got < 3 * PER_PRODUCER) {
        struct svc_batch *b = svc__bkq_take(&q);
        assert_non_null(b);
        free(b);
        got++;
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_true(atomic_load(&g_max_seen) <= 8 + 3);
    svc__bkq_done(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_share_of_time),
        cmocka_unit_test(test_unwind_time_keeps_sub_microsecond_samples),
        cmocka_unit_test(test_queue_bound_and_room),
        cmocka_unit_test(test_queue_back_pressure_threads),
    };
    return cmocka_run_group_tests_name("service_queue", tests, NULL, NULL);
}
