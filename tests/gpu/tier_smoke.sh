#!/usr/bin/env bash
# The daemon's GPU tier on a real GPU (an H200): mapflowd with gpu_bytes (default 1g) on
# the real libcuda must log its arena, show the gpu tier on in `mapflowctl stats` and
# `health`, take rows on the gpu tier (mapflowctl put: payload -> HtoD, DtoH validation)
# and give them back byte for byte (DtoH); then test_daemon_gpu runs against the real
# driver (MF_GPU_REAL=1: device leases read through CUDA IPC in a second process,
# staging, eviction gpu -> host -> ssd, write-through + restart, gpu_promote, ~2 MiB rows
# put from device memory with a corrupted one refused), and the daemon must exit 0 on
# SIGTERM. Rows are validated on the host by default (pinned DtoH + CPU checksum): the log
# line "rows validated on the host (the default" must appear; the device-put rate is
# measured that way and again with MFD_GPU_VERIFY=gpu (the checksum kernels, PTX built
# in; that run's tests check every row was validated on the GPU) for comparison
# (BENCH_ROWS puts of ~2 MiB each, default 384: ~0.8 GB per run). Put regions (one
# reservation and one commit per layer) must be checksummed on the GPU, their corrupt rows
# refused (test_region_put).
# Usage: tests/gpu/tier_smoke.sh [GPU_BYTES]      (MF_BIN: build/bin by default)
# Prints PASS/FAIL lines; exit status non-zero on any failure.
set -u
bin=${MF_BIN:-build/bin}
gpu_bytes=${1:-1g}
tmp=$(mktemp -d /tmp/mf-tier-XXXXXX)
pid=
fails=0
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
ctl() { "$bin/mapflowctl" --socket "$tmp/d.sock" "$@"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader
# Libraries the binaries need and this machine lacks (carry them, e.g. in .gpu-libs).
missing=$(for b in mapflowd mapflowctl mapflow-synth tests/test_daemon_gpu; do
  ldd "$bin/$b" 2>&1 | sed -n "s|^\s*\(\S*\) => not found|\1 ($b)|p"; done | sort -u)
if [ -n "$missing" ]; then echo "FAIL missing libraries: $missing"; exit 2; fi
# MF_CUDA_DRIVER, when set, picks the driver (the fake one, to try this script on CPU).
"$bin/mapflowd" --socket "$tmp/d.sock" --data_dir "$tmp/data" --http "" --gpu_bytes "$gpu_bytes" \
  --gpu_devices 0 >"$tmp/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do
  [ -S "$tmp/d.sock" ] && ctl --timeout 1000 health >/dev/null 2>&1 && break
  sleep 0.02
done
grep -a 'gpu tier' "$tmp/daemon.log"
if grep -aq 'gpu tier: arena 0 on device 0' "$tmp/daemon.log"; then pass "arena allocated"; else fail "no gpu arena (see the log line above)"; fi
vmode=$(grep -ao 'rows validated on the .*' "$tmp/daemon.log" | head -1)
if [[ "$vmode" == "rows validated on the host (the default"* ]] || [ -n "${MF_CUDA_DRIVER:-}" ]; then
  pass "validation mode: $vmode"; else fail "validation mode: ${vmode:-no log line}"; fi
ctl stats | head -4
ctl --json stats >"$tmp/stats.json" 2>&1
want=$("${PYTHON:-python3}" -c '
import sys
s = sys.argv[1].lower(); u = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
n = s.rstrip("b"); print(int(n[:-1]) * u[n[-1]] if n[-1] in u else int(n))' "$gpu_bytes")
if "${PYTHON:-python3}" - "$tmp/stats.json" "$want" <<'PY'; then pass "stats: gpu tier on, capacity $want"; else fail "stats: gpu tier"; fi
import json, sys
t = {x["tier"]: x for x in json.load(open(sys.argv[1]))["tiers"]}
assert t["gpu"]["enabled"] and t["gpu"]["capacity_bytes"] == int(sys.argv[2]), t["gpu"]
PY
if ctl health | grep -q 'gpu on (1 arena'; then pass "health: gpu on"; else fail "health: $(ctl health)"; fi

# Rows through the tools: put lands on the gpu tier, get returns the same bytes.
"${PYTHON:-python3}" -c '
import random, struct, sys
r = random.Random(7)
open(sys.argv[1], "wb").write(struct.pack("<256I", *[r.randrange(1, 50000) for _ in range(256)]))' "$tmp/tok"
"$bin/mapflow-synth" --model smoke --layer 1 --block 64 --heads 8 --tokens "$tmp/tok" --codec fp16 \
  --top-p 0.9 --seed 3 --out "$tmp/rows" --ns default >/dev/null
rows=(); for i in 0 1 2 3; do rows+=(--row "$tmp/rows/row-$i.bin"); done
if ctl put "${rows[@]}" | tee "$tmp/put.txt" | grep -c 'gpu' | grep -q '^4$'; then pass "4 rows put on the gpu tier"; else fail "put: $(cat "$tmp/put.txt")"; fi
mapfile -t H < <("$bin/mapflowctl" hash --model smoke --block 64 --tokens "$tmp/tok")
ok=1
for i in 0 1 2 3; do
  ctl get --model smoke --layer 1 --hash "${H[$i]}" --out "$tmp/got-$i.bin" >/dev/null &&
    cmp -s "$tmp/got-$i.bin" "$tmp/rows/row-$i.bin" || ok=0
done
if [ $ok = 1 ]; then pass "gets from the gpu tier byte for byte"; else fail "gets differ"; fi

ctl --json stats | "${PYTHON:-python3}" -c '
import json, sys
c = json.load(sys.stdin).get("counters", {})
print("validated:", {k: v for k, v in c.items() if k.startswith("gpu_rows_validated")})' 2>&1
# host_pin (default on): the host arena registered with CUDA on a thread of its own; the
# log says how long it took, or why not (then GPU<->host copies stay pageable).
for _ in $(seq 1 200); do grep -aq 'host arena .*pinned for CUDA' "$tmp/daemon.log" && break; sleep 0.1; done
pin=$(grep -ao 'host arena .*pinned for CUDA.*' "$tmp/daemon.log" | head -1)
if [[ "$pin" == "host arena pinned"* ]]; then pass "$pin"; else fail "host arena pin: ${pin:-no log line in 20 s}"; fi
kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?; pid=
if [ $rc = 0 ]; then pass "mapflowd exit 0 on SIGTERM"; else fail "mapflowd exit $rc"; tail -20 "$tmp/daemon.log"; fi

# The wire-level GPU tests on the real driver (their own daemons, CUDA IPC in this process;
# a failing test prints the refused put's message and its daemon's last log lines).
# MF_CUDA_DRIVER set (the fake, to try this script on CPU): the same tests on it.
real=1; [ -n "${MF_CUDA_DRIVER:-}" ] && real=0
rows=${BENCH_ROWS:-384}
if MF_GPU_REAL=$real MF_GPU_BENCH_ROWS=$rows MF_BIN=$(cd "$bin" && pwd) "$bin/tests/test_daemon_gpu" 2>&1 |
  tee "$tmp/unit.log"; [ "${PIPESTATUS[0]}" = 0 ]; then pass "test_daemon_gpu on the real driver"; else fail "test_daemon_gpu on the real driver"; fi
# The same device puts validated by the checksum kernels (opt-in), for the rate.
MFD_GPU_VERIFY=gpu MF_GPU_TESTS=test_big_device_rows MF_GPU_REAL=$real MF_GPU_BENCH_ROWS=$rows \
  MF_BIN=$(cd "$bin" && pwd) "$bin/tests/test_daemon_gpu" >"$tmp/gpu.log" 2>&1 ||
  { fail "device puts with MFD_GPU_VERIFY=gpu"; tail -20 "$tmp/gpu.log"; }
def_rate=$(grep -a '^device puts:' "$tmp/unit.log" | head -1)
gpu_rate=$(grep -a '^device puts:' "$tmp/gpu.log" | tail -1)
echo "RATE default (host) validation: ${def_rate:-none}"
echo "RATE gpu validation:            ${gpu_rate:-none}"
# Where a device put's time goes (us per row: client PutBegin round trip, DtoD + sync,
# PutCommit round trip; the daemon's commit and its GPU check from its counters).
echo "RATE phases default (host): $(grep -a '^device put phases' "$tmp/unit.log" | head -1)"
echo "RATE phases gpu:            $(grep -a '^device put phases' "$tmp/gpu.log" | tail -1)"
if [ $real = 1 ]; then
  [[ "$def_rate" == *"validated on the host"* ]] || fail "default device puts were not validated on the host"
  [[ "$gpu_rate" == *"validated on the gpu"* ]] || fail "MFD_GPU_VERIFY=gpu device puts were not validated on the GPU"
fi
# Put regions (a layer's rows written in place, one commit): test_daemon_gpu's
# test_region_put flips a byte of one sealed row and gives another the wrong layer; both
# must be refused and every other row stored exactly. On the real driver the checksums
# run on the GPU (the kernels load for regions by default).
reg=$(grep -a '^region check' "$tmp/unit.log" | head -1)
echo "RATE region check: ${reg:-none}"
grep -a 'put regions checksummed' "$tmp/daemon.log" "$tmp/unit.log" | head -1
if [ $real = 1 ]; then
  [[ "$reg" == *"checksums on the GPU"* ]] || fail "region rows were not checksummed on the GPU"
fi
# Regions reserved by capacity (test_region_capacities, in the run above): the commit names
# the actual lengths, the slack goes back to the arena (asserted there), wrong lengths are
# refused; on the real driver the rows are checksummed on the GPU at their actual length.
echo "RATE region capacities: $(grep -a '^capacities:' "$tmp/unit.log" | head -1)"
# Their cost at the hand-off's shape: 30 MASK layers and 2 FP16 layers of 512 rows (begin,
# the DtoD a source kernel's writes stand for, commit; per layer).
MF_REGION_RATE=${REGION_LAYERS:-30} MF_GPU_TESTS=test_region_rate MF_GPU_REAL=$real \
  MF_BIN=$(cd "$bin" && pwd) "$bin/tests/test_daemon_gpu" >"$tmp/region.log" 2>&1 ||
  { fail "test_region_rate"; tail -20 "$tmp/region.log"; }
grep -a '^region rate' "$tmp/region.log" | sed 's/^/RATE /'
echo "tier_smoke: $fails failure(s)"
[ $fails = 0 ]
