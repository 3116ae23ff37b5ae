/* preload/pycodes.h: the code objects a sample found valid, so that the next samples of
 * the same functions need not read them again (preload/python.c).
 *
 * Each Python frame of a sample names its code object, which the client reads (one
 * process_vm_readv(2) for all frames of a sample) to check that it is one before the
 * service is told: a frame being torn down may have let go of it. That read was the
 * largest single cost of a python.objects sample (about a sixth of the program's time in
 * bench app_python_ratio_4k_pymalloc_heap). A frame's code object stays what it was
 * until it is freed, and while the python.objects wrapper is in place (preload/pyheap.h)
 * every free of the object allocator passes through it: there the address is forgotten.
 * So a code object checked once is known good until then, without a read.
 *
 * Direct-mapped, CLIENT_PYCODES_SLOTS words; a word holds the address (its slot and a
 * tag, which together give it back whole) and wire_py_check() of the object. Addresses
 * that are not 16-byte aligned or lie above 2^47 are never kept (pymalloc and malloc
 * align objects to 16 bytes).
 *
 * Who may write: entries are put and forgotten only by threads that hold the GIL (all
 * frees of the object allocator are made under it), so that a put cannot race with the
 * free of the same object; any thread may look up (relaxed atomics, one word per entry).
 * A stale entry (a free the wrapper did not see) can only cost a frame its name: the
 * service compares the check with the object it reads, and the client never reads
 * memory on a hit. Hook-safe: no system call, no allocation.
 *
 * Sent marks: an entry also says in which session the client last told the service what
 * names the object (WIRE_PY_CODE, preload/record.c), as a session epoch of 6 bits
 * (client_pycodes_epoch()); the record goes again only in a session whose epoch the
 * entry does not carry. A session's start also clears every mark, so that an epoch
 * coming round again after 63 sessions finds none; a thread of the session before that
 * marks late marks with that session's epoch. Marks are put by the GIL's holder only.
 *
 * Without the python.objects wrapper (--heaps without it) nothing forgets entries, and
 * samples do not take checks from here (they read them); the table still keeps the sent
 * marks. A freed object whose address another code object with the same check takes
 * (same name and file objects, same first line) then goes without its record: the
 * service names it from the record of the first, which is what its cache keyed by
 * address and check already did.
 */
#ifndef HP_PRELOAD_PYCODES_H
#define HP_PRELOAD_PYCODES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/macros.h"

#pragma GCC visibility push(hidden)

#define CLIENT_PYCODES_LOG2 10
#define CLIENT_PYCODES_SLOTS (1u << CLIENT_PYCODES_LOG2)
/* An entry: 1 << 63 | epoch << 57 | tag << 24 | check (24 bits); 0 is empty. The tag
 * has 33 bits (addresses below 2^47, 14 bits in the slot and alignment). */
#define CLIENT_PYCODES_VALID (1ull << 63)
#define CLIENT_PYCODES_CHECK_BITS 24
#define CLIENT_PYCODES_EPOCH_SHIFT 57
#define CLIENT_PYCODES_EPOCH_MASK (63ull << CLIENT_PYCODES_EPOCH_SHIFT)

struct client_pycodes {
    _Atomic uint64_t slot[CLIENT_PYCODES_SLOTS];
};

/* Where @addr lives and the rest of it; false when it cannot be kept. The slot is the
 * address's low bits mixed with a hash of the tag (objects of one pool are a fixed size
 * apart), so that slot and tag still give the address back. */
static inline bool client_pycodes_key(uint64_t addr, uint32_t *ret_slot, uint64_t *ret_tag)
{
    if ((addr & 15) != 0 || addr >> 47 != 0)
        return false;
    uint64_t key = addr >> 4;
    uint64_t tag = key >> CLIENT_PYCODES_LOG2;
    *ret_slot =
        (uint32_t)((key ^ (tag * 0x9e3779b97f4a7c15ull >> 40)) & (CLIENT_PYCODES_SLOTS - 1));
    *ret_tag = tag;
    return true;
}

/* The entry that says @addr is a code object with check @check. */
static inline uint64_t client_pycodes_entry(uint64_t tag, uint32_t check)
{
    return CLIENT_PYCODES_VALID | tag << CLIENT_PYCODES_CHECK_BITS |
           (check & ((1u << CLIENT_PYCODES_CHECK_BITS) - 1));
}

