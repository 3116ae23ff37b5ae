/* report/filter.c: what the views show of a stack: --focus, --hide, the allocator
 * wrappers folded into their callers and the entry frames cut below `main` (the rules
 * are in report/report.h), and a trace rewritten to what a filter keeps.
 *
 * Matching demangles a name and runs a few regexec() calls: too slow to repeat for each
 * of the million frames of a big trace, so the result is cached per name, keyed by its
 * address (a trace's strings are interned: each name is matched once), and the hidden
 * and folded parts of each list of inlined functions per list (the reader shares the
 * list of an address). Frames themselves are copied per callstack: not cached.
 */
#include "report/report.h"

#include <errno.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "report/report_internal.h"

/* Allocator entry points and the thin layers around them whose callers are the sites
 * people look for: libc, C++ (the operators and std::allocator, which libstdc++ names
 * __new_allocator from GCC 12), Rust's alloc crate, GLib, the GNU x* helpers and
 * CPython's allocators. */
const char *const rp_filter_default_wrappers[] = {
    "^operator new",
    "^(__libc_)?(malloc|calloc|realloc|reallocarray|free|memalign|valloc|pvalloc)$",
    "^(posix_memalign|aligned_alloc)$",
    "^(__)?(strdup|strndup)$",
    "^__rust_(alloc|alloc_zeroed|realloc)",
    "^alloc::alloc::",
    "^alloc::raw_vec::",
    "^std::allocator",
    "^std::__new_allocator",
    "^__gnu_cxx::new_allocator",
    "^(xmalloc|xcalloc|xrealloc|xzalloc|xstrdup)$",
    "^g_(try_)?(malloc|malloc0|realloc|new)",
    "^_?Py(Mem|Object)_(Raw)?(Malloc|Calloc|Realloc)$",
    NULL,
};

/* Where a process starts and threads begin: cut below them. */
static const char entry_pattern[] = "^(_start|__libc_start_main|__libc_start_main_impl|"
                                    "__libc_start_call_main|start_thread|clone|clone3|__clone|"
                                    "__clone3|__clone_internal)$";

enum {
    M_HIDE = 1 << 0,
    M_FOCUS = 1 << 1,
    M_FOLD = 1 << 2,
    M_ENTRY = 1 << 3,
    M_MAIN = 1 << 4,
    M_FOCUS_ANY = 1 << 5, /* frames: the function or one inlined into it */
};

/* What a frame is to the filter. */
struct frame_info {
    const struct rp_trace_line *inlined; /* without the hidden ones */
    uint32_t n_inlined;
    uint32_t n_inlined_fold; /* innermost entries of inlined that are wrappers */
    uint32_t flags;
};

/* What an inlined list is to the filter, computed once per list (the reader shares the
 * list of an address between the frames that have it). */
struct inlined_info {
    const struct rp_trace_line *orig; /* the list the entry was made for ... */
    uint32_t orig_n;                  /* ... and its length: a reused address misses */
    struct frame_info fi;             /* its part: kept list, folded count, M_FOCUS_ANY */
};

struct re_set {
    regex_t *re;
    size_t n;
};

struct rp_filter {
    struct re_set hide, focus, fold, entry;
    bool full_stacks;
    struct hp_map names;   /* name address -> match flags + 1 */
    struct hp_map inlined; /* inlined list address -> struct inlined_info */
    struct hp_arena arena;
    struct frame_info *scratch;
    size_t cap_scratch;
    size_t *idx; /* the kept frames' indices, for rp_trace_filter() */
    size_t cap_idx;
};

static void re_set_done(struct re_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        regfree(&s->re[i]);
    free(s->re);
    *s = (struct re_set){0};
}

/* Compiles @pats[0..@n) into @s; on failure a reason naming @what in @err. */
static int re_set_add(struct re_set *s, const char *const *pats, size_t n, const char *what,
                      char *err, size_t errlen)
{
    if (!n)
        return 0;
    regex_t *re = realloc(s->re, (s->n + n) * sizeof(*re));
    if (!re) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    s->re = re;
    for (size_t i = 0; i < n; i++) {
        int r = regcomp(&s->re[s->n], pats[i], REG_EXTENDED | REG_NOSUB);
        if (r != 0) {
            char why[128];
            regerror(r, &s->re[s->n], why, sizeof(why));
            snprintf(err, errlen, "bad %s pattern '%s': %s", what, pats[i], why);
            return -EINVAL;
        }
        s->n++;
    }
    return 0;
}

