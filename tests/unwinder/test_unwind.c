/* tests/unwinder/test_unwind.c: unwinding copies of this process's own stack, as the
 * service unwinds a client's: registers from hp_capture_regs(), the stack copied from the
 * stack pointer to the end of its mapping (at most 64 KiB), /proc/self/maps and
 * /proc/self/mem as the handshake would pass them. */

/* cmocka.h needs these first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* clang-format on */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <ucontext.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/utable.h"
#include "tests/support/regs.h"
#include "tests/unwinder/unwtest.h"
#include "unwinder/elf_cache.h"
#include "unwinder/maps.h"
#include "unwinder/sigmask.h"
#include "unwinder/unwinder.h"
#include "unwinder/unwinder_internal.h"

#define STACK_CAP (64 * 1024)

struct capture {
    uint64_t regs[HP_NREGS];
    uint64_t sp;
    size_t len;
    uint8_t stack[STACK_CAP];
};

static struct capture g_cap;
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];
static char g_exe[4096];

/* The stack holds other frames' ASan redzones: copy it without instrumentation, and
 * through volatile so the loop does not turn into an (intercepted) memcpy call. */
__attribute__((no_sanitize_address)) static void copy_raw(uint8_t *dst, uint64_t src_addr,
                                                          size_t len)
{
    const volatile uint8_t *src = (const volatile uint8_t *)(uintptr_t)src_addr;
    for (size_t i = 0; i < len; i++)
        dst[i] = src[i];
}

/* Copies the captured thread's stack from its sp to the end of the mapping holding it.
 * Runs in a frame below the captured sp, so the copied part is not disturbed. */
static UNWTEST_NOINLINE void cap_copy_stack(struct capture *c)
{
    uint64_t sp = c->regs[HP_REG_RSP];
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct unwinder__maps m;
    assert_int_equal(unwinder__maps_read(fd, &m), 0);
    close(fd);
    ssize_t i = unwinder__maps_find(&m, sp);
    assert_true(i >= 0);
    size_t len = (size_t)HP_MIN(m.v[i].end - sp, (uint64_t)STACK_CAP);
    unwinder__maps_done(&m);
    copy_raw(c->stack, sp, len);
    c->sp = sp;
    c->len = len;
}

static void cap_copy_cb(void *arg)
{
    cap_copy_stack(arg);
}

/* The chain the tests unwind through. */
void unw_test_level1(struct capture *c);
void unw_test_level2(struct capture *c);
void unw_test_level3(struct capture *c);
void unw_test_recurse(struct capture *c, int depth);
void unw_test_lib_cb(void *arg);
int unw_test_compar(const void *a, const void *b);

UNWTEST_NOINLINE void unw_test_level3(struct capture *c)
{
    hp_capture_regs(c->regs);
    cap_copy_stack(c);
    UNWTEST_BARRIER();
}

static int g_level2_call_line;

UNWTEST_NOINLINE void unw_test_level2(struct capture *c)
{
    /* clang-format off */
    unw_test_level3(c); g_level2_call_line = __LINE__;
    /* clang-format on */
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void unw_test_level1(struct capture *c)
{
    unw_test_level2(c);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void unw_test_recurse(struct capture *c, int depth)
{
    if (depth == 0) {
        hp_capture_regs(c->regs);
        cap_copy_stack(c);
    } else {
        unw_test_recurse(c, depth - 1);
    }
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void unw_test_lib_cb(void *arg)
{
    unw_test_level3(arg);
    UNWTEST_BARRIER();
}

static int g_compar_captured;

UNWTEST_NOINLINE int unw_test_compar(const void *a, const void *b)
{
    if (!g_compar_captured) {
        g_compar_captured = 1;
        hp_capture_regs(g_cap.regs);
        cap_copy_stack(&g_cap);
    }
    int x = *(const int *)a, y = *(const int *)b;
    UNWTEST_BARRIER();
    return (x > y) - (x < y);
}

static void dump(const char *what, const struct hp_frame *f, size_t n,
                 const struct unwinder_result *res)
{
    print_message("%s: %zu frames, error=%d truncated=%d reparsed=%d\n", what, n, res->error,
                  res->truncated, res->reparsed_maps);
    for (size_t i = 0; i < n; i++)
        print_message("  #%-3zu %-40s %#10llx %s\n", i, f[i].function_name,
                      (unsigned long long)f[i].rel_pc, f[i].map ? f[i].map->path : "-");
}

static unwinder_process_t *self_process(void)
{
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    assert_true(maps_fd >= 0 && mem_fd >= 0);
    unwinder_process_t *p = NULL;
    assert_int_equal(unwinder_process_new(getpid(), maps_fd, mem_fd, &p), 0);
    assert_non_null(p);
    return p;
}

static size_t unwind_capture(const struct capture *c, const char *what, size_t max,
                             struct unwinder_result *res)
{
    unwinder_process_t *p = self_process();
    size_t n = 0;
    assert_int_equal(unwinder_unwind(p, c->regs, c->sp, c->stack, c->len, g_frames, max, &n, res),
                     0);
    p = unwinder_process_free(p);
    assert_null(p);
    dump(what, g_frames, n, res);
    assert_true(n >= 1 && n <= max);
    return n;
}

static size_t find_name(const struct hp_frame *f, size_t n, size_t from, const char *name)
{
    for (size_t i = from; i < n; i++)
        if (strcmp(f[i].function_name, name) == 0)
            return i;
    return SIZE_MAX;
}

/* A frame in libc, or in a sanitizer runtime that intercepts libc functions. */
static bool in_runtime(const struct hp_frame *f)
{
    static const char *const libs[] = {"/libc.so", "/libasan.so", "/libtsan.so", "/libubsan.so"};
    for (size_t i = 0; f->map && i < HP_ARRAY_SIZE(libs); i++)
        if (strstr(f->map->path, libs[i]))
            return true;
    return false;
}

static void assert_exe_frame(const struct hp_frame *f, const char *name)
{
    assert_string_equal(f->function_name, name);
    assert_non_null(f->map);
    assert_string_equal(f->map->path, g_exe);
    assert_true(f->map->build_id_len >= 16);
    assert_true(f->rel_pc >= f->map->load_bias);
}

static void test_unwind_chain(void **state)
{
    (void)state;
    unw_test_level1(&g_cap);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "chain", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 6);
    assert_exe_frame(&g_frames[0], "unw_test_level3");
    assert_exe_frame(&g_frames[1], "unw_test_level2");
    assert_exe_frame(&g_frames[2], "unw_test_level1");
    assert_exe_frame(&g_frames[3], "test_unwind_chain");
    size_t m = find_name(g_frames, n, 4, "main");
    assert_true(m != SIZE_MAX);
    assert_exe_frame(&g_frames[m], "main");
    assert_false(res.error);
    assert_false(res.truncated);
    /* The stack ends in _start, after libc's __libc_start_main and its internal
     * __libc_start_call_main, named from libc's separate debug file (found by build id). */
    assert_string_equal(g_frames[n - 1].function_name, "_start");
    assert_true(m + 3 == n - 1);
    assert_string_equal(g_frames[m + 1].function_name, "__libc_start_call_main");
    assert_string_equal(g_frames[m + 2].function_name, "__libc_start_main");
    /* One mapping object per mapping: all frames of the executable's text share it. */
    assert_ptr_equal(g_frames[0].map, g_frames[3].map);
}

static void test_unwind_interned_across_processes(void **state)
{
    (void)state;
    unw_test_level1(&g_cap);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "first", UNWINDER_MAX_FRAMES, &res);
    struct hp_frame first[8];
    assert_true(n >= HP_ARRAY_SIZE(first));
    memcpy(first, g_frames, sizeof(first));
    size_t n2 = unwind_capture(&g_cap, "second", UNWINDER_MAX_FRAMES, &res);
    assert_int_equal(n, n2);
    for (size_t i = 0; i < HP_ARRAY_SIZE(first); i++) {
        assert_ptr_equal(first[i].map, g_frames[i].map);
        assert_ptr_equal(first[i].function_name, g_frames[i].function_name);
        assert_int_equal(first[i].rel_pc, g_frames[i].rel_pc);
    }
    assert_true(unwinder_global_bytes() > 0);
}

static void test_unwind_through_qsort(void **state)
{
    (void)state;
    int v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (i * 7) % 16;
    g_compar_captured = 0;
    qsort(v, 16, sizeof(v[0]), unw_test_compar);
    assert_int_equal(g_compar_captured, 1);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "qsort", UNWINDER_MAX_FRAMES, &res);
    assert_exe_frame(&g_frames[0], "unw_test_compar");
    /* Then libc's sort (internal functions have no exported names; under a sanitizer, its
     * interceptor's sort), then us. */
    size_t i = 1;
    while (i < n && in_runtime(&g_frames[i]))
        i++;
    assert_true(i >= 2);
    assert_true(i < n);
    /* libc's internal sort functions have names (from its debug file). */
    for (size_t k = 1; k < i; k++)
        if (strstr(g_frames[k].map->path, "/libc.so"))
            assert_true(g_frames[k].function_name[0] != '\0');
    assert_exe_frame(&g_frames[i], "test_unwind_through_qsort");
    assert_true(find_name(g_frames, n, i, "main") != SIZE_MAX);
    assert_false(res.error);
}

