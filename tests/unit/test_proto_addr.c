/* HOST:PORT addresses: split, resolve (numeric only: tests must not need DNS), loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mf_addr.h"

static void test_split(void **state)
{
    (void)state;
    char host[64];
    uint16_t port;
    assert_int_equal(mf_addr_split("127.0.0.1:9479", host, sizeof host, &port, 0), MF_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9479);
    assert_int_equal(mf_addr_split("[::1]:65535", host, sizeof host, &port, 0), MF_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 65535);
    assert_int_equal(mf_addr_split("node7:0", host, sizeof host, &port, 1), MF_OK);
    assert_int_equal(port, 0);
    assert_int_equal(mf_addr_split("node7:0", host, sizeof host, &port, 0), MF_INVALID_ARGUMENT);
    const char *bad[] = { "", "host", ":80", "1.2.3.4:", "1.2.3.4:x", "1.2.3.4:99999",
                          "1.2.3.4:-1", "1.2.3.4:123456", "a:1 ", NULL };
    for (int i = 0; bad[i]; i++)
        assert_int_equal(mf_addr_split(bad[i], host, sizeof host, &port, 1), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_addr_split(NULL, host, sizeof host, &port, 1), MF_INVALID_ARGUMENT);
    /* A host longer than the caller's buffer is refused, never truncated. */
    assert_int_equal(mf_addr_split("abcdefgh:1", host, 8, &port, 0), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_addr_split("abcdefg:1", host, 8, &port, 0), MF_OK);
}

static void test_resolve_and_loopback(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    socklen_t sl;
    assert_int_equal(mf_addr_resolve("127.0.0.1:9479", 0, &ss, &sl), MF_OK);
    assert_true(mf_addr_is_loopback(&ss));
    assert_int_equal(mf_addr_resolve("127.200.1.1:1", 0, &ss, &sl), MF_OK);
    assert_true(mf_addr_is_loopback(&ss));
    assert_int_equal(mf_addr_resolve("[::1]:1", 0, &ss, &sl), MF_OK);
    assert_true(mf_addr_is_loopback(&ss));
    assert_int_equal(mf_addr_resolve("10.1.2.3:0", 1, &ss, &sl), MF_OK);
    assert_false(mf_addr_is_loopback(&ss));
    assert_int_equal(mf_addr_resolve("0.0.0.0:0", 1, &ss, &sl), MF_OK);
    assert_false(mf_addr_is_loopback(&ss));
    assert_int_equal(mf_addr_resolve("10.1.2.3:0", 0, &ss, &sl), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_addr_resolve("1.2.3.4:x", 1, &ss, &sl), MF_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_resolve_and_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
