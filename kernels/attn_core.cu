/* attn_core — the sm_90a attention core (attn_core.cuh says what it computes).
 *
 * CTA = 3 warpgroups (384 threads): warpgroup 0 is the producer (one thread issues every
 * TMA copy; setmaxnreg 24), warpgroups 1 and 2 the consumers (setmaxnreg 240), each owning
 * 64 query rows of the 128-row tile. Shared memory: Q [128][D] and a STAGES-deep ring of
 * K and V tiles [BN][D], all as 64-column halves in the 128-byte swizzle that TMA writes
 * and wgmma reads (rows of 128 bytes, 1024-byte atoms). Barriers: q_full; per stage
 * k_full / v_full (TMA transaction counts; V separate so QKᵀ starts before V lands) and
 * k_empty / v_empty (one arrival per consumer warp once its wgmma reading that K or V tile
 * has completed: K is free right after S, long before V, so the next K load can start early).
 * A consumer warpgroup per key tile x: S = Q·Kᵀ (wgmma, A and B from shared memory) is
 * issued together with O += P·V of tile x − 1 (wgmma with P from registers as the A
 * operand, V transposed from shared memory), so the softmax of x (causal mask on tiles
 * that cross its diagonal, online softmax in registers, scores in log2 units with the
 * 1/sqrt(d)·log2(e) scale folded into one FFMA before ex2) runs while that P·V does; then
 * O *= alpha. The two consumer warpgroups take turns issuing (ping-pong, named barriers),
 * so one's softmax also overlaps the other's GEMMs.
 * Block-64 lists run with BN = 128 (GATHER, at the kernel): two list entries a key tile;
 * by default on persist_kernel (MF_CORE_PERSIST=0: core_kernel) (the same tile code, consume_tile /
 * produce_tiles, in a loop over tiles with double-buffered Q and lists; attn_persist.cuh says how).
 * O (fp32) goes straight from the accumulators to global memory: each quad writes 32
 * contiguous bytes of a row, whole sectors; or, for mf_export_cuda's and mf_apply_cuda's
 * o_dtype, O in T (16 bytes a quad), so the model gets its layer's output without an fp32
 * round trip (store_o, the one epilogue of both kernels; store_o_row is v2's store too).
 * PVW (MF_CORE_PVWAIT=1, MASS = 0, 128-key tiles): the next K tile's wait between the softmax
 * and the P·V wait, so that the softmax overlaps this warpgroup's own P·V (the MASS ≥ 4 v4
 * placement; consume_tile says why and why it cannot deadlock).
 * Masses (MASS = 2…6, the bookkeeping variant; 0: none; dense, 128-key tiles): the softmax
 * keeps the row sum of each 64-key half apart and stores ℓ = base + log2(sum) per (row,
 * half) into the CTA's ℓ slot (v3 on: in the next tile's S wait); after the loop each
 * warpgroup (= one 64-row query block) turns ℓ − LSE into its mass row.
 * Rationale and measurements: bench/gpu/NOTES.md (issue 20). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "apply_internal.cuh"
#include "attn_core.cuh"
#include "attn_ptx.cuh"
#include "mf_cuda_common.cuh"

namespace mfc {
namespace {

/* the PTX wrappers (wgmma, descriptors, mbarrier, TMA): attn_ptx.cuh */

/* The mass bookkeeping's ℓ of one (row, 64-key half) of a 128-key tile, for lane u of a quad:
 * msub[r][h] is this lane's part of row r's sum over half h (relative to base[r], the row's
 * running max, the same in all four lanes). A 4-way reduce-scatter over the quad: lane u
 * ends with row u / 2, half u % 2 — 3 shuffles and 1 lg2 a thread, where a quad sum per
 * (row, half) took 8 and 2. The additions are the quad sum's, (s0 + s1) + (s2 + s3) in every
 * lane, so ℓ is bitwise the same. A half above the row gives −inf, unread. FTZ (v3 on):
 * lg2.approx.ftz, without __log2f's denormal scaling (3 instructions): a sum of
 * ex2.approx.ftz outputs is 0 or ≥ 2^-126, never denormal, so the result is bitwise the same. */
template <bool FTZ>
__device__ __forceinline__ float mass_ell(const float (&msub)[2][2], const float (&base)[2], int u)
{
    int odd = u & 1, hi = u >> 1;
    float k0 = odd ? msub[0][1] : msub[0][0], k1 = odd ? msub[1][1] : msub[1][0];
    k0 += __shfl_xor_sync(0xffffffffu, odd ? msub[0][0] : msub[0][1], 1);
    k1 += __shfl_xor_sync(0xffffffffu, odd ? msub[1][0] : msub[1][1], 1);
    float tot = (hi ? k1 : k0) + __shfl_xor_sync(0xffffffffu, hi ? k0 : k1, 2), lg;
    if (FTZ)
        asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(lg) : "f"(tot));
    else
        lg = __log2f(tot);
    return (hi ? base[1] : base[0]) + lg;
}

struct core_params {
    void *o;       /* [N, Hq, D]: float, or T when o_t (the epilogue's store) */
    float *lse;
    const uint32_t *keep;
    uint32_t n, hq, hkv, n_tiles, nb, words, pair;
    uint32_t pingpong; /* 1: the consumer warpgroups take turns (MF_CORE_PINGPONG=0: off) */
    uint32_t o_t;      /* 1: O stored in the inputs' type T (bf16 / f16), else float */
    float scale_log2;
    /* masses (core_kernel<…, MASS ≥ 2>, dense only): block-local log2-sum-exp ℓ of each
     * (row, 64-key block) in a per-CTA slot of lscr ([j][128 rows] fp32, nslots slots, a
     * slot taken by CAS on slot_busy), reduced into mass [Hq][nbm][nbm] at the end. */
    float *lscr, *mass;
    uint32_t *slot_busy;
    uint32_t nslots, slot_floats, nbm;
    uint32_t *tile_ctr; /* persist_kernel: the next tile index to take (zeroed per launch) */
};

#define MAX_TILES 2048
#define MASS_MIN_SMEM (116u * 1024u) /* > half of an SM's 228 KiB */

