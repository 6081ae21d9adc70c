"""MapFlow's extract and apply kernels for the quality evaluation, through ctypes.

Two backends with one interface (torch tensors Q, K, V [N, H, d] fp16, contiguous):
  Cuda: build/lib/libmfkernels_cuda.so, device pointers (torch data_ptr), torch's stream.
  Ref:  build/lib/libmfkernels_ref.so (bench/quality/quality.mk): the C reference, host
        tensors; slow, for the CPU smoke test, and it also returns mf_apply_stats_t, which
        the smoke test compares with work() below.
extract() → RowSet (one row per full query block); apply(rows or None, ...) → O [N, H, d]
fp32 (rows None = every block computed densely by the kernel's compute path). Q/K/V may
also be bf16 (the dtype is taken from Q). extract() optionally takes the row LSE and a
per-row bound on entries (tight row buffers at long context: the worst case is every head
keeping every block); a row that does not fit raises RowOverflow. RowSet.at() wraps rows
that live elsewhere (e.g. leased from mapflowd) for apply(). bench/handoff uses both.
parse_rows() reads rows back (kept blocks and 8-bit masses per head) and work() counts,
with the kernels' rules (mapflow_kernels.h), the QKᵀ and PV pairs a layer computes.
The ctypes structures come from bench/gpu/bench_gpu.py (the CUDA layouts).
"""
import ctypes as C
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# MF_GPU_PY: a copy of bench/gpu's rows.py and bench_gpu.py from the commit the kernel
# libraries were built from (their ctypes layouts must match those libraries)
sys.path.insert(0, os.environ.get("MF_GPU_PY", os.path.join(ROOT, "bench", "gpu")))
import rows as R  # noqa: E402
from bench_gpu import ApplyArgs, ExtractArgs, LayerMap, Qkv  # noqa: E402
sys.path.insert(0, HERE)
# the kernels' selection rules and the row parser, NumPy only (tested without torch)
from blocksel import (COMPUTE, MASK_MODE, PROB, keep_rows, pair_counts,  # noqa: E402,F401
                      parse_row_list, select_mask, work)

CODECS = {"mask": R.MASK, "fp16": R.FP16, "bf16": R.BF16, "fp8": R.FP8, "u8log": R.U8LOG}
F16, BF16 = 1, 2
MODEL = b"source"
NS = b"quality"
VIEW_BYTES = 512  # >= sizeof(mf_row_view_t)


class RefExtractArgs(C.Structure):
    _fields_ = [("src", Qkv), ("lse", C.c_void_p), ("block_size", C.c_uint32),
                ("top_p", C.c_float), ("codec", C.c_int), ("i0", C.c_uint32),
                ("i1", C.c_uint32), ("model", C.c_char_p), ("ns", C.c_char_p),
                ("layer", C.c_uint32), ("tokens", C.c_void_p)]


class RefApplyArgs(C.Structure):
    _fields_ = [("rows", C.c_void_p), ("n_rows", C.c_uint32), ("map", C.POINTER(LayerMap)),
                ("tgt", Qkv), ("block_size", C.c_uint32), ("exact", C.c_void_p),
                ("exact_first", C.c_uint32), ("exact_last", C.c_uint32),
                ("q0", C.c_uint32), ("q1", C.c_uint32), ("o", C.c_void_p)]


class ApplyStats(C.Structure):
    _fields_ = [("exact_blocks", C.c_uint64), ("prob_tiles", C.c_uint64),
                ("mask_blocks", C.c_uint64), ("mask_candidates", C.c_uint64)]


def _cdll(env, name, sigs):
    """The library at $env (default build/lib/name), every function in sigs returning int."""
    lib = C.CDLL(os.environ.get(env, os.path.join(ROOT, "build", "lib", name)))
    for fn, argtypes in sigs.items():
        getattr(lib, fn).restype = C.c_int
        getattr(lib, fn).argtypes = argtypes
    return lib


