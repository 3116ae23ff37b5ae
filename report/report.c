/* report/report.c: the text report of a loaded trace (`heapprof report`). */
#include "report/report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
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

double rp_callsite_count_scale(const struct rp_trace_callsite *c)
{
    if (!c->est_alloc_count || !c->alloc_count || c->est_alloc_count <= c->alloc_count)
        return 1.0;
    return (double)c->est_alloc_count / (double)c->alloc_count;
}

/* @samples sampled allocations as an estimate of real ones. */
static uint64_t est_count(uint64_t samples, double scale)
{
    return (uint64_t)((double)samples * scale + 0.5);
}

/* One standard deviation of the estimate of @bytes under Poisson sampling at
 * @interval: each byte of an allocation below the interval is picked with probability
 * 1/interval and stands for interval bytes, so the variance is interval * bytes (an
 * upper bound: allocations of at least the interval are recorded exactly). */
static double sd_bytes(uint64_t bytes, uint64_t interval)
{
    return interval > 1 ? sqrt((double)interval * (double)bytes) : 0.0;
}

/* One standard deviation of the estimated count of @samples sampled allocations each
 * standing for @scale: the Horvitz-Thompson variance, sum of w (w - 1). */
static double sd_count(uint64_t samples, double scale)
{
    return scale > 1.0 ? sqrt((double)samples * scale * (scale - 1.0)) : 0.0;
}

/* "12.0 MiB ± 0.3 MiB" (or without the error bar when there is none). */
static const char *fmt_bytes_pm(uint64_t bytes, double sd, char *buf, size_t len)
{
    char a[32], b[32];
    hp_format_bytes(bytes, a, sizeof(a));
    if (sd < 0.5)
        snprintf(buf, len, "%s", a);
    else
        snprintf(buf, len, "%s ± %s", a, hp_format_bytes((uint64_t)(sd + 0.5), b, sizeof(b)));
    return buf;
}

/* "~3240014 ± 1570 allocations (39820 sampled)", or "40129 allocations" when the counts
 * are exact (or the trace has no estimate). */
