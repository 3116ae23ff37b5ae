/* preload/slotuse.c: see slotuse.h. Hook-safe. */
#include "preload/slotuse.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "common/sys.h"

void client_slotuse_scan(const uint8_t *code, size_t len, uintptr_t at, size_t first,
                         const uintptr_t *slots, size_t n, struct slotuse *use)
{
    if (n == 0 || len < 4)
        return;
    uintptr_t min = UINTPTR_MAX, max = 0;
    for (size_t i = 0; i < n; i++) {
        min = slots[i] < min ? slots[i] : min;
        max = slots[i] > max ? slots[i] : max;
    }
    for (size_t p = first; p + 4 <= len; p++) {
        int32_t disp;
        memcpy(&disp, code + p, sizeof(disp));
        /* The displacement is the instruction's last field: it counts from its end. */
        uintptr_t target = at + p + 4 + (uintptr_t)(intptr_t)disp;
        if (target < min || target > max)
            continue;
        for (size_t i = 0; i < n; i++) {
            if (target != slots[i])
                continue;
            bool call =
                p >= 2 && code[p - 2] == 0xff && (code[p - 1] == 0x15 || code[p - 1] == 0x25);
            if (call)
                use[i].calls++;
            else
                use[i].others++;
        }
    }
}

/* The piece read at a time through /proc/self/mem. */
#define SLOTUSE_PIECE (64u * 1024u)

bool client_slotuse_of_range(uintptr_t lo, uintptr_t hi, int mem_fd, const uintptr_t *slots,
                             size_t n, struct slotuse *use)
{
    if (hi <= lo)
        return true;
    if (mem_fd < 0) {
        client_slotuse_scan((const uint8_t *)lo, hi - lo, lo, 0, slots, n, use);
        return true;
    }
    uint8_t *buf = hp_sys_mmap(NULL, SLOTUSE_PIECE, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hp_sys_failed((long)buf))
        return false;
    bool ok = true;
    /* Each piece starts 2 bytes before the first displacement it looks at, so that the
     * opcode of one that straddles two pieces is seen, and ends 3 bytes after the last. */
    for (uintptr_t at = lo; at < hi && ok;) {
        uintptr_t from = at == lo ? lo : at - 2;
        size_t len = hi - from < SLOTUSE_PIECE ? hi - from : SLOTUSE_PIECE;
        ok = hp_sys4(SYS_pread64, mem_fd, (long)buf, (long)len, (long)from) == (long)len;
        if (ok)
            client_slotuse_scan(buf, len, from, at - from, slots, n, use);
        /* The next piece's first displacement: the one after this piece's last. */
        at = from + len < hi ? from + len - 3 : hi;
    }
    (void)hp_sys_munmap(buf, SLOTUSE_PIECE);
    return ok;
}

bool client_slot_calls_only(uintptr_t lo, uintptr_t hi, int mem_fd, uintptr_t slot)
{
    struct slotuse u = {0};
    return client_slotuse_of_range(lo, hi, mem_fd, &slot, 1, &u) && u.calls > 0 && u.others == 0;
}
