/* tests/preload/test_stack.c: which stack a sample runs on and how it is read
 * (preload/stack.h): the thread's own stack, learned and checked once; foreign stacks
 * (fibers, signal stacks, stacks unmapped and replaced) read only through checked calls
 * that never fault. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "preload/stack.h"

extern void *__libc_stack_end;

#define PAGE 4096u

static uint64_t tp(void)
{
    return (uint64_t)(uintptr_t)__builtin_thread_pointer();
}

static uint64_t main_top(void)
{
    return (uint64_t)(uintptr_t)__libc_stack_end + 256;
}

static uint64_t here(void)
{
    return (uint64_t)(uintptr_t)__builtin_frame_address(0);
}

/* Three pages: read-write, PROT_NONE, unmapped. */
static uint8_t *three_pages(void)
{
    uint8_t *m = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    memset(m, 0x5a, PAGE);
    assert_int_equal(mprotect(m + PAGE, PAGE, PROT_NONE), 0);
    assert_int_equal(munmap(m + 2 * PAGE, PAGE), 0);
    return m;
}

static void test_stack_readable_stops_at_unreadable_pages(void **state)
{
    (void)state;
    uint8_t *m = three_pages();
    uint64_t a = (uint64_t)(uintptr_t)m;
    assert_int_equal(client_stack_readable(a + 100, 64), 64);
    assert_int_equal(client_stack_readable(a + 100, 3 * PAGE), PAGE - 100);
    assert_int_equal(client_stack_readable(a + PAGE, 8), 0);     /* PROT_NONE */
    assert_int_equal(client_stack_readable(a + 2 * PAGE, 8), 0); /* unmapped */
    assert_int_equal(client_stack_readable(0, 8), 0);
    assert_int_equal(client_stack_readable(UINT64_MAX - 8, 64), 0);
    (void)munmap(m, 2 * PAGE);
}

static void test_stack_copy_never_faults(void **state)
{
    (void)state;
    uint8_t *m = three_pages();
    uint64_t a = (uint64_t)(uintptr_t)m;
    static uint8_t buf[4 * PAGE];
    memset(buf, 0, sizeof(buf));
    /* Up to the PROT_NONE page, then nothing. */
    assert_int_equal(client_stack_copy(getpid(), buf, a + 96, 3 * PAGE), PAGE - 96);
    assert_int_equal(buf[0], 0x5a);
    assert_int_equal(buf[PAGE - 97], 0x5a);
    assert_int_equal(client_stack_copy(getpid(), buf, a + PAGE, 64), 0);
    assert_int_equal(client_stack_copy(getpid(), buf, a + 2 * PAGE, 64), 0);
    assert_int_equal(client_stack_copy(getpid(), buf, 8, 64), 0);
    assert_int_equal(client_stack_copy(getpid(), buf, a, 0), 0);
    (void)munmap(m, 2 * PAGE);
}

static void test_stack_main_thread_learned_once(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    uint64_t end = 0, sp = here();
    assert_int_equal(client_stack_lookup(&c, sp, tp(), main_top(), &end), CLIENT_STACK_OWN);
    assert_int_equal(end, main_top());
    assert_int_equal(c.lo, sp);
    assert_int_equal(c.hi, main_top());
    /* Inside the range: answered from the cache (a bogus top shows it is used). */
    c.hi += 8;
    assert_int_equal(client_stack_lookup(&c, sp + 8, tp(), main_top(), &end), CLIENT_STACK_OWN);
    assert_int_equal(end, main_top() + 8);
    c.hi -= 8;
    /* Above the top: not ours. */
    assert_int_equal(client_stack_lookup(&c, main_top() + 64, tp(), main_top(), &end),
                     CLIENT_STACK_OTHER);
}

/* Recursion to grow the stack below what was checked. */
static __attribute__((noinline)) uint64_t deeper(struct client_stack_cache *c, int depth,
                                                 int *ret_kind)
{
    volatile char pad[2048];
    pad[0] = (char)depth;
    if (depth > 0) {
        uint64_t r = deeper(c, depth - 1, ret_kind);
        __asm__ volatile("" ::: "memory");
        return r + (uint64_t)pad[0] * 0;
    }
    uint64_t end;
    *ret_kind = client_stack_lookup(c, here(), tp(), main_top(), &end);
    return here();
}

