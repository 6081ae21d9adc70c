/*
 * libmapflow's GPU fields against a scripted fake daemon that lies: a child process (so
 * its "device memory" from the fake CUDA driver is another process's, as a real daemon's
 * is) announcing malformed GPU arenas in HelloReply, RowRefs that point outside or into
 * unknown arenas, and PutBeginReplies reserving bytes the client cannot write. Every lie
 * must come back as a status (per arena, per row, per call) with the channel still
 * usable: no crash, no write or view outside a mapping.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../fakecuda/fakecuda_env.h"
#include "mf_cudrv.h"
#include "mf_frame.h"
#include "test_client_util.h"

#define NS "wire-ns"
#define MODEL "wire-src"
#define B 16
#define ARENA (1u << 20)
#define HOST_ARENA (1u << 20)
#define N_ANNOUNCED 6

static uint32_t g_tokens[B * 4];
static pid_t g_liar; /* killed by the teardown too, so a failed assertion leaves no child */

static uint8_t *the_row(size_t *len)
{
    tc_tokens(g_tokens, B * 4, 5);
    uint8_t *r = tc_make_row(NS, MODEL, 2, B, 4, g_tokens, 1, MF_CODEC_FP16, 77, len);
    assert_non_null(r);
    return r;
}

/* ==== the lying daemon (child process) =============================================== */

typedef struct liar {
    int cfd, host_fd;
    mf_cu_ipc_mem_handle_t handle;
    uint8_t uuid[16];
    char pci[32];
    int put_begins;
} liar_t;

static void send_env(liar_t *l, mf_envelope_t *env, int fd)
{
    if (tc_send_frame(l->cfd, env, NULL, 0, fd) != MF_OK)
        _exit(3);
}

static void liar_hello(liar_t *l, const mf_envelope_t *q)
{
    static uint8_t junk[64], short_handle[10], short_uuid[5];
    memset(junk, 0x5a, sizeof(junk));
    Mapflow__V1__GpuArena a[N_ANNOUNCED], *ap[N_ANNOUNCED];
    for (int i = 0; i < N_ANNOUNCED; i++) {
        mapflow__v1__gpu_arena__init(&a[i]);
        ap[i] = &a[i];
        a[i].index = (uint32_t)i;
        a[i].bytes = ARENA;
        a[i].pci_bus_id = l->pci;
        a[i].ipc_handle.data = (uint8_t *)l->handle.reserved;
        a[i].ipc_handle.len = 64;
        a[i].uuid.data = l->uuid;
        a[i].uuid.len = 16;
    }
    a[1].ipc_handle = (ProtobufCBinaryData){sizeof(short_handle), short_handle};
    a[2].uuid = (ProtobufCBinaryData){sizeof(short_uuid), short_uuid};
    a[3].bytes = 0;
    a[4].index = 0;                                   /* a second arena 0 */
    a[5].ipc_handle = (ProtobufCBinaryData){sizeof(junk), junk}; /* opens nothing */
    Mapflow__V1__HelloReply h = MAPFLOW__V1__HELLO_REPLY__INIT;
    h.protocol_version = 1;
    h.daemon_version = "liar-1";
    h.session_id = 9;
    h.max_frame = MF_FRAME_DEFAULT_MAX;
    h.max_batch = 1024;
    h.gpu_tier = 1;
    int arena = q->hello->want_host_arena;
    h.host_arena_fd = arena;
    h.host_arena_bytes = arena ? HOST_ARENA : 0;
    if (q->hello->want_gpu_arena) {
        h.n_gpu_arenas = N_ANNOUNCED;
        h.gpu_arenas = ap;
    }
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = q->request_id;
    r.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
    r.hello_reply = &h;
    send_env(l, &r, arena ? l->host_fd : -1);
}

/* Row i of a Get: 0 the real row at offset 0 of arena 0; then outside the arena, an
 * unknown arena, an unaligned offset, an absurd length. */
static void liar_get(liar_t *l, const mf_envelope_t *q, size_t row_len)
{
    size_t n = q->get->n_keys;
    Mapflow__V1__RowRef rr[8], *rp[8];
    if (n > 8)
        n = 8;
    for (size_t i = 0; i < n; i++) {
        mapflow__v1__row_ref__init(&rr[i]);
        rp[i] = &rr[i];
        rr[i].status = MF_OK;
        rr[i].layer = 2;
        rr[i].block = 1;
        rr[i].tier = MAPFLOW__V1__TIER__TIER_GPU;
        rr[i].gpu_arena = 0;
        rr[i].length = row_len;
        rr[i].lease_id = 500 + i;
    }
    if (n > 1)
        rr[1].arena_offset = ARENA - 16;
    if (n > 2)
        rr[2].gpu_arena = 9;
    if (n > 3)
        rr[3].arena_offset = 8;
    if (n > 4)
        rr[4].length = 1ull << 40;
    Mapflow__V1__GetReply g = MAPFLOW__V1__GET_REPLY__INIT;
    g.n_rows = n;
    g.rows = rp;
    g.lease_ttl_ms = 5000;
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = q->request_id;
    r.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
    r.get_reply = &g;
    send_env(l, &r, -1);
}