template <int D, int BN> struct cfg {
    static constexpr int STAGES = BN == 128 ? 2 : 4;
    static constexpr int HALVES = D / 64;
    static constexpr uint32_t Q_HALF = 128 * 128, KV_HALF = BN * 128;   /* bytes */
    static constexpr uint32_t Q_BYTES = HALVES * Q_HALF, KV_BYTES = HALVES * KV_HALF;
    static constexpr uint32_t OFF_K = Q_BYTES, OFF_V = OFF_K + STAGES * KV_BYTES;
    static constexpr uint32_t OFF_BAR = OFF_V + STAGES * KV_BYTES;
    static constexpr uint32_t OFF_LIST = OFF_BAR + 8 * (1 + 4 * STAGES);
    static constexpr uint32_t OFF_LSE2 = OFF_LIST + MAX_TILES * 3 + 16;  /* [128] fp32 */
    static constexpr uint32_t SMEM = OFF_LSE2 + 512 + 1024; /* + alignment slack */
};

/* The tile's key-tile list: s_j[x] and s_f[x] (bit c: consumer warpgroup c multiplies it).
 * Warp 0 builds it; the caller syncs. */
template <int BN>
__device__ __forceinline__ int build_list(const core_params &p, uint32_t m, uint32_t t,
                                          uint16_t *s_j, uint8_t *s_f)
{
    int lane = threadIdx.x & 31, cnt = 0;
    if (!p.keep) { /* dense causal: tile j for warpgroup c iff its first key ≤ c's last row */
        uint32_t last = min(128 * m + 127, p.n - 1), nt = last / BN + 1;
        for (uint32_t x = lane; x < nt; x += 32) {
            uint8_t f = 0;
            for (int c = 0; c < 2; c++) {
                uint32_t r0 = 128 * m + 64 * c;
                if (r0 < p.n && x * BN <= min(r0 + 63, p.n - 1))
                    f |= (uint8_t)(1 << c);
            }
            s_j[x] = (uint16_t)x;
            s_f[x] = f;
        }
        return (int)nt;
    }
    uint32_t ia = p.pair ? 2 * m : m, ib = p.pair ? 2 * m + 1 : m;
    const uint32_t *ka = p.keep + ((size_t)t * p.nb + ia) * p.words;
    const uint32_t *kb = ib < p.nb ? p.keep + ((size_t)t * p.nb + ib) * p.words : nullptr;
    uint32_t nw = (min(ib, p.nb - 1)) / 32 + 1;
    for (uint32_t w0 = 0; w0 < nw; w0 += 32) {
        uint32_t w = w0 + lane, a = w < nw ? ka[w] : 0u, b = (w < nw && kb) ? kb[w] : 0u;
        uint32_t u = a | b, c = __popc(u), incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += y;
        }
        int at = cnt + (int)(incl - c);
        for (; u; u &= u - 1) {
            int bit = __ffs(u) - 1;
            s_j[at] = (uint16_t)(32 * w + bit);
            s_f[at++] = (uint8_t)(((a >> bit) & 1u) | (((b >> bit) & 1u) << 1));
        }
        cnt += (int)__shfl_sync(0xffffffffu, incl, 31);
    }
    return cnt;
}

/* The CTA's K / V ring: STAGES tiles of K and of V (KV_BYTES each) and their barriers. */
struct kv_ring {
    uint8_t *k, *v;
    uint64_t *k_full, *v_full, *k_empty, *v_empty;
};

/* The producer thread's K / V loads for one 128-row tile: ntiles key tiles of the list s_j
 * into the ring, key tile x at ring position kt0 + x (consume_tile's numbering). A key tile
 * is its EPT list entries' rows, LB rows each (box rows LB), stacked; both column halves;
 * one mbarrier counts all of it (KV_BYTES). */
template <int D, int BN, bool GATHER>
__device__ __forceinline__ void produce_tiles(const kv_ring &r, const CUtensorMap *tk,
                                              const CUtensorMap *tv, const uint16_t *s_j,
                                              int ntiles, uint32_t kt0, uint32_t kvh)
{
    typedef cfg<D, BN> C;
    constexpr int EPT = GATHER ? 2 : 1, LB = GATHER ? 64 : BN;
    auto load_tile = [&](uint8_t *dst, const CUtensorMap *tm, uint64_t *bar, int x) {
        for (int e = 0; e < EPT; e++) {
            int row = (int)s_j[EPT * x + e] * LB;
            for (int h = 0; h < C::HALVES; h++)
                tma_load(dst + h * C::KV_HALF + e * LB * 128, tm, bar, 64 * h, (int)kvh, row);
        }
    };
    for (int x = 0; x < ntiles; x++) {
        uint32_t gx = kt0 + (uint32_t)x;
        int s = (int)(gx % C::STAGES);
        uint32_t free_ph = ((gx / C::STAGES) & 1) ^ 1;
        if (gx >= C::STAGES)
            bar_wait(&r.k_empty[s], free_ph);
        bar_expect(&r.k_full[s], C::KV_BYTES);
        load_tile(r.k + s * C::KV_BYTES, tk, &r.k_full[s], x);
        if (gx >= C::STAGES)
            bar_wait(&r.v_empty[s], free_ph);
        bar_expect(&r.v_full[s], C::KV_BYTES);
        load_tile(r.v + s * C::KV_BYTES, tv, &r.v_full[s], x);
    }
}

/* Consumer warpgroup c's part of one 128-row tile (m): waits for its Q (q_full, parity q_ph;
 * qa = its 64 rows), resets o / mrow / l and walks the tile's ntiles key tiles of the list
 * s_j / s_f in ping-pong with the other warpgroup (the file's head says how). Returns O
 * unnormalised in o with each row's max and sum, used = whether its block kept an entry;
 * every K / V stage it waited for is released, and Q and the list are no longer read.
 * kt0: key tiles the ring carried before this tile (its stage and phase run on across the
 * persistent kernel's tiles; 0 in core_kernel). lslot: MASS only. give_first: warpgroup 1
 * gives the tile's first turn (false: it already did, at the end of the tile before).
 * PVW (MF_CORE_PVWAIT=1, MASS = 0): the v4 wait placement below for the dense / lists /
 * gathered / persistent kernels, the same math in the same order (bit for bit). */
