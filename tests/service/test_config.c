/* tests/service/test_config.c: configuration values and their checks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "service/config.h"

/* A byte count as the options take it: the one number parser with suffixes, and the
 * sampling interval's rule that 0 is no count of bytes. */
static int parse_bytes(const char *s, uint64_t *ret)
{
    const struct svc_config_field *f = svc_config_field_find("sampling_interval_bytes");
    struct svc_config c;
    char err[128];
    uint64_t v;
    svc_config_init(&c);
    if (svc_parse_uint(s, true, &v) < 0 || svc_config_set_text(&c, f, s, err, sizeof(err)) < 0)
        return -EINVAL;
    *ret = c.sampling_interval_bytes;
    return 0;
}

static void test_config_parse_bytes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(parse_bytes("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(parse_bytes("1", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(parse_bytes("512k", &v), 0);
    assert_int_equal(v, 512u << 10);
    assert_int_equal(parse_bytes("8M", &v), 0);
    assert_int_equal(v, 8u << 20);
    assert_int_equal(parse_bytes("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(parse_bytes("64KB", &v), 0);
    assert_int_equal(v, 64u << 10);
    const char *bad[] = {"0",
                         "",
                         "-1",
                         "abc",
                         "12abc",
                         "4096 ",
                         " 4096",
                         "1kk",
                         "99999999999999999999",
                         "17179869184G",
                         "0k",
                         "k",
                         NULL};
    for (size_t i = 0; bad[i]; i++) {
        v = 12345;
        assert_int_equal(parse_bytes(bad[i], &v), -EINVAL);
        assert_int_equal(v, 12345); /* not written on failure */
    }
    assert_int_equal(parse_bytes(NULL, &v), -EINVAL);
}

static void test_config_check(void **state)
{
    (void)state;
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    assert_int_equal(c.sampling_interval_bytes, 4096);
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), 0);

    c.sampling_interval_bytes = 0;
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "sampling_interval_bytes"));

    svc_config_init(&c);
    c.shmem_size_bytes = 3 << 20;
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "power of two"));

    svc_config_init(&c);
    c.max_stack_bytes = 1001;
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), -EINVAL);

    svc_config_init(&c);
    c.shmem_size_bytes = 64 << 10;
    c.max_stack_bytes = 64 << 10;
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "too small"));

    /* Unset, the cap of a stack copy is 512 KiB, or what fits a quarter of a smaller
     * ring; set, it is what was asked for. */
    svc_config_init(&c);
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), 0);
    assert_int_equal(svc_config_max_stack(&c), 512u << 10);
    c.shmem_size_bytes = 64 << 10;
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), 0);
    assert_int_equal(svc_config_max_stack(&c), (16u << 10) - 4096);
    c.shmem_size_bytes = 8u << 20;
    c.max_stack_bytes = 64 << 10;
    assert_int_equal(svc_config_max_stack(&c), 64u << 10);
}

