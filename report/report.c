/* report/report.c: the text report of a loaded trace (`heapprof report`): processes, their
 * totals and losses, and the top sites with their stacks; the comparisons (--diff,
 * --growth) are report/compare.c's. */
#include "report/report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libiberty/demangle.h>

#include "common/containers.h"
#include "common/format.h"
#include "report/report_internal.h"

const char *rp_demangle(const char *name, char *buf, size_t buf_len)
{
    /* C++ (Itanium ABI) and Rust's legacy symbols start with _Z, Rust's v0 ones with _R.
     * libiberty's demangler tells C++ from legacy Rust (its h<hash> last segment) and, as
     * rustfilt does, drops that hash and a ".llvm.N" suffix. */
    if (!name || buf_len == 0 || name[0] != '_' || (name[1] != 'Z' && name[1] != 'R'))
        return name;
    char *d = cplus_demangle(name, DMGL_PARAMS | DMGL_ANSI | DMGL_AUTO);
    if (!d)
        return name;
    size_t n = strlen(d);
    if (n >= buf_len)
        n = buf_len - 1;
    memcpy(buf, d, n);
    buf[n] = '\0';
    free(d);
    return buf;
}

uint64_t rp__unreleased(const struct rp_trace_callsite *c)
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
uint64_t rp__est_count(uint64_t samples, double scale)
{
    return (uint64_t)((double)samples * scale + 0.5);
}

/* One standard deviation of the estimate of @bytes under Poisson sampling at
 * @interval: each byte of an allocation below the interval is picked with probability
 * 1/interval and stands for interval bytes, so the variance is interval * bytes (an
 * upper bound: allocations of at least the interval are recorded exactly). */
double rp__sd_bytes(uint64_t bytes, uint64_t interval)
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
                 rp__est_count(samples, scale), sd_count(samples, scale), what, samples);
    else
        snprintf(buf, len, "%" PRIu64 " %s", samples, what);
    return buf;
}

enum order { BY_UNRELEASED, BY_ALLOCATED, BY_PEAK, BY_POSSIBLY_FREED };

static uint64_t key_of(const struct rp_trace_callsite *c, enum order o)
{
    switch (o) {
    case BY_UNRELEASED:
    case BY_POSSIBLY_FREED:
        return rp__unreleased(c);
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

void rp__print_stack(FILE *out, const struct rp_trace_callsite *c,
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
    uint64_t un = rp__unreleased(c);
    switch (o) {
    case BY_UNRELEASED:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) unreleased in %s", rank,
                fmt_bytes_pm(un, rp__sd_bytes(un, interval), b1, sizeof(b1)), un,
                fmt_count(unreleased_count(c), scale, "allocations", n1, sizeof(n1)));
        fprintf(out, "; allocated %s (%" PRIu64 " bytes) in %s\n",
                fmt_bytes_pm(c->self_allocated, rp__sd_bytes(c->self_allocated, interval), b2,
                             sizeof(b2)),
                c->self_allocated, fmt_count(c->alloc_count, scale, "allocations", n2, sizeof(n2)));
        break;
    case BY_ALLOCATED:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) allocated in %s, %" PRIu64 " freed", rank,
                fmt_bytes_pm(c->self_allocated, rp__sd_bytes(c->self_allocated, interval), b1,
                             sizeof(b1)),
                c->self_allocated, fmt_count(c->alloc_count, scale, "allocations", n1, sizeof(n1)),
                rp__est_count(c->free_count, scale));
        fprintf(out, "; unreleased %s (%" PRIu64 " bytes)\n",
                fmt_bytes_pm(un, rp__sd_bytes(un, interval), b2, sizeof(b2)), un);
        break;
    case BY_PEAK:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) in %s at the peak\n", rank,
                fmt_bytes_pm(c->self_max, rp__sd_bytes(c->self_max, interval), b1, sizeof(b1)),
                c->self_max, fmt_count(c->self_max_count, scale, "allocations", n1, sizeof(n1)));
        break;
    case BY_POSSIBLY_FREED:
        fprintf(out, "  #%zu  %s (%" PRIu64 " bytes) possibly freed in %s\n", rank,
                fmt_bytes_pm(un, rp__sd_bytes(un, interval), b1, sizeof(b1)), un,
                fmt_count(unreleased_count(c), scale, "allocations", n1, sizeof(n1)));
        break;
    }
    rp__print_stack(out, c, opt);
}

