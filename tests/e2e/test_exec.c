/* tests/e2e/test_exec.c: programs that exec under `heapprof record`, with the default
 * --follow-exec ("keep": every exec'd image is profiled as a fresh process) and with
 * --no-follow-exec ("drop": only CMD is profiled, the programs it executes start without
 * the profiler in their environment).
 *
 * tests/programs/execer.c leaves known allocations live, then fork+execs and/or execs
 * tests/programs/three_sites.c; both print their ground truth. Everything runs at
 * interval 1, so every figure is exact. Each profiled run is compared with the same
 * command run without the profiler: same stdout, same exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "tests/e2e/e2e_util.h"

#define LIBM "/lib/x86_64-linux-gnu/libm.so.6"
/* heapprof itself runs with the user's LD_PRELOAD too: an ASan build must accept it. */
#define ASAN_PRELOAD_OK "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=1"

/* Runs @prog under `heapprof record -i 1`; returns the trace path (malloc'd). */
static char *record(bool follow_exec, char *const prog[], char *const env[], struct e2e_run *run)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[64];
    size_t k = 0;
    argv[k++] = (char *)e2e_env("HEAPPROF_BIN");
    argv[k++] = "record";
    argv[k++] = "-q";
    argv[k++] = "-o";
    argv[k++] = trace;
    argv[k++] = "-i";
    argv[k++] = "1";
    argv[k++] = "--seed";
    argv[k++] = "1";
    /* Exact counts: the program waits for ring space rather than drop a record, however
     * slow a busy machine makes the service (the default 100 ms wait ran out under TSan
     * beside other test runs, and the child's counts came up short). */
    argv[k++] = "--block-timeout-us";
    argv[k++] = "10000000";
    argv[k++] = follow_exec ? "--follow-exec" : "--no-follow-exec";
    argv[k++] = "--";
    for (size_t i = 0; prog[i] && k < 63; i++)
        argv[k++] = prog[i];
    argv[k] = NULL;
    assert_int_equal(e2e_run(argv, env, run), 0);
    return trace;
}

/* The profiled run printed and returned what the unprofiled one did. */
static void expect_same_run(const struct e2e_run *prof, const struct e2e_run *plain)
{
    if (strcmp(prof->out, plain->out) != 0 || prof->status != plain->status)
        print_message("profiled (status %d):\n%s\nunprofiled (status %d):\n%s\nstderr:\n%s\n",
                      prof->status, prof->out, plain->status, plain->out, prof->err);
    assert_int_equal(prof->status, plain->status);
    assert_string_equal(prof->out, plain->out);
}

/* Dump @dump_index (0: the latest) of process @pid (0: every process). */
static struct rp_trace *load(const char *trace, int32_t pid, int dump_index)
{
    struct rp_trace *t = NULL;
    struct rp_trace_options o = {.dump_index = dump_index, .pid = pid};
    assert_int_equal(rp_trace_load(trace, &o, &t), 0);
    assert_non_null(t);
    return t;
}

static bool has_function(const struct rp_trace_process *p, const char *fn)
{
    struct e2e_sums s;
    e2e_sum_function(p, fn, &s);
    return s.callsites > 0;
}

static bool has_three_sites(const struct rp_trace_process *p)
{
    return has_function(p, "alloc_leaked") || has_function(p, "alloc_freed") ||
           has_function(p, "alloc_half");
}

static void check_exact(const struct rp_trace_process *p, const struct e2e_truth *t)
{
    struct e2e_sums s;
    e2e_sum_function(p, t->name, &s);
    print_message("  pid %d %-14s alloc %llu/%llu (truth %llu/%llu) freed %llu/%llu (truth "
                  "%llu/%llu)\n",
                  (int)p->pid, t->name, (unsigned long long)s.alloc_bytes,
                  (unsigned long long)s.alloc_count, (unsigned long long)t->alloc_bytes,
                  (unsigned long long)t->alloc_count, (unsigned long long)s.free_bytes,
                  (unsigned long long)s.free_count, (unsigned long long)t->free_bytes,
                  (unsigned long long)t->free_count);
    assert_true(s.callsites > 0);
    assert_int_equal(s.alloc_bytes, t->alloc_bytes);
    assert_int_equal(s.alloc_count, t->alloc_count);
    assert_int_equal(s.free_bytes, t->free_bytes);
    assert_int_equal(s.free_count, t->free_count);
}

