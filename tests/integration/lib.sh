# tests/integration/lib.sh — sourced by the integration tests: starts a real mapflowd on a
# temporary unix socket and data directory (HTTP on 127.0.0.1:0, port read from its
# log), stops it with SIGTERM (asserting exit 0), and always kills it on exit (trap).
#
#   source "$(dirname "$0")/lib.sh"
#   mf_start [--key value ...]       # sets MF_PID, MF_SOCK, MF_HTTP_PORT, MF_TCP_PORT
#   ctl health                       # mapflowctl on this daemon's socket
#   mf_http /metrics                 # body of an HTTP GET to the daemon
#   mf_stop                          # SIGTERM; fails unless the daemon exits 0
#
# Env: MF_BIN (build/bin, absolute), MAPFLOWD (daemon binary; default $MF_BIN/mapflowd),
# PYTHON. Every wait is a bounded poll.
set -euo pipefail

MF_BIN=${MF_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/bin}
MAPFLOWD=${MAPFLOWD:-$MF_BIN/mapflowd}
CTL=$MF_BIN/mapflowctl
PYTHON=${PYTHON:-/usr/bin/python3}
MF_TMP=$(mktemp -d /tmp/mfit-XXXXXX)
MF_SOCK=$MF_TMP/d.sock
MF_DATA=$MF_TMP/data
MF_LOG=$MF_TMP/daemon.log
MF_PID=
MF_HTTP_PORT=
MF_TCP_PORT=

mf_cleanup() {
  if [ -n "$MF_PID" ] && kill -0 "$MF_PID" 2>/dev/null; then
    kill -KILL "$MF_PID" 2>/dev/null || true
    wait "$MF_PID" 2>/dev/null || true
  fi
  rm -rf "$MF_TMP"
}
trap mf_cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  if [ -f "$MF_LOG" ]; then echo "---- daemon log (tail)" >&2; tail -n 40 "$MF_LOG" >&2; fi
  exit 1
}

# Asserts "$1" == "$2" with a message.
expect_eq() { [ "$1" == "$2" ] || fail "$3: expected '$2', got '$1'"; }

# Port of the listener of this kind (http|tcp) from the daemon log.
mf_log_port() {
  local kind=$1 line
  if [ "$kind" = http ]; then
    line=$(grep -a 'http' "$MF_LOG" | grep -ao '127\.0\.0\.1:[0-9]\+' | tail -n 1 || true)
  else
    line=$(grep -a 'tcp' "$MF_LOG" | grep -av 'http' | grep -ao '127\.0\.0\.1:[0-9]\+' | tail -n 1 || true)
  fi
  echo "${line##*:}"
}

mf_start() {
  [ -x "$MAPFLOWD" ] || fail "no daemon binary at $MAPFLOWD"
  "$MAPFLOWD" --socket "$MF_SOCK" --data_dir "$MF_DATA" --http 127.0.0.1:0 "$@" \
    >>"$MF_LOG" 2>&1 &
  MF_PID=$!
  local i
  for i in $(seq 1 500); do
    kill -0 "$MF_PID" 2>/dev/null || { wait "$MF_PID" || true; MF_PID=; fail "mapflowd exited during start"; }
    if [ -S "$MF_SOCK" ] && "$CTL" --socket "$MF_SOCK" --timeout 1000 health >/dev/null 2>&1; then
      MF_HTTP_PORT=$(mf_log_port http)
      MF_TCP_PORT=$(mf_log_port tcp)
      [ -n "$MF_HTTP_PORT" ] || fail "no http port in the daemon log"
      return 0
    fi
    sleep 0.02
  done
  fail "mapflowd did not come up on $MF_SOCK"
}

mf_stop() {
  [ -n "$MF_PID" ] || return 0
  kill -TERM "$MF_PID"
  local rc=0
  wait "$MF_PID" || rc=$?
  MF_PID=
  [ "$rc" -eq 0 ] || fail "mapflowd exited $rc on SIGTERM"
}

ctl() { "$CTL" --socket "$MF_SOCK" "$@"; }

# GET http://127.0.0.1:$MF_HTTP_PORT$1 → body on stdout; fails on a non-200 status.
mf_http() {
  "$PYTHON" - "$MF_HTTP_PORT" "$1" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=10) as r:
    if r.status != 200:
        sys.exit("HTTP %d" % r.status)
    sys.stdout.write(r.read().decode())
EOF
}

# Raw little-endian u32 tokens: mf_tokens FILE N SEED (deterministic, never all zeros).
mf_tokens() {
  "$PYTHON" - "$@" <<'EOF'
import random, struct, sys
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
with open(path, "wb") as f:
    f.write(struct.pack("<%dI" % n, *[rng.randrange(1, 50000) for _ in range(n)]))
EOF
}
