/* unwinder/unwinder_internal.h: what the files of unwinder/ share with each other
 * (internal to unwinder/; other components use unwinder/unwinder.h only).
 *
 *     intern.c            interned strings and mappings, the byte count (a leaf)
 *     global.c            unwinder_global_init/done/bytes: set up and release the rest
 *     elf_cache.c         the cache of ELF files (elf_cache.h), SIGBUS-safe reads of them
 *     files.c             opening the files clients name (no symlink, FIFO or hang)
 *     elf_symbols.c       a cached file's symbol index, separate debug files
 *     cfi.c               utable rules from a file's .eh_frame
 *     srcline.c           source file and line of a frame, debuginfod
 *     maps.c              the /proc/PID/maps parser, the loader's path (maps.h)
 *     sigmask.c           libunwind's signal-mask syscalls skipped (sigmask.h)
 *     process.c           struct unwinder_process: its maps, their facts, when to reread,
 *                         reading a word of its memory (both backends)
 *     frames.c            a pc's frame: mapping, rel_pc, function name; cached per process
 *     table.c             rules published into the client's unwind table
 *     perfmap.c           names of JIT code from the runtime's /tmp/perf-PID.map
 *     unwind_libunwind.c  unwinder_unwind() with libunwind's remote API
 *     unwind_dwfl.c       elfutils' unwinder, for code described only by .debug_frame
 *
 * Includes go one way: this header includes unwinder.h, maps.h and elf_cache.h, and none
 * of them includes it.
 *
 *     ssize_t i = unwinder__find_exec(p, pc);       // -1: in no executable mapping
 *     const struct hp_mapping *hm = unwinder__pmap_mapping(p, (size_t)i);
 *     const char *name = unwinder__intern("main", 4); // same pointer for equal text
 *
 * The global state (interning, ELF cache, CFI, source lines) is thread-safe once
 * unwinder_global_init() returned, and what it hands out stays valid until
 * unwinder_global_done(). A struct unwinder_process is used by one thread at a time.
 */
#ifndef HP_UNWINDER_UNWINDER_INTERNAL_H
#define HP_UNWINDER_UNWINDER_INTERNAL_H

#include <elfutils/libdwfl.h>
#include <libelf.h>
#include <libunwind.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "common/frame.h"
#include "shmem_ring/utable.h"
#include "unwinder/elf_cache.h"
#include "unwinder/maps.h"
#include "unwinder/unwinder.h"

/* ---- intern.c: state shared by all processes and threads --------------------- */

/* Interned copy of @s[0..len). On allocation failure returns the interned "" (never
 * NULL), so callers can always store the result in a frame. */
const char *unwinder__intern(const char *s, size_t len);

/* The interned "". */
const char *unwinder__empty(void);

/* Interned copy of @tmpl: equal content (path compared by pointer, so intern it first;
 * build_id compared up to build_id_len) gives the same pointer. NULL on ENOMEM. */
const struct hp_mapping *unwinder__mapping_intern(const struct hp_mapping *tmpl);

/* Adds @delta to the heap bytes reported by unwinder_global_bytes(). */
void unwinder__account(ssize_t delta);

/* The interning part of unwinder_global_init()/done() (global.c, under its lock):
 * 0 or -ENOMEM; done also frees the mappings and zeroes the byte count. */
int unwinder__intern_init(void) HP_WARN_UNUSED;
void unwinder__intern_done(void);

/* unwinder_global_bytes(): the byte count plus the string table's size. */
size_t unwinder__intern_bytes(void);

/* ---- files.c: opening the files clients name --------------------------------- */

/* How long an open may take (a hung NFS or FUSE mount) before it is given up, in ms
 * (default 1000); for tests. */
extern unsigned unwinder__open_timeout_ms;
/* Opens stuck on their helper thread beyond which others fail at once (-ETIMEDOUT). */
#define UNWINDER_OPEN_MAX_STUCK 16

/* Opens @path read-only, safely for a path a client chose: the open runs on a helper
 * thread and is given up after unwinder__open_timeout_ms (the helper closes what it may
 * still open later); a symlink in the last component is not followed unless @follow
 * (paths under the debug root); only a regular file is opened, so a FIFO cannot block
 * and a device is not touched (opened O_PATH, checked with fstat, then reopened); with
 * @inode non-zero, only that inode. Returns the fd (O_CLOEXEC) and fills @ret_st, or
 * -errno: -ETIMEDOUT (given up), -ELOOP (a symlink), -EINVAL (not a regular file),
 * -ESTALE (another inode), or open(2)'s. */
int unwinder__open_file(const char *path, bool follow, uint64_t inode,
                        struct stat *ret_st) HP_WARN_UNUSED;
