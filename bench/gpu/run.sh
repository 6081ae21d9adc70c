#!/usr/bin/env bash
# Kernel benchmark on one H200: our apply (prob FP8 / U8_LOG, mask), dense SDPA (enable_gqa,
# torch's backend: cuDNN), flex_attention on the same kept blocks (128- and 64-token
# blocks), FlexPrefill's selection on flex and on our kernel, and our extract; tables last.
# Usage: bench/gpu/run.sh [bench_gpu.py args]; BENCH_GPU_ARGS adds more (tests/gpu/all.sh);
# JSON goes to $OUT/bench.json when OUT is set.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
# shellcheck disable=SC2086
python3 "$here/bench_gpu.py" --out "$out/bench.json" ${BENCH_GPU_ARGS:-} "$@"