template <typename T, int D, int BN, int MASS, bool GATHER, bool PVW>
__device__ __forceinline__ void consume_tile(const core_params &p, const kv_ring &r,
                                             uint64_t *q_full, uint32_t q_ph, uint32_t qa,
                                             const uint16_t *s_j, const uint8_t *s_f, int ntiles,
                                             uint32_t kt0, uint32_t m, int c, int tid,
                                             const uint32_t (&row)[2], float *lslot,
                                             bool give_first, float (&o)[D / 2],
                                             float (&mrow)[2], float (&l)[2], bool &used)
{
    typedef cfg<D, BN> C;
    int lane = tid & 31, u = lane & 3;
    uint32_t r0 = 128 * m + 64 * c; /* this warpgroup's first query row */
    mrow[0] = mrow[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int x = 0; x < D / 2; x++)
        o[x] = 0.0f;
    const float sl2 = p.scale_log2;
    used = false;
    /* stage and phase of the previous key tile, whose P·V is still to issue */
    int ps = (int)(kt0 % C::STAGES);
    uint32_t pph = (kt0 / C::STAGES) & 1;
    float sc[BN / 2];
    uint32_t pa[BN / 16][4];
    /* Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named
     * barriers 1 + c), so one's softmax runs while the other's wgmmas use the tensor
     * cores. Both take a turn at every key tile (a tile only the other's block kept
     * is computed and masked whole) and once more for the last P·V, so the turns stay
     * matched; warpgroup 1 gives the first turn and skips the very last hand-over. */
    auto turn_wait = [&]() {
        if (p.pingpong)
            asm volatile("bar.sync %0, 256;\n" ::"r"(1 + c) : "memory");
    };
    auto turn_give = [&]() {
        if (p.pingpong)
            asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - c) : "memory");
    };
    /* v5 on: descriptors as these bases + desc_add, not re-encoded for every wgmma */
    const uint64_t dq0 = sdesc(qa, 16, 1024), dk0 = sdesc(smem_addr(r.k), 16, 1024),
                   dv0 = sdesc(smem_addr(r.v), C::KV_HALF, 1024);
    /* O += P·V of the previous tile (issue only) */
    auto issue_pv = [&]() {
        bar_wait(&r.v_full[ps], pph);
        uint32_t va = smem_addr(r.v + ps * C::KV_BYTES);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs<T, D>(o, pa[kk],
                           MASS >= 5 ? desc_add(dv0, ps * C::KV_BYTES + kk * 2048)
                                     : sdesc(va + kk * 2048, C::KV_HALF, 1024),
                           1);
        wgmma_commit();
    };
    auto release = [&](uint64_t *bar) {
        __syncwarp();
        if (lane == 0)
            bar_arrive(bar);
    };
    auto issue_s = [&](int st) { /* S = Q·Kᵀ (issue only) */
        uint32_t ka = smem_addr(r.k + st * C::KV_BYTES);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qo = (kk / 4) * C::Q_HALF + (kk % 4) * 32,
                     ko = (kk / 4) * C::KV_HALF + (kk % 4) * 32;
            if (MASS >= 5)
                wgmma_ss<T, BN>(sc, desc_add(dq0, qo), desc_add(dk0, st * C::KV_BYTES + ko),
                                kk > 0);
            else
                wgmma_ss<T, BN>(sc, sdesc(qa + qo, 16, 1024), sdesc(ka + ko, 16, 1024), kk > 0);
        }
        wgmma_commit();
    };
    /* Online softmax of S (tile x) in place; a tile this warpgroup's block did not keep
     * is masked whole (P = 0, alpha = 1): every wgmma stays on the non-divergent path. */
    /* MASS: the tile's half sums and bases (mass_ell's input); v3 on: kept from the softmax
     * of tile x to mass_flush in iteration x + 1 */
    float msub[2][2], mbase[2];
    /* v3 on: this lane's ℓ address for the next flush: (row u / 2, half u % 2) of key tile 0,
     * + 256 floats a tile (dense lists: s_j[x] = x, so tile x's halves are ℓ columns 2x, 2x+1) */
    float *lp = MASS >= 3 ? lslot + (u & 1) * 128 + ((u >> 1 ? row[1] : row[0]) - 128 * m)
                          : nullptr;
    auto mass_flush = [&]() {
        if (MASS >= 3) {
            __stcg(lp, mass_ell<true>(msub, mbase, u));
            lp += 256;
        }
    };
    auto softmax = [&](int x, float alpha[2]) {
        static_assert(!MASS || BN == 128, "masses: two 64-key halves a tile");
        /* per 64-key half h of the tile: its first key jb and whether this warpgroup's
         * block kept it (GATHER: list entry 2x + h; else both halves are entry x) */
        uint32_t jb[BN / 64];
        bool mh[BN / 64], need = false;
#pragma unroll
        for (int h = 0; h < BN / 64; h++) {
            int e = GATHER ? 2 * x + h : x;
            jb[h] = GATHER ? (uint32_t)s_j[e] * 64 : (uint32_t)s_j[x] * BN + 64 * h;
            mh[h] = s_f[e] & (1 << c);
            used |= mh[h];
            need |= !mh[h] || jb[h] + 63 > r0; /* not kept, or crosses the diagonal */
        }
        uint32_t j0 = jb[0];
        if (need) {
#pragma unroll
            for (int jj = 0; jj < BN / 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    uint32_t key = jb[jj / 8] + 8 * (jj % 8) + 2 * u + (e & 1);
                    if (!mh[jj / 8] || key > row[e >> 1])
                        sc[4 * jj + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < BN / 8; jj++)
                mx = fmaxf(mx, fmaxf(sc[4 * jj + 2 * r], sc[4 * jj + 2 * r + 1]));
            mx = quad_max(mx);
            float mn = fmaxf(mrow[r], mx * sl2);
            float base = mn == -INFINITY ? 0.0f : mn, sum = 0.0f, sub[BN / 64];
#pragma unroll
            for (int b = 0; b < BN / 64; b++) {
                sub[b] = 0.0f;
#pragma unroll
                for (int jj = 8 * b; jj < 8 * b + 8; jj++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float pv = ex2(fmaf(sc[4 * jj + 2 * r + e], sl2, -base));
                        sc[4 * jj + 2 * r + e] = pv;
                        sub[b] += pv;
                    }
                sum += sub[b];
            }
            if (MASS >= 3) /* the same value as 0 + sub[0] + sub[1] (sums ≥ 0), one FADD less */
                sum = sub[0] + sub[BN / 64 - 1];
            if (MASS) {
                msub[r][0] = sub[0];
                msub[r][1] = sub[BN / 64 - 1];
                mbase[r] = base;
            }
            alpha[r] = ex2(mrow[r] - base);
            l[r] = l[r] * alpha[r] + sum;
            mrow[r] = mn;
        }
        if (MASS == 2) /* v2: ℓ of each (row, 64-key half) stored right here, in the softmax
                        * (log2 units, relative to the running max: exp2(ℓ − LSE2) is then
                        * the block's share of the row) */
            __stcg(lslot + (size_t)(j0 / 64 + (u & 1)) * 128 +
                       ((u >> 1 ? row[1] : row[0]) - 128 * m),
                   mass_ell<false>(msub, mbase, u));
    };
    auto rescale_pack = [&](const float alpha[2]) {
#pragma unroll
        for (int x2 = 0; x2 < D / 8; x2++) {
            o[4 * x2 + 0] *= alpha[0];
            o[4 * x2 + 1] *= alpha[0];
            o[4 * x2 + 2] *= alpha[1];
            o[4 * x2 + 3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[kk][0] = elem<T>::pack(sc[8 * kk + 0], sc[8 * kk + 1]);
            pa[kk][1] = elem<T>::pack(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = elem<T>::pack(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = elem<T>::pack(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
    };
    if (c == 1 && give_first)
        turn_give();
    bar_wait(q_full, q_ph);
    float alpha[2];
    bar_wait(&r.k_full[ps], pph); /* tile 0: no P·V before it */
    turn_wait();
    issue_s(ps);
    turn_give();
    wgmma_wait<0>();
    fence_regs(sc);
    release(&r.k_empty[ps]);
    softmax(0, alpha);
    rescale_pack(alpha);
    for (int x = 1; x < ntiles; x++) {
        uint32_t gx = kt0 + (uint32_t)x;
        int s = (int)(gx % C::STAGES);
        bar_wait(&r.k_full[s], (gx / C::STAGES) & 1);
        turn_wait();
        issue_s(s);
        issue_pv();
        turn_give();
        /* v3 on: tile x − 1's ℓ while this warpgroup waits for S (its wgmmas are queued) */
        mass_flush();
        wgmma_wait<1>();
        fence_regs(sc);
        release(&r.k_empty[s]);
        softmax(x, alpha);
        /* v4 on: tile x + 1's K wait (needed next anyway) here, a real branch: ptxas
         * otherwise hoists the P·V wait below above the whole softmax (into the block
         * after the mask's branch, SASS: WARPGROUP.DEPBAR before the first FMNMX), to pack
         * P early into the registers the P·V in flight still reads — so the softmax never
         * overlapped this warpgroup's own P·V, only the other warpgroup's GEMMs. PVW: the
         * same for MASS = 0. Deadlock-free: the producer issues K(x + 1) once both
         * warpgroups released K(x + 1 − STAGES) and, before it in its order, V(x − STAGES):
         * iterations x + 1 − STAGES ≤ x − 1 (STAGES ≥ 2), none of whose waits needs
         * anything of iteration x; the turn is already given (NOTES "MF_CORE_PVWAIT").
         * The next iteration's K wait (same parity) then passes at once: that stage cannot
         * refill before this warpgroup's own release of K(x + 1) */
        if ((MASS >= 4 || PVW) && x + 1 < ntiles)
            bar_wait(&r.k_full[(gx + 1) % C::STAGES], ((gx + 1) / C::STAGES) & 1);
        wgmma_wait<0>(); /* the previous tile's P·V is done: its V is free */
        fence_regs(o);
        fence_regs(pa);
        release(&r.v_empty[ps]);
        rescale_pack(alpha);
        ps = s;
        pph = (gx / C::STAGES) & 1;
    }
    turn_wait();
    issue_pv();
    if (c == 0)
        turn_give();
    mass_flush(); /* v3 on: the last tile's ℓ, under its P·V */
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    release(&r.v_empty[ps]);
}

/* The consumers' epilogue (core_kernel's and persist_kernel's; a prob kernel on the core
 * stores through it too): rows row[0..1] of head t, O = o / l through store_o_row (float,
 * or T when p.o_t: mf_export_cuda's and mf_apply_cuda's o_dtype) and the natural-log LSE
 * when asked. lse2 (MASS): the tile's base-2 LSE per row into lse2[row − row0] (shared
 * memory, rows past N included: the mass reduction reads all 128). */
template <typename T, int D>
__device__ __forceinline__ void store_o(const core_params &p, const float (&o)[D / 2],
                                        const float (&mrow)[2], const float (&l)[2],
                                        const uint32_t (&row)[2], uint32_t t, int u,
                                        float *lse2 = nullptr, uint32_t row0 = 0)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]), inv = 1.0f / lt;
        if (lse2 && u == 0)
            lse2[row[r] - row0] = mrow[r] + log2f(lt);
        if (row[r] >= p.n)
            continue;
        store_o_row<T, D>(p.o, p.o_t, ((size_t)row[r] * p.hq + t) * D + 2 * u, o + 2 * r, inv);
        if (p.lse && u == 0)
            p.lse[(size_t)t * p.n + row[r]] = (mrow[r] + log2f(lt)) * MF_LN2;
    }
}

/* GATHER (block-64 lists only, BN = 128): list entries 2x, 2x + 1 form key tile x, each
 * 64-key block TMA-loaded into its half of the 128-row stage (the 128-byte swizzle repeats
 * every 8 rows, so two stacked 64-row boxes are one 128-row box); per-tile costs and the
 * m64n128 wgmmas are then paid per 128 keys. An odd list's last half is a phantom: block
 * s_j[count − 1] again, kept by nobody (masked whole; V stays finite, so P·V adds 0). */
template <typename T, int D, int BN, int MASS, bool GATHER, bool PVW>
__global__ void __launch_bounds__(384, 1)
core_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
            const __grid_constant__ CUtensorMap tv, const core_params p)
{
    static_assert(!GATHER || (BN == 128 && !MASS), "gather: 128-key tiles, lists mode");
    static_assert(!PVW || !MASS, "pvwait: MASS >= 4 places that wait itself");
    typedef cfg<D, BN> C;
    constexpr int EPT = GATHER ? 2 : 1; /* list entries a key tile */
    extern __shared__ uint8_t sm_raw[];
    uint8_t *sm = smem_align(sm_raw, 1024);
    uint64_t *q_full = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR);
    uint64_t *k_full = q_full + 1, *v_full = k_full + C::STAGES, *k_empty = v_full + C::STAGES,
             *v_empty = k_empty + C::STAGES;
    uint16_t *s_j = reinterpret_cast<uint16_t *>(sm + C::OFF_LIST);
    uint8_t *s_f = reinterpret_cast<uint8_t *>(s_j + MAX_TILES);
    int *s_cnt = reinterpret_cast<int *>(s_f + MAX_TILES);
    float *s_lse2 = reinterpret_cast<float *>(sm + C::OFF_LSE2);
    uint32_t m = p.n_tiles - 1 - blockIdx.x / p.hq, t = blockIdx.x % p.hq;
    uint32_t kvh = t / (p.hq / p.hkv);
    int wg = threadIdx.x / 128;
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) { /* Q does not depend on the list: its load overlaps the build */
            bar_init(q_full, 1);
            for (int s = 0; s < C::STAGES; s++) {
                bar_init(&k_full[s], 1);
                bar_init(&v_full[s], 1);
                bar_init(&k_empty[s], 8);
                bar_init(&v_empty[s], 8);
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            bar_expect(q_full, C::Q_BYTES);
            for (int h = 0; h < C::HALVES; h++)
                tma_load(sm + h * C::Q_HALF, &tq, q_full, 64 * h, (int)t, (int)(128 * m));
        }
        __syncwarp();
        int cnt = build_list<BN>(p, m, t, s_j, s_f);
        if (GATHER && (cnt & 1)) { /* cnt ≤ nb ≤ MAX_TILES and odd: s_j[cnt] is in bounds */
            __syncwarp();          /* the lanes' list writes, before lane 0 reads one */
            if (threadIdx.x == 0) {
                s_j[cnt] = s_j[cnt - 1];
                s_f[cnt] = 0;
            }
        }
        if (threadIdx.x == 0)
            *s_cnt = cnt;
        if (MASS && threadIdx.x == 0) {
            /* An ℓ slot for this CTA's lifetime: at most one CTA per SM is resident (the
             * launcher asks for more than half the shared memory), so nslots = #SMs always
             * has a free one; starting at %smid makes the first CAS succeed in practice.
             * A slot, not a per-(head, tile) array: the working set stays ~#SMs·128·nb·4
             * bytes, small enough to live in L2 (a CTA reads back what it wrote). */
            uint32_t sid;
            asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sid));
            uint32_t x = sid % p.nslots;
            while (atomicCAS(&p.slot_busy[x], 0u, 1u) != 0u)
                x = x + 1 == p.nslots ? 0 : x + 1;
            s_cnt[1] = (int)x;
        }
    }
    __syncthreads();
    int count = *s_cnt;
    if (count == 0) { /* not this kernel's tile: let the Q copy land before the CTA ends */
        if (threadIdx.x == 0)
            bar_wait(q_full, 0);
        return;
    }
    const int ntiles = (count + EPT - 1) / EPT; /* key tiles of BN keys */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            const kv_ring ring = { sm + C::OFF_K, sm + C::OFF_V, k_full, v_full, k_empty, v_empty };
            produce_tiles<D, BN, GATHER>(ring, &tk, &tv, s_j, ntiles, 0, kvh);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    int c = wg - 1, tid = threadIdx.x - 128 * wg, w = tid / 32, lane = tid & 31;
    int g = lane >> 2, u = lane & 3;
    uint32_t r0 = 128 * m + 64 * c;              /* this warpgroup's first query row */
    uint32_t row[2] = { r0 + 16 * w + g, r0 + 16 * w + g + 8 };
    uint32_t qa = smem_addr(sm) + c * 64 * 128;
    float o[D / 2], mrow[2], l[2];
    bool used;
    float *lslot = MASS ? p.lscr + (size_t)s_cnt[1] * p.slot_floats : nullptr;
    const kv_ring ring = { sm + C::OFF_K, sm + C::OFF_V, k_full, v_full, k_empty, v_empty };
    consume_tile<T, D, BN, MASS, GATHER, PVW>(p, ring, q_full, 0, qa, s_j, s_f, ntiles, 0, m, c,
                                              tid, row, lslot, true, o, mrow, l, used);
    if (!MASS && !used)
        return;
    store_o<T, D>(p, o, mrow, l, row, t, u, MASS ? s_lse2 : nullptr, 128 * m);
    if (MASS) {
        /* mass[t][i][j] = mean over the block's 64 rows of exp2(ℓ[q][j] − LSE2[q]): one
         * thread a key block, rows summed in order (deterministic), ℓ read back through L2
         * (the bar.sync orders this warpgroup's stores before the loads). Blocks above the
         * diagonal get 0; the last block, when partial, has no mass row. */
        asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory");
        uint32_t i = 2 * m + c;
        if (64 * (i + 1) <= p.n) {
            float *out = p.mass + ((size_t)t * p.nbm + i) * p.nbm;
            for (uint32_t j = tid; j < p.nbm; j += 128) {
                float acc = 0.0f;
                if (j <= i) {
                    const float4 *lj = reinterpret_cast<const float4 *>(lslot + (size_t)j * 128 +
                                                                        64 * c);
                    const float *lq = s_lse2 + 64 * c;
                    if (MASS >= 6) {
                        /* v6: the 16 loads in flight at once and four partial sums (rows
                         * q ≡ 0..3 mod 4), not 4 round trips and one 64-long FADD chain;
                         * the sum's order changes (masses within fp32 rounding of v2's) */
                        float4 v[16];
                        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
                        for (int q4 = 0; q4 < 16; q4++)
                            v[q4] = __ldcg(lj + q4);
#pragma unroll
                        for (int q4 = 0; q4 < 16; q4++) {
                            a0 += ex2(v[q4].x - lq[4 * q4 + 0]);
                            a1 += ex2(v[q4].y - lq[4 * q4 + 1]);
                            a2 += ex2(v[q4].z - lq[4 * q4 + 2]);
                            a3 += ex2(v[q4].w - lq[4 * q4 + 3]);
                        }
                        acc = (a0 + a1) + (a2 + a3);
                    } else {
#pragma unroll 4
                        for (int q4 = 0; q4 < 16; q4++) {
                            float4 v = __ldcg(lj + q4);
                            acc += ex2(v.x - lq[4 * q4 + 0]);
                            acc += ex2(v.y - lq[4 * q4 + 1]);
                            acc += ex2(v.z - lq[4 * q4 + 2]);
                            acc += ex2(v.w - lq[4 * q4 + 3]);
                        }
                    }
                    acc *= 1.0f / 64.0f;
                }
                out[j] = acc;
            }
        }
        /* both warpgroups are done with the slot: give it back */
        asm volatile("bar.sync 5, 256;\n" ::: "memory");
        if (c == 0 && tid == 0) {
            __threadfence();
            atomicExch(&p.slot_busy[s_cnt[1]], 0u);
        }
    }
}


} /* namespace */
} /* namespace mfc */