static bool re_set_match(const struct re_set *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (regexec(&s->re[i], name, 0, NULL, 0) == 0)
            return true;
    return false;
}

rp_filter_t *rp_filter_new(const struct rp_filter_options *opt, char *err, size_t errlen)
{
    static const struct rp_filter_options defaults = {0};
    if (!opt)
        opt = &defaults;
    if (errlen)
        err[0] = '\0';
    struct rp_filter *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    hp_map_init(&f->names, sizeof(uint32_t));
    hp_map_init(&f->inlined, sizeof(struct inlined_info));
    f->full_stacks = opt->full_stacks;
    size_t n_wrappers = 0;
    while (rp_filter_default_wrappers[n_wrappers])
        n_wrappers++;
    const char *const entry[] = {entry_pattern};
    if (re_set_add(&f->hide, opt->hide, opt->n_hide, "--hide", err, errlen) < 0 ||
        re_set_add(&f->focus, opt->focus, opt->n_focus, "--focus", err, errlen) < 0 ||
        re_set_add(&f->fold, opt->fold, opt->n_fold, "--fold", err, errlen) < 0 ||
        (!opt->no_fold && re_set_add(&f->fold, rp_filter_default_wrappers, n_wrappers, "wrapper",
                                     err, errlen) < 0) ||
        (!opt->full_stacks && re_set_add(&f->entry, entry, 1, "entry", err, errlen) < 0))
        return rp_filter_free(f);
    return f;
}

/* Forgets what was matched (names and frames may be freed and their addresses reused). */
static void forget(struct rp_filter *f)
{
    hp_map_done(&f->names);
    hp_map_done(&f->inlined);
    hp_map_init(&f->names, sizeof(uint32_t));
    hp_map_init(&f->inlined, sizeof(struct inlined_info));
    hp_arena_done(&f->arena);
}

rp_filter_t *rp_filter_free(rp_filter_t *f)
{
    if (!f)
        return NULL;
    re_set_done(&f->hide);
    re_set_done(&f->focus);
    re_set_done(&f->fold);
    re_set_done(&f->entry);
    hp_map_done(&f->names);
    hp_map_done(&f->inlined);
    hp_arena_done(&f->arena);
    free(f->scratch);
    free(f->idx);
    free(f);
    return NULL;
}

/* The M_* flags of a function name. */
static uint32_t match_name(struct rp_filter *f, const char *name)
{
    uint32_t *v;
    if (hp_map_put(&f->names, (uintptr_t)name, (void **)&v) == 0)
        return *v - 1;
    char buf[1024];
    const char *d = !name || !name[0] ? "<unknown>" : rp_demangle(name, buf, sizeof(buf));
    uint32_t m = 0;
    if (re_set_match(&f->hide, d))
        m |= M_HIDE;
    if (re_set_match(&f->focus, d))
        m |= M_FOCUS;
    if (re_set_match(&f->fold, d))
        m |= M_FOLD;
    if (re_set_match(&f->entry, d))
        m |= M_ENTRY;
    if (!f->full_stacks && d == name && !strcmp(name, "main"))
        m |= M_MAIN;
    /* Out of memory (or a full probe) for the cache: the answer is right, only slow. */
    if (v)
        *v = m + 1;
    return m;
}

/* The part of @fr's info that its inlined functions make, from the cache or computed;
 * false when out of memory. */
static bool inlined_info(struct rp_filter *f, const struct rp_trace_frame *fr,
                         struct frame_info *ret)
{
    struct inlined_info *c = hp_map_get(&f->inlined, (uintptr_t)fr->inlined);
    if (c && c->orig == fr->inlined && c->orig_n == fr->n_inlined) {
        *ret = c->fi;
        return true;
    }
    struct frame_info fi = {.inlined = fr->inlined, .n_inlined = fr->n_inlined};
    uint32_t hidden = 0;
    for (uint32_t k = 0; k < fr->n_inlined; k++) {
        uint32_t m = match_name(f, fr->inlined[k].function_name);
        hidden += (m & M_HIDE) != 0;
        if (m & M_FOCUS)
            fi.flags |= M_FOCUS_ANY;
    }
    if (hidden) {
        struct rp_trace_line *kept = NULL;
        if (hidden < fr->n_inlined) {
            kept = hp_arena_alloc(&f->arena, (fr->n_inlined - hidden) * sizeof(*kept));
            if (!kept)
                return false;
        }
        fi.n_inlined = 0;
        for (uint32_t k = 0; k < fr->n_inlined; k++)
            if (!(match_name(f, fr->inlined[k].function_name) & M_HIDE))
                kept[fi.n_inlined++] = fr->inlined[k];
        fi.inlined = kept;
    }
    while (fi.n_inlined_fold < fi.n_inlined &&
           (match_name(f, fi.inlined[fi.n_inlined_fold].function_name) & M_FOLD))
        fi.n_inlined_fold++;
    if (hp_map_put(&f->inlined, (uintptr_t)fr->inlined, (void **)&c) >= 0)
        *c = (struct inlined_info){.orig = fr->inlined, .orig_n = fr->n_inlined, .fi = fi};
    *ret = fi;
    return true;
}

