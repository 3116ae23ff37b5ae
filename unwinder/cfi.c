/* unwinder/cfi.c: unwind rules for the clients' own stack walks (shmem_ring/utable.h),
 * read from a file's .eh_frame with libdw's CFI interface.
 *
 * Only the rules a utable holds are extracted; for anything else the answer is -ENOENT
 * and the client keeps copying its stack for that frame:
 *
 *     CFA            DW_OP_breg7 (rsp) or DW_OP_breg6 (rbp) plus an offset
 *     return address saved at CFA - 8, or undefined (the outermost frame)
 *     rbp            same value, or saved at CFA + offset
 *     not a signal frame, return address column 16 (rip)
 *
 * libdw's CFI objects cache what they parsed and are not thread-safe: one lock guards
 * every use. Rules are asked for once per new code address a stack shows, so the lock is
 * not contended in practice.
 */
#include "unwinder/unwinder_internal.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <errno.h>
#include <gelf.h>
#include <pthread.h>
#include <stdlib.h>

#include "shmem_ring/utable.h"

#define CFI_REG_RBP 6
#define CFI_REG_RSP 7
#define CFI_REG_RA 16

struct unwinder__cfi {
    Elf *elf;
    Dwarf_CFI *cfi;
};

static pthread_mutex_t s_cfi_lock = PTHREAD_MUTEX_INITIALIZER;

/* pre: s_cfi_lock held. */
static struct unwinder__cfi *cfi_of(struct unwinder__elf *e)
{
    if (e->cfi_tried)
        return e->cfi;
    e->cfi_tried = true;
    if (!e->ok || !e->image)
        return NULL;
    struct unwinder__cfi *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->elf = elf_memory((char *)(uintptr_t)e->image, e->image_size);
    c->cfi = c->elf ? dwarf_getcfi_elf(c->elf) : NULL;
    if (!c->cfi) {
        if (c->elf)
            elf_end(c->elf);
        free(c);
        return NULL;
    }
    e->cfi = c;
    return c;
}

void unwinder__cfi_free(struct unwinder__elf *e)
{
    struct unwinder__cfi *c = e->cfi;
    if (!c)
        return;
    dwarf_cfi_end(c->cfi);
    elf_end(c->elf);
    free(c);
    e->cfi = NULL;
}

/* A location "CFA + off" (libdw's form of the offset(N) rule): true with @ret_off. */
static bool cfa_offset_loc(const Dwarf_Op *ops, size_t nops, int64_t *ret_off)
{
    if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa)
        return false;
    if (nops == 1) {
        *ret_off = 0;
        return true;
    }
    if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) {
        *ret_off = (int64_t)ops[1].number; /* a negative offset comes two's-complement */
        return true;
    }
    return false;
}

/* pre: s_cfi_lock held. */
static int frame_rule(Dwarf_Frame *frame, uint64_t *ret_rule)
{
    bool signal = false;
    Dwarf_Addr start, end;
    if (dwarf_frame_info(frame, &start, &end, &signal) != CFI_REG_RA || signal)
        return -ENOENT;

    Dwarf_Op ops_mem[3], *ops;
    size_t nops;
    if (dwarf_frame_register(frame, CFI_REG_RA, ops_mem, &ops, &nops) != 0)
        return -ENOENT;
    if (nops == 0 && ops == ops_mem) {
        /* Undefined return address: no caller. */
        *ret_rule = utable_rule_make(false, 0, false, 0, true);
        return 0;
    }
    int64_t ra_off;
    if (!cfa_offset_loc(ops, nops, &ra_off) || ra_off != -8)
        return -ENOENT;

    if (dwarf_frame_cfa(frame, &ops, &nops) != 0 || nops != 1)
        return -ENOENT;
    int64_t reg, cfa_off;
    if (ops[0].atom == DW_OP_bregx) {
        reg = (int64_t)ops[0].number;
        cfa_off = (int64_t)ops[0].number2;
    } else if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31) {
        reg = ops[0].atom - DW_OP_breg0;
        cfa_off = (int64_t)ops[0].number;
    } else {
        return -ENOENT;
    }
    if ((reg != CFI_REG_RSP && reg != CFI_REG_RBP) || cfa_off < INT32_MIN || cfa_off > INT32_MAX)
        return -ENOENT;

    bool rbp_saved = false;
    int64_t rbp_off = 0;
    if (dwarf_frame_register(frame, CFI_REG_RBP, ops_mem, &ops, &nops) != 0)
        return -ENOENT;
    if (nops == 0 && ops == NULL) {
        /* same value: the caller's rbp is ours */
    } else if (cfa_offset_loc(ops, nops, &rbp_off) && rbp_off >= INT16_MIN &&
               rbp_off <= INT16_MAX) {
        rbp_saved = true;
    } else {
        return -ENOENT; /* undefined, in another register, or an expression */
    }
    *ret_rule =
        utable_rule_make(reg == CFI_REG_RBP, (int32_t)cfa_off, rbp_saved, (int16_t)rbp_off, false);
    return 0;
}

/* The guarded part of unwinder__cfi_rule(): libdw reads the file's .eh_frame from the
 * cache's mapping of it. */
struct rule_args {
    struct unwinder__elf *e;
    uint64_t vaddr;
    uint64_t rule;
};

static int rule_lookup(void *arg)
{
    struct rule_args *a = arg;
    struct unwinder__cfi *c = cfi_of(a->e);
    Dwarf_Frame *frame = NULL;
    int r = c ? -ESRCH : -ENOENT; /* -ESRCH: no CFI covers the address */
    if (c && dwarf_cfi_addrframe(c->cfi, a->vaddr, &frame) == 0)
        r = frame_rule(frame, &a->rule);
    free(frame);
    return r;
}

int unwinder__cfi_rule(const struct unwinder__elf *ce, uint64_t vaddr, uint64_t *ret_rule)
{
    /* The CFI fields are the entry's only mutable part, guarded by s_cfi_lock. */
    struct unwinder__elf *e = (struct unwinder__elf *)(uintptr_t)ce;
    if (unwinder__elf_is_faulted(e))
        return -ENOENT;
    struct rule_args a = {.e = e, .vaddr = vaddr};
    pthread_mutex_lock(&s_cfi_lock);
    int r = unwinder__bus_guarded(rule_lookup, &a, NULL);
    if (r == -EFAULT) {
        /* The file was truncated under libdw: its CFI objects are abandoned mid-use and
         * leaked, never to be touched again (freeing them could read the dead mapping). */
        unwinder__elf_mark_faulted(e);
        e->cfi = NULL;
        e->cfi_tried = true;
        r = -ENOENT;
    }
    pthread_mutex_unlock(&s_cfi_lock);
    if (r == 0)
        *ret_rule = a.rule;
    return r;
}