static void test_config_text_full(void **state)
{
    (void)state;
    const char *text = "# heapprofd config\n"
                       "sampling_interval_bytes: 512\n"
                       "process_cmdline: \"myapp\"\n"
                       "process_cmdline: 'worker-*'\n"
                       "pid: 1234, pid: 99;\n"
                       "continuous_dump_config { dump_phase_ms: 10 dump_interval_ms: 1000 }\n"
                       "shmem_size_bytes: 1048576\n"
                       "block_client: true\n"
                       "block_client_timeout_us: 500\n"
                       "dump_at_max: true no_startup: false no_running: true\n"
                       "max_heapprofd_memory_kb: 65536\n"
                       "max_heapprofd_cpu_secs: 30\n"
                       "heaps: \"libc.malloc\"\n"
                       "all: false disable_fork_teardown: true\n";
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    assert_int_equal(svc_config_parse_text(text, strlen(text), "a.cfg", &c, err, sizeof(err)), 0);
    assert_int_equal(c.sampling_interval_bytes, 512);
    assert_int_equal(c.n_process_cmdline, 2);
    assert_string_equal(c.process_cmdline[0], "myapp");
    assert_string_equal(c.process_cmdline[1], "worker-*");
    assert_int_equal(c.n_pid, 2);
    assert_int_equal(c.pid[0], 1234);
    assert_int_equal(c.pid[1], 99);
    assert_int_equal(c.dump_phase_ms, 10);
    assert_int_equal(c.dump_interval_ms, 1000);
    assert_int_equal(c.shmem_size_bytes, 1 << 20);
    assert_true(c.block_client);
    assert_int_equal(c.block_client_timeout_us, 500);
    assert_true(c.dump_at_max);
    assert_false(c.no_startup);
    assert_true(c.no_running);
    assert_int_equal(c.max_heapprofd_memory_kb, 65536);
    assert_int_equal(c.max_heapprofd_cpu_secs, 30);
    assert_true(c.disable_fork_teardown);
    assert_int_equal(c.n_heaps, 1);
    assert_string_equal(c.heaps[0], "libc.malloc");
    assert_false(c.all_heaps);
    assert_int_equal(svc_config_check(&c, err, sizeof(err)), 0);

    /* matching: pid, exact argv[0], basename, glob */
    assert_true(svc_config_matches(&c, 99, NULL, "x\0", 2));
    assert_true(svc_config_matches(&c, 5, NULL, "/usr/bin/myapp\0--flag\0", 22));
    assert_true(svc_config_matches(&c, 5, NULL, "myapp\0", 6));
    assert_true(svc_config_matches(&c, 5, NULL, "/opt/worker-7\0", 14));
    assert_false(svc_config_matches(&c, 5, NULL, "/usr/bin/other\0", 15));
    assert_false(svc_config_matches(&c, 5, NULL, "myapp", 5)); /* not NUL-terminated */
    assert_false(svc_config_matches(&c, 5, NULL, NULL, 0));
    svc_config_done(&c);
}

/* -n matched argv[0] only: a retitled process ("nginx: master process ...", whose
 * basename is "nginx.conf") or one renamed with PR_SET_NAME was never found, though
 * pgrep finds it. Now: the comm, argv[0], its basename, and the title. */
static void test_config_bug_matches_retitled(void **state)
{
    (void)state;
    struct svc_config c;
    svc_config_init(&c);
    c.process_cmdline[c.n_process_cmdline++] = strdup("nginx");
    c.process_cmdline[c.n_process_cmdline++] = strdup("postgres: *");
    static const char nginx[] = "nginx: master process nginx -c /etc/nginx/nginx.conf\0\0\0";
    static const char pg[] = "postgres: checkpointer \0\0";
    static const char other[] = "/usr/bin/other\0-c\0nginx\0";
    assert_true(svc_config_matches(&c, 5, "nginx", nginx, sizeof(nginx) - 1));
    assert_false(svc_config_matches(&c, 5, NULL, nginx, sizeof(nginx) - 1));
    assert_true(svc_config_matches(&c, 6, "postgres", pg, sizeof(pg) - 1)); /* the title */
    assert_true(svc_config_matches(&c, 6, NULL, pg, sizeof(pg) - 1));
    assert_false(svc_config_matches(&c, 7, "other", other, sizeof(other) - 1));
    assert_true(svc_config_matches(&c, 7, "nginx", NULL, 0)); /* comm alone */
    assert_false(svc_config_matches(&c, 7, "", NULL, 0));

    char title[64];
    assert_int_equal(svc_cmdline_title(pg, sizeof(pg) - 1, title, sizeof(title)), 22);
    assert_string_equal(title, "postgres: checkpointer");
    assert_int_equal(svc_cmdline_title(other, sizeof(other) - 1, title, 10), 9);
    assert_string_equal(title, "/usr/bin/");
    assert_int_equal(svc_cmdline_title("a\0b\0", 4, title, sizeof(title)), 3);
    assert_string_equal(title, "a b");
    svc_config_done(&c);
}

