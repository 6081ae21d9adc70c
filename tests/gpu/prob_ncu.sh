#!/usr/bin/env bash
# Hardware counters of one prob-mode apply call (issue 19: prob on the core ran 3.5x over its
# prediction): every kernel of the first call (prob_kernel and v2's follow-up: a prob-only
# layer runs no pre-pass or core) with the full section set, then prob_kernel's
# per-SASS-instruction stall samples (where its warps wait; summarised by
# bench/gpu/prob_sass.py). Run by
# tests/gpu/all.sh prob-ncu; files go to $OUT.
# Env: PROB_NCU_N (32768), PROB_NCU_DENSITY (0.1 per head = eff 13.5 %).
set -u
out=${OUT:-/tmp/mf-prob-ncu}
mkdir -p "$out"
py=${PYTHON:-python3}
ncu --clock-control none -k regex:'prepass_kernel|persist_kernel|core_kernel|prob_kernel|apply_kernel' \
    -c 4 --set full --import-source no -f -o "$out/prob" \
    "$py" bench/gpu/core_bench.py --no-dense --no-mask --prob --mask-ns "${PROB_NCU_N:-32768}" \
    --densities "${PROB_NCU_DENSITY:-0.1}" --reps 7 || exit 1
ncu --import "$out/prob.ncu-rep" --page details --csv > "$out/prob-details.csv" || exit 1
ncu --import "$out/prob.ncu-rep" --page source --print-source sass --csv -k regex:prob_kernel \
    > "$out/prob-sass.csv" || echo "prob-ncu: no source page (this ncu cannot print it)"
# where the warps wait, per part of the kernel (bench/gpu/prob_sass.py)
[ -s "$out/prob-sass.csv" ] && "$py" bench/gpu/prob_sass.py "$out/prob-sass.csv" | tee "$out/prob-sass.txt"
# the lines the summary needs, printed last
"$py" - "$out/prob-details.csv" <<'PY'
import csv, sys
want = ("Duration", "Elapsed Cycles", "Compute (SM) Throughput", "Memory Throughput",
        "No Eligible", "Issued Warp Per Scheduler", "L2 Hit Rate", "DRAM Throughput",
        "Registers Per Thread", "Achieved Active Warps Per SM")
for r in csv.DictReader(open(sys.argv[1])):
    if r.get("Metric Name") in want:
        print(r["ID"], r["Kernel Name"][:24], r["Metric Name"], r["Metric Value"], r["Metric Unit"])
PY
