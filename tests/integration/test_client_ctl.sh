#!/usr/bin/env bash
# mapflowctl, the rest (issue 5): put of many rows in one batch, ls paging (--pages,
# --page-token, the next token in text and JSON, every entry exactly once across pages),
# stats --interval with per-second rates (bounded by --count), profile put / get with
# --json decoding the profile, hash --json agreeing with the text form, JSON errors, and
# usage errors (exit 2) before connecting.
source "$(dirname "$0")/lib.sh"
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
NS=ctl2
M=ctl-src
Bk=16

mf_tokens "$MF_TMP/tok" $((12 * Bk)) 77
"$CTL" hash --ns "$NS" --model "$M" --block $Bk --tokens "$MF_TMP/tok" >"$MF_TMP/h.txt"
"$CTL" --json hash --ns "$NS" --model "$M" --block $Bk --tokens "$MF_TMP/tok" \
  | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
want = open(sys.argv[1]).read().split()
assert d["hashes"] == want and d["block_size"] == 16 and d["tokens"] == 192, d' "$MF_TMP/h.txt" \
  || fail "hash --json differs from the text form"

# Usage errors exit 2 before any connection is tried (no daemon yet).
for args in "ls --page-token xyz" "stats --count 3" "ls --interval 1" "stats --interval 0"; do
  rc=0; "$CTL" --socket "$MF_TMP/none.sock" $args >/dev/null 2>&1 || rc=$?
  expect_eq $rc 2 "usage error: $args"
done

mf_start
"$SYNTH" --model "$M" --layer 2 --block $Bk --heads 4 --tokens "$MF_TMP/tok" --codec fp16 \
  --top-p 0.9 --seed 9 --out "$MF_TMP/rows" --ns "$NS" >/dev/null
rows=(); for i in $(seq 0 11); do rows+=(--row "$MF_TMP/rows/row-$i.bin"); done
ctl --ns "$NS" --json put "${rows[@]}" >"$MF_TMP/put.json" || fail "put of 12 rows"
expect_eq "$(wc -l <"$MF_TMP/put.json")" 12 "put --json lines"
"$PYTHON" - "$MF_TMP/put.json" "$MF_TMP/h.txt" <<'PY' || fail "put --json content"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = open(sys.argv[2]).read().split()
assert [r["hash"] for r in rows] == want, rows
assert all(r["tier"] == "host" and r["replaced"] is False for r in rows), rows
PY

# Paging: 5 + 5 + 2, each entry once, the token handed from page to page.
tok=""; : >"$MF_TMP/seen"
for page in 1 2 3; do
  args=(--ns "$NS" --json ls --page-size 5 --pages 1)
  [ -n "$tok" ] && args+=(--page-token "$tok")
  ctl "${args[@]}" >"$MF_TMP/page.json" || fail "ls page $page"
  tok=$("$PYTHON" - "$MF_TMP/page.json" "$MF_TMP/seen" "$page" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
page = int(sys.argv[3])
assert len(d["entries"]) == (5 if page < 3 else 2), d
assert (d["next_page_token"] is None) == (page == 3), d
with open(sys.argv[2], "a") as f:
    for e in d["entries"]:
        f.write(e["hash"] + "\n")
print(d["next_page_token"] or "")
PY
) || fail "ls page $page content"
done
expect_eq "$(sort -u "$MF_TMP/seen" | wc -l)" 12 "distinct entries over the pages"
cmp -s <(sort "$MF_TMP/seen") <(sort "$MF_TMP/h.txt") || fail "pages differ from the rows put"
ctl --ns "$NS" ls --page-size 5 --pages 2 >"$MF_TMP/ls.txt" 2>"$MF_TMP/ls.err" || fail "ls --pages 2"
expect_eq "$(wc -l <"$MF_TMP/ls.txt")" 10 "text ls of two pages"
grep -q "^next page: --page-token [0-9a-f]\+$" "$MF_TMP/ls.err" || fail "next token on stderr: $(cat "$MF_TMP/ls.err")"
expect_eq "$(ctl --ns "$NS" ls --page-size 5 | wc -l)" 12 "ls of every page"

