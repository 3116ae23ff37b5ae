/* preload/stack.c: see stack.h. Hook-safe: raw system calls (syscall(2) is no cancellation
 * point), no allocation, no descriptor. */
#include "preload/stack.h"

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define STACK_PAGE 4096ull

static uint64_t page_down(uint64_t a)
{
    return a & ~(STACK_PAGE - 1);
}

/* True when the page holding @addr can be read. rt_sigprocmask(2) copies the new mask in
 * from user memory before it looks at @how: with an invalid @how it fails with EINVAL
 * after a read that worked and with EFAULT after one that did not, and changes nothing
 * either way (kernel/signal.c has done it in this order since rt_sigprocmask exists).
 * About 100 ns, a third of the cheapest process_vm_readv(2). Anything else (a seccomp
 * filter's errno) counts as unreadable. */
static bool page_readable(uint64_t addr)
{
    long r = syscall(SYS_rt_sigprocmask, -1, (void *)(uintptr_t)page_down(addr), NULL,
                     (size_t)sizeof(uint64_t));
    return r < 0 && errno == EINVAL;
}

size_t client_stack_readable(uint64_t addr, size_t len)
{
    uint64_t end = addr + len;
    if (end < addr)
        end = UINT64_MAX;
    uint64_t p = page_down(addr);
    while (p < end && page_readable(p)) {
        if (p + STACK_PAGE < p)
            return (size_t)(end - addr);
        p += STACK_PAGE;
    }
    return p <= addr ? 0 : (size_t)((p < end ? p : end) - addr);
}

ssize_t client_stack_copy(pid_t pid, void *dst, uint64_t src, size_t len)
{
    if (len == 0)
        return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        struct iovec local = {.iov_base = dst, .iov_len = len};
        struct iovec remote = {.iov_base = (void *)(uintptr_t)src, .iov_len = len};
        long n = syscall(SYS_process_vm_readv, pid, &local, 1ul, &remote, 1ul, 0ul);
        if (n >= 0)
            return (ssize_t)n;
        if (errno != EFAULT)
            return -errno;
        /* Linux copies up to the first unreadable page and says how much; its manual
         * allows failing the whole element instead. Then copy the readable part only. */
        size_t ok = client_stack_readable(src, len);
        if (ok == 0 || ok == len)
            return 0;
        len = ok;
    }
    return 0;
}

/* ---- the thread's own stack ------------------------------------------------------ */

static int other_slot(const struct client_stack_cache *c, uint64_t sp)
{
    for (int i = 0; i < CLIENT_STACK_OTHER_SLOTS; i++)
        if (sp >= c->other[i].lo && sp < c->other[i].end)
            return i;
    return -1;
}

int client_stack_lookup(struct client_stack_cache *c, uint64_t sp, uint64_t tp, uint64_t main_top,
                        uint64_t *ret_end)
{
    if (HP_LIKELY(sp >= c->lo && sp < c->hi)) {
        *ret_end = c->hi;
        return CLIENT_STACK_OWN;
    }
    /* A foreign stack we met lately: no need to check its way up to our top again. */
    if (other_slot(c, sp) >= 0)
        return CLIENT_STACK_OTHER;
    uint64_t top, upto;
    if (c->hi != 0) {
        /* Deeper than checked so far: the stack grew. Above the top: another stack. */
        if (sp >= c->lo || c->hi - sp > CLIENT_STACK_MAX_SPAN)
            return CLIENT_STACK_OTHER;
        top = c->hi;
        upto = c->lo;
    } else if (sp < tp && tp - sp <= CLIENT_STACK_MAX_SPAN) {
        top = upto = tp;
    } else if (sp < main_top && main_top - sp <= CLIENT_STACK_MAX_SPAN) {
        top = upto = main_top;
    } else {
        return CLIENT_STACK_OTHER;
    }
    /* A stack pointer on a fiber or signal stack mapped below ours fails here: between it
     * and our top lie unmapped pages or our stack's guard page. */
    if (client_stack_readable(sp, (size_t)(upto - sp)) != upto - sp)
        return CLIENT_STACK_OTHER;
    c->lo = sp;
    c->hi = top;
    *ret_end = top;
    return CLIENT_STACK_OWN;
}

/* ---- other stacks ---------------------------------------------------------------- */

/* The signal stack the thread runs on, if @sp is on it: its end. */
static uint64_t altstack_end(uint64_t sp)
{
    stack_t ss;
    if (syscall(SYS_sigaltstack, NULL, &ss) != 0 || !(ss.ss_flags & SS_ONSTACK))
        return 0;
    uint64_t lo = (uint64_t)(uintptr_t)ss.ss_sp, end = lo + ss.ss_size;
    return sp >= lo && sp < end && end > lo ? end : 0;
}

void client_stack_plan_other(struct client_stack_cache *c, uint64_t sp, size_t cap,
                             struct client_stack_plan *ret)
{
    *ret = (struct client_stack_plan){0};
    int i = other_slot(c, sp);
    if (i >= 0) {
        /* 8 bytes past the end it had: readable means the stack is not what it was. */
        uint64_t want = c->other[i].end - sp + sizeof(uint64_t);
        ret->how = CLIENT_STACK_HINTED;
        ret->len = want < cap ? (size_t)want : cap;
        ret->may_go_on = want >= cap;
        return;
    }
    uint64_t end = altstack_end(sp);
    if (end != 0) {
        ret->how = CLIENT_STACK_ALTSTACK;
        ret->len = end - sp < cap ? (size_t)(end - sp) : cap;
        ret->may_go_on = end - sp > cap;
        return;
    }
    ret->how = CLIENT_STACK_PROBED;
    ret->len = client_stack_readable(sp, cap);
    ret->may_go_on = ret->len == cap;
}

static void note_other(struct client_stack_cache *c, uint64_t sp, uint64_t end)
{
    for (int i = 0; i < CLIENT_STACK_OTHER_SLOTS; i++) {
        if (c->other[i].end == end) {
            if (page_down(sp) < c->other[i].lo)
                c->other[i].lo = page_down(sp);
            return;
        }
    }
    uint32_t i = c->other_next++ % CLIENT_STACK_OTHER_SLOTS;
    c->other[i].lo = page_down(sp);
    c->other[i].end = end;
}

bool client_stack_copied_other(struct client_stack_cache *c, uint64_t sp,
                               const struct client_stack_plan *plan, size_t copied)
{
    switch (plan->how) {
    case CLIENT_STACK_HINTED: {
        int i = other_slot(c, sp);
        if (copied < plan->len) {
            /* Stopped at the end, or before it: the stack was replaced by a smaller one. */
            if (i >= 0)
                c->other[i].end = copied > 0 ? sp + copied : 0;
            return false;
        }
        /* Readable past the end it had: forget it (the next copy checks afresh); what was
         * copied may not be all of the stack. */
        if (i >= 0)
            c->other[i].end = 0;
        return true;
    }
    case CLIENT_STACK_PROBED:
        /* The copy stopped at the first unreadable page: that is where the stack ends. */
        if (copied > 0 && (copied < plan->len || !plan->may_go_on))
            note_other(c, sp, sp + copied);
        return plan->may_go_on && copied == plan->len;
    default:
        return plan->may_go_on && copied == plan->len;
    }
}
