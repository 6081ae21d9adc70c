/*
 * test_daemon_gpu — the daemon's GPU tier on CPU: a real mapflowd process loads the fake
 * CUDA driver (tests/fakecuda, MF_CUDA_DRIVER) and this process is its client over the raw
 * wire (test_daemon_util.h), opening the announced arenas with cuIpcOpenMemHandle through
 * the same driver, as libmapflow does. Covers: puts placed on the GPU tier (client-side
 * copy into the IPC mapping, and payload → HtoD), commit-time validation of GPU rows,
 * GET_LEASE device views read through the mapping, GET_COPY of GPU rows, staged host views
 * for a client that did not map the arena, eviction gpu → host → ssd keeping every
 * acknowledged row readable and exact while leased GPU rows stay put, two devices without
 * peer access, the tier off (gpu_bytes 0, no driver) with its reason in Stats/Health, and
 * host_pin (the host arena registered with the driver, a refusal survived, off).
 *
 * MF_GPU_REAL=1 runs the same tests on the real libcuda (an H200: the daemon's arenas are
 * device memory, this process opens them through CUDA IPC); the fake-only test (two
 * devices without peer access) is skipped then. MF_GPU_TESTS=PATTERN runs only the tests
 * it names (cmocka filter); MF_GPU_BENCH_ROWS sets test_big_device_rows' put count.
 * Copies this process makes into the daemon's arenas are synchronized before PutCommit:
 * on a GPU a pageable HtoD or a DtoD returns before the bytes land (the fake driver
 * queues them likewise), and the daemon reads the row from another process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>


#include "test_client_proc.h" /* a real mapflowd: daemon_start / daemon_stop */
#include "test_daemon_util.h"
#include "mf_clock.h"
#include "../fakecuda/fakecuda_env.h"
#include "mf_cudrv.h"
#include "tier_gpu.h" /* mfd_gpu_verify_ptx: this build's mapflowd has the same */

#define MODEL "gpu-model"
#define NS "gpu-ns"

static const mf_cudrv_t *cu;
static int g_real; /* MF_GPU_REAL: the real driver */

/* The daemon of the running test: a failing assertion jumps past gpu_stop, so teardown
 * prints the last lines of its log (the reason a put was refused on a real GPU) and
 * stops it. Cleared by a normal stop. */
static daemon_t *g_cur;

static void log_tail(const daemon_t *d, int lines)
{
    char cmd[256];
    fprintf(stderr, "---- last %d lines of %s\n", lines, d->log);
    snprintf(cmd, sizeof(cmd), "tail -n %d '%s' >&2", lines, d->log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

static int teardown(void **state)
{
    (void)state;
    if (g_cur) {
        log_tail(g_cur, 40);
        kill(g_cur->pid, SIGKILL);
        waitpid(g_cur->pid, NULL, 0);
        g_cur = NULL;
    }
    return 0;
}

/* ---- the client's side of the GPU arenas ------------------------------------------------ */

typedef struct gview {
    size_t n;
    uint64_t bytes[4];
    mf_cu_deviceptr_t base[4]; /* 0 = not opened */
    int open_result[4];
} gview_t;

/* Hello with want_gpu_arena; maps the host arena; opens every arena in device `dev`'s
 * context (as a client with gpu_device = dev). Returns 0 or -1. */
static int hello_gpu(td_cli_t *c, const char *sock, int dev, gview_t *gv)
{
    memset(gv, 0, sizeof(*gv));
    if (td_raw_connect(c, sock) != 0)
        return -1;
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = 1;
    h.namespace_ = NS;
    h.client_name = "gpu-test";
    h.want_host_arena = 1;
    h.want_gpu_arena = 1;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    env.request_id = c->next_id++;
    if (td_send(c, &env, NULL, 0) != 0)
        return -1;
    int fd = -1;
    mf_envelope_t *r = td_recv(c, &fd);
    if (!r || r->body_case != MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY || fd < 0)
        return -1;
    const Mapflow__V1__HelloReply *hr = r->hello_reply;
    c->arena_len = hr->host_arena_bytes;
    c->arena = mmap(NULL, c->arena_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    mf_cu_context_t ctx;
    assert_int_equal(cu->cuDevicePrimaryCtxRetain(&ctx, dev), 0);
    assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
    gv->n = hr->n_gpu_arenas;
    for (size_t i = 0; i < gv->n && i < 4; i++) {
        const Mapflow__V1__GpuArena *a = hr->gpu_arenas[i];
        assert_int_equal(a->index, i);
        assert_int_equal(a->ipc_handle.len, MF_CU_IPC_HANDLE_SIZE);
        assert_int_equal(a->uuid.len, 16);
        char pci[32];
        assert_int_equal(cu->cuDeviceGetPCIBusId(pci, sizeof(pci), (int)i), 0);
        assert_string_equal(a->pci_bus_id, pci); /* daemon ordinal i = this process's i */
        mf_cu_ipc_mem_handle_t hd;
        memcpy(hd.reserved, a->ipc_handle.data, MF_CU_IPC_HANDLE_SIZE);
        gv->bytes[i] = a->bytes;
        gv->open_result[i] = cu->cuIpcOpenMemHandle(&gv->base[i], hd,
                                                    MF_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (gv->open_result[i] != 0)
            gv->base[i] = 0;
    }
    mf_envelope_free(r);
    return c->arena == MAP_FAILED ? -1 : 0;
}

static void gview_close(gview_t *gv)
{
    for (size_t i = 0; i < gv->n && i < 4; i++)
        if (gv->base[i])
            assert_int_equal(cu->cuIpcCloseMemHandle(gv->base[i]), 0);
}

static uint64_t mapped_mask(const gview_t *gv)
{
    uint64_t m = 0;
    for (size_t i = 0; i < gv->n && i < 4; i++)
        if (gv->base[i])
            m |= 1ull << i;
    return m;
}

/* A real mapflowd with extra "--key", "value" args and this process as its GPU client on
 * device `dev` (arenas opened through CUDA IPC). */
#define GPU_START(d, c, gv, dev, ...)                                                    \
    do {                                                                                 \
        memset(&(d), 0, sizeof(d));                                                      \
        daemon_start(&(d), 0, __VA_ARGS__, (const char *)NULL);                         \
        g_cur = &(d);                                                                    \
        assert_int_equal(hello_gpu(&(c), (d).sock, (dev), &(gv)), 0);                    \
    } while (0)

static void gpu_stop(daemon_t *d, td_cli_t *c, gview_t *gv)
{
    gview_close(gv);
    td_close(c);
    g_cur = NULL;
    daemon_stop(d, 1);
}

/* ---- wire helpers ------------------------------------------------------------------------- */

typedef struct put_res {
    int status;              /* 0 or the error code */
    int tier, arena, in_arena, commit_tier;
} put_res_t;

/* Two-phase put of `row` under (layer, hash): the client copies into whichever arena
 * PutBeginReply names when in_arena, else sends the payload. */
static put_res_t put_row(td_cli_t *c, const gview_t *gv, uint32_t layer, mf_hash128_t hash,
                         const uint8_t *row, size_t size, uint64_t gpu_mapped, int want_tier,
                         uint32_t gpu_arena_plus1)
{
    put_res_t res = {-1, 0, 0, 0, 0};
    uint8_t hb[16];
    Mapflow__V1__Key key;
    td_key(&key, hb, MODEL, layer, hash);
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &key;
    pb.size = size;
    pb.gpu_mapped = gpu_mapped;
    pb.want_tier = want_tier;
    pb.gpu_arena = gpu_arena_plus1;
    mf_envelope_t *r = td_put_begin(c, &pb);
    assert_non_null(r);
    if (r->body_case != MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY) {
        res.status = r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code : -1;
        if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR)
            fprintf(stderr, "PutBegin (layer %u, %zu bytes): %s: %s\n", layer, size,
                    mf_status_name((mf_status_t)r->error->code), r->error->message);
        mf_envelope_free(r);
        return res;
    }
    const Mapflow__V1__PutBeginReply *p = r->put_begin_reply;
    uint64_t rid = p->reservation_id, off = p->arena_offset;
    res.tier = p->tier;
    res.arena = (int)p->gpu_arena;
    res.in_arena = p->in_arena;
    mf_envelope_free(r);
    if (res.in_arena && res.tier == MAPFLOW__V1__TIER__TIER_GPU) {
        assert_true(res.arena < (int)gv->n && gv->base[res.arena]);
        assert_true(off + size <= gv->bytes[res.arena]);
        assert_int_equal(cu->cuMemcpyHtoD(gv->base[res.arena] + off, row, size), 0);
        /* A pageable HtoD returns before the bytes land: the daemon (another process)
         * reads them only after this synchronize, as libmapflow's readback ensures. */
        assert_int_equal(cu->cuCtxSynchronize(), 0);
    } else if (res.in_arena) {
        assert_int_equal(res.tier, MAPFLOW__V1__TIER__TIER_HOST);
        memcpy(c->arena + off, row, size);
    }
    r = td_put_commit(c, rid, res.in_arena ? NULL : row, res.in_arena ? 0 : size);
    assert_non_null(r);
    if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY) {
        res.status = 0;
        res.commit_tier = r->put_commit_reply->tier;
    } else if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        res.status = (int)r->error->code;
        fprintf(stderr, "PutCommit (layer %u, %zu bytes, tier %d, in_arena %d): %s: %s\n",
                layer, size, res.tier, res.in_arena, mf_status_name((mf_status_t)res.status),
                r->error->message);
    }
    mf_envelope_free(r);
    return res;
}

static mf_envelope_t *get_prefix(td_cli_t *c, uint32_t B, const uint32_t *tokens, size_t n_tok,
                                 const uint32_t *layers, size_t n_layers, int lease,
                                 uint64_t gpu_mapped)
{
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = (uint32_t *)layers;
    g.n_layers = n_layers;
    g.mode = lease ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
    g.gpu_mapped = gpu_mapped;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    mf_envelope_t *r = td_call(c, &env, tokens, n_tok * 4);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    return r;
}

static void release_all(td_cli_t *c, const Mapflow__V1__GetReply *g)
{
    uint64_t ids[4096];
    size_t n = 0;
    for (size_t i = 0; i < g->n_rows && n < 4096; i++)
        if (g->rows[i]->status == MF_OK)
            ids[n++] = g->rows[i]->lease_id;
    Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
    rel.lease_ids = ids;
    rel.n_lease_ids = n;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_RELEASE;
    env.release = &rel;
    mf_envelope_t *r = td_call(c, &env, NULL, 0);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY);
    assert_int_equal(r->release_reply->released, n);
    mf_envelope_free(r);
}