static const char *fmt_count(uint64_t samples, double scale, const char *what, char *buf,
                             size_t len)
{
    if (scale > 1.0)
        snprintf(buf, len, "~%" PRIu64 " ± %.0f %s (%" PRIu64 " sampled)",
                 est_count(samples, scale), sd_count(samples, scale), what, samples);
    else
        snprintf(buf, len, "%" PRIu64 " %s", samples, what);
    return buf;
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

static const char *name_of(const char *n, bool demangle, char *buf, size_t len)
{
    if (!n || !n[0])
        return "<unknown>";
    return demangle ? rp_demangle(n, buf, len) : n;
}

static const char *frame_name(const struct rp_trace_frame *f, bool demangle, char *buf, size_t len)
{
    return name_of(f->function_name, demangle, buf, len);
}

/* One frame, leaf first: the functions inlined at its pc, then its own function; each
 * with file:line when the trace has source lines, else with module+offset. */
static void print_frame(FILE *out, const struct rp_trace_frame *f,
                        const struct rp_report_options *opt)
{
    char name[1024];
    bool lines = !opt->no_lines;
    for (uint32_t k = 0; lines && k < f->n_inlined; k++) {
        const struct rp_trace_line *l = &f->inlined[k];
        fprintf(out, "        %s  %s:%" PRIu32 "  (inlined)\n",
                name_of(l->function_name, opt->demangle, name, sizeof(name)),
                l->file[0] ? l->file : "?", l->line);
    }
    if (lines && f->file && f->file[0]) {
        fprintf(out, "        %s  %s:%" PRIu32 "\n",
                frame_name(f, opt->demangle, name, sizeof(name)), f->file, f->line);
        return;
    }
    const char *path = f->mapping_path && f->mapping_path[0] ? f->mapping_path : "?";
    fprintf(out, "        %s  %s+%#" PRIx64 "\n", frame_name(f, opt->demangle, name, sizeof(name)),
            path, f->rel_pc);
}

/* The leaf as a person reads it: the innermost inlined function, with its line. */
static void print_leaf(FILE *out, const struct rp_trace_callsite *c,
                       const struct rp_report_options *opt)
{
    char name[1024];
    const struct rp_trace_frame *leaf = &c->frames[c->n_frames - 1];
    if (!opt->no_lines && leaf->n_inlined) {
        const struct rp_trace_line *l = &leaf->inlined[0];
        fprintf(out, "        %s  %s:%" PRIu32 "\n",
                name_of(l->function_name, opt->demangle, name, sizeof(name)), l->file, l->line);
    } else if (!opt->no_lines && leaf->file && leaf->file[0]) {
        fprintf(out, "        %s  %s:%" PRIu32 "\n",
                frame_name(leaf, opt->demangle, name, sizeof(name)), leaf->file, leaf->line);
    } else {
        fprintf(out, "        %s\n", frame_name(leaf, opt->demangle, name, sizeof(name)));
    }
}

static void print_stack(FILE *out, const struct rp_trace_callsite *c,
                        const struct rp_report_options *opt)
{
    if (c->n_frames == 0) {
        fprintf(out, "        (no frames)\n");
        return;
    }
    if (opt->no_stacks) {
        print_leaf(out, c, opt);
        return;
    }
    for (size_t i = c->n_frames; i-- > 0;) /* leaf first */
        print_frame(out, &c->frames[i], opt);
}

static void print_site(FILE *out, size_t rank, const struct rp_trace_callsite *c, enum order o,
                       uint64_t interval, const struct rp_report_options *opt)
{
    char b1[64], b2[64], n1[128], n2[128];
    double scale = rp_callsite_count_scale(c);
    /* Each sampled allocation standing for exactly one: all were at least the interval
     * large, recorded exactly. */
    if (c->est_alloc_count && c->est_alloc_count == c->alloc_count)
        interval = 1;
    uint64_t un = unreleased(c);
    switch (o) {
    case BY_UNRELEASED:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) unreleased in %s", rank,
                fmt_bytes_pm(un, sd_bytes(un, interval), b1, sizeof(b1)), un,
                fmt_count(unreleased_count(c), scale, "allocations", n1, sizeof(n1)));
        fprintf(
            out, "; allocated %s (%" PRIu64 " bytes) in %s\n",
            fmt_bytes_pm(c->self_allocated, sd_bytes(c->self_allocated, interval), b2, sizeof(b2)),
            c->self_allocated, fmt_count(c->alloc_count, scale, "allocations", n2, sizeof(n2)));
        break;
    case BY_ALLOCATED:
        fprintf(
            out, "  #%zu  %s (%" PRIu64 " bytes) allocated in %s, %" PRIu64 " freed", rank,
            fmt_bytes_pm(c->self_allocated, sd_bytes(c->self_allocated, interval), b1, sizeof(b1)),
            c->self_allocated, fmt_count(c->alloc_count, scale, "allocations", n1, sizeof(n1)),
            est_count(c->free_count, scale));
        fprintf(out, "; unreleased %s (%" PRIu64 " bytes)\n",
                fmt_bytes_pm(un, sd_bytes(un, interval), b2, sizeof(b2)), un);
        break;
    case BY_PEAK:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) in %s at the peak\n", rank,
                fmt_bytes_pm(c->self_max, sd_bytes(c->self_max, interval), b1, sizeof(b1)),
                c->self_max, fmt_count(c->self_max_count, scale, "allocations", n1, sizeof(n1)));
        break;
    }
    print_stack(out, c, opt);
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
        print_site(out, i + 1, items[i].c, o, p->sampling_interval_bytes, opt);
}

static const char *process_name(const struct rp_trace_process *p)
{
    return p->cmdline && p->cmdline[0] ? p->cmdline : "(unknown)";
}

static void print_process_header(FILE *out, const struct rp_trace_process *p)
{
    fprintf(out, "Process %" PRId32 ": %s\n", p->pid, process_name(p));
    if (p->exec_index)
        fprintf(out, "  program %" PRIu32 " of pid %" PRId32 " (exec'd by the one before)\n",
                p->exec_index + 1, p->pid);
}

/* Prints @label and the parts of @v[0..@n) that are not zero ("12 what, 3 other"), on a
 * line of their own; nothing when all are zero. */
static void print_counts(FILE *out, const char *label, const uint64_t *v, const char *const *what,
                         size_t n)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        if (!v[i])
            continue;
        fprintf(out, "%s%" PRIu64 " %s", any ? ", " : label, v[i], what[i]);
        any = true;
    }
    if (any)
        fprintf(out, "\n");
}

