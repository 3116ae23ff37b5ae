/* tests/unwinder/libunwtest_eh.c: a shared library built with -fexceptions, whose
 * function's CIE names a personality routine through a pointer in the library's writable
 * data (DW_EH_PE_indirect), as libc's stdio functions do. */
#include "tests/unwinder/unwtest.h"

static void unwtest_cleanup(int *x)
{
    __asm__ volatile("" : : "r"(x) : "memory");
}

UNWTEST_NOINLINE void unwtest_lib_call_cleanup(void (*cb)(void *), void *arg)
{
    int guard __attribute__((cleanup(unwtest_cleanup))) = 0;
    cb(arg);
    UNWTEST_BARRIER();
}
