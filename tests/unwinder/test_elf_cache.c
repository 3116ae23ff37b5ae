/* tests/unwinder/test_elf_cache.c: the global ELF cache: reference counts and the cap
 * with least-recently-used eviction, reads (ours and libdw's) that survive a file
 * truncated under its mapping, opens that give up on a hung mount, and symbols from a
 * separate debug file found through .gnu_debuglink. */

/* cmocka.h needs these first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
/* clang-format on */

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/unwinder/unwtest.h"
#include "unwinder/elf_cache.h"
#include "unwinder/unwinder.h"
#include "unwinder/unwinder_internal.h"

#define NCOPIES 6

static uint8_t g_orig[1 << 20];
static size_t g_orig_len;
static char g_paths[NCOPIES][64];

/* Copies libunwtest.so to @path (a mkstemp template); returns its fd, open for writing. */
static int write_copy(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, g_orig, g_orig_len), (ssize_t)g_orig_len);
    return fd;
}

static const struct unwinder__elf *get_path(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    const struct unwinder__elf *e = NULL;
    assert_int_equal(unwinder__elf_get(st.st_dev, st.st_ino, path, &e), 0);
    assert_non_null(e);
    return e;
}

/* A cached file truncated to nothing: reads of its mapped image fail with -EFAULT instead
 * of killing the process with SIGBUS, and reads of another file still work. */
static void test_elf_cache_truncated_file_reads_fail(void **state)
{
    (void)state;
    /* cmocka catches SIGBUS around each test; ours goes first and forwards the rest. */
    unwinder__elf_cache_catch_sigbus();
    char path[64] = "/tmp/unwtest-trunc-XXXXXX";
    int fd = write_copy(path);
    const struct unwinder__elf *e = get_path(path);
    assert_true(e->ok);
    uint8_t buf[64];
    assert_int_equal(unwinder__elf_read(e, 0, buf, 8), 0);
    assert_memory_equal(buf, ELFMAG, SELFMAG);
    assert_int_equal(unwinder__elf_read(e, g_orig_len - 40, buf, 40), 0);
    assert_memory_equal(buf, g_orig + g_orig_len - 40, 40);

    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(unwinder__elf_read(e, 0, buf, 8), -EFAULT);
    assert_int_equal(unwinder__elf_read(e, 4096, buf, 40), -EFAULT);
    assert_int_equal(unwinder__elf_read(e, g_orig_len - 8, buf, 8), -EFAULT);

    /* The handler only recovers faults of the copy routine; other files are unaffected. */
    char other[64] = "/tmp/unwtest-trunc-XXXXXX";
    int fd2 = write_copy(other);
    const struct unwinder__elf *e2 = get_path(other);
    assert_int_equal(unwinder__elf_read(e2, 0, buf, 8), 0);
    assert_memory_equal(buf, ELFMAG, SELFMAG);
    unwinder__elf_put(e2);
    unwinder__elf_put(e);
    close(fd2);
    close(fd);
    unlink(other);
    unlink(path);
}

/* A cached file truncated before libdw reads its CFI (cfi.c reads .eh_frame through the
 * mapped image): the SIGBUS inside libdw killed the process; now the lookup fails, the
 * file is marked faulted and left alone, and the process carries on. */
static void test_elf_cache_bug_sigbus_in_libdw_cfi(void **state)
{
    (void)state;
    unwinder__elf_cache_catch_sigbus();
    Dl_info info;
    assert_true(dladdr((void *)unwtest_lib_call, &info) != 0);
    uint64_t vaddr = (uintptr_t)unwtest_lib_call - (uintptr_t)info.dli_fbase;
    char path[64] = "/tmp/unwtest-cfi-XXXXXX";
    int fd = write_copy(path);
    const struct unwinder__elf *e = get_path(path);
    assert_true(e->ok);
    uint64_t rule;
    /* The same code in an intact copy has a rule. */
    const struct unwinder__elf *intact = get_path(g_paths[0]);
    assert_int_equal(unwinder__cfi_rule(intact, vaddr, &rule), 0);
    unsigned long faults = unwinder__bus_faults();
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(unwinder__cfi_rule(e, vaddr, &rule), -ENOENT);
    assert_true(unwinder__bus_faults() > faults);
    assert_true(unwinder__elf_is_faulted(e));
    assert_int_equal(unwinder__cfi_rule(e, vaddr + 1, &rule), -ENOENT);
    assert_int_equal(unwinder__cfi_rule(intact, vaddr + 1, &rule), 0);
    unwinder__elf_put(intact);
    unwinder__elf_put(e);
    close(fd);
    unlink(path);
}