/* the persistent gathered kernel (the block-64 lists default): attn_persist.cuh */
#include "attn_persist.cuh"

namespace mfc {
namespace {

/* ---- host ----------------------------------------------------------------------------- */

PFN_cuTensorMapEncodeTiled_v12000 g_encode;
pthread_once_t g_encode_once = PTHREAD_ONCE_INIT;
void encode_resolve()
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        g_encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

/* This thread's last encodes: a launch encodes three maps, and callers repeat the same
 * tensors (layer after layer, rep after rep). A map is a pure function of the key below, so
 * a hit is exact. */
struct enc_entry {
    CUtensorMap tm;
    const void *base;
    mf_dtype_t dt;
    uint32_t n, h, d, rows;
};
#define ENC_CACHE 6
thread_local enc_entry t_enc[ENC_CACHE];
thread_local unsigned t_enc_used, t_enc_next;

/* [N][H][d] as a 3-d tensor (d, H, N); box {64, 1, rows}, 128-byte swizzle. */
bool encode(CUtensorMap *tm, const void *base, mf_dtype_t dt, uint32_t n, uint32_t h,
            uint32_t d, uint32_t rows)
{
    for (unsigned x = 0; x < t_enc_used; x++) {
        const enc_entry &e = t_enc[x];
        if (e.base == base && e.dt == dt && e.n == n && e.h == h && e.d == d && e.rows == rows) {
            *tm = e.tm;
            return true;
        }
    }
    cuuint64_t dims[3] = { d, h, n };
    cuuint64_t strides[2] = { (cuuint64_t)d * 2, (cuuint64_t)h * d * 2 };
    cuuint32_t box[3] = { 64, 1, rows }, estr[3] = { 1, 1, 1 };
    if (g_encode(tm, dt == MF_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                 3, const_cast<void *>(base), dims, strides, box, estr,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    enc_entry &e = t_enc[t_enc_next];
    e.tm = *tm;
    e.base = base;
    e.dt = dt;
    e.n = n;
    e.h = h;
    e.d = d;
    e.rows = rows;
    t_enc_next = (t_enc_next + 1) % ENC_CACHE;
    if (t_enc_used < ENC_CACHE)
        t_enc_used++;
    return true;
}


bool env_on(const char *var);

/* PERSIST (block-64 lists, GATHER): persist_kernel on min(tiles, SMs) CTAs. pvw
 * (MF_CORE_PVWAIT=1): consume_tile's PVW instantiation, for 128-key tiles without masses
 * (MASS ≥ 4 has that wait anyway; the 64-key-tile kernel, itself an A/B, ignores it) */
/* A persistent kernel's grid (this core's and the prob kernel's): min(*grid, SMs), and at
 * most n CTAs under MF_CORE_PERSIST_CTAS=n, so that gpu_check's small shapes walk several
 * tiles a CTA (buffer reuse, parities, empty tiles). */
mf_status_t persist_grid(uint32_t *grid, const char **why)
{
    uint32_t sms;
    mf_status_t st = sm_count(&sms, why);
    if (st != MF_OK)
        return st;
    const char *e = getenv("MF_CORE_PERSIST_CTAS");
    unsigned long cap = e ? strtoul(e, nullptr, 10) : 0;
    if (cap >= 1 && cap < sms)
        sms = (uint32_t)cap;
    *grid = *grid < sms ? *grid : sms;
    return MF_OK;
}

template <typename T, int D, int BN, int MASS, bool GATHER = false, bool PERSIST = false>
mf_status_t launch(const core_args &a, const core_params &p, bool pvw, cudaStream_t s,
                   const char **why)
{
    static_assert(!PERSIST || (GATHER && !MASS), "persistent: the gathered lists kernel");
    CUtensorMap tq, tk, tv;
    const uint32_t kv_rows = GATHER ? 64 : BN; /* GATHER: a tile is two 64-row boxes */
    if (!encode(&tq, a.q, a.dtype, a.n, a.hq, D, 128) ||
        !encode(&tk, a.k, a.dtype, a.n, a.hkv, D, kv_rows) ||
        !encode(&tv, a.v, a.dtype, a.n, a.hkv, D, kv_rows)) {
        *why = "cuTensorMapEncodeTiled failed (tensor base or strides not 16-byte aligned?)";
        return MF_INTERNAL;
    }
    size_t smem = PERSIST ? pcfg<D>::SMEM : cfg<D, BN>::SMEM;
    /* one CTA per SM: the ℓ slots count on it; the persistent grid (one CTA an SM) at d 64
     * (110 KiB) would otherwise let two share an SM while another idles */
    if ((MASS || PERSIST) && smem < MASS_MIN_SMEM)
        smem = MASS_MIN_SMEM;
    const bool regs240 = PERSIST && env_on("MF_CORE_PERSIST_REGS240");
    constexpr bool PV_OK = BN == 128 && !MASS;
    pvw = pvw && PV_OK;
    void (*kern)(CUtensorMap, CUtensorMap, CUtensorMap, core_params) =
        !PERSIST ? (pvw ? core_kernel<T, D, BN, MASS, GATHER, PV_OK>
                        : core_kernel<T, D, BN, MASS, GATHER, false>)
        : regs240 ? (pvw ? persist_kernel<T, D, 240, true> : persist_kernel<T, D, 240, false>)
                  : (pvw ? persist_kernel<T, D, 232, true> : persist_kernel<T, D, 232, false>);
    uint32_t grid = p.n_tiles * p.hq;
    if (PERSIST) {
        mf_status_t st = persist_grid(&grid, why);
        if (st != MF_OK)
            return st;
        /* the tile counter starts at 0 each launch (stream-ordered before the kernel) */
        st = cuda_status(cudaMemsetAsync(p.tile_ctr, 0, sizeof(uint32_t), s), why);
        if (st != MF_OK)
            return st;
    }
    static std::atomic<uint64_t> raised[4]; /* per kernel: bit = device */
    if (smem_limit_once((const void *)kern, (int)smem, &raised[regs240 + 2 * pvw]) !=
        cudaSuccess) {
        *why = "could not raise the attention core's shared-memory limit";
        return MF_INTERNAL;
    }
    kern<<<grid, 384, smem, s>>>(tq, tk, tv, p);
    return cuda_status(cudaGetLastError(), why);
}

/* bn: key block (128 dense); gather: block-64 lists as 128-key tiles (else 64-key tiles);
 * persist: those on the persistent kernel */
template <typename T, int MV>
mf_status_t launch_mass(const core_args &a, const core_params &p, cudaStream_t s,
                        const char **why)
{
    return a.d == 128 ? launch<T, 128, 128, MV>(a, p, false, s, why)
                      : launch<T, 64, 128, MV>(a, p, false, s, why);
}

/* mv: the mass bookkeeping (2..6, mass_variant), when p.mass; pvw: MF_CORE_PVWAIT=1 */
template <typename T>
mf_status_t launch_t(const core_args &a, const core_params &p, uint32_t bn, bool gather,
                     bool persist, int mv, bool pvw, cudaStream_t s, const char **why)
{
    if (p.mass) /* dense only: 128-key tiles */
        return mv == 6   ? launch_mass<T, 6>(a, p, s, why)
               : mv == 5 ? launch_mass<T, 5>(a, p, s, why)
               : mv == 4 ? launch_mass<T, 4>(a, p, s, why)
               : mv == 3 ? launch_mass<T, 3>(a, p, s, why)
                         : launch_mass<T, 2>(a, p, s, why);
    if (bn == 64 && gather && persist)
        return a.d == 128 ? launch<T, 128, 128, 0, true, true>(a, p, pvw, s, why)
                          : launch<T, 64, 128, 0, true, true>(a, p, pvw, s, why);
    if (a.d == 128)
        return bn == 128 ? launch<T, 128, 128, 0>(a, p, pvw, s, why)
               : gather  ? launch<T, 128, 128, 0, true>(a, p, pvw, s, why)
                         : launch<T, 128, 64, 0>(a, p, pvw, s, why);
    return bn == 128 ? launch<T, 64, 128, 0>(a, p, pvw, s, why)
           : gather  ? launch<T, 64, 128, 0, true>(a, p, pvw, s, why)
                     : launch<T, 64, 64, 0>(a, p, pvw, s, why);
}

/* A bench A/B switch from the environment, read per launch: off only when set to "0". */
bool env_off(const char *var)
{
    const char *e = getenv(var);
    return e && !strcmp(e, "0");
}
/* The same for a switch that is off by default: on only when set to "1". */
bool env_on(const char *var)
{
    const char *e = getenv(var);
    return e && !strcmp(e, "1");
}

/* MF_MASS_VARIANT (read per launch, like the switches above): the mass bookkeeping of the
 * fused forward, for A/B in one process (bench/gpu/NOTES.md "v3/v4 of the mass
 * bookkeeping"). Unset: v2. v2: ℓ reduced, lg2'd and stored inside the softmax; v3: the same
 * ℓ (bitwise), its shuffles / lg2 / store deferred to the next tile's S wait, lg2.ftz, a
 * running address; v4: v3 + the softmax overlapping the warpgroup's own P·V (a branch keeps
 * ptxas from hoisting that wait); v5: v4 + wgmma descriptors as base + offset (desc_add);
 * v6: v5 + an epilogue with its loads in flight at once and four partial sums (masses
 * within fp32 rounding of v2's, not bitwise). */
mf_status_t mass_variant(int *mv, const char **why)
{
    const char *e = getenv("MF_MASS_VARIANT");
    *mv = 2;
    if (!e || !*e)
        return MF_OK;
    if (e[0] == 'v' && e[1] >= '2' && e[1] <= '6' && !e[2]) {
        *mv = e[1] - '0';
        return MF_OK;
    }
    *why = "MF_MASS_VARIANT must be v2, v3, v4, v5 or v6";
    return MF_INVALID_ARGUMENT;
}

} /* namespace */

/* Multiprocessors of the current device (≥ 1); attn_core.cuh. */
mf_status_t sm_count(uint32_t *n, const char **why)
{
    int dev = 0, sms = 0;
    mf_status_t st = cuda_status(cudaGetDevice(&dev), why);
    if (st == MF_OK)
        st = cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), why);
    if (st == MF_OK && sms < 1) {
        *why = "the device reports no multiprocessors";
        st = MF_INTERNAL;
    }
    *n = (uint32_t)sms;
    return st;
}

mf_status_t core_supported(uint32_t d, mf_dtype_t dtype, const char **why)
{
    int dev = 0, major = 0, minor = 0;
    if (d != 64 && d != 128) {
        *why = "the attention core supports head dims 64 and 128";
        return MF_UNIMPLEMENTED;
    }
    if (dtype != MF_DTYPE_F16 && dtype != MF_DTYPE_BF16) {
        *why = "the attention core takes F16 or BF16 tensors";
        return MF_UNIMPLEMENTED;
    }
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        major != 9 || minor != 0) {
        *why = "the attention core needs an sm_90 (Hopper) device";
        return MF_UNIMPLEMENTED;
    }
    pthread_once(&g_encode_once, encode_resolve);
    if (!g_encode) {
        *why = "the driver has no cuTensorMapEncodeTiled";
        return MF_UNIMPLEMENTED;
    }
    return MF_OK;
}