/* What was lost on the way to the dump shown, by cause, as of that dump. */
static void print_losses(FILE *out, const struct rp_trace_process *p)
{
    const struct rp_trace_losses *l = &p->losses;
    const uint64_t lost[] = {l->records_dropped - HP_MIN(l->freeset_full, l->records_dropped),
                             l->freeset_full,
                             l->reserve_failures,
                             l->records_unread,
                             l->records_lost_in_service,
                             l->records_refused};
    static const char *const lost_what[] = {
        "for want of room in the shared buffer",
        "samples whose free the program could not watch (its set was full)",
        "to contention on the shared buffer",
        "left unread when the session ended",
        "for want of memory in the service",
        "refused by the bookkeeping (caps, memory)"};
    print_counts(out, "  Records lost: ", lost, lost_what, HP_ARRAY_SIZE(lost));
    const uint64_t other[] = {l->stacks_truncated, l->unknown_stacks, l->unknown_frees, l->seq_gaps,
                              l->map_reparses_deferred};
    static const char *const other_what[] = {
        "stacks cut at the copy size (outer frames missing)",
        "samples on stacks not the thread's own", "frees of addresses not live",
        "gaps in the record sequence", "waits for the rate limit of maps rereads"};
    print_counts(out, "  Also: ", other, other_what, HP_ARRAY_SIZE(other));
}

struct totals {
    uint64_t alloc, freed, nalloc, nfree, est_alloc, est_free;
    bool has_peak, scaled;
};

static struct totals totals_of(const struct rp_trace_callsite *cs, size_t n)
{
    struct totals t = {0};
    for (size_t i = 0; i < n; i++) {
        const struct rp_trace_callsite *c = &cs[i];
        double scale = rp_callsite_count_scale(c);
        t.alloc += c->self_allocated;
        t.freed += c->self_freed;
        t.nalloc += c->alloc_count;
        t.nfree += c->free_count;
        t.est_alloc += est_count(c->alloc_count, scale);
        t.est_free += est_count(c->free_count, scale);
        t.has_peak |= c->self_max != 0;
        t.scaled |= scale > 1.0;
    }
    return t;
}

static void print_process(FILE *out, const struct rp_trace_process *p,
                          const struct rp_report_options *opt)
{
    size_t top_n = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    char b[32];
    print_process_header(out, p);
    if (p->n_dumps == 0) {
        fprintf(out, "  no complete dump in this trace\n\n");
        return;
    }
    fprintf(out, "  heap %s, sampling interval %" PRIu64 " bytes, %" PRIu32 " dump%s, %s",
            p->heap_name[0] ? p->heap_name : "(unnamed)", p->sampling_interval_bytes, p->n_dumps,
            p->n_dumps == 1 ? "" : "s",
            p->from_startup ? "profiled from startup" : "attached while running");
    /* Not for a process that exited while profiled (Perfetto's disconnected): only when
     * the profiler lost it, and the more precise flag below does not say why. */
    if (p->connection_lost && !p->connection_closed_by_program)
        fprintf(out, ", DISCONNECTED (not profiled after that)");
    if (p->buffer_overran)
        fprintf(out, ", BUFFER OVERRAN (samples were dropped)");
    if (p->buffer_corrupted)
        fprintf(out, ", BUFFER CORRUPTED");
    if (p->hit_guardrail)
        fprintf(out, ", HIT GUARDRAIL");
    if (p->client_error)
        fprintf(out, p->buffer_overran ? ", CLIENT ERROR (stopped waiting for the service)"
                                       : ", CLIENT ERROR");
    if (p->connection_closed_by_program)
        fprintf(out, ", CONNECTION CLOSED BY THE PROGRAM (not profiled after that)");
    if (p->writer_stalled)
        fprintf(out,
                ", writer stalled (%" PRIu64 " waits for a stopped thread, %" PRIu64
                " records of exited threads skipped)",
                p->writer_stalls, p->stalled_records_skipped);
    fprintf(out, "\n");

    struct totals t = totals_of(p->callsites, p->n_callsites);
    uint64_t un = t.alloc > t.freed ? t.alloc - t.freed : 0;
    if (t.scaled)
        fprintf(out,
                "  Totals: allocated %s (%" PRIu64 " bytes, ~%" PRIu64 " allocations, %" PRIu64
                " sampled)",
                hp_format_bytes(t.alloc, b, sizeof(b)), t.alloc, t.est_alloc, t.nalloc);
    else
        fprintf(out, "  Totals: allocated %s (%" PRIu64 " bytes, %" PRIu64 " allocations)",
                hp_format_bytes(t.alloc, b, sizeof(b)), t.alloc, t.nalloc);
    fprintf(out, ", freed %s (%" PRIu64 " bytes, %s%" PRIu64 " frees)",
            hp_format_bytes(t.freed, b, sizeof(b)), t.freed, t.scaled ? "~" : "",
            t.scaled ? t.est_free : t.nfree);
    fprintf(out, ", unreleased %s (%" PRIu64 " bytes)\n", hp_format_bytes(un, b, sizeof(b)), un);
    if (p->sampling_interval_bytes > 1)
        fprintf(out, "  (sampled: ± is one standard deviation of the estimate, ~ marks estimated "
                     "counts)\n");

    struct sort_item *items = p->n_callsites ? calloc(p->n_callsites, sizeof(*items)) : NULL;
    if (p->n_callsites && !items) {
        fprintf(out, "  (out of memory)\n\n");
        return;
    }
    print_table(out, p, BY_UNRELEASED, opt, top_n, items);
    if (!opt->unreleased_only)
        print_table(out, p, BY_ALLOCATED, opt, top_n, items);
    if (t.has_peak && !opt->unreleased_only)
        print_table(out, p, BY_PEAK, opt, top_n, items);
    free(items);

    fprintf(out,
            "\n  Stats: %" PRIu64 " samples, %" PRIu64 " unwinding errors, %" PRIu64
            " map reparses, %" PRIu64 " us unwinding, %" PRIu64 " us client blocked on the ring\n",
            p->heap_samples, p->unwinding_errors, p->map_reparses, p->total_unwinding_time_us,
            p->client_spinlock_blocked_us);
    print_losses(out, p);
    if (p->frees_lost)
        fprintf(out,
                "  WARNING: %" PRIu64 " frees were lost on the way: the bytes they freed show as "
                "unreleased, so unreleased bytes are overestimated\n",
                p->frees_lost);
    fprintf(out, "\n");
}

