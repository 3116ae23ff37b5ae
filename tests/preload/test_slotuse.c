/* tests/preload/test_slotuse.c: the scan that tells how code uses a GOT slot
 * (preload/slotuse.c): calls and tail calls through the slot, other references (a mov, a
 * cmp), references across the pieces /proc/self/mem is read in, and the real code of
 * this test program (built with -fno-plt: its malloc slot is called through). */
#include <dlfcn.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "preload/slotuse.h"

/* Writes at @code[p] an instruction of opcode bytes @op (@n_op of them) whose 32-bit
 * RIP-relative displacement leads to @target, @code being at address @at; returns the
 * offset after it. */
static size_t put_ref(uint8_t *code, size_t p, uintptr_t at, const uint8_t *op, size_t n_op,
                      uintptr_t target)
{
    memcpy(code + p, op, n_op);
    p += n_op;
    int32_t disp = (int32_t)(target - (at + p + 4));
    memcpy(code + p, &disp, 4);
    return p + 4;
}

static const uint8_t CALL[] = {0xff, 0x15}, JMP[] = {0xff, 0x25}, MOV[] = {0x48, 0x8b, 0x05},
                     CMP[] = {0x48, 0x3b, 0x05};

static void test_calls_and_others_counted(void **state)
{
    (void)state;
    uint8_t code[256];
    memset(code, 0x90, sizeof(code)); /* nop */
    uintptr_t at = 0x400000, slots[2] = {0x401000, 0x401008};
    size_t p = 0;
    p = put_ref(code, p, at, CALL, 2, slots[0]);
    p = put_ref(code, p + 3, at, JMP, 2, slots[0]);
    p = put_ref(code, p, at, CALL, 2, slots[1]);
    p = put_ref(code, p + 1, at, MOV, 3, slots[1]);
    p = put_ref(code, p, at, CMP, 3, slots[1]);
    (void)put_ref(code, p, at, CALL, 2, 0x401010); /* another slot */
    struct slotuse u[2] = {0};
    client_slotuse_scan(code, sizeof(code), at, 0, slots, 2, u);
    assert_int_equal(u[0].calls, 2);
    assert_int_equal(u[0].others, 0);
    assert_int_equal(u[1].calls, 1);
    assert_int_equal(u[1].others, 2);
}

/* A displacement in the first two bytes has no opcode before it: another use. */
static void test_displacement_at_start_is_other(void **state)
{
    (void)state;
    uint8_t code[16];
    memset(code, 0x90, sizeof(code));
    uintptr_t at = 0x1000, slot = 0x2000;
    int32_t disp = (int32_t)(slot - (at + 4));
    memcpy(code, &disp, 4);
    struct slotuse u = {0};
    client_slotuse_scan(code, sizeof(code), at, 0, &slot, 1, &u);
    assert_int_equal(u.calls, 0);
    assert_int_equal(u.others, 1);
}

/* Read through /proc/self/mem in 64 KiB pieces: references at every offset around the
 * piece boundaries are each counted once, as a direct read counts them. */
static void test_pieces_count_once(void **state)
{
    (void)state;
    size_t len = 3 * 64 * 1024 + 123;
    uint8_t *code = malloc(len);
    assert_non_null(code);
    memset(code, 0x90, len);
    uintptr_t at = (uintptr_t)code, slot = at + len + 4096;
    uint32_t calls = 0, others = 0;
    for (size_t b = 2; b <= 3; b++) {
        size_t edge = b * (64 * 1024) - 5 * (b - 1); /* where piece b ends (overlap 5) */
        for (size_t d = 0; d < 9; d += 8) {
            size_t p = edge - 12 + d;
            (void)put_ref(code, p, at, b == 2 ? MOV : CALL, b == 2 ? 3 : 2, slot);
            if (b == 2)
                others++;
            else
                calls++;
        }
    }
    /* Every offset of a call across the first boundary. */
    for (size_t p = 64 * 1024 - 8; p < 64 * 1024 + 2; p += 1) {
        uint8_t saved[6];
        memcpy(saved, code + p, 6);
        (void)put_ref(code, p, at, CALL, 2, slot);
        struct slotuse direct = {0}, pieces = {0};
        client_slotuse_scan(code, len, at, 0, &slot, 1, &direct);
        int fd = open("/proc/self/mem", O_RDONLY);
        assert_true(fd >= 0);
        assert_true(client_slotuse_of_range(at, at + len, fd, &slot, 1, &pieces));
        close(fd);
        assert_int_equal(direct.calls, calls + 1);
        assert_int_equal(direct.others, others);
        assert_int_equal(pieces.calls, direct.calls);
        assert_int_equal(pieces.others, direct.others);
        memcpy(code + p, saved, 6);
    }
    free(code);
}

/* An unmapped range read through /proc/self/mem fails instead of faulting. */
static void test_unmapped_range_fails(void **state)
{
    (void)state;
    int fd = open("/proc/self/mem", O_RDONLY);
    assert_true(fd >= 0);
    uintptr_t slot = 0x1000;
    struct slotuse u = {0};
    assert_false(client_slotuse_of_range(0x10000, 0x20000, fd, &slot, 1, &u));
    assert_false(client_slot_calls_only(0x10000, 0x20000, fd, slot));
    close(fd);
}

/* This program, built with -fno-plt: its code calls malloc through the GLOB_DAT slot
 * and never takes its address (dlsym gives it here). */
extern char __executable_start[], etext[];
static void test_own_fnoplt_slot_calls_only(void **state);
static void test_own_fnoplt_slot_calls_only(void **state)
{
    (void)state;
    void *volatile p = malloc(10); /* a call through the slot */
    free(p);
    /* The slot: the GOT entry the call above reads, found from its displacement in this
     * function's code; candidates read through /proc/self/mem (a stray ff 15 could lead
     * anywhere). */
    int fd = open("/proc/self/mem", O_RDONLY);
    assert_true(fd >= 0);
    struct slotuse u = {0};
    uintptr_t lo = (uintptr_t)__executable_start, hi = (uintptr_t)etext;
    uintptr_t found = 0;
    const uint8_t *fn = (const uint8_t *)(uintptr_t)test_own_fnoplt_slot_calls_only;
    for (const uint8_t *c = fn; c < fn + 512 && c + 6 <= (const uint8_t *)hi; c++) {
        if (c[0] != 0xff || c[1] != 0x15)
            continue;
        int32_t disp;
        memcpy(&disp, c + 2, 4);
        uintptr_t slot = (uintptr_t)c + 6 + (uintptr_t)(intptr_t)disp;
        void *v = NULL;
        if (pread(fd, &v, sizeof(v), (off_t)slot) == sizeof(v) &&
            v == dlsym(RTLD_DEFAULT, "malloc")) {
            found = slot;
            break;
        }
    }
    assert_true(found != 0);
    /* Read as the library reads an object's code: through /proc/self/mem. */
    assert_true(client_slotuse_of_range(lo, hi, fd, &found, 1, &u));
    print_message("  malloc's slot: %u calls, %u other uses\n", u.calls, u.others);
    assert_true(u.calls >= 1);
    assert_int_equal(u.others, 0);
    assert_true(client_slot_calls_only(lo, hi, fd, found));
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_and_others_counted),
        cmocka_unit_test(test_displacement_at_start_is_other),
        cmocka_unit_test(test_pieces_count_once),
        cmocka_unit_test(test_unmapped_range_fails),
        cmocka_unit_test(test_own_fnoplt_slot_calls_only),
    };
    return cmocka_run_group_tests_name("slotuse", tests, NULL, NULL);
}
