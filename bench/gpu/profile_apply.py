#!/usr/bin/env python3
"""One launch of each apply implementation on the bench's rows, for a profiler.

  ncu --clock-control none --kernel-name 'regex:apply|prepass|core_kernel' -c 8 \\
      python3 bench/gpu/profile_apply.py [--n 16384] [--density 0.1] [--impls v2,core]

Builds the bench's rows once (bench_torch.build_rows, same patterns and W), then runs prob
FP8 and mask (top-p 1.0) once per implementation in --impls (names as bench_torch.IMPLS),
in that order, so the profiler's kernel list reads impl by impl: prob, mask."""
import argparse
import ctypes as C
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402
import bench_torch as BT  # noqa: E402
import rows as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--impls", default="v2,core")
    args = ap.parse_args()
    g = vars(bench_gpu)
    lib = bench_gpu.load_lib()
    hq, hkv, hs, d, b = g["HQ"], g["HKV"], g["HS"], g["D"], g["B"]
    n, nb = args.n, args.n // b
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    q, k, v, o = BT.random_qkvo(n, hq, hkv, d)
    w = BT.pair_w(hq, hs)
    keep = R.patterns(rng, hs, nb, args.density)
    stream = torch.cuda.current_stream().cuda_stream
    impls = {x[0]: x for x in BT.IMPLS}
    bufs = {}
    for codec in (R.FP8, R.MASK):
        pre = [R.row_prefix(keep, i, codec, b, rng=rng) for i in range(nb)]
        bufs[codec] = BT.build_rows(g, keep, codec, pre)
    for name in args.impls.split(","):
        _, impl = impls[name]
        for codec, mode in ((R.FP8, 1), (R.MASK, 2)):
            buf, offs, _ = bufs[codec]
            ptrs = (C.c_void_p * nb)(*[buf.data_ptr() + x for x in offs])
            modes = np.full(hq, mode, dtype=np.uint8)
            tps = np.full(hq, 1.0, dtype=np.float32)
            lm = g["LayerMap"](hq, hs, w.ctypes.data, modes.ctypes.data, tps.ctypes.data)
            a = g["ApplyArgs"](C.cast(ptrs, C.c_void_p), nb, C.pointer(lm),
                               BT.qkv_struct(g, q, k, v, n, hq, hkv, d), b, None, 0, 0,
                               o.data_ptr(), None)
            why = C.c_char_p()
            st = lib.mf_apply_cuda_impl(C.byref(a), impl, stream, C.byref(why))
            torch.cuda.synchronize()
            print(f"{name} {'prob' if mode == 1 else 'mask'}: status {st} {why.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
