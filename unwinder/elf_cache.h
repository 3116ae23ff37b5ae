/* unwinder/elf_cache.h: the global cache of ELF files met in target processes (internal to
 * unwinder/).
 *
 * One entry per file, keyed by device and inode from /proc/PID/maps (or by path when both
 * are 0). An entry keeps the file mmap'd read-only and what unwinding and symbolization
 * need: the PT_LOAD table (address -> file offset), the .eh_frame_hdr search table
 * (PT_GNU_EH_FRAME), the GNU build id, the load bias and a sorted symbol index built once
 * (elf_symbols.c) from .symtab, else from the .symtab of a separate debug file found by
 * build id or .gnu_debuglink, else from .dynsym; names interned. Files that cannot be
 * used (missing, replaced, not a native ELF) get a negative entry (ok == false) so they
 * are tried once.
 *
 *     const struct unwinder__elf *e;
 *     unwinder__elf_get(dev, inode, path, &e);
 *     if (e->ok) name = unwinder__elf_symbol(e, vaddr);
 *
 * Thread-safe. Entries are immutable once published (but for their reference count) and
 * live while held: every unwinder__elf_get() is paired with an unwinder__elf_put(). The
 * cache keeps at most unwinder__elf_cache_max entries; beyond that, the least recently
 * released entries nobody holds are freed (their names stay: they are interned). Bytes
 * counted in unwinder_global_bytes(): the entry, its symbol index and its mapped image.
 *
 * Files are opened by unwinder__open_file() (a regular file, the inode of the mapping,
 * no symlink, on a helper thread with a timeout) and mmap'd. A client may truncate a file
 * it maps while we read it, and then every page of our mapping past the new end raises
 * SIGBUS; unwinder__elf_cache_init() installs a process-wide handler that turns such a
 * fault into an error in two places: reads of the image go through a copy routine that
 * then fails with -EFAULT, and libelf and libdw, which read through mappings of their own
 * (building an entry, the CFI of cfi.c, source lines, the .debug_frame fallback), run
 * under unwinder__bus_guarded(), which returns -EFAULT. The file is then marked faulted
 * and not read again; other faults go to the previous disposition. Threads that read
 * files must not block SIGBUS: the kernel kills a process that faults with it blocked.
 */
#ifndef HP_UNWINDER_ELF_CACHE_H
#define HP_UNWINDER_ELF_CACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/frame.h"
#include "common/macros.h"

/* Default cap of cached files (unwinder__elf_cache_max). */
#define UNWINDER_ELF_CACHE_MAX 512

/* Cap of PT_LOAD entries kept per file; real files have 2 to 5. */
#define UNWINDER_ELF_MAX_LOADS 16

struct unwinder__segment {
    uint64_t vaddr, memsz;   /* p_vaddr, p_memsz */
    uint64_t offset, filesz; /* p_offset, p_filesz (clamped to the file) */
    uint32_t flags;          /* PF_R | PF_W | PF_X */
};

struct unwinder__symbol {
    uint64_t start, size; /* st_value, st_size (0 is treated as 1) */
    const char *name;     /* interned */
};

struct unwinder__elf {
    /* key */
    uint64_t dev, inode;
    const char *path; /* interned */
    /* interned; where the file was opened: path, or under the root of the process that
     * mapped it (/proc/PID/root/...) when that process lives in another mount namespace */
    const char *open_path;

    bool ok; /* false: negative entry, nothing below is valid */
    const uint8_t *image;
    size_t image_size;

    struct unwinder__segment loads[UNWINDER_ELF_MAX_LOADS];
    size_t n_loads;
    uint64_t load_bias; /* p_vaddr - p_offset of the first executable PT_LOAD */

    /* .eh_frame_hdr with a usable binary-search table (datarel|sdata4 entries). */
    bool has_eh_hdr;
    uint64_t eh_hdr_vaddr; /* p_vaddr of PT_GNU_EH_FRAME */
    uint64_t eh_table_off; /* offset of the search table from the header's start */
    uint64_t eh_fde_count; /* entries in the table, 8 bytes each */

    uint32_t build_id_len;
    uint8_t build_id[HP_BUILD_ID_MAX];

    bool has_debug_frame; /* has a .debug_frame section (CFI the fallback unwinder reads) */

    const char *debug_path;        /* interned; the separate debug file the symbols came from, or
                                      NULL when they came from the file itself */
    struct unwinder__symbol *syms; /* sorted by start, unique starts */
    size_t n_syms;

    uint64_t load0_align; /* p_align of the first PT_LOAD (the fallback reports modules) */

    /* The file's CFI for unwinder__cfi_rule() (unwinder/cfi.c): built on first use and
     * used under that file's lock; freed with the entry. */
    struct unwinder__cfi *cfi;
    bool cfi_tried;