static void test_unwind_through_shared_library(void **state)
{
    (void)state;
    unwtest_lib_call(unw_test_lib_cb, &g_cap);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "shared library", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 5);
    assert_exe_frame(&g_frames[0], "unw_test_level3");
    assert_exe_frame(&g_frames[1], "unw_test_lib_cb");
    assert_string_equal(g_frames[2].function_name, "unwtest_lib_call");
    assert_non_null(g_frames[2].map);
    assert_non_null(strstr(g_frames[2].map->path, "/libunwtest.so"));
    assert_true(g_frames[2].map->build_id_len >= 16);
    assert_true(g_frames[2].map->build_id_len != g_frames[0].map->build_id_len ||
                memcmp(g_frames[2].map->build_id, g_frames[0].map->build_id,
                       g_frames[0].map->build_id_len) != 0);
    assert_exe_frame(&g_frames[3], "test_unwind_through_shared_library");
    assert_false(res.error);
}

/* The process exec'd or exited before its stack was unwound: /proc/PID/mem reads nothing
 * any more. Unwinding through a function with a personality routine reads the routine's
 * address from the library's writable data; it must still reach main (the bytes come
 * from the file). Bug: the last samples of a process that exec'd or exited right after
 * allocating (stdio's buffer in puts) ended in UNWIND_INFO_INVALID. */
static void test_unwind_bug_personality_after_exit(void **state)
{
    (void)state;
    unwtest_lib_call_cleanup(unw_test_lib_cb, &g_cap);
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    assert_true(maps_fd >= 0);
    unwinder_process_t *p = NULL;
    assert_int_equal(unwinder_process_new(getpid(), maps_fd, -1, &p), 0);
    size_t n = 0;
    struct unwinder_result res;
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    p = unwinder_process_free(p);
    dump("personality, no memory", g_frames, n, &res);
    assert_exe_frame(&g_frames[0], "unw_test_level3");
    assert_exe_frame(&g_frames[1], "unw_test_lib_cb");
    assert_string_equal(g_frames[2].function_name, "unwtest_lib_call_cleanup");
    assert_non_null(strstr(g_frames[2].map->path, "/libunwtest_eh.so"));
    assert_exe_frame(&g_frames[3], "test_unwind_bug_personality_after_exit");
    assert_true(find_name(g_frames, n, 4, "main") != SIZE_MAX);
    assert_false(res.error);
}

void unw_test_mid_cb(void *arg);
UNWTEST_NOINLINE void unw_test_mid_cb(void *arg)
{
    hp_capture_regs(((struct capture *)arg)->regs);
    cap_copy_stack(arg);
    UNWTEST_BARRIER();
}

/* A libheapprof frame between two of the program's is left out too. */
static void test_unwind_skips_libheapprof_mid_frame(void **state)
{
    (void)state;
    hpskiptest_call(unw_test_mid_cb, &g_cap);
    UNWTEST_BARRIER();
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "libheapprof mid frame", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 3);
    assert_exe_frame(&g_frames[0], "unw_test_mid_cb");
    assert_exe_frame(&g_frames[1], "test_unwind_skips_libheapprof_mid_frame");
    for (size_t i = 0; i < n; i++)
        assert_true(!g_frames[i].map || !strstr(g_frames[i].map->path, "libheapprof"));
    assert_false(res.error);
}

static void test_unwind_skips_libheapprof_frames(void **state)
{
    (void)state;
    hpskiptest_capture(g_cap.regs, cap_copy_cb, &g_cap);
    UNWTEST_BARRIER();
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "libheapprof skipped", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 2);
    assert_exe_frame(&g_frames[0], "test_unwind_skips_libheapprof_frames");
    for (size_t i = 0; i < n; i++)
        assert_true(!g_frames[i].map || !strstr(g_frames[i].map->path, "libheapprof"));
    assert_false(res.error);
}

