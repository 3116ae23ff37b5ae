/* tests/e2e/test_html.c: `heapprof html` as a user sees it. Real programs recorded
 * exactly (-i 1), their pages opened from disk in headless Chromium with the network off
 * (tests/e2e/html_probe.py drives it over the DevTools protocol): the known sites with
 * their exact bytes, a click that zooms, a search whose sum is a site's bytes, a hide,
 * the heap over time of continuous dumps against the report's figures, a site of the
 * growth ranking opening its stack, the diff of two runs, names made of markup shown as
 * text, a screenshot that is not blank and no console error anywhere. And the command's
 * errors: a missing file, not a trace, an output that cannot be written.
 *
 * Skipped (with a message) when Chromium is not installed; scripts/install-deps.sh
 * installs it. Runs in the main build only (suite no-asan): a browser under a sanitized
 * build proves nothing more. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

#define PROBE_SKIPPED 77

/* Small helpers the page's checks use, defined in the page first. */
static const char helpers[] =
    "helpers=(window.T = {"
    " boxes: () => Array.from(document.querySelectorAll('#hp-flame .f')),"
    " box: n => T.boxes().find(e => e.textContent === n),"
    " val: n => { const b = T.box(n); return b ? +b.dataset.v : 0; },"
    " top: n => { const b = T.box(n); return b ? parseFloat(b.style.top) : -1; },"
    " width: n => { const b = T.box(n); return b ? b.getBoundingClientRect().width : 0; },"
    " set: (id, v) => { const e = document.getElementById(id); e.value = v;"
    "   e.dispatchEvent(new Event('change')); return 1; },"
    " matched: () => { const m = document.getElementById('hp-match-sum');"
    "   return m ? +m.dataset.v : -1; } }, 1)";

static char *g_trace; /* three_sites 1, exact */
static char *g_page;  /* its page */
static struct e2e_truth g_truth[E2E_MAX_TRUTH];
static size_t g_n_truth;

static const struct e2e_truth *truth(const char *name)
{
    for (size_t i = 0; i < g_n_truth; i++)
        if (!strcmp(g_truth[i].name, name))
            return &g_truth[i];
    fail_msg("no truth for %s", name);
    return NULL;
}

/* Records @prog (with @arg and @arg2, may be NULL) exactly into a new trace; its output
 * in @ret_out (may be NULL). Extra record options @opt1 @opt2 (may be NULL). */
static char *record(const char *prog, const char *arg, const char *arg2, const char *opt1,
                    const char *opt2, char **ret_out)
{
    char *trace = e2e_tmp_path(".pftrace");
    const char *argv[16];
    size_t n = 0;
    argv[n++] = e2e_env("HEAPPROF_BIN");
    argv[n++] = "record";
    argv[n++] = "-q";
    argv[n++] = "-i";
    argv[n++] = "1";
    if (opt1)
        argv[n++] = opt1;
    if (opt2)
        argv[n++] = opt2;
    argv[n++] = "-o";
    argv[n++] = trace;
    argv[n++] = "--";
    argv[n++] = prog;
    if (arg)
        argv[n++] = arg;
    if (arg2)
        argv[n++] = arg2;
    argv[n] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run((char *const *)argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    if (ret_out)
        *ret_out = strdup(run.out);
    e2e_run_free(&run);
    return trace;
}

/* `heapprof html @trace -o @page` (plus @extra1 @extra2): must succeed. */
static void html(const char *trace, const char *page, const char *extra1, const char *extra2)
{
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "html",
                    (char *)trace,
                    "-o",
                    (char *)page,
                    (char *)extra1,
                    (char *)extra2,
                    NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    if (run.status != 0)
        print_message("heapprof html: %s", run.err);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.out, "wrote "));
    e2e_run_free(&run);
}

/* Runs the probe @script (html_probe.py: Chromium; html_probe_firefox.py: Firefox) on
 * @page with @exprs (NULL-terminated "NAME=EXPR"s); its output. Skips the test when the
 * browser is missing. */
