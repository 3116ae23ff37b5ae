/* report/overview.c: what `heapprof report` prints before the per-site detail: a header
 * (peak, unreleased at the end, allocated, samples, drops), the table of processes and
 * the functions holding the most memory, flat and cumulative (as `go tool pprof -top`
 * ranks them). */
#include "report/report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/format.h"
#include "report/report_internal.h"

/* ---- the header ---- */

/* The peak of the sum over processes of unreleased bytes, over the dumps (each process
 * counts with its latest dump at or before a time, while it has dumps after it). */
struct peak {
    uint64_t bytes, ts;
    bool found;
};

static struct peak peak_over_dumps(const struct rp_trace *t)
{
    struct peak pk = {0};
    size_t n = t->n_processes;
    size_t *at = calloc(n ? n : 1, sizeof(*at));
    if (!at)
        return pk;
    for (;;) {
        /* The next time any process dumped. */
        uint64_t next = UINT64_MAX;
        for (size_t i = 0; i < n; i++) {
            const struct rp_trace_process *p = &t->processes[i];
            if (p->dump_totals && at[i] < p->n_dumps)
                next = HP_MIN(next, p->dump_totals[at[i]].timestamp);
        }
        if (next == UINT64_MAX)
            break;
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            const struct rp_trace_process *p = &t->processes[i];
            if (!p->dump_totals || !p->n_dumps)
                continue;
            /* Past every dump up to now, counted or not: the process whose dump is next
             * moves on, so the loop ends even when a trace's dump times go backwards. */
            while (at[i] < p->n_dumps && p->dump_totals[at[i]].timestamp <= next)
                at[i]++;
            if (p->dump_totals[p->n_dumps - 1].timestamp < next)
                continue; /* none after: not counted */
            if (at[i])
                sum += p->dump_totals[at[i] - 1].unreleased_bytes;
        }
        if (!pk.found || sum > pk.bytes)
            pk = (struct peak){.bytes = sum, .ts = next, .found = true};
    }
    free(at);
    return pk;
}

/* When the trace starts: the earliest profile start or dump. */
static uint64_t trace_start(const struct rp_trace *t)
{
    uint64_t start = UINT64_MAX;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (p->profile_start_ts)
            start = HP_MIN(start, p->profile_start_ts);
        if (p->dump_totals && p->n_dumps)
            start = HP_MIN(start, p->dump_totals[0].timestamp);
    }
    return start;
}

static uint64_t lost_records(const struct rp_trace_process *p)
{
    const struct rp_trace_losses *l = &p->losses;
    return l->records_dropped + l->reserve_failures + l->records_unread +
           l->records_lost_in_service + l->records_refused;
}

void rp__print_header(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    uint64_t alloc = 0, unrel = 0, samples = 0, drops = 0, self_peak = 0;
    uint32_t max_dumps = 0;
    size_t shown = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        max_dumps = HP_MAX(max_dumps, p->n_dumps);
        if (!p->selected)
            continue;
        /* The process's statistics, once (each of its heaps carries them). */
        if (rp__first_of_process(t, i)) {
            shown++;
            drops += lost_records(p);
        }
        for (size_t k = 0; k < p->n_callsites; k++) {
            const struct rp_trace_callsite *c = &p->callsites[k];
            alloc += c->self_allocated;
            unrel += rp__unreleased(c);
            samples += c->alloc_count;
            self_peak += c->self_max;
        }
    }
    char a[32], b[32], c[32];
    fprintf(out, "Total over %zu process%s: ", shown, shown == 1 ? "" : "es");
    struct peak pk = max_dumps > 1 ? peak_over_dumps(t) : (struct peak){0};
    uint64_t start = trace_start(t);
    if (pk.found && start != UINT64_MAX && pk.ts >= start)
        fprintf(out, "peak %s at a dump %.1f s after the start (heap between dumps unknown)",
                hp_format_bytes(pk.bytes, a, sizeof(a)), (double)(pk.ts - start) / 1e9);
    else if (pk.found)
        fprintf(out, "peak %s at a dump (heap between dumps unknown)",
                hp_format_bytes(pk.bytes, a, sizeof(a)));
    else if (self_peak)
        fprintf(out, "peak %s (each process's own peak, added)",
                hp_format_bytes(self_peak, a, sizeof(a)));
    else
        fprintf(out, "peak %s at the dump (heap between dumps unknown)",
                hp_format_bytes(unrel, a, sizeof(a)));
    if (opt->focused && pk.found)
        fprintf(out, " of the whole heap");
    fprintf(
        out, "; unreleased at the end %s, allocated %s, %" PRIu64 " samples, %" PRIu64 " drops\n",
        hp_format_bytes(unrel, b, sizeof(b)), hp_format_bytes(alloc, c, sizeof(c)), samples, drops);
}

/* ---- functions, flat and cumulative ---- */

struct fn_row {
    const char *name;   /* as stored; NULL for an unknown function of module @module */
    const char *module; /* for unknown functions */
    uint64_t flat[2];   /* unreleased, allocated */
    uint64_t cum[2];
    size_t last_stack; /* the stack that last added to cum, + 1: recursion counts once */
};

struct fn_table {
    struct hp_map index;   /* name address (interned) -> row */
    struct hp_map unknown; /* module path address -> row of its unknown functions */
    struct fn_row *rows;
    size_t n, cap;
};

