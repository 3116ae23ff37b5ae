/* shmem_ring/utable.c: creating and mapping unwind tables, and the writer side. See
 * utable.h. utable_map() runs in the client during its handshake (inside a malloc hook
 * with the reentrancy guard set, or in its session thread, which must not touch errno:
 * utable_map() and utable_unmap() use raw system calls): no allocation, no stdio. */
#include "shmem_ring/utable.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sys.h"
#include "shmem_ring/ring_layout.h"

#define UTABLE_GEN_MAX 0xffffu

static bool utable_slots_valid(uint64_t n)
{
    return n >= UTABLE_MIN_SLOTS && n <= UTABLE_MAX_SLOTS && (n & (n - 1)) == 0;
}

static size_t utable_bytes(uint64_t n_slots)
{
    return sizeof(struct utable_header) + (size_t)n_slots * sizeof(struct utable_slot);
}

static void utable_init_header(void *hdr, void *arg)
{
    struct utable_header *h = hdr;
    h->magic = UTABLE_MAGIC;
    h->n_slots = *(const size_t *)arg;
    atomic_store_explicit(&h->gen, 1, memory_order_relaxed);
}

int utable_create(size_t n_slots, int *ret_fd)
{
    if (!utable_slots_valid(n_slots))
        return -EINVAL;
    return ring__memfd_new("heapprof-utable", utable_bytes(n_slots), sizeof(struct utable_header),
                           utable_init_header, &n_slots, ret_fd);
}

int utable_map(int fd, bool writable, struct utable *ret)
{
    struct stat st;
    long e = hp_sys2(SYS_fstat, fd, (long)&st);
    if (e < 0)
        return (int)e;
    if (st.st_size < (off_t)sizeof(struct utable_header))
        return -EBADMSG;
    uint64_t n = ((uint64_t)st.st_size - sizeof(struct utable_header)) / sizeof(struct utable_slot);
    if (!utable_slots_valid(n) || utable_bytes(n) != (uint64_t)st.st_size)
        return -EBADMSG;
    /* Either side maps a file its peer can write to: it must not shrink under us (the
     * client reads the table inside malloc). */
    if (!ring__sealed(fd))
        return -EPERM;
    size_t len = utable_bytes(n);
    void *p =
        hp_sys_mmap(NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (hp_sys_failed((long)p))
        return (int)(long)p;
    struct utable_header *h = p;
    if (h->magic != UTABLE_MAGIC || h->n_slots != n) {
        (void)hp_sys_munmap(p, len);
        return -EBADMSG;
    }
    *ret = (struct utable){
        .hdr = h,
        .slots = (struct utable_slot *)(h + 1),
        .mask = n - 1,
        .map_len = len,
        .gen = atomic_load_explicit(&h->gen, memory_order_relaxed) & UTABLE_GEN_MAX,
    };
    if (ret->gen == 0)
        ret->gen = 1;
    return 0;
}

void utable_unmap(struct utable *t)
{
    if (t->hdr)
        (void)hp_sys_munmap(t->hdr, t->map_len);
    *t = (struct utable){0};
}

void utable_insert(struct utable *t, uint64_t addr, uint64_t rule)
{
    if (addr > UTABLE_ADDR_MASK)
        return;
    uint64_t want = addr | t->gen << UTABLE_ADDR_BITS;
    uint64_t home = (addr * 0x9e3779b97f4a7c15ull) >> 32;
    struct utable_slot *victim = NULL;
    for (unsigned n = 0; n < UTABLE_PROBES; n++) {
        struct utable_slot *s = &t->slots[(home + n) & t->mask];
        uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
        if (k == want) {
            if (atomic_load_explicit(&s->rule, memory_order_relaxed) == rule)
                return;
            victim = s;
            break;
        }
        /* Empty, or left from an older generation: free for us. */
        if (k == 0 || k >> UTABLE_ADDR_BITS != t->gen) {
            victim = s;
            break;
        }
    }
    /* A full run: a slot chosen by the address, so that two addresses competing for
     * one run mostly take different slots. */
    if (!victim)
        victim = &t->slots[(home + (want >> 7) % UTABLE_PROBES) & t->mask];
    uint64_t seq = atomic_load_explicit(&victim->seq, memory_order_relaxed);
    atomic_store_explicit(&victim->seq, seq + 1, memory_order_relaxed);
    /* Release keeps the odd sequence before each store (no fence: ThreadSanitizer does
     * not model fences): a reader that sees one of them sees the odd sequence (or a
     * later one) on its second look. */
    atomic_store_explicit(&victim->rule, rule, memory_order_release);
    atomic_store_explicit(&victim->key, want, memory_order_release);
    /* Release pairs with the acquire load of the sequence in utable_lookup(). */
    atomic_store_explicit(&victim->seq, seq + 2, memory_order_release);
}

void utable_flush(struct utable *t)
{
    uint64_t g = t->gen + 1;
    if (g > UTABLE_GEN_MAX) {
        /* The generations wrap: clear every key first, so that none of a generation long
         * gone matches again. Readers see generation 0 meanwhile and miss. */
        atomic_store_explicit(&t->hdr->gen, 0, memory_order_release);
        for (uint64_t i = 0; i <= t->mask; i++)
            atomic_store_explicit(&t->slots[i].key, 0, memory_order_relaxed);
        g = 1;
    }
    t->gen = g;
    /* Release: the cleared keys are visible before the new generation. */
    atomic_store_explicit(&t->hdr->gen, g, memory_order_release);
}