static char *probe_in(const char *script, const char *page, bool screenshot,
                      const char *const *exprs)
{
    const char *argv[64];
    size_t n = 0;
    argv[n++] = "python3";
    argv[n++] = script;
    argv[n++] = page;
    if (screenshot)
        argv[n++] = "--screenshot";
    argv[n++] = helpers;
    for (size_t i = 0; exprs[i] && n < 62; i++)
        argv[n++] = exprs[i];
    argv[n] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run((char *const *)argv, NULL, &run), 0);
    if (run.status == PROBE_SKIPPED) {
        print_message("%s", run.out);
        e2e_run_free(&run);
        skip();
    }
    if (run.status != 0)
        print_message("probe: %s%s", run.out, run.err);
    assert_int_equal(run.status, 0);
    char *out = strdup(run.out);
    e2e_run_free(&run);
    /* No console error, exception or error log entry, whatever the checks below. */
    const char *err = strstr(out, "\nerror ");
    if (err || !strncmp(out, "error ", 6))
        fail_msg("the page logged errors:\n%s", out);
    assert_non_null(strstr(out, "\ndone\n"));
    return out;
}

static char *probe(const char *page, bool screenshot, const char *const *exprs)
{
    return probe_in(e2e_env("HTML_PROBE"), page, screenshot, exprs);
}

/* The value printed for @name (its JSON text), as a number; fails when missing. */
static double num(const char *out, const char *name)
{
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("probe printed no %s:\n%s", name, out);
    char *end;
    double v = strtod(p + strlen(key), &end);
    if (end == p + strlen(key))
        fail_msg("%s is not a number:\n%s", name, out);
    return v;
}

/* The string printed for @name (a JSON string, unescaped only for plain text). */
static void str(const char *out, const char *name, char *buf, size_t len)
{
    char key[128];
    snprintf(key, sizeof(key), "\n%s \"", name);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("probe printed no string %s:\n%s", name, out);
    p += strlen(key);
    size_t n = strcspn(p, "\"");
    snprintf(buf, len, "%.*s", (int)n, p);
}

static int setup(void **state)
{
    (void)state;
    char *out;
    g_trace = record(e2e_env("THREE_SITES"), "1", NULL, NULL, NULL, &out);
    g_n_truth = e2e_parse_truth(out, g_truth, E2E_MAX_TRUTH);
    free(out);
    g_page = e2e_tmp_path(".html");
    html(g_trace, g_page, NULL, NULL);
    return g_n_truth == 3 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_trace);
    unlink(g_page);
    free(g_trace);
    free(g_page);
    return 0;
}

/* The sites of three_sites with their exact bytes, unreleased then allocated; a click
 * on main zooms into it (its box spans the graph, the ones above it are its callers,
 * alloc_leaked keeps its share of main's width); a click on the top row zooms out. */
static void test_html_sites_and_zoom(void **state)
{
    (void)state;
    const char *exprs[] = {
        "u_leaked=T.val('alloc_leaked')",
        "u_half=T.val('alloc_half')",
        "u_freed=T.val('alloc_freed')",
        "metric=T.set('hp-metric', 'a')",
        "a_leaked=T.val('alloc_leaked')",
        "a_half=T.val('alloc_half')",
        "a_freed=T.val('alloc_freed')",
        "a_main=T.val('main')",
        "clicked=(T.box('main').click(), 1)",
        "z_root=T.boxes().filter(e => e.classList.contains('anc')).map(e => e.textContent)"
        ".join('>')",
        "z_main_share=T.width('main') / document.getElementById('hp-flame').clientWidth",
        "z_leaked_share=T.width('alloc_leaked') / T.width('main')",
        "z_all_top=T.top('all')",
        "z_main_top=T.top('main')",
        "unzoom=(T.box('all').click(), 1)",
        "u_anc=document.querySelectorAll('#hp-flame .anc').length",
        "u_main_share=T.width('main') / document.getElementById('hp-flame').clientWidth",
        NULL,
    };
    char *out = probe(g_page, true, exprs);
    const struct e2e_truth *lk = truth("alloc_leaked"), *hf = truth("alloc_half"),
                           *fr = truth("alloc_freed");
    assert_int_equal((uint64_t)num(out, "u_leaked"), lk->alloc_bytes - lk->free_bytes);
    assert_int_equal((uint64_t)num(out, "u_half"), hf->alloc_bytes - hf->free_bytes);
    assert_int_equal((uint64_t)num(out, "u_freed"), 0); /* all freed: no box */
    assert_int_equal((uint64_t)num(out, "a_leaked"), lk->alloc_bytes);
    assert_int_equal((uint64_t)num(out, "a_half"), hf->alloc_bytes);
    assert_int_equal((uint64_t)num(out, "a_freed"), fr->alloc_bytes);
    /* Above main: its callers, from the root, one row each. */
    char chain[256];
    str(out, "z_root", chain, sizeof(chain));
    assert_true(!strncmp(chain, "all>_start>", 11));
    size_t callers = 1;
    for (const char *c = chain; (c = strchr(c, '>')); c++)
        callers++;
    assert_true(num(out, "z_main_top") == 18.0 * (double)callers && num(out, "z_all_top") == 0);
    assert_true(fabs(num(out, "z_main_share") - 1.0) < 0.01);
    double share = (double)lk->alloc_bytes / num(out, "a_main");
    assert_true(fabs(num(out, "z_leaked_share") - share) < 0.01);
    assert_int_equal((int)num(out, "u_anc"), 0);
    /* Zoomed out: main is most but not all of the heap (printf's buffer is not in it). */
    assert_true(num(out, "u_main_share") <= 1.0);
    int w, h, colors;
    const char *shot = strstr(out, "\nscreenshot ");
    assert_non_null(shot);
    assert_int_equal(sscanf(shot, "\nscreenshot %d %d %d", &w, &h, &colors), 3);
    print_message("screenshot %dx%d, %d colours\n", w, h, colors);
    assert_true(w > 100 && h > 100 && colors > 20);
    free(out);
}

