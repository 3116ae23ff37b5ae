/* tests/unwinder/test_variants.c: exact frame sequences from this program's own stack,
 * with the program built several ways (tests/unwinder/meson.build builds this file with
 * -O2 with and without frame pointers, -O0, non-PIE, and without .eh_frame). Each test
 * captures the registers and copies the stack as a client would, then unwinds it with a
 * process state made from /proc/self.
 *
 * Each capture is also walked as a client with an unwind table walks it
 * (preload/walk.c): right after the copy, while the captured frames are still live, the
 * copy is unwound by a process state that publishes its rules into a table, and the
 * live stack is walked with them. Where every frame has a simple rule the walk must
 * name exactly the frames the unwind found; where one has not (signal frames, code
 * with CFI only in .debug_frame, stacks deeper than a walk goes) it must give up. */

/* cmocka.h needs these first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* clang-format on */

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "preload/walk.h"
#include "shmem_ring/utable.h"
#include "tests/support/regs.h"
#include "tests/unwinder/unwtest.h"
#include "unwinder/maps.h"
#include "unwinder/unwinder.h"

#define STACK_CAP (64 * 1024)

struct capture {
    uint64_t regs[HP_NREGS];
    uint64_t sp;
    size_t len;
    uint8_t stack[STACK_CAP];
    /* The walk of the live stack right after the copy (walk_live). */
    uint64_t pcs[CLIENT_WALK_MAX_FRAMES];
    size_t n_pcs;
};

/* A process state publishing into a table, and the client's view of that table. */
static unwinder_process_t *g_walk_p;
static struct utable g_walk_table;
static struct hp_frame g_walk_frames[UNWINDER_MAX_FRAMES];

static struct capture g_cap;
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];
static size_t g_n;
static struct unwinder_result g_res;

__attribute__((no_sanitize_address)) static void copy_raw(uint8_t *dst, uint64_t src_addr,
                                                          size_t len)
{
    const volatile uint8_t *src = (const volatile uint8_t *)(uintptr_t)src_addr;
    for (size_t i = 0; i < len; i++)
        dst[i] = src[i];
}

/* Copies from the captured sp to the end of its mapping (at most STACK_CAP). Runs below
 * the captured frame. Async-signal-safe enough for the tests' handler (no allocation:
 * the maps are read into a static buffer). */
static UNWTEST_NOINLINE void cap_copy_stack(struct capture *c)
{
    static char text[1 << 20];
    uint64_t sp = c->regs[HP_REG_RSP];
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    size_t len = 0;
    ssize_t k;
    while (fd >= 0 && len < sizeof(text) && (k = read(fd, text + len, sizeof(text) - len)) > 0)
        len += (size_t)k;
    if (fd >= 0)
        close(fd);
    uint64_t end = sp;
    for (char *line = text; line < text + len;) {
        unsigned long long lo, hi;
        if (sscanf(line, "%llx-%llx", &lo, &hi) == 2 && sp >= lo && sp < hi)
            end = hi;
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        line = nl ? nl + 1 : text + len;
    }
    c->sp = sp;
    c->len = (size_t)HP_MIN(end - sp, (uint64_t)STACK_CAP);
    copy_raw(c->stack, sp, c->len);
}

static unwinder_process_t *self_process(void)
{
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    unwinder_process_t *p = NULL;
    assert_int_equal(unwinder_process_new(getpid(), maps_fd, mem_fd, &p), 0);
    return p;
}

static void unwind_with(unwinder_process_t *p, const struct capture *c, const char *what)
{
    assert_int_equal(unwinder_unwind(p, c->regs, c->sp, c->stack, c->len, g_frames,
                                     UNWINDER_MAX_FRAMES, &g_n, &g_res),
                     0);
    print_message("%s: %zu frames, error=%d truncated=%d\n", what, g_n, g_res.error,
                  g_res.truncated);
    for (size_t i = 0; i < g_n; i++)
        print_message("  #%-3zu %-36s %#8llx %s\n", i, g_frames[i].function_name,
                      (unsigned long long)g_frames[i].rel_pc,
                      g_frames[i].map ? g_frames[i].map->path : "-");
}

static void unwind_capture(const struct capture *c, const char *what)
{
    unwinder_process_t *p = self_process();
    unwind_with(p, c, what);
    unwinder_process_free(p);
}