static void test_stack_grows_down(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    uint64_t end;
    assert_int_equal(client_stack_lookup(&c, here(), tp(), main_top(), &end), CLIENT_STACK_OWN);
    uint64_t lo = c.lo;
    int kind = -1;
    uint64_t sp = deeper(&c, 16, &kind);
    assert_int_equal(kind, CLIENT_STACK_OWN);
    assert_true(sp < lo);
    assert_int_equal(c.lo, sp);
    assert_int_equal(c.hi, main_top());
}

static void *thread_lookup(void *arg)
{
    struct client_stack_cache *c = arg;
    uint64_t end = 0;
    if (client_stack_lookup(c, here(), tp(), main_top(), &end) != CLIENT_STACK_OWN)
        return NULL;
    return (void *)(uintptr_t)end;
}

static void test_stack_thread_ends_at_its_descriptor(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    pthread_t th;
    void *ret;
    assert_int_equal(pthread_create(&th, NULL, thread_lookup, &c), 0);
    assert_int_equal(pthread_join(th, &ret), 0);
    assert_non_null(ret);
    assert_int_equal(c.hi, (uint64_t)(uintptr_t)ret);
    assert_true(c.lo < c.hi);
    assert_true(c.hi != main_top());
}

/* The review's A4 case, one level down: the thread's first sample is on a 256 KiB fiber
 * stack, which is then unmapped, and a 32 KiB one is mapped at the same address. The old
 * lookup cached the first mapping as the thread's stack and the copy ran past the new
 * one's end. Now neither is taken for the thread's own, and every read is checked. */
static void test_stack_bug_fiber_replaced_by_smaller(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    uint64_t end;
    const size_t big = 256u << 10, small = 32u << 10;
    /* A guard page above, as fiber libraries leave, so where the stack ends is known. */
    uint8_t *m = mmap(NULL, big + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + big, PAGE, PROT_NONE), 0);
    uint64_t a = (uint64_t)(uintptr_t)m;
    uint64_t sp = a + big - 512;
    assert_int_equal(client_stack_lookup(&c, sp, tp(), main_top(), &end), CLIENT_STACK_OTHER);
    assert_int_equal(c.hi, 0); /* nothing learned from a foreign stack */
    struct client_stack_plan plan;
    client_stack_plan_other(&c, sp, 64u << 10, &plan);
    assert_int_equal(plan.how, CLIENT_STACK_PROBED);
    assert_int_equal(plan.len, 512);
    static uint8_t buf[64u << 10];
    ssize_t n = client_stack_copy(getpid(), buf, sp, plan.len);
    assert_int_equal(n, 512);
    assert_false(client_stack_copied_other(&c, sp, &plan, (size_t)n));

    /* Replaced: a smaller stack at the same address, used deeper into the old range. */
    assert_int_equal(munmap(m, big + PAGE), 0);
    uint8_t *s2 =
        mmap(m, small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    assert_true(s2 == m);
    sp = a + small - 256;
    assert_int_equal(client_stack_lookup(&c, sp, tp(), main_top(), &end), CLIENT_STACK_OTHER);
    client_stack_plan_other(&c, sp, 64u << 10, &plan);
    n = client_stack_copy(getpid(), buf, sp, plan.len);
    assert_int_equal(n, 256);
    assert_false(client_stack_copied_other(&c, sp, &plan, (size_t)n));
    /* And at the old stack's top, now unmapped: its end is still remembered, but the copy
     * reads nothing and does not fault, and the end is forgotten. */
    sp = a + big - 512;
    client_stack_plan_other(&c, sp, 64u << 10, &plan);
    assert_int_equal(plan.how, CLIENT_STACK_HINTED);
    n = client_stack_copy(getpid(), buf, sp, plan.len);
    assert_int_equal(n, 0);
    assert_false(client_stack_copied_other(&c, sp, &plan, (size_t)n));
    client_stack_plan_other(&c, sp, 64u << 10, &plan);
    assert_int_equal(plan.how, CLIENT_STACK_PROBED);
    assert_int_equal(plan.len, 0);
    (void)munmap(s2, small);
}

/* A foreign stack's end is remembered: the next copy reads 8 bytes more to check it,
 * and a stack that turns out longer is forgotten and the copy called truncated. */
