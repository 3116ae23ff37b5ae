/* tests/e2e/test_report_views.c: what `heapprof report` shows first and the views beside
 * it, on real traces: the header and the function top against the per-site numbers and
 * the program's exact counts (cpp_sites recorded with -i 1), --folded totals against the
 * report's per value kind, allocator wrappers folded (operator new) and entry frames cut,
 * --hide and --focus (in `heapprof pprof` too), a bad pattern, --diff's units, and a
 * trace of 21 processes (forker 20, sampled at 4096 with --seed 3) that stays short at
 * --top 3. No statistics: every comparison is exact. */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/format.h"
#include "tests/e2e/e2e_util.h"

static char *g_cpp, *g_fork;
static struct e2e_truth g_truth[E2E_MAX_TRUTH];
static size_t g_n_truth;

static int record(char *const *prog, bool follow_fork, char *trace, char **ret_out)
{
    char *argv[16] = {(char *)e2e_env("HEAPPROF_BIN"), "record", "-q", "--seed", "3", "-o", trace};
    size_t n = 7;
    if (follow_fork)
        argv[n++] = "--follow-fork";
    else {
        argv[n++] = "-i";
        argv[n++] = "1";
    }
    argv[n++] = "--";
    for (; *prog; prog++)
        argv[n++] = *prog;
    argv[n] = NULL;
    struct e2e_run run;
    if (e2e_run(argv, NULL, &run) < 0)
        return -1;
    int ok = run.status == 0;
    if (ret_out)
        *ret_out = strdup(run.out);
    e2e_run_free(&run);
    return ok ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    g_cpp = e2e_tmp_path(".pftrace");
    g_fork = e2e_tmp_path(".pftrace");
    char *out = NULL;
    if (record((char *[]){(char *)e2e_env("CPP_SITES"), NULL}, false, g_cpp, &out) < 0 ||
        record((char *[]){(char *)e2e_env("FORKER"), "20", NULL}, true, g_fork, NULL) < 0)
        return -1;
    g_n_truth = e2e_parse_truth(out, g_truth, E2E_MAX_TRUTH);
    free(out);
    return g_n_truth == 3 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_cpp);
    unlink(g_fork);
    free(g_cpp);
    free(g_fork);
    return 0;
}

/* `heapprof report` with up to 6 arguments. */
static struct e2e_run report(const char *a1, const char *a2, const char *a3, const char *a4,
                             const char *a5, const char *a6)
{
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "report",
                    (char *)a1,
                    (char *)a2,
                    (char *)a3,
                    (char *)a4,
                    (char *)a5,
                    (char *)a6,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    return run;
}

static const struct e2e_truth *truth(const char *name)
{
    for (size_t i = 0; i < g_n_truth; i++)
        if (!strcmp(g_truth[i].name, name))
            return &g_truth[i];
    fail_msg("no truth for %s", name);
    return NULL;
}

/* The sum of the numbers that the first group of @re_text (an extended regular
 * expression) matches in @from, up to @to (NULL: the end). */
static unsigned long long sum_of(const char *from, const char *to, const char *re_text)
{
    regex_t re;
    assert_int_equal(regcomp(&re, re_text, REG_EXTENDED), 0);
    unsigned long long sum = 0;
    regmatch_t m[2];
    for (const char *p = from; (!to || p < to) && regexec(&re, p, 2, m, 0) == 0; p += m[0].rm_eo) {
        if (to && p + m[0].rm_so >= to)
            break;
        sum += strtoull(p + m[1].rm_so, NULL, 10);
    }
    regfree(&re);
    return sum;
}

static const char *fmt(unsigned long long bytes)
{
    static char buf[4][32];
    static int k;
    k = (k + 1) % 4;
    return hp_format_bytes(bytes, buf[k], sizeof(buf[k]));
}

