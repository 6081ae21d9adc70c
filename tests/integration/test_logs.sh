#!/usr/bin/env bash
# mapflowd's log lines: a client's hello is logged at DEBUG, not INFO; SIGHUP's
# "N live keys changed" counts only the keys whose value changed (an unchanged
# watermark pair is none) and names them; with stderr on the journal (JOURNAL_STREAM
# = stderr's device:inode, as systemd sets it) every line carries its sd-daemon
# priority (<3> error, <4> warning, <6> info, <7> debug) and no timestamp of its own.
source "$(dirname "$0")/lib.sh"
CONF=$MF_TMP/mapflowd.conf
printf 'host_bytes 4mb\nhigh_watermark 0.9\nlow_watermark 0.8\nlog_level info\nmax_batch 16384\n' >"$CONF"

# Waits for the Nth "reloaded" line; prints it.
reloaded() {
  local i line
  for i in $(seq 1 250); do
    line=$(grep -a "reloaded $CONF" "$MF_LOG" | sed -n "${1}p")
    [ -n "$line" ] && { echo "$line"; return 0; }
    sleep 0.02
  done
  fail "no reload line #$1"
}

mf_start -c "$CONF"
grep -aq '^[0-9-]*T[0-9:.]*Z INFO  ready$' "$MF_LOG" || fail "no timestamped INFO line outside the journal"
ctl health >/dev/null || fail "health"
grep -aq "hello from" "$MF_LOG" && fail "a client's hello is logged at info"

kill -HUP "$MF_PID"
line=$(reloaded 1)
[[ $line == *": 0 live keys changed" ]] || fail "unchanged file: $line"

# Two live keys changed (the watermark pair moved together counts its members that
# changed: low_watermark stays), max_batch rewritten with the same value is no change.
sed -i -e 's/^high_watermark .*/high_watermark 0.95/' -e 's/^log_level .*/log_level debug/' \
  -e 's/^max_batch .*/max_batch 16384/' "$CONF"
kill -HUP "$MF_PID"
line=$(reloaded 2)
[[ $line == *": 2 live keys changed: high_watermark, log_level" ]] || fail "two keys: $line"
[ "$(ctl config get high_watermark 2>&1 | grep -o '0\.95')" = 0.95 ] || fail "high_watermark not applied"
[ "$(ctl config get low_watermark 2>&1 | grep -o '0\.8')" = 0.8 ] || fail "low_watermark not restored"

ctl health >/dev/null || fail "health"
grep -aq "DEBUG connection .*hello from" "$MF_LOG" || fail "no DEBUG hello at log_level debug"
mf_stop
echo "plain log: hello at DEBUG only; reload counts 0, then 2 (high_watermark, log_level)"

# The journal: stderr is the file whose device:inode JOURNAL_STREAM names.
rm -f "$MF_LOG" "$MF_SOCK"; : >"$MF_LOG"
export JOURNAL_STREAM
JOURNAL_STREAM=$(stat -c '%d:%i' "$MF_LOG")
printf 'host_bytes 4mb\nlog_level info\n' >"$CONF"
mf_start -c "$CONF"
sed -i 's/^host_bytes .*/host_bytes 8mb/' "$CONF"   # not live: a warning on SIGHUP
kill -HUP "$MF_PID"
reloaded 1 >/dev/null
mf_stop
grep -aqx '<6>INFO  ready' "$MF_LOG" || fail "no <6> info line"
grep -aq '^<4>WARN  reload: host_bytes changed' "$MF_LOG" || fail "no <4> warning line"
bad=$(grep -av '^<[3467]>' "$MF_LOG" || true)
[ -z "$bad" ] || fail "lines without a priority: $bad"
# An error: a start that fails (the socket's directory is a regular file).
: >"$MF_TMP/err.log"; : >"$MF_TMP/notadir"
JOURNAL_STREAM=$(stat -c '%d:%i' "$MF_TMP/err.log")
timeout 60 "$MAPFLOWD" --socket "$MF_TMP/notadir/d.sock" --data_dir "$MF_TMP/data2" \
  --http 127.0.0.1:0 2>>"$MF_TMP/err.log" && fail "a daemon on a file as directory started"
grep -aq '^<3>ERROR cannot start' "$MF_TMP/err.log" || fail "no <3> error line: $(cat "$MF_TMP/err.log")"
# A stderr that is not the stream JOURNAL_STREAM names (2> elsewhere) keeps timestamps.
timeout 60 "$MAPFLOWD" --socket "$MF_TMP/notadir/d.sock" --data_dir "$MF_TMP/data2" \
  --http 127.0.0.1:0 2>"$MF_TMP/other.log" && fail "a daemon on a file as directory started"
grep -aq '^[0-9-]*T[0-9:.]*Z ERROR cannot start' "$MF_TMP/other.log" || fail "redirected stderr lost its timestamps"
echo "journal: <3> <4> <6> prefixes, no timestamps; a redirected stderr keeps them"
echo "test_logs: ok"
