# bench/ucx/daemons.sh — sourced by tests/integration/test_ucx_*.sh and bench/ucx/run.sh:
# several mapflowd on one machine, each with its own unix socket, data directory, HTTP
# port and (optionally) UCX listener, all under one temporary directory that goes away
# on exit together with every daemon still running (by PID).
#
#   source bench/ucx/daemons.sh
#   ucxd_start A [--key value ...]   # sets PID_A; UCX_A (host:port of its UCX listener, if
#                                    # any), HTTP_A, SOCK_A; UCXD_WRAP prefixes the command
#                                    # (e.g. "ip netns exec ns1")
#   ucxd_metric A 'name{labels}'     # value of one /metrics sample (0 when absent)
#   ucxd_stop A                      # SIGTERM; fails unless it exits 0
#   ucxd_kill A                      # SIGKILL
#   tool get --socket "$SOCK_B" ...  # build/bin/mapflow-ucx-tool
#
# Env: MF_BIN (absolute build/bin), PYTHON. Every wait is a bounded poll.
set -euo pipefail

MF_BIN=${MF_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/bin}
PYTHON=${PYTHON:-/usr/bin/python3}
UT=$(mktemp -d /tmp/mfucx-XXXXXX)
UCXD_NAMES=""
UCXD_WRAP=${UCXD_WRAP:-}

ucxd_cleanup() {
  local n pid
  for n in $UCXD_NAMES; do
    pid=$(eval echo "\${PID_$n:-}")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  [ -n "${UCXD_EXTRA_CLEANUP:-}" ] && eval "$UCXD_EXTRA_CLEANUP"
  rm -rf "$UT"
}
trap ucxd_cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  local n
  for n in $UCXD_NAMES; do
    echo "---- daemon $n log (tail)" >&2
    tail -n 25 "$UT/$n.log" >&2 || true
  done
  exit 1
}

expect_eq() { [ "$1" == "$2" ] || fail "$3: expected '$2', got '$1'"; }

tool() { "$MF_BIN/mapflow-ucx-tool" "$@"; }

# Field KEY of a `key=value ...` line.
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

ucxd_start() {
  local name=$1; shift
  local log=$UT/$name.log sock=$UT/$name.sock
  $UCXD_WRAP "$MF_BIN/mapflowd" --socket "$sock" --data_dir "$UT/$name" --http 127.0.0.1:0 \
    --host_bytes 256mb "$@" >>"$log" 2>&1 &
  local pid=$!
  eval "PID_$name=$pid; SOCK_$name=$sock; WRAP_$name='$UCXD_WRAP'"
  UCXD_NAMES="$UCXD_NAMES $name"
  local i
  for i in $(seq 1 500); do
    kill -0 "$pid" 2>/dev/null || fail "mapflowd $name exited during start"
    if grep -q ' ready$' "$log" 2>/dev/null; then
      eval "UCX_$name=$(grep -ao 'listening on ucx:[^ ]*' "$log" | tail -n 1 | sed 's/listening on ucx://')"
      eval "HTTP_$name=$(grep -ao 'http on [0-9.]*:[0-9]*' "$log" | tail -n 1 | sed 's/.*://')"
      return 0
    fi
    sleep 0.02
  done
  fail "mapflowd $name did not become ready"
}

ucxd_stop() {
  local pid rc=0
  pid=$(eval echo "\$PID_$1")
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  eval "PID_$1="
  [ "$rc" -eq 0 ] || fail "mapflowd $1 exited $rc on SIGTERM"
}

ucxd_kill() {
  local pid
  pid=$(eval echo "\$PID_$1")
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  eval "PID_$1="
}

# ucxd_metric NAME SAMPLE — exact sample name as printed (labels included).
ucxd_metric() {
  local port wrap
  port=$(eval echo "\$HTTP_$1")
  wrap=$(eval echo "\$WRAP_$1")
  $wrap "$PYTHON" - "$port" "$2" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10) as r:
    body = r.read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[2] + " "):
        print(line.split()[-1].split(".")[0])
        break
else:
    print(0)
EOF
}

# Waits (bounded) until FILE has a line matching REGEX.
wait_log() {
  local i
  for i in $(seq 1 1000); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.01
  done
  fail "no line matching '$2' in $1"
}