static struct capture g_tcap;

static void *unw_test_thread_main(void *arg)
{
    unw_test_level1(arg);
    UNWTEST_BARRIER();
    return NULL;
}

static void test_unwind_second_thread(void **state)
{
    (void)state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, unw_test_thread_main, &g_tcap), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_tcap, "thread", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 4);
    assert_exe_frame(&g_frames[0], "unw_test_level3");
    assert_exe_frame(&g_frames[1], "unw_test_level2");
    assert_exe_frame(&g_frames[2], "unw_test_level1");
    assert_exe_frame(&g_frames[3], "unw_test_thread_main");
    /* Then start_thread and clone3 in libc (after a sanitizer's thread start, if any),
     * where the stack ends cleanly. */
    assert_true(n - 4 <= 3);
    for (size_t i = 4; i < n; i++)
        assert_true(in_runtime(&g_frames[i]));
    assert_false(res.error);
}

static void test_unwind_deep_recursion(void **state)
{
    (void)state;
    unw_test_recurse(&g_cap, 300);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "recursion", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 302);
    for (size_t i = 0; i <= 300; i++)
        assert_exe_frame(&g_frames[i], "unw_test_recurse");
    assert_exe_frame(&g_frames[301], "test_unwind_deep_recursion");
    assert_false(res.error);
    assert_false(res.truncated);
}

static void test_unwind_max_frames_truncates(void **state)
{
    (void)state;
    unw_test_recurse(&g_cap, 300);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "truncated", 50, &res);
    assert_int_equal(n, 50);
    for (size_t i = 0; i < 49; i++)
        assert_string_equal(g_frames[i].function_name, "unw_test_recurse");
    assert_string_equal(g_frames[49].function_name, "ERROR MAX_FRAMES_EXCEEDED");
    assert_null(g_frames[49].map);
    assert_true(res.truncated);
    assert_true(res.error);

    /* Room for a single frame: only the error frame. */
    n = unwind_capture(&g_cap, "one frame", 1, &res);
    assert_int_equal(n, 1);
    assert_string_equal(g_frames[0].function_name, "ERROR MAX_FRAMES_EXCEEDED");
}

/* A copy cut short (the client's cap, or a foreign stack of unknown end): the unwind
 * stops where the copy does, with a frame that says so, instead of reading on in the
 * process's stack, which holds other frames by now (user trial finding 2: such samples
 * ended in "ERROR INVALID_MAP" and counted as unwinding errors). The rules of the frames
 * found are published as after a whole unwind. */
static void test_unwind_bug_cut_copy_is_truncated(void **state)
{
    (void)state;
    unw_test_recurse(&g_cap, 300);
    assert_true(g_cap.len > 8192);
    unwinder_process_t *p = self_process();
    int fd;
    assert_int_equal(utable_create(UTABLE_MIN_SLOTS * 16, &fd), 0);
    assert_int_equal(unwinder_process_set_table(p, fd), 0);
    close(fd);
    struct unwinder_result res;
    size_t n = 0;
    assert_int_equal(unwinder_unwind_copy(p, g_cap.regs, g_cap.sp, g_cap.stack, 4096,
                                          UNWINDER_COPY_CUT, g_frames, UNWINDER_MAX_FRAMES, &n,
                                          &res),
                     0);
    dump("cut copy", g_frames, n, &res);
    assert_true(n >= 3 && n < 300);
    for (size_t i = 0; i + 1 < n; i++)
        assert_exe_frame(&g_frames[i], "unw_test_recurse");
    assert_string_equal(g_frames[n - 1].function_name, UNWINDER_TRUNCATED_FRAME);
    assert_null(g_frames[n - 1].map);
    assert_true(res.copy_truncated);
    assert_false(res.error);
    assert_false(res.truncated);
    struct unwinder_table_stats ts;
    unwinder_table_stats(p, &ts);
    assert_true(ts.published >= 1);
    /* The whole copy, cut or not, unwinds to the end. */
    assert_int_equal(unwinder_unwind_copy(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len,
                                          UNWINDER_COPY_CUT, g_frames, UNWINDER_MAX_FRAMES, &n,
                                          &res),
                     0);
    assert_true(n >= 302);
    assert_false(res.copy_truncated);
    assert_false(res.error);
    /* A copy of a foreign stack that ends where its memory does: the unwind ends there,
     * without an error frame. */
    assert_int_equal(unwinder_unwind_copy(p, g_cap.regs, g_cap.sp, g_cap.stack, 4096,
                                          UNWINDER_COPY_ENDS, g_frames, UNWINDER_MAX_FRAMES, &n,
                                          &res),
                     0);
    assert_true(n >= 2 && n < 300);
    for (size_t i = 0; i < n; i++)
        assert_exe_frame(&g_frames[i], "unw_test_recurse");
    assert_false(res.copy_truncated);
    assert_false(res.error);
    p = unwinder_process_free(p);
}

/* A ucontext fiber's stack, copied whole (its mapping ends at its top): the stack ends at
 * glibc's __start_context, which makecontext pushes as the return address of the fiber's
 * function (no CFI covers the byte before it), named, and without an error frame. */
static ucontext_t g_fiber_caller, g_fiber;

void unw_test_fiber_main(void);
UNWTEST_NOINLINE void unw_test_fiber_main(void)
{
    unw_test_level1(&g_cap);
    UNWTEST_BARRIER();
}

static void test_unwind_fiber_ends_at_its_entry(void **state)
{
    (void)state;
    size_t size = 128u << 10;
    char *m = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    /* Guard pages on both sides: the copy stops at the fiber's top. */
    assert_int_equal(mprotect(m + size, 4096, PROT_NONE), 0);
    assert_int_equal(getcontext(&g_fiber), 0);
    g_fiber.uc_stack.ss_sp = m;
    g_fiber.uc_stack.ss_size = size;
    g_fiber.uc_link = &g_fiber_caller;
    makecontext(&g_fiber, unw_test_fiber_main, 0);
    assert_int_equal(swapcontext(&g_fiber_caller, &g_fiber), 0);
    unwinder_process_t *p = self_process();
    struct unwinder_result res;
    size_t n = 0;
    assert_int_equal(unwinder_unwind_copy(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len,
                                          UNWINDER_COPY_ENDS, g_frames, UNWINDER_MAX_FRAMES, &n,
                                          &res),
                     0);
    dump("fiber", g_frames, n, &res);
    assert_int_equal(n, 5);
    assert_exe_frame(&g_frames[0], "unw_test_level3");
    assert_exe_frame(&g_frames[3], "unw_test_fiber_main");
    assert_string_equal(g_frames[4].function_name, "__start_context");
    assert_true(in_runtime(&g_frames[4]));
    assert_false(res.error);
    assert_false(res.copy_truncated);
    p = unwinder_process_free(p);
    (void)munmap(m, size + 4096);
}

