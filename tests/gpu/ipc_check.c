/*
 * ipc_check — the daemon's GPU tier end to end on a real GPU: rows made on the GPU by one
 * process are read in place, through CUDA IPC, by another. Starts no daemon: give it
 * the socket of a mapflowd running with gpu_bytes > 0 (tests/gpu/run.sh does).
 *
 * Source (this process, device 0): random Q/K/V (mf_synth, seed printed), mf_extract_cuda
 * into device row buffers, mf_put_device_batch of every row (the daemon places them in
 * its GPU arena: the put copies device to device). Then it starts the target — this
 * binary again, `--target`, a separate process (CUDA does not survive fork) — and pipes
 * it the rows (cudaMemcpy'd out of its device buffers).
 * Target (device 0, or --peer-device N): a channel with gpu_device = that device,
 * mf_get_prefix LEASE of every row, checks they come back on_device (or, across devices
 * without peer access, staged host views), runs mf_apply_cuda on the IPC views and on its
 * own copy of the rows, and compares the outputs bit for bit (and own vs own again, so a
 * nondeterministic kernel is told apart from wrong bytes). Bandwidth: rows bytes per
 * second of lease-get + apply reading the IPC views, against cudaMemcpy of the same bytes
 * into the target's memory and apply on that copy. With --peer-device N (both devices
 * visible) also the peer-access status (cudaDeviceCanAccessPeer, P2P attributes) and the
 * same bytes moved GPU0 -> GPU N by cudaMemcpyPeer in one process (one copy, per-row
 * copies, 256 MiB), next to the row copies from the IPC views.
 *
 * Prints one PASS/FAIL line per check and "ipc_check: PASS|FAIL"; exit status 1 on any
 * failure, 2 on setup errors.
 * Usage: ipc_check --socket PATH [--peer-device N] [--target-visible LIST] [--seed S]
 *                  [--tokens N] [--iters K]
 * --peer-device N: the target uses device N (issue 14: peer access through NVLink, or the
 * staged fallback where peer access is missing). --target-visible LIST: the target runs
 * with CUDA_VISIBLE_DEVICES=LIST (the source's device hidden from it: staged views, or an
 * IPC open of a device it cannot see).
 * Single-threaded tool; owns everything it allocates.
 */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mapflow.h"
#include "mf_clock.h"
#include "mapflow_kernels.h"
#include "mapflow_kernels_cuda.h"
#include "mf_codec.h"
#include "synth.h"

#include "gpu_util.h"

#define NS "ipc-check"
#define MODEL "ipc-src"
#define LAYER 5
#define B 64
#define D 128
#define HS 8          /* source heads (rows' n_heads) */
#define HT 8          /* target heads */

typedef struct opts {
    const char *socket;
    int target, device, peer_device;
    const char *target_visible; /* CUDA_VISIBLE_DEVICES of the target */
    int cross;                  /* target: the source's device may be another one */
    uint64_t seed;
    uint32_t n;
    int iters;
} opts_t;

static int g_fail;

static void check(const char *what, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void check(const char *what, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-40s ", ok ? "PASS" : "FAIL", what);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    g_fail |= !ok;
}

static void die(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(2);
}

static mf_channel_t *open_channel(const opts_t *o, int gpu_device)
{
    char target[4200];
    snprintf(target, sizeof(target), "unix:%s", o->socket);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_GPU | MF_CHANNEL_PARAM_TIMEOUT_MS,
                             .ns = NS, .want_arena = 1, .gpu_device = gpu_device,
                             .timeout_ms = 60000};
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK)
        die("open %s: %s", target, mf_channel_last_error(ch));
    mf_gpu_info_t gi;
    mf_channel_gpu_info(ch, &gi);
    printf("%s: gpu_device %d: %u arena(s) announced, %u mapped (%u through peer access)%s%s\n",
           o->target ? "target" : "source", gpu_device, gi.n_announced, gi.n_mapped, gi.n_peer,
           gi.why[0] ? ": " : "", gi.why);
    for (uint32_t i = 0; i < gi.n_announced && i < MF_GPU_MAX_ARENAS; i++)
        printf("  arena %u: %llu bytes, %s, device %d%s%s\n", gi.arenas[i].index,
               (unsigned long long)gi.arenas[i].bytes, gi.arenas[i].pci_bus_id,
               gi.arenas[i].device, gi.arenas[i].mapped ? ", mapped" : ", NOT mapped: ",
               gi.arenas[i].why);
    return ch;
}

