/* report/compare.c: profiles against each other: `heapprof report --diff BASE` (each
 * site's change between two traces of the same program) and `heapprof report --growth`
 * (unreleased bytes over the dumps of one process, and the sites ranked by how steadily
 * they grow, with the slope's significance under the sampling model). The printing of
 * sites and processes is report/report.c's. */
#include "report/report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/format.h"
#include "report/report_internal.h"

/* ---- diff ---- */

static uint64_t site_hash(const struct rp_trace_callsite *c, uint64_t seed)
{
    uint64_t h = hp_hash_combine(seed, c->n_frames);
    for (size_t i = 0; i < c->n_frames; i++) {
        const struct rp_trace_frame *f = &c->frames[i];
        const char *n = f->function_name ? f->function_name : "";
        const char *m = f->mapping_path ? f->mapping_path : "";
        h = hp_hash_combine(h, hp_hash_bytes(n, strlen(n), seed + 1));
        h = hp_hash_combine(h, hp_hash_bytes(m, strlen(m), seed + 2));
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
    if (a->frames == b->frames)
        return true;
    for (size_t i = 0; i < a->n_frames; i++) {
        const struct rp_trace_frame *x = &a->frames[i], *y = &b->frames[i];
        if (x->rel_pc != y->rel_pc || !same_str(x->function_name, y->function_name) ||
            !same_str(x->mapping_path, y->mapping_path))
            return false;
    }
    return true;
}

struct diff_index {
    struct hp_idtab tab;
    struct rp_diff_site *items;
    size_t n;
};

static bool diff_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct diff_index *di = ctx;
    return same_site(di->items[id].c, key);
}

/* Adds @c to side @side of its group: a hash lookup with a seeded hash and an equality
 * test, so hostile sites cost no more than others. */
static int diff_add(struct diff_index *di, uint64_t seed, const struct rp_trace_callsite *c,
                    int side)
{
    uint64_t h = site_hash(c, seed);
    int64_t id = hp_idtab_find(&di->tab, h, diff_eq, di, c);
    if (id < 0) {
        id = (int64_t)di->n;
        if (hp_idtab_add(&di->tab, h, (uint32_t)id) < 0)
            return -ENOMEM;
        di->items[di->n++] = (struct rp_diff_site){.c = c};
    }
    struct rp_diff_site *d = &di->items[id];
    double scale = rp_callsite_count_scale(c);
    d->unreleased[side] += rp__unreleased(c);
    d->allocated[side] += c->self_allocated;
    d->alloc_count[side] += rp__est_count(c->alloc_count, scale);
    return 0;
}

static int cmp_diff(const void *a, const void *b)
{
    const struct rp_diff_site *x = a, *y = b;
    if (x->d_unreleased != y->d_unreleased)
        return x->d_unreleased < y->d_unreleased ? 1 : -1;
    if (x->d_allocated != y->d_allocated)
        return x->d_allocated < y->d_allocated ? 1 : -1;
    return 0;
}

const struct rp_trace_process *rp_diff_base_process(const struct rp_trace *base,
                                                    const struct rp_trace_process *p, size_t idx)
{
    for (size_t i = 0; i < base->n_processes; i++)
        if (base->processes[i].pid == p->pid && base->processes[i].exec_index == p->exec_index &&
            same_str(base->processes[i].heap_name, p->heap_name))
            return &base->processes[i];
    /* Two runs of a program have different pids: the same command line, else in order. */
    for (size_t i = 0; i < base->n_processes; i++)
        if (same_str(base->processes[i].cmdline, p->cmdline) &&
            same_str(base->processes[i].heap_name, p->heap_name))
            return &base->processes[i];
    return idx < base->n_processes ? &base->processes[idx] : NULL;
}

static int64_t sdiff(uint64_t a, uint64_t b)
{
    return (int64_t)(a - b);
}

/* "+1.2 MiB (+1258291 bytes)", "-300.0 KiB (-307200 bytes)", "0 B (0 bytes)": a change
 * written as the report writes amounts, with its sign. */
static const char *fmt_change(int64_t d, char *buf, size_t len)
{
    char b[32];
    uint64_t mag = d < 0 ? -(uint64_t)d : (uint64_t)d;
    snprintf(buf, len, "%s%s (%+" PRId64 " bytes)",
             d > 0   ? "+"
             : d < 0 ? "-"
                     : "",
             hp_format_bytes(mag, b, sizeof(b)), d);
    return buf;
}