static void print_table(FILE *out, const struct rp_trace_process *p, enum order o,
                        const struct rp_report_options *opt, size_t top_n, struct sort_item *items)
{
    static const char *const titles[] = {
        [BY_UNRELEASED] = "unreleased bytes",
        [BY_ALLOCATED] = "allocated bytes",
        [BY_PEAK] = "bytes at the heap peak",
        [BY_POSSIBLY_FREED] = "possibly freed bytes (their free may have been lost)",
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

/* The sites of @p's possibly freed allocations, ranked as unreleased ones are, apart from
 * them; nothing when there are none. */
static void print_possibly_freed(FILE *out, const struct rp_trace_process *p,
                                 const struct rp_report_options *opt, size_t top_n)
{
    if (!p->n_possibly_freed_sites)
        return;
    struct sort_item *items = calloc(p->n_possibly_freed_sites, sizeof(*items));
    if (!items)
        return;
    struct rp_trace_process view = *p;
    view.callsites = p->possibly_freed_sites;
    view.n_callsites = p->n_possibly_freed_sites;
    print_table(out, &view, BY_POSSIBLY_FREED, opt, top_n, items);
    free(items);
}

bool rp__first_of_process(const struct rp_trace *t, size_t i)
{
    const struct rp_trace_process *p = &t->processes[i];
    for (size_t j = 0; j < i; j++) {
        const struct rp_trace_process *q = &t->processes[j];
        if (q->selected && q->pid == p->pid && q->exec_index == p->exec_index)
            return false;
    }
    return true;
}

bool rp__heap_named(const struct rp_trace_process *p)
{
    return p->heap_name && p->heap_name[0] && strcmp(p->heap_name, "libc.malloc") != 0;
}

/* @p's command line on one line, in @buf: control characters (the newlines of a
 * `python3 -c` script) as spaces, cut with "..." past @len - 1 bytes. */
static const char *process_name(const struct rp_trace_process *p, char *buf, size_t len)
{
    const char *s = p->cmdline && p->cmdline[0] ? p->cmdline : "(unknown)";
    size_t n = 0;
    for (; s[n] && n + 1 < len; n++)
        buf[n] = (unsigned char)s[n] < 0x20 || s[n] == 0x7f ? ' ' : s[n];
    buf[n] = '\0';
    if (s[n] && len > 4)
        memcpy(buf + len - 4, "...", 4);
    return buf;
}

void rp__print_process_header(FILE *out, const struct rp_trace_process *p)
{
    char name[1024];
    fprintf(out, "Process %" PRId32 ": %s\n", p->pid, process_name(p, name, sizeof(name)));
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
    const uint64_t other[] = {l->stacks_truncated, l->unknown_stacks,        l->unknown_frees,
                              l->seq_gaps,         l->map_reparses_deferred, l->unseen_call_slots};
    static const char *const other_what[] = {
        "stacks cut at the copy size (outer frames missing)",
        "samples on stacks not the thread's own",
        "frees of addresses not live",
        "gaps in the record sequence",
        "waits for the rate limit of maps rereads",
        "allocator call slots of the program not switched to the profiler (their calls are "
        "missing)"};
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
        t.est_alloc += rp__est_count(c->alloc_count, scale);
        t.est_free += rp__est_count(c->free_count, scale);
        t.has_peak |= c->self_max != 0;
        t.scaled |= scale > 1.0;
    }
    return t;
}

/* For a process attached while it ran: when its profile began, after its start (when the
 * trace says) and before its selected dump, in @buf. False when it was profiled from its
 * start or the trace does not say. */
static bool attached_when(const struct rp_trace_process *p, char *buf, size_t len)
{
    if (p->from_startup || !p->profile_start_ts || p->timestamp < p->profile_start_ts)
        return false;
    double before = (double)(p->timestamp - p->profile_start_ts) / 1e9;
    if (p->process_start_ts && p->process_start_ts <= p->profile_start_ts)
        snprintf(buf, len,
                 "profiled from %.1f s after the process started, %.1f s before this dump",
                 (double)(p->profile_start_ts - p->process_start_ts) / 1e9, before);
    else
        snprintf(buf, len, "profiled from %.1f s before this dump", before);
    return true;
}

static void print_process(FILE *out, const struct rp_trace_process *p,
                          const struct rp_report_options *opt)
{
    size_t top_n = opt->top_n > 0 ? (size_t)opt->top_n : 10;
    char b[32];
    rp__print_process_header(out, p);
    if (p->n_dumps == 0) {
        fprintf(out, "  no complete dump in this trace\n\n");
        return;
    }
    fprintf(out, "  heap %s, sampling interval %" PRIu64 " bytes, %" PRIu32 " dump%s, %s",
            p->heap_name[0] ? p->heap_name : "(unnamed)", p->sampling_interval_bytes, p->n_dumps,
            p->n_dumps == 1 ? "" : "s",
            p->from_startup ? "profiled from startup" : "attached while running");
    /* Allocations made before an attach are not in the profile: say from when it is. */
    char when[128];
    if (attached_when(p, when, sizeof(when)))
        fprintf(out, " (%s; earlier allocations are not seen)", when);
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
    if (p->possibly_freed_count)
        fprintf(out,
                "  Possibly freed: %" PRIu64 " sampled allocations, %s (%" PRIu64
                " bytes), not counted as unreleased: %" PRIu64
                " frees were lost while the shared buffer was full, and each of these may be "
                "one of them\n",
                p->possibly_freed_count, hp_format_bytes(p->possibly_freed_bytes, b, sizeof(b)),
                p->possibly_freed_bytes, p->frees_lost);
    if (p->sampling_interval_bytes > 1)
        fprintf(out, "  (sampled: ± is one standard deviation of the estimate, ~ marks estimated "
                     "counts)\n");

    struct sort_item *items = p->n_callsites ? calloc(p->n_callsites, sizeof(*items)) : NULL;
    if (p->n_callsites && !items) {
        fprintf(out, "  (out of memory)\n\n");
        return;
    }
    print_table(out, p, BY_UNRELEASED, opt, top_n, items);
    print_possibly_freed(out, p, opt, top_n);
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
    /* Traces of heapprof that mark them (possibly_freed) keep those bytes out of the
     * unreleased ones; older ones did not. */
    if (p->frees_lost && !p->possibly_freed_count)
        fprintf(out,
                "  WARNING: %" PRIu64 " frees were lost on the way: the bytes they freed show as "
                "unreleased, so unreleased bytes are overestimated\n",
                p->frees_lost);
    fprintf(out, "\n");
}

/* ---- many processes ---- */

struct proc_item {
    uint64_t key;
    const struct rp_trace_process *p;
};

static int cmp_unreleased_desc(const void *a, const void *b)
{
    const struct proc_item *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? 1 : -1) : 0;
}

