/* tests/report/test_html.c: the page of `heapprof html` (report/html.c) for traces built
 * in memory: strings escaped for a <script> element (hostile names, invalid UTF-8, line
 * separators), the page's structure, and its data read back by Python's json module
 * (tests/report/check_html.py, argv[1]): stacks, inlined frames, values, growth and
 * diff as the report computes them. */
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
#include <sys/wait.h>

#include "report/report.h"
#include "report/report_internal.h"

#define HOSTILE "</script><img src=x onerror=alert(1)>"

static const char *g_checker;

/* ---- a trace in memory ---- */

static const struct rp_trace_line inl[2] = {
    {"inner_inl", "inl.h", 7}, /* innermost */
    {"outer_inl", "inl.h", 3},
};

#define FRAME(name_, pc_, file_, line_)                                                            \
    {                                                                                              \
        .function_name = name_, .mapping_path = "/bin/app", .rel_pc = pc_, .build_id = "",         \
        .file = file_, .line = line_                                                               \
    }

/* main > HOSTILE > leaf (with two inlined functions); main > other; main > (unknown). */
static const struct rp_trace_frame stack_a[] = {
    FRAME("main", 0x10, "app.c", 5),
    FRAME(HOSTILE, 0x20, "app.c", 9),
    {.function_name = "leaf",
     .mapping_path = "/bin/app",
     .rel_pc = 0x30,
     .build_id = "",
     .file = "app.c",
     .line = 12,
     .n_inlined = 2,
     .inlined = inl},
};
static const struct rp_trace_frame stack_b[] = {
    FRAME("main", 0x14, "app.c", 6),
    FRAME("other\xff\xe2\x80\xa8", 0x40, "app.c", 20),
};
static const struct rp_trace_frame stack_c[] = {
    FRAME("main", 0x18, "app.c", 7),
    FRAME("", 0x99, "", 0),
};

static struct rp_trace_callsite site(const struct rp_trace_frame *f, size_t n, uint64_t alloc,
                                     uint64_t freed)
{
    return (struct rp_trace_callsite){.callstack_id = (uintptr_t)f,
                                      .n_frames = n,
                                      .frames = f,
                                      .self_allocated = alloc,
                                      .self_freed = freed,
                                      .alloc_count = alloc / 100,
                                      .free_count = freed / 100};
}

struct fixture {
    struct rp_trace_callsite d[3][3]; /* per dump */
    struct rp_trace_dump dumps[3];
    struct rp_trace_callsite base_sites[2];
    struct rp_trace_process procs[1], base_procs[1];
    struct rp_trace t, base;
};

/* One process with three dumps: site a grows by 1000 bytes per dump (leaked), b
 * allocates and frees, c stays at 500. The base: a at 1000, b freed. */
static void fixture_init(struct fixture *fx)
{
    memset(fx, 0, sizeof(*fx));
    for (int i = 0; i < 3; i++) {
        fx->d[i][0] = site(stack_a, 3, 1000u * (i + 1), 0);
        fx->d[i][1] = site(stack_b, 2, 4000, 4000);
        fx->d[i][2] = site(stack_c, 2, 500, 0);
        fx->dumps[i] = (struct rp_trace_dump){.timestamp = 1000000000ull * (i + 1),
                                              .sampling_interval_bytes = 1,
                                              .n_callsites = 3,
                                              .callsites = fx->d[i]};
    }
    fx->procs[0] = (struct rp_trace_process){.pid = 42,
                                             .cmdline = "app --serve",
                                             .heap_name = "libc.malloc",
                                             .sampling_interval_bytes = 1,
                                             .timestamp = 3000000000ull,
                                             .n_dumps = 3,
                                             .selected = true,
                                             .from_startup = true,
                                             .buffer_overran = true,
                                             .heap_samples = 90,
                                             .losses = {.records_dropped = 7},
                                             .n_callsites = 3,
                                             .callsites = fx->d[2],
                                             .dumps = fx->dumps};
    fx->t = (struct rp_trace){.n_processes = 1, .processes = fx->procs, .n_packets = 9};
    fx->base_sites[0] = site(stack_a, 3, 1000, 0);
    fx->base_sites[1] = site(stack_b, 2, 4000, 4000);
    fx->base_procs[0] = fx->procs[0];
    fx->base_procs[0].pid = 41;
    fx->base_procs[0].n_dumps = 1;
    fx->base_procs[0].dumps = NULL;
    fx->base_procs[0].callsites = fx->base_sites;
    fx->base_procs[0].n_callsites = 2;
    fx->base = (struct rp_trace){.n_processes = 1, .processes = fx->base_procs};
}

/* The page of @t (and @base) in a malloc'd string. */
static char *page_of(const struct rp_trace *t, const struct rp_trace *base, int *ret_stacks)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    struct rp_html_options o = {.demangle = true, .title = "t<1>.pftrace", .base_title = "b"};
    *ret_stacks = rp_html_write(out, t, base, &o);
    assert_int_equal(fclose(out), 0);
    return text;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static char *json_of(const char *s, size_t len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&text, &n);
    assert_non_null(out);
    rp__html_json_str(out, s, len);
    assert_int_equal(fclose(out), 0);
    return text;
}

