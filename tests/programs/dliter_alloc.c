/* tests/programs/dliter_alloc.c: a small malloc, preloaded before libheapprof.so so that
 * the program's calls bind to it and the client installs its hooks in GOT slots
 * (tests/e2e/test_attach_dl.c). Size classes of powers of two, one free list each under a
 * mutex, blocks carved from mmap'd chunks; larger blocks mapped on their own. Like any
 * malloc, it never takes the loader's lock. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MIN_SHIFT 4
#define N_CLASSES 21 /* 16 B .. 16 MiB */
#define CHUNK (1u << 20)
#define HDR 16

/* Just before every block handed out. */
struct hdr {
    uint32_t cls;  /* N_CLASSES: mapped alone, @len bytes */
    uint32_t back; /* bytes from the start of the block to this header's end */
    uint64_t len;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void *free_list[N_CLASSES];
static char *carve, *carve_end;

static void *class_block(unsigned cls)
{
    size_t sz = (size_t)1 << (cls + MIN_SHIFT);
    pthread_mutex_lock(&mu);
    void *b = free_list[cls];
    if (b) {
        free_list[cls] = *(void **)b;
    } else {
        if ((size_t)(carve_end - carve) < sz) {
            size_t len = sz > CHUNK ? sz : CHUNK;
            void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) {
                pthread_mutex_unlock(&mu);
                return NULL;
            }
            carve = m;
            carve_end = carve + len;
        }
        b = carve;
        carve += sz;
    }
    pthread_mutex_unlock(&mu);
    return b;
}

/* @size bytes aligned to @align (a power of two, at most 4096). */
static void *alloc(size_t size, size_t align)
{
    if (align < HDR)
        align = HDR;
    if (size > ((size_t)1 << 40))
        return errno = ENOMEM, NULL;
    size_t need = size + align + HDR;
    unsigned cls = 0;
    while (cls < N_CLASSES && ((size_t)1 << (cls + MIN_SHIFT)) < need)
        cls++;
    char *b;
    if (cls == N_CLASSES) {
        b = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED)
            return errno = ENOMEM, NULL;
    } else if (!(b = class_block(cls))) {
        return errno = ENOMEM, NULL;
    }
    uintptr_t p = ((uintptr_t)b + HDR + align - 1) & ~(uintptr_t)(align - 1);
    struct hdr *h = (struct hdr *)(p - HDR);
    h->cls = cls;
    h->back = (uint32_t)(p - (uintptr_t)b);
    h->len = cls == N_CLASSES ? need : ((size_t)1 << (cls + MIN_SHIFT)) - h->back;
    return (void *)p;
}

void *malloc(size_t size)
{
    return alloc(size, HDR);
}

void free(void *p)
{
    if (!p)
        return;
    struct hdr *h = (struct hdr *)((char *)p - HDR);
    char *b = (char *)p - h->back;
    if (h->cls == N_CLASSES) {
        munmap(b, h->len);
        return;
    }
    pthread_mutex_lock(&mu);
    *(void **)b = free_list[h->cls];
    free_list[h->cls] = b;
    pthread_mutex_unlock(&mu);
}

void *calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return errno = ENOMEM, NULL;
    /* Not malloc + memset: the compiler would make that a call to calloc. */
    void *p = alloc(n * size, HDR);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *realloc(void *old, size_t size)
{
    if (!old)
        return malloc(size);
    struct hdr *h = (struct hdr *)((char *)old - HDR);
    size_t have = h->cls == N_CLASSES ? h->len - h->back : h->len;
    if (size <= have)
        return old;
    void *p = malloc(size);
    if (p) {
        memcpy(p, old, have);
        free(old);
    }
    return p;
}

void *memalign(size_t align, size_t size)
{
    return alloc(size, align);
}

void *aligned_alloc(size_t align, size_t size)
{
    return alloc(size, align);
}

int posix_memalign(void **ret, size_t align, size_t size)
{
    void *p = alloc(size, align);
    if (!p)
        return ENOMEM;
    *ret = p;
    return 0;
}

size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    struct hdr *h = (struct hdr *)((char *)p - HDR);
    return h->cls == N_CLASSES ? h->len - h->back : h->len;
}
