/* attn_prob — prob mode on the sm_90a core (issue 19): the core's V ring, RS-wgmma P·V and O
 * epilogue, with the W-mixed probability tile as the A operand instead of a softmax of
 * Q·Kᵀ (no Q, no K). Included once, at the end of attn_core.cu (it uses attn_ptx.cuh's
 * wgmma / mbarrier / TMA wrappers and that file's store_o, encode and persist_grid); host
 * entry prob_core_launch (attn_core.cuh).
 *
 * Persistent (prob_kernel says how): an item is (128-row tile m, prob target head t);
 * consumer warpgroup c owns query block i = 2m + c (B = 64) and its row.
 *  - Builders (warps 1, 2; prob_build): row c's columns with a source head of W > 0 (j,
 *    head mask, entry offset) into shared memory, and the block's state: the kernel's (a
 *    usable row — row_usable includes the 16-byte alignment the bulk copies need — of at
 *    most PROB_LIST_CAP columns), v2's (usable but longer: pstate 2), or nobody's here (not
 *    a prob block, exact, or a bad row: the attention core's bitmap from the pre-pass
 *    computes it, or with no core in the launch v2 from the work list).
 *  - Producer warps (0 and 3, every other stage each; lane k builds slot k of a stage;
 *    prob_produce): walk the two lists
 *    merged by j (their union, ascending); per column one or more ring stages: V block j
 *    (TMA, the core's 128-byte swizzle, read transposed by wgmma as in the core) and the
 *    present source tiles of both rows (cp.async.bulk, 1-D, global → shared, on the same
 *    mbarrier; a tile is contiguous bytes of the row, in place), with per-stage metadata (j,
 *    slots: offset, warpgroup, W, entry) written before its arrive; each tile's scale comes
 *    as the aligned 16 bytes of the row's scales around it, by a bulk copy on the same
 *    barrier (a global load here would put an L2 round trip into every stage). A column
 *    with more tiles than a stage holds (TILE_CAP bytes) takes more stages, each with V
 *    again: P·V is linear, so each stage's partial mix is multiplied on its own (rare: > 8
 *    FP8 / 4 FP16 tiles of two rows in one column).
 *  - Consumers (prob_consume): per stage, each warp decodes its 16 rows of its own row's
 *    tiles straight into the m64nNk16 A-fragment layout (thread (g, u): keys 8jj + 2u, +1 of
 *    rows g, g + 8; prob_decode says how it loads; pair_codec, as v2 decodes), mixes with
 *    W·scale, zeroes keys above the diagonal (j = i), packs to T and issues the RS-wgmma
 *    against V, and one against a tile of ones whose accumulator is the rows' kept mass
 *    (the same rounded P as the numerator); the next stage's decode overlaps it, and the two
 *    warpgroups interleave on the tensor cores (no softmax to hide, so no ping-pong turns).
 *    A stage where the warpgroup has no tile is released without a wgmma.
 *  - End of an item: O = acc / kept mass through store_o (the core's epilogue); rows with
 *    kept mass 0 (everything quantised away, or no column) are marked in pzero (pstate 1)
 *    and v2's follow-up launch computes them exactly (the reference's rule), overwriting
 *    them; every block left to v2 goes on its work list (prob_follow).
 * Every prob block with a usable row gets its pstate written here, so v2's follow-up knows
 * what is left (apply.cu). Shared memory (d = 128): 4 stages × (16 KiB V + 32 KiB tiles) +
 * the lists (28 KiB, one set: the producer is done with an item's before the next is
 * built) + two item buffers ≈ 224 KiB; one CTA an SM. */