/* The same page in Firefox (Debian's firefox-esr, driven over Marionette): the sites'
 * exact bytes, the metric switch, a click that zooms into main, a search's sum, a
 * non-blank screenshot, no error. */
static void test_html_firefox(void **state)
{
    (void)state;
    const char *exprs[] = {
        "u_leaked=T.val('alloc_leaked')",
        "u_half=T.val('alloc_half')",
        "metric=T.set('hp-metric', 'a')",
        "a_freed=T.val('alloc_freed')",
        "clicked=(T.box('main').click(), 1)",
        "z_main_share=T.width('main') / document.getElementById('hp-flame').clientWidth",
        NULL,
    };
    char *out = probe_in(e2e_env("HTML_PROBE_FIREFOX"), g_page, true, exprs);
    const struct e2e_truth *lk = truth("alloc_leaked"), *hf = truth("alloc_half"),
                           *fr = truth("alloc_freed");
    assert_int_equal((uint64_t)num(out, "u_leaked"), lk->alloc_bytes - lk->free_bytes);
    assert_int_equal((uint64_t)num(out, "u_half"), hf->alloc_bytes - hf->free_bytes);
    assert_int_equal((uint64_t)num(out, "a_freed"), fr->alloc_bytes);
    assert_true(fabs(num(out, "z_main_share") - 1.0) < 0.01);
    int w, h, colors;
    const char *shot = strstr(out, "\nscreenshot ");
    assert_non_null(shot);
    assert_int_equal(sscanf(shot, "\nscreenshot %d %d %d", &w, &h, &colors), 3);
    print_message("firefox screenshot %dx%d, %d colours\n", w, h, colors);
    assert_true(w > 100 && h > 100 && colors > 20);
    free(out);
}

/* A search sums the bytes of the matching functions; a hide drops a frame and gives its
 * callees to its caller, bytes unchanged; focus keeps the stacks through a frame. */
static void test_html_search_hide_focus(void **state)
{
    (void)state;
    const char *exprs[] = {
        "metric=T.set('hp-metric', 'a')",
        "search=T.set('hp-search', '^alloc_(leaked|half)$')",
        "s_sum=T.matched()",
        "s_boxes=document.querySelectorAll('#hp-flame .match').length",
        "nosearch=T.set('hp-search', '')",
        "n_sum=T.matched()",
        "leaked_top=T.top('alloc_leaked')",
        "hide=T.set('hp-hide', '^main$')",
        "h_main=T.boxes().filter(e => e.textContent === 'main').length",
        "h_leaked=T.val('alloc_leaked')",
        "h_leaked_top=T.top('alloc_leaked')",
        "h_parent=T.top('__libc_start_call_main')",
        "unhide=T.set('hp-hide', '')",
        "focus=T.set('hp-focus', '^alloc_freed$')",
        "f_root=T.val('all')",
        "f_leaked=T.val('alloc_leaked')",
        NULL,
    };
    char *out = probe(g_page, false, exprs);
    const struct e2e_truth *lk = truth("alloc_leaked"), *hf = truth("alloc_half"),
                           *fr = truth("alloc_freed");
    assert_int_equal((uint64_t)num(out, "s_sum"), lk->alloc_bytes + hf->alloc_bytes);
    assert_int_equal((int)num(out, "s_boxes"), 2);
    assert_int_equal((int)num(out, "n_sum"), -1);
    assert_int_equal((int)num(out, "h_main"), 0);
    assert_int_equal((uint64_t)num(out, "h_leaked"), lk->alloc_bytes);
    assert_true(num(out, "h_leaked_top") == num(out, "leaked_top") - 18);
    assert_true(num(out, "h_parent") == num(out, "h_leaked_top") - 18);
    assert_int_equal((uint64_t)num(out, "f_root"), fr->alloc_bytes);
    assert_int_equal((uint64_t)num(out, "f_leaked"), 0);
    free(out);
}