void rp_report_print(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    static const struct rp_report_options defaults = {.demangle = true};
    if (!opt)
        opt = &defaults;
    if (t->n_processes == 0)
        fprintf(out, "No heap profiles in this trace (%" PRIu64 " packets).\n", t->n_packets);
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (p->n_dumps == 0 || p->selected)
            print_process(out, p, opt);
    }
}

/* ---- summary of many processes ---- */

struct proc_item {
    uint64_t key;
    const struct rp_trace_process *p;
};

static int cmp_unreleased_desc(const void *a, const void *b)
{
    const struct proc_item *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? 1 : -1) : 0;
}

void rp_report_print_summary(FILE *out, const struct rp_trace *t,
                             const struct rp_report_options *opt, size_t n_largest)
{
    const size_t max_rows = 40;
    char a[32], u[32];
    struct proc_item *order = t->n_processes ? calloc(t->n_processes, sizeof(*order)) : NULL;
    fprintf(out, "\n%8s %10s %10s %10s  %s\n", "pid", "samples", "allocated", "unreleased",
            "program");
    size_t n = 0, rows = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        struct totals tt = totals_of(p->callsites, p->n_callsites);
        uint64_t un = tt.alloc > tt.freed ? tt.alloc - tt.freed : 0;
        if (order)
            order[n++] = (struct proc_item){.key = un, .p = p};
        if (rows++ < max_rows)
            fprintf(out, "%8" PRId32 " %10" PRIu64 " %10s %10s  %s%s\n", p->pid, tt.nalloc,
                    hp_format_bytes(tt.alloc, a, sizeof(a)), hp_format_bytes(un, u, sizeof(u)),
                    p->exec_index ? "(exec) " : "", process_name(p));
    }
    if (rows > max_rows)
        fprintf(out, "%8s ... and %zu more\n", "", rows - max_rows);
    if (!order)
        return;
    qsort(order, n, sizeof(*order), cmp_unreleased_desc);
    if (n > n_largest)
        n = n_largest;
    if (n)
        fprintf(out, "\nTop sites of the %zu process%s with the most unreleased bytes:\n\n", n,
                n == 1 ? "" : "es");
    for (size_t i = 0; i < n; i++)
        print_process(out, order[i].p, opt);
    free(order);
}

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

/* The sites of both sides with equal frames, added up per side. */
struct diff_item {
    const struct rp_trace_callsite *c; /* one of them, for its frames */
    uint64_t unrel[2], alloc[2], count[2];
    int64_t d_unreleased, d_allocated, d_alloc_count;
};

