"""MapFlow's extract and apply kernels for the quality evaluation, through mapflow.kernels.

Two backends with one interface (torch tensors Q, K, V [N, H, d] fp16, contiguous):
  Cuda: build/lib/libmfkernels_cuda.so (kernels.extract_cuda / apply_cuda: device
        tensors, torch's stream).
  Ref:  build/lib/libmfkernels_ref.so (kernels.extract_ref / apply_ref): the C reference,
        host tensors; slow, for the CPU smoke test, and it also returns mf_apply_stats_t
        (attributes), which the smoke test compares with work() below.
MF_CUDA_LIB / MF_REF_LIB name the library files (default: mapflow.kernels' search, which
finds build/lib). extract() → RowSet (one row per full query block); apply(rows or None,
...) → O [N, H, d] fp32, or in o_dtype = Q's dtype (the kernels store it: no cast; rows
None = every block computed densely by the kernel's compute path). Q/K/V may also be bf16 (the dtype is taken from Q). extract() optionally takes the
row LSE and a per-row bound on entries (tight row buffers at long context: the worst case
is every head keeping every block), and a sample stride (masses from every stride-th query
row of each block, the approximate exporter of a source whose attention is an engine's: it
needs the LSE); a row that does not fit raises RowOverflow.
RowSet.at() wraps rows that live elsewhere (e.g. leased from mapflowd) for apply().
bench/handoff uses both. parse_rows() reads rows back (kept blocks and 8-bit masses per
head) and work() counts, with the kernels' rules (mapflow_kernels.h), the QKᵀ and PV pairs
a layer computes.
"""
import ctypes as C
import os
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# MF_GPU_PY: a copy of bench/gpu's rows.py (the row layout) from the commit the kernel
# libraries were built from; the argument structs come from mapflow.kernels, which checks
# them against the library it loads.
# Appended, not put first: a script importing this module keeps its own `model` etc.
# (bench/handoff/model.py is not bench/quality/model.py); MF_GPU_PY, when set, goes first.
if os.environ.get("MF_GPU_PY"):
    sys.path.insert(0, os.environ["MF_GPU_PY"])
for _d in (os.path.join(ROOT, "bench", "gpu"), os.path.join(ROOT, "client", "python"), HERE):
    if _d not in sys.path:
        sys.path.append(_d)
import rows as R  # noqa: E402
from mapflow import kernels as K  # noqa: E402
# the kernels' selection rules and the row parser, NumPy only (tested without torch)
from blocksel import (COMPUTE, MASK_MODE, PROB, keep_rows, pair_counts,  # noqa: E402,F401
                      parse_row_list, select_mask, work)

CODECS = {"mask": R.MASK, "fp16": R.FP16, "bf16": R.BF16, "fp8": R.FP8, "u8log": R.U8LOG}
MODEL = b"source"
NS = b"quality"
RowOverflow = K.RowOverflow  # a row did not fit its buffer: .block is the first


def _cdll(env, name, sigs):
    """The library at $env (default build/lib/name), every function in sigs returning int
    (the calibration and sealing calls, which mapflow.kernels does not wrap)."""
    lib = C.CDLL(os.environ.get(env, os.path.join(ROOT, "build", "lib", name)))
    for fn, argtypes in sigs.items():
        getattr(lib, fn).restype = C.c_int
        getattr(lib, fn).argtypes = argtypes
    return lib


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
        """Rows at arbitrary addresses (device for Cuda, host for Ref), e.g. leased views;
        NumPy arrays stay arrays (a uint64 array goes to apply_cuda whole)."""
        def keep(x):
            return x if isinstance(x, np.ndarray) else list(x)
        return cls(None, keep(ptrs), keep(sizes), 0, codec)

    @classmethod
    def of(cls, rows, codec):
        """A kernels.Rows (rows 0..nb−1) as a RowSet."""
        rs = cls(rows.buf, rows.offsets, rows.sizes, rows.base, codec)
        rs.keepalive = rows
        return rs

    def ptrs(self):
        if isinstance(self.offs, np.ndarray):
            return self.offs + np.uint64(self.base)
        return [self.base + o for o in self.offs]

    def total_bytes(self):
        return int(sum(self.sizes))

    def host(self):
        b = self.buf.cpu().numpy() if torch.is_tensor(self.buf) else self.buf
        return [b[o:o + s] for o, s in zip(self.offs, self.sizes)]

    def host_views(self):
        """Each row as a NumPy view of host memory at its address (Ref: rows of this
        process, or leased host rows of RowSet.at), without a copy."""
        return [np.ctypeslib.as_array((C.c_uint8 * int(s)).from_address(int(p)))
                for p, s in zip(self.ptrs(), self.sizes)]