/* Continuous dumps: one point per dump on the chart, each the report's total
 * (rp_growth_compute(), which `report --growth` prints); the leak ranks first and a
 * click on it shows its stack alone, its bytes at the last dump. */
static void test_html_growth_chart(void **state)
{
    (void)state;
    /* worker idle: a leaked block every 100 ms; a dump every 100 ms for 0.8 s. */
    char *trace = record(e2e_env("WORKER"), "idle", "800", "--continuous-dump", "100", NULL);
    char *page = e2e_tmp_path(".html");
    html(trace, page, NULL, NULL);
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){.all_dumps = true}, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "worker");
    assert_non_null(p);
    assert_true(p->n_dumps >= 3);
    struct rp_growth g;
    assert_int_equal(rp_growth_compute(p, &g), 0);
    const char *exprs[] = {
        "points=document.querySelectorAll('#hp-chart circle.pt').length",
        "values=Array.from(document.querySelectorAll('#hp-chart circle.pt'))"
        ".map(c => c.dataset.v).join(',')",
        "first_site=document.querySelector('#hp-growth tbody tr .fn').textContent",
        "open=(document.querySelector('#hp-growth tbody tr').click(), 1)",
        "only=getComputedStyle(document.getElementById('hp-only')).display !== 'none' ? 1 : 0",
        "only_root=T.val('all')",
        "only_leaf=T.val('worker_leak')",
        NULL,
    };
    char *out = probe(page, false, exprs);
    assert_int_equal((size_t)num(out, "points"), p->n_dumps);
    char want[4096] = "", got[4096], *w = want;
    for (size_t i = 0; i < g.n_dumps; i++)
        w += snprintf(w, sizeof(want) - (size_t)(w - want), "%s%.0f", i ? "," : "", g.total[i]);
    str(out, "values", got, sizeof(got));
    assert_string_equal(got, want);
    char site[256];
    str(out, "first_site", site, sizeof(site));
    assert_string_equal(site, "worker_leak");
    assert_int_equal((int)num(out, "only"), 1);
    assert_true(g.n_sites > 0);
    assert_int_equal((uint64_t)num(out, "only_root"), (uint64_t)g.sites[0].last);
    assert_int_equal((uint64_t)num(out, "only_leaf"), (uint64_t)g.sites[0].last);
    print_message("%zu dumps, leak %.0f bytes at the last\n", g.n_dumps, g.sites[0].last);
    rp_growth_done(&g);
    rp_trace_free(t);
    free(out);
    unlink(page);
    unlink(trace);
    free(page);
    free(trace);
}

/* --diff: three_sites 2 against three_sites 1: each site grew by its scale-1 bytes. */
static void test_html_diff(void **state)
{
    (void)state;
    char *trace = record(e2e_env("THREE_SITES"), "2", NULL, NULL, NULL, NULL);
    char *page = e2e_tmp_path(".html");
    html(trace, page, "--diff", g_trace);
    const char *exprs[] = {
        "view=T.set('hp-view', 'diff')",
        "d_leaked=T.val('alloc_leaked')",
        "d_half=T.val('alloc_half')",
        "d_freed=T.val('alloc_freed')",
        "first=document.querySelector('#hp-diff tbody tr .fn').textContent",
        "metric=T.set('hp-metric', 'da')",
        "da_freed=T.val('alloc_freed')",
        NULL,
    };
    char *out = probe(page, false, exprs);
    const struct e2e_truth *lk = truth("alloc_leaked"), *hf = truth("alloc_half"),
                           *fr = truth("alloc_freed");
    assert_int_equal((uint64_t)num(out, "d_leaked"), lk->alloc_bytes - lk->free_bytes);
    assert_int_equal((uint64_t)num(out, "d_half"), hf->alloc_bytes - hf->free_bytes);
    assert_int_equal((uint64_t)num(out, "d_freed"), 0);
    assert_int_equal((uint64_t)num(out, "da_freed"), fr->alloc_bytes);
    char first[128];
    str(out, "first", first, sizeof(first));
    assert_string_equal(first, "alloc_leaked");
    free(out);
    unlink(page);
    unlink(trace);
    free(page);
    free(trace);
}