# stats --interval: N samples, rates from the second on (counters only), non-negative,
# counters monotonic.
ctl --json stats --interval 0.05 --count 3 >"$MF_TMP/stats.json" || fail "stats --interval"
"$PYTHON" - "$MF_TMP/stats.json" <<'PY' || fail "stats --interval output"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])]
assert len(s) == 3, len(s)
assert "rates" not in s[0] and all("rates" in x and x["interval_s"] > 0 for x in s[1:]), s
for a, b in zip(s, s[1:]):
    # rates for counters (Prometheus names: *_total, *_count), none for gauges
    assert set(b["rates"]) == {k for k in b["counters"]
                               if k.split("{")[0].endswith(("_total", "_count"))}, b
    assert "leases" in b["counters"] and "leases" not in b["rates"], b
    assert all(r >= 0 for r in b["rates"].values()), b
    assert all(b["counters"][k] >= a["counters"].get(k, 0) for k in b["counters"]), (a, b)
assert s[0]["counters"]["puts_total"] >= 12, s[0]
PY
# Captured first: `ctl | grep -q` under pipefail fails when grep exits early and ctl gets
# SIGPIPE writing the rest (a flake seen in make test).
rates=$(ctl stats --interval 0.05 --count 2) || fail "stats --interval (text)"
grep -q "puts_total .*/s$" <<<"$rates" || fail "text rates"

# Profiles: raw bytes in, the same bytes and a JSON decoding out.
MF_INT_DIR=$(dirname "$0") "$PYTHON" - "$MF_TMP/prof.pb" <<'PY'
import os, struct, sys
sys.path.insert(0, os.environ["MF_INT_DIR"])
from pbwire import f, s, v  # noqa: E402
w = struct.pack("<4f", 0.25, 0.75, 1.0, 0.0)
head = f(1, 0, v(1)) + f(3, 5, struct.pack("<f", 0.9))  # mode prob, top_p
layer = f(1, 0, v(5)) + f(2, 0, v(3)) + f(3, 0, v(2)) + f(4, 0, v(2)) + s(5, w) + \
    f(6, 5, struct.pack("<f", 0.125)) + s(7, head) + s(7, f(1, 0, v(2)))
prof = s(1, b"ctl-src") + s(2, b"ctl-tgt") + f(3, 0, v(16)) + f(4, 0, v(2)) + \
    f(5, 0, v(8)) + s(6, layer) + s(8, b"test_client_ctl")
open(sys.argv[1], "wb").write(prof)
PY
out=$(ctl --json profile put --file "$MF_TMP/prof.pb") || fail "profile put (exit)"
grep -q '"stored":true' <<<"$out" || fail "profile put"
ctl profile get --source ctl-src --target ctl-tgt --out "$MF_TMP/back.pb" >/dev/null || fail "profile get"
cmp -s "$MF_TMP/prof.pb" "$MF_TMP/back.pb" || fail "profile bytes differ"
ctl --json profile get --source ctl-src --target ctl-tgt | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
assert d["source_model"] == "ctl-src" and d["target_model"] == "ctl-tgt", d
assert d["block_size"] == 16 and d["l0"] == 2 and d["target_layers"] == 8, d
l = d["layers"][0]
assert (l["target_layer"], l["source_layer"], l["target_heads"], l["source_heads"]) == (5, 3, 2, 2), l
assert l["w"] == [0.25, 0.75, 1.0, 0.0] and l["error"] == 0.125, l
assert [h["mode"] for h in l["heads"]] == ["prob", "mask"] and abs(l["heads"][0]["top_p"] - 0.9) < 1e-6, l
assert d["created_by"] == "test_client_ctl", d' || fail "profile get --json"

# Errors in JSON mode: a status object on stdout, exit 1.
rc=0; ctl --json profile get --source ctl-src --target nobody >"$MF_TMP/err.json" 2>/dev/null || rc=$?
expect_eq $rc 1 "profile get of a missing profile"
"$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"]["status"] == "NOT_FOUND", d' \
  "$MF_TMP/err.json" || fail "JSON error object"
mf_stop
echo "test_client_ctl: ok"
