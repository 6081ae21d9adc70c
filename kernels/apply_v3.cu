/* apply_v3 — the GQA-packed CUDA apply (MF_APPLY_IMPL_V3; spec: mf_apply_ref; the v2
 * kernel in apply.cu computes the same function one head per CTA).
 *
 * One CTA per (query block i, pack), largest i first. A pack is up to HP target heads
 * that share one KV head and one mode (the host groups each KV head's query heads by
 * mode, so a GQA group with mixed modes becomes several packs). The CTA has HP head
 * groups of B / 16 warps; group h runs head pack.t[h] exactly as a v2 CTA would, but the
 * K / V tiles are loaded once into shared memory for all of them: HP× less L2→SM traffic
 * for K and V (v2's cost, bench/gpu/NOTES.md), and HP·B query rows per K / V tile.
 *  - prob: the CTA walks the union of its heads' columns; V goes through a PST-deep
 *    cp.async ring, and each thread stages its own pieces of the first source tiles of
 *    each column in the same ring (it reads back only what it copied, so no extra
 *    barrier); further source heads of a column are read directly. A head with nothing
 *    in a column skips it.
 *  - mask: each head group selects its columns in parallel (named barrier per group),
 *    then the CTA walks the union of the kept sets; each head attends only its own.
 *  - compute (or exact block, or a bad row): attention over every j ≤ i for all heads.
 * Q stays in shared memory and is re-read per column (registers: 512 threads at most,
 * so 128 a thread).
 * Measured (bench/gpu/NOTES.md): not faster than v2. The prob and mask loops are bound by
 * the SM's L1 / shared-memory pipe (ldmatrix of V: each m16 warp reads the whole V tile
 * per column), not by the L2 traffic that packing removes; and a pack walks the union
 * of its heads' columns in lock step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apply_internal.cuh"

using namespace mfc;

namespace {

template <class S, int HP_> struct v3 {
    typedef typename S::T T;
    static constexpr int HP = HP_;
    static constexpr int GT = S::WARPS * 32; /* threads per head group */
    static constexpr int NT = HP * GT;       /* threads per CTA */
    /* K/V ring depth (attention): 2 where 3 would cost occupancy (B = 128; one head a
     * CTA, which fits 2 CTAs an SM with 2) */
    static constexpr int KVST = S::B >= 128 || HP_ == 1 ? 2 : 3;
    static constexpr int PST = S::B >= 128 ? 2 : 3;  /* V + tile ring depth (prob) */
    static constexpr size_t TILEB = (size_t)S::TILE * sizeof(T);
    /* prob staging: 64 bytes per thread per stage (4 units of 16 bytes); a narrow tile
     * piece set is B/2 bytes per thread, a wide one B bytes. */
    static constexpr int UNITS = 4;
    static constexpr int NPF_N = UNITS * 16 / (S::B / 2); /* staged tiles, FP8 / U8_LOG */
    static constexpr int NPF_W = UNITS * 16 / S::B;       /* staged tiles, FP16 / BF16 */
    /* work area: attention = Q tiles | K,V ring; prob = V ring | staging | scales |
     * s_hm | s_coff; mask selection = HP selection areas */
    static constexpr size_t att = HP * TILEB + (size_t)KVST * 2 * TILEB;
    static constexpr size_t pr_v = PST * TILEB;
    static constexpr size_t pr_stage = (size_t)PST * UNITS * NT * 16;
    static constexpr size_t pr_scale = (size_t)PST * NPF_N * NT * 4;
    static constexpr size_t prob =
        pr_v + pr_stage + pr_scale + MF_CUDA_MAX_BLOCKS * (sizeof(uint64_t) + sizeof(uint32_t));
    static constexpr size_t work = cmax(cmax(att, prob), HP * SEL_BYTES);
    /* lists: s_j (u16), s_hb (head bits), s_keep[HP] */
    static constexpr size_t total = work + MF_CUDA_MAX_BLOCKS * (2 + 1 + HP);
    static_assert(total + 2048 <= 232448, "v3 shared memory over the sm_90 limit");
    static_assert(HP <= MF_PACK_MAX && HP <= 8, "pack too large");
};

