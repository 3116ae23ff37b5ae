/* tests/e2e/test_rust.c: Rust names in the report and the pprof export (issue 26 case
 * 6). tests/programs/rust_sites.rs, built with the default (legacy) symbol mangling and
 * with v0, recorded at interval 1: the report names its sites as rustfilt would (no
 * `$LT$` or `..` escapes, no `::h<hash>`, no `.llvm.N`, no raw `_R` symbol), and so does
 * the pprof export's function names (system names keep the symbol). Skipped when rustc
 * is not installed (scripts/install-deps.sh installs it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_util.h"

/* Records @prog_env's program at interval 1; returns its report (malloc'd). */
static char *record_and_report(const char *prog_env, char **trace_out)
{
    const char *prog = getenv(prog_env);
    if (!prog || access(prog, X_OK) != 0) {
        print_message("  %s: rustc is not installed: skipped\n", prog_env);
        return NULL;
    }
    char *trace = e2e_tmp_path(".pftrace");
    char *rec[] = {(char *)e2e_env("HEAPPROF_BIN"),
                   "record",
                   "-q",
                   "-i",
                   "1",
                   "-o",
                   trace,
                   "--",
                   (char *)prog,
                   NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(rec, NULL, &r), 0);
    if (r.status != 0)
        print_message("  record: %d %s\n", r.status, r.err);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "1000 2000 124716\n"); /* the program's own output */
    e2e_run_free(&r);
    assert_int_equal(e2e_check_rules(trace), 0);
    char *rep[] = {(char *)e2e_env("HEAPPROF_BIN"), "report", "--top", "50", trace, NULL};
    assert_int_equal(e2e_run(rep, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    char *out = r.out;
    r.out = NULL;
    e2e_run_free(&r);
    *trace_out = trace;
    return out;
}

/* No mangled Rust left in @text: escapes, hashes, LLVM suffixes, v0 symbols. */
static void assert_no_rust_mangling(const char *what, const char *text)
{
    static const char *const marks[] = {"$LT$", "$GT$", "$u7b$", "17h", ".llvm.", " _R", "_ZN"};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        const char *m = strstr(text, marks[i]);
        if (m) {
            const char *line = m;
            while (line > text && line[-1] != '\n')
                line--;
            const char *end = strchr(m, '\n');
            print_message("  %s still has \"%s\": %.*s\n", what, marks[i],
                          (int)(end ? end - line : (long)strlen(line)), line);
        }
        assert_null(m);
    }
}

/* The pprof export of @trace, gunzipped (malloc'd). */
static char *pprof_bytes(const char *trace, size_t *len)
{
    char *pb = e2e_tmp_path(".pb.gz");
    char *argv[] = {(char *)e2e_env("HEAPPROF_BIN"), "pprof", "-o", pb, (char *)trace, NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, NULL, &r), 0);
    assert_int_equal(r.status, 0);
    e2e_run_free(&r);
    char *raw = e2e_tmp_path(".pb");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "gzip -dc '%s' > '%s'", pb, raw);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(raw, "rb");
    assert_non_null(f);
    char *buf = malloc(64 << 20);
    *len = fread(buf, 1, 64 << 20, f);
    fclose(f);
    unlink(pb);
    unlink(raw);
    free(pb);
    free(raw);
    return buf;
}

static bool contains(const char *buf, size_t len, const char *s)
{
    return memmem(buf, len, s, strlen(s)) != NULL;
}

static void check_program(const char *prog_env, const char *method)
{
    char *trace = NULL;
    char *rep = record_and_report(prog_env, &trace);
    if (!rep)
        skip();
    print_message("  %s: report of %zu bytes\n", prog_env, strlen(rep));
    assert_non_null(strstr(rep, "rust_sites::rust_leaky_vectors"));
    assert_non_null(strstr(rep, method));
    assert_no_rust_mangling(prog_env, rep);
    size_t len;
    char *pb = pprof_bytes(trace, &len);
    assert_true(contains(pb, len, "rust_sites::rust_leaky_vectors"));
    assert_true(contains(pb, len, method));
    free(pb);
    free(rep);
    unlink(trace);
    free(trace);
}

/* Legacy mangling: `_ZN10rust_sites14Cache$LT$T$GT$11insert_many17h...E`. */
static void test_rust_legacy_names(void **state)
{
    (void)state;
    check_program("RUST_SITES_LEGACY", "rust_sites::Cache<T>::insert_many");
}

/* v0 mangling: `_RNvMNtCs..._10rust_sitesINtB2_5CacheReE11insert_many`: the generic
 * argument is in the name. */
static void test_rust_v0_names(void **state)
{
    (void)state;
    check_program("RUST_SITES_V0", "<rust_sites::Cache<");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rust_legacy_names),
        cmocka_unit_test(test_rust_v0_names),
    };
    return cmocka_run_group_tests_name("e2e_rust", tests, NULL, NULL);
}
