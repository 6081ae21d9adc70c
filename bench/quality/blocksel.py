"""Block selection and statistics of the quality evaluation, in NumPy only (issue 21), so
tests/python/test_quality_blocksel.py checks them in `make test` on a machine without torch.

Owns:
  - the apply kernel's selection rules over mask rows: pair_counts, select_mask, work,
    parse_rows (moved here from mfk.py, which re-exports them);
  - keep_rows: a target-side selection (keep [H, nb, nb]) as mask rows, so every
    target-side estimator goes through the same apply path (mf_apply_ref / mf_apply_cuda
    mask heads, W = I, Top-P 1: every kept block and the forced ones);
  - XAttention's antidiagonal-strided block scores (xattn_scores) and its cumulative-τ
    selection (xattn_keep);
  - the per-head Top-P calibration of calibrate.c's mask_recall for a given W
    (calibrate_top_p: the calibrated random-W control);
  - the split of the calibration texts into calibration and dev windows (split_calib);
  - window-bootstrap intervals (bootstrap) and the dev-chosen operating point
    (operating_point).
Every selection keeps the sink block 0 and the diagonal block (the kernels force them) and
counts them toward the threshold first, as mf_topp_select does.
Called from evaluate.py's one thread; no state.
"""
import math
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# MF_GPU_PY: bench/gpu's rows.py of the commit the kernel libraries were built from
sys.path.insert(0, os.environ.get("MF_GPU_PY", os.path.join(HERE, "..", "gpu")))
import rows as R  # noqa: E402

COMPUTE, PROB, MASK_MODE = 0, 1, 2
# calibrate.c's topp_grid: the per-head target Top-P values tried (ascending)
TOPP_GRID = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0)
HDR = struct.Struct("<IHBBQIIIHHIIfI")