static mf_envelope_t *stats(td_cli_t *c)
{
    mf_envelope_t *r = td_admin_stats(c); /* daemon-wide: the admin socket's */
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY);
    return r;
}

static uint64_t counter(const mf_envelope_t *r, const char *name)
{
    for (size_t k = 0; k < r->stats_reply->n_counters; k++)
        if (!strcmp(r->stats_reply->counters[k]->name, name))
            return r->stats_reply->counters[k]->value;
    fail_msg("no counter %s", name);
    return 0;
}

/* The row a GET_LEASE RowRef names, read where it says (GPU mapping or host arena). */
static void assert_lease_bytes(const td_cli_t *c, const gview_t *gv,
                               const Mapflow__V1__RowRef *ref, const uint8_t *want, size_t size)
{
    assert_int_equal(ref->status, MF_OK);
    assert_int_equal(ref->length, size);
    if (ref->tier == MAPFLOW__V1__TIER__TIER_GPU) {
        assert_true(ref->gpu_arena < gv->n && gv->base[ref->gpu_arena]);
        assert_true(ref->arena_offset + size <= gv->bytes[ref->gpu_arena]);
        uint8_t *got = malloc(size);
        assert_int_equal(cu->cuMemcpyDtoH(got, gv->base[ref->gpu_arena] + ref->arena_offset,
                                          size), 0);
        assert_memory_equal(got, want, size);
        free(got);
    } else {
        assert_int_equal(ref->tier, MAPFLOW__V1__TIER__TIER_HOST);
        assert_true(ref->arena_offset + size <= c->arena_len);
        assert_memory_equal(c->arena + ref->arena_offset, want, size);
    }
}

/* Rows for blocks 0..nb-1 of `layers` layers over random tokens. */
typedef struct rowset {
    uint32_t B, nb, nl;
    uint32_t *tokens;
    uint8_t **row;
    size_t *size;
} rowset_t;

static void rows_make(rowset_t *rs, uint32_t B, uint32_t nb, uint32_t nl, unsigned seed)
{
    rs->B = B;
    rs->nb = nb;
    rs->nl = nl;
    rs->tokens = malloc((size_t)nb * B * 4);
    for (size_t i = 0; i < (size_t)nb * B; i++)
        rs->tokens[i] = 7 + (uint32_t)(rand_r(&seed) % 60000);
    rs->row = calloc((size_t)nb * nl, sizeof(*rs->row));
    rs->size = calloc((size_t)nb * nl, sizeof(*rs->size));
    for (uint32_t l = 0; l < nl; l++)
        for (uint32_t i = 0; i < nb; i++) {
            size_t k = (size_t)l * nb + i;
            rs->row[k] = td_row(NS, MODEL, l, B, rs->tokens, i, &rs->size[k], &seed);
            assert_non_null(rs->row[k]);
        }
}

static void rows_free(rowset_t *rs)
{
    for (size_t k = 0; k < (size_t)rs->nb * rs->nl; k++)
        free(rs->row[k]);
    free(rs->row);
    free(rs->size);
    free(rs->tokens);
}

static mf_hash128_t rows_hash(const rowset_t *rs, uint32_t i)
{
    return td_block_hash(NS, MODEL, rs->B, rs->tokens, i);
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_put_lease_copy_stage(void **state)
{
    (void)state;
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "4mb", "--host_bytes", "8mb", "--gpu_devices",
              "0");
    assert_int_equal(gv.n, 1);
    assert_int_equal(gv.open_result[0], 0);
    assert_int_equal(gv.bytes[0], 4u << 20);

    rowset_t rs;
    rows_make(&rs, 64, 6, 2, 4242);
    /* Layer 0 through the client's own copy into the mapping, layer 1 as payloads (HtoD). */
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < rs.nb; i++) {
            size_t k = (size_t)l * rs.nb + i;
            put_res_t p = put_row(&c, &gv, l, rows_hash(&rs, i), rs.row[k], rs.size[k],
                                  l == 0 ? mapped_mask(&gv) : 0, 0, 0);
            assert_int_equal(p.status, 0);
            assert_int_equal(p.tier, MAPFLOW__V1__TIER__TIER_GPU);
            assert_int_equal(p.in_arena, l == 0);
            assert_int_equal(p.commit_tier, MAPFLOW__V1__TIER__TIER_GPU);
        }
    /* A row damaged on its way into the GPU arena is refused at commit (DtoH + checksum). */
    uint8_t *bad = malloc(rs.size[0]);
    memcpy(bad, rs.row[0], rs.size[0]);
    bad[rs.size[0] - 3] ^= 0x40;
    put_res_t p = put_row(&c, &gv, 0, rows_hash(&rs, 0), bad, rs.size[0], 1, 0, 0);
    assert_int_equal(p.tier, MAPFLOW__V1__TIER__TIER_GPU);
    assert_int_equal(p.status, MF_DATA_LOSS);
    free(bad);

    uint32_t layers[2] = {0, 1};
    size_t ntok = (size_t)rs.nb * rs.B;
    /* Device views: every row leased where it sits in the GPU arena, bytes exact. */
    mf_envelope_t *r = get_prefix(&c, rs.B, rs.tokens, ntok, layers, 2, 1, 1);
    const Mapflow__V1__GetReply *g = r->get_reply;
    assert_int_equal(g->n_rows, 2 * rs.nb);
    for (size_t k = 0; k < g->n_rows; k++) {
        assert_int_equal(g->rows[k]->tier, MAPFLOW__V1__TIER__TIER_GPU);
        assert_int_equal(g->rows[k]->gpu_arena, 0);
        assert_lease_bytes(&c, &gv, g->rows[k], rs.row[k], rs.size[k]);
    }
    release_all(&c, g);
    mf_envelope_free(r);

    /* GET_COPY: DtoH into the reply payload. */
    r = get_prefix(&c, rs.B, rs.tokens, ntok, layers, 2, 0, 0);
    g = r->get_reply;
    for (size_t k = 0; k < g->n_rows; k++) {
        assert_int_equal(g->rows[k]->tier, MAPFLOW__V1__TIER__TIER_GPU);
        td_assert_copy(&c, g->rows[k], rs.row[k], rs.size[k]);
    }
    mf_envelope_free(r);

    /* A client that did not map the arena: host views staged from the GPU, bytes exact. */
    r = get_prefix(&c, rs.B, rs.tokens, ntok, layers, 2, 1, 0);
    g = r->get_reply;
    for (size_t k = 0; k < g->n_rows; k++) {
        assert_int_equal(g->rows[k]->tier, MAPFLOW__V1__TIER__TIER_HOST);
        assert_lease_bytes(&c, &gv, g->rows[k], rs.row[k], rs.size[k]);
    }
    release_all(&c, g);
    mf_envelope_free(r);

    r = stats(&c);
    const Mapflow__V1__TierStats *gt = r->stats_reply->tiers[0];
    assert_int_equal(gt->tier, MAPFLOW__V1__TIER__TIER_GPU);
    assert_true(gt->enabled);
    assert_int_equal(gt->capacity_bytes, 4u << 20);
    assert_int_equal(gt->entries, 2 * rs.nb);
    assert_true(gt->used_bytes >= rs.size[0] * 2 * rs.nb);
    assert_int_equal(counter(r, "gpu_staged_total"), 2 * rs.nb);
    assert_int_equal(counter(r, "put_rejected_total"), 1);
    assert_true(counter(r, "get_hit_tokens_total{tier=\"gpu\"}") >= 4 * ntok);
    mf_envelope_free(r);
    rows_free(&rs);
    gpu_stop(&d, &c, &gv);
}

/* Fills a small GPU tier far past its size: rows demote gpu → host → ssd, every acknowledged
 * row stays readable and exact, and rows leased on the GPU never move. */
static void test_eviction_keeps_rows_and_leases(void **state)
{
    (void)state;
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    /* write_through off: demotion must carry GPU rows down (with it on, a GPU row already on
     * the SSD tier just leaves the GPU; test_write_through_restart covers that). */
    GPU_START(d, c, gv, 0, "--gpu_bytes", "192kb", "--host_bytes", "1mb", "--write_through",
              "off", "--gpu_devices", "0");
    rowset_t rs;
    rows_make(&rs, 256, 128, 8, 777); /* 1024 rows of ~1.3 KiB: 7x the GPU arena */
    uint64_t mask = mapped_mask(&gv);
    /* First the rows that will stay leased. */
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(put_row(&c, &gv, 0, rows_hash(&rs, i), rs.row[i], rs.size[i], mask, 0, 0)
                             .status, 0);
    uint32_t l0 = 0;
    mf_envelope_t *held = get_prefix(&c, rs.B, rs.tokens, 4 * rs.B, &l0, 1, 1, mask);
    for (size_t k = 0; k < 4; k++) {
        assert_int_equal(held->get_reply->rows[k]->tier, MAPFLOW__V1__TIER__TIER_GPU);
        assert_lease_bytes(&c, &gv, held->get_reply->rows[k], rs.row[k], rs.size[k]);
    }
    for (uint32_t l = 0; l < rs.nl; l++)
        for (uint32_t i = l ? 0 : 4; i < rs.nb; i++) {
            size_t k = (size_t)l * rs.nb + i;
            put_res_t p = put_row(&c, &gv, l, rows_hash(&rs, i), rs.row[k], rs.size[k],
                                  (k & 1) ? mask : 0, 0, 0);
            assert_int_equal(p.status, 0);
        }
    /* The leased rows are where they were, bytes unchanged, though the tier turned over. */
    for (size_t k = 0; k < 4; k++)
        assert_lease_bytes(&c, &gv, held->get_reply->rows[k], rs.row[k], rs.size[k]);

    mf_envelope_t *r = stats(&c);
    assert_true(counter(r, "gpu_demotions_total") > 0);
    assert_true(counter(r, "evictions_total{tier=\"gpu\"}") > 0);
    assert_true(counter(r, "evictions_total{tier=\"host\"}") > 0);
    /* Rows sit on all three tiers now (Get below moves SSD rows up again, racing its
     * own promotions, so where each row is read from is not checked). */
    assert_true(r->stats_reply->tiers[0]->entries > 0);
    assert_true(r->stats_reply->tiers[1]->entries > 0);
    assert_true(r->stats_reply->tiers[2]->entries > 0);
    assert_true(r->stats_reply->tiers[0]->used_bytes <= r->stats_reply->tiers[0]->capacity_bytes);
    mf_envelope_free(r);

    /* Every acknowledged row, wherever it went: GET_COPY layer by layer, exact bytes. */
    size_t on_tier[4] = {0};
    for (uint32_t l = 0; l < rs.nl; l++) {
        r = get_prefix(&c, rs.B, rs.tokens, (size_t)rs.nb * rs.B, &l, 1, 0, 0);
        const Mapflow__V1__GetReply *g = r->get_reply;
        assert_int_equal(g->n_rows, rs.nb);
        for (size_t i = 0; i < g->n_rows; i++) {
            size_t k = (size_t)l * rs.nb + i;
            td_assert_copy(&c, g->rows[i], rs.row[k], rs.size[k]);
            on_tier[g->rows[i]->tier & 3]++;
        }
        mf_envelope_free(r);
    }
    assert_true(on_tier[MAPFLOW__V1__TIER__TIER_GPU] > 0);
    assert_true(on_tier[MAPFLOW__V1__TIER__TIER_SSD] > 0);
    release_all(&c, held->get_reply);
    mf_envelope_free(held);

    /* Evict of the GPU tier (this namespace): down to the low watermark. */
    Mapflow__V1__Evict ev = MAPFLOW__V1__EVICT__INIT;
    ev.tier = MAPFLOW__V1__TIER__TIER_GPU;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_EVICT;
    env.evict = &ev;
    ev.bytes = 1u << 30;
    r = td_call(&c, &env, NULL, 0);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY);
    assert_true(r->evict_reply->entries > 0);
    mf_envelope_free(r);
    r = stats(&c);
    assert_int_equal(r->stats_reply->tiers[0]->entries, 0);
    assert_int_equal(r->stats_reply->tiers[0]->used_bytes, 0);
    mf_envelope_free(r);
    rows_free(&rs);
    gpu_stop(&d, &c, &gv);
}

