/* report/html.c: `heapprof html`: a trace as one self-contained HTML page (summary, flame
 * graphs per process and dump, heap over time and growth ranking, diff against a base).
 *
 * The page is the script and style of report/html/ (embedded at build time, see
 * report/html/embed.py) and the profile as JSON in a non-executed <script> element. The
 * JSON is small because everything repeated is interned once:
 *
 *     strings  every name, file and module path, once
 *     frames   [name, file, line, module, rel_pc, flags] per distinct frame; a trace
 *              frame with inlined functions becomes one frame per function (flag 1:
 *              inlined), its own function first (nearer the root)
 *     np, nf   a trie of the call paths of every stack of the page: node i's parent is
 *              i - np[i], its frame nf[i]; node 0 is the root. A stack is its leaf node.
 *
 * and each dump, diff or growth ranking lists stacks as leaf nodes with their values in
 * parallel arrays. The script builds the call tree (merging frames by function) from
 * these, in the browser.
 *
 * Function names are untrusted: every string goes through json_str(), which escapes
 * '<', '>' and '&' (so "</script>" cannot end the element) and replaces invalid UTF-8.
 * A Content-Security-Policy allows only the embedded script (by its hash) and no
 * network at all.
 */
#include "report/report.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "report/html_assets.h"
#include "report/report_internal.h"

/* Values (stack, dump) pairs written for the dumps not selected: past it, older dumps
 * are listed with their totals only (a page of many big dumps stays openable). */
#define HTML_MAX_VALUES 1000000u
/* Growth sites listed per process. */
#define HTML_MAX_GROWTH_SITES 100u
/* Diff sites listed per process. */
#define HTML_MAX_DIFF_SITES 50000u

struct hstr {
    const char *s; /* in the arena */
    size_t len;
};

struct hframe {
    uint32_t name, file, line, module, flags;
    uint64_t pc;
};

struct hnode {
    uint32_t parent, frame;
};

/* What makes two trace frames show the same: the trace's strings are interned, so
 * equal pointers are equal strings (of one trace; frames of two traces never share). */
struct fkey {
    const char *name, *module, *file;
    const struct rp_trace_line *inlined;
    uint64_t pc;
    uint32_t line, n_inlined;
    uint32_t first, n; /* the span in fseq */
};

/* What is written for one process of the trace. */
struct hproc {
    const struct rp_trace_process *p;
    bool has_growth;
    struct rp_growth growth;
    const struct rp_trace_process *base; /* with a base trace */
    struct rp_diff_site *diff;
    size_t n_diff;
    bool *dump_values; /* per dump: its values are written */
};

struct html {
    FILE *out;
    const struct rp_html_options *opt;
    uint64_t seed;
    struct hp_arena arena;
    struct hstr *strs;
    size_t n_strs, cap_strs;
    struct hp_idtab str_tab;
    struct hp_map raw_cache;  /* (uintptr) string of a trace -> id */
    struct hp_map name_cache; /* (uintptr) function name of a trace -> id, demangled */
    struct hframe *frames;
    size_t n_frames, cap_frames;
    struct hp_idtab frame_tab;
    /* Trace frames already expanded: their identity, and where their frames are in fseq. */
    struct fkey *fkeys;
    size_t n_fkeys, cap_fkeys;
    struct hp_idtab fkey_tab;
    uint32_t *fseq;
    size_t n_fseq, cap_fseq;
    struct hnode *nodes;
    size_t n_nodes, cap_nodes;
    struct hp_idtab node_tab;
    bool written;              /* the tables are out: every stack written must be interned before */
    struct hp_map stack_cache; /* (uintptr) frame array of a callsite -> leaf node */
    size_t n_stacks;           /* entries of stack_cache */
    /* The last stack walked and the node after each of its frames: the next one shares
     * most of its path (a dump lists callstacks in the order they were interned). */
    const struct rp_trace_frame *prev;
    size_t prev_n;
    uint32_t *prev_nodes;
    size_t cap_prev_nodes;
    struct hproc *procs;
    size_t n_procs;
};

/* ---- JSON ---- */

