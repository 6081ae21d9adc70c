/*
 * libmapflow's ucx: target without a daemon (the end-to-end cases are in
 * tests/integration/test_client_ucx.sh): malformed targets are INVALID_ARGUMENT with a
 * message before UCX is touched, and an address nobody listens on is UNAVAILABLE within
 * the open's deadline (never a hang); the channel left behind fails calls with
 * UNAVAILABLE and reports no arena. UCX_TLS=tcp: the network path, loopback only.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "mapflow.h"

static mf_channel_params_t params(int64_t timeout_ms)
{
    mf_channel_params_t p = {0};
    p.field_mask = MF_CHANNEL_PARAM_TIMEOUT_MS | MF_CHANNEL_PARAM_TOKEN |
                   MF_CHANNEL_PARAM_RETRY | MF_CHANNEL_PARAM_WANT_ARENA;
    p.timeout_ms = timeout_ms;
    p.token = "secret";
    p.want_arena = 1; /* ignored on ucx: never an error */
    mf_retry_policy_default(&p.retry);
    p.retry.max_retries = 0;
    return p;
}

static void test_bad_targets(void **state)
{
    (void)state;
    static const char *const bad[] = {"ucx:", "ucx:127.0.0.1", "ucx::7000", "ucx:127.0.0.1:",
                                      "ucx:127.0.0.1:0", "ucx:127.0.0.1:65536",
                                      "ucx:127.0.0.1:70x", "ucx:127.0.0.1:123456"};
    mf_channel_params_t p = params(2000);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mf_channel_t *ch = NULL;
        mf_status_t st = mf_channel_open(bad[i], &p, &ch);
        if (st != MF_INVALID_ARGUMENT)
            fail_msg("%s: %s (%s)", bad[i], mf_status_name(st), mf_channel_last_error(ch));
        assert_non_null(ch);
        assert_non_null(strstr(mf_channel_last_error(ch), "ucx:HOST:PORT"));
        mf_channel_close(ch);
    }
}

/* A loopback port that was just free (bound, then closed). */
static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void test_nobody_listening(void **state)
{
    (void)state;
    char target[64];
    snprintf(target, sizeof(target), "ucx:127.0.0.1:%u", free_port());
    mf_channel_params_t p = params(5000);
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_UNAVAILABLE)
        fail_msg("%s: %s (%s)", target, mf_status_name(st), mf_channel_last_error(ch));
    assert_true(strlen(mf_channel_last_error(ch)) > 0);
    assert_int_equal(mf_channel_has_arena(ch), 0);
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    assert_int_equal(info.connected, 0);
    /* The channel that failed to open answers calls with UNAVAILABLE, at once. */
    uint32_t tokens[32], layer = 3, blocks = 7;
    for (int i = 0; i < 32; i++)
        tokens[i] = 11u * (uint32_t)i + 5u;
    st = mf_lookup_peer(ch, "127.0.0.1:1", "m", 16, tokens, 32, &layer, 1, &blocks, NULL,
                        MF_TIMEOUT_DEFAULT);
    assert_int_equal(st, MF_UNAVAILABLE);
    assert_int_equal(blocks, 7); /* untouched */
    mf_channel_close(ch);
}

static void test_peer_argument_checked(void **state)
{
    (void)state;
    /* A bad peer is refused before anything is sent (the channel here is not even up). */
    char target[64];
    snprintf(target, sizeof(target), "ucx:127.0.0.1:%u", free_port());
    mf_channel_params_t p = params(3000);
    mf_channel_t *ch = NULL;
    assert_int_equal(mf_channel_open(target, &p, &ch), MF_UNAVAILABLE);
    uint32_t tokens[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, layer = 0;
    mf_get_result_t *r = (mf_get_result_t *)&r; /* must be reset to NULL */
    assert_int_equal(mf_get_prefix_peer(ch, "no-port", "m", 16, tokens, 16, &layer, 1, 0, 0,
                                        MF_GET_COPY, &r, MF_TIMEOUT_DEFAULT),
                     MF_INVALID_ARGUMENT);
    assert_null(r);
    assert_non_null(strstr(mf_channel_last_error(ch), "HOST:PORT"));
    mf_key_t k = {"m", 0, {0x1234, 0x5678}};
    assert_int_equal(mf_get_keys_peer(ch, "no-port", &k, 1, MF_GET_COPY, &r,
                                      MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    mf_lease_t l;
    assert_int_equal(mf_get_lease(ch, &k, &l, MF_TIMEOUT_DEFAULT), MF_FAILED_PRECONDITION);
    mf_channel_close(ch);
}

int main(void)
{
    setenv("UCX_TLS", "tcp", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_targets),
        cmocka_unit_test(test_nobody_listening),
        cmocka_unit_test(test_peer_argument_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