/* True, with its check in @ret_check, when @addr was put and not forgotten since. */
static inline bool client_pycodes_lookup(const struct client_pycodes *c, uint64_t addr,
                                         uint32_t *ret_check)
{
    uint32_t slot;
    uint64_t tag;
    if (!client_pycodes_key(addr, &slot, &tag))
        return false;
    uint64_t e =
        atomic_load_explicit(&c->slot[slot], memory_order_relaxed) & ~CLIENT_PYCODES_EPOCH_MASK;
    if ((e >> CLIENT_PYCODES_CHECK_BITS) !=
        (client_pycodes_entry(tag, 0) >> CLIENT_PYCODES_CHECK_BITS))
        return false;
    *ret_check = (uint32_t)(e & ((1u << CLIENT_PYCODES_CHECK_BITS) - 1));
    return true;
}

/* The epoch of the session of generation @gen in the sent marks: 1..63. */
static inline uint64_t client_pycodes_epoch(uint64_t gen)
{
    return gen % 63 + 1;
}

/* True when @addr is kept with check @check and marked sent in epoch @epoch. */
static inline bool client_pycodes_sent(const struct client_pycodes *c, uint64_t addr,
                                       uint32_t check, uint64_t epoch)
{
    uint32_t slot;
    uint64_t tag;
    if (!client_pycodes_key(addr, &slot, &tag))
        return false;
    return atomic_load_explicit(&c->slot[slot], memory_order_relaxed) ==
           (client_pycodes_entry(tag, check) | epoch << CLIENT_PYCODES_EPOCH_SHIFT);
}

/* Marks @addr, kept with check @check, as sent in epoch @epoch; nothing when the entry
 * is another now. Caller holds the GIL. */
static inline void client_pycodes_mark_sent(struct client_pycodes *c, uint64_t addr, uint32_t check,
                                            uint64_t epoch)
{
    uint32_t slot;
    uint64_t tag;
    if (!client_pycodes_key(addr, &slot, &tag))
        return;
    uint64_t e = atomic_load_explicit(&c->slot[slot], memory_order_relaxed);
    if ((e & ~CLIENT_PYCODES_EPOCH_MASK) == client_pycodes_entry(tag, check))
        atomic_store_explicit(
            &c->slot[slot], client_pycodes_entry(tag, check) | epoch << CLIENT_PYCODES_EPOCH_SHIFT,
            memory_order_relaxed);
}

/* Clears every sent mark (a session starts). Any thread: one atomic and-not per entry, so
 * that a put or forget at the same time keeps its word whole. */
static inline void client_pycodes_unmark_all(struct client_pycodes *c)
{
    for (uint32_t i = 0; i < CLIENT_PYCODES_SLOTS; i++)
        (void)atomic_fetch_and_explicit(&c->slot[i], ~CLIENT_PYCODES_EPOCH_MASK,
                                        memory_order_relaxed);
}

/* Keeps @addr as a code object with check @check (replacing what shared its slot; the
 * same entry keeps its sent mark). Caller holds the GIL. */
static inline void client_pycodes_put(struct client_pycodes *c, uint64_t addr, uint32_t check)
{
    uint32_t slot;
    uint64_t tag;
    if (!client_pycodes_key(addr, &slot, &tag))
        return;
    uint64_t e = client_pycodes_entry(tag, check);
    if ((atomic_load_explicit(&c->slot[slot], memory_order_relaxed) & ~CLIENT_PYCODES_EPOCH_MASK) !=
        e)
        atomic_store_explicit(&c->slot[slot], e, memory_order_relaxed);
}

/* The block at @addr is freed: no longer kept. Caller holds the GIL. One load on the
 * object allocator's every free. */
static inline void client_pycodes_forget(struct client_pycodes *c, uint64_t addr)
{
    uint32_t slot;
    uint64_t tag;
    if (!client_pycodes_key(addr, &slot, &tag))
        return;
    uint64_t e =
        atomic_load_explicit(&c->slot[slot], memory_order_relaxed) & ~CLIENT_PYCODES_EPOCH_MASK;
    if (HP_UNLIKELY(e != 0 && (e >> CLIENT_PYCODES_CHECK_BITS) ==
                                  (client_pycodes_entry(tag, 0) >> CLIENT_PYCODES_CHECK_BITS)))
        atomic_store_explicit(&c->slot[slot], 0, memory_order_relaxed);
}

/* Forgets everything. Caller holds the GIL (or is the only thread). */
static inline void client_pycodes_clear(struct client_pycodes *c)
{
    for (uint32_t i = 0; i < CLIENT_PYCODES_SLOTS; i++)
        atomic_store_explicit(&c->slot[i], 0, memory_order_relaxed);
}

#pragma GCC visibility pop

#endif