/* The length of the valid UTF-8 sequence at @s (at most @n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        len = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        len = 3;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        len = 4;
    else
        return 0;
    /* No overlong forms, no surrogates, nothing past U+10FFFF. */
    if (s[0] == 0xe0)
        lo = 0xa0;
    else if (s[0] == 0xed)
        hi = 0x9f;
    else if (s[0] == 0xf0)
        lo = 0x90;
    else if (s[0] == 0xf4)
        hi = 0x8f;
    if (len > n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

void rp__html_json_str(FILE *o, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    putc('"', o);
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t n = utf8_len(s + i, len - i);
            if (n == 0) {
                fputs("\\ufffd", o);
                i++;
            } else if (n == 3 && c == 0xe2 && s[i + 1] == 0x80 && (s[i + 2] & 0xfe) == 0xa8) {
                /* U+2028, U+2029: line ends to older JavaScript parsers. */
                fprintf(o, "\\u%04x", 0x2028u + (s[i + 2] - 0xa8u));
                i += 3;
            } else {
                fwrite(s + i, 1, n, o);
                i += n;
            }
            continue;
        }
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f || c == '<' || c == '>' || c == '&')
            fprintf(o, "\\u%04x", c);
        else
            putc(c, o);
        i++;
    }
    putc('"', o);
}

static void json_cstr(FILE *o, const char *s)
{
    rp__html_json_str(o, s ? s : "", s ? strlen(s) : 0);
}

/* A number; null for what JSON cannot say (infinities, NaN). */
static void json_num(FILE *o, double v)
{
    if (isfinite(v))
        fprintf(o, "%.10g", v);
    else
        fputs("null", o);
}

/* Text for an HTML element's content (the page's title). */
static void html_text(FILE *o, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", o);
            break;
        case '>':
            fputs("&gt;", o);
            break;
        case '&':
            fputs("&amp;", o);
            break;
        case '"':
            fputs("&quot;", o);
            break;
        default:
            putc(*s, o);
        }
    }
}

/* ---- interning: strings, frames, call paths ---- */

static bool str_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct html *h = ctx;
    const struct hstr *k = key;
    return h->strs[id].len == k->len && !memcmp(h->strs[id].s, k->s, k->len);
}

/* The id of @s[0..@len), added when new. Returns it, or -ENOMEM. */
static int64_t str_id(struct html *h, const char *s, size_t len)
{
    struct hstr k = {s, len};
    uint64_t hash = hp_hash_bytes(s, len, h->seed);
    int64_t id = hp_idtab_find(&h->str_tab, hash, str_eq, h, &k);
    if (id >= 0)
        return id;
    if (h->n_strs >= UINT32_MAX - 1 ||
        hp_grow((void **)&h->strs, &h->cap_strs, h->n_strs + 1, sizeof(*h->strs)) < 0)
        return -ENOMEM;
    char *copy = hp_arena_strndup(&h->arena, s, len);
    if (!copy || hp_idtab_add(&h->str_tab, hash, (uint32_t)h->n_strs) < 0)
        return -ENOMEM;
    h->strs[h->n_strs] = (struct hstr){copy, len};
    return (int64_t)h->n_strs++;
}

/* The id of a string of a trace as it is (paths), cached by its address. */
static int64_t raw_id(struct html *h, const char *s)
{
    if (!s)
        s = "";
    uint64_t *v = hp_map_get(&h->raw_cache, (uintptr_t)s);
    if (v)
        return (int64_t)*v;
    int64_t id = str_id(h, s, strlen(s));
    if (id < 0 || hp_map_put(&h->raw_cache, (uintptr_t)s, (void **)&v) < 0)
        return -ENOMEM;
    *v = (uint64_t)id;
    return id;
}

/* The id of function name @s (demangled when asked), cached by its address; NULL or ""
 * is unknown: @pc in @module names it, as pprof names such frames. */
static int64_t name_id(struct html *h, const char *s, const char *module, uint64_t pc)
{
    char buf[1024];
    if (!s || !s[0]) {
        const char *path = module && module[0] ? module : "?";
        const char *base = strrchr(path, '/');
        int n = snprintf(buf, sizeof(buf), "%s+%#" PRIx64, base ? base + 1 : path, pc);
        return str_id(h, buf, HP_MIN((size_t)HP_MAX(n, 0), sizeof(buf) - 1));
    }
    uint64_t *v = hp_map_get(&h->name_cache, (uintptr_t)s);
    if (v)
        return (int64_t)*v;
    const char *name = h->opt->demangle ? rp_demangle(s, buf, sizeof(buf)) : s;
    int64_t id = str_id(h, name, strlen(name));
    if (id < 0 || hp_map_put(&h->name_cache, (uintptr_t)s, (void **)&v) < 0)
        return -ENOMEM;
    *v = (uint64_t)id;
    return id;
}

static uint64_t frame_hash(const struct html *h, const struct hframe *f)
{
    uint64_t x = hp_hash_keyed2(h->seed, f->name, f->file);
    x = hp_hash_combine(x, (uint64_t)f->line << 32 | f->flags);
    return hp_hash_combine(hp_hash_combine(x, f->module), f->pc);
}

