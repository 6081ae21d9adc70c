#!/usr/bin/env bash
# Storage robustness (issue 22): damaged SSD databases (CURRENT removed, MANIFEST bytes, an
# SST index block, a blob bit), ssd_reset, colliding blocks (real XXH3-128 collisions) and
# a full SSD budget of durable rows. rel_tool storage starts and restarts its own daemons;
# its refused starts run again under the ASan daemon when that is built.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"
ASAN_D=$(cd "${MF_BUILD:-build}" && pwd)/asan-daemon/bin/mapflowd
args=()
if [ -x "$ASAN_D" ]; then args=(--asan "$ASAN_D"); else echo "SKIP ASan starts: no $ASAN_D"; fi
rel_run "$MF_TMP/storage.out" storage --mapflowd "$MAPFLOWD" --dir "$MF_TMP" "${args[@]}" \
  || fail "storage checks (daemon logs: $MF_TMP/*.log)"
echo "test_rel_storage: ok"
