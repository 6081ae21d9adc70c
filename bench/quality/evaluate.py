#!/usr/bin/env python3
"""Calibrates and evaluates map reuse from the source model into the target (run.sh calls it).

1. Calibration: dense attention maps of both models on CAL windows of the calibration split
   (never trained on) go once into the calibration library (kernels/calibrate.c through
   libmfkernels_ref.so: the code of mapflow-calibrate, without writing GBs of .npy); then
   one fit per rule setting (CONFIGS: mask recall threshold, per-head target Top-P, prob
   error limit, calibration objective: maps, or head outputs A·V with the target's V fed
   through add_outputs) writes OUT/profiles/<name>.pb (and the IAM-style argmax profile), read back
   here from the protobuf and applied as they are (modes, W, per-head Top-P).
2. Test (State of the Union 1991–2021 = "in", Moby-Dick = "out"; windows of CTX tokens):
   per window the source runs once and its rows are extracted by our extract kernel
   (--exporter: mf_extract_cuda, the fused mf_export_cuda, or extract's strided query
   sample with the source's LSE, beside the same sweep on exact-mass rows); the
   target runs once with every layer through our apply kernel's compute path (the reference,
   "target alone") and once per variant with the mapped layers through our apply kernel
   (prob / mask / compute per head). Metrics per variant and split: perplexity and its change,
   KL(target ‖ reuse) per token, top-1 agreement, per-layer relative L1 error of the attention
   output (against exact attention on the same inputs), density after the union over mixed
   heads, row bytes per token per mapped layer, share of the target's attention FLOPs
   (QKᵀ + PV pairs) skipped, share of heads in prob mode.
Writes OUT/quality.json. --backend ref runs the C reference on the CPU (smoke test).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "handoff"))  # after HERE: its model.py is not ours
import blocksel as BS  # noqa: E402
import flexprefill as FP  # noqa: E402  (FlexPrefill's selection, shared with bench/handoff)
import mfk  # noqa: E402
import model as M  # noqa: E402

T0 = time.time()

# Calibration rule settings (mf_calib_opts_t fields on top of COMMON below); the first
# one's fit gives W and the source layer of every target layer to the per-layer variants.
NO_PROB = dict(prob_max_error=1e-9)  # prob mode is not emulated
CONFIGS = [
    ("r0.9", {}),  # the defaults: mask if recall ≥ 0.9 at Top-P 0.95, prob if error < 0.2
    ("r0.9-minl0=1", dict(min_l0=1)),
    ("r0.95", dict(mask_min_recall=0.95)),
    ("r0.85-php", dict(mask_min_recall=0.85, per_head_top_p=1)),
    ("r0.9-php", dict(mask_min_recall=0.9, per_head_top_p=1)),
    ("r0.95-php", dict(mask_min_recall=0.95, per_head_top_p=1)),
    ("r0.97-php", dict(mask_min_recall=0.97, per_head_top_p=1)),
    ("r0.98-php", dict(mask_min_recall=0.98, per_head_top_p=1)),
    ("r0.99-php", dict(mask_min_recall=0.99, per_head_top_p=1)),
    ("r0.97-php-minl0=1", dict(mask_min_recall=0.97, per_head_top_p=1, min_l0=1)),
    ("r0.97-php-minl0=2", dict(mask_min_recall=0.97, per_head_top_p=1, min_l0=2)),
    ("r0.9-php-noprob", dict(mask_min_recall=0.9, per_head_top_p=1, **NO_PROB)),
    ("r0.95-php-noprob", dict(mask_min_recall=0.95, per_head_top_p=1, **NO_PROB)),
    ("r0.97-php-noprob", dict(mask_min_recall=0.97, per_head_top_p=1, **NO_PROB)),
    ("r0.98-php-noprob", dict(mask_min_recall=0.98, per_head_top_p=1, **NO_PROB)),
    ("r0.99-php-noprob", dict(mask_min_recall=0.99, per_head_top_p=1, **NO_PROB)),
    ("r0.995-php-noprob", dict(mask_min_recall=0.995, per_head_top_p=1, **NO_PROB)),
    ("r0.9-php-prob0.3", dict(mask_min_recall=0.9, per_head_top_p=1, prob_max_error=0.3)),
    ("r0.9-php-prob0.5", dict(mask_min_recall=0.9, per_head_top_p=1, prob_max_error=0.5)),
    # 16-token blocks: the CUDA kernels take B ≥ 32, so these profiles are applied by the
    # PyTorch emulation of the kernels' rules (emulate_*; checked against mf_apply_ref)
    ("r0.95-php-B16", dict(mask_min_recall=0.95, per_head_top_p=1, block_size=16, **NO_PROB)),
    ("r0.97-php-B16", dict(mask_min_recall=0.97, per_head_top_p=1, block_size=16, **NO_PROB)),
    ("r0.98-php-B16", dict(mask_min_recall=0.98, per_head_top_p=1, block_size=16, **NO_PROB)),
    ("r0.99-php-B16", dict(mask_min_recall=0.99, per_head_top_p=1, block_size=16, **NO_PROB)),
]
# Prob mode (issue 21, goal 3): the prob gate under each calibration objective (maps: W
# fitted to the attention maps, gated by the map's error; outputs: W fitted to the head
# outputs A·V with the target's own V, gated by the output error), the other heads mask
# with per-head Top-P at R 0.97 as "r0.97-php" (which is maps at the default gate 0.2).
# These run in --methods-only too (the long pair): prob_mode() reports them per objective.
PROB_GATES = {"maps": (0.2, 0.3), "outputs": (0.05, 0.1, 0.2, 0.3)}
PROB_MASK = dict(mask_min_recall=0.97, per_head_top_p=1)
for _obj, _gates in PROB_GATES.items():
    for _g in _gates:
        if _obj == "maps" and _g == 0.2:
            continue  # r0.97-php itself
        CONFIGS.append(("%s-prob%g-r0.97-php" % ("out" if _obj == "outputs" else "map", _g),
                        dict(PROB_MASK, prob_max_error=_g,
                             objective=mfk.OUTPUTS if _obj == "outputs" else mfk.MAPS)))


def prob_study(name):
    """(objective, prob gate) of a CONFIGS entry in the prob-mode study, else None."""
    if name == "r0.97-php":
        return "maps", 0.2
    for obj, pre in (("maps", "map-prob"), ("outputs", "out-prob")):
        if name.startswith(pre) and name.endswith("-r0.97-php"):
            return obj, float(name[len(pre):-len("-r0.97-php")])
    return None


IAM_CONFIG = "r0.9-php"  # its IAM-style argmax profile is evaluated too
ROW_TOP_P = 0.95         # the source rows' Top-P for calibrated profiles (= mask_top_p)
# --exporter strided: mapflow-mask's sweep again on rows from the exact masses
EXACT_EXPORTER = "mapflow-mask-exact-rows"
MAPFLOW_MASK = "r0.97-php-noprob"  # its mapped layers are every method's layers
# The trade-off sweeps (issue 21): method → knob values; every one runs through the same
# apply path (mask heads; target-side selections as rows with W = I, Top-P 1), on the same
# layers, with the same forced sink/diagonal blocks and recompute policy.
SWEEPS = {
    "mapflow-mask": ("R", (0.9, 0.95, 0.97, 0.98, 0.99, 0.995)),   # calibrated, per-head Top-P
    "oracle": ("top_p", (0.8, 0.9, 0.95, 0.97, 0.98, 0.99)),      # the target's own masses
    "xattention": ("tau", (0.8, 0.9, 0.95, 0.97, 0.99)),
    "flexprefill": ("gamma", (0.8, 0.9, 0.95, 0.97, 0.99)),
    "pooled-qk": ("density", (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)),
    "random-w-calibrated": ("R", (0.95, 0.98, 0.99)),
}
ALL_SWEEPS = dict(SWEEPS)  # variants() builds every sweep; --sweeps trims SWEEPS


def log(*a):
    print("[eval %6.1fs]" % (time.time() - T0), *a, flush=True)


# ---- the profile file (Mapflow__V1__MappingProfile, proto/mapflow.proto) ----------------

def _varint(b, i):
    x = s = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7f) << s
        s += 7
        if c < 0x80:
            return x, i


def _fields(b):
    i, out = 0, []
    while i < len(b):
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("profile: wire type %d" % wt)
        out.append((f, wt, v))
    return out


def _f32(v):
    return float(np.frombuffer(bytes(v), np.float32)[0])


def read_profile(path):
    """{l0, block, recompute_last, layers: {t: {source, w [Ht, Hs], mode [Ht], error [Ht]}}}."""
    with open(path, "rb") as f:
        buf = f.read()
    prof = {"l0": 0, "block": 0, "recompute_last": 0, "layers": {}}
    for f, wt, v in _fields(buf):
        if f == 3:
            prof["block"] = v
        elif f == 4:
            prof["l0"] = v
        elif f == 7:
            for g, _, x in _fields(v):
                if g == 1:
                    prof["recompute_last"] = x
        elif f == 6:
            lm = {"target": 0, "source": 0, "ht": 0, "hs": 0, "w": [], "heads": []}
            for g, gwt, x in _fields(v):
                if g in (1, 2, 3, 4):
                    lm[{1: "target", 2: "source", 3: "ht", 4: "hs"}[g]] = x
                elif g == 5:
                    lm["w"].extend(np.frombuffer(bytes(x), np.float32).tolist() if gwt == 2
                                   else [_f32(x)])
                elif g == 7:
                    hp = {"mode": 0, "error": 0.0, "top_p": 0.0}
                    for h, _, y in _fields(x):
                        if h == 1:
                            hp["mode"] = y
                        elif h == 2:
                            hp["error"] = _f32(y)
                        elif h == 3:
                            hp["top_p"] = _f32(y)
                    lm["heads"].append(hp)
            prof["layers"][lm["target"]] = {
                "source": lm["source"],
                "w": np.asarray(lm["w"], np.float32).reshape(lm["ht"], lm["hs"]),
                "mode": np.asarray([h["mode"] for h in lm["heads"]], np.uint8),
                "error": np.asarray([h["error"] for h in lm["heads"]], np.float64),
                "top_p": np.asarray([h["top_p"] for h in lm["heads"]], np.float32)}
    return prof


# ---- calibration --------------------------------------------------------------------------

@torch.no_grad()
def dense_maps(m, idx, keep=None):
    """[L, H, N, N] softmax maps of one sequence (float32, numpy); keep: a dict whose lists
    "p" and "v" get every layer's map [H, N, N] and values [Hkv, N, d] (float32, on the
    model's device: the output objective's products)."""
    maps = []

    def hook(layer, q, k, v):
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        p = torch.softmax(s, -1)
        maps.append(p[0].cpu().numpy())
        if keep is not None:
            keep["p"].append(p[0])
            keep["v"].append(v[0].float())
        return (p @ v.float()).to(q.dtype)
    m(idx, attn=hook)
    return np.stack(maps)


@torch.no_grad()
def add_outputs(cb, ps, pt, vt):
    """One window's statistics of the OUTPUTS objective (mf_calib_add_outputs): per target
    layer t and source layer l, every source head's map applied to each of the target's kv
    heads' V, O_s = A_l[s]·V_t[g], and the target's own outputs A_t[h]·V_t[h // (Ht/Hkv)],
    computed here on the model's device (the C feed mf_calib_add_v computes the same
    products on the CPU: N²·d per product, too slow at 2048 tokens and 144 source heads).
    The maps are causal (zeros above the diagonal), so the full product is the causal one."""
    for t, (at, v) in enumerate(zip(pt, vt)):
        ot = torch.einsum("hqk,hkd->hqd", at, v.repeat_interleave(at.shape[0] // v.shape[0],
                                                                   0)).cpu().numpy()
        for l, al in enumerate(ps):
            cb.add_outputs(t, l, torch.einsum("sqk,gkd->gsqd", al, v).cpu().numpy(), ot)


def summary_text(name, kw, fit, count):
    """mapflow-calibrate's summary for one rule setting."""
    lines = ["[%s] %s: calibrated on %d sequences; L0 = %d" % (
        name, " ".join("%s=%g" % x for x in kw.items()) or "defaults", count, fit["l0"]),
        "%-6s %-6s %-7s %-7s %-7s %s" % ("target", "source", "error", "iam-err", "modes",
                                         "per head: mask recall @ target Top-P")]
    counts = [0, 0, 0]
    for lm in fit["layers"]:
        t = lm["target"]
        head = "%-6d %-6d %-7.4f %-7.4f " % (t, lm["source"], lm["error"], lm["base_error"])
        if t < fit["l0"]:
            lines.append(head + "(below L0: computed)")
            continue
        for md in lm["mode"]:
            counts[md] += 1
        lines.append(head + "%-7s " % "".join("cpm"[md] for md in lm["mode"]) + " ".join(
            "%.3f@%.3g" % (r, p) for r, p in zip(lm["recall"], lm["top_p"])))
    lines.append("heads in mapped layers: %d prob, %d mask, %d compute" % (
        counts[1], counts[2], counts[0]))
    return "\n".join(lines) + "\n"