/* A frame of libc, or of a sanitizer runtime that intercepts or wraps libc. */
static bool in_runtime(const struct hp_frame *f)
{
    static const char *const libs[] = {"/libc.so", "/libasan.so", "/libtsan.so", "/libubsan.so"};
    for (size_t i = 0; f->map && i < HP_ARRAY_SIZE(libs); i++)
        if (strstr(f->map->path, libs[i]))
            return true;
    return false;
}

/* g_frames[from..] starts with exactly @names; returns the index after them. */
static size_t expect_seq(size_t from, const char *const *names, size_t count)
{
    assert_true(from + count <= g_n);
    for (size_t i = 0; i < count; i++)
        assert_string_equal(g_frames[from + i].function_name, names[i]);
    return from + count;
}

#define EXPECT_SEQ(from, ...)                                                                      \
    expect_seq((from), (const char *const[]){__VA_ARGS__},                                         \
               sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

/* The stack continues from @from through cmocka to main and ends in libc's start code. */
static void expect_main_tail(size_t from)
{
    assert_false(g_res.error);
    size_t m = from;
    while (m < g_n && strcmp(g_frames[m].function_name, "main") != 0)
        m++;
    assert_true(m + 4 == g_n);
    EXPECT_SEQ(m, "main", "__libc_start_call_main", "__libc_start_main", "_start");
}

/* Unwinds @c's copy with the publishing process state, then walks the live stack (the
 * captured frames are still there: we run below them) with the rules published. */
static UNWTEST_NOINLINE void walk_live(struct capture *c)
{
    c->n_pcs = 0;
    if (!g_walk_p)
        return;
    size_t n;
    struct unwinder_result res;
    if (unwinder_unwind(g_walk_p, c->regs, c->sp, c->stack, c->len, g_walk_frames,
                        UNWINDER_MAX_FRAMES, &n, &res) < 0)
        return;
    c->n_pcs = client_walk(&g_walk_table, c->regs, c->sp + c->len, c->pcs, CLIENT_WALK_MAX_FRAMES);
}

/* The walk of @c succeeded and names exactly the frames the unwind found (g_frames). */
static __attribute__((unused)) void expect_walk_matches(const struct capture *c)
{
    print_message("walk: %zu pcs\n", c->n_pcs);
    assert_true(c->n_pcs > 0);
    size_t n;
    struct unwinder_result res;
    assert_int_equal(unwinder_resolve_pcs(g_walk_p, c->pcs, c->n_pcs, g_walk_frames,
                                          UNWINDER_MAX_FRAMES, &n, &res),
                     0);
    assert_false(res.error);
    assert_int_equal(n, g_n);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(g_walk_frames[i].function_name, g_frames[i].function_name);
        assert_int_equal(g_walk_frames[i].rel_pc, g_frames[i].rel_pc);
        assert_ptr_equal(g_walk_frames[i].map, g_frames[i].map);
    }
}

/* The .debug_frame-only build has no .eh_frame for the table's rules to come from. */
#if defined(VARIANT_DEBUG_FRAME_ONLY)
#define EXPECT_WALK(c) assert_int_equal((c)->n_pcs, 0)
#else
#define EXPECT_WALK(c) expect_walk_matches(c)
#endif

/* ---- the chains ---------------------------------------------------------------- */

void v_level1(struct capture *c);
void v_level2(struct capture *c);
void v_level3(struct capture *c);
void v_recurse(struct capture *c, int depth);
void v_lib_cb(void *arg);
int v_compar(const void *a, const void *b);
void v_fault(void);
void v_sig_level1(void);
void v_sig_handler(int sig, siginfo_t *si, void *uc);
void *v_thread_main(void *arg);