class RowOverflow(RuntimeError):
    """A row did not fit its buffer (extract with `entries` bounds): .block is the first."""

    def __init__(self, block):
        super().__init__("extract: row %d did not fit" % block)
        self.block = block


def row_slots(codec, b, heads, nb, entries=None, model=MODEL):
    """Bytes of rows 0..nb−1 — worst case (every head keeps every block j ≤ i), or room
    for entries[i] (head, block) entries in row i —, their 16-aligned offsets in one
    buffer, and its size."""
    caps = [R.layout(codec, b, i + 1, min(heads * (i + 1), entries[i]) if entries is not None
                     else heads * (i + 1), len(model))["total"] for i in range(nb)]
    offs = np.concatenate([[0], np.cumsum([R.align16(c) for c in caps])]).astype(int).tolist()
    return caps, offs[:-1], offs[-1]


class RowSet:
    """Rows 0..nb−1 of one (layer, codec, top-p) in one buffer at 16-aligned offsets."""

    def __init__(self, buf, offs, sizes, base_ptr, codec):
        self.buf, self.offs, self.sizes, self.base, self.codec = buf, offs, sizes, base_ptr, codec

    @classmethod
    def at(cls, ptrs, sizes, codec):
        """Rows at arbitrary addresses (device for Cuda, host for Ref), e.g. leased views."""
        return cls(None, list(ptrs), list(sizes), 0, codec)

    def ptrs(self):
        return [self.base + o for o in self.offs]

    def total_bytes(self):
        return int(sum(self.sizes))

    def host(self):
        b = self.buf.cpu().numpy() if torch.is_tensor(self.buf) else self.buf
        return [b[o:o + s] for o, s in zip(self.offs, self.sizes)]


def _map(w, mode, top_p):
    w = np.ascontiguousarray(w, dtype=np.float32)
    mode = np.ascontiguousarray(mode, dtype=np.uint8)
    top_p = np.ascontiguousarray(top_p, dtype=np.float32)
    lm = LayerMap(w.shape[0], w.shape[1], w.ctypes.data, mode.ctypes.data, top_p.ctypes.data)
    return lm, (w, mode, top_p)


def _qkv(q, k, v):
    n, h, d = q.shape
    dt = BF16 if q.dtype == torch.bfloat16 else F16
    return Qkv(q.data_ptr(), k.data_ptr(), v.data_ptr() if v is not None else None, dt, n, h,
               k.shape[1], d)