def jsonable(fit):
    return {"l0": fit["l0"], "layers": [
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in lm.items()}
        for lm in fit["layers"]]}


def needed_configs(methods_only):
    """The CONFIGS to fit: all of them, or with --methods-only those its variants use (the
    mapflow-mask sweep, the prob study and CONFIGS[0], whose W and source layers the
    per-layer variants and the random-W control take)."""
    if not methods_only:
        return list(CONFIGS)
    return [(n, kw) for n, kw in CONFIGS if n == CONFIGS[0][0] or prob_study(n) or
            sweep_config(kw)]


def sweep_config(kw):
    """Whether a CONFIGS entry is a point of the mapflow-mask sweep."""
    return (kw.get("per_head_top_p", 0) and kw.get("prob_max_error") == NO_PROB["prob_max_error"]
            and not kw.get("block_size") and not kw.get("min_l0"))


def calibrate(args, src, tgt, dev, configs):
    """{config: {"fit": all target layers, "profile": read back from its .pb}} for configs
    (a list of CONFIGS entries), the IAM profile, the JSON of every fit, the summary text
    and the calibration windows' block masses ({"src", "tgt"}: per window, per layer [H,
    nb, nb]); sets args.dev_starts."""
    cal = np.load(os.path.join(args.work, "tokens_calib.npy")).astype(np.int64)
    n = args.cal_n
    # calibration and dev windows (thresholds are chosen there) interleaved, disjoint
    try:
        starts, args.dev_starts = BS.split_calib(len(cal), n, args.cal_windows, args.test_ctx,
                                                 args.dev_windows)
    except ValueError as ex:
        raise SystemExit("evaluate: calibration split too short: %s" % ex)
    count = len(starts)
    t = time.time()
    cb = mfk.Calib(src.cfg.n_layer, src.cfg.n_head, tgt.cfg.n_layer, tgt.cfg.n_head)
    bm = {"src": [], "tgt": []}  # block masses per window: the random-W control's calibration
    outputs = any(kw.get("objective") == mfk.OUTPUTS for _, kw in configs)
    t_out = 0.0
    for w in starts:
        idx = torch.from_numpy(cal[w:w + n])[None].to(dev)
        ks, kt = ({"p": [], "v": []}, {"p": [], "v": []}) if outputs else (None, None)
        ms, mt = dense_maps(src, idx, ks), dense_maps(tgt, idx, kt)
        cb.add(ms, mt)
        if outputs:
            t1 = time.time()
            add_outputs(cb, ks["p"], kt["p"], kt["v"])
            t_out += time.time() - t1
            del ks, kt
        bm["src"].append([BS.block_masses(x, args.block) for x in ms])
        bm["tgt"].append([BS.block_masses(x, args.block) for x in mt])
        del ms, mt
    log("calibration maps: %d windows of %d tokens, added in %.1f s (output statistics "
        "%.1f s of it)" % (count, n, time.time() - t, t_out))
    common = dict(min_l0=0, block_size=args.block, recompute_last=args.recompute_last,
                  mask_top_p=ROW_TOP_P, source_model=b"source", target_model=b"target")
    pdir = os.path.join(args.out, "profiles")
    os.makedirs(pdir, exist_ok=True)
    out, js, text, iam = {}, {}, [], None
    t = time.time()
    for name, kw in configs:
        fit = cb.fit(**dict(common, **kw))
        path = os.path.join(pdir, name + ".pb")
        cb.save_profile(path)
        out[name] = {"fit": fit, "profile": read_profile(path)}
        if name == IAM_CONFIG:
            cb.save_profile(os.path.join(pdir, "iam-" + name + ".pb"), baseline=1)
            iam = read_profile(os.path.join(pdir, "iam-" + name + ".pb"))
        js[name] = dict(jsonable(fit), opts=kw)
        text.append(summary_text(name, kw, fit, count))
    cb.close()
    log("calibration fits: %d settings in %.1f s" % (len(configs), time.time() - t))
    return out, iam, js, "\n".join(text), bm