mf_status_t core_launch(const core_args &a, cudaStream_t s, const char **why)
{
    pthread_once(&g_encode_once, encode_resolve);
    if (!g_encode) {
        *why = "the driver has no cuTensorMapEncodeTiled";
        return MF_UNIMPLEMENTED;
    }
    uint32_t bn = a.keep ? a.block : 128;
    if (bn != 64 && bn != 128) {
        *why = "the attention core's key blocks are 64 or 128";
        return MF_UNIMPLEMENTED;
    }
    core_params p = {};
    p.o = a.o;
    p.o_t = a.o_t;
    p.lse = a.lse;
    p.keep = a.keep;
    p.n = a.n;
    p.hq = a.hq;
    p.hkv = a.hkv;
    p.n_tiles = (a.n + 127) / 128;
    p.nb = a.nb;
    p.words = a.words;
    p.pair = a.keep && a.block == 64;
    p.scale_log2 = MF_LOG2E / sqrtf((float)a.d);
    p.pingpong = !env_off("MF_CORE_PINGPONG");
    bool gather = bn == 64 && !env_off("MF_CORE_GATHER");
    /* persistent (the default since its interleaved A/B won at every density: gpu-core.md
     * §12) only with the caller's tile counter (apply.cu gives one; else core_kernel) */
    bool persist = gather && a.tile_ctr && !env_off("MF_CORE_PERSIST");
    p.tile_ctr = a.tile_ctr;
    if (a.mass) {
        if (a.keep || !a.lscr || !a.slot_busy || !a.nslots) {
            *why = "masses need the dense iterator and an ℓ scratch";
            return MF_INTERNAL;
        }
        p.mass = a.mass;
        p.lscr = a.lscr;
        p.slot_busy = a.slot_busy;
        p.nslots = a.nslots;
        p.slot_floats = 2 * p.n_tiles * 128;
        p.nbm = a.n / 64;
    }
    if ((a.keep ? a.nb : (a.n + bn - 1) / bn) > MAX_TILES) {
        *why = "the attention core takes at most 2048 key tiles";
        return MF_UNIMPLEMENTED;
    }
    int mv = 2;
    if (a.mass) {
        mf_status_t st = mass_variant(&mv, why);
        if (st != MF_OK)
            return st;
    }
    /* MF_CORE_PVWAIT=1 (default off, a bench A/B like MF_CORE_PINGPONG): the P·V wait
     * kept after the softmax (consume_tile's PVW); the same output bits */
    bool pvw = env_on("MF_CORE_PVWAIT");
    if (a.dtype == MF_DTYPE_F16)
        return launch_t<__half>(a, p, bn, gather, persist, mv, pvw, s, why);
    return launch_t<__nv_bfloat16>(a, p, bn, gather, persist, mv, pvw, s, why);
}

} /* namespace mfc */

