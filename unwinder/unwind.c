/* unwinder/unwind.c: remote unwinding of stack copies with libunwind, and the frames'
 * mappings and names.
 *
 * libunwind's remote API asks us, through unw_accessors_t, for registers (from the
 * client's capture), memory (the stack copy first, then the mmap'd ELF file behind a
 * read-only file mapping, then /proc/PID/mem) and unwind tables (the .eh_frame_hdr of the
 * ELF behind the pc, described to libunwind at its address in the target).
 *
 * Frame pcs. Frame 0's pc is used as is. Every later frame's pc is a return address, so
 * the function and the rel_pc we report are those of pc - 1, an address inside the call
 * instruction: a call that is the last instruction of a function (noreturn callee) would
 * otherwise be attributed to the next function, and a symbolizer looking up rel_pc gets
 * the line of the call. This is also what libunwindstack (heapprofd's unwinder) reports:
 * its non-leaf rel_pc is adjusted by 1 on x86_64. Frames right above a signal frame are
 * interrupted, not calling, and keep their exact pc.
 */
#include <elf.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <libunwind.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/utable.h"
#include "unwinder/elf_cache.h"
#include "unwinder/global.h"
#include "unwinder/maps.h"
#include "unwinder/sigmask.h"
#include "unwinder/unwinder.h"

/* Exported by libunwind-x86_64 (PROTECTED in its sources) but not declared in the
 * installed headers. Searches a UNW_INFO_FORMAT_REMOTE_TABLE through the accessors. */
int _Ux86_64_dwarf_search_unwind_table(unw_addr_space_t as, unw_word_t ip, unw_dyn_info_t *di,
                                       unw_proc_info_t *pi, int need_unwind_info, void *arg);

_Static_assert(WIRE_REG_RIP == UNW_X86_64_RIP, "register numbering");
_Static_assert(WIRE_REG_RSP == UNW_X86_64_RSP, "register numbering");
_Static_assert(WIRE_REG_RBP == UNW_X86_64_RBP, "register numbering");
_Static_assert(WIRE_REG_RBX == UNW_X86_64_RBX, "register numbering");
_Static_assert(WIRE_REG_R15 == UNW_X86_64_R15, "register numbering");

/* A pc outside every known executable mapping rereads the maps at most this often. */
#define REPARSE_MIN_INTERVAL_NS (100u * 1000 * 1000)

/* Maps older than this are reread before an unwind, so that a library unloaded and
 * another loaded at the same addresses (whose pcs are not unknown) is noticed. */
uint64_t unwinder__maps_refresh_ns = 1000ull * 1000 * 1000;
/* preads on /proc/PID/mem per unwind: bounds the time hostile stacks can cost. */
#define MEM_READ_BUDGET 2048
/* Leading libheapprof frames skipped at most (the hooks are a few frames deep). */
#define SKIP_MAX 32
/* Entries of libunwind's register-state cache per process (it rounds to a power of 2). */
#define UNW_CACHE_ENTRIES 4096
/* Slots of the per-process cache of resolved frames (power of 2). */
#define PC_CACHE_SLOTS 2048
#define PC_CACHE_WAYS 4
/* Slots of the per-process memory of lookup addresses already offered to the unwind
 * table (power of 2): a frame met again is not looked up in the CFI again. */
#define KNOWN_SLOTS 4096

/* What went wrong inside the accessors during one unw_step(). */
enum {
    FAIL_NO_MAP = 1u << 0,      /* a pc in no executable mapping */
    FAIL_ELF = 1u << 1,         /* a pc in a file mapping whose ELF we cannot use */
    FAIL_NO_INFO = 1u << 2,     /* no unwind table, or no entry for the pc */
    FAIL_MEM = 1u << 3,         /* a memory read found nothing */
    FAIL_DEBUG_FRAME = 1u << 4, /* FAIL_NO_INFO in a file that has .debug_frame */
};

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

/* A lookup address offered to the unwind table (published, or found without a rule)
 * under table generation `gen` of the process. */
struct known_slot {
    uint64_t addr;
    uint32_t gen; /* 0: empty */
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

/* ---- mappings ---------------------------------------------------------------- */

/* Releases the ELF entries held by @pm (@n entries) and frees it. */
static void pmaps_free(struct pmap *pm, size_t n)
{
    for (size_t i = 0; pm && i < n; i++)
        unwinder__elf_put(pm[i].elf);
    free(pm);
}

static bool maps_equal(const struct unwinder__maps *a, const struct unwinder__maps *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        const struct unwinder__map *x = &a->v[i], *y = &b->v[i];
        if (x->start != y->start || x->end != y->end || x->pgoff != y->pgoff ||
            x->inode != y->inode || x->dev_major != y->dev_major || x->dev_minor != y->dev_minor ||
            x->perms != y->perms || x->path_len != y->path_len ||
            memcmp(x->path, y->path, x->path_len) != 0)
            return false;
    }
    return true;
}

static bool same_map(const struct unwinder__map *x, const struct unwinder__map *y)
{
    return x->start == y->start && x->end == y->end && x->pgoff == y->pgoff &&
           x->inode == y->inode && x->dev_major == y->dev_major && x->dev_minor == y->dev_minor &&
           x->perms == y->perms && x->path_len == y->path_len &&
           memcmp(x->path, y->path, x->path_len) == 0;
}