class Cuda:
    name = "cuda"

    def __init__(self, block):
        self.b = block
        why = C.POINTER(C.c_char_p)
        self.lib = _cdll("MF_CUDA_LIB", "libmfkernels_cuda.so", {
            "mf_apply_cuda": [C.POINTER(ApplyArgs), C.c_void_p, why],
            "mf_extract_cuda": [C.POINTER(ExtractArgs), C.c_void_p, why]})
        self.pool = {}
        self.bad = torch.zeros(1, dtype=torch.int32, device="cuda")

    def extract(self, q, k, top_p, codec, layer, tokens, slot, lse=None, entries=None,
                model=MODEL, ns=NS):
        """lse: [H, N] fp32 device tensor or None (computed by the kernel)."""
        n, h, _ = q.shape
        nb = n // self.b
        caps, offs, tot = row_slots(codec, self.b, h, nb, entries, model)
        buf = self.pool.get(slot)  # one arena per slot, reused window after window
        if buf is None or buf.numel() < tot:
            buf = self.pool[slot] = torch.empty(tot, dtype=torch.uint8, device="cuda")
        sizes = torch.zeros(nb, dtype=torch.int64, device="cuda")
        failed = torch.zeros(1, dtype=torch.int32, device="cuda")
        ptrs = (C.c_void_p * nb)(*[buf.data_ptr() + o for o in offs])
        capa = (C.c_size_t * nb)(*caps)
        tok = np.ascontiguousarray(tokens, dtype=np.uint32)
        a = ExtractArgs(_qkv(q, k, None), lse.data_ptr() if lse is not None else None, self.b,
                        top_p, codec, 0, nb, model, ns, layer, tok.ctypes.data,
                        C.cast(ptrs, C.c_void_p), C.cast(capa, C.c_void_p), sizes.data_ptr(),
                        failed.data_ptr(), None)
        why = C.c_char_p()
        st = self.lib.mf_extract_cuda(C.byref(a), torch.cuda.current_stream().cuda_stream,
                                      C.byref(why))
        if st != 0:
            raise RuntimeError("mf_extract_cuda: status %d: %s" % (st, why.value))
        fb = int(failed.item()) & 0xffffffff
        if fb != 0xffffffff:
            raise RowOverflow(fb)
        return RowSet(buf, offs, sizes.cpu().tolist(), buf.data_ptr(), codec)

    def apply(self, rows, w, mode, top_p, q, k, v, exact_last):
        n, h, d = q.shape
        nb = n // self.b
        lm, keep = _map(w, mode, top_p)
        o = torch.empty(n, h, d, dtype=torch.float32, device="cuda")
        ptrs = (C.c_void_p * max(1, nb))()
        if rows is not None:
            for i in range(nb):
                ptrs[i] = rows.base + rows.offs[i]
        a = ApplyArgs(C.cast(ptrs, C.c_void_p), nb if rows is not None else 0, C.pointer(lm),
                      _qkv(q, k, v), self.b, None, 0, exact_last, o.data_ptr(),
                      self.bad.data_ptr())
        why = C.c_char_p()
        st = self.lib.mf_apply_cuda(C.byref(a), torch.cuda.current_stream().cuda_stream,
                                    C.byref(why))
        del keep
        if st != 0:
            raise RuntimeError("mf_apply_cuda: status %d: %s" % (st, why.value))
        return o, None

    def check(self):
        """Rows the kernel refused since the start (must stay 0)."""
        return int(self.bad.item())


