/* service/inject.c: loading libheapprof.so into a running process that was started
 * without it, so that the wake (service/wake.c) can then attach it like a preloaded one.
 *
 * One thread of the target is taken at a safe point (service/rcall.h: the others keep
 * running) and made to call, returning to an int3 found in libc's code:
 *
 *     __errno_location()                 errno saved, written back at the end
 *     dlopen(LIB, RTLD_NOW)              glibc >= 2.34 (libc.so.6); before that
 *                                        __libc_dlopen_mode(LIB, RTLD_NOW | __RTLD_DLOPEN)
 *     dlerror()                          only when dlopen failed: its message, for the user
 *
 * In a container (the library's path names another file in the process's root, or none,
 * and svc_proc_inject_ex() was allowed to), the file is handed over instead of named:
 *
 *     memfd_create("heapprof/libheapprof.so", MFD_CLOEXEC)   (or syscall(SYS_memfd_create))
 *                                        filled by us through /proc/PID/fd/N, while the
 *                                        thread is held (the library is ~0.6 MB: ~1 ms)
 *     dlopen("/proc/self/fd/N", RTLD_NOW)
 *     close(N)                           whatever dlopen said: no descriptor left behind
 *
 * Its maps then show "/memfd:heapprof/libheapprof.so (deleted)", a path that ends in
 * /libheapprof.so as attachers (service/targets.c, wake.c) and the unwinder's frame
 * filter look for: a second attach finds it and only wakes it. Nothing is written into
 * the container's files. The dlopen needs its /proc mounted; the loader's message says
 * so otherwise.
 *
 * The library's constructor runs inside that dlopen: it sees that it was loaded late and
 * stays dormant with its wake entry advertised; its hooks go into the GOT slots only when
 * a session starts (preload/got.h). The library is never unloaded: a second attach finds
 * it mapped and only wakes it.
 *
 * The safe point. dlopen takes the loader's lock and allocates (the first load of an
 * object calls calloc), and neither is reentrant: a thread taken while it holds an arena
 * lock, or inside the loader, would deadlock on itself. So a thread is taken only when
 * neither its pc nor any 8-byte word of its stack (sp to the top of the stack mapping, 1
 * MiB at most: every caller's return address, and a pc saved in a signal frame) points
 * into:
 *   - ld.so's code, all of it;
 *   - in libc, the exported functions that take the allocator's, the loader's, fork's or
 *     exit's locks (the malloc family, dl*, dl_iterate_phdr, fork, vfork, posix_spawn,
 *     pthread_create, exit, atexit...), and every unexported function they reach by a
 *     direct call or jump, transitively (aligned_alloc tail-jumps to _mid_memalign, which
 *     calls _int_malloc with the arena locked: no exported frame is on that stack). The
 *     unexported functions are the starts listed in libc's .eh_frame_hdr; a rel32 call,
 *     jmp or jcc is looked for at every byte (a false match only adds a function);
 *   - the allocator, when another one is loaded (jemalloc, tcmalloc, mimalloc): all of its
 *     code; when the executable itself defines malloc, its malloc family and what they
 *     reach, as for libc.
 * Stale words that happen to point there only make a thread look busy: it is released and
 * another one (or the same later) tried.
 *
 * Refused, the process untouched: what the wake refuses (stopped, traced, seccomp, no
 * permission), a process without glibc's libc.so.6 and ld.so (static binaries), a vfork
 * child (it shares its parent's memory until it execs), a library that is not the same file
 * inside the process's root when no memfd may be used (a process that shares our
 * namespaces: a chroot, whose client may not reach our socket either), and a
 * libheapprof.so already mapped that advertises no wake entry. A dlopen that fails (the
 * process may not read the library) leaves nothing behind; its message is passed on. What
 * else a container needs (a socket inside its root, a peer outside its pid namespace, a
 * user namespace refused) is service/targets.c's and svc_listen_in()'s.
 */
#include "service/inject.h"

#include <elf.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "service/rcall.h"
#include "service/targets.h"

#define INJECT_HEADROOM (64u * 1024u)
#define INJECT_CHOOSE_NS 10000000000ull
#define INJECT_STACK_SCAN (1u << 20)
#define INJECT_RTLD_NOW 0x2
#define INJECT_RTLD_DLOPEN 0x80000000u
#define INJECT_KCMP_VM 1
#define INJECT_MFD_CLOEXEC 0x1

static char inject_lib[PATH_MAX];

void svc_inject_set_library(const char *path)
{
    snprintf(inject_lib, sizeof(inject_lib), "%s", path ? path : "");
}

const char *svc_inject_library(void)
{
    return inject_lib[0] ? inject_lib : NULL;
}

/* ---- ranges ------------------------------------------------------------------------- */

struct inject_ranges {
    struct inject_range *v;
    size_t n, cap;
};

static int ranges_add(struct inject_ranges *rs, uint64_t lo, uint64_t hi)
{
    if (hi <= lo)
        return 0;
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 256;
        struct inject_range *v = realloc(rs->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        rs->v = v;
        rs->cap = cap;
    }
    rs->v[rs->n++] = (struct inject_range){lo, hi};
    return 0;
}

