/* tests/programs/hostile_client.c: a client of the service that is not preloaded: it
 * speaks the handshake itself and then misbehaves, to prove the service survives it.
 *   hostile_client SOCKET MODE [SEED [COUNT]]
 * MODE:
 *   random      valid handshake, then records of random types, lengths and bytes
 *   truncated   a WIRE_ALLOC shorter than struct wire_alloc
 *   oversized   a WIRE_ALLOC whose stack_len is far larger than the record
 *   stacklen    a WIRE_ALLOC whose stack fits the record but exceeds max_stack_bytes
 *   badtype     a well-framed record of an unknown type
 *   header      raw writes into the shared ring: a published record header whose
 *               length points outside the data area
 *   writepos    raw writes: write_pos far beyond the data area
 *   pidlie      the hello names another pid
 *   wrongfds    /dev/null and another process's /proc/PID/maps instead of our own files
 *   halfhello   three connections each sending half a hello, then sleeping
 *   flood       valid tiny records (frees and empty-stack allocations) as fast as
 *               possible for 1.5 s ("ready" is printed before it starts)
 *   unpublished reserves a record and never publishes it
 *   hashflood   COUNT (default 200000) allocation records, each waiting for room in the
 *               ring, at addresses unhash(i << 32): under the unkeyed splitmix64
 *               finalizer every one of them hashes to slot 0 of any table smaller than
 *               2^32, as an attacker would aim at the service's live-allocation table
 *               ("ready" is printed before it starts; prints the time it took)
 *   randflood   the same with random addresses, the baseline of hashflood
 * Prints "ready" once the misbehaviour is in place, waits until the service closes the
 * connection (at most 6 s) and exits 0; exit 2 on a usage error, 3 when the handshake
 * could not even be attempted. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/ring_layout.h"
#include "shmem_ring/wire.h"

static uint64_t rng_state;
static unsigned long g_count = 200000; /* records of hashflood and randflood */

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int connect_to(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -1;
    strcpy(sa.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(sock);
        return -1;
    }
    return sock;
}

/* Waits until the service closes @sock, at most @ms. */
static void wait_closed(int sock, int ms)
{
    int64_t end = now_ms() + ms;
    for (;;) {
        int64_t left = end - now_ms();
        if (left <= 0)
            return;
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        if (poll(&pf, 1, (int)left) <= 0)
            continue;
        char buf[64];
        ssize_t n = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return;
    }
}

/* Sends a hello with @pid and fds @fds; returns the config status and the ring fd. */
static int handshake(int sock, int32_t pid, const int fds[2], struct wire_client_config *cfg,
                     int *ring_fd)
{
    struct wire_hello h = {.magic = WIRE_HELLO_MAGIC,
                           .features = WIRE_FEATURE_REGS_X86_64,
                           .pid = pid,
                           .reason = WIRE_REASON_STARTUP};
    int r = hp_send_fds(sock, &h, sizeof(h), fds, 2);
    if (r < 0)
        return r;
    size_t nfds = 0;
    *ring_fd = -1;
    r = hp_recv_fds(sock, cfg, sizeof(*cfg), ring_fd, 1, &nfds);
    if (r < 0)
        return r;
    if (nfds == 0)
        *ring_fd = -1;
    return 0;
}

