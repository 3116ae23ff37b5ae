/* tests/preload/test_walk.c: the client's walk of its own stack with an unwind table
 * (preload/walk.c), on stacks laid out by hand in a buffer: which pcs it returns, and
 * that it gives up (returns 0) whenever a frame has no rule or a rule would make it read
 * outside the stack. Real stacks are walked in tests/unwinder/test_variants.c. */
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "common/macros.h"
#include "preload/walk.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

#define WORDS 512

struct fixture {
    struct utable w, r;
    uint64_t stack[WORDS]; /* the "stack": grows down from stack + WORDS */
    uint64_t regs[WIRE_NREGS];
    uint64_t pcs[CLIENT_WALK_MAX_FRAMES];
};

static int setup(void **state)
{
    static struct fixture f;
    memset(&f, 0, sizeof(f));
    int fd;
    if (utable_create(UTABLE_MIN_SLOTS * 4, &fd) < 0 || utable_map(fd, true, &f.w) < 0 ||
        utable_map(fd, false, &f.r) < 0)
        return -1;
    close(fd);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    utable_unmap(&f->w);
    utable_unmap(&f->r);
    return 0;
}

static uint64_t addr_of(struct fixture *f, size_t word)
{
    return (uint64_t)(uintptr_t)&f->stack[word];
}

static uint64_t end_of(struct fixture *f)
{
    return addr_of(f, WORDS);
}

static uint64_t rsp_rule(int32_t off)
{
    return utable_rule_make(false, off, false, 0, false);
}

static const uint64_t outermost = UTABLE_RULE_OUTERMOST;

/* Three frames with rsp-based CFAs, the last outermost:
 *
 *   frame 0 (pc 0x1000)  sp = word 100, CFA = sp + 32 -> return address at word 103
 *   frame 1 (ra 0x2005)  sp = word 104, CFA = sp + 16 -> return address at word 105
 *   frame 2 (ra 0x3009)  outermost
 *
 * Lookups: the innermost pc as is, the others at return address - 1. */
static void lay_out_three(struct fixture *f)
{
    f->regs[WIRE_REG_RIP] = 0x1000;
    f->regs[WIRE_REG_RSP] = addr_of(f, 100);
    f->regs[WIRE_REG_RBP] = 0xdead;
    f->stack[103] = 0x2005;
    f->stack[105] = 0x3009;
    utable_insert(&f->w, 0x1000, rsp_rule(32));
    utable_insert(&f->w, 0x2004, rsp_rule(16));
    utable_insert(&f->w, 0x3008, outermost);
}

static size_t walk(struct fixture *f, uint64_t end)
{
    return client_walk(&f->r, f->regs, end, f->pcs, CLIENT_WALK_MAX_FRAMES);
}

static void test_walk_rsp_chain_to_outermost(void **state)
{
    struct fixture *f = *state;
    lay_out_three(f);
    assert_int_equal(walk(f, end_of(f)), 3);
    assert_int_equal(f->pcs[0], 0x1000);
    assert_int_equal(f->pcs[1], 0x2005);
    assert_int_equal(f->pcs[2], 0x3009);
}

static void test_walk_missing_rule_gives_up(void **state)
{
    struct fixture *f = *state;
    lay_out_three(f);
    /* The middle frame's rule is keyed at its return address - 1, not at it. */
    utable_flush(&f->w);
    utable_insert(&f->w, 0x1000, rsp_rule(32));
    utable_insert(&f->w, 0x2005, rsp_rule(16));
    utable_insert(&f->w, 0x3008, outermost);
    assert_int_equal(walk(f, end_of(f)), 0);
}

static void test_walk_flushed_table_gives_up(void **state)
{
    struct fixture *f = *state;
    lay_out_three(f);
    utable_flush(&f->w);
    assert_int_equal(walk(f, end_of(f)), 0);
}

/* rbp-based CFA, rbp saved by the frame and restored for its caller, whose CFA is
 * rbp-based too. */