class Ref:
    name = "ref"

    def __init__(self, block):
        self.b = block
        why, p = C.POINTER(C.c_char_p), C.c_void_p
        self.lib = _cdll("MF_REF_LIB", "libmfkernels_ref.so", {
            "mf_extract_ref": [C.POINTER(RefExtractArgs), p, p, p, p, why],
            "mf_apply_ref": [C.POINTER(RefApplyArgs), C.POINTER(ApplyStats), why],
            "mf_row_decode": [p, C.c_size_t, C.c_uint, p, why]})

    def extract(self, q, k, top_p, codec, layer, tokens, slot, lse=None, entries=None,
                model=MODEL, ns=NS):
        """lse: [H, N] fp32 host tensor or None (computed by the reference)."""
        n, h, _ = q.shape
        nb = n // self.b
        caps, offs, tot = row_slots(codec, self.b, h, nb, entries, model)
        raw = np.zeros(tot + 16, dtype=np.uint8)
        pad = (-raw.ctypes.data) % 16
        buf = raw[pad:pad + tot]
        sizes = np.zeros(nb, dtype=np.uint64)
        failed = np.zeros(1, dtype=np.uint32)
        ptrs = (C.c_void_p * nb)(*[buf.ctypes.data + o for o in offs])
        capa = (C.c_size_t * nb)(*caps)
        tok = np.ascontiguousarray(tokens, dtype=np.uint32)
        q, k = q.contiguous(), k.contiguous()
        lse = lse.contiguous() if lse is not None else None
        a = RefExtractArgs(_qkv(q, k, None), lse.data_ptr() if lse is not None else None, self.b,
                           top_p, codec, 0, nb, model, ns, layer, tok.ctypes.data)
        why = C.c_char_p()
        st = self.lib.mf_extract_ref(C.byref(a), ptrs, capa, sizes.ctypes.data,
                                     failed.ctypes.data, C.byref(why))
        if st == 8 and int(failed[0]) != 0xffffffff:  # MF_RESOURCE_EXHAUSTED: a row did not fit
            raise RowOverflow(int(failed[0]))
        if st != 0:
            raise RuntimeError("mf_extract_ref: status %d: %s" % (st, why.value))
        rs = RowSet(buf, offs, [int(s) for s in sizes], buf.ctypes.data, codec)
        rs.keepalive = raw
        return rs

    def apply(self, rows, w, mode, top_p, q, k, v, exact_last):
        n, h, d = q.shape
        nb = n // self.b
        lm, keep = _map(w, mode, top_p)
        o = torch.zeros(n, h, d, dtype=torch.float32)
        views = (C.c_uint8 * (VIEW_BYTES * max(1, nb)))()
        ptrs = (C.c_void_p * max(1, nb))()
        if rows is not None:
            why = C.c_char_p()
            for i in range(nb):
                vp = C.addressof(views) + VIEW_BYTES * i
                st = self.lib.mf_row_decode(rows.base + rows.offs[i], rows.sizes[i], 0, vp,
                                            C.byref(why))
                if st != 0:
                    raise RuntimeError("mf_row_decode row %d: %d %s" % (i, st, why.value))
                ptrs[i] = vp
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        a = RefApplyArgs(C.cast(ptrs, C.c_void_p), nb if rows is not None else 0, C.pointer(lm),
                         _qkv(q, k, v), self.b, None, 0, exact_last, 0, 0, o.data_ptr())
        stats = ApplyStats()
        why = C.c_char_p()
        st = self.lib.mf_apply_ref(C.byref(a), C.byref(stats), C.byref(why))
        del keep
        if st != 0:
            raise RuntimeError("mf_apply_ref: status %d: %s" % (st, why.value))
        return o, stats

    def check(self):
        return 0


class CalibOpts(C.Structure):
    """mf_calib_opts_t (kernels/calibrate.h)."""
    _fields_ = [("max_error", C.c_double), ("prob_max_error", C.c_double),
                ("mask_max_error", C.c_double), ("mask_min_recall", C.c_double),
                ("mask_top_p", C.c_double), ("per_head_top_p", C.c_int),
                ("min_l0", C.c_uint32), ("block_size", C.c_uint32),
                ("recompute_last", C.c_uint32), ("recompute_first", C.c_uint32),
                ("source_model", C.c_char_p), ("target_model", C.c_char_p),
                ("max_iters", C.c_uint32)]


class CalibLayer(C.Structure):
    """mf_calib_layer_t (kernels/calibrate.h)."""
    _D, _U8 = C.POINTER(C.c_double), C.POINTER(C.c_uint8)
    _fields_ = [("target_layer", C.c_uint32), ("source_layer", C.c_uint32),
                ("error", C.c_double), ("w", _D), ("head_error", _D), ("mode", _U8),
                ("recall", _D), ("top_p", _D), ("source_errors", _D),
                ("base_error", C.c_double), ("base_w", _D), ("base_head_error", _D),
                ("base_mode", _U8), ("base_recall", _D), ("base_top_p", _D)]