/* Every callsite of @p has a frame in a mapping whose path contains @needle: nothing in
 * the dump comes from another program image. */
static void check_only_image(const struct rp_trace_process *p, const char *needle)
{
    assert_true(p->n_callsites > 0);
    for (size_t c = 0; c < p->n_callsites; c++) {
        const struct rp_trace_callsite *cs = &p->callsites[c];
        bool in_image = false;
        for (size_t f = 0; f < cs->n_frames; f++)
            in_image |= strstr(cs->frames[f].mapping_path, needle) != NULL;
        if (!in_image)
            print_message("  callsite %llu (%zu frames, leaf %s in %s) is not from %s\n",
                          (unsigned long long)cs->callstack_id, cs->n_frames,
                          cs->n_frames ? cs->frames[cs->n_frames - 1].function_name : "-",
                          cs->n_frames ? cs->frames[cs->n_frames - 1].mapping_path : "-", needle);
        assert_true(in_image);
    }
}

/* Splits the truth lines of execer's output: [0] execer_alloc, then three_sites' lines
 * (all its runs print the same three). */
static void parse_truths(const char *out, struct e2e_truth *execer, struct e2e_truth three[3],
                         size_t want_three_runs)
{
    struct e2e_truth t[E2E_MAX_TRUTH];
    size_t n = e2e_parse_truth(out, t, E2E_MAX_TRUTH);
    assert_int_equal(n, 1 + 3 * want_three_runs);
    assert_string_equal(t[0].name, "execer_alloc");
    *execer = t[0];
    for (size_t i = 0; i < 3 && want_three_runs > 0; i++)
        three[i] = t[1 + i];
}

/* Keep: execer profiled exactly; its fork+exec'd child a process of its own, exact; its
 * exec'd image a fresh session of the same pid, exact, with nothing left over from
 * execer's live allocations. */
static void test_exec_keep_same_pid_and_child(void **state)
{
    (void)state;
    char *prog[] = {
        (char *)e2e_env("EXECER"), "both", (char *)e2e_env("THREE_SITES"), "1", "7", NULL};
    struct e2e_run plain, run;
    assert_int_equal(e2e_run(prog, NULL, &plain), 0);
    assert_int_equal(plain.status, 7);
    char *trace = record(true, prog, NULL, &run);
    expect_same_run(&run, &plain);
    struct e2e_truth ex, three[3];
    parse_truths(run.out, &ex, three, 2);

    assert_int_equal(e2e_check_rules(trace), 0);
    /* Three processes: execer, the three_sites it exec'd in its own pid (a process of
     * its own, named by its own command line), and the fork+exec'd child. */
    struct rp_trace *t = load(trace, 0, 0);
    assert_int_equal(t->n_processes, 3);
    const struct rp_trace_process *pe = NULL, *pt = NULL, *child_p = NULL;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        print_message("  pid %d (program %u): %u dumps, %s\n", (int)p->pid, p->exec_index + 1,
                      p->n_dumps, p->cmdline);
        assert_int_equal(p->n_dumps, 1);
        if (p->exec_index == 1)
            pt = p;
        else if (has_function(p, "execer_alloc"))
            pe = p;
        else
            child_p = p;
    }
    assert_non_null(pe);
    assert_non_null(pt);
    assert_non_null(child_p);
    assert_int_equal(pe->pid, pt->pid);
    assert_int_equal(pe->exec_index, 0);
    assert_non_null(strstr(pe->cmdline, "execer"));
    assert_non_null(strstr(pt->cmdline, "three_sites"));

    /* The fork+exec'd child: three_sites only. */
    assert_true(child_p->from_startup);
    for (size_t i = 0; i < 3; i++)
        check_exact(child_p, &three[i]);
    assert_false(has_function(child_p, "execer_alloc"));
    check_only_image(child_p, "three_sites");

    /* The same pid: one profile per image. */
    check_exact(pe, &ex);
    assert_false(has_three_sites(pe));
    for (size_t i = 0; i < 3; i++)
        check_exact(pt, &three[i]);
    /* execer's 100 live blocks are not carried into the new image's profile. */
    assert_false(has_function(pt, "execer_alloc"));
    check_only_image(pt, "three_sites");

    rp_trace_free(t);
    unlink(trace);
    free(trace);
    e2e_run_free(&run);
    e2e_run_free(&plain);
}

