/* tests/preload/alloc_prog.c: a program with known allocations, run under
 * LD_PRELOAD=libheapprof.so by tests/preload/test_client.c.
 *
 * Prints "allocs=N bytes=B frees=F" on stdout; with the argument "addrs" also one line
 * per allocation ("A addr size") and per free of a live block ("F addr"). Uses write(2)
 * and its own number formatting only, so that it allocates nothing besides what it
 * counts. With "many", it also makes 20000 malloc(100)/free pairs (not listed). With
 * "threads", it only runs 4 threads making 20000 malloc(64)/free pairs each. With
 * "sized", it only frees a malloc(600) with free_sized() and an aligned_alloc(64, 640)
 * with free_aligned_sized() (C23, glibc 2.39; glibc 2.36 has neither, libheapprof.so
 * exports both), listed as above; exit status 9 when they are not there. With
 * "sigfree", it allocates SIG_POOL blocks of 48 bytes (listed), then churns malloc(64)
 * while a SIGALRM handler frees one pool block per signal (every 100 us), until all are
 * freed; the pool frees are listed at the end, then "signals=N" (run it with an
 * async-signal-safe allocator: tests/preload/bump_alloc.c). With "manythreads", see
 * run_manythreads(). With "heaps", it only uses
 * the heap API (preload/include/heapprof.h, weak symbols): see run_heaps(). With
 * "dlfull:LIB:FILE", see run_dlfull().
 */
#define HEAPPROF_WEAK
#include "heapprof.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char out[131072];
static size_t out_len;
static bool show_addrs;
static uint64_t n_allocs, n_bytes, n_frees;

static void put(const char *s)
{
    size_t l = strlen(s);
    if (out_len + l < sizeof(out)) {
        memcpy(out + out_len, s, l);
        out_len += l;
    }
}

static void put_u64(uint64_t v, unsigned base)
{
    char b[24];
    int i = sizeof(b);
    b[--i] = 0;
    do {
        b[--i] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    put(b + i);
}

static void *note_alloc(void *p, size_t size)
{
    if (!p)
        _exit(3);
    n_allocs++;
    n_bytes += size;
    if (show_addrs) {
        put("A ");
        put_u64((uintptr_t)p, 16);
        put(" ");
        put_u64(size, 10);
        put("\n");
    }
    return p;
}

static void note_free(void *p)
{
    n_frees++;
    if (show_addrs) {
        put("F ");
        put_u64((uintptr_t)p, 16);
        put("\n");
    }
}

static void do_free(void *p)
{
    note_free(p);
    free(p);
}

/* Weak: bound at run time to whichever object defines them, if any. */
extern void free_sized(void *p, size_t size) __attribute__((weak));
extern void free_aligned_sized(void *p, size_t alignment, size_t size) __attribute__((weak));

static int run_sized(void)
{
    if (!free_sized || !free_aligned_sized)
        return 9;
    void *p = note_alloc(malloc(600), 600);
    void *q = note_alloc(aligned_alloc(64, 640), 640);
    note_free(p);
    free_sized(p, 600);
    note_free(q);
    free_aligned_sized(q, 64, 640);
    return 0;
}

#define SIG_POOL 500
static void *sig_pool[SIG_POOL];
static volatile sig_atomic_t sig_freed;

static void on_alarm(int sig)
{
    (void)sig;
    if (sig_freed < SIG_POOL) {
        free(sig_pool[sig_freed]);
        sig_freed = sig_freed + 1;
    }
}

static int run_sigfree(void)
{
    show_addrs = true;
    for (int i = 0; i < SIG_POOL; i++)
        sig_pool[i] = note_alloc(malloc(48), 48);
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    struct itimerval it = {.it_interval = {0, 100}, .it_value = {0, 100}};
    if (sigaction(SIGALRM, &sa, NULL) < 0 || setitimer(ITIMER_REAL, &it, NULL) < 0)
        return 8;
    for (long i = 0; sig_freed < SIG_POOL && i < 200000000; i++) {
        void *volatile p = malloc(64);
        free(p);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    (void)setitimer(ITIMER_REAL, &off, NULL);
    for (int i = 0; i < sig_freed; i++)
        note_free(sig_pool[i]);
    put("signals=");
    put_u64((uint64_t)sig_freed, 10);
    put("\n");
    return 0;
}

#define THREADS 4
#define PER_THREAD 20000

static void *thread_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        void *volatile q = malloc(64);
        if (!q)
            _exit(6);
        free(q);
    }
    return NULL;
}

static int run_threads(void)
{
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&th[i], NULL, thread_main, NULL) != 0)
            return 7;
    for (int i = 0; i < THREADS; i++)
        (void)pthread_join(th[i], NULL);
    static const char msg[] = "threads done\n";
    return write(1, msg, sizeof(msg) - 1) == sizeof(msg) - 1 ? 0 : 5;
}