static void test_unwind_bad_arguments(void **state)
{
    (void)state;
    unwinder_process_t *p = self_process();
    size_t n = 7;
    struct unwinder_result res;
    uint64_t regs[HP_NREGS] = {0};
    assert_int_equal(unwinder_unwind(p, regs, 0, NULL, 0, g_frames, 0, &n, &res), -EINVAL);
    assert_int_equal(unwinder_unwind(p, regs, 0, NULL, 8, g_frames, 10, &n, &res), -EINVAL);
    assert_int_equal(n, 7);
    /* All-zero registers: pc 0 is no code. */
    assert_int_equal(unwinder_unwind(p, regs, 0, NULL, 0, g_frames, 10, &n, &res), 0);
    assert_int_equal(n, 1);
    assert_string_equal(g_frames[0].function_name, "ERROR INVALID_MAP");
    assert_true(res.error);
    p = unwinder_process_free(p);

    /* Both fds are taken even on failure. */
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(unwinder_process_new(1, fd, -1, NULL), -EINVAL);
    assert_int_equal(fcntl(fd, F_GETFD), -1);
}

static void test_unwind_reparse_is_rate_limited(void **state)
{
    (void)state;
    unwinder_process_t *p = self_process();
    long page = sysconf(_SC_PAGESIZE);
    /* Mapped after the maps were read: unknown until a reparse. */
    uint8_t *code =
        mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(code != MAP_FAILED);
    uint64_t regs[HP_NREGS] = {0};
    uint8_t stack[64] = {0};
    /* A return address: the frame is that of the call, one byte before. */
    regs[HP_REG_RIP] = (uint64_t)(uintptr_t)code + 0x11;
    regs[HP_REG_RSP] = 0x1000;
    size_t n;
    struct unwinder_result res;
    assert_int_equal(unwinder_unwind(p, regs, 0x1000, stack, sizeof(stack), g_frames, 10, &n, &res),
                     0);
    dump("new anonymous code", g_frames, n, &res);
    assert_true(res.reparsed_maps);
    assert_non_null(g_frames[0].map);
    /* Anonymous executable memory is JIT code (named from a perf map when there is one). */
    assert_string_equal(g_frames[0].map->path, "[jit]");
    assert_int_equal(g_frames[0].map->start, (uint64_t)(uintptr_t)code);
    assert_int_equal(g_frames[0].rel_pc, 0x10);

    /* A second new mapping right after: the reparse is not repeated within 100 ms. */
    uint8_t *code2 =
        mmap(NULL, (size_t)page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(code2 != MAP_FAILED);
    regs[HP_REG_RIP] = (uint64_t)(uintptr_t)code2 + 0x20;
    assert_int_equal(unwinder_unwind(p, regs, 0x1000, stack, sizeof(stack), g_frames, 10, &n, &res),
                     0);
    dump("second new code", g_frames, n, &res);
    assert_false(res.reparsed_maps);
    assert_null(g_frames[0].map);
    assert_int_equal(g_frames[0].rel_pc, regs[HP_REG_RIP] - 1);
    assert_true(res.error);
    assert_string_equal(g_frames[n - 1].function_name, "ERROR INVALID_MAP");
    p = unwinder_process_free(p);
    munmap(code, 2 * (size_t)page);
    munmap(code2, (size_t)page);
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Copies of libunwtest.so with bytes flipped (seed 0xe1f, 24 files), mapped executable:
 * the ELF cache and libunwind must cope with broken headers, program headers and unwind
 * tables. Files are kept until the end so that no inode is reused while cached. */
static void test_unwind_corrupt_elf_files(void **state)
{
    (void)state;
    Dl_info info;
    assert_true(dladdr((void *)unwtest_lib_call, &info) != 0);
    int src = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
    assert_true(src >= 0);
    static uint8_t orig[1 << 20];
    ssize_t size = read(src, orig, sizeof(orig));
    close(src);
    assert_true(size > 4096 && size < (ssize_t)sizeof(orig));

    enum { NFILES = 24 };
    char paths[NFILES][64];
    void *maps[NFILES];
    static uint8_t buf[1 << 20], stack[1024];
    uint64_t seed = 0xe1f;
    unwinder_process_t *p = NULL;
    for (int f = 0; f < NFILES; f++) {
        memcpy(buf, orig, (size_t)size);
        /* Half the flips in the first page (headers), the rest anywhere. */
        for (int k = 0; k < 64; k++) {
            uint64_t r = xorshift(&seed);
            size_t at = k % 2 ? (size_t)(r % 4096) : (size_t)(r % (uint64_t)size);
            buf[at] ^= (uint8_t)(r >> 32) | 1;
        }
        snprintf(paths[f], sizeof(paths[f]), "/tmp/unwtest-elf-XXXXXX");
        int fd = mkstemp(paths[f]);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, buf, (size_t)size), size);
        maps[f] = mmap(NULL, (size_t)size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        assert_true(maps[f] != MAP_FAILED);
        close(fd);
    }
    p = self_process();
    size_t named = 0, deeper = 0;
    for (int f = 0; f < NFILES; f++) {
        for (int k = 0; k < 8; k++) {
            uint64_t regs[HP_NREGS];
            for (size_t r = 0; r < HP_NREGS; r++)
                regs[r] = xorshift(&seed);
            for (size_t i = 0; i < sizeof(stack); i++)
                stack[i] = (uint8_t)xorshift(&seed);
            uint64_t sp = 0x7ff000000000ull;
            regs[HP_REG_RIP] = (uint64_t)(uintptr_t)maps[f] + xorshift(&seed) % (uint64_t)size;
            regs[HP_REG_RSP] = sp;
            size_t n;
            struct unwinder_result res;
            assert_int_equal(unwinder_unwind(p, regs, sp, stack, sizeof(stack), g_frames,
                                             UNWINDER_MAX_FRAMES, &n, &res),
                             0);
            assert_true(n >= 1);
            /* The first frame is always attributed to the file it points into. */
            assert_non_null(g_frames[0].map);
            assert_string_equal(g_frames[0].map->path, paths[f]);
            named += g_frames[0].function_name[0] != '\0';
            deeper += n > 2;
        }
    }
    print_message("corrupt ELF files: %zu of %d leaf frames named, %zu unwinds past 2 frames\n",
                  named, NFILES * 8, deeper);
    p = unwinder_process_free(p);
    for (int f = 0; f < NFILES; f++) {
        munmap(maps[f], (size_t)size);
        unlink(paths[f]);
    }
}

/* The maps text of the libunwtest.so mappings of this process, with the path and inode
 * replaced by those of @path (NULL: unchanged). */
static size_t lib_maps_text(const char *path, char *out, size_t cap)
{
    Dl_info info;
    assert_true(dladdr((void *)unwtest_lib_call, &info) != 0);
    struct stat st;
    if (path)
        assert_int_equal(stat(path, &st), 0);
    FILE *f = fopen("/proc/self/maps", "re");
    assert_non_null(f);
    char line[4096];
    size_t len = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strstr(line, info.dli_fname))
            continue;
        char range[64], perms[8], off[32], dev[16];
        unsigned long long ino;
        assert_int_equal(sscanf(line, "%63s %7s %31s %15s %llu", range, perms, off, dev, &ino), 5);
        int k =
            path ? snprintf(out + len, cap - len, "%s %s %s %02x:%02x %llu %s\n", range, perms, off,
                            major(st.st_dev), minor(st.st_dev), (unsigned long long)st.st_ino, path)
                 : snprintf(out + len, cap - len, "%s", line);
        assert_true(k > 0 && (size_t)k < cap - len);
        len += (size_t)k;
    }
    fclose(f);
    assert_true(len > 0);
    return len;
}