    /* A read of the image faulted (the file was truncated): elfutils is not let near it
     * again. Set once, by any thread; relaxed (nothing is published through it). */
    _Atomic bool faulted;

    /* Guarded by the cache's lock. */
    unsigned refs;              /* holders: unwinder__elf_get() calls not yet put */
    uint64_t last_use;          /* tick of the last unwinder__elf_put() */
    struct unwinder__elf *next; /* hash chain */
};

/* Where separate debug files live (default "/usr/lib/debug"): <root>/.build-id/xx/yyyy.debug
 * and <root><dir of the file>/<.gnu_debuglink name>. Set before the first
 * unwinder__elf_get(); for tests. */
extern const char *unwinder__debug_root;

/* Cap of cached files; for tests. Set while no other thread uses the cache. */
extern size_t unwinder__elf_cache_max;

/* Finds or creates the entry of a file and takes a reference to it. @path is the path from the maps
 * line (any bytes; only absolute paths are opened). @dev is makedev(major, minor) as in the maps
 * line. Sets @ret (possibly to a negative entry) and returns 0, or -ENOMEM. */
int unwinder__elf_get(uint64_t dev, uint64_t inode, const char *path,
                      const struct unwinder__elf **ret) HP_WARN_UNUSED;
/* As unwinder__elf_get(), for a process whose root is @root ("/proc/PID/root"; NULL: ours):
 * a file not cached yet is opened at @root@path. The cache is keyed by device and inode,
 * the same file whoever maps it. */
int unwinder__elf_get_in(uint64_t dev, uint64_t inode, const char *path, const char *root,
                         const struct unwinder__elf **ret) HP_WARN_UNUSED;

/* Drops the reference taken by unwinder__elf_get(); @e may be freed by the time it
 * returns. Accepts NULL. */
void unwinder__elf_put(const struct unwinder__elf *e);
/* Takes another reference to @e (held already); pair with unwinder__elf_put(). */
void unwinder__elf_ref(const struct unwinder__elf *e);

/* Runs @fn(@arg) so that a SIGBUS it takes (a file mapped by libelf or libdw truncated
 * under it) ends it: returns its result, or -EFAULT after such a fault, with the faulting
 * address in *@ret_addr (may be NULL). The code @fn was in is abandoned where it stood:
 * whatever it was building (an Elf, a Dwarf, a Dwfl) must be neither used nor freed
 * afterwards, only leaked (freeing could touch the dead mapping again). Nests. The
 * signal mask is restored as it was. Costs a system call (the mask is saved). */
int unwinder__bus_guarded(int (*fn)(void *arg), void *arg, uintptr_t *ret_addr) HP_WARN_UNUSED;
/* SIGBUS faults turned into errors so far (copies and guarded code), for tests and stats. */
unsigned long unwinder__bus_faults(void);
/* Marks @e faulted (see struct unwinder__elf). */
void unwinder__elf_mark_faulted(const struct unwinder__elf *e);
static inline bool unwinder__elf_is_faulted(const struct unwinder__elf *e)
{
    return atomic_load_explicit(&e->faulted, memory_order_relaxed);
}
/* True when @addr lies in @e's mapped image. */
static inline bool unwinder__elf_image_holds(const struct unwinder__elf *e, uintptr_t addr)
{
    return e->image && addr >= (uintptr_t)e->image && addr - (uintptr_t)e->image < e->image_size;
}

/* Installs the SIGBUS handler that makes reads of truncated files fail (done by
 * unwinder_global_init(); again when something replaced it, e.g. a test framework that
 * catches signals). Thread-safe. */
void unwinder__elf_cache_catch_sigbus(void);

/* Entries in the cache (held or not). */
size_t unwinder__elf_cache_count(void);

/* Copies @len bytes at file offset @off of the image; bytes past the end of the file but
 * within the same page read as zero, as the kernel maps them. 0, or -EFAULT (out of
 * range, or the file was truncated under the mapping). */
int unwinder__elf_read(const struct unwinder__elf *e, uint64_t off, void *buf,
                       size_t len) HP_WARN_UNUSED;

/* The PT_LOAD that a mapping with file offset @pgoff (page-aligned) shows, or NULL:
 * the segment whose page-aligned file range holds @pgoff, preferring one with
 * @want_flags (e.g. PF_X for an executable mapping). */
const struct unwinder__segment *unwinder__elf_segment_for(const struct unwinder__elf *e,
                                                          uint64_t pgoff, uint32_t want_flags);

/* The interned name of the function that holds ELF virtual address @vaddr, or NULL. */
const char *unwinder__elf_symbol(const struct unwinder__elf *e, uint64_t vaddr);

/* True when a function starts at ELF virtual address @vaddr. */
bool unwinder__elf_symbol_starts(const struct unwinder__elf *e, uint64_t vaddr);

#endif
