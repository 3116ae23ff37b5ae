/* unwinder/global.h: the state of unwinder/ shared by all processes and threads
 * (internal to unwinder/): the string table that interns paths and function names, and
 * the table of interned, immutable struct hp_mapping objects.
 *
 *     const char *name = unwinder__intern("main", 4);        // same pointer for equal text
 *     const struct hp_mapping *m = unwinder__mapping_intern(&tmpl);
 *
 * Thread-safe once unwinder_global_init() returned; everything handed out stays valid
 * until unwinder_global_done().
 */
#ifndef HP_UNWINDER_UNWINDER_INTERNAL_H
#define HP_UNWINDER_UNWINDER_INTERNAL_H

#include <elfutils/libdwfl.h>
#include <libelf.h>
#include <libunwind.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/frame.h"
#include "shmem_ring/utable.h"
#include "unwinder/elf_cache.h"
#include "unwinder/maps.h"
#include "unwinder/unwinder.h"

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

/* The ELF cache's part of unwinder_global_init()/done() (unwinder/elf_cache.c). */
int unwinder__elf_cache_init(void);
void unwinder__elf_cache_done(void);

/* How old a process's maps may get before an unwind rereads them (unwinder/unwind.c;
 * default 1 s; rereading identical maps keeps every cache). For tests. */
extern uint64_t unwinder__maps_refresh_ns;

/* How unwinder/srcline.c asks debuginfod for the debug file of a build id (when
 * DEBUGINFOD_URLS is set): 0 with a malloc'd path, or -errno. Replaceable for tests. */
extern int (*unwinder__debuginfod_fetch)(const uint8_t *build_id, uint32_t len, char **ret_path);

/* How many times unwinder/srcline.c asked debuginfod (one per file at most). */
unsigned long unwinder__debuginfod_tries(void);

/* Releases the source-line cache (unwinder/srcline.c). */
void unwinder__srcline_done(void);

/* elf_symbols.c */

int unwinder__elf_load_symbols(Elf *elf, struct unwinder__elf *e);

/* unwinder/cfi.c: the step from a frame to its caller at ELF virtual address @vaddr
 * (where the frame's CFI row is looked up: its pc if innermost, its return address - 1
 * otherwise) as a utable rule (shmem_ring/utable.h), from the file's .eh_frame through
 * libdw. -ENOENT when the CFI there is not of the simple form a utable rule holds (or
 * there is none). Thread-safe. */
int unwinder__cfi_rule(const struct unwinder__elf *e, uint64_t vaddr,
                       uint64_t *ret_rule) HP_WARN_UNUSED;
/* Frees what unwinder__cfi_rule() built for @e (from entry_free()). */
void unwinder__cfi_free(struct unwinder__elf *e);

/* Per-process state (process.c, table.c, frames.c, unwind_libunwind.c, unwind_dwfl.c) */

/* Leading libheapprof frames skipped at most (the hooks are a few frames deep). */
#define SKIP_MAX 32
/* Slots of the per-process cache of resolved frames (power of 2). */
#define PC_CACHE_SLOTS 2048
#define PC_CACHE_WAYS 4

/* Facts about maps.v[i], resolved on first use and dropped when the maps are reread. */
struct pmap {
    const struct unwinder__elf *elf;     /* NULL: anonymous, special or unusable */
    const struct unwinder__segment *seg; /* the PT_LOAD this mapping shows */
    const struct hp_mapping *hm;
    bool elf_done, hm_done;
};

/* A frame resolved for one pc under one generation of the maps. */
struct pc_slot {
    uint64_t pc;  /* the looked-up pc (already adjusted for return addresses) */
    uint32_t gen; /* p->maps_gen when filled; 0: empty */
    bool skip;    /* in libheapprof */
    struct hp_frame f;
};

struct unwinder_process {
    pid_t pid;
    int maps_fd, mem_fd;
    /* The client's unwind table, if it has one (unwinder_process_set_table). */
    struct utable table;
    struct known_slot *known; /* KNOWN_SLOTS entries, with the table */
    uint32_t known_gen;       /* bumped when the table is flushed; never 0 */
    struct unwinder_table_stats tstats;
    /* The current unwind's CFI lookup addresses, innermost first, for the table. */
    uint64_t lookups[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];
    size_t n_lookups;
    struct unwinder__maps maps;
    struct pmap *pm;          /* maps.n entries */
    uint32_t maps_gen;        /* bumped when the maps are reread; never 0 */
    struct pc_slot *pcs;      /* PC_CACHE_SLOTS entries */
    unsigned pc_victim;       /* round-robin replacement in a full set of pcs */
    uint64_t last_reparse_ns; /* last reread for an unknown pc */
    uint64_t parsed_ns;       /* last read of the maps, for any reason (coarse clock) */
    unw_addr_space_t as;
    Dwfl *dwfl;      /* the fallback unwinder's view of the maps; NULL until needed */
    bool dwfl_stale; /* the maps were reread since it was made */
    uint64_t dw_pcs[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];
    bool dw_exact[UNWINDER_MAX_FRAMES + SKIP_MAX + 1];

    /* The current unwinder_unwind() call's input (borrowed from its caller). */
    const uint64_t *regs;
    uint64_t stack_ptr;
    const uint8_t *stack;
    size_t stack_len;
    unsigned fail;       /* FAIL_* during the current step */
    unsigned mem_budget; /* preads left */
    bool reparsed;
};

/* process.c */

void unwinder__maps_refresh(struct unwinder_process *p);
ssize_t unwinder__find_exec(struct unwinder_process *p, uint64_t pc);
const struct unwinder__elf *unwinder__pmap_elf(struct unwinder_process *p, size_t i);
const struct hp_mapping *unwinder__pmap_mapping(struct unwinder_process *p, size_t i);

/* table.c */

void unwinder__table_publish(struct unwinder_process *p);

/* frames.c */

bool unwinder__is_loader_path(const char *path);
bool unwinder__is_loader_frame(const struct hp_frame *f);
void unwinder__resolve_frame(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                             bool *ret_skip);
void unwinder__append_error(struct hp_frame *frames, size_t *n, size_t max, const char *err,
                            struct unwinder_result *res);

/* unwind_libunwind.c */

/* A libunwind address space whose accessors read through the struct unwinder_process
 * passed as the argument of unw_init_remote(), with the caching policy of the service.
 * NULL on ENOMEM. The caller destroys it with unw_destroy_addr_space(). */
unw_addr_space_t unwinder__addr_space_new(void);

/* The libunwind memory accessor; @arg is the struct unwinder_process being unwound. The
 * fallback unwinder reads memory through it too. */
int unwinder__acc_access_mem(unw_addr_space_t as, unw_word_t addr, unw_word_t *valp, int write,
                             void *arg);

/* unwind_dwfl.c */

void unwinder__fallback_unwind(struct unwinder_process *p, size_t steps, struct hp_frame *frames,
                               size_t max, size_t *ret_n, const char **ret_err,
                               struct unwinder_result *res);

#endif
