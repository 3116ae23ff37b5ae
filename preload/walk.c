/* preload/walk.c: see walk.h. Hook-safe. */
#include "preload/walk.h"

#include "preload/stack.h"
#include "shmem_ring/wire.h"

/* A word of the stack at @addr, when [addr, addr + 8) lies in [lo, end) and, on a stack
 * we do not know, in pages checked readable (checking the next ones as needed: *checked
 * grows; *left is set when a page is unreadable). */
static inline bool walk_read(uint64_t addr, uint64_t lo, uint64_t end, uint64_t *checked,
                             bool *left, uint64_t *ret)
{
    if (addr < lo || addr > end - 8 || (addr & 7) != 0)
        return false;
    if (addr + 8 > *checked) {
        /* The pages from the first unchecked one to the one holding the word. */
        uint64_t upto = (addr + 8 + 4095) & ~(uint64_t)4095;
        if (upto > end || upto < addr)
            upto = end;
        if (client_stack_readable(*checked, (size_t)(upto - *checked)) != upto - *checked) {
            *left = true;
            return false;
        }
        *checked = upto;
    }
    *ret = *(const volatile uint64_t *)(uintptr_t)addr;
    return true;
}

/* The rule for lookup address @addr: its own, else that of its page (JIT code, which
 * keeps the frame-pointer chain: utable.h). */
static inline bool walk_rule(const struct utable *t, uint64_t gen, uint64_t addr, uint64_t *ret)
{
    if (HP_LIKELY(utable_lookup(t, gen, addr, ret)))
        return true;
    return addr < UTABLE_PAGE_BIT && utable_lookup(t, gen, utable_page_key(addr), ret);
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
    /* In locals: the stores to @pcs could otherwise alias them, every frame. */
    uint64_t pc = w->pc, sp = w->sp, bp = w->bp, checked = w->checked;
    const uint64_t lo = w->lo, end = w->end, gen = w->gen;
    size_t n = w->n;
    bool left = w->left;
    int r;
    if (gen == 0 || end <= lo || end - lo < 8)
        return CLIENT_WALK_FAILED;
    for (size_t k = 0;; k++) {
        if (n >= max) {
            r = CLIENT_WALK_FAILED;
            break;
        }
        if (k == cap) {
            r = CLIENT_WALK_MORE;
            break;
        }
        if (pcs)
            pcs[k] = pc;
        uint64_t rule;
        /* The innermost frame's row is at its pc; a caller's at its return address - 1
         * (inside the call: after a call to a noreturn function the return address may
         * already belong to the next function). */
        if (!walk_rule(t, gen, n == 0 ? pc : pc - 1, &rule)) {
            r = CLIENT_WALK_FAILED;
            break;
        }
        n++;
        if (rule & UTABLE_RULE_OUTERMOST) {
            r = CLIENT_WALK_DONE;
            break;
        }
        uint64_t cfa =
            ((rule & UTABLE_RULE_CFA_RBP) ? bp : sp) + (uint64_t)(int64_t)utable_rule_cfa_off(rule);
        /* The caller's frame lies above ours: the CFA moves up, within the stack. A
         * frame-pointer chain must also point into this frame, not far above it. */
        if (cfa <= sp || cfa > end ||
            ((rule & UTABLE_RULE_FRAME_PTR) && (bp < sp || bp - sp > UTABLE_FRAME_PTR_MAX_FRAME))) {
            r = CLIENT_WALK_FAILED;
            break;
        }
        uint64_t ra, next_bp = bp;
        /* Left the readable stack (an unknown one): this frame was the outermost. */
        if (!walk_read(cfa - 8, lo, end, &checked, &left, &ra) ||
            ((rule & UTABLE_RULE_RBP_SAVED) &&
             !walk_read(cfa + (uint64_t)(int64_t)utable_rule_rbp_off(rule), lo, end, &checked,
                        &left, &next_bp))) {
            r = left ? CLIENT_WALK_DONE : CLIENT_WALK_FAILED;
            break;
        }
        sp = cfa;
        bp = next_bp;
        pc = ra;
        /* A zero return address ends a stack (some thread entry points push one). */
        if (ra == 0) {
            r = CLIENT_WALK_DONE;
            break;
        }
    }
    w->pc = pc;
    w->sp = sp;
    w->bp = bp;
    w->checked = checked;
    w->n = n;
    w->left = left;
    return r;
}

size_t client_walk(const struct utable *t, const uint64_t *regs, uint64_t stack_end, uint64_t *pcs,
                   size_t max)
{
    struct client_walk w;
    client_walk_begin(&w, t, regs, stack_end, true);
    return client_walk_step(&w, t, pcs, max, max) == CLIENT_WALK_DONE ? w.n : 0;
}