/* Opens given up so far. */
unsigned long unwinder__open_timeouts(void);

/* ---- srcline.c --------------------------------------------------------------- */

/* How srcline.c asks debuginfod for the debug file of a build id (when DEBUGINFOD_URLS
 * is set): 0 with a malloc'd path, or -errno. Replaceable for tests. */
extern int (*unwinder__debuginfod_fetch)(const uint8_t *build_id, uint32_t len, char **ret_path);

/* How many times srcline.c asked debuginfod (one per file at most). */
unsigned long unwinder__debuginfod_tries(void);

/* Releases the source-line cache. */
void unwinder__srcline_done(void);

/* ---- elf_cache.c ------------------------------------------------------------- */

/* The ELF cache's part of unwinder_global_init()/done(). */
int unwinder__elf_cache_init(void);
void unwinder__elf_cache_done(void);

/* ---- elf_symbols.c ----------------------------------------------------------- */

/* Fills @e's symbol index from @elf (the file's ELF, borrowed): its .symtab, else that of
 * its separate debug file (then e->debug_path is set), else its .dynsym. 0, or -ENOMEM. */
int unwinder__elf_load_symbols(Elf *elf, struct unwinder__elf *e);

/* ---- cfi.c ------------------------------------------------------------------- */

/* The step from a frame to its caller at ELF virtual address @vaddr (where the frame's
 * CFI row is looked up: its pc if innermost, its return address - 1 otherwise) as a
 * utable rule (shmem_ring/utable.h), from the file's .eh_frame through libdw. -ENOENT
 * when the CFI there is not of the simple form a utable rule holds (or the file cannot
 * be read), -ESRCH when no CFI covers @vaddr (code made without it: V8's builtins).
 * Thread-safe. */
int unwinder__cfi_rule(const struct unwinder__elf *e, uint64_t vaddr,
                       uint64_t *ret_rule) HP_WARN_UNUSED;
/* Frees what unwinder__cfi_rule() built for @e (from entry_free()). */
void unwinder__cfi_free(struct unwinder__elf *e);

/* ---- perfmap.c: names of JIT code from /tmp/perf-PID.map ---------------------- */

/* Longest name kept from a perf map line (longer ones are cut). */
#define UNWINDER_PERFMAP_MAX_NAME 1024

struct unwinder__perfmap;
struct unwinder_process;

/* Parses one perf map line (@len bytes, without its newline): "START SIZE name" with
 * START and SIZE in hex. 0 with the range and where the name lies in @line (cut to
 * UNWINDER_PERFMAP_MAX_NAME), or -EINVAL (not such a line, an empty or wrapping range,
 * a NUL in the name). Never reads past @len. */
int unwinder__perfmap_parse_line(const char *line, size_t len, uint64_t *ret_start,
                                 uint64_t *ret_size, size_t *ret_name_off,
                                 size_t *ret_name_len) HP_WARN_UNUSED;
/* A perf map read from @fd (taken; -1: none yet). NULL on ENOMEM. */
struct unwinder__perfmap *unwinder__perfmap_new(int fd);
struct unwinder__perfmap *unwinder__perfmap_free(struct unwinder__perfmap *pm);
/* Reads the complete lines added to the file since the last read (bounded: see
 * perfmap.c). True when some were taken. */
bool unwinder__perfmap_read(struct unwinder__perfmap *pm);
/* The name of the function holding @pc (not NUL-terminated, @ret_len bytes; borrowed
 * until the next read), the latest line's where lines overlap; NULL if none. */
const char *unwinder__perfmap_lookup(const struct unwinder__perfmap *pm, uint64_t pc,
                                     size_t *ret_len);
/* The invariants a perf map keeps whatever the file held (sorted, disjoint, bounded):
 * for tests. */
bool unwinder__perfmap_valid(const struct unwinder__perfmap *pm);
/* The interned name of the JIT function at @pc in @p's perf map, reading the lines
 * added since the last read first when it has none (rate-limited); @ret_read says
 * whether new lines were read (names of other pcs may have changed). NULL if none. */
const char *unwinder__perfmap_name(struct unwinder_process *p, uint64_t pc, bool *ret_read);

/* ---- per-process state: process.c, frames.c, table.c, unwind_*.c ------------- */

/* Leading libheapprof frames skipped at most (the hooks are a few frames deep). */
#define SKIP_MAX 32

/* Whether a frame (@ours: in libheapprof) is left out of a stack of @n frames so far:
 * the leading ones, the hooks (@skipped counts them, SKIP_MAX at most), and any further
 * up: the python.objects wrapper (preload/pyheap.c) between the interpreter and the
 * malloc that pymalloc calls, not the program's code. */
