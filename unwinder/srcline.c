/* unwinder/srcline.c: source file and line of a frame, looked up lazily with libdw and
 * cached per (file, pc). Called at dump time, never on the unwinding path.
 *
 * The DWARF comes from the mapped file itself when it has .debug_info, else from its
 * separate debug file (by build id under the debug root, as for symbols). One Dwarf
 * handle per file stays open until unwinder_global_done(); libdw handles are not
 * thread-safe, so every lookup holds one lock (lookups are rare: once per unique frame).
 *
 * When neither has DWARF and DEBUGINFOD_URLS is set (and not empty), the debug file is
 * asked from debuginfod by build id, once per file, through libdebuginfod loaded with
 * dlopen() (no build or package dependency; without the library nothing is fetched).
 * That can take seconds and holds the lock: it belongs to dump time, like every call of
 * unwinder_source_lines(); the unwinding path never fetches anything.
 *
 * A pc in inlined code gets the whole inline chain (unwinder_source_lines()): the DIEs
 * of the unit that contain the pc are walked from the unit down (subprogram, then each
 * DW_TAG_inlined_subroutine nested in it), each function named through its abstract
 * origin, and each inlined call's DW_AT_call_file/DW_AT_call_line give its caller's
 * line. The order is Perfetto's for AddressSymbols.lines: innermost first, the function
 * the code belongs to last (the trace processor makes the first Line of an address the
 * symbol row with id == symbol_set_id, "the most-inlined symbol", and keeps the last one
 * as the frame's own source location). The walk is bounded (nesting depth, DIEs visited,
 * chain length): the DWARF is a file a client chose.
 *
 * Opening a file's debug info is the slow part (libdw decompresses every debug section
 * of a compressed debug file up front: ~40 ms for libc's). unwinder_source_prefetch()
 * lets a low-priority background thread do it as soon as a file shows up in a stack, so
 * the dump at the end of a run does not wait for it.
 */
#include "unwinder/unwinder_internal.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/containers.h"
#include "unwinder/elf_cache.h"
#include "unwinder/unwinder.h"

/* Cap of cached (file, pc) results: a bound on what hostile stacks can make us keep. */
#define SRC_MAX_ENTRIES (1u << 20)
/* Cap of files kept open with their DWARF. */
#define SRC_MAX_FILES 4096
/* Bounds of one lookup's walk through a unit's DIEs: nesting levels descended (inlined
 * C++ templates nest dozens of functions, each with its lexical blocks), DIEs visited. */
#define SRC_MAX_NESTING 256
#define SRC_MAX_DIES (1u << 20)
/* Bytes kept of a function or file name (longer ones are cut). */
#define SRC_MAX_NAME 1024

struct src_file {
    const char *path; /* interned mapping path: the key */
    Dwarf *dw;        /* NULL: no usable debug info */
    int fd;
};

struct src_entry {
    const char *path; /* interned mapping path; NULL: empty slot */
    uint64_t pc;
    const struct hp_source_line *lines; /* malloc'd, innermost first; NULL: unknown */
    uint32_t n_lines;
};

/* ---- debuginfod ---------------------------------------------------------------- */

/* libdebuginfod's API (elfutils/debuginfod.h, not installed without its -dev package). */
typedef void *(*dbgd_begin_fn)(void);
typedef int (*dbgd_find_fn)(void *client, const unsigned char *build_id, int build_id_len,
                            char **path);
typedef void (*dbgd_end_fn)(void *client);

static pthread_once_t s_dbgd_once = PTHREAD_ONCE_INIT;
static dbgd_begin_fn s_dbgd_begin;
static dbgd_find_fn s_dbgd_find;
static dbgd_end_fn s_dbgd_end;
static atomic_ulong s_dbgd_tries;