/* GPU rows reach the SSD tier from a host copy: durable puts are acknowledged durable,
 * async write-through completes, and after a restart every row reads back exactly. */
static void test_write_through_restart(void **state)
{
    (void)state;
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "1mb", "--write_through", "async", "--gpu_devices",
              "0");
    rowset_t rs;
    rows_make(&rs, 64, 24, 2, 99);
    for (uint32_t l = 0; l < rs.nl; l++)
        for (uint32_t i = 0; i < rs.nb; i++) {
            size_t k = (size_t)l * rs.nb + i;
            put_res_t p = put_row(&c, &gv, l, rows_hash(&rs, i), rs.row[k], rs.size[k],
                                  mapped_mask(&gv), 0, 0);
            assert_int_equal(p.status, 0);
            assert_int_equal(p.commit_tier, MAPFLOW__V1__TIER__TIER_GPU);
        }
    /* One durable put: acknowledged only after its synced write from the GPU row. */
    Mapflow__V1__Key key;
    uint8_t hb[16];
    td_key(&key, hb, MODEL, 0, rows_hash(&rs, 0));
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &key;
    pb.size = rs.size[0];
    pb.durable = 1;
    mf_envelope_t *r = td_put_begin(&c, &pb);
    assert_int_equal(r->put_begin_reply->tier, MAPFLOW__V1__TIER__TIER_GPU);
    uint64_t rid = r->put_begin_reply->reservation_id;
    mf_envelope_free(r);
    r = td_put_commit(&c, rid, rs.row[0], rs.size[0]);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY);
    assert_true(r->put_commit_reply->durable);
    assert_int_equal(r->put_commit_reply->tier, MAPFLOW__V1__TIER__TIER_GPU);
    mf_envelope_free(r);
    gview_close(&gv);
    td_close(&c);
    g_cur = NULL;
    daemon_stop(&d, 0); /* drain writes what is still queued */

    daemon_start(&d, 1, "--gpu_bytes", "1mb", "--gpu_devices", "0", (const char *)NULL);
    g_cur = &d;
    assert_int_equal(td_connect(&c, d.sock, NS, 1), 0);
    for (uint32_t l = 0; l < rs.nl; l++) {
        r = get_prefix(&c, rs.B, rs.tokens, (size_t)rs.nb * rs.B, &l, 1, 0, 0);
        for (uint32_t i = 0; i < rs.nb; i++) {
            assert_int_equal(r->get_reply->rows[i]->tier, MAPFLOW__V1__TIER__TIER_SSD);
            td_assert_copy(&c, r->get_reply->rows[i], rs.row[(size_t)l * rs.nb + i],
                           rs.size[(size_t)l * rs.nb + i]);
        }
        mf_envelope_free(r);
    }
    td_close(&c);
    rows_free(&rs);
    g_cur = NULL;
    daemon_stop(&d, 1);
}

/* want_tier HOST keeps a put on the host tier; with gpu_promote on, a hit copies the row to
 * the GPU tier and later leases are device views of the same bytes; off, nothing moves. */
static void test_promote_on_hit(void **state)
{
    (void)state;
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "1mb", "--gpu_promote", "off", "--gpu_devices",
              "0");
    uint64_t mask = mapped_mask(&gv);
    rowset_t rs;
    rows_make(&rs, 64, 5, 1, 2024);
    for (uint32_t i = 0; i < rs.nb; i++) {
        put_res_t p = put_row(&c, &gv, 0, rows_hash(&rs, i), rs.row[i], rs.size[i], mask,
                              MAPFLOW__V1__TIER__TIER_HOST, 0);
        assert_int_equal(p.status, 0);
        assert_int_equal(p.commit_tier, MAPFLOW__V1__TIER__TIER_HOST);
    }
    uint32_t l0 = 0;
    size_t ntok = (size_t)rs.nb * rs.B;
    for (int round = 0; round < 3; round++) {
        if (round == 1) {
            Mapflow__V1__ConfigSet cs = MAPFLOW__V1__CONFIG_SET__INIT;
            cs.key = "gpu_promote";
            cs.value = "on";
            mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
            env.body_case = MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET;
            env.config_set = &cs;
            td_cli_t adm; /* config set is an admin request: the admin socket */
            char adm_path[160];
            snprintf(adm_path, sizeof(adm_path), "%s/d-admin.sock", d.dir);
            assert_int_equal(td_connect(&adm, adm_path, NS, 0), 0);
            mf_envelope_t *r = td_call(&adm, &env, NULL, 0);
            assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET_REPLY);
            mf_envelope_free(r);
            td_close(&adm);
        }
        /* Round 0: off, host views; round 1: the hit promotes; round 2: device views. */
        mf_envelope_t *r = get_prefix(&c, rs.B, rs.tokens, ntok, &l0, 1, 1, mask);
        for (uint32_t i = 0; i < rs.nb; i++) {
            assert_int_equal(r->get_reply->rows[i]->tier, round == 2
                                                              ? MAPFLOW__V1__TIER__TIER_GPU
                                                              : MAPFLOW__V1__TIER__TIER_HOST);
            assert_lease_bytes(&c, &gv, r->get_reply->rows[i], rs.row[i], rs.size[i]);
        }
        release_all(&c, r->get_reply);
        mf_envelope_free(r);
        r = stats(&c);
        assert_int_equal(counter(r, "gpu_promotions_total"), round == 0 ? 0 : rs.nb);
        assert_int_equal(r->stats_reply->tiers[0]->entries, round == 0 ? 0 : rs.nb);
        mf_envelope_free(r);
    }
    rows_free(&rs);
    gpu_stop(&d, &c, &gv);
}

/* Two devices, no peer access: the client on device 1 opens only arena 1. Rows in arena 0
 * come back staged through host memory, rows in arena 1 as device views. */
static void test_two_devices_no_peer(void **state)
{
    (void)state;
    if (g_real)
        skip(); /* needs the fake's FAKECUDA_NO_PEER */
    setenv("FAKECUDA_DEVICES", "2", 1);
    setenv("FAKECUDA_NO_PEER", "1", 1);
    assert_int_equal(cu->cuInit(0), 0); /* the fake re-reads its environment */
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 1, "--gpu_bytes", "2mb", "--gpu_devices", "all");
    assert_int_equal(gv.n, 2);
    assert_int_equal(gv.open_result[0], MF_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    assert_int_equal(gv.open_result[1], 0);
    uint64_t mask = mapped_mask(&gv);
    assert_int_equal(mask, 2);

    rowset_t rs;
    rows_make(&rs, 32, 8, 1, 31337);
    for (uint32_t i = 0; i < rs.nb; i++) {
        uint32_t want = i & 1; /* odd blocks to arena 1, even to arena 0 */
        put_res_t p = put_row(&c, &gv, 0, rows_hash(&rs, i), rs.row[i], rs.size[i], mask, 0,
                              want + 1);
        assert_int_equal(p.status, 0);
        assert_int_equal(p.tier, MAPFLOW__V1__TIER__TIER_GPU);
        assert_int_equal(p.arena, (int)want);
        assert_int_equal(p.in_arena, want == 1); /* arena 0 unmapped: payload, HtoD */
    }
    uint32_t l0 = 0;
    mf_envelope_t *r = get_prefix(&c, rs.B, rs.tokens, (size_t)rs.nb * rs.B, &l0, 1, 1, mask);
    for (uint32_t i = 0; i < rs.nb; i++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[i];
        assert_int_equal(ref->tier, (i & 1) ? MAPFLOW__V1__TIER__TIER_GPU
                                            : MAPFLOW__V1__TIER__TIER_HOST);
        if (i & 1)
            assert_int_equal(ref->gpu_arena, 1);
        assert_lease_bytes(&c, &gv, ref, rs.row[i], rs.size[i]);
    }
    release_all(&c, r->get_reply);
    mf_envelope_free(r);
    r = stats(&c);
    assert_int_equal(counter(r, "gpu_arena_entries{arena=\"0\",device=\"0\"}"), rs.nb / 2);
    assert_int_equal(counter(r, "gpu_arena_entries{arena=\"1\",device=\"1\"}"), rs.nb / 2);
    mf_envelope_free(r);
    rows_free(&rs);
    gpu_stop(&d, &c, &gv);
    unsetenv("FAKECUDA_NO_PEER");
    setenv("FAKECUDA_DEVICES", "1", 1);
    assert_int_equal(cu->cuInit(0), 0);
}

