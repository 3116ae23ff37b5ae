/* preload/walk.c: see walk.h. Hook-safe. */
#include "preload/walk.h"

#include <stdbool.h>

#include "shmem_ring/wire.h"

/* A word of the thread's stack at @addr, when [addr, addr + 8) lies in [lo, hi). */
static inline bool walk_read(uint64_t addr, uint64_t lo, uint64_t hi, uint64_t *ret)
{
    if (addr < lo || addr > hi - 8 || (addr & 7) != 0)
        return false;
    *ret = *(const volatile uint64_t *)(uintptr_t)addr;
    return true;
}

size_t client_walk(const struct utable *t, const uint64_t *regs, uint64_t stack_end, uint64_t *pcs,
                   size_t max)
{
    uint64_t gen = utable_gen(t);
    uint64_t pc = regs[WIRE_REG_RIP], sp = regs[WIRE_REG_RSP], bp = regs[WIRE_REG_RBP];
    const uint64_t lo = sp;
    if (gen == 0 || stack_end <= lo || stack_end - lo < 8)
        return 0;
    for (size_t n = 0; n < max; n++) {
        pcs[n] = pc;
        uint64_t rule;
        /* The innermost frame's row is at its pc; a caller's at its return address - 1
         * (inside the call: after a call to a noreturn function the return address may
         * already belong to the next function). */
        if (!utable_lookup(t, gen, n == 0 ? pc : pc - 1, &rule))
            return 0;
        if (rule & UTABLE_RULE_OUTERMOST)
            return n + 1;
        uint64_t cfa =
            ((rule & UTABLE_RULE_CFA_RBP) ? bp : sp) + (uint64_t)(int64_t)utable_rule_cfa_off(rule);
        /* The caller's frame lies above ours: the CFA moves up, within the stack. */
        if (cfa <= sp || cfa > stack_end)
            return 0;
        uint64_t ra;
        if (!walk_read(cfa - 8, lo, stack_end, &ra))
            return 0;
        if ((rule & UTABLE_RULE_RBP_SAVED) &&
            !walk_read(cfa + (uint64_t)(int64_t)utable_rule_rbp_off(rule), lo, stack_end, &bp))
            return 0;
        sp = cfa;
        pc = ra;
        /* A zero return address ends a stack (some thread entry points push one). */
        if (pc == 0)
            return n + 1;
    }
    return 0;
}