UNWTEST_NOINLINE void v_level3(struct capture *c)
{
    hp_capture_regs(c->regs);
    cap_copy_stack(c);
    walk_live(c);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_level2(struct capture *c)
{
    v_level3(c);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_level1(struct capture *c)
{
    v_level2(c);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_recurse(struct capture *c, int depth)
{
    if (depth == 0)
        v_level3(c);
    else
        v_recurse(c, depth - 1);
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_lib_cb(void *arg)
{
    v_level3(arg);
    UNWTEST_BARRIER();
}

static volatile int g_compar_done;

UNWTEST_NOINLINE int v_compar(const void *a, const void *b)
{
    if (!g_compar_done) {
        g_compar_done = 1;
        v_level3(&g_cap);
    }
    int x = *(const int *)a, y = *(const int *)b;
    UNWTEST_BARRIER();
    return (x > y) - (x < y);
}

UNWTEST_NOINLINE void v_sig_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    v_level3(&g_cap);
    /* Resume after the 2-byte ud2 that raised the signal. */
    ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] += 2;
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_fault(void)
{
    __asm__ volatile("ud2" ::: "memory");
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void v_sig_level1(void)
{
    v_fault();
    UNWTEST_BARRIER();
}

UNWTEST_NOINLINE void *v_thread_main(void *arg)
{
    v_level1(arg);
    UNWTEST_BARRIER();
    return NULL;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_variants_chain(void **state)
{
    (void)state;
    v_level1(&g_cap);
    unwind_capture(&g_cap, "chain");
    size_t i = EXPECT_SEQ(0, "v_level3", "v_level2", "v_level1", "test_variants_chain");
    expect_main_tail(i);
    EXPECT_WALK(&g_cap);
}

static void test_variants_shared_library(void **state)
{
    (void)state;
    unwtest_lib_call(v_lib_cb, &g_cap);
    unwind_capture(&g_cap, "shared library");
    size_t i =
        EXPECT_SEQ(0, "v_level3", "v_lib_cb", "unwtest_lib_call", "test_variants_shared_library");
    assert_non_null(strstr(g_frames[2].map->path, "/libunwtest.so"));
    expect_main_tail(i);
    EXPECT_WALK(&g_cap);
}

static void test_variants_qsort_comparator(void **state)
{
    (void)state;
    int v[32];
    for (int k = 0; k < 32; k++)
        v[k] = (k * 11) % 32;
    g_compar_done = 0;
    qsort(v, 32, sizeof(v[0]), v_compar);
    unwind_capture(&g_cap, "qsort");
    size_t i = EXPECT_SEQ(0, "v_level3", "v_compar");
    size_t lib = i;
    while (i < g_n && in_runtime(&g_frames[i])) {
        assert_true(g_frames[i].function_name[0] != '\0');
        i++;
    }
    assert_true(i > lib);
    i = EXPECT_SEQ(i, "test_variants_qsort_comparator");
    expect_main_tail(i);
    EXPECT_WALK(&g_cap);
}

static void test_variants_signal_handler(void **state)
{
    (void)state;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = v_sig_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGILL, &sa, &old), 0);
    v_sig_level1();
    assert_int_equal(sigaction(SIGILL, &old, NULL), 0);
    unwind_capture(&g_cap, "signal handler");
    size_t i = EXPECT_SEQ(0, "v_level3", "v_sig_handler");
    /* A sanitizer runtime may run the handler from its own. */
    while (i < g_n && in_runtime(&g_frames[i]) &&
           strcmp(g_frames[i].function_name, "__restore_rt") != 0)
        i++;
    /* The trampoline and the interrupted function are symbolized at their exact pc: the
     * interrupted frame's rel_pc is the ud2 itself. */
    i = EXPECT_SEQ(i, "__restore_rt", "v_fault", "v_sig_level1", "test_variants_signal_handler");
    uint8_t insn[2];
    uint64_t fault_pc = g_frames[i - 3].rel_pc - g_frames[i - 3].map->load_bias +
                        g_frames[i - 3].map->start - g_frames[i - 3].map->exact_offset;
    memcpy(insn, (const void *)(uintptr_t)fault_pc, 2);
    assert_int_equal(insn[0], 0x0f);
    assert_int_equal(insn[1], 0x0b);
    expect_main_tail(i);
    /* The signal trampoline has no simple rule: the walk gives up there. */
    assert_int_equal(g_cap.n_pcs, 0);
}

static void test_variants_thread(void **state)
{
    (void)state;
    pthread_t t;
    static struct capture tcap;
    assert_int_equal(pthread_create(&t, NULL, v_thread_main, &tcap), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    unwind_capture(&tcap, "thread");
    size_t i = EXPECT_SEQ(0, "v_level3", "v_level2", "v_level1", "v_thread_main");
    /* Then the runtime's thread start, where the stack ends without an error. */
    assert_false(g_res.error);
    assert_true(i < g_n && g_n - i <= 3);
    for (; i < g_n; i++)
        assert_true(in_runtime(&g_frames[i]));
    assert_string_equal(g_frames[g_n - 1].function_name, "clone3");
    EXPECT_WALK(&tcap);
}

static void test_variants_recursion_300(void **state)
{
    (void)state;
    v_recurse(&g_cap, 300);
    unwind_capture(&g_cap, "recursion 300");
    assert_string_equal(g_frames[0].function_name, "v_level3");
    for (size_t i = 1; i <= 301; i++)
        assert_string_equal(g_frames[i].function_name, "v_recurse");
    expect_main_tail(EXPECT_SEQ(302, "test_variants_recursion_300"));
    assert_false(g_res.truncated);
    /* Walks go as deep as the service unwinds (WIRE_MAX_PCS): this one is walked too. */
    EXPECT_WALK(&g_cap);
}

static void test_variants_recursion_1000_truncated(void **state)
{
    (void)state;
    v_recurse(&g_cap, 1000);
    unwind_capture(&g_cap, "recursion 1000");
    assert_int_equal(g_n, UNWINDER_MAX_FRAMES);
    assert_string_equal(g_frames[0].function_name, "v_level3");
    for (size_t i = 1; i < UNWINDER_MAX_FRAMES - 1; i++)
        assert_string_equal(g_frames[i].function_name, "v_recurse");
    assert_string_equal(g_frames[UNWINDER_MAX_FRAMES - 1].function_name,
                        "ERROR MAX_FRAMES_EXCEEDED");
    assert_null(g_frames[UNWINDER_MAX_FRAMES - 1].map);
    assert_true(g_res.truncated);
    assert_true(g_res.error);
    /* Deeper than a walk goes: the client copies such stacks. */
    assert_int_equal(g_cap.n_pcs, 0);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000};
    nanosleep(&ts, NULL);
}

/* A process state made before the library is loaded finds it by rereading the maps;
 * after dlclose and a new dlopen (past the reparse rate limit) it still names its frames. */
static void test_variants_dlopen_dlclose_dlopen(void **state)
{
    (void)state;
    unwinder_process_t *p = self_process();
    for (int round = 0; round < 2; round++) {
        void *h = dlopen(UNWDL_PATH, RTLD_NOW | RTLD_LOCAL);
        assert_non_null(h);
        void (*call)(void (*)(void *), void *) =
            (void (*)(void (*)(void *), void *))(uintptr_t)dlsym(h, "unwdl_call");
        assert_non_null(call);
        call(v_lib_cb, &g_cap);
        unwind_with(p, &g_cap, round ? "dlopen again" : "dlopen");
        size_t i = EXPECT_SEQ(0, "v_level3", "v_lib_cb", "unwdl_call",
                              "test_variants_dlopen_dlclose_dlopen");
        assert_non_null(strstr(g_frames[2].map->path, "libunwdl.so"));
        assert_true(g_frames[2].map->build_id_len >= 16);
        expect_main_tail(i);
        if (round == 0)
            assert_true(g_res.reparsed_maps);
        assert_int_equal(dlclose(h), 0);
        sleep_ms(120);
    }
    unwinder_process_free(p);
}

static int group_setup(void **state)
{
    (void)state;
    if (unwinder_global_init() < 0)
        return -1;
    g_walk_p = self_process();
    int fd;
    if (utable_create(UTABLE_DEFAULT_SLOTS, &fd) < 0)
        return -1;
    int r = unwinder_process_set_table(g_walk_p, fd);
    if (r == 0)
        r = utable_map(fd, false, &g_walk_table);
    close(fd);
    return r == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    utable_unmap(&g_walk_table);
    g_walk_p = unwinder_process_free(g_walk_p);
    unwinder_global_done();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variants_chain),
        cmocka_unit_test(test_variants_shared_library),
        cmocka_unit_test(test_variants_qsort_comparator),
        cmocka_unit_test(test_variants_signal_handler),
        cmocka_unit_test(test_variants_thread),
        cmocka_unit_test(test_variants_recursion_300),
        cmocka_unit_test(test_variants_recursion_1000_truncated),
        cmocka_unit_test(test_variants_dlopen_dlclose_dlopen),
    };
    return cmocka_run_group_tests_name("unwinder_variants", tests, group_setup, group_teardown);
}
