#!/usr/bin/env bash
# libmapflow over UCX (issue 6, client half), UCX_TLS=tcp so the network path runs
# (sockets on 127.0.0.1): mapflowctl puts rows through `--addr ucx:HOST:PORT` (PutBegin,
# one-sided put, flush, PutCommit) and gets them back (lease, one-sided get, release)
# byte-identical to the unix-socket get and to the files; without the token the daemon
# refuses (UNAUTHENTICATED); `get --peer` / `lookup --peer` read through daemon B rows
# that live on daemon A. Then one Python channel (the ctypes binding) on ucx: gets a
# prefix × 2 layers in both modes (library-owned copies, lease ids 0, the daemon holds
# no lease afterwards, mf_get_lease refused), puts, and survives its daemon: killed →
# UNAVAILABLE (fail-fast policy), restarted on the same address → the same channel
# reconnects and succeeds.
source "$(dirname "$0")/../../bench/ucx/daemons.sh"
# REUSEADDR: the restarted daemon binds the address the killed one held (TIME_WAIT).
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n UCX_TCP_CM_REUSEADDR=y
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CTL=$MF_BIN/mapflowctl
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
TOKEN=t0k-$$
M=ucxm
Bk=16

ucxd_start A --ucx 127.0.0.1:0 --token "$TOKEN"
ucxd_start B --token "$TOKEN" --peers "$UCX_A"
[ -n "$UCX_A" ] || fail "A logged no 'listening on ucx:' line"

"$PYTHON" - "$UT/tok" <<'PY'
import random, struct, sys
rng = random.Random(61)
open(sys.argv[1], "wb").write(struct.pack("<96I", *[rng.randrange(1, 60000) for _ in range(96)]))
PY
rows=()
for L in 1 2 3; do
  "$SYNTH" --model $M --layer $L --block $Bk --heads 4 --tokens "$UT/tok" --codec fp16 \
    --top-p 0.9 --seed $((20 + L)) --out "$UT/rows$L" >/dev/null
done
for L in 1 2; do for i in 0 1 2 3 4 5; do rows+=(--row "$UT/rows$L/row-$i.bin"); done; done
mapfile -t H < <("$CTL" hash --model $M --block $Bk --tokens "$UT/tok")
expect_eq "${#H[@]}" 6 "prefix hashes"

# ---- mapflowctl over ucx: put, get, identical bytes ------------------------------------
out=$("$CTL" --addr "ucx:$UCX_A" --token "$TOKEN" put "${rows[@]}") || fail "put over ucx: $out"
expect_eq "$(grep -c -- '-> host' <<<"$out")" 12 "rows put over ucx"
n=0
for L in 1 2; do for i in 0 1 2 3 4 5; do
  "$CTL" --addr "ucx:$UCX_A" --token "$TOKEN" get --model $M --layer $L --hash "${H[$i]}" \
    --out "$UT/u.bin" >/dev/null || fail "get over ucx layer $L block $i"
  "$CTL" --socket "$SOCK_A" get --model $M --layer $L --hash "${H[$i]}" --out "$UT/s.bin" \
    >/dev/null || fail "get over the unix socket layer $L block $i"
  cmp -s "$UT/u.bin" "$UT/s.bin" || fail "ucx and unix-socket bytes differ (layer $L block $i)"
  cmp -s "$UT/u.bin" "$UT/rows$L/row-$i.bin" || fail "ucx bytes differ from the row put"
  n=$((n + 1))
done; done
echo "12 rows put over ucx, $n read back identical to the unix-socket get"
expect_eq "$(ucxd_metric A mapflowd_leases)" 0 "leases left on A"
expect_eq "$(ucxd_metric A mapflowd_reservations)" 0 "reservations left on A"

rc=0
"$CTL" --addr "ucx:$UCX_A" get --model $M --layer 1 --hash "${H[0]}" --out "$UT/x.bin" \
  >/dev/null 2>"$UT/notoken.err" || rc=$?
expect_eq "$rc" 1 "exit status without the token"
grep -q UNAUTHENTICATED "$UT/notoken.err" || fail "no UNAUTHENTICATED: $(cat "$UT/notoken.err")"
[ ! -e "$UT/x.bin" ] || fail "a refused get wrote its output"
rc=0; "$CTL" --socket "$SOCK_B" get --peer nocolon --model $M --layer 1 --hash "${H[0]}" \
  --out "$UT/x.bin" >/dev/null 2>&1 || rc=$?
expect_eq "$rc" 2 "--peer without a port is a usage error"

# ---- --peer: B reads through rows that live on A -------------------------------------
rc=0; "$CTL" --socket "$SOCK_B" get --model $M --layer 2 --hash "${H[3]}" --out "$UT/p.bin" \
  >/dev/null 2>&1 || rc=$?
expect_eq "$rc" 1 "B alone does not have A's row"
"$CTL" --socket "$SOCK_B" lookup --model $M --block $Bk --tokens "$UT/tok" --layers 1,2 \
  >"$UT/lk0" || fail "lookup on B"
grep -q "layer 2: 0/6 blocks" "$UT/lk0" || fail "B alone: $(cat "$UT/lk0")"
"$CTL" --socket "$SOCK_B" lookup --peer "$UCX_A" --model $M --block $Bk --tokens "$UT/tok" \
  --layers 1,2 >"$UT/lk1" || fail "lookup --peer on B"
