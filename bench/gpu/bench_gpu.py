#!/usr/bin/env python3
"""MapFlow kernel benchmark on one GPU (bench/gpu/run.sh runs it; see NOTES.md).

Side by side, per N and block density: our apply (prob FP8, prob U8_LOG, mask), PyTorch
SDPA dense causal attention (enable_gqa, torch's own backend: cuDNN on the H200) and
flex_attention with the same kept blocks (128- and 64-token blocks), FlexPrefill's
selection on flex and on our mask kernel, plus our extract. Our kernels are called through ctypes on build/lib/libmfkernels_cuda.so
with torch tensors' data_ptr, on torch's current stream. Times: CUDA events, median of
REPS after warm-up. Rows are built here (bench/gpu/rows.py) from synthetic "real-looking"
block patterns: sink + local window + a few per-head stripes, tiles random.

  python3 bench/gpu/bench_gpu.py [--ns 32768,65536] [--densities 0.05,0.1,0.2,0.35]
                                 [--no-extract] [--no-ablation] [--self-test]

--self-test needs no GPU or torch: it builds rows with rows.py and decodes them with the
library's mf_row_decode (structure and checksum), so the bench's rows are valid rows.
"""
import argparse
import ctypes as C
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rows as R  # noqa: E402

LIB = os.environ.get("MF_CUDA_LIB", os.path.join(os.path.dirname(__file__), "..", "..",
                                                 "build", "lib", "libmfkernels_cuda.so"))
HQ, HKV, HS, D, B = 32, 8, 32, 128, 64
REPS, WARM = 7, 2


class Qkv(C.Structure):
    _fields_ = [("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p), ("dtype", C.c_int),
                ("n_tokens", C.c_uint32), ("n_q_heads", C.c_uint32),
                ("n_kv_heads", C.c_uint32), ("head_dim", C.c_uint32)]


class LayerMap(C.Structure):
    _fields_ = [("n_target_heads", C.c_uint32), ("n_source_heads", C.c_uint32),
                ("w", C.c_void_p), ("mode", C.c_void_p), ("top_p", C.c_void_p)]


class ApplyArgs(C.Structure):
    _fields_ = [("rows", C.c_void_p), ("n_rows", C.c_uint32), ("map", C.POINTER(LayerMap)),
                ("tgt", Qkv), ("block_size", C.c_uint32), ("exact", C.c_void_p),
                ("exact_first", C.c_uint32), ("exact_last", C.c_uint32), ("o", C.c_void_p),
                ("bad_rows", C.c_void_p)]


class ExtractArgs(C.Structure):
    _fields_ = [("src", Qkv), ("lse", C.c_void_p), ("block_size", C.c_uint32),
                ("top_p", C.c_float), ("codec", C.c_int), ("i0", C.c_uint32),
                ("i1", C.c_uint32), ("model", C.c_char_p), ("ns", C.c_char_p),
                ("layer", C.c_uint32), ("tokens", C.c_void_p), ("rows", C.c_void_p),
                ("caps", C.c_void_p), ("sizes", C.c_void_p), ("failed_block", C.c_void_p),
                ("mass_out", C.c_void_p)]


def load_lib():
    lib = C.CDLL(LIB)
    lib.mf_apply_cuda.restype = C.c_int
    lib.mf_apply_cuda.argtypes = [C.POINTER(ApplyArgs), C.c_void_p, C.POINTER(C.c_char_p)]
    if hasattr(lib, "mf_apply_cuda_impl"):  # profile_apply.py's per-implementation entry
        lib.mf_apply_cuda_impl.restype = C.c_int
        lib.mf_apply_cuda_impl.argtypes = [C.POINTER(ApplyArgs), C.c_int, C.c_void_p,
                                           C.POINTER(C.c_char_p)]
    lib.mf_extract_cuda.restype = C.c_int
    lib.mf_extract_cuda.argtypes = [C.POINTER(ExtractArgs), C.c_void_p, C.POINTER(C.c_char_p)]
    lib.mf_row_decode.restype = C.c_int
    lib.mf_row_decode.argtypes = [C.c_void_p, C.c_size_t, C.c_uint, C.c_void_p,
                                  C.POINTER(C.c_char_p)]
    return lib


def self_test():
    lib = load_lib()
    rng = np.random.default_rng(1)
    keep = R.patterns(rng, 8, 12, 0.3)
    view = (C.c_uint8 * 512)()
    n = 0
    for codec in (R.MASK, R.FP8, R.U8LOG, R.FP16):
        for i in range(12):
            hdr, lay = R.row_prefix(keep, i, codec, B, layer=1, model=b"m")
            row = np.zeros(lay["total"], dtype=np.uint8)
            row[:len(hdr)] = np.frombuffer(hdr, dtype=np.uint8)
            if codec != R.MASK:
                row[lay["tiles"]:] = rng.integers(0, 0x7f, lay["total"] - lay["tiles"])
            if codec in (R.FP8, R.U8LOG):
                e = lay["entries"]
                row[lay["scales"]:lay["scales"] + 4 * e] = np.frombuffer(
                    np.full(e, 0.5, np.float32).tobytes(), np.uint8)
            R.seal(row)
            buf = np.empty(lay["total"] + 16, np.uint8)
            off = (-buf.ctypes.data) % 16
            buf[off:off + lay["total"]] = row
            why = C.c_char_p()
            st = lib.mf_row_decode(buf.ctypes.data + off, lay["total"], 0, view, C.byref(why))
            if st != 0:
                print(f"self-test: codec {codec} row {i}: status {st} {why.value}")
                return 1
            n += 1
    print(f"self-test: {n} rows built by rows.py decode with mf_row_decode")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="32768,65536")
    ap.add_argument("--densities", default="0.05,0.1,0.2,0.35",
                    help="the target's effective densities (fraction of causal blocks)")
    ap.add_argument("--full-reps-n", dest="full_reps_n", type=int, default=32768,
                    help="N above which the repetitions halve (at least 5)")
    ap.add_argument("--no-ablation", dest="no_ablation", action="store_true",
                    help="skip FlexPrefill's selection on flex / our kernel")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-extract", action="store_true", help="skip the extract timing")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    import bench_torch  # noqa: E402 (needs torch; only on the GPU machine)
    return bench_torch.run(load_lib(), args, globals())


if __name__ == "__main__":
    sys.exit(main())
