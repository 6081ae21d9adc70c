"""mapflow.kernels — MapFlow's extract / apply kernels and dense attention from Python.

Typed wrappers of kernels/mapflow_kernels.h (the C reference: NumPy arrays, or CPU torch
tensors, on the host) and kernels/mapflow_kernels_cuda.h (torch CUDA tensors, queued on
torch's current stream of the tensors' device):

  extract_ref / extract_cuda      source Q, K → map rows of query blocks [i0, i1)
  apply_ref / apply_cuda          rows + layer map + target Q, K, V → O [N, Ht, d] float32
  attention_dense_ref / _cuda     dense causal O and LSE [Hq, N] (natural log)
  export_cuda                     the source's exporter: its layer's O (fp32 or the model's
                                  dtype) and rows from one fused pass (sm_90)
  rows_copy_ref / rows_copy_cuda  n byte ranges copied (the put path's rows into a region;
                                  CUDA: one launch on a given stream)

Tensors are [N, H, d] row-major and contiguous (mapflow_kernels.h); Q/K/V share a dtype
(float16 or bfloat16 on CUDA; float32 / float16 / bfloat16 on the host). Everything a call
hands the C code is checked here first — shapes, dtypes, contiguity, device, the bounds of
mapflow_kernels.h — so a pointer never reaches C with fewer elements behind it than the
dimensions promise; a bad argument raises mapflow.InvalidArgument, a failed kernel the
MapflowError subclass of its status with the kernel's message.

The libraries (libmfkernels_ref.so, libmfkernels_cuda.so) are found like libmapflow: in
the directory $MAPFLOW_KERNELS_LIB when set (only there), next to this package, in the
source tree's build/lib, in the install libdirs, then by the system loader; each call
also takes lib=PATH. On load the argument structs mirrored here are checked against the
library's mf_kernels_abi_layout() (a mismatch is an ImportError naming the field).

Thread safety: as the C functions (no global state); libraries are loaded once, under a
lock, from any thread. CUDA results are valid once torch's stream reaches the call;
extract_cuda reads the row sizes back, so it synchronises that stream.
"""

from __future__ import annotations

import ctypes as C
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, MapflowError, _AbiField, _ERRORS,
               _RowView, _abi_mismatches, _candidates, _dlopen, _lib_layout)

try:
    import numpy as np
except ImportError:  # the reference calls need NumPy; the CUDA calls need torch
    np = None

__all__ = ["extract_ref", "apply_ref", "attention_dense_ref", "extract_cuda", "apply_cuda",
           "attention_dense_cuda", "cuda_supported", "export_cuda", "rows_copy_ref",
           "rows_copy_cuda", "PendingRows", "library", "row_bounds", "Rows", "RowOverflow",
           "RowView",
           "Qkv", "LayerMap", "ExtractArgs", "ApplyArgs", "ApplyStats", "ExtractCudaArgs",
           "ExportCudaArgs", "ApplyCudaArgs", "EXTRACT_SAMPLE",
           "CODECS", "COMPUTE", "PROB", "MASK", "F32", "F16", "BF16",
           "IMPL_DEFAULT", "IMPL_V2", "IMPL_CORE"]

F32, F16, BF16 = 0, 1, 2                 # mf_dtype_t
COMPUTE, PROB, MASK = 0, 1, 2            # mf_head_mode_t
CODECS = {"mask": 0, "fp16": 1, "bf16": 2, "fp8": 3, "u8log": 4}  # mf_codec_t
IMPL_DEFAULT, IMPL_V2, IMPL_CORE = 0, 2, 4  # mf_apply_impl_t (3, v3, left the product)
MAX_TOKENS = 1 << 20                     # MF_KERNELS_MAX_TOKENS
MAX_DIM = 1024                           # MF_KERNELS_MAX_DIM
MAX_HEADS = 64                           # mf_qkv_t: Hq 1..64
_NO_BLOCK = 0xffffffff                   # failed_block: every row fitted
MAX_ROWS_COPY = 1 << 20                  # MF_ROWS_COPY_MAX
EXTRACT_SAMPLE = 1                       # mf_extract_args_t.fields: the row sample is set
_ENV = "MAPFLOW_KERNELS_LIB"


# ==== C types (kernels/mapflow_kernels.h, kernels/mapflow_kernels_cuda.h) ===============

