/* tests/http/test_listen.c: the --http address (http/listen.c): its forms, loopback by
 * default, a non-loopback address refused unless allowed, port 0 bound to a free port. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"

static void expect_split(const char *spec, const char *host, unsigned port)
{
    char h[64], err[256];
    uint16_t p;
    assert_int_equal(http_parse_listen(spec, h, sizeof(h), &p, err, sizeof(err)), 0);
    assert_string_equal(h, host);
    assert_int_equal(p, port);
}

static void expect_bad(const char *spec)
{
    char h[64], err[256] = "";
    uint16_t p;
    if (http_parse_listen(spec, h, sizeof(h), &p, err, sizeof(err)) != -EINVAL)
        fail_msg("'%s' accepted", spec);
    assert_true(err[0] != '\0');
}

static void test_listen_parse(void **state)
{
    (void)state;
    expect_split("127.0.0.1:6060", "127.0.0.1", 6060);
    expect_split(":6060", "", 6060);
    expect_split("6060", "", 6060);
    expect_split("0", "", 0);
    expect_split("localhost:65535", "localhost", 65535);
    expect_split("[::1]:80", "::1", 80);
    expect_bad("");
    expect_bad(":");
    expect_bad("65536");
    expect_bad("127.0.0.1:-1");
    expect_bad("127.0.0.1:+1");
    expect_bad("127.0.0.1:60x");
    expect_bad("::1:80");
    expect_bad("[::1]80");
    expect_bad("[::1");
}

static void test_listen_loopback_only(void **state)
{
    (void)state;
    int fd = -1;
    char url[128], err[256];
    assert_int_equal(http_listen("0.0.0.0:0", false, &fd, url, sizeof(url), err, sizeof(err)),
                     -EPERM);
    assert_non_null(strstr(err, "--http-allow-remote"));
    assert_int_equal(http_listen("0.0.0.0:0", true, &fd, url, sizeof(url), err, sizeof(err)), 0);
    close(fd);
    assert_int_equal(http_listen(":0", false, &fd, url, sizeof(url), err, sizeof(err)), 0);
    assert_int_equal(strncmp(url, "http://127.0.0.1:", 17), 0);
    assert_string_not_equal(url, "http://127.0.0.1:0/");
    close(fd);
    assert_int_equal(http_listen("127.0.0.2:0", false, &fd, url, sizeof(url), err, sizeof(err)), 0);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen_parse),
        cmocka_unit_test(test_listen_loopback_only),
    };
    return cmocka_run_group_tests_name("http_listen", tests, NULL, NULL);
}