/* Functions named "</script><img src=x onerror=alert(1)>" and "<!--<script>'&amp;":
 * the file holds no such markup, the page shows the names as text and makes no image. */
static void test_html_hostile_names(void **state)
{
    (void)state;
    char *trace = record(e2e_env("HOSTILE_NAMES"), NULL, NULL, NULL, NULL, NULL);
    char *page = e2e_tmp_path(".html");
    html(trace, page, NULL, NULL);
    char *text = e2e_read_file(page);
    assert_null(strstr(text, "<img"));
    assert_null(strstr(text, "<!--"));
    free(text);
    const char *exprs[] = {
        "tag=T.boxes().filter(e => e.textContent === "
        "'</script><img src=x onerror=alert(1)>').length",
        "comment=T.boxes().filter(e => e.textContent === \"<!--<script>'&amp;\").length",
        "tag_bytes=T.val('</script><img src=x onerror=alert(1)>')",
        "images=document.querySelectorAll('img').length",
        "scripts=document.querySelectorAll('script').length",
        NULL,
    };
    char *out = probe(page, false, exprs);
    assert_int_equal((int)num(out, "tag"), 1);
    assert_int_equal((int)num(out, "comment"), 1);
    assert_int_equal((int)num(out, "tag_bytes"), 1 << 20);
    assert_int_equal((int)num(out, "images"), 0);
    assert_int_equal((int)num(out, "scripts"), 2);
    free(out);
    unlink(page);
    unlink(trace);
    free(page);
    free(trace);
}

static struct e2e_run run_html(const char *a1, const char *a2, const char *a3)
{
    char *argv[] = {
        (char *)e2e_env("HEAPPROF_BIN"), "html", (char *)a1, (char *)a2, (char *)a3, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    return run;
}

static void expect_error(struct e2e_run r, const char *what)
{
    assert_int_equal(r.status, 1);
    assert_string_equal(r.out, "");
    if (!strstr(r.err, what))
        fail_msg("expected '%s' in: %s", what, r.err);
    assert_int_equal(strchr(r.err, '\n') - r.err + 1, (long)strlen(r.err)); /* one line */
    e2e_run_free(&r);
}

/* One line and status 1 for a missing file, a file that is no trace and an output that
 * cannot be written; the default output is the trace's name with .html. */
static void test_html_cli_errors(void **state)
{
    (void)state;
    expect_error(run_html("/nonexistent/x.pftrace", NULL, NULL), "No such file or directory");
    char *junk = e2e_tmp_path(".pftrace");
    FILE *f = fopen(junk, "we");
    assert_non_null(f);
    fputs("this is not a trace, only text\n", f);
    fclose(f);
    expect_error(run_html(junk, NULL, NULL), "not a valid trace file");
    expect_error(run_html(g_trace, "-o", "/nonexistent/dir/out.html"), "cannot write");
    expect_error(run_html(g_trace, "--pid", "1"), "no process with pid 1");
    unlink(junk);
    free(junk);

    struct e2e_run r = run_html(g_trace, NULL, NULL);
    assert_int_equal(r.status, 0);
    char want[4096];
    snprintf(want, sizeof(want), "%.*s.html", (int)(strlen(g_trace) - strlen(".pftrace")), g_trace);
    struct stat st;
    assert_int_equal(stat(want, &st), 0);
    char line[4096 + 64];
    snprintf(line, sizeof(line), "wrote %s (%lld KiB, ", want,
             (long long)(st.st_size + 1023) / 1024);
    assert_non_null(strstr(r.out, line));
    assert_non_null(strstr(r.out, " stacks)\n"));
    e2e_run_free(&r);
    unlink(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_html_cli_errors),    cmocka_unit_test(test_html_sites_and_zoom),
        cmocka_unit_test(test_html_firefox),       cmocka_unit_test(test_html_search_hide_focus),
        cmocka_unit_test(test_html_growth_chart),  cmocka_unit_test(test_html_diff),
        cmocka_unit_test(test_html_hostile_names),
    };
    return cmocka_run_group_tests_name("e2e_html", tests, setup, teardown);
}
