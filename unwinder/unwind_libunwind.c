/* unwinder/unwind_libunwind.c: unwinder_unwind(), the remote unwinding of stack copies
 * with libunwind, and the accessors it reads the target through.
 *
 * libunwind's remote API asks us, through unw_accessors_t, for registers (from the
 * client's capture), memory (unwinder__read_word() in process.c: the stack copy first,
 * then the mmap'd ELF file behind a read-only file mapping, then /proc/PID/mem) and unwind
 * tables (the .eh_frame_hdr of the ELF behind the pc, described to libunwind at its
 * address in the target).
 *
 * unwinder_unwind_copy() runs in steps: unwind_begin() takes the input, unwind_walk()
 * steps with libunwind (unwind_steps(), deciding after each step in step_ends()) and
 * hands over to the fallback, unwind_finish() ends the stack with its reason.
 *
 * Each step's frame is named by frames.c (which says why later frames use pc - 1). Code
 * whose CFI is only in .debug_frame hands the stack over to unwind_dwfl.c; a stack that
 * ends without error is offered to the client's unwind table (table.c).
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <libunwind.h>
#include <string.h>

#include "unwinder/sigmask.h"

/* Exported by libunwind-x86_64 (PROTECTED in its sources) but not declared in the
 * installed headers. Searches a UNW_INFO_FORMAT_REMOTE_TABLE through the accessors. */
int _Ux86_64_dwarf_search_unwind_table(unw_addr_space_t as, unw_word_t ip, unw_dyn_info_t *di,
                                       unw_proc_info_t *pi, int need_unwind_info, void *arg);

_Static_assert(WIRE_REG_RIP == UNW_X86_64_RIP, "register numbering");
_Static_assert(WIRE_REG_RSP == UNW_X86_64_RSP, "register numbering");
_Static_assert(WIRE_REG_RBP == UNW_X86_64_RBP, "register numbering");
_Static_assert(WIRE_REG_RBX == UNW_X86_64_RBX, "register numbering");
_Static_assert(WIRE_REG_R15 == UNW_X86_64_R15, "register numbering");

/* preads on /proc/PID/mem per unwind: bounds the time hostile stacks can cost. */
#define MEM_READ_BUDGET 2048

/* ---- libunwind accessors ----------------------------------------------------- */