static void dbgd_load(void)
{
    void *h = dlopen("libdebuginfod.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    s_dbgd_begin = (dbgd_begin_fn)(uintptr_t)dlsym(h, "debuginfod_begin");
    s_dbgd_find = (dbgd_find_fn)(uintptr_t)dlsym(h, "debuginfod_find_debuginfo");
    s_dbgd_end = (dbgd_end_fn)(uintptr_t)dlsym(h, "debuginfod_end");
    if (!s_dbgd_begin || !s_dbgd_find || !s_dbgd_end)
        s_dbgd_begin = NULL; /* the handle stays open: a library is loaded once */
}

static int dbgd_fetch(const uint8_t *build_id, uint32_t len, char **ret_path)
{
    (void)pthread_once(&s_dbgd_once, dbgd_load);
    if (!s_dbgd_begin)
        return -ENOSYS;
    void *client = s_dbgd_begin();
    if (!client)
        return -ENOMEM;
    char *path = NULL;
    int fd = s_dbgd_find(client, build_id, (int)len, &path);
    s_dbgd_end(client);
    if (fd < 0) {
        free(path);
        return fd;
    }
    (void)close(fd);
    if (!path)
        return -ENOENT;
    *ret_path = path;
    return 0;
}

int (*unwinder__debuginfod_fetch)(const uint8_t *build_id, uint32_t len,
                                  char **ret_path) = dbgd_fetch;

unsigned long unwinder__debuginfod_tries(void)
{
    return atomic_load_explicit(&s_dbgd_tries, memory_order_relaxed);
}

static bool dbgd_enabled(void)
{
    const char *urls = getenv("DEBUGINFOD_URLS");
    return urls && urls[0];
}

/* ---- cache ---------------------------------------------------------------------- */

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool s_enabled = true;
static struct src_file *s_files;
static size_t s_nfiles, s_files_cap;
static struct src_entry *s_tab;
static size_t s_tab_cap, s_tab_n;
/* Keys the table's hash: the pcs are the clients' choice (common/containers.h). Drawn
 * when the table is first made, under s_lock. */
static uint64_t s_tab_seed;

void unwinder_set_source_lines(bool enabled)
{
    atomic_store_explicit(&s_enabled, enabled, memory_order_relaxed);
}

static void pf_stop(void);

void unwinder__srcline_done(void)
{
    pf_stop();
    pthread_mutex_lock(&s_lock);
    for (size_t i = 0; i < s_nfiles; i++) {
        if (s_files[i].dw)
            dwarf_end(s_files[i].dw);
        if (s_files[i].fd >= 0)
            (void)close(s_files[i].fd);
    }
    free(s_files);
    for (size_t i = 0; i < s_tab_cap; i++)
        free((void *)(uintptr_t)s_tab[i].lines);
    free(s_tab);
    s_files = NULL;
    s_tab = NULL;
    s_nfiles = s_files_cap = s_tab_cap = s_tab_n = 0;
    pthread_mutex_unlock(&s_lock);
}

struct begin_args {
    int fd;
    Dwarf *dw;
};

static int begin(void *arg)
{
    struct begin_args *a = arg;
    a->dw = dwarf_begin(a->fd, DWARF_C_READ);
    return 0;
}

/* @follow: a symlink in the last component is followed (a path under the debug root,
 * not one a client chose). */
static Dwarf *open_dwarf(const char *path, bool follow, int *ret_fd)
{
    struct stat st;
    if (path[0] != '/')
        return NULL;
    int fd = unwinder__open_file(path, follow, 0, &st);
    if (fd < 0)
        return NULL;
    /* libdw maps the file: a truncation while it reads the headers faults. */
    struct begin_args a = {.fd = fd, .dw = NULL};
    if (unwinder__bus_guarded(begin, &a, NULL) < 0 || !a.dw) {
        (void)close(fd);
        return NULL;
    }
    *ret_fd = fd;
    return a.dw;
}

/* A file whose Dwarf faulted: the Dwarf is abandoned (leaked, never touched again) and
 * the file has no source lines from now on. pre: s_lock held. */
static void file_faulted(struct src_file *f)
{
    f->dw = NULL;
    if (f->fd >= 0)
        (void)close(f->fd);
    f->fd = -1;
}

/* Opens the debug information of @m: the file itself, then its build id under the debug
 * root, then debuginfod. Takes no lock: the slow part (libdw reads and inflates the
 * headers) never holds s_lock. */
static Dwarf *open_file(const struct hp_mapping *m, int *ret_fd)
{
    Dwarf *dw = open_dwarf(m->path, false, ret_fd);
    if (!dw && m->build_id_len >= 2) {
        char buf[4096];
        int k =
            snprintf(buf, sizeof(buf), "%s/.build-id/%02x/", unwinder__debug_root, m->build_id[0]);
        for (uint32_t i = 1; k > 0 && (size_t)k + 3 < sizeof(buf) && i < m->build_id_len; i++)
            k += snprintf(buf + k, sizeof(buf) - (size_t)k, "%02x", m->build_id[i]);
        if (k > 0 && (size_t)k + 7 < sizeof(buf)) {
            memcpy(buf + k, ".debug", 7);
            dw = open_dwarf(buf, true, ret_fd);
        }
    }
    if (!dw && m->build_id_len > 0 && dbgd_enabled()) {
        atomic_fetch_add_explicit(&s_dbgd_tries, 1, memory_order_relaxed);
        char *path = NULL;
        if (unwinder__debuginfod_fetch(m->build_id, m->build_id_len, &path) == 0) {
            dw = open_dwarf(path, true, ret_fd);
            free(path);
        }
    }
    return dw;
}

/* pre: s_lock held. */
static struct src_file *find_file_locked(const char *path)
{
    for (size_t i = 0; i < s_nfiles; i++)
        if (s_files[i].path == path)
            return &s_files[i];
    return NULL;
}

/* Keeps @dw and @fd (either may be absent) as @m's file, or closes them when the table
 * is full. pre: s_lock held, @m's file not in the table. */
static struct src_file *add_file_locked(const struct hp_mapping *m, Dwarf *dw, int fd)
{
    if (s_nfiles == SRC_MAX_FILES)
        goto drop;
    if (s_nfiles == s_files_cap) {
        size_t ncap = s_files_cap ? s_files_cap * 2 : 16;
        struct src_file *nv = realloc(s_files, ncap * sizeof(*nv));
        if (!nv)
            goto drop;
        unwinder__account((ssize_t)((ncap - s_files_cap) * sizeof(*nv)));
        s_files = nv;
        s_files_cap = ncap;
    }
    struct src_file *f = &s_files[s_nfiles++];
    *f = (struct src_file){.path = m->path, .dw = dw, .fd = fd};
    return f;
drop:
    if (dw)
        dwarf_end(dw);
    if (fd >= 0)
        (void)close(fd);
    return NULL;
}

/* @m's file, opened now when it was not before. pre: s_lock held. */
static struct src_file *file_locked(const struct hp_mapping *m)
{
    struct src_file *f = find_file_locked(m->path);
    if (f || s_nfiles == SRC_MAX_FILES)
        return f;
    int fd = -1;
    Dwarf *dw = open_file(m, &fd);
    return add_file_locked(m, dw, fd);
}

static uint64_t entry_hash(const char *path, uint64_t pc)
{
    return hp_hash_keyed2(s_tab_seed, (uint64_t)(uintptr_t)path, pc);
}

static struct src_entry *slot_locked(const char *path, uint64_t pc, bool *ret_found)
{
    size_t i = entry_hash(path, pc) & (s_tab_cap - 1);
    while (s_tab[i].path) {
        if (s_tab[i].path == path && s_tab[i].pc == pc) {
            *ret_found = true;
            return &s_tab[i];
        }
        i = (i + 1) & (s_tab_cap - 1);
    }
    *ret_found = false;
    return &s_tab[i];
}

static int grow_locked(void)
{
    size_t ncap = s_tab_cap ? s_tab_cap * 2 : 1024;
    if (!s_tab_cap)
        s_tab_seed = hp_hash_seed();
    struct src_entry *nv = calloc(ncap, sizeof(*nv));
    if (!nv)
        return -ENOMEM;
    for (size_t i = 0; i < s_tab_cap; i++) {
        if (!s_tab[i].path)
            continue;
        size_t j = entry_hash(s_tab[i].path, s_tab[i].pc) & (ncap - 1);
        while (nv[j].path)
            j = (j + 1) & (ncap - 1);
        nv[j] = s_tab[i];
    }
    unwinder__account((ssize_t)((ncap - s_tab_cap) * sizeof(*nv)));
    free(s_tab);
    s_tab = nv;
    s_tab_cap = ncap;
    return 0;
}

/* What one lookup finds, copied out of the DWARF (which is mapped: a truncated file
 * faults while it is read) into these buffers, to be interned once the guarded region is
 * left. Static: every lookup holds s_lock. */
struct found_line {
    char function_name[SRC_MAX_NAME];
    char file[SRC_MAX_NAME];
    uint32_t line;
};
static struct found_line s_found[UNWINDER_MAX_INLINE_DEPTH]; /* protected by s_lock */

struct lookup_args {
    Dwarf *dw;
    uint64_t pc;
    size_t n; /* entries of s_found filled, innermost first */
    /* The walk: the function DIEs (subprogram, inlined subroutines) on the path from the
     * unit to the pc, outermost first; DIEs visited so far. */
    Dwarf_Die path[SRC_MAX_NESTING];
    size_t n_path;
    unsigned visited;
};

static void copy_str(char *dst, const char *src)
{
    size_t n = src ? strnlen(src, SRC_MAX_NAME - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

static bool is_function(int tag)
{
    return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine;
}

/* Descends from @parent into the DIEs that contain the pc, appending the functions met
 * to a->path. Returns 1 once the innermost scope holding the pc was reached, 0 when no
 * child of @parent holds it, -1 past the walk's bounds. */
static int walk(struct lookup_args *a, Dwarf_Die *parent, unsigned depth)
{
    if (depth >= SRC_MAX_NESTING)
        return -1;
    Dwarf_Die d;
    for (int r = dwarf_child(parent, &d); r == 0; r = dwarf_siblingof(&d, &d)) {
        if (++a->visited > SRC_MAX_DIES)
            return -1;
        int tag = dwarf_tag(&d);
        switch (tag) {
        case DW_TAG_subprogram:
        case DW_TAG_inlined_subroutine:
        case DW_TAG_lexical_block:
        case DW_TAG_try_block:
        case DW_TAG_catch_block:
        case DW_TAG_with_stmt:
            if (dwarf_haspc(&d, a->pc) <= 0)
                break;
            if (is_function(tag) && a->n_path < SRC_MAX_NESTING)
                a->path[a->n_path++] = d;
            /* Scopes that hold the pc do not overlap their siblings: this is the one. */
            return walk(a, &d, depth + 1) < 0 ? -1 : 1;
        case DW_TAG_namespace:
        case DW_TAG_module:
        case DW_TAG_class_type:
        case DW_TAG_structure_type:
        case DW_TAG_union_type: {
            /* No addresses of their own, but they may hold functions that have some. */
            int w = walk(a, &d, depth + 1);
            if (w != 0)
                return w;
            break;
        }
        case DW_TAG_imported_unit: {
            /* A partial unit (dwz) whose DIEs belong here. */
            Dwarf_Attribute at;
            Dwarf_Die unit;
            if (dwarf_attr(&d, DW_AT_import, &at) && dwarf_formref_die(&at, &unit)) {
                int w = walk(a, &unit, depth + 1);
                if (w != 0)
                    return w;
            }
            break;
        }
        default:
            break;
        }
    }
    return 0;
}

/* The name a function DIE (or its abstract origin, or its declaration) gives: the
 * linkage name when there is one (mangled, as the ELF symbols are), else DW_AT_name. */
static const char *function_name_of(Dwarf_Die *d)
{
    static const unsigned attrs[] = {DW_AT_linkage_name, DW_AT_MIPS_linkage_name, DW_AT_name};
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        Dwarf_Attribute at;
        const char *s = dwarf_attr_integrate(d, attrs[i], &at) ? dwarf_formstring(&at) : NULL;
        if (s && s[0])
            return s;
    }
    return NULL;
}

/* The file and line of the call an inlined subroutine DIE stands for, into @ret. */
static void call_site_of(Dwarf_Die *cu, Dwarf_Die *inl, struct found_line *ret)
{
    Dwarf_Attribute at;
    Dwarf_Word file = 0, line = 0;
    Dwarf_Files *files;
    size_t n_files;
    ret->file[0] = '\0';
    ret->line = 0;
    if (dwarf_attr(inl, DW_AT_call_line, &at) && dwarf_formudata(&at, &line) == 0 &&
        line <= UINT32_MAX)
        ret->line = (uint32_t)line;
    if (dwarf_attr(inl, DW_AT_call_file, &at) && dwarf_formudata(&at, &file) == 0 &&
        dwarf_getsrcfiles(cu, &files, &n_files) == 0 && file < n_files) {
        const char *name = dwarf_filesrc(files, file, NULL, NULL);
        /* libdw names entry 0 of a DWARF 4 file table (no file) "???". */
        if (name && strcmp(name, "???") != 0)
            copy_str(ret->file, name);
    }
}

/* Run under unwinder__bus_guarded(): libdw reads the DWARF through its mapping. */
static int lookup(void *arg)
{
    struct lookup_args *a = arg;
    Dwarf_Die cu;
    if (!dwarf_addrdie(a->dw, a->pc, &cu))
        return 0;
    Dwarf_Line *l = dwarf_getsrc_die(&cu, a->pc);
    int line;
    const char *file = l ? dwarf_linesrc(l, NULL, NULL) : NULL;
    if (!file || dwarf_lineno(l, &line) != 0 || line <= 0)
        return 0;
    copy_str(s_found[0].file, file);
    s_found[0].line = (uint32_t)line;
    s_found[0].function_name[0] = '\0';
    a->n = 1;

    /* The functions around the pc; a walk past its bounds keeps what it found. */
    a->n_path = 0;
    a->visited = 0;
    (void)walk(a, &cu, 0);
    /* The function the code belongs to: the innermost subprogram on the path (a GNU C
     * nested function is a subprogram inside one). */
    if (a->n_path == 0)
        return 0;
    size_t outer = 0;
    for (size_t i = 0; i < a->n_path; i++)
        if (dwarf_tag(&a->path[i]) == DW_TAG_subprogram)
            outer = i;
    /* Innermost first: chain[j] is function path[outer + c - 1 - j], at the pc's line
     * for j = 0, else at the call that path[outer + c - j] (inlined into it) stands for.
     * Past the cap, the innermost functions and the outermost one are kept. */
    size_t c = a->n_path - outer;
    size_t keep = c > UNWINDER_MAX_INLINE_DEPTH ? UNWINDER_MAX_INLINE_DEPTH - 1 : c;
    size_t k = 0;
    for (size_t j = 0; j < c; j++) {
        if (j >= keep && j != c - 1)
            continue;
        copy_str(s_found[k].function_name, function_name_of(&a->path[outer + c - 1 - j]));
        if (j > 0)
            call_site_of(&cu, &a->path[outer + c - j], &s_found[k]);
        k++;
    }
    a->n = k;
    return 0;
}

static int get_aranges(void *arg)
{
    Dwarf_Aranges *ar;
    size_t n;
    (void)dwarf_getaranges(arg, &ar, &n);
    return 0;
}

/* ---- background opening --------------------------------------------------------- */

#define PF_QUEUE 64
/* Files asked for, by interned path (open addressing, never removed). */
#define PF_SEEN_CAP (2 * SRC_MAX_FILES)

static pthread_mutex_t s_pf_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s_pf_cond = PTHREAD_COND_INITIALIZER;
static const struct hp_mapping *s_pf_queue[PF_QUEUE]; /* protected by s_pf_lock */
static unsigned s_pf_head, s_pf_n;                    /* protected by s_pf_lock */
static const char *s_pf_seen[PF_SEEN_CAP];            /* protected by s_pf_lock */
static size_t s_pf_seen_n;                            /* protected by s_pf_lock */
static bool s_pf_started, s_pf_stop;                  /* protected by s_pf_lock */
static pthread_t s_pf_thread;

/* Opens @m's file and reads its address ranges (the first lookup needs them) without
 * s_lock: at nice 19 on a busy machine this takes seconds, and a dump that needs the
 * table must not wait for it. A lookup that opened the file meanwhile wins. */
static void pf_open(const struct hp_mapping *m)
{
    pthread_mutex_lock(&s_lock);
    bool known = find_file_locked(m->path) != NULL;
    pthread_mutex_unlock(&s_lock);
    if (known)
        return;
    int fd = -1;
    Dwarf *dw = open_file(m, &fd);
    if (dw && unwinder__bus_guarded(get_aranges, dw, NULL) < 0) {
        dw = NULL; /* abandoned, as file_faulted() does */
        (void)close(fd);
        fd = -1;
    }
    pthread_mutex_lock(&s_lock);
    if (!find_file_locked(m->path)) {
        (void)add_file_locked(m, dw, fd);
    } else {
        if (dw)
            dwarf_end(dw);
        if (fd >= 0)
            (void)close(fd);
    }
    pthread_mutex_unlock(&s_lock);
}

static void *pf_main(void *arg)
{
    (void)arg;
    /* Below the application and the unwinders: it only runs on an otherwise idle core. */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    pthread_mutex_lock(&s_pf_lock);
    for (;;) {
        while (s_pf_n == 0 && !s_pf_stop)
            pthread_cond_wait(&s_pf_cond, &s_pf_lock);
        if (s_pf_stop)
            break;
        const struct hp_mapping *m = s_pf_queue[s_pf_head];
        s_pf_head = (s_pf_head + 1) % PF_QUEUE;
        s_pf_n--;
        pthread_mutex_unlock(&s_pf_lock);

        pf_open(m);

        pthread_mutex_lock(&s_pf_lock);
    }
    pthread_mutex_unlock(&s_pf_lock);
    return NULL;
}

/* pre: s_pf_lock held. True when @path was not asked for before (and is now). */
static bool pf_mark_locked(const char *path)
{
    if (s_pf_seen_n * 2 >= PF_SEEN_CAP)
        return false;
    size_t i = ((uintptr_t)path >> 4) * 0x9e3779b97f4a7c15ull % PF_SEEN_CAP;
    while (s_pf_seen[i]) {
        if (s_pf_seen[i] == path)
            return false;
        i = (i + 1) % PF_SEEN_CAP;
    }
    s_pf_seen[i] = path;
    s_pf_seen_n++;
    return true;
}

/* pre: s_pf_lock held. True when @path was asked for before. */
static bool pf_seen_locked(const char *path)
{
    size_t i = ((uintptr_t)path >> 4) * 0x9e3779b97f4a7c15ull % PF_SEEN_CAP;
    for (; s_pf_seen[i]; i = (i + 1) % PF_SEEN_CAP)
        if (s_pf_seen[i] == path)
            return true;
    return false;
}

/* True when the background thread opens (or opened) @m's file: queued now or before. */
static bool prefetch(const struct hp_mapping *m)
{
    pthread_mutex_lock(&s_pf_lock);
    bool queued = pf_seen_locked(m->path);
    if (!queued && !s_pf_stop && s_pf_n < PF_QUEUE) {
        if (!s_pf_started)
            s_pf_started = pthread_create(&s_pf_thread, NULL, pf_main, NULL) == 0;
        if (s_pf_started && pf_mark_locked(m->path)) {
            s_pf_queue[(s_pf_head + s_pf_n) % PF_QUEUE] = m;
            s_pf_n++;
            pthread_cond_signal(&s_pf_cond);
            queued = true;
        }
    }
    pthread_mutex_unlock(&s_pf_lock);
    return queued;
}

void unwinder_source_prefetch(const struct hp_mapping *m)
{
    if (!m || !m->path || !m->path[0] || unwinder_is_py_mapping(m) ||
        !atomic_load_explicit(&s_enabled, memory_order_relaxed))
        return;
    (void)prefetch(m);
}

static void pf_stop(void)
{
    pthread_mutex_lock(&s_pf_lock);
    bool started = s_pf_started;
    s_pf_stop = true;
    pthread_cond_signal(&s_pf_cond);
    pthread_mutex_unlock(&s_pf_lock);
    if (started)
        pthread_join(s_pf_thread, NULL);
    pthread_mutex_lock(&s_pf_lock);
    s_pf_started = s_pf_stop = false;
    s_pf_head = s_pf_n = 0;
    memset(s_pf_seen, 0, sizeof(s_pf_seen));
    s_pf_seen_n = 0;
    pthread_mutex_unlock(&s_pf_lock);
}

/* The lines s_found holds (@n of them), interned, in a malloc'd array; NULL when out of
 * memory. pre: s_lock held. */
static struct hp_source_line *keep_found_locked(size_t n)
{
    struct hp_source_line *v = malloc(n * sizeof(*v));
    if (!v)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const struct found_line *f = &s_found[i];
        v[i] = (struct hp_source_line){
            .function_name = unwinder__intern(f->function_name, strlen(f->function_name)),
            .file = unwinder__intern(f->file, strlen(f->file)),
            .line = f->line};
        if (!v[i].function_name || !v[i].file) {
            free(v);
            return NULL;
        }
    }
    unwinder__account((ssize_t)(n * sizeof(*v)));
    return v;
}

/* unwinder_source_lines(); with !@wait, -EAGAIN instead of opening a file the
 * background thread opens. */
static int source_lines(const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                        const struct hp_source_line **ret_lines, size_t *ret_n)
{
    if (!m || !ret_lines || !ret_n)
        return -EINVAL;
    if (!atomic_load_explicit(&s_enabled, memory_order_relaxed))
        return -ECANCELED;
    if (!m->path || !m->path[0] || unwinder_is_py_mapping(m))
        return -ENOENT; /* no ELF file: a Python frame's source (unwinder/python.c) */
    const struct hp_source_line *lines = NULL;
    uint32_t n = 0;
    int r = 0;
    pthread_mutex_lock(&s_lock);
    if ((s_tab_n + 1) * 2 > s_tab_cap && (r = grow_locked()) < 0)
        goto out;
    bool found;
    struct src_entry *e = slot_locked(m->path, rel_pc, &found);
    if (found) {
        lines = e->lines;
        n = e->n_lines;
        goto out;
    }
    if (s_tab_n >= SRC_MAX_ENTRIES) {
        r = -ENOSPC; /* what a lookup finds is kept in the table, which is full */
        goto out;
    }
    struct src_file *f = find_file_locked(m->path);
    if (!f && !wait && s_nfiles < SRC_MAX_FILES && prefetch(m)) {
        r = -EAGAIN; /* not cached: asked again once the file is open */
        goto out;
    }
    if (!f)
        f = file_locked(m);
    if (f && f->dw) {
        struct lookup_args a = {.dw = f->dw, .pc = rel_pc, .n = 0};
        if (unwinder__bus_guarded(lookup, &a, NULL) < 0) {
            file_faulted(f);
        } else if (a.n > 0) {
            lines = keep_found_locked(a.n);
            if (!lines) {
                r = -ENOMEM;
                goto out; /* not cached: the next lookup tries again */
            }
            n = (uint32_t)a.n;
        }
    }
    *e = (struct src_entry){.path = m->path, .pc = rel_pc, .lines = lines, .n_lines = n};
    s_tab_n++;
out:
    pthread_mutex_unlock(&s_lock);
    if (r < 0)
        return r;
    if (!lines)
        return -ENOENT;
    *ret_lines = lines;
    *ret_n = n;
    return 0;
}

int unwinder_source_lines(const struct hp_mapping *m, uint64_t rel_pc,
                          const struct hp_source_line **ret_lines, size_t *ret_n)
{
    return source_lines(m, rel_pc, true, ret_lines, ret_n);
}

int unwinder_source_lines_nowait(const struct hp_mapping *m, uint64_t rel_pc,
                                 const struct hp_source_line **ret_lines, size_t *ret_n)
{
    return source_lines(m, rel_pc, false, ret_lines, ret_n);
}

int unwinder_source_line(const struct hp_mapping *m, uint64_t rel_pc, const char **ret_file,
                         uint32_t *ret_line)
{
    if (!ret_file || !ret_line)
        return -EINVAL;
    const struct hp_source_line *lines;
    size_t n;
    int r = unwinder_source_lines(m, rel_pc, &lines, &n);
    if (r < 0)
        return r;
    *ret_file = lines[0].file;
    *ret_line = lines[0].line;
    return 0;
}
