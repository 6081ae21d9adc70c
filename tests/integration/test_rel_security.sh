#!/usr/bin/env bash
# Security (issue 12): TCP token, namespaces (Lookup/Get/List/Delete/Flush/Evict/Stats),
# wire bounds, a planted hash collision (rel_tool security), the unix socket's mode, and
# a non-loopback TCP listener without a token refused at start.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"
TOKEN=rel-$RANDOM-$RANDOM-secret
mf_start --tcp 127.0.0.1:0 --token "$TOKEN" --peers 127.0.0.1:1
[ -n "$MF_TCP_PORT" ] || fail "no tcp port in the daemon log"
rel_run "$MF_TMP/sec.out" security --unix "$MF_SOCK" --tcp "127.0.0.1:$MF_TCP_PORT" \
  --token "$TOKEN" || fail "security checks"
mode=$(stat -c %a "$MF_SOCK")
expect_eq "$mode" "660" "unix socket mode"
rejected=$(rel_metric connections_rejected_total)
[ "${rejected:-0}" -ge 5 ] || fail "connections_rejected_total is '$rejected', want >= 5"
mf_stop
# Non-loopback TCP without a token: the daemon must refuse to start (exit 1, a message).
rc=0
"$MAPFLOWD" --socket "$MF_TMP/n.sock" --data_dir "$MF_TMP/n" --http "" --tcp 0.0.0.0:0 \
  >"$MF_TMP/nl.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "without a token" "$MF_TMP/nl.log" \
  || { cat "$MF_TMP/nl.log"; fail "non-loopback TCP without a token was not refused (rc $rc)"; }
printf 'RESULT|socket|unix socket permissions; open TCP without a token|stat the socket; start with --tcp 0.0.0.0:0 and no token|socket mode %s; the daemon refused to start (exit %s: "%s")\n' \
  "$mode" "$rc" "$(grep -o 'refusing[^(]*' "$MF_TMP/nl.log" | head -n 1 | sed 's/ *$//')" \
  | "$PYTHON" "$REL_DIR/record.py" "$REL_MD" "$REL_MODE"
echo "test_rel_security: ok"
