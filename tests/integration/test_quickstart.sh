#!/usr/bin/env bash
# README.md's integrator quick-start, run as written: the C snippet (after the marker
# <!-- quickstart-c -->) compiled warning-free against client/mapflow.h and libmapflow,
# the Python one (<!-- quickstart-py -->) through the binding, both against a real
# daemon holding synthetic rows of the snippets' model, namespace and layers. Only the
# socket path is replaced; tokens, n_tokens and use_row() come from the wrappers here.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$(cd "$MF_BIN/../lib" && pwd)
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
NBLK=5
snippet() {   # the fenced block after the marker $1, socket path replaced
  awk -v m="<!-- $1 -->" '$0 == m {on = 1; next} on && /^```/ {if (in_) exit; in_ = 1; next} in_' \
    "$ROOT/README.md" | sed "s|unix:/run/mapflowd/mapflowd.sock|unix:$MF_SOCK|"
}
mf_start --host_bytes 16mb
mf_tokens "$MF_TMP/tok" $((NBLK * 64)) 4242
for l in 3 4; do
  "$SYNTH" --model qwen2.5-14b --layer $l --block 64 --heads 4 --tokens "$MF_TMP/tok" \
    --codec mask --top-p 0.9 --seed $((20 + l)) --out "$MF_TMP/rows$l" --ns prod >/dev/null
  args=(); for r in "$MF_TMP/rows$l"/row-*.bin; do args+=(--row "$r"); done
  ctl --ns prod put "${args[@]}" >/dev/null || fail "put layer $l"
done

# C: the snippet inside main(), tokens read from the token file.
c=$(snippet quickstart-c); [ -n "$c" ] || fail "no C quick-start in README.md"
{
  printf '#include <stdio.h>\n#include <stdint.h>\n#include "mapflow.h"\n'
  printf 'static size_t n_used, n_tok;\n'
  printf 'static void use_row(const mf_row_view_t *v) { n_used++; n_tok += v->block_size; }\n'
  printf 'int main(int argc, char **argv) {\n  (void)argc;\n  uint32_t tokens[4096];\n'
  printf '  FILE *f = fopen(argv[1], "rb");\n  if (!f) return 2;\n'
  printf '  size_t n_tokens = fread(tokens, 4, 4096, f);\n  fclose(f);\n'
  printf '%s\n' "$c"
  printf '  printf("%%zu rows %%zu tokens\\n", n_used, n_tok);\n  return 0;\n}\n'
} >"$MF_TMP/qs.c"
cc -std=c11 -Wall -Wextra -Werror -I"$ROOT/client" -I"$ROOT/proto" "$MF_TMP/qs.c" \
  -L"$LIB" -Wl,-rpath,"$LIB" -lmapflow -o "$MF_TMP/qs" 2>"$MF_TMP/cc.log" \
  || fail "the C quick-start does not compile: $(cat "$MF_TMP/cc.log")"
out=$("$MF_TMP/qs" "$MF_TMP/tok") || fail "the C quick-start failed: $out"
expect_eq "$out" "$((2 * NBLK)) rows $((2 * NBLK * 64)) tokens" "C quick-start rows"
ctl stats >/dev/null || fail "stats"

# Python: the snippet with tokens and use_row() defined first; row.bin = a stored row.
py=$(snippet quickstart-py); [ -n "$py" ] || fail "no Python quick-start in README.md"
cp "$MF_TMP/rows3/row-0.bin" "$MF_TMP/row.bin"
{
  printf 'import struct, sys\ndata = open(sys.argv[1], "rb").read()\n'
  printf 'tokens = list(struct.unpack("<%%dI" %% (len(data) // 4), data))\nseen = []\n'
  printf 'def use_row(layer, block, arr):\n    assert arr.dtype.name == "uint8" and len(arr) > 64\n'
  printf '    seen.append((layer, block))\n'
  printf '%s\n' "$py"
  printf 'print(sorted(seen) == [(l, b) for l in (3, 4) for b in range(%d)], len(seen))\n' "$NBLK"
} >"$MF_TMP/qs.py"
out=$(cd "$MF_TMP" && MAPFLOW_LIB="$LIB/libmapflow.so" PYTHONPATH="$ROOT/client/python" \
      "$PYTHON" qs.py "$MF_TMP/tok" 2>&1) || fail "the Python quick-start failed: $out"
expect_eq "$out" "True $((2 * NBLK))" "Python quick-start rows"
got=$(ctl stats 2>&1 | grep -o 'put_replaced_total[^0-9]*[0-9]*' | grep -o '[0-9]*$')
[ "${got:-0}" -ge 1 ] || fail "the Python quick-start's put did not reach the daemon (put_replaced_total ${got:-?})"
mf_stop
echo "test_quickstart: README's C and Python quick-starts read $((2 * NBLK)) rows each; put_replaced_total $got"