/* The header equals the per-site detail added up: every site listed (--top 100000). */
static void test_views_header_is_the_sites_added_up(void **state)
{
    (void)state;
    struct e2e_run r = report("--top", "100000", "--no-stacks", g_cpp, NULL, NULL);
    assert_int_equal(r.status, 0);
    print_message("%.600s\n", r.out);
    const char *by_unrel = strstr(r.out, "sites by unreleased bytes:");
    const char *by_alloc = strstr(r.out, "sites by allocated bytes:");
    assert_non_null(by_unrel);
    assert_non_null(by_alloc);
    unsigned long long unrel = sum_of(by_unrel, by_alloc, "\\(([0-9]+) bytes\\) unreleased in");
    unsigned long long alloc = sum_of(by_alloc, NULL, "\\(([0-9]+) bytes\\) allocated in");
    unsigned long long samples = sum_of(by_alloc, NULL, "allocated in ([0-9]+) allocations");
    char want[256];
    snprintf(want, sizeof(want), "unreleased at the end %s, allocated %s, %llu samples, 0 drops\n",
             fmt(unrel), fmt(alloc), samples);
    assert_int_equal(strncmp(r.out, "Total over 1 process: ", 22), 0);
    const char *eol = strchr(r.out, '\n');
    const char *got = strstr(r.out, "unreleased at the end");
    assert_true(got && got < eol);
    assert_int_equal(strncmp(got, want, strlen(want)), 0);
    /* One dump without a peak: the peak is that dump's. */
    snprintf(want, sizeof(want), "peak %s at the dump", fmt(unrel));
    assert_non_null(strstr(r.out, want));
    /* The process table as record prints it. */
    assert_non_null(strstr(r.out, "     pid    samples  allocated unreleased  program\n"));
    e2e_run_free(&r);
}

/* The row of @fn in the function table after @from: flat and cum as printed. */
static void fn_row(const char *from, const char *fn, char *flat, char *cum)
{
    char pat[512];
    snprintf(pat, sizeof(pat), "  %s\n", fn);
    const char *at = strstr(from, pat);
    assert_non_null(at);
    const char *bol = at;
    while (bol > from && bol[-1] != '\n')
        bol--;
    char u1[8], u2[8];
    double f, c;
    assert_int_equal(sscanf(bol, "%lf %7s %*s %*s %lf %7s", &f, u1, &c, u2), 4);
    snprintf(flat, 32, !strcmp(u1, "B") ? "%.0f %s" : "%.1f %s", f, u1);
    snprintf(cum, 32, !strcmp(u2, "B") ? "%.0f %s" : "%.1f %s", c, u2);
}

/* make_widgets is where its `new Widget` goes (operator new folded): flat and cum are
 * its exact bytes; make_vector allocates only through inlined std::vector code: flat 0,
 * cum its bytes. */
static void test_views_functions_match_the_truth(void **state)
{
    (void)state;
    struct e2e_run r = report("--top", "60", g_cpp, NULL, NULL, NULL);
    assert_int_equal(r.status, 0);
    const char *unrel = strstr(r.out, "functions by unreleased bytes");
    const char *alloc = strstr(r.out, "functions by allocated bytes");
    assert_non_null(unrel);
    assert_non_null(alloc);
    char flat[32], cum[32];
    const struct e2e_truth *w = truth("make_widgets"), *v = truth("make_vector");
    fn_row(unrel, "heapprof_test::make_widgets(int)", flat, cum);
    assert_string_equal(flat, fmt(w->alloc_bytes - w->free_bytes));
    assert_string_equal(cum, fmt(w->alloc_bytes - w->free_bytes));
    fn_row(alloc, "heapprof_test::make_vector(unsigned long)", flat, cum);
    assert_string_equal(flat, "0 B");
    assert_string_equal(cum, fmt(v->alloc_bytes));
    /* The columns of pprof's -top. */
    assert_non_null(strstr(unrel, "      flat  flat%   sum%        cum   cum%  function\n"));
    assert_null(strstr(r.out, "operator new"));
    e2e_run_free(&r);
}

/* The sum of the values of folded lines, each "stack value"; checks the format. */
static unsigned long long folded_total(const char *text, size_t *ret_lines)
{
    unsigned long long sum = 0;
    size_t n = 0;
    for (const char *l = text; *l; n++) {
        const char *eol = strchr(l, '\n');
        assert_non_null(eol);
        const char *sp = eol;
        while (sp > l && sp[-1] != ' ')
            sp--;
        assert_true(sp > l + 1);
        assert_true(sp < eol);
        sum += strtoull(sp, NULL, 10);
        l = eol + 1;
    }
    *ret_lines = n;
    return sum;
}

/* Per process, the report's totals (and its unreleased counts, per site) are the folded
 * totals of each value kind; with several processes each stack starts at its process. */