/* The ring: issue(x, stage) queues column x's copies, body(x, stage) uses them once
 * resident; ST − 1 columns in flight. Every thread of the CTA calls it. */
template <int ST, class ISSUE, class BODY>
__device__ __forceinline__ void ring(int count, ISSUE issue, BODY body)
{
    if (count <= 0)
        return;
#pragma unroll
    for (int x = 0; x < ST - 1; x++) {
        if (x < count)
            issue(x, x);
        cp_commit();
    }
    for (int x = 0; x < count; x++) {
        int xn = x + ST - 1;
        if (xn < count)
            issue(xn, xn % ST);
        cp_commit();
        cp_wait<ST - 1>();
        __syncthreads();
        body(x, x % ST);
        __syncthreads();
    }
}

/* Attention of each head group's rows over the key blocks jf(x), x < count, attended by
 * the heads whose bit is set in bits(x); stores rows < N where store[r]. */
template <class S, int HP, class JF, class BF>
__device__ void attend3(const app_params &p, uint8_t *sm, uint32_t i, const apply_pack &pk,
                        int count, JF jf, BF bits, const bool store[2])
{
    typedef v3<S, HP> P;
    typedef typename S::T T;
    T *qs = reinterpret_cast<T *>(sm), *kv = qs + HP * S::TILE;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hh = warp / S::WARPS,
        w = warp % S::WARPS;
    bool act = hh < (int)pk.n;
    uint32_t t = act ? pk.t[hh] : 0;
    if (act)
        load_tile<S>(qs + hh * S::TILE, static_cast<const T *>(p.q), i * S::B, p.n, p.ht, t,
                     (int)threadIdx.x - hh * P::GT, P::GT);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    const T *qh = qs + hh * S::TILE;
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f }, o[S::D / 8][4];
#pragma unroll
    for (int dt = 0; dt < S::D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    const T *K = static_cast<const T *>(p.k), *V = static_cast<const T *>(p.v);
    ring<P::KVST>(
        count,
        [&](int x, int st) {
            uint32_t j = jf(x);
            load_tile<S>(kv + (2 * st) * S::TILE, K, j * S::B, p.n, p.hkv, pk.kvh,
                         (int)threadIdx.x, P::NT);
            load_tile<S>(kv + (2 * st + 1) * S::TILE, V, j * S::B, p.n, p.hkv, pk.kvh,
                         (int)threadIdx.x, P::NT);
        },
        [&](int x, int st) {
            if (!act || !((bits(x) >> hh) & 1u))
                return;
            uint32_t j = jf(x);
            const T *kt = kv + (2 * st) * S::TILE, *vt = kt + S::TILE;
            /* scores: Q fragments re-read per k-step (registers), same sums as qk() */
            float s[S::B / 8][4];
#pragma unroll
            for (int nt = 0; nt < S::B / 8; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            int qrow = w * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int kk = 0; kk < S::D / 16; kk++) {
                uint32_t qf[4];
                ldsm_x4(qf, qh + qrow * S::LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int nt = 0; nt < S::B / 8; nt += 2) {
                    int key = nt * 8 + (lane & 7) + (lane >> 4) * 8;
                    uint32_t r[4];
                    ldsm_x4(r, kt + key * S::LD + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma<T>(s[nt], qf, r[0], r[1]);
                    mma<T>(s[nt + 1], qf, r[2], r[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int q = w * 16 + (lane >> 2) + (c >> 1) * 8,
                        kq = nt * 8 + (lane & 3) * 2 + (c & 1);
                    s[nt][c] = (j == i && kq > q) ? -INFINITY : s[nt][c] * p.scale_log2;
                }
            float alpha[2];
            softmax_step<S>(s, m, l, alpha);
#pragma unroll
            for (int dt = 0; dt < S::D / 8; dt++) {
                o[dt][0] *= alpha[0];
                o[dt][1] *= alpha[0];
                o[dt][2] *= alpha[1];
                o[dt][3] *= alpha[1];
            }
#pragma unroll
            for (int kk = 0; kk < S::B / 16; kk++) {
                uint32_t pf[4] = { elem<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                                   elem<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                                   elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
                pv_kstep<S, false>(o, pf, vt, kk);
            }
        });
    if (!act)
        return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]), inv = 1.0f / lt;
        uint32_t row = i * S::B + w * 16 + (lane >> 2) + r * 8;
        if (!store[r] || row >= p.n)
            continue;
        float *dst = p.o + ((size_t)row * p.ht + t) * S::D + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < S::D / 8; dt++)
            *reinterpret_cast<float2 *>(dst + dt * 8) =
                make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
}

/* Prob mode over the listed union columns (s_j, s_hm, s_coff); writes O of the rows with
 * kept mass and returns this thread's rows' kept mass (0 for an inactive group). */
template <class S, int HP, int CODEC>
__device__ void prob3(const app_params &p, uint8_t *sm, const row_dev &row, uint32_t i,
                      const apply_pack &pk, int count, const uint16_t *s_j,
                      const unsigned long long *s_hm, const uint32_t *s_coff,
                      const float (*s_w)[MF_ROW_MAX_HEADS], unsigned long long wm,
                      float kmass[2])
{
    typedef v3<S, HP> P;
    typedef typename S::T T;
    typedef tile_piece<CODEC> TP;
    typedef typename TP::raw_t raw_t;
    constexpr bool WIDE = TP::WIDE;
    constexpr int PT = (S::B / 32) * 2; /* pieces per tile per thread */
    constexpr int NPF = WIDE ? P::NPF_W : P::NPF_N;
    constexpr bool SCALES = CODEC == MF_CODEC_FP8_E4M3 || CODEC == MF_CODEC_U8_LOG;
    T *vst = reinterpret_cast<T *>(sm);
    uint4 *stg = reinterpret_cast<uint4 *>(sm + P::pr_v);
    float *ssc = reinterpret_cast<float *>(sm + P::pr_v + P::pr_stage);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, hh = warp / S::WARPS,
        w = warp % S::WARPS, u = lane & 3, row0 = w * 16 + (lane >> 2);
    bool act = hh < (int)pk.n;
    uint32_t t = act ? pk.t[hh] : 0;
    float o[S::D / 8][4];
#pragma unroll
    for (int dt = 0; dt < S::D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    kmass[0] = kmass[1] = 0.0f;
    const T *V = static_cast<const T *>(p.v);
    /* piece q (= 2·kp + h) of staged tile z: 16-byte unit, and the byte within it */
    auto unit = [&](int st, int z, int q) -> uint8_t * {
        int k = WIDE ? z * PT + q : (z * PT + q) >> 1;
        int half = WIDE ? 0 : (z * PT + q) & 1;
        return reinterpret_cast<uint8_t *>(stg + ((size_t)st * P::UNITS + k) * P::NT + tid) +
               8 * half;
    };
    auto piece_src = [&](uint32_t e, int q) -> const uint8_t * {
        int kp = q >> 1, h = q & 1;
        size_t at = (size_t)(row0 + 8 * h) * S::B + kp * 32 + 8 * u;
        return row.tiles + (size_t)e * row.tile_bytes + (WIDE ? 2 : 1) * at;
    };
    ring<P::PST>(
        count,
        [&](int x, int st) {
            load_tile<S>(vst + st * S::TILE, V, (uint32_t)s_j[x] * S::B, p.n, p.hkv, pk.kvh,
                         tid, P::NT);
            if (NPF == 0 || !act)
                return;
            unsigned long long hm = s_hm[x], rel = hm & wm;
            for (int z = 0; z < NPF && rel; z++, rel &= rel - 1) {
                uint32_t s = __ffsll((long long)rel) - 1, e = entry_of(s_coff[x], hm, s);
#pragma unroll
                for (int q = 0; q < PT; q++) {
                    if (WIDE)
                        cp16(unit(st, z, q), piece_src(e, q), 16);
                    else
                        cp8(unit(st, z, q), piece_src(e, q));
                }
                if (SCALES)
                    cp4(ssc + ((size_t)st * P::NPF_N + z) * P::NT + tid, row.scales + e);
            }
        },
        [&](int x, int st) {
            if (!act)
                return;
            unsigned long long hm = s_hm[x], rel0 = hm & wm;
            if (!rel0)
                return;
            uint32_t j = s_j[x];
            const T *vt = vst + st * S::TILE;
#pragma unroll
            for (int kp = 0; kp < S::B / 32; kp++) {
                float mx[2][8];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int y = 0; y < 8; y++)
                        mx[r][y] = 0.0f;
                int z = 0;
                for (unsigned long long rel = rel0; rel; rel &= rel - 1, z++) {
                    uint32_t s = __ffsll((long long)rel) - 1;
                    float wt = s_w[hh][s], sc = 1.0f;
                    raw_t r0, r1;
                    if (z < NPF) {
                        r0 = *reinterpret_cast<const raw_t *>(unit(st, z, 2 * kp));
                        r1 = *reinterpret_cast<const raw_t *>(unit(st, z, 2 * kp + 1));
                        if (SCALES)
                            sc = ssc[((size_t)st * P::NPF_N + z) * P::NT + tid];
                    } else {
                        uint32_t e = entry_of(s_coff[x], hm, s);
                        r0 = __ldg(reinterpret_cast<const raw_t *>(piece_src(e, 2 * kp)));
                        r1 = __ldg(reinterpret_cast<const raw_t *>(piece_src(e, 2 * kp + 1)));
                        if (SCALES)
                            sc = __ldg(row.scales + e);
                    }
                    TP::mix(mx[0], r0, wt, sc);
                    TP::mix(mx[1], r1, wt, sc);
                }
                uint32_t pf[2][4];
#pragma unroll
                for (int r = 0; r < 2; r++) {
#pragma unroll
                    for (int y = 0; y < 8; y++) {
                        int key = kp * 32 + 8 * u + y;
                        if (j == i && key > row0 + 8 * r) /* causality, whatever the tile holds */
                            mx[r][y] = 0.0f;
                        kmass[r] += mx[r][y];
                    }
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {
                        pf[h2][r] = elem<T>::pack(mx[r][4 * h2], mx[r][4 * h2 + 1]);
                        pf[h2][2 + r] = elem<T>::pack(mx[r][4 * h2 + 2], mx[r][4 * h2 + 3]);
                    }
                }
                pv_kstep<S, true>(o, pf[0], vt, 2 * kp);
                pv_kstep<S, true>(o, pf[1], vt, 2 * kp + 1);
            }
        });
    if (!act)
        return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        kmass[r] = quad_sum(kmass[r]);
        uint32_t rr = i * S::B + row0 + 8 * r;
        if (!(kmass[r] > 0.0f) || rr >= p.n)
            continue;
        float inv = 1.0f / kmass[r];
        float *dst = p.o + ((size_t)rr * p.ht + t) * S::D + (lane & 3) * 2;
#pragma unroll
        for (int dt = 0; dt < S::D / 8; dt++)
            *reinterpret_cast<float2 *>(dst + dt * 8) =
                make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
}

template <class S, int HP>
__global__ void __launch_bounds__(v3<S, HP>::NT, 1) apply_v3_kernel(app_params p)
{
    typedef v3<S, HP> P;
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float s_w[HP][MF_ROW_MAX_HEADS];
    __shared__ unsigned long long s_wm[HP];
    __shared__ int s_cnt, s_n[HP], s_kept[HP];
    __shared__ double s_acc0[HP], s_target[HP];
    uint16_t *s_j = reinterpret_cast<uint16_t *>(sm + P::work);
    uint8_t *s_hb = reinterpret_cast<uint8_t *>(s_j + MF_CUDA_MAX_BLOCKS);
    uint8_t *s_keep = s_hb + MF_CUDA_MAX_BLOCKS; /* [HP][MF_CUDA_MAX_BLOCKS] */
    const apply_pack pk = p.packs[blockIdx.x % p.n_packs];
    uint32_t i = p.nb_all - 1 - blockIdx.x / p.n_packs;
    int np = pk.n, warp = threadIdx.x >> 5, hh = warp / S::WARPS;
    int tg = (int)threadIdx.x - hh * P::GT;
    bool act = hh < np;
    uint32_t mode = p.exact[i] ? MF_HEAD_COMPUTE : pk.mode;
    uint8_t all_bits = (uint8_t)((1u << np) - 1);
    row_dev row;
    bool all[2] = { true, true };
    if (mode != MF_HEAD_COMPUTE) {
        row = row_open(p.rows[i]);
        bool ok = row.block_index == i && row.block_size == S::B && row.n_heads == p.hs &&
                  row.n_cols >= 1 && row.n_cols <= i + 1 &&
                  !(mode == MF_HEAD_PROB && row.codec == MF_CODEC_MASK);
        if (!ok) {
            if (threadIdx.x == 0 && p.bad)
                atomicAdd(p.bad, (uint32_t)np); /* once per head, as v2 counts */
            mode = MF_HEAD_COMPUTE;
        }
    }
    if (mode == MF_HEAD_COMPUTE) {
        attend3<S, HP>(p, sm, i, pk, (int)i + 1, [](int x) { return (uint32_t)x; },
                       [&](int) { return all_bits; }, all);
        return;
    }
    for (int x = threadIdx.x; x < HP * MF_ROW_MAX_HEADS; x += P::NT) {
        int q = x / MF_ROW_MAX_HEADS;
        uint32_t s = x % MF_ROW_MAX_HEADS;
        s_w[q][s] = q < np && s < p.hs ? p.w[(size_t)pk.t[q] * p.hs + s] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < HP) {
        unsigned long long m = 0;
        for (uint32_t s = 0; s < p.hs; s++)
            if (s_w[threadIdx.x][s] > 0.0f)
                m |= 1ull << s;
        s_wm[threadIdx.x] = m;
    }
    __syncthreads();
    unsigned long long wm = act ? s_wm[hh] : 0ull, wu = 0;
#pragma unroll
    for (int q = 0; q < HP; q++)
        wu |= s_wm[q];
    if (mode == MF_HEAD_PROB) {
        unsigned long long *s_hm =
            reinterpret_cast<unsigned long long *>(sm + P::pr_v + P::pr_stage + P::pr_scale);
        uint32_t *s_coff = reinterpret_cast<uint32_t *>(s_hm + MF_CUDA_MAX_BLOCKS);
        list_columns(
            row, nullptr, s_j, &s_cnt, [&](uint32_t c) { return (row.head_mask[c] & wu) != 0; },
            s_hm, s_coff);
        float km[2];
        int cnt = s_cnt;
        switch (row.codec) {
        case MF_CODEC_FP16:
            prob3<S, HP, MF_CODEC_FP16>(p, sm, row, i, pk, cnt, s_j, s_hm, s_coff, s_w, wm, km);
            break;
        case MF_CODEC_BF16:
            prob3<S, HP, MF_CODEC_BF16>(p, sm, row, i, pk, cnt, s_j, s_hm, s_coff, s_w, wm, km);
            break;
        case MF_CODEC_FP8_E4M3:
            prob3<S, HP, MF_CODEC_FP8_E4M3>(p, sm, row, i, pk, cnt, s_j, s_hm, s_coff, s_w, wm,
                                            km);
            break;
        default:
            prob3<S, HP, MF_CODEC_U8_LOG>(p, sm, row, i, pk, cnt, s_j, s_hm, s_coff, s_w, wm,
                                          km);
            break;
        }
        bool need[2] = { act && !(km[0] > 0.0f), act && !(km[1] > 0.0f) };
        if (__syncthreads_or(need[0] || need[1])) /* everything quantised away: exact */
            attend3<S, HP>(p, sm, i, pk, (int)i + 1, [](int x) { return (uint32_t)x; },
                           [&](int) { return all_bits; }, need);
        return;
    }
    /* mask: each head group selects its kept columns (v2's rule and arithmetic) */
    if (act) {
        double *mall = reinterpret_cast<double *>(sm + (size_t)hh * SEL_BYTES);
        double *cm = mall + MF_CUDA_MAX_BLOCKS;
        uint32_t *cj = reinterpret_cast<uint32_t *>(cm + MF_CUDA_MAX_BLOCKS);
        uint8_t *keep = s_keep + hh * MF_CUDA_MAX_BLOCKS;
        int bar = 1 + hh;
        for (uint32_t c = tg; c < row.n_cols; c += P::GT) {
            unsigned long long hm = row.head_mask[c], rel = hm & wm;
            double mm = 0.0;
            for (; rel; rel &= rel - 1) {
                uint32_t s = __ffsll((long long)rel) - 1;
                mm += (double)s_w[hh][s] *
                      (double)mass_decode(row.mass[entry_of(row.col_off[c], hm, s)]);
            }
            mall[c] = mm;
            keep[c] = (hm & wm) ? 1 : 0; /* candidate */
        }
        group_sync(bar, P::GT);
        double tp = p.top_p ? (double)p.top_p[pk.t[hh]] : 1.0;
        if (tg == 0) {
            double total = 0.0, acc0 = 0.0;
            int n = 0;
            for (uint32_t c = 0; c < row.n_cols; c++) {
                uint32_t j = row.cols[c];
                if (!keep[c])
                    continue;
                total += mall[c];
                if (j == 0 || j == i)
                    continue;
                cm[n] = mall[c];
                cj[n++] = c; /* column index; ties go to the lower c, i.e. the lower j */
            }
            if (row.cols[0] == 0 && keep[0])
                acc0 += mall[0];
            if (i > 0 && row.cols[row.n_cols - 1] == i && keep[row.n_cols - 1])
                acc0 += mall[row.n_cols - 1];
            s_n[hh] = n;
            s_acc0[hh] = acc0;
            s_target[hh] = tp * total;
        }
        group_sync(bar, P::GT);
        int n = s_n[hh];
        if (tp < 1.0 && i + 1 > 2) {
            for (uint32_t c = tg; c < row.n_cols; c += P::GT) {
                uint32_t j = row.cols[c];
                if (j != 0 && j != i)
                    keep[c] = 0;
            }
            int kept = topp_sorted(cm, cj, n, s_acc0[hh], s_target[hh], &s_kept[hh], tg, P::GT,
                                   bar);
            for (int x = tg; x < kept; x += P::GT)
                keep[cj[x]] = 1;
        }
    }
    __syncthreads();
    /* union of the kept sets; blocks 0 and i are attended by every head */
    if (threadIdx.x < 32) {
        int lane = threadIdx.x, cnt = 0;
        for (uint32_t base = 0; base < row.n_cols; base += 32) {
            uint32_t c = base + lane, j = 0;
            uint32_t b = 0;
            if (c < row.n_cols) {
                j = row.cols[c];
                for (int q = 0; q < np; q++)
                    b |= (uint32_t)s_keep[q * MF_CUDA_MAX_BLOCKS + c] << q;
                if (j == 0 || j == i)
                    b = all_bits;
            }
            uint32_t bal = __ballot_sync(0xffffffffu, b != 0);
            if (b) {
                int at = cnt + __popc(bal & ((1u << lane) - 1));
                s_j[at] = (uint16_t)j;
                s_hb[at] = (uint8_t)b;
            }
            cnt += __popc(bal);
        }
        __syncwarp(); /* the lanes' list entries before lane 0 moves them */
        if (lane == 0) {
            if (row.cols[0] != 0) { /* not in the row: prepend (the list stays ascending) */
                for (int x = cnt; x > 0; x--) {
                    s_j[x] = s_j[x - 1];
                    s_hb[x] = s_hb[x - 1];
                }
                s_j[0] = 0;
                s_hb[0] = all_bits;
                cnt++;
            }
            if (i > 0 && row.cols[row.n_cols - 1] != i) {
                s_j[cnt] = (uint16_t)i;
                s_hb[cnt++] = all_bits;
            }
            s_cnt = cnt;
        }
    }
    __syncthreads();
    attend3<S, HP>(p, sm, i, pk, s_cnt, [&](int x) { return (uint32_t)s_j[x]; },
                   [&](int x) { return s_hb[x]; }, all);
}

template <class S, int HP> mf_status_t launch3(const app_params &p, cudaStream_t st)
{
    typedef v3<S, HP> P;
    size_t sm = P::total;
    cudaError_t e = cudaFuncSetAttribute(apply_v3_kernel<S, HP>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (e != cudaSuccess)
        return MF_INTERNAL;
    apply_v3_kernel<S, HP><<<p.nb_all * p.n_packs, P::NT, sm, st>>>(p);
    return MF_OK;
}

template <typename T> mf_status_t launch3_t(const app_params &p, uint32_t b, uint32_t d,
                                            cudaStream_t st)
{
    switch (b * 1000 + d) {
    case 32064: return launch3<shape<32, 64, T>, 4>(p, st);
    case 32128: return launch3<shape<32, 128, T>, 4>(p, st);
    case 64064: return launch3<shape<64, 64, T>, 4>(p, st);
    case 64128:
        switch (apply_v3_heads_per_cta(b, d)) {
        case 1: return launch3<shape<64, 128, T>, 1>(p, st);
        case 2: return launch3<shape<64, 128, T>, 2>(p, st);
        default: return launch3<shape<64, 128, T>, 4>(p, st);
        }
    case 128064: return launch3<shape<128, 64, T>, 2>(p, st);
    case 128128: return launch3<shape<128, 128, T>, 2>(p, st);
    default: return MF_UNIMPLEMENTED;
    }
}

} /* namespace */

/* Must match launch3_t's HP per shape: B = 128 → 2; B = 64, d = 128 → MF_V3_HP=1|2|4
 * (a measurement switch, read per call) or MF_V3_HP_DEFAULT: 1 (128 threads, 2 CTAs an
 * SM: v2's shape with v3's deeper ring), 2 (256 threads) or 4 (512 threads, 128
 * registers a thread, spills); else 4. */
#define MF_V3_HP_DEFAULT 1 /* run 2: the fastest pack size at B64 d128 (bench/gpu/NOTES.md) */
uint32_t mfc::apply_v3_heads_per_cta(uint32_t b, uint32_t d)
{
    if (b >= 128)
        return 2;
    if (b != 64 || d != 128)
        return 4;
    const char *e = getenv("MF_V3_HP");
    if (e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4")))
        return (uint32_t)atoi(e);
    return MF_V3_HP_DEFAULT;
}

mf_status_t mfc::apply_v3_launch(const app_params &p, uint32_t b, uint32_t d, mf_dtype_t dtype,
                                 cudaStream_t st)
{
    return dtype == MF_DTYPE_F16 ? launch3_t<__half>(p, b, d, st)
                                 : launch3_t<__nv_bfloat16>(p, b, d, st);
}