namespace mfc {
namespace {

#define PROB_LIST_CAP 1024u /* listed columns a row (N ≤ 64k at B = 64); longer: v2 */

/* A stage's metadata: column j, slots [0, n0) row 0's tiles and [n0, n) row 1's (so each
 * consumer walks its own, no per-slot test), last = the item's last stage. 16 bytes each
 * part: one shared load for the head and one a slot. */
struct prob_slot {
    uint32_t off, e; /* byte offset in the stage's tile area; the tile's entry in its row */
    float w;
    uint32_t pad;
};
struct prob_meta {
    uint32_t j, n, n0, last;
    prob_slot s[8];
};
/* One (m, head) item's state, double-buffered (the CTA's k-th item in buffer k & 1):
 * written by the builders, read by the producer (rows, W) and the consumers (the rows'
 * codec and state, the zero bits). */
struct prob_item {
    float w[MF_ROW_MAX_HEADS];
    row_dev row[2];
    unsigned long long zero[2], wmask;
    int n[2], st[2]; /* listed columns; state: 0 not here, 1 this kernel, 2 v2 */
    uint32_t idx, t; /* the item (≥ the items: none left) and its target head */
};

template <int D> struct prob_cfg {
    static constexpr int STAGES = 4, MAX_SLOTS = 8;
    static constexpr uint32_t V_HALF = cfg<D, 64>::KV_HALF, V_BYTES = cfg<D, 64>::KV_BYTES;
    static constexpr uint32_t TILE_CAP = 32768; /* 8 FP8 / U8 or 4 FP16 / BF16 tiles of B 64 */
    static constexpr uint32_t OFF_T = STAGES * V_BYTES, OFF_META = OFF_T + STAGES * TILE_CAP;
    /* per stage and slot the 16 bytes of the row's scales that hold the tile's (FP8 / U8):
     * copied with the tiles, so the producer never waits on a global load */
    static constexpr uint32_t OFF_SC = OFF_META + STAGES * (uint32_t)sizeof(prob_meta);
    /* full, empty per stage; item_full, item_free per item buffer; lists_free */
    static constexpr uint32_t OFF_BAR = OFF_SC + STAGES * MAX_SLOTS * 16;
    static constexpr uint32_t OFF_LJ = OFF_BAR + (8 * (2 * STAGES + 5) + 15) / 16 * 16;
    static constexpr uint32_t OFF_LC = OFF_LJ + 2 * PROB_LIST_CAP * 2; /* [2][CAP] u32 col_off */
    static constexpr uint32_t OFF_LH = OFF_LC + 2 * PROB_LIST_CAP * 4; /* [2][CAP] u64 mask */
    static constexpr uint32_t OFF_ITEM = OFF_LH + 2 * PROB_LIST_CAP * 8; /* [2] prob_item */
    /* ONES_BYTES of T ones: wgmma_rs_ones's B (8 × 16, both core matrices 128 B apart) */
    static constexpr uint32_t OFF_ONES = OFF_ITEM + 2 * (uint32_t)sizeof(prob_item);
    static constexpr uint32_t ONES_BYTES = 256;
    static constexpr uint32_t SMEM = OFF_ONES + ONES_BYTES + 1024;
    static_assert(SMEM <= 227 * 1024, "prob kernel: shared memory per block");
    static_assert(sizeof(prob_meta) % 16 == 0 && OFF_LH % 8 == 0 && OFF_ITEM % 16 == 0 &&
                      sizeof(prob_item) % 16 == 0, "alignment");
    static_assert(MAX_SLOTS * 4096 >= TILE_CAP, "slots for the smallest tiles");
};

/* m without its k lowest set bits (k ≤ MAX_SLOTS: a short loop). */
__device__ __forceinline__ unsigned long long drop_low_bits(unsigned long long m, uint32_t k)
{
    for (uint32_t q = 0; q < k; q++)
        m &= m - 1;
    return m;
}


/* sc[4·jj + 2r + e] (the m64nN accumulator / A-fragment layout: row q0 + 8r, key
 * 8jj + 2u + e) += W·P̂ of one 64 × 64 tile in shared memory (rows of 64 elements, as in
 * the row). 16-bit codecs: each thread loads its own 4 bytes a pair. 8-bit codecs: the
 * quad loads the 16 bytes of each 16-key group together (one 16-byte load, the same in
 * all four lanes) and each lane takes its two pairs from it — half the shared-memory
 * wavefronts of a 2-byte load a pair (rows 64 B apart: both patterns are 4-way bank
 * conflicts per row set, the wide load needs half as many instructions). */
template <int CODEC, bool SET>
__device__ __forceinline__ void prob_decode(const uint8_t *tile, float w, float scale,
                                            float (&sc)[32], int q0, int u)
{
    typedef pair_codec<CODEC> pc;
    constexpr bool WIDE = CODEC == MF_CODEC_FP16 || CODEC == MF_CODEC_BF16;
    float cf = pc::coef(w, scale);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (WIDE) {
            const uint8_t *rp = tile + (q0 + 8 * r) * 128 + 4 * u;
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
                pc::template add<SET>(sc[4 * jj + 2 * r], sc[4 * jj + 2 * r + 1],
                                      *reinterpret_cast<const uint32_t *>(rp + 16 * jj), cf);
        } else {
            const uint4 *rp = reinterpret_cast<const uint4 *>(tile + (q0 + 8 * r) * 64);
            /* keys 2u, 2u + 1 of each 8-key half: bytes 2u, 2u + 1 of (x, y) or (z, w), one
             * byte permute instead of a select and a shift (add reads the low 16 bits) */
            const uint32_t sel = (2u * u) | ((2u * u + 1u) << 4);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint4 v = rp[kk]; /* keys 16kk .. 16kk + 15 */
                pc::template add<SET>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1],
                                      __byte_perm(v.x, v.y, sel), cf);
                pc::template add<SET>(sc[8 * kk + 4 + 2 * r], sc[8 * kk + 5 + 2 * r],
                                      __byte_perm(v.z, v.w, sel), cf);
            }
        }
    }
}

