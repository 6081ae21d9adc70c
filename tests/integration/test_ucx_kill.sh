#!/usr/bin/env bash
# A peer killed mid-transfer: B is pulling 24 rows of ~8 MiB from A over UCX (UCX_TLS=tcp)
# when A is stopped (SIGSTOP, so the transfer is provably unfinished: B's fetched-rows
# counter is below 24) and then killed (SIGKILL). The client of B gets UNAVAILABLE for
# the rows that did not arrive, every row it does get is byte-identical, B keeps serving,
# and no partially transferred row ever becomes visible: afterwards B holds exactly the
# rows it answered OK, and they verify.
source "$(dirname "$0")/../../bench/ucx/daemons.sh"
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
N=24
SHAPE=(--layers $N --first-block 130 --blocks 1 --size 8000000)

ucxd_start A --ucx 127.0.0.1:0 --host_bytes 512mb --ssd_bytes 0 --max_frame 64mb
ucxd_start B --host_bytes 512mb --log_level debug --ssd_bytes 0 --peers "$UCX_A"
tool put --socket "$SOCK_A" "${SHAPE[@]}" --seed 3 | sed 's/^/A /'

# The whole Get takes a few hundred ms on loopback TCP; stop A as soon as B says the
# leases are granted and the pull has begun.
tool get --socket "$SOCK_B" "${SHAPE[@]}" --seed 3 --peer "$UCX_A" >"$UT/get.out" 2>&1 &
GET_PID=$!
UCXD_EXTRA_CLEANUP="kill -KILL $GET_PID 2>/dev/null || true"
wait_log "$UT/B.log" "pulling $N of $N rows"
kill -STOP "$PID_A"
done_rows=$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")
echo "A stopped with $done_rows of $N rows in B"
[ "$done_rows" -lt $N ] || fail "the transfer finished before A was stopped"
ucxd_kill A
for i in $(seq 1 1000); do kill -0 "$GET_PID" 2>/dev/null || break; sleep 0.01; done
kill -0 "$GET_PID" 2>/dev/null && fail "B did not answer within 10 s of A's death"
wait "$GET_PID" || fail "get exited $?: $(cat "$UT/get.out")"
out=$(grep '^get ' "$UT/get.out"); echo "B (peer killed) $out"
ok=$(field "$out" ok)
[ "$(field "$out" unavailable)" -ge 1 ] || fail "no row came back UNAVAILABLE"
expect_eq "$(( ok + $(field "$out" unavailable) ))" $N "every row is OK or UNAVAILABLE"
expect_eq "$(field "$out" identical)" "$ok" "rows that arrived are intact"
[ "$(ucxd_metric B "mapflowd_peer_errors_total{peer=\"$UCX_A\"}")" -ge 1 ] || fail "no peer error counted"

# Nothing half-written is visible: B holds exactly the rows it answered OK.
expect_eq "$(ucxd_metric B mapflowd_tier_entries{tier=\"host\"})" "$ok" "entries in B"
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --seed 3); echo "B (local) $out"
expect_eq "$(field "$out" identical)" "$ok" "rows B serves afterwards"
expect_eq "$(field "$out" not_found)" $((N - ok)) "rows that never arrived"
expect_eq "$(ucxd_metric B mapflowd_reservations)" 0 "no reservation left behind"

# B keeps serving: health, and the dead peer is a fast UNAVAILABLE, not a hang.
"$MF_BIN/mapflowctl" --socket "$SOCK_B" --timeout 2000 health >/dev/null || fail "B unhealthy"
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --seed 3 --peer "$UCX_A")
expect_eq "$(field "$out" unavailable)" $((N - ok)) "dead peer afterwards"
ucxd_stop B
echo "ucx peer killed mid-transfer: ok"
