#!/usr/bin/env python3
"""Timing of the sm_90a attention core (kernels/attn_core.cu) against the baselines a user
would pick, on one H200 (bench/gpu/NOTES.md has the floors and the versions).

  dense: mf_attention_dense_cuda vs F.scaled_dot_product_attention(is_causal=True,
         enable_gqa=True) with torch's default backend (named in the output), bf16,
         Hq 32 / Hkv 8, d 128; our O is also compared with SDPA's (rel err).
  mask:  mf_apply_cuda_impl(core) in mask mode (MASK-codec rows, W = identity, top_p 1, so
         head t keeps exactly the pattern's blocks of source head t: sink + window +
         stripes at 5 / 10 / 20 / 35 %), pre-pass included, vs v2 on the same rows and vs
         flex_attention on the same kept (head, 64-block) pairs: BLOCK_SIZE 128 with default
         kernel options (the exact 64-block pattern as mask_mod on partial 128-blocks), and
         64-token blocks (BLOCK_M = BLOCK_N = 64). Core vs v2 rel err printed.
         Phase split of the core call (phase_split: pre-pass only, core only, no launch,
         host wall of one call, and the same with MF_APPLY_CACHE=0, the per-call scratch
         of before) and the warpgroup tiles the pairing masks whole (union_waste).
         A/B of the core's block-64 tiles: the same call with MF_CORE_GATHER=0 (the
         64-key-tile kernel instead of gathered 128-key tiles): "BN-64 kernel" ms, its
         core-only ms and rel err vs v2; "phantom halves": the share of the gathered
         tiles' 64-key halves that pad an odd union (union_waste). A/B of the persistent
         gathered kernel: the same call with MF_CORE_PERSIST=1: "persistent" ms, its
         core-only ms, and whether its O is bit for bit the core's (it should be).
         Interleaved A/B (ab_*_ms, one log line): core, core + MF_CORE_PVWAIT=1 (the P·V
         wait after the softmax), persistent, persistent + PVWAIT, persistent 24 / 240;
         the PVWAIT outputs bit for bit the core's. Dense: ours + PVWAIT interleaved with
         ours (ab_ours_ms, ab_ours_pvw_ms), O bit for bit ours.
  mix:   (--mix-ns) one layer of 8 prob / 16 mask / 8 compute heads against the sum of each
         mode's heads run alone (MF_APPLY_ONLY), FP8 rows, prob heads on the core's prob
         kernel (bench_mix).
  O dtype: the apply calls (mask, mix, and the dense table's compute-mode apply) are timed
         as the target calls them, O in the model's dtype (o_dtype = bf16: no fp32 O, no
         cast), each bf16 O checked = rn(fp32 O) of the same path; the fp32 call alone and
         followed by the model's cast are extra columns (the mask table's A/B runs and
         phase split time the bf16 call too; their O checks use the fp32 O).
  prob:  (--prob) every head prob, FP8 rows (--prob-codecs: fp8, fp16, bf16, u8log;
         the goal is FP8's), W = pair_w, at --mask-ns × (--densities +
         0.1, eff 13.5 %): the core's prob kernel vs v2 (MF_APPLY_PROB=v2), ms, GB/s of
         the bytes it must move, TFLOP/s of P·V on the eff blocks, the 1.8 ms goal
         (bench_prob).
  masses: mf_attention_masses_cuda (O, LSE and B = 64 block masses in one pass) vs cuDNN
         dense on the same layer, vs our dense core alone, and vs the current extract path
         (mf_extract_cuda, MASK codec: masses + Top-P 0.9 + rows + seal, with the LSE given),
         bf16, d 128, Hq/Hkv from --mass-heads, structured Q/K (bench_torch.structured_qk);
         fused masses vs extract's mass_out max |diff| printed. The mass bookkeepings
         (MF_MASS_VARIANT, --mass-variants v2,v3,v4,v5,v6): each one's O / LSE / masses against
         v2's on these inputs, then fused ms of each beside the dense core, in --mass-rounds
         interleaved rounds (median of the rounds' medians, so drift between calls hits
         every variant alike): fused / dense core, / cuDNN, / v2.
  export: mf_export_cuda (the exporter that ships: the fused forward's O, LSE and masses,
         then extract's selection, rows and seal on those masses; MASK codec, Top-P 0.9) vs
         today's path, cuDNN dense + mf_extract_cuda (LSE computed by extract, as SDPA
         returns none; with the LSE given as well), vs cuDNN dense alone; same layer as
         masses. Every exported row is decoded (mf_row_decode: structure + seal). Also the
         export with O in bf16 from the epilogue (o_dtype; checked = rn(fp32 O)) against
         fp32 O + the model's cast, with extract's scratch per call (MF_EXTRACT_CACHE=0)
         and cached, and the layer's rows copied into a region-like buffer on a side
         stream: mf_rows_copy_cuda (one launch) vs one torch copy a row (wall ms).
  strided: mf_extract_cuda with the strided query sample (MF_EXTRACT_SAMPLE: masses from
         the rows q ≡ stride/2 (mod stride) of each block, the engine's LSE given; MASK codec,
         Top-P 0.9), the approximate exporter for a source whose attention is an engine's
         cuDNN call, at each of --strides vs cuDNN dense alone on the same layer (the
         source's extra cost = extract / cuDNN); kept-set recall against stride 1 (exact
         masses) on the structured inputs: share of the exact Top-P kept blocks kept,
         density ratio, exact mass covered; rows decoded. --strided-ns / --strided-heads;
         --strided-inputs structured,random adds Gaussian Q/K with a few large keys (diffuse
         maps: near-equal masses, where recall measures tie-breaking and the exact mass
         covered is the number that matters).
Times: CUDA events, median of --reps (≥ 7) after warm-up. A table is printed last and the
numbers go to --out as JSON.

  python3 bench/gpu/core_bench.py [--ns 16384,32768,65536] [--densities 0.05,0.1,0.2,0.35]
                                  [--reps 9] [--out core.json] [--no-flex] [--no-mask]
                                  [--mass-ns 32768] [--mass-heads 40/8,32/8] [--no-dense]
                                  [--mass-variants v2,v3,v4,v5,v6] [--mass-rounds 3]
                                  [--strided-ns 32768] [--strided-heads 40/8]
                                  [--strides 1,4,8,16] [--strided-inputs structured]
                                  [--mix-ns 32768] [--mix-density 0.1] [--prob]
"""
import argparse
import ctypes as C
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu as BG  # noqa: E402  (ctypes structures and the library path)
import bench_torch as BT  # noqa: E402  (one CUDA-event timer)
import rows as R  # noqa: E402

HQ, HKV, D, B = 32, 8, 128, 64
IMPL_V2, IMPL_CORE = 2, 4
MIX_CYCLE = (1, 2, 2, 0)  # bench_mix: head t's mode (prob, mask, mask, compute by t % 4)


# mf_export_cuda_args_t: mapflow.kernels' mirror (layout-checked when the library loads)
ExportArgs = BG.K.ExportCudaArgs


def timeit(fn, reps, warm=2):
    """(median, min, max) ms: bench_torch's CUDA-event timer, reordered for this script."""
    lo, med, hi = BT.timings(fn, reps, warm)
    return med, lo, hi