# ---- variants -----------------------------------------------------------------------------

def variants(cal, lt):
    v = []
    for codec in ("fp8", "u8log"):
        v.append(dict(name="prob-%s-L0=1" % codec, group="prob per layer", kind="fit", l0=1,
                      policy="prob", codec=codec, p=0.95))
    v.append(dict(name="prob-fp8-last", group="prob per layer", kind="fit", l0=lt - 1,
                  policy="prob", codec="fp8", p=0.95))
    for l0, ps in ((0, (0.8, 0.9, 0.95, 0.99)), (1, (0.9, 0.95, 0.99))):
        for p in ps:
            v.append(dict(name="mask-p%g-L0=%d" % (p, l0), group="mask per layer L0=%d" % l0,
                          kind="fit", l0=l0, policy="mask", codec="mask", p=p))
    for name, kw in CONFIGS:
        if name not in cal:  # not fitted (--methods-only)
            continue
        php = kw.get("per_head_top_p", 0)
        group = ("calibrated, per-head Top-P" if php else "calibrated, Top-P 0.95") + \
            (" + prob" if "prob_max_error" in kw else "")
        b = kw.get("block_size", 0)
        if b and b < 32:  # below the CUDA kernels' smallest block: emulated
            v.append(dict(name="emu-cal-" + name, group="emulated B=%d, calibrated" % b,
                          kind="calib", cfg=name, l0=cal[name]["profile"]["l0"],
                          policy="profile", codec="mask", p=ROW_TOP_P, emu=True, block=b))
            continue
        d = dict(name="cal-" + name, group=group, kind="calib", cfg=name,
                 l0=cal[name]["profile"]["l0"], policy="profile", codec="fp8", p=ROW_TOP_P)
        if sweep_config(kw):
            d.update(method="mapflow-mask", knob=kw["mask_min_recall"])
        if prob_study(name):  # (objective, prob gate): prob_mode() reports these
            d.update(prob=prob_study(name))
            d["group"] = "prob mode, %s objective" % d["prob"][0]
        v.append(d)
    for r in (0, 4):  # recompute the last R query blocks exactly (the profile says 1)
        v.append(dict(name="cal-r0.97-php-R%d" % r, group="recompute last R", kind="calib",
                      cfg="r0.97-php", l0=cal["r0.97-php"]["profile"]["l0"],
                      policy="profile", codec="fp8", p=ROW_TOP_P, recompute=r))
    v.append(dict(name="iam-prob-L0=1", group="IAM-style", kind="iam", l0=1, policy="prob",
                  codec="fp8", p=0.95))
    v.append(dict(name="iam-mask-p0.9-L0=0", group="IAM-style", kind="iam", l0=0,
                  policy="mask", codec="mask", p=0.9))
    v.append(dict(name="iam-cal-" + IAM_CONFIG, group="IAM-style", kind="iam-calib",
                  cfg=IAM_CONFIG, l0=0, policy="profile", codec="fp8", p=ROW_TOP_P))
    v.append(dict(name="random-prob-L0=1", group="control", kind="random", l0=1, policy="prob",
                  codec="fp8", p=0.95))
    for p in (0.9, 0.95):
        v.append(dict(name="random-mask-p%g-L0=0" % p, group="control", kind="random", l0=0,
                      policy="mask", codec="mask", p=p))
    v.append(dict(name="uniform-L0=1", group="control", kind="uniform", l0=1,
                  policy="uniform", codec="none", p=1.0))
    l0m = cal[MAPFLOW_MASK]["profile"]["l0"]  # the layers MapFlow mask maps
    for p in ALL_SWEEPS["oracle"][1]:  # the target's own exact block masses, Top-P
        v.append(dict(name="own-p%g-L0=%d" % (p, l0m), group="oracle (own Top-P)",
                      kind="own", l0=l0m, policy="own", codec="mask", p=p, method="oracle",
                      knob=p))
    for p in (0.9, 0.95):
        v.append(dict(name="own-p%g-L0=%d" % (p, l0m + 1), group="own top-p L0=%d" % (l0m + 1),
                      kind="own", l0=l0m + 1, policy="own", codec="mask", p=p))
    # target-side estimators from the target's own Q, K of the same forward pass
    for method, sel in (("xattention", "xattn"), ("flexprefill", "flexprefill"),
                        ("pooled-qk", "pooled")):
        knob = ALL_SWEEPS[method][0]
        for x in ALL_SWEEPS[method][1]:
            v.append(dict(name="%s-%s%g" % (method, knob, x), group=method, kind="target",
                          sel=sel, l0=l0m, policy="target", codec="mask", p=1.0,
                          method=method, knob=x))
    for r in ALL_SWEEPS["random-w-calibrated"][1]:  # random W, then the per-head Top-P rule
        v.append(dict(name="random-cal-r%g" % r, group="control", kind="random-cal",
                      l0=l0m, policy="mask", codec="mask", p=ROW_TOP_P, recall=r,
                      method="random-w-calibrated", knob=r))
    # The emulation at B = 32 next to the kernels' own numbers (the same rules: the pairs
    # must agree), then at B = 16: the target's own Top-P bound and the fitted W.
    v.append(dict(name="emu-cal-r0.97-php-noprob", group="emulated B=32 (check)",
                  kind="calib", cfg="r0.97-php-noprob",
                  l0=cal["r0.97-php-noprob"]["profile"]["l0"], policy="profile",
                  codec="mask", p=ROW_TOP_P, emu=True, block=32))
    v.append(dict(name="emu-own-p0.95-L0=0", group="emulated B=32 (check)", kind="own", l0=0,
                  policy="own", codec="mask", p=0.95, emu=True, block=32))
    for p in (0.9, 0.95, 0.97):
        v.append(dict(name="emu-own-p%g-L0=0-B16" % p, group="emulated B=16, own top-p",
                      kind="own", l0=0, policy="own", codec="mask", p=p, emu=True, block=16))
    for p in (0.9, 0.95):
        v.append(dict(name="emu-mask-p%g-L0=0-B16" % p, group="emulated B=16, mask per layer",
                      kind="fit", l0=0, policy="mask", codec="mask", p=p, emu=True, block=16))
    return v


