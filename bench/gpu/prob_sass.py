#!/usr/bin/env python3
"""Where prob_kernel's warps wait, from ncu's per-SASS-instruction source page
(`ncu --import R --page source --print-source sass --csv`, written by tests/gpu/prob_ncu.sh
as prob-sass.csv). bench/gpu/NOTES.md "core v6.1" and "core v7" quote its output.

The kernel's code splits at its two setmaxnreg instructions into the setup (every warp,
before the roles part), the consumers (USETMAXREG.TRY_ALLOC: the 224-register raise) and
the producer warp with, in the persistent kernel, the two builder warps (USETMAXREG.DEALLOC). For each part: its share of the stall samples, its stall
reasons, its hottest instructions; and instructions executed per ring stage and warp, a
stage counted as one execution of the producer's first TMA issue (UTMALDG: one a stage).

  python3 bench/gpu/prob_sass.py prob-sass.csv [--top 12] [--consumer-warps 8]
"""
import argparse
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    rows = list(csv.reader(open(path)))
    heads = [k for k, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if not heads:
        sys.exit(f"{path}: no 'Kernel Name' line (not an ncu source page)")
    end = heads[1] if len(heads) > 1 else len(rows)  # the first kernel's page only
    hdr = rows[heads[0] + 1]
    return hdr, rows[heads[0] + 2:end]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--consumer-warps", type=int, default=8)
    args = ap.parse_args()
    hdr, data = load(args.csv)
    ix = {h: i for i, h in enumerate(hdr)}

    def num(r, h):
        return float((r[ix[h]] or "0").replace(",", ""))
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r, SAMPLES) for r in data) or 1.0
    marks = [k for k, r in enumerate(data) if "SETMAXREG" in r[1]]
    if len(marks) < 2:
        sys.exit("expected the two setmaxnreg instructions of prob_kernel")
    # each part runs from its setmaxnreg to the next one (or the end), whichever order the
    # compiler laid them out in
    ends = {k: (marks + [len(data)])[x + 1] for x, k in enumerate(marks)}
    cons = next(k for k in marks if "DEALLOC" not in data[k][1])  # the raise (TRY_ALLOC)
    prod = next(k for k in marks if "DEALLOC" in data[k][1])
    tma = [k for k in range(prod, ends[prod]) if "UTMALDG" in data[k][1]]
    stages = num(data[tma[0]], EXECUTED) if tma else 0.0
    print(f"stall samples {total:.0f}, ring stages {stages:.0f}")
    # the producer part holds the builders' code too (the persistent kernel's warps 1, 2:
    # their instructions count in its "a stage a warp", which is then the three warps' sum)
    parts = (("setup", 0, marks[0], 0), ("consumers", cons, ends[cons], args.consumer_warps),
             ("producer + builders", prod, ends[prod], 1))
    for name, a, b, warps in parts:
        share = sum(num(r, SAMPLES) for r in data[a:b])
        reasons = sorted(((sum(num(r, s) for r in data[a:b]), s) for s in stalls), reverse=True)
        per = (f", {sum(num(r, EXECUTED) for r in data[a:b]) / stages / warps:.0f} instructions"
               " a stage a warp" if warps and stages else "")
        print(f"== {name}: {share / total * 100:.1f} % of samples{per}")
        print("   " + ", ".join(f"{s[6:]} {v / (share or 1) * 100:.0f} %" for v, s in reasons[:6]))
        hot = sorted(range(a, b), key=lambda k: -num(data[k], SAMPLES))[:args.top]
        for k in sorted(hot):
            r = data[k]
            why = sorted(((num(r, s), s) for s in stalls), reverse=True)[:2]
            print(f"   {k:5d} {num(r, SAMPLES) / total * 100:5.1f} % ex={r[ix[EXECUTED]]:>9} "
                  f"{r[1][:64]:64s} {why[0][1][6:]} {why[1][1][6:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
