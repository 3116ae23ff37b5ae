/* tests/programs/truth_prog.c: a ground-truth program for the accuracy tests.
 *
 * Allocates through twelve named call sites whose totals it counts exactly, and prints
 * them as lines "truth <function> <alloc_bytes> <alloc_count> <free_bytes> <free_count>"
 * (bytes as requested from the allocator). It exercises: sizes from 1 byte to 4 MiB
 * (truth_huge: only blocks of at least 512 KiB), three threads with their own sites,
 * realloc chains, frees done by another thread than the allocating one, address reuse
 * (the same size freed and allocated again at a different site), calloc, posix_memalign
 * and aligned_alloc. Some blocks stay live at exit.
 *
 * Usage: truth_prog [scale]   (work grows linearly with scale; default 1)
 * Deterministic: sizes come from a fixed-seed generator.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BARRIER() __asm__ volatile("" ::: "memory")
#define N_THREADS 3
#define N_SITES 12

enum {
    S_TINY,
    S_MEDIUM,
    S_HUGE,
    S_CALLOC,
    S_POSIX_MEMALIGN,
    S_ALIGNED_ALLOC,
    S_REALLOC_CHAIN,
    S_REUSE_A,
    S_REUSE_B,
    S_THREAD0,
    S_THREAD1,
    S_THREAD2,
};

struct truth {
    const char *name;
    unsigned long long alloc_bytes, alloc_count, free_bytes, free_count;
};

static struct truth g_truth[N_SITES] = {
    {"truth_tiny", 0, 0, 0, 0},           {"truth_medium", 0, 0, 0, 0},
    {"truth_huge", 0, 0, 0, 0},           {"truth_calloc", 0, 0, 0, 0},
    {"truth_posix_memalign", 0, 0, 0, 0}, {"truth_aligned_alloc", 0, 0, 0, 0},
    {"truth_realloc_chain", 0, 0, 0, 0},  {"truth_reuse_a", 0, 0, 0, 0},
    {"truth_reuse_b", 0, 0, 0, 0},        {"thread0_site", 0, 0, 0, 0},
    {"thread1_site", 0, 0, 0, 0},         {"thread2_site", 0, 0, 0, 0},
};
static pthread_mutex_t g_truth_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_alloc(int site, size_t n)
{
    pthread_mutex_lock(&g_truth_lock);
    g_truth[site].alloc_bytes += n;
    g_truth[site].alloc_count++;
    pthread_mutex_unlock(&g_truth_lock);
}

/* Frees @p (of @n bytes, allocated at @site) and counts it. */
static void free_counted(int site, void *p, size_t n)
{
    free(p);
    pthread_mutex_lock(&g_truth_lock);
    g_truth[site].free_bytes += n;
    g_truth[site].free_count++;
    pthread_mutex_unlock(&g_truth_lock);
}

/* xorshift64*: one generator per thread, fixed seeds. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* ---- the sites: not static, so their names appear in the profile's stacks ---------- */

void *truth_tiny(size_t n);
void *truth_medium(size_t n);
void *truth_huge(size_t n);
void *truth_calloc(size_t nmemb, size_t size);
void *truth_posix_memalign(size_t align, size_t n);
void *truth_aligned_alloc(size_t align, size_t n);
void truth_realloc_chain(uint64_t *rng, int keep);
void *truth_reuse_a(size_t n);
void *truth_reuse_b(size_t n);
void *thread0_site(size_t n);
void *thread1_site(size_t n);
void *thread2_site(size_t n);

