/* shmem_ring/ring.c: creating, mapping and unmapping rings; statistics. Called once per
 * client on both sides (the client calls ring_map() during its handshake, from inside a
 * malloc hook with its reentrancy guard set, or from its session thread, which must not
 * touch errno: ring_map() and ring_unmap() use raw system calls): no allocation, no
 * stdio. */
#include "shmem_ring/ring.h"

#include <cpuid.h>
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

struct ring_geometry {
    uint64_t size;
    uint32_t lanes;
};

static void ring_init_header(void *hdr, void *arg)
{
    const struct ring_geometry *g = arg;
    struct ring_shared *h = hdr;
    h->magic = RING_HEADER_MAGIC;
    h->data_size = g->size;
    h->lanes = g->lanes;
}

/* @lanes lanes of @n bytes in all: a power of two up to RING_MAX_LANES, each lane at
 * least RING_MIN_LANE_SIZE. */
bool ring_lanes_valid(uint64_t n, uint32_t lanes)
{
    return lanes >= 1 && lanes <= RING_MAX_LANES && (lanes & (lanes - 1)) == 0 &&
           n / lanes >= RING_MIN_LANE_SIZE;
}

int ring_create_lanes(size_t data_size_bytes, unsigned lanes, int *ret_fd)
{
    if (!ring_size_valid(data_size_bytes) || !ring_lanes_valid(data_size_bytes, lanes))
        return -EINVAL;
    struct ring_geometry g = {.size = data_size_bytes, .lanes = lanes};
    return ring__memfd_new("heapprof-ring", RING_HEADER_SIZE + data_size_bytes, RING_HEADER_SIZE,
                           ring_init_header, &g, ret_fd);
}

/* True when the kernel keeps time with the TSC: it then checked that the CPUs' counters
 * agree, which the order of records across lanes rests on. */
bool ring__tsc_is_clock(void)
{
    char buf[32] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                  O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    (void)close(fd);
    return n >= 3 && memcmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == 0);
}

bool ring__has_cas16(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_CMPXCHG16B);
}

unsigned ring_lanes_for(size_t data_size_bytes, size_t max_record_bytes)
{
#if defined(__x86_64__)
    if (!ring__tsc_is_clock() || !ring__has_cas16())
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned lanes = 1;
    while (lanes * 2 <= RING_MAX_LANES && (long)lanes * 2 <= cpus)
        lanes *= 2;
    while (lanes > 1 && !ring_lanes_valid(data_size_bytes, lanes))
        lanes /= 2;
    while (lanes > 1) {
        uint64_t lane = data_size_bytes / lanes;
        if (lane - (lane >> RING_URGENT_RESERVE_SHIFT) >= ring__record_total(max_record_bytes))
            break;
        lanes /= 2;
    }
    return lanes;
#else
    (void)data_size_bytes;
    (void)max_record_bytes;
    return 1;
#endif
}

int ring_create(size_t data_size_bytes, int *ret_fd)
{
    return ring_create_lanes(data_size_bytes, 1, ret_fd);
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

/* Maps the private page, the shared header and each of the @lanes lanes of the @n data
 * bytes of @fd twice in a row (ring_layout.h) into one reservation of @map_len bytes.
 * Returns 0 with its base, or -errno. */
static int ring_map_views(int fd, uint64_t n, uint32_t lanes, int prot_data, size_t map_len,
                          uint8_t **ret_base)
{
    uint8_t *base =
        hp_sys_mmap(NULL, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_sys_failed((long)base))
        return (int)(long)base;
    long m = (long)hp_sys_mmap(base, RING_PRIVATE_SIZE, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (!hp_sys_failed(m))
        m = (long)hp_sys_mmap(base + RING_PRIVATE_SIZE, RING_HEADER_SIZE, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_FIXED, fd, 0);
    uint64_t lane_size = n / lanes;
    uint8_t *at = base + RING_PRIVATE_SIZE + RING_HEADER_SIZE;
    for (uint32_t i = 0; i < 2 * lanes && !hp_sys_failed(m); i++, at += lane_size)
        m = (long)hp_sys_mmap(at, lane_size, prot_data, MAP_SHARED | MAP_FIXED, fd,
                              (off_t)(RING_HEADER_SIZE + (i / 2) * lane_size));
    if (hp_sys_failed(m)) {
        (void)hp_sys_munmap(base, map_len);
        return (int)m;
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

/* The private state of a ring of @n data bytes in @lanes lanes mapped at @base, in its
 * first page. */
static struct ring *ring_init_private(uint8_t *base, size_t map_len, uint64_t n, uint32_t lanes,
                                      enum ring_role role)
{
    struct ring *ring = (struct ring *)base;
    ring->hdr = (struct ring_shared *)(base + RING_PRIVATE_SIZE);
    ring->size = n;
    ring->lanes = lanes;
    ring->lane_size = n / lanes;
    ring->mask = ring->lane_size - 1;
    for (uint32_t i = 0; i < lanes; i++) {
        struct ring_lane *l = &ring->lane[i];
        l->word = i == 0 ? &ring->hdr->write_pos : &ring->hdr->lane_ctl[i - 1].write_pos;
        l->shared_read_pos = i == 0 ? &ring->hdr->read_pos : &ring->hdr->lane_ctl[i - 1].read_pos;
        l->data = base + RING_PRIVATE_SIZE + RING_HEADER_SIZE + 2 * i * ring->lane_size;
    }
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
    /* The geometry first, from a look at the header alone; copied once: the peer may
     * change the header at any time. */
    size_t map_len = RING_PRIVATE_SIZE + RING_HEADER_SIZE + 2 * n;
    const volatile struct ring_shared *vh =
        hp_sys_mmap(NULL, RING_HEADER_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (hp_sys_failed((long)vh))
        return (int)(long)vh;
    uint64_t magic = vh->magic, data_size = vh->data_size;
    uint32_t lanes = vh->lanes ? vh->lanes : 1;
    (void)hp_sys_munmap((void *)(uintptr_t)vh, RING_HEADER_SIZE);
    if (magic != RING_HEADER_MAGIC || data_size != n || !ring_lanes_valid(n, lanes))
        return -EBADMSG;
    /* The service made it on this machine: several lanes only where the CPU can take
     * them. */
    bool cas16 = ring__has_cas16();
    if (lanes > 1 && !cas16)
        return -EOPNOTSUPP;
    r = ring_map_views(fd, n, lanes, prot_data, map_len, &base);
    if (r < 0)
        return r;
    struct ring *ring = ring_init_private(base, map_len, n, lanes, role);
    ring->cas16 = cas16;
    for (uint32_t i = 0; i < lanes; i++) {
        struct ring_lane *l = &ring->lane[i];
        l->read_pos = atomic_load_explicit(l->shared_read_pos, memory_order_acquire);
        l->seen_write_pos = l->published_read_pos = l->read_pos;
        l->last_stamp = l->horizon = 0;
        l->head_ready = false;
    }
    ring->frontier = 0;
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