struct diff_index {
    struct hp_idtab tab;
    struct diff_item *items;
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
        di->items[di->n++] = (struct diff_item){.c = c};
    }
    struct diff_item *d = &di->items[id];
    double scale = rp_callsite_count_scale(c);
    d->unrel[side] += unreleased(c);
    d->alloc[side] += c->self_allocated;
    d->count[side] += est_count(c->alloc_count, scale);
    return 0;
}

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

static void diff_process(FILE *out, const struct rp_trace_process *bp,
                         const struct rp_trace_process *p, const struct rp_report_options *opt)
{
    size_t nb = bp ? bp->n_callsites : 0;
    uint64_t seed = hp_hash_u64((uintptr_t)p ^ (uintptr_t)&seed);
    struct diff_index di = {.items = calloc(p->n_callsites + nb + 1, sizeof(*di.items))};
    hp_idtab_init(&di.tab);
    if (!di.items) {
        fprintf(out, "  (out of memory)\n");
        goto out;
    }
    for (size_t i = 0; i < nb; i++)
        if (diff_add(&di, seed, &bp->callsites[i], 0) < 0)
            goto oom;
    for (size_t i = 0; i < p->n_callsites; i++)
        if (diff_add(&di, seed, &p->callsites[i], 1) < 0)
            goto oom;
    int64_t tot_unrel = 0, tot_alloc = 0;
    for (size_t i = 0; i < di.n; i++) {
        struct diff_item *d = &di.items[i];
        d->d_unreleased = sdiff(d->unrel[1], d->unrel[0]);
        d->d_allocated = sdiff(d->alloc[1], d->alloc[0]);
        d->d_alloc_count = sdiff(d->count[1], d->count[0]);
        tot_unrel += d->d_unreleased;
        tot_alloc += d->d_allocated;
    }
    if (di.n)
        qsort(di.items, di.n, sizeof(*di.items), cmp_diff);
    fprintf(out, "\nProcess %d (%s) heap %s: growth since the base%s\n", (int)p->pid,
            p->cmdline && p->cmdline[0] ? p->cmdline : "?", p->heap_name,
            bp ? "" : " (no matching process in the base: all of it)");
    fprintf(out, "  unreleased %+" PRId64 " bytes, allocated %+" PRId64 " bytes\n", tot_unrel,
            tot_alloc);
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    fprintf(out, "\n  Top %zu sites by unreleased growth:\n", top);
    size_t shown = 0;
    for (size_t i = 0; i < di.n && shown < top; i++) {
        const struct diff_item *d = &di.items[i];
        if (d->d_unreleased <= 0 && d->d_allocated <= 0)
            continue;
        shown++;
        fprintf(out,
                "  #%zu  unreleased %+" PRId64 " bytes, allocated %+" PRId64 " bytes in %+" PRId64
                " allocations\n",
                shown, d->d_unreleased, d->d_allocated, d->d_alloc_count);
        print_stack(out, d->c, opt);
    }
    if (!shown)
        fprintf(out, "    (none grew)\n");
    goto out;
oom:
    fprintf(out, "  (out of memory)\n");
out:
    hp_idtab_done(&di.tab);
    free(di.items);
}

void rp_report_print_diff(FILE *out, const struct rp_trace *base, const struct rp_trace *t,
                          const struct rp_report_options *opt)
{
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        diff_process(out, match_process(base, p, i), p, opt);
    }
}

/* ---- growth over the dumps of a process ---- */

/* A site followed across dumps: its unreleased bytes at each one. */
struct growth_site {
    const struct rp_trace_callsite *c; /* its latest occurrence, for frames and counts */
    double *y;                         /* per dump, bytes */
    double slope, z, last;
};