static int range_cmp(const void *a, const void *b)
{
    const struct inject_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping ranges. */
static void ranges_finish(struct inject_ranges *rs)
{
    if (!rs->n)
        return;
    qsort(rs->v, rs->n, sizeof(rs->v[0]), range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < rs->n; i++) {
        if (rs->v[i].lo <= rs->v[k].hi)
            rs->v[k].hi = HP_MAX(rs->v[k].hi, rs->v[i].hi);
        else
            rs->v[++k] = rs->v[i];
    }
    rs->n = k + 1;
}

bool svc__inject_in_ranges(const struct inject_range *v, size_t n, uint64_t a)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a < v[mid].lo)
            hi = mid;
        else if (a >= v[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* ---- the objects of the target -------------------------------------------------------- */

/* A mapped file of the target: its path in the target, the lowest address it is mapped at
 * (offset 0: the load bias of a shared object whose first segment has vaddr 0) and its
 * executable mappings. */
struct inject_obj {
    char path[PATH_MAX];
    uint64_t base;
    bool have_base;
    struct inject_range exec[8];
    size_t n_exec;
};

#define INJECT_MAX_OBJS 512

struct inject_map {
    struct inject_obj *objs;
    size_t n;
    int libc, ld, exe; /* indices, -1: none */
    bool has_lib;      /* a libheapprof.so is mapped */
};

static bool path_base_is(const char *path, const char *prefix)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    return strncmp(b, prefix, strlen(prefix)) == 0;
}

/* Parses /proc/PID/maps into @m (objects with a path starting with '/'). */
static int inject_read_maps(pid_t pid, struct inject_map *m)
{
    HP_CLEANUP_FREE char *maps = svc__proc_maps(pid);
    if (!maps)
        return -errno;
    char exe[PATH_MAX], link[64];
    snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
    ssize_t en = readlink(link, exe, sizeof(exe) - 1);
    exe[en > 0 ? en : 0] = '\0';
    m->objs = calloc(INJECT_MAX_OBJS, sizeof(*m->objs));
    if (!m->objs)
        return -ENOMEM;
    m->n = 0;
    m->libc = m->ld = m->exe = -1;
    m->has_lib = false;
    for (char *l = maps; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl)
            *nl = '\0';
        unsigned long long s, e, off;
        char perms[5];
        int pos = 0;
        if (sscanf(l, "%llx-%llx %4s %llx %*s %*s%n", &s, &e, perms, &off, &pos) == 4) {
            const char *p = l + pos;
            while (*p == ' ')
                p++;
            if (*p == '/' && !strstr(p, " (deleted)")) {
                size_t i = 0;
                while (i < m->n && strcmp(m->objs[i].path, p) != 0)
                    i++;
                if (i == m->n && m->n < INJECT_MAX_OBJS) {
                    snprintf(m->objs[i].path, sizeof(m->objs[i].path), "%s", p);
                    m->n++;
                    if (path_base_is(p, "libc.so.6") || path_base_is(p, "libc-2."))
                        m->libc = (int)i;
                    else if (path_base_is(p, "ld-linux") || path_base_is(p, "ld-2."))
                        m->ld = (int)i;
                    else if (path_base_is(p, "libheapprof.so"))
                        m->has_lib = true;
                    if (exe[0] && strcmp(p, exe) == 0)
                        m->exe = (int)i;
                }
                if (i < m->n) {
                    struct inject_obj *o = &m->objs[i];
                    if (off == 0 && (!o->have_base || s < o->base)) {
                        o->base = s;
                        o->have_base = true;
                    }
                    if (perms[2] == 'x' && o->n_exec < HP_ARRAY_SIZE(o->exec))
                        o->exec[o->n_exec++] = (struct inject_range){s, e};
                }
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    return 0;
}

/* An ELF file of the target, opened through its root (/proc/PID/root/PATH). */
struct inject_elf {
    int fd;
    Elf *elf;
    uint64_t bias;
};

static void inject_elf_close(struct inject_elf *f)
{
    if (f->elf)
        elf_end(f->elf);
    if (f->fd >= 0)
        close(f->fd);
    f->elf = NULL;
    f->fd = -1;
}

static int inject_elf_open(pid_t pid, const struct inject_obj *o, struct inject_elf *f)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "/proc/%d/root%s", (int)pid, o->path);
    f->elf = NULL;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0)
        return -errno;
    (void)elf_version(EV_CURRENT);
    f->elf = elf_begin(f->fd, ELF_C_READ_MMAP, NULL);
    GElf_Ehdr eh;
    if (!f->elf || elf_kind(f->elf) != ELF_K_ELF || !gelf_getehdr(f->elf, &eh) ||
        eh.e_machine != EM_X86_64) {
        inject_elf_close(f);
        return -ENOEXEC;
    }
    /* The bias: where the first PT_LOAD (file offset 0) is mapped, less its vaddr. */
    size_t nph = 0;
    uint64_t first = 0;
    bool found = false;
    if (elf_getphdrnum(f->elf, &nph) == 0)
        for (size_t i = 0; i < nph && !found; i++) {
            GElf_Phdr ph;
            if (gelf_getphdr(f->elf, (int)i, &ph) && ph.p_type == PT_LOAD) {
                first = ph.p_vaddr & ~(uint64_t)(ph.p_align ? ph.p_align - 1 : 0);
                found = true;
            }
        }
    f->bias = o->base - first;
    return 0;
}

static Elf_Scn *inject_section(Elf *elf, Elf64_Word type, const char *name, GElf_Shdr *ret)
{
    size_t shstr;
    if (elf_getshdrstrndx(elf, &shstr) != 0)
        return NULL;
    for (Elf_Scn *s = elf_nextscn(elf, NULL); s; s = elf_nextscn(elf, s)) {
        if (!gelf_getshdr(s, ret))
            continue;
        if (type != SHT_NULL && ret->sh_type != type)
            continue;
        if (name) {
            const char *n = elf_strptr(elf, shstr, ret->sh_name);
            if (!n || strcmp(n, name) != 0)
                continue;
        }
        return s;
    }
    return NULL;
}

