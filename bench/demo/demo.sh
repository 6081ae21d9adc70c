#!/usr/bin/env bash
# make demo: a real source → mapflowd → target hand-off on the CPU.
#   1. start mapflowd with its built-in defaults (socket and data under a temp dir);
#   2. calibrate a mapping profile from sample maps of both models (mapflow-calibrate);
#   3. the source worker prefills, extracts rows and puts them (and the profile);
#   4. the target worker looks up, gets the rows zero-copy, applies them, reports;
#   5. stop the daemon (SIGTERM, must exit 0).
# MF_DEMO_SHORT=1 runs a smaller context (used by make test).
set -euo pipefail
BIN=${MF_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/bin}
if [ "${MF_DEMO_SHORT:-0}" = 1 ]; then
  N=512; LAYERS=3; CAL_N=256; SAMPLES=2
else
  N=2048; LAYERS=3; CAL_N=256; SAMPLES=3
fi
SHAPE=(--layers "$LAYERS" --dim 64 --block 64)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mapflow-demo.XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
sock="$tmp/mapflowd.sock"

echo "== mapflowd (defaults; socket and data directory in $tmp)"
"$BIN/mapflowd" --socket "$sock" --data_dir "$tmp/data" --http 127.0.0.1:0 >"$tmp/mapflowd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "mapflowd did not start:"; cat "$tmp/mapflowd.log"; exit 1; }
grep -E "listening|tier|http" "$tmp/mapflowd.log" | sed 's/^/  /' | head -6

echo "== calibration: dense sample maps of both models (N=$CAL_N, $SAMPLES contexts) -> profile"
mkdir -p "$tmp/cal/src" "$tmp/cal/tgt"
"$BIN/mapflow-demo-source" --dump-maps "$tmp/cal/src" --samples "$SAMPLES" --n "$CAL_N" "${SHAPE[@]}" --seed 100
"$BIN/mapflow-demo-source" --dump-maps "$tmp/cal/tgt" --samples "$SAMPLES" --n "$CAL_N" "${SHAPE[@]}" --seed 100 --target-maps
"$BIN/mapflow-calibrate" --source "$tmp/cal/src" --target "$tmp/cal/tgt" --out "$tmp/profile.pb" \
  --source-model demo-src-8h --target-model demo-tgt-6h --block 64 --recompute-last 1 --prob-max-error 0.12 | sed 's/^/  /'

echo "== source worker"
"$BIN/mapflow-demo-source" --daemon "unix:$sock" --profile "$tmp/profile.pb" --n "$N" "${SHAPE[@]}" --codec u8log

echo "== target worker"
"$BIN/mapflow-demo-target" --daemon "unix:$sock" --n "$N" "${SHAPE[@]}" --max-error 0.25

echo "== daemon"
"$BIN/mapflowctl" --socket "$sock" --ns demo stats 2>/dev/null | grep -E "host|ssd|hit|put" | head -8 | sed 's/^/  /' || true
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=""
echo "mapflowd stopped (exit $rc)"
[ "$rc" = 0 ]
