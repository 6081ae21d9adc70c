#!/usr/bin/env bash
# Load (issue 12): 256 concurrent clients on the unix socket doing mixed put / lookup /
# get / lease + release for a bounded time; only RESOURCE_EXHAUSTED may fail; every row
# read back verifies. The daemon's RssAnon after the run (clients gone) must be within
# 5% of before, measured after two warm-ups of the same load (same contexts, so the
# index holds the same keys and allocator arenas are at their working size) with the SSD
# tier off (RocksDB's memtable is not counted — the ASan run below covers leaks with it
# on). Then the same load against the ASan
# daemon (LeakSanitizer: SIGTERM exit 0, no report) and, in make soak, the TSan daemon.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"
secs=3; san_secs=2
[ -n "${MF_SOAK:-}" ] && { secs=60; san_secs=20; }
CLIENTS=256

rss() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }
wait_idle() {  # connections gauge back to 0 (bounded)
  local i
  for i in $(seq 1 200); do [ "$(rel_metric connections)" = 0 ] && return 0; sleep 0.05; done
  fail "connections did not drop to 0"
}

mf_start --host_bytes 256mb --ssd_bytes 0
"$REL_TOOL" load --target "$MF_SOCK" --clients "$CLIENTS" --seconds "$secs" --seed 1 --label warmup \
  >"$MF_TMP/warm.out" 2>&1 || { cat "$MF_TMP/warm.out"; fail "warm-up load"; }
"$REL_TOOL" load --target "$MF_SOCK" --clients "$CLIENTS" --seconds "$secs" --seed 1 --label warmup \
  >"$MF_TMP/warm.out" 2>&1 || { cat "$MF_TMP/warm.out"; fail "second warm-up load"; }
wait_idle
before=$(rss "$MF_PID")
rel_run "$MF_TMP/load.out" load --target "$MF_SOCK" --clients "$CLIENTS" --seconds "$secs" \
  --seed 1 --label load || fail "load"
wait_idle
after=$(rss "$MF_PID")
expect_eq "$(rel_metric leases)" "0" "leases after the load"
expect_eq "$(rel_metric reservations)" "0" "reservations after the load"
limit=$((before + before / 20))
echo "daemon RssAnon: $before kB before, $after kB after (limit $limit kB)"
[ "$after" -le "$limit" ] || fail "RssAnon grew from $before to $after kB (> 5%)"
mf_stop
printf 'RESULT|load-memory|memory after the load|RssAnon of mapflowd after a warm-up vs after the %s-client run (same contexts, clients gone)|%s kB before, %s kB after (%+.1f%%; limit +5%%)\n' \
  "$CLIENTS" "$before" "$after" "$(echo "$before $after" | awk '{print 100*($2-$1)/$1}')" \
  | "$PYTHON" "$REL_DIR/record.py" "$REL_MD" "$REL_MODE"

# sanitizer daemons: same load, shorter; a report or a nonzero SIGTERM exit fails.
san_run() {  # NAME BINARY OPTIONS_VAR
  local name=$1 bin=$2
  [ -x "$bin" ] || { echo "SKIP $name daemon: no $bin"; return 0; }
  rm -rf "$MF_DATA"
  MAPFLOWD=$bin mf_start --host_bytes 128mb
  rel_run "$MF_TMP/$name.out" load --target "$MF_SOCK" --clients "$CLIENTS" \
    --seconds "$san_secs" --seed 3 --label "load-$name" || fail "load against the $name daemon"
  mf_stop
  if ls "$MF_TMP"/san.* >/dev/null 2>&1; then cat "$MF_TMP"/san.*; fail "$name report"; fi
  printf 'RESULT|%s|%s daemon under the same load|%s clients × %s s, then SIGTERM|no report; exit 0\n' \
    "san-$name" "$name" "$CLIENTS" "$san_secs" | "$PYTHON" "$REL_DIR/record.py" "$REL_MD" "$REL_MODE"
}
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:log_path=$MF_TMP/san \
  LSAN_OPTIONS=report_objects=0 \
  san_run asan "$(cd "${MF_BUILD:-build}" && pwd)/asan-daemon/bin/mapflowd"
if [ -n "${MF_TSAN_DAEMON:-}" ]; then
  # UCX's memory hooks (libucm) crash under TSan at thread start; this load uses no UCX.
  UCX_MEM_EVENTS=no \
    TSAN_OPTIONS=halt_on_error=1:log_path=$MF_TMP/san:suppressions=$REL_DIR/tsan.supp \
    san_run tsan "$MF_TSAN_DAEMON"
fi
echo "test_rel_load: ok"