def _caps(codec, b, heads, nb, entries, model):
    return row_slots(codec, b, heads, nb, entries, model)[0]


class Cuda:
    name = "cuda"

    def __init__(self, block, exporter="extract"):
        self.b = block
        self.lib = os.environ.get("MF_CUDA_LIB")
        L = K.library("cuda", self.lib)  # fails here, not at the first call
        self.pool = {}
        self.bad = torch.zeros(1, dtype=torch.int32, device="cuda")
        # "fused": the source's rows come from the exporter that ships (mf_export_cuda: the
        # fused forward's masses, B = 64, sm_90), given V; "extract": mf_extract_cuda
        self.exporter = exporter
        self.scratch = {}
        self._need = L.mf_attention_masses_scratch

    def extract(self, q, k, top_p, codec, layer, tokens, slot, lse=None, entries=None,
                model=MODEL, ns=NS, v=None, sample_stride=1):
        """lse: [H, N] fp32 device tensor or None (computed by the kernel); v: the layer's
        values, used by the fused exporter (then lse must be None); sample_stride > 1: the
        strided query sample (MF_EXTRACT_SAMPLE, offset stride / 2)."""
        if self.exporter == "fused" and v is not None and lse is None:
            return self.export(q, k, v, top_p, codec, layer, tokens, slot, entries, model,
                               ns)[2]
        n, h, _ = q.shape
        rows = K.extract_cuda(q, k, block_size=self.b, top_p=top_p, tokens=tokens,
                              model=model, ns=ns, codec=codec, layer=layer, lse=lse,
                              caps=_caps(codec, self.b, h, n // self.b, entries, model),
                              buf=self.pool.get(slot), sample_stride=sample_stride,
                              sample_offset=sample_stride // 2, lib=self.lib)
        self.pool[slot] = rows.buf  # one arena per slot, reused window after window
        return RowSet.of(rows, codec)

    def export(self, q, k, v, top_p, codec, layer, tokens, slot, entries=None, model=MODEL,
               ns=NS, o_dtype=None, rows_stream=None, rows=None, caps=None):
        """The source's exporter (mf_export_cuda, B = 64): (O [N, H, d] fp32, or o_dtype =
        q.dtype, LSE [H, N], the layer's rows), attention and rows from one fused pass.
        rows_stream: the rows' launches go there; the third value then has wait() → the
        RowSet (kernels.PendingRows). rows / caps: the rows' addresses and capacities (e.g.
        a put region begun with capacities=True: written in place) instead of the slot's
        buffer and the entry bound's caps."""
        n, h, _ = q.shape
        if n not in self.scratch:
            self.scratch[n] = torch.empty(int(self._need(n)), dtype=torch.uint8,
                                          device=q.device)
        if caps is None:
            caps = _caps(codec, self.b, h, n // self.b, entries, model)
        o, lse, rows = K.export_cuda(q, k, v, top_p=top_p, tokens=tokens, model=model, ns=ns,
                                     codec=codec, layer=layer, caps=caps,
                                     buf=None if rows is not None else self.pool.get(slot),
                                     rows=rows, scratch=self.scratch[n], o_dtype=o_dtype,
                                     rows_stream=rows_stream, lib=self.lib)
        if rows.buf is not None:
            self.pool[slot] = rows.buf
        if rows_stream is not None:
            return o, lse, types.SimpleNamespace(
                wait=lambda stream=None: RowSet.of(rows.wait(stream), codec))
        return o, lse, RowSet.of(rows, codec)

    def apply(self, rows, w, mode, top_p, q, k, v, exact_last, o_dtype=None):
        """O [N, H, d]: fp32, or o_dtype = q.dtype stored by the kernels (no cast)."""
        o = K.apply_cuda(None if rows is None else rows.ptrs(), w, mode, q, k, v,
                         block_size=self.b, top_p=top_p, exact_last=exact_last,
                         bad_rows=self.bad, o_dtype=o_dtype, lib=self.lib)
        return o, None

    def check(self):
        """Rows the kernel refused since the start (must stay 0)."""
        return int(self.bad.item())


class Ref:
    name = "ref"

    def __init__(self, block):
        self.b = block
        self.lib = os.environ.get("MF_REF_LIB")
        K.library("ref", self.lib)

    def extract(self, q, k, top_p, codec, layer, tokens, slot, lse=None, entries=None,
                model=MODEL, ns=NS, v=None, sample_stride=1):
        """lse: [H, N] fp32 host tensor or None (computed by the reference); v: unused (the
        reference's masses are the specification both CUDA exporters are checked against);
        sample_stride as Cuda.extract's."""
        n, h, _ = q.shape
        rows = K.extract_ref(q.contiguous(), k.contiguous(), block_size=self.b, top_p=top_p,
                             tokens=tokens, model=model, ns=ns, codec=codec, layer=layer,
                             lse=None if lse is None else lse.contiguous().numpy(),
                             caps=_caps(codec, self.b, h, n // self.b, entries, model),
                             sample_stride=sample_stride, sample_offset=sample_stride // 2,
                             lib=self.lib)
        return RowSet.of(rows, codec)

    def apply(self, rows, w, mode, top_p, q, k, v, exact_last, o_dtype=None):
        """As Cuda.apply; the reference is fp32 (the spec), so o_dtype is a cast here."""
        o, st = K.apply_ref(None if rows is None else rows.host_views(), w, mode,
                            q.contiguous(), k.contiguous(), v.contiguous(), block_size=self.b,
                            top_p=top_p, exact_last=exact_last, lib=self.lib)
        o = torch.from_numpy(o)
        return (o if o_dtype is None else o.to(o_dtype)), types.SimpleNamespace(**st)

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
                ("max_iters", C.c_uint32), ("objective", C.c_int)]


MAPS, OUTPUTS = 0, 1  # mf_calib_objective_t


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
            "mf_calib_add_outputs": [p, C.c_uint32, C.c_uint32, p, p] + [C.c_uint32] * 3,
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

    def add_outputs(self, t, l, o_src, o_tgt):
        """The OUTPUTS objective's products of one sequence for pair (target layer t,
        source layer l), after add() of that sequence: o_src [Hkv, Hs, N, d] = A_l[s]·V_t[g],
        o_tgt [Ht, N, d] the target's head outputs (float32 numpy)."""
        o_src = np.ascontiguousarray(o_src, dtype=np.float32)
        o_tgt = np.ascontiguousarray(o_tgt, dtype=np.float32)
        hkv, hs, n, d = o_src.shape
        if hs != self.shape[1] or o_tgt.shape != (self.shape[3], n, d):
            raise ValueError("calib add_outputs: shapes %s %s" % (o_src.shape, o_tgt.shape))
        self._ok(self.lib.mf_calib_add_outputs(self.c, t, l, o_src.ctypes.data,
                                               o_tgt.ctypes.data, n, hkv, d), "add_outputs")

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
