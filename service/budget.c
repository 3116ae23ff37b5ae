/* service/budget.c: budgets of time (svc_internal.h, struct svc_budget): what share of
 * the time passing a job may take, such as a client's rereads of its maps; and the
 * accounting of the time samples take to unwind (svc__count_unwind_time()). */
#include "service/svc_internal.h"

void svc__budget_init(struct svc_budget *b, uint64_t now_ns, int64_t burst_ns)
{
    b->credit_ns = burst_ns;
    b->at_ns = now_ns;
}

bool svc__budget_allows(struct svc_budget *b, uint64_t now_ns, unsigned share, int64_t burst_ns)
{
    if (now_ns > b->at_ns) {
        uint64_t earned = (now_ns - b->at_ns) / (share ? share : 1);
        /* Saturating at the burst: a budget left alone for long holds that much. */
        if (b->credit_ns < burst_ns)
            b->credit_ns = earned >= (uint64_t)(burst_ns - b->credit_ns)
                               ? burst_ns
                               : b->credit_ns + (int64_t)earned;
        b->at_ns = now_ns;
    }
    return b->credit_ns > 0;
}

void svc__budget_spend(struct svc_budget *b, uint64_t ns)
{
    /* At most a day per step: the credit never wraps. */
    const uint64_t day = 86400ull * 1000 * 1000 * 1000;
    b->credit_ns -= (int64_t)(ns < day ? ns : day);
    if (b->credit_ns < -(int64_t)(1000 * day))
        b->credit_ns = -(int64_t)(1000 * day);
}

void svc__count_unwind_time(struct bk_process_stats *st, uint64_t *total_ns, uint64_t ns,
                            uint64_t n)
{
    static const uint64_t bounds_us[] = BK_UNWIND_HIST_BOUNDS;
    _Static_assert(HP_ARRAY_SIZE(bounds_us) == HP_ARRAY_SIZE(st->unwinding_time_hist),
                   "one bound per bucket");
    if (n == 0)
        return;
    st->heap_samples += n;
    *total_ns += ns;
    st->total_unwinding_time_us = *total_ns / 1000;
    /* A bucket holds the samples of at most its bound: compared in nanoseconds, so that
     * 1.5 us goes to (1, 2], not to <= 1. */
    uint64_t each_ns = ns / n;
    for (size_t i = 0; i < HP_ARRAY_SIZE(bounds_us); i++) {
        if (bounds_us[i] == UINT64_MAX || each_ns <= bounds_us[i] * 1000) {
            st->unwinding_time_hist[i] += n;
            break;
        }
    }
}