/* The selected processes of @t by unreleased bytes, most first (*@ret_n of them); NULL
 * when there are none or out of memory. */
static struct proc_item *by_unreleased(const struct rp_trace *t, size_t *ret_n)
{
    struct proc_item *order = t->n_processes ? calloc(t->n_processes, sizeof(*order)) : NULL;
    size_t n = 0;
    for (size_t i = 0; order && i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        struct totals tt = totals_of(p->callsites, p->n_callsites);
        order[n++] =
            (struct proc_item){.key = tt.alloc > tt.freed ? tt.alloc - tt.freed : 0, .p = p};
    }
    if (n)
        qsort(order, n, sizeof(*order), cmp_unreleased_desc);
    *ret_n = n;
    return order;
}

void rp__print_process_table(FILE *out, const struct rp_trace *t)
{
    const size_t max_rows = 40;
    char a[32], u[32], name[120];
    fprintf(out, "\n%8s %10s %10s %10s  %s\n", "pid", "samples", "allocated", "unreleased",
            "program");
    size_t rows = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (!p->selected)
            continue;
        struct totals tt = totals_of(p->callsites, p->n_callsites);
        uint64_t un = tt.alloc > tt.freed ? tt.alloc - tt.freed : 0;
        if (rows++ < max_rows)
            fprintf(out, "%8" PRId32 " %10" PRIu64 " %10s %10s  %s%s%s%s%s\n", p->pid, tt.nalloc,
                    hp_format_bytes(tt.alloc, a, sizeof(a)), hp_format_bytes(un, u, sizeof(u)),
                    p->exec_index ? "(exec) " : "", rp__heap_named(p) ? "[heap " : "",
                    rp__heap_named(p) ? p->heap_name : "", rp__heap_named(p) ? "] " : "",
                    process_name(p, name, sizeof(name)));
    }
    if (rows > max_rows)
        fprintf(out, "%8s ... and %zu more\n", "", rows - max_rows);
    /* Attached while running: their earlier allocations are not in the table. */
    for (size_t i = 0, shown = 0; i < t->n_processes && shown < max_rows; i++) {
        char when[128];
        if (t->processes[i].selected && rp__first_of_process(t, i) &&
            attached_when(&t->processes[i], when, sizeof(when))) {
            fprintf(out, "%8" PRId32 "  attached while running: %s\n", t->processes[i].pid, when);
            shown++;
        }
    }
}