static struct fn_row *fn_get(struct fn_table *ft, const char *name, const char *module)
{
    bool known = name && name[0];
    size_t *at;
    int r = hp_map_put(known ? &ft->index : &ft->unknown, (uintptr_t)(known ? name : module),
                       (void **)&at);
    if (r < 0)
        return NULL;
    if (r == 1) {
        if (hp_grow((void **)&ft->rows, &ft->cap, ft->n + 1, sizeof(*ft->rows)) < 0) {
            hp_map_remove_value(known ? &ft->index : &ft->unknown, at);
            return NULL;
        }
        *at = ft->n;
        ft->rows[ft->n++] = (struct fn_row){.name = known ? name : NULL, .module = module};
    }
    return &ft->rows[*at];
}

/* Adds @v to @row's cum once per stack @stack, and to its flat when @leaf. */
static void fn_add(struct fn_row *row, const uint64_t v[2], size_t stack, bool leaf)
{
    if (!row)
        return;
    if (leaf) {
        row->flat[0] += v[0];
        row->flat[1] += v[1];
    }
    if (row->last_stack != stack + 1) {
        row->last_stack = stack + 1;
        row->cum[0] += v[0];
        row->cum[1] += v[1];
    }
}

/* Every function of @c (each frame's inlined functions, then its own), leaf first. */
static void fn_add_callsite(struct fn_table *ft, const struct rp_trace_callsite *c, size_t stack)
{
    uint64_t v[2] = {rp__unreleased(c), c->self_allocated};
    bool leaf = true;
    for (size_t i = c->n_frames; i-- > 0;) {
        const struct rp_trace_frame *f = &c->frames[i];
        for (uint32_t k = 0; k < f->n_inlined; k++) {
            fn_add(fn_get(ft, f->inlined[k].function_name, f->mapping_path), v, stack, leaf);
            leaf = false;
        }
        fn_add(fn_get(ft, f->function_name, f->mapping_path), v, stack, leaf);
        leaf = false;
    }
}

static int cmp_fn(const void *a, const void *b, void *ctx)
{
    const struct fn_row *x = a, *y = b;
    int k = *(const int *)ctx;
    if (x->flat[k] != y->flat[k])
        return x->flat[k] < y->flat[k] ? 1 : -1;
    if (x->cum[k] != y->cum[k])
        return x->cum[k] < y->cum[k] ? 1 : -1;
    return 0;
}

static const char *fn_name(const struct fn_row *r, bool demangle, char *buf, size_t len)
{
    if (!r->name) {
        const char *m = r->module && r->module[0] ? r->module : "?";
        const char *slash = strrchr(m, '/');
        snprintf(buf, len, "<unknown> in %s", slash ? slash + 1 : m);
        return buf;
    }
    return demangle ? rp_demangle(r->name, buf, len) : r->name;
}

static double pct(uint64_t v, uint64_t total)
{
    return total ? 100.0 * (double)v / (double)total : 0.0;
}

static void print_fn_table(FILE *out, struct fn_table *ft, int kind, uint64_t total, size_t top,
                           const struct rp_report_options *opt)
{
    static const char *const what[] = {"unreleased bytes", "allocated bytes"};
    if (ft->n) /* rows is NULL when no function has bytes */
        qsort_r(ft->rows, ft->n, sizeof(*ft->rows), cmp_fn, &kind);
    fprintf(out, "\nTop %zu functions by %s (flat: allocated there; cum: there or below):\n", top,
            what[kind]);
    fprintf(out, "%10s %6s %6s %10s %6s  %s\n", "flat", "flat%", "sum%", "cum", "cum%", "function");
    uint64_t sum = 0;
    size_t shown = 0;
    for (size_t i = 0; i < ft->n && shown < top; i++) {
        const struct fn_row *r = &ft->rows[i];
        if (!r->flat[kind] && !r->cum[kind])
            continue;
        char f[32], c[32], name[1024];
        sum += r->flat[kind];
        shown++;
        fprintf(out, "%10s %5.1f%% %5.1f%% %10s %5.1f%%  %s\n",
                hp_format_bytes(r->flat[kind], f, sizeof(f)), pct(r->flat[kind], total),
                pct(sum, total), hp_format_bytes(r->cum[kind], c, sizeof(c)),
                pct(r->cum[kind], total), fn_name(r, opt->demangle, name, sizeof(name)));
    }
    if (!shown)
        fprintf(out, "    (none)\n");
}

void rp__print_functions(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    struct fn_table ft = {0};
    hp_map_init(&ft.index, sizeof(size_t));
    hp_map_init(&ft.unknown, sizeof(size_t));
    uint64_t total[2] = {0, 0};
    size_t stack = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        for (size_t k = 0; k < p->n_callsites; k++) {
            const struct rp_trace_callsite *c = &p->callsites[k];
            total[0] += rp__unreleased(c);
            total[1] += c->self_allocated;
            fn_add_callsite(&ft, c, stack++);
        }
    }
    print_fn_table(out, &ft, 0, total[0], top, opt);
    if (!opt->unreleased_only)
        print_fn_table(out, &ft, 1, total[1], top, opt);
    hp_map_done(&ft.index);
    hp_map_done(&ft.unknown);
    free(ft.rows);
}
