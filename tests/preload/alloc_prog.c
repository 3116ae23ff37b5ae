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
 * async-signal-safe allocator: tests/preload/bump_alloc.c).
 */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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

int main(int argc, char **argv)
{
    static void *blocks[100];
    void *p = NULL;

    show_addrs = argc > 1 && strcmp(argv[1], "addrs") == 0;
    if (argc > 1 && strcmp(argv[1], "threads") == 0)
        return run_threads();
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