static void poke(int sock)
{
    char c = 0;
    (void)!send(sock, &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static int write_record(ring_t *ring, uint16_t type, const void *data, size_t len)
{
    struct ring_wspan w;
    int r = ring_try_begin_write(ring, type, len, &w);
    if (r < 0)
        return r;
    memcpy(w.data, data, len);
    (void)ring_end_write(ring, &w);
    return 0;
}

static void fill_alloc(struct wire_alloc *a, uint64_t seq)
{
    memset(a, 0, sizeof(*a));
    a->seq = seq;
    a->addr = 0x1000 + seq * 16;
    a->size = 16;
    a->sample_size = 16;
    a->tid = (uint32_t)getpid();
}

/* The multiplicative inverse of odd @c modulo 2^64 (Newton's iteration doubles the
 * correct low bits each step). */
static uint64_t inverse(uint64_t c)
{
    uint64_t x = c;
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

/* The inverse of splitmix64's finalizer (the service's hash before it was keyed): each
 * xor-shift and multiply undone in reverse order. */
static uint64_t unhash(uint64_t y)
{
    y ^= y >> 31 ^ y >> 62;
    y *= inverse(0x94d049bb133111ebull);
    y ^= y >> 27 ^ y >> 54;
    y *= inverse(0xbf58476d1ce4e5b9ull);
    y ^= y >> 30 ^ y >> 60;
    return y;
}

/* hashflood / randflood: g_count allocations, every one waiting for room (none dropped),
 * so the service has all of them to process. */
static void flood_addresses(ring_t *ring, int sock, bool crafted)
{
    ring_set_blocking(ring, true, 1000000);
    int64_t t0 = now_ms();
    struct wire_alloc a;
    unsigned long written = 0;
    for (unsigned long i = 0; i < g_count; i++) {
        fill_alloc(&a, i + 1);
        a.addr = crafted ? unhash((uint64_t)(i + 1) << 32) : rnd() & ~15ull;
        int r;
        while ((r = write_record(ring, WIRE_ALLOC, &a, sizeof(a))) == -EAGAIN)
            poke(sock);
        if (r < 0)
            break;
        written++;
        if (i % 256 == 0)
            poke(sock);
    }
    fprintf(stderr, "hostile_client: %s: %lu records written in %lld ms\n",
            crafted ? "hashflood" : "randflood", written, (long long)(now_ms() - t0));
}

/* Raw view of the ring: header page then data area. */
static struct ring_shared *map_raw(int fd, uint8_t **data, uint64_t *size)
{
    off_t len = lseek(fd, 0, SEEK_END);
    if (len <= RING_HEADER_SIZE)
        return NULL;
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    *data = (uint8_t *)p + RING_HEADER_SIZE;
    *size = (uint64_t)len - RING_HEADER_SIZE;
    return p;
}

static int misbehave(const char *mode, int sock, int ring_fd, const struct wire_client_config *cfg)
{
    ring_t *ring = NULL;
    if (ring_map(ring_fd, RING_ROLE_WRITER, &ring) < 0)
        return 3;
    static uint8_t buf[RING_MAX_PAYLOAD];
    struct wire_alloc a;
    if (!strcmp(mode, "random")) {
        for (int i = 0; i < 2000; i++) {
            size_t len = 1 + rnd() % 600;
            for (size_t k = 0; k < len; k++)
                buf[k] = (uint8_t)rnd();
            uint16_t type = (uint16_t)(1 + rnd() % 3);
            (void)write_record(ring, type, buf, len);
        }
    } else if (!strcmp(mode, "truncated")) {
        fill_alloc(&a, 1);
        (void)write_record(ring, WIRE_ALLOC, &a, 100);
    } else if (!strcmp(mode, "oversized")) {
        fill_alloc(&a, 1);
        a.stack_len = 0xfffffff0u;
        memcpy(buf, &a, sizeof(a));
        (void)write_record(ring, WIRE_ALLOC, buf, sizeof(a) + 64);
    } else if (!strcmp(mode, "stacklen")) {
        fill_alloc(&a, 1);
        a.stack_len = (uint32_t)cfg->max_stack_bytes + 8;
        a.stack_ptr = 0x7fff0000;
        memcpy(buf, &a, sizeof(a));
        memset(buf + sizeof(a), 0x5a, a.stack_len);
        (void)write_record(ring, WIRE_ALLOC, buf, sizeof(a) + a.stack_len);
    } else if (!strcmp(mode, "badtype")) {
        fill_alloc(&a, 1);
        (void)write_record(ring, 9, &a, sizeof(a));
    } else if (!strcmp(mode, "header") || !strcmp(mode, "writepos")) {
        uint8_t *data;
        uint64_t size;
        struct ring_shared *hdr = map_raw(ring_fd, &data, &size);
        if (!hdr)
            return 3;
        uint64_t pos = atomic_load(&hdr->write_pos);
        if (!strcmp(mode, "header")) {
            struct ring_rec *rec = (struct ring_rec *)(data + (pos & (size - 1)));
            rec->len_total = 0x7ffffff8u;
            rec->type = WIRE_ALLOC;
            rec->flags = 0;
            atomic_store(&rec->commit_tag, pos ^ RING_TAG_MAGIC);
            atomic_store(&hdr->write_pos, pos + 4096);
        } else {
            atomic_store(&hdr->write_pos, pos + (size << 4) + 8);
        }
    } else if (!strcmp(mode, "flood")) {
        /* The other clients run while this one floods. */
        printf("ready\n");
        fflush(stdout);
        int64_t end = now_ms() + 1500;
        uint64_t seq = 0, written = 0;
        struct wire_free f = {0};
        while (now_ms() < end) {
            for (int k = 0; k < 1024; k++, seq++) {
                if (seq % 2) {
                    f.seq = seq;
                    f.addr = 0x1000 + seq * 16;
                    written += write_record(ring, WIRE_FREE, &f, sizeof(f)) == 0;
                } else {
                    fill_alloc(&a, seq);
                    written += write_record(ring, WIRE_ALLOC, &a, sizeof(a)) == 0;
                }
            }
            poke(sock);
        }
        fprintf(stderr, "hostile_client: flood: %llu records attempted, %llu written in 1.5 s\n",
                (unsigned long long)seq, (unsigned long long)written);
    } else if (!strcmp(mode, "hashflood") || !strcmp(mode, "randflood")) {
        printf("ready\n");
        fflush(stdout);
        flood_addresses(ring, sock, mode[0] == 'h');
        /* Leave at once: the service processes what is in the ring and ends us. */
        ring_unmap(ring);
        return 0;
    } else if (!strcmp(mode, "unpublished")) {
        struct ring_wspan w;
        if (ring_try_begin_write(ring, WIRE_FREE, sizeof(struct wire_free), &w) < 0)
            return 3;
        /* never published */
    } else {
        return 2;
    }
    poke(sock);
    if (strcmp(mode, "flood") != 0) {
        printf("ready\n");
        fflush(stdout);
    }
    wait_closed(sock, 6000);
    ring_unmap(ring);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *path = argv[1], *mode = argv[2];
    rng_state = (argc > 3 ? strtoull(argv[3], NULL, 0) : 1) * 2654435761u + 1;
    if (argc > 4)
        g_count = strtoul(argv[4], NULL, 0);

    if (!strcmp(mode, "halfhello")) {
        int socks[3];
        struct wire_hello h = {.magic = WIRE_HELLO_MAGIC, .pid = getpid()};
        for (int i = 0; i < 3; i++) {
            socks[i] = connect_to(path);
            if (socks[i] < 0)
                return 3;
            (void)!send(socks[i], &h, sizeof(h) / 2, MSG_NOSIGNAL);
        }
        printf("ready\n");
        fflush(stdout);
        for (int i = 0; i < 3; i++)
            wait_closed(socks[i], 6000);
        return 0;
    }

    int sock = connect_to(path);
    if (sock < 0)
        return 3;
    int fds[2] = {open("/proc/self/maps", O_RDONLY | O_CLOEXEC),
                  open("/proc/self/mem", O_RDONLY | O_CLOEXEC)};
    int32_t pid = getpid();
    if (!strcmp(mode, "pidlie")) {
        pid = getppid();
    } else if (!strcmp(mode, "wrongfds")) {
        char other[64];
        snprintf(other, sizeof(other), "/proc/%d/maps", (int)getppid());
        close(fds[0]);
        close(fds[1]);
        fds[0] = open(other, O_RDONLY | O_CLOEXEC);
        fds[1] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (fds[0] < 0 || fds[1] < 0)
        return 3;
    struct wire_client_config cfg;
    int ring_fd = -1;
    int r = handshake(sock, pid, fds, &cfg, &ring_fd);
    if (r < 0 || cfg.magic != WIRE_CONFIG_MAGIC) {
        printf("handshake failed\nready\n");
        return 0;
    }
    if (cfg.status != WIRE_STATUS_PROFILE || ring_fd < 0) {
        printf("not profiled\nready\n");
        return 0;
    }
    return misbehave(mode, sock, ring_fd, &cfg);
}
