# tests/reliability/rel_lib.sh — sourced after tests/integration/lib.sh by the
# test_rel_*.sh scripts: the driver, the soak switch and the RELIABILITY.md recorder.
REL_TOOL=$MF_BIN/tests/rel_tool
REL_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REL_MD=$REL_DIR/../RELIABILITY.md
REL_MODE="make test"
[ -n "${MF_SOAK:-}" ] && REL_MODE="make soak"
[ -x "$REL_TOOL" ] || fail "no $REL_TOOL (make build/bin/tests/rel_tool)"

# rel_run OUTFILE ARGS... : runs rel_tool, shows its output, records its RESULT rows
# (also when it fails: the table says what happened), returns its status.
rel_run() {
  local out=$1 rc=0
  shift
  "$REL_TOOL" "$@" >"$out" 2>&1 || rc=$?
  cat "$out"
  "$PYTHON" "$REL_DIR/record.py" "$REL_MD" "$REL_MODE" <"$out" || true
  return $rc
}

# One metric's value from /metrics (first matching line; empty when absent).
rel_metric() { mf_http /metrics | grep -a "^mapflowd_$1 " | head -n 1 | awk '{print $2}'; }

# mf_restart [--key value ...]: a fresh daemon with a fresh data directory.
mf_fresh() {
  [ -n "$MF_PID" ] && mf_stop
  rm -rf "$MF_DATA"
  mf_start "$@"
}
