#!/usr/bin/env bash
# The demo in its short mode, with its printed numbers checked for sanity: blocks were
# hit, every codec compresses against dense fp16 maps, the output error is bounded, some
# attention work was skipped, and the daemon stopped cleanly.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(MF_DEMO_SHORT=1 MF_BIN="${MF_BIN:-$PWD/build/bin}" bench/demo/demo.sh 2>&1); rc=$?
printf '%s\n' "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "demo exited $rc"
hit=$(printf '%s\n' "$out" | sed -n 's/.*leased get: \([0-9]*\) of \([0-9]*\) blocks hit.*/\1 \2/p')
[ -n "$hit" ] || fail "no hit line"
set -- $hit
[ "$1" -gt 0 ] || fail "no blocks hit"
[ "$1" -le "$2" ] || fail "more hits than blocks"
ratios=$(printf '%s\n' "$out" | sed -n 's/.*MiB *\([0-9.]*\)x smaller.*/\1/p')
[ "$(printf '%s\n' "$ratios" | wc -l)" -eq 5 ] || fail "expected 5 codec lines"
for r in $ratios; do awk -v r="$r" 'BEGIN { exit !(r > 1.0) }' || fail "ratio $r not > 1"; done
err=$(printf '%s\n' "$out" | sed -n 's/.*worst layer output error.*: \([0-9.e+-]*\) .*/\1/p')
awk -v e="$err" 'BEGIN { exit !(e >= 0 && e < 0.25) }' || fail "error '$err' not in [0, 0.25)"
work=$(printf '%s\n' "$out" | sed -n 's/.*attention work.*: \([0-9.]*\)% of.*/\1/p')
awk -v w="$work" 'BEGIN { exit !(w > 0 && w < 100) }' || fail "work share '$work' not in (0, 100)"
printf '%s\n' "$out" | grep -q "mapflowd stopped (exit 0)" || fail "daemon did not exit 0"
echo "PASS: hits $1/$2, ratios $(echo $ratios | tr '\n' ' '), error $err, work $work%"
