/* report/report.c: the text report of a loaded trace (`heapprof report`). */
#include "report/report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/format.h"

/* libstdc++'s demangler (the Itanium C++ ABI entry point); declared here so that the C
 * code needs no C++ header. Returns a malloc()ed string or NULL, status 0 on success. */
char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

const char *rp_demangle(const char *name, char *buf, size_t buf_len)
{
    if (!name || strncmp(name, "_Z", 2) != 0 || buf_len == 0)
        return name;
    int status = -1;
    char *d = __cxa_demangle(name, NULL, NULL, &status);
    if (!d || status != 0) {
        free(d);
        return name;
    }
    size_t n = strlen(d);
    if (n >= buf_len)
        n = buf_len - 1;
    memcpy(buf, d, n);
    buf[n] = '\0';
    free(d);
    return buf;
}

static uint64_t unreleased(const struct rp_trace_callsite *c)
{
    return c->self_allocated > c->self_freed ? c->self_allocated - c->self_freed : 0;
}

static uint64_t unreleased_count(const struct rp_trace_callsite *c)
{
    return c->alloc_count > c->free_count ? c->alloc_count - c->free_count : 0;
}

enum order { BY_UNRELEASED, BY_ALLOCATED, BY_PEAK };

static uint64_t key_of(const struct rp_trace_callsite *c, enum order o)
{
    switch (o) {
    case BY_UNRELEASED:
        return unreleased(c);
    case BY_ALLOCATED:
        return c->self_allocated;
    case BY_PEAK:
        return c->self_max;
    }
    return 0;
}

struct sort_item {
    uint64_t key;
    const struct rp_trace_callsite *c;
};

static int cmp_items(const void *a, const void *b)
{
    const struct sort_item *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? 1 : -1; /* descending */
    if (x->c->callstack_id != y->c->callstack_id)
        return x->c->callstack_id < y->c->callstack_id ? -1 : 1;
    return 0;
}

static const char *frame_name(const struct rp_trace_frame *f, bool demangle, char *buf, size_t len)
{
    if (!f->function_name || !f->function_name[0])
        return "<unknown>";
    return demangle ? rp_demangle(f->function_name, buf, len) : f->function_name;
}

static void print_site(FILE *out, size_t rank, const struct rp_trace_callsite *c, enum order o,
                       const struct rp_report_options *opt)
{
    char b1[32], b2[32], name[1024];
    switch (o) {
    case BY_UNRELEASED:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) unreleased in %" PRIu64 " allocations", rank,
                hp_format_bytes(unreleased(c), b1, sizeof(b1)), unreleased(c), unreleased_count(c));
        fprintf(out, "; allocated %s (%" PRIu64 " bytes) in %" PRIu64 " allocations\n",
                hp_format_bytes(c->self_allocated, b2, sizeof(b2)), c->self_allocated,
                c->alloc_count);
        break;
    case BY_ALLOCATED:
        fprintf(out,
                "  #%zu  %s (%" PRIu64 " bytes) allocated in %" PRIu64 " allocations, %" PRIu64
                " freed",
                rank, hp_format_bytes(c->self_allocated, b1, sizeof(b1)), c->self_allocated,
                c->alloc_count, c->free_count);
        fprintf(out, "; unreleased %s (%" PRIu64 " bytes)\n",
                hp_format_bytes(unreleased(c), b2, sizeof(b2)), unreleased(c));
        break;
    case BY_PEAK:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) in %" PRIu64 " allocations at the peak\n",
                rank, hp_format_bytes(c->self_max, b1, sizeof(b1)), c->self_max, c->self_max_count);
        break;
    }
    if (c->n_frames == 0) {
        fprintf(out, "        (no frames)\n");
        return;
    }
    if (opt->no_stacks) {
        const struct rp_trace_frame *leaf = &c->frames[c->n_frames - 1];
        fprintf(out, "        %s\n", frame_name(leaf, opt->demangle, name, sizeof(name)));
        return;
    }
    for (size_t i = c->n_frames; i-- > 0;) { /* leaf first */
        const struct rp_trace_frame *f = &c->frames[i];
        const char *path = f->mapping_path && f->mapping_path[0] ? f->mapping_path : "?";
        fprintf(out, "        %s  %s+%#" PRIx64 "\n",
                frame_name(f, opt->demangle, name, sizeof(name)), path, f->rel_pc);
    }
}

