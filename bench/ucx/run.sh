#!/usr/bin/env bash
# bench/ucx/run.sh — remote get throughput and latency over UCX on loopback, row sizes
# 64 KiB … 64 MiB, beside ucx_perftest (ucx-utils) on the same transport and sizes.
#
#   bench/ucx/run.sh [--quick] [--tls tcp]      (make bench-ucx)
#
# Per size: daemon A holds the rows (UCX listener on 127.0.0.1); the timed client is
# mapflow-ucx-tool fetch — daemon/peer.c's fetch engine: Hello + RemoteArena once, then
# per iteration one Get(GET_LEASE) for all rows, pipelined one-sided ucp_get_nbx straight
# from A's arena (MFD_PEER_CHUNK chunks, MFD_PEER_WINDOW in flight), Release. Throughput =
# row bytes / wall time of that whole round (control round trips included); latency =
# one 1-row round. "via B" is the whole read-through path a client of daemon B sees: Get
# naming the peer → B pulls, verifies, commits to its arena, copies the rows back over its
# unix socket (B flushed before each round). ucx_perftest runs ucp_get with the same size
# and UCX_TLS. Writes bench/results/ucx.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
export MF_BIN=${MF_BIN:-$PWD/build/bin}
QUICK=0
TLS=tcp
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --tls) TLS=$2; shift ;;
    *) echo "usage: $0 [--quick] [--tls TLS]" >&2; exit 2 ;;
  esac
  shift
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 1; }
source bench/ucx/daemons.sh
export UCX_TLS=$TLS UCX_WARN_UNUSED_ENV_VARS=n
RES=bench/results/ucx.md
ROWS_CSV=$UT/rows.csv
: >"$ROWS_CSV"

if [ $QUICK = 1 ]; then SIZES="65536 1048576 16777216"; ITERS=3; else
  SIZES="65536 262144 1048576 4194304 16777216 67108864"; ITERS=5; fi

ucxd_start A --ucx 127.0.0.1:0 --host_bytes 1gb --max_frame 256mb --ssd_bytes 0
ucxd_start B --host_bytes 1gb --max_frame 256mb --ssd_bytes 0 --write_through off

for size in $SIZES; do
  # About 64 MiB of rows per round (at least 2 rows), each a distinct layer of block 200.
  rows=$(( (64 << 20) / size )); [ $rows -lt 2 ] && rows=2; [ $rows -gt 256 ] && rows=256
  shape=(--model "s$size" --layers $rows --first-block 200 --blocks 1 --size "$size" --seed 5)
  tool put --socket "$SOCK_A" "${shape[@]}" >/dev/null
  bw=$(tool fetch --ucx "$UCX_A" "${shape[@]}" --iters $ITERS 2>/dev/null)
  lat=$(tool fetch --ucx "$UCX_A" "${shape[@]}" --layers 1 --iters $((ITERS * 4)) 2>/dev/null)
  [ "$(field "$bw" identical)" = "$rows" ] || fail "fetch of $size-byte rows: $bw"
  best_e2e=999999
  for i in $(seq 1 $ITERS); do
    tool flush --socket "$SOCK_B" >/dev/null
    e2e=$(tool get --socket "$SOCK_B" "${shape[@]}" --peer "$UCX_A")
    [ "$(field "$e2e" identical)" = "$rows" ] || fail "via B, $size-byte rows: $e2e"
    best_e2e=$(awk -v a="$best_e2e" -v b="$(field "$e2e" ms)" 'BEGIN {print (b < a) ? b : a}')
  done
  # ucx_perftest: a fresh server per size (it serves one test), same port for both.
  port=$((20000 + RANDOM % 20000))
  ucx_perftest -p $port >"$UT/pt_srv.log" 2>&1 &
  pt_srv=$!
  UCXD_EXTRA_CLEANUP="kill -KILL $pt_srv 2>/dev/null || true"
  n=$(( (256 << 20) / size )); [ $n -lt 20 ] && n=20; [ $n -gt 2000 ] && n=2000
  pt=""
  for try in $(seq 1 50); do
    if pt=$(timeout 120 ucx_perftest 127.0.0.1 -p $port -t ucp_get -s "$size" -n $n -w $((n / 10 + 1)) 2>&1 | grep '^Final:'); then break; fi
    sleep 0.1
  done
  kill -KILL $pt_srv 2>/dev/null || true; wait $pt_srv 2>/dev/null || true
  [ -n "$pt" ] || fail "ucx_perftest produced no result for size $size"
  echo "$size,$rows,$(field "$bw" row_bytes),$(field "$bw" best_gbps),$(field "$bw" mean_gbps),$(field "$lat" best_ms),$(field "$lat" mean_ms),$best_e2e,$(field "$e2e" bytes),$n,$pt" >>"$ROWS_CSV"
  echo "size $size: fetch $(field "$bw" best_gbps) GB/s best, row latency $(field "$lat" mean_ms) ms; perftest: $pt"
