/* unwinder/process.c: the state of one target process (struct unwinder_process): its
 * maps, the facts resolved per mapping (ELF cache entry, PT_LOAD shown, interned
 * hp_mapping), when the maps are reread, and unwinder_process_new()/free() and
 * unwinder_maps_changed().
 *
 * The maps are reread for a pc in no executable mapping (at most every 100 ms), when the
 * client says its code changed, and, for a client that never said so, before an unwind
 * when they are older than unwinder__maps_refresh_ns. Identical maps keep every cache;
 * changed ones drop what was derived from the old ones: the per-mapping facts, the cached
 * frames (a new generation), libunwind's cache, the fallback's Dwfl, and the unwind
 * table's rules when code went away.
 *
 * Not thread-safe: one unwinder thread uses a process at a time.
 */
#include "unwinder/unwinder_internal.h"

#include <elf.h>
#include <errno.h>
#include <libunwind.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/utable.h"

/* A pc outside every known executable mapping rereads the maps at most this often. */
#define REPARSE_MIN_INTERVAL_NS (100u * 1000 * 1000)

/* Maps older than this are reread before an unwind, so that a library unloaded and
 * another loaded at the same addresses (whose pcs are not unknown) is noticed. Not for a
 * client that tells of its loads (p->loads_told): the maps as they are now would name
 * the records of the old library still to be read after the new one, which its client
 * tells of in the ring after them. */
uint64_t unwinder__maps_refresh_ns = 1000ull * 1000 * 1000;

/* ---- mappings ---------------------------------------------------------------- */

/* Releases the ELF entries held by @pm (@n entries) and frees it. */
static void pmaps_free(struct pmap *pm, size_t n)
{
    for (size_t i = 0; pm && i < n; i++)
        unwinder__elf_put(pm[i].elf);
    free(pm);
}

static bool same_map(const struct unwinder__map *x, const struct unwinder__map *y)
{
    return x->start == y->start && x->end == y->end && x->pgoff == y->pgoff &&
           x->inode == y->inode && x->dev_major == y->dev_major && x->dev_minor == y->dev_minor &&
           x->perms == y->perms && x->path_len == y->path_len &&
           memcmp(x->path, y->path, x->path_len) == 0;
}

/* True when @m is what p->maps shows of the process (its entries but the retired ones). */
static bool kernel_view_equal(const struct unwinder_process *p, const struct unwinder__maps *m)
{
    size_t j = 0;
    for (size_t i = 0; i < p->maps.n; i++) {
        if (p->pm[i].retired)
            continue;
        if (j == m->n || !same_map(&p->maps.v[i], &m->v[j]))
            return false;
        j++;
    }
    return j == m->n;
}

/* True when @m holds a mapping the same as @x in every field. */
static bool in_maps(const struct unwinder__maps *m, const struct unwinder__map *x)
{
    ssize_t j = unwinder__maps_find(m, x->start);
    return j >= 0 && same_map(x, &m->v[j]);
}

/* True when a mapping of @m covers part of [start, end). */
static bool overlaps(const struct unwinder__maps *m, uint64_t start, uint64_t end)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].start < end)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && m->v[lo - 1].end > start;
}

bool unwinder__is_jit_map(const struct unwinder__map *m)
{
    return (m->perms & UNWINDER_PERM_EXEC) &&
           (m->path[0] == '\0' || strncmp(m->path, "[anon:", 6) == 0 ||
            strncmp(m->path, "/memfd:", 7) == 0);
}

/* True when anonymous executable mappings of @m cover all of [start, end). */
static bool anon_code_covers(const struct unwinder__maps *m, uint64_t start, uint64_t end)
{
    while (start < end) {
        ssize_t j = unwinder__maps_find(m, start);
        if (j < 0 || !unwinder__is_jit_map(&m->v[j]))
            return false;
        start = m->v[j].end;
    }
    return true;
}

/* True when an executable mapping that p->maps shows of the process is not in @now. JIT
 * code memory that grew, or was split by a change of protection elsewhere, is still
 * there: the frame-pointer rules published for its pages (table.c) hold for any code
 * the same JIT puts there. */
static bool exec_mapping_gone(const struct unwinder_process *p, const struct unwinder__maps *now)
{
    for (size_t i = 0; i < p->maps.n; i++) {
        const struct unwinder__map *x = &p->maps.v[i];
        if ((x->perms & UNWINDER_PERM_EXEC) && !p->pm[i].retired && !in_maps(now, x) &&
            !(unwinder__is_jit_map(x) && anon_code_covers(now, x->start, x->end)))
            return true;
    }
    return false;
}

