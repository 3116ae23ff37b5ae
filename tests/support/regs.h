/* tests/support/regs.h: capture of the caller's registers, for tests and benchmarks that
 * unwind their own stack as the service unwinds a client's (tests/support/regs_x86_64.S;
 * not part of libheapprof.so or the service).
 *
 * hp_capture_regs() stores the caller's registers as they are at the call: callee-saved
 * registers, rsp as it will be after the call returns, and rip = the return address (a pc
 * inside the caller), in the order of common/regs.h. rax is clobbered. A dozen moves, no
 * stack use beyond the call.
 *
 *     uint64_t regs[HP_NREGS];
 *     hp_capture_regs(regs);   // regs[HP_REG_RIP] is in this function
 */
#ifndef HP_TESTS_SUPPORT_REGS_H
#define HP_TESTS_SUPPORT_REGS_H

#include <stdint.h>

#include "common/regs.h"

void hp_capture_regs(uint64_t regs[HP_NREGS]);

#endif