/* A FUSE file system whose server never answers, mounted in a mount namespace of our
 * own: every lookup under it sleeps until the connection is aborted, as on a hung NFS
 * or sshfs mount. Needs CAP_SYS_ADMIN; false (the test is skipped) without it. */
static bool hung_mount(const char *dir, int *ret_fuse_fd)
{
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return false;
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return false;
    char opts[128];
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
    if (mount("heapprof-hung", dir, "fuse", MS_NOSUID | MS_NODEV, opts) < 0) {
        close(fd);
        return false;
    }
    *ret_fuse_fd = fd;
    return true;
}

struct get_call {
    const char *path;
    uint64_t dev, inode;
    const struct unwinder__elf *e;
    int r;
};

static void *get_thread(void *arg)
{
    struct get_call *c = arg;
    c->r = unwinder__elf_get(c->dev, c->inode, c->path, &c->e);
    return NULL;
}

/* A mapping whose path lies on a hung mount: building its entry used to stat() and open()
 * the path on the unwinder thread, which then slept forever (and with it every client it
 * served and every dump). Now the open gives up after its timeout (200 ms here) and the
 * file gets a negative entry; the helper left behind finishes when the mount goes. */
static void test_elf_cache_bug_hung_mount_blocks_thread(void **state)
{
    (void)state;
    char dir[64] = "/tmp/unwtest-hung-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/lib.so", dir);
    int cfd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    assert_true(cfd >= 0);
    assert_int_equal(write(cfd, g_orig, g_orig_len), (ssize_t)g_orig_len);
    close(cfd);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    int fuse_fd = -1;
    if (!hung_mount(dir, &fuse_fd)) {
        unlink(path);
        rmdir(dir);
        print_message("  no FUSE mount here (needs CAP_SYS_ADMIN): skipped\n");
        skip();
    }
    unsigned saved = unwinder__open_timeout_ms;
    unwinder__open_timeout_ms = 200;
    unsigned long timeouts = unwinder__open_timeouts();
    struct get_call c = {.path = path, .dev = st.st_dev, .inode = st.st_ino, .r = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, get_thread, &c), 0);
    struct timespec limit;
    clock_gettime(CLOCK_REALTIME, &limit);
    limit.tv_sec += 5;
    int joined = pthread_timedjoin_np(t, NULL, &limit);
    /* Abort the connection: whatever still sleeps on the mount wakes with ENOTCONN. */
    close(fuse_fd);
    (void)umount2(dir, MNT_DETACH);
    if (joined != 0) {
        pthread_join(t, NULL);
        fail_msg("unwinder__elf_get() on a hung mount did not return within 5 s");
    }
    unwinder__open_timeout_ms = saved;
    assert_int_equal(c.r, 0);
    assert_non_null(c.e);
    assert_false(c.e->ok);
    assert_true(unwinder__open_timeouts() > timeouts);
    unwinder__elf_put(c.e);
    /* The helper finishes now that the mount is gone; give it a moment to free its
     * request before the leak checkers look. */
    usleep(100 * 1000);
    unlink(path);
    rmdir(dir);
}

/* With a cap of 2 files, released entries are evicted least recently used first, held
 * entries never, and the memory they held leaves unwinder_global_bytes(). */