/* What @fr is to the filter; false when out of memory. */
static bool frame_info(struct rp_filter *f, const struct rp_trace_frame *fr, struct frame_info *ret)
{
    struct frame_info fi = {.inlined = fr->inlined};
    if (fr->n_inlined && !inlined_info(f, fr, &fi))
        return false;
    fi.flags |= match_name(f, fr->function_name);
    if (fi.flags & M_FOCUS)
        fi.flags |= M_FOCUS_ANY;
    *ret = fi;
    return true;
}

/* rp_filter_stack() with the kept frames' indices in @f->idx. Returns 1 when kept, 0
 * when focus drops the stack, -ENOMEM. */
static int filter_stack(struct rp_filter *f, const struct rp_trace_frame *frames, size_t n,
                        struct rp_trace_frame *out, size_t *ret_n)
{
    if (hp_grow((void **)&f->scratch, &f->cap_scratch, n, sizeof(*f->scratch)) < 0 ||
        hp_grow((void **)&f->idx, &f->cap_idx, n, sizeof(*f->idx)) < 0)
        return -ENOMEM;
    struct frame_info *fi = f->scratch;
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        if (!frame_info(f, &frames[i], &fi[i]))
            return -ENOMEM;
        any |= fi[i].flags;
    }
    if (f->focus.n && !(any & M_FOCUS_ANY))
        return 0;
    /* The outermost main, else past the entry frames at the root (keeping one). */
    size_t start = 0;
    if (!f->full_stacks) {
        while (start < n && !(fi[start].flags & M_MAIN))
            start++;
        if (start == n)
            for (start = 0; start + 1 < n && (fi[start].flags & M_ENTRY);)
                start++;
    }
    size_t k = 0;
    for (size_t i = start; i < n; i++) {
        if (fi[i].flags & M_HIDE)
            continue;
        out[k] = frames[i];
        out[k].inlined = fi[i].inlined;
        out[k].n_inlined = fi[i].n_inlined;
        f->idx[k++] = i;
    }
    /* Wrappers at the leaf end: whole frames while more remain, then the innermost
     * inlined wrappers of the frame that stays. */
    while (k > 1) {
        const struct frame_info *leaf = &fi[f->idx[k - 1]];
        if (!(leaf->flags & M_FOLD) || leaf->n_inlined_fold != leaf->n_inlined)
            break;
        k--;
    }
    if (k) {
        const struct frame_info *leaf = &fi[f->idx[k - 1]];
        /* (A frame without inlined functions has a NULL list: nothing to cut.) */
        if ((!(leaf->flags & M_FOLD) || k > 1 || leaf->n_inlined_fold < leaf->n_inlined) &&
            leaf->n_inlined_fold) {
            out[k - 1].inlined += leaf->n_inlined_fold;
            out[k - 1].n_inlined -= leaf->n_inlined_fold;
        }
    }
    *ret_n = k;
    return 1;
}

bool rp_filter_stack(rp_filter_t *f, const struct rp_trace_frame *frames, size_t n,
                     struct rp_trace_frame *ret_frames, size_t *ret_n)
{
    size_t k;
    int r = filter_stack(f, frames, n, ret_frames, &k);
    if (r < 0) {
        /* Out of memory: the stack as it is, rather than a wrong cut. */
        memcpy(ret_frames, frames, n * sizeof(*frames));
        *ret_n = n;
        return true;
    }
    if (r > 0)
        *ret_n = k;
    return r > 0;
}