class Calib:
    """The calibration library (calibrate.h) through libmfkernels_ref.so: the maps are
    added once, then fit() runs the mode rule with any options (mapflow-calibrate runs the
    same code on .npy files, one option set per run)."""

    def __init__(self, ls, hs, lt, ht):
        p = C.c_void_p
        self.lib = _cdll("MF_REF_LIB", "libmfkernels_ref.so", {
            "mf_calib_create": [C.c_uint32] * 4 + [C.POINTER(p)],
            "mf_calib_add": [p, p, p, C.c_uint32],
            "mf_calib_fit": [p, C.POINTER(CalibOpts)],
            "mf_calib_layer": [p, C.c_uint32, C.POINTER(CalibLayer)],
            "mf_calib_profile": [p, C.POINTER(CalibOpts), C.c_int, C.POINTER(p)],
            "mf_profile_save": [C.c_char_p, p]})
        self.lib.mf_calib_l0.restype = C.c_uint32
        self.lib.mf_calib_l0.argtypes = [p]
        self.lib.mf_calib_destroy.argtypes = [p]
        self.lib.mf_profile_free.argtypes = [p]
        self.shape = (ls, hs, lt, ht)
        self.c = p()
        self._ok(self.lib.mf_calib_create(ls, hs, lt, ht, C.byref(self.c)), "create")

    @staticmethod
    def _ok(st, what):
        if st != 0:
            raise RuntimeError("mf_calib_%s: status %d" % (what, st))

    def add(self, src, tgt):
        """src [Ls, Hs, N, N], tgt [Lt, Ht, N, N] float32 numpy (C order)."""
        src = np.ascontiguousarray(src, dtype=np.float32)
        tgt = np.ascontiguousarray(tgt, dtype=np.float32)
        if src.shape[:2] != self.shape[:2] or tgt.shape[:2] != self.shape[2:]:
            raise ValueError("calib add: shapes %s %s" % (src.shape, tgt.shape))
        self._ok(self.lib.mf_calib_add(self.c, src.ctypes.data, tgt.ctypes.data,
                                       src.shape[-1]), "add")

    def fit(self, **kw):
        """Fits with the given mf_calib_opts_t fields; returns {l0, layers: [...]}, every
        target layer (modes of layers below L0 are what the rule gave them)."""
        o = CalibOpts(**kw)
        self._ok(self.lib.mf_calib_fit(self.c, C.byref(o)), "fit")
        ls, hs, lt, ht = self.shape
        out = {"l0": int(self.lib.mf_calib_l0(self.c)), "layers": []}
        for t in range(lt):
            r = CalibLayer()
            self._ok(self.lib.mf_calib_layer(self.c, t, C.byref(r)), "layer")

            def arr(ptr, n, dt=np.float64):
                return np.ctypeslib.as_array(ptr, shape=(n,)).astype(dt).copy()
            out["layers"].append({
                "target": t, "source": int(r.source_layer), "error": r.error,
                "w": arr(r.w, ht * hs, np.float32).reshape(ht, hs),
                "head_error": arr(r.head_error, ht), "mode": arr(r.mode, ht, np.uint8),
                "recall": arr(r.recall, ht), "top_p": arr(r.top_p, ht),
                "base_error": r.base_error,
                "base_w": arr(r.base_w, ht * hs, np.float32).reshape(ht, hs),
                "base_head_error": arr(r.base_head_error, ht),
                "base_mode": arr(r.base_mode, ht, np.uint8)})
        self._opts = o
        return out

    def save_profile(self, path, baseline=0):
        """The last fit's profile (layers ≥ L0) to path (mf_profile_save)."""
        prof = C.c_void_p()
        self._ok(self.lib.mf_calib_profile(self.c, C.byref(self._opts), baseline,
                                           C.byref(prof)), "profile")
        st = self.lib.mf_profile_save(path.encode(), prof)
        self.lib.mf_profile_free(prof)
        self._ok(st, "profile save")

    def close(self):
        if self.c:
            self.lib.mf_calib_destroy(self.c)
            self.c = C.c_void_p()


def parse_rows(rows, heads, nb):
    """keep [Hs, nb, nb] bool and mass [Hs, nb, nb] (decoded, 0 where not kept)."""
    return parse_row_list(rows.host(), heads, nb)