/* File mappings the process no longer shows (an unloaded library's code, and its other
 * segments, whose unwind tables and data the unwind of its frames reads) are kept in
 * p->maps, with what was resolved for them (pm[i].retired: the retirement they went
 * with), so that records written before they went are still named and unwound (the
 * file is held by its ELF cache entry). A mapping that another one now overlaps is not
 * kept: the address belongs to the new one. The caller lets them go with
 * unwinder_retired_drop(). */
#define RETIRED_MAX 256

struct retired {
    struct unwinder__map m;
    struct pmap pm;
};

/* Moves the file mappings of p->maps that @now neither shows nor overlaps into
 * @out (room for p->maps.n), their paths interned and their resolved facts moved (p->pm
 * loses them). Returns how many, at most RETIRED_MAX (the oldest go first). */
static size_t retire(struct unwinder_process *p, const struct unwinder__maps *now,
                     struct retired *out)
{
    size_t k = 0;
    uint64_t seq = p->retired_seq + 1; /* one retirement per reread */
    for (size_t i = 0; i < p->maps.n; i++) {
        struct unwinder__map x = p->maps.v[i];
        if (x.path[0] != '/' || (!p->pm[i].retired && in_maps(now, &x)) ||
            overlaps(now, x.start, x.end))
            continue;
        x.path = unwinder__intern(x.path, x.path_len);
        x.path_len = (uint32_t)strlen(x.path);
        out[k].m = x;
        out[k].pm = p->pm[i];
        if (!out[k].pm.retired)
            out[k].pm.retired = p->retired_seq = seq;
        p->pm[i] = (struct pmap){0};
        k++;
    }
    while (k > RETIRED_MAX) {
        size_t oldest = 0;
        for (size_t j = 1; j < k; j++)
            if (out[j].pm.retired < out[oldest].pm.retired)
                oldest = j;
        unwinder__elf_put(out[oldest].pm.elf);
        memmove(&out[oldest], &out[oldest + 1], (k - oldest - 1) * sizeof(*out));
        k--;
    }
    return k;
}

/* Merges @m (the process's maps, sorted) and @r (@nr retired mappings, sorted, disjoint
 * from @m) into @m; @ret_pm gets the facts of each entry (fresh for @m's). */
static int merge_retired(struct unwinder__maps *m, const struct retired *r, size_t nr,
                         struct pmap **ret_pm)
{
    size_t n = m->n + nr;
    struct unwinder__map *v = malloc((n ? n : 1) * sizeof(*v));
    struct pmap *pm = calloc(n ? n : 1, sizeof(*pm));
    if (!v || !pm) {
        free(v);
        free(pm);
        return -ENOMEM;
    }
    size_t a = 0, b = 0;
    for (size_t k = 0; k < n; k++) {
        if (b < nr && (a == m->n || r[b].m.start < m->v[a].start)) {
            v[k] = r[b].m;
            pm[k] = r[b].pm;
            b++;
        } else {
            v[k] = m->v[a++];
        }
    }
    free(m->v);
    m->v = v;
    m->n = n;
    *ret_pm = pm;
    return 0;
}

static void maps_changed_caches(struct unwinder_process *p)
{
    p->dwfl_stale = true;
    if (++p->maps_gen == 0)
        p->maps_gen = 1;
    /* Libraries may have been replaced at the same addresses. Only bumps a generation
     * counter, so it is safe from inside an accessor. */
    unw_flush_cache(p->as, 0, 0);
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
    if (kernel_view_equal(p, &m)) {
        unwinder__maps_done(&m);
        return false;
    }
    struct retired *r = malloc((p->maps.n ? p->maps.n : 1) * sizeof(*r));
    if (!r) {
        unwinder__maps_done(&m);
        return false;
    }
    bool code_gone = exec_mapping_gone(p, &m);
    size_t nr = retire(p, &m, r);
    struct pmap *pm;
    if (merge_retired(&m, r, nr, &pm) < 0) {
        /* Without memory for them, the retired mappings go now. */
        for (size_t k = 0; k < nr; k++)
            unwinder__elf_put(r[k].pm.elf);
        pm = calloc(m.n ? m.n : 1, sizeof(*pm));
        if (!pm) {
            free(r);
            unwinder__maps_done(&m);
            return false;
        }
    }
    free(r);
    pmaps_free(p->pm, p->maps.n);
    unwinder__maps_done(&p->maps);
    p->maps = m;
    p->pm = pm;
    maps_changed_caches(p);
    /* Code gone or replaced: the client must not walk with rules that described it. New
     * code alone (a dlopen) leaves the rules of the rest true. */
    if (code_gone)
        unwinder_table_reset(p);
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

void unwinder__maps_refresh(struct unwinder_process *p)
{
    if (p->loads_told)
        return;
    if (hp_clock_ns(CLOCK_MONOTONIC_COARSE) - p->parsed_ns >= unwinder__maps_refresh_ns)
        (void)maps_reload(p);
}

/* Index of the executable mapping holding @pc, rereading the maps (rate-limited) when
 * none does; -1 if none. Invalidates pointers into p->maps. */
ssize_t unwinder__find_exec(struct unwinder_process *p, uint64_t pc)
{
    ssize_t i = unwinder__maps_find(&p->maps, pc);
    if (i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC))
        return i;
    if (!reparse(p))
        return -1;
    i = unwinder__maps_find(&p->maps, pc);
    return i >= 0 && (p->maps.v[i].perms & UNWINDER_PERM_EXEC) ? i : -1;
}

