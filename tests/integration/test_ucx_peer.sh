#!/usr/bin/env bash
# Two daemons on one machine (own sockets, data directories, ports): rows put into A are
# read by a client of B through the peer path (Get.peer = A's UCX listener), bytes
# identical; the second read is a local hit (no new peer traffic); Lookup.peer counts A's
# blocks; a partial miss fetches only what is missing; A's leases are released; a daemon
# peering with the wrong token (and a UCX client with none) is refused; a peer address
# not in `peers` answers PERMISSION_DENIED, a dead listed one UNAVAILABLE; a non-loopback
# UCX listener without a
# token is refused at start. UCX_TLS=tcp: the cross-daemon path runs over the network
# transport (sockets on 127.0.0.1), not shared memory.
source "$(dirname "$0")/../../bench/ucx/daemons.sh"
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
TOKEN=t0k3n-$$
SHAPE=(--layers 3 --first-block 0 --blocks 6 --size 100000 --vary --seed 7)

ucxd_start A --ucx 127.0.0.1:0 --token "$TOKEN"
[ -n "$UCX_A" ] || fail "A logged no 'listening on ucx:' line"
ucxd_start B --token "$TOKEN" --peers "$UCX_A"
[ -n "$UCX_A" ] || fail "A logged no 'listening on ucx:' line"
echo "A: ucx $UCX_A; B: no UCX listener (its context starts at the first peer request)"

out=$(tool put --socket "$SOCK_A" "${SHAPE[@]}"); echo "A $out"
expect_eq "$(field "$out" rows)" 18 "rows put into A"

out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}")
expect_eq "$(field "$out" not_found)" 18 "B alone has none of A's rows"

out=$(tool lookup --socket "$SOCK_B" "${SHAPE[@]}" --peer "$UCX_A"); echo "B $out"
expect_eq "$(field "$out" blocks)" "6,6,6" "Lookup through the peer"
expect_eq "$(ucxd_metric B mapflowd_tier_entries{tier=\"host\"})" 0 "Lookup caches nothing"

out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --peer "$UCX_A"); echo "B (peer) $out"
expect_eq "$(field "$out" ok)" 18 "rows served through the peer"
expect_eq "$(field "$out" identical)" 18 "bytes identical to what A stored"
fetched=$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")
expect_eq "$fetched" 18 "rows B pulled from A"
bytes=$(ucxd_metric B "mapflowd_peer_fetched_bytes_total{peer=\"$UCX_A\"}")
expect_eq "$bytes" "$(field "$out" bytes)" "bytes B pulled from A"
expect_eq "$(ucxd_metric B mapflowd_tier_entries{tier=\"host\"})" 18 "read-through cached"
expect_eq "$(ucxd_metric B mapflowd_peer_fetch_duration_seconds_count)" 1 "one fetch observed"
expect_eq "$(ucxd_metric A mapflowd_leases)" 0 "A's leases released after the transfer"
[ "$(ucxd_metric A mapflowd_leases_granted_total)" -ge 18 ] || fail "A granted no leases"

"$PYTHON" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode())' "$HTTP_B" >"$UT/metrics_b"
"$PYTHON" "$(dirname "$0")/promcheck.py" "$UT/metrics_b" || fail "B's /metrics with peer series is not valid Prometheus text"
reqs=$(ucxd_metric B "mapflowd_peer_requests_total{peer=\"$UCX_A\"}")
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --peer "$UCX_A"); echo "B (again) $out"
expect_eq "$(field "$out" identical)" 18 "second read"
expect_eq "$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")" 18 "second read pulled nothing"
expect_eq "$(ucxd_metric B "mapflowd_peer_requests_total{peer=\"$UCX_A\"}")" "$reqs" "second read asked A nothing"
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}")
expect_eq "$(field "$out" identical)" 18 "cached rows served without naming the peer"

# A fourth layer exists only at A: only its 6 rows travel.
tool put --socket "$SOCK_A" --layers 4 --first-block 0 --blocks 6 --size 100000 --vary --seed 7 >/dev/null
out=$(tool get --socket "$SOCK_B" --layers 4 --first-block 0 --blocks 6 --size 100000 --vary --seed 7 --peer "$UCX_A")
echo "B (partial miss) $out"
expect_eq "$(field "$out" identical)" 24 "partial miss"
expect_eq "$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")" 24 "only the missing rows pulled"

# Rows the peer does not have either stay NOT_FOUND.
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --seed 8 --peer "$UCX_A")
expect_eq "$(field "$out" not_found)" 18 "rows neither daemon has"

# The standalone UCX client (the same fetch engine) with and without the token.
out=$(tool fetch --ucx "$UCX_A" --token "$TOKEN" "${SHAPE[@]}" --iters 2); echo "client $out"
expect_eq "$(field "$out" identical)" 18 "remote client with the token"
rejected=$(ucxd_metric A mapflowd_connections_rejected_total)
if tool fetch --ucx "$UCX_A" "${SHAPE[@]}" --iters 1 2>"$UT/notoken.err"; then
  fail "a UCX client without the token was served"
fi
grep -q UNAUTHENTICATED "$UT/notoken.err" || fail "no UNAUTHENTICATED for the tokenless client: $(cat "$UT/notoken.err")"

# A daemon peering with the wrong token is refused; nothing lands in its cache.
ucxd_start C --token "not-$TOKEN" --peers "$UCX_A,127.0.0.1:1"
out=$(tool get --socket "$SOCK_C" "${SHAPE[@]}" --peer "$UCX_A"); echo "C (wrong token) $out"
expect_eq "$(field "$out" unauthenticated)" 18 "wrong token: rows UNAUTHENTICATED"
expect_eq "$(ucxd_metric C mapflowd_tier_entries{tier=\"host\"})" 0 "wrong token: nothing cached"
[ "$(ucxd_metric A mapflowd_connections_rejected_total)" -ge $((rejected + 2)) ] \
  || fail "A did not count the refused Hellos"
[ "$(ucxd_metric C "mapflowd_peer_errors_total{peer=\"$UCX_A\"}")" -ge 1 ] || fail "C counted no peer error"

# Addresses not in `peers` (B lists only A) are refused; a dead listed one is UNAVAILABLE.
out=$(tool get --socket "$SOCK_C" "${SHAPE[@]}" --peer not-an-address || true)
expect_eq "$(field "$out" error)" PERMISSION_DENIED "unlisted, unparsable peer"
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --peer 127.0.0.1:1 || true)
expect_eq "$(field "$out" error)" PERMISSION_DENIED "peer not in B's peers"
out=$(tool get --socket "$SOCK_C" "${SHAPE[@]}" --peer 127.0.0.1:1)
expect_eq "$(field "$out" unavailable)" 18 "nobody listens at the peer address"
tool lookup --socket "$SOCK_C" "${SHAPE[@]}" --peer 127.0.0.1:1 | grep -q 'blocks=0,0,0' \
  || fail "Lookup with a dead peer should answer the local blocks"

# Non-loopback UCX listener without a token: refused at start.
if "$MF_BIN/mapflowd" --socket "$UT/x.sock" --data_dir "$UT/x" --http "" --host_bytes 16mb \
    --ucx 0.0.0.0:0 >"$UT/x.log" 2>&1; then
  fail "mapflowd listened on UCX 0.0.0.0 without a token"
fi
grep -q "refusing to listen on non-loopback" "$UT/x.log" || fail "no reason given: $(tail -1 "$UT/x.log")"

ucxd_stop C
ucxd_stop B
ucxd_stop A
echo "ucx peer: ok"