def keep_rowset(be, keep, layer=0):
    """A target-side selection keep [H, nb, nb] as mask rows for be.apply (W = I, mode
    mask, Top-P 1: the kernel attends exactly keep plus the forced blocks), checksummed by
    mf_row_seal of the reference library; on the device for Cuda."""
    buf, offs, sizes = keep_rows(keep, be.b, layer, seal=_seal())
    if be.name == "cuda":
        dbuf = torch.from_numpy(buf).to("cuda")
        return RowSet(dbuf, offs, sizes, dbuf.data_ptr(), R.MASK)
    raw = np.zeros(len(buf) + 16, dtype=np.uint8)
    pad = (-raw.ctypes.data) % 16
    hb = raw[pad:pad + len(buf)]
    hb[:] = buf
    rs = RowSet(hb, offs, sizes, hb.ctypes.data, R.MASK)
    rs.keepalive = raw
    return rs


_SEAL = []


def _seal():
    """mf_row_seal of libmfkernels_ref.so as a function of one row (uint8 array)."""
    if not _SEAL:
        lib = _cdll("MF_REF_LIB", "libmfkernels_ref.so",
                    {"mf_row_seal": [C.c_void_p, C.c_size_t]})

        def seal(row):
            st = lib.mf_row_seal(row.ctypes.data, len(row))
            if st != 0:
                raise RuntimeError("mf_row_seal: status %d" % st)
        _SEAL.append(seal)
    return _SEAL[0]


# ---- the kernels' rules in PyTorch (block sizes the CUDA kernels do not take) -------------

def emu_extract(q, k, b, top_p):
    """What the extract kernel's mask rows hold, as parse_rows gives it: (keep, mass) [H, nb,
    nb] from Q, K [N, H, d] (torch, any device). Block mass = the exact softmax summed over
    the block, / B; Top-P per (head, query block) with the first and diagonal blocks forced
    (mf_topp_select, via select_mask with W = I); masses through the 8-bit row code."""
    n, h, d = q.shape
    nb = n // b
    qf = q[:nb * b].permute(1, 0, 2).float()
    kf = k[:nb * b].permute(1, 0, 2).float()
    s = (qf @ kf.transpose(1, 2)) / float(np.sqrt(d))
    s = s.masked_fill(torch.ones(nb * b, nb * b, dtype=torch.bool, device=q.device).triu(1),
                      float("-inf"))
    p = torch.softmax(s, -1)
    mass = (p.view(h, nb, b, nb, b).sum((2, 4)).double() / b).cpu().numpy()
    lower = np.broadcast_to(np.tril(np.ones((nb, nb), dtype=bool)), (h, nb, nb))
    keep = select_mask(lower, mass, np.eye(h, dtype=np.float32), np.full(h, top_p))
    q8 = np.rint(np.sqrt(np.clip(mass, 0.0, 1.0)) * 255.0) / 255.0
    return keep, np.where(keep, q8 * q8, 0.0)


def emu_apply(keep, mass, w, mode, top_p, q, k, v, b, exact_last):
    """The apply kernel's mask and compute modes (prob is not emulated): each mask head
    attends, with the target's Q, K, V, over the blocks select_mask picks from the mixed
    masses; compute heads and the last exact_last query blocks attend to everything
    (causal). Q, K, V [N, Ht, d] → O [N, Ht, d] fp32."""
    if (np.asarray(mode) == PROB).any():
        raise NotImplementedError("emu_apply: prob mode is not emulated")
    n, ht, d = q.shape
    nb = n // b
    sel = select_mask(keep, mass, w, top_p).copy()
    if exact_last > 0:
        sel[:, nb - exact_last:, :] = True
    sel[np.asarray(mode) != MASK_MODE] = True
    allowed = torch.from_numpy(np.repeat(np.repeat(sel, b, 1), b, 2)).to(q.device)
    allowed &= torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    qf, kf, vf = (x.permute(1, 0, 2).float() for x in (q, k, v))
    s = (qf @ kf.transpose(1, 2)) / float(np.sqrt(d))
    o = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ vf
    return o.permute(1, 0, 2).contiguous()