def sdpa_backend(fn):
    """Name of the longest CUDA kernel one call of fn runs (which SDPA backend it took)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total",
                                                               getattr(e, "cuda_time_total", 0)))
    return ev[0].key[:90] if ev else "?"


def load():
    lib = BG.load_lib()
    lib.mf_attention_dense_cuda.restype = C.c_int
    lib.mf_attention_dense_cuda.argtypes = [C.POINTER(BG.Qkv), C.c_void_p, C.c_void_p,
                                            C.c_void_p, C.POINTER(C.c_char_p)]
    if hasattr(lib, "mf_attention_masses_cuda"):
        lib.mf_attention_masses_cuda.restype = C.c_int
        lib.mf_attention_masses_cuda.argtypes = [C.POINTER(BG.Qkv), C.c_uint32, C.c_void_p,
                                                 C.c_void_p, C.c_void_p, C.c_void_p,
                                                 C.c_size_t, C.c_void_p,
                                                 C.POINTER(C.c_char_p)]
        lib.mf_attention_masses_scratch.restype = C.c_size_t
        lib.mf_attention_masses_scratch.argtypes = [C.c_uint32]
    if hasattr(lib, "mf_export_cuda"):
        lib.mf_export_cuda.restype = C.c_int
        lib.mf_export_cuda.argtypes = [C.POINTER(ExportArgs), C.c_void_p,
                                       C.POINTER(C.c_char_p)]
    return lib


def bench_dense(lib, n, reps, log):
    q = torch.randn(n, HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(n, HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(n, HKV, D, dtype=torch.bfloat16, device="cuda")
    o = torch.empty(n, HQ, D, dtype=torch.float32, device="cuda")
    lse = torch.empty(HQ, n, dtype=torch.float32, device="cuda")
    t = BG.Qkv(q.data_ptr(), k.data_ptr(), v.data_ptr(), 2, n, HQ, HKV, D)
    why = C.c_char_p()
    stream = torch.cuda.current_stream().cuda_stream

    def ours():
        st = lib.mf_attention_dense_cuda(C.byref(t), o.data_ptr(), lse.data_ptr(), stream,
                                         C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_attention_dense_cuda {st} {why.value}")
    o.fill_(float("nan"))
    ours()
    torch.cuda.synchronize()
    qs = q.transpose(0, 1).unsqueeze(0)
    ks = k.transpose(0, 1).unsqueeze(0)
    vs = v.transpose(0, 1).unsqueeze(0)
    qs, ks, vs = qs.contiguous(), ks.contiguous(), vs.contiguous()

    def sdpa():
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    ref = sdpa()[0].transpose(0, 1).float()  # [n, HQ, D]
    rel = float((o - ref).norm() / ref.norm())
    finite = bool(torch.isfinite(o).all())
    backend = sdpa_backend(sdpa)
    t_ours = timeit(ours, reps)
    t_sdpa = timeit(sdpa, reps)
    flops = 2.0 * n * n * D * HQ  # causal: half of 4·N²·d per head
    rec = {"N": n, "ours_ms": t_ours[0], "ours_minmax": t_ours[1:], "sdpa_ms": t_sdpa[0],
           "sdpa_minmax": t_sdpa[1:], "ours_TFLOPs": flops / t_ours[0] / 1e9,
           "sdpa_TFLOPs": flops / t_sdpa[0] / 1e9, "rel_vs_sdpa": rel, "finite": finite,
           "sdpa_kernel": backend}
    # MF_CORE_PVWAIT=1 (the P·V wait after the softmax): O bit for bit, then interleaved
    # with the default (drift hits both alike)
    pvw = {"MF_CORE_PVWAIT": "1"}
    o_def = o.clone()
    o.fill_(float("nan"))
    with_env(pvw, ours)
    torch.cuda.synchronize()
    rec["pvw_same_as_ours"] = bool(torch.equal(o, o_def))
    del o_def
    ab = interleaved({"ours": ({}, ours), "ours_pvw": (pvw, ours)}, 3 * reps)
    rec["ab_ours_ms"], rec["ab_ours_pvw_ms"] = ab["ours"], ab["ours_pvw"]
    log(f"interleaved dense N={n}: ours {ab['ours']:.3f} ms, ours+pvwait {ab['ours_pvw']:.3f}"
        f" ({ab['ours_pvw'] / ab['ours']:.3f}); pvwait bits = ours {rec['pvw_same_as_ours']}")
    rec.update(dense_apply(lib, q, k, v, o, ref, reps))
    log(json.dumps(rec))
    del q, k, v, o, lse, qs, ks, vs, ref
    torch.cuda.empty_cache()
    return rec


def mass_variants_ab(fused, dense, o, lse, mass, variants, rounds, reps):
    """The mass bookkeepings A/B (MF_MASS_VARIANT): each variant's outputs against v2's
    (bit-equal O / LSE, masses: differing words and max |diff|), then the fused ms of each
    and the dense core's, interleaved over rounds (median of the round medians)."""
    def run(v):
        o.fill_(float("nan"))
        mass.fill_(float("nan"))
        with_env({"MF_MASS_VARIANT": v}, fused)
        torch.cuda.synchronize()
        return o.clone(), lse.clone(), mass.clone()
    o2, lse2, mass2 = run("v2")
    out = {}
    for v in variants:
        ov, lv, mv = (o2, lse2, mass2) if v == "v2" else run(v)
        out[v] = {"o_same": bool(torch.equal(ov, o2)), "lse_same": bool(torch.equal(lv, lse2)),
                  "mass_words_differ": int((mv.view(torch.int32) != mass2.view(torch.int32))
                                           .sum()),
                  "mass_maxdiff_v2": float((mv - mass2).abs().max()),
                  "finite": bool(torch.isfinite(mv).all()), "ms_rounds": []}
        del ov, lv, mv
    del o2, lse2, mass2
    dense_rounds = []
    for _ in range(rounds):
        dense_rounds.append(timeit(dense, reps)[0])
        for v in variants:
            out[v]["ms_rounds"].append(with_env({"MF_MASS_VARIANT": v},
                                                lambda: timeit(fused, reps))[0])
    dense_ms = float(np.median(dense_rounds))
    for v in variants:
        out[v]["ms"] = float(np.median(out[v]["ms_rounds"]))
        out[v]["over_dense"] = out[v]["ms"] / dense_ms
    base = out.get("v2", {}).get("ms")
    for v in variants:
        out[v]["over_v2"] = out[v]["ms"] / base if base else None
    return {"variants": out, "variants_dense_ms": dense_ms, "variants_dense_rounds": dense_rounds}


def apply_args_pair(rows, n_rows, lm, q, k, v, o):
    """(fp32-O args into o, the same args with O in bf16 into a new tensor, that tensor): the
    two forms every apply case times (the bf16 call) and checks (the fp32 one)."""
    n = q.shape[0]
    a32 = BG.ApplyArgs(rows, n_rows, C.pointer(lm),
                       BG.Qkv(q.data_ptr(), k.data_ptr(), v.data_ptr(), 2, n, HQ, HKV, D), B,
                       None, 0, 0, o.data_ptr(), None)
    ot = torch.empty(n, HQ, D, dtype=torch.bfloat16, device="cuda")
    a = BG.ApplyArgs.from_buffer_copy(a32)
    a.o, a.o_dtype = ot.data_ptr(), BG.K.BF16
    return a32, a, ot