static void test_views_folded_totals_are_the_reports(void **state)
{
    (void)state;
    struct e2e_run r = report("--all-processes", "--top", "100000", "--no-stacks", g_fork, NULL);
    assert_int_equal(r.status, 0);
    /* Totals per process; unreleased counts per site (only the table by unreleased
     * bytes says "unreleased in"). */
    unsigned long long want[4] = {
        sum_of(r.out, NULL, "Totals: [^\n]*unreleased [^\n(]*\\(([0-9]+) bytes\\)\n"),
        sum_of(r.out, NULL, "Totals: allocated [^\n(]*\\(([0-9]+) bytes"),
        sum_of(r.out, NULL, "unreleased in ~?([0-9]+)"),
        sum_of(r.out, NULL, "Totals: allocated [^\n(]*\\([0-9]+ bytes, ~?([0-9]+) allocations"),
    };
    assert_true(want[0] > 0 && want[1] > 0 && want[2] > 0 && want[3] > 0);
    e2e_run_free(&r);
    static const char *const kinds[] = {"unreleased", "allocated", "unreleased-count",
                                        "allocated-count"};
    for (int k = 0; k < 4; k++) {
        r = report("--folded", "--value", kinds[k], g_fork, NULL, NULL);
        assert_int_equal(r.status, 0);
        size_t lines;
        unsigned long long got = folded_total(r.out, &lines);
        print_message("  %s: folded %llu, report %llu, %zu lines\n", kinds[k], got, want[k], lines);
        assert_int_equal(got, want[k]);
        assert_true(lines >= 21);
        assert_non_null(strstr(r.out, "forker ("));
        assert_non_null(strstr(r.out, ");main;child_alloc "));
        assert_null(strstr(r.out, "_start"));
        e2e_run_free(&r);
    }
    /* One process: no process frame; --full-stacks keeps the entry frames. */
    r = report("--folded", "--full-stacks", g_cpp, NULL, NULL, NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "\n_start;__libc_start_main;"));
    assert_non_null(strstr(r.out, ";main;heapprof_test::make_widgets(int) 4000000\n"));
    e2e_run_free(&r);
}

/* The leaf line of the site whose exact bytes are @bytes, in a --no-stacks report. */
static char *leaf_of(const char *text, unsigned long long bytes)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "(%llu bytes) unreleased", bytes);
    const char *at = strstr(text, pat);
    assert_non_null(at);
    const char *l = strchr(at, '\n');
    assert_non_null(l);
    l += strspn(l, "\n ");
    return strndup(l, strcspn(l, " \n"));
}

static void test_views_wrappers_hide_focus(void **state)
{
    (void)state;
    const struct e2e_truth *w = truth("make_widgets"), *s = truth("make_strings");
    /* Folded by default: the caller of operator new is the site; below main, nothing. */
    struct e2e_run r = report("--no-stacks", g_cpp, NULL, NULL, NULL, NULL);
    assert_int_equal(r.status, 0);
    char *leaf = leaf_of(r.out, w->alloc_bytes);
    assert_string_equal(leaf, "heapprof_test::make_widgets(int)");
    free(leaf);
    e2e_run_free(&r);
    r = report("--no-fold", "--no-stacks", g_cpp, NULL, NULL, NULL);
    leaf = leaf_of(r.out, w->alloc_bytes);
    assert_string_equal(leaf, "operator");
    free(leaf);
    e2e_run_free(&r);
    r = report(g_cpp, NULL, NULL, NULL, NULL, NULL);
    assert_null(strstr(r.out, "__libc_start_main"));
    e2e_run_free(&r);
    r = report("--full-stacks", g_cpp, NULL, NULL, NULL, NULL);
    assert_non_null(strstr(r.out, "__libc_start_main"));
    e2e_run_free(&r);

    /* --hide: make_widgets' bytes become main's own; nothing else changes. */
    r = report("--hide", "^heapprof_test::make_widgets", "--no-stacks", g_cpp, NULL, NULL);
    assert_int_equal(r.status, 0);
    leaf = leaf_of(r.out, w->alloc_bytes);
    assert_string_equal(leaf, "main");
    free(leaf);
    leaf = leaf_of(r.out, s->alloc_bytes);
    assert_true(strstr(leaf, "basic_string") != NULL);
    free(leaf);
    assert_null(strstr(r.out, "make_widgets"));
    e2e_run_free(&r);

    /* --focus: only make_strings' stack is left, in every view. */
    r = report("--focus", "make_strings", "--focus", "no_such_function", g_cpp, NULL);
    assert_int_equal(r.status, 0);
    char want[128];
    snprintf(want, sizeof(want), "unreleased at the end %s, allocated %s, %llu samples",
             fmt(s->alloc_bytes), fmt(s->alloc_bytes), (unsigned long long)s->alloc_count);
    assert_non_null(strstr(r.out, want));
    assert_null(strstr(r.out, "make_widgets"));
    assert_null(strstr(r.out, "make_vector"));
    e2e_run_free(&r);
    r = report("--folded", "--focus", "make_strings", g_cpp, NULL, NULL);
    size_t lines;
    assert_int_equal(folded_total(r.out, &lines), s->alloc_bytes);
    assert_int_equal(lines, 1);
    e2e_run_free(&r);

    /* A bad pattern: one line, status 1. */
    r = report("--hide", "a(", g_cpp, NULL, NULL, NULL);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "--hide"));
    assert_non_null(strstr(r.err, "'a('"));
    assert_ptr_equal(strchr(r.err, '\n'), r.err + strlen(r.err) - 1);
    assert_string_equal(r.out, "");
    e2e_run_free(&r);
}