extern "C" mf_status_t mf_attention_dense_cuda(const mf_qkv_t *t, float *o, float *lse,
                                               mf_cuda_stream_t stream, const char **why)
{
    using namespace mfc;
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (!t || !o) {
        *why = "tensors and output O are required";
        return MF_INVALID_ARGUMENT;
    }
    mf_status_t st = mf_qkv_check(t, 1, why);
    if (st != MF_OK)
        return st;
    st = core_supported(t->head_dim, t->dtype, why);
    if (st != MF_OK)
        return st;
    if (((uintptr_t)t->q | (uintptr_t)t->k | (uintptr_t)t->v) & 15) {
        *why = "Q, K and V must be 16-byte aligned";
        return MF_INVALID_ARGUMENT;
    }
    return core_launch(core_args_of(t, o, lse), stream, why);
}

/* Slots for the ℓ scratch: one per SM (at most one mass CTA is resident on each). */
static mf_status_t mass_slots(uint32_t *nslots, const char **why)
{
    return mfc::sm_count(nslots, why);
}

extern "C" size_t mf_attention_masses_scratch(uint32_t n_tokens)
{
    const char *why;
    uint32_t nslots;
    if (n_tokens < 1 || mass_slots(&nslots, &why) != MF_OK)
        return 0;
    return ((size_t)nslots * 4 + 255) / 256 * 256 +
           (size_t)nslots * mfc::core_mass_slot_floats(n_tokens) * 4;
}