#define HEAP_NAME_64 "0123456789012345678901234567890123456789012345678901234567890123"

/* heaps / all_heaps: the selection the clients get (service/handshake.c). */
static void test_config_heaps(void **state)
{
    (void)state;
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    /* None named: the malloc heap and CPython's objects (in a Python process). */
    assert_true(svc_config_records_heap(&c, "libc.malloc"));
    assert_true(svc_config_records_heap(&c, "python.objects"));
    assert_false(svc_config_records_heap(&c, "arena.small"));
    const struct svc_config_field *f = svc_config_field_find("heaps");
    assert_non_null(f);
    assert_string_equal(f->flag, "heaps");
    assert_int_equal(svc_config_set_text(&c, f, "arena.small,malloc", err, sizeof(err)), 0);
    assert_int_equal(svc_config_set_text(&c, f, "arena.small", err, sizeof(err)), 0);
    assert_int_equal(c.n_heaps, 2); /* once each; "malloc" is "libc.malloc" */
    assert_string_equal(c.heaps[0], "arena.small");
    assert_string_equal(c.heaps[1], "libc.malloc");
    assert_true(svc_config_records_heap(&c, "arena.small"));
    assert_true(svc_config_records_heap(&c, "libc.malloc"));
    assert_false(svc_config_records_heap(&c, "arena.big"));
    assert_false(svc_config_records_heap(&c, "python.objects"));
    assert_int_equal(svc_config_set_text(&c, f, "x,", err, sizeof(err)), -EINVAL);
    svc_config_done(&c);

    svc_config_init(&c);
    assert_int_equal(svc_config_set_text(&c, f, "arena.small", err, sizeof(err)), 0);
    assert_false(svc_config_records_heap(&c, "libc.malloc"));
    svc_config_set_bool(&c, svc_config_field_find("all_heaps"), true);
    assert_true(svc_config_records_heap(&c, "arena.big"));
    assert_true(svc_config_records_heap(&c, "libc.malloc"));
    svc_config_done(&c);

    svc_config_init(&c);
    char many[40 * 3];
    size_t k = 0;
    for (int i = 0; i < 33; i++)
        k += (size_t)snprintf(many + k, sizeof(many) - k, "%s%c", i ? "," : "", 'a' + i % 26);
    /* 26 distinct letters and 7 repeats: within the cap. */
    assert_int_equal(svc_config_set_text(&c, f, many, err, sizeof(err)), 0);
    assert_int_equal(c.n_heaps, 26);
    for (int i = 0; i < 7; i++) {
        char two[3] = {'A' + (char)i, 'B', 0};
        assert_int_equal(svc_config_set_text(&c, f, two, err, sizeof(err)), i < 6 ? 0 : -EINVAL);
    }
    assert_non_null(strstr(err, "more than 32 heaps"));
    svc_config_done(&c);
}

static void expect_error(const char *text, const char *msg)
{
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    int r = svc_config_parse_text(text, strlen(text), "bad.cfg", &c, err, sizeof(err));
    print_message("  %s\n", err);
    assert_int_equal(r, -EINVAL);
    assert_non_null(strstr(err, msg));
    svc_config_done(&c);
}

