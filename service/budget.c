/* service/budget.c: budgets of time (svc_internal.h, struct svc_budget): what share of
 * the time passing a job may take, such as a client's rereads of its maps. */
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