/* "manythreads": MANY_HOLDERS threads each free a block of 40 bytes (more threads than
 * the library has batches of frees: each takes one while there is one) and wait; then
 * one more thread makes MANY_PAIRS malloc(72)/free pairs; the holders exit, a second goes by
 * (the library's thread takes their batches back), and the last thread makes
 * MANY_PAIRS malloc(88)/free pairs. Prints "manythreads done". */
#define MANY_HOLDERS 270
#define MANY_PAIRS 50
static pthread_mutex_t many_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t many_cond = PTHREAD_COND_INITIALIZER;
static int many_freed, many_phase;

static void many_wait_phase(int phase)
{
    pthread_mutex_lock(&many_lock);
    while (many_phase < phase)
        pthread_cond_wait(&many_cond, &many_lock);
    pthread_mutex_unlock(&many_lock);
}

static void many_set_phase(int phase)
{
    pthread_mutex_lock(&many_lock);
    many_phase = phase;
    pthread_cond_broadcast(&many_cond);
    pthread_mutex_unlock(&many_lock);
}

static void *many_holder(void *arg)
{
    (void)arg;
    void *volatile q = malloc(40);
    free(q);
    pthread_mutex_lock(&many_lock);
    many_freed++;
    pthread_cond_broadcast(&many_cond);
    pthread_mutex_unlock(&many_lock);
    many_wait_phase(1);
    return NULL;
}

static void many_pairs(size_t size)
{
    for (int i = 0; i < MANY_PAIRS; i++) {
        void *volatile q = malloc(size);
        if (!q)
            _exit(6);
        free(q);
    }
}

static void *many_late(void *arg)
{
    (void)arg;
    many_pairs(72);
    many_set_phase(1);
    many_wait_phase(2);
    many_pairs(88);
    return NULL;
}

static int run_manythreads(void)
{
    static pthread_t th[MANY_HOLDERS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    for (int i = 0; i < MANY_HOLDERS; i++)
        if (pthread_create(&th[i], &attr, many_holder, NULL) != 0)
            return 7;
    pthread_mutex_lock(&many_lock);
    while (many_freed < MANY_HOLDERS)
        pthread_cond_wait(&many_cond, &many_lock);
    pthread_mutex_unlock(&many_lock);
    pthread_t late;
    if (pthread_create(&late, &attr, many_late, NULL) != 0)
        return 7;
    for (int i = 0; i < MANY_HOLDERS; i++)
        (void)pthread_join(th[i], NULL);
    struct timespec ts = {1, 0};
    while (nanosleep(&ts, &ts) != 0)
        ;
    many_set_phase(2);
    (void)pthread_join(late, NULL);
    static const char msg[] = "manythreads done\n";
    return write(1, msg, sizeof(msg) - 1) == sizeof(msg) - 1 ? 0 : 5;
}

/* "heaps": registers arena.a and arena.b; reports HEAPS_A_N blocks of 32 bytes on arena.a
 * (ids 0x100000 + 32 i), frees the first HEAPS_A_FREED; one self-sampled block on
 * arena.a (id 0x200000, 100 bytes standing for 777); 5 blocks on arena.b (ids 0x300000
 * + 64 i), all freed; then registers arena.c and reports 7 blocks of 16 bytes on it (ids
 * 0x400000 + 16 i). Prints "heaps=A,B,C sampled=N". */
#define HEAPS_A_N 50
#define HEAPS_A_FREED 10
static int run_heaps(void)
{
    if (!heapprof_register_heap)
        return 6;
    uint32_t a = heapprof_register_heap("arena.a"), b = heapprof_register_heap("arena.b");
    uint64_t sampled = 0;
    for (uint64_t i = 0; i < HEAPS_A_N; i++)
        sampled += heapprof_report_allocation(a, 0x100000 + 32 * i, 32);
    for (uint64_t i = 0; i < HEAPS_A_FREED; i++)
        heapprof_report_free(a, 0x100000 + 32 * i);
    sampled += heapprof_report_sample(a, 0x200000, 100, 777);
    for (uint64_t i = 0; i < 5; i++)
        sampled += heapprof_report_allocation(b, 0x300000 + 64 * i, 64);
    for (uint64_t i = 0; i < 5; i++)
        heapprof_report_free(b, 0x300000 + 64 * i);
    uint32_t c = heapprof_register_heap("arena.c");
    for (uint64_t i = 0; i < 7; i++)
        sampled += heapprof_report_allocation(c, 0x400000 + 16 * i, 16);
    /* Not heaps: refused, and reports to them record nothing. */
    if (heapprof_register_heap("libc.malloc") != 0 || heapprof_register_heap("") != 0 ||
        heapprof_register_heap("arena.a") != a)
        return 7;
    sampled += heapprof_report_allocation(0, 0x500000, 16);
    sampled += heapprof_report_allocation(99, 0x500000, 16);
    put("heaps=");
    put_u64(a, 10);
    put(",");
    put_u64(b, 10);
    put(",");
    put_u64(c, 10);
    put(" sampled=");
    put_u64(sampled, 10);
    put("\n");
    return write(1, out, out_len) == (ssize_t)out_len ? 0 : 5;
}

/* For a service that reads nothing until FILE exists (interval 1, no block mode): fills
 * the ring with samples (kept blocks), then loads and unloads LIB with a sample in
 * between until the small records that tell of it fill the last bytes too, frees the
 * first block (its record goes into the room frees keep: a mark), loads LIB and samples
 * (the record that tells of it finds no room), makes FILE, waits for the service to
 * read, and samples once more. Prints "dlfull mark=ADDR" (hex). */
static int run_dlfull(char *spec)
{
    char *lib = spec, *file = strchr(spec, ':');
    if (!file)
        return 2;
    *file++ = 0;
    void *mark = malloc(64);
    if (!mark)
        return 3;
    /* Its address, printed after the free (volatile: not the freed pointer's value). */
    static volatile uintptr_t mark_addr;
    mark_addr = (uintptr_t)mark;
    for (int i = 0; i < 40000; i++)
        if (!malloc(64))
            return 3;
    for (int i = 0; i < 300; i++) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h || !malloc(64))
            return 4;
        dlclose(h);
    }
    free(mark);
    if (!dlopen(lib, RTLD_NOW | RTLD_LOCAL) || !malloc(64))
        return 4;
    int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0)
        return 6;
    (void)close(fd);
    struct timespec ts = {0, 500 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (!malloc(64))
        return 3;
    put("dlfull mark=");
    put_u64((uint64_t)mark_addr, 16);
    put("\n");
    return write(1, out, out_len) == (ssize_t)out_len ? 0 : 5;
}