class Qkv(C.Structure):
    _c_type_ = "mf_qkv_t"
    _fields_ = [("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p), ("dtype", C.c_int),
                ("n_tokens", C.c_uint32), ("n_q_heads", C.c_uint32),
                ("n_kv_heads", C.c_uint32), ("head_dim", C.c_uint32)]


class LayerMap(C.Structure):
    _c_type_ = "mf_layer_map_t"
    _fields_ = [("n_target_heads", C.c_uint32), ("n_source_heads", C.c_uint32),
                ("w", C.c_void_p), ("mode", C.c_void_p), ("top_p", C.c_void_p)]


class ExtractArgs(C.Structure):
    _c_type_ = "mf_extract_args_t"
    _fields_ = [("src", Qkv), ("lse", C.c_void_p), ("block_size", C.c_uint32),
                ("top_p", C.c_float), ("codec", C.c_int), ("i0", C.c_uint32),
                ("i1", C.c_uint32), ("model", C.c_char_p), ("ns", C.c_char_p),
                ("layer", C.c_uint32), ("tokens", C.c_void_p), ("fields", C.c_uint32),
                ("sample_stride", C.c_uint32), ("sample_offset", C.c_uint32)]


class ApplyArgs(C.Structure):
    _c_type_ = "mf_apply_args_t"
    _fields_ = [("rows", C.c_void_p), ("n_rows", C.c_uint32), ("map", C.POINTER(LayerMap)),
                ("tgt", Qkv), ("block_size", C.c_uint32), ("exact", C.c_void_p),
                ("exact_first", C.c_uint32), ("exact_last", C.c_uint32),
                ("q0", C.c_uint32), ("q1", C.c_uint32), ("o", C.c_void_p)]


class ApplyStats(C.Structure):
    _c_type_ = "mf_apply_stats_t"
    _fields_ = [("exact_blocks", C.c_uint64), ("prob_tiles", C.c_uint64),
                ("mask_blocks", C.c_uint64), ("mask_candidates", C.c_uint64)]


class ExtractCudaArgs(C.Structure):
    _c_type_ = "mf_extract_cuda_args_t"
    _fields_ = [("src", Qkv), ("lse", C.c_void_p), ("block_size", C.c_uint32),
                ("top_p", C.c_float), ("codec", C.c_int), ("i0", C.c_uint32),
                ("i1", C.c_uint32), ("model", C.c_char_p), ("ns", C.c_char_p),
                ("layer", C.c_uint32), ("tokens", C.c_void_p), ("rows", C.c_void_p),
                ("caps", C.c_void_p), ("sizes", C.c_void_p), ("failed_block", C.c_void_p),
                ("mass_out", C.c_void_p), ("fields", C.c_uint32),
                ("sample_stride", C.c_uint32), ("sample_offset", C.c_uint32)]


class ExportCudaArgs(C.Structure):
    _c_type_ = "mf_export_cuda_args_t"
    _fields_ = [("ex", ExtractCudaArgs), ("o", C.c_void_p), ("lse", C.c_void_p),
                ("mass", C.c_void_p), ("scratch", C.c_void_p), ("scratch_bytes", C.c_size_t),
                ("o_dtype", C.c_int), ("rows_stream", C.c_void_p)]


class ApplyCudaArgs(C.Structure):
    _c_type_ = "mf_apply_cuda_args_t"
    _fields_ = [("rows", C.c_void_p), ("n_rows", C.c_uint32), ("map", C.POINTER(LayerMap)),
                ("tgt", Qkv), ("block_size", C.c_uint32), ("exact", C.c_void_p),
                ("exact_first", C.c_uint32), ("exact_last", C.c_uint32), ("o", C.c_void_p),
                ("bad_rows", C.c_void_p), ("o_dtype", C.c_int)]


# mf_row_view_t (proto/mf_row.h): what mf_row_decode of either library fills in; its
# layout is checked against libmapflow's, built from the same header.
RowView = _RowView

# Checked against mf_kernels_abi_layout() whenever a library is loaded (enums as C int).
_MIRRORS = [Qkv, LayerMap, ExtractArgs, ApplyArgs, ApplyStats, ExtractCudaArgs,
            ExportCudaArgs, ApplyCudaArgs] + [type("_Enum", (C.c_int,), {"_c_type_": t})
                              for t in ("mf_dtype_t", "mf_head_mode_t", "mf_apply_impl_t",
                                        "mf_codec_t", "mf_status_t")]

_P, _WHY = C.c_void_p, C.POINTER(C.c_char_p)
_D = C.POINTER(C.c_double)
_COMMON = {  # in both libraries
    "mf_kernels_abi_layout": (C.POINTER(_AbiField), [C.POINTER(C.c_size_t)]),
    "mf_row_decode": (C.c_int, [_P, C.c_size_t, C.c_uint, C.POINTER(_RowView), _WHY]),
    "mf_attention_dense_ref": (C.c_int, [C.POINTER(Qkv), _D, _D]),
}
_SIGS = {
    "ref": dict(_COMMON, **{
        "mf_extract_ref": (C.c_int, [C.POINTER(ExtractArgs), _P, _P, _P, _P, _WHY]),
        "mf_apply_ref": (C.c_int, [C.POINTER(ApplyArgs), C.POINTER(ApplyStats), _WHY]),
        "mf_extract_row_bound": (C.c_size_t, [C.c_int, C.c_uint32, C.c_uint32, C.c_uint32,
                                              C.c_size_t]),
        "mf_row_seal": (C.c_int, [_P, C.c_size_t]),
        "mf_rows_copy_ref": (C.c_int, [_P, _P, _P, C.c_uint32, _WHY]),
    }),
    "cuda": dict(_COMMON, **{
        "mf_cuda_supported": (C.c_int, [C.c_uint32, C.c_uint32, C.c_int, C.c_uint32, _WHY]),
        "mf_extract_cuda": (C.c_int, [C.POINTER(ExtractCudaArgs), _P, _WHY]),
        "mf_export_cuda": (C.c_int, [C.POINTER(ExportCudaArgs), _P, _WHY]),
        "mf_rows_copy_cuda": (C.c_int, [_P, _P, _P, C.c_uint32, _P, _WHY]),
        "mf_attention_masses_scratch": (C.c_size_t, [C.c_uint32]),
        "mf_apply_cuda": (C.c_int, [C.POINTER(ApplyCudaArgs), _P, _WHY]),
        "mf_apply_cuda_impl": (C.c_int, [C.POINTER(ApplyCudaArgs), C.c_int, _P, _WHY]),
        "mf_attention_dense_cuda": (C.c_int, [C.POINTER(Qkv), _P, _P, _P, _WHY]),
    }),
}
_LIBS: Dict[Tuple[str, Optional[str]], C.CDLL] = {}
_LOCK = threading.Lock()


def _kernel_candidates(kind: str) -> List[str]:
    soname = "libmfkernels_%s.so" % kind
    if os.environ.get(_ENV):
        return [os.path.join(os.environ[_ENV], soname)]
    return _candidates(soname, None)


def library(kind: str, path: Optional[str] = None) -> C.CDLL:
    """The loaded, layout-checked kernel library: kind "ref" or "cuda"; path overrides the
    search. ImportError when it cannot be loaded or does not match this module."""
    if kind not in _SIGS:
        raise ValueError("mapflow.kernels: library kind %r (ref or cuda)" % (kind,))
    with _LOCK:
        lib = _LIBS.get((kind, path))
        if lib is not None:
            return lib
        lib, where = _dlopen([path] if path else _kernel_candidates(kind),
                             "libmfkernels_%s.so" % kind,
                             "" if path or os.environ.get(_ENV) else
                             " (%s=DIR names the directory holding it)" % _ENV)
        for name, (res, args) in _SIGS[kind].items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise ImportError("mapflow.kernels: %s has no %s: a library older than this "
                                  "module" % (where, name)) from None
            f.restype, f.argtypes = res, args
        bad = _abi_mismatches(_lib_layout(lib.mf_kernels_abi_layout), _MIRRORS)
        if bad:
            raise ImportError("mapflow.kernels: %s does not match this module's view of the "
                              "kernel argument structs; build both from one commit. "
                              "Differences: %s" % (where, " | ".join(bad)))
        _LIBS[(kind, path)] = lib
        return lib


# ==== errors ==============================================================================

def _bad(msg: str) -> MapflowError:
    return MapflowError(INVALID_ARGUMENT, "mapflow.kernels: " + msg)


def _check(st: int, fn: str, why: C.c_char_p) -> None:
    if st != 0:
        raise MapflowError(st, "%s: %s" % (fn, (why.value or b"").decode(errors="replace")))


class RowOverflow(_ERRORS[RESOURCE_EXHAUSTED]):
    """extract: row .block did not fit its capacity (.needed bytes, when known)."""

    def __new__(cls, block: int, needed: int = 0):
        return super().__new__(cls, RESOURCE_EXHAUSTED, "")

    def __init__(self, block: int, needed: int = 0):
        self.block, self.needed = int(block), int(needed)
        super().__init__(RESOURCE_EXHAUSTED, "extract: row %d did not fit its buffer%s" % (
            block, " (%d bytes needed)" % needed if needed else ""))

    def __reduce__(self):
        return (RowOverflow, (self.block, self.needed))


# ==== argument checks shared by both sides ===============================================

def _u32(x: Any, name: str, lo: int = 0, hi: int = 0xffffffff) -> int:
    try:
        v = int(x)
    except (TypeError, ValueError):
        raise _bad("%s must be an integer, not %r" % (name, x)) from None
    if not lo <= v <= hi:
        raise _bad("%s = %d is outside [%d, %d]" % (name, v, lo, hi))
    return v


def _qkv_dims(shapes: Sequence[Optional[Tuple[int, ...]]]) -> Tuple[int, int, int, int]:
    """(N, Hq, Hkv, d) from the shapes of Q, K and V (V None: not used); the rules of
    mf_qkv_check, so the C code never sees dims the buffers do not have."""
    names = ("q", "k", "v")
    for nm, s in zip(names, shapes):
        if s is not None and len(s) != 3:
            raise _bad("%s must be 3-D [N, H, d], got shape %s" % (nm, tuple(s)))
    n, hq, d = shapes[0]
    hkv = shapes[1][1]
    for nm, s in zip(names[1:], shapes[1:]):
        if s is not None and (s[0] != n or s[2] != d or s[1] != hkv):
            raise _bad("%s has shape %s; [N, Hkv, d] = [%d, %d, %d] wanted (q is %s)"
                       % (nm, tuple(s), n, hkv, d, tuple(shapes[0])))
    if not 1 <= n <= MAX_TOKENS:
        raise _bad("N = %d tokens is outside [1, %d]" % (n, MAX_TOKENS))
    if not 1 <= d <= MAX_DIM:
        raise _bad("head_dim = %d is outside [1, %d]" % (d, MAX_DIM))
    if not 1 <= hq <= MAX_HEADS or hkv < 1 or hq % hkv:
        raise _bad("Hq = %d, Hkv = %d: Hq must be in [1, %d] and a multiple of Hkv"
                   % (hq, hkv, MAX_HEADS))
    return n, hq, hkv, d


def _bytes_arg(s: Any, name: str) -> bytes:
    b = s.encode() if isinstance(s, str) else bytes(s)
    if not 1 <= len(b) <= 255 or b"\0" in b:
        raise _bad("%s must be 1..255 bytes without NUL, got %d bytes" % (name, len(b)))
    return b


def _codec(codec: Any) -> int:
    if isinstance(codec, str):
        if codec not in CODECS:
            raise _bad("codec %r is not one of %s" % (codec, ", ".join(CODECS)))
        return CODECS[codec]
    if int(codec) not in CODECS.values():
        raise _bad("codec %r is not one of %s" % (codec, sorted(CODECS.values())))
    return int(codec)


def _need_np() -> None:
    if np is None:
        raise ImportError("mapflow.kernels: NumPy is needed for this call")


def _host_array(x: Any, name: str, dtype: Any, shape: Tuple[int, ...]) -> Any:
    """x as a C-contiguous NumPy array of dtype and exactly shape (a copy when it has
    another dtype or layout): the small host-side arrays (layer map, tokens, flags)."""
    a = np.ascontiguousarray(np.asarray(x), dtype=dtype)
    if a.shape != tuple(shape):
        raise _bad("%s has shape %s, %s wanted" % (name, a.shape, tuple(shape)))
    return a


def _layer_map(w: Any, mode: Any, top_p: Any, ht: int) -> Tuple[LayerMap, Tuple]:
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[0] != ht or not 1 <= w.shape[1] <= MAX_HEADS:
        raise _bad("w has shape %s; [Ht = %d, Hs ≤ %d] wanted" % (w.shape, ht, MAX_HEADS))
    w = _host_array(w, "w", np.float32, w.shape)
    mode = _host_array(mode, "mode", np.uint8, (ht,))
    if (mode > MASK).any():
        raise _bad("mode holds %d; modes are COMPUTE 0, PROB 1, MASK 2" % int(mode.max()))
    tp = None if top_p is None else _host_array(top_p, "top_p", np.float32, (ht,))
    lm = LayerMap(ht, w.shape[1], w.ctypes.data, mode.ctypes.data,
                  None if tp is None else tp.ctypes.data)
    return lm, (w, mode, tp)


def _exact(exact: Any, n: int, b: int) -> Tuple[Optional[int], Any]:
    if exact is None:
        return None, None
    e = _host_array(exact, "exact", np.uint8, (-(-n // b),))
    return e.ctypes.data, e


def _block(b: Any) -> int:
    b = _u32(b, "block_size", 8, 256)
    if b & (b - 1):
        raise _bad("block_size = %d is not a power of two in [8, 256]" % b)
    return b


def _blocks(i0: Any, i1: Any, n: int, b: int) -> Tuple[int, int]:
    full = n // b
    i1 = full if i1 is None else _u32(i1, "i1", 0, full)
    i0 = _u32(i0, "i0", 0, i1)
    if i0 == i1:
        raise _bad("no query blocks: [i0, i1) = [%d, %d) (N / B = %d full blocks)"
                   % (i0, i1, full))
    return i0, i1


def _caps(caps: Optional[Sequence[int]], codec: int, b: int, h: int, i0: int, i1: int,
          model: bytes) -> List[int]:
    if caps is not None:
        caps = [_u32(c, "caps[%d]" % k, 1, 1 << 40) for k, c in enumerate(caps)]
        if len(caps) != i1 - i0:
            raise _bad("caps has %d entries for %d rows" % (len(caps), i1 - i0))
        return caps
    lib = library("ref")  # the bound is C code of the reference; the CUDA .so lacks it
    out = [lib.mf_extract_row_bound(codec, b, h, i, len(model)) for i in range(i0, i1)]
    if not all(out):
        raise _bad("no row bound for codec %d, B %d, %d heads" % (codec, b, h))
    return out


def row_bounds(n_heads: int, i0: int, i1: int, *, block_size: int, model: Any,
               codec: Any = "mask") -> List[int]:
    """mf_extract_row_bound for query blocks i0..i1-1: each row's capacity, the caps
    extract_cuda / export_cuda take by default (never too small). What a source reserves
    a put region by (Channel.put_region(model, layer, caps, capacities=True)) before the
    kernel writes the rows there (rows=PutRegion.rows)."""
    b = _block(block_size)
    if not 0 <= int(i0) < int(i1):
        raise _bad("blocks [%r, %r) are empty or negative" % (i0, i1))
    return _caps(None, _codec(codec), b, _u32(n_heads, "n_heads", 1, 64), int(i0), int(i1),
                 _bytes_arg(model, "model"))


def _row_addr(i: int, r: Any) -> int:
    """Row i's device address r as an int: non-zero and 16-byte aligned (the kernels' rule
    for every row they read or write), else MapflowError INVALID_ARGUMENT."""
    if not isinstance(r, int) or r <= 0 or r % 16:
        raise _bad("rows[%d] = %r is not a 16-byte aligned device address" % (i, r))
    return r


def _dest_rows(rows: Optional[Sequence[int]], nr: int) -> Optional[List[int]]:
    """The caller's row addresses (rows=): one per row, 16-byte aligned device addresses."""
    if rows is None:
        return None
    try:
        out = [int(r) for r in rows]
    except (TypeError, ValueError) as e:
        raise _bad("rows must be device addresses (ints): %s" % e) from None
    if len(out) != nr:
        raise _bad("rows has %d addresses for %d rows" % (len(out), nr))
    return [_row_addr(i, r) for i, r in enumerate(out)]


def _sample(stride: Any, offset: Any, b: int) -> Tuple[int, int, int]:
    """(fields, stride, offset) of extract's strided query sample (MF_EXTRACT_SAMPLE):
    masses from the rows q ≡ offset (mod stride) of each block; stride 1 = every row."""
    st = _u32(stride, "sample_stride", 1, b)
    if st & (st - 1):
        raise _bad("sample_stride = %d must be a power of two ≤ B = %d (it divides B)" % (st, b))
    off = _u32(offset, "sample_offset", 0, st - 1)
    return (0, 1, 0) if st == 1 and off == 0 else (EXTRACT_SAMPLE, st, off)


def _offsets(caps: Sequence[int]) -> Tuple[List[int], int]:
    offs, at = [], 0
    for c in caps:
        offs.append(at)
        at += (c + 15) & ~15  # rows are 16-byte aligned
    return offs, at


class Rows:
    """Map rows in one buffer: row k (query block i0 + k) is buf[offsets[k] :
    offsets[k] + sizes[k]]. buf is a NumPy uint8 array (extract_ref) or a CUDA uint8
    tensor (extract_cuda, whose mass is the optional [Hq, i1 − i0, i1] float32 tensor)."""

    def __init__(self, buf: Any, base: int, offsets: List[int], sizes: List[int], i0: int,
                 mass: Any = None, keep: Any = None):
        self.buf, self.base, self.offsets, self.sizes = buf, base, offsets, sizes
        self.i0, self.mass, self._keep = i0, mass, keep

    def __len__(self) -> int:
        return len(self.offsets)

    def ptrs(self) -> List[int]:
        """Addresses of the rows (device addresses for extract_cuda)."""
        return [self.base + o for o in self.offsets]

    def host(self) -> List[Any]:
        """Each row as a NumPy uint8 array (a copy from the device for extract_cuda)."""
        if self.buf is None:
            raise _bad("the rows were written at the caller's addresses (rows=): read them "
                       "there (ptrs(), sizes)")
        b = self.buf if np is not None and isinstance(self.buf, np.ndarray) else \
            self.buf.cpu().numpy()
        return [b[o:o + s] for o, s in zip(self.offsets, self.sizes)]


# ==== reference (host) ===================================================================

def _host_tensor(x: Any, name: str) -> Tuple[int, Tuple[int, ...], int, Any]:
    """(address, shape, mf_dtype_t, object to keep alive) of a C-contiguous host tensor:
    a NumPy array (float32, float16) or a CPU torch tensor (also bfloat16)."""
    if type(x).__module__.startswith("torch"):
        import torch
        dt = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}.get(x.dtype)
        if x.device.type != "cpu":
            raise _bad("%s is on %s; the reference takes host tensors" % (name, x.device))
        if dt is None:
            raise _bad("%s has dtype %s; float32, float16 or bfloat16 wanted" % (name, x.dtype))
        if not x.is_contiguous():
            raise _bad("%s is not contiguous (call .contiguous())" % name)
        return x.data_ptr(), tuple(x.shape), dt, x
    _need_np()
    if not isinstance(x, np.ndarray):
        raise _bad("%s must be a NumPy array or a torch tensor, not %s" % (name, type(x)))
    dt = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}.get(x.dtype)
    if dt is None:
        raise _bad("%s has dtype %s; float32 or float16 wanted" % (name, x.dtype))
    if not x.flags["C_CONTIGUOUS"]:
        raise _bad("%s is not C-contiguous (numpy.ascontiguousarray)" % name)
    return x.ctypes.data, x.shape, dt, x


def _host_qkv(q: Any, k: Any, v: Any) -> Tuple[Qkv, Tuple[int, int, int, int]]:
    t = [_host_tensor(x, nm) if x is not None else None for x, nm in ((q, "q"), (k, "k"),
                                                                       (v, "v"))]
    dims = _qkv_dims([x[1] if x else None for x in t])
    if any(x is not None and x[2] != t[0][2] for x in t):
        raise _bad("q, k, v must share one dtype")
    return Qkv(t[0][0], t[1][0], t[2][0] if t[2] else None, t[0][2], dims[0], dims[1], dims[2],
               dims[3]), dims


def attention_dense_ref(q: Any, k: Any, v: Any, lib: Optional[str] = None) -> Tuple[Any, Any]:
    """Dense causal attention in float64 (mf_attention_dense_ref): (O [N, Hq, d], LSE
    [Hq, N]) as float64 NumPy arrays."""
    L = library("ref", lib)
    qkv, (n, hq, _, d) = _host_qkv(q, k, v)
    o = np.empty((n, hq, d), np.float64)
    lse = np.empty((hq, n), np.float64)
    st = L.mf_attention_dense_ref(C.byref(qkv), o.ctypes.data_as(_D), lse.ctypes.data_as(_D))
    _check(st, "mf_attention_dense_ref", C.c_char_p(b""))
    return o, lse


def extract_ref(q: Any, k: Any, *, block_size: int, top_p: float, tokens: Any,
                model: Any, ns: Any, codec: Any = "mask", layer: int = 0, lse: Any = None,
                i0: int = 0, i1: Optional[int] = None, caps: Optional[Sequence[int]] = None,
                sample_stride: int = 1, sample_offset: int = 0,
                lib: Optional[str] = None) -> Rows:
    """mf_extract_ref: map rows of query blocks [i0, i1) (default every full block) from
    source Q, K [N, Hq, d]. tokens [N] (uint32), lse [Hq, N] float32 or None (computed),
    caps the rows' capacities (default mf_extract_row_bound: never too small). A row that
    does not fit raises RowOverflow. sample_stride s > 1: masses from the query rows
    q ≡ sample_offset (mod s) of each block only (MF_EXTRACT_SAMPLE; s a power of two ≤ B),
    the approximation for a source whose attention returns only O and the LSE."""
    L = library("ref", lib)
    qkv, (n, hq, _, _) = _host_qkv(q, k, None)
    b = _block(block_size)
    i0, i1 = _blocks(i0, i1, n, b)
    cd, model, ns = _codec(codec), _bytes_arg(model, "model"), _bytes_arg(ns, "ns")
    if not 0.0 < float(top_p) <= 1.0:
        raise _bad("top_p = %r is outside (0, 1]" % (top_p,))
    tok = _host_array(tokens, "tokens", np.uint32, (n,))
    smp = _sample(sample_stride, sample_offset, b)
    lse_a = None if lse is None else _host_array(lse, "lse", np.float32, (hq, n))
    caps = _caps(caps, cd, b, hq, i0, i1, model)
    offs, total = _offsets(caps)
    raw = np.zeros(total + 16, np.uint8)
    pad = (-raw.ctypes.data) % 16
    buf = raw[pad:pad + total]
    nr = i1 - i0
    ptrs = (C.c_void_p * nr)(*[buf.ctypes.data + o for o in offs])
    capa = (C.c_size_t * nr)(*caps)
    sizes = (C.c_size_t * nr)()
    failed = C.c_uint32(_NO_BLOCK)
    a = ExtractArgs(qkv, None if lse_a is None else lse_a.ctypes.data, b, float(top_p), cd,
                    i0, i1, model, ns, _u32(layer, "layer"), tok.ctypes.data, *smp)
    why = C.c_char_p()
    st = L.mf_extract_ref(C.byref(a), ptrs, capa, sizes, C.byref(failed), C.byref(why))
    if st == RESOURCE_EXHAUSTED and failed.value != _NO_BLOCK:
        raise RowOverflow(failed.value, sizes[failed.value - i0])
    _check(st, "mf_extract_ref", why)
    return Rows(buf, buf.ctypes.data, offs, [int(s) for s in sizes], i0, keep=raw)


def apply_ref(rows: Optional[Sequence[Any]], w: Any, mode: Any, q: Any, k: Any, v: Any, *,
              block_size: int, top_p: Any = None, exact: Any = None, exact_first: int = 0,
              exact_last: int = 0, q0: int = 0, q1: int = 0, out: Any = None,
              lib: Optional[str] = None) -> Tuple[Any, Dict[str, int]]:
    """mf_apply_ref: O [N, Ht, d] float32 (a new zeroed array, or out) and the work
    counters (mf_apply_stats_t as a dict). rows: per query block a row (bytes-like, e.g.
    Rows.host()[k], a leased row's data) or None, or a Rows; None = no rows (every block
    dense). w [Ht, Hs], mode [Ht], top_p [Ht] or None, exact [ceil(N / B)] or None."""
    L = library("ref", lib)
    qkv, (n, hq, _, d) = _host_qkv(q, k, v)
    b = _block(block_size)
    lm, keep = _layer_map(w, mode, top_p, hq)
    ex, ex_keep = _exact(exact, n, b)
    nblk = -(-n // b)
    q0 = _u32(q0, "q0", 0, nblk)
    q1 = _u32(q1, "q1", 0, nblk)
    if q1 and q0 >= q1:
        raise _bad("query blocks [q0, q1) = [%d, %d) are empty" % (q0, q1))
    if isinstance(rows, Rows):
        rows = [None] * rows.i0 + rows.host()
    rows = [] if rows is None else list(rows)
    if len(rows) > nblk:
        raise _bad("%d rows for %d query blocks" % (len(rows), nblk))
    views = (_RowView * max(1, len(rows)))()
    vptr = (C.POINTER(_RowView) * max(1, len(rows)))()
    held = []
    for i, r in enumerate(rows):
        if r is None:
            continue
        # mf_row_decode wants 16-byte alignment: copy into an aligned buffer when needed.
        a = np.frombuffer(r, np.uint8) if not isinstance(r, np.ndarray) else r.view(np.uint8)
        if a.ndim != 1 or a.ctypes.data % 16 or not a.flags["C_CONTIGUOUS"]:
            raw = np.zeros(a.size + 16, np.uint8)
            pad = (-raw.ctypes.data) % 16
            raw[pad:pad + a.size] = a.ravel()
            a = raw[pad:pad + a.size]
        held.append(a)
        why = C.c_char_p()
        st = L.mf_row_decode(a.ctypes.data, a.size, 0, C.byref(views[i]), C.byref(why))
        _check(st, "mf_row_decode (row %d)" % i, why)
        vptr[i] = C.pointer(views[i])
    if out is None:
        out = np.zeros((n, hq, d), np.float32)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and
              out.shape == (n, hq, d) and out.flags["C_CONTIGUOUS"]):
        raise _bad("out must be a C-contiguous float32 array of shape %s" % ((n, hq, d),))
    a = ApplyArgs(C.cast(vptr, C.c_void_p), len(rows), C.pointer(lm), qkv, b, ex,
                  _u32(exact_first, "exact_first"), _u32(exact_last, "exact_last"), q0, q1,
                  out.ctypes.data)
    stats = ApplyStats()
    why = C.c_char_p()
    st = L.mf_apply_ref(C.byref(a), C.byref(stats), C.byref(why))
    del keep, ex_keep, held
    _check(st, "mf_apply_ref", why)
    return out, {f[0]: int(getattr(stats, f[0])) for f in ApplyStats._fields_}


# ==== CUDA (torch tensors) ===============================================================

def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("mapflow.kernels: the CUDA calls take torch tensors; torch is not "
                          "importable") from None
    return torch


def _cuda_qkv(q: Any, k: Any, v: Any) -> Tuple[Qkv, Tuple[int, int, int, int], Any]:
    torch = _torch()
    names = ("q", "k", "v")
    ts = [(x, nm) for x, nm in zip((q, k, v), names) if x is not None]
    for x, nm in ts:
        if not isinstance(x, torch.Tensor):
            raise _bad("%s must be a torch tensor, not %s" % (nm, type(x)))
        if not x.is_cuda:
            raise _bad("%s is on %s; a CUDA tensor wanted" % (nm, x.device))
        if x.device != q.device:
            raise _bad("%s is on %s, q on %s: one device" % (nm, x.device, q.device))
        if x.dtype != q.dtype:
            raise _bad("%s is %s, q %s: one dtype" % (nm, x.dtype, q.dtype))
        if not x.is_contiguous():
            raise _bad("%s is not contiguous (call .contiguous())" % nm)
        if x.data_ptr() % 16:
            raise _bad("%s's data is not 16-byte aligned" % nm)
    dt = {torch.float16: F16, torch.bfloat16: BF16}.get(q.dtype)
    if dt is None:
        raise _bad("q has dtype %s; float16 or bfloat16 wanted" % q.dtype)
    dims = _qkv_dims([tuple(q.shape), tuple(k.shape), None if v is None else tuple(v.shape)])
    return Qkv(q.data_ptr(), k.data_ptr(), None if v is None else v.data_ptr(), dt, *dims), \
        dims, torch


def _cuda_out(t: Any, name: str, shape: Tuple[int, ...], dtype: Any, dev: Any) -> None:
    torch = _torch()
    if not (isinstance(t, torch.Tensor) and t.device == dev and t.dtype == dtype and
            tuple(t.shape) == tuple(shape) and t.is_contiguous()):
        raise _bad("%s must be a contiguous %s tensor of shape %s on %s" % (name, dtype,
                                                                             shape, dev))


def cuda_supported(block_size: int, head_dim: int, dtype: Any, n_tokens: int,
                   lib: Optional[str] = None) -> Tuple[bool, str]:
    """(supported, why not) for the CUDA kernels (mf_cuda_supported); dtype a torch dtype
    or an mf_dtype_t number."""
    L = library("cuda", lib)
    if not isinstance(dtype, int):
        torch = _torch()
        dtype = {torch.float16: F16, torch.bfloat16: BF16, torch.float32: F32}.get(dtype, -1)
    why = C.c_char_p()
    st = L.mf_cuda_supported(_u32(block_size, "block_size"), _u32(head_dim, "head_dim"),
                             int(dtype), _u32(n_tokens, "n_tokens"), C.byref(why))
    return st == 0, (why.value or b"").decode(errors="replace") if st else ""


def _stream(torch: Any, dev: Any) -> int:
    return torch.cuda.current_stream(dev).cuda_stream


def attention_dense_cuda(q: Any, k: Any, v: Any, want_lse: bool = True,
                         out: Any = None, lib: Optional[str] = None) -> Tuple[Any, Any]:
    """mf_attention_dense_cuda (sm_90a attention core): (O [N, Hq, d] float32, LSE [Hq, N]
    float32 or None) on q's device, queued on torch's current stream."""
    L = library("cuda", lib)
    qkv, (n, hq, _, d), torch = _cuda_qkv(q, k, v)
    if out is None:
        out = torch.empty((n, hq, d), dtype=torch.float32, device=q.device)
    _cuda_out(out, "out", (n, hq, d), torch.float32, q.device)
    lse = torch.empty((hq, n), dtype=torch.float32, device=q.device) if want_lse else None
    why = C.c_char_p()
    with torch.cuda.device(q.device):
        st = L.mf_attention_dense_cuda(C.byref(qkv), out.data_ptr(),
                                       None if lse is None else lse.data_ptr(),
                                       _stream(torch, q.device), C.byref(why))
    _check(st, "mf_attention_dense_cuda", why)
    return out, lse


def _extract_setup(q: Any, k: Any, v: Any, block_size: int, top_p: float, tokens: Any,
                   model: Any, ns: Any, codec: Any, layer: int, lse: Any, i0: int,
                   i1: Optional[int], caps: Optional[Sequence[int]], buf: Any,
                   want_mass: bool, sample: Tuple[int, int] = (1, 0),
                   rows: Optional[Sequence[int]] = None
                   ) -> Tuple[ExtractCudaArgs, Dict[str, Any]]:
    """The argument struct of mf_extract_cuda / mf_export_cuda's ex, and what it points
    into (kept alive by the caller until the call has been issued and the sizes read).
    rows: the caller's row addresses (e.g. a put region's), instead of buf."""
    qkv, (n, hq, _, d), torch = _cuda_qkv(q, k, v)
    dev = q.device
    b = _block(block_size)
    i0, i1 = _blocks(i0, i1, n, b)
    cd, model, ns = _codec(codec), _bytes_arg(model, "model"), _bytes_arg(ns, "ns")
    if not 0.0 < float(top_p) <= 1.0:
        raise _bad("top_p = %r is outside (0, 1]" % (top_p,))
    _need_np()
    tok = _host_array(tokens, "tokens", np.uint32, (n,))
    smp = _sample(sample[0], sample[1], b)
    if lse is not None:
        _cuda_out(lse, "lse", (hq, n), torch.float32, dev)
    caps = _caps(caps, cd, b, hq, i0, i1, model)
    dest = _dest_rows(rows, i1 - i0)
    offs, total = _offsets(caps) if dest is None else (dest, 0)
    if dest is not None:
        buf = None  # written at the caller's addresses: no buffer of ours
    elif buf is None or buf.numel() < total:
        buf = torch.empty(total, dtype=torch.uint8, device=dev)
    elif not (buf.dtype == torch.uint8 and buf.device == dev and buf.is_contiguous() and
              buf.data_ptr() % 16 == 0):
        raise _bad("buf must be a contiguous, 16-byte aligned uint8 tensor on %s" % dev)
    nr = i1 - i0
    sizes = torch.zeros(nr, dtype=torch.int64, device=dev)
    failed = torch.zeros(1, dtype=torch.int32, device=dev)
    mass = torch.zeros((hq, nr, i1), dtype=torch.float32, device=dev) if want_mass else None
    base = 0 if buf is None else buf.data_ptr()
    ptrs = (C.c_void_p * nr)(*[base + o for o in offs])
    capa = (C.c_size_t * nr)(*caps)
    a = ExtractCudaArgs(qkv, None if lse is None else lse.data_ptr(), b, float(top_p), cd, i0,
                        i1, model, ns, _u32(layer, "layer"), tok.ctypes.data,
                        C.cast(ptrs, C.c_void_p), C.cast(capa, C.c_void_p), sizes.data_ptr(),
                        failed.data_ptr(), None if mass is None else mass.data_ptr(), *smp)
    keep = dict(torch=torch, dev=dev, n=n, hq=hq, d=d, i0=i0, i1=i1, buf=buf, offs=offs,
                sizes=sizes, failed=failed, mass=mass, tok=tok, ptrs=ptrs, capa=capa,
                model=model, ns=ns)
    return a, keep


def _extract_rows(keep: Dict[str, Any], mass: Any = None) -> "Rows":
    got = keep["sizes"].cpu().tolist()  # synchronises the stream
    fb = int(keep["failed"].item()) & 0xffffffff
    i0, i1 = keep["i0"], keep["i1"]
    if fb != _NO_BLOCK:
        raise RowOverflow(fb, got[fb - i0] if i0 <= fb < i1 else 0)
    buf = keep["buf"]
    return Rows(buf, 0 if buf is None else buf.data_ptr(), keep["offs"], [int(s) for s in got], i0,
                mass=keep["mass"] if mass is None else mass)


def extract_cuda(q: Any, k: Any, *, block_size: int, top_p: float, tokens: Any,
                 model: Any, ns: Any, codec: Any = "mask", layer: int = 0, lse: Any = None,
                 i0: int = 0, i1: Optional[int] = None, caps: Optional[Sequence[int]] = None,
                 buf: Any = None, want_mass: bool = False, sample_stride: int = 1,
                 sample_offset: int = 0, rows: Optional[Sequence[int]] = None,
                 lib: Optional[str] = None) -> Rows:
    """mf_extract_cuda: the rows of extract_ref, in a device buffer (buf: a uint8 CUDA
    tensor to reuse when large enough, else a new one). lse [Hq, N] float32 on the device
    or None; tokens [N] on the host; want_mass: also the block masses; sample_stride /
    sample_offset as extract_ref's (only the sampled rows' scores are computed).
    rows: device addresses (one per row, 16-byte aligned, caps[k] bytes each: e.g. the
    rows of a put region begun with these caps and capacities=True) to write the rows at
    instead of buf; the Rows then have buf None and ptrs() those addresses.
    Synchronises torch's stream to read the sizes back; a row that does not fit raises
    RowOverflow."""
    L = library("cuda", lib)
    a, keep = _extract_setup(q, k, None, block_size, top_p, tokens, model, ns, codec, layer,
                             lse, i0, i1, caps, buf, want_mass, (sample_stride, sample_offset),
                             rows)
    why = C.c_char_p()
    with keep["torch"].cuda.device(keep["dev"]):
        st = L.mf_extract_cuda(C.byref(a), _stream(keep["torch"], keep["dev"]), C.byref(why))
    _check(st, "mf_extract_cuda", why)
    return _extract_rows(keep)


def export_cuda(q: Any, k: Any, v: Any, *, top_p: float, tokens: Any, model: Any, ns: Any,
                codec: Any = "mask", layer: int = 0, i0: int = 0, i1: Optional[int] = None,
                caps: Optional[Sequence[int]] = None, buf: Any = None,
                want_mass: bool = False, scratch: Any = None, o_dtype: Any = None,
                rows_stream: Any = None, rows: Optional[Sequence[int]] = None,
                lib: Optional[str] = None) -> Tuple[Any, Any, Any]:
    """mf_export_cuda, the source's exporter: the layer's dense causal attention and its
    rows in one call (block size 64; sm_90). Returns (O [N, Hq, d], LSE [Hq, N] float32,
    rows as extract_cuda's; want_mass: rows.mass holds the [Hq, N/64, N/64] masses the rows
    were selected from). o_dtype: O's dtype, torch.float32 (None, the default) or q.dtype
    (written by the kernel's epilogue: no fp32 O and no cast for the model). scratch: a
    uint8 CUDA tensor of at least mf_attention_masses_scratch(N) bytes to reuse across
    layers (else one per call). rows_stream (a torch.cuda.Stream): the rows' launches go
    there after the forward, so torch's current stream goes on with O at once; the third
    value is then a PendingRows (its wait() gives the Rows). rows: the rows' addresses, as
    extract_cuda's (written in place, e.g. a put region begun with capacities=True).
    MapflowError UNIMPLEMENTED off sm_90."""
    L = library("cuda", lib)
    if v is None:
        raise _bad("export_cuda needs v (the layer's values)")
    a, keep = _extract_setup(q, k, v, 64, top_p, tokens, model, ns, codec, layer, None, i0,
                             i1, caps, buf, False, rows=rows)
    torch, dev, n, hq, d = keep["torch"], keep["dev"], keep["n"], keep["hq"], keep["d"]
    odt, o_code = _o_dtype(o_dtype, q)
    o = torch.empty((n, hq, d), dtype=odt, device=dev)
    lse = torch.empty((hq, n), dtype=torch.float32, device=dev)
    nb = n // 64  # a partial last block has no mass row (mf_attention_masses_cuda)
    # always passed: the kernel would otherwise allocate it stream-ordered per call, and the
    # pool gives it back at the synchronisation _extract_rows makes; torch's cache keeps it
    mass = torch.empty((hq, nb, nb), dtype=torch.float32, device=dev)
    with torch.cuda.device(dev):
        need = int(L.mf_attention_masses_scratch(n))
    if scratch is not None and not (scratch.dtype == torch.uint8 and scratch.device == dev and
                                    scratch.is_contiguous() and scratch.numel() >= need and
                                    scratch.data_ptr() % 256 == 0):
        raise _bad("scratch must be a contiguous, 256-byte aligned uint8 tensor of at least "
                   "%d bytes on %s" % (need, dev))
    if rows_stream is not None and rows_stream.device != dev:
        raise _bad("rows_stream is on %s, q on %s" % (rows_stream.device, dev))
    e = ExportCudaArgs(a, o.data_ptr(), lse.data_ptr(), mass.data_ptr(),
                       None if scratch is None else scratch.data_ptr(),
                       0 if scratch is None else scratch.numel(),
                       o_code, None if rows_stream is None else rows_stream.cuda_stream)
    why = C.c_char_p()
    with torch.cuda.device(dev):
        st = L.mf_export_cuda(C.byref(e), _stream(torch, dev), C.byref(why))
    _check(st, "mf_export_cuda", why)
    if rows_stream is not None:
        # what the rows' launches read stays referenced until they are done
        keep.update(q=q, k=k, lse=lse, all_mass=mass, scratch=scratch)
        done = torch.cuda.Event()
        done.record(rows_stream)
        return o, lse, PendingRows(keep, mass if want_mass else None, rows_stream, done)
    return o, lse, _extract_rows(keep, mass if want_mass else None)


class PendingRows:
    """export_cuda's rows while their launches run on rows_stream. wait(stream) (any
    thread) waits for the event recorded right after them (not for the stream: later
    layers' launches may be queued there already), reads the sizes back on `stream`
    (default rows_stream) and returns the Rows, or raises RowOverflow as export_cuda does;
    until then this object keeps the tensors those launches read (Q, K, LSE, masses,
    scratch, the row buffer) referenced, so torch's allocator cannot hand them out while
    they are in use."""

    def __init__(self, keep: Dict[str, Any], mass: Any, stream: Any, done: Any):
        self._keep, self._mass, self.stream, self.done = keep, mass, stream, done
        self.buf = keep["buf"]  # the rows' buffer (reusable once wait() has returned)
        self._rows: Optional[Rows] = None

    def wait(self, stream: Any = None) -> "Rows":
        if self._rows is None:
            torch = self._keep["torch"]
            self.done.synchronize()
            with torch.cuda.stream(self.stream if stream is None else stream):
                rows = _extract_rows(self._keep, self._mass)
            self._rows, self._keep = rows, None
        return self._rows


def _mf_dtype(torch: Any, dt: Any) -> int:
    """The mf_dtype_t of a torch dtype the CUDA kernels take (F16 / BF16)."""
    return {torch.float16: F16, torch.bfloat16: BF16}[dt]


def _o_dtype(o_dtype: Any, q: Any) -> Tuple[Any, int]:
    """(torch dtype, mf_dtype_t) of O for export_cuda / apply_cuda's o_dtype: torch.float32
    (None) or q's dtype (the C side's o_dtype rule, checked here first)."""
    torch = _torch()
    odt = torch.float32 if o_dtype is None else o_dtype
    qdt = getattr(q, "dtype", None)
    if odt != torch.float32 and (odt != qdt or qdt not in (torch.float16, torch.bfloat16)):
        raise _bad("o_dtype %s: torch.float32 or q's dtype %s wanted" % (odt, qdt))
    return odt, F32 if odt == torch.float32 else _mf_dtype(torch, odt)


def _copy_tables(dst: Sequence[int], src: Sequence[int], sizes: Sequence[int]) -> Tuple:
    """The three host arrays of mf_rows_copy_*: addresses and sizes as ints, checked here
    (one length, sizes ≥ 0, at most MAX_ROWS_COPY) before C sees them."""
    n = len(sizes)
    if len(dst) != n or len(src) != n:
        raise _bad("rows copy: %d destinations, %d sources, %d sizes" % (len(dst), len(src), n))
    if n > MAX_ROWS_COPY:
        raise _bad("rows copy: %d rows, at most %d" % (n, MAX_ROWS_COPY))
    try:
        d, s, z = [[int(x) for x in a] for a in (dst, src, sizes)]
    except (TypeError, ValueError) as e:
        raise _bad("rows copy: addresses and sizes must be ints (%s)" % e) from None
    if any(x < 0 or x >= 1 << 64 for a in (d, s, z) for x in a):
        raise _bad("rows copy: addresses and sizes must be in [0, 2**64)")
    return ((C.c_void_p * max(1, n))(*[x or None for x in d]),
            (C.c_void_p * max(1, n))(*[x or None for x in s]),
            (C.c_size_t * max(1, n))(*z), n)


def rows_copy_ref(dst: Sequence[int], src: Sequence[int], sizes: Sequence[int],
                  lib: Optional[str] = None) -> None:
    """mf_rows_copy_ref: sizes[x] bytes from host address src[x] to dst[x] (the spec of
    rows_copy_cuda)."""
    L = library("ref", lib)
    d, s, z, n = _copy_tables(dst, src, sizes)
    why = C.c_char_p()
    _check(L.mf_rows_copy_ref(d, s, z, n, C.byref(why)), "mf_rows_copy_ref", why)


def rows_copy_cuda(dst: Sequence[int], src: Sequence[int], sizes: Sequence[int],
                   stream: Any = None, device: Any = None, lib: Optional[str] = None) -> None:
    """mf_rows_copy_cuda: sizes[x] bytes from device address src[x] to dst[x], one launch
    queued on stream (a torch.cuda.Stream; default: torch's current stream of device)."""
    L = library("cuda", lib)
    torch = _torch()
    d, s, z, n = _copy_tables(dst, src, sizes)
    dev = torch.device("cuda") if device is None else torch.device(device)
    if stream is None:
        stream = torch.cuda.current_stream(dev)
    why = C.c_char_p()
    with torch.cuda.device(stream.device):
        st = L.mf_rows_copy_cuda(d, s, z, n, stream.cuda_stream, C.byref(why))
    _check(st, "mf_rows_copy_cuda", why)


def _row_ptrs(rows: Any, nblk: int, dev: Any, torch: Any) -> Tuple[int, int, Any]:
    """apply_cuda's rows as (address of an array of 16-byte aligned device addresses, 0 =
    no row; its length ≤ nblk; the object that owns it). A uint64 NumPy array (e.g. a
    layer's slice of GetResult.columns().data) is checked whole and passed without a copy
    when contiguous: every entry must be a row (non-zero). Other sequences: entry by entry."""
    if np is not None and isinstance(rows, np.ndarray):
        if rows.dtype != np.uint64 or rows.ndim != 1:
            raise _bad("rows as a NumPy array must be 1-D uint64 device addresses, not %s %s"
                       % (rows.dtype, rows.shape))
        if rows.size > nblk:
            raise _bad("%d rows for %d query blocks" % (rows.size, nblk))
        bad = np.flatnonzero((rows == 0) | (rows % np.uint64(16) != 0))
        if bad.size:
            i = int(bad[0])
            raise _bad("rows[%d] = %d is not a 16-byte aligned device address"
                       % (i, int(rows[i])))
        a = np.ascontiguousarray(rows)
        return (a.ctypes.data if a.size else 0), a.size, a
    rows = [] if rows is None else list(rows)
    if len(rows) > nblk:
        raise _bad("%d rows for %d query blocks" % (len(rows), nblk))
    ptrs = (C.c_void_p * max(1, len(rows)))()
    for i, r in enumerate(rows):
        if r is None:
            continue
        if isinstance(r, torch.Tensor):
            if not (r.device == dev and r.dtype == torch.uint8 and r.is_contiguous()):
                raise _bad("rows[%d] must be a contiguous uint8 tensor on %s" % (i, dev))
            r = r.data_ptr()
        ptrs[i] = _row_addr(i, r)
    return C.addressof(ptrs), len(rows), ptrs


def apply_cuda(rows: Any, w: Any, mode: Any, q: Any, k: Any, v: Any, *, block_size: int,
               top_p: Any = None, exact: Any = None, exact_first: int = 0,
               exact_last: int = 0, impl: int = IMPL_DEFAULT, out: Any = None,
               bad_rows: Any = None, o_dtype: Any = None, lib: Optional[str] = None) -> Any:
    """mf_apply_cuda_impl: O [N, Ht, d] on q's device (new, or out), queued on torch's
    current stream. rows: a Rows from extract_cuda, or per query block a device address
    (int; e.g. a leased device row's device_ptr), a uint8 CUDA tensor, or None; or a
    uint64 NumPy array of addresses, all rows (checked whole: no loop per row); None = no
    rows. bad_rows: an optional int32 [1] CUDA tensor, incremented per row whose header
    disagrees (that block is then computed exactly). o_dtype: O's dtype, torch.float32
    (None, the default) or q.dtype (the model's: stored by the kernels, each element the
    fp32 O rounded to nearest; no fp32 O and no cast); out must have it."""
    L = library("cuda", lib)
    odt, o_code = _o_dtype(o_dtype, q)  # before the device checks: an argument error
    qkv, (n, hq, _, d), torch = _cuda_qkv(q, k, v)
    dev = q.device
    b = _block(block_size)
    lm, keep = _layer_map(w, mode, top_p, hq)
    ex, ex_keep = _exact(exact, n, b)
    if impl not in (IMPL_DEFAULT, IMPL_V2, IMPL_CORE):
        raise _bad("impl %r is not one of IMPL_DEFAULT, IMPL_V2, IMPL_CORE" % (impl,))
    if isinstance(rows, Rows):
        rows = [None] * rows.i0 + rows.ptrs()
    nblk = -(-n // b)
    rows_at, n_rows, rows_keep = _row_ptrs(rows, nblk, dev, torch)
    if out is None:
        out = torch.empty((n, hq, d), dtype=odt, device=dev)
    _cuda_out(out, "out", (n, hq, d), odt, dev)
    if bad_rows is not None:
        _cuda_out(bad_rows, "bad_rows", (1,), torch.int32, dev)
    a = ApplyCudaArgs(rows_at, n_rows, C.pointer(lm), qkv, b, ex,
                      _u32(exact_first, "exact_first"), _u32(exact_last, "exact_last"),
                      out.data_ptr(), None if bad_rows is None else bad_rows.data_ptr(),
                      o_code)
    why = C.c_char_p()
    with torch.cuda.device(dev):
        st = L.mf_apply_cuda_impl(C.byref(a), impl, _stream(torch, dev), C.byref(why))
    del keep, ex_keep, rows_keep  # the launcher copied the host arrays before it returned
    _check(st, "mf_apply_cuda", why)
    return out