/* Registers and a zeroed stack (@stack, @len bytes) of one frame in unwtest_lib_call, at
 * its first instruction seen as a return address (the pc after it), whose return
 * address is 0. Returns the stack pointer. */
static uint64_t lib_call_frame(uint64_t regs[HP_NREGS], uint8_t *stack, size_t len)
{
    memset(regs, 0, HP_NREGS * sizeof(regs[0]));
    memset(stack, 0, len);
    uint64_t sp = 0x7ff000001000ull;
    regs[HP_REG_RIP] = (uint64_t)(uintptr_t)unwtest_lib_call + 1;
    regs[HP_REG_RSP] = sp;
    return sp;
}

/* A process whose maps (in a memfd, returned in @ret_maps_fd) show the library of
 * unwtest_lib_call only. */
static unwinder_process_t *lib_process(int *ret_maps_fd)
{
    static char text[16384];
    int maps_fd = memfd_create("maps", MFD_CLOEXEC);
    assert_true(maps_fd >= 0);
    size_t len = lib_maps_text(NULL, text, sizeof(text));
    assert_int_equal(pwrite(maps_fd, text, len, 0), (ssize_t)len);
    unwinder_process_t *p = NULL;
    assert_int_equal(unwinder_process_new(getpid(), maps_fd, -1, &p), 0);
    *ret_maps_fd = maps_fd;
    return p;
}

/* A library unloaded and another one loaded at the same addresses (simulated: the maps
 * text changes under fixed addresses, to a file whose function at the same offset has
 * another name). The pc is not unknown, so only the refresh of old maps notices; the
 * frame must then be named from the new file, not from what was cached for the old one. */
static void test_unwind_library_replaced_at_same_address(void **state)
{
    (void)state;
    static char text[16384];
    int maps_fd;
    unwinder_process_t *p = lib_process(&maps_fd);

    /* Frame 0 at the function's first instruction (as a return address: the pc after
     * it), whose return address is 0: one frame. */
    uint64_t regs[HP_NREGS];
    static uint8_t stack[64];
    uint64_t sp = lib_call_frame(regs, stack, sizeof(stack));
    size_t n;
    struct unwinder_result res;
    assert_int_equal(
        unwinder_unwind(p, regs, sp, stack, sizeof(stack), g_frames, UNWINDER_MAX_FRAMES, &n, &res),
        0);
    assert_true(n >= 1);
    assert_string_equal(g_frames[0].function_name, "unwtest_lib_call");
    uint64_t rel_pc = g_frames[0].rel_pc;

    /* What the other library has at that address. */
    struct stat st;
    assert_int_equal(stat(UNWDL_PATH, &st), 0);
    const struct unwinder__elf *e = NULL;
    assert_int_equal(unwinder__elf_get(st.st_dev, st.st_ino, UNWDL_PATH, &e), 0);
    assert_true(e->ok);
    const char *want = unwinder__elf_symbol(e, rel_pc);
    unwinder__elf_put(e);
    assert_non_null(want);
    assert_string_not_equal(want, "unwtest_lib_call");

    size_t len = lib_maps_text(UNWDL_PATH, text, sizeof(text));
    assert_int_equal(ftruncate(maps_fd, 0), 0);
    assert_int_equal(pwrite(maps_fd, text, len, 0), (ssize_t)len);
    uint64_t saved = unwinder__maps_refresh_ns;
    unwinder__maps_refresh_ns = 0;
    assert_int_equal(
        unwinder_unwind(p, regs, sp, stack, sizeof(stack), g_frames, UNWINDER_MAX_FRAMES, &n, &res),
        0);
    unwinder__maps_refresh_ns = saved;
    assert_true(n >= 1);
    assert_string_equal(g_frames[0].function_name, want);
    assert_non_null(strstr(g_frames[0].map->path, "libunwdl.so"));
    p = unwinder_process_free(p);
}

/* This process's maps without the lines of the files whose path contains @drop (NULL:
 * all lines), into @out; returns the length. */
static size_t self_maps_without(const char *drop, char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/maps", "re");
    assert_non_null(f);
    char line[4096];
    size_t len = 0;
    while (fgets(line, sizeof(line), f)) {
        if (drop && strstr(line, drop))
            continue;
        size_t n = strlen(line);
        assert_true(len + n < cap);
        memcpy(out + len, line, n);
        len += n;
    }
    fclose(f);
    return len;
}

static void set_maps(int fd, const char *text, size_t len)
{
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(pwrite(fd, text, len, 0), (ssize_t)len);
}

/* The same replacement, but the client tells of its loads and unloads (it sent
 * WIRE_MAPS_CHANGED before), and has not told of this one yet: the records read before
 * it says so were written before the replacement, and keep the old library's names. The
 * refresh of old maps read the maps as they are now and named them from the new file: a
 * slow service (TSan's, beside a CPU hog) named 133 samples of one library in
 * tests/programs/dlloop.c after the other (e2e_record's
 * test_record_dlclose_resets_walks). */