/* 21 processes at --top 3: the per-site detail of the 3 largest, the others counted. */
static void test_views_many_processes_stay_short(void **state)
{
    (void)state;
    struct e2e_run r = report("--top", "3", g_fork, NULL, NULL, NULL);
    assert_int_equal(r.status, 0);
    size_t lines = 0;
    for (const char *p = r.out; (p = strchr(p, '\n')); p++)
        lines++;
    print_message("  %zu lines\n", lines);
    assert_true(lines <= 200);
    assert_non_null(strstr(r.out, "Total over 21 processes: "));
    assert_non_null(
        strstr(r.out, "Sites of the 3 processes with the most unreleased bytes (of 21)"));
    assert_non_null(strstr(r.out, "18 more processes not shown in detail: see one with --process "
                                  "PID, or all with --all-processes."));
    int headers = 0;
    for (const char *p = r.out; (p = strstr(p, "\nProcess ")); p++)
        headers++;
    assert_int_equal(headers, 3);
    e2e_run_free(&r);
    r = report("--top", "3", "--all-processes", g_fork, NULL, NULL);
    headers = 0;
    for (const char *p = r.out; (p = strstr(p, "\nProcess ")); p++)
        headers++;
    assert_int_equal(headers, 21);
    e2e_run_free(&r);
}

/* --diff writes amounts as the report does: units and a sign. */
static void test_views_diff_units(void **state)
{
    (void)state;
    struct e2e_run r = report(g_cpp, "--diff", g_fork, "--no-stacks", NULL, NULL);
    print_message("%.800s\n", r.out);
    const struct e2e_truth *w = truth("make_widgets");
    char want[128];
    snprintf(want, sizeof(want), "unreleased +%s (+%llu bytes), allocated +%s (+%llu bytes)",
             fmt(w->alloc_bytes), (unsigned long long)w->alloc_bytes, fmt(w->alloc_bytes),
             (unsigned long long)w->alloc_bytes);
    assert_non_null(strstr(r.out, want));
    e2e_run_free(&r);
}

/* `heapprof pprof --focus`: the profile holds only the stacks kept (its string table
 * names no other function); a bad pattern is refused. */
static void test_views_pprof_focus(void **state)
{
    (void)state;
    char *pp = e2e_tmp_path(".pb.gz");
    char *argv[] = {
        (char *)e2e_env("HEAPPROF_BIN"), "pprof", "--focus", "make_strings", "-o", pp, g_cpp, NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "gzip -dc '%s' | grep -qa make_strings", pp);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "gzip -dc '%s' | grep -qa make_widgets", pp);
    assert_int_not_equal(system(cmd), 0);
    argv[2] = "--hide";
    argv[3] = "a(";
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "bad --hide pattern 'a('"));
    e2e_run_free(&r);
    unlink(pp);
    free(pp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_header_is_the_sites_added_up),
        cmocka_unit_test(test_views_functions_match_the_truth),
        cmocka_unit_test(test_views_folded_totals_are_the_reports),
        cmocka_unit_test(test_views_wrappers_hide_focus),
        cmocka_unit_test(test_views_many_processes_stay_short),
        cmocka_unit_test(test_views_diff_units),
        cmocka_unit_test(test_views_pprof_focus),
    };
    return cmocka_run_group_tests_name("report_views", tests, setup, teardown);
}