/* Each defined function of the dynamic symbol table, to @fn. */
static void inject_each_dynsym(const struct inject_elf *f,
                               void (*fn)(void *ctx, const char *name, uint64_t value,
                                          uint64_t size),
                               void *ctx)
{
    GElf_Shdr sh;
    Elf_Scn *s = inject_section(f->elf, SHT_DYNSYM, NULL, &sh);
    Elf_Data *d = s ? elf_getdata(s, NULL) : NULL;
    if (!d || !sh.sh_entsize)
        return;
    size_t n = sh.sh_size / sh.sh_entsize;
    for (size_t i = 0; i < n; i++) {
        GElf_Sym sym;
        if (!gelf_getsym(d, (int)i, &sym) || sym.st_shndx == SHN_UNDEF ||
            GELF_ST_TYPE(sym.st_info) != STT_FUNC)
            continue;
        const char *name = elf_strptr(f->elf, sh.sh_link, sym.st_name);
        if (name)
            fn(ctx, name, sym.st_value, sym.st_size);
    }
}

/* ---- the unsafe functions of an allocator's object -------------------------------------- */

static const char *const inject_unsafe_names[] = {
    /* the allocator */
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "aligned_alloc", "valloc",
    "pvalloc", "posix_memalign", "cfree", "malloc_usable_size", "malloc_trim", "mallopt",
    "mallinfo", "mallinfo2", "malloc_stats", "malloc_info", "__libc_malloc", "__libc_free",
    "__libc_calloc", "__libc_realloc", "__libc_memalign", "__libc_valloc", "__libc_pvalloc",
    "__libc_mallopt", "__libc_mallinfo", "__libc_freeres", "__libc_thread_freeres",
    "_ZnwmSt11align_val_t", "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "sdallocx",
    "mallocx", "rallocx", "xallocx", "dallocx", "nallocx", "mallctl", "tc_malloc", "tc_free",
    "mi_malloc", "mi_free",
    /* the loader */
    "dlopen", "dlmopen", "dlclose", "dlsym", "dlvsym", "dladdr", "dladdr1", "dlinfo", "dlerror",
    "dl_iterate_phdr", "_dl_find_object", "__libc_dlopen_mode", "__libc_dlsym", "__libc_dlvsym",
    "__libc_dlclose", "__tls_get_addr",
    /* fork, threads and exit (their atfork, stack-cache and exit-handler locks) */
    "fork", "_Fork", "vfork", "__fork", "__vfork", "posix_spawn", "posix_spawnp", "system", "popen",
    "pclose", "pthread_create", "pthread_atfork", "__register_atfork", "exit", "quick_exit",
    "atexit", "on_exit", "__cxa_atexit", "__cxa_finalize", "__cxa_thread_atexit_impl",
    "__call_tls_dtors"};
/* Not __libc_start_main: every main thread's stack holds a return address into what it
 * calls (__libc_start_call_main), which would make every main thread unsafe; exit() is
 * caught by its own name. */

static bool inject_unsafe_name(const char *name)
{
    for (size_t i = 0; i < HP_ARRAY_SIZE(inject_unsafe_names); i++)
        if (strcmp(name, inject_unsafe_names[i]) == 0)
            return true;
    return false;
}

/* Function starts of an object (from .eh_frame_hdr), sorted, and the exported ones. */
struct inject_funcs {
    uint64_t *start; /* vaddr */
    size_t n;
    struct inject_ranges exported; /* vaddr ranges of the defined dynamic functions */
    struct inject_ranges roots;    /* the unsafe exported ones */
};

static void funcs_dynsym_cb(void *ctx, const char *name, uint64_t value, uint64_t size)
{
    struct inject_funcs *fs = ctx;
    (void)ranges_add(&fs->exported, value, value + HP_MAX(size, 1));
    if (inject_unsafe_name(name))
        (void)ranges_add(&fs->roots, value, value + HP_MAX(size, 1));
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The function starts of .eh_frame_hdr's binary search table (the encoding every
 * toolchain writes: datarel sdata4 pairs, udata4 count). */
static int inject_eh_starts(const struct inject_elf *f, struct inject_funcs *fs)
{
    GElf_Shdr sh;
    Elf_Scn *s = inject_section(f->elf, SHT_NULL, ".eh_frame_hdr", &sh);
    Elf_Data *d = s ? elf_getdata(s, NULL) : NULL;
    if (!d || d->d_size < 12)
        return -ENOENT;
    const uint8_t *p = d->d_buf;
    if (p[0] != 1 || p[2] != 0x03 || p[3] != 0x3b)
        return -ENOTSUP;
    uint32_t count;
    memcpy(&count, p + 8, 4);
    if ((uint64_t)count * 8 + 12 > d->d_size)
        return -EINVAL;
    fs->start = malloc(((size_t)count + 1) * sizeof(uint64_t));
    if (!fs->start)
        return -ENOMEM;
    for (uint32_t i = 0; i < count; i++) {
        int32_t rel;
        memcpy(&rel, p + 12 + (size_t)i * 8, 4);
        fs->start[i] = sh.sh_addr + (uint64_t)(int64_t)rel;
    }
    fs->n = count;
    qsort(fs->start, fs->n, sizeof(uint64_t), u64_cmp);
    return 0;
}

