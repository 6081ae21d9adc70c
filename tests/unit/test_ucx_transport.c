/* test_ucx_transport — daemon/ucx.c in one process, two UCX contexts on one event loop
 * (UCX_TLS=tcp over 127.0.0.1): frames both ways through the listener's socketpair
 * bridge, in order; one-sided get / put / flush against the registered arena (random
 * bytes, identical); ranges outside the remote arena refused; a frame that is not a frame
 * fails the endpoint; the server end closing is an error at the client, not a hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "ticket.h"
#include "mf_frame.h"
#include "ucx.h"

/* UCX keeps process-lifetime caches (rcache, config tables) that LeakSanitizer reports. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs\nleak:libucp\nleak:libuct\nleak:libucm\n";
}

#define ARENA (1u << 20)

typedef struct fixture {
    struct event_base *base;
    mfd_ucx_t *srv, *cli;
    uint8_t *arena;
    int adopted_fd;
    mfd_ucx_ep_t *ep;
    uint8_t got[4][256];
    size_t got_len[4], n_got;
    int errors;
    mf_status_t last_err;
    int done;
    mf_status_t done_st;
} fixture_t;

static mf_status_t on_adopt(void *arg, int fd, const char *name)
{
    fixture_t *f = arg;
    assert_non_null(strstr(name, "127.0.0.1"));
    f->adopted_fd = fd;
    return MF_OK;
}

static void on_frame(void *arg, const uint8_t *frame, size_t len)
{
    fixture_t *f = arg;
    assert_true(f->n_got < 4 && len <= sizeof(f->got[0]));
    memcpy(f->got[f->n_got], frame, len);
    f->got_len[f->n_got++] = len;
}

static void on_error(void *arg, mf_status_t st, const char *why)
{
    fixture_t *f = arg;
    (void)why;
    f->errors++;
    f->last_err = st;
}

static void on_done(void *arg, mf_status_t st)
{
    fixture_t *f = arg;
    f->done++;
    f->done_st = st;
}

/* Runs the loop until *flag reaches want; fails after 10 s (a bound, not a measurement). */
static void run_until(fixture_t *f, const int *flag, int want)
{
    int64_t end = mf_now_ms() + 10000;
    while (*flag < want) {
        assert_true(mf_now_ms() < end);
        event_base_loop(f->base, EVLOOP_ONCE);
    }
}

static void run_until_size(fixture_t *f, const size_t *n, size_t want)
{
    int64_t end = mf_now_ms() + 10000;
    while (*n < want) {
        assert_true(mf_now_ms() < end);
        event_base_loop(f->base, EVLOOP_ONCE);
    }
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 33);
    }
}

/* A Hello frame with a recognisable client name. */
static size_t make_frame(uint8_t *out, size_t cap, const char *name, uint64_t rid)
{
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = 1;
    h.namespace_ = (char *)"ns";
    h.client_name = (char *)name;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.request_id = rid;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    uint8_t *buf;
    size_t len;
    assert_int_equal(mf_frame_encode(&e, "xyz", 3, 1u << 20, &buf, &len), MF_OK);
    assert_true(len <= cap);
    memcpy(out, buf, len);
    free(buf);
    return len;
}

static int setup(void **state)
{
    setenv("UCX_TLS", "tcp", 1);
    fixture_t *f = calloc(1, sizeof(*f));
    f->base = event_base_new();
    f->arena = aligned_alloc(4096, ARENA);
    fill_random(f->arena, ARENA, 42);
    f->adopted_fd = -1;
    char err[256];
    mfd_ucx_params_t p = {0};
    p.field_mask = MFD_UCX_P_ARENA | MFD_UCX_P_LISTEN;
    p.base = f->base;
    p.arena = f->arena;
    p.arena_bytes = ARENA;
    p.listen = "127.0.0.1:0";
    p.adopt = on_adopt;
    p.adopt_arg = f;
    assert_int_equal(mfd_ucx_create(&p, &f->srv, err, sizeof(err)), MF_OK);
    assert_true(strncmp(mfd_ucx_bound(f->srv), "127.0.0.1:", 10) == 0);
    assert_string_not_equal(mfd_ucx_bound(f->srv), "127.0.0.1:0");
    mfd_ucx_params_t c = {0};
    c.base = f->base;
    assert_int_equal(mfd_ucx_create(&c, &f->cli, err, sizeof(err)), MF_OK);
    mfd_ucx_ep_cbs_t cbs = {on_frame, on_error, f};
    assert_int_equal(mfd_ucx_connect(f->cli, mfd_ucx_bound(f->srv), &cbs, &f->ep, err,
                                     sizeof(err)),
                     MF_OK);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    mfd_ucx_close(f->ep);
    if (f->adopted_fd >= 0)
        close(f->adopted_fd);
    mfd_ucx_destroy(f->cli);
    mfd_ucx_destroy(f->srv);
    event_base_free(f->base);
    free(f->arena);
    free(f);
    return 0;
}

