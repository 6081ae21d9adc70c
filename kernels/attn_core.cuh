/*
 * attn_core — the Hopper (sm_90a) attention core: causal softmax attention of 128-row
 * query tiles over a list of key tiles, with wgmma, TMA into an mbarrier ring, one
 * producer warp and two consumer warpgroups (64 query rows each). Only attn_core.cu is
 * built for sm_90a; this header is the host-side interface the other kernels/ sources
 * call (no device code). Internal to kernels/.
 *
 * The block iterator is the only thing that differs between uses:
 *  - dense (keep == NULL): every key j ≤ row, key tiles of 128;
 *  - lists (keep != NULL): per (head, query block of `block` rows) a bitmap of kept key
 *    blocks (keep[(t·nb + i)·words + j/32] bit j%32), key tiles of `block` keys. A 128-row
 *    tile pairs query blocks 2m, 2m + 1 (block 64) or is block m (block 128); it walks the
 *    union of their kept sets once, and each warpgroup multiplies only the tiles its own
 *    block kept. A query block with no bit set is not this kernel's (O there untouched).
 *    Block 64 is computed in gathered 128-key tiles: union entries 2x, 2x + 1 are loaded
 *    into one tile (an odd union's last half: a block again, masked whole), so the loop's
 *    per-tile costs are paid per 128 keys, as in dense mode.
 *
 * Dense mode can also return B = 64 block masses (core_args.mass: mf_attention_masses_cuda):
 * per-64-key block-local log-sum-exps kept in an ℓ slot per CTA, reduced against the final
 * LSE at the tile's end (attn_core.cu says how).
 *
 * The environment's MF_CORE_PINGPONG=0 turns the consumer warpgroups' turn-taking off (an A/B
 * switch for bench/gpu/core_bench.py; bench/gpu/NOTES.md), and MF_CORE_GATHER=0 runs block-64
 * lists on the 64-key-tile kernel instead of gathered 128-key tiles (the same A/B use; both
 * read once per launch). The gathered block-64 lists run on the persistent kernel (the default;
 * MF_CORE_PERSIST=0: core_kernel, one CTA a tile) when core_args.tile_ctr is given: min(tiles, SMs) CTAs
 * taking tiles from a device counter in the same largest-first order, a tile's list build,
 * Q load and first K / V loads overlapping the previous tile's loop;
 * MF_CORE_PERSIST_CTAS=n caps its grid (gpu_check: many tiles a CTA on small shapes).
 * MF_CORE_PVWAIT=1 (default off) keeps the previous tile's P·V wait after the softmax in the
 * 128-key-tile kernels without masses (dense, lists, gathered, persistent): same output bits.
 * MF_MASS_VARIANT=v2|v3|v4|v5|v6 picks the masses' bookkeeping (default v2; attn_core.cu's
 * mass_variant says what each does; another value: MF_INVALID_ARGUMENT), read per launch.
 * Thread safety: global state is
 * a once-resolved driver entry point (cuTensorMapEncodeTiled through
 * cudaGetDriverEntryPointByVersion) and per-kernel atomic "shared-memory limit raised" flags;
 * each thread keeps its last few tensor maps (thread_local). Any thread, any stream.
 */
#ifndef MF_ATTN_CORE_CUH
#define MF_ATTN_CORE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "mapflow_kernels.h"

