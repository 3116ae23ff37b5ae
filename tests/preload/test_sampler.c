/* tests/preload/test_sampler.c: statistics of the allocation sampler (preload/sample.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/sample.h"

#define SEQ_LEN 1000

/* A fixed allocation sequence: sizes 1..2000 from a small LCG (seed 42). */
static uint64_t make_sequence(uint64_t *sizes, size_t n, uint64_t max_size)
{
    uint64_t x = 42, total = 0;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        sizes[i] = 1 + (x >> 33) % max_size;
        total += sizes[i];
    }
    return total;
}

struct moments {
    double mean;
    double var;
};

/* Runs @trials independent samplers (seeds 1..trials) over the sequence. */
static struct moments run_trials(const uint64_t *sizes, size_t n, uint64_t interval, int trials)
{
    struct client_sampler_params p;
    double sum = 0, sum2 = 0;

    client_sampler_params_init(&p, interval);
    for (int t = 1; t <= trials; t++) {
        struct client_sampler s;
        client_sampler_init(&s, &p, (uint64_t)t);
        uint64_t est = 0;
        for (size_t i = 0; i < n; i++)
            est += client_sampler_step(&s, &p, sizes[i]);
        sum += (double)est;
        sum2 += (double)est * (double)est;
    }
    struct moments m;
    m.mean = sum / trials;
    m.var = (sum2 - sum * sum / trials) / (trials - 1);
    return m;
}

static void test_sampler_unbiased_with_poisson_variance(void **state)
{
    (void)state;
    uint64_t sizes[SEQ_LEN];
    const uint64_t interval = 4096;
    const int trials = 3000;
    uint64_t total = make_sequence(sizes, SEQ_LEN, 2000);

    struct moments m = run_trials(sizes, SEQ_LEN, interval, trials);
    /* Poisson model: Var = interval * total (exactly total * (interval - 1) for per-byte
     * Bernoulli picks). Mean within 4 standard errors; variance within 15% (its relative
     * standard error is about sqrt(2 / trials) = 2.6%). */
    double model_var = (double)total * (double)(interval - 1);
    double se = sqrt(model_var / trials);
    printf("# total %llu mean %.1f (se %.1f) var %.4g model %.4g\n", (unsigned long long)total,
           m.mean, se, m.var, model_var);
    assert_true(fabs(m.mean - (double)total) < 4 * se);
    assert_true(fabs(m.var / model_var - 1.0) < 0.15);

    /* Short sequences, many trials: sensitive to an error in the first draw. */
    total = make_sequence(sizes, 50, 2000);
    m = run_trials(sizes, 50, interval, 40000);
    model_var = (double)total * (double)(interval - 1);
    se = sqrt(model_var / 40000);
    printf("# total %llu mean %.1f (se %.1f) var %.4g model %.4g\n", (unsigned long long)total,
           m.mean, se, m.var, model_var);
    assert_true(fabs(m.mean - (double)total) < 4 * se);
    assert_true(fabs(m.var / model_var - 1.0) < 0.15);
}

static void test_sampler_small_interval_unbiased(void **state)
{
    (void)state;
    uint64_t sizes[SEQ_LEN];
    /* Interval 2 and 7 with sizes 1..6: the geometric distance keeps the estimate
     * unbiased even when the exponential approximation would not (tolerance 4 se). */
    const uint64_t intervals[] = {2, 7};
    uint64_t total = make_sequence(sizes, SEQ_LEN, 6);
    for (size_t i = 0; i < 2; i++) {
        struct moments m = run_trials(sizes, SEQ_LEN, intervals[i], 2000);
        /* Allocations of at least the interval are exact and add no variance. */
        double sampled_bytes = 0;
        for (size_t j = 0; j < SEQ_LEN; j++)
            if (sizes[j] < intervals[i])
                sampled_bytes += (double)sizes[j];
        double model_var = sampled_bytes * (double)(intervals[i] - 1);
        double se = sqrt(model_var / 2000);
        assert_true(fabs(m.mean - (double)total) < 4 * se);
        assert_true(fabs(m.var / model_var - 1.0) < 0.15);
    }
}

static void test_sampler_large_allocations_exact(void **state)
{
    (void)state;
    struct client_sampler_params p;
    struct client_sampler s;

    client_sampler_params_init(&p, 4096);
    client_sampler_init(&s, &p, 7);
    int64_t before = s.bytes_left;
    assert_int_equal(client_sampler_step(&s, &p, 4096), 4096);
    assert_int_equal(client_sampler_step(&s, &p, 1 << 20), 1 << 20);
    /* Large allocations do not move the counter. */
    assert_int_equal(s.bytes_left, before);
}

static void test_sampler_interval_one_records_everything(void **state)
{
    (void)state;
    struct client_sampler_params p;
    struct client_sampler s;

    client_sampler_params_init(&p, 1);
    client_sampler_init(&s, &p, 1);
    for (uint64_t size = 1; size < 5000; size += 37)
        assert_int_equal(client_sampler_step(&s, &p, size), size);
    assert_int_equal(client_sampler_step(&s, &p, 0), 0);
}

static void test_sampler_multiples_of_interval(void **state)
{
    (void)state;
    struct client_sampler_params p;
    struct client_sampler s;
    uint64_t sampled = 0;

    /* Seed 3: attributed sizes are whole multiples of the interval, and an allocation
     * just below the interval is sampled about size/interval of the time. */
    client_sampler_params_init(&p, 1000);
    client_sampler_init(&s, &p, 3);
    for (int i = 0; i < 100000; i++) {
        uint64_t a = client_sampler_step(&s, &p, 999);
        assert_int_equal(a % 1000, 0);
        sampled += a;
    }
    double ratio = (double)sampled / (100000.0 * 999.0);
    assert_true(fabs(ratio - 1.0) < 0.03);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_unbiased_with_poisson_variance),
        cmocka_unit_test(test_sampler_small_interval_unbiased),
        cmocka_unit_test(test_sampler_large_allocations_exact),
        cmocka_unit_test(test_sampler_interval_one_records_everything),
        cmocka_unit_test(test_sampler_multiples_of_interval),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
