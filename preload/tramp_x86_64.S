/* preload/tramp_x86_64.S: client_sample_tramp(p, size, ret) and client_heap_tramp(), see
 * preload/client.h.
 *
 * The exported allocation functions tail-call this when the sampler fires. At entry the
 * callee-saved registers still hold the application's values and (%rsp) is the return
 * address into the application, so the registers stored here describe the application's
 * frame at its call to malloc: the stack copy starts at the caller's stack pointer and
 * the profile's stack starts at the call site, with no libheapprof.so frame. Without the
 * tail call (an unoptimised build) they describe the exported function's frame instead,
 * which is just as consistent (the unwinder skips it).
 *
 * regs[] (DWARF order, see common/regs.h) lives in our frame; caller-saved slots are 0.
 */
/* TRAMP target, regs_reg: saves the registers into regs[] and calls target with its
 * first arguments as they came and &regs[0] in regs_reg (the next argument register). */
    .macro TRAMP target, regs_reg
    .cfi_startproc
    /* 17 slots: entry %rsp is 8 mod 16, so %rsp is 16-aligned after this. */
    subq $136, %rsp
    .cfi_adjust_cfa_offset 136
    movq $0, 0(%rsp)
    movq $0, 8(%rsp)
    movq $0, 16(%rsp)
    movq %rbx, 24(%rsp)
    movq $0, 32(%rsp)
    movq $0, 40(%rsp)
    movq %rbp, 48(%rsp)
    leaq 144(%rsp), %rax
    movq %rax, 56(%rsp)
    movq $0, 64(%rsp)
    movq $0, 72(%rsp)
    movq $0, 80(%rsp)
    movq $0, 88(%rsp)
    movq %r12, 96(%rsp)
    movq %r13, 104(%rsp)
    movq %r14, 112(%rsp)
    movq %r15, 120(%rsp)
    movq 136(%rsp), %rax
    movq %rax, 128(%rsp)
    movq %rsp, \regs_reg
    call \target
    addq $136, %rsp
    .cfi_adjust_cfa_offset -136
    ret
    .cfi_endproc
    .endm

    .text
    .globl client_sample_tramp
    .hidden client_sample_tramp
    .type client_sample_tramp, @function
    .globl client_sample_tramp_int
    .hidden client_sample_tramp_int
    .type client_sample_tramp_int, @function
    .p2align 4
client_sample_tramp:
client_sample_tramp_int:
    /* client_alloc_slow(p = %rdi, size = %rsi, ret = %rdx, regs = %rcx) */
    TRAMP client_alloc_slow, %rcx
    .size client_sample_tramp, .-client_sample_tramp
    .size client_sample_tramp_int, .-client_sample_tramp_int

/* client_heap_tramp(heap, id, size, sample_size), tail-called from the heap API's exported
 * calls (preload/heapapi.c) in the same way: the stack starts at the program's call. */
    .globl client_heap_tramp
    .hidden client_heap_tramp
    .type client_heap_tramp, @function
    .p2align 4
client_heap_tramp:
    /* client_heap_slow(heap = %edi, id = %rsi, size = %rdx, sample_size = %rcx, regs = %r8) */
    TRAMP client_heap_slow, %r8
    .size client_heap_tramp, .-client_heap_tramp

/* dlopen(file, mode), exported. glibc resolves a dlopen's DT_RUNPATH, $ORIGIN and
 * namespace for the object its return address lies in: the function client_dl_open_target()
 * returns (glibc's dlopen, see preload/dl.c) is reached by a jump, with the application's
 * return address still on the stack, so that it finds what the application's call would
 * find. The arguments are kept across the call (16-byte aligned there). */
    .globl dlopen
    .type dlopen, @function
    .p2align 4
dlopen:
    .cfi_startproc
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call client_dl_open_target
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlopen, .-dlopen
    .section .note.GNU-stack,"",@progbits