/* (t, i) for v2's follow-up launch: its work list (apply.cu walks only these). */
__device__ __forceinline__ void prob_follow(const app_params &a, uint32_t t, uint32_t i)
{
    a.wl[atomicAdd(a.wl_n, 1u)] = t * a.nb_all + i;
}

/* The CTA's shared memory, by part (prob_cfg's offsets). */
template <int D> struct prob_sm {
    uint8_t *base;
    prob_meta *meta;
    uint64_t *full, *empty, *item_full, *item_free, *lists_free;
    uint16_t *lj;
    uint32_t *lc;
    unsigned long long *lh;
    prob_item *items;
    uint32_t *ones;
    __device__ explicit prob_sm(uint8_t *sm)
    {
        typedef prob_cfg<D> C;
        base = sm;
        meta = reinterpret_cast<prob_meta *>(sm + C::OFF_META);
        full = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR);
        empty = full + C::STAGES;
        item_full = empty + C::STAGES;
        item_free = item_full + 2;
        lists_free = item_free + 2;
        lj = reinterpret_cast<uint16_t *>(sm + C::OFF_LJ);
        lc = reinterpret_cast<uint32_t *>(sm + C::OFF_LC);
        lh = reinterpret_cast<unsigned long long *>(sm + C::OFF_LH);
        items = reinterpret_cast<prob_item *>(sm + C::OFF_ITEM);
        ones = reinterpret_cast<uint32_t *>(sm + C::OFF_ONES);
    }
};

/* Builder warp c (warps 1, 2): row c of each item the CTA takes, into item buffer k & 1 and
 * the (single) lists. The item index, the row's header, W and the first round of column
 * loads need only the buffer (free once the consumers are done with item k − 2); the list
 * writes wait for the producer to have walked item k − 1's lists. So the build's global
 * latency overlaps item k − 1's last stages, and the producer, which walks an item's lists
 * well before the consumers drain the ring, finds the next lists ready. A builder with no
 * list to write never waits on lists_free (its phase k cannot complete before this item is
 * published, so a later wait's parity stays unambiguous). */
