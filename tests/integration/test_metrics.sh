#!/usr/bin/env bash
# /metrics parses as Prometheus text (checked by tests/integration/promcheck.py, stdlib
# only, and by Debian's promtool: `promtool check metrics`, the exposition and lint
# rules, e.g. base units) and its counters move as the traffic says; the process_*
# families are there and follow the daemon's process; /healthz and /readyz answer.
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
NS=met
M=src-met
Bk=16

t_before=$(date +%s)
mf_start --host_bytes 4mb
t_after=$(date +%s)
mf_http /healthz >/dev/null || fail "/healthz"
mf_http /readyz >/dev/null || fail "/readyz"
mf_http /metrics >"$MF_TMP/m0"
"$PYTHON" "$HERE/promcheck.py" "$MF_TMP/m0" || fail "/metrics is not valid Prometheus text"

mf_tokens "$MF_TMP/tok" $((6 * Bk)) 77
"$SYNTH" --model "$M" --layer 3 --block $Bk --heads 4 --tokens "$MF_TMP/tok" --codec mask \
  --top-p 0.9 --seed 9 --out "$MF_TMP/rows" --ns "$NS" >/dev/null
rows=("$MF_TMP"/rows/row-*.bin)
args=(); for r in "${rows[@]}"; do args+=(--row "$r"); done
ctl --ns "$NS" put "${args[@]}" >/dev/null || fail "put"
ctl --ns "$NS" lookup --model "$M" --block $Bk --tokens "$MF_TMP/tok" --layers 3,4 >/dev/null \
  || fail "lookup"
mf_http /metrics >"$MF_TMP/m1"
"$PYTHON" "$HERE/promcheck.py" "$MF_TMP/m1" || fail "/metrics after traffic"
# promtool: Debian's prometheus package (make deps). Exit 0 and nothing printed = clean.
PROMTOOL=$(command -v promtool) || fail "no promtool (Debian package prometheus; make deps installs it)"
for f in m0 m1; do
  out=$("$PROMTOOL" check metrics <"$MF_TMP/$f" 2>&1) && [ -z "$out" ] \
    || fail "promtool check metrics on /metrics ($f): $out"
done
echo "promtool check metrics: clean ($("$PROMTOOL" --version 2>&1 | head -1))"
# process_*: this daemon's numbers (its fds in /proc, started between the two clocks).
val() { sed -n "s/^$1 //p" "$MF_TMP/m1"; }
"$PYTHON" - "$(val process_open_fds)" "$(ls /proc/"$MF_PID"/fd | wc -l)" \
  "$(val process_start_time_seconds)" "$t_before" "$t_after" "$(val process_resident_memory_bytes)" \
  "$(val process_cpu_seconds_total)" "$(val process_max_fds)" <<'PY' || fail "process_* values"
import sys
fds, now_fds, start, t0, t1, rss, cpu, maxfds = (float(a) for a in sys.argv[1:])
assert abs(fds - now_fds) <= 2, ("open fds", fds, now_fds)  # the scrape's own socket
assert t0 - 2 <= start <= t1 + 1, ("start time", start, t0, t1)  # btime is whole seconds
assert rss > 1 << 20 and cpu >= 0 and maxfds >= fds, (rss, cpu, maxfds)
PY

# Deltas: 6 puts; one lookup of 96 tokens on 2 layers = 192 requested, 96 hit (layer 3).
"$PYTHON" "$HERE/promcheck.py" --delta "$MF_TMP/m0" "$MF_TMP/m1" \
  'mapflowd_puts_total=6' \
  'mapflowd_put_bytes_total>0' \
  'mapflowd_lookup_requested_tokens_total=192' \
  'mapflowd_lookup_hit_tokens_total=96' \
  'mapflowd_requests_total{op="lookup"}=1' \
  'mapflowd_request_duration_seconds_count{op="lookup"}=1' \
  'mapflowd_tier_used_bytes{tier="host"}>0' \
  || fail "metric deltas"
mf_stop
echo "test_metrics: ok"
