/* common/regs.h: the registers a remote unwinder needs (x86_64), in the order and
 * numbering of DWARF (libunwind UNW_X86_64_*):
 * rax rdx rcx rbx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip.
 *
 * The client's trampoline (preload/tramp_x86_64.S) stores them in this order, and the
 * record layout pins it (shmem_ring/wire.h); tests capture them with hp_capture_regs()
 * (tests/support/regs.h).
 *
 *     uint64_t regs[HP_NREGS];
 *     uint64_t sp = regs[HP_REG_RSP], pc = regs[HP_REG_RIP];
 */
#ifndef HP_COMMON_REGS_H
#define HP_COMMON_REGS_H

#define HP_NREGS 17
#define HP_REG_RSP 7
#define HP_REG_RIP 16

#endif
