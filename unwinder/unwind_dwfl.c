/* unwinder/unwind_dwfl.c: the fallback unwinder, elfutils' (libdwfl), for code whose
 * CFI is only in .debug_frame, which libunwind does not read. A Dwfl per process, made
 * when first needed and again after the maps changed, reports every usable executable
 * ELF mapping at its load address; memory is read through the libunwind accessor
 * (unwinder__acc_access_mem()) and registers come from the client's capture.
 */
#include "unwinder/unwinder_internal.h"

#include <elfutils/libdwfl.h>
#include <libunwind.h>

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
    if (unwinder__acc_access_mem(NULL, addr, &v, 0, dwfl_arg) < 0)
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
        const struct unwinder__elf *e = unwinder__pmap_elf(p, i);
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
        unwinder__resolve_frame(p, i == 0 || p->dw_exact[i] ? pc : pc - 1, &f, &skip);
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