static void print_table(FILE *out, const struct rp_trace_process *p, enum order o,
                        const struct rp_report_options *opt, size_t top_n, struct sort_item *items)
{
    static const char *const titles[] = {
        [BY_UNRELEASED] = "unreleased bytes",
        [BY_ALLOCATED] = "allocated bytes",
        [BY_PEAK] = "bytes at the heap peak",
    };
    size_t n = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        uint64_t k = key_of(&p->callsites[i], o);
        if (k)
            items[n++] = (struct sort_item){.key = k, .c = &p->callsites[i]};
    }
    if (n)
        qsort(items, n, sizeof(*items), cmp_items);
    fprintf(out, "\n  Top %zu sites by %s:\n", top_n, titles[o]);
    if (n == 0)
        fprintf(out, "    (none)\n");
    for (size_t i = 0; i < n && i < top_n; i++)
        print_site(out, i + 1, items[i].c, o, opt);
}

static void print_process(FILE *out, const struct rp_trace_process *p,
                          const struct rp_report_options *opt)
{
    size_t top_n = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    char b[32];
    fprintf(out, "Process %" PRId32 ": %s\n", p->pid, p->cmdline[0] ? p->cmdline : "(unknown)");
    fprintf(out, "  heap %s, sampling interval %" PRIu64 " bytes, %" PRIu32 " dump%s, %s",
            p->heap_name[0] ? p->heap_name : "(unnamed)", p->sampling_interval_bytes, p->n_dumps,
            p->n_dumps == 1 ? "" : "s",
            p->from_startup ? "profiled from startup" : "attached while running");
    if (p->disconnected)
        fprintf(out, ", disconnected");
    if (p->buffer_overran)
        fprintf(out, ", BUFFER OVERRAN (samples were dropped)");
    if (p->buffer_corrupted)
        fprintf(out, ", BUFFER CORRUPTED");
    if (p->hit_guardrail)
        fprintf(out, ", HIT GUARDRAIL");
    if (p->client_error)
        fprintf(out, ", CLIENT ERROR");
    if (p->connection_closed_by_program)
        fprintf(out, ", CONNECTION CLOSED BY THE PROGRAM (not profiled after that)");
    if (p->writer_stalled)
        fprintf(out,
                ", writer stalled (%" PRIu64 " waits for a stopped thread, %" PRIu64
                " records of exited threads skipped)",
                p->writer_stalls, p->stalled_records_skipped);
    fprintf(out, "\n");
    if (p->n_dumps == 0) {
        fprintf(out, "  no complete dump\n\n");
        return;
    }

    uint64_t alloc = 0, freed = 0, nalloc = 0, nfree = 0;
    bool has_peak = false;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        alloc += c->self_allocated;
        freed += c->self_freed;
        nalloc += c->alloc_count;
        nfree += c->free_count;
        has_peak |= c->self_max != 0;
    }
    fprintf(out, "  Totals: allocated %s (%" PRIu64 " bytes, %" PRIu64 " allocations)",
            hp_format_bytes(alloc, b, sizeof(b)), alloc, nalloc);
    fprintf(out, ", freed %s (%" PRIu64 " bytes, %" PRIu64 " frees)",
            hp_format_bytes(freed, b, sizeof(b)), freed, nfree);
    fprintf(out, ", unreleased %s (%" PRIu64 " bytes)\n",
            hp_format_bytes(alloc > freed ? alloc - freed : 0, b, sizeof(b)),
            alloc > freed ? alloc - freed : 0);

    struct sort_item *items = p->n_callsites ? calloc(p->n_callsites, sizeof(*items)) : NULL;
    if (p->n_callsites && !items) {
        fprintf(out, "  (out of memory)\n\n");
        return;
    }
    print_table(out, p, BY_UNRELEASED, opt, top_n, items);
    if (!opt->unreleased_only)
        print_table(out, p, BY_ALLOCATED, opt, top_n, items);
    if (has_peak && !opt->unreleased_only)
        print_table(out, p, BY_PEAK, opt, top_n, items);
    free(items);

    fprintf(out,
            "\n  Stats: %" PRIu64 " samples, %" PRIu64 " unwinding errors, %" PRIu64
            " map reparses, %" PRIu64 " us unwinding, %" PRIu64
            " us client blocked on the ring\n\n",
            p->heap_samples, p->unwinding_errors, p->map_reparses, p->total_unwinding_time_us,
            p->client_spinlock_blocked_us);
}