static void test_stack_other_end_remembered(void **state)
{
    (void)state;
    struct client_stack_cache c = {0};
    /* Pages: 0-1 the stack, 2 a guard, 3 more, 4 a guard against whatever comes next. */
    uint8_t *m = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + 2 * PAGE, PAGE, PROT_NONE), 0);
    assert_int_equal(mprotect(m + 4 * PAGE, PAGE, PROT_NONE), 0);
    uint64_t a = (uint64_t)(uintptr_t)m, sp = a + PAGE + 100;
    static uint8_t buf[64u << 10];
    struct client_stack_plan plan;
    client_stack_plan_other(&c, sp, sizeof(buf), &plan);
    assert_int_equal(plan.how, CLIENT_STACK_PROBED);
    ssize_t n = client_stack_copy(getpid(), buf, sp, plan.len);
    assert_false(client_stack_copied_other(&c, sp, &plan, (size_t)n));
    client_stack_plan_other(&c, sp - 64, sizeof(buf), &plan);
    assert_int_equal(plan.how, CLIENT_STACK_HINTED);
    assert_int_equal(plan.len, PAGE - 100 + 64 + 8);
    n = client_stack_copy(getpid(), buf, sp - 64, plan.len);
    assert_int_equal(n, PAGE - 100 + 64);
    assert_false(client_stack_copied_other(&c, sp - 64, &plan, (size_t)n));
    /* The guard page goes: the stack now reads on past its old end. */
    assert_int_equal(mprotect(m + 2 * PAGE, PAGE, PROT_READ), 0);
    client_stack_plan_other(&c, sp, sizeof(buf), &plan);
    assert_int_equal(plan.how, CLIENT_STACK_HINTED);
    n = client_stack_copy(getpid(), buf, sp, plan.len);
    assert_int_equal(n, (ssize_t)plan.len);
    assert_true(client_stack_copied_other(&c, sp, &plan, (size_t)n));
    client_stack_plan_other(&c, sp, sizeof(buf), &plan);
    assert_int_equal(plan.how, CLIENT_STACK_PROBED);
    assert_int_equal(plan.len, 4 * PAGE - PAGE - 100);
    (void)munmap(m, 5 * PAGE);
}

static struct client_stack_plan alt_plan;
static int alt_kind;
static uint64_t alt_sp;

static void on_alt(int sig)
{
    (void)sig;
    struct client_stack_cache c = {0};
    uint64_t end;
    alt_sp = here();
    alt_kind = client_stack_lookup(&c, alt_sp, tp(), main_top(), &end);
    client_stack_plan_other(&c, alt_sp, 1u << 20, &alt_plan);
}

static void test_stack_sigaltstack_bounds(void **state)
{
    (void)state;
    size_t size = 64u << 10;
    uint8_t *mem = malloc(size);
    assert_non_null(mem);
    stack_t ss = {.ss_sp = mem, .ss_size = size, .ss_flags = 0}, old;
    assert_int_equal(sigaltstack(&ss, &old), 0);
    struct sigaction sa = {.sa_handler = on_alt, .sa_flags = SA_ONSTACK}, old_sa;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR2, &sa, &old_sa), 0);
    assert_int_equal(raise(SIGUSR2), 0);
    assert_int_equal(sigaction(SIGUSR2, &old_sa, NULL), 0);
    ss.ss_flags = SS_DISABLE;
    assert_int_equal(sigaltstack(&ss, NULL), 0);
    uint64_t lo = (uint64_t)(uintptr_t)mem;
    assert_true(alt_sp >= lo && alt_sp < lo + size);
    assert_int_equal(alt_kind, CLIENT_STACK_OTHER);
    assert_int_equal(alt_plan.how, CLIENT_STACK_ALTSTACK);
    assert_int_equal(alt_plan.len, lo + size - alt_sp);
    assert_false(alt_plan.may_go_on);
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stack_readable_stops_at_unreadable_pages),
        cmocka_unit_test(test_stack_copy_never_faults),
        cmocka_unit_test(test_stack_main_thread_learned_once),
        cmocka_unit_test(test_stack_grows_down),
        cmocka_unit_test(test_stack_thread_ends_at_its_descriptor),
        cmocka_unit_test(test_stack_bug_fiber_replaced_by_smaller),
        cmocka_unit_test(test_stack_other_end_remembered),
        cmocka_unit_test(test_stack_sigaltstack_bounds),
    };
    return cmocka_run_group_tests_name("stack", tests, NULL, NULL);
}