template <int D>
__device__ __forceinline__ void prob_build(const prob_sm<D> &S, const app_params &a,
                                           const core_params &p, uint32_t total, int c)
{
    const uint32_t lane = threadIdx.x & 31;
    uint16_t *lj = S.lj + c * PROB_LIST_CAP;
    uint32_t *lc = S.lc + c * PROB_LIST_CAP;
    unsigned long long *lh = S.lh + c * PROB_LIST_CAP;
    for (uint32_t k = 0;; k++) {
        const int b = (int)(k & 1);
        prob_item *it = &S.items[b];
        if (k >= 2)
            bar_wait_idle(&S.item_free[b], ((k >> 1) & 1) ^ 1);
        if (c == 0 && lane == 0) /* ≥ total: none left, the sentinel (everyone stops) */
            it->idx = atomicAdd(a.prob_ctr, 1u);
        asm volatile("bar.sync 5, 64;\n" ::: "memory"); /* both builders: the index */
        const uint32_t x = it->idx;
        if (x >= total) {
            bar_arrive(&S.item_full[b]);
            return;
        }
        const uint32_t m = p.n_tiles - 1 - x / a.nh, t = a.heads[x % a.nh], i = 2 * m + c;
        int st = 0, cnt = 0;
        row_dev row = {};
        if (i < a.nb_all && a.mode[t] == MF_HEAD_PROB && !a.exact[i]) {
            row = row_open(a.rows[i]);
            if (row_usable(row, i, 64, a.hs, MF_HEAD_PROB))
                st = row.n_cols > PROB_LIST_CAP ? 2 : 1; /* (usable: 16-byte aligned) */
        }
        /* W's row: its mask read warp-wide from global memory (no CTA barrier here, unlike
         * load_w), the row itself kept by builder 0 for the producers' slot weights */
        const float *wrow = a.w + (size_t)t * a.hs;
        if (c == 0)
            for (uint32_t s = lane; s < MF_ROW_MAX_HEADS; s += 32)
                it->w[s] = s < a.hs ? wrow[s] : 0.0f;
        const unsigned long long wmask = w_row_mask(wrow, a.hs);
        if (st == 1 && lane == 0)
            it->row[c] = row; /* before the loop: not live across it (56 registers) */
        if (st == 1) {
            /* 4 × 32 columns a round, every load of the round issued before the first is
             * used: one global round trip a round, not three dependent ones per 32 columns */
            constexpr int U = 4;
            bool lists_ok = k == 0; /* the lists (item k − 1's walked) */
            for (uint32_t base = 0; base < row.n_cols; base += 32 * U) {
                unsigned long long hm[U];
                uint32_t cj[U], co[U];
#pragma unroll
                for (int q = 0; q < U; q++) {
                    const uint32_t col = base + 32 * q + lane;
                    const bool in = col < row.n_cols;
                    hm[q] = in ? row.head_mask[col] : 0ull;
                    cj[q] = in ? row.cols[col] : 0u;
                    co[q] = in ? row.col_off[col] : 0u;
                }
                if (!lists_ok) { /* after the first round's loads are issued */
                    bar_wait_idle(S.lists_free, (k - 1) & 1);
                    lists_ok = true;
                }
#pragma unroll
                for (int q = 0; q < U; q++) {
                    const bool ok = (hm[q] & wmask) != 0;
                    const uint32_t bal = __ballot_sync(0xffffffffu, ok);
                    if (ok) {
                        int at = cnt + __popc(bal & ((1u << lane) - 1));
                        lj[at] = (uint16_t)cj[q];
                        lc[at] = co[q];
                        lh[at] = hm[q];
                    }
                    cnt += __popc(bal);
                }
            }
        }
        if (lane == 0) {
            it->n[c] = cnt;
            it->st[c] = st;
            it->zero[c] = 0;
            if (c == 0) {
                it->t = t;
                it->wmask = wmask;
            }
        }
        asm volatile("bar.sync 5, 64;\n" ::: "memory"); /* both rows' counts */
        if (lane == 0) {
            const size_t at = (size_t)t * a.nb_all + i;
            bool follow = false;
            if (st == 2) { /* longer than the list: the whole block is v2's */
                a.pstate[at] = 2;
                follow = true;
            } else if (st == 1 && it->n[0] + it->n[1] == 0) {
                a.pzero[at] = ~0ull; /* nothing to load: kept mass 0 in every row */
                a.pstate[at] = 1;
                follow = true;
            } else if (st == 0 && !a.core && i < a.nb_all) {
                follow = true; /* a bad row (or exact block) and no attention core: v2's */
            }
            if (follow)
                prob_follow(a, t, i);
        }
        bar_arrive(&S.item_full[b]); /* every lane: its list writes */
    }
}

/* Producer warp pw (warps 0 and 3): each item's two lists merged by j (their union,
 * ascending); per column one or more ring stages (the ring and its position gx run on
 * across items). Both warps walk every stage (the walk is cheap and uniform) and each fills
 * every other one (gx & 1 = pw): one warp filling all of them was the kernel's limit (ncu:
 * the consumers waited on `full` 30 % of their time with the ring never full; a deeper
 * ring did not help). Lane k builds slot k of a stage: one thread walking the slots ran ≈
 * 600 dependent instructions a stage. Each lane writes its own slot, arrives on `full`
 * itself (an arrive releases only its own thread's writes) and issues its own copies. */
