/* tests/service/test_config.c: configuration values and their checks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "service/svc.h"

static void test_config_parse_bytes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(svc_parse_bytes("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(svc_parse_bytes("1", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(svc_parse_bytes("512k", &v), 0);
    assert_int_equal(v, 512u << 10);
    assert_int_equal(svc_parse_bytes("8M", &v), 0);
    assert_int_equal(v, 8u << 20);
    assert_int_equal(svc_parse_bytes("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(svc_parse_bytes("64KB", &v), 0);
    assert_int_equal(v, 64u << 10);
    const char *bad[] = {"0", "", "-1", "abc", "12abc", "4096 ", " 4096", "1kk",
                         "99999999999999999999", "17179869184G", "0k", "k", NULL};
    for (size_t i = 0; bad[i]; i++) {
        v = 12345;
        assert_int_equal(svc_parse_bytes(bad[i], &v), -EINVAL);
        assert_int_equal(v, 12345); /* not written on failure */
    }
    assert_int_equal(svc_parse_bytes(NULL, &v), -EINVAL);
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
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parse_bytes),
        cmocka_unit_test(test_config_check),
    };
    return cmocka_run_group_tests_name("service_config", tests, NULL, NULL);
}