/* Drop: execer profiled exactly; neither the fork+exec'd child nor the exec'd image. */
static void test_exec_drop_same_pid_and_child(void **state)
{
    (void)state;
    char *prog[] = {
        (char *)e2e_env("EXECER"), "both", (char *)e2e_env("THREE_SITES"), "1", "7", NULL};
    struct e2e_run plain, run;
    assert_int_equal(e2e_run(prog, NULL, &plain), 0);
    char *trace = record(false, prog, NULL, &run);
    expect_same_run(&run, &plain);
    struct e2e_truth ex, three[3];
    parse_truths(run.out, &ex, three, 2);

    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *t = load(trace, 0, 0);
    assert_int_equal(t->n_processes, 1);
    const struct rp_trace_process *p = &t->processes[0];
    print_message("  pid %d: %u dumps, %s\n", (int)p->pid, p->n_dumps, p->cmdline);
    assert_int_equal(p->n_dumps, 1);
    assert_true(p->from_startup);
    check_exact(p, &ex);
    assert_false(has_three_sites(p));
    check_only_image(p, "execer");
    rp_trace_free(t);
    unlink(trace);
    free(trace);
    e2e_run_free(&run);
    e2e_run_free(&plain);
}

/* The script prints what the programs it starts find in their environment. */
static void sh_script(char *buf, size_t len, bool exec_at_end)
{
    const char *three = e2e_env("THREE_SITES");
    snprintf(buf, len,
             "echo \"preload=[$LD_PRELOAD]\"; "
             "env | grep -c -E '^HEAPPROF_(SOCKET|STARTUP|SEED|FOLLOW_EXEC|INIT_TIMEOUT_MS)='; "
             "'%s' 1 3; echo \"rc=$?\"%s%s%s",
             three, exec_at_end ? "; exec '" : "", exec_at_end ? three : "",
             exec_at_end ? "' 1 7" : "");
}

/* Drop with /bin/sh as CMD and a preloaded library of the user's: sh and the programs it
 * starts see exactly the environment of an unprofiled run; only sh is profiled. */
static void test_exec_drop_sh_environment(void **state)
{
    (void)state;
    char script[8192];
    sh_script(script, sizeof(script), true);
    char *prog[] = {"/bin/sh", "-c", script, NULL};
    char *env[] = {"LD_PRELOAD=" LIBM, ASAN_PRELOAD_OK, NULL};
    struct e2e_run plain, run;
    assert_int_equal(e2e_run(prog, env, &plain), 0);
    char *trace = record(false, prog, env, &run);
    expect_same_run(&run, &plain);
    print_message("%s", run.out);
    assert_int_equal(run.status, 7);
    assert_non_null(strstr(run.out, "preload=[" LIBM "]\n0\n"));
    assert_non_null(strstr(run.out, "rc=3\n"));
    struct e2e_truth truth[E2E_MAX_TRUTH];
    assert_int_equal(e2e_parse_truth(run.out, truth, E2E_MAX_TRUTH), 6);

    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *t = load(trace, 0, 0);
    assert_int_equal(t->n_processes, 1);
    const struct rp_trace_process *p = &t->processes[0];
    print_message("  pid %d: %u dumps, %s\n", (int)p->pid, p->n_dumps, p->cmdline);
    assert_int_equal(p->n_dumps, 1);
    assert_true(p->heap_samples > 0);
    assert_false(has_three_sites(p));
    for (size_t c = 0; c < p->n_callsites; c++)
        for (size_t f = 0; f < p->callsites[c].n_frames; f++)
            assert_null(strstr(p->callsites[c].frames[f].mapping_path, "three_sites"));
    rp_trace_free(t);
    unlink(trace);
    free(trace);
    e2e_run_free(&run);
    e2e_run_free(&plain);
}

