/* preload/stack.h: which stack a sampled allocation runs on, how far it may be read, and
 * reads of other stacks that cannot fault.
 *
 * The thread's own stack ends at a fixed address: for a thread made by pthread_create,
 * the thread pointer (glibc puts the thread's descriptor at the top of its stack mapping,
 * so no frame lives above it); for the main thread, the stack pointer the program started
 * with (__libc_stack_end, plus a little for the entry code's frame: the caller adds it).
 * Its lower end is learned: the first time a thread samples below that top, every page
 * from there to the top is checked readable with a system call that cannot fault
 * (client_stack_readable()), and the range is kept in the thread's TLS. Later samples
 * inside it read it directly (the walk's loads, the copy's rep movsb); deeper ones check
 * only the new pages. The range is part of the thread's own stack, mapped for as long as
 * the thread lives, so it never goes stale (a thread's TLS starts zeroed).
 *
 * Any other stack (a fiber's, a sigaltstack, one unmapped and replaced later) is never
 * read unchecked: a walk checks each page before its first load there, and a copy goes
 * through client_stack_copy(), which returns how much it could read. Where such a stack
 * ends comes from sigaltstack(2) when the thread runs on its signal stack, else from a
 * small per-thread memory of where the last foreign stacks stopped being readable (a
 * size hint, which the copy checks by reading 8 bytes more), else from checking pages up
 * to the copy's cap. No /proc/self/maps and no descriptor on any path.
 *
 *     uint64_t end;
 *     if (client_stack_lookup(&tls->stack, sp, tp, main_top, &end) == CLIENT_STACK_OWN)
 *         walk_or_copy_directly(sp, end);
 *     else
 *         plan = client_stack_plan_other(&tls->stack, sp, cap); copy it with
 *         client_stack_copy(pid, dst, sp, plan.len), then client_stack_copied_other().
 *
 * Hook-safe: raw system calls only (rt_sigprocmask, process_vm_readv, sigaltstack), no
 * allocation, no descriptor, small frames.
 */
#ifndef HP_PRELOAD_STACK_H
#define HP_PRELOAD_STACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"

/* A stack pointer further than this below the top of the thread's stack is not taken
 * for the thread's own stack (such samples are copied safely, not lost). */
#define CLIENT_STACK_MAX_SPAN (64ull << 20)
/* Foreign stacks remembered per thread (fibers a thread switches between). */
#define CLIENT_STACK_OTHER_SLOTS 2

enum { CLIENT_STACK_OWN = 0, CLIENT_STACK_OTHER = 1 };

/* Per thread, in TLS (zeroed: nothing known). */
struct client_stack_cache {
    /* [lo, hi): part of the thread's own stack checked readable; hi == 0: none yet. */
    uint64_t lo, hi;
    /* Foreign stacks seen lately: read from lo, readable up to end exactly (end == 0:
     * slot empty). Only a size hint: a copy checks it again. */
    struct {
        uint64_t lo, end;
    } other[CLIENT_STACK_OTHER_SLOTS];
    uint32_t other_next; /* slot replaced next */
};

/* Returns CLIENT_STACK_OWN when [@sp, *@ret_end) lies in the thread's own stack, checked
 * readable (it may be read directly); else CLIENT_STACK_OTHER (read it only through a
 * checked walk or client_stack_copy()). @tp is the thread pointer, @main_top the top of
 * the main thread's stack. Updates @c. */
int client_stack_lookup(struct client_stack_cache *c, uint64_t sp, uint64_t tp, uint64_t main_top,
                        uint64_t *ret_end);

/* How a foreign stack at @sp is copied. */
enum client_stack_how {
    CLIENT_STACK_HINTED,   /* from @c's memory; reads 8 bytes past the end to check it */
    CLIENT_STACK_ALTSTACK, /* the signal stack the thread runs on (sigaltstack(2)) */
    CLIENT_STACK_PROBED,   /* pages checked up to the first unreadable one, or the cap */
};
struct client_stack_plan {
    size_t len;     /* bytes to reserve and copy */
    uint8_t how;    /* enum client_stack_how */
    bool may_go_on; /* len is the cap: the stack may go on past it */
};
void client_stack_plan_other(struct client_stack_cache *c, uint64_t sp, size_t cap,
                             struct client_stack_plan *ret);
/* After client_stack_copy() of a planned copy returned @copied (>= 0): remembers where the
 * stack ended and returns whether the copy is truncated (the stack may go on past it). */
bool client_stack_copied_other(struct client_stack_cache *c, uint64_t sp,
                               const struct client_stack_plan *plan, size_t copied);

/* Copies up to @len bytes at @src to @dst and returns how many it could: the bytes up to
 * the first unreadable page (so the copy of a stack stops where its mapping does), or
 * -errno when the copy is impossible (process_vm_readv(2) refused, e.g. by seccomp).
 * Never faults, whatever @src. @pid: ours. */
ssize_t client_stack_copy(pid_t pid, void *dst, uint64_t src, size_t len);

/* How many bytes from @addr, up to @len, lie in readable pages (0 when none); one system
 * call per page. Never faults. */
size_t client_stack_readable(uint64_t addr, size_t len);

#endif