/* Large rows (~2 MiB, fp16 tiles) put from this process's device memory, as mf_put_device
 * does (DtoD into the mapped arena, synchronize, PutCommit): the daemon validates them on
 * the GPU (real driver) or, on the fake driver (no PTX JIT), on the host through its
 * staging buffer; either way a row with one flipped tile byte is refused with DATA_LOSS and
 * gpu_rows_validated_total{on=...} counts the accepted ones where they ran. Prints the
 * validation mode and the put rate (MF_GPU_BENCH_ROWS puts, default 8; no timing checks). */
#define BIG_B 128
#define BIG_I 7   /* block index: 8 columns x 8 heads = 64 tiles of 32 KiB */
#define BIG_KEYS 16

static uint8_t *big_row(uint32_t layer, const uint32_t *tokens, unsigned *seed, size_t *size)
{
    mf_hash128_t h = mf_hash_root(BIG_B, NS, strlen(NS), MODEL, strlen(MODEL)), parent = h;
    for (uint32_t b = 0; b <= BIG_I; b++) {
        parent = h;
        h = mf_hash_next(h, tokens + (size_t)b * BIG_B, BIG_B);
    }
    mf_row_spec_t spec = {MODEL, layer, BIG_I, BIG_B, 8, MF_CODEC_FP16, 0.9f, parent, h,
                          tokens + (size_t)BIG_I * BIG_B};
    uint32_t cols[BIG_I + 1];
    uint64_t masks[BIG_I + 1];
    for (uint32_t c = 0; c <= BIG_I; c++) {
        cols[c] = c;
        masks[c] = 0xff;
    }
    size_t n_ent = 8 * (BIG_I + 1), bb = (size_t)BIG_B * BIG_B;
    float *mass = malloc(n_ent * sizeof(float)), *tiles = malloc(n_ent * bb * sizeof(float));
    for (size_t k = 0; k < n_ent; k++)
        mass[k] = (float)(rand_r(seed) % 1000) / 1000.0f;
    for (size_t k = 0; k < n_ent * bb; k++)
        tiles[k] = (float)(rand_r(seed) % 4096) / 4096.0f;
    size_t need = 0;
    mf_row_build(NULL, 0, &spec, BIG_I + 1, cols, masks, mass, tiles, &need, NULL);
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    assert_int_equal(mf_row_build(buf, need, &spec, BIG_I + 1, cols, masks, mass, tiles, size,
                                  NULL), MF_OK);
    free(mass);
    free(tiles);
    return buf;
}

/* Seconds put_from_device spent per phase (big_rows_run prints them per row). */
static double g_t_begin, g_t_copy, g_t_commit;

/* PutBegin / DtoD from `src` (device) into the arena / synchronize / PutCommit. */
static int put_from_device(td_cli_t *c, const gview_t *gv, uint32_t layer, mf_hash128_t hash,
                           mf_cu_deviceptr_t src, size_t size)
{
    uint8_t hb[16];
    Mapflow__V1__Key key;
    td_key(&key, hb, MODEL, layer, hash);
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &key;
    pb.size = size;
    pb.gpu_mapped = mapped_mask(gv);
    double t0 = mf_now_s();
    mf_envelope_t *r = td_put_begin(c, &pb);
    double t1 = mf_now_s();
    g_t_begin += t1 - t0;
    assert_non_null(r);
    if (r->body_case != MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY) {
        fprintf(stderr, "PutBegin: %s\n", r->error ? r->error->message : "?");
        mf_envelope_free(r);
        return -1;
    }
    const Mapflow__V1__PutBeginReply *p = r->put_begin_reply;
    assert_int_equal(p->tier, MAPFLOW__V1__TIER__TIER_GPU);
    assert_true(p->in_arena);
    assert_true(p->gpu_arena < gv->n && gv->base[p->gpu_arena]);
    assert_int_equal(cu->cuMemcpyDtoD(gv->base[p->gpu_arena] + p->arena_offset, src, size), 0);
    assert_int_equal(cu->cuCtxSynchronize(), 0); /* landed before the daemon looks */
    double t2 = mf_now_s();
    g_t_copy += t2 - t1;
    uint64_t rid = p->reservation_id;
    mf_envelope_free(r);
    r = td_put_commit(c, rid, NULL, 0);
    g_t_commit += mf_now_s() - t2;
    assert_non_null(r);
    int st = 0;
    if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        st = (int)r->error->code;
        fprintf(stderr, "PutCommit of a device row (%zu bytes): %s: %s\n", size,
                mf_status_name(st), r->error->message);
    } else {
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY);
        assert_int_equal(r->put_commit_reply->tier, MAPFLOW__V1__TIER__TIER_GPU);
    }
    mf_envelope_free(r);
    return st;
}

/* expect_gpu: 1 every row validated on the GPU, 0 on the host, -1 either. */
static void big_rows_run(const char *write_through, int expect_gpu)
{
    const char *e = getenv("MF_GPU_BENCH_ROWS");
    long n_puts = e && *e ? atol(e) : 8;
    if (n_puts < BIG_KEYS)
        n_puts = BIG_KEYS;
    if (n_puts > 2000)
        n_puts = 2000; /* ≤ ~4 GB of copies */
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "96mb", "--host_bytes", "64mb", "--write_through",
              write_through, "--gpu_devices", "0");
    assert_int_equal(gv.open_result[0], 0);
    unsigned seed = 606;
    uint32_t tokens[(BIG_I + 1) * BIG_B];
    for (size_t i = 0; i < sizeof(tokens) / 4; i++)
        tokens[i] = 11 + (uint32_t)(rand_r(&seed) % 60000);
    mf_hash128_t hash = td_block_hash(NS, MODEL, BIG_B, tokens, BIG_I);
    uint8_t *row[BIG_KEYS];
    size_t size = 0;
    mf_cu_deviceptr_t dev;
    for (uint32_t l = 0; l < BIG_KEYS; l++)
        row[l] = big_row(l, tokens, &seed, &size); /* same shape: same size */
    assert_true(size > (2u << 20) && size < (3u << 20));
    assert_int_equal(cu->cuMemAlloc(&dev, (size_t)(BIG_KEYS + 1) * size), 0);
    for (uint32_t l = 0; l < BIG_KEYS; l++)
        assert_int_equal(cu->cuMemcpyHtoD(dev + (size_t)l * size, row[l], size), 0);
    /* The corrupted copy: layer 0's row with one tile byte flipped near the end. */
    row[0][size - 100] ^= 0x10;
    assert_int_equal(cu->cuMemcpyHtoD(dev + (size_t)BIG_KEYS * size, row[0], size), 0);
    row[0][size - 100] ^= 0x10;
    assert_int_equal(cu->cuCtxSynchronize(), 0);

    assert_int_equal(put_from_device(&c, &gv, 0, hash, dev + (size_t)BIG_KEYS * size, size),
                     MF_DATA_LOSS);
    mf_envelope_t *r = stats(&c);
    uint64_t chk0 = counter(r, "gpu_commit_check_microseconds_total");
    uint64_t com0 = counter(r, "gpu_commit_microseconds_total");
    mf_envelope_free(r);
    g_t_begin = g_t_copy = g_t_commit = 0;
    double t0 = mf_now_s();
    for (long k = 0; k < n_puts; k++) {
        uint32_t l = (uint32_t)(k % BIG_KEYS);
        assert_int_equal(put_from_device(&c, &gv, l, hash, dev + (size_t)l * size, size), 0);
    }
    double s = mf_now_s() - t0;

    r = stats(&c);
    uint64_t on_gpu = counter(r, "gpu_rows_validated_total{on=\"gpu\"}");
    double chk = (double)(counter(r, "gpu_commit_check_microseconds_total") - chk0);
    double com = (double)(counter(r, "gpu_commit_microseconds_total") - com0);
    assert_true(com >= chk);
    uint64_t on_host = counter(r, "gpu_rows_validated_total{on=\"host\"}");
    assert_int_equal(on_gpu + on_host, (uint64_t)n_puts);
    assert_int_equal(counter(r, "put_rejected_total"), 1);
    mf_envelope_free(r);
    if (expect_gpu >= 0)
        assert_int_equal(expect_gpu ? on_gpu : on_host, (uint64_t)n_puts);
    printf("device puts: %ld rows of %.2f MiB in %.3f s: %.0f rows/s, %.2f GB/s; validated "
           "on the %s (%llu on gpu, %llu on host)\n",
           n_puts, (double)size / (1 << 20), s, (double)n_puts / s,
           (double)n_puts * (double)size / s / 1e9, on_gpu ? "gpu" : "host",
           (unsigned long long)on_gpu, (unsigned long long)on_host);
    /* Where a row's time goes (µs per row): the client's PutBegin round trip, its DtoD +
     * synchronize, its PutCommit round trip, and of that the daemon's commit in the store
     * and the GPU check within it (copies, kernels, synchronize). */
    double us = 1e6 / (double)n_puts;
    printf("device put phases (us/row): begin %.1f, copy+sync %.1f, commit %.1f (daemon "
           "commit %.1f, of which gpu check %.1f), total %.1f\n",
           g_t_begin * us, g_t_copy * us, g_t_commit * us, com / (double)n_puts,
           chk / (double)n_puts, s * us);
    fflush(stdout);

    /* The stored rows are the good ones, byte for byte (GET_COPY). Blocks 0..BIG_I-1 get
     * small rows on another layer first: a prefix Get's chain needs every earlier block
     * stored (a block of which no row is stored breaks it). */
    for (uint32_t b = 0; b < BIG_I; b++) {
        size_t small;
        uint8_t *sr = td_row(NS, MODEL, 100, BIG_B, tokens, b, &small, &seed);
        assert_non_null(sr);
        put_res_t sp = put_row(&c, &gv, 100, td_block_hash(NS, MODEL, BIG_B, tokens, b), sr,
                               small, 0, 0, 0);
        assert_int_equal(sp.status, 0);
        free(sr);
    }
    for (uint32_t l = 0; l < BIG_KEYS; l += 5) {
        r = get_prefix(&c, BIG_B, tokens, (size_t)(BIG_I + 1) * BIG_B, &l, 1, 0, 0);
        assert_int_equal(r->get_reply->n_rows, BIG_I + 1);
        td_assert_copy(&c, r->get_reply->rows[BIG_I], row[l], size);
        mf_envelope_free(r);
    }
    assert_int_equal(cu->cuMemFree(dev), 0);
    for (uint32_t l = 0; l < BIG_KEYS; l++)
        free(row[l]);
    gpu_stop(&d, &c, &gv);
}