template <int D>
__device__ __forceinline__ void prob_produce(const prob_sm<D> &S, const CUtensorMap *tv,
                                             const app_params &a, uint32_t total, uint32_t pw)
{
    typedef prob_cfg<D> C;
    const uint32_t lane = threadIdx.x & 31;
    uint32_t gx = 0;
    for (uint32_t k = 0;; k++) {
        const int b = (int)(k & 1);
        const prob_item *it = &S.items[b];
        bar_wait(&S.item_full[b], (k >> 1) & 1);
        if (it->idx >= total)
            return;
        const int na = it->n[0], nb = it->n[1];
        const uint32_t kvh = it->t / (a.ht / a.hkv);
        const unsigned long long wmask = it->wmask;
        uint32_t tb[2], lg[2], scb[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const bool on = it->st[c] == 1;
            tb[c] = on ? it->row[c].tile_bytes : C::TILE_CAP; /* unused when off: no list */
            lg[c] = __ffs(tb[c]) - 1; /* 64 × 64 × 1 or 2 bytes: a power of two, no division */
            scb[c] = on && it->row[c].scales ? 16u : 0u;
        }
        int x[2] = { 0, 0 };
        while (x[0] < na || x[1] < nb) {
            uint32_t jc[2], j;
            unsigned long long hm[2] = { 0, 0 }, rel[2] = { 0, 0 };
            uint32_t coff[2] = { 0, 0 };
            jc[0] = x[0] < na ? S.lj[x[0]] : 0xffffffffu;
            jc[1] = x[1] < nb ? S.lj[PROB_LIST_CAP + x[1]] : 0xffffffffu;
            j = min(jc[0], jc[1]);
#pragma unroll
            for (int c = 0; c < 2; c++)
                if (jc[c] == j) {
                    uint32_t at = c * PROB_LIST_CAP + x[c]++;
                    hm[c] = S.lh[at];
                    coff[c] = S.lc[at];
                    rel[c] = hm[c] & wmask;
                }
            while (rel[0] | rel[1]) { /* one stage per TILE_CAP bytes of this column's tiles */
                int s = (int)(gx % C::STAGES);
                /* row 0's tiles first, then row 1's, as many as the stage holds */
                const uint32_t n0 = __popcll(rel[0]), n1 = __popcll(rel[1]);
                const uint32_t t0 = min(n0, min((uint32_t)C::MAX_SLOTS, C::TILE_CAP >> lg[0]));
                const uint32_t t1 = min(n1, min((uint32_t)C::MAX_SLOTS - t0,
                                                (C::TILE_CAP - t0 * tb[0]) >> lg[1]));
                const uint32_t n = t0 + t1;
                const unsigned long long r0 = rel[0], r1 = rel[1];
                /* the taken tiles leave the column (mostly all of them) */
                rel[0] = t0 >= n0 ? 0ull : drop_low_bits(rel[0], t0);
                rel[1] = t1 >= n1 ? 0ull : drop_low_bits(rel[1], t1);
                if ((gx & 1u) != pw) { /* the other producer's stage */
                    gx++;
                    continue;
                }
                if (gx >= C::STAGES)
                    bar_wait(&S.empty[s], ((gx / C::STAGES) & 1) ^ 1);
                prob_meta *mt = &S.meta[s];
                unsigned long long src = 0;
                uint32_t me = 0, mc = 0, moff = 0, mtb = 0, msc = 0; /* (no local arrays) */
                if (lane < n) {
                    mc = lane < t0 ? 0u : 1u;
                    const uint32_t idx = mc ? lane - t0 : lane;
                    const uint32_t h = __ffsll((long long)drop_low_bits(mc ? r1 : r0, idx)) - 1;
                    me = entry_of(mc ? coff[1] : coff[0], mc ? hm[1] : hm[0], h);
                    mtb = mc ? tb[1] : tb[0];
                    msc = mc ? scb[1] : scb[0];
                    moff = mc ? t0 * tb[0] + idx * tb[1] : idx * tb[0];
                    src = __cvta_generic_to_global(it->row[mc].tiles + (size_t)me * mtb);
                    *reinterpret_cast<uint4 *>(&mt->s[lane]) =
                        make_uint4(moff, me, __float_as_uint(it->w[h]), 0u);
                }
                if (lane == 0) {
                    *reinterpret_cast<uint4 *>(mt) =
                        make_uint4(j, n, t0, !(rel[0] | rel[1]) && x[0] >= na && x[1] >= nb);
                    bar_expect(&S.full[s], C::V_BYTES + t0 * (tb[0] + scb[0]) +
                                               t1 * (tb[1] + scb[1]));
                    for (int h = 0; h < D / 64; h++)
                        tma_load(S.base + s * C::V_BYTES + h * C::V_HALF, tv, &S.full[s],
                                 64 * h, (int)kvh, (int)(64 * j));
                } else {
                    bar_arrive(&S.full[s]);
                }
                if (lane < n) {
                    bulk_load(S.base + C::OFF_T + s * C::TILE_CAP + moff, src, mtb, &S.full[s]);
                    /* the scales section is 16-byte aligned and followed by the tiles, so
                     * the aligned 16 bytes around entry e lie inside the row */
                    if (msc)
                        bulk_load(S.base + C::OFF_SC + (s * C::MAX_SLOTS + lane) * 16,
                                  __cvta_generic_to_global(it->row[mc].scales + (me & ~3u)),
                                  16, &S.full[s]);
                }
                gx++;
            }
        }
        bar_arrive(S.lists_free); /* every lane of both warps: its reads of the lists done */
    }
}

/* FP8 rows, packed: h[4·kk + 2·hh + r] (the pair sc[8·kk + 4·hh + 2r], +1 of prob_decode)
 * = (+=) c2 · P̂ of the two keys in f16x2 — the FP8 pair unpacks to f16x2 exactly, so a
 * pair costs a permute, an unpack and one HFMA2 instead of a permute, an unpack, two
 * conversions and two FFMA. c2 carries a power-of-two prescale (a.fp8_pre) that keeps the
 * mixed values in f16's normal range; O = acc / kept mass cancels it. */