/* True when an executable mapping of @old is not in @now, the same in every field (both
 * sorted by start, as the kernel lists them). */
static bool exec_mapping_gone(const struct unwinder__maps *old, const struct unwinder__maps *now)
{
    size_t j = 0;
    for (size_t i = 0; i < old->n; i++) {
        const struct unwinder__map *x = &old->v[i];
        if (!(x->perms & UNWINDER_PERM_EXEC))
            continue;
        while (j < now->n && now->v[j].start < x->start)
            j++;
        if (j == now->n || !same_map(x, &now->v[j]))
            return true;
    }
    return false;
}

/* Rereads the maps. When they changed, everything derived from the old ones is dropped
 * (returns true); identical maps keep the caches. */
static bool maps_reload(struct unwinder_process *p)
{
    p->parsed_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    struct unwinder__maps m;
    if (unwinder__maps_read(p->maps_fd, &m) < 0)
        return false;
    /* A process that has exited reads as no mappings at all (a live one always has some):
     * its last records are still to be named with the maps it had. */
    if (m.n == 0 && p->maps.n > 0) {
        unwinder__maps_done(&m);
        return false;
    }
    if (maps_equal(&m, &p->maps)) {
        unwinder__maps_done(&m);
        return false;
    }
    struct pmap *pm = calloc(m.n ? m.n : 1, sizeof(*pm));
    if (!pm) {
        unwinder__maps_done(&m);
        return false;
    }
    bool code_gone = exec_mapping_gone(&p->maps, &m);
    pmaps_free(p->pm, p->maps.n);
    unwinder__maps_done(&p->maps);
    p->maps = m;
    p->pm = pm;
    p->dwfl_stale = true;
    if (++p->maps_gen == 0)
        p->maps_gen = 1;
    /* Code gone or replaced: the client must not walk with rules that described it. New
     * code alone (a dlopen) leaves the rules of the rest true. */
    if (code_gone)
        unwinder_table_reset(p);
    /* Libraries may have been replaced at the same addresses. Only bumps a generation
     * counter, so it is safe from inside an accessor. */
    unw_flush_cache(p->as, 0, 0);
    return true;
}

/* An unknown pc: rereads the maps, at most every REPARSE_MIN_INTERVAL_NS. True when they
 * changed. */
static bool reparse(struct unwinder_process *p)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    if (p->last_reparse_ns && now - p->last_reparse_ns < REPARSE_MIN_INTERVAL_NS)
        return false;
    p->last_reparse_ns = now ? now : 1;
    p->reparsed = true;
    return maps_reload(p);
}

/* Index of the executable mapping holding @pc, rereading the maps (rate-limited) when
 * none does; -1 if none. Invalidates pointers into p->maps. */
static ssize_t find_exec(struct unwinder_process *p, uint64_t pc)
{
    ssize_t i = unwinder__maps_find(&p->maps, pc);
    if (i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC))
        return i;
    if (!reparse(p))
        return -1;
    i = unwinder__maps_find(&p->maps, pc);
    return i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC) ? i : -1;
}

static const struct unwinder__elf *pmap_elf(struct unwinder_process *p, size_t i)
{
    struct pmap *pm = &p->pm[i];
    if (pm->elf_done)
        return pm->elf;
    pm->elf_done = true;
    const struct unwinder__map *m = &p->maps.v[i];
    const struct unwinder__elf *e;
    if (m->path[0] != '/' ||
        unwinder__elf_get(makedev(m->dev_major, m->dev_minor), m->inode, m->path, &e) < 0)
        return NULL;
    if (!e->ok) {
        unwinder__elf_put(e);
        return NULL;
    }
    pm->elf = e; /* held until the maps are reread or the process is freed */
    pm->seg = unwinder__elf_segment_for(e, m->pgoff, (m->perms & UNWINDER_PERM_EXEC) ? PF_X : 0);
    return e;
}

static const struct hp_mapping *pmap_mapping(struct unwinder_process *p, size_t i)
{
    struct pmap *pm = &p->pm[i];
    if (pm->hm_done)
        return pm->hm;
    const struct unwinder__elf *e = pmap_elf(p, i);
    const struct unwinder__map *m = &p->maps.v[i];
    struct hp_mapping t = {
        .start = m->start,
        .end = m->end,
        .exact_offset = m->pgoff,
        .start_offset = 0,
        .load_bias = e ? e->load_bias : 0,
        .path = unwinder__intern(m->path, m->path_len),
    };
    if (e) {
        t.build_id_len = e->build_id_len;
        memcpy(t.build_id, e->build_id, e->build_id_len);
    }
    pm->hm = unwinder__mapping_intern(&t);
    pm->hm_done = pm->hm != NULL; /* retried after an allocation failure */
    return pm->hm;
}

/* ---- libunwind accessors ----------------------------------------------------- */

