#!/usr/bin/env python3
"""MapFlow kernel benchmark on one GPU (bench/gpu/run.sh runs it; see NOTES.md).

Side by side, per N and block density: our apply (prob FP8, prob U8_LOG, mask), PyTorch
SDPA dense causal attention (enable_gqa, torch's own backend: cuDNN on the H200) and
flex_attention with the same kept blocks (128- and 64-token blocks), FlexPrefill's
selection on flex and on our mask kernel, plus our extract. Our kernels are called on
build/lib/libmfkernels_cuda.so (mapflow.kernels' structs and loader; args built once, the
bare C call timed) with torch tensors' data_ptr, on torch's current stream. Times: CUDA
events, median of REPS after warm-up. Rows are built here (bench/gpu/rows.py) from synthetic "real-looking"
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

# The kernels' argument structs and library loading are mapflow.kernels' (layout-checked
# against the library); the benchmark builds the args once and times the bare C calls.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from mapflow import kernels as K  # noqa: E402

LIB = os.environ.get("MF_CUDA_LIB")  # None: mapflow.kernels' search (build/lib in a tree)
HQ, HKV, HS, D, B = 32, 8, 32, 128, 64
REPS, WARM = 7, 2

Qkv, LayerMap = K.Qkv, K.LayerMap
ApplyArgs, ExtractArgs = K.ApplyCudaArgs, K.ExtractCudaArgs


def load_lib():
    """libmfkernels_cuda.so with mf_apply_cuda(_impl), mf_extract_cuda, mf_row_decode and
    mf_attention_dense_cuda typed (mapflow.kernels.library)."""
    return K.library("cuda", LIB)


def self_test():
    lib = load_lib()
    rng = np.random.default_rng(1)
    keep = R.patterns(rng, 8, 12, 0.3)
    view = K.RowView()
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
            st = lib.mf_row_decode(buf.ctypes.data + off, lay["total"], 0, C.byref(view),
                                   C.byref(why))
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
