/* tests/fuzz/fuzz_unwind.c: the unwinder's entry point on a synthetic process: this
 * process's own maps and memory, with registers and stack bytes from the input. The
 * unwind must return with at least one frame, error frames named "ERROR <reason>", and
 * never crash or hang.
 *
 * Input layout (short inputs are zero-padded):
 *   byte 0       which real function the pc points into (index into code[]), or none
 *   bytes 1-2    offset added to that function's address
 *   byte 3       bit 0: rsp/rbp point into the stack copy; bit 1: rewrite stack words
 *                whose low bits are 01 into code addresses and 10 into stack addresses
 *   bytes 4-139  the 17 registers (rsp, rbp and rip overridden as above)
 *   the rest     the stack copy, at a fixed fake stack address
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unwinder/unwinder.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FAKE_SP 0x7ff000000000ull
#define STACK_MAX (64u * 1024)

static unwinder_process_t *g_p;
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];
static uint8_t g_stack[STACK_MAX];

static void setup(void)
{
    if (g_p)
        return;
    if (unwinder_global_init() < 0)
        abort();
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (unwinder_process_new(getpid(), maps_fd, mem_fd, &g_p) < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint64_t code[] = {
        (uint64_t)(uintptr_t)LLVMFuzzerTestOneInput,
        (uint64_t)(uintptr_t)setup,
        (uint64_t)(uintptr_t)qsort,
        (uint64_t)(uintptr_t)memcpy,
        (uint64_t)(uintptr_t)malloc,
        (uint64_t)(uintptr_t)unwinder_unwind,
    };
    setup();
    uint8_t head[4 + WIRE_NREGS * 8] = {0};
    memcpy(head, data, size < sizeof(head) ? size : sizeof(head));
    size_t len = size > sizeof(head) ? size - sizeof(head) : 0;
    if (len > STACK_MAX)
        len = STACK_MAX;
    if (len)
        memcpy(g_stack, data + sizeof(head), len);

    uint64_t regs[WIRE_NREGS];
    memcpy(regs, head + 4, sizeof(regs));
    size_t which = head[0] % (sizeof(code) / sizeof(code[0]) + 1);
    if (which < sizeof(code) / sizeof(code[0]))
        regs[WIRE_REG_RIP] = code[which] + (uint64_t)(head[1] | head[2] << 8) % 4096;
    if (head[3] & 1) {
        regs[WIRE_REG_RSP] = FAKE_SP;
        regs[WIRE_REG_RBP] = FAKE_SP + (regs[WIRE_REG_RBP] % (len + 16));
    }
    if (head[3] & 2) {
        for (size_t i = 0; i + 8 <= len; i += 8) {
            uint64_t w;
            memcpy(&w, g_stack + i, 8);
            if ((w & 3) == 1)
                w = code[(w >> 8) % (sizeof(code) / sizeof(code[0]))] + ((w >> 16) % 256);
            else if ((w & 3) == 2)
                w = FAKE_SP + ((w >> 8) % (len + 64));
            memcpy(g_stack + i, &w, 8);
        }
    }

    size_t n = 0;
    struct unwinder_result res;
    if (unwinder_unwind(g_p, regs, FAKE_SP, g_stack, len, g_frames, UNWINDER_MAX_FRAMES, &n,
                        &res) != 0)
        abort();
    if (n < 1 || n > UNWINDER_MAX_FRAMES)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!g_frames[i].function_name)
            abort();
    if (res.error && strncmp(g_frames[n - 1].function_name, "ERROR ", 6) != 0)
        abort();
    return 0;
}
