/* tests/http/test_request.c: the HTTP request head parser and the query reader
 * (http/request.h): what is accepted, what is refused with which status, and heads that
 * arrive a few bytes at a time. */
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

#include "http/request.h"

static int parse(const char *s, struct http_request *req)
{
    return http_parse_request(s, strlen(s), req);
}

static void test_request_get_with_query(void **state)
{
    (void)state;
    const char *s = "GET /debug/pprof/heap?pid=42&gc=1 HTTP/1.1\r\nHost: x\r\n"
                    "User-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\ntrailing";
    struct http_request req;
    int r = parse(s, &req);
    assert_int_equal(r, (int)(strstr(s, "trailing") - s));
    assert_int_equal(req.method, HTTP_METHOD_GET);
    assert_int_equal(req.minor_version, 1);
    assert_true(http_path_is(&req, "/debug/pprof/heap"));
    assert_false(http_path_is(&req, "/debug/pprof/hea"));
    assert_int_equal(req.query_len, strlen("pid=42&gc=1"));
    assert_memory_equal(req.query, "pid=42&gc=1", req.query_len);
}

static void test_request_http10_bare_lf_head(void **state)
{
    (void)state;
    struct http_request req;
    assert_true(parse("\r\nHEAD / HTTP/1.0\nX:\n\n", &req) > 0);
    assert_int_equal(req.method, HTTP_METHOD_HEAD);
    assert_int_equal(req.minor_version, 0);
    assert_true(http_path_is(&req, "/"));
    assert_int_equal(req.query_len, 0);
    assert_true(parse("POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", &req) > 0);
    assert_int_equal(req.method, HTTP_METHOD_OTHER);
}

/* Every prefix of a valid head needs more bytes; the whole head parses. */
static void test_request_incremental(void **state)
{
    (void)state;
    const char *s = "GET /debug/pprof/allocs?name=a%20b HTTP/1.1\r\nHost: h\r\n\r\n";
    struct http_request req;
    for (size_t n = 0; n < strlen(s); n++)
        assert_int_equal(http_parse_request(s, n, &req), 0);
    assert_int_equal(http_parse_request(s, strlen(s), &req), (int)strlen(s));
}

static void expect_status(const char *s, int status)
{
    struct http_request req;
    int r = parse(s, &req);
    if (r != -status)
        fail_msg("'%s': %d, not %d", s, r, -status);
    assert_non_null(req.why_bad);
    assert_null(strchr(req.why_bad, '\n'));
}

static void test_request_malformed(void **state)
{
    (void)state;
    expect_status("\x16\x03\x01\x02", 400); /* a TLS hello: refused at its first byte */
    expect_status(" GET / HTTP/1.1\r\n\r\n", 400);
    expect_status("GET\r\n\r\n", 400);
    expect_status("GET /\r\n\r\n", 400); /* HTTP/0.9 */
    expect_status("GET  / HTTP/1.1\r\n\r\n", 400);
    expect_status("GET http://h/ HTTP/1.1\r\n\r\n", 400);
    expect_status("GET * HTTP/1.1\r\n\r\n", 400);
    expect_status("GET /a#b HTTP/1.1\r\n\r\n", 400);
    expect_status("GET /a\x01 HTTP/1.1\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1 \r\n\r\n", 400);
    expect_status("GET / HTTX/1.1\r\n\r\n", 400);
    expect_status("GET / HTTP/2.0\r\n\r\n", 505);
    expect_status("GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nName : v\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\n: v\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nA: b\x7f\r\n\r\n", 400);
    expect_status("GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400);
    struct http_request req;
    assert_int_equal(http_parse_request("GET / HTTP/1.1\r\nA: \0\r\n\r\n", 23, &req), -400);
}

static void test_request_too_large(void **state)
{
    (void)state;
    size_t n = HTTP_MAX_HEAD + 10;
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, 'a', n);
    memcpy(s, "GET /", 5);
    s[n] = '\0';
    struct http_request req;
    /* Up to the limit it may still end; at the limit it is refused. */
    assert_int_equal(http_parse_request(s, HTTP_MAX_HEAD - 1, &req), 0);
    assert_int_equal(http_parse_request(s, HTTP_MAX_HEAD, &req), -431);
    assert_int_equal(http_parse_request(s, n, &req), -431);
    /* Too many header lines. */
    size_t len = 0;
    len += (size_t)sprintf(s + len, "GET / HTTP/1.1\r\n");
    for (int i = 0; i <= HTTP_MAX_HEADERS; i++)
        len += (size_t)sprintf(s + len, "A: b\r\n");
    len += (size_t)sprintf(s + len, "\r\n");
    assert_int_equal(http_parse_request(s, len, &req), -431);
    free(s);
}

static void test_request_query_get(void **state)
{
    (void)state;
    const char *q = "pid=42&name=a%20b+c&empty=&flag&bad=%4&dup=1&dup=2&nul=%00";
    size_t n = strlen(q);
    char v[16];
    assert_int_equal(http_query_get(q, n, "pid", v, sizeof(v)), 1);
    assert_string_equal(v, "42");
    assert_int_equal(http_query_get(q, n, "name", v, sizeof(v)), 1);
    assert_string_equal(v, "a b c");
    assert_int_equal(http_query_get(q, n, "empty", v, sizeof(v)), 1);
    assert_string_equal(v, "");
    assert_int_equal(http_query_get(q, n, "flag", v, sizeof(v)), 1);
    assert_string_equal(v, "");
    assert_int_equal(http_query_get(q, n, "missing", v, sizeof(v)), 0);
    assert_int_equal(http_query_get(q, n, "bad", v, sizeof(v)), -1);
    assert_int_equal(http_query_get(q, n, "dup", v, sizeof(v)), -1);
    assert_int_equal(http_query_get(q, n, "nul", v, sizeof(v)), -1);
    assert_int_equal(http_query_get("pid=123456789", 13, "pid", v, 5), -1); /* too long */
    assert_int_equal(http_query_get("p%69d=7", 7, "pid", v, sizeof(v)), 1); /* encoded key */
    assert_string_equal(v, "7");
    assert_int_equal(http_query_get("", 0, "pid", v, sizeof(v)), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_get_with_query),
        cmocka_unit_test(test_request_http10_bare_lf_head),
        cmocka_unit_test(test_request_incremental),
        cmocka_unit_test(test_request_malformed),
        cmocka_unit_test(test_request_too_large),
        cmocka_unit_test(test_request_query_get),
    };
    return cmocka_run_group_tests_name("http_request", tests, NULL, NULL);
}
