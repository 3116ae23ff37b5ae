/* tests/service/test_inject.c: the ranges a thread must not be in for the injection
 * (service/inject.c), computed for this very process: glibc's allocator, loader, fork and
 * exit functions and ld.so are in them; system call wrappers a thread idles in and the
 * program's own code are not. With glibc's debug symbols installed (libc6-dbg), the
 * unexported allocator internals that no exported frame shows on a stack are checked
 * too (they come from the call closure, not from names), and the bottom frames of every
 * thread must not be avoided. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "service/inject.h"
#include "service/targets.h"

static struct inject_range *ranges;
static size_t n_ranges;
static uint64_t trap;
static void *libc;

static int setup(void **state)
{
    (void)state;
    libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    return libc && svc__inject_unsafe_of(getpid(), &ranges, &n_ranges, &trap) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(ranges);
    return 0;
}

static bool unsafe(const void *addr)
{
    return svc__inject_in_ranges(ranges, n_ranges, (uint64_t)(uintptr_t)addr);
}

static void test_ranges_sorted_disjoint(void **state)
{
    (void)state;
    assert_true(n_ranges > 0);
    for (size_t i = 0; i < n_ranges; i++) {
        assert_true(ranges[i].lo < ranges[i].hi);
        if (i)
            assert_true(ranges[i - 1].hi < ranges[i].lo);
    }
    struct inject_range v[] = {{10, 20}, {30, 40}};
    assert_false(svc__inject_in_ranges(v, 2, 9));
    assert_true(svc__inject_in_ranges(v, 2, 10));
    assert_true(svc__inject_in_ranges(v, 2, 19));
    assert_false(svc__inject_in_ranges(v, 2, 20));
    assert_true(svc__inject_in_ranges(v, 2, 39));
    assert_false(svc__inject_in_ranges(v, 2, 40));
    assert_false(svc__inject_in_ranges(v, 0, 10));
}

static void test_libc_exports_unsafe(void **state)
{
    (void)state;
    const char *names[] = {"malloc",          "free",           "calloc",         "realloc",
                           "aligned_alloc",   "posix_memalign", "dlopen",         "dlclose",
                           "dl_iterate_phdr", "fork",           "pthread_create", "exit",
                           "__cxa_finalize"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *f = dlsym(libc, names[i]);
        assert_non_null(f);
        if (!unsafe(f))
            fail_msg("%s at %p is not avoided", names[i], f);
    }
}

static void test_idle_wrappers_safe(void **state)
{
    (void)state;
    const char *names[] = {"epoll_wait", "nanosleep", "clock_nanosleep",   "read",
                           "poll",       "getpid",    "pthread_cond_wait", "sigtimedwait"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *f = dlsym(libc, names[i]);
        assert_non_null(f);
        if (unsafe(f))
            fail_msg("%s at %p is avoided: a thread idle in it could never be taken", names[i], f);
    }
    assert_false(unsafe((const void *)(uintptr_t)test_idle_wrappers_safe));
}

static int find_ld(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "ld-linux"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_LOAD && (info->dlpi_phdr[i].p_flags & PF_X)) {
            *(uintptr_t *)data = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            return 1;
        }
    return 0;
}

static void test_ld_so_unsafe(void **state)
{
    (void)state;
    uintptr_t text = 0;
    dl_iterate_phdr(find_ld, &text);
    assert_true(text != 0);
    assert_true(unsafe((const void *)text));
    assert_true(unsafe((const void *)(text + 64)));
}

static void test_trap_is_int3_in_libc(void **state)
{
    (void)state;
    assert_true(trap != 0);
    assert_int_equal(*(const volatile uint8_t *)(uintptr_t)trap, 0xcc);
    Dl_info di;
    assert_true(dladdr((void *)(uintptr_t)trap, &di) != 0);
    assert_non_null(strstr(di.dli_fname, "libc.so.6"));
}

/* libc's debug file by build id, or NULL. */
static char *libc_debug_file(uintptr_t *bias)
{
    struct link_map *lm = NULL;
    if (dlinfo(libc, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return NULL;
    *bias = lm->l_addr;
    int fd = open(lm->l_name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    elf_version(EV_CURRENT);
    Elf *e = elf_begin(fd, ELF_C_READ, NULL);
    char *path = NULL;
    for (Elf_Scn *s = e ? elf_nextscn(e, NULL) : NULL; s && !path; s = elf_nextscn(e, s)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(s, &sh) || sh.sh_type != SHT_NOTE)
            continue;
        Elf_Data *d = elf_getdata(s, NULL);
        size_t off = 0, no, dd;
        GElf_Nhdr nh;
        while (d && (off = gelf_getnote(d, off, &nh, &no, &dd)) > 0) {
            if (nh.n_type != NT_GNU_BUILD_ID || nh.n_descsz < 2)
                continue;
            const uint8_t *id = (const uint8_t *)d->d_buf + dd;
            char hex[128];
            size_t k = 0;
            for (size_t i = 1; i < nh.n_descsz && k + 3 < sizeof(hex); i++)
                k += (size_t)snprintf(hex + k, sizeof(hex) - k, "%02x", id[i]);
            if (asprintf(&path, "/usr/lib/debug/.build-id/%02x/%s.debug", id[0], hex) < 0)
                path = NULL;
            break;
        }
    }
    if (e)
        elf_end(e);
    close(fd);
    if (path && access(path, R_OK) != 0) {
        free(path);
        path = NULL;
    }
    return path;
}

static void test_allocator_internals_unsafe(void **state)
{
    (void)state;
    uintptr_t bias = 0;
    char *dbg = libc_debug_file(&bias);
    if (!dbg) {
        print_message("no debug symbols for libc (libc6-dbg): internals not checked\n");
        skip();
    }
    int fd = open(dbg, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    Elf *e = elf_begin(fd, ELF_C_READ, NULL);
    assert_non_null(e);
    /* Internals a thread holds an arena lock in, reached with no exported frame above
     * them (aligned_alloc's tail jump) or below an exported one. */
    const char *want[] = {"_mid_memalign", "_int_malloc", "_int_free",
                          "_int_memalign", "sysmalloc",   "malloc_consolidate"};
    bool found[sizeof(want) / sizeof(want[0])] = {0};
    /* The bottom frames of every main thread and every other thread: a return address
     * into them is on each stack, so they must stay takeable. */
    const char *never[] = {"__libc_start_call_main", "start_thread"};
    for (Elf_Scn *s = elf_nextscn(e, NULL); s; s = elf_nextscn(e, s)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(s, &sh) || sh.sh_type != SHT_SYMTAB)
            continue;
        Elf_Data *d = elf_getdata(s, NULL);
        for (size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; i++) {
            GElf_Sym sym;
            if (!gelf_getsym(d, (int)i, &sym) || GELF_ST_TYPE(sym.st_info) != STT_FUNC ||
                !sym.st_value)
                continue;
            const char *name = elf_strptr(e, sh.sh_link, sym.st_name);
            for (size_t k = 0; name && k < sizeof(never) / sizeof(never[0]); k++)
                if (strcmp(name, never[k]) == 0 &&
                    unsafe((const void *)(bias + sym.st_value + sym.st_size / 2)))
                    fail_msg("%s is avoided: no thread could ever be taken", name);
            for (size_t k = 0; name && k < sizeof(want) / sizeof(want[0]); k++) {
                if (strcmp(name, want[k]) != 0)
                    continue;
                found[k] = true;
                const void *a = (const void *)(bias + sym.st_value);
                if (!unsafe(a) || !unsafe((const char *)a + sym.st_size / 2))
                    fail_msg("%s at %p is not avoided", name, a);
            }
        }
    }
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++)
        if (!found[k])
            print_message("%s: not in this libc's symbols\n", want[k]);
    assert_true(found[0] || found[1]);
    elf_end(e);
    close(fd);
    free(dbg);
}

/* A process that exited but is not reaped yet (a zombie: its maps are empty) is refused
 * as exited; it was called "statically linked or does not use glibc". */
static void test_zombie_exited(void **state)
{
    (void)state;
    svc_inject_set_library("/nonexistent/libheapprof.so");
    pid_t z = fork();
    assert_true(z >= 0);
    if (z == 0)
        _exit(0);
    struct svc_proc p;
    int r = -1;
    for (int i = 0; i < 500; i++) {
        char path[64], st[512] = "";
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)z);
        FILE *f = fopen(path, "r");
        if (f) {
            (void)!fgets(st, sizeof(st), f);
            fclose(f);
        }
        const char *e = strrchr(st, ')');
        if (e && e[2] == 'Z')
            break;
        usleep(1000);
    }
    r = svc_proc_inspect(z, &p);
    char why[512] = "";
    if (r == 0)
        r = svc_proc_inject(&p, why, sizeof(why), NULL);
    print_message("  zombie: %d %s\n", r, why);
    assert_int_equal(r, -ESRCH);
    assert_null(strstr(why, "statically"));
    assert_int_equal(waitpid(z, NULL, 0), z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_sorted_disjoint),
        cmocka_unit_test(test_libc_exports_unsafe),
        cmocka_unit_test(test_idle_wrappers_safe),
        cmocka_unit_test(test_ld_so_unsafe),
        cmocka_unit_test(test_trap_is_int3_in_libc),
        cmocka_unit_test(test_allocator_internals_unsafe),
        cmocka_unit_test(test_zombie_exited),
    };
    return cmocka_run_group_tests_name("service_inject", tests, setup, teardown);
}