static void test_big_device_rows(void **state)
{
    (void)state;
    /* The real driver: on the GPU with MFD_GPU_VERIFY=gpu (tier_smoke's second run; the
     * module must load), else on the host; the fake: on the host. */
    const char *v = getenv("MFD_GPU_VERIFY");
    big_rows_run("off", g_real && v && strcmp(v, "gpu") == 0);
}

/* The fake running the checksum kernels on the CPU (FAKECUDA_MODULES=1): the daemon's GPU
 * validation path end to end (launches, result, prefix decode, a corrupted row refused),
 * with write_through sync (the accepted row copied out DtoH for its SSD write). */
static void test_big_device_rows_gpu_path(void **state)
{
    (void)state;
    size_t ptx_len;
    if (g_real || !mfd_gpu_verify_ptx(&ptx_len))
        skip(); /* the real kernels run in test_big_device_rows; no PTX: built without nvcc */
    setenv("FAKECUDA_MODULES", "1", 1); /* the daemon's fake driver only */
    setenv("MFD_GPU_VERIFY", "gpu", 1);  /* host validation is the default */
    big_rows_run("sync", 1);
    unsetenv("MFD_GPU_VERIFY");
    unsetenv("FAKECUDA_MODULES");
}

/* ---- put regions (PutRegionBegin / Commit / Abort) -------------------------------------- */

#define RG_B 8
#define RG_NB 80  /* the last MASK rows' prefixes pass 4 KiB: the second copy of a region check */
#define RG_HEADS 64
#define RG_LAYER 3

/* The row of block i (parent and hash given) with `heads` heads of which every one keeps
 * columns 0 and i, and n_mid evenly spread middle columns (all of them when n_mid ≥ i)
 * with random head masks; random masses and tiles. */
static uint8_t *shaped_row(uint32_t layer, uint32_t B, uint32_t heads, mf_codec_t codec,
                           uint32_t n_mid, mf_hash128_t parent, mf_hash128_t h,
                           const uint32_t *tokens, uint32_t i, unsigned *seed, size_t *size)
{
    mf_row_spec_t spec = {MODEL, layer, i, B, heads, codec, 0.9f, parent, h,
                          tokens + (size_t)i * B};
    uint32_t *cols = malloc((i + 1) * sizeof(*cols)), nc = 0;
    uint64_t *masks = malloc((i + 1) * sizeof(*masks));
    uint64_t all = heads == 64 ? ~0ull : (1ull << heads) - 1;
    size_t n_ent = 0;
    for (uint32_t c = 0; c <= i; c++) {
        if (c && c < i && n_mid < i && (uint64_t)c * (n_mid + 1) / i ==
                                           (uint64_t)(c - 1) * (n_mid + 1) / i)
            continue; /* not one of the n_mid spread columns */
        cols[nc] = c;
        masks[nc] = c == 0 || c == i
                        ? all
                        : (((uint64_t)rand_r(seed) << 33 ^ (uint64_t)rand_r(seed)) & all) | 1;
        n_ent += (size_t)__builtin_popcountll(masks[nc++]);
    }
    size_t bb = codec == MF_CODEC_MASK ? 0 : (size_t)B * B;
    float *mass = malloc(n_ent * sizeof(float));
    float *tiles = bb ? malloc(n_ent * bb * sizeof(float)) : NULL;
    for (size_t k = 0; k < n_ent; k++)
        mass[k] = (float)(rand_r(seed) % 1000) / 1000.0f;
    for (size_t k = 0; k < n_ent * bb; k++)
        tiles[k] = (float)(rand_r(seed) % 4096) / 4096.0f;
    size_t need = 0;
    mf_row_build(NULL, 0, &spec, nc, cols, masks, mass, tiles, &need, NULL);
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    assert_int_equal(mf_row_build(buf, need, &spec, nc, cols, masks, mass, tiles, size, NULL),
                     MF_OK);
    free(mass);
    free(tiles);
    free(cols);
    free(masks);
    return buf;
}

/* Row of block i for a region: codec by i (FP16, FP8, MASK), 64 heads, every column j ≤ i. */
static uint8_t *region_row(uint32_t layer, const uint32_t *tokens, uint32_t i, unsigned *seed,
                           size_t *size)
{
    mf_hash128_t h = mf_hash_root(RG_B, NS, strlen(NS), MODEL, strlen(MODEL)), parent = h;
    for (uint32_t b = 0; b <= i; b++) {
        parent = h;
        h = mf_hash_next(h, tokens + (size_t)b * RG_B, RG_B);
    }
    mf_codec_t codec = i % 3 == 0 ? MF_CODEC_FP16 : i % 3 == 1 ? MF_CODEC_FP8_E4M3 : MF_CODEC_MASK;
    return shaped_row(layer, RG_B, RG_HEADS, codec, i, parent, h, tokens, i, seed, size);
}

/* PutRegionBegin for rows of `lens`; the reply (or an ErrorReply) for the caller to free. */
static mf_envelope_t *region_begin(td_cli_t *c, uint32_t layer, const uint64_t *lens, size_t n,
                                   uint64_t gpu_mapped)
{
    Mapflow__V1__PutRegionBegin b = MAPFLOW__V1__PUT_REGION_BEGIN__INIT;
    b.model = MODEL;
    b.layer = layer;
    b.lengths = (uint64_t *)lens;
    b.n_lengths = n;
    b.gpu_mapped = gpu_mapped;
    mf_envelope_t *r = td_simple(c, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN, &b);
    assert_non_null(r);
    return r;
}

/* The status of a reply: 0 for the expected body, else the ErrorReply's code. */
static int reply_code(const mf_envelope_t *r, int want_case)
{
    if ((int)r->body_case == want_case)
        return 0;
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    return (int)r->error->code;
}

static mf_envelope_t *region_end(td_cli_t *c, uint64_t id, int commit)
{
    Mapflow__V1__PutRegionCommit m = MAPFLOW__V1__PUT_REGION_COMMIT__INIT; /* same shape */
    m.region_id = id;
    mf_envelope_t *r = td_simple(c, commit ? MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT
                                           : MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT, &m);
    assert_non_null(r);
    return r;
}

/* The stored row under (layer, hash) by key, GET_COPY; NULL-free: asserts equal to want,
 * or (want NULL) asserts NOT_FOUND. */
static void assert_key_row(td_cli_t *c, uint32_t layer, mf_hash128_t hash, const uint8_t *want,
                           size_t size)
{
    uint8_t hb[16];
    Mapflow__V1__Key key, *kp = &key;
    td_key(&key, hb, MODEL, layer, hash);
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.keys = &kp;
    g.n_keys = 1;
    g.mode = MAPFLOW__V1__GET_MODE__GET_COPY;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    mf_envelope_t *r = td_call(c, &env, NULL, 0);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->n_rows, 1);
    if (want)
        td_assert_copy(c, r->get_reply->rows[0], want, size);
    else
        assert_int_equal(r->get_reply->rows[0]->status, MF_NOT_FOUND);
    mf_envelope_free(r);
}

