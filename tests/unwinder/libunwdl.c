/* tests/unwinder/libunwdl.c: a shared library the variant tests dlopen, unwind through,
 * dlclose and dlopen again. */
#include "tests/unwinder/unwtest.h"

void unwdl_call(void (*cb)(void *), void *arg);

UNWTEST_NOINLINE void unwdl_call(void (*cb)(void *), void *arg)
{
    cb(arg);
    UNWTEST_BARRIER();
}