static inline bool unwinder__skip_ours(bool ours, size_t n, size_t *skipped)
{
    if (!ours)
        return false;
    if (n > 0)
        return true;
    if (*skipped >= SKIP_MAX)
        return false;
    (*skipped)++;
    return true;
}
/* Slots of the per-process cache of resolved frames (power of 2). */
#define PC_CACHE_SLOTS 2048
#define PC_CACHE_WAYS 4

/* Facts about maps.v[i], resolved on first use and dropped when the maps are reread. */
struct pmap {
    const struct unwinder__elf *elf;     /* NULL: anonymous, special or unusable */
    const struct unwinder__segment *seg; /* the PT_LOAD this mapping shows */
    const struct hp_mapping *hm;
    bool elf_done, hm_done;
    /* 0: the process shows this mapping; else it went away with that retirement and is
     * kept for the records written before (unwinder_retired_seq()). */
    uint64_t retired;
};

/* A frame resolved for one pc under one generation of the maps. */
struct pc_slot {
    uint64_t pc;  /* the looked-up pc (already adjusted for return addresses) */
    uint32_t gen; /* p->maps_gen when filled; 0: empty */
    bool skip;    /* in libheapprof */
    bool jit;     /* in JIT code: valid while jit_gen is p->jit_gen */
    uint32_t jit_gen;
    struct hp_frame f;
};

/* What went wrong during one step of an unwind (struct unwinder_process's fail): set by
 * libunwind's accessors (unwind_libunwind.c) and by unwinder__read_word(). */
enum {
    FAIL_NO_MAP = 1u << 0,      /* a pc in no executable mapping */
    FAIL_ELF = 1u << 1,         /* a pc in a file mapping whose ELF we cannot use */
    FAIL_NO_INFO = 1u << 2,     /* no unwind table, or no entry for the pc */
    FAIL_MEM = 1u << 3,         /* a memory read found nothing */
    FAIL_DEBUG_FRAME = 1u << 4, /* FAIL_NO_INFO in a file that has .debug_frame */
    FAIL_TRUNCATED = 1u << 5,   /* memory past a partial copy (unwinder_unwind_copy()) */
};

/* The state of one target process (unwinder_process_t), made in process.c. Not
 * thread-safe; caller serialises: one unwinder thread uses a process at a time. */
struct unwinder_process {
    pid_t pid;
    int maps_fd, mem_fd;
    /* "/proc/PID/root" when the process lives in another mount namespace (a container):
     * the files its maps name are opened there; "" otherwise. */
    char root[32];
    /* The client's unwind table, if it has one (unwinder_process_set_table). */
    struct utable table;
    struct known_slot *known; /* KNOWN_SLOTS entries, with the table */
    uint32_t known_gen;       /* bumped when the table is flushed; never 0 */
    struct unwinder_table_stats tstats;
    /* The current unwind's CFI lookup addresses, innermost first, for the table. */
    uint64_t lookups[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];
    size_t n_lookups;
    struct unwinder__maps maps;
    struct pmap *pm;      /* maps.n entries */
    uint32_t maps_gen;    /* bumped when the maps are reread; never 0 */
    uint64_t retired_seq; /* rereads that retired mappings (unwinder_retired_seq()) */
    /* The client tells of its loads and unloads (it sent WIRE_MAPS_CHANGED): the maps
     * are reread when it does, never for their age (unwinder__maps_refresh()). */
    bool loads_told;
    struct pc_slot *pcs; /* PC_CACHE_SLOTS entries */
    /* The runtime's perf map (perfmap.c), NULL until a JIT frame is named; jit_gen is
     * bumped when it read new lines (names of JIT frames cached before may change). */
    struct unwinder__perfmap *perfmap;
    uint32_t jit_gen;
    unsigned pc_victim;       /* round-robin replacement in a full set of pcs */
    uint64_t last_reparse_ns; /* last reread for an unknown pc */
    uint64_t parsed_ns;       /* last read of the maps, for any reason (coarse clock) */
    unw_addr_space_t as;
    Dwfl *dwfl;      /* the fallback unwinder's view of the maps; NULL until needed */
    bool dwfl_stale; /* the maps were reread since it was made */
    /* The ELF cache entries whose images the Dwfl reads (held while it lives). */
    const struct unwinder__elf **dw_elfs;
    size_t n_dw_elfs, cap_dw_elfs;
    uint64_t dw_pcs[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];
    bool dw_exact[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];

    /* The current unwinder_unwind() call's input (borrowed from its caller). */
    const uint64_t *regs;
    uint64_t stack_ptr;
    const uint8_t *stack;
    size_t stack_len;
    enum unwinder_copy copy; /* THREAD: memory outside the copy is read from the process */
    unsigned fail;           /* FAIL_* during the current step */
    unsigned mem_budget;     /* preads left */
    bool reparsed;
    bool ended_at_entry;     /* the current unwind ended at an entry return (frames.c) */
    struct unwinder__py *py; /* Python frames' state (python.c); NULL until told */
};

