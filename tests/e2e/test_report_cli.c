/* tests/e2e/test_report_cli.c: `heapprof report` and `heapprof pprof` on a real trace,
 * as a user runs them: errors instead of wrong answers, estimated counts against the
 * program's own, every pprof export opened by `go tool pprof` (Debian's golang-go),
 * whose -top, -lines and -sample_index=alloc_objects figures must be the report's,
 * inlined functions in the trace, the report and pprof, and `report --growth` finding a
 * leak over continuous dumps.
 *
 * Statistics: three_sites 10 at the default interval (4096) with --seed 7; alloc_freed
 * makes 30,000 allocations of 2000 bytes. The estimate is checked within 5 standard
 * deviations of the Horvitz-Thompson estimator (sqrt(n w (w - 1)), about 0.7% here): a
 * false failure below 1e-6. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

static char *g_trace;

static int setup(void **state)
{
    (void)state;
    g_trace = e2e_tmp_path(".pftrace");
    /* Waits for room up to 2 s: the estimates below allow no dropped sample, and a
     * sanitizer build of the service beside other load falls behind for longer than the
     * default 100 ms now and then (1 run in 8 beside stress -c 2 under TSan). */
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"),
                    "record",
                    "-q",
                    "--seed",
                    "7",
                    "--block-timeout-us",
                    "2000000",
                    "-o",
                    g_trace,
                    "--",
                    (char *)e2e_env("THREE_SITES"),
                    "10",
                    NULL};
    struct e2e_run run;
    if (e2e_run(argv, NULL, &run) < 0 || run.status != 0)
        return -1;
    e2e_run_free(&run);
    return e2e_check_rules(g_trace) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_trace);
    free(g_trace);
    return 0;
}

static struct e2e_run report(const char *a1, const char *a2, const char *a3)
{
    char *argv[] = {
        (char *)e2e_env("HEAPPROF_BIN"), "report", (char *)a1, (char *)a2, (char *)a3, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    return run;
}

/* User trial E: `--dump 15` of a 14-dump trace, an unknown --process, a truncated trace
 * and a directory gave rc 0 with an empty or partial report, or an odd errno text. */
static void test_report_cli_bug_errors(void **state)
{
    (void)state;
    struct e2e_run r = report(g_trace, "--dump", "99");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "has no dump 99"));
    e2e_run_free(&r);

    r = report(g_trace, "--process", "1");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "no process with pid 1"));
    e2e_run_free(&r);

    r = report("/", NULL, NULL);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "Is a directory"));
    e2e_run_free(&r);

    /* The first 60% of the file: what was read is shown, then one line says where the
     * file ends. */
    char *cut = e2e_tmp_path(".pftrace");
    FILE *in = fopen(g_trace, "rbe"), *out = fopen(cut, "wbe");
    assert_non_null(in);
    assert_non_null(out);
    fseek(in, 0, SEEK_END);
    long size = ftell(in);
    rewind(in);
    for (long i = 0; i < size * 6 / 10; i++)
        fputc(fgetc(in), out);
    fclose(in);
    fclose(out);
    r = report(cut, NULL, NULL);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "is truncated"));
    assert_int_equal(strchr(r.err, '\n') - r.err + 1, (long)strlen(r.err)); /* one line */
    e2e_run_free(&r);
    unlink(cut);
    free(cut);
}

/* User trial finding 9: "disconnected" was printed for every process that exited
 * normally, so it could not flag a lost connection. three_sites exits normally: the
 * trace says disconnected (Perfetto: it ended before the session), the report says
 * nothing of it. */
static void test_report_cli_bug_disconnected_on_normal_exit(void **state)
{
    (void)state;
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(g_trace, NULL, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "three_sites");
    assert_non_null(p);
    assert_true(p->disconnected);
    assert_false(p->connection_lost);
    rp_trace_free(t);
    struct e2e_run r = report(g_trace, NULL, NULL);
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, "isconnected"));
    assert_null(strstr(r.out, "DISCONNECTED"));
    e2e_run_free(&r);
}