def pair_counts(nb, b):
    """pairs[i, j]: causal (query, key) pairs of block (i, j)."""
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    return np.where(j < i, b * b, np.where(j == i, b * (b + 1) // 2, 0)).astype(np.float64)


def lower(h, nb):
    """Every causal block of h heads: keep [h, nb, nb]."""
    return np.broadcast_to(np.tril(np.ones((nb, nb), dtype=bool)), (h, nb, nb))


def select_mask(keep, mass, w, top_p):
    """The mask-mode selection of mf_apply_ref for every target head: sel [Ht, nb, nb]."""
    hs, nb, _ = keep.shape
    ht = w.shape[0]
    cand = np.einsum("ts,sij->tij", (w > 0).astype(np.float64), keep.astype(np.float64)) > 0
    mix = np.einsum("ts,sij->tij", w.astype(np.float64), mass)
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    forced = np.broadcast_to((j == 0) | (j == i), (ht, nb, nb))
    tot = np.where(cand, mix, 0).sum(-1, keepdims=True)
    # forced blocks first, then candidates by mass (ties to lower j), others never
    key = np.where(forced, 3.0, np.where(cand & (j < i), mix, -1.0))
    order = np.argsort(-key, axis=-1, kind="stable")
    m_sorted = np.take_along_axis(np.where(forced | cand, mix, 0), order, -1)
    acc_before = np.cumsum(m_sorted, -1) - m_sorted
    ok_sorted = np.take_along_axis(key, order, -1) > -1
    tp = np.asarray(top_p, dtype=np.float64)[:, None, None]
    take = ok_sorted & ((np.take_along_axis(forced, order, -1)) |
                        (acc_before < tp * tot) | (tp >= 1.0))
    sel = np.zeros_like(take)
    np.put_along_axis(sel, order, take, -1)
    return sel & (j <= i)


def work(keep, mass, w, mode, top_p, b, exact_last):
    """(qk_pairs, pv_pairs, attended_pairs, dense_pairs) of one layer over all target heads;
    attended/dense over the mapped heads on reused (non-exact) query blocks only."""
    hs, nb, _ = keep.shape
    pairs = pair_counts(nb, b)
    dense_row = pairs.sum(-1)
    exact = np.arange(nb) >= nb - exact_last
    union = np.einsum("ts,sij->tij", (w > 0).astype(np.float64), keep.astype(np.float64)) > 0
    sel = select_mask(keep, mass, w, top_p)
    qk = pv = att = den = 0.0
    for t in range(w.shape[0]):
        if mode[t] == COMPUTE:
            qk += dense_row.sum()
            pv += dense_row.sum()
            continue
        used = union[t] if mode[t] == PROB else sel[t]
        rows_pairs = (used * pairs).sum(-1)
        qk += dense_row[exact].sum() + (0 if mode[t] == PROB else rows_pairs[~exact].sum())
        pv += dense_row[exact].sum() + rows_pairs[~exact].sum()
        att += rows_pairs[~exact].sum()
        den += dense_row[~exact].sum()
    return qk, pv, att, den


def parse_row_list(rows, heads, nb):
    """keep [H, nb, nb] bool and mass [H, nb, nb] (decoded, 0 where not kept) of a list of
    row byte arrays (uint8)."""
    keep = np.zeros((heads, nb, nb), dtype=bool)
    mass = np.zeros((heads, nb, nb), dtype=np.float64)
    bits = np.uint64(1) << np.arange(heads, dtype=np.uint64)
    for r in rows:
        (magic, _, codec, mlen, _, total, _, i, b, h, ncols, ne, _, _) = HDR.unpack_from(
            r.tobytes()[:HDR.size])
        if magic != R.MAGIC or h != heads or total != len(r) or i >= nb:
            raise RuntimeError("parse_rows: bad row header (block %d)" % i)
        lay = R.layout(codec, b, ncols, ne, mlen)
        cols = np.frombuffer(r[lay["cols"]:lay["cols"] + 4 * ncols].tobytes(), np.uint32)
        off = np.frombuffer(r[lay["col_off"]:lay["col_off"] + 4 * ncols].tobytes(), np.uint32)
        hm = np.frombuffer(r[lay["head_mask"]:lay["head_mask"] + 8 * ncols].tobytes(), np.uint64)
        q = r[lay["mass"]:lay["mass"] + ne].astype(np.float64)
        present = (hm[:, None] & bits[None, :]) != 0               # [C, H]
        rank = np.cumsum(present, axis=1) - 1                      # entry rank in column
        ent = off[:, None].astype(np.int64) + rank                 # [C, H]
        cc, hh = np.nonzero(present)
        keep[hh, i, cols[cc]] = True
        mass[hh, i, cols[cc]] = (q[ent[cc, hh]] / 255.0) ** 2
    return keep, mass


def parse_rows(rows, heads, nb):
    """parse_row_list over a RowSet (mfk.RowSet.host())."""
    return parse_row_list(rows.host(), heads, nb)


def keep_rows(keep, b, layer=0, model=b"target", seal=None):
    """Mask rows (proto/mf_row.h) of a target-side selection keep [H, nb, nb] (causal):
    (buffer uint8, 16-aligned offsets, sizes), the sink and diagonal added. The masses
    are arbitrary (1..255): the apply kernel at Top-P 1 attends every column of the row.
    seal(row) writes the checksum (mf_row_seal through a kernel library); None leaves it
    zero (parse_row_list does not read it)."""
    h, nb, _ = keep.shape
    if h > 64:
        raise ValueError("keep_rows: %d heads (a row holds at most 64)" % h)
    ii = np.arange(nb)
    forced = (ii[None, :] == 0) | (ii[None, :] == ii[:, None])   # the decoder requires them
    keep = (keep | forced[None]) & np.tril(np.ones((nb, nb), dtype=bool))[None]
    pre = [R.row_prefix(keep, i, R.MASK, b, layer=layer, model=model,
                        rng=np.random.default_rng(i))[0] for i in range(nb)]
    sizes = [len(p) for p in pre]
    offs = np.concatenate([[0], np.cumsum([R.align16(s) for s in sizes])]).astype(int)
    buf = np.zeros(int(offs[-1]), dtype=np.uint8)
    for o, p in zip(offs, pre):
        buf[o:o + len(p)] = np.frombuffer(p, dtype=np.uint8)
        if seal is not None:
            seal(buf[o:o + len(p)])
    return buf, offs[:-1].tolist(), sizes


def block_masses(p, b):
    """Exact block masses [H, nb, nb] (/ B, as the extract kernel's rows) of softmax maps
    p [H, N, N]."""
    h, n, _ = p.shape
    nb = n // b
    return p[:, :nb * b, :nb * b].reshape(h, nb, b, nb, b).sum((2, 4)) / b


def softmax_causal(s):
    """Row softmax of s [..., M, M] over j ≤ i."""
    m = s.shape[-1]
    s = np.where(np.tril(np.ones((m, m), dtype=bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def xattn_scores(q, k, b, stride):
    """XAttention's block scores [H, nb, nb] from Q, K [N, H, d] (arXiv 2503.16428): the
    strided reshape sums, per stride-S cell, the S products along its antidiagonal
    (query iS+S−1−s with key jS+s); scaled by 1/(√d·S) as XAttention's code does, row
    softmax over cells j ≤ i, summed to B/S × B/S cells per block. Rows sum to B/S."""
    n, h, d = q.shape
    if b % stride or n % b:
        raise ValueError("xattn_scores: stride %d must divide B %d, B must divide N %d" % (
            stride, b, n))
    m = n // stride
    qf = np.asarray(q, np.float32).transpose(1, 0, 2).reshape(h, m, stride, d)
    kf = np.asarray(k, np.float32).transpose(1, 0, 2).reshape(h, m, stride, d)
    qr = qf[:, :, ::-1, :].reshape(h, m, stride * d)   # query iS+S−1−s beside key jS+s
    kr = kf.reshape(h, m, stride * d)
    s = (qr @ kr.transpose(0, 2, 1)).astype(np.float64) / (math.sqrt(d) * stride)
    p = softmax_causal(s)
    c = b // stride
    nb = n // b
    return p.reshape(h, nb, c, nb, c).sum((2, 4))


def xattn_scores_torch(t, q, k, b, stride):
    """xattn_scores on the device of torch tensors q, k [N, H, d] (t: the torch module,
    imported by the caller): the same cells, for long windows (the test checks the two
    agree); returns NumPy float64."""
    n, h, d = q.shape
    if b % stride or n % b:
        raise ValueError("xattn_scores: stride %d must divide B %d, B must divide N %d" % (
            stride, b, n))
    m = n // stride
    qf = q.float().transpose(0, 1).reshape(h, m, stride, d)
    kf = k.float().transpose(0, 1).reshape(h, m, stride, d)
    qr = qf.flip(2).reshape(h, m, stride * d)
    kr = kf.reshape(h, m, stride * d)
    s = (qr @ kr.transpose(1, 2)) / (math.sqrt(d) * stride)
    i = t.arange(m, device=q.device)
    p = s.masked_fill(i[None, :] > i[:, None], float("-inf")).double().softmax(-1)
    c = b // stride
    nb = n // b
    return p.reshape(h, nb, c, nb, c).sum((2, 4)).cpu().numpy()


def xattn_keep(q, k, b, stride, tau, t=None):
    """XAttention's selection: per head and query block, the sink, the diagonal and the
    fewest other blocks whose cumulative score reaches τ of the row (select_mask with
    W = I over every causal block). With t (the torch module), q and k are torch tensors
    and the scores are computed on their device."""
    sc = xattn_scores_torch(t, q, k, b, stride) if t is not None else \
        xattn_scores(q, k, b, stride)
    h = sc.shape[0]
    return select_mask(lower(h, sc.shape[1]), sc, np.eye(h, dtype=np.float32),
                       np.full(h, tau))


def calibrate_top_p(src, tgt, w, src_p, recall, grid=TOPP_GRID):
    """Per-head target Top-P for given weights w [Ht, Hs], as calibrate.c's mask_recall
    and mode rule: src / tgt are lists (one per calibration window) of block masses
    [Hs, nb, nb] / [Ht, nb, nb]; candidates are the blocks some source head with w > 0
    keeps at its own Top-P src_p, the selection is Top-P over the mixed masses; recall =
    the share of the target head's mass inside the selection over query blocks i ≥ 1 of
    every window. Returns (top_p [Ht], recall [Ht]): the smallest grid Top-P reaching
    `recall`, else the last one."""
    ht, hs = w.shape
    num = np.zeros((ht, len(grid)))
    den = np.zeros(ht)
    for sm, tm in zip(src, tgt):
        nb = sm.shape[1]
        ssel = select_mask(lower(hs, nb), sm, np.eye(hs, dtype=np.float32), np.full(hs, src_p))
        rows = np.arange(nb) >= 1
        den += tm[:, rows].sum((1, 2))
        for g, p in enumerate(grid):
            sel = select_mask(ssel, sm, w, np.full(ht, p))
            num[:, g] += np.where(sel, tm, 0.0)[:, rows].sum((1, 2))
    rec = np.where(den[:, None] > 0, num / np.maximum(den[:, None], 1e-300), 0.0)
    ok = rec >= recall
    g = np.where(ok.any(1), ok.argmax(1), len(grid) - 1)
    return np.asarray(grid, np.float32)[g], rec[np.arange(ht), g]


def split_calib(total, cal_n, cal_windows, dev_n, dev_windows):
    """Window starts in the calibration split (total tokens, the training texts' held-out
    tails one after another): the split is cut into cal_windows + dev_windows equal slots,
    dev windows (dev_n + 1 tokens: inputs and next-token targets) in slots spread evenly
    over it (so dev sees every text, as the calibration does), calibration windows (cal_n
    tokens) in the others, each at its slot's start: never overlapping. Returns
    (cal_starts, dev_starts); fewer windows where the split is short (at least one of
    each, or ValueError)."""
    need = max(cal_n, dev_n + 1)
    if cal_n < 1 or dev_n < 1 or total < 2 * need:
        raise ValueError("split_calib: %d tokens for windows of %d and %d" % (total, cal_n,
                                                                             dev_n + 1))
    cw, dw = max(1, cal_windows), max(1, dev_windows)
    while total // (cw + dw) < need:  # shorter split: fewer windows, both kinds kept
        if cw >= dw:
            cw -= 1
        else:
            dw -= 1
    k = cw + dw
    slot = total // k
    dev_slots = {int((i + 0.5) * k / dw) for i in range(dw)}
    cal = [j * slot for j in range(k) if j not in dev_slots]
    dev = [j * slot for j in sorted(dev_slots)]
    return cal, dev


def stats(w, idx=None):
    """Numbers of a variant from per-window sums w (dict of equal-length arrays: nll,
    base_nll, kl, agree, tokens, and optionally work, dense) over windows idx (all if
    None): dppl_pct, kl, agree_pct, skipped_pct."""
    sel = (lambda a: np.asarray(a, np.float64)) if idx is None else \
        (lambda a: np.asarray(a, np.float64)[idx])
    tok = sel(w["tokens"]).sum()
    out = {"dppl_pct": 100.0 * (math.exp((sel(w["nll"]).sum() - sel(w["base_nll"]).sum())
                                         / tok) - 1.0),
           "kl": sel(w["kl"]).sum() / tok, "agree_pct": 100.0 * sel(w["agree"]).sum() / tok}
    if "work" in w and len(w["work"]) and sel(w["dense"]).sum() > 0:
        out["skipped_pct"] = 100.0 * (1.0 - sel(w["work"]).sum() / sel(w["dense"]).sum())
    return out


def bootstrap(w, n_boot=1000, seed=0, level=0.95):
    """Window bootstrap: {name: [lo, hi]} percentile intervals of stats() over windows
    drawn with replacement (the variant and the base on the same windows: paired)."""
    nw = len(w["tokens"])
    if nw < 2:
        return {}
    rng = np.random.default_rng(seed)
    draws = [stats(w, rng.integers(0, nw, nw)) for _ in range(n_boot)]
    a = (1.0 - level) / 2.0
    return {k: [float(np.quantile([d[k] for d in draws], a)),
                float(np.quantile([d[k] for d in draws], 1.0 - a))] for k in draws[0]}


def passes(r, max_dppl=1.0, min_agree=97.0, strict=False):
    """Within the quality bounds: the point estimates, or (strict) the whole intervals."""
    if strict:
        ci = r.get("ci") or {}
        if "dppl_pct" not in ci or "agree_pct" not in ci:
            return False
        return ci["dppl_pct"][1] <= max_dppl and ci["agree_pct"][0] >= min_agree
    return r["dppl_pct"] <= max_dppl and r["agree_pct"] >= min_agree


def operating_point(points, max_dppl=1.0, min_agree=97.0):
    """The most FLOPs skipped on the dev split within the bounds: points is a list of
    {"name", "dev": stats with skipped_pct, ...}; returns that point or None. The test
    splits are never looked at here."""
    ok = [p for p in points if p["dev"].get("skipped_pct") is not None and
          passes(p["dev"], max_dppl, min_agree)]
    return max(ok, key=lambda p: p["dev"]["skipped_pct"]) if ok else None
