/* tests/programs/harm/alloc_family.cpp: every malloc-family call a program makes, for the
 * "every program" matrix (tests/e2e/test_every_program.c), run with other allocators
 * linked or preloaded. Prints what it checked and a checksum of malloc_usable_size()
 * over its blocks: the usable sizes are the allocator's own (jemalloc, tcmalloc,
 * mimalloc and glibc round differently), so a block served by another allocator than
 * the program's shows in the output, and a pointer handed to the wrong one crashes.
 * Allocates enough (about 20 MB in all) to be sampled at the default interval.
 *
 * cxx_new_site() allocates through every form of operator new (plain, array, nothrow,
 * aligned, aligned nothrow) and frees through every form of delete, CXX_BLOCKS blocks of
 * about 8 MB in all: the tests find its samples by its name. With the argument "cxx" the
 * program runs only that and the failing news (for exact counts at interval 1).
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>
#include <string>
#include <vector>

static unsigned long long usable_sum;
static int failures;

static void check(bool ok, const char *what)
{
    if (!ok) {
        printf("FAILED: %s\n", what);
        failures++;
    }
}

static void *note(void *p, size_t size)
{
    check(p != NULL, "allocation");
    if (p) {
        size_t u = malloc_usable_size(p);
        check(u >= size, "usable size");
        usable_sum += u;
        memset(p, 0x5a, size);
    }
    return p;
}

static bool aligned(const void *p, size_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* A block of operator new (not an array): a size of its own. */
struct cxx_obj {
    char bytes[1000];
};

enum { CXX_ROUNDS = 500, CXX_BLOCKS = 8 * CXX_ROUNDS };

/* CXX_BLOCKS blocks, each through one operator new at this function and freed through one
 * of the twelve operators delete (alternating between two sets): the sized and unsized,
 * array and aligned forms. Returns the number of blocks. */
extern "C" __attribute__((noinline)) int cxx_new_site(void)
{
    int blocks = 0;
    for (int i = 0; i < CXX_ROUNDS; i++) {
        size_t size = 512 + (size_t)(i * 97) % 3500;
        std::align_val_t a64{64}, a128{128};
        char *arr = (char *)note(new char[size], size);
        cxx_obj *obj = (cxx_obj *)note(new cxx_obj, sizeof(cxx_obj));
        char *arr_nt = (char *)note(new (std::nothrow) char[size], size);
        cxx_obj *obj_nt = (cxx_obj *)note(new (std::nothrow) cxx_obj, sizeof(cxx_obj));
        void *al = note(::operator new(size, a64), size);
        void *al_arr = note(::operator new[](size, a128), size);
        void *al_nt = note(::operator new(size, a128, std::nothrow), size);
        void *al_arr_nt = note(::operator new[](size, a128, std::nothrow), size);
        check(aligned(al, 64) && aligned(al_arr, 128) && aligned(al_nt, 128) &&
                  aligned(al_arr_nt, 128),
              "aligned new");
        blocks += 8;
        if (i % 2) {
            delete[] arr;                                       /* _ZdaPv */
            ::operator delete(obj, sizeof(cxx_obj));            /* _ZdlPvm */
            ::operator delete[](arr_nt, std::nothrow);          /* _ZdaPvRKSt9nothrow_t */
            ::operator delete(obj_nt, std::nothrow);            /* _ZdlPvRKSt9nothrow_t */
            ::operator delete(al, size, a64);                   /* _ZdlPvmSt11align_val_t */
            ::operator delete[](al_arr, a128);                  /* _ZdaPvSt11align_val_t */
            ::operator delete(al_nt, a128, std::nothrow);       /* _ZdlPvSt11align_val_tRKSt9... */
            ::operator delete[](al_arr_nt, a128, std::nothrow); /* _ZdaPvSt11align_val_tRK... */
        } else {
            ::operator delete[](arr, size);          /* _ZdaPvm */
            ::operator delete(obj);                  /* _ZdlPv */
            ::operator delete[](arr_nt);             /* _ZdaPv */
            ::operator delete(obj_nt);               /* _ZdlPv */
            ::operator delete(al, a64);              /* _ZdlPvSt11align_val_t */
            ::operator delete[](al_arr, size, a128); /* _ZdaPvmSt11align_val_t */
            ::operator delete(al_nt, size, a128);    /* _ZdlPvmSt11align_val_t */
            ::operator delete[](al_arr_nt, a128);    /* _ZdaPvSt11align_val_t */
        }
    }
    return blocks;
}

static void cxx_throw_bad_alloc()
{
    throw std::bad_alloc();
}

/* A new that fails: std::bad_alloc goes through whatever stands between the program and
 * the allocator (thrown by the allocator's operator, or by a new_handler it calls); the
 * nothrow operators return NULL. mimalloc's throwing operators (built as C, and blind to
 * the program's new_handler) abort instead: not tried with mimalloc. */