int main(int argc, char **argv)
{
    static void *blocks[100];
    void *p = NULL;

    show_addrs = argc > 1 && strcmp(argv[1], "addrs") == 0;
    if (argc > 1 && strcmp(argv[1], "threads") == 0)
        return run_threads();
    if (argc > 1 && strcmp(argv[1], "heaps") == 0)
        return run_heaps();
    if (argc > 1 && strcmp(argv[1], "manythreads") == 0)
        return run_manythreads();
    if (argc > 1 && strncmp(argv[1], "dlfull:", 7) == 0)
        return run_dlfull(argv[1] + 7);
    if (argc > 1 && strcmp(argv[1], "sigfree") == 0) {
        int r = run_sigfree();
        if (r != 0)
            return r;
        return write(1, out, out_len) == (ssize_t)out_len ? 0 : 5;
    }
    if (argc > 1 && strcmp(argv[1], "sized") == 0) {
        show_addrs = true;
        int r = run_sized();
        if (r != 0)
            return r;
        return write(1, out, out_len) == (ssize_t)out_len ? 0 : 5;
    }

    for (int i = 0; i < 100; i++)
        blocks[i] = note_alloc(malloc(1000), 1000);
    for (int i = 0; i < 100; i += 2)
        do_free(blocks[i]);

    void *c = note_alloc(calloc(10, 100), 1000);
    void *r = note_alloc(malloc(200), 200);
    note_free(r);
    r = note_alloc(realloc(r, 5000), 5000);
    if (posix_memalign(&p, 64, 700) != 0)
        return 4;
    note_alloc(p, 700);
    void *al = note_alloc(aligned_alloc(128, 256), 256);
    void *m = note_alloc(memalign(32, 333), 333);
    void *v = note_alloc(valloc(4000), 4000);
    /* pvalloc allocates whole pages: those are the bytes sampled. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *pv = note_alloc(pvalloc(5000), (5000 + page - 1) / page * page);
    void *ra = note_alloc(reallocarray(NULL, 10, 30), 300);

    do_free(c);
    do_free(r);
    do_free(p);
    do_free(al);
    do_free(m);
    do_free(v);
    do_free(pv);
    do_free(ra);
    free(NULL);

    if (argc > 1 && strcmp(argv[1], "many") == 0) {
        for (int i = 0; i < 20000; i++) {
            void *q = note_alloc(malloc(100), 100);
            n_frees++;
            free(q);
        }
    }

    put("allocs=");
    put_u64(n_allocs, 10);
    put(" bytes=");
    put_u64(n_bytes, 10);
    put(" frees=");
    put_u64(n_frees, 10);
    put("\n");
    for (size_t off = 0; off < out_len;) {
        ssize_t w = write(1, out + off, out_len - off);
        if (w <= 0)
            return 5;
        off += (size_t)w;
    }
    return 0;
}