static int acc_find_proc_info(unw_addr_space_t as, unw_word_t ip, unw_proc_info_t *pi,
                              int need_unwind_info, void *arg)
{
    struct unwinder_process *p = arg;
    ssize_t i = find_exec(p, ip);
    if (i < 0) {
        p->fail |= FAIL_NO_MAP;
        return -UNW_ENOINFO;
    }
    const struct unwinder__map *m = &p->maps.v[i];
    const struct unwinder__elf *e = pmap_elf(p, (size_t)i);
    const struct unwinder__segment *seg = p->pm[i].seg;
    if (!e || !seg) {
        p->fail |= m->path[0] == '/' ? FAIL_ELF : FAIL_NO_INFO;
        return -UNW_ENOINFO;
    }
    if (!e->has_eh_hdr) {
        p->fail |= FAIL_NO_INFO | (e->has_debug_frame ? FAIL_DEBUG_FRAME : 0);
        return -UNW_ENOINFO;
    }
    /* The object's load base in the target: ELF vaddr v lives at base + v. */
    uint64_t base = m->start - m->pgoff - (seg->vaddr - seg->offset);
    unw_dyn_info_t di;
    memset(&di, 0, sizeof(di));
    di.format = UNW_INFO_FORMAT_REMOTE_TABLE;
    di.start_ip = base + seg->vaddr;
    di.end_ip = di.start_ip + seg->memsz;
    /* libunwind asserts this; with hostile maps it need not hold. */
    if (ip < di.start_ip || ip >= di.end_ip) {
        p->fail |= FAIL_NO_INFO;
        return -UNW_ENOINFO;
    }
    di.u.rti.name_ptr = 0;
    di.u.rti.segbase = base + e->eh_hdr_vaddr;
    di.u.rti.table_data = di.u.rti.segbase + e->eh_table_off;
    di.u.rti.table_len = e->eh_fde_count * 8 / sizeof(unw_word_t);
    int r = _Ux86_64_dwarf_search_unwind_table(as, ip, &di, pi, need_unwind_info, arg);
    if (r < 0)
        p->fail |= FAIL_NO_INFO | (e->has_debug_frame ? FAIL_DEBUG_FRAME : 0);
    return r;
}

/* libunwind calls this only for proc info it got from the dynamic-registration list
 * (UNW_INFO_FORMAT_DYNAMIC), which we never provide (get_dyn_info_list_addr fails).
 * The unwind_info that _Ux86_64_dwarf_search_unwind_table() fills in comes from
 * libunwind's internal pool and libunwind returns it there itself (its DWARF parser
 * releases UNW_INFO_FORMAT_TABLE info after each use), so freeing it here, as the ptrace
 * and coredump accessors of libunwind do with free(), would corrupt the heap. */
static void acc_put_unwind_info(unw_addr_space_t as, unw_proc_info_t *pi, void *arg)
{
    (void)as;
    (void)pi;
    (void)arg;
}

static int acc_get_dyn_info_list_addr(unw_addr_space_t as, unw_word_t *dilap, void *arg)
{
    (void)as;
    (void)dilap;
    (void)arg;
    return -UNW_ENOINFO;
}

/* Reads a word at @addr from the file behind the mapping that holds it: from read-only
 * segments only, or, with @writable, from data segments too. 0, or -1 when no usable file
 * backs @addr. */
static int file_read(struct unwinder_process *p, uint64_t addr, unw_word_t *valp, bool writable)
{
    const size_t w = sizeof(*valp);
    ssize_t i = unwinder__maps_find(&p->maps, addr);
    if (i < 0)
        return -1;
    const struct unwinder__map *m = &p->maps.v[i];
    if ((!writable && (m->perms & UNWINDER_PERM_WRITE)) || m->end - addr < w)
        return -1;
    const struct unwinder__elf *e = pmap_elf(p, (size_t)i);
    const struct unwinder__segment *seg = p->pm[i].seg;
    if (!e || !seg || (!writable && (seg->flags & PF_W)))
        return -1;
    uint64_t off = addr - m->start + m->pgoff;
    if (off < m->pgoff)
        return -1;
    /* Past the segment's file bytes lies its zero-filled part (.bss). */
    if (off + w > seg->offset + seg->filesz) {
        if (!writable || off < seg->offset)
            return unwinder__elf_read(e, off, valp, w) == 0 ? 0 : -1;
        *valp = 0;
        return 0;
    }
    return unwinder__elf_read(e, off, valp, w) == 0 ? 0 : -1;
}