static void cxx_fail(size_t huge)
{
    int thrown = 0;
    bool can_throw = dlsym(RTLD_DEFAULT, "mi_malloc") == NULL;
    std::new_handler old = std::get_new_handler();
    for (int i = 0; can_throw && i < 2; i++) {
        /* Without a handler the allocator throws itself, with one the handler does. */
        std::set_new_handler(i ? cxx_throw_bad_alloc : nullptr);
        try {
            char *p = new char[huge];
            p[0] = 1;
        } catch (const std::bad_alloc &) {
            thrown++;
        }
        try {
            void *p = ::operator new (huge, std::align_val_t{64});
            ::operator delete (p, std::align_val_t{64});
        } catch (const std::bad_alloc &) {
            thrown++;
        }
    }
    std::set_new_handler(old);
    check(!can_throw || thrown == 4, "new throws std::bad_alloc");
    check(new (std::nothrow) char[huge] == NULL, "nothrow new returns NULL");
    check(::operator new (huge, std::align_val_t{64}, std::nothrow) == NULL,
          "aligned nothrow new returns NULL");
    printf("failing new: %d thrown\n", thrown);
}

int main(int argc, char **argv)
{
    enum { N = 6000 };
    volatile size_t huge = SIZE_MAX / 2; /* opaque: no compile-time overflow warning */
    static void *keep[N];
    if (argc > 1 && strcmp(argv[1], "cxx") == 0) {
        int blocks = cxx_new_site();
        cxx_fail(huge);
        printf("cxx: %d blocks, usable-size checksum %llu, %d failures\n", blocks, usable_sum,
               failures);
        return failures ? 1 : 0;
    }
    /* Many small and medium blocks: half freed at once, half kept to the end. */
    for (int i = 0; i < N; i++) {
        keep[i] = note(malloc(16 + (size_t)(i * 37) % 3000), 16 + (size_t)(i * 37) % 3000);
        if (i % 2) {
            free(keep[i]);
            keep[i] = NULL;
        }
    }

    char *z = (char *)calloc(1000, 7);
    bool zero = z != NULL;
    for (size_t i = 0; zero && i < 7000; i++)
        zero = z[i] == 0;
    check(zero, "calloc zeroes");
    note(z, 7000);
    /* (Whether errno is ENOMEM then is the allocator's business: tcmalloc leaves it.) */
    check(calloc(huge, 4) == NULL, "calloc overflow");

    /* realloc keeps the contents as the block grows and shrinks. */
    char *r = (char *)note(malloc(100), 100);
    for (int i = 0; i < 100; i++)
        r[i] = (char)i;
    for (size_t size = 200; size < 200000; size *= 3)
        r = (char *)note(realloc(r, size), 100);
    r = (char *)realloc(r, 50);
    bool kept = r != NULL;
    for (int i = 0; kept && i < 50; i++)
        kept = r[i] == (char)0x5a;
    check(kept, "realloc keeps contents");
    free(r);

    int *ra = (int *)note(reallocarray(NULL, 100, sizeof(int)), 400);
    ra = (int *)note(reallocarray(ra, 5000, sizeof(int)), 20000);
    errno = 0;
    check(reallocarray(NULL, huge, 4) == NULL && errno == ENOMEM, "reallocarray overflow");
    free(ra);

    void *pm = NULL;
    check(posix_memalign(&pm, 64, 1000) == 0 && aligned(pm, 64), "posix_memalign 64");
    note(pm, 1000);
    free(pm);
    check(posix_memalign(&pm, 4096, 20000) == 0 && aligned(pm, 4096), "posix_memalign 4096");
    note(pm, 20000);
    free(pm);
    check(posix_memalign(&pm, 3, 100) == EINVAL, "posix_memalign EINVAL");

    void *aa = aligned_alloc(256, 1024);
    check(aa && aligned(aa, 256), "aligned_alloc");
    note(aa, 1024);
    free(aa);
    /* An alignment that is not a power of two: the allocator decides (glibc 2.36 rounds it
     * up, 2.38 and jemalloc refuse it); printed, so that every run must agree. */
    void *odd = aligned_alloc(24, 48);
    printf("aligned_alloc(24, 48): %s\n", odd ? "allocated" : "refused");
    free(odd);
    void *ma = memalign(128, 500);
    check(ma && aligned(ma, 128), "memalign");
    note(ma, 500);
    free(ma);
    void *va = valloc(5000);
    check(va && aligned(va, 4096), "valloc");
    note(va, 5000);
    free(va);

    /* Large blocks (always sampled), freed. */
    for (int i = 0; i < 20; i++)
        free(note(malloc((size_t)(64 + i) << 10), (size_t)(64 + i) << 10));

    /* C++: new/delete (the allocator's own operators when it has them). */
    std::vector<std::string> words;
    for (int i = 0; i < 3000; i++)
        words.push_back(std::string(40 + i % 200, (char)('a' + i % 26)));
    size_t chars = 0;
    for (const std::string &w : words)
        chars += w.size();
    int *arr = new int[10000];
    arr[9999] = 7;
    check(arr[9999] == 7, "new[]");
    delete[] arr;
    int blocks = cxx_new_site();
    cxx_fail(huge);

    for (int i = 0; i < N; i++)
        free(keep[i]);
    printf("usable-size checksum %llu, %zu characters in strings, %d C++ blocks, %d failures\n",
           usable_sum, chars, blocks, failures);
    return failures ? 1 : 0;
}
