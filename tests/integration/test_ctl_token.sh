#!/usr/bin/env bash
# token_file against a real mapflowd: a 0600 file's first line is the TCP token (not on
# the command line), get shows the path and a redacted token, a rotated file is picked up
# by `config set token_file` and by SIGHUP; loose permissions, a missing file and token +
# token_file together are refused at start (exit 2) with a message naming the problem.
source "$(dirname "$0")/lib.sh"

rand_token() { "$PYTHON" -c 'import secrets; print(secrets.token_hex(24))'; }
tcp_health() { "$CTL" --addr 127.0.0.1:"$MF_TCP_PORT" --token "$1" health >/dev/null 2>&1; }

TOK=$(rand_token)
umask 077
printf '%s\nsecond line is not the token\n' "$TOK" >"$MF_TMP/token"
cp "$MF_TMP/token" "$MF_TMP/loose"
chmod 0644 "$MF_TMP/loose"

# --- refused at start -------------------------------------------------------------------
start_fails() { # expected message, then mapflowd arguments
  local want=$1 out rc=0
  shift
  out=$("$MAPFLOWD" --socket "$MF_TMP/x.sock" --data_dir "$MF_DATA" --http "" "$@" 2>&1) || rc=$?
  expect_eq $rc 2 "mapflowd $* exit code"
  grep -q -- "$want" <<<"$out" || fail "mapflowd $*: expected '$want' in: $out"
}
start_fails "group or others" --token_file "$MF_TMP/loose"
start_fails "No such file" --token_file "$MF_TMP/missing"
start_fails "token and token_file" --token abc --token_file "$MF_TMP/token"
printf 'token abc\ntoken_file %s\n' "$MF_TMP/token" >"$MF_TMP/both.conf"
rc=0; out=$("$MAPFLOWD" --check-config "$MF_TMP/both.conf" 2>&1) || rc=$?
expect_eq $rc 2 "--check-config with token and token_file"
grep -q "both.conf:2: token and token_file" <<<"$out" || fail "--check-config: $out"

# --- the file's token guards TCP --------------------------------------------------------
printf 'token_file %s\n' "$MF_TMP/token" >"$MF_TMP/d.conf"
mf_start -c "$MF_TMP/d.conf" --tcp 127.0.0.1:0
[ -n "$MF_TCP_PORT" ] || fail "no tcp port in the daemon log"
tcp_health "$TOK" || fail "tcp with the file's token"
tcp_health "wrong-$TOK" && fail "tcp with a wrong token accepted"
tcp_health "second line is not the token" && fail "the second line acted as the token"
grep -q -- "$TOK" "/proc/$MF_PID/cmdline" && fail "token on the command line"
grep -q -- "$TOK" "$MF_LOG" && fail "token in the daemon log"

expect_eq "$(ctl config get token)" "token ***" "config get token"
ctl config get token_file | grep -qF "$MF_TMP/token" || fail "config get token_file: $(ctl config get token_file)"
rc=0; ctl config set token abc >/dev/null 2>"$MF_TMP/set.err" || rc=$?
expect_eq $rc 1 "config set token with token_file set"
grep -q "token and token_file" "$MF_TMP/set.err" || fail "config set token: $(cat "$MF_TMP/set.err")"
tcp_health "$TOK" || fail "a refused config set changed the token"

# Rotation through config set: the same path is read again.
TOK2=$(rand_token)
printf '%s' "$TOK2" >"$MF_TMP/token"
ctl config set token_file "$MF_TMP/token" >/dev/null || fail "config set token_file"
tcp_health "$TOK2" || fail "tcp with the rotated token (config set)"
tcp_health "$TOK" && fail "old token accepted after rotation"

# Rotation through SIGHUP (re-reads -c FILE, and the token file with it).
TOK3=$(rand_token)
printf '%s\n' "$TOK3" >"$MF_TMP/token"
kill -HUP "$MF_PID"
for i in $(seq 1 500); do
  grep -q "reload: token changed (token_file)" "$MF_LOG" && break
  sleep 0.02
done
grep -q "reload: token changed (token_file)" "$MF_LOG" || fail "SIGHUP did not re-read the token file"
tcp_health "$TOK3" || fail "tcp with the rotated token (SIGHUP)"
tcp_health "$TOK2" && fail "old token accepted after SIGHUP"

# A file made loose later is refused by config set; the token in effect stays.
chmod 0640 "$MF_TMP/token"
rc=0; ctl config set token_file "$MF_TMP/token" >/dev/null 2>&1 || rc=$?
expect_eq $rc 1 "config set token_file of a 0640 file"
tcp_health "$TOK3" || fail "token lost after a refused token_file"
mf_stop
echo "test_ctl_token: ok"
