/* tests/unwinder/libheapprof_unwtest.c: stands in for libheapprof.so's frames; the
 * unwinder skips frames in files whose name starts with "libheapprof": the leading ones
 * (the hooks) and one between program frames (a wrapper that calls back, as the
 * python.objects wrapper calls pymalloc). */
#include "tests/support/regs.h"
#include "tests/unwinder/unwtest.h"

static UNWTEST_NOINLINE void hpskiptest_inner(uint64_t *regs, void (*after)(void *), void *arg)
{
    hp_capture_regs(regs);
    after(arg);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void hpskiptest_capture(uint64_t *regs, void (*after)(void *), void *arg)
{
    hpskiptest_inner(regs, after, arg);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void hpskiptest_call(void (*fn)(void *), void *arg)
{
    fn(arg);
    UNWTEST_BARRIER();
}