static void test_walk_rbp_frames(void **state)
{
    struct fixture *f = *state;
    /* frame 0: CFA = rbp + 16 with rbp = word 200 -> CFA word 202, ra at word 201, rbp
     * saved at CFA - 16 = word 200 (holds the caller's rbp, word 300). */
    f->regs[WIRE_REG_RIP] = 0x1000;
    f->regs[WIRE_REG_RSP] = addr_of(f, 150);
    f->regs[WIRE_REG_RBP] = addr_of(f, 200);
    f->stack[201] = 0x2005;
    f->stack[200] = addr_of(f, 300);
    /* frame 1: CFA = rbp + 16 = word 302, ra at word 301. */
    f->stack[301] = 0x3009;
    utable_insert(&f->w, 0x1000, utable_rule_make(true, 16, true, -16, false));
    utable_insert(&f->w, 0x2004, utable_rule_make(true, 16, true, -16, false));
    utable_insert(&f->w, 0x3008, outermost);
    assert_int_equal(walk(f, end_of(f)), 3);
    assert_int_equal(f->pcs[1], 0x2005);
    assert_int_equal(f->pcs[2], 0x3009);
    /* Without the saved rbp the caller's CFA would come from the wrong rbp. */
    utable_insert(&f->w, 0x1000, utable_rule_make(true, 16, false, 0, false));
    assert_int_equal(walk(f, end_of(f)), 0);
}

/* A C frame (rule at its address) called from JIT code the table knows only by page
 * (utable_page_key()), which is called by C code that ends the stack:
 *
 *   frame 0 (pc 0x1000)        CFA = sp + 16 -> ra 0x7f0000012345 at word 101
 *   frame 1 (JIT, ra 0x7f...)  its page's frame-pointer rule: rbp = word 120, ra at
 *                              word 121, caller's rbp at word 120 (word 200)
 *   frame 2 (ra 0x3009)        outermost */
static void lay_out_jit(struct fixture *f)
{
    f->regs[WIRE_REG_RIP] = 0x1000;
    f->regs[WIRE_REG_RSP] = addr_of(f, 100);
    f->regs[WIRE_REG_RBP] = addr_of(f, 120);
    f->stack[101] = 0x7f0000012345;
    f->stack[120] = addr_of(f, 200);
    f->stack[121] = 0x3009;
    utable_insert(&f->w, 0x1000, rsp_rule(16));
    utable_insert(&f->w, utable_page_key(0x7f0000012344), utable_rule_frame_ptr());
    utable_insert(&f->w, 0x3008, outermost);
}

static void test_walk_jit_page_frame_pointer(void **state)
{
    struct fixture *f = *state;
    lay_out_jit(f);
    assert_int_equal(walk(f, end_of(f)), 3);
    assert_int_equal(f->pcs[1], 0x7f0000012345);
    assert_int_equal(f->pcs[2], 0x3009);
    /* Another page of the same JIT code has no rule: the walk gives up. */
    f->stack[101] = 0x7f0000013345;
    assert_int_equal(walk(f, end_of(f)), 0);
}

/* A frame-pointer step checks the chain: rbp below the frame's stack pointer, or further
 * above it than UTABLE_FRAME_PTR_MAX_FRAME, is not a frame of this code. */
static void test_walk_jit_bad_chain_gives_up(void **state)
{
    struct fixture *f = *state;
    lay_out_jit(f);
    f->regs[WIRE_REG_RBP] = addr_of(f, 90); /* below frame 1's sp (word 102) */
    f->stack[90] = addr_of(f, 200);
    f->stack[91] = 0x3009;
    assert_int_equal(walk(f, end_of(f)), 0);
    /* The same chain without the frame-pointer flag would be taken: the flag is what
     * makes the walker check it. */
    utable_insert(&f->w, utable_page_key(0x7f0000012344),
                  utable_rule_frame_ptr() & ~UTABLE_RULE_FRAME_PTR);
    f->regs[WIRE_REG_RBP] = addr_of(f, 120);
    assert_int_equal(walk(f, end_of(f)), 3);
}