/* ---- python.c ---------------------------------------------------------------- */

struct unwinder__py;
void unwinder__py_free(struct unwinder__py *py);

/* ---- process.c --------------------------------------------------------------- */

/* How old a process's maps may get before an unwind rereads them (default 1 s;
 * rereading identical maps keeps every cache). For tests. */
extern uint64_t unwinder__maps_refresh_ns;

/* Rereads @p's maps when they are older than unwinder__maps_refresh_ns, unless its
 * client tells of its loads and unloads; called before each unwind. */
void unwinder__maps_refresh(struct unwinder_process *p);

/* The mapping name JIT code gets in frames (Perfetto's Mapping, the report). */
#define UNWINDER_JIT_PATH "[jit]"

/* True for executable memory that no ELF file backs, where JIT compilers put their code:
 * anonymous (named by prctl or not) or a memfd (double-mapped JIT code). */
bool unwinder__is_jit_map(const struct unwinder__map *m);

/* Index of the executable mapping holding @pc, rereading the maps (at most every 100 ms)
 * when none does; -1 if none. Invalidates pointers into p->maps and p->pm. */
ssize_t unwinder__find_exec(struct unwinder_process *p, uint64_t pc);

/* The ELF cache entry of the file behind p->maps.v[@i] (held until the maps are reread),
 * with p->pm[@i].seg set; NULL for an anonymous, special or unusable mapping. */
const struct unwinder__elf *unwinder__pmap_elf(struct unwinder_process *p, size_t i);

/* The interned hp_mapping of p->maps.v[@i]; NULL on ENOMEM (tried again next time). */
const struct hp_mapping *unwinder__pmap_mapping(struct unwinder_process *p, size_t i);

/* Reads the word at @addr of the current unwind's target into @ret_word: from the stack
 * copy, else from the cached image of a read-only file mapping, else (within the copy's
 * bounds, see enum unwinder_copy, and p->mem_budget) from /proc/PID/mem, else from the
 * file behind a writable file mapping. 0, or -EFAULT with FAIL_TRUNCATED or FAIL_MEM set
 * in p->fail. The memory reader of both backends. */
int unwinder__read_word(struct unwinder_process *p, uint64_t addr,
                        uint64_t *ret_word) HP_WARN_UNUSED;

/* ---- table.c ----------------------------------------------------------------- */

/* Offers p->lookups (the stack just unwound without error) to the unwind table. */
void unwinder__table_publish(struct unwinder_process *p);

/* ---- frames.c ---------------------------------------------------------------- */

/* True for a frame in the dynamic loader, where stacks without CFI end. */
bool unwinder__is_loader_frame(const struct hp_frame *f);

/* Fills @f for @pc (already adjusted for return addresses) and sets @ret_skip when it is in
 * libheapprof; a pc in no known mapping gives a frame without map. */
void unwinder__resolve_frame(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                             bool *ret_skip);

/* True when the return address @ra is the first byte of a function that no function's
 * code precedes: not the return of a call, but a trampoline that a context switch pushed
 * as the return address of a fiber's entry function (glibc's makecontext pushes
 * __start_context), whose frame is the outermost one. */
bool unwinder__entry_return(struct unwinder_process *p, uint64_t ra);

/* Ends @frames (@n of at most @max) with the frame "ERROR <reason>" @err, in place of the
 * last one when full, and marks @res. */
void unwinder__append_error(struct hp_frame *frames, size_t *n, size_t max, const char *err,
                            struct unwinder_result *res);

/* ---- unwind_libunwind.c ------------------------------------------------------ */

/* A libunwind address space whose accessors read through the struct unwinder_process
 * passed as the argument of unw_init_remote(), with the caching policy of the service.
 * NULL on ENOMEM. The caller destroys it with unw_destroy_addr_space(). */
unw_addr_space_t unwinder__addr_space_new(void);

/* ---- unwind_dwfl.c ----------------------------------------------------------- */

/* libunwind stopped after @steps frames in code with only .debug_frame: unwinds the
 * current input again with elfutils and, when that goes further, replaces @frames, @ret_n
 * and @ret_err with its stack. */
void unwinder__fallback_unwind(struct unwinder_process *p, size_t steps, struct hp_frame *frames,
                               size_t max, size_t *ret_n, const char **ret_err,
                               struct unwinder_result *res);
/* Ends @p's Dwfl and releases the files it held (process.c, when the process goes). */
void unwinder__fallback_done(struct unwinder_process *p);

#endif
