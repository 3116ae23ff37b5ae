/* preload/walk.c: see walk.h. Hook-safe. */
#include "preload/walk.h"

#include "preload/stack.h"
#include "shmem_ring/wire.h"

/* A word of the stack at @addr, when [addr, addr + 8) lies in [lo, end) and, on a stack
 * we do not know, in pages checked readable (checking the next ones as needed). */
static inline bool walk_read(struct client_walk *w, uint64_t addr, uint64_t *ret)
{
    if (addr < w->lo || addr > w->end - 8 || (addr & 7) != 0)
        return false;
    if (addr + 8 > w->checked) {
        /* The pages from the first unchecked one to the one holding the word. */
        uint64_t upto = (addr + 8 + 4095) & ~(uint64_t)4095;
        if (upto > w->end || upto < addr)
            upto = w->end;
        if (client_stack_readable(w->checked, (size_t)(upto - w->checked)) != upto - w->checked) {
            w->left = true;
            return false;
        }
        w->checked = upto;
    }
    *ret = *(const volatile uint64_t *)(uintptr_t)addr;
    return true;
}

void client_walk_begin(struct client_walk *w, const struct utable *t, const uint64_t *regs,
                       uint64_t stack_end, bool checked)
{
    uint64_t sp = regs[WIRE_REG_RSP];
    *w = (struct client_walk){
        .pc = regs[WIRE_REG_RIP],
        .sp = sp,
        .bp = regs[WIRE_REG_RBP],
        .lo = sp,
        .end = stack_end,
        .checked = checked ? stack_end : sp,
        .gen = utable_gen(t),
        .n = 0,
        .left = false,
    };
}

int client_walk_step(struct client_walk *w, const struct utable *t, uint64_t *pcs, size_t cap,
                     size_t max)
{
    if (w->gen == 0 || w->end <= w->lo || w->end - w->lo < 8)
        return CLIENT_WALK_FAILED;
    for (size_t k = 0;; k++) {
        if (w->n >= max)
            return CLIENT_WALK_FAILED;
        if (k == cap)
            return CLIENT_WALK_MORE;
        if (pcs)
            pcs[k] = w->pc;
        uint64_t rule;
        /* The innermost frame's row is at its pc; a caller's at its return address - 1
         * (inside the call: after a call to a noreturn function the return address may
         * already belong to the next function). */
        if (!utable_lookup(t, w->gen, w->n == 0 ? w->pc : w->pc - 1, &rule))
            return CLIENT_WALK_FAILED;
        w->n++;
        if (rule & UTABLE_RULE_OUTERMOST)
            return CLIENT_WALK_DONE;
        uint64_t cfa = ((rule & UTABLE_RULE_CFA_RBP) ? w->bp : w->sp) +
                       (uint64_t)(int64_t)utable_rule_cfa_off(rule);
        /* The caller's frame lies above ours: the CFA moves up, within the stack. */
        if (cfa <= w->sp || cfa > w->end)
            return CLIENT_WALK_FAILED;
        uint64_t ra, bp = w->bp;
        /* Left the readable stack: this frame was the outermost. */
        if (!walk_read(w, cfa - 8, &ra))
            return w->left ? CLIENT_WALK_DONE : CLIENT_WALK_FAILED;
        if ((rule & UTABLE_RULE_RBP_SAVED) &&
            !walk_read(w, cfa + (uint64_t)(int64_t)utable_rule_rbp_off(rule), &bp))
            return w->left ? CLIENT_WALK_DONE : CLIENT_WALK_FAILED;
        w->sp = cfa;
        w->bp = bp;
        w->pc = ra;
        /* A zero return address ends a stack (some thread entry points push one). */
        if (ra == 0)
            return CLIENT_WALK_DONE;
    }
}

size_t client_walk(const struct utable *t, const uint64_t *regs, uint64_t stack_end, uint64_t *pcs,
                   size_t max)
{
    struct client_walk w;
    client_walk_begin(&w, t, regs, stack_end, true);
    return client_walk_step(&w, t, pcs, max, max) == CLIENT_WALK_DONE ? w.n : 0;
}