grep -q "layer 1: 6/6 blocks" "$UT/lk1" && grep -q "layer 2: 6/6 blocks" "$UT/lk1" \
  || fail "lookup --peer: $(cat "$UT/lk1")"
"$CTL" --socket "$SOCK_B" get --peer "$UCX_A" --model $M --layer 2 --hash "${H[3]}" \
  --out "$UT/p.bin" >/dev/null || fail "get --peer on B"
cmp -s "$UT/p.bin" "$UT/rows2/row-3.bin" || fail "row read through B differs"
expect_eq "$(ucxd_metric B "mapflowd_peer_fetched_rows_total{peer=\"$UCX_A\"}")" 1 "rows B pulled"
"$CTL" --socket "$SOCK_B" get --model $M --layer 2 --hash "${H[3]}" --out "$UT/p2.bin" \
  >/dev/null || fail "B keeps the row it read through"
cmp -s "$UT/p2.bin" "$UT/rows2/row-3.bin" || fail "cached row differs"
echo "B: lookup --peer 6/6 per layer, get --peer identical and cached"

# ---- one Python channel on ucx: modes, leases, put, kill, restart ----------------------
cat >"$UT/drive.py" <<'PY'
import struct, sys, time
import mapflow
ucx, token, tok, ut = sys.argv[1:5]
tokens = list(struct.unpack("<96I", open(tok, "rb").read()))
want = {(L, i): open("%s/rows%d/row-%d.bin" % (ut, L, i), "rb").read()
        for L in (1, 2, 3) for i in range(6)}
ch = mapflow.Channel("ucx:" + ucx, token=token, timeout_ms=10000,
                     retry={"max_retries": 0, "initial_backoff_ms": 10, "max_backoff_ms": 50})
assert not ch.has_arena, "a ucx channel maps no arena"
assert ch.info()["host_arena_bytes"] > 0, ch.info()
for lease in (False, True):
    with ch.get_prefix("ucxm", 16, tokens, [1, 2], lease=lease) as r:
        assert len(r) == 12, len(r)
        for k, row in enumerate(r):
            L, i = 1 + k // 6, k % 6
            assert row.ok and row.lease_id == 0, (lease, k, row)
            assert bytes(row.data) == want[(L, i)], ("bytes differ", lease, L, i)
# The Releases went out on the same endpoint before the Stats request: none is left.
leases = ch.stats()["counters"].get("leases")
assert leases == 0, "daemon still holds %r leases" % leases
try:
    ch.get_lease("ucxm", 1, mapflow.hash_prefix("default", "ucxm", 16, tokens)[0])
    raise AssertionError("mf_get_lease worked on ucx")
except mapflow.MapflowError as e:
    assert e.code == mapflow.FAILED_PRECONDITION, e
h3 = mapflow.hash_prefix("default", "ucxm", 16, tokens)
assert ch.put(want[(3, 0)]).tier == "host"
assert ch.get("ucxm", 3, h3[0]) == want[(3, 0)]
print("phase1 ok", flush=True)

print("kill", flush=True); sys.stdin.readline()
try:
    ch.get("ucxm", 3, h3[0])
    raise AssertionError("a get on a killed daemon succeeded")
except mapflow.MapflowError as e:
    assert e.code == mapflow.UNAVAILABLE, e
    print("after kill: %s" % e.status, flush=True)

print("restart", flush=True); sys.stdin.readline()
for attempt in range(100):  # fail-fast policy: a refused reconnect answers at once
    try:
        ch.put(want[(3, 1)])
        break
    except mapflow.MapflowError as e:
        assert e.code == mapflow.UNAVAILABLE, e
        time.sleep(0.05)
else:
    raise AssertionError("no reconnect after the restart")
assert ch.get("ucxm", 3, h3[1]) == want[(3, 1)]
info = ch.info()
assert info["connected"] and info["reconnects"] >= 1, info
print("reconnected reconnects=%d attempts=%d" % (info["reconnects"], attempt + 1), flush=True)
ch.close()
print("done", flush=True)
PY
coproc DRV { PYTHONPATH="$ROOT/client/python" MAPFLOW_LIB="$(cd "$MF_BIN/../lib" && pwd)/libmapflow.so" \
  timeout 60 "$PYTHON" -u "$UT/drive.py" "$UCX_A" "$TOKEN" "$UT/tok" "$UT" 2>&1; }
UCXD_EXTRA_CLEANUP="kill -KILL $DRV_PID 2>/dev/null || true"
expect_line() { # waits for the driver's next line, which must start with $1
  local line=""
  read -r -t 30 line <&"${DRV[0]}" || fail "driver said nothing while waiting for '$1'"
  echo "driver: $line"
  [[ "$line" == "$1"* ]] || fail "driver: expected '$1', got '$line'"
}
expect_line "phase1 ok"
expect_line "kill"
ucxd_kill A
echo go >&"${DRV[1]}"
expect_line "after kill: UNAVAILABLE"
expect_line "restart"
ucxd_start A2 --ucx "$UCX_A" --token "$TOKEN"
expect_eq "$UCX_A2" "$UCX_A" "restarted on the same address"
echo go >&"${DRV[1]}"
expect_line "reconnected"
expect_line "done"
wait "$DRV_PID" || fail "driver exited $?"
expect_eq "$(ucxd_metric A2 mapflowd_leases)" 0 "leases left on the restarted A"

ucxd_stop A2
ucxd_stop B
echo "client ucx: ok"
