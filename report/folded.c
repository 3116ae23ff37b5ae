/* report/folded.c: `heapprof report --folded`: the selected dump as folded stacks, one
 * line "root;caller;...;leaf VALUE" per distinct stack, the format of flamegraph.pl's
 * stackcollapse scripts that inferno and speedscope read too.
 *
 * Each frame gives its own function, then the functions inlined into it, outermost
 * first, so the line reads from the root down as the calls went. A name cannot hold the
 * separators of the format: ';' becomes ':' and control characters (newlines included)
 * become ' '. A frame without a name is "<unknown> in MODULE" (the file's base name).
 * With several processes, each stack starts with a frame "PROGRAM (PID)".
 */
#include "report/report.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "report/report_internal.h"

int rp_folded_value_parse(const char *s, enum rp_folded_value *ret)
{
    static const char *const names[] = {
        [RP_FOLDED_UNRELEASED] = "unreleased",
        [RP_FOLDED_ALLOCATED] = "allocated",
        [RP_FOLDED_UNRELEASED_COUNT] = "unreleased-count",
        [RP_FOLDED_ALLOCATED_COUNT] = "allocated-count",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i])) {
            *ret = (enum rp_folded_value)i;
            return 0;
        }
    return -EINVAL;
}

uint64_t rp_folded_value_of(const struct rp_trace_callsite *c, enum rp_folded_value v)
{
    double scale = rp_callsite_count_scale(c);
    switch (v) {
    case RP_FOLDED_UNRELEASED:
        return rp__unreleased(c);
    case RP_FOLDED_ALLOCATED:
        return c->self_allocated;
    case RP_FOLDED_UNRELEASED_COUNT:
        return rp__est_count(c->alloc_count - HP_MIN(c->free_count, c->alloc_count), scale);
    case RP_FOLDED_ALLOCATED_COUNT:
        return rp__est_count(c->alloc_count, scale);
    }
    return 0;
}

/* @name as a frame of the format. */
static void put_name(FILE *out, const char *name, bool demangle)
{
    char buf[1024];
    const char *s = demangle ? rp_demangle(name, buf, sizeof(buf)) : name;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        fputc(ch == ';' ? ':' : ch < 0x20 || ch == 0x7f ? ' ' : ch, out);
    }
}

static void put_function(FILE *out, const char *name, const char *module, bool demangle)
{
    if (name && name[0]) {
        put_name(out, name, demangle);
        return;
    }
    const char *m = module && module[0] ? module : "?";
    const char *slash = strrchr(m, '/');
    fputs("<unknown> in ", out);
    put_name(out, slash ? slash + 1 : m, false);
}

/* "PROGRAM (PID)": argv[0]'s base name. */
static void put_process(FILE *out, const struct rp_trace_process *p)
{
    const char *cmd = p->cmdline && p->cmdline[0] ? p->cmdline : "?";
    size_t n = strcspn(cmd, " ");
    const char *slash = memrchr(cmd, '/', n);
    const char *base = slash ? slash + 1 : cmd;
    char prog[256];
    snprintf(prog, sizeof(prog), "%.*s", (int)(n - (size_t)(base - cmd)), base);
    put_name(out, prog, false);
    fprintf(out, " (%" PRId32 ")", p->pid);
}

/* The stack of @c, root first, without the value; malloc'd, or NULL. */
static char *stack_line(const struct rp_trace_process *p, const struct rp_trace_callsite *c,
                        bool with_process, bool demangle)
{
    char *s = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&s, &len);
    if (!out)
        return NULL;
    bool first = true;
    if (with_process) {
        put_process(out, p);
        first = false;
    }
    for (size_t i = 0; i < c->n_frames; i++) {
        const struct rp_trace_frame *f = &c->frames[i];
        if (!first)
            fputc(';', out);
        first = false;
        put_function(out, f->function_name, f->mapping_path, demangle);
        for (uint32_t k = f->n_inlined; k-- > 0;) {
            fputc(';', out);
            put_function(out, f->inlined[k].function_name, f->mapping_path, demangle);
        }
    }
    if (first)
        fputs("[no frames]", out);
    if (fclose(out) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

struct folded_line {
    char *stack;
    uint64_t value;
};

static int cmp_lines(const void *a, const void *b)
{
    return strcmp(((const struct folded_line *)a)->stack, ((const struct folded_line *)b)->stack);
}

int rp_report_print_folded(FILE *out, const struct rp_trace *t, enum rp_folded_value v,
                           const struct rp_report_options *opt)
{
    bool demangle = opt ? opt->demangle : true;
    size_t selected = 0, n_sites = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].selected) {
            selected++;
            n_sites += t->processes[i].n_callsites;
        }
    struct folded_line *lines = calloc(n_sites ? n_sites : 1, sizeof(*lines));
    if (!lines)
        return -ENOMEM;
    size_t n = 0;
    int r = 0;
    for (size_t i = 0; i < t->n_processes && r == 0; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        for (size_t k = 0; p->selected && k < p->n_callsites; k++) {
            uint64_t val = rp_folded_value_of(&p->callsites[k], v);
            if (!val)
                continue;
            char *s = stack_line(p, &p->callsites[k], selected > 1, demangle);
            if (!s) {
                r = -ENOMEM;
                break;
            }
            lines[n++] = (struct folded_line){.stack = s, .value = val};
        }
    }
    if (n)
        qsort(lines, n, sizeof(*lines), cmp_lines);
    /* Stacks that print the same (other pcs in the same functions) make one line. */
    for (size_t i = 0; i < n && r == 0;) {
        uint64_t sum = 0;
        size_t j = i;
        for (; j < n && !strcmp(lines[j].stack, lines[i].stack); j++)
            sum += lines[j].value;
        fprintf(out, "%s %" PRIu64 "\n", lines[i].stack, sum);
        i = j;
    }
    for (size_t i = 0; i < n; i++)
        free(lines[i].stack);
    free(lines);
    return r;
}
