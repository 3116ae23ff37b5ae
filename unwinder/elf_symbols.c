/* unwinder/elf_symbols.c: the symbol index of an ELF cache entry (elf_cache.h), built
 * once when the entry is: function symbols from the file's .symtab, else from the .symtab
 * of its separate debug file (by build id under unwinder__debug_root, else by
 * .gnu_debuglink), else from its .dynsym; sorted, one per start address, names interned.
 * And unwinder__elf_symbol(), the function that holds an address.
 */
#include "unwinder/unwinder_internal.h"

#include <elfutils/libdwelf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unwinder/elf_cache.h"

/* Cap of symbols indexed per file. */
#define ELF_MAX_SYMS (8u << 20)
/* How many overlapping symbols before the best candidate a lookup considers. */
#define ELF_SYM_BACKTRACK 8

const char *unwinder__debug_root = "/usr/lib/debug";

/* ---- symbols ----------------------------------------------------------------- */

struct rawsym {
    uint64_t start, size;
    const char *name; /* into libelf's data, valid until elf_end() */
    int rank;         /* lower wins among symbols at the same address */
};

static int cmp_rawsym(const void *a, const void *b)
{
    const struct rawsym *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    /* Aliases: the public spelling (clone3) over internal ones (__clone3, __GI___clone3). */
    size_t ux = strspn(x->name, "_"), uy = strspn(y->name, "_");
    if (ux != uy)
        return ux < uy ? -1 : 1;
    if (!strncmp(x->name, "__GI_", 5) != !strncmp(y->name, "__GI_", 5))
        return strncmp(x->name, "__GI_", 5) ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int bind_rank(unsigned bind)
{
    switch (bind) {
    case STB_GLOBAL:
        return 0;
    case STB_WEAK:
        return 1;
    default:
        return 2;
    }
}

static int load_symbols(Elf *elf, struct unwinder__elf *e)
{
    Elf_Scn *scn = NULL, *symtab = NULL, *dynsym = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh))
            continue;
        if (sh.sh_type == SHT_SYMTAB && !symtab)
            symtab = scn;
        else if (sh.sh_type == SHT_DYNSYM && !dynsym)
            dynsym = scn;
    }
    scn = symtab ? symtab : dynsym;
    if (!scn)
        return 0;
    GElf_Shdr sh;
    Elf_Data *data = elf_getdata(scn, NULL);
    if (!gelf_getshdr(scn, &sh) || !data || !data->d_buf)
        return 0;
    size_t count = data->d_size / sizeof(Elf64_Sym);
    if (count > ELF_MAX_SYMS)
        count = ELF_MAX_SYMS;
    if (count == 0)
        return 0;

    struct rawsym *raw = malloc(count * sizeof(*raw));
    if (!raw)
        return -ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        GElf_Sym s;
        if (!gelf_getsym(data, (int)i, &s))
            continue;
        unsigned type = GELF_ST_TYPE(s.st_info);
        if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF ||
            s.st_value == 0)
            continue;
        const char *name = elf_strptr(elf, sh.sh_link, s.st_name);
        if (!name || !name[0])
            continue;
        raw[n++] = (struct rawsym){.start = s.st_value,
                                   .size = s.st_size ? s.st_size : 1,
                                   .name = name,
                                   .rank = bind_rank(GELF_ST_BIND(s.st_info))};
    }
    qsort(raw, n, sizeof(*raw), cmp_rawsym);

    struct unwinder__symbol *syms = n ? malloc(n * sizeof(*syms)) : NULL;
    if (n && !syms) {
        free(raw);
        return -ENOMEM;
    }
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (out > 0 && syms[out - 1].start == raw[i].start)
            continue;
        syms[out++] = (struct unwinder__symbol){
            .start = raw[i].start,
            .size = raw[i].size,
            /* Versioned names in a .symtab carry "@VERSION" or "@@VERSION". */
            .name = unwinder__intern(raw[i].name, strcspn(raw[i].name, "@")),
        };
    }
    free(raw);
    e->syms = syms;
    e->n_syms = out;
    return 0;
}

const char *unwinder__elf_symbol(const struct unwinder__elf *e, uint64_t vaddr)
{
    if (!e->ok || e->n_syms == 0)
        return NULL;
    size_t lo = 0, hi = e->n_syms;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->syms[mid].start <= vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* The closest start is not always the container: a large function may enclose a
     * smaller symbol (local labels marked as functions), so look a few entries back. */
    for (size_t k = 0; k < ELF_SYM_BACKTRACK && lo > 0; k++, lo--) {
        const struct unwinder__symbol *s = &e->syms[lo - 1];
        if (vaddr - s->start < s->size)
            return s->name;
    }
    return NULL;
}

