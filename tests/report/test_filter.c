/* tests/report/test_filter.c: the stack filter (report/filter.c): entry frames cut,
 * allocator wrappers folded (inlined ones too), --hide, --focus, bad patterns, and a
 * trace rewritten with equal filtered stacks merged; the summary's peak over dumps of
 * several processes (report/overview.c), which the filter must not change. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "report/report.h"

#define MAX 16

/* Frames named @names[0..n) (root first, NULL-terminated), each at its own pc. */
static size_t make_stack(const char *const *names, struct rp_trace_frame *fr)
{
    size_t n = 0;
    for (; names[n]; n++)
        fr[n] = (struct rp_trace_frame){
            .function_name = names[n], .mapping_path = "/bin/x", .rel_pc = 0x100 + n};
    return n;
}

/* The names of what @f keeps of the stack @names, joined by ';' ("DROPPED" when focus
 * drops it). */
static const char *kept(rp_filter_t *f, const char *const *names)
{
    static char out[1024];
    struct rp_trace_frame fr[MAX], res[MAX];
    size_t n = make_stack(names, fr), k = 99;
    if (!rp_filter_stack(f, fr, n, res, &k))
        return "DROPPED";
    out[0] = '\0';
    for (size_t i = 0; i < k; i++)
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%s", i ? ";" : "",
                 res[i].function_name);
    return out;
}

static rp_filter_t *new_filter(const struct rp_filter_options *o)
{
    char err[256];
    rp_filter_t *f = rp_filter_new(o, err, sizeof(err));
    if (!f)
        fail_msg("rp_filter_new: %s", err);
    return f;
}

#define STACK(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_filter_defaults_cut_entry_and_fold_wrappers(void **state)
{
    (void)state;
    rp_filter_t *f = new_filter(NULL);
    /* _Znwm is operator new(unsigned long): matched demangled. */
    assert_string_equal(
        kept(f, STACK("_start", "__libc_start_main", "main", "foo", "_Znwm", "malloc")),
        "main;foo");
    assert_string_equal(kept(f, STACK("clone3", "start_thread", "worker", "g_malloc0")), "worker");
    /* Without main, only the entry frames at the root go. */
    assert_string_equal(kept(f, STACK("_start", "other", "start_thread", "x")),
                        "other;start_thread;x");
    /* Wrappers only in the middle stay: the fold is at the leaf end. */
    assert_string_equal(kept(f, STACK("main", "malloc", "cb")), "main;malloc;cb");
    /* A stack of wrappers keeps its outermost one. */
    assert_string_equal(kept(f, STACK("g_malloc", "malloc")), "g_malloc");
    assert_string_equal(kept(f, STACK("__rust_alloc", "alloc::raw_vec::finish_grow")),
                        "__rust_alloc");
    assert_string_equal(kept(f, STACK("main", "f", "alloc::alloc::alloc::h0123", "__rust_alloc")),
                        "main;f");
    /* Not a wrapper: names that only contain one. */
    assert_string_equal(kept(f, STACK("main", "my_malloc")), "main;my_malloc");
    assert_true(rp_filter_is_wrapper(f, "_Znam")); /* operator new[] */
    assert_true(rp_filter_is_wrapper(f, "PyMem_Malloc"));
    assert_false(rp_filter_is_wrapper(f, "main"));
    rp_filter_free(f);
}

static void test_filter_no_fold_and_full_stacks_keep_all(void **state)
{
    (void)state;
    rp_filter_t *f = new_filter(&(struct rp_filter_options){.no_fold = true, .full_stacks = true});
    assert_string_equal(kept(f, STACK("_start", "main", "foo", "_Znwm")), "_start;main;foo;_Znwm");
    assert_false(rp_filter_is_wrapper(f, "malloc"));
    rp_filter_free(f);
    /* --fold still applies without the defaults. */
    const char *fold[] = {"^zmalloc$"};
    f = new_filter(&(struct rp_filter_options){.fold = fold, .n_fold = 1, .no_fold = true});
    assert_string_equal(kept(f, STACK("main", "foo", "zmalloc")), "main;foo");
    assert_string_equal(kept(f, STACK("main", "foo", "malloc")), "main;foo;malloc");
    rp_filter_free(f);
}

