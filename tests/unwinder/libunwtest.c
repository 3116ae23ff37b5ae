/* tests/unwinder/libunwtest.c: a shared library for unwinding through another ELF. */
#include "tests/unwinder/unwtest.h"

UNWTEST_NOINLINE void unwtest_lib_call(void (*cb)(void *), void *arg)
{
    cb(arg);
    UNWTEST_BARRIER();
}
