/* preload/walk.h: the client walks its own stack with the rules the service published in
 * the session's unwind table (shmem_ring/utable.h), so that a sampled allocation can be
 * recorded with its return addresses instead of a copy of the stack.
 *
 * A walk succeeds only when every frame from the allocation's call site to the outermost
 * one has a rule, and every address a rule makes it read lies in the thread's stack;
 * otherwise the caller copies the stack as before, and the service, unwinding that copy,
 * publishes the rules the walk missed.
 *
 *     uint64_t pcs[CLIENT_WALK_MAX_FRAMES];
 *     size_t n = client_walk(&s->utable, regs, stack_end, pcs, CLIENT_WALK_MAX_FRAMES);
 *     if (n > 0) record_pcs(pcs, n); else record_stack_copy();
 *
 * Hook-safe: loads only, no system call.
 */
#ifndef HP_PRELOAD_WALK_H
#define HP_PRELOAD_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

/* Deeper stacks are copied (the unwinder then truncates them as it does any). */
#define CLIENT_WALK_MAX_FRAMES WIRE_MAX_PCS

/* Walks from the registers of the application's frame at its allocation call (@regs in
 * WIRE_REG_* numbering) within the thread's stack [regs[WIRE_REG_RSP], @stack_end).
 * Writes the pcs innermost first (regs[WIRE_REG_RIP], then the return addresses) to
 * @pcs and returns their number when the walk reached the end of the stack; 0 when it
 * could not (a frame without a rule, an address outside the stack, deeper than @max). */
size_t client_walk(const struct utable *t, const uint64_t *regs, uint64_t stack_end, uint64_t *pcs,
                   size_t max);

#endif