static void liar_reply(liar_t *l, const mf_envelope_t *q, size_t row_len)
{
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = q->request_id;
    switch (q->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_HELLO:
        liar_hello(l, q);
        return;
    case MAPFLOW__V1__ENVELOPE__BODY_GET:
        liar_get(l, q, row_len);
        return;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN: {
        /* alternately: past the end of arena 0, and arena 9 nobody announced */
        Mapflow__V1__PutBeginReply p = MAPFLOW__V1__PUT_BEGIN_REPLY__INIT;
        p.reservation_id = 70 + (uint64_t)l->put_begins;
        p.in_arena = 1;
        p.tier = MAPFLOW__V1__TIER__TIER_GPU;
        p.gpu_arena = l->put_begins % 2 ? 9 : 0;
        p.arena_offset = l->put_begins % 2 ? 0 : ARENA - 64;
        l->put_begins++;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY;
        r.put_begin_reply = &p;
        send_env(l, &r, -1);
        return;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_RELEASE: {
        Mapflow__V1__ReleaseReply rel = MAPFLOW__V1__RELEASE_REPLY__INIT;
        rel.released = (uint32_t)q->release->n_lease_ids;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY;
        r.release_reply = &rel;
        send_env(l, &r, -1);
        return;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_ABORT:
        return; /* one-way from the client */
    default: {
        Mapflow__V1__ErrorReply e = MAPFLOW__V1__ERROR_REPLY__INIT;
        e.code = MF_UNIMPLEMENTED;
        e.message = "liar";
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_ERROR;
        r.error = &e;
        send_env(l, &r, -1);
    }
    }
}

/* The child: its own device arena with the real row at offset 0, then connections. */
static void liar_main(int lfd)
{
    liar_t l = {.host_fd = memfd_create("liar-host", MFD_CLOEXEC)};
    if (l.host_fd < 0 || ftruncate(l.host_fd, HOST_ARENA) != 0)
        _exit(3);
    const mf_cudrv_t *t = NULL;
    mf_cu_device_t d;
    mf_cu_context_t c;
    mf_cu_deviceptr_t base;
    mf_cu_uuid_t u;
    size_t row_len;
    uint8_t *row = the_row(&row_len);
    if (mf_cudrv_get(&t, NULL) != MF_OK || t->cuDeviceGet(&d, 0) ||
        t->cuDevicePrimaryCtxRetain(&c, d) || t->cuCtxSetCurrent(c) ||
        t->cuMemAlloc(&base, ARENA) || t->cuMemcpyHtoD(base, row, row_len) ||
        t->cuCtxSynchronize() || /* the copy may land late: the daemon reads it next */
        t->cuIpcGetMemHandle(&l.handle, base) || t->cuDeviceGetUuid(&u, d) ||
        t->cuDeviceGetPCIBusId(l.pci, sizeof(l.pci), d))
        _exit(3);
    memcpy(l.uuid, u.bytes, 16);
    for (;;) {
        l.cfd = accept(lfd, NULL, NULL);
        if (l.cfd < 0)
            _exit(errno == EINTR ? 0 : 3);
        mf_frame_reader_t rd;
        mf_frame_reader_init(&rd, MF_FRAME_DEFAULT_MAX);
        for (int open = 1; open;) {
            uint8_t *p;
            size_t avail;
            mf_frame_reader_space(&rd, 65536, &p, &avail);
            ssize_t got = recv(l.cfd, p, avail, 0);
            if (got <= 0)
                break;
            mf_frame_reader_commit(&rd, (size_t)got);
            for (;;) {
                mf_frame_t f;
                int have = 0;
                const char *why;
                mf_envelope_t *q = NULL;
                if (mf_frame_reader_next(&rd, &f, &have, &why) != MF_OK) {
                    open = 0;
                    break;
                }
                if (!have)
                    break;
                if (mf_envelope_decode(&f, &q, &why) != MF_OK) {
                    open = 0;
                    break;
                }
                liar_reply(&l, q, row_len);
                mf_envelope_free(q);
            }
        }
        mf_frame_reader_deinit(&rd);
        close(l.cfd);
    }
}

/* ==== the client ===================================================================== */

static void test_lies_become_statuses(void **state)
{
    (void)state;
    char dir[] = "/tmp/mfliar-XXXXXX", path[100];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/d.sock", dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(lfd >= 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 4), 0);
    pid_t pid = g_liar = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        liar_main(lfd);
    }
    close(lfd);

    char target[120];
    snprintf(target, sizeof(target), "unix:%s", path);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_GPU | MF_CHANNEL_PARAM_TIMEOUT_MS |
                                           MF_CHANNEL_PARAM_RETRY,
                             .ns = NS, .want_arena = 1, .gpu_device = 0, .timeout_ms = 5000};
    mf_retry_policy_default(&p.retry);
    p.retry.max_retries = 0;
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK)
        fail_msg("open: %s", mf_channel_last_error(ch));

    /* only arena 0 (the first announcement) is usable; each other one says why */
    mf_gpu_info_t gi;
    mf_channel_gpu_info(ch, &gi);
    assert_int_equal(gi.n_announced, N_ANNOUNCED);
    assert_int_equal(gi.n_mapped, 1);
    assert_true(gi.arenas[0].mapped);
    assert_int_equal(gi.arenas[0].device, 0);
    static const char *const want[N_ANNOUNCED] = {"", "64 bytes", "16 bytes", "size of 0",
                                                  "twice", "cuIpcOpenMemHandle"};
    for (int i = 1; i < N_ANNOUNCED; i++) {
        assert_false(gi.arenas[i].mapped);
        if (!strstr(gi.arenas[i].why, want[i]))
            fail_msg("arena %d: why '%s' lacks '%s'", i, gi.arenas[i].why, want[i]);
    }

    /* rows: one good device view, the others refused one by one */
    size_t row_len;
    uint8_t *row = the_row(&row_len);
    mf_row_view_t v;
    assert_int_equal(mf_row_decode(row, row_len, 0, &v, NULL), MF_OK);
    mf_key_t keys[5];
    for (int i = 0; i < 5; i++)
        keys[i] = (mf_key_t){.model = MODEL, .layer = 2, .hash = v.hash};
    for (int round = 0; round < 2; round++) {
        mf_get_result_t *res = NULL;
        assert_int_equal(mf_get_keys(ch, keys, 5, MF_GET_LEASE, &res, MF_TIMEOUT_DEFAULT),
                         MF_OK);
        assert_int_equal(res->n_rows, 5);
        assert_int_equal(res->rows[0].status, MF_OK);
        assert_int_equal(res->rows[0].on_device, 1);
        assert_memory_equal(res->rows[0].data, row, row_len); /* fake: readable here */
        assert_int_equal(res->rows[1].status, MF_DATA_LOSS);
        assert_int_equal(res->rows[2].status, MF_FAILED_PRECONDITION);
        assert_int_equal(res->rows[3].status, MF_DATA_LOSS);
        assert_int_equal(res->rows[4].status, MF_DATA_LOSS);
        for (int i = 1; i < 5; i++) {
            assert_null(res->rows[i].data);
            assert_int_equal(res->rows[i].on_device, 0);
        }
        assert_int_equal(mf_release_result(ch, res, MF_TIMEOUT_DEFAULT), MF_OK);
        mf_get_result_free(res);

        /* reservations the client cannot write: a status, nothing written */
        st = mf_put(ch, row, row_len, 0, NULL, MF_TIMEOUT_DEFAULT);
        assert_int_equal(st, MF_INTERNAL);
        assert_non_null(strstr(mf_channel_last_error(ch), "outside"));
        st = mf_put(ch, row, row_len, 0, NULL, MF_TIMEOUT_DEFAULT);
        assert_int_equal(st, MF_INTERNAL);
        assert_non_null(strstr(mf_channel_last_error(ch), "did not map"));
    }
    /* the good row's bytes were never touched by the refused puts */
    mf_get_result_t *res = NULL;
    assert_int_equal(mf_get_keys(ch, keys, 1, MF_GET_LEASE, &res, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_memory_equal(res->rows[0].data, row, row_len);
    mf_get_result_free(res);
    mf_channel_close(ch);
    free(row);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    g_liar = 0;
    unlink(path);
    rmdir(dir);
}

static int kill_liar(void **state)
{
    (void)state;
    if (g_liar > 0) {
        kill(g_liar, SIGKILL);
        waitpid(g_liar, NULL, 0);
        g_liar = 0;
    }
    return 0;
}

int main(void)
{
    if (fakecuda_use(1, 0) != 0) {
        fprintf(stderr, "fake CUDA driver not built (make build/lib/tests/libfakecuda.so)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lies_become_statuses, kill_liar),
    };
    return cmocka_run_group_tests_name("client_gpu_wire", tests, NULL, NULL);
}
