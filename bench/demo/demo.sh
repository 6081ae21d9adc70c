#!/usr/bin/env bash
# make demo: a real hand-off between two small trained GPTs (bench/models, see its README)
# on the CPU, through mapflowd:
#   1. start mapflowd with its built-in defaults (socket and data under a temp dir);
#   2. the source worker prefills a held-out passage, extracts map rows for the source
#      layers the mapping profile needs and puts them (and the profile) to the daemon;
#   3. the target worker takes the same context plus the passage's next tokens, looks up
#      and gets the rows (leased, zero-copy), prefills with reuse and without, and prints
#      both side by side: generated text, top-1 agreement over the continuation,
#      perplexity of the passage's next tokens, prefill time;
#   5. what the daemon stored; stop it (SIGTERM, must exit 0).
#   4. the kernel-level view at a longer context, on a synthetic pair (mapflow-demo-source /
#      -target, bench/demo/demo_model.h): a profile calibrated from sample maps
#      (mapflow-calibrate), rows of every layer, and per layer the mode mix, the bytes
#      each codec takes against dense fp16 maps, the output error and the attention time
#      saved against the target's own full computation;
# MF_DEMO_SHORT=1 runs shorter contexts (used by make test). MF_DEMO_AGREE_MIN: the
# lowest top-1 agreement accepted (the target exits 1 below it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${MF_BIN:-$ROOT/build/bin}
M=${MFW_MODELS:-$ROOT/bench/models}
if [ "${MF_DEMO_SHORT:-0}" = 1 ]; then
  N=192; CONT=32; GEN=8; SYN_N=512; CAL_SAMPLES=2
else
  N=448; CONT=64; GEN=24; SYN_N=2048; CAL_SAMPLES=3
fi
SYN=(--layers 3 --dim 64 --block 64)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mapflow-demo.XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
sock="$tmp/mapflowd.sock"
W=("$BIN/mapflow-worker" --tokenizer "$M/tokenizer.txt" --text "$M/passage.txt" --ns demo
   --daemon "unix:$sock" --tokens "$N")

echo "== mapflowd (defaults; socket and data directory in $tmp)"
"$BIN/mapflowd" --socket "$sock" --data_dir "$tmp/data" --http 127.0.0.1:0 >"$tmp/mapflowd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "mapflowd did not start:"; cat "$tmp/mapflowd.log"; exit 1; }
grep -E "listening|tier|http" "$tmp/mapflowd.log" | sed 's/^/  /' | head -6

echo "== source worker: $N tokens of a held-out passage ($M/passage.txt)"
"${W[@]}" --role source --model "$M/source.safetensors" --profile "$M/profile.pb"

echo "== target worker: the same $N tokens + the passage's next $CONT, then $GEN generated; with and without reuse"
"${W[@]}" --role target --model "$M/target.safetensors" --continue "$CONT" --generate "$GEN" \
  --compare ${MF_DEMO_AGREE_MIN:+--agree-min "$MF_DEMO_AGREE_MIN"}

echo "== kernel-level view: synthetic pair (8 source heads -> 6 target heads, d 64 -> 128), N=$SYN_N"
mkdir -p "$tmp/cal/src" "$tmp/cal/tgt"
"$BIN/mapflow-demo-source" --dump-maps "$tmp/cal/src" --samples "$CAL_SAMPLES" --n 256 "${SYN[@]}" --seed 100
"$BIN/mapflow-demo-source" --dump-maps "$tmp/cal/tgt" --samples "$CAL_SAMPLES" --n 256 "${SYN[@]}" --seed 100 --target-maps
"$BIN/mapflow-calibrate" --source "$tmp/cal/src" --target "$tmp/cal/tgt" --out "$tmp/syn-profile.pb" \
  --source-model demo-src-8h --target-model demo-tgt-6h --block 64 --recompute-last 1 \
  --prob-max-error 0.12 2>&1 | sed 's/^/  /'
"$BIN/mapflow-demo-source" --daemon "unix:$sock" --profile "$tmp/syn-profile.pb" --n "$SYN_N" "${SYN[@]}" --codec u8log
"$BIN/mapflow-demo-target" --daemon "unix:$sock" --n "$SYN_N" "${SYN[@]}" --max-error 0.25

echo "== daemon"
"$BIN/mapflowctl" --socket "$sock" --ns demo stats 2>/dev/null | grep -E "host|ssd|hit|put" | head -8 | sed 's/^/  /' || true
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=""
echo "mapflowd stopped (exit $rc)"
[ "$rc" = 0 ]
