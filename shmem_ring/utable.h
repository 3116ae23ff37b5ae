/* shmem_ring/utable.h: the unwind table a service shares with one client: how to step from
 * a frame to its caller at the code addresses its stacks have shown so far, so that the
 * client can walk its own stack and send the return addresses instead of a stack copy.
 *
 * A memfd the service creates and sends in the handshake; the service maps it writable,
 * the client read-only. One writer (the unwinder thread serving the client), any number
 * of readers (every thread of the client), no locks:
 *
 *     | header (64 bytes) | slot[0] | slot[1] | ... | slot[n - 1] |      n a power of two
 *
 * A slot maps a lookup address (where the frame's CFI row is looked up: the pc of the
 * innermost frame, a return address minus one for the others) to a rule of the simple
 * form most code has on x86_64:
 *
 *     CFA = rsp + off | rbp + off;  return address at CFA - 8;
 *     rbp unchanged | saved at CFA + rbp_off;   or: no caller (the outermost frame)
 *
 * Frames whose CFI is anything else (expressions, signal frames) never get a slot, so a
 * walk that meets them gives up and the client copies the stack as before.
 *
 * Code without CFI that keeps a frame-pointer chain (JIT-compiled code: V8's, and the
 * builtins node embeds in its binary without CFI) gets the frame-pointer rule, flagged
 * UTABLE_RULE_FRAME_PTR (CFA = rbp + 16, rbp saved at CFA - 16), once the service has
 * unwound a stack through it that way without error: per lookup address in a file, and
 * per 4 KiB page (a key made by utable_page_key()) in anonymous executable memory, where
 * the JIT places code the service has not seen yet. A walker looks the page up when the
 * address itself has no slot. User-space addresses lie below 2^47, so page keys (bit 47
 * set) never equal a lookup address.
 *
 * Slots are open addressing (linear probing, UTABLE_PROBES at most). The key word holds
 * the address and, in its top 16 bits, the table's generation: the service bumps the
 * generation to forget every slot at once (the process's maps changed), and a key of an
 * older generation never matches. A slot is replaced under its own sequence word (odd
 * while the writer changes the key and the rule), so a reader never pairs a key with
 * another key's rule, even when the slot went to another address and back while it
 * looked (see utable_lookup()).
 *
 * Trust: the client trusts the service (which can read all its memory anyway) but still
 * checks every address a rule makes it read against the thread's stack. The service
 * reads the shared keys only to choose which slot of a probe run to write (an index it
 * computes and bounds itself), so a client scribbling over its table (it may remap it
 * writable) only spoils its own walks.
 *
 *     service: utable_create(8192, &fd); utable_map(fd, true, &t);
 *              utable_insert(&t, addr, rule);  utable_flush(&t);
 *     client:  utable_map(fd, false, &t);
 *              uint64_t gen = utable_gen(&t), rule;
 *              if (utable_lookup(&t, gen, addr, &rule)) step(rule);
 */
#ifndef HP_SHMEM_RING_UTABLE_H
#define HP_SHMEM_RING_UTABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

#define UTABLE_MAGIC 0x48505554424c3032ull /* "HPUTBL02" */
#define UTABLE_MIN_SLOTS 64u
#define UTABLE_MAX_SLOTS (1u << 20)
#define UTABLE_DEFAULT_SLOTS 8192u
#define UTABLE_PROBES 8u
/* Lookup addresses must fit below the generation bits (x86_64 user space does). */
#define UTABLE_ADDR_BITS 48
#define UTABLE_ADDR_MASK ((UINT64_C(1) << UTABLE_ADDR_BITS) - 1)

/* A rule word: bits 0-31 the CFA offset (int32), bits 32-39 UTABLE_RULE_* flags, bits
 * 48-63 the offset from the CFA of the saved rbp (int16, with UTABLE_RULE_RBP_SAVED). */
#define UTABLE_RULE_CFA_RBP (UINT64_C(1) << 32)   /* CFA = rbp + off (else rsp + off) */
#define UTABLE_RULE_RBP_SAVED (UINT64_C(1) << 33) /* rbp saved at CFA + rbp_off */
#define UTABLE_RULE_OUTERMOST (UINT64_C(1) << 34) /* no caller: the stack ends here */
/* The frame-pointer rule of code without CFI: the walker checks the chain harder
 * (rbp within UTABLE_FRAME_PTR_MAX_FRAME above the frame's stack pointer). */
#define UTABLE_RULE_FRAME_PTR (UINT64_C(1) << 35)
/* Largest frame a frame-pointer step accepts, the bound libunwind puts on its own
 * frame-pointer steps: the walk and the service's unwind of a copy agree (the audit). */
#define UTABLE_FRAME_PTR_MAX_FRAME 0x4000u

/* Page keys: lookup addresses at or above UTABLE_PAGE_BIT are never published. */
#define UTABLE_PAGE_BIT (UINT64_C(1) << 47)
#define UTABLE_PAGE_SHIFT 12

static inline uint64_t utable_rule_make(bool cfa_rbp, int32_t cfa_off, bool rbp_saved,
                                        int16_t rbp_off, bool outermost)
{
    return (uint64_t)(uint32_t)cfa_off | (cfa_rbp ? UTABLE_RULE_CFA_RBP : 0) |
           (rbp_saved ? UTABLE_RULE_RBP_SAVED : 0) | (outermost ? UTABLE_RULE_OUTERMOST : 0) |
           (uint64_t)(uint16_t)rbp_off << 48;
}

