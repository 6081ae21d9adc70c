/* attn_persist — the attention core's persistent gathered kernel (persist_kernel and its
 * shared-memory plan pcfg), the default for block-64 lists; the section below says how it
 * works. Included once, by attn_core.cu, after consume_tile / produce_tiles / build_list
 * (which it runs in a loop over tiles) and before the host code that launches it. */

namespace mfc {
namespace {

/* ---- persistent gathered kernel (the default; MF_CORE_PERSIST=0 off) ---------------------------------
 *
 * Block-64 lists in gathered 128-key tiles, as core_kernel<…, GATHER>, but grid = min(tiles,
 * SMs) CTAs that each take their next tile index from a device counter (atomicAdd, zeroed
 * before the launch), in core_kernel's blockIdx order (largest query tile first), so one
 * tile's fixed costs (list build, Q load, first K / V latency) overlap the previous tile's
 * loop. Dynamic, not a static walk b, b + grid, …: a tile's work grows with its query index
 * (causal lists) and differs by head, so a static walk leaves CTAs unequal totals (NOTES
 * core v5.1), where core_kernel's CTAs are handed out as SMs free up. Q and the list are
 * double-buffered (buffer k & 1 for the CTA's k-th tile); the K / V ring runs on across
 * tiles (ring position = key tiles walked so far). Producer warpgroup: warp 1 is the lister
 * (lane 0 takes tile k's index and writes it beside the list, the warp builds the list,
 * lane 0 writes its count and issues its Q), the loader (thread 0) issues every tile's K / V
 * into the ring; apart, so that the next list and Q do not wait behind the loads of the tile
 * before. Barriers, per buffer b: list_full[b]
 * (each lister lane arrives once the list and its count are written: 32), q_full[b] (Q's
 * TMA bytes), tile_free[b] (each consumer thread once it no longer reads that Q and list,
 * and the loader once it has issued the tile's loads: 257). Every tile, empty or not,
 * passes list_full and tile_free once, so their parity is (k / 2) & 1; an empty tile (count
 * 0) loads nothing and the consumers skip it, so q_full[b] advances only on non-empty tiles
 * and each consumer keeps its parity bit per buffer. The lister waits tile_free[b] of tile
 * k − 2 before rewriting buffer b: it runs at most two tiles ahead of the consumers. An
 * index ≥ tiles is the "no more tiles" sentinel: the lister publishes it (list_full as any
 * tile) and stops, and the loader and consumers, reading the same buffer, stop after the
 * same tile.
 * Turns (ping-pong) stay consume_tile's per-tile protocol, matched within each tile, none
 * on a skipped one, except that warpgroup 1 gives a non-empty next tile's first turn
 * before its O store rather than after. gpu_check runs it with MF_CORE_PERSIST_CTAS=3 and 1
 * (many tiles a CTA). Registers 40 / 232: no spills (ptxas -v), the lister included. */
template <int D> struct pcfg {
    typedef cfg<D, 128> C;
    static constexpr uint32_t OFF_K = 2 * C::Q_BYTES, OFF_V = OFF_K + C::STAGES * C::KV_BYTES;
    static constexpr uint32_t OFF_BAR = OFF_V + C::STAGES * C::KV_BYTES;
    static constexpr uint32_t OFF_LIST = OFF_BAR + 8 * (6 + 4 * C::STAGES);
    static constexpr uint32_t LIST_BYTES = MAX_TILES * 3 + 16; /* s_j, s_f, count, index */
    static constexpr uint32_t SMEM = OFF_LIST + 2 * LIST_BYTES + 1024; /* + alignment slack */
    static_assert(SMEM <= 227 * 1024, "persistent kernel: shared memory per block");
    static_assert(LIST_BYTES % 16 == 0, "list buffers 16-byte aligned");
};

/* CREGS: the consumers' setmaxnreg (232 with a 40-register producer warpgroup; 240 with 24,
 * where the lister / loader spill — a bench A/B, MF_CORE_PERSIST_REGS240=1); PVW:
 * consume_tile's, MF_CORE_PVWAIT=1 */
template <typename T, int D, int CREGS, bool PVW>
__global__ void __launch_bounds__(384, 1)
persist_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, const core_params p)
{
    typedef cfg<D, 128> C;
    typedef pcfg<D> P;
    extern __shared__ uint8_t sm_raw[];
    uint8_t *sm = smem_align(sm_raw, 1024);
    uint64_t *q_full = reinterpret_cast<uint64_t *>(sm + P::OFF_BAR);
    uint64_t *list_full = q_full + 2, *tile_free = list_full + 2;
    const kv_ring ring = { sm + P::OFF_K, sm + P::OFF_V, tile_free + 2,
                           tile_free + 2 + C::STAGES, tile_free + 2 + 2 * C::STAGES,
                           tile_free + 2 + 3 * C::STAGES };
    /* buffer b's list: s_j [MAX_TILES], s_f [MAX_TILES], count, tile index (≥ total: none) */
    auto list_j = [&](int b) {
        return reinterpret_cast<uint16_t *>(sm + P::OFF_LIST + b * P::LIST_BYTES);
    };
    auto list_f = [&](int b) { return reinterpret_cast<uint8_t *>(list_j(b) + MAX_TILES); };
    auto list_cnt = [&](int b) { return reinterpret_cast<int *>(list_f(b) + MAX_TILES); };
    auto list_idx = [&](int b) { return reinterpret_cast<uint32_t *>(list_cnt(b) + 1); };
    const uint32_t total = p.n_tiles * p.hq;
    int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; b++) {
            bar_init(&q_full[b], 1);
            /* every lister lane / consumer thread arrives itself: an arrive releases only
             * its own thread's list writes / reads (one lane's after __syncwarp is valid
             * too, but racecheck need not see it that way) */
            bar_init(&list_full[b], 32);
            bar_init(&tile_free[b], 257); /* 256 consumer threads + the loader */
        }
        for (int s = 0; s < C::STAGES; s++) {
            bar_init(&ring.k_full[s], 1);
            bar_init(&ring.v_full[s], 1);
            bar_init(&ring.k_empty[s], 8);
            bar_init(&ring.v_empty[s], 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        /* 40 / 232, not core_kernel's 24 / 240: at 24 the lister and loader loops spill
         * (ptxas -v: 128–136 bytes; 40–48 at 32); 40 + 2 · 232 = 3 · 168, the launch's */
        static_assert(CREGS == 232 || CREGS == 240, "40 / 232 or 24 / 240");
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(CREGS == 240 ? 24 : 40));
        int warp = threadIdx.x / 32;
        if (warp == 1) { /* the lister: tile k's list and Q, as soon as buffer k & 1 is free */
            for (uint32_t k = 0;; k++) {
                int b = (int)(k & 1);
                uint16_t *s_j = list_j(b);
                uint8_t *s_f = list_f(b);
                if (k >= 2) /* the consumers and the loader are done with tile k − 2's */
                    bar_wait(&tile_free[b], ((k >> 1) & 1) ^ 1);
                uint32_t i = 0;
                if (threadIdx.x == 32) /* ≥ total: none left, the sentinel (everyone stops) */
                    *list_idx(b) = i = atomicAdd(p.tile_ctr, 1u);
                i = __shfl_sync(0xffffffffu, i, 0);
                if (i >= total) {
                    bar_arrive(&list_full[b]);
                    break;
                }
                uint32_t m = p.n_tiles - 1 - i / p.hq, t = i % p.hq;
                int cnt = build_list<128>(p, m, t, s_j, s_f);
                __syncwarp(); /* the lanes' list writes, before lane 0 reads or publishes them */
                if (threadIdx.x == 32) {
                    if (cnt & 1) { /* phantom half, as core_kernel: cnt odd < MAX_TILES */
                        s_j[cnt] = s_j[cnt - 1];
                        s_f[cnt] = 0;
                    }
                    *list_cnt(b) = cnt;
                    if (cnt) {
                        bar_expect(&q_full[b], C::Q_BYTES);
                        for (int h = 0; h < C::HALVES; h++)
                            tma_load(sm + b * C::Q_BYTES + h * C::Q_HALF, &tq, &q_full[b],
                                     64 * h, (int)t, (int)(128 * m));
                    }
                }
                bar_arrive(&list_full[b]); /* after lane 0's index, count and phantom */
            }
        } else if (threadIdx.x == 0) { /* the loader: every tile's K / V into the ring */
            uint32_t kt = 0; /* key tiles handed to the ring so far */
            for (uint32_t k = 0;; k++) {
                int b = (int)(k & 1);
                bar_wait(&list_full[b], (k >> 1) & 1);
                uint32_t i = *list_idx(b);
                if (i >= total)
                    break;
                int nt = (*list_cnt(b) + 1) / 2;
                produce_tiles<D, 128, true>(ring, &tk, &tv, list_j(b), nt, kt,
                                            (i % p.hq) / (p.hq / p.hkv));
                kt += (uint32_t)nt;
                bar_arrive(&tile_free[b]); /* its list read: every load of the tile issued */
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREGS));
    int c = wg - 1, tid = threadIdx.x - 128 * wg, w = tid / 32, lane = tid & 31;
    int g = lane >> 2, u = lane & 3;
    uint32_t kt = 0, q_ph = 0; /* ring position; bit b: q_full[b]'s next parity */
    bool gave = false;         /* warpgroup 1: this tile's first turn already given */
    for (uint32_t k = 0;; k++) {
        int b = (int)(k & 1);
        bar_wait(&list_full[b], (k >> 1) & 1);
        uint32_t i = *list_idx(b);
        if (i >= total)
            break;
        uint32_t m = p.n_tiles - 1 - i / p.hq, t = i % p.hq;
        int count = *list_cnt(b);
        if (count == 0) { /* not this kernel's tile: nothing was loaded for it */
            bar_arrive(&tile_free[b]);
            continue;
        }
        int ntiles = (count + 1) / 2;
        uint32_t r0 = 128 * m + 64 * c;
        uint32_t row[2] = { r0 + 16 * w + g, r0 + 16 * w + g + 8 };
        float o[D / 2], mrow[2], l[2];
        bool used;
        consume_tile<T, D, 128, 0, true, PVW>(p, ring, &q_full[b], (q_ph >> b) & 1,
                                              smem_addr(sm + b * C::Q_BYTES) + c * 64 * 128,
                                              list_j(b), list_f(b), ntiles, kt, m, c, tid, row,
                                              nullptr, !gave, o, mrow, l, used);
        q_ph ^= 1u << b;
        kt += (uint32_t)ntiles;
        bar_arrive(&tile_free[b]); /* done with Q and the list: free them before the O store */
        /* Warpgroup 1 gives the next tile's first turn before its O store, so warpgroup 0's
         * first S there does not wait for the store's issue; only when that tile is not
         * empty nor the sentinel (the turn would stay unmatched). Its list (or the sentinel)
         * is normally there already: the lister runs a tile ahead and waits on nothing this
         * warpgroup still holds. */
        gave = false;
        if (c == 1 && p.pingpong) {
            int b1 = (int)((k + 1) & 1);
            bar_wait(&list_full[b1], ((k + 1) >> 1) & 1);
            if (*list_idx(b1) < total && *list_cnt(b1) != 0) {
                asm volatile("bar.arrive 1, 256;\n" ::: "memory"); /* consume_tile's turn_give */
                gave = true;
            }
        }
        if (used)
            store_o<T, D>(p, o, mrow, l, row, t, u);
    }
}

} /* namespace */
} /* namespace mfc */