static int acc_access_mem(unw_addr_space_t as, unw_word_t addr, unw_word_t *valp, int write,
                          void *arg)
{
    (void)as;
    struct unwinder_process *p = arg;
    if (write)
        return -UNW_EINVAL;
    const size_t w = sizeof(*valp);

    uint64_t rel = addr - p->stack_ptr;
    if (addr >= p->stack_ptr && rel < p->stack_len && p->stack_len - rel >= w) {
        memcpy(valp, p->stack + rel, w);
        return 0;
    }

    /* Read-only file mappings show the file's bytes: serve them from the cached image
     * (unwind tables, code for signal-frame checks) without a syscall. Writable segments
     * (data, relocated RELRO) differ from the file and go to the target's memory. */
    if (file_read(p, addr, valp, false) == 0)
        return 0;

    if (p->mem_fd >= 0 && p->mem_budget > 0 && addr <= (uint64_t)INT64_MAX - w) {
        p->mem_budget--;
        if (pread(p->mem_fd, valp, w, (off_t)addr) == (ssize_t)w)
            return 0;
    }

    /* The target's memory is gone (it exec'd or exited before this record was unwound)
     * or out of reach: a writable file segment still shows the file's bytes, unrelocated.
     * What unwinding reads there is the personality routine's address of a CIE
     * (DW_EH_PE_indirect, a GOT-like slot), which libunwind decodes but we never use;
     * failing the read would end the stack at every function with a cleanup handler,
     * such as libc's stdio (puts, fopen), instead. */
    if (file_read(p, addr, valp, true) == 0)
        return 0;
    p->fail |= FAIL_MEM;
    return -UNW_EINVAL;
}

static int acc_access_reg(unw_addr_space_t as, unw_regnum_t reg, unw_word_t *valp, int write,
                          void *arg)
{
    (void)as;
    struct unwinder_process *p = arg;
    if (write)
        return -UNW_EREADONLYREG;
    /* UNW_REG_IP and UNW_REG_SP are UNW_X86_64_RIP and UNW_X86_64_RSP. */
    if (reg < 0 || reg >= WIRE_NREGS)
        return -UNW_EBADREG;
    *valp = p->regs[reg];
    return 0;
}

static int acc_access_fpreg(unw_addr_space_t as, unw_regnum_t reg, unw_fpreg_t *val, int write,
                            void *arg)
{
    (void)as;
    (void)reg;
    (void)val;
    (void)write;
    (void)arg;
    return -UNW_EINVAL;
}

static int acc_resume(unw_addr_space_t as, unw_cursor_t *c, void *arg)
{
    (void)as;
    (void)c;
    (void)arg;
    return -UNW_EINVAL;
}

/* We symbolize from our own symbol index. */
static int acc_get_proc_name(unw_addr_space_t as, unw_word_t addr, char *buf, size_t len,
                             unw_word_t *offp, void *arg)
{
    (void)as;
    (void)addr;
    (void)buf;
    (void)len;
    (void)offp;
    (void)arg;
    return -UNW_EINVAL;
}

/* ---- processes --------------------------------------------------------------- */

int unwinder_process_new(pid_t pid, int maps_fd, int mem_fd, unwinder_process_t **ret)
{
    int r;
    unwinder_process_t *p = calloc(1, sizeof(*p));
    if (!p) {
        if (maps_fd >= 0)
            (void)close(maps_fd);
        if (mem_fd >= 0)
            (void)close(mem_fd);
        return -ENOMEM;
    }
    p->pid = pid;
    p->maps_fd = maps_fd;
    p->mem_fd = mem_fd;
    if (!ret) {
        r = -EINVAL;
        goto fail;
    }
    r = unwinder__maps_read(maps_fd, &p->maps);
    if (r < 0)
        goto fail;
    p->parsed_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    p->pm = calloc(p->maps.n ? p->maps.n : 1, sizeof(*p->pm));
    p->pcs = calloc(PC_CACHE_SLOTS, sizeof(*p->pcs));
    p->maps_gen = 1;
    /* libunwind copies the accessors into the address space. */
    unw_accessors_t acc = {
        .find_proc_info = acc_find_proc_info,
        .put_unwind_info = acc_put_unwind_info,
        .get_dyn_info_list_addr = acc_get_dyn_info_list_addr,
        .access_mem = acc_access_mem,
        .access_reg = acc_access_reg,
        .access_fpreg = acc_access_fpreg,
        .resume = acc_resume,
        .get_proc_name = acc_get_proc_name,
    };
    p->as = p->pm && p->pcs ? unw_create_addr_space(&acc, 0) : NULL;
    if (!p->as) {
        r = -ENOMEM;
        goto fail;
    }
    /* GLOBAL (one cache per address space, behind a lock) rather than PER_THREAD: the
     * per-thread cache is shared by every address space a thread uses, and one unwinder
     * thread serves several processes. */
    (void)unw_set_caching_policy(p->as, UNW_CACHE_GLOBAL);
    (void)unw_set_cache_size(p->as, UNW_CACHE_ENTRIES, 0);
    *ret = p;
    return 0;
fail:
    unwinder_process_free(p);
    return r;
}

int unwinder_process_set_table(unwinder_process_t *p, int fd)
{
    if (p->table.hdr)
        return -EBUSY;
    struct known_slot *known = calloc(KNOWN_SLOTS, sizeof(*known));
    if (!known)
        return -ENOMEM;
    int r = utable_map(fd, true, &p->table);
    if (r < 0) {
        free(known);
        return r;
    }
    p->known = known;
    p->known_gen = 1;
    return 0;
}

void unwinder_table_reset(unwinder_process_t *p)
{
    if (!p->table.hdr)
        return;
    utable_flush(&p->table);
    p->tstats.flushes++;
    if (++p->known_gen == 0)
        p->known_gen = 1;
}

