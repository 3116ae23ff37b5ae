/* preload/slotuse.h: how an object's code uses a GOT slot of the allocator.
 *
 * A GLOB_DAT slot of `malloc` serves two uses: code built with -fno-plt calls through it
 * (`call *malloc@GOTPCREL(%rip)`), and code that takes the function's address loads it
 * from there (`mov malloc@GOTPCREL(%rip), %rax`) to store it, pass it or compare it. In a
 * program the library was loaded into while it ran, pointing such a slot at a hook for a
 * session would let the first use see the calls, and break the second: an address stored
 * before the session (or in data the loader relocated) would no longer equal `&malloc`
 * read during it. So only slots that the code uses for calls alone are switched; the
 * scan here tells which.
 *
 * The scan looks for 32-bit RIP-relative displacements that end an instruction and lead
 * to the slot: `ff 15 disp32` (call) and `ff 25 disp32` (jmp, a tail call) are calls;
 * any other (a mov, a cmp, a push) is another use. It does not decode instructions: a
 * byte sequence that happens to lead to the slot counts as another use, which only makes
 * the answer more cautious (a slot left as it is).
 *
 *     struct slotuse u[2] = {0};
 *     client_slotuse_scan(code, len, code_addr, slots, 2, u);
 *     bool switch_it = u[0].calls > 0 && u[0].others == 0;
 *
 * Hook-safe: no allocation, no lock. */
#ifndef HP_PRELOAD_SLOTUSE_H
#define HP_PRELOAD_SLOTUSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

struct slotuse {
    uint32_t calls;  /* call and jmp through the slot */
    uint32_t others; /* every other reference */
};

/* Adds to @use[i] the references to @slots[i] (i < @n) of the instructions whose
 * displacement starts at @code[first..len-4]: @code is a copy of the code at address @at,
 * and @first >= 2 lets the opcode bytes before a displacement be read (a scan in pieces
 * passes each piece with 2 bytes of the one before: first = 2). */
void client_slotuse_scan(const uint8_t *code, size_t len, uintptr_t at, size_t first,
                         const uintptr_t *slots, size_t n, struct slotuse *use);

/* The references to @slots[i] (i < @n) in [@lo, @hi) of this process's memory, read
 * through @mem_fd (/proc/self/mem: an unmapped range reads as an error, not a fault) or,
 * when @mem_fd < 0, directly (the caller knows the range is mapped and readable). Returns
 * false when the range could not be read whole (@use then says nothing). */
bool client_slotuse_of_range(uintptr_t lo, uintptr_t hi, int mem_fd, const uintptr_t *slots,
                             size_t n, struct slotuse *use);

/* True when the slot at @slot is used for calls only by the code in [@lo, @hi) (read as
 * client_slotuse_of_range() says), false when it is used otherwise too, never at all, or
 * the code could not be read. */
bool client_slot_calls_only(uintptr_t lo, uintptr_t hi, int mem_fd, uintptr_t slot);

#pragma GCC visibility pop

#endif