bool rp_filter_is_wrapper(rp_filter_t *f, const char *function_name)
{
    return (match_name(f, function_name) & M_FOLD) != 0;
}

/* ---- a trace rewritten to what a filter keeps ---- */

/* A filtered stack, shared by the callsites of a process that have it. */
struct fstack {
    const struct rp_trace_frame *frames;
    size_t n;
};

struct trace_filter {
    struct rp_filter *f;
    struct hp_arena *arena; /* the trace's */
    uint64_t seed;
    struct hp_idtab tab; /* per process: filtered stacks by content */
    struct fstack *stacks;
    size_t n_stacks, cap_stacks;
    struct rp_trace_frame *buf; /* one filtered stack */
    size_t cap_buf;
};

static bool same_frame(const struct rp_trace_frame *a, const struct rp_trace_frame *b)
{
    /* Strings are interned per trace: equal strings have equal addresses. */
    return a->function_name == b->function_name && a->mapping_path == b->mapping_path &&
           a->rel_pc == b->rel_pc && a->inlined == b->inlined && a->n_inlined == b->n_inlined;
}

static bool fstack_eq(const void *ctx, uint32_t id, const void *key)
{
    const struct trace_filter *tf = ctx;
    const struct fstack *a = &tf->stacks[id], *b = key;
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (!same_frame(&a->frames[i], &b->frames[i]))
            return false;
    return true;
}

static uint64_t fstack_hash(const struct trace_filter *tf, const struct fstack *s)
{
    uint64_t h = hp_hash_keyed(tf->seed, s->n);
    for (size_t i = 0; i < s->n; i++) {
        const struct rp_trace_frame *fr = &s->frames[i];
        h = hp_hash_combine(h, (uintptr_t)fr->function_name ^ fr->rel_pc);
        h = hp_hash_combine(h, (uintptr_t)fr->inlined + fr->n_inlined);
    }
    return h;
}

/* Copies the filtered frames in tf->buf (from @orig) to the trace's arena, with the
 * inlined lists the filter made (its own memory) copied too. */
static const struct rp_trace_frame *keep_frames(struct trace_filter *tf,
                                                const struct rp_trace_frame *orig, size_t n)
{
    const size_t *idx = tf->f->idx;
    bool same = true;
    for (size_t i = 0; i < n && same; i++)
        same = idx[i] == idx[0] + i && same_frame(&tf->buf[i], &orig[idx[i]]);
    if (same)
        return orig + idx[0]; /* cut at the ends only: share the reader's frames */
    struct rp_trace_frame *fr = hp_arena_alloc(tf->arena, n * sizeof(*fr));
    if (!fr)
        return NULL;
    memcpy(fr, tf->buf, n * sizeof(*fr));
    for (size_t i = 0; i < n; i++) {
        const struct rp_trace_frame *o = &orig[idx[i]];
        if (!fr[i].n_inlined ||
            (fr[i].inlined >= o->inlined && fr[i].inlined < o->inlined + o->n_inlined))
            continue;
        struct rp_trace_line *l = hp_arena_alloc(tf->arena, fr[i].n_inlined * sizeof(*l));
        if (!l)
            return NULL;
        memcpy(l, fr[i].inlined, fr[i].n_inlined * sizeof(*l));
        fr[i].inlined = l;
    }
    return fr;
}

/* The id of @c's filtered stack in the process, interned when new; -1 when focus drops
 * it; -ENOMEM. */
static int64_t stack_id(struct trace_filter *tf, const struct rp_trace_callsite *c)
{
    if (hp_grow((void **)&tf->buf, &tf->cap_buf, c->n_frames, sizeof(*tf->buf)) < 0)
        return -ENOMEM;
    size_t n;
    int r = filter_stack(tf->f, c->frames, c->n_frames, tf->buf, &n);
    if (r <= 0)
        return r < 0 ? r : -1;
    struct fstack key = {.frames = tf->buf, .n = n};
    uint64_t h = fstack_hash(tf, &key);
    int64_t id = hp_idtab_find(&tf->tab, h, fstack_eq, tf, &key);
    if (id >= 0)
        return id;
    if (hp_grow((void **)&tf->stacks, &tf->cap_stacks, tf->n_stacks + 1, sizeof(*tf->stacks)) < 0)
        return -ENOMEM;
    key.frames = n ? keep_frames(tf, c->frames, n) : NULL;
    if (n && !key.frames)
        return -ENOMEM;
    if (hp_idtab_add(&tf->tab, h, (uint32_t)tf->n_stacks) < 0)
        return -ENOMEM;
    tf->stacks[tf->n_stacks] = key;
    return (int64_t)tf->n_stacks++;
}