static void test_elf_cache_lru_cap(void **state)
{
    (void)state;
    size_t saved_max = unwinder__elf_cache_max;
    unwinder_global_done(); /* start from an empty cache */
    assert_int_equal(unwinder_global_init(), 0);
    unwinder__elf_cache_max = 2;
    size_t base_bytes = unwinder_global_bytes();

    const struct unwinder__elf *held = get_path(g_paths[0]);
    size_t one = unwinder_global_bytes() - base_bytes;
    assert_true(one >= g_orig_len); /* the mapped image is counted */
    assert_int_equal(unwinder__elf_cache_count(), 1);

    /* Files 1..5, each released right away. */
    for (int i = 1; i < NCOPIES; i++) {
        const struct unwinder__elf *e = get_path(g_paths[i]);
        assert_true(e->ok);
        unwinder__elf_put(e);
        assert_true(unwinder__elf_cache_count() <= 2);
    }
    /* The held one survived (its memory is still readable) next to the newest. */
    assert_int_equal(unwinder__elf_cache_count(), 2);
    uint8_t buf[8];
    assert_int_equal(unwinder__elf_read(held, 0, buf, sizeof(buf)), 0);
    assert_memory_equal(buf, ELFMAG, SELFMAG);
    assert_true(unwinder_global_bytes() - base_bytes < 3 * one);

    /* All held: the cap is exceeded until they are released. */
    const struct unwinder__elf *h[NCOPIES];
    for (int i = 1; i < NCOPIES; i++)
        h[i] = get_path(g_paths[i]);
    assert_int_equal(unwinder__elf_cache_count(), NCOPIES);
    for (int i = 1; i < NCOPIES; i++) {
        assert_int_equal(unwinder__elf_read(h[i], 0, buf, sizeof(buf)), 0);
        unwinder__elf_put(h[i]);
    }
    assert_int_equal(unwinder__elf_cache_count(), 2);
    /* The most recently released one is kept: getting it again finds it. */
    const struct unwinder__elf *again = get_path(g_paths[NCOPIES - 1]);
    assert_ptr_equal(again, h[NCOPIES - 1]);
    unwinder__elf_put(again);

    unwinder__elf_put(held);
    assert_int_equal(unwinder__elf_cache_count(), 2);
    unwinder__elf_cache_max = saved_max;
}

/* libunwdbg-stripped.so has no .symtab; its static function is named from the separate
 * debug file its .gnu_debuglink names, next to it. */
static void test_elf_cache_gnu_debuglink(void **state)
{
    (void)state;
    void *h = dlopen(UNWDBG_PATH, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    uintptr_t (*addr_fn)(void) = (uintptr_t(*)(void))(uintptr_t)dlsym(h, "unwdbg_helper_addr");
    assert_non_null(addr_fn);
    uintptr_t helper = addr_fn();
    Dl_info info;
    assert_true(dladdr((void *)helper, &info) != 0);

    const struct unwinder__elf *e = get_path(UNWDBG_PATH);
    assert_true(e->ok);
    assert_non_null(e->debug_path);
    const char *base = strrchr(e->debug_path, '/');
    assert_non_null(base);
    assert_string_equal(base + 1, "libunwdbg.debug");
    /* A DSO's first PT_LOAD is at vaddr 0: the ELF address is the offset from the base. */
    uint64_t vaddr = helper - (uintptr_t)info.dli_fbase;
    const char *name = unwinder__elf_symbol(e, vaddr + 1);
    assert_non_null(name);
    assert_string_equal(name, "unwdbg_static_helper");
    unwinder__elf_put(e);
    dlclose(h);
}

static int group_setup(void **state)
{
    (void)state;
    Dl_info info;
    if (!dladdr((void *)unwtest_lib_call, &info))
        return -1;
    int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, g_orig, sizeof(g_orig));
    close(fd);
    if (len <= 4096 || (size_t)len == sizeof(g_orig))
        return -1;
    g_orig_len = (size_t)len;
    for (int i = 0; i < NCOPIES; i++) {
        snprintf(g_paths[i], sizeof(g_paths[i]), "/tmp/unwtest-lru-XXXXXX");
        int cfd = mkstemp(g_paths[i]);
        if (cfd < 0 || write(cfd, g_orig, g_orig_len) != (ssize_t)g_orig_len)
            return -1;
        close(cfd);
    }
    return unwinder_global_init() == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    unwinder_global_done();
    for (int i = 0; i < NCOPIES; i++)
        if (g_paths[i][0])
            unlink(g_paths[i]);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elf_cache_truncated_file_reads_fail),
        cmocka_unit_test(test_elf_cache_lru_cap),
        cmocka_unit_test(test_elf_cache_gnu_debuglink),
        cmocka_unit_test(test_elf_cache_bug_sigbus_in_libdw_cfi),
        cmocka_unit_test(test_elf_cache_bug_hung_mount_blocks_thread),
    };
    return cmocka_run_group_tests_name("unwinder_elf_cache", tests, group_setup, group_teardown);
}
