/* tests/unwinder/libunwdbg.c: a shared library the tests strip into a separate debug file
 * (tests/unwinder/meson.build): its static function is named only in the debug file's
 * .symtab, found through .gnu_debuglink. */
#include <stdint.h>

#include "tests/unwinder/unwtest.h"

uintptr_t unwdbg_helper_addr(void);
void unwdbg_call(void (*cb)(void *), void *arg);

static UNWTEST_NOINLINE void unwdbg_static_helper(void (*cb)(void *), void *arg)
{
    cb(arg);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void unwdbg_call(void (*cb)(void *), void *arg)
{
    unwdbg_static_helper(cb, arg);
    UNWTEST_BARRIER();
}

uintptr_t unwdbg_helper_addr(void)
{
    return (uintptr_t)unwdbg_static_helper;
}