static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* No service at the socket: the library still takes itself out of the environment
 * (HEAPPROF_FOLLOW_EXEC=0), so only sh says it runs unprofiled, not the programs it
 * starts; with HEAPPROF_FOLLOW_EXEC=1 each of them does. */
static void test_exec_drop_without_service(void **state)
{
    (void)state;
    char script[8192];
    sh_script(script, sizeof(script), false);
    char *prog[] = {"/bin/sh", "-c", script, NULL};
    char *sock = e2e_tmp_path(".sock"); /* never created */
    char preload[4096], sock_var[4096];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s:" LIBM, e2e_env("HEAPPROF_LIB"));
    snprintf(sock_var, sizeof(sock_var), "HEAPPROF_SOCKET=%s", sock);

    for (int drop = 0; drop < 2; drop++) {
        char *env[] = {preload,
                       sock_var,
                       "HEAPPROF_STARTUP=1",
                       "HEAPPROF_INIT_TIMEOUT_MS=1000",
                       drop ? "HEAPPROF_FOLLOW_EXEC=0" : "HEAPPROF_FOLLOW_EXEC=1",
                       NULL};
        struct e2e_run run;
        assert_int_equal(e2e_run(prog, env, &run), 0);
        print_message("  follow-exec %d:\n%sstderr:\n%s", !drop, run.out, run.err);
        assert_int_equal(run.status, 0);
        assert_non_null(strstr(run.out, "rc=3\n"));
        struct e2e_truth truth[E2E_MAX_TRUTH];
        assert_int_equal(e2e_parse_truth(run.out, truth, E2E_MAX_TRUTH), 3);
        if (drop) {
            assert_non_null(strstr(run.out, "preload=[" LIBM "]\n0\n"));
            assert_int_equal(count(run.err, "running unprofiled"), 1);
        } else {
            assert_non_null(strstr(run.out, "libheapprof.so:" LIBM "]\n4\n"));
            /* sh, then env, grep and three_sites, each with the library. */
            assert_int_equal(count(run.err, "running unprofiled"), 4);
        }
        e2e_run_free(&run);
    }
    free(sock);
}

/* A shell whose short-lived children exit while it lives on, then execs a program in its
 * own pid (a pyenv-style shim): every trace reference must resolve the way Perfetto's
 * importer resolves it. The children's dumps used to write source lines for the shell's
 * frames before any dump of the shell used them (stackprofile_invalid_frame_id). */
static void test_exec_bug_shim_children_symbols(void **state)
{
    (void)state;
    char script[512];
    snprintf(script, sizeof(script),
             "for i in 1 2 3; do sh -c 'readlink -f /' >/dev/null; done; exec %s",
             e2e_env("THREE_SITES"));
    char *prog[] = {"/bin/bash", "-c", script, NULL};
    struct e2e_run run;
    char *trace = record(true, prog, NULL, &run);
    assert_int_equal(run.status, 0);
    assert_int_equal(e2e_check_rules(trace), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    print_message("  %zu processes\n", t->n_processes);
    assert_true(t->n_processes >= 5); /* bash, 3 children, the exec'd program */
    rp_trace_free(t);
    e2e_run_free(&run);
    unlink(trace);
    free(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_keep_same_pid_and_child),
        cmocka_unit_test(test_exec_drop_same_pid_and_child),
        cmocka_unit_test(test_exec_drop_sh_environment),
        cmocka_unit_test(test_exec_drop_without_service),
        cmocka_unit_test(test_exec_bug_shim_children_symbols),
    };
    return cmocka_run_group_tests_name("e2e_exec", tests, NULL, NULL);
}
