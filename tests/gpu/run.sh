#!/usr/bin/env bash
# GPU correctness on an H200 (or any sm_90 GPU): gpu_check against the C reference and
# float64 on fresh random inputs, then compute-sanitizer memcheck and racecheck on the small
# case, then
# ipc_check: the daemon's GPU tier through CUDA IPC between two processes (a mapflowd with
# gpu_bytes=2gb on a unix socket in a temp dir, started and stopped here).
# Usage: tests/gpu/run.sh [gpu_check args]   (MF_BIN: build/bin by default;
#   IPC_CHECK_ARGS: extra ipc_check args, e.g. "--peer-device 1" on a 2-GPU machine;
#   IPC_ONLY=1: the ipc_check section alone)
# Exit status: non-zero if any step fails.
set -u
bin=${MF_BIN:-build/bin}
rc=0
src=0
if [ "${IPC_ONLY:-0}" = 1 ]; then
    echo "IPC_ONLY=1: gpu_check and memcheck skipped"
else
"$bin/tests/gpu_check" "$@"
rc=$?
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ]; then
    "$san" --tool memcheck --error-exitcode 3 --print-limit 20 "$bin/tests/gpu_check" --small \
        > "${OUT:-/tmp}/sanitizer.log" 2>&1
    src=$?
    tail -n 4 "${OUT:-/tmp}/sanitizer.log"
    "$san" --tool racecheck --error-exitcode 3 --print-limit 20 "$bin/tests/gpu_check" --small \
        > "${OUT:-/tmp}/racecheck.log" 2>&1
    rrc=$?
    tail -n 2 "${OUT:-/tmp}/racecheck.log"
    [ "$rrc" = 0 ] || src=$rrc
else
    echo "compute-sanitizer not found: memcheck skipped"
    src=0
fi
echo "gpu_check exit $rc, memcheck/racecheck exit $src"
fi

# ---- ipc_check: GPU tier + CUDA IPC (source process -> mapflowd -> target process) ----
tmp=$(mktemp -d /tmp/mf-ipc-XXXXXX)
"$bin/mapflowd" --socket "$tmp/d.sock" --data_dir "$tmp/data" --http 127.0.0.1:0 \
    --gpu_bytes 2gb --host_bytes 1gb > "$tmp/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 200); do [ -S "$tmp/d.sock" ] && break; sleep 0.05; done
# shellcheck disable=SC2086
"$bin/tests/ipc_check" --socket "$tmp/d.sock" ${IPC_CHECK_ARGS:-}
irc=$?
kill -TERM "$dpid"
wait "$dpid"
drc=$?
grep -iE "gpu" "$tmp/daemon.log" | head -n 5
[ "$drc" = 0 ] || { echo "mapflowd exit $drc:"; tail -n 20 "$tmp/daemon.log"; }
cp "$tmp/daemon.log" "${OUT:-/tmp}/ipc_daemon.log" 2>/dev/null
rm -rf "$tmp"
echo "ipc_check exit $irc, mapflowd exit $drc"
[ "$rc" = 0 ] && [ "$src" = 0 ] && [ "$irc" = 0 ] && [ "$drc" = 0 ]