static void test_config_text_errors(void **state)
{
    (void)state;
    expect_error("sampling_interval_bytes: 0\n", "bad.cfg:1: sampling_interval_bytes must be");
    expect_error("\n\nfrobnicate: 3\n", "bad.cfg:3: unknown field 'frobnicate'");
    expect_error("sampling_interval_bytes: abc\n", "wants a number");
    expect_error("sampling_interval_bytes: -5\n", "invalid value '-5'");
    expect_error("sampling_interval_bytes 5\n", "expected ':'");
    expect_error("block_client: maybe\n", "wants true or false");
    expect_error("process_cmdline: myapp\n", "wants a quoted string");
    expect_error("process_cmdline: \"unterminated\n", "unterminated string");
    expect_error("continuous_dump_config { dump_interval_ms: 5 \n", "unexpected end of file");
    expect_error("continuous_dump_config { bogus: 5 }\n", "unknown field 'bogus'");
    expect_error("}\n", "unexpected '}'");
    expect_error("shmem_size_bytes: 1000\n", "power of two");
    expect_error("heaps: \"" HEAP_NAME_64 "\"\n", "a heap name has 1 to 63 characters");
    expect_error("heaps: \"a,,b\"\n", "a heap name has 1 to 63 characters");
    expect_error("pid: 0\n", "pid must be positive");
    expect_error("sampling_interval_bytes: 99999999999999999999999\n", "invalid value");
    expect_error("@\n", "unexpected character '@'");
}

