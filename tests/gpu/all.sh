#!/usr/bin/env bash
# Every GPU check and benchmark of the project in one device call (the device time is
# short, and each call pays a machine start): kernel correctness (run.sh: gpu_check,
# memcheck, ipc_check), the daemon's GPU tier (tier_smoke.sh), the worker's CUDA path
# (worker_check.sh), the Python binding's DLPack of device rows (test_dlpack_gpu.py),
# mapflow.kernels' CUDA calls against the C reference (test_kernels_py.py),
# the kernel benchmark (bench/gpu/run.sh), the attention core's export / masses timing
# (core-bench: bench/gpu/core_bench.py, CORE_BENCH_ARGS replacing its default arguments;
# its core.json is in logs.tar.xz), hardware counters of the mask core's kernels (core-ncu:
# ncu over core_bench.py --ncu, NCU_NS / NCU_DENSITIES; ncu.csv in logs.tar.xz), of one
# prob-mode call's kernels (prob-ncu: tests/gpu/prob_ncu.sh, per-SASS-line stalls) and the
# hand-off benchmark (bench/handoff/run.sh).
# Each step has a time limit; logs and results are packed into $OUT (at most 8 files come
# back) and a summary table is printed last.
# Usage: tests/gpu/all.sh [STEP ...]   (default: every step; names as in the table)
# Every table in bench/results/handoff.md and gpu.md comes from the kernels-bench and
# handoff steps (issue 18); sizes through the env of bench/handoff/run.sh (HANDOFF_*) and
# bench/gpu/run.sh (BENCH_GPU_ARGS). MF_COMMIT (default: git's HEAD) and each step's
# command (with those variables) go into the results.
# Binaries come from a bundle made by tests/gpu/bundle.sh when .gpu-carry/bundle.tar.xz
# exists (the CUDA binaries are too large to carry unpacked).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/mf-gpu-out}
mkdir -p "$out"
res=$(mktemp -d /tmp/mf-all-XXXXXX)
if [ -f .gpu-carry/bundle.tar.xz ]; then
    tar -xJf .gpu-carry/bundle.tar.xz -C "$root" || { echo "bundle: unpack failed"; exit 2; }
fi
export LD_LIBRARY_PATH="$root/.gpu-libs/usr/lib/x86_64-linux-gnu:$root/.gpu-libs/usr/lib/x86_64-linux-gnu/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
export MF_COMMIT=${MF_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
sizes=$(env | grep -E '^(HANDOFF_[A-Z_]+|BENCH_GPU_ARGS|CORE_BENCH_ARGS|BUDGET)=' | sort | sed "s/=\(.*\)/='\1'/" | tr '\n' ' ')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2

# name | seconds | command
steps=(
  "kernels-check|${KCHECK_LIMIT:-120}|bash tests/gpu/run.sh"
  "tier-smoke|75|bash tests/gpu/tier_smoke.sh 1g"
  "worker-check|35|bash tests/gpu/worker_check.sh"
  "dlpack|40|${PYTHON:-python3} tests/gpu/test_dlpack_gpu.py"
  "kernels-py|90|${PYTHON:-python3} tests/gpu/test_kernels_py.py"
  "kernels-bench|${KBENCH_LIMIT:-150}|bash bench/gpu/run.sh"
  "core-bench|${CORE_BENCH_LIMIT:-150}|${PYTHON:-python3} bench/gpu/core_bench.py --out \$OUT/core.json ${CORE_BENCH_ARGS:---no-dense --no-mask --mass-ns 32768 --mass-heads 40/8,32/8 --reps 9}"
  "core-ncu|${NCU_LIMIT:-240}|ncu --clock-control none --nvtx --nvtx-include 'ncu/' --kernel-name regex:'core_kernel|persist_kernel' --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --csv --page details ${PYTHON:-python3} bench/gpu/core_bench.py --ncu --no-dense --no-flex --mask-ns ${NCU_NS:-32768} --densities ${NCU_DENSITIES:-0.05,0.35} --reps 7 > \$OUT/ncu.csv"
  "prob-ncu|${NCU_LIMIT:-240}|bash tests/gpu/prob_ncu.sh"
  "handoff|${HANDOFF_LIMIT:-300}|bash bench/handoff/run.sh"
  "handoff-2gpu|230|bash bench/handoff/two_gpu.sh"
)
want=" $* "
summary=()
for s in "${steps[@]}"; do
    IFS='|' read -r name secs cmd <<<"$s"
    [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
    mkdir -p "$res/$name"
    echo "==== $name (limit ${secs}s): $cmd"
    t0=$(date +%s)
    MF_COMMAND="${sizes}tests/gpu/all.sh $name" OUT="$res/$name" \
        timeout -k 10 "$secs" bash -c "$cmd" >"$res/$name/stdout.log" 2>&1
    rc=$?
    t=$(( $(date +%s) - t0 ))
    tail -n 40 "$res/$name/stdout.log"
    summary+=("$(printf '%-14s %4ss  exit %s%s' "$name" "$t" "$rc" "$([ "$rc" = 124 ] && echo ' (time limit)')")")
done
# What comes back: the handoff plot and JSON, the kernel bench JSON, everything else packed.
cp "$res/handoff/handoff.png" "$res/handoff/handoff.json" "$out/" 2>/dev/null
cp "$res/handoff-2gpu/two_gpu.md" "$out/" 2>/dev/null
cp "$res/handoff-2gpu/handoff.json" "$out/handoff-2gpu.json" 2>/dev/null
cp "$res/kernels-bench/bench.json" "$out/kernels-bench.json" 2>/dev/null
cp "$res/handoff/table.md" "$out/handoff-table.md" 2>/dev/null
tar -cJf "$out/logs.tar.xz" -C "$res" . 2>/dev/null
echo "==== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
rm -rf "$res"