static void tokens_make(uint32_t *t, uint32_t n, uint64_t seed)
{
    mf_rng_t r;
    mf_rng_seed(&r, seed ^ 0x70cE115ull);
    for (uint32_t i = 0; i < n; i++)
        t[i] = 1 + (uint32_t)(mf_rng_u64(&r) % 50000);
}

/* Random F16 Q/K/V on the device. */
static mf_qkv_t qkv_make(uint64_t seed, uint32_t n, uint32_t h, void *dev[3])
{
    size_t ne = (size_t)n * h * D;
    float *f[3];
    uint16_t *x = malloc(ne * 2);
    for (int i = 0; i < 3; i++)
        f[i] = malloc(ne * 4);
    mf_synth_opts_t so = {.seed = seed, .n_tokens = n, .n_q_heads = h, .n_kv_heads = h,
                          .head_dim = D, .window = 96, .sink = 3.0f, .noise = 1.0f};
    if (!x || !f[0] || !f[1] || !f[2] || mf_synth_qkv(&so, f[0], f[1], f[2]) != MF_OK)
        die("%s%s", "synth failed", "");
    for (int i = 0; i < 3; i++) {
        for (size_t e = 0; e < ne; e++)
            x[e] = mf_f32_to_f16(f[i][e]);
        CK(cudaMalloc(&dev[i], ne * 2));
        CK(cudaMemcpy(dev[i], x, ne * 2, cudaMemcpyHostToDevice));
        free(f[i]);
    }
    free(x);
    mf_qkv_t q = {dev[0], dev[1], dev[2], MF_DTYPE_F16, n, h, h, D};
    return q;
}

/* ==== source ========================================================================== */

