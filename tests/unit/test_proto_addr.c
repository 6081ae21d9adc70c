/* HOST:PORT addresses: split, resolve (numeric only: tests must not need DNS), loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* The default socket rule daemon and mapflowctl share: /run/mapflowd when usable, else a
 * writable absolute XDG_RUNTIME_DIR, else /tmp/mapflowd-UID. */
static void test_default_socket(void **state)
{
    (void)state;
    char dir[] = "/tmp/mf-xdg-XXXXXX", out[4096], want[4200], tmp[64];
    assert_non_null(mkdtemp(dir));
    snprintf(tmp, sizeof(tmp), "/tmp/mapflowd-%u/mapflowd.sock", (unsigned)getuid());
    int sys_listen = access(MF_SYSTEM_SOCKET_DIR, W_OK | X_OK) == 0;
    int sys_client = access(MF_SYSTEM_SOCKET, F_OK) == 0;
    setenv("XDG_RUNTIME_DIR", dir, 1);
    snprintf(want, sizeof(want), "%s/mapflowd/mapflowd.sock", dir);
    for (int listen = 0; listen < 2; listen++) {
        int sys = listen ? sys_listen : sys_client;
        mf_default_socket_path(out, sizeof(out), listen);
        assert_string_equal(out, sys ? MF_SYSTEM_SOCKET : want);
        setenv("XDG_RUNTIME_DIR", "relative/dir", 1); /* not absolute: skipped */
        mf_default_socket_path(out, sizeof(out), listen);
        assert_string_equal(out, sys ? MF_SYSTEM_SOCKET : tmp);
        unsetenv("XDG_RUNTIME_DIR");
        mf_default_socket_path(out, sizeof(out), listen);
        assert_string_equal(out, sys ? MF_SYSTEM_SOCKET : tmp);
        setenv("XDG_RUNTIME_DIR", dir, 1);
    }
    unsetenv("XDG_RUNTIME_DIR");
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_resolve_and_loopback),
        cmocka_unit_test(test_default_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