bool unwinder__elf_symbol_starts(const struct unwinder__elf *e, uint64_t vaddr)
{
    if (!e->ok || e->n_syms == 0)
        return false;
    size_t lo = 0, hi = e->n_syms;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->syms[mid].start < vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < e->n_syms && e->syms[lo].start == vaddr;
}

/* ---- separate debug files --------------------------------------------------------- */

static bool has_section(Elf *elf, uint32_t type)
{
    Elf_Scn *scn = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == type)
            return true;
    }
    return false;
}

/* Opens @path as an ELF file for reading with libelf; NULL if it is not one. Only a
 * regular file, opened on a helper with a timeout (unwinder__open_file()); a symlink is
 * followed only when @follow (under the debug root, not next to a client's file). */
static Elf *open_elf(const char *path, bool follow, int *ret_fd)
{
    struct stat st;
    int fd = unwinder__open_file(path, follow, 0, &st);
    if (fd < 0)
        return NULL;
    Elf *elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
    if (!elf || elf_kind(elf) != ELF_K_ELF) {
        if (elf)
            elf_end(elf);
        (void)close(fd);
        return NULL;
    }
    *ret_fd = fd;
    return elf;
}

/* A candidate debug file is only used when its build id matches the file's (when the
 * file has one). */
static Elf *open_debug_candidate(const char *path, bool follow, const struct unwinder__elf *e,
                                 int *ret_fd)
{
    Elf *elf = open_elf(path, follow, ret_fd);
    if (!elf)
        return NULL;
    if (e->build_id_len > 0) {
        const void *bid;
        ssize_t len = dwelf_elf_gnu_build_id(elf, &bid);
        if (len != (ssize_t)e->build_id_len || memcmp(bid, e->build_id, e->build_id_len) != 0) {
            elf_end(elf);
            (void)close(*ret_fd);
            return NULL;
        }
    }
    if (!has_section(elf, SHT_SYMTAB)) {
        elf_end(elf);
        (void)close(*ret_fd);
        return NULL;
    }
    return elf;
}

/* Finds the separate debug file of @e (whose ELF is @elf): by build id under the debug
 * root, then by .gnu_debuglink next to the file, in its .debug/ folder and under the
 * debug root. Writes its path to @buf and returns it opened, or NULL. */
static Elf *find_debug_file(Elf *elf, const struct unwinder__elf *e, char *buf, size_t cap,
                            int *ret_fd)
{
    const char *root = unwinder__debug_root;
    Elf *d;
    if (e->build_id_len >= 2) {
        int k = snprintf(buf, cap, "%s/.build-id/%02x/", root, e->build_id[0]);
        for (uint32_t i = 1; k > 0 && (size_t)k + 3 < cap && i < e->build_id_len; i++)
            k += snprintf(buf + k, cap - (size_t)k, "%02x", e->build_id[i]);
        if (k > 0 && (size_t)k + 7 < cap) {
            memcpy(buf + k, ".debug", 7);
            if ((d = open_debug_candidate(buf, true, e, ret_fd)) != NULL)
                return d;
        }
    }
    GElf_Word crc;
    const char *link = dwelf_elf_gnu_debuglink(elf, &crc);
    if (!link || !link[0] || strchr(link, '/'))
        return NULL;
    /* Next to the file: where it was opened (inside a container's root, for one of its
     * processes); under the debug root: ours, by the path it has there. */
    const char *at = e->open_path ? e->open_path : e->path;
    const char *slash = strrchr(at, '/');
    int alen = (int)(slash - at);
    slash = strrchr(e->path, '/');
    int dlen = (int)(slash - e->path);
    for (int i = 0; i < 3; i++) {
        int k;
        if (i == 0)
            k = snprintf(buf, cap, "%.*s/%s", alen, at, link);
        else if (i == 1)
            k = snprintf(buf, cap, "%.*s/.debug/%s", alen, at, link);
        else
            k = snprintf(buf, cap, "%s%.*s/%s", root, dlen, e->path, link);
        if (k <= 0 || (size_t)k >= cap || strcmp(buf, at) == 0)
            continue;
        /* Next to the file, the directory is the client's. */
        if ((d = open_debug_candidate(buf, i == 2, e, ret_fd)) != NULL)
            return d;
    }
    return NULL;
}

/* Symbols from the file's .symtab, else from its separate debug file's .symtab, else from
 * its .dynsym (stripped libraries keep only exported names there). */
int unwinder__elf_load_symbols(Elf *elf, struct unwinder__elf *e)
{
    if (!has_section(elf, SHT_SYMTAB)) {
        char path[4096];
        int fd = -1;
        Elf *d = find_debug_file(elf, e, path, sizeof(path), &fd);
        if (d) {
            int r = load_symbols(d, e);
            elf_end(d);
            (void)close(fd);
            if (r < 0)
                return r;
            if (e->n_syms > 0) {
                e->debug_path = unwinder__intern(path, strlen(path));
                return 0;
            }
        }
    }
    return load_symbols(elf, e);
}
