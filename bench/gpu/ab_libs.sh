#!/usr/bin/env bash
# A / B of kernel-library builds in one device call: core_bench.py once per variant and
# round (MF_CUDA_LIB = that build's libmfkernels_cuda.so, variants interleaved within each
# round so that clock drift falls on all alike), then a table of the prob and mix rows of
# every run, with each variant's median against the first's. Variants are builds of other
# commits (e.g. `git worktree add W C && make -C W build/lib/libmfkernels_cuda.so`),
# carried to the GPU machine; NOTES.md quotes the table per version.
# Usage: bench/gpu/ab_libs.sh NAME=LIB [NAME=LIB ...] -- CORE_BENCH_ARGS...
# Env: ROUNDS (2); OUT (results: ab-NAME-ROUND.json and ab.md).
set -u
out=${OUT:-/tmp/mf-ab}
mkdir -p "$out"
py=${PYTHON:-python3}
variants=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#variants[@]} -ge 1 ] || { echo "usage: $0 NAME=LIB ... -- CORE_BENCH_ARGS"; exit 2; }
for r in $(seq "${ROUNDS:-2}"); do
    for v in "${variants[@]}"; do
        name=${v%%=*} lib=${v#*=}
        [ -f "$lib" ] || { echo "ab: $lib missing"; exit 2; }
        echo "== round $r: $name ($lib)"
        MF_CUDA_LIB="$lib" "$py" bench/gpu/core_bench.py --out "$out/ab-$name-$r.json" "$@" \
            > "$out/ab-$name-$r.log" 2>&1 || { echo "ab: $name round $r failed:"; tail -n 20 "$out/ab-$name-$r.log"; }
    done
done
names=$(for v in "${variants[@]}"; do printf '%s ' "${v%%=*}"; done)
"$py" - "$out" $names <<'PY' | tee "$out/ab.md"
import glob, json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
runs = {n: [json.load(open(f)) for f in sorted(glob.glob(f"{out}/ab-{n}-*.json"))] for n in names}
print("| variant | N | codec | density (eff) | prob ms (rounds) | / first | rel vs v2 | finite |")
print("|---|---|---|---|---|---|---|---|")
base = {}
for n in names:
    keyed = {}
    for res in runs[n]:
        for r in res.get("prob", []):
            keyed.setdefault((r["N"], r.get("codec", "fp8"), r["density"]), []).append(r)
    for (N, cd, d), rs in sorted(keyed.items()):
        med = statistics.median(r["core_ms"] for r in rs)
        base.setdefault((N, cd, d), med)
        each = " ".join("%.3f" % r["core_ms"] for r in rs)
        print(f"| {n} | {N} | {cd} | {d:.2f} ({rs[0]['eff']:.3f}) | {med:.3f} "
              f"({each}) | {med / base[(N, cd, d)]:.3f} | "
              f"{max(r['core_rel_vs_v2'] for r in rs):.1e} | {all(r['core_finite'] for r in rs)} |")
mix = [(n, r) for n in names for res in runs[n] for r in res.get("mix", [])]
if mix:
    print("\n| variant | N | mixed ms | sum of parts ms | mixed / sum |")
    print("|---|---|---|---|---|")
    for n, r in mix:
        print(f"| {n} | {r['N']} | {r['mixed_ms']:.3f} | {r['sum_ms']:.3f} | "
              f"{r['mixed_ms'] / r['sum_ms']:.3f} |")
PY