def layer_plans(var, cal, iam, ht, hs, lt, seed, bm=None):
    """{t: (source layer, W, mode, top_p)} for the mapped layers of a variant (bm: the
    calibration windows' block masses, for the calibrated random-W control)."""
    rng = np.random.default_rng(seed)
    plans = {}
    if var["kind"] in ("calib", "iam-calib"):  # the profile as calibrated
        prof = iam if var["kind"] == "iam-calib" else cal[var["cfg"]]["profile"]
        for t, lm in prof["layers"].items():
            if (lm["mode"] != mfk.COMPUTE).any():
                plans[t] = (lm["source"], lm["w"], lm["mode"], lm["top_p"])
        return plans
    fit = cal[CONFIGS[0][0]]["fit"]["layers"]  # every target layer's W and source layer
    for t in range(var["l0"], lt):
        if var["kind"] in ("own", "uniform", "target"):
            plans[t] = (t, np.eye(ht, dtype=np.float32), np.full(ht, mfk.MASK_MODE, np.uint8),
                        np.ones(ht, np.float32))
            continue
        lm = fit[t]
        w = (lm["base_w"] if var["kind"] == "iam" else lm["w"]).copy()
        if var["kind"] in ("random", "random-cal"):
            w = rng.dirichlet(np.ones(hs), size=ht).astype(np.float32)
        mode = np.full(ht, mfk.PROB if var["policy"] == "prob" else mfk.MASK_MODE, np.uint8)
        top_p = np.full(ht, var["p"], np.float32)
        if var["kind"] == "random-cal":  # the per-head Top-P rule of calibrate.c for this W
            top_p, rec = BS.calibrate_top_p([x[lm["source"]] for x in bm["src"]],
                                            [x[t] for x in bm["tgt"]], w, ROW_TOP_P,
                                            var["recall"])
            mode[rec < var["recall"]] = mfk.COMPUTE  # as the rule: no Top-P reaches R
        plans[t] = (lm["source"], w, mode, top_p)
    return plans


# ---- evaluation ---------------------------------------------------------------------------

class Acc:
    def __init__(self, lt):
        self.nll = self.kl = self.agree = self.tokens = 0.0
        self.l1 = np.zeros((lt, 2))
        self.work = np.zeros(4)        # qk, pv, attended, dense-of-mapped
        self.dense = 0.0               # qk + pv of the whole target, dense
        self.acct_windows = 0
        self.row_bytes = self.row_tokens = 0.0
        self.heads = np.zeros(2)       # prob heads, heads (all target layers)
        self.windows = 0
        # per window (the bootstrap): nll, kl, agree, tokens, work (qk + pv), dense
        self.win = {k: [] for k in ("nll", "kl", "agree", "tokens", "work", "dense")}
        self._mark = (0.0,) * 6

    def close_window(self):
        """Appends this window's sums (the totals' change since the last call)."""
        now = (self.nll, self.kl, self.agree, self.tokens, self.work[0] + self.work[1],
               self.dense)
        for k, a, b in zip(("nll", "kl", "agree", "tokens", "work", "dense"), now, self._mark):
            self.win[k].append(float(a - b))
        self._mark = now

    def result(self, base):
        r = {"windows": self.windows, "tokens": int(self.tokens),
             "ppl": math.exp(self.nll / self.tokens) if self.tokens else float("nan")}
        if base is not None and base.tokens:
            r["dppl_pct"] = 100.0 * (r["ppl"] / base.result(None)["ppl"] - 1.0)
            r["kl"] = self.kl / self.tokens
            r["agree_pct"] = 100.0 * self.agree / self.tokens
        r["layer_rel_l1"] = [float(a / b) if b else None for a, b in self.l1]
        if self.acct_windows:
            r["skipped_pct"] = 100.0 * (1.0 - (self.work[0] + self.work[1]) / self.dense)
            r["density"] = float(self.work[2] / self.work[3]) if self.work[3] else None
        r["row_bytes_per_token_layer"] = (self.row_bytes / self.row_tokens
                                          if self.row_tokens else 0.0)
        r["prob_head_share"] = float(self.heads[0] / self.heads[1]) if self.heads[1] else 0.0
        if base is not None and base.tokens and len(self.win["tokens"]) == \
                len(base.win["tokens"]):
            r["ci"] = BS.bootstrap(dict(self.win, base_nll=base.win["nll"]), ARGS.boot,
                                   seed=ARGS.seed)
        return r


# --exporter strided: per (source layer, row Top-P), the kept (head, i, j) blocks of the
# exact extract, of the strided sample, and of both, summed over the windows.
RECALL = {}


def source_lse(q, k, chunk=1024):
    """The row LSE [H, N] fp32 (natural log) an engine's attention returns with O, from the
    model's q, k [1, H, N, d] in chunks of query rows: what the strided exporter is given."""
    q, k = q[0].float(), k[0].float()
    h, n, d = q.shape
    kt = k.transpose(1, 2) / math.sqrt(d)
    keys = torch.arange(n, device=q.device)
    out = torch.empty(h, n, dtype=torch.float32, device=q.device)
    for r0 in range(0, n, chunk):
        s = q[:, r0:r0 + chunk] @ kt
        s.masked_fill_(keys[None, :] > keys[r0:r0 + chunk, None], -math.inf)
        out[:, r0:r0 + chunk] = torch.logsumexp(s, -1)
    return out


