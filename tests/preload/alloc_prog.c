/* tests/preload/alloc_prog.c: a program with known allocations, run under
 * LD_PRELOAD=libheapprof.so by tests/preload/test_client.c.
 *
 * Prints "allocs=N bytes=B frees=F" on stdout; with the argument "addrs" also one line
 * per allocation ("A addr size") and per free of a live block ("F addr"). Uses write(2)
 * and its own number formatting only, so that it allocates nothing besides what it
 * counts. With "many", it also makes 20000 malloc(100)/free pairs (not listed). With
 * "threads", it only runs 4 threads making 20000 malloc(64)/free pairs each.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char out[16384];
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
