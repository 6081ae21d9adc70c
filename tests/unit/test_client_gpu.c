/*
 * libmapflow's GPU arenas against a real mapflowd, on the CPU: the fake CUDA driver
 * (tests/fakecuda, MF_CUDA_DRIVER) gives the daemon and this process memfd-backed
 * "device memory", so device addresses are host addresses the test can memcmp, and IPC
 * handles open across processes as they do on a GPU.
 *
 * Covers: device puts (mf_put_device, batch) land in the gpu tier and lease gets hand
 * back on_device views whose bytes are the rows; host puts through a GPU-mapped channel;
 * copies of GPU rows (payload, and staged through the host arena); a channel without
 * the GPU parameter gets host views and copies only; a daemon restart remaps the new
 * session's arenas; a gpu tier smaller than the rows (device puts staged into the host
 * tier) and a daemon without one (device rows staged into the host arena or sent as the
 * payload); bad device rows and arguments answered with a status. With two fake
 * devices and no peer access (a re-exec of this binary with --no-peer): the arena on the
 * other device stays unmapped with its reason and its rows come back as staged host
 * views with the right bytes, the own device's as device views. Malformed GPU fields
 * from the wire: test_client_gpu_wire.c.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../fakecuda/fakecuda_env.h"
#include "mf_clock.h"
#include "mf_cudrv.h"
#include "mf_frame.h"
#include "test_client_proc.h"
#include "test_client_util.h"

#define NS "gpu-ns"
#define MODEL "gpu-src"
#define B 32
#define HEADS 8
#define NB 6

static const char *g_argv0;

/* ==== device memory through the (fake) driver ======================================== */

static const mf_cudrv_t *cu(void)
{
    const mf_cudrv_t *t = NULL;
    const char *why = NULL;
    if (mf_cudrv_get(&t, &why) != MF_OK)
        fail_msg("CUDA driver: %s", why);
    return t;
}

static void use_device(int ordinal)
{
    mf_cu_device_t d;
    mf_cu_context_t c;
    assert_int_equal(cu()->cuDeviceGet(&d, ordinal), MF_CUDA_SUCCESS);
    assert_int_equal(cu()->cuDevicePrimaryCtxRetain(&c, d), MF_CUDA_SUCCESS);
    assert_int_equal(cu()->cuCtxSetCurrent(c), MF_CUDA_SUCCESS);
}

/* A copy of n host bytes in device memory of `ordinal`. */
static void *dev_copy(int ordinal, const void *src, size_t n)
{
    use_device(ordinal);
    mf_cu_deviceptr_t p = 0;
    assert_int_equal(cu()->cuMemAlloc(&p, n), MF_CUDA_SUCCESS);
    assert_int_equal(cu()->cuMemcpyHtoD(p, src, n), MF_CUDA_SUCCESS);
    return (void *)(uintptr_t)p;
}

static void dev_free(void *p)
{
    assert_int_equal(cu()->cuMemFree((mf_cu_deviceptr_t)(uintptr_t)p), MF_CUDA_SUCCESS);
}

/* ==== rows and channels ============================================================== */

typedef struct rows {
    uint32_t tokens[NB * B + 3];
    uint8_t *row[NB];
    size_t len[NB];
    mf_hash128_t hash[NB];
} rows_t;

static void make_rows(rows_t *r, uint32_t layer, uint64_t seed)
{
    tc_tokens(r->tokens, sizeof(r->tokens) / 4, seed);
    for (uint32_t b = 0; b < NB; b++) {
        r->row[b] = tc_make_row(NS, MODEL, layer, B, HEADS, r->tokens, b, MF_CODEC_FP16,
                                seed * 31 + b, &r->len[b]);
        assert_non_null(r->row[b]);
        mf_row_view_t v;
        assert_int_equal(mf_row_decode(r->row[b], r->len[b], 0, &v, NULL), MF_OK);
        r->hash[b] = v.hash;
    }
}

static void free_rows(rows_t *r)
{
    for (int b = 0; b < NB; b++)
        free(r->row[b]);
}

