"""The torch half of bench_gpu.py (needs torch and a GPU): times, bytes, FLOPs, tables.

Issue 18's rules: the dense row is SDPA with enable_gqa and torch's own backend (cuDNN on
the H200; its name and TFLOP/s printed), never a forced backend; the block-sparse anchor is
flex_attention on the same kept (head, 64-token block) pairs, at 128-token blocks with its
default kernel options (its best: partial blocks look the pairs up in a mask_mod) and at
64-token blocks (BLOCK_M = BLOCK_N = 64); a density sweep of the target's effective
density with the break-even density against cuDNN; FlexPrefill's selection
(bench/handoff/flexprefill.py) on flex_attention and on our mask kernel (the ablation:
what comes from selection, what from the kernel). mf_apply_cuda is whatever the library
exports (the public API); ≥ 5 repetitions, min / median / max."""
import ctypes as C
import json
import os
import statistics

import numpy as np
import torch
import torch.nn.functional as F

import rows as R


def timeit(fn, reps, warm):
    """Median ms (CUDA events)."""
    return timings(fn, reps, warm)[1]


def timings(fn, reps, warm):
    """[min, median, max] ms of reps calls after warm ones (CUDA events)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return [min(ts), statistics.median(ts), max(ts)]


def ceilings(g):
    x = torch.randint(0, 255, (2 << 30,), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = timeit(lambda: y.copy_(x), g["REPS"], g["WARM"])
    bw = 2 * x.numel() / (t * 1e-3) / 1e12
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = timeit(lambda: a @ b, g["REPS"], g["WARM"])
    return bw, 2 * 8192 ** 3 / (t * 1e-3) / 1e12


# (label, mf_apply_impl_t): profile_apply.py's names for the implementations (v3 was
# removed: bench/gpu/NOTES.md)
IMPLS = (("core", 4), ("v2", 2))
OPS = (("prob_fp8", "prob fp8"), ("prob_u8log", "prob u8log"), ("mask", "mask"),
       ("mask_tp95", "mask tp.95"), ("compute", "compute (dense causal, our kernel)"),
       ("mixed", "mixed per-head modes (prob fp8 / mask / compute by head % 3)"))
# "mixed": one launch where head t runs MIXED_CYCLE[t % 3]; the goal is that it costs
# no more than the sum of its heads' shares of the single-mode launches.
MIXED_CYCLE = (1, 2, 0)


def structured_qk(n, hq, hkv, d):
    """Q, K with a local (rotary-like) term, a sink at token 0 and noise: real-looking maps."""
    r = torch.arange(n, device="cuda", dtype=torch.float32)
    m = d // 4
    w = torch.logspace(0, -3, m, device="cuda")  # rad / token
    ang = r[:, None] * w[None, :]
    pos = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1) * 2.6  # [n, d/2]
    q = torch.cat([pos[:, None, :].expand(n, hq, d // 2),
                   0.5 * torch.randn(n, hq, d // 2, device="cuda")], dim=2)
    k = torch.cat([pos[:, None, :].expand(n, hkv, d // 2),
                   0.5 * torch.randn(n, hkv, d // 2, device="cuda")], dim=2)
    u = torch.randn(d // 2, device="cuda")
    u = u / u.norm()
    q[:, :, d // 2:] += 1.5 * u
    k[0, :, d // 2:] += 6.0 * u
    return q.to(torch.bfloat16).contiguous(), k.to(torch.bfloat16).contiguous()


def pair_w(hq, hs):
    """W of the benches: each target head mixes two source heads (t and t + 1, 0.75 / 0.25),
    the usual shape of a fit."""
    w = np.zeros((hq, hs), dtype=np.float32)
    for t in range(hq):
        w[t, t % hs] = 0.75
        w[t, (t + 1) % hs] = 0.25
    return w


def random_qkvo(n, hq, hkv, d, device="cuda"):
    """Random bf16 Q [n, hq, d], K / V [n, hkv, d] and an fp32 O to write, on device."""
    q = torch.randn(n, hq, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device=device)
    v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device=device)
    return q, k, v, torch.empty(n, hq, d, dtype=torch.float32, device=device)


def qkv_struct(g, q, k, v, n, hq, hkv, d):
    return g["Qkv"](q.data_ptr(), k.data_ptr(), v.data_ptr() if v is not None else 0, 2, n, hq,
                    hkv, d)


class RowBuffers:
    """Device output of an extract-style call for rows of capacities caps: one buffer with
    the rows at 16-byte aligned offsets, sizes [n] int64, failed_block, and the ctypes
    arrays of row addresses (rows) and capacities (capa) the call takes."""

    def __init__(self, caps):
        self.caps, self.offs, tot = list(caps), [], 0
        for c in self.caps:
            self.offs.append(tot)
            tot += R.align16(c)
        n = len(self.caps)
        self.buf = torch.empty(tot, dtype=torch.uint8, device="cuda")
        self.sizes = torch.zeros(n, dtype=torch.int64, device="cuda")
        self.failed = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.rows = (C.c_void_p * n)(*[self.buf.data_ptr() + o for o in self.offs])
        self.capa = (C.c_size_t * n)(*self.caps)


def run_extract(lib, g, n, stream, log):
    hq, hkv, d, b = g["HQ"], g["HKV"], g["D"], g["B"]
    nb = n // b
    q, k = structured_qk(n, hq, hkv, d)
    tokens = np.arange(n, dtype=np.uint32)
    # capacity: half the causal blocks per head (the structured maps keep far fewer)
    rb = RowBuffers(R.layout(R.FP8, b, i + 1, hq * min(i + 1, (i + 1) // 2 + 4), 3)["total"]
                    for i in range(nb))
    buf, sizes, failed, rows, capa = rb.buf, rb.sizes, rb.failed, rb.rows, rb.capa
    out = {}
    for label, lse in (("computed", None), ("given", "cudnn")):
        lse_t = None
        if lse:
            try:
                from model import sdpa_lse
                qs = q.transpose(0, 1).unsqueeze(0)
                ks = k.transpose(0, 1).unsqueeze(0)
                lse_t = sdpa_lse(qs, ks, ks)[1].contiguous()
            except Exception as ex:  # noqa: BLE001
                log(f"extract: no LSE from the dense op ({ex}); skipped")
                continue
        a = g["ExtractArgs"](qkv_struct(g, q, k, None, n, hq, hkv, d),
                             lse_t.data_ptr() if lse_t is not None else None, b, 0.9, R.FP8, 0,
                             nb, b"src", b"bench", 0, tokens.ctypes.data, C.cast(rows, C.c_void_p),
                             C.cast(capa, C.c_void_p), sizes.data_ptr(), failed.data_ptr(), None)
        why = C.c_char_p()

        def call():
            st = lib.mf_extract_cuda(C.byref(a), stream, C.byref(why))
            if st != 0:
                raise RuntimeError(f"mf_extract_cuda {st} {why.value}")
        t = timeit(call, g["REPS"], g["WARM"])
        torch.cuda.synchronize()
        fb = int(failed.item()) & 0xffffffff
        written = int(sizes.sum().item())
        # density: entries / (heads · causal blocks), from the row sizes' tile bytes
        ent = (sizes.cpu().numpy().astype(np.int64) // (b * b)).sum()
        dens = ent / (hq * nb * (nb + 1) / 2)
        out[label] = {"ms": t, "row_bytes": written, "density": float(dens),
                      "overflow": fb != 0xffffffff}
    del buf
    return out


def build_rows(g, keep, codec, prefixes):
    b = g["B"]
    offs, tot = [], 0
    for _, lay in prefixes:
        offs.append(tot)
        tot += R.align16(lay["total"])
    hi = 0x7f if codec == R.FP8 else 256
    buf = torch.randint(0, hi, (tot,), dtype=torch.uint8, device="cuda")
    for (pre, lay), o in zip(prefixes, offs):
        buf[o:o + len(pre)].copy_(torch.frombuffer(bytearray(pre), dtype=torch.uint8))
        if codec in (R.FP8, R.U8LOG):
            e = lay["entries"]
            buf[o + lay["scales"]:o + lay["scales"] + 4 * e].view(torch.float32).uniform_(0.2, 1.0)
        if codec in (R.FP16, R.BF16):  # random bytes are no probabilities (negative, NaN, huge)
            dt = torch.float16 if codec == R.FP16 else torch.bfloat16
            buf[o + lay["tiles"]:o + lay["total"]].view(dt).uniform_(0.0, 1.0 / 64)
    return buf, offs, tot


def eff_patterns(seed, hs, hq, nb, goal):
    """Source keep [hs, nb, nb] whose target union (head t: sources t, t+1) keeps about
    `goal` of the causal blocks (the per-head density is rescaled twice)."""
    causal = nb * (nb + 1) / 2
    dens = goal
    for _ in range(3):
        keep = R.patterns(np.random.default_rng(seed), hs, nb, min(dens, 0.95))
        tgt = keep | np.roll(keep, -1, axis=0)
        eff = tgt.sum() / (hq * causal)
        dens *= goal / max(eff, 1e-9)
    return keep, tgt, keep.sum() / (hs * causal), eff


class Apply:
    """mf_apply_cuda on rows built from a source keep, W given, one mode for every head."""

    def __init__(self, lib, g, keep, codec, mode, w, q, k, v, o, top_p=1.0):
        hq, b, nb = g["HQ"], g["B"], keep.shape[1]
        rng = np.random.default_rng(1)
        pre = [R.row_prefix(keep, i, codec, b, rng=rng) for i in range(nb)]
        self.buf, offs, self.tot = build_rows(g, keep, codec, pre)
        self.ptrs = (C.c_void_p * nb)(*[self.buf.data_ptr() + x for x in offs])
        self.modes = np.full(hq, mode, dtype=np.uint8)
        self.tps = np.full(hq, top_p, dtype=np.float32)
        self.w = np.ascontiguousarray(w, dtype=np.float32)
        self.lm = g["LayerMap"](hq, keep.shape[0], self.w.ctypes.data, self.modes.ctypes.data,
                                self.tps.ctypes.data)
        n = q.shape[0]
        self.a = g["ApplyArgs"](C.cast(self.ptrs, C.c_void_p), nb, C.pointer(self.lm),
                                qkv_struct(g, q, k, v, n, hq, k.shape[1], q.shape[2]), b, None,
                                0, 0, o.data_ptr(), None)
        self.lib, self.o = lib, o
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self):
        why = C.c_char_p()
        st = self.lib.mf_apply_cuda(C.byref(self.a), self.stream, C.byref(why))
        if st != 0:
            raise RuntimeError(f"mf_apply_cuda {st} {why.value}")

    def checked(self, reps, warm):
        """Timings after one poisoned-output run whose every element must be finite."""
        self.o.fill_(float("nan"))
        self()
        torch.cuda.synchronize()
        if not bool(torch.isfinite(self.o).all()):
            raise RuntimeError("mf_apply_cuda left non-finite output")
        return timings(self, reps, warm)


def flex_times(flex, BlockMask, FP, keep64, b, qs, kf, vf, reps, warm):
    """flex_attention on the kept (head, 64-block) pairs: at 128-token blocks with default
    kernel options (partial blocks through a mask_mod lookup) and at 64-token blocks with
    64 × 64 tiles. Returns {"flex128": (stats, visited 128-block density), "flex64": stats}."""
    dev = torch.from_numpy(keep64).cuda()
    out = {}
    try:
        bm, vis = FP.block_mask_coarse(torch, BlockMask, dev, b, 128)
        out["flex128"] = (timings(lambda: flex(qs, kf, vf, block_mask=bm, enable_gqa=True),
                                  reps, warm), vis)
    except Exception as ex:  # noqa: BLE001
        out["flex128_error"] = str(ex)[:300]
    try:
        bm = FP.block_mask(torch, BlockMask, dev, b)
        opts = {"BLOCK_M": 64, "BLOCK_N": 64}
        out["flex64"] = timings(lambda: flex(qs, kf, vf, block_mask=bm, enable_gqa=True,
                                             kernel_options=opts), reps, warm)
    except Exception as ex:  # noqa: BLE001
        out["flex64_error"] = str(ex)[:300]
    return out


def ablation(lib, g, flex, BlockMask, FP, n, goal, reps, warm, log):
    """FlexPrefill's selection (structured Q/K, γ calibrated to `goal`) timed alone, then
    its blocks on flex_attention (128-token blocks, default options) and on our mask
    kernel (each 128 block as its 2 × 2 64-blocks, identity W: the same pairs)."""
    hq, hkv, d, b = g["HQ"], g["HKV"], g["D"], g["B"]
    q, k = structured_qk(n, hq, hkv, d)
    v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
    sc = FP.Scores(torch, q, k, 128, 0.1)
    gam, got, mb = FP.calibrate_gamma(sc, goal, 1024)
    sel = timings(lambda: FP.Scores(torch, q, k, 128, 0.1).keep(gam, mb), reps, warm)
    keep = FP.Scores(torch, q, k, 128, 0.1).keep(gam, mb)
    qa = float(sc.query_aware.float().mean())
    nb = n // b
    k64 = keep.repeat_interleave(2, 1).repeat_interleave(2, 2)
    ii = torch.arange(nb, device="cuda")
    k64 = (k64 & (ii[None, :] <= ii[:, None])[None]).cpu().numpy()
    qs, kf, vf = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    bm = FP.block_mask(torch, BlockMask, keep, 128)
    t_flex = timings(lambda: flex(qs, kf, vf, block_mask=bm, enable_gqa=True), reps, warm)
    o = torch.empty(n, hq, d, dtype=torch.float32, device="cuda")
    ap = Apply(lib, g, k64, R.MASK, 2, np.eye(hq, dtype=np.float32), q, k, v, o)
    t_ours = ap.checked(reps, warm)
    # our output against flex's on the same pairs (both bf16 inputs, fp32 / bf16 out)
    of = flex(qs, kf, vf, block_mask=bm, enable_gqa=True)[0].transpose(0, 1).float()
    rel = float((o - of).norm() / of.norm())
    rec = {"N": n, "goal": goal, "gamma": gam, "keep_density": got, "query_aware_share": qa,
           "min_budget": mb,
           "selection_ms": sel, "flex128_ms": t_flex, "ours_mask_ms": t_ours,
           "rel_ours_vs_flex": rel}
    log(json.dumps(rec))
    del ap
    return rec


def run(lib, args, g):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "handoff"))
    import flexprefill as FP
    from model import dense_rate, lse_source
    log = print
    torch.manual_seed(0)
    hq, hkv, hs, d, b = g["HQ"], g["HKV"], g["HS"], g["D"], g["B"]
    bw, mm = ceilings(g)
    log(f"ceilings: copy {bw:.2f} TB/s (read+write), bf16 matmul {mm:.0f} TFLOP/s")
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    w = pair_w(hq, hs)
    results = {"copy_TBps": bw, "matmul_TFLOPs": mm, "rows": [], "dense": [], "ablation": [],
               "commit": os.environ.get("MF_COMMIT"), "command": os.environ.get("MF_COMMAND"),
               "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    dens_list = [float(x) for x in args.densities.split(",")]
    for n in [int(x) for x in args.ns.split(",")]:
        reps = g["REPS"] if n <= args.full_reps_n else max(5, g["REPS"] // 2)
        warm = g["WARM"]
        nb = n // b
        q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
        qs, kf, vf = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
        dr = dense_rate(hq, hkv, n, d, q.device, reps)
        dense_ms = dr["ms"][1]
        ext = {}
        if not args.no_extract:
            try:
                ext = run_extract(lib, g, n, torch.cuda.current_stream().cuda_stream, log)
            except Exception as ex:  # noqa: BLE001
                log(f"extract N={n}: {ex}")
        dr.update(N=n, reps=reps, lse=lse_source(q.device), extract=ext)
        o = torch.empty(n, hq, d, dtype=torch.float32, device="cuda")
        # our kernel computing dense causal attention (compute mode), once per N
        try:  # compute mode ignores the rows' blocks: any valid rows will do
            ap = Apply(lib, g, R.patterns(np.random.default_rng(0), hs, nb, 0.05), R.FP8, 0,
                       w, q, k, v, o)
            dr["ours_compute_ms"] = ap.checked(reps, warm)
            del ap
        except Exception as ex:  # noqa: BLE001
            log(f"compute N={n}: {ex}")
        results["dense"].append(dr)
        log(json.dumps(dr))
        for goal in dens_list:
            keep, tgt, per_head, eff = eff_patterns(n + int(1000 * goal), hs, hq, nb, goal)
            blocks = float(tgt.sum())
            rec = {"N": n, "goal": goal, "density": float(per_head), "eff_density": float(eff),
                   "dense_ms": dr["ms"], "dense_backend": dr["backend"], "reps": reps}
            for label, codec, mode, fl in (("prob_fp8", R.FP8, 1, 2),
                                           ("prob_u8log", R.U8LOG, 1, 2),
                                           ("mask", R.MASK, 2, 4)):
                try:
                    ap = Apply(lib, g, keep, codec, mode, w, q, k, v, o)
                    st = ap.checked(reps, warm)
                    rec[label] = {"ms": st, "row_bytes": ap.tot,
                                  "TFLOPs": blocks * fl * b * b * d / (st[1] * 1e-3) / 1e12}
                    del ap
                except Exception as ex:  # noqa: BLE001
                    rec[label] = {"error": str(ex)[:300]}
                    log(f"{label} N={n} goal {goal}: {ex}")
            rec.update(flex_times(flex, BlockMask, FP, tgt, b, qs, kf, vf, reps, warm))
            results["rows"].append(rec)
            log(json.dumps(rec))
            torch.cuda.empty_cache()
        del q, k, v, qs, kf, vf, o
        torch.cuda.empty_cache()
        if not args.no_ablation:
            for goal in dens_list:
                try:
                    results["ablation"].append(ablation(lib, g, flex, BlockMask, FP, n, goal,
                                                        reps, warm, log))
                except Exception as ex:  # noqa: BLE001
                    log(f"ablation N={n} goal {goal}: {str(ex)[:300]}")
                torch.cuda.empty_cache()
    print_table(results, log)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _st(x):
    return f"{x[1]:.3f} ({x[0]:.3f}..{x[2]:.3f})"


def print_table(res, log):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "handoff"))
    from model import break_even
    log("")
    log(f"commit {res.get('commit') or '?'}; command: `{res.get('command') or '?'}`; "
        f"{res.get('gpu')}; torch {res.get('torch')}; Hq 32, Hkv 8, Hs 32, d 128, B 64, bf16, "
        "causal; ms = median (min..max)")
    log(f"copy ceiling {res['copy_TBps']:.2f} TB/s, bf16 matmul {res['matmul_TFLOPs']:.0f} TFLOP/s")
    log("")
    log("| N | dense backend | dense ms | dense TFLOP/s | our compute mode ms (x dense) "
        "| extract ms, LSE computed / given (LSE from) | reps |")
    log("|---|---|---|---|---|---|---|")
    for r in res["dense"]:
        ex = r.get("extract") or {}
        exs = " / ".join(f"{ex[k]['ms']:.2f}" if k in ex else "-" for k in ("computed", "given"))
        oc = r.get("ours_compute_ms")
        ocs = f"{_st(oc)} ({r['ms'][1] / oc[1]:.2f})" if oc else "-"
        log(f"| {r['N']} | {r['backend']} ({r.get('kernel', '?')}) | {_st(r['ms'])} | {r['TFLOPs']:.0f} | {ocs} | {exs} "
            f"({r.get('lse')}) | {r['reps']} |")
    log("")
    log("density sweep: x = speed-up over dense SDPA (cuDNN) / over flex at 128-token blocks "
        "(default options) / over flex at 64-token blocks; same kept (head, 64-block) pairs; "
        "goal = the target's effective density")
    log("| N | goal | eff | mask ms | mask x dense / flex128 / flex64 | prob fp8 ms (x dense) "
        "| prob u8log ms (x dense) | flex128 ms (x dense) [128-blocks visited] "
        "| flex64 ms (x dense) |")
    log("|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for r in res["rows"]:
        dn = r["dense_ms"][1]

        def ms(key):
            x = r.get(key)
            if isinstance(x, dict):
                return x.get("ms")
            if isinstance(x, (list, tuple)) and x and isinstance(x[0], list):
                return x[0]
            return x
        m, p8, pu, f128, f64 = (ms(x) for x in ("mask", "prob_fp8", "prob_u8log", "flex128",
                                               "flex64"))
        for key, x in (("mask", m), ("prob_fp8", p8), ("prob_u8log", pu), ("flex128", f128),
                       ("flex64", f64)):
            if x:
                curves.setdefault((r["N"], key), []).append((r["eff_density"], dn / x[1]))
        ratios = " / ".join(f"{y[1] / m[1]:.2f}" if (y and m) else "-"
                            for y in (r["dense_ms"], f128, f64))
        vis = r["flex128"][1] if isinstance(r.get("flex128"), (list, tuple)) else None
        log(f"| {r['N']} | {r['goal']:.2f} | {r['eff_density']:.3f} | {_st(m) if m else '-'} | "
            f"{ratios} | " + " | ".join(f"{_st(x)} ({dn / x[1]:.2f})" if x else "-"
                                        for x in (p8, pu)) +
            f" | {_st(f128) + f' ({dn / f128[1]:.2f}) [{vis:.3f}]' if f128 else '-'} | "
            f"{_st(f64) + f' ({dn / f64[1]:.2f})' if f64 else '-'} |")
    log("")
    for n in sorted({k[0] for k in curves}):
        log(f"break-even density against dense cuDNN, N={n}: " + "; ".join(
            f"{key} {break_even(c)}" for (nn, key), c in curves.items() if nn == n))
    if res.get("ablation"):
        log("")
        log("ablation: FlexPrefill's selection (128-token blocks, γ calibrated to the goal, "
            "τ 0.1, min_budget 1024 or halved until the goal is reachable, structured Q/K) on "
            "flex_attention and on our mask kernel (same pairs); x = over dense")
        log("| N | goal | kept | γ / min_budget | query-aware | selection ms | sel + flex128 ms (x dense) "
            "| sel + our mask ms (x dense) | ours ÷ flex (kernels) | rel ‖ours − flex‖ |")
        log("|---|---|---|---|---|---|---|---|---|---|")
        dense = {r["N"]: r["ms"][1] for r in res["dense"]}
        for a in res["ablation"]:
            dn, s = dense.get(a["N"]), a["selection_ms"][1]
            f, o = a["flex128_ms"][1], a["ours_mask_ms"][1]
            log(f"| {a['N']} | {a['goal']:.2f} | {a['keep_density']:.3f} | {a['gamma']:.3f} / "
                f"{a.get('min_budget', 1024)} | "
                f"{a['query_aware_share']:.2f} | {_st(a['selection_ms'])} | {s + f:.3f} "
                f"({dn / (s + f):.2f}) | {s + o:.3f} ({dn / (s + o):.2f}) | {o / f:.2f} | "
                f"{a['rel_ours_vs_flex']:.1e} |")
