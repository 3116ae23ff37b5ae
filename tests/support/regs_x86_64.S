/* hp_capture_regs(uint64_t regs[17]): see tests/support/regs.h. */
    .text
    .globl hp_capture_regs
    .hidden hp_capture_regs
    .type hp_capture_regs, @function
    .p2align 4
hp_capture_regs:
    .cfi_startproc
    movq %rax, 0(%rdi)
    movq %rdx, 8(%rdi)
    movq %rcx, 16(%rdi)
    movq %rbx, 24(%rdi)
    movq %rsi, 32(%rdi)
    movq %rdi, 40(%rdi)
    movq %rbp, 48(%rdi)
    leaq 8(%rsp), %rax
    movq %rax, 56(%rdi)
    movq %r8, 64(%rdi)
    movq %r9, 72(%rdi)
    movq %r10, 80(%rdi)
    movq %r11, 88(%rdi)
    movq %r12, 96(%rdi)
    movq %r13, 104(%rdi)
    movq %r14, 112(%rdi)
    movq %r15, 120(%rdi)
    movq (%rsp), %rax
    movq %rax, 128(%rdi)
    ret
    .cfi_endproc
    .size hp_capture_regs, .-hp_capture_regs
    .section .note.GNU-stack,"",@progbits