static void test_unwind_bug_refresh_ahead_of_told_loads(void **state)
{
    (void)state;
    static char text[16384];
    int maps_fd;
    unwinder_process_t *p = lib_process(&maps_fd);
    /* The client tells of a load (this library's, say). */
    unwinder_maps_changed(p, false);

    uint64_t regs[HP_NREGS];
    static uint8_t stack[64];
    uint64_t sp = lib_call_frame(regs, stack, sizeof(stack));
    uint64_t pcs[1] = {regs[HP_REG_RIP] + 1}; /* a return address just past the pc */
    size_t n;
    struct unwinder_result res;

    /* The library is replaced at the same addresses; the client has not said so yet. */
    size_t len = lib_maps_text(UNWDL_PATH, text, sizeof(text));
    set_maps(maps_fd, text, len);
    uint64_t saved = unwinder__maps_refresh_ns;
    unwinder__maps_refresh_ns = 0;
    assert_int_equal(
        unwinder_unwind(p, regs, sp, stack, sizeof(stack), g_frames, UNWINDER_MAX_FRAMES, &n, &res),
        0);
    assert_true(n >= 1);
    assert_string_equal(g_frames[0].function_name, "unwtest_lib_call");
    assert_int_equal(unwinder_resolve_pcs(p, pcs, 1, g_frames, UNWINDER_MAX_FRAMES, &n, &res), 0);
    assert_true(n >= 1);
    assert_string_equal(g_frames[0].function_name, "unwtest_lib_call");

    /* It says so (its next sample's record comes after): the new file names the frames. */
    unwinder_maps_changed(p, true);
    assert_int_equal(unwinder_resolve_pcs(p, pcs, 1, g_frames, UNWINDER_MAX_FRAMES, &n, &res), 0);
    assert_true(n >= 1);
    assert_non_null(strstr(g_frames[0].map->path, "libunwdl.so"));
    assert_string_not_equal(g_frames[0].function_name, "unwtest_lib_call");
    unwinder__maps_refresh_ns = saved;
    p = unwinder_process_free(p);
}

/* The unwind table survives code being added (dlopen) and is reset when code goes away
 * or the client says it unloaded some (WIRE_MAPS_CHANGED). */
static void test_unwind_table_reset_when_code_goes(void **state)
{
    (void)state;
    static char text[1 << 20];
    int maps_fd = memfd_create("maps", MFD_CLOEXEC);
    assert_true(maps_fd >= 0);
    /* At first libunwtest_eh.so is not loaded as far as the maps say. */
    set_maps(maps_fd, text, self_maps_without("libunwtest_eh.so", text, sizeof(text)));
    unwinder_process_t *p = NULL;
    assert_int_equal(
        unwinder_process_new(getpid(), maps_fd, open("/proc/self/mem", O_RDONLY | O_CLOEXEC), &p),
        0);
    int table_fd;
    struct utable reader;
    assert_int_equal(utable_create(UTABLE_DEFAULT_SLOTS, &table_fd), 0);
    assert_int_equal(unwinder_process_set_table(p, table_fd), 0);
    assert_int_equal(utable_map(table_fd, false, &reader), 0);
    close(table_fd);

    unwtest_lib_call(unw_test_lib_cb, &g_cap);
    size_t n;
    struct unwinder_result res;
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    assert_false(res.error);
    struct unwinder_table_stats ts;
    unwinder_table_stats(p, &ts);
    print_message("  %llu rules published\n", (unsigned long long)ts.published);
    assert_true(ts.published >= n - 1);
    assert_int_equal(ts.flushes, 0);
    uint64_t gen = utable_gen(&reader);
    /* The rule of the frame in libunwtest.so is there. */
    uint64_t rule;
    assert_true(utable_lookup(&reader, gen, (uint64_t)g_cap.regs[HP_REG_RIP], &rule));

    /* Code added (a dlopen): the rules stay. */
    set_maps(maps_fd, text, self_maps_without(NULL, text, sizeof(text)));
    unwinder_maps_changed(p, false);
    unwinder_table_stats(p, &ts);
    assert_int_equal(ts.flushes, 0);
    assert_int_equal(utable_gen(&reader), gen);
    /* The same maps again, after an unload the maps do not show (the library stayed
     * loaded): reset anyway, the client waits for it. */
    unwinder_maps_changed(p, true);
    unwinder_table_stats(p, &ts);
    assert_int_equal(ts.flushes, 1);
    assert_int_not_equal(utable_gen(&reader), gen);
    assert_false(
        utable_lookup(&reader, utable_gen(&reader), (uint64_t)g_cap.regs[HP_REG_RIP], &rule));
    /* Rules published again, then code gone: reset. */
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    gen = utable_gen(&reader);
    assert_true(utable_lookup(&reader, gen, (uint64_t)g_cap.regs[HP_REG_RIP], &rule));
    set_maps(maps_fd, text, self_maps_without("libunwtest.so", text, sizeof(text)));
    unwinder_maps_changed(p, false);
    unwinder_table_stats(p, &ts);
    assert_int_equal(ts.flushes, 2);
    assert_int_not_equal(utable_gen(&reader), gen);
    utable_unmap(&reader);
    p = unwinder_process_free(p);
}

/* A process that exited reads as no mappings: the periodic reread of the maps must keep
 * the old ones, or its last records (unwound after its exit) lose their names. Bug: every
 * record read after the first reread past a client's exit ended in INVALID_MAP. */
/* A library unloaded before the records of its samples were read (the service lags, and
 * a dlclose no longer waits for it): the reread that finds it gone keeps its mappings for
 * those records, frames and unwind tables alike, until the caller says they are read. */
