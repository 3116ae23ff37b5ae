/* shmem_ring/ring.c: creating, mapping and unmapping rings; statistics. Called once per
 * client on both sides (the client calls ring_map() during its handshake, from inside a
 * malloc hook with its reentrancy guard set, or from its session thread, which must not
 * touch errno: ring_map() and ring_unmap() use raw system calls): no allocation, no
 * stdio. */
#include "shmem_ring/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sys.h"
#include "shmem_ring/ring_layout.h"

/* Source of struct ring.map_id. */
static _Atomic uint64_t ring_map_ids;

/* The seals ring__memfd_new() puts on every file it makes. */
#define RING_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

bool ring__sealed(int fd)
{
    long seals = hp_sys2(SYS_fcntl, fd, F_GET_SEALS);
    return seals >= 0 && (seals & RING_SEALS) == RING_SEALS;
}

static bool ring_size_valid(uint64_t n)
{
    return n >= RING_MIN_SIZE && n <= RING_MAX_SIZE && (n & (n - 1)) == 0;
}

int ring__memfd_new(const char *name, size_t len, size_t hdr_len,
                    void (*init)(void *hdr, void *arg), void *arg, int *ret_fd)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    int r;
    if (ftruncate(fd, (off_t)len) < 0) {
        r = -errno;
        goto fail;
    }
    void *p = mmap(NULL, hdr_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto fail;
    }
    init(p, arg);
    (void)munmap(p, hdr_len);
    /* A peer shrinking the file would make every access past the new end SIGBUS. */
    if (fcntl(fd, F_ADD_SEALS, RING_SEALS) < 0) {
        r = -errno;
        goto fail;
    }
    *ret_fd = fd;
    return 0;

fail:
    (void)close(fd);
    return r;
}

static void ring_init_header(void *hdr, void *arg)
{
    struct ring_shared *h = hdr;
    h->magic = RING_HEADER_MAGIC;
    h->data_size = *(const size_t *)arg;
}

int ring_create(size_t data_size_bytes, int *ret_fd)
{
    if (!ring_size_valid(data_size_bytes))
        return -EINVAL;
    return ring__memfd_new("heapprof-ring", RING_HEADER_SIZE + data_size_bytes, RING_HEADER_SIZE,
                           ring_init_header, &data_size_bytes, ret_fd);
}

/* Checks that @fd holds a ring either role may map; its data size in *@ret_size. Returns
 * 0, -EBADMSG (not a ring's size), -EPERM (not sealed as ring_create() seals: the writer,
 * in the program, needs that as much as the reader) or -errno. */
static int ring_check_fd(int fd, uint64_t *ret_size)
{
    struct stat st;
    long e = hp_sys2(SYS_fstat, fd, (long)&st);
    if (e < 0)
        return (int)e;
    if (st.st_size < (off_t)RING_HEADER_SIZE)
        return -EBADMSG;
    uint64_t n = (uint64_t)st.st_size - RING_HEADER_SIZE;
    if (!ring_size_valid(n))
        return -EBADMSG;
    if (!ring__sealed(fd))
        return -EPERM;
    *ret_size = n;
    return 0;
}

/* Maps the private page, the shared header and the @n data bytes of @fd twice in a row
 * (ring_layout.h) into one reservation of @map_len bytes. Returns 0 with its base, or
 * -errno. */