static void region_run(int expect_gpu)
{
    daemon_t d;
    td_cli_t c, c2;
    gview_t gv, gv2;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "64mb", "--host_bytes", "16mb", "--gpu_devices",
              "0");
    assert_int_equal(gv.open_result[0], 0);
    unsigned seed = 2020;
    uint32_t tokens[RG_NB * RG_B];
    for (size_t i = 0; i < RG_NB * RG_B; i++)
        tokens[i] = 5 + (uint32_t)(rand_r(&seed) % 60000);
    uint8_t *row[RG_NB];
    size_t size[RG_NB];
    uint64_t lens[RG_NB];
    for (uint32_t i = 0; i < RG_NB; i++) {
        row[i] = region_row(RG_LAYER, tokens, i, &seed, &size[i]);
        lens[i] = size[i];
    }
    /* A flipped byte in a small MASK row (checked on the host) and in a large FP16 row's
     * tiles (checksummed by the kernels on the GPU path); a row of layer 4. */
    const uint32_t bad = 41, bad_tiles = 60, other_layer = 57;
    size_t wsize;
    uint8_t *wrong = region_row(RG_LAYER + 1, tokens, other_layer, &seed, &wsize);
    lens[other_layer] = wsize;
    /* Some rows' prefixes (what the host decodes) are longer than the first bytes a GPU
     * check copies: the second copy runs. */
    size_t long_prefix = 0;
    for (uint32_t i = 0; i < RG_NB; i++) {
        mf_row_view_t pv;
        const char *pwhy = "";
        if (mf_row_decode(row[i], size[i], 0, &pv, &pwhy) != MF_OK)
            fail_msg("row %u: %s", i, pwhy);
        size_t pre = pv.tiles ? (size_t)((const uint8_t *)pv.tiles - pv.base) : size[i];
        long_prefix += pre > MFD_GPU_RC_HEAD;
    }
    assert_true(long_prefix > 0);
    mf_envelope_t *st0 = stats(&c);
    uint64_t used0 = counter(st0, "gpu_arena_used_bytes{arena=\"0\",device=\"0\"}");
    uint64_t chk0 = counter(st0, "put_region_check_microseconds_total");
    mf_envelope_free(st0);

    /* Begin: one block, row offsets ascending, 64-aligned, inside it. */
    mf_envelope_t *r = region_begin(&c, RG_LAYER, lens, RG_NB, mapped_mask(&gv));
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY), 0);
    const Mapflow__V1__PutRegionBeginReply *br = r->put_region_begin_reply;
    assert_int_equal(br->n_row_offsets, RG_NB);
    assert_int_equal(br->gpu_arena, 0);
    uint64_t id = br->region_id, off[RG_NB], total = br->bytes;
    for (uint32_t i = 0; i < RG_NB; i++) {
        off[i] = br->row_offsets[i];
        assert_int_equal(off[i] % 64, 0);
        assert_true(off[i] >= br->arena_offset && off[i] + lens[i] <= br->arena_offset + total);
        if (i)
            assert_true(off[i] >= off[i - 1] + lens[i - 1]);
    }
    assert_true(total + br->arena_offset <= gv.bytes[0]);
    mf_envelope_free(r);
    /* "The source's kernels" write every row in place; one byte of a sealed row flipped. */
    for (uint32_t i = 0; i < RG_NB; i++) {
        const uint8_t *src = i == other_layer ? wrong : row[i];
        assert_int_equal(cu->cuMemcpyHtoD(gv.base[0] + off[i], src, lens[i]), 0);
    }
    /* The flips land in the masses and the tiles (any byte value is valid there: only the
     * checksum can tell), so the refusals are DATA_LOSS on both paths. */
    for (int k = 0; k < 2; k++) {
        uint32_t i = k ? bad_tiles : bad;
        mf_row_view_t v;
        assert_int_equal(mf_row_decode(row[i], size[i], 0, &v, NULL), MF_OK);
        size_t from = (size_t)((k ? (const uint8_t *)v.tiles : v.mass) - v.base);
        size_t span = k ? size[i] - from : v.n_entries;
        uint8_t flip = (uint8_t)(1u << (rand_r(&seed) % 8)), byte;
        size_t at = from + (size_t)rand_r(&seed) % span;
        assert_int_equal(cu->cuMemcpyDtoH(&byte, gv.base[0] + off[i] + at, 1), 0);
        byte ^= flip;
        assert_int_equal(cu->cuMemcpyHtoD(gv.base[0] + off[i] + at, &byte, 1), 0);
    }
    assert_int_equal(cu->cuCtxSynchronize(), 0);

    /* Another connection cannot commit (or abort) it. */
    assert_int_equal(hello_gpu(&c2, d.sock, 0, &gv2), 0);
    r = region_end(&c2, id, 1);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY),
                     MF_NOT_FOUND);
    mf_envelope_free(r);
    r = region_end(&c2, id, 0);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT_REPLY),
                     MF_NOT_FOUND);
    mf_envelope_free(r);

    /* Commit: the flipped row and the other layer's row refused, every other row visible. */
    r = region_end(&c, id, 1);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY), 0);
    const Mapflow__V1__PutRegionCommitReply *cr = r->put_region_commit_reply;
    assert_int_equal(cr->n_status, RG_NB);
    assert_int_equal(cr->committed, RG_NB - 3);
    assert_int_equal(cr->first_failed, bad);
    assert_int_equal(cr->checked_on_gpu, expect_gpu);
    for (uint32_t i = 0; i < RG_NB; i++)
        assert_int_equal(cr->status[i], i == bad || i == bad_tiles ? (uint32_t)MF_DATA_LOSS
                                        : i == other_layer ? (uint32_t)MF_INVALID_ARGUMENT
                                                           : 0u);
    printf("region commit: %s\n", cr->first_error);
    mf_envelope_free(r);
    for (uint32_t i = 0; i < RG_NB; i++)
        assert_key_row(&c, RG_LAYER, td_block_hash(NS, MODEL, RG_B, tokens, i),
                       i == bad || i == bad_tiles || i == other_layer ? NULL : row[i],
                       size[i]);
    assert_key_row(&c, RG_LAYER + 1, td_block_hash(NS, MODEL, RG_B, tokens, other_layer), NULL, 0);
    /* Leased device views are the rows where the source wrote them: nothing was moved. */
    uint32_t layer = RG_LAYER;
    r = get_prefix(&c, RG_B, tokens, bad * RG_B, &layer, 1, 1, mapped_mask(&gv));
    assert_int_equal(r->get_reply->n_rows, bad);
    for (uint32_t i = 0; i < bad; i++) {
        assert_int_equal(r->get_reply->rows[i]->tier, MAPFLOW__V1__TIER__TIER_GPU);
        assert_int_equal(r->get_reply->rows[i]->arena_offset, off[i]);
        assert_lease_bytes(&c, &gv, r->get_reply->rows[i], row[i], size[i]);
    }
    release_all(&c, r->get_reply);
    mf_envelope_free(r);
    r = stats(&c);
    double chk_us = (double)(counter(r, "put_region_check_microseconds_total") - chk0);
    assert_int_equal(counter(r, "put_regions"), 0);
    assert_int_equal(counter(r, "put_regions_committed_total"), 1);
    assert_int_equal(counter(r, "put_rejected_total"), 3);
    mf_envelope_free(r);
    printf("region check (%s): %u rows, %.1f KiB, %.0f us (%.1f us/row)\n",
           expect_gpu ? "checksums on the GPU" : "rows copied to the host", RG_NB,
           (double)total / 1024, chk_us, chk_us / RG_NB);

    /* A second commit, an abort after it, a commit after an abort: NOT_FOUND. */
    r = region_end(&c, id, 1);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY),
                     MF_NOT_FOUND);
    assert_non_null(strstr(r->error->message, "already committed"));
    mf_envelope_free(r);
    r = region_begin(&c, RG_LAYER, lens, 4, mapped_mask(&gv));
    uint64_t id2 = r->put_region_begin_reply->region_id;
    mf_envelope_free(r);
    r = region_end(&c, id2, 0);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT_REPLY), 0);
    mf_envelope_free(r);
    r = region_end(&c, id2, 1);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY),
                     MF_NOT_FOUND);
    mf_envelope_free(r);

    /* Bounds: no rows, too many, a row shorter than a header, more than the arena, more
     * than the namespace's share, no mapped arena. */
    uint64_t *many = calloc(65537, sizeof(*many));
    for (size_t i = 0; i < 65537; i++)
        many[i] = 128;
    uint64_t short_len[2] = {4096, 79}, huge[2] = {40u << 20, 30u << 20}, half[1] = {40u << 20};
    struct { const uint64_t *l; size_t n; uint64_t mask; int want; } cases[] = {
        {lens, 0, 1, MF_INVALID_ARGUMENT},        {many, 65537, 1, MF_INVALID_ARGUMENT},
        {short_len, 2, 1, MF_INVALID_ARGUMENT},   {huge, 2, 1, MF_INVALID_ARGUMENT},
        {half, 1, 1, MF_RESOURCE_EXHAUSTED},      {lens, 4, 0, MF_FAILED_PRECONDITION},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        r = region_begin(&c, RG_LAYER, cases[k].l, cases[k].n, cases[k].mask);
        assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY),
                         cases[k].want);
        mf_envelope_free(r);
    }
    free(many);

    /* A region dies with its connection: Stats sees it held, then freed. */
    r = region_begin(&c2, RG_LAYER, lens, RG_NB, mapped_mask(&gv2));
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY), 0);
    uint64_t held = r->put_region_begin_reply->bytes;
    mf_envelope_free(r);
    r = stats(&c);
    uint64_t used1 = counter(r, "gpu_arena_used_bytes{arena=\"0\",device=\"0\"}");
    assert_int_equal(counter(r, "put_regions"), 1);
    mf_envelope_free(r);
    gview_close(&gv2);
    td_close(&c2);
    uint64_t used2 = used1, regions = 1;
    for (int k = 0; k < 500 && regions; k++) {
        usleep(10000);
        r = stats(&c);
        regions = counter(r, "put_regions");
        used2 = counter(r, "gpu_arena_used_bytes{arena=\"0\",device=\"0\"}");
        mf_envelope_free(r);
    }
    assert_int_equal(regions, 0);
    assert_int_equal(used1 - used2, held);
    assert_true(used2 > used0); /* the committed rows stay */
    for (uint32_t i = 0; i < RG_NB; i++)
        free(row[i]);
    free(wrong);
    gpu_stop(&d, &c, &gv);
}

/* PutRegionCommit with each row's actual lengths (PutRegionBegin.capacities). */
static mf_envelope_t *region_commit_lens(td_cli_t *c, uint64_t id, const uint64_t *lens,
                                         size_t n)
{
    Mapflow__V1__PutRegionCommit m = MAPFLOW__V1__PUT_REGION_COMMIT__INIT;
    m.region_id = id;
    m.lengths = (uint64_t *)lens;
    m.n_lengths = n;
    mf_envelope_t *r = td_simple(c, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT, &m);
    assert_non_null(r);
    return r;
}

static uint64_t gpu_used(td_cli_t *c, uint64_t *regions)
{
    mf_envelope_t *r = stats(c);
    uint64_t u = counter(r, "gpu_arena_used_bytes{arena=\"0\",device=\"0\"}");
    if (regions)
        *regions = counter(r, "put_regions");
    mf_envelope_free(r);
    return u;
}

/* A region reserved by capacity (what an exporter knows before it runs): random rows
 * written at the row addresses with random bytes in the slack after them, the commit
 * naming the actual lengths. Wrong lengths (none, a count mismatch, > capacity, < a
 * header, lengths on an exact region) refuse the commit and leave the region as it was;
 * a length the header's total_size disagrees with refuses that row. After the commit
 * every other row reads back byte-exact and the arena holds exactly the committed rows
 * (each rounded to 64): the slack and the refused row went back. */