/* Index of the function starting exactly at @a, or -1. */
static long funcs_find(const struct inject_funcs *fs, uint64_t a)
{
    size_t lo = 0, hi = fs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fs->start[mid] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < fs->n && fs->start[lo] == a ? (long)lo : -1;
}

/* The end of the function containing @a: the next start (or @a + 1). */
static uint64_t funcs_end(const struct inject_funcs *fs, uint64_t a)
{
    size_t lo = 0, hi = fs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fs->start[mid] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < fs->n ? fs->start[lo] : a + 1;
}

/* Reads the bytes of vaddr range [@lo, @hi) from the file's PT_LOAD segments. */
static int inject_read_code(const struct inject_elf *f, uint64_t lo, uint64_t hi, uint8_t *buf)
{
    size_t nph = 0;
    if (elf_getphdrnum(f->elf, &nph) != 0)
        return -EINVAL;
    for (size_t i = 0; i < nph; i++) {
        GElf_Phdr ph;
        if (!gelf_getphdr(f->elf, (int)i, &ph) || ph.p_type != PT_LOAD)
            continue;
        if (lo >= ph.p_vaddr && hi <= ph.p_vaddr + ph.p_filesz) {
            ssize_t n = pread(f->fd, buf, hi - lo, (off_t)(ph.p_offset + (lo - ph.p_vaddr)));
            return n == (ssize_t)(hi - lo) ? 0 : -EIO;
        }
    }
    return -ERANGE;
}

/* Adds to @out (target addresses) the unsafe functions of @f: the exported roots and every
 * unexported function they reach by direct calls and jumps, transitively. */
static int inject_closure(const struct inject_elf *f, struct inject_funcs *fs,
                          struct inject_ranges *out)
{
    ranges_finish(&fs->exported);
    int r = inject_eh_starts(f, fs);
    if (r < 0) {
        /* No table: the roots alone (their internals are not known). */
        for (size_t i = 0; i < fs->roots.n; i++)
            (void)ranges_add(out, fs->roots.v[i].lo + f->bias, fs->roots.v[i].hi + f->bias);
        return r;
    }
    /* Work list of vaddr ranges to scan; each unexported function enters once. */
    bool *seen = calloc(fs->n ? fs->n : 1, sizeof(bool));
    struct inject_ranges work = {0};
    if (!seen) {
        free(seen);
        return -ENOMEM;
    }
    for (size_t i = 0; i < fs->roots.n; i++)
        (void)ranges_add(&work, fs->roots.v[i].lo, fs->roots.v[i].hi);
    size_t cap = 0;
    uint8_t *code = NULL;
    for (size_t w = 0; w < work.n; w++) {
        struct inject_range fr = work.v[w];
        (void)ranges_add(out, fr.lo + f->bias, fr.hi + f->bias);
        size_t len = fr.hi - fr.lo;
        if (len > (4u << 20))
            continue;
        if (len + 8 > cap) {
            uint8_t *more = realloc(code, len + 8);
            if (!more)
                break;
            code = more;
            cap = len + 8;
        }
        memset(code, 0, len + 8);
        if (inject_read_code(f, fr.lo, fr.hi, code) < 0)
            continue;
        for (size_t i = 0; i + 5 <= len; i++) {
            uint64_t target;
            int32_t rel;
            if (code[i] == 0xe8 || code[i] == 0xe9) {
                memcpy(&rel, code + i + 1, 4);
                target = fr.lo + i + 5 + (uint64_t)(int64_t)rel;
            } else if (code[i] == 0x0f && (code[i + 1] & 0xf0) == 0x80 && i + 6 <= len) {
                memcpy(&rel, code + i + 2, 4);
                target = fr.lo + i + 6 + (uint64_t)(int64_t)rel;
            } else {
                continue;
            }
            long k = funcs_find(fs, target);
            if (k < 0 || seen[k])
                continue;
            seen[k] = true;
            if (svc__inject_in_ranges(fs->exported.v, fs->exported.n, target))
                continue; /* exported: unsafe only if named so (a root) */
            (void)ranges_add(&work, target, funcs_end(fs, target));
        }
    }
    free(code);
    free(seen);
    free(work.v);
    return 0;
}

/* True when @f defines malloc. */
static void defines_malloc_cb(void *ctx, const char *name, uint64_t value, uint64_t size)
{
    (void)value;
    (void)size;
    if (strcmp(name, "malloc") == 0)
        *(bool *)ctx = true;
}

/* ---- the plan ----------------------------------------------------------------------- */

struct inject_plan {
    pid_t pid;
    struct inject_ranges unsafe; /* target addresses, sorted and merged */
    uint64_t fn_errno, fn_dlopen, fn_dlerror;
    bool libc_dlopen_mode; /* fn_dlopen is __libc_dlopen_mode */
    const char *lib;
    /* The library is not the same file inside the process's root (a container): handed
     * over in a memfd the process makes (fn_memfd: memfd_create, or syscall() with
     * SYS_memfd_create when fn_memfd_syscall), which we fill, and dlopen'd as
     * /proc/self/fd/N; fn_close closes it after. */
    bool by_memfd, fn_memfd_syscall;
    uint64_t fn_memfd, fn_close;
    int lib_fd; /* ours, to fill the memfd from */
    char *why;
    size_t why_len;
    char unsafe_seen[96]; /* why the last thread looked at was not taken (debug) */
    bool anywhere;        /* HEAPPROF_TEST_INJECT_ANYWHERE=1: no safe-point check (the
                             negative control of tests/e2e/test_inject_safe.c) */
    Dwfl *dwfl;           /* the process's modules, to unwind a stopped thread; NULL: none */
};