void rp_report_print_summary(FILE *out, const struct rp_trace *t,
                             const struct rp_report_options *opt, size_t n_largest)
{
    rp__print_process_table(out, t);
    size_t n;
    struct proc_item *order = by_unreleased(t, &n);
    if (!order)
        return;
    if (n > n_largest)
        n = n_largest;
    if (n)
        fprintf(out, "\nTop sites of the %zu process%s with the most unreleased bytes:\n\n", n,
                n == 1 ? "" : "es");
    for (size_t i = 0; i < n; i++)
        print_process(out, order[i].p, opt);
    free(order);
}

/* The per-site detail of the @opt->max_processes processes with the most unreleased
 * bytes, and how to see the others. */
static void print_largest(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    size_t n;
    struct proc_item *order = by_unreleased(t, &n);
    if (!order) {
        fprintf(out, "(out of memory)\n");
        return;
    }
    size_t shown = HP_MIN(n, opt->max_processes);
    fprintf(out, "Sites of the %zu process%s with the most unreleased bytes (of %zu):\n\n", shown,
            shown == 1 ? "" : "es", n);
    for (size_t i = 0; i < shown; i++)
        print_process(out, order[i].p, opt);
    fprintf(out,
            "%zu more process%s not shown in detail: see one with --process PID, or all with "
            "--all-processes.\n",
            n - shown, n - shown == 1 ? "" : "es");
    free(order);
}

void rp_report_print(FILE *out, const struct rp_trace *t, const struct rp_report_options *opt)
{
    static const struct rp_report_options defaults = {.demangle = true};
    if (!opt)
        opt = &defaults;
    if (t->n_processes == 0) {
        fprintf(out, "No heap profiles in this trace (%" PRIu64 " packets).\n", t->n_packets);
        return;
    }
    size_t selected = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        selected += t->processes[i].selected;
    if (opt->summary && selected) {
        rp__print_header(out, t, opt);
        rp__print_process_table(out, t);
        rp__print_functions(out, t, opt);
        fprintf(out, "\n");
    }
    if (opt->max_processes && selected > opt->max_processes) {
        print_largest(out, t, opt);
        return;
    }
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (p->n_dumps == 0 || p->selected)
            print_process(out, p, opt);
    }
}
