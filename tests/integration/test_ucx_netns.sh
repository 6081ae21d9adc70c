#!/usr/bin/env bash
# Two daemons in two network namespaces joined by a veth pair (addresses exist inside the
# namespaces only; nothing is configured in the root namespace): A listens for UCX on its
# veth address (non-loopback, so a token is required), a client of B reads A's rows
# through the peer path over that link (UCX_TLS=tcp), bytes identical, and the second
# read is a local hit. Needs root and `ip netns`; skipped with a message otherwise.
set -u
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIPPED: needs root and iproute2 for network namespaces (uid $(id -u))"
  exit 0
fi
NSA=mfucxA$$ NSB=mfucxB$$ VA=mfa$$ VB=mfb$$
NET=10.$((200 + $$ % 50)).$(( ($$ / 50) % 250 ))
if ! ip netns add "$NSA" 2>/dev/null; then
  echo "SKIPPED: cannot create a network namespace here (ip netns add failed)"
  exit 0
fi
source "$(dirname "$0")/../../bench/ucx/daemons.sh"
UCXD_EXTRA_CLEANUP="ip netns del $NSA 2>/dev/null; ip netns del $NSB 2>/dev/null; true"
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
ip netns add "$NSB" || fail "ip netns add $NSB"
ip link add "$VA" type veth peer name "$VB" || fail "cannot create a veth pair"
ip link set "$VA" netns "$NSA" && ip link set "$VB" netns "$NSB" || fail "moving the veth ends"
ip -n "$NSA" addr add "$NET.1/24" dev "$VA" && ip -n "$NSB" addr add "$NET.2/24" dev "$VB" \
  || fail "addresses"
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set "$VA" up && ip -n "$NSB" link set "$VB" up || fail "links up"

TOKEN=netns-$$
SHAPE=(--layers 2 --first-block 0 --blocks 5 --size 300000 --vary --seed 11)
UCXD_WRAP="ip netns exec $NSA" ucxd_start A --ucx "$NET.1:0" --token "$TOKEN"
# B lists A, and the same port on its own loopback so that request is dialled (and fails).
UCXD_WRAP="ip netns exec $NSB" ucxd_start B --token "$TOKEN" --peers "$UCX_A,127.0.0.1:${UCX_A##*:}"
case "$UCX_A" in "$NET.1:"*) ;; *) fail "A's UCX listener is '$UCX_A', not on $NET.1" ;; esac
echo "A in $NSA listens on ucx:$UCX_A; B in $NSB"

tool put --socket "$SOCK_A" "${SHAPE[@]}" | sed 's/^/A /'
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --peer "$UCX_A"); echo "B (peer over veth) $out"
expect_eq "$(field "$out" identical)" 10 "rows read across the namespaces"
expect_eq "$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")" 10 "rows pulled over the veth"
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --peer "$UCX_A"); echo "B (again) $out"
expect_eq "$(field "$out" identical)" 10 "second read"
expect_eq "$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")" 10 "second read is a local hit"
# B's loopback is not A's: the same port on 127.0.0.1 inside B's namespace is nobody.
out=$(tool get --socket "$SOCK_B" "${SHAPE[@]}" --seed 12 --peer "127.0.0.1:${UCX_A##*:}")
expect_eq "$(field "$out" unavailable)" 10 "A is not reachable on B's loopback"
ucxd_stop B
ucxd_stop A
echo "ucx across network namespaces: ok"