static void test_walk_jit_frame_too_large_gives_up(void **state)
{
    /* A stack big enough for a frame larger than the bound. */
    static uint64_t big[UTABLE_FRAME_PTR_MAX_FRAME / 8 + 64];
    struct fixture *f = *state;
    size_t top = HP_ARRAY_SIZE(big);
    uint64_t end = (uint64_t)(uintptr_t)&big[top];
    memset(big, 0, sizeof(big));
    f->regs[WIRE_REG_RIP] = 0x1000;
    f->regs[WIRE_REG_RSP] = (uint64_t)(uintptr_t)&big[0];
    big[1] = 0x7f0000012345; /* frame 1's sp: word 2 */
    utable_insert(&f->w, 0x1000, rsp_rule(16));
    utable_insert(&f->w, utable_page_key(0x7f0000012344), utable_rule_frame_ptr());
    utable_insert(&f->w, 0x3008, outermost);
    size_t rbp = top - 4;
    big[rbp + 1] = 0x3009;
    f->regs[WIRE_REG_RBP] = (uint64_t)(uintptr_t)&big[rbp];
    assert_true((rbp - 2) * 8 > UTABLE_FRAME_PTR_MAX_FRAME);
    assert_int_equal(client_walk(&f->r, f->regs, end, f->pcs, CLIENT_WALK_MAX_FRAMES), 0);
    rbp = 2 + UTABLE_FRAME_PTR_MAX_FRAME / 8;
    big[rbp + 1] = 0x3009;
    f->regs[WIRE_REG_RBP] = (uint64_t)(uintptr_t)&big[rbp];
    assert_int_equal(client_walk(&f->r, f->regs, end, f->pcs, CLIENT_WALK_MAX_FRAMES), 3);
}

/* Rules that point outside [sp, end) or do not move up the stack are refused. */
static void test_walk_out_of_bounds_gives_up(void **state)
{
    struct fixture *f = *state;
    lay_out_three(f);
    /* The stack ends before the middle frame's return address. */
    assert_int_equal(walk(f, addr_of(f, 105)), 0);
    /* A CFA at or below sp: no progress. */
    utable_insert(&f->w, 0x1000, rsp_rule(0));
    assert_int_equal(walk(f, end_of(f)), 0);
    utable_insert(&f->w, 0x1000, rsp_rule(-64));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* A CFA past the end. */
    utable_insert(&f->w, 0x1000, rsp_rule(INT32_MAX));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* A misaligned return address slot. */
    utable_insert(&f->w, 0x1000, rsp_rule(33));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* An rbp-based CFA from a garbage rbp. */
    f->regs[WIRE_REG_RBP] = 8;
    utable_insert(&f->w, 0x1000, utable_rule_make(true, 16, false, 0, false));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* A saved rbp slot outside the stack. */
    utable_insert(&f->w, 0x1000, utable_rule_make(false, 32, true, 32000, false));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* No room at all. */
    utable_insert(&f->w, 0x1000, rsp_rule(32));
    assert_int_equal(walk(f, f->regs[WIRE_REG_RSP]), 0);
}

/* A zero return address ends the stack (after the frame that has it). */
static void test_walk_zero_return_address_ends(void **state)
{
    struct fixture *f = *state;
    lay_out_three(f);
    f->stack[105] = 0;
    assert_int_equal(walk(f, end_of(f)), 2);
    assert_int_equal(f->pcs[1], 0x2005);
}

/* Deeper than the walk goes: give up (the client then copies the stack). */
static void test_walk_too_deep_gives_up(void **state)
{
    struct fixture *f = *state;
    /* A frame of 2 words calling itself: every frame's CFA is sp + 16. */
    f->regs[WIRE_REG_RIP] = 0x1000;
    f->regs[WIRE_REG_RSP] = addr_of(f, 0);
    for (size_t w = 1; w < WORDS; w += 2)
        f->stack[w] = 0x1001;
    utable_insert(&f->w, 0x1000, rsp_rule(16));
    assert_int_equal(walk(f, end_of(f)), 0);
    /* The same recursion, shorter, ending in an outermost frame, is walked. */
    f->stack[2 * 10 + 1] = 0x3009;
    utable_insert(&f->w, 0x3008, outermost);
    assert_int_equal(walk(f, end_of(f)), 12);
    assert_int_equal(f->pcs[11], 0x3009);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_walk_rsp_chain_to_outermost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_missing_rule_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_flushed_table_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_rbp_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_out_of_bounds_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_zero_return_address_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_too_deep_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_jit_page_frame_pointer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_jit_bad_chain_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_walk_jit_frame_too_large_gives_up, setup, teardown),
    };
    return cmocka_run_group_tests_name("walk", tests, NULL, NULL);
}