static int ring_map_views(int fd, uint64_t n, int prot_data, size_t map_len, uint8_t **ret_base)
{
    uint8_t *base =
        hp_sys_mmap(NULL, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_sys_failed((long)base))
        return (int)(long)base;
    void *m[4] = {
        hp_sys_mmap(base, RING_PRIVATE_SIZE, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
        hp_sys_mmap(base + RING_PRIVATE_SIZE, RING_HEADER_SIZE, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED, fd, 0),
        hp_sys_mmap(base + RING_PRIVATE_SIZE + RING_HEADER_SIZE, n, prot_data,
                    MAP_SHARED | MAP_FIXED, fd, RING_HEADER_SIZE),
        hp_sys_mmap(base + RING_PRIVATE_SIZE + RING_HEADER_SIZE + n, n, prot_data,
                    MAP_SHARED | MAP_FIXED, fd, RING_HEADER_SIZE),
    };
    for (int i = 0; i < 4; i++) {
        if (hp_sys_failed((long)m[i])) {
            (void)hp_sys_munmap(base, map_len);
            return (int)(long)m[i];
        }
    }

    /* Fork safety (see ring_layout.h). Failing kernels (before 4.14 for WIPEONFORK) leave
     * the check to the client's own fork handling. */
#ifdef MADV_WIPEONFORK
    (void)hp_sys3(SYS_madvise, (long)base, RING_PRIVATE_SIZE, MADV_WIPEONFORK);
#endif
    (void)hp_sys3(SYS_madvise, (long)(base + RING_PRIVATE_SIZE),
                  (long)(map_len - RING_PRIVATE_SIZE), MADV_DONTFORK);
    *ret_base = base;
    return 0;
}

/* The private state of a ring of @n data bytes mapped at @base, in its first page. */
static struct ring *ring_init_private(uint8_t *base, size_t map_len, uint64_t n,
                                      enum ring_role role)
{
    struct ring *ring = (struct ring *)base;
    ring->hdr = (struct ring_shared *)(base + RING_PRIVATE_SIZE);
    ring->data = base + RING_PRIVATE_SIZE + RING_HEADER_SIZE;
    ring->size = n;
    ring->mask = n - 1;
    ring->map_base = base;
    ring->map_len = map_len;
    ring->role = role;
    ring->map_id = atomic_fetch_add_explicit(&ring_map_ids, 1, memory_order_relaxed) + 1;
    atomic_init(&ring->blocking, false);
    atomic_init(&ring->block_timeout_us, 0);
    ring->stall_pos = 0;
    ring->stall_since_ns = 0;
    ring->stall_timeout_ns = (uint64_t)RING_DEFAULT_STALL_TIMEOUT_US * 1000u;
    return ring;
}

int ring_map(int fd, enum ring_role role, ring_t **ret)
{
    uint64_t n = 0;
    int prot_data = role == RING_ROLE_WRITER ? PROT_READ | PROT_WRITE : PROT_READ;
    uint8_t *base = NULL;

    if (role != RING_ROLE_READER && role != RING_ROLE_WRITER)
        return -EINVAL;
    int r = ring_check_fd(fd, &n);
    if (r < 0)
        return r;
    size_t map_len = RING_PRIVATE_SIZE + RING_HEADER_SIZE + 2 * n;
    r = ring_map_views(fd, n, prot_data, map_len, &base);
    if (r < 0)
        return r;
    struct ring *ring = ring_init_private(base, map_len, n, role);

    /* Copy the header fields once; the peer may change them at any time. */
    uint64_t magic = ((volatile struct ring_shared *)ring->hdr)->magic;
    uint64_t data_size = ((volatile struct ring_shared *)ring->hdr)->data_size;
    if (magic != RING_HEADER_MAGIC || data_size != n) {
        (void)hp_sys_munmap(base, map_len);
        return -EBADMSG;
    }
    ring->read_pos = atomic_load_explicit(&ring->hdr->read_pos, memory_order_acquire);
    ring->seen_write_pos = ring->read_pos;
    ring->published_read_pos = ring->read_pos;
    *ret = ring;
    return 0;
}

ring_t *ring_unmap(ring_t *r)
{
    /* In a forked child the private page reads as zeros and nothing else is mapped. */
    if (r && r->map_base)
        (void)hp_sys_munmap(r->map_base, r->map_len);
    return NULL;
}

void ring_get_stats(ring_t *r, struct ring_stats *ret)
{
    struct ring_shared *h = r->hdr;

    memset(ret, 0, sizeof(*ret));
    if (!h)
        return; /* forked child */
    ret->records_read = r->records_read;
    ret->bytes_read = r->bytes_read;
    ret->records_dropped = atomic_load_explicit(&h->stats.records_dropped, memory_order_relaxed);
    ret->reserve_failures = atomic_load_explicit(&h->stats.reserve_failures, memory_order_relaxed);
    ret->client_spinlock_blocked_us =
        atomic_load_explicit(&h->stats.client_spinlock_blocked_us, memory_order_relaxed);
    ret->max_fill_bytes = atomic_load_explicit(&h->stats.max_fill_bytes, memory_order_relaxed);
    ret->frees_lost = atomic_load_explicit(&h->stats.frees_lost, memory_order_relaxed);
    ret->block_timeouts = atomic_load_explicit(&h->stats.block_timeouts, memory_order_relaxed);
    ret->block_resumes = atomic_load_explicit(&h->block_resumes, memory_order_relaxed);
    ret->block_given_up = atomic_load_explicit(&h->block_given_up, memory_order_relaxed);
    ret->size_bytes = r->size;
    ret->records_skipped = r->records_skipped;
    ret->freeset_full = atomic_load_explicit(&h->stats.freeset_full, memory_order_relaxed);
    ret->unseen_slots = atomic_load_explicit(&h->stats.unseen_slots, memory_order_relaxed);
}