/* User trial finding 4: counts were sample counts (~40 k shown for 3.24 M). */
static void test_report_cli_bug_estimated_counts(void **state)
{
    (void)state;
    struct rp_trace *t;
    assert_int_equal(rp_trace_load(g_trace, NULL, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "three_sites");
    assert_non_null(p);
    double est = 0, var = 0;
    uint64_t sampled = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        bool hit = false;
        for (size_t f = 0; f < c->n_frames; f++)
            hit |= !strcmp(c->frames[f].function_name, "alloc_freed");
        if (!hit)
            continue;
        double w = rp_callsite_count_scale(c);
        est += (double)c->alloc_count * w;
        var += (double)c->alloc_count * w * (w - 1);
        sampled += c->alloc_count;
    }
    print_message("alloc_freed: %.0f estimated from %llu samples (truth 30000, sd %.0f)\n", est,
                  (unsigned long long)sampled, sqrt(var));
    assert_true(sampled < 20000); /* sampled: far fewer than the allocations */
    assert_true(fabs(est - 30000) <= 5 * sqrt(var) + 1);
    rp_trace_free(t);
}

/* Runs `go tool pprof -symbolize=none ARGS... FILE`; its stdout (malloc'd). */
static char *go_pprof(const char *file, const char *a1, const char *a2, const char *a3)
{
    char *argv[] = {"go",       "tool",       "pprof", "-symbolize=none", (char *)a1, (char *)a2,
                    (char *)a3, (char *)file, NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    if (r.status != 0)
        fail_msg("go tool pprof %s %s %s: %s", a1, a2, a3, r.err);
    free(r.err);
    return r.out;
}

/* The flat value of the line of -top output that names @fn, or -1. */
static long long flat_of(const char *top, const char *fn)
{
    for (const char *l = top; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *end = strchr(l, '\n');
        size_t n = end ? (size_t)(end - l) : strlen(l);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)n, l);
        char *hit = strstr(line, fn);
        if (hit && (hit[strlen(fn)] == '\0' || hit[strlen(fn)] == ' '))
            return strtoll(line, NULL, 10);
    }
    return -1;
}

/* User trial F and finding 9: File: named the first library, unnamed frames collapsed
 * into one node per module, lines were ":0" without files, and alloc_objects were
 * sample counts. go tool pprof must read each export, and agree with the report. */
static void test_report_cli_pprof_agrees_with_go_tool(void **state)
{
    (void)state;
    struct e2e_run v;
    char *vargv[] = {"go", "version", NULL};
    if (e2e_run(vargv, NULL, &v) < 0 || v.status != 0) {
        print_message("go is not installed (scripts/install-deps.sh installs golang-go)\n");
        e2e_run_free(&v);
        fail();
    }
    e2e_run_free(&v);
    char *prefix = e2e_tmp_path("");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "pprof", "-o", prefix, g_trace, NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    char *file = strtok(r.out, "\n");
    assert_non_null(file);

    struct rp_trace *t;
    assert_int_equal(rp_trace_load(g_trace, NULL, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "three_sites");
    assert_non_null(p);
    /* The report's figures of the sites whose leaf is alloc_freed. */
    unsigned long long bytes = 0, objects = 0;
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *c = &p->callsites[i];
        if (c->n_frames && !strcmp(c->frames[c->n_frames - 1].function_name, "alloc_freed")) {
            bytes += c->self_allocated;
            objects +=
                (unsigned long long)((double)c->alloc_count * rp_callsite_count_scale(c) + 0.5);
        }
    }
    assert_true(bytes > 0);

    char *top = go_pprof(file, "-top", "-sample_index=alloc_space", "-unit=B");
    assert_non_null(strstr(top, "File: three_sites"));
    assert_non_null(strstr(top, "Build ID: "));
    /* The allocator's frames are not in the stacks: alloc_freed is the leaf. */
    assert_int_equal(flat_of(top, "alloc_freed"), (long long)bytes);
    free(top);

    char *objs = go_pprof(file, "-top", "-sample_index=alloc_objects", "-nodecount=50");
    assert_int_equal(flat_of(objs, "alloc_freed"), (long long)objects);
    free(objs);

    /* -lines: source lines of three_sites.c, with the inlined-or-not frames named. */
    char *lines = go_pprof(file, "-top", "-lines", "-sample_index=alloc_space");
    assert_non_null(strstr(lines, "alloc_freed "));
    assert_non_null(strstr(lines, "three_sites.c:"));
    free(lines);

    for (char *f = file; f; f = strtok(NULL, "\n"))
        unlink(f);
    e2e_run_free(&r);
    rp_trace_free(t);
    free(prefix);
}

