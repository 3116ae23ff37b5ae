/* unwinder/process.c: the state of one target process (struct unwinder_process): its
 * maps, the facts resolved per mapping (ELF cache entry, PT_LOAD shown, interned
 * hp_mapping), when the maps are reread, and unwinder_process_new()/free() and
 * unwinder_maps_changed().
 *
 * The maps are reread for a pc in no executable mapping (at most every 100 ms), before an
 * unwind when they are older than unwinder__maps_refresh_ns, and when the client says its
 * code changed. Identical maps keep every cache; changed ones drop what was derived from
 * the old ones: the per-mapping facts, the cached frames (a new generation), libunwind's
 * cache, the fallback's Dwfl, and the unwind table's rules when code went away.
 *
 * Not thread-safe: one unwinder thread uses a process at a time.
 */
#include "unwinder/unwinder_internal.h"

#include <elf.h>
#include <errno.h>
#include <libunwind.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/clock.h"
#include "shmem_ring/utable.h"

/* A pc outside every known executable mapping rereads the maps at most this often. */
#define REPARSE_MIN_INTERVAL_NS (100u * 1000 * 1000)

/* Maps older than this are reread before an unwind, so that a library unloaded and
 * another loaded at the same addresses (whose pcs are not unknown) is noticed. */
uint64_t unwinder__maps_refresh_ns = 1000ull * 1000 * 1000;

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

void unwinder__maps_refresh(struct unwinder_process *p)
{
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
    if (e) {
        t.build_id_len = e->build_id_len;
        memcpy(t.build_id, e->build_id, e->build_id_len);
    }
    pm->hm = unwinder__mapping_intern(&t);
    pm->hm_done = pm->hm != NULL; /* retried after an allocation failure */
    return pm->hm;
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
    uint32_t gen = p->known_gen;
    (void)maps_reload(p);
    /* A reread that finds code gone resets the table itself; else the client, which
     * waits for a new generation after an unload, is released here. */
    if (unloaded && p->known_gen == gen)
        unwinder_table_reset(p);
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
    if (p->maps_fd >= 0)
        (void)close(p->maps_fd);
    if (p->mem_fd >= 0)
        (void)close(p->mem_fd);
    free(p);
    return NULL;
}
