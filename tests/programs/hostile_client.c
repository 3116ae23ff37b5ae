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
 *   fifo        maps a copy of tests/programs/hostile_lib.c's library (path in
 *               HOSTILE_LIB; CFI only in .debug_frame, so the service unwinds it with
 *               elfutils), has a sample unwound through it, prints "ready", then deletes
 *               the copy and puts FIFOs at its path and at "<path> (deleted)" (how the
 *               maps now name it), maps something new (the service rereads the maps and
 *               makes its elfutils view again) and sends the sample again
 *   truncate    the same library; snapshots through both of its functions, the first sent
 *               and unwound, then "ready", the file truncated to nothing (still mapped
 *               here and by the service) and the second snapshot sent
 *   (fifo and truncate end with a WIRE_SYNC and say on stderr whether the service read
 *   it within 2 s: "service answered" or "service did not answer")
 *   eofwrite    makes 20 000 small mappings, prints "ready", then writes pairs of
 *               WIRE_MAPS_CHANGED and WIRE_ALLOC_PCS (one pc, in main) flat out; after
 *               1 s shuts its socket down (the service sees EOF) and writes on until
 *               COUNT seconds (default 25) have passed since "ready", into the ring
 *               itself once the service detached it (it clears the detached flag)
 *   mapsflood   the same without the hang-up: a connected client writing flat out
 *   memhog      allocation records (WIRE_ALLOC_PCS, each waiting for room) at new
 *               addresses with new stacks (16 pcs anywhere in its own code) as fast as
 *               the service takes them, for COUNT seconds (default 10): everything the
 *               service keeps of a process grows (live allocations, interned frames and
 *               callstacks); "ready" is printed before it starts
 *   memhogfrees the same with the free of every other allocation right after it
 *               (WIRE_FREE): when the guardrail fires, frees are among the records the
 *               service counts instead of reading
 * Prints "ready" once the misbehaviour is in place, waits until the service closes the
 * connection (at most 6 s) and exits 0; exit 2 on a usage error, 3 when the handshake
 * could not even be attempted. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/ring_layout.h"
#include "shmem_ring/wire.h"
#include "tests/programs/unhash.h"
#include "tests/support/regs.h"

static uint64_t rng_state;
static unsigned long g_count = 200000; /* records of hashflood and randflood */
static bool g_count_given;

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

/* eofwrite: a process with many mappings, each maps change forcing a full reread (the
 * old service reread the maps for every pair), which goes on writing after it hung up;
 * a flag the service sets in shared memory does not stop it. */
#define EOF_MAPPINGS 20000
int main(int argc, char **argv);
static int eof_then_write(ring_t *ring, int sock, unsigned long seconds, bool hang_up)
{
    /* Alternate protections: the kernel cannot merge neighbours into one mapping. */
    size_t page = 4096, len = 2 * EOF_MAPPINGS * page;
    uint8_t *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return 3;
    for (size_t i = 0; i < EOF_MAPPINGS; i++)
        if (mprotect(m + 2 * i * page, page, PROT_READ | PROT_WRITE) < 0)
            return 3;
    printf("ready\n");
    fflush(stdout);
    int64_t t0 = now_ms(), hangup = t0 + 1000, end = t0 + (int64_t)seconds * 1000;
    bool hung_up = false;
    uint64_t seq = 0, pairs = 0, after = 0;
    uint8_t buf[sizeof(struct wire_alloc_pcs) + sizeof(uint64_t)];
    struct wire_alloc_head h = {.size = 16, .sample_size = 16, .tid = (uint32_t)getpid()};
    uint64_t pc = (uint64_t)(uintptr_t)&main + 16;
    struct wire_maps_changed mc = {0};
    for (;;) {
        int64_t now = now_ms();
        if (now >= end)
            break;
        if (hang_up && !hung_up && now >= hangup) {
            shutdown(sock, SHUT_RDWR);
            hung_up = true;
        }
        for (int k = 0; k < 256; k++) {
            if (hung_up)
                atomic_store(&ring->hdr->detached, 0u);
            h.unused0 = ++seq; /* ignored by the service */
            h.addr = 0x10000 + seq * 16;
            memcpy(wire_encode_alloc_pcs(buf, &h, 1, 0), &pc, sizeof(pc));
            if (write_record(ring, WIRE_MAPS_CHANGED, &mc, sizeof(mc)) == 0 &&
                write_record(ring, WIRE_ALLOC_PCS, buf, wire_alloc_pcs_len(1)) == 0) {
                pairs++;
                after += hung_up;
            }
        }
        ring_wake_reader(ring);
    }
    fprintf(stderr, "hostile_client: %s: %llu pairs written, %llu after the hang-up\n",
            hang_up ? "eofwrite" : "mapsflood", (unsigned long long)pairs,
            (unsigned long long)after);
    munmap(m, len);
    return 0;
}