extern "C" mf_status_t mf_attention_masses_cuda(const mf_qkv_t *t, uint32_t block_size,
                                                float *o, float *lse, float *mass,
                                                void *scratch, size_t scratch_bytes,
                                                mf_cuda_stream_t stream, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    return mfc::masses_run(t, block_size, o, false, lse, mass, scratch, scratch_bytes, stream,
                           why);
}

mf_status_t mfc::masses_run(const mf_qkv_t *t, uint32_t block_size, void *o, bool o_t,
                            float *lse, float *mass, void *scratch, size_t scratch_bytes,
                            cudaStream_t stream, const char **why)
{
    using namespace mfc;
    if (!t || !o || !mass) {
        *why = "tensors, output O and the mass output are required";
        return MF_INVALID_ARGUMENT;
    }
    if (block_size != 64) {
        *why = "fused block masses are computed for B = 64 only";
        return MF_UNIMPLEMENTED;
    }
    mf_status_t st = mf_qkv_check(t, 1, why);
    if (st != MF_OK)
        return st;
    if (t->n_tokens < block_size) {
        *why = "N must hold at least one full block";
        return MF_INVALID_ARGUMENT;
    }
    st = core_supported(t->head_dim, t->dtype, why);
    if (st != MF_OK)
        return st;
    if (((uintptr_t)t->q | (uintptr_t)t->k | (uintptr_t)t->v) & 15) {
        *why = "Q, K and V must be 16-byte aligned";
        return MF_INVALID_ARGUMENT;
    }
    uint32_t nslots;
    st = mass_slots(&nslots, why);
    if (st != MF_OK)
        return st;
    size_t flags = ((size_t)nslots * 4 + 255) / 256 * 256;
    size_t need = flags + (size_t)nslots * core_mass_slot_floats(t->n_tokens) * 4;
    cudaStream_t s = stream;
    uint8_t *base = (uint8_t *)scratch, *owned = nullptr;
    if (scratch && (scratch_bytes < need || ((uintptr_t)scratch & 255))) {
        *why = "scratch smaller than mf_attention_masses_scratch(N) or not 256-byte aligned";
        return MF_INVALID_ARGUMENT;
    }
    if (!scratch) {
        st = cuda_status(cudaMallocAsync((void **)&owned, need, s), why);
        if (st != MF_OK)
            return st;
        base = owned;
    }
    st = cuda_status(cudaMemsetAsync(base, 0, (size_t)nslots * 4, s), why);
    if (st == MF_OK) {
        core_args a = core_args_of(t, o, lse);
        a.o_t = o_t;
        a.mass = mass;
        a.lscr = (float *)(base + flags);
        a.slot_busy = (uint32_t *)base;
        a.nslots = nslots;
        st = core_launch(a, s, why);
    }
    if (owned)
        cudaFreeAsync(owned, s);
    return st;
}

/* prob mode on the core: its kernel and prob_core_launch (attn_prob.cuh says how) */
#include "attn_prob.cuh"