static inline int32_t utable_rule_cfa_off(uint64_t rule)
{
    return (int32_t)(uint32_t)rule;
}

static inline int16_t utable_rule_rbp_off(uint64_t rule)
{
    return (int16_t)(uint16_t)(rule >> 48);
}

/* The rule of a frame in code without CFI that keeps the frame-pointer chain: push rbp;
 * mov rbp, rsp at its entry, so the return address is at rbp + 8 and the caller's rbp at
 * rbp. */
static inline uint64_t utable_rule_frame_ptr(void)
{
    return utable_rule_make(true, 16, true, -16, false) | UTABLE_RULE_FRAME_PTR;
}

/* The key of the page holding lookup address @addr (< UTABLE_PAGE_BIT). */
static inline uint64_t utable_page_key(uint64_t addr)
{
    return UTABLE_PAGE_BIT | addr >> UTABLE_PAGE_SHIFT;
}

struct utable_header {
    uint64_t magic;       /* UTABLE_MAGIC */
    uint64_t n_slots;     /* a power of two */
    _Atomic uint64_t gen; /* 1..0xffff; 0 while the service clears the table */
    uint64_t reserved[5];
};
_Static_assert(sizeof(struct utable_header) == 64, "utable_header ABI");

/* 32 bytes, so that a slot never straddles a cache line (the slots start 64 bytes into a
 * page). */
struct utable_slot {
    _Atomic uint64_t seq;  /* even: stable; odd: the writer is changing key and rule */
    _Atomic uint64_t key;  /* addr | gen << 48; 0: empty */
    _Atomic uint64_t rule; /* UTABLE_RULE_* word */
    uint64_t reserved;
};
_Static_assert(sizeof(struct utable_slot) == 32, "utable_slot ABI");

/* A mapping of a table. Caller storage; not thread-safe to map or unmap, the lookups are. */
struct utable {
    struct utable_header *hdr;
    struct utable_slot *slots;
    uint64_t mask;
    size_t map_len;
    /* Writer only (the service): the generation it publishes. */
    uint64_t gen;
};

/* Service: creates a table of @n_slots (a power of two, UTABLE_MIN_SLOTS..
 * UTABLE_MAX_SLOTS; else -EINVAL) in a sealed memfd; returns the fd in @ret_fd. */
int utable_create(size_t n_slots, int *ret_fd) HP_WARN_UNUSED;
/* Maps the table in @fd (borrowed), read-only unless @writable, after checking its size
 * (-EBADMSG), its seals (those of utable_create(), whichever side: -EPERM) and header
 * (-EBADMSG). Hook-safe (no allocation). */
int utable_map(int fd, bool writable, struct utable *ret) HP_WARN_UNUSED;
void utable_unmap(struct utable *t);

/* Writer: publishes @rule for lookup address @addr (< 2^48) in the current generation,
 * replacing the least useful slot of its probe run when every one is taken. */
void utable_insert(struct utable *t, uint64_t addr, uint64_t rule);
/* Writer: forgets every slot (a new generation). */
void utable_flush(struct utable *t);

/* Reader, hook-safe: the generation to look up in (0: the table is being cleared, every
 * lookup misses). Acquire pairs with the release store in utable_flush(). */
static inline uint64_t utable_gen(const struct utable *t)
{
    return atomic_load_explicit(&t->hdr->gen, memory_order_acquire);
}

/* Reader, hook-safe: the rule for @addr in generation @gen, or false. The key is a
 * filter; on a match the slot is read as a seqlock: its sequence, the rule and the key
 * again (each acquire), the sequence again. An even sequence unchanged across
 * the loads means no store of the writer fell between them, so the rule is the one
 * stored with that key (a key and rule of two writes, or of a slot that went to another
 * address and came back, are never paired); else the lookup misses and the walk gives up
 * (the sample copies its stack). */
static inline bool utable_lookup(const struct utable *t, uint64_t gen, uint64_t addr,
                                 uint64_t *ret_rule)
{
    if (HP_UNLIKELY(gen == 0 || addr > UTABLE_ADDR_MASK))
        return false;
    uint64_t want = addr | gen << UTABLE_ADDR_BITS;
    uint64_t i = (addr * 0x9e3779b97f4a7c15ull) >> 32;
    for (unsigned n = 0; n < UTABLE_PROBES; n++, i++) {
        const struct utable_slot *s = &t->slots[i & t->mask];
        uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
        if (k == 0)
            return false;
        if (k != want)
            continue;
        /* Acquire pairs with the release store of the even sequence in utable_insert():
         * the loads below see the writes it closed, or later ones. */
        uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        /* Acquire pairs with the release stores of rule and key in utable_insert(): a
         * load that sees a store of the writer sees the odd sequence stored before it, so
         * the second load of the sequence (kept after them) differs from the first. */
        uint64_t rule = atomic_load_explicit(&s->rule, memory_order_acquire);
        uint64_t key = atomic_load_explicit(&s->key, memory_order_acquire);
        if ((seq & 1) || key != want || atomic_load_explicit(&s->seq, memory_order_relaxed) != seq)
            return false;
        *ret_rule = rule;
        return true;
    }
    return false;
}

#endif
