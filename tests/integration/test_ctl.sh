#!/usr/bin/env bash
# mapflowctl against a real mapflowd: hash agrees with the independent Python
# implementation, exit codes (2 usage, 3 cannot connect, 1 daemon error), put/get round
# trip with cmp on the host and SSD tiers, lookup of partial prefixes, ls, del, evict,
# evict --tier gpu and stats' why_off with the GPU tier off,
# config get/set, flush, --json output, TCP with and without the token, SIGTERM exit 0.
source "$(dirname "$0")/lib.sh"
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
NS=ctl-ns
M=src-ctl
Bk=16

# --- no daemon needed ---------------------------------------------------------------
mf_tokens "$MF_TMP/tok" $((6 * Bk + 3)) 41
"$CTL" hash --ns "$NS" --model "$M" --block $Bk --tokens "$MF_TMP/tok" >"$MF_TMP/h.c"
"$PYTHON" - "$MF_TMP/tok" "$NS" "$M" $Bk >"$MF_TMP/h.py" <<EOF
import struct, sys
sys.path.insert(0, "$(cd "$(dirname "$0")/../python" && pwd)")
import prefix_hash
data = open(sys.argv[1], "rb").read()
toks = list(struct.unpack("<%dI" % (len(data) // 4), data))
for h in prefix_hash.prefix(sys.argv[2], sys.argv[3], int(sys.argv[4]), toks):
    print(prefix_hash.hexof(h))
EOF
expect_eq "$(wc -l <"$MF_TMP/h.c")" 6 "hash lines (full blocks only)"
cmp -s "$MF_TMP/h.c" "$MF_TMP/h.py" || fail "mapflowctl hash differs from the Python reference"

rc=0; "$CTL" frobnicate >/dev/null 2>&1 || rc=$?
expect_eq $rc 2 "unknown command exit code"
rc=0; "$CTL" get --model x >/dev/null 2>&1 || rc=$?
expect_eq $rc 2 "missing option exit code"
rc=0; "$CTL" --socket "$MF_TMP/none.sock" health >/dev/null 2>&1 || rc=$?
expect_eq $rc 3 "cannot-connect exit code"
"$CTL" --help | grep -q "EXIT STATUS" || fail "--help lacks the man-style sections"

# --- daemon -------------------------------------------------------------------------
mf_start --tcp 127.0.0.1:0 --token tok-ctl --host_bytes 8mb
[ -n "$MF_TCP_PORT" ] || fail "no tcp port in the daemon log"
ctl --ns "$NS" health >/dev/null || fail "health"
ctl --json health | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] is True, d'

"$SYNTH" --model "$M" --layer 3 --block $Bk --heads 4 --tokens "$MF_TMP/tok" --codec fp16 \
  --top-p 0.9 --seed 5 --out "$MF_TMP/rows" --ns "$NS" >/dev/null
n_rows=$(ls "$MF_TMP/rows" | wc -l)
expect_eq "$n_rows" 6 "synth rows"
for i in 0 1 2 3 4 5; do
  flags=(); [ $i -lt 2 ] && flags=(--durable)
  ctl --ns "$NS" put --row "$MF_TMP/rows/row-$i.bin" "${flags[@]}" >/dev/null || fail "put row $i"
done
expect_eq "$(ctl --ns "$NS" ls | wc -l)" 6 "ls entries"
expect_eq "$(ctl --ns other ls | wc -l)" 0 "ls in another namespace"

ctl --ns "$NS" lookup --model "$M" --block $Bk --tokens "$MF_TMP/tok" --layers 3,4 >"$MF_TMP/lk"
grep -q "layer 3: 6/6 blocks" "$MF_TMP/lk" || fail "lookup layer 3: $(cat "$MF_TMP/lk")"
grep -q "layer 4: 0/6 blocks" "$MF_TMP/lk" || fail "lookup layer 4: $(cat "$MF_TMP/lk")"

get_cmp() { # get_cmp I: fetch row I by its hash and compare with the file put
  local h; h=$(sed -n "$(($1 + 1))p" "$MF_TMP/h.c")
  ctl --ns "$NS" get --model "$M" --layer 3 --hash "$h" --out "$MF_TMP/got-$1" >/dev/null \
    || fail "get row $1"
  cmp -s "$MF_TMP/got-$1" "$MF_TMP/rows/row-$1.bin" || fail "row $1 bytes differ"
}
for i in 0 3 5; do get_cmp $i; done

# A hole at block 3 cuts the prefix to 3 blocks.
ctl --ns "$NS" del --model "$M" --layer 3 --hash "$(sed -n 4p "$MF_TMP/h.c")" | grep -q "deleted 1" \
  || fail "del one key"
ctl --ns "$NS" --json lookup --model "$M" --block $Bk --tokens "$MF_TMP/tok" --layers 3 \
  | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["layers"]["3"] == 3 and d["total_blocks"] == 6, d'

# SSD tier: demote everything from host, then read back identical bytes.
ctl --ns "$NS" evict --tier host --bytes 1g >/dev/null || fail "evict"
ctl --ns "$NS" --json ls | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
e = d["entries"]
assert d["next_page_token"] is None, d
assert len(e) == 5 and all(x["tier"] == "ssd" for x in e), e'
for i in 0 4 5; do get_cmp $i; done

# Config: a live key changes, a restart-only key is refused (exit 1), a bad value too.
ctl config set lease_ttl 12s >/dev/null || fail "config set lease_ttl"
ctl config get lease_ttl | grep -q "lease_ttl" || fail "config get lease_ttl"
rc=0; ctl config set host_bytes 2gb >/dev/null 2>&1 || rc=$?
expect_eq $rc 1 "config set of a non-live key"
rc=0; ctl config set lease_ttl banana >/dev/null 2>&1 || rc=$?
expect_eq $rc 1 "config set of a bad value"
ctl --json config get | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert "host_bytes" in d and "lease_ttl" in d, d'

# TCP: the token is required.
rc=0; "$CTL" --addr 127.0.0.1:"$MF_TCP_PORT" health >/dev/null 2>&1 || rc=$?
expect_eq $rc 1 "tcp without token"
"$CTL" --addr 127.0.0.1:"$MF_TCP_PORT" --token tok-ctl --ns "$NS" ls | wc -l | grep -qx 5 \
  || fail "tcp with token"

ctl --json stats | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["counters"], d'
# The GPU tier is off here (gpu_bytes 0): stats says why, evict --tier gpu says it is off.
ctl stats >"$MF_TMP/stats.txt" || fail "stats"
grep -q '^tier gpu  off .*(off: .\+)$' "$MF_TMP/stats.txt" || fail "stats lacks the gpu tier's why_off: $(cat "$MF_TMP/stats.txt")"
grep '^tier host' "$MF_TMP/stats.txt" | grep -q 'off:' && fail "host tier (on) printed a why_off"
ctl --json stats | "$PYTHON" -c '
import json, sys
t = {x["tier"]: x for x in json.load(sys.stdin)["tiers"]}
assert t["gpu"]["enabled"] is False and t["gpu"]["why_off"], t
assert "why_off" not in t["host"], t'
rc=0; ctl --ns "$NS" evict --tier gpu >/dev/null 2>"$MF_TMP/evict-gpu.err" || rc=$?
expect_eq $rc 1 "evict --tier gpu with the GPU tier off"
grep -q "GPU tier is off" "$MF_TMP/evict-gpu.err" || fail "evict --tier gpu: $(cat "$MF_TMP/evict-gpu.err")"
ctl --ns "$NS" flush | grep -q "flushed 5" || fail "flush"
expect_eq "$(ctl --ns "$NS" ls | wc -l)" 0 "ls after flush"
rc=0; ctl --ns "$NS" get --model "$M" --layer 3 --hash "$(sed -n 1p "$MF_TMP/h.c")" \
  --out "$MF_TMP/x" >/dev/null 2>&1 || rc=$?
expect_eq $rc 1 "get after flush"
mf_stop
echo "test_ctl: ok"