static void add_values(struct rp_trace_callsite *d, const struct rp_trace_callsite *c)
{
    d->self_allocated += c->self_allocated;
    d->self_freed += c->self_freed;
    d->alloc_count += c->alloc_count;
    d->free_count += c->free_count;
    d->self_max += c->self_max;
    d->self_max_count += c->self_max_count;
}

/* The callsites @cs[0..@n) filtered and merged, in a new array (*@ret_n of them);
 * NULL when out of memory. */
static struct rp_trace_callsite *filter_callsites(struct trace_filter *tf,
                                                  const struct rp_trace_callsite *cs, size_t n,
                                                  size_t *ret_n)
{
    struct rp_trace_callsite *out = malloc((n ? n : 1) * sizeof(*out));
    /* Estimated counts: a callsite without one stands for its sampled count; the sum
     * keeps "no estimate" (0) only when none had one. */
    uint64_t *est = calloc(n ? n : 1, sizeof(*est));
    struct hp_map where; /* stack id -> index in out */
    hp_map_init(&where, sizeof(size_t));
    size_t k = 0;
    if (!out || !est)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        const struct rp_trace_callsite *c = &cs[i];
        int64_t id = stack_id(tf, c);
        if (id == -1)
            continue;
        size_t *at;
        int r = id < 0 ? (int)id : hp_map_put(&where, (uint64_t)id, (void **)&at);
        if (r < 0)
            goto oom;
        if (r == 1) {
            *at = k++;
            out[*at] = (struct rp_trace_callsite){.callstack_id = (uint64_t)id + 1,
                                                  .n_frames = tf->stacks[id].n,
                                                  .frames = tf->stacks[id].frames};
        }
        add_values(&out[*at], c);
        est[*at] += c->est_alloc_count ? c->est_alloc_count : c->alloc_count;
        if (c->est_alloc_count)
            out[*at].est_alloc_count = 1; /* marks "has one"; set below */
    }
    for (size_t i = 0; i < k; i++)
        if (out[i].est_alloc_count)
            out[i].est_alloc_count = est[i];
    hp_map_done(&where);
    free(est);
    *ret_n = k;
    return out;
oom:
    hp_map_done(&where);
    free(est);
    free(out);
    return NULL;
}

/* Filters process @p's callsites and dumps. */
static int filter_process(struct trace_filter *tf, struct rp_trace_process *p)
{
    tf->n_stacks = 0;
    hp_idtab_done(&tf->tab);
    hp_idtab_init(&tf->tab);
    struct rp_trace_dump *dumps = (struct rp_trace_dump *)p->dumps;
    if (!dumps) {
        size_t n;
        struct rp_trace_callsite *cs = filter_callsites(tf, p->callsites, p->n_callsites, &n);
        if (!cs)
            return -ENOMEM;
        free(p->callsites);
        p->callsites = cs;
        p->n_callsites = n;
        return 0;
    }
    for (uint32_t d = 0; d < p->n_dumps; d++) {
        size_t n;
        struct rp_trace_callsite *cs =
            filter_callsites(tf, dumps[d].callsites, dumps[d].n_callsites, &n);
        if (!cs)
            return -ENOMEM;
        if (p->callsites == dumps[d].callsites) {
            p->callsites = cs;
            p->n_callsites = n;
        }
        free(dumps[d].callsites);
        dumps[d].callsites = cs;
        dumps[d].n_callsites = n;
    }
    return 0;
}

int rp_trace_filter(struct rp_trace *t, rp_filter_t *f)
{
    struct trace_priv *tp = (struct trace_priv *)t;
    struct trace_filter tf = {.f = f, .arena = &tp->arena, .seed = hp_hash_seed()};
    hp_idtab_init(&tf.tab);
    /* Addresses matched before may belong to a trace since freed. */
    forget(f);
    int r = 0;
    for (size_t i = 0; i < t->n_processes && r == 0; i++)
        r = filter_process(&tf, &t->processes[i]);
    forget(f);
    hp_idtab_done(&tf.tab);
    free(tf.stacks);
    free(tf.buf);
    return r;
}