template <bool SET>
__device__ __forceinline__ void prob_decode_fp8x2(const uint8_t *tile, __half2 c2,
                                                  __half2 (&h)[16], int q0, int u)
{
    const uint32_t sel = (2u * u) | ((2u * u + 1u) << 4);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const uint4 *rp = reinterpret_cast<const uint4 *>(tile + (q0 + 8 * r) * 64);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint4 v = rp[kk];
            const uint32_t raw[2] = { __byte_perm(v.x, v.y, sel), __byte_perm(v.z, v.w, sel) };
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                __half2_raw hr =
                    __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)raw[hh], __NV_E4M3);
                const __half2 f = *reinterpret_cast<__half2 *>(&hr);
                __half2 &d = h[4 * kk + 2 * hh + r]; /* sc[8kk + 4hh + 2r], +1 */
                d = SET ? __hmul2(f, c2) : __hfma2(f, c2, d);
            }
        }
    }
}

/* Consumer warpgroup c: row c (query block i = 2m + c) of each item, its stages in ring
 * order (gx runs on across items, as the producers'), then its O store and state; the
 * buffer is handed back (item_free) once nothing of it is read any more. */
template <typename T, int D>
__device__ __forceinline__ void prob_consume(const prob_sm<D> &S, const app_params &a,
                                             const core_params &p, uint32_t total)
{
    typedef prob_cfg<D> C;
    const int c = (int)(threadIdx.x / 128) - 1, tid = threadIdx.x - 128 * (c + 1);
    const int lane = tid & 31, u = lane & 3;
    const int q0 = 16 * (tid / 32) + (lane >> 2); /* this thread's rows q0, q0 + 8 of block i */
    uint32_t gx = 0;
    for (uint32_t k = 0;; k++) {
        const int b = (int)(k & 1);
        prob_item *it = &S.items[b];
        bar_wait(&S.item_full[b], (k >> 1) & 1);
        const uint32_t x = it->idx;
        if (x >= total)
            return;
        if (it->n[0] + it->n[1] == 0) { /* nothing loaded (the builders marked it) */
            bar_arrive(&S.item_free[b]);
            continue;
        }
        const uint32_t m = p.n_tiles - 1 - x / a.nh, t = it->t, i = 2 * m + c;
        const int st = it->st[c];
        const uint32_t codec = st == 1 ? it->row[c].codec : 0u;
        const bool has_sc = st == 1 && it->row[c].scales != nullptr; /* FP8 / U8 rows */
        /* km: the kept mass, row q0 in km[0] (= km[1]), row q0 + 8 in km[2] (= km[3]) */
        float o[D / 2], km[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
        for (int x2 = 0; x2 < D / 2; x2++)
            o[x2] = 0.0f;
        /* no swizzle, K-major; LBO = SBO = 128: the two core matrices of a k16 step, and
         * nothing outside the ones whichever of the two the hardware steps by */
        const uint64_t ones_d = sdesc(smem_addr(S.ones), 128, 128) & ~(3ull << 62);
        uint32_t pa[4][4];
        int ps = -1;
        for (;; gx++) {
            int s = (int)(gx % C::STAGES);
            bar_wait(&S.full[s], (gx / C::STAGES) & 1);
            const prob_meta *mt = &S.meta[s];
            const uint4 hd = *reinterpret_cast<const uint4 *>(mt); /* j, n, n0, last */
            const uint32_t j = hd.x, last = hd.w;
            const uint32_t q_lo = c ? hd.z : 0u, q_hi = c ? hd.y : hd.z; /* this row's slots */
            const uint8_t *tiles = S.base + C::OFF_T + s * C::TILE_CAP;
            const float *scs =
                reinterpret_cast<const float *>(S.base + C::OFF_SC) + s * C::MAX_SLOTS * 4;
            /* the first tile sets sc (no zeroing: 32 instructions a stage), the others add;
             * FP8 rows mix packed in h, unpacked into sc once a stage */
            float sc[32];
            __half2 h[16];
            auto decode = [&](uint32_t q, auto first) {
                constexpr bool SET = decltype(first)::value;
                const uint4 sl = *reinterpret_cast<const uint4 *>(&mt->s[q]); /* off, e, w */
                const uint8_t *tl = tiles + sl.x;
                const float w = __uint_as_float(sl.z);
                const float scale = has_sc ? scs[4 * q + (sl.y & 3u)] : 1.0f;
                switch (codec) {
                case MF_CODEC_FP16: prob_decode<MF_CODEC_FP16, SET>(tl, w, scale, sc, q0, u); break;
                case MF_CODEC_BF16: prob_decode<MF_CODEC_BF16, SET>(tl, w, scale, sc, q0, u); break;
                case MF_CODEC_FP8_E4M3:
                    prob_decode_fp8x2<SET>(
                        tl, __float2half2_rn(pair_codec<MF_CODEC_FP8_E4M3>::coef(w, scale) *
                                             a.fp8_pre),
                        h, q0, u);
                    break;
                default: prob_decode<MF_CODEC_U8_LOG, SET>(tl, w, scale, sc, q0, u); break;
                }
            };
            const bool any = q_lo < q_hi;
            if (any) {
                decode(q_lo, std::true_type());
                for (uint32_t q = q_lo + 1; q < q_hi; q++)
                    decode(q, std::false_type());
                if (codec == MF_CODEC_FP8_E4M3)
#pragma unroll
                    for (int x2 = 0; x2 < 16; x2++) {
                        const float2 f = __half22float2(h[x2]);
                        sc[2 * x2] = f.x;
                        sc[2 * x2 + 1] = f.y;
                    }
                if (j == i) /* causality is enforced here too, whatever the tile holds */
#pragma unroll
                    for (int jj = 0; jj < 8; jj++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (8 * jj + 2 * u + (e & 1) > q0 + 8 * (e >> 1))
                                sc[4 * jj + e] = 0.0f;
            }
            wgmma_wait<0>(); /* the previous stage's P·V is done: its V, tiles and pa are free */
            fence_regs(o);
            fence_regs(km);
            fence_regs(pa);
            if (ps >= 0)
                bar_arrive(&S.empty[ps]);
            if (any) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    pa[kk][0] = elem<T>::pack(sc[8 * kk + 0], sc[8 * kk + 1]);
                    pa[kk][1] = elem<T>::pack(sc[8 * kk + 2], sc[8 * kk + 3]);
                    pa[kk][2] = elem<T>::pack(sc[8 * kk + 4], sc[8 * kk + 5]);
                    pa[kk][3] = elem<T>::pack(sc[8 * kk + 6], sc[8 * kk + 7]);
                }
                /* one descriptor a stage, the k16 steps by desc_add (not four sdesc builds) */
                const uint64_t vd = sdesc(smem_addr(S.base + s * C::V_BYTES), C::V_HALF, 1024);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_rs<T, D>(o, pa[kk], desc_add(vd, kk * 2048), 1);
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_rs_ones<T>(km, pa[kk], ones_d);
                wgmma_commit();
            }
            ps = s;
            if (last) {
                gx++;
                break;
            }
        }
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(km);
        fence_regs(pa);
        bar_arrive(&S.empty[ps]); /* an item with columns has at least one stage */
        if (st == 1) {
            if (u == 0)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    if (!(km[2 * r] > 0.0f))
                        atomicOr(&it->zero[c], 1ull << (q0 + 8 * r));
            /* O = acc / kept mass; a row of mass 0 gets a non-finite value here, overwritten
             * by v2's exact pass (pzero) later in stream order */
            const uint32_t row[2] = { 64 * i + q0, 64 * i + q0 + 8 };
            const float mrow[2] = { 0.0f, 0.0f }; /* unread: no LSE in prob mode */
            /* every lane holds its rows' whole mass; store_o sums the quad's l */
            const float l[2] = { u == 0 ? km[0] : 0.0f, u == 0 ? km[2] : 0.0f };
            store_o<T, D>(p, o, mrow, l, row, t, u);
            asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory"); /* the zero bits */
            if (tid == 0) {
                size_t at = (size_t)t * a.nb_all + i;
                unsigned long long z = it->zero[c];
                a.pzero[at] = z;
                a.pstate[at] = z ? 1 : 0;
                if (z)
                    prob_follow(a, t, i);
            }
        }
        bar_arrive(&S.item_free[b]); /* every consumer thread: its reads of the buffer */
    }
}

