/* preload/walk.h: the client walks its own stack with the rules the service published in
 * the session's unwind table (shmem_ring/utable.h), so that a sampled allocation can be
 * recorded with its return addresses instead of a copy of the stack.
 *
 * A walk succeeds only when every frame from the allocation's call site to the outermost
 * one has a rule, and every address a rule makes it read lies in the stack; otherwise the
 * caller copies the stack as before, and the service, unwinding that copy, publishes the
 * rules the walk missed. A frame in JIT code has the rule of its page, the frame-pointer
 * rule, whose chain must also stay within UTABLE_FRAME_PTR_MAX_FRAME of the frame's stack
 * pointer (utable.h); the caller's return address must then have a rule of its own or
 * be in JIT code the service knows, like any other frame's.
 *
 * The stack is either the thread's own, [sp, end) known readable (preload/stack.h), or a
 * stack we know nothing of (a fiber's, a signal stack): then each page is checked readable
 * before the walk's first load there (client_stack_readable(), one system call per page),
 * so that no load can fault whatever the rules say, and a caller whose return address
 * would lie in an unreadable page is past the end of the stack (a fiber's entry frame has
 * none: the service ends its unwinds of such stacks there too, UNWINDER_COPY_ENDS).
 *
 * A walk can stop after a number of frames and go on later from where it stood, so that
 * the caller needs room for only a few pcs on its stack:
 *
 *     struct client_walk w;
 *     client_walk_begin(&w, &s->utable, regs, stack_end, false);
 *     int r = client_walk_step(&w, &s->utable, pcs, 16, CLIENT_WALK_MAX_FRAMES);
 *     if (r == CLIENT_WALK_MORE) { struct client_walk rest = w; count, reserve, go on }
 *
 * Hook-safe: loads, and system calls only for the pages of an unknown stack.
 */
#ifndef HP_PRELOAD_WALK_H
#define HP_PRELOAD_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

/* Deeper stacks are copied (the unwinder then truncates them as it does any). */
#define CLIENT_WALK_MAX_FRAMES WIRE_MAX_PCS

enum { CLIENT_WALK_FAILED = -1, CLIENT_WALK_DONE = 0, CLIENT_WALK_MORE = 1 };

/* Where a walk stands. */
struct client_walk {
    uint64_t pc, sp, bp; /* the frame reached (pcs not yet stored) */
    uint64_t lo, end;    /* stack bounds: [lo, end) */
    uint64_t checked;    /* unknown stack: [lo, checked) known readable; else == end */
    uint64_t gen;        /* table generation the walk uses */
    size_t n;            /* frames stored or counted so far */
    bool left;           /* unknown stack: a read found an unreadable page */
};

/* Starts a walk from the registers of the application's frame at its allocation call
 * (@regs in WIRE_REG_* numbering) within [regs[WIRE_REG_RSP], @stack_end). @checked:
 * the whole range is known readable (the thread's own stack); else pages are checked as
 * the walk reaches them. */
void client_walk_begin(struct client_walk *w, const struct utable *t, const uint64_t *regs,
                       uint64_t stack_end, bool checked);

/* Goes on with @w, writing the next pcs (innermost first: regs[WIRE_REG_RIP], then return
 * addresses) to @pcs, at most @cap of them (@pcs NULL: only counts them). Returns
 * CLIENT_WALK_DONE when it reached the outermost frame (w->n frames in all),
 * CLIENT_WALK_MORE when @cap pcs were written and frames remain (call again, from a copy
 * of @w if the same frames are to be walked twice), or CLIENT_WALK_FAILED (a frame without
 * a rule, an address outside the stack or unreadable, more than @max frames in all). */
int client_walk_step(struct client_walk *w, const struct utable *t, uint64_t *pcs, size_t cap,
                     size_t max);

/* The whole walk at once: the number of pcs written to @pcs when it reached the end of
 * the stack within @max frames, else 0. @stack_end bounds a stack known readable. */
size_t client_walk(const struct utable *t, const uint64_t *regs, uint64_t stack_end, uint64_t *pcs,
                   size_t max);

#endif