class Window:
    """Per test window: the source's Q, K per layer and the rows extracted from them."""

    def __init__(self, be, src_qk, tokens, args):
        self.be, self.src_qk, self.tokens, self.args = be, src_qk, tokens, args
        self.rows, self.parsed = {}, {}

    def rows_for(self, layer, codec, p, exact=False):
        """The source's rows of (layer, codec, row Top-P); exact: from the exact masses even
        under --exporter strided (the paired mapflow-mask-exact variants)."""
        key = (layer, codec, p, exact)
        if key not in self.rows:
            ent = self.src_qk[layer]
            q, k = ent[:2]
            v = ent[2] if len(ent) > 2 else None
            lse = ent[3] if len(ent) > 3 else None  # --exporter strided: the source's LSE
            stride = self.args.sample_stride if lse is not None and not exact else 1
            self.rows[key] = self.be.extract(q, k, p, mfk.CODECS[codec], layer, self.tokens,
                                             ("src",) + key, lse=lse, v=v, sample_stride=stride)
            if stride > 1 and codec == "mask":
                self.count_recall(layer, p, q.shape[1], q.shape[0] // self.be.b)
        return self.rows[key]

    def count_recall(self, layer, p, hs, nb):
        """Kept sets of the strided rows against the exact masses' (same LSE, stride 1)."""
        ke = self.parsed_for(layer, p, hs, nb, exact=True)[0]
        ks = self.parsed_for(layer, p, hs, nb)[0]
        c = RECALL.setdefault((layer, p), [0, 0, 0])
        c[0] += int(ke.sum())
        c[1] += int((ke & ks).sum())
        c[2] += int(ks.sum())

    def parsed_for(self, layer, p, hs, nb, exact=False):
        key = (layer, p, exact)
        if key not in self.parsed:
            self.parsed[key] = mfk.parse_rows(self.rows_for(layer, "mask", p, exact), hs, nb)
        return self.parsed[key]

    def emu_rows(self, layer, b, p):
        """(keep, mass) of the source's mask rows at block b (emulated extraction)."""
        key = ("emu", layer, b, p)
        if key not in self.parsed:
            q, k = self.src_qk[layer][:2]
            self.parsed[key] = mfk.emu_extract(q, k, b, p)
        return self.parsed[key]


def to_kernel(x):
    """[1, H, N, d] → [N, H, d] fp16 contiguous."""
    return x[0].transpose(0, 1).to(torch.float16).contiguous()


def from_kernel(o, like):
    return o.transpose(0, 1)[None].to(like.dtype)


def compute(be, q, k, v, ht):
    o, _ = be.apply(None, np.ones((ht, 1), np.float32), np.zeros(ht, np.uint8),
                    np.ones(ht, np.float32), q, k, v, 0)
    return o


def run_target(tgt, idx, be, plans, var, win, acc, acct, ht, hs):
    """The target on one window with the variant's plans; returns logits [N, V]."""
    b = var.get("block", be.b)
    emu = var.get("emu", False)

    def hook(t, q, k, v):
        qh, kh, vh = to_kernel(q), to_kernel(k), to_kernel(v)
        n = qh.shape[0]
        nb = n // b
        plan = plans.get(t)
        if plan is None:
            if acct:
                acc.work[0] += ht * mfk.pair_counts(nb, b).sum()
                acc.work[1] += ht * mfk.pair_counts(nb, b).sum()
            return from_kernel(compute(be, qh, kh, vh, ht), q)
        src_l, w, mode, top_p = plan
        exact = compute(be, qh, kh, vh, ht)
        if var["policy"] == "uniform":
            cnt = torch.arange(1, n + 1, device=vh.device, dtype=torch.float32)[:, None, None]
            o = vh.float().cumsum(0) / cnt
            stats_pairs = None
        elif emu:  # the kernels' rules in PyTorch (block sizes the CUDA kernels lack)
            if var["policy"] == "own":
                stats_pairs = mfk.emu_extract(qh, kh, b, var["p"])
            else:
                stats_pairs = win.emu_rows(src_l, b, var["p"])
            o = mfk.emu_apply(stats_pairs[0], stats_pairs[1], w, mode, top_p, qh, kh, vh, b,
                              args_r)
        elif var["policy"] == "target":  # a target-side estimator's blocks, as mask rows
            kf = target_keep(var, qh, kh, b, n)
            o, st = be.apply(mfk.keep_rowset(be, kf, t), w, mode, top_p, qh, kh, vh, args_r)
            stats_pairs = (kf, kf.astype(np.float64))
            if st is not None and acct:
                check_stats(st, stats_pairs, w, mode, top_p, b, args_r, nb)
        elif var["policy"] == "own":
            rows = be.extract(qh, kh, var["p"], mfk.CODECS["mask"], t, win.tokens, ("own", t))
            o, _ = be.apply(rows, w, mode, top_p, qh, kh, vh, args_r)
            stats_pairs = mfk.parse_rows(rows, ht, nb) if acct else None
        else:
            any_prob = bool((mode == mfk.PROB).any())
            codec = var["codec"] if any_prob else "mask"
            ex_rows = var.get("exact_rows", False)
            rows = win.rows_for(src_l, codec, var["p"], ex_rows)
            o, st = be.apply(rows, w, mode, top_p, qh, kh, vh, args_r)
            acc.row_bytes += rows.total_bytes()
            acc.row_tokens += n
            stats_pairs = win.parsed_for(src_l, var["p"], hs, nb, ex_rows) if acct else None
            if st is not None and acct:
                check_stats(st, stats_pairs, w, mode, top_p, b, args_r, nb)
        acc.heads += [(mode == mfk.PROB).sum(), 0]
        acc.l1[t] += [float((o - exact).abs().sum()), float(exact.abs().sum())]
        if acct:
            if stats_pairs is None:  # uniform: QKᵀ skipped, PV over everything
                d = mfk.pair_counts(nb, b).sum() * ht
                acc.work += [0, d, d, d]
            else:
                acc.work += mfk.work(stats_pairs[0], stats_pairs[1], w, mode, top_p, b, args_r)
        return from_kernel(o, q)

    args_r = var.get("recompute", ARGS.recompute_last)
    acc.heads[1] += ht * tgt.cfg.n_layer
    return tgt(idx, attn=hook)[0].float()


def target_keep(var, q, k, b, n):
    """The blocks a target-side estimator keeps from the target's own Q, K [N, H, d] at
    block b, with the sink and the diagonal: keep [H, nb, nb] bool (NumPy)."""
    if var["sel"] == "xattn":
        keep = BS.xattn_keep(q, k, b, ARGS.xattn_stride, var["knob"], t=torch)
    elif var["sel"] == "flexprefill":
        sc = FP.Scores(torch, q, k, bf=b, tau=ARGS.fp_tau)
        keep = sc.keep(var["knob"], ARGS.fp_min_budget or max(1, n // 32)).cpu().numpy()
    else:
        keep = FP.pooled_keep(torch, q, k, var["knob"], bf=b).cpu().numpy()
    nb = n // b
    ii = np.arange(nb)
    forced = (ii[None, :] == 0) | (ii[None, :] == ii[:, None])
    return (keep | forced[None]) & (ii[None, :] <= ii[:, None])[None]


def check_stats(st, parsed, w, mode, top_p, b, r, nb):
    """Ref backend: mf_apply_ref's own counters must equal what work() derives from rows."""
    keep, mass = parsed
    sel = mfk.select_mask(keep, mass, w, top_p)
    exact = np.arange(nb) >= nb - r
    want = sum(int(sel[t][~exact].sum()) for t in range(w.shape[0]) if mode[t] == mfk.MASK_MODE)
    if st.mask_blocks != want:
        raise SystemExit("check: mask blocks %d (kernel) != %d (work())" % (st.mask_blocks, want))
    union = np.einsum("ts,sij->tij", (w > 0).astype(float), keep.astype(float)) > 0
    want = sum(int(union[t][~exact].sum()) for t in range(w.shape[0]) if mode[t] == mfk.PROB)
    if st.prob_tiles != want:
        raise SystemExit("check: prob tiles %d (kernel) != %d (work())" % (st.prob_tiles, want))
    CHECKED[0] += 1


CHECKED = [0]
ARGS = None


@torch.no_grad()
def emu_check(src, tgt, tokens, plan, b, p, r, dev):
    """The PyTorch emulation (mfk.emu_*) against the C reference kernels (mf_extract_ref,
    mf_apply_ref) at block b on one real window, for one target layer of a profile: the
    rows' kept blocks, the blocks the apply kernel attends, and the output."""
    t, (src_l, w, mode, top_p) = plan
    idx = torch.from_numpy(tokens.astype(np.int64))[None].to(dev)
    got = {}

    def grab(name, layer):
        def hook(i, q, k, v):
            if i == layer:
                got[name] = (to_kernel(q), to_kernel(k), to_kernel(v))
            return M.causal_attention(q, k, v)
        return hook
    src(idx, attn=grab("src", src_l))
    tgt(idx, attn=grab("tgt", t))
    (qs, ks, _), (qt, kt, vt) = got["src"], got["tgt"]
    n = qs.shape[0]
    ref = mfk.Ref(b)
    rows = ref.extract(qs.cpu(), ks.cpu(), p, mfk.CODECS["mask"], src_l,
                       tokens.astype(np.uint32), None)
    o_ref, st = ref.apply(rows, w, mode, top_p, qt.cpu(), kt.cpu(), vt.cpu(), r)
    keep_ref, mass_ref = mfk.parse_rows(rows, qs.shape[1], n // b)
    keep, mass = mfk.emu_extract(qs, ks, b, p)
    o = mfk.emu_apply(keep, mass, w, mode, top_p, qt, kt, vt, b, r).cpu()
    sel = mfk.select_mask(keep, mass, w, top_p)
    exact = np.arange(n // b) >= n // b - r
    emu_blocks = sum(int(sel[h][~exact].sum()) for h in range(w.shape[0])
                     if mode[h] == mfk.MASK_MODE)
    out = {"block": b, "tokens": int(n), "target_layer": int(t), "source_layer": int(src_l),
           "row_top_p": p, "kept_blocks_ref": int(keep_ref.sum()),
           "kept_blocks_differ": int((keep_ref != keep).sum()),
           "mass_max_diff": float(np.abs(mass_ref - mass).max()),
           "mask_blocks_ref": int(st.mask_blocks), "mask_blocks_emu": emu_blocks,
           "out_rel_l1": float((o - o_ref).abs().sum() / o_ref.abs().sum())}
    log("emulation vs mf_apply_ref:", out)
    return out


TARGET_SIDE = ("xattention", "flexprefill", "pooled-qk")


def _plain(x):
    """NumPy scalars and arrays for json.dump."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError("not JSON: %r" % type(x))


def _numbers(r):
    keys = ("dppl_pct", "kl", "agree_pct", "skipped_pct", "density", "ci", "windows")
    return {k: r.get(k) for k in keys}


def operating_points(res, vs, cal):
    """Per method of SWEEPS: the knob value chosen on the dev split (the most FLOPs skipped
    with Δppl ≤ +1 % and agreement ≥ 97 %), then its numbers on the test splits; and the
    verdict of MapFlow mask against the best target-side estimator at that quality
    (effective density = 1 − FLOPs skipped, over all of the target's attention). The
    "operating_points" key of quality.json (README: bench/handoff reads density, top_p,
    R from it)."""
    sp = res["splits"]
    ops = {}
    for method, (knob, _) in SWEEPS.items():
        pts = [dict(name=v["name"], knob=v["knob"], dev=sp["dev"]["variants"][v["name"]],
                    test={s: sp[s]["variants"][v["name"]] for s in ("in", "out")})
               for v in vs if v.get("method") == method and v["name"] in sp["dev"]["variants"]]
        rec = {"knob": knob, "swept": [p["knob"] for p in pts], "variant": None}
        op = BS.operating_point(pts)
        if op is not None:
            t = op["test"]
            rec.update(variant=op["name"], value=op["knob"], dev=_numbers(op["dev"]),
                       **{s: _numbers(t[s]) for s in t})
            # a test split the deadline left without windows has no numbers: the point
            # then passes nothing (reported as missing), it is not a crash
            missing = [s for s in t if t[s].get("skipped_pct") is None]
            rec["missing_splits"] = missing
            rec["density"] = t["in"].get("density")
            rec["effective_density"] = (None if missing else
                                        1.0 - 0.01 * min(t[s]["skipped_pct"] for s in t))
            rec["passes_test"] = not missing and all(BS.passes(t[s]) for s in t)
            rec["passes_test_ci"] = not missing and all(BS.passes(t[s], strict=True)
                                                        for s in t)
            rec["goal_50pct"] = rec["passes_test_ci"] and all(
                t[s]["skipped_pct"] >= 50.0 for s in t)
            spec = next(v for v in vs if v["name"] == op["name"])
            if method == "mapflow-mask":
                prof = cal[spec["cfg"]]["profile"]["layers"].values()
                tp = [float(x) for lm in prof for x, md in zip(lm["top_p"], lm["mode"])
                      if md == mfk.MASK_MODE]
                rec.update(R=op["knob"], top_p=float(np.mean(tp)) if tp else None,
                           row_top_p=ROW_TOP_P, profile=spec["cfg"] + ".pb")
            elif method == "random-w-calibrated":
                rec.update(R=op["knob"])
            elif method == "oracle":
                rec.update(top_p=op["knob"])
        ops[method] = rec
    mf = ops.get("mapflow-mask", {})
    best = [(m, ops[m]) for m in TARGET_SIDE
            if ops.get(m, {}).get("effective_density") is not None]
    verdict = {"rule": "MapFlow mask's effective density ≤ 0.8 × the best target-side "
               "estimator's, both at their dev-chosen operating points"}
    if mf.get("effective_density") is not None and best:
        m, b = min(best, key=lambda x: x[1]["effective_density"])
        ratio = mf["effective_density"] / b["effective_density"]
        verdict.update(best_target_side=m, ratio=float(ratio), met=bool(ratio <= 0.8))
    else:
        verdict.update(met=None, why="no dev-chosen operating point with numbers on "
                       "every test split for %s" % (
                           "MapFlow mask" if mf.get("effective_density") is None
                           else "any target-side estimator"))
    return ops, verdict


def prob_mode(res, vs, cal, lt):
    """Prob mode (issue 21, goal 3). "variant" / "per_layer" / splits: the calibrated
    profile with the most heads in prob mode whose dev Δppl ≤ +2 % (chosen on dev), its
    share of prob heads per target layer and its test numbers. "study": every profile of
    the prob study (objective maps / outputs × prob gate, PROB_GATES) with the same
    numbers; "by_objective": per objective the study's dev-chosen profile (most prob heads
    with dev Δppl ≤ +2 %, ties: more FLOPs skipped), {"variant": None} if none."""
    sp = res["splits"]

    def share(v):
        layers = cal[v["cfg"]]["profile"]["layers"]
        return [float((layers[t]["mode"] == mfk.PROB).mean()) if t in layers else 0.0
                for t in range(lt)]

    def numbers(v, sh):
        return {"variant": v["name"], "per_layer": sh, "share": float(np.mean(sh)),
                **{s: _numbers(sp[s]["variants"][v["name"]]) for s in ("dev", "in", "out")}}

    def choose(cands):
        best = None
        for v in cands:
            d = sp["dev"]["variants"][v["name"]]
            if d.get("dppl_pct") is None or d["dppl_pct"] > 2.0:
                continue
            sh = share(v)
            key = (sum(sh), d.get("skipped_pct") or 0.0)
            if best is None or key > best[0]:
                best = (key, v, sh)
        if best is None:
            return None
        r = numbers(best[1], best[2])
        if best[1].get("prob"):
            r["objective"], r["gate"] = best[1]["prob"]
        return r

    ran = [v for v in vs if v["kind"] == "calib" and v["name"] in sp["dev"]["variants"]]
    study = [v for v in ran if v.get("prob")]
    out = choose(ran) or {"variant": None}
    out["study"] = [dict(numbers(v, share(v)), objective=v["prob"][0], gate=v["prob"][1])
                    for v in sorted(study, key=lambda v: v["prob"])]
    out["by_objective"] = {obj: choose([v for v in study if v["prob"][0] == obj]) or
                           {"variant": None} for obj in PROB_GATES}
    return out


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("cuda", "ref"), default="cuda")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--exporter", choices=("extract", "fused", "strided"), default="extract",
                    help="source rows from mf_extract_cuda, or from mf_export_cuda (the "
                    "fused forward's masses: the exporter that ships; B = 64), or from "
                    "extract's strided query sample with the source's LSE (the approximate "
                    "exporter of a source whose attention we do not own)")
    ap.add_argument("--sample-stride", type=int, default=8,
                    help="--exporter strided: masses from every S-th query row of each block "
                    "(a power of two ≤ B; offset S / 2)")
    ap.add_argument("--recompute-last", type=int, default=1)
    ap.add_argument("--cal-windows", type=int, default=8)
    ap.add_argument("--cal-n", type=int, default=0, help="tokens per calibration window "
                    "(default: the test window)")
    ap.add_argument("--emu-check-n", type=int, default=1024,
                    help="tokens of the window that checks the emulation against mf_apply_ref")
    ap.add_argument("--ctx", type=int, default=0, help="test window (default: training ctx)")
    ap.add_argument("--windows", type=int, default=48, help="per split, at most")
    ap.add_argument("--acct-windows", type=int, default=1000,
                    help="per split, windows whose rows are parsed for density and FLOPs")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds; then stop adding "
                    "windows (every variant sees the same windows)")
    ap.add_argument("--only", default="", help="comma-separated variant names (smoke test)")
    ap.add_argument("--methods-only", action="store_true",
                    help="only the trade-off sweeps of SWEEPS (the long configuration)")
    ap.add_argument("--sweeps", default="",
                    help="comma-separated SWEEPS methods to run (default: all; the prob-mode "
                    "study runs whatever this says): fits the long pair's two block sizes "
                    "into one device call")
    ap.add_argument("--dev-windows", type=int, default=16,
                    help="dev windows (thresholds are chosen there), between the calibration "
                    "windows of the calibration split")
    ap.add_argument("--xattn-stride", type=int, default=8, help="XAttention's stride S")
    ap.add_argument("--fp-tau", type=float, default=0.1, help="FlexPrefill's JS threshold")
    ap.add_argument("--fp-min-budget", type=int, default=0,
                    help="FlexPrefill's min_budget tokens (default N/32: its 1024 at 32k)")
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=7, help="random W and the bootstrap")
    args = ARGS = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda" if args.backend == "cuda" else "cpu")
    with open(os.path.join(args.work, "meta.json")) as f:
        meta = json.load(f)
    src = M.load_model(meta["source"], os.path.join(args.work, "source.safetensors"), dev)
    tgt = M.load_model(meta["target"], os.path.join(args.work, "target.safetensors"), dev)
    ctx = args.test_ctx = args.ctx or meta["ctx"]
    args.cal_n = args.cal_n or ctx
    if args.block % args.xattn_stride or ctx % args.block or ctx % 128:
        raise SystemExit("evaluate: ctx %d must be a multiple of 128 and of B %d; the "
                         "XAttention stride %d must divide B" % (ctx, args.block,
                                                                 args.xattn_stride))
    lt, ht, hs = tgt.cfg.n_layer, tgt.cfg.n_head, src.cfg.n_head
    if args.exporter == "fused" and (args.backend != "cuda" or args.block != 64):
        raise SystemExit("evaluate: --exporter fused needs --backend cuda and --block 64 "
                         "(mf_export_cuda's fused masses are B = 64)")
    st = args.sample_stride
    if args.exporter == "strided" and not (1 <= st <= args.block and st & (st - 1) == 0):
        raise SystemExit("evaluate: --sample-stride %d must be a power of two in [1, B = %d]"
                         % (st, args.block))
    if args.exporter != "strided":
        args.sample_stride = 1
    be = (mfk.Cuda(args.block, args.exporter) if args.backend == "cuda"
          else mfk.Ref(args.block))
    if args.sweeps:
        keep = set(args.sweeps.split(","))
        if keep - set(SWEEPS):
            raise SystemExit("evaluate: --sweeps: unknown %s (known: %s)" % (
                ",".join(sorted(keep - set(SWEEPS))), ",".join(SWEEPS)))
        for m in [m for m in SWEEPS if m not in keep]:
            del SWEEPS[m]
    cal, iam, cal_json, cal_summary, bm = calibrate(args, src, tgt, dev,
                                                    needed_configs(args.methods_only))
    vs = variants(cal, lt)
    if args.exporter == "strided" and "mapflow-mask" in SWEEPS:
        # the same calibrated sweep on rows from the exact masses (same windows, same
        # models): the strided sample's quality effect, paired
        SWEEPS[EXACT_EXPORTER] = SWEEPS["mapflow-mask"]
        vs += [dict(v, name=v["name"] + "-exact-rows", group=v["group"] + ", exact masses",
                    method=EXACT_EXPORTER, exact_rows=True)
               for v in vs if v.get("method") == "mapflow-mask"]
    if args.only:
        keep = set(args.only.split(","))
        vs = [v for v in vs if v["name"] in keep]
    if args.methods_only:  # the sweeps and the prob-mode study
        vs = [v for v in vs if "method" in v or "prob" in v]
    vs = [v for v in vs if v.get("method") in SWEEPS or "method" not in v]
    plans = {v["name"]: layer_plans(v, cal, iam, ht, hs, lt, args.seed, bm) for v in vs}
    del bm
    tests = {s: np.load(os.path.join(args.work, "tokens_%s.npy" % s)).astype(np.int64)
             for s in ("in", "out")}
    starts = {s: [w * ctx for w in range(min(args.windows, (len(a) - 1) // ctx))]
              for s, a in tests.items()}
    # dev: windows of the calibration split beside the calibration windows (split_calib)
    tests["dev"] = np.load(os.path.join(args.work, "tokens_calib.npy")).astype(np.int64)
    starts["dev"] = args.dev_starts
    nwin = {s: len(x) for s, x in starts.items()}
    accs = {s: {v["name"]: Acc(lt) for v in vs} for s in tests}
    base = {s: Acc(lt) for s in tests}
    sdpa = {s: Acc(lt) for s in tests}
    failed = {}
    checks, checked = [], set()
    for v in vs:  # one emulated profile per block size, against the C reference kernels
        if v.get("emu") and v["kind"] == "calib" and v["block"] not in checked:
            pl = sorted(plans[v["name"]].items())
            if not pl:
                continue
            checked.add(v["block"])
            n_chk = min(ctx, args.emu_check_n) // v["block"] * v["block"]
            try:
                checks.append(dict(emu_check(src, tgt, tests["in"][:n_chk], pl[-1],
                                             v["block"], v["p"], v.get("recompute",
                                                                       args.recompute_last),
                                             dev), variant=v["name"]))
            except Exception as ex:  # noqa: BLE001  (a check, not the evaluation)
                log("emulation check %s failed: %r" % (v["name"], ex))
                checks.append({"variant": v["name"], "error": repr(ex)})
    order = [(s, w) for w in range(max(nwin.values())) for s in ("dev", "in", "out")
             if w < nwin[s]]
    log("test: %s windows of %d tokens, %d variants, backend %s, B %d" % (
        nwin, ctx, len(vs), be.name, args.block))
    with torch.no_grad():
        for s, w in order:
            if time.time() - T0 > args.deadline:
                log("deadline: stopping at window %d of %s" % (w, s))
                break
            w0 = starts[s][w]
            seq = torch.from_numpy(tests[s][w0:w0 + ctx + 1]).to(dev)
            idx, tgt_ids = seq[None, :-1], seq[1:]
            src_qk = {}

            def grab(layer, q, k, v):
                extra = ()
                if args.exporter == "fused":
                    extra = (to_kernel(v),)
                elif args.exporter == "strided":
                    extra = (None, source_lse(q, k))
                src_qk[layer] = (to_kernel(q), to_kernel(k)) + extra
                return M.causal_attention(q, k, v)
            src(idx, attn=grab)
            win = Window(be, src_qk, tests[s][w0:w0 + ctx].astype(np.uint32), args)
            acct = w < args.acct_windows
            ba = base[s]
            logits_b = run_target(tgt, idx, be, {}, {"policy": "compute"}, win, ba, acct, ht, hs)
            lp_b = F.log_softmax(logits_b, -1)
            top_b = lp_b.argmax(-1)
            ba.nll += float(F.nll_loss(lp_b, tgt_ids, reduction="sum"))
            ba.tokens += ctx
            ba.windows += 1
            ba.dense += 2 * ht * lt * mfk.pair_counts(ctx // args.block, args.block).sum() * acct
            ba.acct_windows += acct
            ba.close_window()
            lp_s = F.log_softmax(tgt(idx)[0].float(), -1)
            sdpa[s].nll += float(F.nll_loss(lp_s, tgt_ids, reduction="sum"))
            sdpa[s].tokens += ctx
            for v in vs:
                a = accs[s][v["name"]]
                if v["name"] in failed:
                    continue
                try:
                    logits = run_target(tgt, idx, be, plans[v["name"]], v, win, a, acct, ht, hs)
                except Exception as ex:  # noqa: BLE001  (one broken variant must not stop all)
                    failed[v["name"]] = repr(ex)
                    log("variant %s failed: %r" % (v["name"], ex))
                    continue
                lp = F.log_softmax(logits, -1)
                a.nll += float(F.nll_loss(lp, tgt_ids, reduction="sum"))
                a.kl += float((lp_b.exp() * (lp_b - lp)).sum())
                a.agree += float((lp.argmax(-1) == top_b).sum())
                a.tokens += ctx
                a.windows += 1
                if acct:
                    a.dense += 2 * ht * lt * mfk.pair_counts(ctx // args.block,
                                                             args.block).sum()
                    a.acct_windows += 1
                a.close_window()
            if w % 8 == 0:
                log("window %d of %s done" % (w, s))
    if be.check():
        raise SystemExit("evaluate: the apply kernel refused %d rows" % be.check())
    res = {"config": {"block": args.block, "recompute_last": args.recompute_last, "ctx": ctx,
                      "cal_windows": args.cal_windows, "cal_n": args.cal_n,
                      "backend": be.name, "source": meta["source"], "target": meta["target"],
                      "acct_windows": args.acct_windows, "ref_checks": CHECKED[0],
                      "dev_windows": len(args.dev_starts), "xattn_stride": args.xattn_stride,
                      "fp_tau": args.fp_tau, "fp_min_budget": args.fp_min_budget or ctx // 32,
                      "boot": args.boot, "seed": args.seed, "exporter": args.exporter,
                      "sample_stride": args.sample_stride},
           "calibration": cal_json, "calibration_summary": cal_summary,
           "profile_l0": {n: c["profile"]["l0"] for n, c in cal.items()},
           "variants": [v for v in vs if v["name"] not in failed],
           "failed": failed, "emu_checks": checks, "splits": {}}
    for s in tests:
        bres = base[s].result(None)
        bres["ppl_sdpa"] = sdpa[s].result(None)["ppl"]
        res["splits"][s] = {"base": bres,
                            "variants": {n: a.result(base[s]) for n, a in accs[s].items()
                                         if n not in failed}}
    if RECALL:
        tot = np.sum(list(RECALL.values()), axis=0)
        res["exporter_recall"] = {
            "stride": args.sample_stride, "offset": args.sample_stride // 2,
            "recall": float(tot[1] / max(tot[0], 1)),
            "density_ratio": float(tot[2] / max(tot[0], 1)),
            "per_layer_top_p": [{"layer": ly, "top_p": p, "recall": c[1] / max(c[0], 1),
                                 "density_ratio": c[2] / max(c[0], 1)}
                                for (ly, p), c in sorted(RECALL.items())]}
        log("strided exporter: kept-set recall %.4f, density ratio %.3f vs exact masses" % (
            res["exporter_recall"]["recall"], res["exporter_recall"]["density_ratio"]))
    res["operating_points"], res["verdict"] = operating_points(res, vs, cal)
    res["prob_mode"] = prob_mode(res, vs, cal, lt)
    trp = os.path.join(args.work, "train.json")
    if os.path.exists(trp):
        with open(trp) as f:
            res["train"] = json.load(f)
    with open(os.path.join(args.out, "quality.json"), "w") as f:
        json.dump(res, f, indent=1, default=_plain)
    log("wrote", os.path.join(args.out, "quality.json"), "ref checks:", CHECKED[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