/* Persistent: grid = min(items, SMs) CTAs, each taking its next (m, head) item from a device
 * counter (atomicAdd; largest m first, as the mask core's persistent kernel) until the
 * counter passes the items. One CTA an SM ran 62 items in sequence at 32k, each paying its
 * setup, ring fill and O store with nothing beside it (≈ 0.46 ms of 3.5); here the next
 * item's lists are built and its first stages loaded while this one drains. Roles: warps 0
 * and 3 the producers (every other stage each), warps 1 and 2 the builders of rows 0 and
 * 1; warpgroups 1, 2
 * the consumers of rows 0, 1. Barriers: full / empty per ring stage; per item buffer b
 * item_full[b] (the builders' 64 lanes) and item_free[b] (the 256 consumer threads);
 * lists_free (both producers' 64 lanes, once per item: the single lists are free again).
 * Every item passes item_full and item_free once, so their parity is (k / 2) & 1 for the
 * CTA's k-th item; the sentinel index (≥ items) is published as an item and stops all. */
template <typename T, int D>
__global__ void __launch_bounds__(384, 1)
prob_kernel(const __grid_constant__ CUtensorMap tv, const app_params a, const core_params p)
{
    typedef prob_cfg<D> C;
    extern __shared__ uint8_t sm_raw[];
    const prob_sm<D> S(smem_align(sm_raw, 1024));
    const uint32_t total = p.n_tiles * a.nh;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; s++) {
            bar_init(&S.full[s], 32); /* the lanes of the stage's producer warp */
            /* every consumer thread of both warpgroups, every stage: an arrive releases only
             * its own thread's reads of the stage (metadata included), so each thread
             * arrives itself (as CUTLASS's consumer release; racecheck sees it) */
            bar_init(&S.empty[s], 256);
        }
        for (int b = 0; b < 2; b++) {
            bar_init(&S.item_full[b], 64);
            bar_init(&S.item_free[b], 256);
        }
        bar_init(S.lists_free, 64); /* both producer warps' lanes */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (threadIdx.x < C::ONES_BYTES / 4) {
        S.ones[threadIdx.x] = elem<T>::pack(1.0f, 1.0f);
        /* generic-proxy writes, read by wgmma (the async proxy) */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        /* 56 / 224: the producer loop holds two rows' cursors, the builders a round of
         * loads (no spills, ptxas -v); 56 + 2 · 224 = 3 · 168, the launch's */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        const int warp = threadIdx.x / 32;
        if (warp == 0 || warp == 3)
            prob_produce<D>(S, &tv, a, total, warp == 3);
        else
            prob_build<D>(S, a, p, total, warp - 1);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    prob_consume<T, D>(S, a, p, total);
}