NOINLINE void *truth_tiny(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *truth_medium(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *truth_huge(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *truth_calloc(size_t nmemb, size_t size)
{
    void *p = calloc(nmemb, size);
    BARRIER();
    return p;
}

NOINLINE void *truth_posix_memalign(size_t align, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, align, n) != 0)
        return NULL;
    BARRIER();
    return p;
}

NOINLINE void *truth_aligned_alloc(size_t align, size_t n)
{
    void *p = aligned_alloc(align, n);
    BARRIER();
    return p;
}

static void *volatile g_sink;

/* One chain: malloc of a small block, then reallocs growing it past 3 MiB (each one an
 * allocation of the new size and a free of the old block, both at this site). The last
 * block is kept live when @keep, else freed. */
NOINLINE void truth_realloc_chain(uint64_t *rng, int keep)
{
    size_t n = 1 + rng_next(rng) % 100;
    char *p = malloc(n);
    BARRIER();
    if (!p)
        abort();
    count_alloc(S_REALLOC_CHAIN, n);
    while (n < (3u << 20)) {
        size_t m = n + n / 2 + 7 + rng_next(rng) % 64;
        char *q = realloc(p, m);
        BARRIER();
        if (!q)
            abort();
        q[m - 1] = 1;
        count_alloc(S_REALLOC_CHAIN, m);
        pthread_mutex_lock(&g_truth_lock);
        g_truth[S_REALLOC_CHAIN].free_bytes += n;
        g_truth[S_REALLOC_CHAIN].free_count++;
        pthread_mutex_unlock(&g_truth_lock);
        p = q;
        n = m;
    }
    if (keep)
        g_sink = p;
    else
        free_counted(S_REALLOC_CHAIN, p, n);
}

NOINLINE void *truth_reuse_a(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *truth_reuse_b(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *thread0_site(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *thread1_site(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

NOINLINE void *thread2_site(size_t n)
{
    void *p = malloc(n);
    BARRIER();
    return p;
}

/* ---- threads ---------------------------------------------------------------------- */

struct block {
    void *p;
    size_t n;
};

/* A batch of truth_medium blocks that a freeing thread releases. */
struct batch {
    struct block *b;
    size_t n;
};

static void *freer_start(void *arg)
{
    struct batch *bt = arg;
    for (size_t i = 0; i < bt->n; i++)
        free_counted(S_MEDIUM, bt->b[i].p, bt->b[i].n);
    return NULL;
}

struct worker {
    int index;
    int scale;
    /* Blocks handed back to main, which frees them (or keeps them live) after join. */
    struct block *handed;
    size_t n_handed;
};

static void *worker_start(void *arg)
{
    struct worker *w = arg;
    static void *(*const sites[N_THREADS])(size_t) = {thread0_site, thread1_site, thread2_site};
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(w->index + 1);
    size_t n = (size_t)4000 * (size_t)w->scale;
    w->handed = malloc(n * sizeof(*w->handed));
    if (!w->handed)
        abort();
    w->n_handed = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&rng);
        /* Mostly small (1..256), some medium (..16 KiB), a few large (..700 KiB). */
        size_t sz;
        if (r % 16 < 11)
            sz = 1 + (r >> 8) % 256;
        else if (r % 16 < 15)
            sz = 257 + (r >> 8) % 16128;
        else
            sz = 16384 + (r >> 8) % (700u << 10);
        void *p = sites[w->index](sz);
        if (!p)
            abort();
        memset(p, 0x5a, sz < 64 ? sz : 64);
        count_alloc(S_THREAD0 + w->index, sz);
        if (i % 2 == 0)
            free_counted(S_THREAD0 + w->index, p, sz);
        else
            w->handed[w->n_handed++] = (struct block){p, sz};
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int scale = argc > 1 ? atoi(argv[1]) : 1;
    if (scale < 1)
        scale = 1;
    uint64_t rng = 0x1234567887654321ull;

    struct worker workers[N_THREADS];
    pthread_t tids[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        workers[i] = (struct worker){.index = i, .scale = scale};
        if (pthread_create(&tids[i], NULL, worker_start, &workers[i]) != 0)
            abort();
    }

    /* Tiny blocks, 1 to 64 bytes; every other one freed at once, the rest at the end
     * (one in four kept live). */
    size_t n_tiny = (size_t)20000 * (size_t)scale;
    struct block *tiny = malloc(n_tiny * sizeof(*tiny));
    if (!tiny)
        abort();
    size_t kept_tiny = 0;
    for (size_t i = 0; i < n_tiny; i++) {
        size_t sz = 1 + rng_next(&rng) % 64;
        void *p = truth_tiny(sz);
        if (!p)
            abort();
        count_alloc(S_TINY, sz);
        if (i % 2 == 0)
            free_counted(S_TINY, p, sz);
        else
            tiny[kept_tiny++] = (struct block){p, sz};
    }

    /* Medium blocks freed by another thread, in batches of 500. */
    for (int b = 0; b < 4 * scale; b++) {
        struct block blocks[500];
        for (size_t i = 0; i < 500; i++) {
            size_t sz = 1000 + rng_next(&rng) % 8000;
            blocks[i] = (struct block){truth_medium(sz), sz};
            if (!blocks[i].p)
                abort();
            count_alloc(S_MEDIUM, sz);
        }
        struct batch bt = {blocks, 500};
        pthread_t ft;
        if (pthread_create(&ft, NULL, freer_start, &bt) != 0 || pthread_join(ft, NULL) != 0)
            abort();
    }

    /* Huge blocks, 512 KiB to 4 MiB; every other one freed. */
    for (int i = 0; i < 8 * scale; i++) {
        size_t sz = (512u << 10) + rng_next(&rng) % (3584u << 10);
        char *p = truth_huge(sz);
        if (!p)
            abort();
        p[0] = p[sz - 1] = 1;
        count_alloc(S_HUGE, sz);
        if (i % 2 == 0)
            free_counted(S_HUGE, p, sz);
        else
            g_sink = p;
    }

    /* calloc, posix_memalign, aligned_alloc; two thirds freed. */
    for (int i = 0; i < 2000 * scale; i++) {
        size_t nmemb = 1 + rng_next(&rng) % 200, size = 1 + rng_next(&rng) % 100;
        void *p = truth_calloc(nmemb, size);
        if (!p)
            abort();
        count_alloc(S_CALLOC, nmemb * size);
        if (i % 3 != 0)
            free_counted(S_CALLOC, p, nmemb * size);
        else
            g_sink = p;

        size_t align = (size_t)8 << (rng_next(&rng) % 10); /* 8 .. 4096 */
        size_t sz = 1 + rng_next(&rng) % 12000;
        p = truth_posix_memalign(align, sz);
        if (!p || (uintptr_t)p % align != 0)
            abort();
        count_alloc(S_POSIX_MEMALIGN, sz);
        if (i % 3 != 0)
            free_counted(S_POSIX_MEMALIGN, p, sz);
        else
            g_sink = p;

        align = (size_t)16 << (rng_next(&rng) % 8); /* 16 .. 2048 */
        sz = align * (1 + rng_next(&rng) % 8);
        p = truth_aligned_alloc(align, sz);
        if (!p || (uintptr_t)p % align != 0)
            abort();
        count_alloc(S_ALIGNED_ALLOC, sz);
        if (i % 3 != 0)
            free_counted(S_ALIGNED_ALLOC, p, sz);
        else
            g_sink = p;
    }

    /* Realloc chains; one in five keeps its last block. */
    for (int i = 0; i < 10 * scale; i++)
        truth_realloc_chain(&rng, i % 5 == 0);

    /* Address reuse: a block freed, then one of the same size at another site (the
     * allocator hands back the same address), freed too. */
    static const size_t reuse_sizes[] = {24, 40, 100, 500, 1500, 3000, 5000};
    for (int i = 0; i < 3000 * scale; i++) {
        size_t sz = reuse_sizes[(size_t)i % (sizeof(reuse_sizes) / sizeof(reuse_sizes[0]))];
        void *p = truth_reuse_a(sz);
        if (!p)
            abort();
        count_alloc(S_REUSE_A, sz);
        free_counted(S_REUSE_A, p, sz);
        void *q = truth_reuse_b(sz);
        if (!q)
            abort();
        count_alloc(S_REUSE_B, sz);
        free_counted(S_REUSE_B, q, sz);
    }

    for (int i = 0; i < N_THREADS; i++) {
        if (pthread_join(tids[i], NULL) != 0)
            abort();
        /* Frees from this thread of blocks the worker allocated; one in four kept. */
        for (size_t j = 0; j < workers[i].n_handed; j++) {
            if (j % 4 == 0)
                g_sink = workers[i].handed[j].p;
            else
                free_counted(S_THREAD0 + i, workers[i].handed[j].p, workers[i].handed[j].n);
        }
        free(workers[i].handed);
    }
    for (size_t i = 0; i < kept_tiny; i++)
        if (i % 2 == 0)
            free_counted(S_TINY, tiny[i].p, tiny[i].n);
    free(tiny);

    for (int i = 0; i < N_SITES; i++)
        printf("truth %s %llu %llu %llu %llu\n", g_truth[i].name, g_truth[i].alloc_bytes,
               g_truth[i].alloc_count, g_truth[i].free_bytes, g_truth[i].free_count);
    fflush(stdout);
    return 0;
}
