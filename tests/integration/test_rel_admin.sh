#!/usr/bin/env bash
# Security and bounds of issue 22 (rel_tool admin-*): the admin boundary (admin socket
# 0600, Hello.admin_token, who changed the config in the log), peers from the config
# only, hello/idle timeouts, max_unsent, the per-namespace reservation quota, max_lookup,
# NUL / control bytes in names (and escaped logs), the descriptor limit (RLIMIT_NOFILE
# raised at start, no accept spin at the limit) and the socket directory check.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../reliability/rel_lib.sh"
TOKEN=adm-$RANDOM-$RANDOM-tok
ATOKEN=adm-$RANDOM-$RANDOM-admin
ADMIN_SOCK=${MF_SOCK%.sock}-admin.sock

# Roles, names, peers, lookup bounds: one daemon with TCP, a token and an admin token.
mf_start --tcp 127.0.0.1:0 --token "$TOKEN" --admin_token "$ATOKEN"
[ -n "$MF_TCP_PORT" ] || fail "no tcp port in the daemon log"
expect_eq "$(stat -c %a "$ADMIN_SOCK")" "600" "admin socket mode"
expect_eq "$(stat -c %a "$MF_SOCK")" "660" "unix socket mode"
rel_run "$MF_TMP/roles.out" admin-roles --unix "$MF_SOCK" --tcp "127.0.0.1:$MF_TCP_PORT" \
  --token "$TOKEN" --admin-token "$ATOKEN" || fail "admin roles"
grep -aq "ConfigSet refused: connection unix:#[0-9]* (pid [0-9]* uid [0-9]*), client 'rel', namespace 'mallory'" \
  "$MF_LOG" || fail "the refused ConfigSet is not logged with who sent it"
# The tenant's 10 refused admin requests came within seconds: rate-limited to one line
# (a second only if the run crossed the 10 s window), every one counted.
n=$(grep -ac ' refused: .* is not an admin connection' "$MF_LOG" || true)
[ "$n" -ge 1 ] && [ "$n" -le 2 ] || fail "admin refusals logged $n times (want 1..2: rate-limited)"
denied=$(mf_http /metrics | grep -a '^mapflowd_admin_denied_total ' | awk '{print $2}')
[ "${denied:-0}" -ge 10 ] || fail "admin_denied_total ${denied:-none} (want >= 10)"
grep -aq "config: lease_ttl = 25s (set by connection admin:#[0-9]* (pid [0-9]* uid [0-9]*, admin socket)" \
  "$MF_LOG" || fail "the admin's ConfigSet is not logged with who made it"
grep -aq "config: lease_ttl = 20s (set by connection tcp:127.0.0.1:[0-9]* (no credentials, admin_token)" \
  "$MF_LOG" || fail "the admin_token ConfigSet is not logged with who made it"
expect_eq "$(ctl config get admin_token | awk '{print $2}')" "***" "admin_token shown redacted"
# mapflowctl: admin commands take the admin socket by default; a tenant path is refused.
ctl config set lease_ttl 31s >/dev/null || fail "mapflowctl config set (admin socket)"
rc=0; ctl --admin-socket "$MF_SOCK" config set lease_ttl 32s >/dev/null 2>&1 || rc=$?
expect_eq "$rc" 1 "config set sent to the tenant socket"
expect_eq "$(ctl config get lease_ttl | awk '{print $2}')" "31s" "lease_ttl after the refused set"
"$CTL" --addr "127.0.0.1:$MF_TCP_PORT" --token "$TOKEN" --admin-token "$ATOKEN" \
  flush --all-namespaces >/dev/null || fail "flush --all-namespaces with the admin token"
rel_run "$MF_TMP/names.out" admin-names --unix "$MF_SOCK" --tcp "127.0.0.1:$MF_TCP_PORT" \
  --token "$TOKEN" || fail "names"
grep -aq 'nokey\\x0aINFO  forged' "$MF_LOG" || fail "the logged key was not escaped"
if grep -aq '^INFO  forged' "$MF_LOG"; then fail "a client forged a log line"; fi
rel_run "$MF_TMP/peers.out" admin-peers --unix "$MF_SOCK" || fail "peers"
rel_run "$MF_TMP/lookup.out" admin-lookup --unix "$MF_SOCK" || fail "lookup bounds"
mf_stop