int rp_diff_sites(const struct rp_trace_process *bp, const struct rp_trace_process *p,
                  struct rp_diff_site **ret, size_t *ret_n)
{
    size_t nb = bp ? bp->n_callsites : 0;
    uint64_t seed = hp_hash_u64((uintptr_t)p ^ (uintptr_t)&seed);
    struct diff_index di = {.items = calloc(p->n_callsites + nb + 1, sizeof(*di.items))};
    hp_idtab_init(&di.tab);
    if (!di.items)
        goto oom;
    for (size_t i = 0; i < nb; i++)
        if (diff_add(&di, seed, &bp->callsites[i], 0) < 0)
            goto oom;
    for (size_t i = 0; i < p->n_callsites; i++)
        if (diff_add(&di, seed, &p->callsites[i], 1) < 0)
            goto oom;
    for (size_t i = 0; i < di.n; i++) {
        struct rp_diff_site *d = &di.items[i];
        d->d_unreleased = sdiff(d->unreleased[1], d->unreleased[0]);
        d->d_allocated = sdiff(d->allocated[1], d->allocated[0]);
        d->d_alloc_count = sdiff(d->alloc_count[1], d->alloc_count[0]);
    }
    if (di.n)
        qsort(di.items, di.n, sizeof(*di.items), cmp_diff);
    hp_idtab_done(&di.tab);
    *ret = di.items;
    *ret_n = di.n;
    return 0;
oom:
    hp_idtab_done(&di.tab);
    free(di.items);
    return -ENOMEM;
}

static void diff_process(FILE *out, const struct rp_trace_process *bp,
                         const struct rp_trace_process *p, const struct rp_report_options *opt)
{
    struct rp_diff_site *items;
    size_t n;
    if (rp_diff_sites(bp, p, &items, &n) < 0) {
        fprintf(out, "  (out of memory)\n");
        return;
    }
    int64_t tot_unrel = 0, tot_alloc = 0;
    for (size_t i = 0; i < n; i++) {
        tot_unrel += items[i].d_unreleased;
        tot_alloc += items[i].d_allocated;
    }
    fprintf(out, "\nProcess %d (%s) heap %s: growth since the base%s\n", (int)p->pid,
            p->cmdline && p->cmdline[0] ? p->cmdline : "?", p->heap_name,
            bp ? "" : " (no matching process in the base: all of it)");
    char c1[64], c2[64];
    fprintf(out, "  unreleased %s, allocated %s\n", fmt_change(tot_unrel, c1, sizeof(c1)),
            fmt_change(tot_alloc, c2, sizeof(c2)));
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    fprintf(out, "\n  Top %zu sites by unreleased growth:\n", top);
    size_t shown = 0;
    for (size_t i = 0; i < n && shown < top; i++) {
        const struct rp_diff_site *d = &items[i];
        if (d->d_unreleased <= 0 && d->d_allocated <= 0)
            continue;
        shown++;
        fprintf(out, "  #%zu  unreleased %s, allocated %s in %+" PRId64 " allocations\n", shown,
                fmt_change(d->d_unreleased, c1, sizeof(c1)),
                fmt_change(d->d_allocated, c2, sizeof(c2)), d->d_alloc_count);
        rp__print_stack(out, d->c, opt);
    }
    if (!shown)
        fprintf(out, "    (none grew)\n");
    free(items);
}

void rp_report_print_diff(FILE *out, const struct rp_trace *base, const struct rp_trace *t,
                          const struct rp_report_options *opt)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        diff_process(out, rp_diff_base_process(base, p, i), p, opt);
    }
}

/* ---- growth over the dumps of a process ---- */

struct growth_index {
    struct hp_idtab tab;
    struct rp_growth_site *sites;
    size_t n;
};

static bool growth_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct growth_index *gi = ctx;
    const struct rp_trace_callsite *a = gi->sites[id].c, *b = key;
    /* Within a sequence generation equal callstacks share their frames. */
    return a->frames == b->frames && (a->frames || a->callstack_id == b->callstack_id);
}