static void test_frames_both_ways(void **state)
{
    fixture_t *f = *state;
    uint8_t a[256], b[256];
    size_t la = make_frame(a, sizeof(a), "first", 1), lb = make_frame(b, sizeof(b), "second", 2);
    assert_int_equal(mfd_ucx_send(f->ep, a, la), MF_OK);
    assert_int_equal(mfd_ucx_send(f->ep, b, lb), MF_OK);
    /* Both arrive on the adopted stream, whole and in order. */
    uint8_t in[512];
    size_t have = 0;
    int64_t end = mf_now_ms() + 10000;
    while (have < la + lb) {
        assert_true(mf_now_ms() < end);
        event_base_loop(f->base, EVLOOP_NONBLOCK);
        if (f->adopted_fd < 0)
            continue;
        ssize_t n = recv(f->adopted_fd, in + have, sizeof(in) - have, MSG_DONTWAIT);
        if (n > 0)
            have += (size_t)n;
        else
            usleep(1000);
    }
    assert_int_equal(have, la + lb);
    assert_memory_equal(in, a, la);
    assert_memory_equal(in + la, b, lb);
    /* And back: what the server writes reaches the client as whole frames. */
    assert_int_equal(write(f->adopted_fd, b, lb), (ssize_t)lb);
    assert_int_equal(write(f->adopted_fd, a, la), (ssize_t)la);
    run_until_size(f, &f->n_got, 2);
    assert_int_equal(f->got_len[0], lb);
    assert_memory_equal(f->got[0], b, lb);
    assert_int_equal(f->got_len[1], la);
    assert_memory_equal(f->got[1], a, la);
    assert_int_equal(f->errors, 0);
    assert_int_equal(mfd_ucx_endpoints(f->srv), 1);
}

static void test_rma_get_put(void **state)
{
    fixture_t *f = *state;
    uint64_t addr, bytes;
    const void *rkey;
    size_t rlen;
    assert_int_equal(mfd_ucx_get(f->ep, 0, f->got[0], 16, on_done, f), MF_FAILED_PRECONDITION);
    assert_int_equal(mfd_ucx_arena_key(f->srv, &addr, &bytes, &rkey, &rlen), MF_OK);
    assert_int_equal(bytes, ARENA);
    assert_int_equal(mfd_ucx_set_remote(f->ep, addr, bytes, rkey, rlen), MF_OK);
    /* Several gets in flight, from scattered offsets. */
    size_t len = 200000;
    uint8_t *dst = malloc(3 * len);
    uint64_t offs[3] = {0, 333333, ARENA - len};
    for (int i = 0; i < 3; i++)
        assert_int_equal(mfd_ucx_get(f->ep, offs[i], dst + i * len, len, on_done, f), MF_OK);
    run_until(f, &f->done, 3);
    assert_int_equal(f->done_st, MF_OK);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(dst + i * len, f->arena + offs[i], len);
    /* Put, flush, and the arena holds the new bytes. */
    fill_random(dst, len, 7);
    assert_memory_not_equal(f->arena + 4096, dst, len);
    assert_int_equal(mfd_ucx_put(f->ep, 4096, dst, len, on_done, f), MF_OK);
    assert_int_equal(mfd_ucx_flush(f->ep, on_done, f), MF_OK);
    run_until(f, &f->done, 5);
    assert_int_equal(f->done_st, MF_OK);
    assert_memory_equal(f->arena + 4096, dst, len);
    /* Outside the arena: refused before anything moves; no callback. */
    assert_int_equal(mfd_ucx_get(f->ep, ARENA - 10, dst, 11, on_done, f), MF_OUT_OF_RANGE);
    assert_int_equal(mfd_ucx_get(f->ep, UINT64_MAX - 4, dst, 8, on_done, f), MF_OUT_OF_RANGE);
    assert_int_equal(f->done, 5);
    free(dst);
}

static void test_not_a_frame_fails_endpoint(void **state)
{
    fixture_t *f = *state;
    uint8_t junk[64];
    fill_random(junk, sizeof(junk), 3);
    junk[0] = 200; /* length field that disagrees with the message size */
    junk[1] = junk[2] = junk[3] = 0;
    assert_int_equal(mfd_ucx_send(f->ep, junk, sizeof(junk)), MF_OK);
    run_until(f, &f->errors, 1);
    assert_int_equal(f->last_err, MF_UNAVAILABLE);
    assert_int_equal(mfd_ucx_send(f->ep, junk, sizeof(junk)), MF_UNAVAILABLE);
}

static void test_server_close_is_an_error(void **state)
{
    fixture_t *f = *state;
    uint8_t a[256];
    size_t la = make_frame(a, sizeof(a), "hello", 1);
    assert_int_equal(mfd_ucx_send(f->ep, a, la), MF_OK);
    int64_t end = mf_now_ms() + 10000;
    while (f->adopted_fd < 0) {
        assert_true(mf_now_ms() < end);
        event_base_loop(f->base, EVLOOP_ONCE);
    }
    close(f->adopted_fd); /* the server dropped the connection */
    f->adopted_fd = -1;
    run_until(f, &f->errors, 1);
    assert_int_equal(f->last_err, MF_UNAVAILABLE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_frames_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rma_get_put, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_frame_fails_endpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_close_is_an_error, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
