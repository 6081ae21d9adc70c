#!/usr/bin/env bash
# mapflow-worker against a real mapflowd on a temp unix socket: the source stores rows for
# the profile's layers (by its export plan: the committed profile has no prob heads, so mask
# rows only), the target hits every full block of the shared context and its
# reuse prefill keeps the full prefill's top-1 predictions on the passage; bad inputs
# (missing or corrupt weights, a tokenizer of another vocabulary, no profile, no daemon)
# end with a clear message and the documented exit code.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${MF_BIN:-$PWD/build/bin}
M=${MFW_MODELS:-bench/models}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mf-worker.XXXXXX")
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
W=("$BIN/mapflow-worker" --tokenizer "$M/tokenizer.txt" --text "$M/passage.txt" --ns wtest)

# expect CODE PATTERN CMD...: exit code and a message on stderr
expect() {
  local code=$1 pat=$2; shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, not $code: $err"
  printf '%s\n' "$err" | grep -q -- "$pat" || fail "'$*': no '$pat' in: $err"
  echo "ok: exit $code, $(printf '%s\n' "$err" | head -1)"
}

sock="$tmp/d.sock"
"$BIN/mapflowd" --socket "$sock" --data_dir "$tmp/data" --http 127.0.0.1:0 >"$tmp/d.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$tmp/d.log"; fail "mapflowd did not start"; }

expect 2 usage "${W[@]}" --role sideways --model "$M/source.safetensors"
expect 1 "No such file" "${W[@]}" --role source --model "$tmp/none.safetensors" --profile "$M/profile.pb" --daemon "unix:$sock"
head -c 100 "$M/source.safetensors" >"$tmp/cut.safetensors"
expect 1 "header length" "${W[@]}" --role source --model "$tmp/cut.safetensors" --profile "$M/profile.pb" --daemon "unix:$sock"
printf 'mapflow-bpe 1\n1\n97 98\n' >"$tmp/tok.txt"
expect 1 "tokenizer has 257 tokens" "$BIN/mapflow-worker" --tokenizer "$tmp/tok.txt" --text "$M/passage.txt" \
  --role target --model "$M/target.safetensors" --no-reuse
expect 3 "cannot reach mapflowd" "${W[@]}" --role source --model "$M/source.safetensors" \
  --profile "$M/profile.pb" --daemon "unix:$tmp/nobody.sock" --tokens 64
expect 2 usage "${W[@]}" --role source --model "$M/source.safetensors" --profile "$M/profile.pb" \
  --daemon "unix:$sock" --prob-codec mask
expect 1 "no usable profile" "${W[@]}" --role target --model "$M/target.safetensors" \
  --daemon "unix:$sock" --source-id nobody --tokens 64 --continue 8

src=$("${W[@]}" --role source --model "$M/source.safetensors" --profile "$M/profile.pb" \
  --daemon "unix:$sock" --tokens 128) || fail "source failed"
printf '%s\n' "$src"
# --codec auto (the default): every planned layer of this profile is a mask layer
printf '%s\n' "$src" | grep -Eq "export plan \(--codec auto\): layer [0-9]+ mask" || fail "no export plan"
printf '%s\n' "$src" | grep -q "export plan.*fp16" && fail "fp16 rows for a profile without prob heads"
printf '%s\n' "$src" | grep -q "stored [1-9][0-9]* rows" || fail "source stored nothing"
tgt=$("${W[@]}" --role target --model "$M/target.safetensors" --daemon "unix:$sock" \
  --tokens 128 --continue 32 --generate 4 --compare) || fail "target failed"
printf '%s\n' "$tgt"
# 160 tokens = 5 blocks of 32; the source saw 128 tokens = 4 full blocks
printf '%s\n' "$tgt" | grep -q "4 of 5 blocks hit" || fail "expected 4 of 5 blocks hit"
printf '%s\n' "$tgt" | grep -q "zero-copy: yes" || fail "not zero-copy"
agree=$(printf '%s\n' "$tgt" | sed -n 's/.*agreement over the continuation: \([0-9.]*\)%.*/\1/p')
awk -v a="$agree" 'BEGIN { exit !(a >= 90) }' || fail "agreement '$agree' below 90% (the bound of test_demo.sh)"
kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?; pid=""
[ "$rc" = 0 ] || fail "mapflowd exited $rc"
echo "PASS: worker hand-off (agreement $agree%) and error paths"