struct growth_index {
    struct hp_idtab tab;
    struct growth_site *sites;
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
    const struct growth_site *x = a, *y = b;
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

static void growth_chart(FILE *out, const struct rp_trace_process *p, const double *x,
                         const double *tot, bool timed)
{
    const size_t max_rows = 30, width = 40;
    double mx = 1;
    for (size_t i = 0; i < p->n_dumps; i++)
        mx = tot[i] > mx ? tot[i] : mx;
    fprintf(out, "  Unreleased bytes per dump:\n");
    size_t n = p->n_dumps, step = n > max_rows ? (n + max_rows - 1) / max_rows : 1;
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

static void growth_process(FILE *out, const struct rp_trace_process *p,
                           const struct rp_report_options *opt)
{
    size_t n = p->n_dumps;
    print_process_header(out, p);
    if (n < 3 || !p->dumps) {
        fprintf(out,
                "  %zu dump%s: growth needs at least 3 (record with --continuous-dump MS, or "
                "ask for dumps with 'heapprof dump')\n\n",
                n, n == 1 ? "" : "s");
        return;
    }
    double *x = calloc(n, sizeof(*x)), *tot = calloc(n, sizeof(*tot));
    struct growth_index gi = {0};
    hp_idtab_init(&gi.tab);
    size_t cap = 0;
    if (!x || !tot)
        goto oom;
    /* Seconds since the first dump; dump numbers when the trace has no times. */
    bool timed = p->dumps[n - 1].timestamp > p->dumps[0].timestamp;
    for (size_t i = 0; i < n; i++)
        x[i] = timed ? (double)(p->dumps[i].timestamp - p->dumps[0].timestamp) / 1e9 : (double)i;
    uint64_t seed = hp_hash_u64((uintptr_t)p);
    for (size_t i = 0; i < n; i++) {
        const struct rp_trace_dump *d = &p->dumps[i];
        for (size_t k = 0; k < d->n_callsites; k++) {
            const struct rp_trace_callsite *c = &d->callsites[k];
            uint64_t h = hp_hash_combine(seed, (uintptr_t)c->frames ^ c->callstack_id);
            int64_t id = hp_idtab_find(&gi.tab, h, growth_eq, &gi, c);
            if (id < 0) {
                if (hp_grow((void **)&gi.sites, &cap, gi.n + 1, sizeof(*gi.sites)) < 0)
                    goto oom;
                double *y = calloc(n, sizeof(*y));
                if (!y || hp_idtab_add(&gi.tab, h, (uint32_t)gi.n) < 0) {
                    free(y);
                    goto oom;
                }
                id = (int64_t)gi.n;
                gi.sites[gi.n++] = (struct growth_site){.y = y};
            }
            struct growth_site *g = &gi.sites[id];
            g->c = c;
            g->y[i] += (double)unreleased(c);
            tot[i] += (double)unreleased(c);
        }
    }
    char b[32];
    double span = x[n - 1] - x[0];
    fprintf(out, "  heap %s, %zu dumps over %.1f %s, sampling interval %" PRIu64 " bytes\n",
            p->heap_name[0] ? p->heap_name : "(unnamed)", n, span, timed ? "s" : "dumps",
            p->sampling_interval_bytes);
    growth_chart(out, p, x, tot, timed);

    uint64_t interval = p->sampling_interval_bytes;
    for (size_t k = 0; k < gi.n; k++) {
        struct growth_site *g = &gi.sites[k];
        double mean = 0;
        for (size_t i = 0; i < n; i++)
            mean += g->y[i];
        mean /= (double)n;
        double se;
        /* Each point's sampling variance is at most interval * bytes (sd_bytes()). */
        fit(x, g->y, n, interval > 1 ? (double)interval * mean : 0, &g->slope, &se);
        g->z = se > 0 ? g->slope / se : (g->slope > 0 ? INFINITY : 0);
        g->last = g->y[n - 1];
    }
    qsort(gi.sites, gi.n, sizeof(*gi.sites), cmp_growth);
    size_t top = opt->top_n > 0 ? (size_t)opt->top_n : 10, shown = 0;
    fprintf(out, "\n  Sites by steady growth of unreleased bytes (least-squares slope; z = slope / "
                 "its standard error, with the sampling noise as a floor: z >= 3 is growth beyond "
                 "noise):\n");
    for (size_t k = 0; k < gi.n && shown < top; k++) {
        const struct growth_site *g = &gi.sites[k];
        if (!(g->slope > 0))
            continue;
        shown++;
        char rate[32];
        hp_format_bytes((uint64_t)(g->slope + 0.5), rate, sizeof(rate));
        fprintf(out, "  #%zu  +%s/%s, z %.1f%s; %s unreleased at the last dump\n", shown, rate,
                timed ? "s" : "dump", isinf(g->z) ? 999.9 : g->z, g->z >= 3 ? "" : " (noise?)",
                hp_format_bytes((uint64_t)g->last, b, sizeof(b)));
        print_stack(out, g->c, opt);
    }
    if (!shown)
        fprintf(out, "    (no site grew)\n");
    fprintf(out, "\n");
    goto out;
oom:
    fprintf(out, "  (out of memory)\n\n");
out:
    for (size_t k = 0; k < gi.n; k++)
        free(gi.sites[k].y);
    free(gi.sites);
    hp_idtab_done(&gi.tab);
    free(x);
    free(tot);
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
