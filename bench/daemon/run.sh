#!/usr/bin/env bash
# bench/daemon/run.sh — mapflowd against the stores users would pick instead (issue 13).
#
#   bench/daemon/run.sh [--quick] [--no-report] [--keep] [-- BENCH-ARGS...]
#
# Builds mapflowd and mapflow-bench-daemon, starts its own mapflowd (temp socket and data
# directory, host tier sized for the rows) and two redis-servers (unix sockets in the temp
# directory, no persistence): one with the defaults and one with io-threads N and
# io-threads-do-reads yes, as a user tuning Redis would. Runs every measurement at 1, 4,
# 16 and 64 clients, 5 repetitions each, with the page cache dropped before every SSD
# pass when it can write /proc/sys/vm/drop_caches (root); prints a table (min / median /
# max) with ratios against every baseline measured in the same run, and writes
# bench/results/daemon.md (the exact command, machine info, the table).
# --quick: fewer rows and 0.5 s per point (< 2 min); default < 10 min.
# --no-report: print the table but leave bench/results/daemon.md alone; --out FILE: write
# the results there instead. --keep: leave the temp directory (logs, raw RESULT lines);
# --raw FILE: copy the raw RESULT/INFO lines there.
# BENCH-ARGS go to mapflow-bench-daemon (e.g. -- --only lookup,get --clients 1,16).
# Env: MF_BENCH_HOST_BYTES (default 2gb, 1gb with --quick); MF_BENCH_CPUS (e.g. 0,1: pin
# the daemon, redis-server and the clients to those CPUs with taskset);
# MF_BENCH_REDIS_IO_THREADS (default from nproc: 2 up to 3 CPUs, 3 up to 7, else 6, as
# redis.conf advises); MF_BENCH_LIMIT (seconds for the bench, default 150 / 570); MF_BENCH_BIN (a
# directory with prebuilt mapflowd and mapflow-bench-daemon: no make); REDIS_SERVER
# (default redis-server); PYTHON (python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cmdline="bench/daemon/run.sh${*:+ $*}"
quick=0 report=1 keep=0 out="" raw=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --no-report) report=0 ;;
    --keep) keep=1 ;;
    --out) out=$2; shift ;;
    --raw) raw=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
PYTHON=${PYTHON:-python3}
if [ $quick = 1 ]; then
    host_bytes=${MF_BENCH_HOST_BYTES:-1gb}; limit=${MF_BENCH_LIMIT:-150}; qflag=(--quick)
else
    host_bytes=${MF_BENCH_HOST_BYTES:-2gb}; limit=${MF_BENCH_LIMIT:-570}; qflag=()
fi
# Five repetitions of every point (BENCH-ARGS may override with --reps); cold SSD passes
# where the page cache can be dropped.
qflag+=(--reps 5)
cold=no
if [ -w /proc/sys/vm/drop_caches ]; then qflag+=(--drop-caches); cold=yes; fi
ncpu=$(nproc)
if [ "$ncpu" -le 3 ]; then iothreads=2; elif [ "$ncpu" -le 7 ]; then iothreads=3; else iothreads=6; fi
iothreads=${MF_BENCH_REDIS_IO_THREADS:-$iothreads}

cd "$root"
if [ -n "${MF_BENCH_BIN:-}" ]; then
    bin=$(cd "$MF_BENCH_BIN" && pwd)
else
    echo "== building" >&2
    make --no-print-directory -j"$(nproc)" build/bin/mapflowd build/bin/mapflow-bench-daemon >&2
    bin=$root/build/bin
