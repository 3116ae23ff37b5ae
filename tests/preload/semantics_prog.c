/* tests/preload/semantics_prog.c: checks glibc's allocator semantics (return values and
 * errno) and prints one deterministic line per check; exits 1 when a check fails. Run
 * with and without LD_PRELOAD=libheapprof.so by tests/preload/test_client.c, which
 * compares the outputs. */
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int failures;

static void check(const char *name, bool ok)
{
    printf("%s %s\n", name, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

int main(void)
{
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    volatile size_t huge = SIZE_MAX / 2 + 7; /* volatile: keep the compiler out of it */

    errno = 1234;
    check("posix_memalign_align3_einval", posix_memalign(&p, 3, 16) == EINVAL && errno == 1234);
    check("posix_memalign_align0_einval", posix_memalign(&p, 0, 16) == EINVAL && errno == 1234);
    check("posix_memalign_align24_einval",
          posix_memalign(&p, 24, 16) == EINVAL && errno == 1234 && p == NULL);
    check("posix_memalign_align64_ok",
          posix_memalign(&p, 64, 16) == 0 && p && (uintptr_t)p % 64 == 0 && errno == 1234);
    free(p);
    p = NULL;
    check("posix_memalign_huge_enomem", posix_memalign(&p, 64, huge) == ENOMEM && p == NULL);

    errno = 0;
    check("calloc_overflow_enomem", calloc(huge, 3) == NULL && errno == ENOMEM);
    errno = 0;
    check("reallocarray_overflow_enomem", reallocarray(NULL, huge, 3) == NULL && errno == ENOMEM);
    errno = 0;
    check("malloc_huge_enomem", malloc(huge) == NULL && errno == ENOMEM);

    errno = 77;
    p = malloc(0);
    check("malloc0_nonnull", p != NULL && errno == 77);
    free(p);
    check("free_keeps_errno", errno == 77);

    p = realloc(NULL, 10);
    check("realloc_null_is_malloc", p != NULL && malloc_usable_size(p) >= 10);
    p = realloc(p, 100000);
    check("realloc_grow", p != NULL && malloc_usable_size(p) >= 100000);
    check("realloc_zero_frees", realloc(p, 0) == NULL);

    p = calloc(100, 10);
    bool zero = p != NULL;
    for (int i = 0; zero && i < 1000; i++)
        zero = ((unsigned char *)p)[i] == 0;
    check("calloc_zeroed", zero);
    free(p);

    p = aligned_alloc(256, 100);
    check("aligned_alloc_256", p && (uintptr_t)p % 256 == 0);
    free(p);
    p = aligned_alloc(3, 16);
    printf("aligned_alloc_align3 %s\n", p ? "nonnull" : "null");
    free(p);
    p = memalign(4096, 100);
    check("memalign_4096", p && (uintptr_t)p % 4096 == 0);
    free(p);
    p = valloc(1);
    check("valloc_page", p && (uintptr_t)p % (uintptr_t)page == 0);
    free(p);
    p = pvalloc(1);
    check("pvalloc_page",
          p && (uintptr_t)p % (uintptr_t)page == 0 && malloc_usable_size(p) >= (size_t)page);
    free(p);
    p = reallocarray(NULL, 10, 10);
    check("reallocarray_ok", p && malloc_usable_size(p) >= 100);
    free(p);

    errno = 0;
    p = memalign((size_t)1 << 63 | 1, 16);
    printf("memalign_silly_align %s errno=%d\n", p ? "nonnull" : "null", errno);
    free(p);
    return failures ? 1 : 0;
}