done
ucxd_stop B
ucxd_stop A

"$PYTHON" - "$ROWS_CSV" "$RES" "$TLS" "$QUICK" "$(nproc)" "$(ucx_info -v | head -1)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import sys, datetime
rows_csv, res, tls, quick, ncpu, ucxv, load = sys.argv[1:]
lines = []
goal_ok = True
for line in open(rows_csv):
    f = line.strip().split(",", 10)
    size, rows, row_bytes = int(f[0]), int(f[1]), int(f[2])
    best, mean, lat_best, lat_mean = map(float, f[3:7])
    e2e_ms, e2e_bytes, n = float(f[7]), int(f[8]), int(f[9])
    final = f[10].split()
    # Final: iters lat50 lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall
    pt_lat_us, pt_bw_mib = float(final[3]), float(final[6])
    pt_gbps = pt_bw_mib * 1048576 / 1e9
    ratio = mean / pt_gbps if pt_gbps else 0
    e2e_gbps = e2e_bytes / (e2e_ms / 1e3) / 1e9
    if size >= 1 << 20 and ratio < 0.7:
        goal_ok = False
    label = "%d KiB" % (size >> 10) if size < 1 << 20 else "%d MiB" % (size >> 20)
    lines.append("| %s | %d | %d | %.3f | %.3f | %.3f / %.3f | %.3f | %.3f | %.0f%% | %.3f |" % (
        label, rows, row_bytes, best, mean, lat_best, lat_mean, pt_gbps, pt_lat_us / 1e3,
        100 * ratio, e2e_gbps))
with open(res, "w") as out:
    out.write("""# UCX remote get: mapflowd peer fetch vs ucx_perftest

Command: `bench/ucx/run.sh%s` (`make bench-ucx`), UCX_TLS=%s, loopback (127.0.0.1),
%s CPUs (load average at the end: %s), %s, %s UTC. Everything here is memory-copy
bound on a shared VM: compare columns of one run, not runs.

- **mapflow fetch**: `mapflow-ucx-tool fetch` against daemon A — the fetch engine of
  daemon/peer.c: one Get(GET_LEASE) for all rows of the round, then pipelined one-sided
  `ucp_get_nbx` from A's registered arena (1 MiB chunks, 16 in flight), then Release.
  GB/s = row bytes / wall time of the whole round (control round trips included), best and
  mean of the timed rounds after one warm-up. Latency = a round of a single row.
- **ucx_perftest**: `ucx_perftest 127.0.0.1 -t ucp_get -s SIZE -n N` against a fresh
  `ucx_perftest` server, same UCX_TLS; overall bandwidth (its MB/s are MiB/s, converted) and
  average latency.
- **via B**: what a client of daemon B sees for `Get{peer = A}` after B was flushed: B pulls
  the rows, verifies them (checksum, tokens), commits them to its arena and copies them back
  over its unix socket (GET_COPY); best round. Not comparable to ucx_perftest: it includes
  two extra copies and two full checksum passes.
- Goal: mapflow fetch ≥ 70%% of ucx_perftest's bandwidth at ≥ 1 MiB rows: **%s**.

| row size | rows/round | row bytes | fetch GB/s best | fetch GB/s mean | 1-row latency ms best / mean | ucx_perftest GB/s | ucx_perftest latency ms | mean / perftest | via B GB/s |
|---|---|---|---|---|---|---|---|---|---|
%s
""" % (" --quick" if quick == "1" else "", tls, ncpu, load, ucxv.lstrip("# "),
       datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
       "met" if goal_ok else "NOT met", "\n".join(lines)))
print(open(res).read())
EOF