static int acc_find_proc_info(unw_addr_space_t as, unw_word_t ip, unw_proc_info_t *pi,
                              int need_unwind_info, void *arg)
{
    struct unwinder_process *p = arg;
    ssize_t i = unwinder__find_exec(p, ip);
    if (i < 0) {
        p->fail |= FAIL_NO_MAP;
        return -UNW_ENOINFO;
    }
    const struct unwinder__map *m = &p->maps.v[i];
    const struct unwinder__elf *e = unwinder__pmap_elf(p, (size_t)i);
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
    /* The table lies where the file maps it with the same base. Code mapped a second
     * time on its own (node maps V8's builtins again next to its JIT code) has no table
     * there: libunwind would search whatever memory lies at that address, through
     * /proc/PID/mem, a read per probe. Such code goes without (a frame-pointer step). */
    ssize_t h = unwinder__maps_find(&p->maps, di.u.rti.segbase);
    if (h < 0 || p->maps.v[h].inode != m->inode || p->maps.v[h].dev_major != m->dev_major ||
        p->maps.v[h].dev_minor != m->dev_minor ||
        p->maps.v[h].start - p->maps.v[h].pgoff != m->start - m->pgoff) {
        p->fail |= FAIL_NO_INFO;
        return -UNW_ENOINFO;
    }
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

/* The memory accessor: the word reader shared with the fallback unwinder. */
static int acc_access_mem(unw_addr_space_t as, unw_word_t addr, unw_word_t *valp, int write,
                          void *arg)
{
    (void)as;
    if (write)
        return -UNW_EINVAL;
    uint64_t v;
    if (unwinder__read_word(arg, addr, &v) < 0)
        return -UNW_EINVAL;
    *valp = v;
    return 0;
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

/* Entries of libunwind's register-state cache per process (it rounds to a power of 2). */
#define REG_CACHE_ENTRIES 4096

unw_addr_space_t unwinder__addr_space_new(void)
{
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
    unw_addr_space_t as = unw_create_addr_space(&acc, 0);
    if (!as)
        return NULL;
    /* GLOBAL (one cache per address space, behind a lock) rather than PER_THREAD: the
     * per-thread cache is shared by every address space a thread uses, and one unwinder
     * thread serves several processes. */
    (void)unw_set_caching_policy(as, UNW_CACHE_GLOBAL);
    (void)unw_set_cache_size(as, REG_CACHE_ENTRIES, 0);
    return as;
}

/* The reason of an unwind that needed memory a partial copy does not hold (compared by
 * address). */
static const char truncated_reason[] = UNWINDER_TRUNCATED_FRAME;

static const char *fail_reason(unsigned fail, int r)
{
    /* First: what the copy did not hold explains whatever followed from it. */
    if (fail & FAIL_TRUNCATED)
        return truncated_reason;
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

int unwinder_unwind(unwinder_process_t *p, const uint64_t regs[WIRE_NREGS], uint64_t stack_ptr,
                    const uint8_t *stack, size_t stack_len, struct hp_frame *frames,
                    size_t max_frames, size_t *ret_n, struct unwinder_result *ret_res)
{
    return unwinder_unwind_copy(p, regs, stack_ptr, stack, stack_len, UNWINDER_COPY_THREAD, frames,
                                max_frames, ret_n, ret_res);
}

/* One unwind in progress, from unwind_begin() to unwind_finish(). */
struct unwind_run {
    struct unwinder_process *p;
    struct hp_frame *frames; /* the caller's, n of at most max filled */
    size_t n, max;
    struct unwinder_result res;
    /* Why the stack ends early: an "ERROR <reason>" frame, or truncated_reason. NULL: it
     * ended where the stack does. */
    const char *err;
    bool lookups_ok; /* p->lookups hold this stack's, for the unwind table */
    bool fallback;   /* libunwind met code described only by .debug_frame */
    size_t steps;    /* the frames libunwind stepped from, when fallback */
};

/* Takes the input of an unwind into @p (borrowed until unwind_finish()) and starts @u. */
static void unwind_begin(struct unwind_run *u, struct unwinder_process *p, const uint64_t *regs,
                         uint64_t stack_ptr, const uint8_t *stack, size_t stack_len,
                         enum unwinder_copy copy, struct hp_frame *frames, size_t max_frames)
{
    *u = (struct unwind_run){
        .p = p,
        .frames = frames,
        .max = HP_MIN(max_frames, (size_t)UNWINDER_MAX_FRAMES),
    };
    p->regs = regs;
    p->stack_ptr = stack_ptr;
    p->stack = stack;
    p->stack_len = stack_len;
    p->copy = copy;
    p->ended_at_entry = false;
    p->mem_budget = MEM_READ_BUDGET;
    p->reparsed = false;
    p->fail = 0;
    p->n_lookups = 0;
    u->lookups_ok = p->table.hdr != NULL;
    unwinder__maps_refresh(p);
}

/* Adds the frame of @pc (already adjusted for return addresses) unless it is
 * libheapprof's (unwinder__skip_ours(); the leading ones counted in @skipped); @ret_added says
 * whether it was added. False when @u is full: the stack ends there, cut. */
static bool add_frame(struct unwind_run *u, uint64_t pc, size_t *skipped, bool *ret_added)
{
    struct hp_frame f;
    bool skip;
    unwinder__resolve_frame(u->p, pc, &f, &skip);
    *ret_added = false;
    if (unwinder__skip_ours(skip, u->n, skipped))
        return true;
    if (u->n == u->max) {
        u->res.truncated = true;
        u->err = "ERROR MAX_FRAMES_EXCEEDED";
        return false;
    }
    u->frames[u->n++] = f;
    *ret_added = true;
    return true;
}

/* unw_step() returned @r from the frame at @ip, the @step-th (@interrupted: above a
 * signal frame; @added: in u->frames, last). True when the stack ends there: at its end,
 * or with u->err, and with u->fallback and u->steps when elfutils is to take over. */
static bool step_ends(struct unwind_run *u, size_t step, uint64_t ip, bool interrupted, bool added,
                      int r)
{
    struct unwinder_process *p = u->p;
    /* The entry trampoline of a fiber (makecontext's __start_context), pushed as the
     * return address of its entry function: no CFI covers the byte before it, and
     * nothing lies beyond its frame but the end of the fiber's stack. Named by where
     * it starts, it ends the stack. */
    if (step > 0 && !interrupted && added && (p->fail & FAIL_NO_INFO) &&
        !(p->fail & (FAIL_NO_MAP | FAIL_ELF)) && unwinder__entry_return(p, ip)) {
        bool ignored;
        unwinder__resolve_frame(p, ip, &u->frames[u->n - 1], &ignored);
        p->ended_at_entry = true;
        return true;
    }
    /* A pc in a file whose CFI is only in .debug_frame: libunwind found no unwind info
     * and guessed (frame pointer, or the end), so whatever it stepped to is not to be
     * trusted; elfutils, which reads .debug_frame, takes over from the start. */
    if (p->fail & FAIL_DEBUG_FRAME) {
        u->err = fail_reason(p->fail, r < 0 ? r : -UNW_ENOINFO);
        u->fallback = true;
        u->steps = step + 1;
        return true;
    }
    /* libunwind ends a chain it cannot follow (no unwind info, frame-pointer guess
     * rejected) with 0, like a real end; our accessors know better. */
    if (r == 0 && (p->fail & FAIL_NO_INFO) && !(p->fail & (FAIL_NO_MAP | FAIL_ELF)) && added &&
        unwinder__is_loader_frame(&u->frames[u->n - 1]))
        return true;
    if (r < 0 || (r == 0 && (p->fail & (FAIL_NO_MAP | FAIL_ELF | FAIL_NO_INFO | FAIL_TRUNCATED)))) {
        u->err = fail_reason(p->fail, r);
        u->fallback = (p->fail & FAIL_DEBUG_FRAME) != 0;
        u->steps = step + 1;
        return true;
    }
    return r == 0;
}

/* The step loop: names each frame libunwind steps to, from @c, until the stack ends. */
static void unwind_steps(struct unwind_run *u, unw_cursor_t *c)
{
    struct unwinder_process *p = u->p;
    uint64_t prev_ip = 0, prev_sp = 0;
    bool prev_added = false; /* frames[n - 1] is the previous step's frame */
    size_t skipped = 0;
    for (size_t step = 0;; step++) {
        unw_word_t ip, sp;
        if (unw_get_reg(c, UNW_REG_IP, &ip) < 0 || unw_get_reg(c, UNW_REG_SP, &sp) < 0) {
            u->err = "ERROR MEMORY_INVALID";
            return;
        }
        if (ip == 0) {
            if (step == 0)
                u->err = "ERROR INVALID_MAP";
            return;
        }
        if (step > 0 && ip == prev_ip && sp == prev_sp) {
            u->err = "ERROR REPEATED_FRAME";
            return;
        }
        uint64_t trampoline_ip = prev_ip;
        prev_ip = ip;
        prev_sp = sp;

        /* libunwind flags the frame whose registers came from a signal frame: this one
         * was interrupted (its pc is exact), and the previous one is the trampoline,
         * whose pc is where the handler returned to, its first instruction. */
        bool interrupted = step > 0 && unw_is_signal_frame(c) > 0;
        /* Where this frame's CFI row is looked up, for the unwind table: the frames past
         * a signal frame are not for a client's walk (the trampoline has no simple rule,
         * so a walk never gets there). */
        if (interrupted)
            u->lookups_ok = false;
        if (u->lookups_ok && p->n_lookups < HP_ARRAY_SIZE(p->lookups))
            p->lookups[p->n_lookups++] = step == 0 ? ip : ip - 1;
        if (interrupted && prev_added) {
            bool ignored;
            unwinder__resolve_frame(p, trampoline_ip, &u->frames[u->n - 1], &ignored);
        }
        if (!add_frame(u, interrupted ? ip : ip - 1, &skipped, &prev_added))
            return;

        p->fail = 0;
        int r = unw_step(c);
        if (step_ends(u, step, ip, interrupted, prev_added, r))
            return;
    }
}

/* Unwinds with libunwind, then with elfutils where libunwind met code described only by
 * .debug_frame, and offers the rules of a stack that ended without error to the unwind
 * table. */
static void unwind_walk(struct unwind_run *u)
{
    struct unwinder_process *p = u->p;
    unw_cursor_t c;
    int r = unw_init_remote(&c, p->as, p);
    if (r < 0) {
        u->err = fail_reason(p->fail, r);
        return;
    }
    unwind_steps(u, &c);
    if (u->fallback) {
        p->fail = 0;
        unwinder__fallback_unwind(p, u->steps, u->frames, u->max, &u->n, &u->err, &u->res);
        if (!u->err && (p->fail & FAIL_TRUNCATED))
            u->err = truncated_reason;
    }
    /* Past a copy that holds all of a foreign stack: the chain left the stack, whose
     * memory ends there (a fiber's entry frame, which has no caller). */
    if (u->err == truncated_reason && p->copy == UNWINDER_COPY_ENDS)
        u->err = NULL;
    if (!u->fallback && (!u->err || u->err == truncated_reason) && u->lookups_ok)
        unwinder__table_publish(p);
}

/* Ends the stack with the frame that says why it ended early, if it did, hands the
 * result over and drops the input borrowed in unwind_begin(). */
static void unwind_finish(struct unwind_run *u, size_t *ret_n, struct unwinder_result *ret_res)
{
    struct unwinder_process *p = u->p;
    /* Only hook frames and then the end: nothing a profile could use. */
    if (u->n == 0 && !u->err)
        u->err = "ERROR UNWIND_INFO_INVALID";
    if (u->err == truncated_reason)
        unwinder_mark_truncated(u->frames, &u->n, u->max, &u->res);
    else if (u->err)
        unwinder__append_error(u->frames, &u->n, u->max, u->err, &u->res);
    u->res.reparsed_maps = p->reparsed;
    p->regs = NULL;
    p->stack = NULL;
    p->stack_len = 0;
    p->copy = UNWINDER_COPY_THREAD;
    *ret_n = u->n;
    *ret_res = u->res;
}

int unwinder_unwind_copy(unwinder_process_t *p, const uint64_t regs[WIRE_NREGS], uint64_t stack_ptr,
                         const uint8_t *stack, size_t stack_len, enum unwinder_copy copy,
                         struct hp_frame *frames, size_t max_frames, size_t *ret_n,
                         struct unwinder_result *ret_res)
{
    if (!p || !regs || !frames || !ret_n || !ret_res || max_frames == 0 || (!stack && stack_len))
        return -EINVAL;
    struct unwind_run u;
    unwind_begin(&u, p, regs, stack_ptr, stack, stack_len, copy, frames, max_frames);
    /* libunwind's signal-mask syscalls are skipped while it runs (sigmask.h). */
    unwinder__sigmask_skip = true;
    unwind_walk(&u);
    unwinder__sigmask_skip = false;
    unwind_finish(&u, ret_n, ret_res);
    return 0;
}