void rp_report_print(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    static const struct rp_report_options defaults = {.demangle = true};
    if (!opt)
        opt = &defaults;
    if (t->n_processes == 0)
        fprintf(out, "No heap profiles in this trace (%" PRIu64 " packets).\n", t->n_packets);
    for (size_t i = 0; i < t->n_processes; i++)
        print_process(out, &t->processes[i], opt);
}

/* ---- diff ---- */

static uint64_t site_hash(const struct rp_trace_callsite *c)
{
    uint64_t h = hp_hash_u64(c->n_frames);
    for (size_t i = 0; i < c->n_frames; i++) {
        const struct rp_trace_frame *f = &c->frames[i];
        const char *n = f->function_name ? f->function_name : "";
        const char *m = f->mapping_path ? f->mapping_path : "";
        h = hp_hash_combine(h, hp_hash_bytes(n, strlen(n), 1));
        h = hp_hash_combine(h, hp_hash_bytes(m, strlen(m), 2));
        h = hp_hash_combine(h, f->rel_pc);
    }
    return h;
}

static bool same_str(const char *a, const char *b)
{
    return !strcmp(a ? a : "", b ? b : "");
}

static bool same_site(const struct rp_trace_callsite *a, const struct rp_trace_callsite *b)
{
    if (a->n_frames != b->n_frames)
        return false;
    for (size_t i = 0; i < a->n_frames; i++) {
        const struct rp_trace_frame *x = &a->frames[i], *y = &b->frames[i];
        if (x->rel_pc != y->rel_pc || !same_str(x->function_name, y->function_name) ||
            !same_str(x->mapping_path, y->mapping_path))
            return false;
    }
    return true;
}

struct diff_item {
    int64_t d_unreleased, d_allocated, d_alloc_count;
    const struct rp_trace_callsite *c;
};

static int cmp_diff(const void *a, const void *b)
{
    const struct diff_item *x = a, *y = b;
    if (x->d_unreleased != y->d_unreleased)
        return x->d_unreleased < y->d_unreleased ? 1 : -1;
    if (x->d_allocated != y->d_allocated)
        return x->d_allocated < y->d_allocated ? 1 : -1;
    return 0;
}

static const struct rp_trace_process *match_process(const struct rp_trace *base,
                                                    const struct rp_trace_process *p, size_t idx)
{
    for (size_t i = 0; i < base->n_processes; i++)
        if (base->processes[i].pid == p->pid &&
            same_str(base->processes[i].heap_name, p->heap_name))
            return &base->processes[i];
    /* Two runs of a program have different pids: pair processes in order. */
    return idx < base->n_processes ? &base->processes[idx] : NULL;
}

static int64_t sdiff(uint64_t a, uint64_t b)
{
    return (int64_t)(a - b);
}

