#!/usr/bin/env bash
# Quality evaluation of MapFlow reuse on a real model pair (bench/quality/README.md), in one
# call: builds what is missing, fetches the texts (get-data.sh), trains the source and
# target models (train.py; two processes sharing the GPU) and, beside them, the small demo
# pair of bench/models (train_small.py, a third process), calibrates
# (kernels/calibrate.c, the code of mapflow-calibrate, through libmfkernels_ref.so) with
# several rule settings and evaluates every variant through our CUDA kernels
# (evaluate.py), then prints the table (report.py).
#   bench/quality/run.sh [--smoke]
# Env: OUT (results; default bench/results/tmp/quality), WORK (models, tokens; default
# bench/quality/data/work, work-smoke with --smoke), PYTHON (python3), BUDGET (seconds for
# the whole run, default 540: the evaluation stops adding test windows in time),
# PAIR (fast: the 6x8 -> 4x6 pair at 2048 tokens; long: 12x12 -> 8x8 at 8192, B = 64 and
# 32, method sweeps only), SEEDS (training seed indices, default "0"), BLOCKS,
# SRC_SECONDS / TGT_SECONDS (wall clock per model, default 240 each, 180 long, all at once),
# SMALL_SECONDS (the small pair, both models in turn, default 200; 0: none), CTX (2048),
# BACKEND (cuda | ref; default cuda when torch sees a GPU), MF_CUDA_LIB / MF_REF_LIB (the
# kernel libraries; default build/lib/...), TRAIN_ARGS / SMALL_ARGS / EVAL_ARGS (more
# options for train.py / train_small.py / evaluate.py: a CPU dry run of this path uses them).
# --smoke: tiny models, data and windows, C reference kernels, one process at a time, for
# a machine without a GPU (about a minute on 2 cores once the smoke models exist).
# Results in OUT: run.log, quality.{json,md,png}, train.json, extras.tar (the profiles)
# and small-pair.tar (the small pair's fp16 weights, tokenizer, stats).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT:-$root/bench/results/tmp/quality}
smoke=0
[ "${1:-}" = "--smoke" ] && smoke=1
if [ $smoke = 1 ]; then work=${WORK:-$root/bench/quality/data/work-smoke}
else work=${WORK:-$root/bench/quality/data/work}; fi
budget=${BUDGET:-540}
mkdir -p "$out" "$work"
exec > >(tee "$out/run.log") 2>&1   # the log travels with the results
[ -d "$root/.gpu-libs" ] && export LD_LIBRARY_PATH="$root/.gpu-libs/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
backend=${BACKEND:-$($py -c 'import torch; print("cuda" if torch.cuda.is_available() else "ref")')}
[ $smoke = 1 ] && backend=ref
export MF_REF_LIB=${MF_REF_LIB:-build/lib/libmfkernels_ref.so}   # calibration, --backend ref
export MF_CUDA_LIB=${MF_CUDA_LIB:-build/lib/libmfkernels_cuda.so}
need=$MF_REF_LIB
[ "$backend" = cuda ] && need="$need $MF_CUDA_LIB"
for f in $need; do [ -e "$f" ] || make "$f"; done
"$here/get-data.sh" "$here/data"

# Runs "$@" in the background, its output prefixed with a tag; the pid goes to $bg.
tagged() {
    local tag=$1
    shift
    (set -o pipefail; "$@" 2>&1 | sed -u "s/^/[$tag] /") &
    bg=$!
}

if [ $smoke = 1 ]; then
    $py "$here/train.py" --data "$here/data" --work "$work" --smoke --ctx 256 --src 2,4,128 \
        --tgt 2,2,128 --src-seconds 5 --tgt-seconds 5 --batch 4 --test-windows 2
    $py "$here/evaluate.py" --work "$work" --out "$out" --backend ref --cal-windows 2 \
        --cal-n 128 --windows 1 --dev-windows 1 --emu-check-n 128 --boot 200 ${EVAL_ARGS:-}