/* memhog: the bounds of the executable mapping that holds main. */
static bool own_code(uint64_t *ret_lo, uint64_t *ret_hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return false;
    char line[512];
    uint64_t pc = (uint64_t)(uintptr_t)&main;
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long long lo, hi;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) == 3 && perms[2] == 'x' && pc >= lo &&
            pc < hi) {
            *ret_lo = lo;
            *ret_hi = hi;
            found = true;
        }
    }
    fclose(f);
    return found;
}

static int memhog(ring_t *ring, int sock, unsigned long seconds, bool frees)
{
    uint64_t lo, hi;
    if (!own_code(&lo, &hi))
        return 3;
    ring_set_blocking(ring, true, 1000000);
    printf("ready\n");
    fflush(stdout);
    int64_t end = now_ms() + (int64_t)seconds * 1000;
    uint64_t seq = 0;
    uint64_t pcs[16];
    uint8_t buf[sizeof(struct wire_alloc_pcs) + sizeof(pcs)];
    struct wire_alloc_head h = {.size = 64, .sample_size = 64, .tid = (uint32_t)getpid()};
    while (now_ms() < end) {
        for (int k = 0; k < 256; k++) {
            for (size_t i = 0; i < HP_ARRAY_SIZE(pcs); i++)
                pcs[i] = lo + rnd() % (hi - lo);
            h.unused0 = ++seq; /* ignored by the service */
            h.addr = 0x100000 + seq * 64;
            memcpy(wire_encode_alloc_pcs(buf, &h, HP_ARRAY_SIZE(pcs), 0), pcs, sizeof(pcs));
            int r;
            while ((r = write_record(ring, WIRE_ALLOC_PCS, buf, sizeof(buf))) == -EAGAIN)
                poke(sock);
            struct wire_free f = {.addr = h.addr};
            while (r == 0 && frees && seq % 2 &&
                   (r = write_record(ring, WIRE_FREE, &f, sizeof(f))) == -EAGAIN)
                poke(sock);
            if (r < 0)
                goto out;
        }
        poke(sock);
    }
out:
    fprintf(stderr, "hostile_client: memhog: %llu records written\n", (unsigned long long)seq);
    return 0;
}

