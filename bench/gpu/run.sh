#!/usr/bin/env bash
# Kernel benchmark on one H200: our apply (prob FP8 / U8_LOG, mask), PyTorch SDPA (flash)
# and flex_attention with the same block mask, and our extract; table printed last.
# Usage: bench/gpu/run.sh [bench_gpu.py args]; JSON goes to $OUT/bench.json when OUT is set.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
python3 "$here/bench_gpu.py" --out "$out/bench.json" "$@"