#define CAP_NB 24
static void capacities_run(int expect_gpu)
{
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "64mb", "--host_bytes", "16mb", "--gpu_devices",
              "0");
    assert_int_equal(gv.open_result[0], 0);
    unsigned seed = 777;
    uint32_t tokens[CAP_NB * RG_B];
    for (size_t i = 0; i < CAP_NB * RG_B; i++)
        tokens[i] = 5 + (uint32_t)(rand_r(&seed) % 60000);
    uint8_t *row[CAP_NB];
    size_t size[CAP_NB];
    uint64_t cap[CAP_NB], len[CAP_NB];
    const uint32_t lying = 9; /* committed with a length its header does not carry */
    for (uint32_t i = 0; i < CAP_NB; i++) {
        row[i] = region_row(RG_LAYER, tokens, i, &seed, &size[i]);
        /* Slack from none to several KiB (row 0: exactly its size; the lying row: room
         * for the wrong length). */
        cap[i] = size[i] + (i == 0 ? 0 : 64 + (uint64_t)rand_r(&seed) % 6000);
        len[i] = size[i];
    }
    uint64_t used0 = gpu_used(&c, NULL), want_used = 0, cap_bytes = 0;
    for (uint32_t i = 0; i < CAP_NB; i++)
        cap_bytes += (cap[i] + 63) & ~63ull;

    Mapflow__V1__PutRegionBegin b = MAPFLOW__V1__PUT_REGION_BEGIN__INIT;
    b.model = MODEL;
    b.layer = RG_LAYER;
    b.lengths = cap;
    b.n_lengths = CAP_NB;
    b.gpu_mapped = mapped_mask(&gv);
    b.capacities = 1;
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN, &b);
    assert_non_null(r);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY), 0);
    const Mapflow__V1__PutRegionBeginReply *br = r->put_region_begin_reply;
    assert_int_equal(br->n_row_offsets, CAP_NB);
    assert_int_equal(br->bytes, cap_bytes); /* reserved by capacity */
    uint64_t id = br->region_id, off[CAP_NB];
    for (uint32_t i = 0; i < CAP_NB; i++) {
        off[i] = br->row_offsets[i];
        if (i)
            assert_true(off[i] >= off[i - 1] + cap[i - 1]);
    }
    mf_envelope_free(r);
    uint64_t regions;
    uint64_t used_open = gpu_used(&c, &regions);
    assert_int_equal(used_open - used0, cap_bytes);
    assert_int_equal(regions, 1);
    for (uint32_t i = 0; i < CAP_NB; i++) {
        uint8_t *junk = malloc(cap[i]);
        for (size_t k = 0; k < cap[i]; k++)
            junk[k] = (uint8_t)rand_r(&seed);
        memcpy(junk, row[i], size[i]);
        assert_int_equal(cu->cuMemcpyHtoD(gv.base[0] + off[i], junk, cap[i]), 0);
        free(junk);
    }
    assert_int_equal(cu->cuCtxSynchronize(), 0);

    /* Wrong lengths: the commit is refused, the region stays open and whole. */
    uint64_t over[CAP_NB], under[CAP_NB];
    memcpy(over, len, sizeof(len));
    memcpy(under, len, sizeof(len));
    over[5] = cap[5] + 1;
    under[7] = MF_ROW_HEADER - 1;
    struct { const uint64_t *l; size_t n; const char *msg; } bad[] = {
        {NULL, 0, "0 lengths"},          {len, CAP_NB - 1, "23 lengths"},
        {over, CAP_NB, "row 5 is"},      {under, CAP_NB, "row 7 is 79 bytes"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        r = region_commit_lens(&c, id, bad[k].l, bad[k].n);
        assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY),
                         MF_INVALID_ARGUMENT);
        if (!strstr(r->error->message, bad[k].msg))
            fail_msg("case %zu: '%s' lacks '%s'", k, r->error->message, bad[k].msg);
        mf_envelope_free(r);
        assert_int_equal(gpu_used(&c, &regions), used_open);
        assert_int_equal(regions, 1);
    }

    /* The commit: every row but the lying one visible, byte-exact; slack returned. */
    len[lying] = size[lying] + 64; /* ≤ cap: only the header can tell */
    r = region_commit_lens(&c, id, len, CAP_NB);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY), 0);
    const Mapflow__V1__PutRegionCommitReply *cr = r->put_region_commit_reply;
    assert_int_equal(cr->committed, CAP_NB - 1);
    assert_int_equal(cr->first_failed, lying);
    assert_int_equal(cr->status[lying], MF_INVALID_ARGUMENT);
    assert_int_equal(cr->checked_on_gpu, expect_gpu);
    printf("capacities commit: %s\n", cr->first_error);
    mf_envelope_free(r);
    for (uint32_t i = 0; i < CAP_NB; i++) {
        assert_key_row(&c, RG_LAYER, td_block_hash(NS, MODEL, RG_B, tokens, i),
                       i == lying ? NULL : row[i], size[i]);
        if (i != lying)
            want_used += (size[i] + 63) & ~63ull;
    }
    uint64_t used1 = gpu_used(&c, &regions);
    assert_int_equal(regions, 0);
    assert_int_equal(used1 - used0, want_used);
    printf("capacities: reserved %llu bytes, %llu kept by %u rows\n",
           (unsigned long long)cap_bytes, (unsigned long long)want_used, CAP_NB - 1);
    /* Leased device views are where the exporter wrote the rows. */
    uint32_t layer = RG_LAYER;
    r = get_prefix(&c, RG_B, tokens, lying * RG_B, &layer, 1, 1, mapped_mask(&gv));
    assert_int_equal(r->get_reply->n_rows, lying);
    for (uint32_t i = 0; i < lying; i++) {
        assert_int_equal(r->get_reply->rows[i]->arena_offset, off[i]);
        assert_lease_bytes(&c, &gv, r->get_reply->rows[i], row[i], size[i]);
    }
    release_all(&c, r->get_reply);
    mf_envelope_free(r);

    /* Lengths on a region begun with exact lengths: refused; abort gives it all back. */
    r = region_begin(&c, RG_LAYER, len, 3, mapped_mask(&gv));
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY), 0);
    uint64_t id2 = r->put_region_begin_reply->region_id;
    mf_envelope_free(r);
    r = region_commit_lens(&c, id2, len, 3);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(r->error->message, "exact lengths"));
    mf_envelope_free(r);
    r = region_end(&c, id2, 0);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT_REPLY), 0);
    mf_envelope_free(r);
    assert_int_equal(gpu_used(&c, &regions), used1);
    assert_int_equal(regions, 0);
    for (uint32_t i = 0; i < CAP_NB; i++)
        free(row[i]);
    gpu_stop(&d, &c, &gv);
}

/* Rows checked on the host (the fake's default), then (with the PTX built in) the fake
 * running the checksum kernels: the GPU check sees the actual lengths, not the caps. */
static void test_region_capacities(void **state)
{
    (void)state;
    size_t ptx_len;
    capacities_run(g_real && mfd_gpu_verify_ptx(&ptx_len) != NULL);
    if (g_real || !mfd_gpu_verify_ptx(&ptx_len))
        return;
    setenv("FAKECUDA_MODULES", "1", 1);
    capacities_run(1);
    unsetenv("FAKECUDA_MODULES");
}

/* Region puts with rows copied whole to the host (the fake's default: no kernels), or on a
 * GPU with the checksum kernels (the real driver with PTX built in). */
static void test_region_put(void **state)
{
    (void)state;
    size_t ptx_len;
    region_run(g_real && mfd_gpu_verify_ptx(&ptx_len) != NULL);
}

/* The fake running the checksum kernels on the CPU: the region's GPU path (the batched
 * launches after their self-test, then per-row launches; header and prefix copies, the
 * second copy of long prefixes). On the real driver the per-row launches only (the default
 * run covers the batched ones). */
static void test_region_put_gpu_path(void **state)
{
    (void)state;
    size_t ptx_len;
    if (!mfd_gpu_verify_ptx(&ptx_len))
        skip();
    setenv("FAKECUDA_MODULES", "1", 1);
    if (!g_real)
        region_run(1);
    setenv("MFD_REGION_BATCHED", "0", 1);
    region_run(1);
    unsetenv("MFD_REGION_BATCHED");
    unsetenv("FAKECUDA_MODULES");
}

/* Region puts at the hand-off's shape, timed (printed, never asserted): layers of 512 rows
 * (a 32k prefix at B = 64) through PutRegionBegin, a DtoD of the rows into the region (what
 * the source's kernels would write), PutRegionCommit; MASK layers (40 heads, 8 middle
 * columns) and FP16 "prob" layers (8 heads, 4 middle columns). MF_REGION_RATE=L runs L
 * mask layers and 2 prob layers (tests/gpu/tier_smoke.sh: 30); unset, 1 and 1 of 64 rows. */
static void test_region_rate(void **state)
{
    (void)state;
    const char *e = getenv("MF_REGION_RATE");
    uint32_t n_mask = e && *e ? (uint32_t)atoi(e) : 1, n_prob = e && *e ? 2 : 1;
    uint32_t nb = e && *e ? 512 : 64, B = 64;
    if (n_mask < 1 || n_mask > 64)
        n_mask = 1;
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "512mb", "--host_bytes", "64mb", "--write_through",
              "off", "--gpu_devices", "0");
    assert_int_equal(gv.open_result[0], 0);
    unsigned seed = 515;
    uint32_t *tokens = malloc((size_t)nb * B * 4);
    for (size_t i = 0; i < (size_t)nb * B; i++)
        tokens[i] = 3 + (uint32_t)(rand_r(&seed) % 60000);
    mf_hash128_t *h = malloc((nb + 1) * sizeof(*h));
    h[0] = mf_hash_root(B, NS, strlen(NS), MODEL, strlen(MODEL));
    for (uint32_t b = 0; b < nb; b++)
        h[b + 1] = mf_hash_next(h[b], tokens + (size_t)b * B, B);
    for (int prob = 0; prob < 2; prob++) {
        uint32_t nl = prob ? n_prob : n_mask;
        /* One layer's rows, uploaded once (the source's scratch); each layer puts them
         * under its own layer number (the rows carry it: rebuilt per layer, same shape). */
        double t_begin = 0, t_copy = 0, t_commit = 0, bytes = 0;
        int on_gpu = 1, small = 1; /* rows of ≤ 4 KiB are checksummed on the host anyway */
        for (uint32_t l = 0; l < nl; l++) {
            uint32_t layer = 200 + (uint32_t)prob * 100 + l;
            uint8_t **row = malloc(nb * sizeof(*row));
            uint64_t *lens = malloc(nb * sizeof(*lens)), total = 0;
            for (uint32_t b = 0; b < nb; b++) {
                size_t sz;
                row[b] = shaped_row(layer, B, prob ? 8 : 40, prob ? MF_CODEC_FP16 : MF_CODEC_MASK,
                                    prob ? 4 : 8, h[b], h[b + 1], tokens, b, &seed, &sz);
                lens[b] = sz;
                total += mfd_arena_round(sz);
                small &= sz <= MFD_GPU_RC_HEAD;
            }
            mf_cu_deviceptr_t src;
            assert_int_equal(cu->cuMemAlloc(&src, total), 0);
            uint64_t at = 0;
            for (uint32_t b = 0; b < nb; b++) {
                assert_int_equal(cu->cuMemcpyHtoD(src + at, row[b], lens[b]), 0);
                at += mfd_arena_round(lens[b]);
            }
            assert_int_equal(cu->cuCtxSynchronize(), 0);
            double t0 = mf_now_s();
            mf_envelope_t *r = region_begin(&c, layer, lens, nb, mapped_mask(&gv));
            double t1 = mf_now_s();
            assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY), 0);
            const Mapflow__V1__PutRegionBeginReply *br = r->put_region_begin_reply;
            assert_int_equal(br->bytes, total); /* rows back to back: one copy does it */
            assert_int_equal(cu->cuMemcpyDtoD(gv.base[br->gpu_arena] + br->arena_offset, src,
                                              total), 0);
            assert_int_equal(cu->cuCtxSynchronize(), 0);
            uint64_t id = br->region_id;
            mf_envelope_free(r);
            double t2 = mf_now_s();
            r = region_end(&c, id, 1);
            double t3 = mf_now_s();
            assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY), 0);
            assert_int_equal(r->put_region_commit_reply->committed, nb);
            on_gpu &= r->put_region_commit_reply->checked_on_gpu;
            mf_envelope_free(r);
            t_begin += t1 - t0;
            t_copy += t2 - t1;
            t_commit += t3 - t2;
            bytes += (double)total;
            assert_key_row(&c, layer, h[nb], row[nb - 1], lens[nb - 1]);
            assert_int_equal(cu->cuMemFree(src), 0);
            for (uint32_t b = 0; b < nb; b++)
                free(row[b]);
            free(row);
            free(lens);
        }
        printf("region rate (%s layers): %u x %u rows, %.1f MiB/layer; per layer: begin %.2f "
               "ms, copy %.2f ms, commit %.2f ms (%.1f us/row; checksums %s)\n",
               prob ? "fp16" : "mask", nl, nb, bytes / nl / (1 << 20), t_begin * 1e3 / nl,
               t_copy * 1e3 / nl, t_commit * 1e3 / nl, t_commit * 1e6 / nl / nb,
               small ? "on the host (rows of <= 4 KiB)" : on_gpu ? "on the GPU" : "on the host");
        fflush(stdout);
    }
    free(h);
    free(tokens);
    gpu_stop(&d, &c, &gv);
}

