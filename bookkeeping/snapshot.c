/* bookkeeping/snapshot.c: one process's profile as a trace of its own, on demand (the
 * daemon's HTTP endpoint serves it as pprof), and the list of the processes profiled.
 *
 * A snapshot is a dump written to another descriptor by the same code as every dump
 * (bookkeeping/dump.c), with the output state of a new trace: nothing emitted yet, so
 * every interned string, mapping and frame goes out, and a callstack buffer of its own
 * holding only the process's callstacks (the session's buffer holds only those its trace
 * has not defined yet). The session's output state is saved before and put back after,
 * whole: a dump changes nothing in struct bk but its output state (emitted_*, counters,
 * next_packet_index, out_fd, out_broken, in.emit) and the encoding buffer, which is kept
 * (it may have grown). Of a heap it changes last_dump_ts only, which stays increasing.
 * Source lines (ModuleSymbols) are not written: the session's trace writes each frame's
 * once, and offering them here would take them from it.
 */
#include "bookkeeping/bookkeeping.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bookkeeping/state.h"

/* Encodes into @em every callstack a site of @p uses, each once. */
static int emit_process_callstacks(bk_t *bk, const struct bk_proc *p, struct bk_emit *em)
{
    uint8_t *seen = calloc(bk->in.n_nodes ? bk->in.n_nodes : 1, 1);
    if (!seen)
        return -ENOMEM;
    int r = 0;
    for (size_t k = 0; k < p->n_heaps && r == 0; k++) {
        const struct bk_heap *h = p->heaps[k];
        for (size_t i = 0; i < h->n_sites && r == 0; i++) {
            uint32_t cs = h->sites[i].callstack_id;
            if (cs >= bk->in.n_nodes || seen[cs])
                continue;
            seen[cs] = 1;
            r = bk__intern_emit_into(&bk->in, em, cs);
        }
    }
    free(seen);
    return r;
}

/* The packets of the snapshot, written with @bk's output pointed at @fd. */
static int write_snapshot(bk_t *bk, struct bk_proc *p)
{
    int r = bk__write_start(bk);
    if (r == 0)
        r = bk__write_process_tree(bk, p);
    for (size_t k = 0; k < p->n_heaps && r == 0; k++)
        r = bk__dump_heap(bk, p, p->heaps[k]);
    return r;
}

int bk_snapshot_process(bk_t *bk, int32_t pid, int fd)
{
    struct bk_proc *p = bk__find_proc(bk, pid);
    if (!p)
        return -ESRCH;
    bk__flush_pending(bk, p);
    struct bk_emit em = {0};
    int r = emit_process_callstacks(bk, p, &em);
    if (r < 0) {
        free(em.p);
        free(em.marks);
        return r;
    }

    /* A copy to put back: see the top of the file for why this is all of it. */
    struct bk *saved = malloc(sizeof(*saved));
    if (!saved) {
        free(em.p);
        free(em.marks);
        return -ENOMEM;
    }
    memcpy(saved, bk, sizeof(*saved));
    bk->out_fd = fd;
    bk->has_sink = false;
    bk->out_broken = false;
    bk->next_packet_index = 0;
    for (int k = 0; k < BK_STR_KINDS; k++)
        bk->emitted_str[k] = 0;
    bk->emitted_mappings = bk->emitted_frames = 0;
    bk->emitted_callstacks = bk->emitted_callstacks_off = 0;
    bk->in.emit = em;

    r = write_snapshot(bk, p);

    em = bk->in.emit;
    struct bk_buf buf = bk->buf;
    memcpy(bk, saved, sizeof(*bk));
    bk->buf = buf;
    free(saved);
    free(em.p);
    free(em.marks);
    return r;
}

size_t bk_n_processes(const bk_t *bk)
{
    return bk->n_procs;
}

void bk_process_summary(bk_t *bk, size_t i, struct bk_proc_summary *ret)
{
    struct bk_proc *p = bk->procs[i];
    bk__flush_ready(bk, p);
    memset(ret, 0, sizeof(*ret));
    ret->pid = p->pid;
    ret->cmdline = p->cmdline;
    ret->cmdline_len = p->cmdline_len;
    for (size_t k = 0; k < p->n_heaps; k++) {
        const struct bk_heap *h = p->heaps[k];
        for (size_t j = 0; j < h->n_sites; j++) {
            ret->samples += h->sites[j].alloc_count;
            ret->allocated_bytes += h->sites[j].allocated;
        }
        ret->live_bytes += h->live_total;
    }
}