static bool frame_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct html *h = ctx;
    const struct hframe *a = &h->frames[id], *b = key;
    return a->name == b->name && a->file == b->file && a->line == b->line &&
           a->module == b->module && a->flags == b->flags && a->pc == b->pc;
}

/* Appends the id of @f (added when new) to fseq. */
static int frame_push(struct html *h, const struct hframe *f)
{
    uint64_t hash = frame_hash(h, f);
    int64_t id = hp_idtab_find(&h->frame_tab, hash, frame_eq, h, f);
    if (id < 0) {
        if (h->n_frames >= UINT32_MAX - 1 ||
            hp_grow((void **)&h->frames, &h->cap_frames, h->n_frames + 1, sizeof(*h->frames)) < 0 ||
            hp_idtab_add(&h->frame_tab, hash, (uint32_t)h->n_frames) < 0)
            return -ENOMEM;
        h->frames[h->n_frames] = *f;
        id = (int64_t)h->n_frames++;
    }
    if (hp_grow((void **)&h->fseq, &h->cap_fseq, h->n_fseq + 1, sizeof(*h->fseq)) < 0)
        return -ENOMEM;
    h->fseq[h->n_fseq++] = (uint32_t)id;
    return 0;
}

static struct fkey fkey_of(const struct rp_trace_frame *f)
{
    return (struct fkey){.name = f->function_name,
                         .module = f->mapping_path,
                         .file = f->file,
                         .inlined = f->n_inlined ? f->inlined : NULL,
                         .pc = f->rel_pc,
                         .line = f->line,
                         .n_inlined = f->n_inlined};
}

static bool fkey_same(const struct fkey *a, const struct fkey *b)
{
    return a->name == b->name && a->module == b->module && a->file == b->file &&
           a->inlined == b->inlined && a->pc == b->pc && a->line == b->line &&
           a->n_inlined == b->n_inlined;
}

static bool fkey_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct html *h = ctx;
    return fkey_same(&h->fkeys[id], key);
}

/* Appends the page's frames of trace frame @f to fseq, root first: its own function,
 * then the ones inlined at its pc, outermost first. */