void unwinder_maps_changed(unwinder_process_t *p, bool unloaded)
{
    uint32_t gen = p->known_gen;
    (void)maps_reload(p);
    /* A reread that finds code gone resets the table itself; else the client, which
     * waits for a new generation after an unload, is released here. */
    if (unloaded && p->known_gen == gen)
        unwinder_table_reset(p);
}

void unwinder_table_stats(const unwinder_process_t *p, struct unwinder_table_stats *ret)
{
    *ret = p->tstats;
}

/* True for the path of the dynamic loader. */
static bool is_loader_path(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, "ld-linux", 8) == 0 || strncmp(base, "ld.so", 5) == 0;
}

/* Offers the lookup addresses of the stack just unwound to the unwind table: each one
 * not offered before under the current maps gets its rule from the CFI of its file, and
 * the rule is published when there is one. */
static void table_publish(struct unwinder_process *p)
{
    for (size_t k = 0; k < p->n_lookups; k++) {
        uint64_t addr = p->lookups[k];
        struct known_slot *ks = &p->known[((addr * 0x9e3779b97f4a7c15ull) >> 40) % KNOWN_SLOTS];
        if (ks->addr == addr && ks->gen == p->known_gen)
            continue;
        *ks = (struct known_slot){.addr = addr, .gen = p->known_gen};
        ssize_t i = unwinder__maps_find(&p->maps, addr);
        const struct unwinder__elf *e =
            i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC) ? pmap_elf(p, (size_t)i) : NULL;
        const struct unwinder__segment *seg = e ? p->pm[i].seg : NULL;
        uint64_t rule;
        if (!seg || unwinder__cfi_rule(e,
                                       addr - p->maps.v[i].start + p->maps.v[i].pgoff +
                                           (seg->vaddr - seg->offset),
                                       &rule) < 0) {
            /* The last frame of a stack that ended without error, yet without a rule:
             * the dynamic loader's entry code (no CFI), where unwinder_unwind() ends
             * stacks of constructors run by _dl_init. A walk ends there too. */
            if (!seg || k + 1 != p->n_lookups || !is_loader_path(p->maps.v[i].path)) {
                p->tstats.no_rule++;
                continue;
            }
            rule = utable_rule_make(false, 0, false, 0, true);
        }
        utable_insert(&p->table, addr, rule);
        p->tstats.published++;
    }
}

unwinder_process_t *unwinder_process_free(unwinder_process_t *p)
{
    if (!p)
        return NULL;
    utable_unmap(&p->table);
    free(p->known);
    if (p->as)
        unw_destroy_addr_space(p->as);
    if (p->dwfl)
        dwfl_end(p->dwfl);
    pmaps_free(p->pm, p->maps.n);
    unwinder__maps_done(&p->maps);
    free(p->pcs);
    if (p->maps_fd >= 0)
        (void)close(p->maps_fd);
    if (p->mem_fd >= 0)
        (void)close(p->mem_fd);
    free(p);
    return NULL;
}

/* ---- fallback: elfutils' unwinder, for code described only by .debug_frame ---- */

static pid_t dw_next_thread(Dwfl *dwfl, void *dwfl_arg, void **thread_argp)
{
    (void)dwfl;
    if (*thread_argp)
        return 0;
    *thread_argp = dwfl_arg;
    struct unwinder_process *p = dwfl_arg;
    return p->pid > 0 ? p->pid : 1;
}

static bool dw_memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *dwfl_arg)
{
    (void)dwfl;
    unw_word_t v;
    if (acc_access_mem(NULL, addr, &v, 0, dwfl_arg) < 0)
        return false;
    *result = v;
    return true;
}

static bool dw_set_initial_registers(Dwfl_Thread *thread, void *thread_arg)
{
    struct unwinder_process *p = thread_arg;
    /* DWARF numbering for x86_64 is the wire's: 0-15 general registers, 16 the return
     * address column (rip). */
    Dwarf_Word regs[WIRE_NREGS];
    for (size_t i = 0; i < WIRE_NREGS; i++)
        regs[i] = p->regs[i];
    if (!dwfl_thread_state_registers(thread, 0, WIRE_NREGS, regs))
        return false;
    dwfl_thread_state_register_pc(thread, regs[WIRE_REG_RIP]);
    return true;
}

static const Dwfl_Thread_Callbacks dw_thread_callbacks = {
    .next_thread = dw_next_thread,
    .memory_read = dw_memory_read,
    .set_initial_registers = dw_set_initial_registers,
};

static char *dw_debuginfo_path;
static const Dwfl_Callbacks dw_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &dw_debuginfo_path,
};

/* A Dwfl reporting every usable ELF mapping at its load address, attached to the
 * process through our callbacks (the stack copy and the cached files). */