static mf_channel_t *gchan(const daemon_t *d, int arena, int gpu_device)
{
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", d->sock);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_TIMEOUT_MS | MF_CHANNEL_PARAM_GPU,
                             .ns = NS, .want_arena = arena, .timeout_ms = 10000,
                             .gpu_device = gpu_device};
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK) {
        dump_log(d);
        fail_msg("open: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    }
    return ch;
}

static void start_gpu_daemon(daemon_t *d, int keep)
{
    daemon_start(d, keep, "--gpu_bytes", "4mb", "--host_bytes", "16mb", NULL);
}

static mf_get_result_t *get_layer(mf_channel_t *ch, const rows_t *r, uint32_t layer,
                                  mf_get_mode_t mode)
{
    mf_get_result_t *res = NULL;
    mf_status_t st = mf_get_prefix(ch, MODEL, B, r->tokens, sizeof(r->tokens) / 4, &layer, 1,
                                   0, 0, mode, &res, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("get_prefix: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    assert_int_equal(res->n_rows, NB);
    return res;
}

/* Every row OK, its bytes the source's; device views only where expected. */
static void check_rows(const mf_get_result_t *res, const rows_t *r, int want_on_device)
{
    static const mf_row_view_t zero;
    for (int b = 0; b < NB; b++) {
        const mf_row_ref_t *x = &res->rows[b];
        assert_int_equal(x->status, MF_OK);
        assert_int_equal(x->length, r->len[b]);
        assert_int_equal(x->on_device, want_on_device);
        if (want_on_device) {
            assert_int_equal(x->tier, MF_TIER_GPU);
            assert_memory_equal(&x->view, &zero, sizeof(zero));
        } else {
            assert_int_equal(x->view.block_index, b);
        }
        /* fake driver: a device address is readable here */
        assert_memory_equal(x->data, r->row[b], r->len[b]);
    }
}

static void gpu_info(mf_channel_t *ch, mf_gpu_info_t *gi)
{
    mf_channel_gpu_info(ch, gi);
}

/* The fake driver's record of host registrations in this process (fakecuda.c). */
static int host_registered(const void *p, size_t n, unsigned *flags)
{
    char path[PATH_MAX];
    assert_int_equal(fakecuda_path(path, sizeof(path)), 0);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    int (*f)(const void *, size_t, size_t *, unsigned *);
    *(void **)&f = dlsym(h, "fakecuda_host_registered");
    assert_non_null(f);
    int r = f(p, n, NULL, flags);
    dlclose(h);
    return r;
}

/* The channel's host-arena registration once its thread is done (≤ 20 s). */
static int host_pin_wait(mf_channel_t *ch)
{
    mf_gpu_info_t gi;
    for (int i = 0; i < 2000; i++) {
        gpu_info(ch, &gi);
        if (gi.host_arena_pinned)
            return gi.host_arena_pinned;
        usleep(10000);
    }
    return 0;
}

/* ==== tests against mapflowd ========================================================= */

static void test_device_put_then_device_views(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    rows_t r;
    make_rows(&r, 1, 11);
    mf_channel_t *w = gchan(&d, 1, 0);
    mf_gpu_info_t gi;
    gpu_info(w, &gi);
    assert_int_equal(gi.gpu_device, 0);
    assert_true(gi.driver);
    assert_int_equal(gi.n_announced, 2);
    assert_int_equal(gi.n_mapped, 2);
    assert_int_equal(gi.n_peer, 1);      /* the daemon's arena on device 1 */
    mf_server_info_t si;
    mf_channel_info(w, &si);
    assert_true(si.gpu_tier);

    /* rows 0..3 one by one, 4..5 as a batch */
    void *dev[NB];
    for (int b = 0; b < NB; b++)
        dev[b] = dev_copy(0, r.row[b], r.len[b]);
    for (int b = 0; b < 4; b++) {
        mf_put_result_t pr;
        mf_status_t st = mf_put_device(w, dev[b], r.len[b], 0, &pr, MF_TIMEOUT_DEFAULT);
        if (st != MF_OK)
            fail_msg("put_device: %s: %s", mf_status_name(st), mf_channel_last_error(w));
        assert_int_equal(pr.tier, MF_TIER_GPU);
    }
    mf_put_item_t items[2] = {{.row = dev[4], .len = r.len[4]}, {.row = dev[5], .len = r.len[5]}};
    assert_int_equal(mf_put_device_batch(w, items, 2, 0, MF_TIMEOUT_DEFAULT), MF_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(items[i].status, MF_OK);
        assert_int_equal(items[i].result.tier, MF_TIER_GPU);
    }

    /* a reader with the GPU (leases need the host arena too): device views */
    mf_channel_t *rd = gchan(&d, 1, 0);
    mf_get_result_t *res = get_layer(rd, &r, 1, MF_GET_LEASE);
    check_rows(res, &r, 1);
    for (int b = 0; b < NB; b++) {
        assert_true(res->rows[b].lease_id != 0);
        assert_true(res->rows[b].gpu_arena < 2);
    }
    assert_int_equal(mf_release_result(rd, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    /* copies of GPU rows: payload (no host arena), and through the host arena */
    mf_channel_t *nh = gchan(&d, 0, 0);
    res = get_layer(nh, &r, 1, MF_GET_COPY);
    check_rows(res, &r, 0);
    mf_get_result_free(res);
    mf_channel_close(nh);
    res = get_layer(w, &r, 1, MF_GET_COPY);
    check_rows(res, &r, 0);
    mf_get_result_free(res);
    /* single-row forms */
    mf_key_t k = {.model = MODEL, .layer = 1, .hash = r.hash[2]};
    uint8_t *buf = malloc(r.len[2]);
    size_t len = 0;
    assert_int_equal(mf_get(w, &k, buf, r.len[2], &len, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(len, r.len[2]);
    assert_memory_equal(buf, r.row[2], len);
    free(buf);
    mf_lease_t l;
    assert_int_equal(mf_get_lease(rd, &k, &l, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(l.on_device, 1);
    assert_int_equal(l.length, r.len[2]);
    assert_memory_equal(l.data, r.row[2], l.length);
    assert_int_equal(mf_release(rd, &l.lease_id, 1, NULL, MF_TIMEOUT_DEFAULT), MF_OK);

    /* a host row put through a GPU channel goes to the gpu tier too (client HtoD) */
    rows_t h;
    make_rows(&h, 2, 12);
    for (int b = 0; b < NB; b++) {
        mf_put_result_t pr;
        assert_int_equal(mf_put(w, h.row[b], h.len[b], 0, &pr, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(pr.tier, MF_TIER_GPU);
    }
    res = get_layer(rd, &h, 2, MF_GET_LEASE);
    check_rows(res, &h, 1);
    assert_int_equal(mf_release_result(rd, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);

    mf_channel_close(rd);
    mf_channel_close(w);
    for (int b = 0; b < NB; b++)
        dev_free(dev[b]);
    free_rows(&h);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_no_gpu_param_host_only(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    rows_t r;
    make_rows(&r, 3, 21);
    mf_channel_t *w = gchan(&d, 1, 0);
    for (int b = 0; b < NB; b++) {
        void *dv = dev_copy(0, r.row[b], r.len[b]);
        assert_int_equal(mf_put_device(w, dv, r.len[b], 0, NULL, MF_TIMEOUT_DEFAULT), MF_OK);
        dev_free(dv);
    }
    /* plain channels: host views (staged by the daemon) and copies */
    mf_channel_t *plain = chan(&d, NS, 1);
    mf_gpu_info_t gi;
    gpu_info(plain, &gi);
    assert_int_equal(gi.gpu_device, -1);
    assert_int_equal(gi.n_announced, 0);
    mf_get_result_t *res = get_layer(plain, &r, 3, MF_GET_LEASE);
    check_rows(res, &r, 0);
    for (int b = 0; b < NB; b++)
        assert_int_equal(res->rows[b].tier, MF_TIER_HOST);
    assert_int_equal(mf_release_result(plain, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_t *bare = chan(&d, NS, 0);
    res = get_layer(bare, &r, 3, MF_GET_COPY);
    check_rows(res, &r, 0);
    mf_get_result_free(res);
    /* device puts need the GPU parameter */
    void *dv = dev_copy(0, r.row[0], r.len[0]);
    assert_int_equal(mf_put_device(plain, dv, r.len[0], 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION);
    dev_free(dv);
    mf_channel_close(bare);
    mf_channel_close(plain);
    mf_channel_close(w);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_reconnect_remaps(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    rows_t r;
    make_rows(&r, 4, 31);
    mf_channel_t *ch = gchan(&d, 1, 0);
    mf_server_info_t s1, s2;
    mf_channel_info(ch, &s1);
    mf_gpu_info_t g1, g2;
    gpu_info(ch, &g1);
    assert_int_equal(g1.n_mapped, 2);
    daemon_stop(&d, 0);
    start_gpu_daemon(&d, 1);
    /* the first call after the restart reconnects (retries), then maps the new arenas */
    void *dv[NB];
    for (int b = 0; b < NB; b++) {
        dv[b] = dev_copy(0, r.row[b], r.len[b]);
        mf_status_t st = mf_put_device(ch, dv[b], r.len[b], 0, NULL, MF_TIMEOUT_DEFAULT);
        if (st != MF_OK)
            fail_msg("put_device after restart: %s: %s", mf_status_name(st),
                     mf_channel_last_error(ch));
    }
    mf_channel_info(ch, &s2);
    assert_true(s2.reconnects > s1.reconnects);
    gpu_info(ch, &g2);
    assert_int_equal(g2.n_announced, 2);
    assert_int_equal(g2.n_mapped, 2);
    mf_get_result_t *res = get_layer(ch, &r, 4, MF_GET_LEASE);
    check_rows(res, &r, 1);
    assert_int_equal(mf_release_result(ch, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_close(ch);
    for (int b = 0; b < NB; b++)
        dev_free(dv[b]);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_bad_device_rows(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    rows_t r;
    make_rows(&r, 5, 41);
    mf_channel_t *ch = gchan(&d, 1, 0);
    size_t n = r.len[1];
    void *good = dev_copy(0, r.row[1], n);
    /* wrong length, unaligned, NULL, not device memory at all */
    assert_int_equal(mf_put_device(ch, good, n - 16, 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_device(ch, (uint8_t *)good + 8, n - 16, 0, NULL,
                                   MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_device(ch, NULL, n, 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_device(ch, r.row[1], n, 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_INVALID_ARGUMENT);
    /* random bytes: no row header */
    uint8_t *junk = malloc(n);
    uint64_t s = 99;
    for (size_t i = 0; i < n; i++)
        junk[i] = (uint8_t)tc_rand(&s);
    void *dj = dev_copy(0, junk, n);
    assert_int_equal(mf_put_device(ch, dj, n, 0, NULL, MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    /* a good header over a corrupted body: the daemon's commit-time check refuses it */
    memcpy(junk, r.row[1], n);
    junk[n - 5] ^= 0x5a;
    void *dc = dev_copy(0, junk, n);
    mf_status_t st = mf_put_device(ch, dc, n, 0, NULL, MF_TIMEOUT_DEFAULT);
    assert_true(st == MF_DATA_LOSS || st == MF_INVALID_ARGUMENT);
    mf_key_t k = {.model = MODEL, .layer = 5, .hash = r.hash[1]};
    size_t len;
    assert_int_equal(mf_get(ch, &k, junk, n, &len, MF_TIMEOUT_DEFAULT), MF_NOT_FOUND);
    /* the good one still goes in */
    assert_int_equal(mf_put_device(ch, good, n, 0, NULL, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_get(ch, &k, junk, n, &len, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_memory_equal(junk, r.row[1], n);
    /* a bad gpu_device */
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", d.sock);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_GPU, .gpu_device = -7};
    mf_channel_t *bad = NULL;
    assert_int_equal(mf_channel_open(target, &p, &bad), MF_INVALID_ARGUMENT);
    mf_channel_close(bad);
    /* an ordinal this process does not have: opens, works through host memory */
    p.gpu_device = 9;
    assert_int_equal(mf_channel_open(target, &p, &bad), MF_OK);
    mf_gpu_info_t gi;
    gpu_info(bad, &gi);
    assert_false(gi.driver);
    assert_non_null(strstr(gi.why, "gpu_device 9"));
    assert_int_equal(gi.n_announced, 0);
    assert_int_equal(mf_put_device(bad, good, n, 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION);
    mf_channel_close(bad);
    free(junk);
    dev_free(dj);
    dev_free(dc);
    dev_free(good);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* A gpu tier smaller than most rows: device puts land on the host tier (staged through
 * host memory, DtoH into the host arena) and every row still reads back right. */
static void test_full_gpu_tier_stages_to_host(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--gpu_bytes", "24kb", "--host_bytes", "16mb", NULL);
    rows_t r;
    make_rows(&r, 8, 61);
    mf_channel_t *ch = gchan(&d, 1, 0);
    int tiers[4] = {0};
    for (int b = 0; b < NB; b++) {
        void *dv = dev_copy(0, r.row[b], r.len[b]);
        mf_put_result_t pr;
        mf_status_t st = mf_put_device(ch, dv, r.len[b], 0, &pr, MF_TIMEOUT_DEFAULT);
        if (st != MF_OK)
            fail_msg("put_device: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
        assert_true(pr.tier == MF_TIER_GPU || pr.tier == MF_TIER_HOST);
        tiers[pr.tier]++;
        dev_free(dv);
    }
    assert_true(tiers[MF_TIER_HOST] > 0);
    assert_true(tiers[MF_TIER_GPU] > 0); /* block 0 (one column) fits */
    mf_get_result_t *res = get_layer(ch, &r, 8, MF_GET_LEASE);
    int dev_views = 0;
    for (int b = 0; b < NB; b++) {
        const mf_row_ref_t *x = &res->rows[b];
        assert_int_equal(x->status, MF_OK);
        assert_int_equal(x->on_device, x->tier == MF_TIER_GPU);
        dev_views += x->on_device;
        assert_memory_equal(x->data, r.row[b], r.len[b]);
    }
    assert_true(dev_views > 0 && dev_views < NB);
    /* A gpu_device channel page-locks its host arena (PORTABLE): the host views' bytes,
     * which the caller copies to its device, lie in that registration. */
    assert_int_equal(host_pin_wait(ch), 1);
    const void *host_view = NULL;
    size_t host_len = 0;
    for (int b = 0; b < NB; b++)
        if (!res->rows[b].on_device) {
            host_view = res->rows[b].data;
            host_len = res->rows[b].length;
        }
    unsigned flags = 0;
    assert_true(host_registered(host_view, host_len, &flags));
    assert_int_equal(flags, MF_CU_MEMHOSTREGISTER_PORTABLE);
    /* A channel without gpu_device maps the same arena elsewhere and leaves it pageable. */
    mf_channel_t *plain = chan(&d, NS, 1);
    mf_get_result_t *pres = get_layer(plain, &r, 8, MF_GET_LEASE);
    check_rows(pres, &r, 0);
    mf_gpu_info_t gi;
    gpu_info(plain, &gi);
    assert_int_equal(gi.host_arena_pinned, 0);
    for (int b = 0; b < NB; b++) {
        assert_int_equal(pres->rows[b].tier, MF_TIER_HOST);
        assert_false(host_registered(pres->rows[b].data, pres->rows[b].length, NULL));
    }
    assert_int_equal(mf_release_result(plain, pres, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(pres);
    mf_channel_close(plain);
    assert_int_equal(mf_release_result(ch, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_close(ch);
    /* Unregistered at close (before the munmap). */
    assert_false(host_registered(host_view, host_len, NULL));
    /* MAPFLOW_GPU_ARENAS=off: a gpu_device channel maps no GPU arena; every row comes back
     * staged in its host arena, which it pins. */
    setenv("MAPFLOW_GPU_ARENAS", "off", 1);
    ch = gchan(&d, 1, 0);
    unsetenv("MAPFLOW_GPU_ARENAS");
    mf_gpu_info_t gi3;
    gpu_info(ch, &gi3);
    assert_int_equal(gi3.n_announced, 0);
    assert_int_equal(host_pin_wait(ch), 1);
    res = get_layer(ch, &r, 8, MF_GET_LEASE);
    check_rows(res, &r, 0);
    for (int b = 0; b < NB; b++) {
        assert_int_equal(res->rows[b].tier, MF_TIER_HOST);
        assert_true(host_registered(res->rows[b].data, res->rows[b].length, NULL));
    }
    assert_int_equal(mf_release_result(ch, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_close(ch);
    /* MAPFLOW_HOST_PIN=off: a gpu_device channel leaves its mapping pageable. */
    setenv("MAPFLOW_HOST_PIN", "off", 1);
    ch = gchan(&d, 1, 0);
    unsetenv("MAPFLOW_HOST_PIN");
    res = get_layer(ch, &r, 8, MF_GET_LEASE);
    int host_views = 0;
    for (int b = 0; b < NB; b++)
        if (!res->rows[b].on_device) {
            host_views++;
            assert_false(host_registered(res->rows[b].data, res->rows[b].length, NULL));
        }
    assert_true(host_views > 0);
    mf_gpu_info_t gi2;
    gpu_info(ch, &gi2);
    assert_int_equal(gi2.host_arena_pinned, 0);
    assert_int_equal(mf_release_result(ch, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* A daemon without a gpu tier: device rows are staged through host memory, into the host
 * arena (DtoH straight into it) or as the PutCommit payload. */
static void test_daemon_without_gpu_tier(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "16mb", NULL);
    rows_t r;
    make_rows(&r, 9, 71);
    mf_channel_t *arena = gchan(&d, 1, 0), *bare = gchan(&d, 0, 0);
    mf_gpu_info_t gi;
    gpu_info(arena, &gi);
    assert_true(gi.driver);
    assert_int_equal(gi.n_announced, 0);
    for (int b = 0; b < NB; b++) {
        void *dv = dev_copy(0, r.row[b], r.len[b]);
        mf_put_result_t pr;
        mf_status_t st = mf_put_device(b % 2 ? arena : bare, dv, r.len[b], 0, &pr,
                                       MF_TIMEOUT_DEFAULT);
        if (st != MF_OK)
            fail_msg("put_device: %s: %s", mf_status_name(st),
                     mf_channel_last_error(b % 2 ? arena : bare));
        assert_int_equal(pr.tier, MF_TIER_HOST);
        dev_free(dv);
    }
    mf_get_result_t *res = get_layer(arena, &r, 9, MF_GET_LEASE);
    check_rows(res, &r, 0);
    assert_int_equal(mf_release_result(arena, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    mf_channel_close(bare);
    mf_channel_close(arena);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* --no-peer: two devices, no peer access (driver state is per process: a re-exec). */
static void test_no_peer_staged(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    rows_t r0, r1;
    make_rows(&r0, 6, 51);
    make_rows(&r1, 7, 52);
    /* writers on each device: each maps only its own device's arena */
    mf_channel_t *w0 = gchan(&d, 0, 0), *w1 = gchan(&d, 0, 1);
    mf_gpu_info_t gi;
    gpu_info(w0, &gi);
    assert_int_equal(gi.n_announced, 2);
    assert_int_equal(gi.n_mapped, 1);
    assert_int_equal(gi.n_peer, 0);
    int other = gi.arenas[0].mapped ? 1 : 0;
    assert_false(gi.arenas[other].mapped);
    assert_int_equal(gi.arenas[other].device, 1);
    assert_non_null(strstr(gi.arenas[other].why, "peer"));
    for (int b = 0; b < NB; b++) {
        void *a = dev_copy(0, r0.row[b], r0.len[b]);
        void *c = dev_copy(1, r1.row[b], r1.len[b]);
        mf_put_result_t p0, p1;
        assert_int_equal(mf_put_device(w0, a, r0.len[b], 0, &p0, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(mf_put_device(w1, c, r1.len[b], 0, &p1, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(p0.tier, MF_TIER_GPU);
        assert_int_equal(p1.tier, MF_TIER_GPU);
        dev_free(a);
        dev_free(c);
    }
    /* a reader on device 0 with the host arena: own-device rows as device views, the
     * other device's staged into host views */
    mf_channel_t *rd = gchan(&d, 1, 0);
    mf_get_result_t *res = get_layer(rd, &r0, 6, MF_GET_LEASE);
    check_rows(res, &r0, 1);
    assert_int_equal(mf_release_result(rd, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    res = get_layer(rd, &r1, 7, MF_GET_LEASE);
    check_rows(res, &r1, 0);
    for (int b = 0; b < NB; b++)
        assert_int_equal(res->rows[b].tier, MF_TIER_HOST);
    assert_int_equal(mf_release_result(rd, res, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(res);
    /* without the host arena: copies, right bytes */
    mf_channel_t *nh = gchan(&d, 0, 0);
    res = get_layer(nh, &r1, 7, MF_GET_COPY);
    check_rows(res, &r1, 0);
    mf_get_result_free(res);
    mf_channel_close(nh);
    mf_channel_close(rd);
    mf_channel_close(w1);
    mf_channel_close(w0);
    free_rows(&r0);
    free_rows(&r1);
    daemon_stop(&d, 1);
}

static void test_no_peer_reexec(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(g_argv0, g_argv0, "--no-peer", (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ==== put regions ===================================================================== */

/* Rows written in place: random rows (one flipped byte after sealing) into the region's
 * device addresses, committed; Get returns the others byte-identical; the misuse cases. */
static void test_region_put_get(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    mf_channel_t *w = gchan(&d, 1, 0);
    rows_t r;
    uint64_t seed = (uint64_t)getpid() * 7919u + 5;
    make_rows(&r, 7, seed);
    size_t lens[NB];
    for (int b = 0; b < NB; b++)
        lens[b] = r.len[b];
    void *dev[NB];
    mf_put_region_t *reg = NULL;
    mf_status_t st = mf_put_region_begin(w, MODEL, 7, lens, NB, 0, NULL, dev, &reg,
                                         MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("region begin: %s: %s", mf_status_name(st), mf_channel_last_error(w));
    assert_int_equal(mf_put_region_rows(reg), NB);
    /* "The source's kernels" write the rows in place (in the channel's device context). */
    use_device(0);
    const int bad = (int)(seed % NB);
    for (int b = 0; b < NB; b++) {
        assert_ptr_equal(mf_put_region_row(reg, (size_t)b), dev[b]);
        assert_int_equal((uintptr_t)dev[b] % 16, 0);
        assert_int_equal(cu()->cuMemcpyHtoD((mf_cu_deviceptr_t)(uintptr_t)dev[b], r.row[b],
                                            r.len[b]), MF_CUDA_SUCCESS);
    }
    uint8_t byte;
    size_t at = r.len[bad] - 1 - (size_t)(seed % 64); /* in the tiles */
    mf_cu_deviceptr_t p = (mf_cu_deviceptr_t)(uintptr_t)dev[bad] + at;
    assert_int_equal(cu()->cuMemcpyDtoH(&byte, p, 1), MF_CUDA_SUCCESS);
    byte ^= 0x20;
    assert_int_equal(cu()->cuMemcpyHtoD(p, &byte, 1), MF_CUDA_SUCCESS);
    assert_int_equal(cu()->cuCtxSynchronize(), MF_CUDA_SUCCESS);
    mf_status_t sts[NB];
    mf_put_region_result_t res;
    st = mf_put_region_commit(reg, sts, &res, MF_TIMEOUT_DEFAULT);
    assert_int_equal(st, MF_DATA_LOSS);
    assert_non_null(strstr(mf_channel_last_error(w), "checksum"));
    assert_int_equal(res.committed, NB - 1);
    assert_int_equal(res.first_failed, bad);
    for (int b = 0; b < NB; b++)
        assert_int_equal(sts[b], b == bad ? MF_DATA_LOSS : MF_OK);
    /* Get by key: the good rows byte-identical, the refused one absent. */
    for (int b = 0; b < NB; b++) {
        mf_key_t k = {.model = MODEL, .layer = 7, .hash = r.hash[b]};
        uint8_t *buf = malloc(r.len[b]);
        size_t len = 0;
        st = mf_get(w, &k, buf, r.len[b], &len, MF_TIMEOUT_DEFAULT);
        if (b == bad) {
            assert_int_equal(st, MF_NOT_FOUND);
        } else {
            assert_int_equal(st, MF_OK);
            assert_int_equal(len, r.len[b]);
            assert_memory_equal(buf, r.row[b], len);
        }
        free(buf);
    }
    /* A second commit, an abort after it: FAILED_PRECONDITION, nothing sent. */
    assert_int_equal(mf_put_region_commit(reg, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION);
    assert_int_equal(mf_put_region_abort(reg, MF_TIMEOUT_DEFAULT), MF_FAILED_PRECONDITION);
    mf_put_region_free(reg);
    /* Abort, then commit: FAILED_PRECONDITION. */
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, lens, 2, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_put_region_abort(reg, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_put_region_commit(reg, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION);
    assert_non_null(strstr(mf_channel_last_error(w), "aborted"));
    mf_put_region_free(reg);
    /* The async commit: one event, the statuses and result written before it. */
    rows_t r8;
    make_rows(&r8, 8, seed + 1);
    assert_int_equal(mf_put_region_begin(w, MODEL, 8, r8.len, NB, 0, NULL, dev, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_OK);
    for (int b = 0; b < NB; b++)
        assert_int_equal(cu()->cuMemcpyHtoD((mf_cu_deviceptr_t)(uintptr_t)dev[b], r8.row[b],
                                            r8.len[b]), MF_CUDA_SUCCESS);
    assert_int_equal(cu()->cuCtxSynchronize(), MF_CUDA_SUCCESS);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    for (int b = 0; b < NB; b++)
        sts[b] = MF_UNKNOWN;
    assert_int_equal(mf_put_region_commit_async(reg, sts, &res, MF_TIMEOUT_DEFAULT, cq, &r8,
                                                NULL), MF_OK);
    mf_cq_event_t ev;
    assert_int_equal(mf_cq_next(cq, 10000, &ev), MF_CQ_CALL_DONE);
    assert_ptr_equal(ev.tag, &r8);
    assert_int_equal(ev.status, MF_OK);
    assert_int_equal(res.committed, NB);
    assert_int_equal(res.first_failed, NB);
    for (int b = 0; b < NB; b++)
        assert_int_equal(sts[b], MF_OK);
    mf_put_region_free(reg);
    mf_cq_shutdown(cq);
    assert_int_equal(mf_cq_next(cq, 10000, &ev), MF_CQ_SHUTDOWN);
    mf_cq_destroy(cq);
    for (int b = 0; b < NB; b++) {
        mf_key_t k = {.model = MODEL, .layer = 8, .hash = r8.hash[b]};
        uint8_t *buf = malloc(r8.len[b]);
        size_t len = 0;
        assert_int_equal(mf_get(w, &k, buf, r8.len[b], &len, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_memory_equal(buf, r8.row[b], r8.len[b]);
        free(buf);
    }
    free_rows(&r8);
    /* Bounds and fallbacks: no rows, a row shorter than a header, durable, more rows than
     * MF_PUT_BATCH_MAX, a region larger than the arena (4 MiB), no GPU on the channel. */
    size_t tiny[2] = {lens[0], 40}, big[2] = {3u << 20, 3u << 20};
    reg = (mf_put_region_t *)1;
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, lens, 0, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_null(reg);
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, tiny, 2, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, lens, 2, MF_PUT_DURABLE, NULL, NULL,
                                         &reg, MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, lens, MF_PUT_BATCH_MAX + 1, 0, NULL,
                                         NULL, &reg, MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_begin(w, MODEL, 7, big, 2, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(mf_channel_last_error(w), "GPU arena"));
    mf_channel_t *h = gchan(&d, 1, -1);
    assert_int_equal(mf_put_region_begin(h, MODEL, 7, lens, 2, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_FAILED_PRECONDITION);
    assert_non_null(strstr(mf_channel_last_error(h), "mf_put_device_batch"));
    mf_channel_close(h);
    /* A handle freed unused gives its block back (one-way abort): a new region fills the
     * arena's half again. */
    size_t half[1] = {(2u << 20) - 4096};
    for (int k = 0; k < 3; k++) {
        for (int tries = 0; tries < 200; tries++) {
            st = mf_put_region_begin(w, MODEL, 7, half, 1, 0, NULL, NULL, &reg,
                                     MF_TIMEOUT_DEFAULT);
            if (st != MF_RESOURCE_EXHAUSTED)
                break;
            usleep(10000); /* the previous abort is one-way: it may still be in flight */
        }
        assert_int_equal(st, MF_OK);
        mf_put_region_free(reg);
    }
    mf_channel_close(w);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* A region reserved by capacity: rows written at the addresses with random bytes in the
 * slack, the actual lengths set, committed (async: the lengths travel with it); Get returns
 * every row byte-identical. The misuse cases of mf_put_region_set_lengths. */
static void test_region_capacities(void **state)
{
    (void)state;
    daemon_t d;
    start_gpu_daemon(&d, 0);
    mf_channel_t *w = gchan(&d, 1, 0);
    rows_t r;
    uint64_t seed = (uint64_t)getpid() * 104729u + 11;
    make_rows(&r, 9, seed);
    size_t caps[NB], exact[NB];
    for (int b = 0; b < NB; b++) {
        caps[b] = r.len[b] + (size_t)((seed >> (b % 32)) % 3000) + (b ? 1 : 0);
        exact[b] = r.len[b];
    }
    mf_put_region_params_t prm = {.field_mask = MF_PUT_REGION_PARAM_CAPACITIES,
                                  .capacities = 1};
    void *dev[NB];
    mf_put_region_t *reg = NULL;
    mf_status_t st = mf_put_region_begin(w, MODEL, 9, caps, NB, 0, &prm, dev, &reg,
                                         MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("region begin: %s: %s", mf_status_name(st), mf_channel_last_error(w));
    use_device(0);
    uint64_t rng = seed;
    for (int b = 0; b < NB; b++) {
        uint8_t *junk = malloc(caps[b]);
        for (size_t k = 0; k < caps[b]; k++)
            junk[k] = (uint8_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 56);
        memcpy(junk, r.row[b], r.len[b]);
        assert_int_equal(cu()->cuMemcpyHtoD((mf_cu_deviceptr_t)(uintptr_t)dev[b], junk,
                                            caps[b]), MF_CUDA_SUCCESS);
        free(junk);
    }
    assert_int_equal(cu()->cuCtxSynchronize(), MF_CUDA_SUCCESS);
    /* No lengths yet: the commit is refused before anything is sent. */
    assert_int_equal(mf_put_region_commit(reg, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION);
    assert_non_null(strstr(mf_channel_last_error(w), "mf_put_region_set_lengths"));
    size_t wrong[NB];
    memcpy(wrong, exact, sizeof(wrong));
    wrong[NB - 1] = caps[NB - 1] + 1;
    assert_int_equal(mf_put_region_set_lengths(reg, wrong, NB), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(mf_channel_last_error(w), "its capacity"));
    wrong[NB - 1] = MF_ROW_HEADER - 1;
    assert_int_equal(mf_put_region_set_lengths(reg, wrong, NB), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_set_lengths(reg, exact, NB - 1), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_set_lengths(reg, NULL, NB), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_put_region_commit(reg, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_FAILED_PRECONDITION); /* still none set */
    assert_int_equal(mf_put_region_set_lengths(reg, exact, NB), MF_OK);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    mf_status_t sts[NB];
    mf_put_region_result_t res;
    assert_int_equal(mf_put_region_commit_async(reg, sts, &res, MF_TIMEOUT_DEFAULT, cq, &r,
                                                NULL), MF_OK);
    mf_cq_event_t ev;
    assert_int_equal(mf_cq_next(cq, 10000, &ev), MF_CQ_CALL_DONE);
    assert_int_equal(ev.status, MF_OK);
    assert_int_equal(res.committed, NB);
    assert_int_equal(mf_put_region_set_lengths(reg, exact, NB), MF_FAILED_PRECONDITION);
    mf_put_region_free(reg);
    mf_cq_shutdown(cq);
    assert_int_equal(mf_cq_next(cq, 10000, &ev), MF_CQ_SHUTDOWN);
    mf_cq_destroy(cq);
    for (int b = 0; b < NB; b++) {
        mf_key_t k = {.model = MODEL, .layer = 9, .hash = r.hash[b]};
        uint8_t *buf = malloc(caps[b]);
        size_t len = 0;
        assert_int_equal(mf_get(w, &k, buf, caps[b], &len, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(len, r.len[b]);
        assert_memory_equal(buf, r.row[b], len);
        free(buf);
    }
    /* Lengths on a region begun with exact lengths: refused by the library. */
    assert_int_equal(mf_put_region_begin(w, MODEL, 9, exact, 2, 0, NULL, NULL, &reg,
                                         MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_put_region_set_lengths(reg, exact, 2), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(mf_channel_last_error(w), "exact lengths"));
    assert_int_equal(mf_put_region_abort(reg, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_put_region_free(reg);
    mf_channel_close(w);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* One source layer of the bench: n_blocks rows (MASK, 40 heads, B = 64) of one layer. */
static uint8_t **bench_layer(const uint32_t *tokens, uint32_t layer, uint32_t n_blocks,
                             size_t *len)
{
    uint8_t **rows = calloc(n_blocks, sizeof(*rows));
    for (uint32_t b = 0; b < n_blocks; b++) {
        rows[b] = tc_make_row(NS, MODEL, layer, 64, 40, tokens, b, MF_CODEC_MASK,
                              layer * 100003u + b, &len[b]);
        assert_non_null(rows[b]);
    }
    return rows;
}

/* MF_REGION_BENCH=LAYERSxBLOCKS (e.g. 30x512: 15,360 rows): the CPU / fake-driver time of a
 * source's export through put regions (one begin + one commit per layer, rows written in
 * place) against mf_put_device_batch of the same rows from device memory. Printed, not
 * asserted; skipped unless asked (timed tests stay out of `make test`). */
static void test_region_bench(void **state)
{
    (void)state;
    const char *spec = getenv("MF_REGION_BENCH");
    unsigned nl = 0, nb = 0;
    if (!spec || sscanf(spec, "%ux%u", &nl, &nb) != 2 || !nl || !nb || nb > 4096)
        skip();
    daemon_t d;
    daemon_start(&d, 0, "--gpu_bytes", "512mb", "--host_bytes", "256mb", "--write_through",
                 "off", NULL);
    mf_channel_t *w = gchan(&d, 1, 0);
    uint32_t *tokens = malloc((size_t)nb * 64 * 4);
    tc_tokens(tokens, (size_t)nb * 64, 77);
    size_t *len = malloc((size_t)nl * nb * sizeof(*len));
    uint8_t ***rows = malloc(nl * sizeof(*rows));
    size_t bytes = 0;
    for (unsigned l = 0; l < nl; l++) {
        rows[l] = bench_layer(tokens, l, nb, len + (size_t)l * nb);
        for (unsigned b = 0; b < nb; b++)
            bytes += len[(size_t)l * nb + b];
    }
    /* Baseline: the rows already in device memory (the source's scratch), put as batches
     * of one layer each (layers 0..nl-1). */
    void **dev = malloc((size_t)nl * nb * sizeof(*dev));
    for (size_t k = 0; k < (size_t)nl * nb; k++)
        dev[k] = dev_copy(0, rows[k / nb][k % nb], len[k]);
    mf_put_item_t *items = calloc(nb, sizeof(*items));
    double t0 = mf_now_s();
    for (unsigned l = 0; l < nl; l++) {
        for (unsigned b = 0; b < nb; b++)
            items[b] = (mf_put_item_t){.row = dev[(size_t)l * nb + b],
                                       .len = len[(size_t)l * nb + b]};
        assert_int_equal(mf_put_device_batch(w, items, nb, 0, MF_TIMEOUT_INFINITE), MF_OK);
    }
    double t_batch = mf_now_s() - t0;
    /* Regions: the same rows under layers nl..2nl-1 (fresh keys), written in place. */
    for (unsigned l = 0; l < nl; l++)
        for (unsigned b = 0; b < nb; b++)
            free(rows[l][b]);
    for (unsigned l = 0; l < nl; l++) {
        free(rows[l]);
        rows[l] = bench_layer(tokens, nl + l, nb, len + (size_t)l * nb);
    }
    double t_begin = 0, t_write = 0, t_commit = 0;
    int on_gpu = 0;
    use_device(0);
    for (unsigned l = 0; l < nl; l++) {
        mf_put_region_t *reg = NULL;
        double a = mf_now_s();
        mf_status_t st = mf_put_region_begin(w, MODEL, nl + l, len + (size_t)l * nb, nb, 0,
                                             NULL, NULL, &reg, MF_TIMEOUT_INFINITE);
        if (st != MF_OK)
            fail_msg("region begin: %s: %s", mf_status_name(st), mf_channel_last_error(w));
        double b0 = mf_now_s();
        for (unsigned b = 0; b < nb; b++) /* the source's kernels' writes */
            assert_int_equal(cu()->cuMemcpyHtoD((mf_cu_deviceptr_t)(uintptr_t)
                                                    mf_put_region_row(reg, b),
                                                rows[l][b], len[(size_t)l * nb + b]),
                             MF_CUDA_SUCCESS);
        assert_int_equal(cu()->cuCtxSynchronize(), MF_CUDA_SUCCESS);
        double c0 = mf_now_s();
        mf_put_region_result_t res;
        assert_int_equal(mf_put_region_commit(reg, NULL, &res, MF_TIMEOUT_INFINITE), MF_OK);
        assert_int_equal(res.committed, nb);
        on_gpu = res.checked_on_gpu;
        mf_put_region_free(reg);
        double e = mf_now_s();
        t_begin += b0 - a;
        t_write += c0 - b0;
        t_commit += e - c0;
    }
    double t_region = t_begin + t_commit;
    /* The target's side: every region row of the nl layers in one leased prefix Get (device
     * views, as the hand-off's get), 5 times; each row checked OK and on the device. */
    uint32_t *gl = malloc(nl * sizeof(*gl));
    for (unsigned l = 0; l < nl; l++)
        gl[l] = nl + l;
    double tg[5];
    for (int r = 0; r < 5; r++) {
        mf_get_result_t *res = NULL;
        double a = mf_now_s();
        mf_status_t st = mf_get_prefix(w, MODEL, 64, tokens, (size_t)nb * 64, gl, nl, 0, 0,
                                       MF_GET_LEASE, &res, MF_TIMEOUT_INFINITE);
        tg[r] = mf_now_s() - a;
        if (st != MF_OK)
            fail_msg("prefix get: %s: %s", mf_status_name(st), mf_channel_last_error(w));
        assert_int_equal(res->n_rows, (size_t)nl * nb);
        for (size_t k = 0; k < res->n_rows; k++) {
            assert_int_equal(res->rows[k].status, MF_OK);
            assert_true(res->rows[k].on_device);
        }
        assert_int_equal(mf_release_result(w, res, MF_TIMEOUT_INFINITE), MF_OK);
        mf_get_result_free(res);
    }
    for (int i = 1; i < 5; i++) /* insertion sort: the median of 5 */
        for (int j = i; j > 0 && tg[j] < tg[j - 1]; j--) {
            double x = tg[j];
            tg[j] = tg[j - 1];
            tg[j - 1] = x;
        }
    free(gl);
    size_t longest = 0;
    for (size_t k = 0; k < (size_t)nl * nb; k++)
        longest = len[k] > longest ? len[k] : longest;
    printf("region bench: %u layers x %u rows = %u rows, %.1f MiB (MASK rows, 40 heads, "
           "B 64, longest %zu B); checksums %s\n", nl, nb, nl * nb, (double)bytes / (1 << 20),
           longest, longest <= 4096 ? "on the host (rows of <= 4 KiB are copied whole)"
                    : on_gpu        ? "on the GPU (kernels)"
                                    : "on the host (rows copied whole)");
    printf("  mf_put_device_batch: %.1f ms (%.1f us/row)\n", t_batch * 1e3,
           t_batch * 1e6 / (nl * nb));
    printf("  put region: %.1f ms (%.1f us/row): begin %.1f ms, commit %.1f ms; the rows' "
           "writes (the source's kernels, not counted) %.1f ms\n", t_region * 1e3,
           t_region * 1e6 / (nl * nb), t_begin * 1e3, t_commit * 1e3, t_write * 1e3);
    printf("  ratio mf_put_device_batch / put region: %.1fx\n", t_batch / t_region);
    printf("  leased prefix get of the %u region rows (device views, one call): median %.1f ms"
           " (min %.1f, max %.1f) of 5\n", nl * nb, tg[2] * 1e3, tg[0] * 1e3, tg[4] * 1e3);
    fflush(stdout);
    for (size_t k = 0; k < (size_t)nl * nb; k++)
        dev_free(dev[k]);
    for (unsigned l = 0; l < nl; l++) {
        for (unsigned b = 0; b < nb; b++)
            free(rows[l][b]);
        free(rows[l]);
    }
    free(rows);
    free(dev);
    free(items);
    free(len);
    free(tokens);
    mf_channel_close(w);
    daemon_stop(&d, 1);
}

int main(int argc, char **argv)
{
    g_argv0 = argv[0];
    tp_find_mapflowd(argv[0]);
    int no_peer = argc > 1 && strcmp(argv[1], "--no-peer") == 0;
    if (fakecuda_use(2, no_peer) != 0) {
        fprintf(stderr, "fake CUDA driver not built (make build/lib/tests/libfakecuda.so)\n");
        return 1;
    }
    if (no_peer) {
        const struct CMUnitTest t[] = {cmocka_unit_test(test_no_peer_staged)};
        return cmocka_run_group_tests_name("client_gpu_no_peer", t, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_put_then_device_views),
        cmocka_unit_test(test_no_gpu_param_host_only),
        cmocka_unit_test(test_reconnect_remaps),
        cmocka_unit_test(test_bad_device_rows),
        cmocka_unit_test(test_full_gpu_tier_stages_to_host),
        cmocka_unit_test(test_daemon_without_gpu_tier),
        cmocka_unit_test(test_no_peer_reexec),
        cmocka_unit_test(test_region_put_get),
        cmocka_unit_test(test_region_capacities),
        cmocka_unit_test(test_region_bench),
    };
    return cmocka_run_group_tests_name("client_gpu", tests, NULL, NULL);
}