fi
redis_server=${REDIS_SERVER:-redis-server}
pin=()
[ -n "${MF_BENCH_CPUS:-}" ] && pin=(taskset -c "$MF_BENCH_CPUS")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mf-bench-daemon.XXXXXX")
dpid="" rpid="" ripid=""
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null || true
    [ -n "$rpid" ] && kill "$rpid" 2>/dev/null && wait "$rpid" 2>/dev/null || true
    [ -n "$ripid" ] && kill "$ripid" 2>/dev/null && wait "$ripid" 2>/dev/null || true
    if [ $keep = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT INT TERM

# Waits (bounded) for a unix socket to appear; fails if the process died.
wait_socket() {
    local sock=$1 pid=$2 what=$3 i
    for i in $(seq 1 200); do
        [ -S "$sock" ] && return 0
        kill -0 "$pid" 2>/dev/null || { echo "run.sh: $what exited early" >&2; return 1; }
        sleep 0.05
    done
    echo "run.sh: $what did not create $sock in 10 s" >&2
    return 1
}

# A free loopback port for mapflowd's /metrics: its own request-time histograms separate
# the daemon's service time from the clients' and the scheduler's share.
http_port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "== starting mapflowd (host_bytes $host_bytes) and redis-server in $tmp" >&2
"${pin[@]}" "$bin/mapflowd" --socket "$tmp/mapflowd.sock" --data_dir "$tmp/data" \
    --http "127.0.0.1:$http_port" \
    --host_bytes "$host_bytes" --log_level warn 2>"$tmp/mapflowd.log" &
dpid=$!
wait_socket "$tmp/mapflowd.sock" "$dpid" mapflowd || { cat "$tmp/mapflowd.log" >&2; exit 1; }

redis_args=()
redis_version=""
redis_missing=""
if command -v "$redis_server" >/dev/null; then
    "${pin[@]}" "$redis_server" --port 0 --unixsocket "$tmp/redis.sock" --unixsocketperm 700 \
        --save "" --appendonly no --dir "$tmp" --daemonize no \
        --logfile "$tmp/redis.log" &
    rpid=$!
    wait_socket "$tmp/redis.sock" "$rpid" redis-server || exit 1
    mkdir -p "$tmp/redis-io"
    "${pin[@]}" "$redis_server" --port 0 --unixsocket "$tmp/redis-io.sock" --unixsocketperm 700 \
        --save "" --appendonly no --dir "$tmp/redis-io" --daemonize no \
        --io-threads "$iothreads" --io-threads-do-reads yes \
        --logfile "$tmp/redis-io.log" &
    ripid=$!
    wait_socket "$tmp/redis-io.sock" "$ripid" "redis-server (io-threads)" || exit 1
    redis_args=(--redis "$tmp/redis.sock" --redis-io "$tmp/redis-io.sock")
    redis_version=$("$redis_server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
else
    echo "run.sh: redis-server not installed (apt-get install redis-server): Redis rows skipped" >&2
    redis_missing="INFO	redis-server ($redis_server) not found: Redis rows and the Redis goal skipped"
fi

echo "== running (bounded at ${limit} s)" >&2
# The report names the commit and time of the run (not of whatever HEAD is when it is written).
run_date=$(date -u '+%Y-%m-%d %H:%M UTC')
run_commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?")
[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && run_commit="$run_commit+dirty"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
set +e
timeout "$limit" "${pin[@]}" "$bin/mapflow-bench-daemon" --daemon "unix:$tmp/mapflowd.sock" \
    "${redis_args[@]}" --rocks-dir "$tmp/rocks-direct" "${qflag[@]}" "${extra[@]}" \
    | tee "$tmp/results.tsv" | grep --line-buffered '^INFO' >&2
rc=${PIPESTATUS[0]}
set -e
[ -n "${redis_missing:-}" ] && printf '%s\n' "$redis_missing" >>"$tmp/results.tsv"
printf 'INFO\tload average (1, 5, 15 min) before the run: %s, after: %s\n' "$load_before" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$tmp/results.tsv"
# mapflowd's own time per request over the whole run (receipt of the request to its reply
# queued; every size of one kind together).
"$PYTHON" - "$http_port" >>"$tmp/results.tsv" <<'PY' || true
import re, sys, urllib.request
try:
    text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
except Exception as e:
    print("INFO\tmapflowd /metrics unavailable: %s" % e)
    sys.exit(0)
val = lambda k, op: float((re.search(r'^mapflowd_request_duration_seconds_%s\{op="%s"\} (\S+)' % (k, op), text, re.M) or [0, 0])[1])
for op in ("put", "get", "lookup"):
    n, s = val("count", op), val("sum", op)
    if n:
        print("INFO\tmapflowd's own time per %s request (its /metrics): %.0f us mean over %d" % (op, s / n * 1e6, n))
PY
if [ "$rc" -ne 0 ]; then
    echo "run.sh: mapflow-bench-daemon exited $rc (see the lines above)" >&2
    [ -s "$tmp/mapflowd.log" ] && { echo "-- mapflowd log (tail):" >&2; tail -20 "$tmp/mapflowd.log" >&2; }
fi
kill -0 "$dpid" 2>/dev/null || { echo "run.sh: mapflowd died during the run" >&2; rc=1; }

[ -n "$raw" ] && cp "$tmp/results.tsv" "$raw"
out_args=()
[ $report = 1 ] && out_args=(--out "${out:-$root/bench/results/daemon.md}")
"$PYTHON" "$here/report.py" --results "$tmp/results.tsv" --command "$cmdline" \
    --redis-version "${redis_version:-none}" --host-bytes "$host_bytes" \
    --redis-io-threads "$iothreads" --cold "$cold" \
    --cpus "${MF_BENCH_CPUS:-all}" --commit "$run_commit" --date "$run_date" "${out_args[@]}"
exit "$rc"