static int cmp_growth(const void *a, const void *b)
{
    const struct rp_growth_site *x = a, *y = b;
    if (x->z != y->z)
        return x->z < y->z ? 1 : -1;
    return x->slope < y->slope ? 1 : x->slope > y->slope ? -1 : 0;
}

/* Least-squares slope of @y over @x (n points), its standard error from the residuals
 * with a floor of @var_floor per point (the sampling variance). */
static void fit(const double *x, const double *y, size_t n, double var_floor, double *ret_slope,
                double *ret_se)
{
    double mx = 0, my = 0;
    for (size_t i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= (double)n;
    my /= (double)n;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
    }
    double b = sxx > 0 ? sxy / sxx : 0, rss = 0;
    for (size_t i = 0; i < n; i++) {
        double e = y[i] - my - b * (x[i] - mx);
        rss += e * e;
    }
    double var = n > 2 ? rss / (double)(n - 2) : 0;
    if (var < var_floor)
        var = var_floor;
    *ret_slope = b;
    *ret_se = sxx > 0 ? sqrt(var / sxx) : INFINITY;
}

static void growth_chart(FILE *out, const struct rp_growth *g)
{
    const double *x = g->x, *tot = g->total;
    bool timed = g->timed;
    const size_t max_rows = 30, width = 40;
    double mx = 1;
    for (size_t i = 0; i < g->n_dumps; i++)
        mx = tot[i] > mx ? tot[i] : mx;
    fprintf(out, "  Unreleased bytes per dump:\n");
    size_t n = g->n_dumps, step = n > max_rows ? (n + max_rows - 1) / max_rows : 1;
    for (size_t i = 0; i < n; i += step) {
        if (i + step >= n && i != n - 1)
            i = n - 1; /* always the last one */
        char b[32], bar[64];
        size_t w = (size_t)(tot[i] / mx * (double)width + 0.5);
        memset(bar, '#', w);
        bar[w] = '\0';
        if (timed)
            fprintf(out, "    #%-4zu %8.1f s %10s |%s\n", i + 1, x[i],
                    hp_format_bytes((uint64_t)tot[i], b, sizeof(b)), bar);
        else
            fprintf(out, "    #%-4zu %10s |%s\n", i + 1,
                    hp_format_bytes((uint64_t)tot[i], b, sizeof(b)), bar);
    }
}

/* Adds the unreleased bytes of dump @i of @p to the sites of @gi and to @tot[i]. */
static int growth_collect(struct growth_index *gi, size_t *cap, const struct rp_trace_process *p,
                          size_t i, double *tot)
{
    uint64_t seed = hp_hash_u64((uintptr_t)p);
    const struct rp_trace_dump *d = &p->dumps[i];
    for (size_t k = 0; k < d->n_callsites; k++) {
        const struct rp_trace_callsite *c = &d->callsites[k];
        uint64_t h = hp_hash_combine(seed, (uintptr_t)c->frames ^ c->callstack_id);
        int64_t id = hp_idtab_find(&gi->tab, h, growth_eq, gi, c);
        if (id < 0) {
            if (hp_grow((void **)&gi->sites, cap, gi->n + 1, sizeof(*gi->sites)) < 0)
                return -ENOMEM;
            double *y = calloc(p->n_dumps, sizeof(*y));
            if (!y || hp_idtab_add(&gi->tab, h, (uint32_t)gi->n) < 0) {
                free(y);
                return -ENOMEM;
            }
            id = (int64_t)gi->n;
            gi->sites[gi->n++] = (struct rp_growth_site){.y = y};
        }
        struct rp_growth_site *g = &gi->sites[id];
        g->c = c;
        g->y[i] += (double)rp__unreleased(c);
        tot[i] += (double)rp__unreleased(c);
    }
    return 0;
}