else
    # PAIR=fast (default): the 6×8 → 4×6 pair at 2048 tokens, B = 32, every variant;
    # PAIR=long: a 12×12 → 8×8 pair trained at 8192 tokens, evaluated at B = 64 and at
    # B = 32 (the method sweeps only; calibration on 3 windows of 2048 tokens: dense maps
    # of 8192 tokens do not fit the calibration's host memory)
    pair=${PAIR:-fast}
    if [ "$pair" = long ]; then
        ctx=${CTX:-8192}; small_s=${SMALL_SECONDS:-0}; blocks=${BLOCKS:-64 32}; secs=180
        shape="--src 12,12,768 --tgt 8,8,512 --batch ${BATCH:-4}"
        eargs="--methods-only --cal-n 2048 --cal-windows 3 --dev-windows 8 --windows 12"
    elif [ "$pair" = fast ]; then
        ctx=${CTX:-2048}; small_s=${SMALL_SECONDS:-200}; blocks=${BLOCKS:-32}; secs=240
        shape=""; eargs=""
    else
        echo "run.sh: PAIR must be fast or long, not '$pair'" >&2; exit 2
    fi
    # SEEDS: training seed indices (train.py --seed), each pair trained at once on the GPU
    read -r -a seeds <<< "${SEEDS:-0}"
    small_dev=$([ "$backend" = cuda ] && echo cuda || echo cpu)
    sw="$work/small"
    mkdir -p "$sw"
    seed_work() { [ "$1" = "${seeds[0]}" ] && echo "$work" || echo "$work/seed$1"; }
    T=("$py" "$here/train.py" --data "$here/data" --ctx "$ctx"
       --src-seconds "${SRC_SECONDS:-$secs}" --tgt-seconds "${TGT_SECONDS:-$secs}" $shape
       ${TRAIN_ARGS:-})
    S=("$py" "$here/train_small.py" --data "$here/data" --work "$sw" --device "$small_dev"
       --tokenizer "$root/bench/models/tokenizer.txt" --chars 0 --jobs 8 --batch 64
       --src-lr 2e-3 --tgt-lr 2.5e-3 --src-seconds "$((small_s * 11 / 20))"
       --tgt-seconds "$((small_s * 9 / 20))" ${SMALL_ARGS:-})
    # 1. tokens of both pairs (CPU), at once; every seed shares the first one's tokens
    tagged prep "${T[@]}" --work "$work" --seed "${seeds[0]}" --stage prepare; p1=$bg
    p2=""
    if [ "$small_s" != 0 ]; then tagged sprep "${S[@]}" --stage prepare; p2=$bg; fi
    wait $p1
    for k in "${seeds[@]:1}"; do
        d=$(seed_work "$k")
        mkdir -p "$d"
        for f in "$work"/prep.json "$work"/tok.json "$work"/tokens_*.npy; do
            ln -sf "$f" "$d/"
        done
    done
    small_ok=1
    [ -n "$p2" ] && { wait $p2 || small_ok=0; }
    # 2. the training processes share the one GPU (each model is far too small to fill
    # it): per seed the source and the target, and the small pair (source, then target)
    pids=()
    for k in "${seeds[@]}"; do
        for m in source target; do
            tagged "$m$k" "${T[@]}" --work "$(seed_work "$k")" --seed "$k" --stage "$m"
            pids+=($bg)
        done
    done
    spids=()
    if [ "$small_s" != 0 ] && [ $small_ok = 1 ]; then
        tagged small "${S[@]}" --stage train; spids+=($bg)
    fi
    for p in "${pids[@]}"; do wait "$p"; done
    for k in "${seeds[@]}"; do "${T[@]}" --work "$(seed_work "$k")" --seed "$k" --stage meta; done
    cp "$work/train.json" "$out/" 2>/dev/null || true
    for p in "${spids[@]}"; do wait "$p" || small_ok=0; done
    if [ ${#spids[@]} -gt 0 ] && [ $small_ok = 1 ]; then
        (cd "$sw" && tar cf "$out/small-pair.tar" tokenizer.txt source.safetensors \
            target.safetensors source.json target.json)
    fi
    # 3. per seed and block size: calibration and the variants, ending in time (the
    # first seed's first block size is quality.json; the others go to OUT/runs/ and into
    # extras.tar, summarised in quality.md)
    read -r -a bl <<< "$blocks"
    runs=$(( ${#seeds[@]} * ${#bl[@]} ))
    i=0
    for k in "${seeds[@]}"; do
        for b in "${bl[@]}"; do
            o="$out"
            [ $i -gt 0 ] && o="$out/runs/seed$k-B$b"
            left=$(( (budget - SECONDS - 30) / (runs - i) ))
            $py "$here/evaluate.py" --work "$(seed_work "$k")" --out "$o" \
                --backend "$backend" --block "$b" --ctx "$ctx" \
                --deadline "$((left > 30 ? left : 30))" $eargs ${EVAL_ARGS:-}
            [ $i -gt 0 ] && $py "$here/report.py" "$o/quality.json" "$o/quality.md"
            i=$((i + 1))
        done
    done
fi
$py "$here/report.py" "$out/quality.json" "$out/quality.md" "$out/quality.png"
# every run's operating points side by side (seeds, block sizes)
if [ -d "$out/runs" ]; then
    $py "$here/report.py" --summary "$out/quality.md" "$out/quality.json" \
        "$out"/runs/*/quality.json
fi
# the device call returns at most 8 files: the profiles and the other runs go into one tar
x=()
for d in profiles runs; do [ -d "$out/$d" ] && x+=("$d"); done
if [ ${#x[@]} -gt 0 ]; then
    tar cf "$out/extras.tar" -C "$out" "${x[@]}" && rm -rf "${x[@]/#/$out/}"
fi
echo "run.sh: done in $SECONDS s"
