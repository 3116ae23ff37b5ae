/* tests/unwinder/test_srcline.c: source lines of frames. The inline chain of a pc in
 * inlined code (innermost first, each caller at the line of its call, capped), and the
 * optional debuginfod route: never taken when DEBUGINFOD_URLS is unset or empty, taken
 * once per file when it is set. The fetch itself is replaced by a fake: no network in
 * tests. */

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
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "unwinder/elf_cache.h"
#include "unwinder/unwinder.h"
#include "unwinder/unwinder_internal.h"

static int g_fetches;
static uint8_t g_fetched_id[HP_BUILD_ID_MAX];
/* With g_hold, a fetch posts g_in_fetch and waits for g_let_go: a slow read. */
static bool g_hold;
static sem_t g_in_fetch, g_let_go;

/* Answers with the debug file the build made next to the stripped library. */
static int fake_fetch(const uint8_t *build_id, uint32_t len, char **ret_path)
{
    g_fetches++;
    if (g_hold) {
        sem_post(&g_in_fetch);
        while (sem_wait(&g_let_go) < 0 && errno == EINTR)
            ;
    }
    memcpy(g_fetched_id, build_id, len < HP_BUILD_ID_MAX ? len : HP_BUILD_ID_MAX);
    char *path = strdup(UNWDBG_DEBUG_PATH);
    if (!path)
        return -ENOMEM;
    *ret_path = path;
    return 0;
}

/* A mapping of the stripped library under the name @alias (source-line state is kept per
 * path, so each test uses its own), and the ELF address of its static function. */