static void test_filter_hide_merges_into_caller(void **state)
{
    (void)state;
    const char *hide[] = {"^mid", "^x$"};
    rp_filter_t *f = new_filter(&(struct rp_filter_options){.hide = hide, .n_hide = 2});
    assert_string_equal(kept(f, STACK("main", "mid1", "mid2", "leaf")), "main;leaf");
    assert_string_equal(kept(f, STACK("main", "x", "xx")), "main;xx");
    /* Hiding the leaf makes its caller the site; hiding all leaves nothing. */
    assert_string_equal(kept(f, STACK("main", "leaf", "mid")), "main;leaf");
    assert_string_equal(kept(f, STACK("mid", "x")), "");
    rp_filter_free(f);
}

static void test_filter_focus_keeps_matching_stacks(void **state)
{
    (void)state;
    const char *focus[] = {"^parse_", "^load$"};
    rp_filter_t *f = new_filter(&(struct rp_filter_options){.focus = focus, .n_focus = 2});
    assert_string_equal(kept(f, STACK("main", "parse_x", "leaf")), "main;parse_x;leaf");
    assert_string_equal(kept(f, STACK("main", "load", "malloc")), "main;load");
    assert_string_equal(kept(f, STACK("main", "loader")), "DROPPED");
    /* Focus looks at every frame, the cut and folded ones too. */
    assert_string_equal(kept(f, STACK("load", "main", "x")), "main;x");
    rp_filter_free(f);
}

static void test_filter_inlined_functions(void **state)
{
    (void)state;
    /* main calls vector::push_back inlined, which calls the allocator inlined, which
     * calls operator new (a frame of its own). Inlined lists are innermost first. */
    const struct rp_trace_line inl[] = {
        {"_ZNSt15__new_allocatorIiE8allocateEmPKv", "new_allocator.h", 137},
        {"hidden_helper", "h.h", 5},
        {"push_back_like", "vec.h", 10},
    };
    struct rp_trace_frame fr[2] = {
        {.function_name = "main", .rel_pc = 1, .inlined = inl, .n_inlined = 3},
        {.function_name = "_Znwm", .rel_pc = 2},
    };
    struct rp_trace_frame res[2];
    size_t k;
    rp_filter_t *f = new_filter(NULL);
    assert_true(rp_filter_stack(f, fr, 2, res, &k));
    assert_int_equal(k, 1);
    assert_string_equal(res[0].function_name, "main");
    assert_int_equal(res[0].n_inlined, 2);
    assert_string_equal(res[0].inlined[0].function_name, "hidden_helper");
    assert_ptr_equal(fr[0].inlined, inl); /* the input is left alone */
    rp_filter_free(f);

    const char *hide[] = {"hidden_helper"}, *focus[] = {"push_back"};
    f = new_filter(&(struct rp_filter_options){
        .hide = hide, .n_hide = 1, .focus = focus, .n_focus = 1, .no_fold = true});
    assert_true(rp_filter_stack(f, fr, 2, res, &k));
    assert_int_equal(k, 2);
    assert_int_equal(res[0].n_inlined, 2);
    assert_string_equal(res[0].inlined[0].function_name, inl[0].function_name);
    assert_string_equal(res[0].inlined[1].function_name, "push_back_like");
    rp_filter_free(f);
}

static void test_filter_bad_pattern_is_one_line(void **state)
{
    (void)state;
    char err[256];
    const char *bad[] = {"ok", "a(b"};
    assert_null(
        rp_filter_new(&(struct rp_filter_options){.focus = bad, .n_focus = 2}, err, sizeof(err)));
    assert_non_null(strstr(err, "--focus"));
    assert_non_null(strstr(err, "'a(b'"));
    assert_null(strchr(err, '\n'));
}

/* Two sites that differ only in the wrapper's pc merge; a third stays apart; the
 * estimate of counts survives the merge. */