static int run_source(const opts_t *o, char **argv)
{
    uint32_t n = o->n, nb = n / B;
    printf("ipc_check: seed %llu, %u tokens, B %u, %u source heads, d %u\n",
           (unsigned long long)o->seed, n, B, HS, D);
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    uint32_t *tokens = malloc(n * 4);
    tokens_make(tokens, n, o->seed);
    void *qd[3];
    mf_qkv_t src = qkv_make(o->seed, n, HS, qd);
    size_t *cap = calloc(nb, sizeof(size_t)), *off = calloc(nb, sizeof(size_t)), total = 0;
    void **rows = calloc(nb, sizeof(void *));
    for (uint32_t k = 0; k < nb; k++) {
        cap[k] = mf_extract_row_bound(MF_CODEC_FP16, B, HS, k, strlen(MODEL));
        off[k] = total;
        total += (cap[k] + 15) & ~(size_t)15;
    }
    uint8_t *drows;
    uint64_t *dsizes;
    uint32_t *dfailed, failed = 0;
    CK(cudaMalloc((void **)&drows, total));
    CK(cudaMalloc((void **)&dsizes, nb * 8));
    CK(cudaMalloc((void **)&dfailed, 4));
    for (uint32_t k = 0; k < nb; k++)
        rows[k] = drows + off[k];
    mf_extract_cuda_args_t ea = {.src = src, .block_size = B, .top_p = 0.9f,
                                 .codec = MF_CODEC_FP16, .i0 = 0, .i1 = nb, .model = MODEL,
                                 .ns = NS, .layer = LAYER, .tokens = tokens, .rows = rows,
                                 .caps = cap, .sizes = dsizes, .failed_block = dfailed};
    const char *why = "";
    mf_status_t st = mf_extract_cuda(&ea, 0, &why);
    if (st != MF_OK)
        die("mf_extract_cuda: %s (%s)", mf_status_name(st), why);
    CK(cudaDeviceSynchronize());
    uint64_t *sizes = calloc(nb, 8);
    CK(cudaMemcpy(sizes, dsizes, nb * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&failed, dfailed, 4, cudaMemcpyDeviceToHost));
    check("source: extract", failed == UINT32_MAX, "%u rows", nb);

    mf_channel_t *ch = open_channel(o, 0);
    mf_put_item_t *items = calloc(nb, sizeof(*items));
    size_t bytes = 0;
    for (uint32_t k = 0; k < nb; k++) {
        items[k].row = rows[k];
        items[k].len = sizes[k];
        bytes += sizes[k];
    }
    double t0 = mf_now_s();
    st = mf_put_device_batch(ch, items, nb, 0, MF_TIMEOUT_DEFAULT);
    double t1 = mf_now_s();
    uint32_t on_gpu = 0;
    for (uint32_t k = 0; k < nb; k++)
        on_gpu += items[k].status == MF_OK && items[k].result.tier == MF_TIER_GPU;
    check("source: mf_put_device_batch", st == MF_OK, "%u rows, %zu bytes, %u in the gpu tier, "
          "%.2f ms%s%s", nb, bytes, on_gpu, (t1 - t0) * 1e3, st ? ": " : "",
          st ? mf_channel_last_error(ch) : "");
    check("source: rows placed on the gpu tier", on_gpu == nb, "%u of %u", on_gpu, nb);

    /* the target, with our rows through a pipe */
    int pfd[2];
    if (pipe(pfd) != 0)
        die("%s%s", "pipe failed", "");
    char dev[16], seed[32], ntok[16], iters[16];
    snprintf(dev, sizeof(dev), "%d", o->peer_device >= 0 ? o->peer_device : 0);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)o->seed);
    snprintf(ntok, sizeof(ntok), "%u", n);
    snprintf(iters, sizeof(iters), "%d", o->iters);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (o->target_visible)
            setenv("CUDA_VISIBLE_DEVICES", o->target_visible, 1);
        dup2(pfd[0], 0);
        close(pfd[0]);
        close(pfd[1]);
        execl("/proc/self/exe", argv[0], "--target", "--socket", o->socket, "--device", dev,
              "--seed", seed, "--tokens", ntok, "--iters", iters,
              o->target_visible ? "--cross" : NULL, (char *)NULL);
        _exit(127);
    }
    close(pfd[0]);
    uint8_t *host = malloc(total);
    CK(cudaMemcpy(host, drows, total, cudaMemcpyDeviceToHost));
    FILE *w = fdopen(pfd[1], "w");
    fwrite(&nb, 4, 1, w);
    for (uint32_t k = 0; k < nb; k++) {
        fwrite(&sizes[k], 8, 1, w);
        fwrite(host + off[k], 1, sizes[k], w);
    }
    fclose(w);
    int status = 0;
    waitpid(pid, &status, 0);
    check("source: target process", WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    mf_channel_close(ch);
    for (int i = 0; i < 3; i++)
        cudaFree(qd[i]);
    cudaFree(drows);
    cudaFree(dsizes);
    cudaFree(dfailed);
    free(host);
    free(items);
    free(sizes);
    free(rows);
    free(cap);
    free(off);
    free(tokens);
    printf("ipc_check: %s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}

/* ==== target ========================================================================== */

static void read_all(void *p, size_t n)
{
    if (fread(p, 1, n, stdin) != n)
        die("%s%s", "target: short read of the rows from the source", "");
}

static double apply_once(const mf_apply_cuda_args_t *a, uint32_t *dbad)
{
    CK(cudaMemset(dbad, 0, 4));
    CK(cudaMemset(a->o, 0xff, (size_t)a->tgt.n_tokens * HT * D * 4));
    CK(cudaDeviceSynchronize());
    double t0 = mf_now_s();
    const char *why = "";
    mf_status_t st = mf_apply_cuda(a, 0, &why);
    if (st != MF_OK)
        die("mf_apply_cuda: %s (%s)", mf_status_name(st), why);
    CK(cudaDeviceSynchronize());
    return mf_now_s() - t0;
}

/* Issue 14: how the target's device reaches device 0 (the daemon's arena), and the same
 * bytes moved GPU0 -> target device by cudaMemcpyPeer in this one process, next to the
 * IPC-view numbers (t_get, t_copy: seconds per iteration of the bandwidth loop). Only where
 * this process sees both devices (--peer-device N without --target-visible). */
static void peer_report(const opts_t *o, const uint8_t *host, const size_t *off,
                        const size_t *len, uint32_t nb, size_t total, size_t bytes,
                        double t_get, double t_copy)
{
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (o->cross || o->device == 0 || ndev < 2) {
        printf("peer: n/a (target device %d, %d device(s) visible%s)\n", o->device, ndev,
               o->cross ? ", the source's device hidden from CUDA_VISIBLE_DEVICES: the views "
                          "above say whether its arena still opened (device views) or rows "
                          "came staged through host memory" : "");
        return;
    }
    int dev = o->device, to0 = 0, from0 = 0, rank = -1, atom = -1, sup = -1;
    CK(cudaDeviceCanAccessPeer(&to0, dev, 0));
    CK(cudaDeviceCanAccessPeer(&from0, 0, dev));
    cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, dev);
    cudaDeviceGetP2PAttribute(&sup, cudaDevP2PAttrAccessSupported, 0, dev);
    cudaDeviceGetP2PAttribute(&atom, cudaDevP2PAttrNativeAtomicSupported, 0, dev);
    printf("peer access: cudaDeviceCanAccessPeer(%d -> 0) %d, (0 -> %d) %d; P2P attributes "
           "0 -> %d: access %d, performance rank %d, native atomics %d (native atomics: "
           "NVLink; PCIe P2P has none); link: see nvidia-smi topo -m\n",
           dev, to0, dev, from0, dev, sup, rank, atom);
    uint8_t *s0 = NULL, *d1 = NULL, *big0 = NULL, *big1 = NULL;
    const size_t big = (size_t)256 << 20;
    CK(cudaSetDevice(0));
    CK(cudaMalloc((void **)&s0, total));
    CK(cudaMalloc((void **)&big0, big));
    CK(cudaMemcpy(s0, host, total, cudaMemcpyHostToDevice));
    CK(cudaMemset(big0, 0x5a, big));
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(dev));
    cudaError_t pe = to0 ? cudaDeviceEnablePeerAccess(0, 0) : cudaErrorPeerAccessUnsupported;
    const char *pes = pe == cudaSuccess ? "enabled here"
                      : pe == cudaErrorPeerAccessAlreadyEnabled ? "already enabled (IPC lazy "
                                                                  "peer access)"
                                                                : cudaGetErrorString(pe);
    (void)cudaGetLastError(); /* AlreadyEnabled / unsupported are not errors here */
    CK(cudaMalloc((void **)&d1, total));
    CK(cudaMalloc((void **)&big1, big));
    CK(cudaMemcpyPeer(d1, dev, s0, 0, total)); /* warm-up */
    CK(cudaMemcpyPeer(big1, dev, big0, 0, big));
    CK(cudaDeviceSynchronize());
    int iters = o->iters > 0 ? o->iters : 1;
    double t_one = 0, t_rows = 0, t_big = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = mf_now_s();
        CK(cudaMemcpyPeer(d1, dev, s0, 0, total));
        CK(cudaDeviceSynchronize());
        double t1 = mf_now_s();
        for (uint32_t k = 0; k < nb; k++)
            CK(cudaMemcpyPeerAsync(d1 + off[k], dev, s0 + off[k], 0, len[k], 0));
        CK(cudaDeviceSynchronize());
        double t2 = mf_now_s();
        CK(cudaMemcpyPeer(big1, dev, big0, 0, big));
        CK(cudaDeviceSynchronize());
        t_big += mf_now_s() - t2;
        t_one += t1 - t0;
        t_rows += t2 - t1;
    }
    uint8_t *chk = malloc(total);
    CK(cudaMemcpy(chk, d1, total, cudaMemcpyDeviceToHost));
    int same = 1;
    for (uint32_t k = 0; k < nb && same; k++)
        same = memcmp(chk + off[k], host + off[k], len[k]) == 0;
    free(chk);
    check("target: cudaMemcpyPeer bytes arrive", same, "GPU0 -> GPU%d, peer access %s", dev,
          pes);
    t_one /= iters;
    t_rows /= iters;
    t_big /= iters;
    printf("peer bandwidth GPU0 -> GPU%d (%zu row bytes, %u rows, x %d): cudaMemcpyPeer in one "
           "process: one copy %.3f ms = %.2f GB/s, per-row copies %.3f ms = %.2f GB/s; "
           "256 MiB one copy %.3f ms = %.2f GB/s | IPC views: row copies %.3f ms = %.2f GB/s, "
           "lease-get + row copies %.3f ms = %.2f GB/s\n",
           dev, bytes, nb, iters, t_one * 1e3, bytes / t_one / 1e9, t_rows * 1e3,
           bytes / t_rows / 1e9, t_big * 1e3, big / t_big / 1e9, t_copy * 1e3,
           bytes / t_copy / 1e9, (t_get + t_copy) * 1e3, bytes / (t_get + t_copy) / 1e9);
    cudaFree(d1);
    cudaFree(big1);
    CK(cudaSetDevice(0));
    cudaFree(s0);
    cudaFree(big0);
    CK(cudaSetDevice(dev));
}