static void test_config_load_file(void **state)
{
    (void)state;
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    assert_int_equal(svc_config_load_file("/nonexistent/heapprof.cfg", &c, err, sizeof(err)),
                     -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/heapprof.cfg"));
    char path[] = "/tmp/heapprof-cfg-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *t = "sampling_interval_bytes: 100\nall: true\n";
    assert_int_equal(write(fd, t, strlen(t)), (ssize_t)strlen(t));
    close(fd);
    assert_int_equal(svc_config_load_file(path, &c, err, sizeof(err)), 0);
    assert_int_equal(c.sampling_interval_bytes, 100);
    assert_true(c.all);
    assert_true(svc_config_has_targets(&c));
    assert_true(svc_config_matches(&c, 1, NULL, NULL, 0));
    unlink(path);
    svc_config_done(&c);
}

/* ---- the same configuration as protobuf bytes (what traced hands the data source) ---- */

struct pb {
    uint8_t b[512];
    size_t n;
};

static void pb_varint(struct pb *p, uint64_t v)
{
    while (v >= 0x80) {
        p->b[p->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p->b[p->n++] = (uint8_t)v;
}

static void pb_uint(struct pb *p, uint32_t field, uint64_t v)
{
    pb_varint(p, (uint64_t)field << 3);
    pb_varint(p, v);
}

static void pb_bytes(struct pb *p, uint32_t field, const void *b, size_t n)
{
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    memcpy(p->b + p->n, b, n);
    p->n += n;
}

/* HeapprofdConfig as Perfetto's protos number it gives the same svc_config as the text
 * of test_config_text_full: one table maps both. */
static void test_config_proto_equals_text(void **state)
{
    (void)state;
    const char *text = "sampling_interval_bytes: 512\n"
                       "process_cmdline: \"myapp\"\n"
                       "process_cmdline: 'worker-*'\n"
                       "pid: 1234, pid: 99, pid: 7;\n"
                       "continuous_dump_config { dump_phase_ms: 10 dump_interval_ms: 1000 }\n"
                       "shmem_size_bytes: 1048576\n"
                       "block_client: true\n"
                       "block_client_timeout_us: 500\n"
                       "dump_at_max: true no_startup: true no_running: true\n"
                       "max_heapprofd_memory_kb: 65536\n"
                       "max_heapprofd_cpu_secs: 30\n"
                       "heaps: \"libc.malloc\" all_heaps: true\n"
                       "all: false disable_fork_teardown: true\n";
    struct pb p = {0}, dump = {0};
    pb_uint(&p, 1, 512);
    pb_bytes(&p, 2, "myapp", 5);
    pb_bytes(&p, 2, "worker-*", 8);
    pb_uint(&p, 4, 1234);
    uint8_t packed[] = {99, 7}; /* repeated pid, packed */
    pb_bytes(&p, 4, packed, 2);
    pb_uint(&dump, 5, 10);
    pb_uint(&dump, 6, 1000);
    pb_bytes(&p, 6, dump.b, dump.n);
    pb_uint(&p, 8, 1 << 20);
    pb_uint(&p, 9, 1);
    pb_uint(&p, 14, 500);
    pb_uint(&p, 13, 1);
    pb_uint(&p, 10, 1);
    pb_uint(&p, 11, 1);
    pb_uint(&p, 16, 65536);
    pb_uint(&p, 17, 30);
    pb_bytes(&p, 20, "libc.malloc", 11);
    pb_uint(&p, 21, 1);
    pb_uint(&p, 5, 0);
    pb_uint(&p, 18, 1);
    struct svc_config a, b;
    char err[256];
    svc_config_init(&a);
    svc_config_init(&b);
    assert_int_equal(svc_config_parse_text(text, strlen(text), "a.cfg", &a, err, sizeof(err)), 0);
    assert_int_equal(svc_config_from_proto(p.b, p.n, &b, err, sizeof(err)), 0);
    assert_string_equal(err, "");
    assert_int_equal(a.n_process_cmdline, b.n_process_cmdline);
    for (size_t i = 0; i < a.n_process_cmdline; i++)
        assert_string_equal(a.process_cmdline[i], b.process_cmdline[i]);
    svc_config_done(&a);
    svc_config_done(&b);
    /* With the strings gone, the rest is the same byte for byte. */
    memset(a.process_cmdline, 0, sizeof(a.process_cmdline));
    memset(b.process_cmdline, 0, sizeof(b.process_cmdline));
    assert_memory_equal(&a, &b, sizeof(a));
    assert_int_equal(b.n_pid, 3);
    assert_int_equal(b.pid[2], 7);
}

static void expect_proto_error(const struct pb *p, int want, const char *msg)
{
    struct svc_config c;
    char err[256];
    svc_config_init(&c);
    int r = svc_config_from_proto(p->b, p->n, &c, err, sizeof(err));
    print_message("  %s\n", err);
    assert_int_equal(r, want);
    assert_non_null(strstr(err, msg));
    svc_config_done(&c);
}

static void test_config_proto_errors(void **state)
{
    (void)state;
    struct pb p = {0};
    pb_uint(&p, 1, 0);
    expect_proto_error(&p, -EINVAL, "sampling_interval_bytes must be at least 1");
    p.n = 0;
    pb_uint(&p, 8, 3000000);
    expect_proto_error(&p, -EINVAL, "shmem_size_bytes must be a power of two");
    p.n = 0;
    pb_bytes(&p, 20, HEAP_NAME_64, 64);
    expect_proto_error(&p, -EINVAL, "a heap name has 1 to 63 characters");
    p.n = 0;
    pb_bytes(&p, 1, "xx", 2);
    expect_proto_error(&p, -EINVAL, "sampling_interval_bytes: not a varint");
    p.n = 0;
    pb_bytes(&p, 2, "a\0b", 3);
    expect_proto_error(&p, -EINVAL, "process_cmdline: not a valid string");
    p.n = 0;
    pb_uint(&p, 1, 4096);
    p.n--; /* truncated */
    expect_proto_error(&p, -EINVAL, "malformed");
    /* Fields heapprof does not implement are named, not refused. */
    p.n = 0;
    pb_uint(&p, 5, 1);
    pb_bytes(&p, 7, "skip", 4);
    pb_uint(&p, 23, 1);
    expect_proto_error(&p, 0, "ignored: 7, 23");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parse_bytes),
        cmocka_unit_test(test_config_check),
        cmocka_unit_test(test_config_text_full),
        cmocka_unit_test(test_config_bug_matches_retitled),
        cmocka_unit_test(test_config_text_errors),
        cmocka_unit_test(test_config_heaps),
        cmocka_unit_test(test_config_load_file),
        cmocka_unit_test(test_config_proto_equals_text),
        cmocka_unit_test(test_config_proto_errors),
    };
    return cmocka_run_group_tests_name("service_config", tests, NULL, NULL);
}