static void test_filter_trace_merges_equal_stacks(void **state)
{
    (void)state;
    static const struct hp_mapping lib = {.start = 0x1000, .end = 0x9000, .path = "/bin/app"};
    int fd = memfd_create("trace", MFD_CLOEXEC);
    assert_true(fd >= 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
    assert_int_equal(bk_process_start(bk, 7, "app", 3, true, 1), 0);
    struct hp_frame a[] = {{&lib, "malloc", 0x10}, {&lib, "foo", 0x20}, {&lib, "main", 0x30}};
    struct hp_frame b[] = {{&lib, "malloc", 0x11}, {&lib, "foo", 0x20}, {&lib, "main", 0x30}};
    struct hp_frame c[] = {{&lib, "bar", 0x40}, {&lib, "main", 0x31}};
    bk_record_alloc(bk, 7, 0, 1, 0x100, 100, 100, a, 3);
    bk_record_alloc(bk, 7, 0, 2, 0x200, 50, 50, b, 3);
    bk_record_alloc(bk, 7, 0, 3, 0x300, 7, 7, c, 2);
    assert_int_equal(bk_dump_all(bk), 0);
    bk_free(bk);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(path, NULL, &t), 0);
    assert_int_equal(t->n_processes, 1);
    assert_int_equal(t->processes[0].n_callsites, 3);
    rp_filter_t *f = new_filter(NULL);
    assert_int_equal(rp_trace_filter(t, f), 0);
    const struct rp_trace_process *p = &t->processes[0];
    assert_int_equal(p->n_callsites, 2);
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *s = &p->callsites[i];
        total += s->self_allocated;
        if (s->self_allocated == 150) {
            assert_int_equal(s->alloc_count, 2);
            assert_int_equal(s->n_frames, 2);
            assert_string_equal(s->frames[1].function_name, "foo");
        } else {
            assert_int_equal(s->self_allocated, 7);
            assert_string_equal(s->frames[s->n_frames - 1].function_name, "bar");
        }
    }
    assert_int_equal(total, 157);
    /* A second filter on the filtered trace: focus drops the other site. */
    rp_filter_free(f);
    const char *focus[] = {"^bar$"};
    f = new_filter(&(struct rp_filter_options){.focus = focus, .n_focus = 1});
    assert_int_equal(rp_trace_filter(t, f), 0);
    assert_int_equal(t->processes[0].n_callsites, 1);
    assert_int_equal(t->processes[0].callsites[0].self_allocated, 7);
    rp_filter_free(f);
    rp_trace_free(t);
    close(fd);
}

/* Two processes dumped together twice: 1000 bytes in pid 1 at the first dump, freed by
 * the second, when pid 2 holds 300. The peak is the first dump's sum, not the end's. */
static void test_filter_summary_peak_over_dumps(void **state)
{
    (void)state;
    static const struct hp_mapping lib = {.start = 0x1000, .end = 0x9000, .path = "/bin/app"};
    int fd = memfd_create("trace", MFD_CLOEXEC);
    assert_true(fd >= 0);
    bk_t *bk;
    assert_int_equal(bk_new(&(struct bk_config){.out_fd = fd}, &bk), 0);
    assert_int_equal(bk_process_start(bk, 1, "one", 3, true, 1), 0);
    assert_int_equal(bk_process_start(bk, 2, "two", 3, true, 1), 0);
    struct hp_frame a[] = {{&lib, "a", 0x10}, {&lib, "main", 0x30}};
    bk_record_alloc(bk, 1, 0, 1, 0x100, 1000, 1000, a, 2);
    assert_int_equal(bk_dump_all(bk), 0);
    bk_record_free(bk, 1, 0, 2, 0x100);
    bk_record_alloc(bk, 2, 0, 1, 0x100, 300, 300, a, 2);
    assert_int_equal(bk_dump_all(bk), 0);
    bk_free(bk);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(path, NULL, &t), 0);
    assert_int_equal(t->n_processes, 2);
    assert_int_equal(t->processes[0].n_dumps, 2);
    assert_int_equal(t->processes[0].dump_totals[0].unreleased_bytes, 1000);
    assert_int_equal(t->processes[0].dump_totals[1].unreleased_bytes, 0);
    rp_filter_t *f = new_filter(NULL);
    assert_int_equal(rp_trace_filter(t, f), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    rp_report_print(out, t, &(struct rp_report_options){.top_n = 3, .summary = true});
    fclose(out);
    assert_non_null(strstr(text, "Total over 2 processes: peak 1000 B at a dump "));
    assert_non_null(strstr(text, "; unreleased at the end 300 B, allocated 1.3 KiB, 2 samples, "
                                 "0 drops\n"));
    free(text);
    rp_filter_free(f);
    rp_trace_free(t);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_defaults_cut_entry_and_fold_wrappers),
        cmocka_unit_test(test_filter_no_fold_and_full_stacks_keep_all),
        cmocka_unit_test(test_filter_hide_merges_into_caller),
        cmocka_unit_test(test_filter_focus_keeps_matching_stacks),
        cmocka_unit_test(test_filter_inlined_functions),
        cmocka_unit_test(test_filter_bad_pattern_is_one_line),
        cmocka_unit_test(test_filter_trace_merges_equal_stacks),
        cmocka_unit_test(test_filter_summary_peak_over_dumps),
    };
    return cmocka_run_group_tests_name("report_filter", tests, NULL, NULL);
}