static Dwfl *dw_make(struct unwinder_process *p)
{
    Dwfl *dwfl = dwfl_begin(&dw_callbacks);
    if (!dwfl)
        return NULL;
    dwfl_report_begin(dwfl);
    for (size_t i = 0; i < p->maps.n; i++) {
        const struct unwinder__map *m = &p->maps.v[i];
        if (!(m->perms & UNWINDER_PERM_EXEC) || m->path[0] != '/')
            continue;
        const struct unwinder__elf *e = pmap_elf(p, i);
        const struct unwinder__segment *seg = p->pm[i].seg;
        if (!e || !seg)
            continue;
        uint64_t base = m->start - m->pgoff - (seg->vaddr - seg->offset);
        (void)dwfl_report_elf(dwfl, m->path, m->path, -1, base, false);
    }
    if (dwfl_report_end(dwfl, NULL, NULL) != 0 ||
        !dwfl_attach_state(dwfl, NULL, p->pid > 0 ? p->pid : 1, &dw_thread_callbacks, p)) {
        dwfl_end(dwfl);
        return NULL;
    }
    return dwfl;
}

struct dw_walk {
    uint64_t *pcs;
    bool *exact;
    size_t n, max;
    uint64_t sp; /* the previous frame's stack pointer, if have_sp */
    bool have_sp;
};

static int dw_frame_cb(Dwfl_Frame *state, void *arg)
{
    struct dw_walk *w = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(state, &pc, &activation) || pc == 0)
        return DWARF_CB_ABORT;
    /* A frame equal to the previous one (pc and stack pointer) would repeat forever;
     * recursion repeats the pc only. Without the stack pointer the walk is still bounded
     * by w->max. */
    Dwarf_Word sp = 0;
    bool have_sp = dwfl_frame_reg(state, WIRE_REG_RSP, &sp) == 0;
    if (w->n > 0 && w->pcs[w->n - 1] == pc && have_sp && w->have_sp && w->sp == sp)
        return DWARF_CB_ABORT;
    w->sp = sp;
    w->have_sp = have_sp;
    w->pcs[w->n] = pc;
    w->exact[w->n] = activation;
    w->n++;
    return w->n < w->max ? DWARF_CB_OK : DWARF_CB_ABORT;
}

/* Unwinds the current input again with elfutils. Returns the number of frames found (pcs
 * and whether each is exact), 0 if the fallback cannot run. */
static size_t dw_unwind(struct unwinder_process *p, uint64_t *pcs, bool *exact, size_t max)
{
    if (p->dwfl && p->dwfl_stale) {
        dwfl_end(p->dwfl);
        p->dwfl = NULL;
    }
    if (!p->dwfl) {
        p->dwfl = dw_make(p);
        p->dwfl_stale = false;
        if (!p->dwfl)
            return 0;
    }
    struct dw_walk w = {.pcs = pcs, .exact = exact, .n = 0, .max = max, .sp = 0, .have_sp = false};
    (void)dwfl_getthread_frames(p->dwfl, p->pid > 0 ? p->pid : 1, dw_frame_cb, &w);
    return w.n;
}

/* ---- unwinding --------------------------------------------------------------- */

static void resolve_frame(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                          bool *ret_skip);

/* libunwind stopped after @steps frames in code with only .debug_frame: unwinds again
 * with elfutils and keeps its stack if it goes further. */
static void fallback_unwind(struct unwinder_process *p, size_t steps, struct hp_frame *frames,
                            size_t max, size_t *ret_n, const char **ret_err,
                            struct unwinder_result *res)
{
    size_t want = max + SKIP_MAX + 1;
    size_t got = dw_unwind(p, p->dw_pcs, p->dw_exact, want);
    if (got <= steps)
        return;
    size_t n = 0, skipped = 0;
    const char *err = NULL;
    for (size_t i = 0; i < got; i++) {
        struct hp_frame f;
        bool skip;
        uint64_t pc = p->dw_pcs[i];
        resolve_frame(p, i == 0 || p->dw_exact[i] ? pc : pc - 1, &f, &skip);
        if (skip && n == 0 && skipped < SKIP_MAX) {
            skipped++;
            continue;
        }
        if (n == max) {
            res->truncated = true;
            err = "ERROR MAX_FRAMES_EXCEEDED";
            break;
        }
        frames[n++] = f;
    }
    if (!err && got == want) {
        res->truncated = true;
        err = "ERROR MAX_FRAMES_EXCEEDED";
    }
    *ret_n = n;
    *ret_err = err;
}

static const char *fail_reason(unsigned fail, int r)
{
    if (fail & FAIL_NO_MAP)
        return "ERROR INVALID_MAP";
    if (fail & FAIL_ELF)
        return "ERROR INVALID_ELF";
    if (fail & FAIL_NO_INFO)
        return "ERROR UNWIND_INFO_INVALID";
    if (fail & FAIL_MEM)
        return "ERROR MEMORY_INVALID";
    switch (r) {
    case -UNW_EINVALIDIP:
        return "ERROR INVALID_MAP";
    case -UNW_EBADREG:
    case -UNW_EINVAL:
        return "ERROR MEMORY_INVALID";
    default:
        return "ERROR UNWIND_INFO_INVALID";
    }
}

/* True for a frame in the dynamic loader. Its entry code (_start, _dl_start_user, which
 * run shared libraries' constructors through _dl_init) has no CFI: reaching it is the
 * end of the stack, not an unwinding error. */
static bool is_loader_frame(const struct hp_frame *f)
{
    return f->map && f->map->path && is_loader_path(f->map->path);
}

