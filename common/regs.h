/* common/regs.h: cheap capture of the registers a remote unwinder needs (x86_64).
 *
 * hp_capture_regs() stores the caller's registers as they are at the call: callee-saved
 * registers, rsp as it will be after the call returns, and rip = the return address (a pc
 * inside the caller). Order and numbering are DWARF's (libunwind UNW_X86_64_*):
 * rax rdx rcx rbx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip. rax is clobbered.
 * Hook-safe: a dozen moves, no stack use beyond the call.
 *
 *     uint64_t regs[HP_NREGS];
 *     hp_capture_regs(regs);   // regs[HP_REG_RIP] is in this function
 */
#ifndef HP_COMMON_REGS_H
#define HP_COMMON_REGS_H

#include <stdint.h>

#define HP_NREGS 17
#define HP_REG_RSP 7
#define HP_REG_RIP 16

void hp_capture_regs(uint64_t regs[HP_NREGS]);

#endif