namespace mfc {

struct core_args {
    const void *q, *k, *v;  /* device [N, Hq | Hkv, d] */
    mf_dtype_t dtype;       /* F16 or BF16 */
    uint32_t n, hq, hkv, d; /* d ∈ {64, 128} */
    void *o;                /* device [N, Hq, d]: float, or the inputs' dtype when o_t */
    uint32_t o_t;           /* 1: O stored as F16 / BF16 (the inputs' dtype) */
    float *lse;             /* device [Hq, N] natural log, or NULL */
    const uint32_t *keep;   /* device bitmaps (lists mode) or NULL (dense) */
    uint32_t block;         /* lists mode: 64 or 128 */
    uint32_t nb, words;     /* lists mode: query blocks ceil(N / block); words per bitmap */
    /* dense mode, optional: block masses of 64-blocks [Hq][N/64][N/64] (0 above the
     * diagonal); lscr holds nslots ℓ slots of core_mass_slot_floats(n) fp32, slot_busy
     * nslots zeroed words (left zero). nslots ≥ the device's SM count. */
    float *mass, *lscr;
    uint32_t *slot_busy;
    uint32_t nslots;
    /* lists mode, optional: 4 bytes of device scratch the persistent kernel's dynamic tile
     * scheduler counts in (zeroed by core_launch on its stream); NULL: never persistent.
     * One launch at a time per counter (stream order). */
    uint32_t *tile_ctr;
};

/* The core's arguments for tensors t (checked by the caller), output o [N, Hq, d] and
 * optional lse: dense mode; lists mode and masses are set on the result. */
static inline core_args core_args_of(const mf_qkv_t *t, void *o, float *lse)
{
    core_args a = {};
    a.q = t->q;
    a.k = t->k;
    a.v = t->v;
    a.dtype = t->dtype;
    a.n = t->n_tokens;
    a.hq = t->n_q_heads;
    a.hkv = t->n_kv_heads;
    a.d = t->head_dim;
    a.o = o;
    a.lse = lse;
    return a;
}

/* fp32 words of one ℓ slot (128 rows × the 64-key blocks of N, rounded to 128-key tiles). */
static inline size_t core_mass_slot_floats(uint32_t n) { return (size_t)((n + 127) / 128) * 256; }

/* cudaFuncSetAttribute(fn, MaxDynamicSharedMemorySize, bytes) once per (kernel, device):
 * a driver call per launch otherwise. raised: the kernel's own flags (bit = device ordinal;
 * devices past 63 set it every time). bytes must be the kernel's one value. Any thread. */
static inline cudaError_t smem_limit_once(const void *fn, int bytes, std::atomic<uint64_t> *raised)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    uint64_t bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
    if (bit && (raised->load(std::memory_order_acquire) & bit))
        return cudaSuccess;
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && bit)
        raised->fetch_or(bit, std::memory_order_release);
    return e;
}

/* MF_OK when the core runs (d, dtype) on the current device (compute capability 9.0);
 * MF_UNIMPLEMENTED with *why otherwise. */
mf_status_t core_supported(uint32_t d, mf_dtype_t dtype, const char **why);

/* mf_attention_masses_cuda (its checks and scratch) with O stored as float, or in t's dtype
 * when o_t (mf_export_cuda's o_dtype); why non-NULL. */
mf_status_t masses_run(const mf_qkv_t *t, uint32_t block_size, void *o, bool o_t, float *lse,
                       float *mass, void *scratch, size_t scratch_bytes, cudaStream_t stream,
                       const char **why);

/* Queues the core on stream s. Shapes are the caller's to have checked (mf_qkv_check,
 * core_supported); returns MF_INTERNAL when a tensor map cannot be encoded or the
 * shared-memory limit cannot be raised, a CUDA status for a launch error. */
mf_status_t core_launch(const core_args &a, cudaStream_t s, const char **why);

/* The current device's multiprocessors (≥ 1) into *n; a CUDA status (why set) otherwise.
 * The persistent grids and v2's work-list grid are sized by it. Any host thread. */
mf_status_t sm_count(uint32_t *n, const char **why);

/* Prob mode on the core (attn_prob.cuh): the prob blocks of heads a.heads[0..a.nh) at
 * B = 64 (a: apply.cu's v2 parameters, with pstate / pzero, the item counter prob_ctr and
 * the work list wl / wl_n set, the counters zeroed), O through the core's epilogue; each
 * prob block with a usable row gets its pstate, and each block left to v2 goes on the work
 * list for v2's follow-up launch, which must run after it on the same stream. Shapes and
 * alignment of Q / K / V are the caller's to have checked (core_supported). */
struct app_params;
mf_status_t prob_core_launch(const app_params &a, mf_dtype_t dtype, uint32_t d,
                             cudaStream_t s, const char **why);

} /* namespace mfc */

#endif /* MF_ATTN_CORE_CUH */