template <typename T, int D>
mf_status_t prob_launch(const app_params &a, const core_params &p, mf_dtype_t dt,
                        cudaStream_t s, const char **why)
{
    CUtensorMap tv;
    if (!encode(&tv, a.v, dt, a.n, a.hkv, D, 64)) {
        *why = "cuTensorMapEncodeTiled failed for V (base or strides not 16-byte aligned?)";
        return MF_INTERNAL;
    }
    static std::atomic<uint64_t> raised; /* per instantiation: bit = device */
    if (smem_limit_once((const void *)prob_kernel<T, D>, (int)prob_cfg<D>::SMEM, &raised) !=
        cudaSuccess) {
        *why = "could not raise the prob kernel's shared-memory limit";
        return MF_INTERNAL;
    }
    uint32_t grid = p.n_tiles * a.nh;
    mf_status_t st = persist_grid(&grid, why);
    if (st != MF_OK)
        return st;
    /* a.prob_ctr was zeroed with the call's constants (stream-ordered before this launch) */
    prob_kernel<T, D><<<grid, 384, prob_cfg<D>::SMEM, s>>>(tv, a, p);
    return cuda_status(cudaGetLastError(), why);
}

} /* namespace */

mf_status_t prob_core_launch(const app_params &a, mf_dtype_t dtype, uint32_t d,
                             cudaStream_t s, const char **why)
{
    pthread_once(&g_encode_once, encode_resolve);
    if (!g_encode) {
        *why = "the driver has no cuTensorMapEncodeTiled";
        return MF_UNIMPLEMENTED;
    }
    if (!a.pstate || !a.pzero || !a.heads || !a.prob_ctr || !a.wl || !a.wl_n) {
        *why = "the prob kernel needs its state arrays, counters, work list and head list";
        return MF_INTERNAL;
    }
    if (a.nh == 0)
        return MF_OK;
    core_params p = {};
    p.o = a.o;
    p.o_t = a.o_t; /* o_dtype: the epilogue stores O as v2 does */
    p.n = a.n;
    p.hq = a.ht;
    p.hkv = a.hkv;
    p.n_tiles = (a.n + 127) / 128;
    bool f16 = dtype == MF_DTYPE_F16;
    if (d == 128)
        return f16 ? prob_launch<__half, 128>(a, p, dtype, s, why)
                   : prob_launch<__nv_bfloat16, 128>(a, p, dtype, s, why);
    if (d == 64)
        return f16 ? prob_launch<__half, 64>(a, p, dtype, s, why)
                   : prob_launch<__nv_bfloat16, 64>(a, p, dtype, s, why);
    *why = "the prob kernel supports head dims 64 and 128";
    return MF_UNIMPLEMENTED;
}

} /* namespace mfc */
