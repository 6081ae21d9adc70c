#!/usr/bin/env bash
# The daemon built with AddressSanitizer (client/client.mk: build/asan-daemon) serves the
# C integration suite and the mapflowctl workload; each run ends with SIGTERM, which must
# exit 0 — with LeakSanitizer on, any leak or memory error makes that exit nonzero — and
# the logs must hold no sanitizer report.
source "$(dirname "$0")/lib.sh"
ASAN_MAPFLOWD=$(cd "${MF_BUILD:-build}" && pwd)/asan-daemon/bin/mapflowd
[ -x "$ASAN_MAPFLOWD" ] || fail "no ASan daemon at $ASAN_MAPFLOWD (make asan-daemon)"
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:log_path=$MF_TMP/asan
export LSAN_OPTIONS=report_objects=0

MF_MAPFLOWD=$ASAN_MAPFLOWD "$MF_BIN/tests/test_client_daemon" >"$MF_TMP/c.out" 2>&1 \
  || { cat "$MF_TMP/c.out"; cat "$MF_TMP"/asan* 2>/dev/null; fail "C integration suite under ASan"; }
MAPFLOWD=$ASAN_MAPFLOWD bash "$(dirname "$0")/test_ctl.sh" >"$MF_TMP/ctl.out" 2>&1 \
  || { cat "$MF_TMP/ctl.out"; cat "$MF_TMP"/asan* 2>/dev/null; fail "mapflowctl workload under ASan"; }
if ls "$MF_TMP"/asan* >/dev/null 2>&1; then
  cat "$MF_TMP"/asan*
  fail "sanitizer reports"
fi
echo "C suite under ASan: $(sed -n "s/^\[  PASSED  \] \([0-9]*\).*/\1/p" "$MF_TMP/c.out") tests passed"
echo "test_asan_daemon: ok (no sanitizer report, every SIGTERM exited 0)"