static struct hp_mapping stripped_mapping(const char *alias, uint64_t *ret_vaddr)
{
    void *h = dlopen(UNWDBG_PATH, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    uintptr_t (*addr_fn)(void) = (uintptr_t(*)(void))(uintptr_t)dlsym(h, "unwdbg_helper_addr");
    assert_non_null(addr_fn);
    Dl_info info;
    uintptr_t helper = addr_fn();
    assert_true(dladdr((void *)helper, &info) != 0);
    *ret_vaddr = helper - (uintptr_t)info.dli_fbase;
    struct stat st;
    assert_int_equal(stat(UNWDBG_PATH, &st), 0);
    const struct unwinder__elf *e = NULL;
    assert_int_equal(unwinder__elf_get(st.st_dev, st.st_ino, UNWDBG_PATH, &e), 0);
    assert_true(e->ok);
    assert_true(e->build_id_len >= 16);
    struct hp_mapping m = {.path = unwinder__intern(alias, strlen(alias)),
                           .build_id_len = e->build_id_len};
    memcpy(m.build_id, e->build_id, e->build_id_len);
    unwinder__elf_put(e);
    return m;
}

/* Unset or empty: nothing is asked from debuginfod; the line stays unknown. */
static void test_srcline_debuginfod_off_when_unset(void **state)
{
    (void)state;
    uint64_t vaddr;
    struct hp_mapping m = stripped_mapping(UNWDBG_PATH, &vaddr);
    assert_int_equal(unsetenv("DEBUGINFOD_URLS"), 0);
    g_fetches = 0;
    unsigned long tries = unwinder__debuginfod_tries();
    const char *file;
    uint32_t line;
    assert_int_equal(unwinder_source_line(&m, vaddr, &file, &line), -ENOENT);
    assert_int_equal(setenv("DEBUGINFOD_URLS", "", 1), 0);
    assert_int_equal(unwinder_source_line(&m, vaddr + 1, &file, &line), -ENOENT);
    assert_int_equal(unsetenv("DEBUGINFOD_URLS"), 0);
    assert_int_equal(g_fetches, 0);
    assert_int_equal(unwinder__debuginfod_tries(), tries);
}

/* Set: the build id is asked for once per file and the line comes from the answer. */
static void test_srcline_debuginfod_when_set(void **state)
{
    (void)state;
    uint64_t vaddr;
    /* Another name for the same file: a fresh source-line entry. */
    struct hp_mapping m = stripped_mapping(UNWDBG_PATH "-via-debuginfod", &vaddr);
    assert_int_equal(setenv("DEBUGINFOD_URLS", "http://127.0.0.1:9/", 1), 0);
    g_fetches = 0;
    const char *file = NULL;
    uint32_t line = 0;
    int r = unwinder_source_line(&m, vaddr, &file, &line);
    assert_int_equal(unsetenv("DEBUGINFOD_URLS"), 0);
    assert_int_equal(r, 0);
    assert_int_equal(g_fetches, 1);
    assert_memory_equal(g_fetched_id, m.build_id, m.build_id_len);
    assert_non_null(strstr(file, "libunwdbg.c"));
    assert_true(line > 0);
    assert_int_equal(unwinder_source_line(&m, vaddr + 2, &file, &line), 0);
    assert_int_equal(g_fetches, 1);
}

struct lookup_job {
    struct hp_mapping m;
    uint64_t pc;
    int r;
};

static void *lookup_job(void *arg)
{
    struct lookup_job *j = arg;
    const char *file;
    uint32_t line;
    j->r = unwinder_source_line(&j->m, j->pc, &file, &line);
    return NULL;
}

static bool sem_wait_s(sem_t *s, int seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += seconds;
    int r;
    while ((r = sem_timedwait(s, &t)) < 0 && errno == EINTR)
        ;
    return r == 0;
}

/* The background thread reads a file's debug information slowly (nice 19 beside a CPU
 * hog: seconds). It held the lock of every lookup meanwhile, so a dump waited for it
 * however little it needed: 2 continuous dumps instead of 12 in a loaded run. Now a
 * lookup in another file does not wait, one in that file without waiting says -EAGAIN,
 * and the file is read once. */
static void test_srcline_bug_lookup_waits_for_prefetch(void **state)
{
    (void)state;
    uint64_t vaddr;
    struct hp_mapping slow = stripped_mapping(UNWDBG_PATH "-slow-prefetch", &vaddr);
    assert_int_equal(sem_init(&g_in_fetch, 0, 0), 0);
    assert_int_equal(sem_init(&g_let_go, 0, 0), 0);
    assert_int_equal(setenv("DEBUGINFOD_URLS", "http://127.0.0.1:9/", 1), 0);
    g_fetches = 0;
    g_hold = true;
    unwinder_source_prefetch(&slow);
    assert_true(sem_wait_s(&g_in_fetch, 30));
    assert_int_equal(unsetenv("DEBUGINFOD_URLS"), 0);

    const struct hp_source_line *lines;
    size_t n;
    assert_int_equal(unwinder_source_lines_nowait(&slow, vaddr, &lines, &n), -EAGAIN);
    struct lookup_job other = {.m = stripped_mapping(UNWDBG_PATH "-beside-slow", &other.pc)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lookup_job, &other), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    int joined = pthread_timedjoin_np(t, NULL, &until);
    sem_post(&g_let_go);
    g_hold = false;
    if (joined != 0)
        pthread_join(t, NULL);
    assert_int_equal(joined, 0);
    assert_int_equal(other.r, -ENOENT); /* stripped, no debuginfod: no lines */

    /* Read once, by the background thread: found after it is done. */
    int r = -EAGAIN;
    for (int i = 0; i < 3000 && r == -EAGAIN; i++) {
        r = unwinder_source_lines_nowait(&slow, vaddr, &lines, &n);
        if (r == -EAGAIN)
            usleep(10000);
    }
    assert_int_equal(r, 0);
    assert_non_null(strstr(lines[0].file, "libunwdbg.c"));
    assert_int_equal(g_fetches, 1);
    sem_destroy(&g_in_fetch);
    sem_destroy(&g_let_go);
}

/* A file whose DWARF libdw has open (mapped) is truncated: the next lookup that reads it
 * takes SIGBUS inside libdw, which killed the service (and every session's data) with it.
 * Now the lookup fails, the file gives no more lines, and nothing else is affected. */
static void test_srcline_bug_sigbus_truncated_dwarf(void **state)
{
    (void)state;
    unwinder__elf_cache_catch_sigbus(); /* cmocka catches SIGBUS too; ours goes first */
    uint64_t vaddr;
    (void)stripped_mapping(UNWDBG_PATH, &vaddr);
    /* A copy of the debug file (an ELF with .debug_info for the library's addresses). */
    char path[64] = "/tmp/unwtest-srcline-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int in = open(UNWDBG_DEBUG_PATH, O_RDONLY | O_CLOEXEC);
    assert_true(in >= 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        assert_int_equal(write(fd, buf, (size_t)n), n);
    close(in);
    struct hp_mapping m = {.path = unwinder__intern(path, strlen(path))};
    const char *file;
    uint32_t line;
    /* A pc no unit covers: the file's DWARF is opened, its ranges read, nothing more. */
    assert_int_equal(unwinder_source_line(&m, 1, &file, &line), -ENOENT);
    unsigned long faults = unwinder__bus_faults();
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(unwinder_source_line(&m, vaddr, &file, &line), -ENOENT);
    assert_true(unwinder__bus_faults() > faults);
    assert_int_equal(unwinder_source_line(&m, vaddr + 1, &file, &line), -ENOENT);
    /* Another file still has its lines. */
    struct hp_mapping ok = {.path = unwinder__intern(UNWDBG_DEBUG_PATH, strlen(UNWDBG_DEBUG_PATH))};
    assert_int_equal(unwinder_source_line(&ok, vaddr, &file, &line), 0);
    assert_non_null(strstr(file, "libunwdbg.c"));
    close(fd);
    unlink(path);
}

/* Calls unwinline's function @fn and returns the ELF address of the call it makes from
 * inlined code (its return address - 1, as a frame's rel_pc), and a mapping of the
 * library. */
static uint64_t inlined_call_pc(const char *fn, struct hp_mapping *ret_m, void **ret_h)
{
    void *h = dlopen(UNWINLINE_PATH, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    void (*f)(void) = (void (*)(void))(uintptr_t)dlsym(h, fn);
    uintptr_t *ra = dlsym(h, "unwinline_ra");
    assert_non_null(f);
    assert_non_null(ra);
    f();
    Dl_info info;
    assert_true(dladdr((void *)*ra, &info) != 0);
    *ret_m = (struct hp_mapping){.path = unwinder__intern(UNWINLINE_PATH, strlen(UNWINLINE_PATH))};
    *ret_h = h;
    return *ra - 1 - (uintptr_t)info.dli_fbase;
}

/* Two inlined levels: three lines, innermost first (Perfetto's order for
 * AddressSymbols.lines), each named, the innermost at the pc's own line and each caller
 * at the line of its call (DW_AT_call_line). */
static void test_srcline_inlined_chain(void **state)
{
    (void)state;
    struct hp_mapping m;
    void *h;
    uint64_t pc = inlined_call_pc("unwinline_outer", &m, &h);
    const int *want = dlsym(h, "unwinline_lines");
    assert_non_null(want);
    const struct hp_source_line *l = NULL;
    size_t n = 0;
    assert_int_equal(unwinder_source_lines(&m, pc, &l, &n), 0);
    for (size_t i = 0; i < n; i++)
        print_message("%s %s:%u\n", l[i].function_name, l[i].file, l[i].line);
    assert_int_equal(n, 3);
    static const char *const names[] = {"unwinline_inner", "unwinline_middle", "unwinline_outer"};
    for (size_t i = 0; i < 3; i++) {
        assert_string_equal(l[i].function_name, names[i]);
        assert_non_null(strstr(l[i].file, "libunwinline.c"));
        assert_int_equal(l[i].line, want[i]);
    }
    /* Cached: the same lines; the one-line form gives the innermost. */
    const struct hp_source_line *l2 = NULL;
    assert_int_equal(unwinder_source_lines(&m, pc, &l2, &n), 0);
    assert_ptr_equal(l, l2);
    const char *file;
    uint32_t line;
    assert_int_equal(unwinder_source_line(&m, pc, &file, &line), 0);
    assert_ptr_equal(file, l[0].file);
    assert_int_equal(line, want[0]);
    dlclose(h);
}

/* 40 inlined levels: the chain keeps the 31 innermost functions and the outermost one,
 * at the line of the call it makes. */
static void test_srcline_inlined_chain_capped(void **state)
{
    (void)state;
    struct hp_mapping m;
    void *h;
    uint64_t pc = inlined_call_pc("unwinline_deep", &m, &h);
    const int *deep_line = dlsym(h, "unwinline_deep_line");
    assert_non_null(deep_line);
    const struct hp_source_line *l = NULL;
    size_t n = 0;
    assert_int_equal(unwinder_source_lines(&m, pc, &l, &n), 0);
    assert_int_equal(n, UNWINDER_MAX_INLINE_DEPTH);
    char name[32];
    for (size_t i = 0; i + 1 < n; i++) {
        snprintf(name, sizeof(name), "deep%zu", i);
        assert_string_equal(l[i].function_name, name);
        assert_true(l[i].line > 0);
    }
    assert_string_equal(l[n - 1].function_name, "unwinline_deep");
    assert_int_equal(l[n - 1].line, *deep_line);
    dlclose(h);
}

static int group_setup(void **state)
{
    (void)state;
    unwinder__debuginfod_fetch = fake_fetch;
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
        cmocka_unit_test(test_srcline_inlined_chain),
        cmocka_unit_test(test_srcline_inlined_chain_capped),
        cmocka_unit_test(test_srcline_debuginfod_off_when_unset),
        cmocka_unit_test(test_srcline_debuginfod_when_set),
        cmocka_unit_test(test_srcline_bug_sigbus_truncated_dwarf),
        cmocka_unit_test(test_srcline_bug_lookup_waits_for_prefetch),
    };
    return cmocka_run_group_tests_name("unwinder_srcline", tests, group_setup, group_teardown);
}