/* ---- the stack of a stopped thread ---------------------------------------------------- */

static const Dwfl_Callbacks inject_dwfl_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
};

/* Reads a module's ELF file and its .eh_frame now, not while a thread is stopped. */
static int inject_dwfl_warm(Dwfl_Module *mod, void **userdata, const char *name, Dwarf_Addr start,
                            void *arg)
{
    (void)userdata;
    (void)name;
    (void)start;
    (void)arg;
    Dwarf_Addr bias;
    (void)dwfl_module_eh_cfi(mod, &bias);
    return DWARF_CB_OK;
}

/* The modules of @pid, for unwinding its threads once we stop them (we are their tracer:
 * libdw reads their registers and memory through ptrace), or NULL. Their files and
 * unwind tables are read first: the first unwind of a thread took about 10 ms of its stop
 * reading them. */
static Dwfl *inject_dwfl_open(pid_t pid)
{
    Dwfl *d = dwfl_begin(&inject_dwfl_callbacks);
    if (!d)
        return NULL;
    dwfl_report_begin(d);
    if (dwfl_linux_proc_report(d, pid) != 0 || dwfl_report_end(d, NULL, NULL) != 0 ||
        dwfl_linux_proc_attach(d, pid, true) != 0) {
        dwfl_end(d);
        return NULL;
    }
    (void)dwfl_getmodules(d, inject_dwfl_warm, NULL, 0);
    return d;
}

struct inject_walk {
    const struct inject_plan *pl;
    uint64_t bad; /* the first frame's pc found unsafe */
    unsigned frames;
};

static int inject_frame_cb(Dwfl_Frame *f, void *arg)
{
    struct inject_walk *w = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(f, &pc, &activation))
        return -1; /* cannot tell: the caller falls back to the word scan */
    /* A return address points after its call: the caller's call is the byte before. */
    uint64_t at = activation ? pc : pc - 1;
    w->frames++;
    if (svc__inject_in_ranges(w->pl->unsafe.v, w->pl->unsafe.n, at)) {
        w->bad = at;
        return DWARF_CB_ABORT;
    }
    return w->frames > 4096 ? -1 : DWARF_CB_OK;
}

struct libc_syms {
    uint64_t errno_loc, dlopen, dlopen_mode, dlerror, memfd_create, syscall, close;
};

static void libc_syms_cb(void *ctx, const char *name, uint64_t value, uint64_t size)
{
    struct libc_syms *s = ctx;
    (void)size;
    if (strcmp(name, "__errno_location") == 0)
        s->errno_loc = value;
    else if (strcmp(name, "dlopen") == 0)
        s->dlopen = value;
    else if (strcmp(name, "__libc_dlopen_mode") == 0)
        s->dlopen_mode = value;
    else if (strcmp(name, "dlerror") == 0)
        s->dlerror = value;
    else if (strcmp(name, "memfd_create") == 0)
        s->memfd_create = value;
    else if (strcmp(name, "syscall") == 0)
        s->syscall = value;
    else if (strcmp(name, "close") == 0)
        s->close = value;
}

/* An int3 byte in @f's code, as a target address, or 0. */
static uint64_t inject_find_trap(const struct inject_elf *f)
{
    GElf_Shdr sh;
    Elf_Scn *s = inject_section(f->elf, SHT_PROGBITS, ".text", &sh);
    Elf_Data *d = s ? elf_getdata(s, NULL) : NULL;
    if (!d)
        return 0;
    const uint8_t *p = d->d_buf;
    for (size_t i = 0; i < d->d_size; i++)
        if (p[i] == 0xcc)
            return f->bias + sh.sh_addr + i;
    return 0;
}

