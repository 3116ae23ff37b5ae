/* unwinder/frames.c: a pc's frame: its mapping (an interned hp_mapping), its rel_pc and
 * the name of its function, and whether it lies in libheapprof (a hook frame, skipped)
 * or in the dynamic loader; cached per process and generation of the maps. Also
 * unwinder_resolve_pcs(), for stacks the client walked itself, and the "ERROR <reason>"
 * frame that ends a stack that failed.
 *
 * Frame pcs. Every frame's pc is a return address, so the function and the rel_pc we
 * report are those of pc - 1, an address inside the call instruction: a call that is the
 * last instruction of a function (noreturn callee) would otherwise be attributed to the
 * next function, and a symbolizer looking up rel_pc gets the line of the call (and, in
 * inlined code, the inlined function that makes it, not the one after it). This is also
 * what libunwindstack (heapprofd's unwinder) reports: its non-leaf rel_pc is adjusted by
 * 1 on x86_64. Frame 0 is no exception: the registers come from a call (the allocation
 * function's tail call into client_sample_tramp, or hp_capture_regs()), so their pc is
 * that call's return address. Frames right above a signal frame are interrupted, not
 * calling, and keep their exact pc. The callers adjust the pc.
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <string.h>

/* True for a frame in the dynamic loader. Its entry code (_start, _dl_start_user, which
 * run shared libraries' constructors through _dl_init) has no CFI: reaching it is the
 * end of the stack, not an unwinding error. */
bool unwinder__is_loader_frame(const struct hp_frame *f)
{
    return f->map && f->map->path && unwinder__is_loader_path(f->map->path);
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
    ssize_t i = unwinder__find_exec(p, pc);
    if (i < 0)
        return;
    const struct unwinder__map *m = &p->maps.v[i];
    *ret_skip = is_libheapprof(m);
    const struct hp_mapping *hm = unwinder__pmap_mapping(p, (size_t)i);
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
    } else if (unwinder__is_jit_map(m)) {
        bool read;
        const char *name = unwinder__perfmap_name(p, pc, &read);
        if (read && ++p->jit_gen == 0)
            p->jit_gen = 1;
        if (name)
            f->function_name = name;
    }
}

/* resolve_frame_slow(), cached per pc for the current maps: a warm unwind resolves each
 * frame with one probe instead of a mapping search, a symbol search and a name check. */
void unwinder__resolve_frame(struct unwinder_process *p, uint64_t pc, struct hp_frame *f,
                             bool *ret_skip)
{
    /* PC_CACHE_WAYS-way set associative: direct mapping made a collision between two of
     * a stack's pcs (likely for a few dozen pcs in 2048 slots) cost both a slow lookup on
     * every unwind. */
    uint64_t h = pc * 0x9e3779b97f4a7c15ull;
    struct pc_slot *set =
        &p->pcs[((h >> 40) & (PC_CACHE_SLOTS / PC_CACHE_WAYS - 1)) * PC_CACHE_WAYS];
    for (size_t w = 0; w < PC_CACHE_WAYS; w++) {
        if (set[w].pc == pc && set[w].gen == p->maps_gen &&
            (!set[w].jit || set[w].jit_gen == p->jit_gen)) {
            *f = set[w].f;
            *ret_skip = set[w].skip;
            return;
        }
    }
    resolve_frame_slow(p, pc, f, ret_skip);
    /* Only frames in a known mapping: an unknown pc may be found after a reread. A JIT
     * frame's name holds until the perf map gets new lines, which may give its code
     * another name; one without a name is not kept. */
    if (!f->map)
        return;
    bool jit = strcmp(f->map->path, UNWINDER_JIT_PATH) == 0;
    if (jit && !f->function_name[0])
        return; /* looked up again (the perf map is read again, within its rate) */
    struct pc_slot *s = NULL;
    for (size_t w = 0; w < PC_CACHE_WAYS && !s; w++)
        if (set[w].gen != p->maps_gen)
            s = &set[w];
    if (!s)
        s = &set[p->pc_victim++ % PC_CACHE_WAYS];
    s->pc = pc;
    s->gen = p->maps_gen;
    s->skip = *ret_skip;
    s->jit = jit;
    s->jit_gen = p->jit_gen;
    s->f = *f;
}

bool unwinder__entry_return(struct unwinder_process *p, uint64_t ra)
{
    ssize_t i = unwinder__find_exec(p, ra);
    if (i < 0)
        return false;
    const struct unwinder__map *m = &p->maps.v[i];
    const struct unwinder__elf *e = unwinder__pmap_elf(p, (size_t)i);
    const struct unwinder__segment *seg = p->pm[i].seg;
    if (!e || !seg || ra == m->start)
        return false;
    uint64_t vaddr = ra - m->start + m->pgoff + (seg->vaddr - seg->offset);
    return unwinder__elf_symbol_starts(e, vaddr) && !unwinder__elf_symbol(e, vaddr - 1);
}

/* Ends @frames (@n of at most @max) with the frame "ERROR <reason>" @err, in place of the
 * last one when full. */
void unwinder__append_error(struct hp_frame *frames, size_t *n, size_t max, const char *err,
                            struct unwinder_result *res)
{
    if (*n == max)
        (*n)--;
    frames[(*n)++] = (struct hp_frame){
        .map = NULL, .function_name = unwinder__intern(err, strlen(err)), .rel_pc = 0};
    res->error = true;
}

void unwinder_mark_truncated(struct hp_frame *frames, size_t *n, size_t max,
                             struct unwinder_result *res)
{
    if (max == 0)
        return;
    if (*n == max)
        (*n)--;
    frames[(*n)++] =
        (struct hp_frame){.map = NULL,
                          .function_name = unwinder__intern(UNWINDER_TRUNCATED_FRAME,
                                                            sizeof(UNWINDER_TRUNCATED_FRAME) - 1),
                          .rel_pc = 0};
    res->copy_truncated = true;
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
    unwinder__maps_refresh(p);
    for (size_t i = 0; i < n_pcs; i++) {
        struct hp_frame f;
        bool skip;
        uint64_t pc = pcs[i];
        unwinder__resolve_frame(p, pc - 1, &f, &skip);
        if (!f.map) {
            err = "ERROR INVALID_MAP";
            break;
        }
        /* A fiber's entry trampoline: named by where it starts, as unwinder_unwind() does. */
        if (i > 0 && !f.function_name[0] && unwinder__entry_return(p, pc))
            unwinder__resolve_frame(p, pc, &f, &skip);
        if (unwinder__skip_ours(skip, n, &skipped))
            continue;
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
        unwinder__append_error(frames, &n, max, err, &res);
    res.reparsed_maps = p->reparsed;
    *ret_n = n;
    *ret_res = res;
    return 0;
}