/* The line of tests/programs/inline_sites.c that holds @marker (1-based). */
static uint32_t marker_line(const char *marker)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/programs/inline_sites.c", e2e_env("SOURCE_ROOT"));
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    char buf[512];
    uint32_t n = 0, found = 0;
    while (!found && fgets(buf, sizeof(buf), f)) {
        n++;
        if (strstr(buf, marker))
            found = n;
    }
    fclose(f);
    assert_true(found > 0);
    return found;
}

/* The AddressSymbols at @from in protoc's text: up to the next one, the next module or
 * the next packet. */
static char *block_at(const char *from)
{
    const char *end = from + strlen(from);
    static const char *const next[] = {"address_symbols {", "module_symbols {", "packet {"};
    for (size_t i = 0; i < 3; i++) {
        const char *e = strstr(from + 1, next[i]);
        if (e && e < end)
            end = e;
    }
    return strndup(from, (size_t)(end - from));
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* --no-source-lines: the same program, its functions named, no file or line anywhere in
 * the report (no debug information was read). */
static void test_report_cli_no_source_lines(void **state)
{
    (void)state;
    char *trace = e2e_tmp_path(".pftrace");
    char *rec[] = {(char *)e2e_env("HEAPPROF_BIN"),
                   "record",
                   "-q",
                   "-i",
                   "1",
                   "--no-source-lines",
                   "-o",
                   trace,
                   "--",
                   (char *)e2e_env("INLINE_SITES"),
                   "500",
                   NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(rec, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    assert_int_equal(e2e_check_rules(trace), 0);
    r = report(trace, NULL, NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "build_table"));
    assert_null(strstr(r.out, "inline_sites.c:"));
    assert_null(strstr(r.out, ".c:"));
    e2e_run_free(&r);
    unlink(trace);
    free(trace);
}

/* Issue 18: a pc in inlined code had one Line, under the caller's name at a line of the
 * inlined function. inline_sites (-O2 -g) allocates in grow_buffer(), inlined into
 * make_record(), inlined into build_table(); at interval 1 every allocation is recorded.
 * The trace must carry the three Lines innermost first (Perfetto's order), the report
 * list them leaf first with file:line, and go tool pprof show the inlined functions. */
static void test_report_cli_inlined_frames(void **state)
{
    (void)state;
    const uint32_t l_malloc = marker_line("@grow_buffer_malloc");
    const uint32_t l_make = marker_line("@make_record_call");
    const uint32_t l_build = marker_line("@build_table_call");
    char *trace = e2e_tmp_path(".pftrace");
    char *rec[] = {(char *)e2e_env("HEAPPROF_BIN"), "record", "-q", "-i", "1", "-o", trace, "--",
                   (char *)e2e_env("INLINE_SITES"), "500",    NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(rec, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    assert_int_equal(e2e_check_rules(trace), 0);

    /* The trace as protoc decodes it: one AddressSymbols with the three Lines. */
    const char *protoc = getenv("PROTOC");
    if (protoc && *protoc) {
        char *cmd;
        assert_true(asprintf(&cmd, "'%s' --decode=perfetto.protos.Trace -I '%s' '%s' < '%s'",
                             protoc, e2e_env("PROTOS_DIR"), e2e_env("TRACE_PROTO"), trace) > 0);
        char *sh[] = {"/bin/sh", "-c", cmd, NULL};
        assert_int_equal(e2e_run(sh, NULL, &r), 0);
        assert_int_equal(r.status, 0);
        const char *inner = strstr(r.out, "function_name: \"grow_buffer\"");
        assert_non_null(inner);
        const char *start = inner;
        while (start > r.out && strncmp(start, "address_symbols {", 17) != 0)
            start--;
        char *block = block_at(start);
        print_message("%s\n", block);
        const char *a = strstr(block, "function_name: \"grow_buffer\"");
        const char *b = strstr(block, "function_name: \"make_record\"");
        const char *c = strstr(block, "function_name: \"build_table\"");
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(c);
        assert_true(a < b && b < c);
        assert_int_equal(count_of(block, "lines {"), 3);
        char want[64];
        snprintf(want, sizeof(want), "line_number: %u", l_malloc);
        assert_true(strstr(a, want) && strstr(a, want) < b);
        snprintf(want, sizeof(want), "line_number: %u", l_make);
        assert_true(strstr(b, want) && strstr(b, want) < c);
        snprintf(want, sizeof(want), "line_number: %u", l_build);
        assert_non_null(strstr(c, want));
        assert_non_null(strstr(block, "inline_sites.c\""));
        free(block);
        e2e_run_free(&r);
        free(cmd);
    }

    /* The report: leaf first, each function with file:line, the inlined ones marked. */
    r = report(trace, NULL, NULL);
    assert_int_equal(r.status, 0);
    char want[3][128];
    const char *fns[3] = {"grow_buffer", "make_record", "build_table"};
    const uint32_t lines[3] = {l_malloc, l_make, l_build};
    const char *at[3];
    /* The per-site detail, after the summary's tables of functions. */
    const char *detail = strstr(r.out, "sites by unreleased bytes");
    assert_non_null(detail);
    for (int i = 0; i < 3; i++) {
        snprintf(want[i], sizeof(want[i]), "inline_sites.c:%u%s", lines[i],
                 i < 2 ? "  (inlined)\n" : "\n");
        const char *fn = strstr(detail, fns[i]);
        assert_non_null(fn);
        at[i] = strstr(fn, want[i]);
        assert_non_null(at[i]);
        assert_true(memchr(fn, '\n', (size_t)(at[i] - fn)) == NULL); /* the same line */
    }
    assert_true(at[0] < at[1] && at[1] < at[2]);
    e2e_run_free(&r);

    /* pprof: one Location, three Lines; go tool pprof names them. */
    char *prefix = e2e_tmp_path("");
    char *pp[] = {(char *)e2e_env("HEAPPROF_BIN"), "pprof", "-o", prefix, trace, NULL};
    assert_int_equal(e2e_run(pp, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    char *file = strtok(r.out, "\n");
    assert_non_null(file);
    char *top = go_pprof(file, "-top", "-lines", "-sample_index=alloc_space");
    print_message("%s", top);
    for (int i = 0; i < 3; i++) {
        char w[128];
        snprintf(w, sizeof(w), "%s ", fns[i]);
        const char *fn = strstr(top, w);
        assert_non_null(fn);
        snprintf(w, sizeof(w), "inline_sites.c:%u%s", lines[i], i < 2 ? " (inline)" : "");
        const char *pos = strstr(fn, w);
        assert_non_null(pos);
        assert_true(memchr(fn, '\n', (size_t)(pos - fn)) == NULL);
    }
    free(top);
    char *traces = go_pprof(file, "-traces", "-sample_index=alloc_space", "-nodecount=100");
    const char *a = strstr(traces, "grow_buffer (inline)");
    const char *b = strstr(traces, "make_record (inline)");
    const char *c = strstr(traces, "build_table");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(a < b && b < c);
    free(traces);
    for (char *f = file; f; f = strtok(NULL, "\n"))
        unlink(f);
    e2e_run_free(&r);
    free(prefix);
    unlink(trace);
    free(trace);
}

/* Issue 18, growth over time: `worker idle 2000` leaks 1000 bytes about every 100 ms
 * (worker_leak) and allocates nothing else as it runs. Recorded exactly (-i 1) with a
 * dump every 200 ms, `report --growth` charts the unreleased bytes of every dump, rising,
 * and ranks worker_leak first, growing beyond noise (z >= 3) at a rate within [3, 12] KiB/s
 * (at most 1000 B per 100 ms, 9.8 KiB/s; a loaded machine sleeps longer, never shorter;
 * the slope comes from the dumps' times, a few ms off each on a coarse clock: 10.2 was
 * seen). A trace of one dump says that growth needs more. */
static void test_report_cli_growth_ranks_the_leak(void **state)
{
    (void)state;
    char *trace = e2e_tmp_path(".pftrace");
    char *rec[] = {(char *)e2e_env("HEAPPROF_BIN"),
                   "record",
                   "-q",
                   "-i",
                   "1",
                   "--continuous-dump",
                   "200",
                   "-o",
                   trace,
                   "--",
                   (char *)e2e_env("WORKER"),
                   "idle",
                   "2000",
                   NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(rec, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    assert_int_equal(e2e_check_rules(trace), 0);

    r = report("--growth", trace, NULL);
    print_message("%s\n", r.out);
    assert_int_equal(r.status, 0);
    const char *chart = strstr(r.out, "Unreleased bytes per dump:");
    const char *sites = strstr(r.out, "Sites by steady growth");
    assert_non_null(chart);
    assert_non_null(sites);
    /* The chart: a row per dump, the bars never shorter than the one before. */
    int rows = 0;
    size_t last_bar = 0;
    for (const char *l = strchr(chart, '\n'); l && l < sites; l = strchr(l + 1, '\n')) {
        const char *bar = strchr(l + 1, '|');
        const char *eol = strchr(l + 1, '\n');
        if (!bar || !eol || bar > eol)
            continue;
        size_t len = strspn(bar + 1, "#");
        assert_true(len >= last_bar);
        last_bar = len;
        rows++;
    }
    assert_true(rows >= 5);
    /* The first site: worker_leak, growing beyond noise at the leak's rate. */
    const char *first = strstr(sites, "#1  +");
    assert_non_null(first);
    double rate = 0, z = 0;
    char unit[16] = "";
    assert_int_equal(sscanf(first, "#1  +%lf %15[^/]/s, z %lf", &rate, unit, &z), 3);
    double kib = !strcmp(unit, "KiB") ? rate : !strcmp(unit, "B") ? rate / 1024 : -1;
    print_message("  worker_leak: %.2f KiB/s, z %.1f\n", kib, z);
    assert_true(kib >= 3 && kib <= 12);
    assert_true(z >= 3);
    const char *frame = strchr(first, '\n');
    assert_non_null(frame);
    frame += strspn(frame, "\n ");
    assert_int_equal(strncmp(frame, "worker_leak ", 12), 0);
    e2e_run_free(&r);

    r = report("--growth", g_trace, NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "1 dump: growth needs at least 3"));
    e2e_run_free(&r);
    unlink(trace);
    free(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_cli_bug_errors),
        cmocka_unit_test(test_report_cli_bug_disconnected_on_normal_exit),
        cmocka_unit_test(test_report_cli_bug_estimated_counts),
        cmocka_unit_test(test_report_cli_pprof_agrees_with_go_tool),
        cmocka_unit_test(test_report_cli_inlined_frames),
        cmocka_unit_test(test_report_cli_no_source_lines),
        cmocka_unit_test(test_report_cli_growth_ranks_the_leak),
    };
    return cmocka_run_group_tests_name("report_cli", tests, setup, teardown);
}