static int run_target(const opts_t *o)
{
    uint32_t n = o->n, nb = n / B;
    CK(cudaSetDevice(o->device));
    CK(cudaFree(0)); /* the primary context libmapflow opens the arenas in */
    uint32_t nrows;
    read_all(&nrows, 4);
    if (nrows != nb)
        die("%s%s", "target: row count from the source differs", "");
    /* own copy of the rows, from the source's bytes */
    size_t *len = calloc(nb, sizeof(size_t)), *off = calloc(nb, sizeof(size_t)), total = 0;
    uint8_t *host = NULL;
    for (uint32_t k = 0; k < nb; k++) {
        uint64_t l;
        read_all(&l, 8);
        if (l == 0 || l > (1u << 30))
            die("%s%s", "target: bad row length from the source", "");
        len[k] = l;
        off[k] = total;
        total += (l + 15) & ~(size_t)15;
        host = realloc(host, total);
        read_all(host + off[k], l);
    }
    uint8_t *own;
    CK(cudaMalloc((void **)&own, total));
    CK(cudaMemcpy(own, host, total, cudaMemcpyHostToDevice));

    uint32_t *tokens = malloc(n * 4);
    tokens_make(tokens, n, o->seed);
    mf_channel_t *ch = open_channel(o, o->device);
    uint32_t layer = LAYER;
    mf_get_result_t *res = NULL;
    mf_status_t st = mf_get_prefix(ch, MODEL, B, tokens, n, &layer, 1, 0, 0, MF_GET_LEASE, &res,
                                   MF_TIMEOUT_DEFAULT);
    check("target: mf_get_prefix LEASE", st == MF_OK && res && res->n_rows == nb, "%s %s",
          mf_status_name(st), st ? mf_channel_last_error(ch) : "");
    if (st != MF_OK)
        return 1;
    uint32_t ok = 0, on_dev = 0, host_views = 0, same_bytes = 0;
    const void **ipc = calloc(nb, sizeof(void *)), **mine = calloc(nb, sizeof(void *));
    uint8_t *staged = NULL, *chk = malloc(total);
    CK(cudaMalloc((void **)&staged, total));
    for (uint32_t k = 0; k < nb; k++) {
        const mf_row_ref_t *r = &res->rows[k];
        mine[k] = own + off[k];
        if (r->status != MF_OK || r->length != len[k])
            continue;
        ok++;
        if (r->on_device) {
            on_dev++;
            ipc[k] = r->data;
            CK(cudaMemcpy(chk + off[k], r->data, len[k], cudaMemcpyDeviceToHost));
        } else { /* staged host view: the kernels need it on the device */
            host_views++;
            CK(cudaMemcpy(staged + off[k], r->data, len[k], cudaMemcpyHostToDevice));
            ipc[k] = staged + off[k];
            memcpy(chk + off[k], r->data, len[k]);
        }
        same_bytes += memcmp(chk + off[k], host + off[k], len[k]) == 0;
    }
    check("target: every row OK", ok == nb, "%u of %u", ok, nb);
    int cross = o->cross || o->device != 0;
    check(cross ? "target: device views or staged host views" : "target: every row on_device",
          cross ? on_dev + host_views == nb : on_dev == nb,
          "%u device views, %u staged host views", on_dev, host_views);
    check("target: leased bytes equal the source's", same_bytes == nb, "%u of %u rows",
          same_bytes, nb);

    /* apply on the IPC views and on our own copy */
    void *td[3];
    mf_qkv_t tgt = qkv_make(o->seed ^ 0x7a96e7ull, n, HT, td);
    float w[HT * HS] = {0}, tp[HT];
    uint8_t mode[HT];
    mf_rng_t rng;
    mf_rng_seed(&rng, o->seed ^ 0xa991);
    for (uint32_t t = 0; t < HT; t++) {
        float sum = 0;
        for (uint32_t z = 0; z < 2; z++) {
            float x = 0.2f + (float)mf_rng_uniform(&rng);
            w[t * HS + (uint32_t)(mf_rng_u64(&rng) % HS)] += x;
            sum += x;
        }
        for (uint32_t s = 0; s < HS; s++)
            w[t * HS + s] /= sum;
        mode[t] = (uint8_t)((t + 1) % 3); /* prob, mask, compute */
        tp[t] = 0.8f + 0.19f * (float)mf_rng_uniform(&rng);
    }
    mf_layer_map_t map = {HT, HS, w, mode, tp};
    size_t on = (size_t)n * HT * D;
    float *o_ipc, *o_own;
    uint32_t *dbad, bad[2] = {0, 0};
    CK(cudaMalloc((void **)&o_ipc, on * 4));
    CK(cudaMalloc((void **)&o_own, on * 4));
    CK(cudaMalloc((void **)&dbad, 4));
    mf_apply_cuda_args_t ai = {.rows = ipc, .n_rows = nb, .map = &map, .tgt = tgt,
                               .block_size = B, .exact_first = 0, .exact_last = 1,
                               .o = o_ipc, .bad_rows = dbad};
    mf_apply_cuda_args_t am = ai;
    am.rows = mine;
    am.o = o_own;
    apply_once(&ai, dbad);
    CK(cudaMemcpy(&bad[0], dbad, 4, cudaMemcpyDeviceToHost));
    apply_once(&am, dbad);
    CK(cudaMemcpy(&bad[1], dbad, 4, cudaMemcpyDeviceToHost));
    float *h1 = malloc(on * 4), *h2 = malloc(on * 4);
    CK(cudaMemcpy(h1, o_ipc, on * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2, o_own, on * 4, cudaMemcpyDeviceToHost));
    int same = memcmp(h1, h2, on * 4) == 0;
    apply_once(&am, dbad);
    CK(cudaMemcpy(h1, o_own, on * 4, cudaMemcpyDeviceToHost));
    int det = memcmp(h1, h2, on * 4) == 0;
    check("target: apply on own copy is deterministic", det, "two runs %s",
          det ? "identical" : "differ");
    check("target: apply on IPC views == on own copy", same && bad[0] == 0 && bad[1] == 0,
          "bit for bit: %s; bad rows %u / %u", same ? "yes" : "no", bad[0], bad[1]);

    /* bandwidth: lease-get + apply reading the views, vs cudaMemcpy of the same bytes
     * into our memory + apply on that copy */
    mf_release_result(ch, res, MF_TIMEOUT_DEFAULT);
    mf_get_result_free(res);
    size_t bytes = 0;
    for (uint32_t k = 0; k < nb; k++)
        bytes += len[k];
    double t_get = 0, t_apply = 0, t_copy = 0, t_apply_own = 0;
    uint8_t *dst;
    CK(cudaMalloc((void **)&dst, total));
    for (int it = 0; it < o->iters; it++) {
        double t0 = mf_now_s();
        st = mf_get_prefix(ch, MODEL, B, tokens, n, &layer, 1, 0, 0, MF_GET_LEASE, &res,
                           MF_TIMEOUT_DEFAULT);
        t_get += mf_now_s() - t0;
        if (st != MF_OK)
            die("bandwidth get: %s %s", mf_status_name(st), mf_channel_last_error(ch));
        int all_dev = 1;
        for (uint32_t k = 0; k < nb; k++) {
            all_dev &= res->rows[k].on_device;
            ipc[k] = res->rows[k].on_device ? res->rows[k].data : staged + off[k];
        }
        t_apply += apply_once(&ai, dbad);
        /* the copy path: the same bytes moved into our memory first */
        CK(cudaDeviceSynchronize());
        t0 = mf_now_s();
        for (uint32_t k = 0; k < nb; k++)
            CK(cudaMemcpyAsync(dst + off[k], all_dev ? res->rows[k].data : host + off[k],
                               len[k], cudaMemcpyDefault, 0));
        CK(cudaDeviceSynchronize());
        t_copy += mf_now_s() - t0;
        t_apply_own += apply_once(&am, dbad);
        mf_release_result(ch, res, MF_TIMEOUT_DEFAULT);
        mf_get_result_free(res);
    }
    double it = o->iters > 0 ? o->iters : 1;
    printf("bandwidth: %zu row bytes x %d: lease-get %.3f ms + apply on IPC views %.3f ms = "
           "%.2f GB/s; cudaMemcpy of the same bytes %.3f ms (%.2f GB/s) + apply on the copy "
           "%.3f ms = %.2f GB/s; IPC/copy %.2fx\n",
           bytes, o->iters, t_get / it * 1e3, t_apply / it * 1e3,
           bytes / ((t_get + t_apply) / it) / 1e9, t_copy / it * 1e3,
           bytes / (t_copy / it) / 1e9, t_apply_own / it * 1e3,
           bytes / ((t_copy + t_apply_own) / it) / 1e9,
           (t_copy + t_apply_own) / (t_get + t_apply));
    peer_report(o, host, off, len, nb, total, bytes, t_get / it, t_copy / it);
    mf_channel_close(ch);
    for (int i = 0; i < 3; i++)
        cudaFree(td[i]);
    cudaFree(own);
    cudaFree(staged);
    cudaFree(dst);
    cudaFree(o_ipc);
    cudaFree(o_own);
    cudaFree(dbad);
    free(h1);
    free(h2);
    free(ipc);
    free(mine);
    free(chk);
    free(host);
    free(len);
    free(off);
    free(tokens);
    printf("ipc_check target: %s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    opts_t o = {.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20), .n = 4096,
                .iters = 20, .peer_device = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--target"))
            o.target = 1;
        else if (!strcmp(a, "--socket") && v)
            o.socket = argv[++i];
        else if (!strcmp(a, "--device") && v)
            o.device = atoi(argv[++i]);
        else if (!strcmp(a, "--peer-device") && v)
            o.peer_device = atoi(argv[++i]);
        else if (!strcmp(a, "--target-visible") && v)
            o.target_visible = argv[++i];
        else if (!strcmp(a, "--cross"))
            o.cross = 1;
        else if (!strcmp(a, "--seed") && v)
            o.seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "--tokens") && v)
            o.n = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(a, "--iters") && v)
            o.iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: ipc_check --socket PATH [--peer-device N] "
                            "[--target-visible LIST] [--seed S] [--tokens N (multiple of "
                            "%u)] [--iters K]\n", B);
            return 2;
        }
    }
    if (!o.socket || o.n < 4 * B || o.n % B || o.n / B > MF_CUDA_MAX_BLOCKS || o.iters < 0) {
        fprintf(stderr, "ipc_check: --socket is required; --tokens a multiple of %u, "
                        ">= %u\n", B, 4 * B);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    return o.target ? run_target(&o) : run_source(&o, argv);
}
