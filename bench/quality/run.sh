#!/usr/bin/env bash
# Quality evaluation of MapFlow reuse on a real model pair (bench/quality/README.md), in one
# call: builds what is missing, fetches the texts (get-data.sh), trains the source and
# target models or loads them (train.py), calibrates (kernels/calibrate.c, the code of
# mapflow-calibrate, through libmfkernels_ref.so) with several rule settings and evaluates
# every variant through our CUDA kernels (evaluate.py), then prints the table (report.py).
#   bench/quality/run.sh [--smoke]
# Env: OUT (results; default bench/results/tmp/quality), WORK (models, tokens; default
# bench/quality/data/work), PYTHON (python3), BUDGET (seconds for the whole run, default
# 400: training and the test windows are sized to end in time), SRC_SECONDS / TGT_SECONDS
# (training time per model, default 70 / 48), CTX (2048), BACKEND (cuda | ref; default
# cuda when torch sees a GPU). --smoke: tiny models, data and windows, C reference kernels,
# for a machine without a GPU (a few minutes on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT:-$root/bench/results/tmp/quality}
work=${WORK:-$root/bench/quality/data/work}
budget=${BUDGET:-400}
smoke=0
[ "${1:-}" = "--smoke" ] && smoke=1
mkdir -p "$out" "$work"
exec > >(tee "$out/run.log") 2>&1   # the log travels with the results
[ -d "$root/.gpu-libs" ] && export LD_LIBRARY_PATH="$root/.gpu-libs/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
backend=${BACKEND:-$($py -c 'import torch; print("cuda" if torch.cuda.is_available() else "ref")')}
[ $smoke = 1 ] && backend=ref
need="build/lib/libmfkernels_ref.so"   # calibration (and the kernels with --backend ref)
[ "$backend" = cuda ] && need="$need build/lib/libmfkernels_cuda.so"
for f in $need; do [ -e "$f" ] || make "$f"; done
"$here/get-data.sh" "$here/data"
if [ $smoke = 1 ]; then
    $py "$here/train.py" --data "$here/data" --work "$work" --smoke --ctx 256 --src 2,4,128 \
        --tgt 2,2,128 --src-seconds 5 --tgt-seconds 5 --batch 4 --test-windows 2
    $py "$here/evaluate.py" --work "$work" --out "$out" --backend ref --cal-windows 2 \
        --cal-n 128 --windows 1
else
    $py "$here/train.py" --data "$here/data" --work "$work" --ctx "${CTX:-2048}" \
        --src-seconds "${SRC_SECONDS:-70}" --tgt-seconds "${TGT_SECONDS:-48}" \
        --max-chars 32000000
    cp "$work/train.json" "$out/" 2>/dev/null || true
    left=$((budget - SECONDS - 45))
    $py "$here/evaluate.py" --work "$work" --out "$out" --backend "$backend" \
        --deadline "$((left > 30 ? left : 30))"
fi
$py "$here/report.py" "$out/quality.json" "$out/quality.md" "$out/quality.png"