static bool is_libheapprof(const struct unwinder__map *m)
{
    const char *base = strrchr(m->path, '/');
    base = base ? base + 1 : m->path;
    return strncmp(base, "libheapprof", 11) == 0;
}

/* Fills @f for the pc @pc (already adjusted for return addresses). */
static void resolve_frame_slow(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                               bool *ret_skip)
{
    *f = (struct hp_frame){.map = NULL, .function_name = unwinder__empty(), .rel_pc = pc};
    *ret_skip = false;
    ssize_t i = find_exec(p, pc);
    if (i < 0)
        return;
    const struct unwinder__map *m = &p->maps.v[i];
    *ret_skip = is_libheapprof(m);
    const struct hp_mapping *hm = pmap_mapping(p, (size_t)i);
    const struct unwinder__elf *e = p->pm[i].elf;
    const struct unwinder__segment *seg = p->pm[i].seg;
    if (!hm)
        return;
    f->map = hm;
    f->rel_pc = pc - m->start + m->pgoff + (seg ? seg->vaddr - seg->offset : 0);
    if (e && seg) {
        const char *name = unwinder__elf_symbol(e, f->rel_pc);
        if (name)
            f->function_name = name;
    }
}

/* resolve_frame_slow(), cached per pc for the current maps: a warm unwind resolves each
 * frame with one probe instead of a mapping search, a symbol search and a name check. */
static void resolve_frame(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                          bool *ret_skip)
{
    /* PC_CACHE_WAYS-way set associative: direct mapping made a collision between two of
     * a stack's pcs (likely for a few dozen pcs in 2048 slots) cost both a slow lookup on
     * every unwind. */
    uint64_t h = pc * 0x9e3779b97f4a7c15ull;
    struct pc_slot *set =
        &p->pcs[((h >> 40) & (PC_CACHE_SLOTS / PC_CACHE_WAYS - 1)) * PC_CACHE_WAYS];
    for (size_t w = 0; w < PC_CACHE_WAYS; w++) {
        if (set[w].pc == pc && set[w].gen == p->maps_gen) {
            *f = set[w].f;
            *ret_skip = set[w].skip;
            return;
        }
    }
    resolve_frame_slow(p, pc, f, ret_skip);
    /* Only frames in a known mapping: an unknown pc may be found after a reread. */
    if (!f->map)
        return;
    struct pc_slot *s = NULL;
    for (size_t w = 0; w < PC_CACHE_WAYS && !s; w++)
        if (set[w].gen != p->maps_gen)
            s = &set[w];
    if (!s)
        s = &set[p->pc_victim++ % PC_CACHE_WAYS];
    s->pc = pc;
    s->gen = p->maps_gen;
    s->skip = *ret_skip;
    s->f = *f;
}

/* Ends @frames (@n of at most @max) with the frame "ERROR <reason>" @err, in place of the
 * last one when full. */
static void append_error(struct hp_frame *frames, size_t *n, size_t max, const char *err,
                         struct unwinder_result *res)
{
    if (*n == max)
        (*n)--;
    frames[(*n)++] = (struct hp_frame){
        .map = NULL, .function_name = unwinder__intern(err, strlen(err)), .rel_pc = 0};
    res->error = true;
}