const struct unwinder__elf *unwinder__pmap_elf(struct unwinder_process *p, size_t i)
{
    struct pmap *pm = &p->pm[i];
    if (pm->elf_done)
        return pm->elf;
    pm->elf_done = true;
    const struct unwinder__map *m = &p->maps.v[i];
    const struct unwinder__elf *e;
    if (m->path[0] != '/' || unwinder__elf_get_in(makedev(m->dev_major, m->dev_minor), m->inode,
                                                  m->path, p->root[0] ? p->root : NULL, &e) < 0)
        return NULL;
    if (!e->ok) {
        unwinder__elf_put(e);
        return NULL;
    }
    pm->elf = e; /* held until the maps are reread or the process is freed */
    pm->seg = unwinder__elf_segment_for(e, m->pgoff, (m->perms & UNWINDER_PERM_EXEC) ? PF_X : 0);
    return e;
}

const struct hp_mapping *unwinder__pmap_mapping(struct unwinder_process *p, size_t i)
{
    struct pmap *pm = &p->pm[i];
    if (pm->hm_done)
        return pm->hm;
    const struct unwinder__elf *e = unwinder__pmap_elf(p, i);
    const struct unwinder__map *m = &p->maps.v[i];
    struct hp_mapping t = {
        .start = m->start,
        .end = m->end,
        .exact_offset = m->pgoff,
        .start_offset = 0,
        .load_bias = e ? e->load_bias : 0,
        .path = unwinder__intern(m->path, m->path_len),
    };
    /* JIT code: named so in traces and reports, its functions from the perf map. */
    if (unwinder__is_jit_map(m))
        t.path = unwinder__intern(UNWINDER_JIT_PATH, sizeof(UNWINDER_JIT_PATH) - 1);
    if (e) {
        t.build_id_len = e->build_id_len;
        memcpy(t.build_id, e->build_id, e->build_id_len);
    }
    pm->hm = unwinder__mapping_intern(&t);
    pm->hm_done = pm->hm != NULL; /* retried after an allocation failure */
    return pm->hm;
}

/* ---- memory ------------------------------------------------------------------ */

/* Reads a word at @addr from the file behind the mapping that holds it: from read-only
 * segments only, or, with @writable, from data segments too. 0, or -1 when no usable file
 * backs @addr. */