static void fill_alloc(struct wire_alloc *a, uint64_t seq)
{
    memset(a, 0, sizeof(*a));
    a->unused0 = seq;
    a->addr = 0x1000 + seq * 16;
    a->size = 16;
    a->sample_size = 16;
    a->tid = (uint32_t)getpid();
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
        a.addr = crafted ? hp_test_unhash((uint64_t)(i + 1) << 32) : rnd() & ~15ull;
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

/* ---- files the service reads (fifo, truncate) ---- */

/* The main thread's stack end (glibc's loader exports it). */
extern void *__libc_stack_end;

#define SNAP_MAX_STACK (64u << 10)

/* A sampled allocation as the preload library would send it: registers at the call and
 * the raw stack from there to the stack's end. */
struct snapshot {
    struct wire_alloc a;
    uint8_t stack[SNAP_MAX_STACK];
};
static struct snapshot g_snap[2];
static uint64_t g_max_stack;

/* Our own stack, redzones of other frames included: not through memcpy, which a
 * sanitizer checks. */
#if defined(__SANITIZE_ADDRESS__)
__attribute__((no_sanitize_address))
#endif
static void
copy_raw(uint8_t *dst, const volatile uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
}

__attribute__((noinline)) static void snap_cb(int k)
{
    struct snapshot *s = &g_snap[k];
    hp_capture_regs(s->a.regs);
    uint64_t sp = s->a.regs[WIRE_REG_RSP];
    uint64_t end = (uint64_t)(uintptr_t)__libc_stack_end;
    uint64_t len = end > sp ? end - sp : 0;
    len = len < g_max_stack ? len : g_max_stack;
    len = len < SNAP_MAX_STACK ? len : SNAP_MAX_STACK;
    copy_raw(s->stack, (const volatile uint8_t *)(uintptr_t)sp, (size_t)len);
    s->a.stack_ptr = sp;
    s->a.stack_len = (uint32_t)len;
    __asm__ volatile("" ::: "memory");
}

static int send_snapshot(ring_t *ring, int sock, int k, uint64_t seq)
{
    static uint8_t buf[sizeof(struct wire_alloc) + SNAP_MAX_STACK];
    struct snapshot *s = &g_snap[k];
    s->a.unused0 = seq;
    s->a.addr = 0x1000 + seq * 16;
    s->a.size = s->a.sample_size = 16;
    s->a.tid = (uint32_t)getpid();
    memcpy(buf, &s->a, sizeof(s->a));
    memcpy(buf + sizeof(s->a), s->stack, s->a.stack_len);
    int r = write_record(ring, WIRE_ALLOC, buf, sizeof(s->a) + s->a.stack_len);
    poke(sock);
    return r;
}

/* A WIRE_SYNC, and whether the service read it within @timeout_ms (so every record
 * before it was handled). */
static bool sync_service(ring_t *ring, int sock, unsigned timeout_ms)
{
    struct ring_wspan w;
    if (ring_try_begin_write(ring, WIRE_SYNC, 0, &w) < 0)
        return false;
    (void)ring_end_write(ring, &w);
    poke(sock);
    return ring_wait_consumed(ring, &w, timeout_ms * 1000u) == 0;
}

static int files_mode(const char *mode, ring_t *ring, int sock,
                      const struct wire_client_config *cfg)
{
    const char *lib = getenv("HOSTILE_LIB");
    char dir[] = "/tmp/heapprof-hostile-XXXXXX";
    if (!lib || !mkdtemp(dir))
        return 3;
    char path[sizeof(dir) + 32];
    snprintf(path, sizeof(path), "%s/libhostile.so", dir);
    int in = open(lib, O_RDONLY | O_CLOEXEC);
    int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (in < 0 || out < 0)
        return 3;
    static char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        if (write(out, buf, (size_t)n) != n)
            return 3;
    close(in);
    close(out);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void (*first)(void (*)(int), int) =
        h ? (void (*)(void (*)(int), int))dlsym(h, "hl_first") : NULL;
    void (*second)(void (*)(int), int) =
        h ? (void (*)(void (*)(int), int))dlsym(h, "hl_second") : NULL;
    if (!first || !second)
        return 3;
    g_max_stack = cfg->max_stack_bytes;
    first(snap_cb, 0);
    second(snap_cb, 0);
    ring_set_blocking(ring, true, 1000000);
    if (send_snapshot(ring, sock, 0, 1) < 0 || !sync_service(ring, sock, 5000))
        return 3;
    printf("ready\n");
    fflush(stdout);
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
    nanosleep(&pause, NULL); /* the healthy client is under way */
    char deleted[sizeof(path) + 16];
    snprintf(deleted, sizeof(deleted), "%s (deleted)", path);
    if (!strcmp(mode, "fifo")) {
        /* The maps now name the mapping "<path> (deleted)": a FIFO goes there (and one at
         * the path itself). */
        if (unlink(path) < 0 || mkfifo(deleted, 0600) < 0 || mkfifo(path, 0600) < 0)
            return 3;
        /* New code mapped: the service rereads the maps and makes its elfutils view again. */
        void *x = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct wire_maps_changed mc = {0};
        if (x == MAP_FAILED || write_record(ring, WIRE_MAPS_CHANGED, &mc, sizeof(mc)) < 0 ||
            send_snapshot(ring, sock, 0, 2) < 0)
            return 3;
    } else {
        /* Still mapped here: nothing of it may run from now on (its pages are gone). */
        if (truncate(path, 0) < 0 || send_snapshot(ring, sock, 1, 2) < 0)
            return 3;
    }
    bool answered = sync_service(ring, sock, 2000);
    fprintf(stderr, "hostile_client: %s: service %s\n", mode,
            answered ? "answered" : "did not answer");
    printf("%s\n", answered ? "service answered" : "service did not answer");
    fflush(stdout);
    unlink(path);
    unlink(deleted);
    rmdir(dir);
    ring_unmap(ring);
    /* Not exit(): the library's destructors live in the pages truncated away. */
    _exit(0);
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
        (void)write_record(ring, 200, &a, sizeof(a)); /* no such type */
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
                    f.unused0 = seq;
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
    } else if (!strcmp(mode, "eofwrite") || !strcmp(mode, "mapsflood")) {
        int r = eof_then_write(ring, sock, g_count_given ? g_count : 25, mode[0] == 'e');
        ring_unmap(ring);
        return r;
    } else if (!strcmp(mode, "memhog") || !strcmp(mode, "memhogfrees")) {
        int r = memhog(ring, sock, g_count_given ? g_count : 10, !strcmp(mode, "memhogfrees"));
        ring_unmap(ring);
        return r;
    } else if (!strcmp(mode, "fifo") || !strcmp(mode, "truncate")) {
        return files_mode(mode, ring, sock, cfg);
    } else if (!strcmp(mode, "idslie")) {
        /* Says its ids changed, with a message that names another process: the service
         * must end the session (no valid credentials), nothing more. */
        fill_alloc(&a, 1);
        (void)write_record(ring, WIRE_ALLOC, &a, sizeof(a));
        struct wire_forked lie = {.magic = WIRE_FORKED_MAGIC, .pid = 1};
        if (send(sock, &lie, sizeof(lie), MSG_NOSIGNAL) != (ssize_t)sizeof(lie))
            return 3;
        ring_note_ids_changed(ring);
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
    if (argc > 4) {
        g_count = strtoul(argv[4], NULL, 0);
        g_count_given = true;
    }

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
