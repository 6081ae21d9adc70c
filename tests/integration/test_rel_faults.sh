#!/usr/bin/env bash
# Faults (issue 12), one daemon each, a bystander client served throughout, the fault
# visible as a status and a metric: host arena exhausted + lease holder SIGKILLed, a
# client that stops reading, half frames, disk full under the SSD tier (tmpfs; needs
# root and mount, else skipped with a message).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"

mf_fresh --host_bytes 1mb --ssd_bytes 0 --reservation_share 1 # one tenant may fill it here
rel_run "$MF_TMP/arena.out" fault-arena --target "$MF_SOCK" || fail "arena / lease-kill"
v=$(rel_metric 'errors_total{code="RESOURCE_EXHAUSTED"}')
[ "${v:-0}" -ge 1 ] || fail "errors_total{code=RESOURCE_EXHAUSTED} is '$v'"
for i in $(seq 1 100); do [ "$(rel_metric leases)" = 0 ] && break; sleep 0.05; done
expect_eq "$(rel_metric leases)" "0" "leases gauge after the holder was killed"
expect_eq "$(rel_metric reservations)" "0" "reservations gauge after the holder was killed"

mf_fresh --max_frame 1mb
rel_run "$MF_TMP/slow.out" fault-slow-reader --target "$MF_SOCK" --pid "$MF_PID" \
  || fail "slow reader"

mf_fresh
rel_run "$MF_TMP/half.out" fault-half-frame --target "$MF_SOCK" || fail "half frame"
v=$(rel_metric 'errors_total{code="INVALID_ARGUMENT"}')
[ "${v:-0}" -ge 1 ] || fail "errors_total{code=INVALID_ARGUMENT} is '$v'"
mf_stop

MNT=$MF_TMP/full
if [ "$(id -u)" != 0 ] || ! { mkdir -p "$MNT" && mount -t tmpfs -o size=4m mfrel "$MNT"; } 2>/dev/null; then
  echo "SKIP disk-full: needs root and 'mount -t tmpfs' (uid $(id -u))"
else
  trap 'umount "$MNT" 2>/dev/null || true; mf_cleanup' EXIT
  MF_DATA=$MNT mf_start --host_bytes 64mb
  rel_run "$MF_TMP/full.out" fault-disk-full --target "$MF_SOCK" || fail "disk full"
  v=$(rel_metric ssd_errors_total)
  [ "${v:-0}" -ge 1 ] || fail "ssd_errors_total is '$v'"
  grep -q "read-only until restart" "$MF_LOG" || fail "no log line for the SSD write failure"
  mf_stop
  umount "$MNT"
  trap mf_cleanup EXIT
fi
echo "test_rel_faults: ok"
