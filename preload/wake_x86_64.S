/* preload/wake_x86_64.S: the return trap of the remote call that wakes a dormant client
 * (preload/wake.c, service/wake.c). The attacher pushes client_wake_trap as the return
 * address of client_wake_entry(): when the call returns, the int3 stops the thread in
 * the attacher's hands (SIGTRAP, rip = client_wake_trap + 1), which puts its registers
 * back. Nothing else ever jumps here. */
    .text
    .globl client_wake_trap
    .hidden client_wake_trap
    .type client_wake_trap, @function
    .p2align 4
client_wake_trap:
    .cfi_startproc
    int3
    /* Only if the attacher vanished and someone let the SIGTRAP pass: never fall
     * through into whatever follows. */
    ud2
    .cfi_endproc
    .size client_wake_trap, .-client_wake_trap

    .section .note.GNU-stack,"",@progbits