static void diff_process(FILE *out, const struct rp_trace_process *bp,
                         const struct rp_trace_process *p, const struct rp_report_options *opt)
{
    struct hp_map index; /* site hash (probed) -> base callsite index */
    hp_map_init(&index, sizeof(uint64_t));
    size_t nb = bp ? bp->n_callsites : 0;
    bool *matched = calloc(nb + 1, sizeof(*matched));
    struct diff_item *items = calloc(p->n_callsites + nb + 1, sizeof(*items));
    if (!matched || !items) {
        fprintf(out, "  (out of memory)\n");
        goto out;
    }
    for (size_t i = 0; i < nb; i++) {
        uint64_t *v;
        for (uint64_t h = site_hash(&bp->callsites[i]);; h++) {
            int r = hp_map_put(&index, h, (void **)&v);
            if (r < 0)
                goto out;
            if (r == 1) {
                *v = i;
                break;
            }
        }
    }
    size_t n = 0;
    int64_t tot_unrel = 0, tot_alloc = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        const struct rp_trace_callsite *b = NULL;
        for (uint64_t h = site_hash(c);; h++) {
            uint64_t *v = hp_map_get(&index, h);
            if (!v)
                break;
            if (!matched[*v] && same_site(&bp->callsites[*v], c)) {
                b = &bp->callsites[*v];
                matched[*v] = true;
                break;
            }
        }
        struct diff_item d = {.c = c};
        d.d_unreleased = sdiff(unreleased(c), b ? unreleased(b) : 0);
        d.d_allocated = sdiff(c->self_allocated, b ? b->self_allocated : 0);
        d.d_alloc_count = sdiff(c->alloc_count, b ? b->alloc_count : 0);
        items[n++] = d;
    }
    for (size_t i = 0; i < nb; i++) {
        if (matched[i])
            continue;
        const struct rp_trace_callsite *b = &bp->callsites[i];
        items[n++] = (struct diff_item){.d_unreleased = -(int64_t)unreleased(b),
                                        .d_allocated = -(int64_t)b->self_allocated,
                                        .d_alloc_count = -(int64_t)b->alloc_count,
                                        .c = b};
    }
    for (size_t i = 0; i < n; i++) {
        tot_unrel += items[i].d_unreleased;
        tot_alloc += items[i].d_allocated;
    }
    if (n)
        qsort(items, n, sizeof(*items), cmp_diff);
    fprintf(out, "\nProcess %d (%s) heap %s: growth since the base%s\n", (int)p->pid,
            p->cmdline && p->cmdline[0] ? p->cmdline : "?", p->heap_name,
            bp ? "" : " (no matching process in the base: all of it)");
    fprintf(out, "  unreleased %+" PRId64 " bytes, allocated %+" PRId64 " bytes\n", tot_unrel,
            tot_alloc);
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    fprintf(out, "\n  Top %zu sites by unreleased growth:\n", top);
    size_t shown = 0;
    char name[1024];
    for (size_t i = 0; i < n && shown < top; i++) {
        const struct diff_item *d = &items[i];
        if (d->d_unreleased <= 0 && d->d_allocated <= 0)
            continue;
        shown++;
        fprintf(out,
                "  #%zu  unreleased %+" PRId64 " bytes, allocated %+" PRId64 " bytes in %+" PRId64
                " allocations\n",
                shown, d->d_unreleased, d->d_allocated, d->d_alloc_count);
        for (size_t j = d->c->n_frames; j-- > 0;) {
            const struct rp_trace_frame *f = &d->c->frames[j];
            fprintf(out, "        %s  %s+%#" PRIx64 "\n",
                    frame_name(f, opt->demangle, name, sizeof(name)),
                    f->mapping_path && f->mapping_path[0] ? f->mapping_path : "?", f->rel_pc);
            if (opt->no_stacks)
                break;
        }
    }
    if (!shown)
        fprintf(out, "    (none grew)\n");
out:
    hp_map_done(&index);
    free(matched);
    free(items);
}

void rp_report_print_diff(FILE *out, const struct rp_trace *base, const struct rp_trace *t,
                          const struct rp_report_options *opt)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->n_dumps)
            continue;
        diff_process(out, match_process(base, p, i), p, opt);
    }
}