/* Off: gpu_bytes 0 (in-process daemon) and a missing driver (real process). Puts go to the
 * host tier, no arenas are announced, Stats and Health say why. */
static void test_tier_off(void **state)
{
    (void)state;
    td_daemon_t d = {0};
    assert_int_equal(td_start(&d, NULL), 0);
    td_cli_t c;
    gview_t gv;
    assert_int_equal(hello_gpu(&c, d.sock, 0, &gv), 0);
    assert_int_equal(gv.n, 0);
    rowset_t rs;
    rows_make(&rs, 16, 2, 1, 5);
    put_res_t p = put_row(&c, &gv, 0, rows_hash(&rs, 0), rs.row[0], rs.size[0], 1,
                          MAPFLOW__V1__TIER__TIER_GPU, 1);
    assert_int_equal(p.status, 0);
    assert_int_equal(p.tier, MAPFLOW__V1__TIER__TIER_HOST);
    mf_envelope_t *r = stats(&c);
    assert_false(r->stats_reply->tiers[0]->enabled);
    assert_string_equal(r->stats_reply->tiers[0]->why_off, "gpu_bytes is 0");
    mf_envelope_free(r);
    /* No GPU tier, no region: the caller falls back to row-by-row puts. */
    uint64_t lens[1] = {rs.size[0]};
    r = region_begin(&c, 0, lens, 1, 1);
    assert_int_equal(reply_code(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY),
                     MF_FAILED_PRECONDITION);
    assert_non_null(strstr(r->error->message, "GPU tier is off (gpu_bytes is 0)"));
    mf_envelope_free(r);
    td_close(&c);
    td_stop(&d);
    td_rmdir(&d);

    daemon_t g = {0};
    char *drv = strdup(getenv("MF_CUDA_DRIVER") ? getenv("MF_CUDA_DRIVER") : "");
    setenv("MF_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1); /* for the daemon only */
    daemon_start(&g, 0, "--gpu_bytes", "1mb", (const char *)NULL);
    setenv("MF_CUDA_DRIVER", drv, 1);
    free(drv);
    assert_int_equal(td_connect(&c, g.sock, NS, 1), 0);
    r = stats(&c);
    assert_false(r->stats_reply->tiers[0]->enabled);
    assert_non_null(strstr(r->stats_reply->tiers[0]->why_off, "no CUDA driver"));
    mf_envelope_free(r);
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HEALTH;
    env.health = &h;
    r = td_call(&c, &env, NULL, 0);
    assert_non_null(strstr(r->health_reply->status, "gpu off (no CUDA driver"));
    mf_envelope_free(r);
    p = put_row(&c, &gv, 0, rows_hash(&rs, 1), rs.row[1], rs.size[1], 0, 0, 0);
    assert_int_equal(p.status, 0);
    assert_int_equal(p.commit_tier, MAPFLOW__V1__TIER__TIER_HOST);
    td_close(&c);
    rows_free(&rs);
    daemon_stop(&g, 1);
}

/* 1 when the file at path contains needle (the whole file read; small logs only). */
static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

/* Waits (≤ 20 s: the daemon pins on a thread of its own) for needle in the daemon's log. */
static int log_wait(const daemon_t *d, const char *needle)
{
    for (int i = 0; i < 2000; i++) {
        if (file_has(d->log, needle))
            return 1;
        usleep(10000);
    }
    return 0;
}

/* One host_pin case: rows put on the GPU tier come back staged (host views) with exact
 * bytes whatever became of the registration; `expect` is 1 registered, -1 refused, 0 off.
 * The fake driver logs every registration of the daemon process to a file. */
static void host_pin_case(const char *pin, int expect)
{
    char reglog[] = "/tmp/mf-hostreg-XXXXXX";
    int fd = mkstemp(reglog);
    assert_true(fd >= 0);
    close(fd);
    setenv("FAKECUDA_HOSTREG_LOG", reglog, 1);
    if (expect < 0)
        setenv("FAKECUDA_HOSTREG_FAIL", "1", 1);
    daemon_t d;
    td_cli_t c;
    gview_t gv;
    GPU_START(d, c, gv, 0, "--gpu_bytes", "4mb", "--host_bytes", "8mb", "--gpu_devices", "0",
              "--host_pin", pin);
    unsetenv("FAKECUDA_HOSTREG_LOG");
    unsetenv("FAKECUDA_HOSTREG_FAIL");
    char line[96];
    snprintf(line, sizeof(line), "register %d %u 1\n", (int)d.pid, 8u << 20);
    if (expect > 0) {
        assert_true(log_wait(&d, "host arena pinned for CUDA"));
        assert_true(file_has(reglog, line));
    } else if (expect < 0) {
        assert_true(log_wait(&d, "host arena NOT pinned for CUDA"));
        assert_false(file_has(reglog, "register"));
    } else {
        assert_true(log_wait(&d, "host_pin off"));
        assert_false(file_has(d.log, "pinning"));
        assert_false(file_has(reglog, "register"));
    }

    rowset_t rs;
    rows_make(&rs, 64, 5, 1, 777 + (unsigned)expect);
    for (uint32_t i = 0; i < rs.nb; i++) {
        put_res_t p = put_row(&c, &gv, 0, rows_hash(&rs, i), rs.row[i], rs.size[i], 0, 0, 0);
        assert_int_equal(p.status, 0);
        assert_int_equal(p.commit_tier, MAPFLOW__V1__TIER__TIER_GPU);
    }
    uint32_t layer = 0;
    mf_envelope_t *r = get_prefix(&c, rs.B, rs.tokens, (size_t)rs.nb * rs.B, &layer, 1, 1, 0);
    const Mapflow__V1__GetReply *g = r->get_reply;
    assert_int_equal(g->n_rows, rs.nb);
    for (size_t k = 0; k < g->n_rows; k++) {
        assert_int_equal(g->rows[k]->tier, MAPFLOW__V1__TIER__TIER_HOST);
        assert_lease_bytes(&c, &gv, g->rows[k], rs.row[k], rs.size[k]);
    }
    release_all(&c, g);
    mf_envelope_free(r);
    rows_free(&rs);
    pid_t pid = d.pid;
    gpu_stop(&d, &c, &gv);
    /* Unregistered at shutdown, before the arena is unmapped. */
    snprintf(line, sizeof(line), "unregister %d %u", (int)pid, 8u << 20);
    assert_int_equal(file_has(reglog, line), expect > 0);
    unlink(reglog);
}

/* host_pin: the daemon registers its host arena with the driver (PORTABLE) when the GPU
 * tier is on, logs it, continues unpinned when the driver refuses, and does nothing with
 * host_pin off. The registrations are the fake driver's record: fake only. */
static void test_host_pin(void **state)
{
    (void)state;
    if (g_real)
        skip();
    host_pin_case("on", 1);
    host_pin_case("on", -1);
    host_pin_case("off", 0);
}

static int setup(void **state)
{
    (void)state;
    const char *real = getenv("MF_GPU_REAL");
    g_real = real && *real && strcmp(real, "0") != 0;
    if (!g_real && fakecuda_use(1, 0) != 0) {
        fprintf(stderr, "libfakecuda.so not found (make build/lib/tests/libfakecuda.so)\n");
        return -1;
    }
    const char *why = NULL;
    if (mf_cudrv_get(&cu, &why) != MF_OK) {
        fprintf(stderr, "CUDA driver: %s\n", why);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tp_find_mapflowd(argv[0]);
    const char *only = getenv("MF_GPU_TESTS"); /* e.g. test_big_device_rows */
    if (only && *only)
        cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_put_lease_copy_stage, teardown),
        cmocka_unit_test_teardown(test_eviction_keeps_rows_and_leases, teardown),
        cmocka_unit_test_teardown(test_write_through_restart, teardown),
        cmocka_unit_test_teardown(test_promote_on_hit, teardown),
        cmocka_unit_test_teardown(test_two_devices_no_peer, teardown),
        cmocka_unit_test_teardown(test_big_device_rows, teardown),
        cmocka_unit_test_teardown(test_big_device_rows_gpu_path, teardown),
        cmocka_unit_test_teardown(test_region_put, teardown),
        cmocka_unit_test_teardown(test_region_put_gpu_path, teardown),
        cmocka_unit_test_teardown(test_region_capacities, teardown),
        cmocka_unit_test_teardown(test_region_rate, teardown),
        cmocka_unit_test_teardown(test_tier_off, teardown),
        cmocka_unit_test_teardown(test_host_pin, teardown),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
