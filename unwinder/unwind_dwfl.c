/* unwinder/unwind_dwfl.c: the fallback unwinder, elfutils' (libdwfl), for code whose
 * CFI is only in .debug_frame, which libunwind does not read. A Dwfl per process, made
 * when first needed and again after the maps changed, reports every usable executable
 * ELF mapping at its load address; memory is read through unwinder__read_word()
 * (process.c), as libunwind's accessor does, and registers come from the client's
 * capture.
 *
 * elfutils never opens a file here: each module's ELF is the ELF cache's mapped image of
 * it (elf_memory), held while the Dwfl lives, and no separate debug file is looked for.
 * Left to itself, libdwfl would reopen each path by name (blocking on a FIFO a client put
 * there, following a symlink, hanging on a dead mount) and search more paths for debug
 * files. Its reads of an image go through unwinder__bus_guarded(): a file truncated
 * under them abandons the unwind (the Dwfl is leaked, the file marked faulted and left
 * out of the next Dwfl) and the sample keeps libunwind's frames and error.
 */
#include "unwinder/unwinder_internal.h"

#include <elfutils/libdwfl.h>
#include <errno.h>
#include <stdlib.h>

#include "common/containers.h"

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
    uint64_t v;
    if (unwinder__read_word(dwfl_arg, addr, &v) < 0)
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

/* The module's ELF: the image of the cache entry in its userdata. */
static int dw_find_elf(Dwfl_Module *mod, void **userdata, const char *modname, Dwarf_Addr base,
                       char **file_name, Elf **elfp)
{
    (void)mod;
    (void)modname;
    (void)base;
    const struct unwinder__elf *e = *userdata;
    *file_name = NULL;
    *elfp = e && e->ok ? elf_memory((char *)(uintptr_t)e->image, e->image_size) : NULL;
    return -1;
}

/* No separate debug files: the .debug_frame the fallback is for is the file's own. */
static int dw_find_debuginfo(Dwfl_Module *mod, void **userdata, const char *modname,
                             Dwarf_Addr base, const char *file_name, const char *debuglink_file,
                             GElf_Word debuglink_crc, char **debuginfo_file_name)
{
    (void)mod;
    (void)userdata;
    (void)modname;
    (void)base;
    (void)file_name;
    (void)debuglink_file;
    (void)debuglink_crc;
    *debuginfo_file_name = NULL;
    return -1;
}

static char *dw_debuginfo_path;
static const Dwfl_Callbacks dw_callbacks = {
    .find_elf = dw_find_elf,
    .find_debuginfo = dw_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &dw_debuginfo_path,
};

/* Releases the files held for the Dwfl (which is ended or abandoned). */
static void dw_release(struct unwinder_process *p)
{
    for (size_t i = 0; i < p->n_dw_elfs; i++)
        unwinder__elf_put(p->dw_elfs[i]);
    p->n_dw_elfs = 0;
}

void unwinder__fallback_done(struct unwinder_process *p)
{
    if (p->dwfl)
        dwfl_end(p->dwfl);
    p->dwfl = NULL;
    dw_release(p);
    free(p->dw_elfs);
    p->dw_elfs = NULL;
    p->cap_dw_elfs = 0;
}

/* Reports the module of cache entry @e mapped with load base @base: its range is what
 * libdwfl expects (from the first PT_LOAD's aligned address, which libdwfl subtracts to
 * find the bias), and @e, held, is its userdata. */
static void dw_report(struct unwinder_process *p, Dwfl *dwfl, const char *name,
                      const struct unwinder__elf *e, uint64_t base)
{
    if (e->n_loads == 0 ||
        hp_grow((void **)&p->dw_elfs, &p->cap_dw_elfs, p->n_dw_elfs + 1, sizeof(*p->dw_elfs)) < 0)
        return;
    uint64_t low = base + (e->loads[0].vaddr & -e->load0_align), high = 0;
    for (size_t k = 0; k < e->n_loads; k++)
        high = HP_MAX(high, base + e->loads[k].vaddr + e->loads[k].memsz);
    Dwfl_Module *mod = high > low ? dwfl_report_module(dwfl, name, low, high) : NULL;
    void **userdata;
    if (!mod || !dwfl_module_info(mod, &userdata, NULL, NULL, NULL, NULL, NULL, NULL))
        return;
    unwinder__elf_ref(e);
    p->dw_elfs[p->n_dw_elfs++] = e;
    *userdata = (void *)(uintptr_t)e;
}

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
        const struct unwinder__elf *e = unwinder__pmap_elf(p, i);
        const struct unwinder__segment *seg = p->pm[i].seg;
        if (!e || !seg || unwinder__elf_is_faulted(e))
            continue;
        dw_report(p, dwfl, m->path, e, m->start - m->pgoff - (seg->vaddr - seg->offset));
    }
    if (dwfl_report_end(dwfl, NULL, NULL) != 0 ||
        !dwfl_attach_state(dwfl, NULL, p->pid > 0 ? p->pid : 1, &dw_thread_callbacks, p)) {
        dwfl_end(dwfl);
        dw_release(p);
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

struct dw_args {
    struct unwinder_process *p;
    struct dw_walk w;
};

static int dw_frames(void *arg)
{
    struct dw_args *a = arg;
    (void)dwfl_getthread_frames(a->p->dwfl, a->p->pid > 0 ? a->p->pid : 1, dw_frame_cb, &a->w);
    return 0;
}

/* Unwinds the current input again with elfutils. Returns the number of frames found (pcs
 * and whether each is exact), 0 if the fallback cannot run. */
static size_t dw_unwind(struct unwinder_process *p, uint64_t *pcs, bool *exact, size_t max)
{
    if (p->dwfl && p->dwfl_stale)
        unwinder__fallback_done(p);
    if (!p->dwfl) {
        p->dwfl = dw_make(p);
        p->dwfl_stale = false;
        if (!p->dwfl)
            return 0;
    }
    struct dw_args a = {.p = p};
    a.w = (struct dw_walk){.pcs = pcs, .exact = exact, .n = 0, .max = max};
    uintptr_t addr = 0;
    if (unwinder__bus_guarded(dw_frames, &a, &addr) == -EFAULT) {
        /* A file truncated under libdw: the Dwfl is abandoned mid-use (leaked, never
         * touched again); the file that faulted is left out of the next one. */
        for (size_t i = 0; i < p->n_dw_elfs; i++)
            if (unwinder__elf_image_holds(p->dw_elfs[i], addr))
                unwinder__elf_mark_faulted(p->dw_elfs[i]);
        p->dwfl = NULL;
        dw_release(p);
        return 0;
    }
    return a.w.n;
}

/* libunwind stopped after @steps frames in code with only .debug_frame: unwinds again
 * with elfutils and keeps its stack if it goes further. */
void unwinder__fallback_unwind(struct unwinder_process *p, size_t steps, struct hp_frame *frames,
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
        /* Frame 0 too is a return address (frames.c); libdw calls it exact. */
        unwinder__resolve_frame(p, i > 0 && p->dw_exact[i] ? pc : pc - 1, &f, &skip);
        if (unwinder__skip_ours(skip, n, &skipped))
            continue;
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