static void test_unwind_unloaded_library_kept_until_dropped(void **state)
{
    (void)state;
    static char text[1 << 20];
    unwtest_lib_call(unw_test_lib_cb, &g_cap);
    int maps_fd = memfd_create("maps", MFD_CLOEXEC);
    assert_true(maps_fd >= 0);
    set_maps(maps_fd, text, self_maps_without(NULL, text, sizeof(text)));
    unwinder_process_t *p = NULL;
    assert_int_equal(
        unwinder_process_new(getpid(), maps_fd, open("/proc/self/mem", O_RDONLY | O_CLOEXEC), &p),
        0);
    size_t n = 0;
    struct unwinder_result res;
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    assert_string_equal(g_frames[2].function_name, "unwtest_lib_call");
    assert_int_equal(unwinder_retired_seq(p), 0);

    /* Unloaded (as far as the maps say): still named and unwound through. */
    set_maps(maps_fd, text, self_maps_without("libunwtest.so", text, sizeof(text)));
    unwinder_maps_changed(p, true);
    assert_int_equal(unwinder_retired_seq(p), 1);
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    dump("unloaded, kept", g_frames, n, &res);
    assert_false(res.error);
    assert_string_equal(g_frames[2].function_name, "unwtest_lib_call");
    assert_exe_frame(&g_frames[3], "test_unwind_unloaded_library_kept_until_dropped");
    /* Another reread keeps them (they are not new: the count stays). */
    unwinder_maps_changed(p, false);
    assert_int_equal(unwinder_retired_seq(p), 1);

    /* Read: let go. The library's frames are unknown now. */
    unwinder_retired_drop(p, 1);
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    dump("unloaded, dropped", g_frames, n, &res);
    assert_true(n >= 3);
    assert_null(g_frames[2].map);
    assert_string_equal(g_frames[2].function_name, "");
    p = unwinder_process_free(p);
}

static void test_unwind_bug_exited_process_keeps_maps(void **state)
{
    (void)state;
    static char text[1 << 20];
    int maps_fd = memfd_create("maps", MFD_CLOEXEC);
    assert_true(maps_fd >= 0);
    set_maps(maps_fd, text, self_maps_without(NULL, text, sizeof(text)));
    unwinder_process_t *p = NULL;
    assert_int_equal(unwinder_process_new(getpid(), maps_fd, -1, &p), 0);
    unw_test_level1(&g_cap);
    size_t n, n2;
    struct unwinder_result res;
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    assert_false(res.error);
    /* The process is gone: its maps file reads empty. */
    set_maps(maps_fd, text, 0);
    uint64_t saved = unwinder__maps_refresh_ns;
    unwinder__maps_refresh_ns = 0;
    assert_int_equal(unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, g_frames,
                                     UNWINDER_MAX_FRAMES, &n2, &res),
                     0);
    unwinder__maps_refresh_ns = saved;
    dump("after exit", g_frames, n2, &res);
    assert_false(res.error);
    assert_int_equal(n2, n);
    assert_string_equal(g_frames[0].function_name, "unw_test_level3");
    uint64_t pcs[1] = {g_cap.regs[HP_REG_RIP]};
    assert_int_equal(unwinder_resolve_pcs(p, pcs, 1, g_frames, UNWINDER_MAX_FRAMES, &n2, &res), 0);
    assert_false(res.error);
    assert_string_equal(g_frames[0].function_name, "unw_test_level3");
    p = unwinder_process_free(p);
}

#define CONC_THREADS 4
#define CONC_FRAMES 16

struct conc {
    pthread_t t;
    struct hp_frame frames[CONC_FRAMES];
    size_t n;
    int failures;
};

static void *conc_main(void *arg)
{
    struct conc *c = arg;
    for (int i = 0; i < 20; i++) {
        int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
        unwinder_process_t *p;
        struct unwinder_result res;
        if (unwinder_process_new(getpid(), maps_fd, mem_fd, &p) < 0 ||
            unwinder_unwind(p, g_cap.regs, g_cap.sp, g_cap.stack, g_cap.len, c->frames, CONC_FRAMES,
                            &c->n, &res) < 0 ||
            res.error)
            c->failures++;
        p = unwinder_process_free(p);
    }
    return NULL;
}

/* Threads with a process each, starting from empty global caches so that they race to
 * fill them: all must see the same interned mappings and names (run under TSan too). */
static void test_unwind_concurrent_processes(void **state)
{
    (void)state;
    unwinder_global_done();
    assert_int_equal(unwinder_global_init(), 0);
    unw_test_level1(&g_cap);
    static struct conc c[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++)
        assert_int_equal(pthread_create(&c[i].t, NULL, conc_main, &c[i]), 0);
    for (int i = 0; i < CONC_THREADS; i++)
        assert_int_equal(pthread_join(c[i].t, NULL), 0);
    for (int i = 0; i < CONC_THREADS; i++) {
        assert_int_equal(c[i].failures, 0);
        assert_int_equal(c[i].n, c[0].n);
        for (size_t k = 0; k < c[0].n; k++) {
            assert_ptr_equal(c[i].frames[k].map, c[0].frames[k].map);
            assert_ptr_equal(c[i].frames[k].function_name, c[0].frames[k].function_name);
            assert_int_equal(c[i].frames[k].rel_pc, c[0].frames[k].rel_pc);
        }
    }
    assert_string_equal(c[0].frames[0].function_name, "unw_test_level3");
    assert_string_equal(c[0].frames[3].function_name, "test_unwind_concurrent_processes");
}

/* Seed 0x5eed, 1000 iterations; each unwind must finish, and all of them within 10 s
 * (they take well under a second). Four kinds of input: random everything; a real pc
 * with random stack bytes; random stack words mixing real code addresses and pointers
 * into the stack (long plausible chains, loops); a real capture with a few bytes
 * flipped. */