static bool inject_safe(void *arg, pid_t tid, uint64_t rip, uint64_t rsp)
{
    struct inject_plan *pl = arg;
    if (pl->anywhere)
        return true;
    const struct inject_range *v = pl->unsafe.v;
    size_t n = pl->unsafe.n;
    if (svc__inject_in_ranges(v, n, rip)) {
        snprintf(pl->unsafe_seen, sizeof(pl->unsafe_seen), "thread %d: pc %#llx", (int)tid,
                 (unsigned long long)rip);
        return false;
    }
    /* Its frames, unwound by their CFI (every caller's return address, and the pc
     * interrupted by a signal handler): exact, where every frame has CFI. */
    if (pl->dwfl) {
        struct inject_walk w = {.pl = pl};
        int r = dwfl_getthread_frames(pl->dwfl, tid, inject_frame_cb, &w);
        if (r == 0)
            return true;
        if (r == DWARF_CB_ABORT) {
            snprintf(pl->unsafe_seen, sizeof(pl->unsafe_seen), "thread %d: frame %u at %#llx",
                     (int)tid, w.frames, (unsigned long long)w.bad);
            return false;
        }
        /* A frame without CFI (JIT code, hand-written assembly): every word, below. */
    }
    /* The stack: from sp up to the end of its mapping, 1 MiB at most. A stale word that
     * points into unsafe code only makes the thread look busy. */
    HP_CLEANUP_FREE char *maps = svc__proc_maps(pl->pid);
    uint64_t top = rsp + INJECT_STACK_SCAN;
    for (const char *l = maps; l && *l;) {
        unsigned long long s, e;
        if (sscanf(l, "%llx-%llx", &s, &e) == 2 && rsp >= s && rsp < e) {
            top = HP_MIN(top, (uint64_t)e);
            break;
        }
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    size_t len = (size_t)(top - (rsp & ~7ull));
    HP_CLEANUP_FREE uint64_t *words = malloc(len);
    if (!words)
        return false;
    struct iovec local = {words, len}, remote = {(void *)(uintptr_t)(rsp & ~7ull), len};
    ssize_t got = process_vm_readv(pl->pid, &local, 1, &remote, 1, 0);
    if (got <= 0)
        return false;
    for (size_t i = 0; i < (size_t)got / 8; i++)
        if (svc__inject_in_ranges(v, n, words[i])) {
            snprintf(pl->unsafe_seen, sizeof(pl->unsafe_seen),
                     "thread %d: stack word %#llx at sp+%zu", (int)tid,
                     (unsigned long long)words[i], i * 8);
            return false;
        }
    return true;
}

/* Copies the library (pl->lib_fd) into the process's memfd @fd through
 * /proc/PID/fd/@fd. Returns 0 or a negative errno with the reason. */
static int inject_fill_memfd(const struct inject_plan *pl, int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pl->pid, fd);
    HP_CLEANUP_CLOSE int out = open(path, O_WRONLY | O_CLOEXEC);
    if (out < 0)
        return svc__why(pl->why, pl->why_len, -errno, "cannot open its memfd (%s): %s", path,
                        strerror(errno));
    char buf[65536];
    off_t off = 0;
    for (;;) {
        ssize_t n = pread(pl->lib_fd, buf, sizeof(buf), off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return svc__why(pl->why, pl->why_len, -errno, "cannot read %s: %s", pl->lib,
                            strerror(errno));
        if (n == 0)
            return 0;
        for (ssize_t done = 0; done < n;) {
            ssize_t w = pwrite(out, buf + done, (size_t)(n - done), off + done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return svc__why(pl->why, pl->why_len, w < 0 ? -errno : -EIO,
                                "cannot fill its memfd: %s", w < 0 ? strerror(errno) : "short");
            done += w;
        }
        off += n;
    }
}

/* Makes the memfd in the process and fills it: its descriptor in @ret_fd, the path to
 * dlopen ("/proc/self/fd/N") in @path. */
static int inject_memfd(struct svc_rcall *t, const struct inject_plan *pl, int *ret_fd, char *path,
                        size_t len)
{
    uint64_t name_at = 0, fd = 0;
    /* "/memfd:heapprof/libheapprof.so (deleted)" in its maps: a path that ends in
     * /libheapprof.so, as attachers and the unwinder look for. */
    static const char name[] = "heapprof/libheapprof.so";
    int r = svc__rcall_put(t, name, sizeof(name), &name_at);
    if (r < 0)
        return r;
    if (pl->fn_memfd_syscall)
        r = svc__rcall_call(t, pl->fn_memfd, SYS_memfd_create, name_at, INJECT_MFD_CLOEXEC, &fd);
    else
        r = svc__rcall_call(t, pl->fn_memfd, name_at, INJECT_MFD_CLOEXEC, 0, &fd);
    if (r < 0)
        return r;
    if ((int)fd < 0)
        return svc__why(pl->why, pl->why_len, -ENOEXEC,
                        "could not make a memfd to hand it libheapprof.so (memfd_create "
                        "failed in the process)");
    *ret_fd = (int)fd;
    snprintf(path, len, "/proc/self/fd/%d", (int)fd);
    return inject_fill_memfd(pl, (int)fd);
}

static int inject_act(struct svc_rcall *t, void *arg)
{
    struct inject_plan *pl = arg;
    uint64_t errno_at = 0, path_at = 0, handle = 0;
    int saved_errno = 0, memfd = -1;
    char fd_path[64];
    const char *lib = pl->lib;
    int r = svc__rcall_call(t, pl->fn_errno, 0, 0, 0, &errno_at);
    if (r < 0)
        return r;
    if (!errno_at || svc__rcall_read(t, errno_at, &saved_errno, sizeof(saved_errno)) < 0)
        errno_at = 0;
    if (pl->by_memfd) {
        r = inject_memfd(t, pl, &memfd, fd_path, sizeof(fd_path));
        lib = fd_path;
    }
    if (r == 0)
        r = svc__rcall_put(t, lib, strlen(lib) + 1, &path_at);
    if (r == 0) {
        uint64_t flags = INJECT_RTLD_NOW | (pl->libc_dlopen_mode ? INJECT_RTLD_DLOPEN : 0);
        r = svc__rcall_call(t, pl->fn_dlopen, path_at, flags, 0, &handle);
    }
    if (r == 0 && !handle) {
        char msg[400] = "";
        uint64_t m = 0;
        if (pl->fn_dlerror && svc__rcall_call(t, pl->fn_dlerror, 0, 0, 0, &m) == 0 && m) {
            for (size_t i = 0; i + 1 < sizeof(msg); i++) {
                if (svc__rcall_read(t, m + i, &msg[i], 1) < 0 || !msg[i])
                    break;
            }
            msg[sizeof(msg) - 1] = '\0';
        }
        r = svc__why(pl->why, pl->why_len, -ENOEXEC,
                     pl->by_memfd ? "could not load %s from a memfd: %s (its /proc must be mounted)"
                                  : "could not load %s: %s (the process must be able to read the "
                                    "library and its directories as its own user)",
                     pl->lib, msg[0] ? msg : "dlopen failed");
    }
    /* The memfd is closed whatever happened: a loaded library keeps its mapping. */
    uint64_t ignored;
    if (memfd >= 0 && r != -ESRCH &&
        svc__rcall_call(t, pl->fn_close, (uint64_t)memfd, 0, 0, &ignored) < 0)
        hp_log_debug("pid %d: its memfd %d could not be closed", (int)pl->pid, memfd);
    if (errno_at && r != -ESRCH &&
        svc__rcall_write(t, errno_at, &saved_errno, sizeof(saved_errno)) < 0)
        hp_log_debug("pid %d: errno could not be put back", (int)pl->pid);
    return r;
}

/* Is @pid a vfork child, sharing its parent's memory? */
static bool inject_vfork_child(pid_t pid)
{
    char path[64], text[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    size_t n;
    if (svc__read_small(path, text, sizeof(text) - 1, &n) < 0)
        return false;
    text[n] = '\0';
    const char *p = strrchr(text, ')');
    int ppid = 0;
    char st;
    if (!p || sscanf(p + 1, " %c %d", &st, &ppid) != 2 || ppid <= 1)
        return false;
    return syscall(SYS_kcmp, pid, ppid, INJECT_KCMP_VM, 0, 0) == 0;
}

/* Is @lib (open as @fd) the same file in @pid's root as in ours? 1 yes, 0 no. */
static int inject_same_file(pid_t pid, const char *lib, int fd)
{
    struct stat ours, theirs;
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "/proc/%d/root%s", (int)pid, lib);
    return fstat(fd, &ours) == 0 && stat(path, &theirs) == 0 && theirs.st_dev == ours.st_dev &&
           theirs.st_ino == ours.st_ino;
}

/* The unsafe ranges of the objects of @m. */
static int inject_unsafe(pid_t pid, const struct inject_map *m, struct inject_ranges *out)
{
    /* ld.so: all of it. */
    for (size_t k = 0; k < m->objs[m->ld].n_exec; k++)
        (void)ranges_add(out, m->objs[m->ld].exec[k].lo, m->objs[m->ld].exec[k].hi);
    for (size_t i = 0; i < m->n; i++) {
        const struct inject_obj *o = &m->objs[i];
        if ((int)i == m->ld || !o->n_exec || !o->have_base)
            continue;
        struct inject_elf f;
        if (inject_elf_open(pid, o, &f) < 0)
            continue; /* not an ELF object (a font, a locale archive) */
        bool is_alloc = (int)i == m->libc;
        if (!is_alloc)
            inject_each_dynsym(&f, defines_malloc_cb, &is_alloc);
        if (is_alloc && (int)i != m->libc && (int)i != m->exe) {
            /* Another allocator's object: all of its code. */
            for (size_t k = 0; k < o->n_exec; k++)
                (void)ranges_add(out, o->exec[k].lo, o->exec[k].hi);
        } else if (is_alloc) {
            struct inject_funcs fs = {0};
            inject_each_dynsym(&f, funcs_dynsym_cb, &fs);
            int r = inject_closure(&f, &fs, out);
            if (r < 0)
                hp_log_debug("pid %d: %s: no function table (%s): only its exported "
                             "allocator, loader and fork functions are avoided",
                             (int)pid, o->path, strerror(-r));
            free(fs.start);
            free(fs.exported.v);
            free(fs.roots.v);
        }
        inject_elf_close(&f);
    }
    ranges_finish(out);
    return 0;
}

int svc__inject_unsafe_of(pid_t pid, struct inject_range **ret, size_t *n, uint64_t *trap)
{
    struct inject_map m = {0};
    struct inject_ranges rs = {0};
    int r = inject_read_maps(pid, &m);
    if (r == 0 && (m.libc < 0 || m.ld < 0))
        r = -ENOEXEC;
    if (r == 0)
        r = inject_unsafe(pid, &m, &rs);
    if (r == 0 && trap) {
        struct inject_elf libc = {.fd = -1};
        *trap = inject_elf_open(pid, &m.objs[m.libc], &libc) == 0 ? inject_find_trap(&libc) : 0;
        inject_elf_close(&libc);
    }
    free(m.objs);
    if (r < 0) {
        free(rs.v);
        return r;
    }
    *ret = rs.v;
    *n = rs.n;
    return 0;
}

int svc_proc_inject(const struct svc_proc *p, char *why, size_t why_len,
                    struct svc_rcall_stats *stats)
{
    return svc_proc_inject_ex(p, true, why, why_len, stats);
}

int svc_proc_inject_ex(const struct svc_proc *p, bool by_memfd, char *why, size_t why_len,
                       struct svc_rcall_stats *stats)
{
    if (why && why_len)
        why[0] = '\0';
    const char *lib = svc_inject_library();
    if (!lib)
        return svc__why(why, why_len, -ENOPKG,
                        "does not have libheapprof.so loaded, and this heapprof cannot find its "
                        "own libheapprof.so to load (set HEAPPROF_LIB)");
    HP_CLEANUP_CLOSE int pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    if (pidfd < 0 && errno != ENOSYS)
        return errno == ESRCH ? svc__why(why, why_len, -ESRCH, "exited") : -errno;
    struct svc_proc now;
    int r = svc_proc_inspect(p->pid, &now);
    if (r < 0 || now.start_time != p->start_time)
        return svc__why(why, why_len, -ESRCH, "exited");
    r = svc__rcall_preflight(p->pid, why, why_len);
    if (r < 0)
        return r;
    if (inject_vfork_child(p->pid))
        return svc__why(why, why_len, -EBUSY,
                        "is a vfork child (it shares its parent's memory until it execs or "
                        "exits): attach once it has exec'd");

    struct inject_map m = {0};
    r = inject_read_maps(p->pid, &m);
    if (r < 0) {
        free(m.objs);
        return r == -EACCES || r == -EPERM ? svc__wake_no_permission(-r, why, why_len)
                                           : svc__why(why, why_len, r, "exited");
    }
    const char *anywhere = getenv("HEAPPROF_TEST_INJECT_ANYWHERE");
    struct inject_plan pl = {.pid = p->pid,
                             .lib = lib,
                             .lib_fd = -1,
                             .why = why,
                             .why_len = why_len,
                             .anywhere = anywhere && strcmp(anywhere, "1") == 0};
    struct inject_elf libc = {.fd = -1};
    struct libc_syms syms = {0};
    struct svc_rcall_plan plan = {.headroom = INJECT_HEADROOM,
                                  .choose_ns = INJECT_CHOOSE_NS,
                                  .safe = inject_safe,
                                  .act = inject_act,
                                  .arg = &pl};
    if (m.has_lib) {
        r = svc__why(why, why_len, -EPROTO,
                     "has a libheapprof.so mapped that advertises no wake entry (another "
                     "version, or one started with HEAPPROF_ATTACH=0)");
        goto out;
    }
    if (m.libc < 0 || m.ld < 0 || !m.objs[m.libc].have_base) {
        r = svc__why(why, why_len, -ENOEXEC,
                     "is statically linked or does not use glibc (no libc.so.6 and ld.so in "
                     "its maps): a library cannot be loaded into it; profile it from its "
                     "start with heapprof record if it is dynamically linked");
        goto out;
    }
    pl.lib_fd = open(lib, O_RDONLY | O_CLOEXEC);
    if (pl.lib_fd < 0) {
        r = svc__why(why, why_len, -ENOENT, "cannot be given %s: %s", lib, strerror(errno));
        goto out;
    }
    if (!inject_same_file(p->pid, lib, pl.lib_fd)) {
        /* Another root (a container): the path names another file there, or none. */
        if (!by_memfd) {
            /* Attaches give a memfd to a process in other namespaces (a container,
             * svc_proc_attach_for()); in ours, another root is a chroot's. */
            r = svc__why(why, why_len, -EXDEV,
                         "does not see %s as this heapprof does (another root directory in "
                         "the same namespaces: a chroot?); heapprof loads the library into "
                         "a process of another root only when it lives in a container",
                         lib);
            goto out;
        }
        pl.by_memfd = true;
    }
    r = inject_elf_open(p->pid, &m.objs[m.libc], &libc);
    if (r < 0) {
        r = svc__why(why, why_len, r, "cannot read its C library %s: %s", m.objs[m.libc].path,
                     strerror(-r));
        goto out;
    }
    inject_each_dynsym(&libc, libc_syms_cb, &syms);
    pl.fn_errno = syms.errno_loc ? syms.errno_loc + libc.bias : 0;
    pl.fn_dlerror = syms.dlerror ? syms.dlerror + libc.bias : 0;
    if (syms.dlopen)
        pl.fn_dlopen = syms.dlopen + libc.bias;
    else if (syms.dlopen_mode) {
        pl.fn_dlopen = syms.dlopen_mode + libc.bias;
        pl.libc_dlopen_mode = true;
    }
    pl.fn_memfd = syms.memfd_create ? syms.memfd_create + libc.bias
                  : syms.syscall    ? syms.syscall + libc.bias
                                    : 0;
    pl.fn_memfd_syscall = !syms.memfd_create;
    pl.fn_close = syms.close ? syms.close + libc.bias : 0;
    plan.trap = inject_find_trap(&libc);
    bool memfd_ok = !pl.by_memfd || (pl.fn_memfd && pl.fn_close);
    if (!pl.fn_errno || !pl.fn_dlopen || !plan.trap || !memfd_ok) {
        r = svc__why(why, why_len, -ENOEXEC,
                     "has a C library (%s) without %s: heapprof cannot load a library into it",
                     m.objs[m.libc].path,
                     !pl.fn_errno    ? "__errno_location"
                     : !pl.fn_dlopen ? "dlopen"
                     : !plan.trap    ? "an int3"
                                     : "memfd_create and close");
        goto out;
    }
    r = inject_unsafe(p->pid, &m, &pl.unsafe);
    if (r < 0)
        goto out;
    pl.dwfl = inject_dwfl_open(p->pid);
    r = svc__rcall_run(p->pid, &plan, why, why_len, stats);
    if (r == -ETIMEDOUT && pl.unsafe_seen[0])
        hp_log_debug("pid %d: last thread not taken: %s", (int)p->pid, pl.unsafe_seen);
    if (r == 0 && stats)
        hp_log_debug("pid %d: libheapprof.so loaded on thread %d (stopped %.3f ms, attach "
                     "%.3f ms)",
                     (int)p->pid, (int)stats->tid, (double)stats->stop_ns / 1e6,
                     (double)stats->total_ns / 1e6);
out:
    if (pl.lib_fd >= 0)
        (void)close(pl.lib_fd);
    if (pl.dwfl)
        dwfl_end(pl.dwfl);
    inject_elf_close(&libc);
    free(pl.unsafe.v);
    free(m.objs);
    return r;
}
