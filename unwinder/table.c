/* unwinder/table.c: the client's unwind table (shmem_ring/utable.h). After a stack is
 * unwound without error, each CFI lookup address of its frames not offered yet under the
 * table's generation gets its rule from cfi.c, published when it has the simple form the
 * table holds, so that the client walks those frames itself instead of copying its
 * stack. Code without CFI that the unwind stepped through by its frame pointer gets the
 * frame-pointer rule: V8's builtins in node's binary per address, JIT code in anonymous
 * executable memory per page (utable.h). Also unwinder_process_set_table(),
 * unwinder_table_reset() and unwinder_table_stats().
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shmem_ring/utable.h"

/* Slots of the per-process memory of lookup addresses already offered to the unwind
 * table (power of 2): a frame met again is not looked up in the CFI again. */
#define KNOWN_SLOTS 4096

/* A lookup address offered to the unwind table (published, or found without a rule)
 * under table generation `gen` of the process. */
struct known_slot {
    uint64_t addr;
    uint32_t gen; /* 0: empty */
};

int unwinder_process_set_table(unwinder_process_t *p, int fd)
{
    if (p->table.hdr)
        return -EBUSY;
    struct known_slot *known = calloc(KNOWN_SLOTS, sizeof(*known));
    if (!known)
        return -ENOMEM;
    int r = utable_map(fd, true, &p->table);
    if (r < 0) {
        free(known);
        return r;
    }
    p->known = known;
    p->known_gen = 1;
    return 0;
}

void unwinder_table_reset(unwinder_process_t *p)
{
    if (!p->table.hdr)
        return;
    utable_flush(&p->table);
    p->tstats.flushes++;
    if (++p->known_gen == 0)
        p->known_gen = 1;
}

void unwinder_table_stats(const unwinder_process_t *p, struct unwinder_table_stats *ret)
{
    *ret = p->tstats;
}

/* The rule of the frame at p->lookups[@k] (in p->maps.v[@i], an executable mapping, @e
 * its file or NULL) for the table, or false. */
static bool lookup_rule(struct unwinder_process *p, size_t k, ssize_t i,
                        const struct unwinder__elf *e, uint64_t *ret_rule, uint64_t *ret_key)
{
    uint64_t addr = p->lookups[k];
    const struct unwinder__segment *seg = e ? p->pm[i].seg : NULL;
    /* The stack was unwound from this frame to its caller, and on to its end without
     * error: without CFI, libunwind took that step by the frame-pointer chain, which the
     * code there keeps then (the innermost frame's rbp may not be set up yet). */
    bool fp_ok = k > 0 && k + 1 < p->n_lookups;
    *ret_key = addr;
    if (seg) {
        int r = unwinder__cfi_rule(
            e, addr - p->maps.v[i].start + p->maps.v[i].pgoff + (seg->vaddr - seg->offset),
            ret_rule);
        if (r == 0)
            return true;
        if (r == -ESRCH && fp_ok) {
            *ret_rule = utable_rule_frame_ptr();
            return true;
        }
    } else if (i >= 0 && fp_ok && unwinder__is_jit_map(&p->maps.v[i])) {
        /* JIT code: the whole page, where the compiler put more code of its own. */
        *ret_rule = utable_rule_frame_ptr();
        *ret_key = utable_page_key(addr);
        return true;
    }
    /* The last frame of a stack that ended without error, yet without a rule: the
     * dynamic loader's entry code (no CFI), where unwinder_unwind() ends stacks of
     * constructors run by _dl_init, or a fiber's entry trampoline
     * (unwinder__entry_return()). A walk ends there too. */
    if (seg && k + 1 == p->n_lookups &&
        (p->ended_at_entry || unwinder__is_loader_path(p->maps.v[i].path))) {
        *ret_rule = utable_rule_make(false, 0, false, 0, true);
        return true;
    }
    return false;
}

/* Offers the lookup addresses of the stack just unwound to the unwind table: each one
 * not offered before under the current maps gets its rule from the CFI of its file (or
 * the frame-pointer rule, for code without CFI), and the rule is published when there
 * is one. */
void unwinder__table_publish(struct unwinder_process *p)
{
    for (size_t k = 0; k < p->n_lookups; k++) {
        uint64_t addr = p->lookups[k];
        /* Such addresses would be taken for page keys (utable.h). */
        if (addr >= UTABLE_PAGE_BIT)
            continue;
        struct known_slot *ks = &p->known[((addr * 0x9e3779b97f4a7c15ull) >> 40) % KNOWN_SLOTS];
        if (ks->addr == addr && ks->gen == p->known_gen)
            continue;
        *ks = (struct known_slot){.addr = addr, .gen = p->known_gen};
        ssize_t i = unwinder__maps_find(&p->maps, addr);
        const struct unwinder__elf *e = i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC)
                                            ? unwinder__pmap_elf(p, (size_t)i)
                                            : NULL;
        uint64_t rule, key;
        if (!lookup_rule(p, k, i, e, &rule, &key)) {
            p->tstats.no_rule++;
            continue;
        }
        utable_insert(&p->table, key, rule);
        p->tstats.published++;
        if (rule & UTABLE_RULE_FRAME_PTR)
            p->tstats.frame_ptr++;
    }
}