def dense_apply(lib, q, k, v, o, ref, reps):
    """The dense layer as a target calls it: mf_apply_cuda with every head in compute mode
    and no rows (the core's lists, every j ≤ i), O in the model's dtype (o_dtype = bf16:
    "apply_t_ms", and its rel err vs SDPA) and, for comparison, fp32 O alone and with the
    model's cast after it; the bf16 O must be the fp32 O rounded to nearest."""
    w = np.ones((HQ, 1), dtype=np.float32)
    modes = np.zeros(HQ, dtype=np.uint8)  # MF_HEAD_COMPUTE
    lm = BG.LayerMap(HQ, 1, w.ctypes.data, modes.ctypes.data, None)
    a32, a, ot = apply_args_pair(None, 0, lm, q, k, v, o)
    why = C.c_char_p()
    stream = torch.cuda.current_stream().cuda_stream

    def call(args):
        st = lib.mf_apply_cuda_impl(C.byref(args), IMPL_CORE, stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_apply_cuda (compute) {st} {why.value}")

    o.fill_(float("nan"))
    ot.fill_(float("nan"))
    call(a32)
    call(a)
    torch.cuda.synchronize()
    rec = {"apply_t_differ_from_rn": int((ot.view(torch.int16) != o.to(
               torch.bfloat16).view(torch.int16)).sum()),
           "apply_t_rel_vs_sdpa": float((ot.float() - ref).norm() / ref.norm())}
    rec.update(o_dtype_ab(lambda: call(a), lambda: call(a32), o, reps, "apply"))
    rec["apply_t_ms"] = rec["apply_t_ab_ms"]
    del ot
    return rec


def bench_masses(lib, n, hq, hkv, reps, log, variants=(), rounds=3):
    import bench_torch as BT
    nb = n // B
    q, k = BT.structured_qk(n, hq, hkv, D)
    v = torch.randn(n, hkv, D, dtype=torch.bfloat16, device="cuda")
    o = torch.empty(n, hq, D, dtype=torch.float32, device="cuda")
    lse = torch.empty(hq, n, dtype=torch.float32, device="cuda")
    mass = torch.empty(hq, nb, nb, dtype=torch.float32, device="cuda")
    xmass = torch.empty(hq, nb, nb, dtype=torch.float32, device="cuda")
    scr_n = lib.mf_attention_masses_scratch(n)
    scr = torch.empty(scr_n + 256, dtype=torch.uint8, device="cuda")
    scr_p = (scr.data_ptr() + 255) // 256 * 256
    t = BG.Qkv(q.data_ptr(), k.data_ptr(), v.data_ptr(), 2, n, hq, hkv, D)
    why = C.c_char_p()
    stream = torch.cuda.current_stream().cuda_stream

    def fused():
        st = lib.mf_attention_masses_cuda(C.byref(t), B, o.data_ptr(), lse.data_ptr(),
                                          mass.data_ptr(), scr_p, scr_n, stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_attention_masses_cuda {st} {why.value}")

    def dense():
        st = lib.mf_attention_dense_cuda(C.byref(t), o.data_ptr(), lse.data_ptr(), stream,
                                         C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_attention_dense_cuda {st} {why.value}")
    qs = q.transpose(0, 1).unsqueeze(0).contiguous()
    ks = k.transpose(0, 1).unsqueeze(0).contiguous()
    vs = v.transpose(0, 1).unsqueeze(0).contiguous()

    def sdpa():
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    # extract, MASK codec, LSE given (ours: the same LSE the dense op returns, to fp32)
    tokens = np.arange(n, dtype=np.uint32)
    caps = [R.layout(R.MASK, B, i + 1, hq * (i + 1), 3)["total"] for i in range(nb)]
    rb = BT.RowBuffers(caps)
    buf, sizes, failed, rows, capa, offs = rb.buf, rb.sizes, rb.failed, rb.rows, rb.capa, rb.offs
    lse_x = torch.empty(hq, n, dtype=torch.float32, device="cuda")
    a = BG.ExtractArgs(t, lse_x.data_ptr(), B, 0.9, R.MASK, 0, nb, b"src", b"bench", 0,
                       tokens.ctypes.data, C.cast(rows, C.c_void_p), C.cast(capa, C.c_void_p),
                       sizes.data_ptr(), failed.data_ptr(), xmass.data_ptr())

    def extract():
        st = lib.mf_extract_cuda(C.byref(a), stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_extract_cuda {st} {why.value}")
    # today's path as a user has it: SDPA returns no LSE, so extract computes it
    a_nolse = BG.ExtractArgs.from_buffer_copy(a)
    a_nolse.lse = None
    a_nolse.mass_out = None

    def extract_nolse():
        st = lib.mf_extract_cuda(C.byref(a_nolse), stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_extract_cuda (LSE computed) {st} {why.value}")
    xa = None
    if hasattr(lib, "mf_export_cuda"):
        xb = BT.RowBuffers(caps)
        xbuf, xsizes, xfailed, xrows = xb.buf, xb.sizes, xb.failed, xb.rows
        xo = torch.empty(n, hq, D, dtype=torch.float32, device="cuda")
        xlse = torch.empty(hq, n, dtype=torch.float32, device="cuda")
        xmass_out = torch.empty(hq, nb, nb, dtype=torch.float32, device="cuda")
        # everything preallocated, as the fused masses call above gets it
        xa = ExportArgs(BG.ExtractArgs.from_buffer_copy(a), xo.data_ptr(), xlse.data_ptr(),
                        xmass_out.data_ptr(), scr_p, scr_n)
        xa.ex.lse = None
        xa.ex.mass_out = None
        xa.ex.rows = C.cast(xrows, C.c_void_p)
        xa.ex.sizes = xsizes.data_ptr()
        xa.ex.failed_block = xfailed.data_ptr()

    def export():
        st = lib.mf_export_cuda(C.byref(xa), stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_export_cuda {st} {why.value}")
    xa_t = xo_t = None
    if xa is not None:  # O in the model's dtype from the epilogue (o_dtype), as the source uses it
        xo_t = torch.empty(n, hq, D, dtype=torch.bfloat16, device="cuda")
        xa_t = ExportArgs.from_buffer_copy(xa)
        xa_t.o = xo_t.data_ptr()
        xa_t.o_dtype = BG.K.BF16

    def export_t():
        st = lib.mf_export_cuda(C.byref(xa_t), stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_export_cuda (O bf16) {st} {why.value}")

    def export_cast():  # the hand-off before o_dtype: fp32 O, then the model's cast
        export()
        return xo.to(torch.bfloat16)
    o.fill_(float("nan"))
    mass.fill_(float("nan"))
    fused()
    torch.cuda.synchronize()
    lse_x.copy_(lse)
    extract()
    torch.cuda.synchronize()
    ref = sdpa()[0].transpose(0, 1).float()
    rec = {"N": n, "Hq": hq, "Hkv": hkv,
           "rel_vs_sdpa": float((o - ref).norm() / ref.norm()),
           "finite": bool(torch.isfinite(o).all() and torch.isfinite(mass).all()),
           "mass_vs_extract_maxdiff": float((mass - xmass).abs().max()),
           "extract_failed": int(failed.item()) & 0xffffffff}
    if xa is not None:
        xo.fill_(float("nan"))
        xbuf.fill_(0xa5)
        export()
        torch.cuda.synchronize()
        rec["export_failed"] = int(xfailed.item()) & 0xffffffff
        rec["export_rel_vs_sdpa"] = float((xo - ref).norm() / ref.norm())
        rec["export_lse_vs_fused_maxdiff"] = float((xlse - lse).abs().max())
        rec["export_mass_vs_fused_maxdiff"] = float((xmass_out - mass).abs().max())
        rec["export_rows_bad"] = rows_bad(lib, xbuf, xsizes, offs)
        rec["export_rows_same_as_extract"] = sum(
            int(torch.equal(xbuf[x:x + int(sz)], buf[x:x + int(sz)]))
            for x, sz in zip(offs, xsizes.tolist()))
        xo_t.fill_(float("nan"))
        export_t()
        torch.cuda.synchronize()
        # the epilogue's bf16 O is the fp32 O rounded to nearest, element for element
        rec["export_t_differ_from_rn"] = int((xo_t != xo.to(torch.bfloat16)).sum())
    del ref
    if variants:
        rec.update(mass_variants_ab(fused, dense, o, lse, mass, variants, rounds, reps))
    rec["fused_ms"] = timeit(fused, reps)[0]
    rec["dense_ms"] = timeit(dense, reps)[0]
    rec["sdpa_ms"] = timeit(sdpa, reps)[0]
    rec["extract_ms"] = timeit(extract, reps)[0]
    rec["extract_nolse_ms"] = timeit(extract_nolse, reps)[0]
    if xa is not None:
        rec["export_ms"] = timeit(export, reps)[0]
        rec["export_over_sdpa"] = rec["export_ms"] / rec["sdpa_ms"]
        rec["today_over_export"] = (rec["sdpa_ms"] + rec["extract_nolse_ms"]) / rec["export_ms"]
        rec["export_cast_ms"] = timeit(export_cast, reps)[0]
        rec["export_t_ms"] = timeit(export_t, reps)[0]
        rec["export_t_over_sdpa"] = rec["export_t_ms"] / rec["sdpa_ms"]
        # extract's scratch per call and its constants from pageable memory (before the cache)
        nocache = {"MF_EXTRACT_CACHE": "0"}
        rec["export_t_nocache_ms"] = with_env(nocache, lambda: timeit(export_t, reps))[0]
        rec["export_t_nocache_wall_ms"] = with_env(nocache,
                                                   lambda: wall_to_done(export_t, reps))
        rec["export_t_wall_ms"] = wall_to_done(export_t, reps)
        rec["export_t_host_us"] = host_wall(export_t, reps)
        rec["export_t_nocache_host_us"] = with_env(nocache, lambda: host_wall(export_t, reps))
        rec.update(bench_rows_copy(xbuf, xsizes, offs, reps))
    flops = 2.0 * n * n * D * hq
    for x in rec.get("variants", {}).values():
        x["over_sdpa"] = x["ms"] / rec["sdpa_ms"]
        x["TFLOPs"] = flops / x["ms"] / 1e9
    rec["fused_TFLOPs"] = flops / rec["fused_ms"] / 1e9
    rec["sdpa_TFLOPs"] = flops / rec["sdpa_ms"] / 1e9
    rec["sdpa_over_fused"] = rec["sdpa_ms"] / rec["fused_ms"]
    rec["today_over_fused"] = (rec["sdpa_ms"] + rec["extract_ms"]) / rec["fused_ms"]
    log(json.dumps(rec))
    del q, k, v, o, lse, mass, xmass, scr, qs, ks, vs, buf, lse_x
    if xa is not None:
        del xbuf, xo, xlse, xmass_out, xo_t
    torch.cuda.empty_cache()
    return rec


def wall_to_done(fn, reps):
    """Median wall ms of fn() and a device synchronisation (host work and launch gaps
    included, unlike the CUDA-event times; host_wall below times the host part alone)."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def bench_rows_copy(buf, sizes, offs, reps):
    """A layer's exported rows into a region-like buffer (rows packed in a shuffled order):
    mf_rows_copy_cuda (one launch) vs one torch copy a row (the hand-off's put path before
    it), both on a side stream as the put thread runs them; wall ms to the copy's end, and
    whether the bytes arrived."""
    K = BG.K
    sz = [int(z) for z in sizes.tolist()]
    order = np.random.default_rng(len(sz)).permutation(len(sz))
    dst_off, at = [0] * len(sz), 0
    for x in order:
        dst_off[x] = at
        at += (sz[x] + 15) // 16 * 16
    dst = torch.zeros(at, dtype=torch.uint8, device="cuda")
    d_ptr = [dst.data_ptr() + o for o in dst_off]
    s_ptr = [buf.data_ptr() + o for o in offs]
    side = torch.cuda.Stream()

    def one_launch():
        K.rows_copy_cuda(d_ptr, s_ptr, sz, stream=side)
        side.synchronize()

    def per_row():
        with torch.cuda.stream(side):
            for x in range(len(sz)):
                dst[dst_off[x]:dst_off[x] + sz[x]].copy_(buf[offs[x]:offs[x] + sz[x]])
        side.synchronize()
    one_launch()
    same = sum(int(torch.equal(dst[dst_off[x]:dst_off[x] + sz[x]], buf[offs[x]:offs[x] + sz[x]]))
               for x in range(len(sz)))
    rec = {"rows_copy_rows": len(sz), "rows_copy_bytes": sum(sz), "rows_copy_same": same,
           "rows_copy_wall_ms": wall_to_done(one_launch, reps),
           "rows_copy_per_row_wall_ms": wall_to_done(per_row, reps)}
    del dst
    return rec


def kept_sets(buf, sizes, offs, hq, nb):
    """keep [Hq, nb, nb] bool of MASK rows in buf (device), read from their head masks."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "quality"))
    import blocksel  # the rows' parser, NumPy only
    host = buf.cpu().numpy()
    return blocksel.parse_row_list([host[o:o + int(z)] for o, z in zip(offs, sizes.tolist())],
                                   hq, nb)[0]


def bench_strided(lib, n, hq, hkv, strides, reps, log, inputs="structured"):
    """The strided-sample extract at each stride vs cuDNN dense alone (see the module doc)."""
    nb = n // B
    if inputs == "structured":
        q, k = BT.structured_qk(n, hq, hkv, D)
    else:
        q = torch.randn(n, hq, D, device="cuda").to(torch.bfloat16)
        k = torch.randn(n, hkv, D, device="cuda")
        k[torch.randint(0, n, (16,), device="cuda")] *= 3
        k = k.to(torch.bfloat16)
    v = torch.randn(n, hkv, D, dtype=torch.bfloat16, device="cuda")
    qs = q.transpose(0, 1).unsqueeze(0).contiguous()
    ks = k.transpose(0, 1).unsqueeze(0).contiguous()
    vs = v.transpose(0, 1).unsqueeze(0).contiguous()

    def sdpa():
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    t = BG.Qkv(q.data_ptr(), k.data_ptr(), v.data_ptr(), 2, n, hq, hkv, D)
    why = C.c_char_p()
    stream = torch.cuda.current_stream().cuda_stream
    # the LSE an engine returns with O (the same function; our dense core computes it here)
    o = torch.empty(n, hq, D, dtype=torch.float32, device="cuda")
    lse = torch.empty(hq, n, dtype=torch.float32, device="cuda")
    if lib.mf_attention_dense_cuda(C.byref(t), o.data_ptr(), lse.data_ptr(), stream,
                                   C.byref(why)) != 0:
        raise RuntimeError(f"mf_attention_dense_cuda: {why.value}")
    del o
    tokens = np.arange(n, dtype=np.uint32)
    caps = [R.layout(R.MASK, B, i + 1, hq * (i + 1), 3)["total"] for i in range(nb)]
    mass = torch.empty(hq, nb, nb, dtype=torch.float32, device="cuda")
    rec = {"N": n, "Hq": hq, "Hkv": hkv, "inputs": inputs, "sdpa_ms": timeit(sdpa, reps)[0],
           "sdpa_kernel": sdpa_backend(sdpa), "strides": []}
    exact = exact_mass = None
    for st in sorted(set(strides) | {1}, key=lambda x: (x != 1, x)):  # 1 first: the truth
        rb = BT.RowBuffers(caps)
        off = st // 2
        a = BG.ExtractArgs(t, lse.data_ptr(), B, 0.9, R.MASK, 0, nb, b"src", b"bench", 0,
                           tokens.ctypes.data, C.cast(rb.rows, C.c_void_p),
                           C.cast(rb.capa, C.c_void_p), rb.sizes.data_ptr(),
                           rb.failed.data_ptr(), mass.data_ptr(),
                           BG.K.EXTRACT_SAMPLE if st > 1 else 0, st, off)

        def extract():
            if lib.mf_extract_cuda(C.byref(a), stream, C.byref(why)) != 0:
                raise RuntimeError(f"mf_extract_cuda stride {st}: {why.value}")
        rb.buf.fill_(0xa5)
        mass.fill_(float("nan"))
        extract()
        torch.cuda.synchronize()
        r = {"stride": st, "offset": off, "failed": int(rb.failed.item()) & 0xffffffff,
             "rows_bad": rows_bad(lib, rb.buf, rb.sizes, rb.offs),
             "mass_finite": bool(torch.isfinite(mass).all())}
        keep = kept_sets(rb.buf, rb.sizes, rb.offs, hq, nb)
        if st == 1:
            exact, exact_mass = keep, mass.double().cpu().numpy()
        n_exact = int(exact.sum())
        r["recall"] = float((keep & exact).sum()) / n_exact
        r["density_ratio"] = float(keep.sum()) / n_exact
        r["density"] = float(keep.sum()) / (hq * nb * (nb + 1) / 2)
        r["mass_cover"] = float(exact_mass[keep].sum() / exact_mass[exact].sum())
        a.mass_out = None  # timed as a source runs it
        r["extract_ms"] = timeit(extract, reps)[0]
        r["extra_over_cudnn"] = r["extract_ms"] / rec["sdpa_ms"]
        rec["strides"].append(r)
        del rb
    log(json.dumps(rec))
    del q, k, v, qs, ks, vs, lse, mass
    torch.cuda.empty_cache()
    return rec


def strided_table(res, log):
    if not res.get("strided"):
        return
    log("\n| N | Hq/Hkv | inputs | stride | extract ms (MASK, LSE given) | cuDNN dense ms |"
        " extract/cuDNN | vs stride 1 | kept-set recall | density ratio | exact mass covered |"
        " density | rows bad |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["strided"]:
        one = next((x for x in r["strides"] if x["stride"] == 1), None)
        for x in r["strides"]:
            rel1 = one["extract_ms"] / x["extract_ms"] if one else float("nan")
            log(f"| {r['N']} | {r['Hq']}/{r['Hkv']} | {r['inputs']} | {x['stride']} "
                f"(+{x['offset']}) | {x['extract_ms']:.3f} | {r['sdpa_ms']:.3f} | "
                f"{x['extra_over_cudnn']:.3f} | "
                f"{rel1:.2f}x faster | {x['recall']:.4f} | {x['density_ratio']:.3f} | "
                f"{x['mass_cover']:.4f} | {x['density']:.3f} | {x['rows_bad']} "
                f"(failed {x['failed']:#x}) |")
    log("cuDNN kernel: " + res["strided"][0]["sdpa_kernel"])


def rows_bad(lib, buf, sizes, offs):
    """How many of the rows in buf (device) fail mf_row_decode (structure + xxh3 seal)."""
    host = buf.cpu().numpy()
    view = BG.K.RowView()
    why = C.c_char_p()
    bad = 0
    for off, sz in zip(offs, sizes.tolist()):
        if not 0 < sz <= len(host) - off:
            bad += 1
            continue
        if lib.mf_row_decode(host.ctypes.data + off, int(sz), 0, C.byref(view),
                             C.byref(why)) != 0:
            bad += 1
    return bad


def flex_masks(keep, n, b):
    """BlockMasks for flex on the kept pairs keep[h, i, j] (64-blocks): BLOCK_SIZE 64 (full
    below the diagonal, the diagonal partial) and 128 (a 128-block is full when its four
    64-blocks are kept and below the diagonal, partial when any is kept)."""
    from torch.nn.attention.flex_attention import BlockMask
    h, nb, _ = keep.shape
    dev = torch.from_numpy(keep).cuda()
    out = {}
    ii = torch.arange(nb, device="cuda")
    full = dev & (ii[None, None, :] < ii[None, :, None])

    def causal(bb, hh, qi, ki):
        return qi >= ki

    def kv_lists(full_b, part_b):
        fn = full_b.sum(-1).to(torch.int32)[None]
        fi = torch.argsort((~full_b).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None]
        pn = part_b.sum(-1).to(torch.int32)[None]
        pi = torch.argsort((~part_b).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None]
        return pn, pi, fn, fi
    pn, pi, fn, fi = kv_lists(full, dev & ~full)
    out[64] = BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=b, mask_mod=causal)
    nb2 = (nb + 1) // 2
    pad = torch.zeros(h, 2 * nb2, 2 * nb2, dtype=torch.bool, device="cuda")
    pad[:, :nb, :nb] = dev
    q4 = pad.view(h, nb2, 2, nb2, 2)
    any2 = q4.any(4).any(2)
    jj = torch.arange(nb2, device="cuda")
    all2 = q4.all(4).all(2) & (jj[None, None, :] < jj[None, :, None])
    table = dev  # mask_mod: the exact 64-block pattern, causal

    def pattern(bb, hh, qi, ki):
        return (qi >= ki) & table[hh, qi // b, ki // b]
    pn, pi, fn, fi = kv_lists(all2, any2 & ~all2)
    out[128] = BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=2 * b, mask_mod=pattern)
    return out


NCU = False  # --ncu


def bench_mask(lib, n, dens, reps, rng, flex, log):
    """The mask table's case; "core" there is core_kernel (one CTA a tile, MF_CORE_PERSIST=0),
    the product's default persistent kernel its "persistent" A/B column."""
    return with_env({"MF_CORE_PERSIST": "0"},
                    lambda: _bench_mask(lib, n, dens, reps, rng, flex, log))


def _bench_mask(lib, n, dens, reps, rng, flex, log):
    nb = n // B
    keep = R.patterns(rng, HQ, nb, dens)
    kept = float(keep.sum())
    per_head = kept / (HQ * nb * (nb + 1) / 2)
    q, k, v, o = BT.random_qkvo(n, HQ, HKV, D)
    prefixes = [R.row_prefix(keep, i, R.MASK, B, rng=rng) for i in range(nb)]
    offs, tot = [], 0
    for _, lay in prefixes:
        offs.append(tot)
        tot += R.align16(lay["total"])
    host = np.zeros(tot, dtype=np.uint8)
    for (pre, lay), off in zip(prefixes, offs):
        host[off:off + len(pre)] = np.frombuffer(pre, dtype=np.uint8)
        R.seal(host[off:off + lay["total"]])
    buf = torch.from_numpy(host).cuda()
    ptrs = (C.c_void_p * nb)(*[buf.data_ptr() + x for x in offs])
    w = np.eye(HQ, dtype=np.float32)
    modes = np.full(HQ, 2, dtype=np.uint8)
    tps = np.ones(HQ, dtype=np.float32)
    lm = BG.LayerMap(HQ, HQ, w.ctypes.data, modes.ctypes.data, tps.ctypes.data)
    # timed as the target calls it: O in the model's dtype (o_dtype = bf16, from the
    # kernels' epilogues); a32 writes fp32 O, for the accuracy checks and the fp32 column
    a32, a, ot = apply_args_pair(C.cast(ptrs, C.c_void_p), nb, lm, q, k, v, o)
    why = C.c_char_p()
    stream = torch.cuda.current_stream().cuda_stream
    flops = kept * 4 * B * B * D
    rec = {"N": n, "density": per_head, "kept_blocks": kept, "TFLOP": flops / 1e12,
           "o_dtype": "bf16"}

    def apply_call(args, impl, name):
        st = lib.mf_apply_cuda_impl(C.byref(args), impl, stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_apply_cuda {name} {st} {why.value}")
    outs = {}
    for name, impl in (("core", IMPL_CORE), ("v2", IMPL_V2)):
        def call():
            apply_call(a, impl, name)
        o.fill_(float("nan"))
        apply_call(a32, impl, name)
        ot.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        outs[name] = o.clone()
        # the bf16 O is the same path's fp32 O rounded to nearest, element for element
        rec[name + "_t_differ_from_rn"] = int((ot.view(torch.int16) != o.to(
            torch.bfloat16).view(torch.int16)).sum())
        t = timeit(call, reps)
        rec[name + "_ms"] = t[0]
        rec[name + "_TFLOPs"] = flops / t[0] / 1e9
    rec["core_finite"] = bool(torch.isfinite(outs["core"]).all())
    rec["core_rel_vs_v2"] = float((outs["core"] - outs["v2"]).norm() / outs["v2"].norm())
    def core_call():
        apply_call(a, IMPL_CORE, "core")

    def ab_run():  # under an A/B switch: the fp32 O (checks) and the bf16 call's median ms
        o.fill_(float("nan"))
        apply_call(a32, IMPL_CORE, "core fp32")
        torch.cuda.synchronize()
        return o.clone(), timeit(core_call, reps)[0]
    if NCU:  # one call per kernel variant inside an NVTX range, for ncu --nvtx-include ncu/
        for tag, env in (("core", {"MF_CORE_PERSIST": "0"}),
                         ("core_pvw", {"MF_CORE_PERSIST": "0", "MF_CORE_PVWAIT": "1"}),
                         ("persist", {"MF_CORE_PERSIST": "1"}),
                         ("persist_pvw", {"MF_CORE_PERSIST": "1", "MF_CORE_PVWAIT": "1"}),
                         ("persist240", {"MF_CORE_PERSIST": "1",
                                         "MF_CORE_PERSIST_REGS240": "1"})):
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("ncu")  # one range name: ncu tells the variants apart by
            log(f"ncu: {tag} N={n} density {per_head:.3f}")  # kernel name and order
            with_env(env, core_call)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        return rec
    # A/B 1: block-64 lists on the 64-key-tile kernel (no gather)
    gather_off = {"MF_CORE_GATHER": "0"}
    ob, rec["bn64_ms"] = with_env(gather_off, ab_run)
    rec["bn64_TFLOPs"] = flops / rec["bn64_ms"] / 1e9
    rec["bn64_rel_vs_v2"] = float((ob - outs["v2"]).norm() / outs["v2"].norm())
    rec["bn64_phase_core_ms"] = with_env(dict(gather_off, MF_APPLY_PHASE="core"),
                                         lambda: timeit(core_call, reps))[0]
    # A/B 2: the persistent gathered kernel (same tile math: O bit for bit the core's)
    persist = {"MF_CORE_PERSIST": "1"}
    op, rec["persist_ms"] = with_env(persist, ab_run)
    rec["persist_TFLOPs"] = flops / rec["persist_ms"] / 1e9
    rec["persist_same_as_core"] = bool(torch.equal(op, outs["core"]))
    rec["persist_phase_core_ms"] = with_env(dict(persist, MF_APPLY_PHASE="core"),
                                            lambda: timeit(core_call, reps))[0]
    # A/B 3, interleaved (core, core + PVWAIT, persistent 40 / 232, the same + PVWAIT,
    # persistent 24 / 240 in turn, each rep timed alone): sequential medians of one variant
    # after another moved by up to 7 % from run to run with the card's clocks (gpu-core.md
    # §10 / §11), more than the variants differ. PVWAIT: the same math, O bit for bit
    pvw = {"MF_CORE_PVWAIT": "1"}
    abv = {"core": {}, "core_pvw": pvw, "persist": persist, "persist_pvw": dict(persist, **pvw),
           "persist240": dict(persist, MF_CORE_PERSIST_REGS240="1")}
    for k in ("core_pvw", "persist_pvw", "persist240"):
        rec[f"{k}_same_as_core"] = bool(torch.equal(with_env(abv[k], ab_run)[0], outs["core"]))
    ab = interleaved({k: (e, core_call) for k, e in abv.items()}, 3 * reps)
    for k, t in ab.items():
        rec[f"ab_{k}_ms"] = t
    log(f"interleaved N={n} density {per_head:.3f}: core {ab['core']:.3f} ms, core+pvwait "
        f"{ab['core_pvw']:.3f} ({ab['core_pvw'] / ab['core']:.3f}), persistent "
        f"{ab['persist']:.3f} ({ab['persist'] / ab['core']:.3f}), persistent+pvwait "
        f"{ab['persist_pvw']:.3f} ({ab['persist_pvw'] / ab['persist']:.3f} of persistent), "
        f"24/240 {ab['persist240']:.3f}; bits = core: pvwait {rec['core_pvw_same_as_core']}, "
        f"persistent+pvwait {rec['persist_pvw_same_as_core']}, 24/240 "
        f"{rec['persist240_same_as_core']}")
    del op
    del ob
    rec.update(o_dtype_ab(core_call, lambda: apply_call(a32, IMPL_CORE, "core fp32"), o,
                          reps, "core"))
    log(f"O dtype N={n} density {per_head:.3f}: bf16 {rec['core_t_ab_ms']:.3f} ms, fp32 "
        f"{rec['core_f32_ms']:.3f}, fp32 + cast {rec['core_f32_cast_ms']:.3f}")
    rec.update(phase_split(lib, core_call, reps))
    rec.update(union_waste(keep))
    if flex is not None:
        qs = q.transpose(0, 1).unsqueeze(0).contiguous()
        ks = k.transpose(0, 1).unsqueeze(0).contiguous()
        vs = v.transpose(0, 1).unsqueeze(0).contiguous()
        try:
            bms = flex_masks(keep, n, B)
            for bs, opts in ((128, None), (64, {"BLOCK_M": 64, "BLOCK_N": 64})):
                try:
                    def fn():
                        return flex(qs, ks, vs, block_mask=bms[bs], enable_gqa=True,
                                    kernel_options=opts)
                    ref = fn()[0].transpose(0, 1).float()
                    rec[f"flex{bs}_rel_vs_core"] = float((outs["core"] - ref).norm() /
                                                         ref.norm())
                    del ref
                    rec[f"flex{bs}_ms"] = timeit(fn, reps)[0]
                except Exception as ex:  # noqa: BLE001
                    log(f"flex {bs} N={n}: {str(ex)[:300]}")
        except Exception as ex:  # noqa: BLE001
            log(f"flex masks N={n}: {str(ex)[:300]}")
        del qs, ks, vs
    log(json.dumps(rec))
    del q, k, v, o, ot, buf, outs
    torch.cuda.empty_cache()
    return rec


def o_dtype_ab(call_t, call_f32, o32, reps, key):
    """O in bf16 (call_t) against fp32 O (call_f32, writing o32) alone and followed by the
    model's cast, interleaved (the clocks' drift is larger than the difference):
    {key}_t_ab_ms, {key}_f32_ms, {key}_f32_cast_ms and the savings, bf16 call vs fp32 call
    ({key}_o_saved_ms) and vs fp32 + cast ({key}_o_saved_vs_cast_ms)."""
    def f32_cast():
        call_f32()
        return o32.to(torch.bfloat16)
    ab = interleaved({"t": ({}, call_t), "f32": ({}, call_f32), "f32_cast": ({}, f32_cast)},
                     3 * reps)
    return {f"{key}_t_ab_ms": ab["t"], f"{key}_f32_ms": ab["f32"],
            f"{key}_f32_cast_ms": ab["f32_cast"], f"{key}_o_saved_ms": ab["f32"] - ab["t"],
            f"{key}_o_saved_vs_cast_ms": ab["f32_cast"] - ab["t"]}


def interleaved(variants, reps, warm=2):
    """Median ms of each variant {name: (env, fn)}, the variants called in turn rep by rep
    (each call timed alone with CUDA events), so drift in the card's clocks hits all alike."""
    ts = {k: [] for k in variants}
    for r in range(warm + reps):
        for k, (env, fn) in variants.items():
            def one():
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                return s.elapsed_time(e)
            t = with_env(env, one)
            if r >= warm:
                ts[k].append(t)
    return {k: float(np.median(v)) for k, v in ts.items()}


def with_env(env, fn):
    """fn() with the environment variables env set (None: unset), restored after."""
    old = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def host_wall(fn, reps):
    """Median µs of fn() on the host (perf_counter), the stream idle before each call and
    synchronised after it (nothing inside fn waits for the device)."""
    ts = []
    for _ in range(reps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return statistics.median(ts[2:]) * 1e6


def phase_split(lib, call, reps):
    """Where one mask-apply call's time goes (the lib's bench switches, kernels/
    mapflow_kernels_cuda.h): CUDA-event ms of the call with only the pre-pass queued
    (MF_APPLY_PHASE=prepass), only the core (=core, on the bitmaps the previous call left in
    the cached scratch), no launch at all (=none: the host work and the constants copy);
    the host wall of the whole call (µs) and of a trivial ctypes call into the library
    (mf_cuda_supported: Python + ctypes alone); the same with MF_APPLY_CACHE=0 (the per-call
    cudaMallocAsync + pageable copy this cache replaced); the pre-pass of before
    (MF_APPLY_PREPASS=v1) alone and in the call; and the call with both (= before)."""
    out = {}
    call()  # the bitmaps the core phase reads
    torch.cuda.synchronize()
    for ph in ("prepass", "core", "none"):
        out[f"phase_{ph}_ms"] = with_env({"MF_APPLY_PHASE": ph}, lambda: timeit(call, reps))[0]
    out["host_wall_us"] = host_wall(call, reps)
    why = C.c_char_p()
    out["ctypes_wall_us"] = host_wall(
        lambda: lib.mf_cuda_supported(B, D, 2, 1 << 15, C.byref(why)), reps)
    nocache = {"MF_APPLY_CACHE": "0"}
    out["nocache_ms"] = with_env(nocache, lambda: timeit(call, reps))[0]
    out["nocache_none_ms"] = with_env(dict(nocache, MF_APPLY_PHASE="none"),
                                      lambda: timeit(call, reps))[0]
    out["nocache_host_wall_us"] = with_env(nocache, lambda: host_wall(call, reps))
    v1 = {"MF_APPLY_PREPASS": "v1"}
    out["prepass_v1_ms"] = with_env(dict(v1, MF_APPLY_PHASE="prepass"),
                                    lambda: timeit(call, reps))[0]
    out["v1_ms"] = with_env(v1, lambda: timeit(call, reps))[0]
    # the call as it was before this commit: per-call scratch and the old pre-pass
    out["before_ms"] = with_env(dict(v1, **nocache), lambda: timeit(call, reps))[0]
    return out


def union_waste(keep):
    """The core's 128-row tiles pair 64-blocks 2m, 2m + 1 and walk the union of their kept
    sets; a warpgroup masks whole the tiles only its partner kept. keep[h, i, j] is exactly
    what the pre-pass writes here (W = identity, top_p 1, the pattern has blocks 0 and i),
    so these counts are the kernel's: warpgroup-tiles walked, of them masked whole; and the
    gathered 128-key tiles' phantom halves (one per odd union) among the halves computed."""
    h, nb, _ = keep.shape
    a = keep[:, 0:nb - nb % 2:2, :]
    b = keep[:, 1:nb - nb % 2:2, :]
    u = a | b
    walked = 2 * int(u.sum())
    masked = int((u & ~a).sum() + (u & ~b).sum())
    counts = u.sum(axis=2)
    if nb % 2:  # the last block alone: its partner row is empty, the other warpgroup idles
        walked += 2 * int(keep[:, nb - 1, :].sum())
        masked += int(keep[:, nb - 1, :].sum())
        counts = np.concatenate([counts, keep[:, nb - 1, :].sum(axis=1)[:, None]], axis=1)
    phantoms = int((counts % 2).sum())
    return {"wg_tiles_walked": walked, "wg_tiles_masked": masked,
            "masked_share": masked / max(walked, 1), "gather_phantoms": phantoms,
            "phantom_share": phantoms / max(int(counts.sum()) + phantoms, 1)}


def bench_mix(lib, n, dens, reps, log):
    """One layer with prob / mask / compute heads mixed (head t: MIX_CYCLE[t % 4], i.e. 8 prob,
    16 mask, 8 compute of 32, mixed inside every KV group) against each mode's heads run
    alone (MF_APPLY_ONLY: the others skipped, their O untouched); FP8 rows (prob heads mix
    the tiles, mask heads the masses), W mixes source heads t and t + 1 (0.75 / 0.25). The
    three partial outputs together must equal the mixed one bit for bit."""
    g = vars(BG)
    hs, nb = g["HS"], n // B
    rng = np.random.default_rng(7)
    keep = R.patterns(rng, hs, nb, dens)
    q, k, v, o = BT.random_qkvo(n, HQ, HKV, D)
    w = BT.pair_w(HQ, hs)
    ap = BT.Apply(lib, g, keep, R.FP8, 0, w, q, k, v, o)
    ap.modes[:] = [MIX_CYCLE[t % len(MIX_CYCLE)] for t in range(HQ)]
    rec = {"N": n, "density": dens,
           "heads": {m: int((ap.modes == x).sum()) for m, x in
                     (("prob", 1), ("mask", 2), ("compute", 0))}}
    o.fill_(float("nan"))
    ap()
    torch.cuda.synchronize()
    mixed = o.clone()
    rec["mixed_finite"] = bool(torch.isfinite(mixed).all())
    o.fill_(float("nan"))
    for m in ("prob", "mask", "compute"):
        with_env({"MF_APPLY_ONLY": m}, ap)
    torch.cuda.synchronize()
    rec["parts_vs_mixed_maxdiff"] = float((o - mixed).abs().max())  # NaN if a head unwritten
    # timed from here as the target calls it: O in bf16 from the kernels (o_dtype), which
    # must be the fp32 O rounded to nearest (v2 on its side stream and the core alike)
    ap32 = BG.ApplyArgs.from_buffer_copy(ap.a)
    ot = torch.full((n, HQ, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    ap.a.o, ap.a.o_dtype = ot.data_ptr(), BG.K.BF16
    ap()
    torch.cuda.synchronize()
    rec["o_dtype"] = "bf16"
    rec["mixed_t_differ_from_rn"] = int((ot.view(torch.int16) != mixed.to(
        torch.bfloat16).view(torch.int16)).sum())

    def mixed_f32():
        why = C.c_char_p()
        if lib.mf_apply_cuda(C.byref(ap32), ap.stream, C.byref(why)) != 0:
            raise RuntimeError(f"mf_apply_cuda (mixed, fp32 O) {why.value}")
    rec.update(o_dtype_ab(ap, mixed_f32, o, reps, "mixed"))
    rec["mixed_ms"] = timeit(ap, reps)[0]
    for m in ("prob", "mask", "compute"):
        rec[f"only_{m}_ms"] = with_env({"MF_APPLY_ONLY": m}, lambda: timeit(ap, reps))[0]
    rec["sum_ms"] = sum(rec[f"only_{m}_ms"] for m in ("prob", "mask", "compute"))
    rec["mixed_over_sum"] = rec["mixed_ms"] / rec["sum_ms"]
    log(json.dumps(rec))
    del ap, q, k, v, o, ot, mixed
    torch.cuda.empty_cache()
    return rec


def _f(r, key, fmt=".3f"):
    """r[key] formatted, or "-" (JSON from before the column)."""
    return "-" if r.get(key) is None else format(r[key], fmt)


PROB_CODECS = {"fp8": R.FP8, "fp16": R.FP16, "bf16": R.BF16, "u8log": R.U8LOG}


def bench_prob(lib, n, dens, reps, log, codec="fp8"):
    """Prob mode (every head prob, FP8 rows (codec), W = pair_w: head t mixes source heads t and
    t + 1) on the core's prob kernel (attn_prob.cuh) vs v2 (MF_APPLY_PROB=v2), the same
    rows. eff = the union of the two source heads' blocks (the columns a head walks) as a
    share of the causal blocks; bytes = the tiles read (each present (head, block) tile of
    a source head with W > 0, once per target head) + V once + O; FLOPs = P·V on the eff
    blocks."""
    g = vars(BG)
    hs, nb = g["HS"], n // B
    rng = np.random.default_rng(11)
    keep = R.patterns(rng, hs, nb, dens)
    q, k, v, o = BT.random_qkvo(n, HQ, HKV, D)
    w = BT.pair_w(HQ, hs)
    ap = BT.Apply(lib, g, keep, PROB_CODECS[codec], 1, w, q, k, v, o)
    causal = nb * (nb + 1) / 2
    eff_blocks = tiles = 0
    for t in range(HQ):
        src = np.nonzero(w[t] > 0)[0]
        eff_blocks += int(np.logical_or.reduce(keep[src], axis=0).sum())
        tiles += int(keep[src].sum())
    flops = eff_blocks * 2 * B * B * D
    elem = 2 if codec in ("fp16", "bf16") else 1
    bytes_ = tiles * B * B * elem + n * HKV * D * 2 + n * HQ * D * 4
    rec = {"N": n, "density": dens, "codec": codec, "eff": eff_blocks / (HQ * causal),
           "TFLOP": flops / 1e12,
           "GB": bytes_ / 1e9, "floor_bytes_ms": bytes_ / 4.25e12 * 1e3,
           "floor_flops_ms": flops / 600e12 * 1e3}
    outs = {}
    for name, env in (("core", {"MF_APPLY_PROB": None}), ("v2", {"MF_APPLY_PROB": "v2"})):
        def run():
            o.fill_(float("nan"))
            ap()
            torch.cuda.synchronize()
            return o.clone(), timeit(ap, reps)[0]
        outs[name], rec[name + "_ms"] = with_env(env, run)
        rec[name + "_GBs"] = bytes_ / rec[name + "_ms"] / 1e6
        rec[name + "_TFLOPs"] = flops / rec[name + "_ms"] / 1e9
    rec["core_finite"] = bool(torch.isfinite(outs["core"]).all())
    rec["core_rel_vs_v2"] = float((outs["core"] - outs["v2"]).norm() / outs["v2"].norm())
    rec["goal_ms"] = 1.8
    log(json.dumps(rec))
    del ap, q, k, v, o, outs
    torch.cuda.empty_cache()
    return rec


def table(res, log):
    log("\n| N | ours dense ms (TFLOP/s) | ours+pvwait ms (/ ours, interleaved) |"
        " SDPA default ms (TFLOP/s) | ours/SDPA | rel err | apply compute, O bf16 ms |"
        " O fp32 ms | fp32 + cast ms (interleaved) | bf16 ≠ rn(fp32) | SDPA kernel |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["dense"]:
        pv = (f"{r['ab_ours_pvw_ms']:.3f} ({r['ab_ours_pvw_ms'] / r['ab_ours_ms']:.3f}"
              f"{'' if r['pvw_same_as_ours'] else ', BITS DIFFER'})" if "ab_ours_ms" in r
              else "-")  # absent in JSON from before the PVWAIT A/B
        log(f"| {r['N']} | {r['ours_ms']:.3f} ({r['ours_TFLOPs']:.0f}) | {pv} | "
            f"{r['sdpa_ms']:.3f} ({r['sdpa_TFLOPs']:.0f}) | {r['sdpa_ms'] / r['ours_ms']:.2f}x | "
            f"{r['rel_vs_sdpa']:.1e} | {_f(r, 'apply_t_ms')} | {_f(r, 'apply_f32_ms')} | "
            f"{_f(r, 'apply_f32_cast_ms')} | {_f(r, 'apply_t_differ_from_rn', 'd')} | "
            f"{r['sdpa_kernel'][:40]} |")
    if res.get("masses"):
        log("\n| N | Hq/Hkv | fused O+LSE+masses ms (TFLOP/s) | dense core ms | cuDNN ms |"
            " cuDNN/fused | extract (MASK, LSE given) ms | (cuDNN+extract)/fused |"
            " mass vs extract max diff | rel err O |")
        log("|---|---|---|---|---|---|---|---|---|---|")
        for r in res["masses"]:
            log(f"| {r['N']} | {r['Hq']}/{r['Hkv']} | {r['fused_ms']:.3f} "
                f"({r['fused_TFLOPs']:.0f}) | {r['dense_ms']:.3f} | {r['sdpa_ms']:.3f} | "
                f"{r['sdpa_over_fused']:.3f}x | {r['extract_ms']:.3f} | "
                f"{r['today_over_fused']:.2f}x | {r['mass_vs_extract_maxdiff']:.1e} | "
                f"{r['rel_vs_sdpa']:.1e} |")
        if any("variants" in r for r in res["masses"]):
            log("\n| N | Hq/Hkv | mass bookkeeping | fused ms (TFLOP/s) | / dense core |"
                " / cuDNN | / v2 | rounds ms | O, LSE = v2 | masses ≠ v2 (words, max diff) |")
            log("|---|---|---|---|---|---|---|---|---|---|")
        for r in res["masses"]:
            for v, x in r.get("variants", {}).items():
                rel = f"{x['over_v2']:.3f}" if x["over_v2"] else "-"
                log(f"| {r['N']} | {r['Hq']}/{r['Hkv']} | {v} | {x['ms']:.3f} "
                    f"({x['TFLOPs']:.0f}) | {x['over_dense']:.3f}x "
                    f"(dense {r['variants_dense_ms']:.3f}) | {x['over_sdpa']:.3f}x | {rel} | "
                    f"{' '.join(f'{t:.2f}' for t in x['ms_rounds'])} | "
                    f"{'yes' if x['o_same'] and x['lse_same'] else 'NO'} | "
                    f"{x['mass_words_differ']}, {x['mass_maxdiff_v2']:.1e}"
                    f"{'' if x['finite'] else ' NOT FINITE'} |")
        if any("export_ms" in r for r in res["masses"]):
            log("\n| N | Hq/Hkv | export ms (O+LSE+masses+rows+seal) | cuDNN dense ms |"
                " export/cuDNN | extract ms (LSE computed / given) | cuDNN+extract ms |"
                " (cuDNN+extract)/export | rows bad | rows = extract's | rel err O |")
            log("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in res["masses"]:
            if "export_ms" not in r:
                continue
            today = r["sdpa_ms"] + r["extract_nolse_ms"]
            log(f"| {r['N']} | {r['Hq']}/{r['Hkv']} | {r['export_ms']:.3f} | "
                f"{r['sdpa_ms']:.3f} | {r['export_over_sdpa']:.3f}x | "
                f"{r['extract_nolse_ms']:.3f} / {r['extract_ms']:.3f} | {today:.3f} | "
                f"{r['today_over_export']:.2f}x | {r['export_rows_bad']} "
                f"(failed {r['export_failed']:#x}) | {r['export_rows_same_as_extract']}/"
                f"{r['N'] // B} | {r['export_rel_vs_sdpa']:.1e} |")
        if any("export_t_ms" in r for r in res["masses"]):
            log("\n| N | Hq/Hkv | export O fp32 + cast ms | export O bf16 ms (/cuDNN) | "
                "bf16 ≠ rn(fp32) | per-call scratch ms (wall / host µs) | cached (wall / host µs) |"
                " rows copy 1 launch ms | per-row copies ms | rows equal |")
            log("|---|---|---|---|---|---|---|---|---|---|")
        for r in res["masses"]:
            if "export_t_ms" not in r:
                continue
            log(f"| {r['N']} | {r['Hq']}/{r['Hkv']} | {r['export_cast_ms']:.3f} | "
                f"{r['export_t_ms']:.3f} ({r['export_t_over_sdpa']:.3f}x) | "
                f"{r['export_t_differ_from_rn']} | {r['export_t_nocache_ms']:.3f} "
                f"({r['export_t_nocache_wall_ms']:.3f} / {r['export_t_nocache_host_us']:.0f}) | "
                f"{r['export_t_ms']:.3f} ({r['export_t_wall_ms']:.3f} / "
                f"{r['export_t_host_us']:.0f}) | {r['rows_copy_wall_ms']:.3f} | "
                f"{r['rows_copy_per_row_wall_ms']:.3f} | {r['rows_copy_same']}/"
                f"{r['rows_copy_rows']} |")
    if res["mask"]:
        log("\n| N | density | core ms (TFLOP/s) | BN-64 kernel ms (TFLOP/s) | core / BN-64 |"
            " core only ms (BN-64) | persistent ms (TFLOP/s) | persistent / core |"
            " persistent core only ms | persistent = core bits | v2 ms | flex128 ms |"
            " flex64 ms | core vs flex128 | core/cuDNN per block (BN-64, persistent) |"
            " rel vs v2 (BN-64) | phantom halves |")
        log("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    dense = {r["N"]: r for r in res["dense"]}
    for r in res["mask"]:
        f128, f64 = r.get("flex128_ms"), r.get("flex64_ms")
        sd = dense.get(r["N"])
        per_block = r["core_TFLOPs"] / sd["sdpa_TFLOPs"] if sd else float("nan")
        b64 = r.get("bn64_ms")  # absent in JSON from before the gather A/B
        b64_block = r["bn64_TFLOPs"] / sd["sdpa_TFLOPs"] if sd and b64 else float("nan")
        pm = r.get("persist_ms")  # absent in JSON from before the persistent A/B
        p_block = r["persist_TFLOPs"] / sd["sdpa_TFLOPs"] if sd and pm else float("nan")
        log(f"| {r['N']} | {r['density']:.3f} | {r['core_ms']:.3f} ({r['core_TFLOPs']:.0f}) | "
            + (f"{b64:.3f} ({r['bn64_TFLOPs']:.0f}) | {r['core_ms'] / b64:.3f} | "
               f"{r['phase_core_ms']:.3f} ({r['bn64_phase_core_ms']:.3f}) | " if b64
               else "- | - | - | ")
            + (f"{pm:.3f} ({r['persist_TFLOPs']:.0f}) | {pm / r['core_ms']:.3f} | "
               f"{r['persist_phase_core_ms']:.3f} | {r['persist_same_as_core']} | " if pm
               else "- | - | - | - | ")
            + f"{r['v2_ms']:.3f} | {f128 if f128 is None else round(f128, 3)} | "
            f"{f64 if f64 is None else round(f64, 3)} | "
            f"{(f128 / r['core_ms']) if f128 else float('nan'):.2f}x | {per_block:.2f} "
            f"({b64_block:.2f}, {p_block:.2f}) | {r['core_rel_vs_v2']:.1e} "
            f"({r.get('bn64_rel_vs_v2', float('nan')):.1e}) | "
            f"{100 * r.get('phantom_share', float('nan')):.1f} % |")
    if any("ab_core_pvw_ms" in r for r in res["mask"]):
        log("\n| N | density | interleaved: core ms | core+pvwait ms (/ core) | persistent ms"
            " (/ core) | persistent+pvwait ms (/ persistent) | persistent 24/240 ms |"
            " pvwait bits = core (core, persistent) |")
        log("|---|---|---|---|---|---|---|---|")
    for r in res["mask"]:
        if "ab_core_pvw_ms" not in r:  # absent in JSON from before the PVWAIT A/B
            continue
        c, p = r["ab_core_ms"], r["ab_persist_ms"]
        log(f"| {r['N']} | {r['density']:.3f} | {c:.3f} | {r['ab_core_pvw_ms']:.3f} "
            f"({r['ab_core_pvw_ms'] / c:.3f}) | {p:.3f} ({p / c:.3f}) | "
            f"{r['ab_persist_pvw_ms']:.3f} ({r['ab_persist_pvw_ms'] / p:.3f}) | "
            f"{r['ab_persist240_ms']:.3f} | {r['core_pvw_same_as_core']}, "
            f"{r['persist_pvw_same_as_core']} |")
    if any("core_f32_ms" in r for r in res["mask"]):
        log("\n| N | density | core call, O bf16 ms | O fp32 ms | saved ms | fp32 + cast ms |"
            " saved vs fp32 + cast ms | bf16 ≠ rn(fp32) core / v2 |  (interleaved medians)")
        log("|---|---|---|---|---|---|---|---|")
    for r in res["mask"]:
        if "core_f32_ms" not in r:
            continue
        log(f"| {r['N']} | {r['density']:.3f} | {r['core_t_ab_ms']:.3f} | "
            f"{r['core_f32_ms']:.3f} | {r['core_o_saved_ms']:.3f} | "
            f"{r['core_f32_cast_ms']:.3f} | {r['core_o_saved_vs_cast_ms']:.3f} | "
            f"{r['core_t_differ_from_rn']} / {r['v2_t_differ_from_rn']} |")
    if any("phase_prepass_ms" in r for r in res["mask"]):
        log("\n| N | density | core call ms | before ms | pre-pass only ms (v1) | core only ms |"
            " no launch ms | host wall µs (ctypes alone) | MF_APPLY_CACHE=0: call ms / no launch"
            " ms / wall µs | PREPASS=v1 call ms | wg tiles masked whole / walked |")
        log("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["mask"]:
        if "phase_prepass_ms" not in r:
            continue
        log(f"| {r['N']} | {r['density']:.3f} | {r['core_ms']:.3f} | {r['before_ms']:.3f} | "
            f"{r['phase_prepass_ms']:.3f} ({r['prepass_v1_ms']:.3f}) | "
            f"{r['phase_core_ms']:.3f} | "
            f"{r['phase_none_ms']:.3f} | {r['host_wall_us']:.0f} ({r['ctypes_wall_us']:.0f}) | "
            f"{r['nocache_ms']:.3f} / {r['nocache_none_ms']:.3f} / "
            f"{r['nocache_host_wall_us']:.0f} | {r['v1_ms']:.3f} | "
            f"{r['wg_tiles_masked']} / {r['wg_tiles_walked']}"
            f" ({100 * r['masked_share']:.1f} %) |")
    if res.get("prob"):
        log("\n| N | codec | density (eff) | core prob ms (GB/s, TFLOP/s) | v2 ms (GB/s, TFLOP/s) |"
            " v2 / core | floors bytes / FLOPs ms | ≤ 1.8 ms at eff 13.5 % | rel vs v2 | finite |")
        log("|---|---|---|---|---|---|---|---|---|---|")
    for r in res.get("prob", []):
        goal = "yes" if r["core_ms"] <= r["goal_ms"] else "no"
        if abs(r["eff"] - 0.135) > 0.02 or r.get("codec", "fp8") != "fp8":
            goal = "-"
        log(f"| {r['N']} | {r.get('codec', 'fp8')} | {r['density']:.2f} ({r['eff']:.3f}) | "
            f"{r['core_ms']:.3f} "
            f"({r['core_GBs']:.0f}, {r['core_TFLOPs']:.0f}) | {r['v2_ms']:.3f} "
            f"({r['v2_GBs']:.0f}, {r['v2_TFLOPs']:.0f}) | {r['v2_ms'] / r['core_ms']:.2f}x | "
            f"{r['floor_bytes_ms']:.3f} / {r['floor_flops_ms']:.3f} | {goal} | "
            f"{r['core_rel_vs_v2']:.1e} | {r['core_finite']} |")
    if res.get("mix"):
        log("\n| N | density | heads prob/mask/compute | mixed layer ms (O bf16) | prob alone |"
            " mask alone | compute alone | sum ms | mixed / sum | parts vs mixed max diff |"
            " interleaved: O bf16 / fp32 / fp32 + cast ms | bf16 ≠ rn(fp32) |")
        log("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res.get("mix", []):
        hh = r["heads"]
        log(f"| {r['N']} | {r['density']:.2f} | {hh['prob']}/{hh['mask']}/{hh['compute']} | "
            f"{r['mixed_ms']:.3f} | {r['only_prob_ms']:.3f} | {r['only_mask_ms']:.3f} | "
            f"{r['only_compute_ms']:.3f} | {r['sum_ms']:.3f} | {r['mixed_over_sum']:.3f} | "
            f"{r['parts_vs_mixed_maxdiff']:.1e} | {_f(r, 'mixed_t_ab_ms')} / "
            f"{_f(r, 'mixed_f32_ms')} / {_f(r, 'mixed_f32_cast_ms')} | "
            f"{_f(r, 'mixed_t_differ_from_rn', 'd')} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="16384,32768,65536")
    ap.add_argument("--mask-ns", default="32768")
    ap.add_argument("--densities", default="0.05,0.1,0.2,0.35")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-mask", action="store_true")
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--mass-ns", default="")
    ap.add_argument("--mass-heads", default="40/8,32/8")
    ap.add_argument("--mass-variants", default="v2,v3,v4,v5,v6",
                    help="MF_MASS_VARIANT A/B in the masses table ('' for none)")
    ap.add_argument("--mass-rounds", type=int, default=3)
    ap.add_argument("--strided-ns", default="")
    ap.add_argument("--strided-heads", default="40/8")
    ap.add_argument("--strides", default="1,4,8,16")
    ap.add_argument("--strided-inputs", default="structured")
    ap.add_argument("--mix-ns", default="", help="layer-mix runs (e.g. 32768); none by default")
    ap.add_argument("--mix-density", type=float, default=0.1)
    ap.add_argument("--ncu", action="store_true",
                    help="mask cases: one call per core kernel variant (core, persistent 40/232, 24/240), each"
                         " in an NVTX range 'ncu' (run under ncu --nvtx --nvtx-include 'ncu/'),"
                         " no timing tables")
    ap.add_argument("--prob-codecs", default="fp8",
                    help="the prob table's row codecs, of " + ",".join(PROB_CODECS))
    ap.add_argument("--prob", action="store_true",
                    help="the prob table: --mask-ns x (--densities + 0.1, eff 13.5 %%), "
                         "the core's prob kernel vs v2")
    args = ap.parse_args()
    global NCU
    NCU = args.ncu
    if args.reps < 7:
        ap.error("--reps must be at least 7 (medians of >= 7)")
    log = print
    lib = load()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    log(f"device {torch.cuda.get_device_name()} torch {torch.__version__} "
        f"cudnn {torch.backends.cudnn.version()}")
    res = {"dense": [], "mask": [], "masses": [], "mix": []}
    for n in [int(x) for x in args.ns.split(",") if x and not args.no_dense]:
        res["dense"].append(bench_dense(lib, n, args.reps, log))
    for n in [int(x) for x in args.mass_ns.split(",") if x]:
        for hh in args.mass_heads.split(","):
            hq, hkv = (int(x) for x in hh.split("/"))
            try:
                res["masses"].append(bench_masses(
                    lib, n, hq, hkv, args.reps, log,
                    [x for x in args.mass_variants.split(",") if x], args.mass_rounds))
            except Exception as ex:  # noqa: BLE001
                log(f"masses N={n} {hq}/{hkv}: {str(ex)[:300]}")
    flex = None
    if not args.no_flex and not args.no_mask:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as ex:  # noqa: BLE001
            log(f"flex_attention unavailable: {ex}")
    if not args.no_mask:
        for n in [int(x) for x in args.mask_ns.split(",") if x]:
            for dens in [float(x) for x in args.densities.split(",")]:
                res["mask"].append(bench_mask(lib, n, dens, args.reps, rng, flex, log))
    if NCU:
        return 0
    res["strided"] = []
    for n in [int(x) for x in args.strided_ns.split(",") if x]:
        for hh in args.strided_heads.split(","):
            hq, hkv = (int(x) for x in hh.split("/"))
            for inp in args.strided_inputs.split(","):
                try:
                    res["strided"].append(bench_strided(
                        lib, n, hq, hkv, [int(x) for x in args.strides.split(",")], args.reps,
                        log, inp))
                except Exception as ex:  # noqa: BLE001
                    log(f"strided N={n} {hq}/{hkv} {inp}: {str(ex)[:300]}")
    res["prob"] = []
    if args.prob:
        pd = sorted({float(x) for x in args.densities.split(",")} | {0.1})
        for codec in args.prob_codecs.split(","):
            for n in [int(x) for x in args.mask_ns.split(",") if x]:
                for dens in pd:
                    try:
                        res["prob"].append(bench_prob(lib, n, dens, args.reps, log, codec))
                    except Exception as ex:  # noqa: BLE001
                        log(f"prob {codec} N={n} density {dens}: {str(ex)[:300]}")
    for n in [int(x) for x in args.mix_ns.split(",") if x]:
        try:
            res["mix"].append(bench_mix(lib, n, args.mix_density, args.reps, log))
        except Exception as ex:  # noqa: BLE001
            log(f"mix N={n}: {str(ex)[:300]}")
    table(res, log)
    strided_table(res, log)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