static int file_read(struct unwinder_process *p, uint64_t addr, uint64_t *valp, bool writable)
{
    const size_t w = sizeof(*valp);
    ssize_t i = unwinder__maps_find(&p->maps, addr);
    if (i < 0)
        return -1;
    const struct unwinder__map *m = &p->maps.v[i];
    if ((!writable && (m->perms & UNWINDER_PERM_WRITE)) || m->end - addr < w)
        return -1;
    const struct unwinder__elf *e = unwinder__pmap_elf(p, (size_t)i);
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

int unwinder__read_word(struct unwinder_process *p, uint64_t addr, uint64_t *ret_word)
{
    uint64_t v;
    const size_t w = sizeof(v);

    uint64_t rel = addr - p->stack_ptr;
    if (addr >= p->stack_ptr && rel < p->stack_len && p->stack_len - rel >= w) {
        memcpy(&v, p->stack + rel, w);
        goto found;
    }

    /* Read-only file mappings show the file's bytes: serve them from the cached image
     * (unwind tables, code for signal-frame checks) without a syscall. Writable segments
     * (data, relocated RELRO) differ from the file and go to the target's memory. */
    if (file_read(p, addr, &v, false) == 0)
        goto found;

    /* Past a copy of a foreign stack, or of one cut short: the rest, or the stack a signal
     * handler interrupted, is in the process, but no longer as it was. Only a file's data
     * segment (a GOT slot) is worth reading there. */
    if (p->copy != UNWINDER_COPY_THREAD) {
        ssize_t i = unwinder__maps_find(&p->maps, addr);
        if (i < 0 || p->maps.v[i].path[0] != '/') {
            p->fail |= FAIL_TRUNCATED;
            return -EFAULT;
        }
    }

    if (p->mem_fd >= 0 && p->mem_budget > 0 && addr <= (uint64_t)INT64_MAX - w) {
        p->mem_budget--;
        if (pread(p->mem_fd, &v, w, (off_t)addr) == (ssize_t)w)
            goto found;
    }

    /* The target's memory is gone (it exec'd or exited before this record was unwound)
     * or out of reach: a writable file segment still shows the file's bytes, unrelocated.
     * What unwinding reads there is the personality routine's address of a CIE
     * (DW_EH_PE_indirect, a GOT-like slot), which libunwind decodes but we never use;
     * failing the read would end the stack at every function with a cleanup handler,
     * such as libc's stdio (puts, fopen), instead. */
    if (file_read(p, addr, &v, true) == 0)
        goto found;
    p->fail |= FAIL_MEM;
    return -EFAULT;
found:
    *ret_word = v;
    return 0;
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
    /* In another mount namespace (a container) the paths of its maps are in its root. */
    char their_mnt[64];
    snprintf(their_mnt, sizeof(their_mnt), "/proc/%d/ns/mnt", (int)pid);
    struct stat ours, theirs;
    if (stat("/proc/self/ns/mnt", &ours) == 0 && stat(their_mnt, &theirs) == 0 &&
        (ours.st_ino != theirs.st_ino || ours.st_dev != theirs.st_dev))
        snprintf(p->root, sizeof(p->root), "/proc/%d/root", (int)pid);
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
    p->as = p->pm && p->pcs ? unwinder__addr_space_new() : NULL;
    if (!p->as) {
        r = -ENOMEM;
        goto fail;
    }
    *ret = p;
    return 0;
fail:
    unwinder_process_free(p);
    return r;
}

void unwinder_maps_changed(unwinder_process_t *p, bool unloaded)
{
    p->loads_told = true;
    uint32_t gen = p->known_gen;
    (void)maps_reload(p);
    /* A reread that finds code gone resets the table itself; else the client, which
     * waits for a new generation after an unload, is released here. */
    if (unloaded && p->known_gen == gen)
        unwinder_table_reset(p);
}

uint64_t unwinder_retired_seq(const unwinder_process_t *p)
{
    return p->retired_seq;
}

void unwinder_retired_drop(unwinder_process_t *p, uint64_t seq)
{
    size_t out = 0;
    for (size_t i = 0; i < p->maps.n; i++) {
        if (p->pm[i].retired && p->pm[i].retired <= seq) {
            unwinder__elf_put(p->pm[i].elf);
            continue;
        }
        p->maps.v[out] = p->maps.v[i];
        p->pm[out] = p->pm[i];
        out++;
    }
    if (out == p->maps.n)
        return;
    p->maps.n = out;
    /* Frames resolved in them are cached under the current generation. */
    maps_changed_caches(p);
}

size_t unwinder_process_warm(unwinder_process_t *p, uint64_t min_code_bytes, uint64_t budget_ns)
{
    uint64_t end = hp_clock_ns(CLOCK_MONOTONIC) + budget_ns;
    size_t n = 0;
    for (size_t i = 0; i < p->maps.n; i++) {
        const struct unwinder__map *m = &p->maps.v[i];
        if (!(m->perms & UNWINDER_PERM_EXEC) || unwinder__is_jit_map(m) ||
            m->end - m->start < min_code_bytes)
            continue;
        if (hp_clock_ns(CLOCK_MONOTONIC) >= end)
            break;
        n += unwinder__pmap_elf(p, i) != NULL;
    }
    return n;
}

unwinder_process_t *unwinder_process_free(unwinder_process_t *p)
{
    if (!p)
        return NULL;
    utable_unmap(&p->table);
    free(p->known);
    if (p->as)
        unw_destroy_addr_space(p->as);
    unwinder__fallback_done(p);
    pmaps_free(p->pm, p->maps.n);
    unwinder__maps_done(&p->maps);
    free(p->pcs);
    p->perfmap = unwinder__perfmap_free(p->perfmap);
    unwinder__py_free(p->py);
    if (p->maps_fd >= 0)
        (void)close(p->maps_fd);
    if (p->mem_fd >= 0)
        (void)close(p->mem_fd);
    free(p);
    return NULL;
}
