/* tests/unwinder/unwtest.h: the functions of the small shared libraries the unwind tests
 * call through (libunwtest.so, and libheapprof_unwtest.so whose frames the unwinder must
 * skip like the real libheapprof.so's). */
#ifndef HP_TESTS_UNWINDER_UNWTEST_H
#define HP_TESTS_UNWINDER_UNWTEST_H

#include <stdint.h>

/* noclone too: a constant-propagated clone would carry a ".constprop" name. */
#if defined(__clang__)
#define UNWTEST_NOINLINE __attribute__((noinline))
#else
#define UNWTEST_NOINLINE __attribute__((noinline, noclone))
#endif

/* Keeps a call from becoming a tail call, so the caller's frame stays on the stack. */
#define UNWTEST_BARRIER() __asm__ volatile("" ::: "memory")

/* Calls @cb(@arg) from inside libunwtest.so. */
void unwtest_lib_call(void (*cb)(void *), void *arg);

/* Calls @cb(@arg) from inside libunwtest_eh.so, from a function with a cleanup handler
 * (so an LSDA and a personality routine). */
void unwtest_lib_call_cleanup(void (*cb)(void *), void *arg);

/* Inside libheapprof_unwtest.so: captures the registers into @regs two frames deep in
 * the library, then calls @after(@arg) (which copies the stack) before returning. */
void hpskiptest_capture(uint64_t *regs, void (*after)(void *), void *arg);
void hpskiptest_call(void (*fn)(void *), void *arg);

#endif