# Timeouts.
mf_fresh --hello_timeout 500ms --idle_timeout 1s --ssd_bytes 0
rel_run "$MF_TMP/idle.out" admin-timeouts --unix "$MF_SOCK" || fail "timeouts"
mf_stop

# Unsent output and the reservation quota.
mf_fresh --max_frame 1mb --max_unsent 2mb --ssd_bytes 0
rel_run "$MF_TMP/unsent.out" admin-unsent --unix "$MF_SOCK" --pid "$MF_PID" || fail "unsent"
mf_stop
mf_fresh --host_bytes 8mb --reservation_share 0.5 --ssd_bytes 0
rel_run "$MF_TMP/quota.out" admin-quota --unix "$MF_SOCK" --host-bytes $((8 << 20)) \
  || fail "quota"
mf_stop

# RLIMIT_NOFILE: a soft limit below the hard one is raised at start.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -gt 256 ]; then
  MAPFLOWD_REAL=$MAPFLOWD
  MAPFLOWD=$MF_TMP/lowsoft.sh
  printf '#!/usr/bin/env bash\nulimit -Sn 256\nexec "%s" "$@"\n' "$MAPFLOWD_REAL" >"$MAPFLOWD"
  chmod +x "$MAPFLOWD"
  mf_fresh --ssd_bytes 0
  soft=$(awk '/Max open files/ {print $4}' "/proc/$MF_PID/limits")
  expect_eq "$soft" "$hard" "soft RLIMIT_NOFILE after start"
  grep -aq "RLIMIT_NOFILE raised from 256 to $hard" "$MF_LOG" || fail "no RLIMIT_NOFILE log line"
  mf_stop
  # At the (hard) limit: 80 clients against 48 descriptors.
  printf '#!/usr/bin/env bash\nulimit -n 48\nexec "%s" "$@"\n' "$MAPFLOWD_REAL" >"$MAPFLOWD"
  mf_fresh --ssd_bytes 0
  rel_run "$MF_TMP/fds.out" admin-fds --unix "$MF_SOCK" --pid "$MF_PID" --n 80 \
    --http-port "$MF_HTTP_PORT" || fail "fd limit"
  n=$(grep -ac 'accept: Too many open files' "$MF_LOG" || true)
  [ "$n" -ge 1 ] && [ "$n" -le 4 ] || fail "accept errors logged $n times (want 1..4: rate-limited)"
  if grep -aq 'Error from accept' "$MF_LOG"; then fail "libevent's accept loop logged"; fi
  mf_stop
  MAPFLOWD=$MAPFLOWD_REAL
else
  echo "RLIMIT_NOFILE hard limit is $hard: limit checks skipped"
fi

# A world-writable socket directory that someone else owns is refused.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  D=$MF_TMP/shared
  mkdir -p "$D" && chown nobody "$D" && chmod 1777 "$D"
  rc=0
  "$MAPFLOWD" --socket "$D/x.sock" --data_dir "$MF_TMP/x" --http "" >"$MF_TMP/dir.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] && grep -q "world-writable" "$MF_TMP/dir.log" \
    || { cat "$MF_TMP/dir.log"; fail "a world-writable socket directory owned by nobody was used (rc $rc)"; }
  why=$(grep -o 'socket directory [^:]*: [^;]*' "$MF_TMP/dir.log" | head -n 1 | sed "s|$MF_TMP|TMP|")
  [ -n "$why" ] || why=$(grep -o 'world-writable[^;]*' "$MF_TMP/dir.log" | head -n 1)
  printf 'RESULT|socket-dir|a world-writable socket directory|--socket in a mode 1777 directory owned by nobody|refused to start (exit %s: "%s")\n' \
    "$rc" "$why" | "$PYTHON" "$REL_DIR/record.py" "$REL_MD" "$REL_MODE"
else
  echo "not root (or no user nobody): socket directory check skipped"
fi
echo "test_rel_admin: ok"
