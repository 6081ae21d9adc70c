"""The torch half of bench_gpu.py (needs torch and a GPU): times, bytes, FLOPs, table.

Every apply variant runs through each implementation in the same process (IMPLS: v2, v3,
and v3 with 2 heads a CTA); v3's outputs are compared with v2's on the same inputs."""
import ctypes as C
import json
import os
import statistics

import numpy as np
import torch
import torch.nn.functional as F

import rows as R


def timeit(fn, reps, warm):
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
    return statistics.median(ts)


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


# (label, mf_apply_impl_t, MF_V3_HP)
IMPLS = (("v2", 2, None), ("v3", 3, None), ("v3hp1", 3, "1"), ("v3hp2", 3, "2"),
         ("v3hp4", 3, "4"))
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


def qkv_struct(g, q, k, v, n, hq, hkv, d):
    return g["Qkv"](q.data_ptr(), k.data_ptr(), v.data_ptr() if v is not None else 0, 2, n, hq,
                    hkv, d)


def run_extract(lib, g, n, stream, log):
    hq, hkv, d, b = g["HQ"], g["HKV"], g["D"], g["B"]
    nb = n // b
    q, k = structured_qk(n, hq, hkv, d)
    tokens = np.arange(n, dtype=np.uint32)
    # capacity: half the causal blocks per head (the structured maps keep far fewer)
    caps, offs, tot = [], [], 0
    for i in range(nb):
        e = hq * min(i + 1, (i + 1) // 2 + 4)
        lay = R.layout(R.FP8, b, i + 1, e, 3)
        caps.append(lay["total"])
        offs.append(tot)
        tot += R.align16(lay["total"])
    buf = torch.empty(tot, dtype=torch.uint8, device="cuda")
    sizes = torch.zeros(nb, dtype=torch.int64, device="cuda")
    failed = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = (C.c_void_p * nb)(*[buf.data_ptr() + o for o in offs])
    capa = (C.c_size_t * nb)(*caps)
    out = {}
    for label, lse in (("computed", None), ("given", "flash")):
        lse_t = None
        if lse:
            try:
                qs = q.transpose(0, 1).unsqueeze(0)
                ks = k.transpose(0, 1).unsqueeze(0).repeat_interleave(hq // hkv, dim=1)
                res = torch.ops.aten._scaled_dot_product_flash_attention(qs, ks, ks, 0.0, True)
                lse_t = res[1].reshape(hq, n).float().contiguous()
            except Exception as ex:  # noqa: BLE001
                log(f"extract: no LSE from flash attention ({ex}); skipped")
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
    return buf, offs, tot


def run(lib, args, g):
    log = print
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    hq, hkv, hs, d, b = g["HQ"], g["HKV"], g["HS"], g["D"], g["B"]
    stream = torch.cuda.current_stream().cuda_stream
    bw, mm = ceilings(g)
    log(f"ceilings: copy {bw:.2f} TB/s (read+write), bf16 matmul {mm:.0f} TFLOP/s")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flex = None
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as ex:  # noqa: BLE001
        log(f"flex_attention unavailable: {ex}")
    # W: each target head mixes two source heads (t and t+1), the usual shape of a fit.
    w = np.zeros((hq, hs), dtype=np.float32)
    for t in range(hq):
        w[t, t % hs] = 0.75
        w[t, (t + 1) % hs] = 0.25
    results = {"copy_TBps": bw, "matmul_TFLOPs": mm, "rows": []}
    for n in [int(x) for x in args.ns.split(",")]:
        nb = n // b
        q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
        qs = q.transpose(0, 1).unsqueeze(0).contiguous()
        kf = k.transpose(0, 1).unsqueeze(0).contiguous()
        vf = v.transpose(0, 1).unsqueeze(0).contiguous()
        ks = kf.repeat_interleave(hq // hkv, dim=1)
        vs = vf.repeat_interleave(hq // hkv, dim=1)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_sdpa = timeit(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
                            g["REPS"], g["WARM"])
        del ks, vs
        dense_flops = 2.0 * n * n * d * hq  # causal QKᵀ + PV
        ext = {}
        if not args.no_extract:
            try:
                ext = run_extract(lib, g, n, stream, log)
            except Exception as ex:  # noqa: BLE001
                log(f"extract N={n}: {ex}")
        torch.cuda.empty_cache()
        o = torch.empty(n, hq, d, dtype=torch.float32, device="cuda")
        for dens in [float(x) for x in args.densities.split(",")]:
            keep = R.patterns(rng, hs, nb, dens)
            per_head = keep.sum() / (hs * nb * (nb + 1) / 2)
            tgt = keep | np.roll(keep, -1, axis=0)  # head t's candidates: sources t, t+1
            eff = tgt.sum() / (hq * nb * (nb + 1) / 2)
            rec = {"N": n, "density": float(per_head), "eff_density": float(eff),
                   "sdpa_ms": t_sdpa, "sdpa_TFLOPs": dense_flops / (t_sdpa * 1e-3) / 1e12,
                   "extract": ext}
            prefixes = {}
            for codec in (R.FP8, R.U8LOG, R.MASK):
                prefixes[codec] = [R.row_prefix(keep, i, codec, b, rng=rng) for i in range(nb)]
            for label, codec, mode, top_p in (("prob_fp8", R.FP8, 1, 1.0),
                                              ("prob_u8log", R.U8LOG, 1, 1.0),
                                              ("mask", R.MASK, 2, 1.0),
                                              ("mask_tp95", R.MASK, 2, 0.95),
                                              ("compute", R.FP8, 0, 1.0),
                                              ("mixed", R.FP8, -1, 1.0)):
                buf, offs, tot = build_rows(g, keep, codec, prefixes[codec])
                ptrs = (C.c_void_p * nb)(*[buf.data_ptr() + x for x in offs])
                if mode < 0:
                    modes = np.array([MIXED_CYCLE[t % 3] for t in range(hq)], dtype=np.uint8)
                else:
                    modes = np.full(hq, mode, dtype=np.uint8)
                tps = np.full(hq, top_p, dtype=np.float32)
                lm = g["LayerMap"](hq, hs, w.ctypes.data, modes.ctypes.data, tps.ctypes.data)
                a = g["ApplyArgs"](C.cast(ptrs, C.c_void_p), nb, C.pointer(lm),
                                   qkv_struct(g, q, k, v, n, hq, hkv, d), b, None, 0, 0,
                                   o.data_ptr(), None)
                why = C.c_char_p()
                blocks = float(tgt.sum())
                prob_flops, mask_flops = blocks * 2 * b * b * d, blocks * 4 * b * b * d
                if mode == 1:
                    byts = tot + v.numel() * 2 + o.numel() * 4
                    flops = prob_flops
                elif mode == 0:
                    byts = (q.numel() + 2 * k.numel()) * 2 + o.numel() * 4
                    flops = dense_flops
                elif mode == 2:
                    byts = tot + (q.numel() + 2 * k.numel()) * 2 + o.numel() * 4
                    flops = mask_flops
                else:  # mixed: each head's share of its mode's work
                    share = {m: float((modes == m).sum()) / hq for m in (0, 1, 2)}
                    byts = tot + (q.numel() + 2 * k.numel()) * 2 + o.numel() * 4
                    flops = (share[1] * prob_flops + share[2] * mask_flops +
                             share[0] * dense_flops)
                rec[label] = {}
                o_v2 = None
                for iname, impl, hp in IMPLS:
                    if hp:
                        os.environ["MF_V3_HP"] = hp
                    else:
                        os.environ.pop("MF_V3_HP", None)

                    def call():
                        st = lib.mf_apply_cuda_impl(C.byref(a), impl, stream, C.byref(why))
                        if st != 0:
                            raise RuntimeError(f"mf_apply_cuda {iname} {st} {why.value}")
                    o.fill_(float("nan"))
                    try:
                        call()
                        torch.cuda.synchronize()
                    except RuntimeError as ex:
                        if label not in ("compute", "mixed"):
                            raise
                        log(f"{label} {iname}: {ex}")  # new variants never stop the others
                        continue
                    finite = bool(torch.isfinite(o).all())
                    if not finite:
                        log(f"{label} {iname}: non-finite output")
                    if o_v2 is None:
                        o_v2 = o.clone()
                        rel = 0.0
                    else:
                        rel = float((o - o_v2).norm() / o_v2.norm())
                    t = timeit(call, g["REPS"], g["WARM"])
                    rec[label][iname] = {
                        "ms": t, "bytes": byts, "GBps": byts / (t * 1e-3) / 1e9,
                        "TFLOPs": flops / (t * 1e-3) / 1e12, "rel_vs_v2": rel,
                        "finite": finite,
                        "floor_ms": max(byts / (bw * 1e12), flops / (mm * 1e12)) * 1e3}
                os.environ.pop("MF_V3_HP", None)
                del o_v2
                del buf
            if flex is not None:
                try:
                    dev = torch.from_numpy(tgt).cuda()  # [H, nb, nb]
                    ii = torch.arange(nb, device="cuda")
                    full = dev & (ii[None, None, :] < ii[None, :, None])
                    full_n = full.sum(-1).to(torch.int32)[None]
                    full_i = torch.argsort((~full).to(torch.int8), dim=-1,
                                           stable=True).to(torch.int32)[None]
                    part_n = torch.ones(1, hq, nb, dtype=torch.int32, device="cuda")
                    part_i = ii.view(1, 1, nb, 1).expand(1, hq, nb, nb).contiguous().to(torch.int32)

                    def causal(bb, h, qi, ki):
                        return qi >= ki
                    bm = BlockMask.from_kv_blocks(part_n, part_i, full_n, full_i, BLOCK_SIZE=b,
                                                  mask_mod=causal)
                    t_flex = None
                    for opts in (None, {"BLOCK_M": 64, "BLOCK_N": 64}):
                        try:
                            fn = (lambda: flex(qs, kf, vf, block_mask=bm, enable_gqa=True,
                                               kernel_options=opts))
                            t_flex = timeit(fn, g["REPS"], g["WARM"])
                            break
                        except Exception as ex:  # noqa: BLE001
                            log(f"flex N={n} options {opts}: {str(ex)[:200]}")
                    rec["flex_ms"] = t_flex
                except Exception as ex:  # noqa: BLE001
                    log(f"flex N={n}: {str(ex)[:300]}")
            mixed = (rec.get("mixed") or {}).get("v2")
            parts = [(rec.get(k) or {}).get("v2") for k in ("prob_fp8", "mask", "compute")]
            if mixed and all(parts):
                shares = [sum(1 for t in range(hq) if MIXED_CYCLE[t % 3] == m) / hq
                          for m in (1, 2, 0)]
                rec["mixed_vs_shares"] = {
                    "mixed_ms": mixed["ms"],
                    "sum_of_shares_ms": sum(s_ * p["ms"] for s_, p in zip(shares, parts))}
            results["rows"].append(rec)
            log(json.dumps(rec))
        del q, k, v, qs, kf, vf, o
        torch.cuda.empty_cache()
    print_table(results, log)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def print_table(res, log):
    log("")
    log(f"copy ceiling {res['copy_TBps']:.2f} TB/s, bf16 matmul {res['matmul_TFLOPs']:.0f} TFLOP/s")
    log("| N | dens | eff | SDPA ms | flex ms | extract ms (% SDPA) |")
    log("|---|---|---|---|---|---|")
    for r in res["rows"]:
        ex = r["extract"].get("computed") or r["extract"].get("given") or {}
        exs = "-" if not ex else f"{ex['ms']:.2f} ({100 * ex['ms'] / r['sdpa_ms']:.0f}%)"
        fx = r.get("flex_ms")
        log(f"| {r['N']} | {r['density']:.3f} | {r['eff_density']:.3f} | {r['sdpa_ms']:.3f} | "
            f"{'-' if fx is None else f'{fx:.3f}'} | {exs} |")
    log("")
    log("mixed per-head modes in one launch (v2) vs the sum of its heads' shares of the "
        "single-mode launches (goal: mixed <= sum)")
    log("| N | dens | mixed ms | sum of shares ms | mixed / sum |")
    log("|---|---|---|---|---|")
    for r in res["rows"]:
        m = r.get("mixed_vs_shares")
        if m:
            log(f"| {r['N']} | {r['density']:.3f} | {m['mixed_ms']:.3f} | "
                f"{m['sum_of_shares_ms']:.3f} | {m['mixed_ms'] / m['sum_of_shares_ms']:.2f} |")
    names = [x[0] for x in IMPLS]
    for key, title in OPS:
        ref = "flex" if key.startswith("mask") else "SDPA"
        log("")
        log(f"{title}: ms (x {ref}, GB/s, TFLOP/s); v3 rel = ‖O_v3 − O_v2‖ / ‖O_v2‖")
        log("| N | dens | " + " | ".join(names) + " | v2/v3 | max rel vs v2 |")
        log("|---|---|" + "---|" * len(names) + "---|---|")
        for r in res["rows"]:
            d = r.get(key)
            if not d:
                continue
            base = r.get("flex_ms") if ref == "flex" else r["sdpa_ms"]
            cells = []
            for nm in names:
                x = d.get(nm)
                if not x:
                    cells.append("-")
                    continue
                xs = "-" if not base else f"{base / x['ms']:.2f}"
                cells.append(f"{x['ms']:.3f} ({xs}, {x['GBps']:.0f}, {x['TFLOPs']:.0f})")
            sp = d["v2"]["ms"] / d["v3"]["ms"] if "v3" in d and "v2" in d else float("nan")
            rels = f"{max((d[nm]['rel_vs_v2'] for nm in names[1:] if nm in d), default=0.0):.1e}"
            log(f"| {r['N']} | {r['density']:.3f} | " + " | ".join(cells) +
                f" | {sp:.2f} | {rels} |")
