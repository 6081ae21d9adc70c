#!/usr/bin/env bash
# The daemon's GPU tier through the real tools, on the fake CUDA driver (tests/fakecuda):
# mapflowd with gpu_bytes on 2 fake devices, rows put with mapflowctl land on the gpu tier
# (payload puts: the daemon copies HtoD and validates through a DtoH copy), `get` returns
# them byte for byte (DtoH), stats / health / /metrics show the tier, gpu_promote is live;
# restarted without a driver the tier is off and health says why, while the rows (written
# through, synced, from the GPU rows) are still there. (Evict of the gpu tier and the
# IPC-mapped views are in tests/unit/test_daemon_gpu.c: mapflowctl has no gpu evict.)
source "$(dirname "$0")/lib.sh"
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
FAKE=${MF_BUILD:-$(cd "$(dirname "$0")/../.." && pwd)/build}/lib/tests/libfakecuda.so
[ -f "$FAKE" ] || fail "fake CUDA driver not built ($FAKE)"
FAKE=$(cd "$(dirname "$FAKE")" && pwd)/$(basename "$FAKE")
NS=gput
M=gpu-src
Bk=32
N=10

mf_tokens "$MF_TMP/tok" $((N * Bk)) 4711
"$SYNTH" --model "$M" --layer 3 --block $Bk --heads 4 --tokens "$MF_TMP/tok" --codec fp16 \
  --top-p 0.9 --seed 5 --out "$MF_TMP/rows" --ns "$NS" >/dev/null
"$CTL" hash --ns "$NS" --model "$M" --block $Bk --tokens "$MF_TMP/tok" >"$MF_TMP/h.txt"
mapfile -t H <"$MF_TMP/h.txt"

export MF_CUDA_DRIVER=$FAKE FAKECUDA_DEVICES=2
mf_start --gpu_bytes 2mb --host_bytes 8mb --write_through sync
grep -q 'gpu tier: arena 1 on device 1' "$MF_LOG" || fail "no second GPU arena in the log"

ctl --json stats >"$MF_TMP/s0.json" || fail "stats"
"$PYTHON" - "$MF_TMP/s0.json" <<'PY' || fail "stats before puts"
import json, sys
t = {x["tier"]: x for x in json.load(open(sys.argv[1]))["tiers"]}
assert t["gpu"]["enabled"] and t["gpu"]["capacity_bytes"] == 2 * 2 * 1024 * 1024, t
PY

rows=(); for i in $(seq 0 $((N - 1))); do rows+=(--row "$MF_TMP/rows/row-$i.bin"); done
ctl --ns "$NS" --json put "${rows[@]}" >"$MF_TMP/put.json" || fail "put of $N rows"
"$PYTHON" - "$MF_TMP/put.json" <<'PY' || fail "puts not on the gpu tier"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 10 and all(r["tier"] == "gpu" for r in rows), rows
PY

for i in 0 4 9; do
  ctl --ns "$NS" get --model "$M" --layer 3 --hash "${H[$i]}" --out "$MF_TMP/got-$i.bin" \
    || fail "get of row $i from the gpu tier"
  cmp -s "$MF_TMP/got-$i.bin" "$MF_TMP/rows/row-$i.bin" || fail "row $i differs after a gpu get"
done

ctl --json stats >"$MF_TMP/s1.json" || fail "stats"
"$PYTHON" - "$MF_TMP/s1.json" <<'PY' || fail "stats after puts"
import json, sys
d = json.load(open(sys.argv[1]))
t = {x["tier"]: x for x in d["tiers"]}
assert t["gpu"]["entries"] == 10 and t["gpu"]["used_bytes"] > 0, t
c = d["counters"]
assert sum(v for k, v in c.items() if k.startswith("gpu_arena_entries")) == 10, c
PY
ctl health | grep -q 'gpu on (2 arenas' || fail "health does not show the gpu tier on"
mf_http /metrics >"$MF_TMP/metrics" || fail "/metrics"
"$PYTHON" "$(dirname "$0")/promcheck.py" "$MF_TMP/metrics" || fail "/metrics with the gpu tier is not valid Prometheus text"
grep -q '^mapflowd_tier_enabled{tier="gpu"} 1$' "$MF_TMP/metrics" || fail "metrics: gpu tier not enabled"
grep -q '^mapflowd_tier_entries{tier="gpu"} 10$' "$MF_TMP/metrics" || fail "metrics: gpu entries"
n0=$(sed -n 's/^mapflowd_gpu_arena_entries{arena="0",device="0"} //p' "$MF_TMP/metrics")
n1=$(sed -n 's/^mapflowd_gpu_arena_entries{arena="1",device="1"} //p' "$MF_TMP/metrics")
expect_eq "$((n0 + n1))" 10 "metrics: rows over the two gpu arenas ($n0 + $n1)"
grep -q '^mapflowd_gpu_arena_capacity_bytes{arena="1",device="1"} 2097152$' "$MF_TMP/metrics" \
  || fail "metrics: gpu arena capacity"

ctl config set gpu_promote on >/dev/null || fail "gpu_promote is not a live key"
ctl config get gpu_devices | grep -q all || fail "gpu_devices default"

mf_stop

# No driver: the tier is off with its reason; the rows (synced at put) are on the SSD tier.
export MF_CUDA_DRIVER=/nonexistent/libcuda.so.1
mf_start --gpu_bytes 2mb --host_bytes 8mb
ctl health | grep -q 'gpu off (no CUDA driver' || fail "health does not say why the gpu tier is off"
ctl --json stats >"$MF_TMP/s2.json" || fail "stats"
"$PYTHON" - "$MF_TMP/s2.json" <<'PY' || fail "stats without a driver"
import json, sys
t = {x["tier"]: x for x in json.load(open(sys.argv[1]))["tiers"]}
assert not t["gpu"]["enabled"] and t["ssd"]["entries"] == 10, t
PY
for i in 0 9; do
  ctl --ns "$NS" get --model "$M" --layer 3 --hash "${H[$i]}" --out "$MF_TMP/ssd-$i.bin" \
    || fail "get of row $i after the restart"
  cmp -s "$MF_TMP/ssd-$i.bin" "$MF_TMP/rows/row-$i.bin" || fail "row $i differs after the restart"
done
mf_stop
echo "PASS test_gpu_tier"