static int frame_expand(struct html *h, const struct rp_trace_frame *f)
{
    int64_t module = raw_id(h, f->mapping_path);
    int64_t name = name_id(h, f->function_name, f->mapping_path, f->rel_pc);
    int64_t file = raw_id(h, f->file);
    if (module < 0 || name < 0 || file < 0)
        return -ENOMEM;
    struct hframe hf = {(uint32_t)name, (uint32_t)file, f->line, (uint32_t)module, 0, f->rel_pc};
    if (frame_push(h, &hf) < 0)
        return -ENOMEM;
    for (uint32_t k = f->n_inlined; k-- > 0;) {
        const struct rp_trace_line *l = &f->inlined[k];
        name = name_id(h, l->function_name, f->mapping_path, f->rel_pc);
        file = raw_id(h, l->file);
        if (name < 0 || file < 0)
            return -ENOMEM;
        hf = (struct hframe){(uint32_t)name, (uint32_t)file, l->line, (uint32_t)module, 1,
                             f->rel_pc};
        if (frame_push(h, &hf) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* The page's frames of trace frame @f (indices [first, first + n) in fseq), expanded
 * once per distinct frame. */
static int frame_span(struct html *h, const struct rp_trace_frame *f, size_t *ret_first,
                      size_t *ret_n)
{
    struct fkey k = fkey_of(f);
    uint64_t hash = hp_hash_keyed2(h->seed, (uintptr_t)k.name ^ k.pc, (uintptr_t)k.inlined);
    hash = hp_hash_combine(hash, (uintptr_t)k.module ^ (uintptr_t)k.file ^ k.line);
    int64_t id = hp_idtab_find(&h->fkey_tab, hash, fkey_eq, h, &k);
    if (id < 0) {
        k.first = (uint32_t)h->n_fseq;
        if (h->n_fseq >= UINT32_MAX / 2 || frame_expand(h, f) < 0)
            return -ENOMEM;
        k.n = (uint32_t)(h->n_fseq - k.first);
        if (h->n_fkeys >= UINT32_MAX - 1 ||
            hp_grow((void **)&h->fkeys, &h->cap_fkeys, h->n_fkeys + 1, sizeof(*h->fkeys)) < 0 ||
            hp_idtab_add(&h->fkey_tab, hash, (uint32_t)h->n_fkeys) < 0)
            return -ENOMEM;
        h->fkeys[h->n_fkeys] = k;
        id = (int64_t)h->n_fkeys++;
    }
    *ret_first = h->fkeys[id].first;
    *ret_n = h->fkeys[id].n;
    return 0;
}

static bool node_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct html *h = ctx;
    const struct hnode *k = key;
    return h->nodes[id].parent == k->parent && h->nodes[id].frame == k->frame;
}

/* The child of node @parent through frame @frame, added when new. */
static int64_t node_get(struct html *h, uint32_t parent, uint32_t frame)
{
    struct hnode k = {parent, frame};
    uint64_t hash = hp_hash_keyed2(h->seed, parent, frame);
    int64_t id = hp_idtab_find(&h->node_tab, hash, node_eq, h, &k);
    if (id >= 0)
        return id;
    assert(!h->written);
    if (h->n_nodes >= UINT32_MAX - 1 ||
        hp_grow((void **)&h->nodes, &h->cap_nodes, h->n_nodes + 1, sizeof(*h->nodes)) < 0 ||
        hp_idtab_add(&h->node_tab, hash, (uint32_t)h->n_nodes) < 0)
        return -ENOMEM;
    h->nodes[h->n_nodes] = k;
    return (int64_t)h->n_nodes++;
}

/* How many frames from the root @a[0..@n) shares with the last stack walked. */
static size_t shared_prefix(const struct html *h, const struct rp_trace_frame *a, size_t n)
{
    size_t k = 0, max = HP_MIN(n, h->prev_n);
    while (k < max) {
        struct fkey x = fkey_of(&a[k]), y = fkey_of(&h->prev[k]);
        if (!fkey_same(&x, &y))
            break;
        k++;
    }
    return k;
}

/* The leaf node of the stack of @c, interned on first use. */
static int64_t stack_leaf(struct html *h, const struct rp_trace_callsite *c)
{
    if (!c->frames || !c->n_frames)
        return 0;
    uint64_t *v = hp_map_get(&h->stack_cache, (uintptr_t)c->frames);
    if (v)
        return (int64_t)*v;
    if (hp_grow((void **)&h->prev_nodes, &h->cap_prev_nodes, c->n_frames, sizeof(*h->prev_nodes)) <
        0)
        return -ENOMEM;
    size_t k = shared_prefix(h, c->frames, c->n_frames);
    int64_t node = k ? h->prev_nodes[k - 1] : 0;
    /* What is walked now is the last stack, up to where it is written. */
    h->prev = c->frames;
    h->prev_n = k;
    for (size_t i = k; i < c->n_frames; i++) {
        size_t first, n;
        if (frame_span(h, &c->frames[i], &first, &n) < 0)
            return -ENOMEM;
        for (size_t j = 0; j < n; j++) {
            node = node_get(h, (uint32_t)node, h->fseq[first + j]);
            if (node < 0)
                return node;
        }
        h->prev_nodes[i] = (uint32_t)node;
        h->prev_n = i + 1;
    }
    if (hp_map_put(&h->stack_cache, (uintptr_t)c->frames, (void **)&v) < 0)
        return -ENOMEM;
    *v = (uint64_t)node;
    h->n_stacks++;
    return node;
}

static int intern_sites(struct html *h, const struct rp_trace_callsite *cs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (stack_leaf(h, &cs[i]) < 0)
            return -ENOMEM;
    return 0;
}

/* ---- what each process shows ---- */

/* The next growth site of @g the page lists at or after *@k (those that grow, the first
 * HTML_MAX_GROWTH_SITES), or NULL; *@shown counts them. */
static const struct rp_growth_site *growth_next(const struct rp_growth *g, size_t *k, size_t *shown)
{
    for (; *k < g->n_sites && *shown < HTML_MAX_GROWTH_SITES; (*k)++) {
        if (g->sites[*k].slope > 0) {
            (*shown)++;
            return &g->sites[(*k)++];
        }
    }
    return NULL;
}

static const struct rp_trace_callsite *dump_sites(const struct rp_trace_process *p, size_t d,
                                                  size_t *ret_n)
{
    if (p->dumps) {
        *ret_n = p->dumps[d].n_callsites;
        return p->dumps[d].callsites;
    }
    *ret_n = p->n_callsites;
    return p->callsites;
}

/* Dumps of @p as the page lists them: every dump kept, else the selected one. */
static size_t n_page_dumps(const struct rp_trace_process *p)
{
    return p->dumps ? p->n_dumps : p->selected ? 1 : 0;
}

/* The dump of @p shown first: the one selected when loading. */
static size_t selected_dump(const struct rp_trace_process *p, const struct rp_html_options *opt)
{
    size_t n = n_page_dumps(p);
    if (!p->dumps || n == 0)
        return 0;
    if (opt->dump_index > 0 && (size_t)opt->dump_index <= n)
        return (size_t)opt->dump_index - 1;
    return n - 1;
}

/* Chooses the dumps whose values are written (the selected one always, then the latest
 * while the budget lasts) and interns their stacks, the growth sites and diff sites. */
static int prepare_process(struct html *h, struct hproc *hp, size_t *budget)
{
    const struct rp_trace_process *p = hp->p;
    size_t n = n_page_dumps(p), sel = selected_dump(p, h->opt), ns;
    hp->dump_values = calloc(n + 1, sizeof(*hp->dump_values));
    if (!hp->dump_values)
        return -ENOMEM;
    for (size_t k = 0; k <= n; k++) {
        size_t d = k == 0 ? sel : n - k; /* the selected one, then from the last */
        if (d >= n || hp->dump_values[d])
            continue;
        const struct rp_trace_callsite *cs = dump_sites(p, d, &ns);
        if (k > 0 && ns > *budget)
            continue;
        *budget -= HP_MIN(ns, *budget);
        hp->dump_values[d] = true;
        if (intern_sites(h, cs, ns) < 0)
            return -ENOMEM;
    }
    if (p->dumps && p->n_dumps >= 2) {
        int r = rp_growth_compute(p, &hp->growth);
        if (r < 0)
            return r;
        hp->has_growth = true;
        size_t k = 0, shown = 0;
        for (const struct rp_growth_site *g; (g = growth_next(&hp->growth, &k, &shown));)
            if (stack_leaf(h, g->c) < 0)
                return -ENOMEM;
    }
    for (size_t k = 0; hp->diff && k < hp->n_diff && k < HTML_MAX_DIFF_SITES; k++)
        if (stack_leaf(h, hp->diff[k].c) < 0)
            return -ENOMEM;
    return 0;
}

/* ---- writing ---- */

static uint64_t unreleased_count_est(const struct rp_trace_callsite *c)
{
    uint64_t n = c->alloc_count > c->free_count ? c->alloc_count - c->free_count : 0;
    return rp__est_count(n, rp_callsite_count_scale(c));
}

/* Leaf nodes of the stacks of @cs, then their values: unreleased and allocated bytes,
 * unreleased and allocated counts (estimated). */
static void write_values(struct html *h, const struct rp_trace_callsite *cs, size_t n)
{
    FILE *o = h->out;
    static const char *const keys[] = {"s", "u", "a", "uc", "ac"};
    for (size_t k = 0; k < HP_ARRAY_SIZE(keys); k++) {
        fprintf(o, "%s\"%s\":[", k ? "," : "", keys[k]);
        bool first = true;
        for (size_t i = 0; i < n; i++) {
            const struct rp_trace_callsite *c = &cs[i];
            if (!c->self_allocated && !rp__unreleased(c))
                continue;
            uint64_t v = k == 0   ? (uint64_t)stack_leaf(h, c)
                         : k == 1 ? rp__unreleased(c)
                         : k == 2 ? c->self_allocated
                         : k == 3 ? unreleased_count_est(c)
                                  : rp__est_count(c->alloc_count, rp_callsite_count_scale(c));
            fprintf(o, first ? "%" PRIu64 : ",%" PRIu64, v);
            first = false;
        }
        fputc(']', o);
    }
}

/* The time origin of @p's dumps: when its profile began, else its first dump. */
static uint64_t time_origin(const struct rp_trace_process *p)
{
    uint64_t first = p->dumps && p->n_dumps ? p->dumps[0].timestamp : p->timestamp;
    return p->profile_start_ts && p->profile_start_ts <= first ? p->profile_start_ts : first;
}

static void write_dumps(struct html *h, const struct hproc *hp)
{
    FILE *o = h->out;
    const struct rp_trace_process *p = hp->p;
    uint64_t t0 = time_origin(p);
    size_t n = n_page_dumps(p), ns;
    fputs(",\"dumps\":[", o);
    for (size_t d = 0; d < n; d++) {
        const struct rp_trace_callsite *cs = dump_sites(p, d, &ns);
        uint64_t ts = p->dumps ? p->dumps[d].timestamp : p->timestamp, un = 0, alloc = 0, peak = 0;
        for (size_t i = 0; i < ns; i++) {
            un += rp__unreleased(&cs[i]);
            alloc += cs[i].self_allocated;
            peak += cs[i].self_max;
        }
        fprintf(o, "%s{\"t\":", d ? "," : "");
        json_num(o, ts && ts >= t0 ? (double)(ts - t0) / 1e9 : NAN);
        fprintf(o, ",\"u\":%" PRIu64 ",\"a\":%" PRIu64 ",\"peak\":%" PRIu64 ",\"v\":", un, alloc,
                peak);
        if (hp->dump_values[d]) {
            fputc('{', o);
            write_values(h, cs, ns);
            fputc('}', o);
        } else {
            fputs("null", o);
        }
        fputc('}', o);
    }
    fprintf(o, "],\"sel\":%zu", selected_dump(p, h->opt));
}

static void write_growth(struct html *h, const struct hproc *hp)
{
    FILE *o = h->out;
    const struct rp_growth *g = &hp->growth;
    if (!hp->has_growth)
        return;
    fprintf(o, ",\"growth\":{\"timed\":%s,\"x\":[", g->timed ? "true" : "false");
    for (size_t i = 0; i < g->n_dumps; i++) {
        fputs(i ? "," : "", o);
        json_num(o, g->x[i]);
    }
    fputs("],\"total\":[", o);
    for (size_t i = 0; i < g->n_dumps; i++)
        fprintf(o, "%s%.0f", i ? "," : "", g->total[i]);
    fputs("],\"sites\":[", o);
    size_t k = 0, shown = 0;
    for (const struct rp_growth_site *s; (s = growth_next(g, &k, &shown));) {
        fprintf(o, "%s{\"s\":%" PRId64 ",\"slope\":", shown > 1 ? "," : "", stack_leaf(h, s->c));
        json_num(o, s->slope);
        fputs(",\"z\":", o);
        json_num(o, isinf(s->z) ? 999.9 : s->z);
        fprintf(o, ",\"last\":%.0f}", s->last);
    }
    fputs("]}", o);
}

static void write_diff(struct html *h, const struct hproc *hp)
{
    FILE *o = h->out;
    if (!hp->diff)
        return;
    fputs(",\"diff\":{\"base\":", o);
    if (hp->base) {
        fprintf(o, "{\"pid\":%" PRId32 ",\"cmd\":", hp->base->pid);
        json_cstr(o, hp->base->cmdline);
        fputc('}', o);
    } else {
        fputs("null", o);
    }
    size_t n = HP_MIN(hp->n_diff, (size_t)HTML_MAX_DIFF_SITES);
    /* Per site: leaf; unreleased change, base, now; allocated change; count change. */
    static const char *const keys[] = {"s", "du", "bu", "tu", "da", "dc"};
    for (size_t k = 0; k < HP_ARRAY_SIZE(keys); k++) {
        fprintf(o, ",\"%s\":[", keys[k]);
        for (size_t i = 0; i < n; i++) {
            const struct rp_diff_site *d = &hp->diff[i];
            int64_t v = k == 0   ? stack_leaf(h, d->c)
                        : k == 1 ? d->d_unreleased
                        : k == 2 ? (int64_t)d->unreleased[0]
                        : k == 3 ? (int64_t)d->unreleased[1]
                        : k == 4 ? d->d_allocated
                                 : d->d_alloc_count;
            fprintf(o, i ? ",%" PRId64 : "%" PRId64, v);
        }
        fputc(']', o);
    }
    fputc('}', o);
}

static void write_losses(FILE *o, const struct rp_trace_losses *l)
{
    fprintf(o,
            ",\"losses\":{\"records_dropped\":%" PRIu64 ",\"freeset_full\":%" PRIu64
            ",\"reserve_failures\":%" PRIu64 ",\"records_unread\":%" PRIu64
            ",\"records_lost_in_service\":%" PRIu64 ",\"records_refused\":%" PRIu64
            ",\"stacks_truncated\":%" PRIu64 ",\"unknown_stacks\":%" PRIu64
            ",\"unknown_frees\":%" PRIu64 ",\"seq_gaps\":%" PRIu64
            ",\"map_reparses_deferred\":%" PRIu64 ",\"unseen_call_slots\":%" PRIu64 "}",
            l->records_dropped, l->freeset_full, l->reserve_failures, l->records_unread,
            l->records_lost_in_service, l->records_refused, l->stacks_truncated, l->unknown_stacks,
            l->unknown_frees, l->seq_gaps, l->map_reparses_deferred, l->unseen_call_slots);
}

static void write_flags(FILE *o, const struct rp_trace_process *p)
{
    const struct {
        const char *name;
        bool v;
    } flags[] = {
        {"from_startup", p->from_startup},
        {"disconnected", p->disconnected},
        {"buffer_overran", p->buffer_overran},
        {"buffer_corrupted", p->buffer_corrupted},
        {"hit_guardrail", p->hit_guardrail},
        {"client_error", p->client_error},
        {"writer_stalled", p->writer_stalled},
        {"connection_closed_by_program", p->connection_closed_by_program},
        {"connection_lost", p->connection_lost},
    };
    fputs(",\"flags\":{", o);
    for (size_t i = 0; i < HP_ARRAY_SIZE(flags); i++)
        fprintf(o, "%s\"%s\":%s", i ? "," : "", flags[i].name, flags[i].v ? "true" : "false");
    fputc('}', o);
}

static void write_process(struct html *h, const struct hproc *hp)
{
    FILE *o = h->out;
    const struct rp_trace_process *p = hp->p;
    fprintf(o, "{\"pid\":%" PRId32 ",\"exec\":%" PRIu32 ",\"cmd\":", p->pid, p->exec_index);
    json_cstr(o, p->cmdline);
    fputs(",\"heap\":", o);
    json_cstr(o, p->heap_name);
    fprintf(o, ",\"interval\":%" PRIu64 ",\"nDumps\":%" PRIu32 ",\"startedBefore\":",
            p->sampling_interval_bytes, p->n_dumps);
    /* Attached while running: seconds the profile had run at the selected dump, and from
     * how long after the process started. */
    bool started = p->profile_start_ts && p->timestamp >= p->profile_start_ts;
    json_num(o, started ? (double)(p->timestamp - p->profile_start_ts) / 1e9 : NAN);
    fputs(",\"startedAfter\":", o);
    json_num(o, started && p->process_start_ts && p->process_start_ts <= p->profile_start_ts
                    ? (double)(p->profile_start_ts - p->process_start_ts) / 1e9
                    : NAN);
    write_flags(o, p);
    fprintf(o,
            ",\"stats\":{\"samples\":%" PRIu64 ",\"unwinding_errors\":%" PRIu64
            ",\"map_reparses\":%" PRIu64 ",\"unwinding_us\":%" PRIu64
            ",\"client_blocked_us\":%" PRIu64 ",\"frees_lost\":%" PRIu64
            ",\"writer_stalls\":%" PRIu64 ",\"stalled_records_skipped\":%" PRIu64 "}",
            p->heap_samples, p->unwinding_errors, p->map_reparses, p->total_unwinding_time_us,
            p->client_spinlock_blocked_us, p->frees_lost, p->writer_stalls,
            p->stalled_records_skipped);
    write_losses(o, &p->losses);
    write_dumps(h, hp);
    write_growth(h, hp);
    write_diff(h, hp);
    fputc('}', o);
}

static void write_tables(struct html *h)
{
    FILE *o = h->out;
    fputs("\"strings\":[", o);
    for (size_t i = 0; i < h->n_strs; i++) {
        fputs(i ? "," : "", o);
        rp__html_json_str(o, h->strs[i].s, h->strs[i].len);
    }
    fputs("],\"frames\":[", o);
    for (size_t i = 0; i < h->n_frames; i++) {
        const struct hframe *f = &h->frames[i];
        fprintf(o, "%s%" PRIu32 ",%" PRIu32 ",%" PRIu32 ",%" PRIu32 ",%" PRIu64 ",%" PRIu32,
                i ? "," : "", f->name, f->file, f->line, f->module, f->pc, f->flags);
    }
    /* Parents as distances: most are 1 (a path grows node after node). */
    fputs("],\"np\":[0", o);
    for (size_t i = 1; i < h->n_nodes; i++)
        fprintf(o, ",%zu", i - h->nodes[i].parent);
    fputs("],\"nf\":[-1", o);
    for (size_t i = 1; i < h->n_nodes; i++)
        fprintf(o, ",%" PRIu32, h->nodes[i].frame);
    fputc(']', o);
    h->written = true;
}

static void write_data(struct html *h, const struct rp_trace *t, const struct rp_trace *base)
{
    FILE *o = h->out;
    fputs("{\"version\":1,\"title\":", o);
    json_cstr(o, h->opt->title);
    fputs(",\"baseTitle\":", o);
    if (base)
        json_cstr(o, h->opt->base_title);
    else
        fputs("null", o);
    fprintf(o,
            ",\"packets\":%" PRIu64 ",\"truncated\":%s,\"incompleteDumps\":%" PRIu32
            ",\"sourceLines\":%" PRIu64 ",",
            t->n_packets, t->truncated ? "true" : "false", t->incomplete_dumps, t->n_source_lines);
    write_tables(h);
    fputs(",\"processes\":[", o);
    for (size_t i = 0; i < h->n_procs; i++) {
        fputs(i ? "," : "", o);
        write_process(h, &h->procs[i]);
    }
    fputs("]}", o);
}

static void write_page(struct html *h, const struct rp_trace *t, const struct rp_trace *base)
{
    FILE *o = h->out;
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n", o);
    /* Nothing but the embedded script runs, and nothing is fetched. */
    fprintf(o,
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'sha256-%s'; style-src 'unsafe-inline'; img-src data:\">\n",
            rp__html_js_sha256);
    fputs("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>", o);
    html_text(o, "heapprof: ");
    html_text(o, h->opt->title ? h->opt->title : "");
    fputs("</title>\n<style>", o);
    for (size_t i = 0; rp__html_css[i]; i++)
        fputs(rp__html_css[i], o);
    fputs("</style>\n</head>\n<body>\n<div id=\"app\">Loading the profile...</div>\n", o);
    fputs("<script type=\"application/json\" id=\"hp-data\">", o);
    write_data(h, t, base);
    fputs("</script>\n<script>", o);
    for (size_t i = 0; rp__html_js[i]; i++)
        fputs(rp__html_js[i], o);
    fputs("</script>\n</body>\n</html>\n", o);
}

static void html_done(struct html *h)
{
    for (size_t i = 0; i < h->n_procs; i++) {
        if (h->procs[i].has_growth)
            rp_growth_done(&h->procs[i].growth);
        free(h->procs[i].diff);
        free(h->procs[i].dump_values);
    }
    free(h->procs);
    free(h->strs);
    free(h->frames);
    free(h->fseq);
    free(h->fkeys);
    free(h->prev_nodes);
    hp_idtab_done(&h->fkey_tab);
    free(h->nodes);
    hp_idtab_done(&h->str_tab);
    hp_idtab_done(&h->frame_tab);
    hp_idtab_done(&h->node_tab);
    hp_map_done(&h->raw_cache);
    hp_map_done(&h->name_cache);
    hp_map_done(&h->stack_cache);
    hp_arena_done(&h->arena);
}

static void html_init(struct html *h, FILE *out, const struct rp_html_options *opt)
{
    *h = (struct html){.out = out, .opt = opt, .seed = hp_hash_seed()};
    hp_idtab_init(&h->str_tab);
    hp_idtab_init(&h->frame_tab);
    hp_idtab_init(&h->node_tab);
    hp_map_init(&h->raw_cache, sizeof(uint64_t));
    hp_map_init(&h->name_cache, sizeof(uint64_t));
    hp_idtab_init(&h->fkey_tab);
    hp_map_init(&h->stack_cache, sizeof(uint64_t));
}

/* Interns everything the page shows of @t (and the diff against @base). */
static int prepare(struct html *h, const struct rp_trace *t, const struct rp_trace *base)
{
    /* Node 0: the root of every stack. */
    if (hp_grow((void **)&h->nodes, &h->cap_nodes, 1, sizeof(*h->nodes)) < 0)
        return -ENOMEM;
    h->nodes[h->n_nodes++] = (struct hnode){0, 0};
    h->procs = calloc(t->n_processes + 1, sizeof(*h->procs));
    if (!h->procs)
        return -ENOMEM;
    size_t budget = HTML_MAX_VALUES;
    for (size_t i = 0; i < t->n_processes; i++) {
        struct hproc *hp = &h->procs[h->n_procs++];
        hp->p = &t->processes[i];
        if (base && hp->p->selected) {
            hp->base = rp_diff_base_process(base, hp->p, i);
            int r = rp_diff_sites(hp->base, hp->p, &hp->diff, &hp->n_diff);
            if (r < 0)
                return r;
        }
        int r = prepare_process(h, hp, &budget);
        if (r < 0)
            return r;
    }
    return 0;
}

int rp_html_write(FILE *out, const struct rp_trace *t, const struct rp_trace *base,
                  const struct rp_html_options *opt)
{
    static const struct rp_html_options defaults = {.demangle = true};
    struct html h;
    html_init(&h, out, opt ? opt : &defaults);
    int r = prepare(&h, t, base);
    if (r == 0) {
        write_page(&h, t, base);
        r = ferror(out) ? -EIO : (int)HP_MIN(h.n_stacks, (size_t)INT32_MAX);
    }
    html_done(&h);
    return r;
}