int unwinder_unwind(unwinder_process_t *p, const uint64_t regs[WIRE_NREGS], uint64_t stack_ptr,
                    const uint8_t *stack, size_t stack_len, struct hp_frame *frames,
                    size_t max_frames, size_t *ret_n, struct unwinder_result *ret_res)
{
    if (!p || !regs || !frames || !ret_n || !ret_res || max_frames == 0 || (!stack && stack_len))
        return -EINVAL;
    size_t max = HP_MIN(max_frames, (size_t)UNWINDER_MAX_FRAMES);
    struct unwinder_result res = {0};
    const char *err = NULL;
    size_t n = 0;

    p->regs = regs;
    p->stack_ptr = stack_ptr;
    p->stack = stack;
    p->stack_len = stack_len;
    p->mem_budget = MEM_READ_BUDGET;
    p->reparsed = false;
    p->fail = 0;
    p->n_lookups = 0;
    bool lookups_ok = p->table.hdr != NULL;
    if (hp_clock_ns(CLOCK_MONOTONIC_COARSE) - p->parsed_ns >= unwinder__maps_refresh_ns)
        (void)maps_reload(p);

    unwinder__sigmask_skip = true;
    unw_cursor_t c;
    int r = unw_init_remote(&c, p->as, p);
    if (r < 0) {
        err = fail_reason(p->fail, r);
        goto out;
    }
    uint64_t prev_ip = 0, prev_sp = 0;
    bool prev_added = false; /* frames[n - 1] is the previous step's frame */
    bool fallback = false;   /* libunwind met code described only by .debug_frame */
    size_t steps = 0;
    size_t skipped = 0;
    for (size_t step = 0;; step++) {
        unw_word_t ip, sp;
        if (unw_get_reg(&c, UNW_REG_IP, &ip) < 0 || unw_get_reg(&c, UNW_REG_SP, &sp) < 0) {
            err = "ERROR MEMORY_INVALID";
            break;
        }
        if (ip == 0) {
            if (step == 0)
                err = "ERROR INVALID_MAP";
            break;
        }
        if (step > 0 && ip == prev_ip && sp == prev_sp) {
            err = "ERROR REPEATED_FRAME";
            break;
        }
        uint64_t trampoline_ip = prev_ip;
        prev_ip = ip;
        prev_sp = sp;

        /* libunwind flags the frame whose registers came from a signal frame: this one
         * was interrupted (its pc is exact), and the previous one is the trampoline,
         * whose pc is where the handler returned to, its first instruction. */
        bool interrupted = step > 0 && unw_is_signal_frame(&c) > 0;
        /* Where this frame's CFI row is looked up, for the unwind table: the frames past
         * a signal frame are not for a client's walk (the trampoline has no simple rule,
         * so a walk never gets there). */
        if (interrupted)
            lookups_ok = false;
        if (lookups_ok && p->n_lookups < HP_ARRAY_SIZE(p->lookups))
            p->lookups[p->n_lookups++] = step == 0 ? ip : ip - 1;
        if (interrupted && prev_added) {
            bool ignored;
            resolve_frame(p, trampoline_ip, &frames[n - 1], &ignored);
        }
        struct hp_frame f;
        bool skip;
        resolve_frame(p, step == 0 || interrupted ? ip : ip - 1, &f, &skip);
        prev_added = false;
        if (skip && n == 0 && skipped < SKIP_MAX) {
            skipped++;
        } else {
            if (n == max) {
                res.truncated = true;
                err = "ERROR MAX_FRAMES_EXCEEDED";
                break;
            }
            frames[n++] = f;
            prev_added = true;
        }

        p->fail = 0;
        r = unw_step(&c);
        /* A pc in a file whose CFI is only in .debug_frame: libunwind found no unwind info
         * and guessed (frame pointer, or the end), so whatever it stepped to is not to be
         * trusted; elfutils, which reads .debug_frame, takes over from the start. */
        if (p->fail & FAIL_DEBUG_FRAME) {
            err = fail_reason(p->fail, r < 0 ? r : -UNW_ENOINFO);
            fallback = true;
            steps = step + 1;
            break;
        }
        /* libunwind ends a chain it cannot follow (no unwind info, frame-pointer guess
         * rejected) with 0, like a real end; our accessors know better. */
        if (r == 0 && (p->fail & FAIL_NO_INFO) && !(p->fail & (FAIL_NO_MAP | FAIL_ELF)) &&
            prev_added && is_loader_frame(&frames[n - 1]))
            break;
        if (r < 0 || (r == 0 && (p->fail & (FAIL_NO_MAP | FAIL_ELF | FAIL_NO_INFO)))) {
            err = fail_reason(p->fail, r);
            fallback = (p->fail & FAIL_DEBUG_FRAME) != 0;
            steps = step + 1;
            break;
        }
        if (r == 0)
            break;
    }

    if (fallback)
        fallback_unwind(p, steps, frames, max, &n, &err, &res);
    else if (!err && lookups_ok)
        table_publish(p);
out:
    unwinder__sigmask_skip = false;
    /* Only hook frames and then the end: nothing a profile could use. */
    if (n == 0 && !err)
        err = "ERROR UNWIND_INFO_INVALID";
    if (err)
        append_error(frames, &n, max, err, &res);
    res.reparsed_maps = p->reparsed;
    p->regs = NULL;
    p->stack = NULL;
    p->stack_len = 0;
    *ret_n = n;
    *ret_res = res;
    return 0;
}

int unwinder_resolve_pcs(unwinder_process_t *p, const uint64_t *pcs, size_t n_pcs,
                         struct hp_frame *frames, size_t max_frames, size_t *ret_n,
                         struct unwinder_result *ret_res)
{
    if (!p || (!pcs && n_pcs) || !frames || !ret_n || !ret_res || max_frames == 0)
        return -EINVAL;
    size_t max = HP_MIN(max_frames, (size_t)UNWINDER_MAX_FRAMES);
    struct unwinder_result res = {0};
    const char *err = NULL;
    size_t n = 0, skipped = 0;
    p->reparsed = false;
    if (hp_clock_ns(CLOCK_MONOTONIC_COARSE) - p->parsed_ns >= unwinder__maps_refresh_ns)
        (void)maps_reload(p);
    for (size_t i = 0; i < n_pcs; i++) {
        struct hp_frame f;
        bool skip;
        uint64_t pc = pcs[i];
        resolve_frame(p, i == 0 ? pc : pc - 1, &f, &skip);
        if (!f.map) {
            err = "ERROR INVALID_MAP";
            break;
        }
        if (skip && n == 0 && skipped < SKIP_MAX) {
            skipped++;
            continue;
        }
        if (n == max) {
            res.truncated = true;
            err = "ERROR MAX_FRAMES_EXCEEDED";
            break;
        }
        frames[n++] = f;
    }
    if (n == 0 && !err)
        err = "ERROR UNWIND_INFO_INVALID";
    if (err)
        append_error(frames, &n, max, err, &res);
    res.reparsed_maps = p->reparsed;
    *ret_n = n;
    *ret_res = res;
    return 0;
}