static void expect_json(const char *in, size_t len, const char *want)
{
    char *got = json_of(in, len);
    assert_string_equal(got, want);
    free(got);
}

/* ---- tests ---- */

static void test_html_json_escapes(void **state)
{
    (void)state;
    expect_json(HOSTILE, strlen(HOSTILE),
                "\"\\u003c/script\\u003e\\u003cimg src=x onerror=alert(1)\\u003e\"");
    expect_json("a\"b\\c\n\x01&", 8, "\"a\\\"b\\\\c\\u000a\\u0001\\u0026\"");
    expect_json("x\0y", 3, "\"x\\u0000y\"");
    /* UTF-8 passes; what is not UTF-8 becomes U+FFFD, byte by byte. */
    expect_json("\xc3\xa9\xf0\x9f\x98\x80", 6, "\"\xc3\xa9\xf0\x9f\x98\x80\"");
    expect_json("\xff\xc0\x80ok", 5, "\"\\ufffd\\ufffd\\ufffdok\"");
    expect_json("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");            /* a surrogate */
    expect_json("\xe0\x80\xaf", 3, "\"\\ufffd\\ufffd\\ufffd\"");            /* overlong */
    expect_json("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* > U+10FFFF */
    expect_json("\xe2\x82", 2, "\"\\ufffd\\ufffd\"");                       /* cut short */
    expect_json("\xe2\x80\xa8\xe2\x80\xa9", 6, "\"\\u2028\\u2029\"");
}

/* A hostile name cannot end the data element or reach the page as markup. */
static void test_html_page_structure(void **state)
{
    (void)state;
    struct fixture fx;
    fixture_init(&fx);
    int stacks;
    char *page = page_of(&fx.t, NULL, &stacks);
    assert_int_equal(stacks, 3);
    assert_int_equal(count(page, "<script"), 2);
    assert_int_equal(count(page, "</script>"), 2);
    assert_null(strstr(page, "<img"));
    assert_non_null(strstr(page, "<title>heapprof: t&lt;1&gt;.pftrace</title>"));
    assert_non_null(strstr(page, "Content-Security-Policy"));
    assert_non_null(strstr(page, "script-src 'sha256-"));
    const char *data = strstr(page, "id=\"hp-data\">");
    assert_non_null(data);
    data += strlen("id=\"hp-data\">");
    const char *end = strstr(data, "</script>");
    assert_non_null(end);
    assert_null(memchr(data, '<', (size_t)(end - data)));
    assert_null(memchr(data, '>', (size_t)(end - data)));
    assert_non_null(
        strstr(data, "\"\\u003c/script\\u003e\\u003cimg src=x onerror=alert(1)\\u003e\""));
    free(page);
}

/* Runs check_html.py on @page with the case @what: its exit status. */
static int check(const char *page, const char *what)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "python3 '%s' %s", g_checker, what);
    FILE *p = popen(cmd, "w");
    assert_non_null(p);
    fputs(page, p);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_html_data_reads_back(void **state)
{
    (void)state;
    struct fixture fx;
    fixture_init(&fx);
    int stacks;
    char *page = page_of(&fx.t, NULL, &stacks);
    assert_int_equal(check(page, "growth"), 0);
    free(page);
}

static void test_html_diff_reads_back(void **state)
{
    (void)state;
    struct fixture fx;
    fixture_init(&fx);
    int stacks;
    char *page = page_of(&fx.t, &fx.base, &stacks);
    assert_int_equal(check(page, "diff"), 0);
    /* The checker can fail: a page without the diff does not pass as one. */
    free(page);
    page = page_of(&fx.t, NULL, &stacks);
    assert_int_not_equal(check(page, "diff"), 0);
    free(page);
}

/* A process read without every dump (no dumps array) shows its selected one; one
 * without a complete dump shows none. */
static void test_html_single_dump_and_empty(void **state)
{
    (void)state;
    struct fixture fx;
    fixture_init(&fx);
    struct rp_trace_process procs[2] = {fx.procs[0], {.pid = 7, .cmdline = "", .heap_name = ""}};
    procs[0].dumps = NULL;
    procs[0].n_dumps = 3;
    struct rp_trace t = {.n_processes = 2, .processes = procs};
    int stacks;
    char *page = page_of(&t, NULL, &stacks);
    assert_int_equal(stacks, 3);
    assert_int_equal(check(page, "single"), 0);
    free(page);
    struct rp_trace empty = {0};
    page = page_of(&empty, NULL, &stacks);
    assert_int_equal(stacks, 0);
    assert_non_null(strstr(page, "\"processes\":[]"));
    free(page);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_html CHECK_HTML_PY\n");
        return 2;
    }
    g_checker = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_html_json_escapes),
        cmocka_unit_test(test_html_page_structure),
        cmocka_unit_test(test_html_data_reads_back),
        cmocka_unit_test(test_html_diff_reads_back),
        cmocka_unit_test(test_html_single_dump_and_empty),
    };
    return cmocka_run_group_tests_name("report_html", tests, NULL, NULL);
}
