#!/usr/bin/env bash
# Crash consistency (issue 12): rel_tool crash SIGKILLs mapflowd at random points of a
# put/get load and checks every operation after each restart (durable-acknowledged rows
# present and verified, uncommitted / rejected rows invisible, no bad bytes ever read).
# make test: 20 kills; make soak (MF_SOAK=1): 100 kills.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"
cycles=20
[ -n "${MF_SOAK:-}" ] && cycles=100
rel_run "$MF_TMP/crash.out" crash --mapflowd "$MAPFLOWD" --dir "$MF_TMP" --cycles "$cycles" \
  --seed 20261129 || fail "crash consistency (see above; daemon log: $MF_TMP/daemon.log)"
echo "test_rel_crash: ok"