static void test_unwind_hostile_input_terminates(void **state)
{
    (void)state;
    static uint8_t stack[8192];
    static struct capture real;
    unw_test_level1(&real);
    const uint64_t code[] = {
        (uint64_t)(uintptr_t)unw_test_level1,  (uint64_t)(uintptr_t)unw_test_level2,
        (uint64_t)(uintptr_t)unw_test_recurse, (uint64_t)(uintptr_t)qsort,
        (uint64_t)(uintptr_t)unwtest_lib_call, (uint64_t)(uintptr_t)memcpy,
    };
    unwinder_process_t *p = self_process();
    uint64_t seed = 0x5eed, t0 = hp_clock_ns(CLOCK_MONOTONIC);
    size_t errors = 0, frames_total = 0;
    for (int iter = 0; iter < 1000; iter++) {
        uint64_t regs[HP_NREGS];
        uint64_t sp;
        size_t len;
        const uint8_t *st = stack;
        int kind = iter % 4;
        for (size_t r = 0; r < HP_NREGS; r++)
            regs[r] = xorshift(&seed);
        if (kind == 3) {
            memcpy(regs, real.regs, sizeof(regs));
            memcpy(stack, real.stack, HP_MIN(real.len, sizeof(stack)));
            len = HP_MIN(real.len, sizeof(stack));
            sp = real.sp;
            for (int k = 0; k < 4; k++)
                stack[xorshift(&seed) % len] ^= (uint8_t)(1u << (xorshift(&seed) % 8));
        } else {
            len = xorshift(&seed) % sizeof(stack);
            sp = kind == 0 ? xorshift(&seed) : 0x7ff000000000ull + (xorshift(&seed) & 0xfff0);
            for (size_t i = 0; i + 8 <= len; i += 8) {
                uint64_t w = xorshift(&seed);
                if (kind == 2 && (w & 3) == 1)
                    w = code[(w >> 8) % HP_ARRAY_SIZE(code)] + ((w >> 16) % 200);
                else if (kind == 2 && (w & 3) == 2)
                    w = sp + ((w >> 8) % (len + 64));
                memcpy(stack + i, &w, 8);
            }
            if (kind >= 1) {
                regs[HP_REG_RIP] =
                    code[xorshift(&seed) % HP_ARRAY_SIZE(code)] + xorshift(&seed) % 200;
                regs[HP_REG_RSP] = sp;
                regs[6] = sp + (xorshift(&seed) % (len + 16)); /* rbp */
            }
        }
        size_t n = 0;
        struct unwinder_result res;
        assert_int_equal(
            unwinder_unwind(p, regs, sp, st, len, g_frames, UNWINDER_MAX_FRAMES, &n, &res), 0);
        assert_true(n >= 1 && n <= UNWINDER_MAX_FRAMES);
        for (size_t i = 0; i < n; i++)
            assert_non_null(g_frames[i].function_name);
        if (res.error) {
            errors++;
            assert_memory_equal(g_frames[n - 1].function_name, "ERROR ", 6);
        }
        frames_total += n;
    }
    uint64_t dt_ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000;
    print_message("hostile: 1000 unwinds in %llu ms, %zu with an error frame, %zu frames\n",
                  (unsigned long long)dt_ms, errors, frames_total);
    assert_true(dt_ms < 10000);
    assert_true(errors > 0);
    p = unwinder_process_free(p);
}

/* libunwind's sigprocmask calls reach our no-op definition, and only inside an unwind:
 * outside, the real function still changes the mask. */
static void test_unwind_sigmask_bypass(void **state)
{
    (void)state;
    assert_true(unwinder__sigmask_interposed());
    sigset_t usr1, old, now;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    assert_int_equal(sigprocmask(SIG_BLOCK, &usr1, &old), 0);
    assert_int_equal(sigprocmask(SIG_SETMASK, NULL, &now), 0);
    assert_true(sigismember(&now, SIGUSR1));
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, NULL, &now), 0);
    assert_false(sigismember(&now, SIGUSR1));
    /* Unwinding still works, and leaves the flag clear. */
    unw_test_level1(&g_cap);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "sigmask", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 4);
    assert_false(res.error);
    assert_false(unwinder__sigmask_skip);
}

/* Lines of frames of this program and of libc (from libc's separate debug file). */
static void test_unwind_source_lines(void **state)
{
    (void)state;
    unw_test_level1(&g_cap);
    struct unwinder_result res;
    size_t n = unwind_capture(&g_cap, "source lines", UNWINDER_MAX_FRAMES, &res);
    assert_true(n >= 4);
    const char *file = NULL;
    uint32_t line = 0;
    assert_int_equal(unwinder_source_line(g_frames[1].map, g_frames[1].rel_pc, &file, &line), 0);
    print_message("unw_test_level2: %s:%u\n", file, line);
    assert_non_null(strstr(file, "test_unwind.c"));
    assert_int_equal(line, g_level2_call_line);
    /* Cached: the same interned pointer. */
    const char *file2 = NULL;
    assert_int_equal(unwinder_source_line(g_frames[1].map, g_frames[1].rel_pc, &file2, &line), 0);
    assert_ptr_equal(file, file2);
    size_t m = find_name(g_frames, n, 0, "__libc_start_call_main");
    assert_true(m != SIZE_MAX);
    assert_int_equal(unwinder_source_line(g_frames[m].map, g_frames[m].rel_pc, &file, &line), 0);
    print_message("__libc_start_call_main: %s:%u\n", file, line);
    assert_true(line > 0);
    assert_true(file[0] != '\0');
    /* Anonymous memory has no lines; the off switch answers at once. */
    struct hp_mapping anon = {.path = ""};
    assert_int_equal(unwinder_source_line(&anon, 0x10, &file, &line), -ENOENT);
    unwinder_set_source_lines(false);
    assert_int_equal(unwinder_source_line(g_frames[1].map, g_frames[1].rel_pc, &file, &line),
                     -ECANCELED);
    unwinder_set_source_lines(true);
}

static int group_setup(void **state)
{
    (void)state;
    ssize_t len = readlink("/proc/self/exe", g_exe, sizeof(g_exe) - 1);
    if (len <= 0)
        return -1;
    g_exe[len] = '\0';
    return unwinder_global_init() == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    unwinder_global_done();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unwind_chain),
        cmocka_unit_test(test_unwind_interned_across_processes),
        cmocka_unit_test(test_unwind_through_qsort),
        cmocka_unit_test(test_unwind_through_shared_library),
        cmocka_unit_test(test_unwind_bug_personality_after_exit),
        cmocka_unit_test(test_unwind_skips_libheapprof_frames),
        cmocka_unit_test(test_unwind_skips_libheapprof_mid_frame),
        cmocka_unit_test(test_unwind_second_thread),
        cmocka_unit_test(test_unwind_deep_recursion),
        cmocka_unit_test(test_unwind_max_frames_truncates),
        cmocka_unit_test(test_unwind_bug_cut_copy_is_truncated),
        cmocka_unit_test(test_unwind_fiber_ends_at_its_entry),
        cmocka_unit_test(test_unwind_bad_arguments),
        cmocka_unit_test(test_unwind_reparse_is_rate_limited),
        cmocka_unit_test(test_unwind_hostile_input_terminates),
        cmocka_unit_test(test_unwind_corrupt_elf_files),
        cmocka_unit_test(test_unwind_library_replaced_at_same_address),
        cmocka_unit_test(test_unwind_bug_refresh_ahead_of_told_loads),
        cmocka_unit_test(test_unwind_table_reset_when_code_goes),
        cmocka_unit_test(test_unwind_unloaded_library_kept_until_dropped),
        cmocka_unit_test(test_unwind_bug_exited_process_keeps_maps),
        cmocka_unit_test(test_unwind_concurrent_processes),
        cmocka_unit_test(test_unwind_sigmask_bypass),
        cmocka_unit_test(test_unwind_source_lines),
    };
    return cmocka_run_group_tests_name("unwinder_unwind", tests, group_setup, group_teardown);
}