int rp_growth_compute(const struct rp_trace_process *p, struct rp_growth *ret)
{
    size_t n = p->n_dumps;
    if (n == 0 || !p->dumps)
        return -ENODATA;
    struct rp_growth g = {.n_dumps = n};
    struct growth_index gi = {0};
    hp_idtab_init(&gi.tab);
    size_t cap = 0;
    g.x = calloc(n, sizeof(*g.x));
    g.total = calloc(n, sizeof(*g.total));
    if (!g.x || !g.total)
        goto oom;
    /* Seconds since the first dump; dump numbers when the trace has no times. */
    g.timed = p->dumps[n - 1].timestamp > p->dumps[0].timestamp;
    for (size_t i = 0; i < n; i++)
        g.x[i] =
            g.timed ? (double)(p->dumps[i].timestamp - p->dumps[0].timestamp) / 1e9 : (double)i;
    for (size_t i = 0; i < n; i++)
        if (growth_collect(&gi, &cap, p, i, g.total) < 0)
            goto oom;
    uint64_t interval = p->sampling_interval_bytes;
    for (size_t k = 0; k < gi.n; k++) {
        struct rp_growth_site *s = &gi.sites[k];
        double mean = 0;
        for (size_t i = 0; i < n; i++)
            mean += s->y[i];
        mean /= (double)n;
        double se;
        /* Each point's sampling variance is at most interval * bytes (rp__sd_bytes()). */
        fit(g.x, s->y, n, interval > 1 ? (double)interval * mean : 0, &s->slope, &se);
        s->z = se > 0 ? s->slope / se : (s->slope > 0 ? INFINITY : 0);
        s->last = s->y[n - 1];
    }
    if (gi.n)
        qsort(gi.sites, gi.n, sizeof(*gi.sites), cmp_growth);
    hp_idtab_done(&gi.tab);
    g.sites = gi.sites;
    g.n_sites = gi.n;
    *ret = g;
    return 0;
oom:
    hp_idtab_done(&gi.tab);
    g.sites = gi.sites;
    g.n_sites = gi.n;
    rp_growth_done(&g);
    return -ENOMEM;
}

void rp_growth_done(struct rp_growth *g)
{
    for (size_t k = 0; k < g->n_sites; k++)
        free(g->sites[k].y);
    free(g->sites);
    free(g->x);
    free(g->total);
    *g = (struct rp_growth){0};
}

static void growth_process(FILE *out, const struct rp_trace_process *p,
                           const struct rp_report_options *opt)
{
    size_t n = p->n_dumps;
    rp__print_process_header(out, p);
    if (n < 3 || !p->dumps) {
        fprintf(out,
                "  %zu dump%s: growth needs at least 3 (record with --continuous-dump MS, or "
                "ask for dumps with 'heapprof dump')\n\n",
                n, n == 1 ? "" : "s");
        return;
    }
    struct rp_growth g;
    if (rp_growth_compute(p, &g) < 0) {
        fprintf(out, "  (out of memory)\n\n");
        return;
    }
    char b[32];
    double span = g.x[n - 1] - g.x[0];
    fprintf(out, "  heap %s, %zu dumps over %.1f %s, sampling interval %" PRIu64 " bytes\n",
            p->heap_name[0] ? p->heap_name : "(unnamed)", n, span, g.timed ? "s" : "dumps",
            p->sampling_interval_bytes);
    growth_chart(out, &g);
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10, shown = 0;
    fprintf(out, "\n  Sites by steady growth of unreleased bytes (least-squares slope; z = slope / "
                 "its standard error, with the sampling noise as a floor: z >= 3 is growth beyond "
                 "noise):\n");
    for (size_t k = 0; k < g.n_sites && shown < top; k++) {
        const struct rp_growth_site *s = &g.sites[k];
        if (!(s->slope > 0))
            continue;
        shown++;
        char rate[32];
        hp_format_bytes((uint64_t)(s->slope + 0.5), rate, sizeof(rate));
        fprintf(out, "  #%zu  +%s/%s, z %.1f%s; %s unreleased at the last dump\n", shown, rate,
                g.timed ? "s" : "dump", isinf(s->z) ? 999.9 : s->z, s->z >= 3 ? "" : " (noise?)",
                hp_format_bytes((uint64_t)s->last, b, sizeof(b)));
        rp__print_stack(out, s->c, opt);
    }
    if (!shown)
        fprintf(out, "    (no site grew)\n");
    fprintf(out, "\n");
    rp_growth_done(&g);
}

void rp_report_print_growth(FILE *out, const struct rp_trace *t,
                            const struct rp_report_options *opt)
{
    if (t->n_processes == 0)
        fprintf(out, "No heap profiles in this trace (%" PRIu64 " packets).\n", t->n_packets);
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].n_dumps)
            growth_process(out, &t->processes[i], opt);
}
