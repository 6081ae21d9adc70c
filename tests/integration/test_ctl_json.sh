#!/usr/bin/env bash
# mapflowctl's contract (issue 24): --json output parsed for every command, successes and
# failures alike (usage, cannot connect, daemon errors, bad files): stdout holds JSON only,
# a failure is {"error":{"code","status","message"}} with the documented exit status, and
# no message repeats its status. Also: one `ls --json` shape, the command table behind
# `help`, `CMD --help` and the manual, the daemon's block-size rule and size grammar,
# control characters escaped in plain `ls`, `profile put` saying what it stored, and the
# compact `stats --interval` view (rates for counters only).
source "$(dirname "$0")/lib.sh"
SYNTH=$MF_BIN/mapflow-synth
[ -x "$SYNTH" ] || fail "mapflow-synth not built ($SYNTH)"
NS=ctljson
M='ctl\json'   # a backslash: legal in a model name, escaped by plain ls
Bk=16

mf_tokens "$MF_TMP/tok" $((5 * Bk + 7)) 1234
MF_INT_DIR=$(dirname "$0") "$PYTHON" - "$MF_TMP/prof.pb" <<'PY'
import os, struct, sys
sys.path.insert(0, os.environ["MF_INT_DIR"])
from pbwire import f, s, v  # noqa: E402
layer = f(1, 0, v(4)) + f(2, 0, v(1)) + f(3, 0, v(1)) + f(4, 0, v(1)) + \
    s(5, struct.pack("<f", 1.0)) + s(7, f(1, 0, v(2)))
prof = s(1, b"json-src") + s(2, b"json-tgt") + f(3, 0, v(16)) + f(4, 0, v(2)) + \
    f(5, 0, v(6)) + s(6, layer) + s(6, layer) + s(8, b"test_ctl_json")
open(sys.argv[1], "wb").write(prof)
# profile ls: five more, random names and shapes (the listing must echo them, sorted)
import json, os, random
rng = random.Random(os.urandom(8))
made = []
for i in range(5):
    src = "src-%d-%08x" % (i, rng.getrandbits(32))
    tgt = "tgt-%08x" % rng.getrandbits(32)
    blk, nl = rng.choice([16, 32, 64]), rng.randint(1, 4)
    layers = b"".join(s(6, layer) for _ in range(nl))
    p = s(1, src.encode()) + s(2, tgt.encode()) + f(3, 0, v(blk)) + f(4, 0, v(1)) + \
        f(5, 0, v(nl + 1)) + layers + s(8, ("by-%d" % i).encode())
    open("%s.%d" % (sys.argv[1], i), "wb").write(p)
    made.append({"source_model": src, "target_model": tgt, "block_size": blk,
                 "mapped_layers": nl, "target_layers": nl + 1, "encoded_bytes": len(p),
                 "created_by": "by-%d" % i, "l0": 1})
json.dump(made, open(sys.argv[1] + ".json", "w"))
PY
head -c 300 /dev/urandom >"$MF_TMP/junk.pb"

# Phase 1: no daemon (usage errors, cannot connect, hash, help).
"$PYTHON" - "$CTL" "$MF_TMP" "$M" <<'PY' || fail "phase 1 (no daemon)"
import json, re, subprocess, sys
ctl, tmp, model = sys.argv[1:4]
none = ["--socket", tmp + "/none.sock"]

def run(args, rc_want):
    p = subprocess.run([ctl] + args, capture_output=True, text=True, timeout=60)
    assert p.returncode == rc_want, (args, p.returncode, p.stdout, p.stderr)
    return p

def err(args, rc_want, status):
    p = run(["--json"] + args, rc_want)
    lines = p.stdout.splitlines()
    assert len(lines) == 1, (args, p.stdout)
    e = json.loads(lines[0])["error"]
    assert e["status"] == status and isinstance(e["code"], int) and e["code"] > 0, (args, e)
    assert e["message"] and status + ": " not in e["message"], (args, e)
    assert p.stderr and (status + ": " + status) not in p.stderr, (args, p.stderr)
    return e

# cannot connect: exit 3, UNAVAILABLE, the same object for every daemon command
for cmd in (["health"], ["stats"], ["ls"], ["flush"], ["config", "get"],
            ["profile", "get", "--source", "a", "--target", "b"]):
    e = err(none + cmd, 3, "UNAVAILABLE")
    # (stats is an admin command: it names the admin socket beside none.sock)
    assert ("none-admin.sock" if cmd == ["stats"] else "none.sock") in e["message"], e
# usage errors: exit 2, INVALID_ARGUMENT, before any connection is tried
for args in (["ls", "--peer", "h:1"], ["stats", "--count", "2"], ["frobnicate"],
             ["profile"], ["profile", "frob"], ["profile", "ls", "--page-size", "x"],
             ["profile", "ls", "--page-token", "zz"], ["config", "set", "k"], ["get", "--model", "x"],
             ["evict", "--tier", "host", "--bytes", "12parsecs"], ["--timeout", "soon", "health"],
             ["hash", "--model", "m", "--block", "7", "--tokens", tmp + "/tok"],
             ["lookup", "--model", "m", "--block", "24", "--tokens", tmp + "/tok",
              "--layers", "0"]):
    err(none + args, 2, "INVALID_ARGUMENT")
e = err(none + ["hash", "--model", "m", "--block", "7", "--tokens", tmp + "/tok"], 2,
        "INVALID_ARGUMENT")
assert "power of two" in e["message"], e
# a file that does not exist: NOT_FOUND, exit 2
err(none + ["hash", "--model", "m", "--block", "16", "--tokens", tmp + "/nope"], 2, "NOT_FOUND")
# hash --json needs no daemon; the daemon's sizes pass (512b) the option parser
d = json.loads(run(["--json", "hash", "--model", model, "--block", "16", "--tokens",
                    tmp + "/tok"], 0).stdout)
assert d["block_size"] == 16 and d["tokens"] == 87 and len(d["hashes"]) == 5, d

# The command table: the manual's COMMANDS, `help CMD` and `CMD --help` agree.
man = run(["--help"], 0).stdout
assert run(["help"], 0).stdout == man
section = man.split("COMMANDS\n")[1].split("\nOPTIONS\n")[0]
synopses = [l[4:] for l in section.splitlines() if l.startswith("    ") and l[4] != " "]
names = []
for syn in synopses:
    words = syn.split()
    name = words[:2] if words[0] in ("config", "profile") else words[:1]
    names.append(name)
    h = run(name + ["--help"], 0).stdout
    assert h.startswith("usage: mapflowctl [OPTIONS] " + syn + "\n"), (name, h)
    assert run(["help"] + name, 0).stdout == h, name
assert ["health"] in names and ["profile", "put"] in names and ["help"] in names, names
assert len(names) >= 14, names
print("phase 1: %d commands in the table, errors as JSON" % len(names))
PY

# Phase 2: a daemon.
mf_start --host_bytes 8mb
"$SYNTH" --model "$M" --layer 1 --block $Bk --heads 2 --tokens "$MF_TMP/tok" --codec fp16 \
  --top-p 0.9 --seed 5 --out "$MF_TMP/rows" --ns "$NS" >/dev/null
cp "$MF_TMP/rows/row-1.bin" "$MF_TMP/bad.bin"
printf '\x55' | dd of="$MF_TMP/bad.bin" bs=1 seek=200 conv=notrunc 2>/dev/null

"$PYTHON" - "$CTL" "$MF_SOCK" "$MF_TMP" "$M" "$NS" <<'PY' || fail "phase 2 (daemon)"
import json, subprocess, sys
ctl, sock, tmp, model, ns = sys.argv[1:6]
base = ["--socket", sock, "--ns", ns]

def run(args, rc_want, json_mode=True):
    p = subprocess.run([ctl] + base + (["--json"] if json_mode else []) + args,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == rc_want, (args, p.returncode, p.stdout, p.stderr)
    return p

def ok(args):
    return json.loads(run(args, 0).stdout)

def err(args, rc_want, status):
    p = run(args, rc_want)
    objs = [json.loads(l) for l in p.stdout.splitlines()]
    errs = [o["error"] for o in objs if "error" in o]
    assert errs, (args, p.stdout)
    for e in errs:
        assert e["status"] == status, (args, e)
        assert status + ": " not in e["message"], (args, e)  # the status is said once
    return errs

rows = sum((["--row", "%s/rows/row-%d.bin" % (tmp, i)] for i in range(5)), [])
put = [json.loads(l) for l in run(["put"] + rows, 0).stdout.splitlines()]
assert len(put) == 5 and all(p["model"] == model and p["tier"] == "host" for p in put), put
p = run(["put", "--row", tmp + "/bad.bin"], 1)
bad = json.loads(p.stdout.splitlines()[0])["error"]
assert bad["status"] in ("DATA_LOSS", "INVALID_ARGUMENT") and "bad.bin" in bad["message"], bad

# ls: one shape with and without --pages
for extra in ([], ["--pages", "1"], ["--page-size", "2"]):
    d = ok(["ls"] + extra)
    assert set(d) == {"entries", "next_page_token"}, d
d = ok(["ls", "--page-size", "2", "--pages", "1"])
assert len(d["entries"]) == 2 and d["next_page_token"], d
assert len(ok(["ls"])["entries"]) == 5
plain = run(["ls"], 0, json_mode=False).stdout.splitlines()
assert len(plain) == 5 and all(l.startswith("ctl\\x5cjson\t1\t") for l in plain), plain

h = put[2]["hash"]
g = ok(["get", "--model", model, "--layer", "1", "--hash", h, "--out", tmp + "/g.bin"])
assert g["size"] == put[2]["size"] and g["out"] == tmp + "/g.bin", g
assert open(tmp + "/g.bin", "rb").read() == open(tmp + "/rows/row-2.bin", "rb").read()
err(["get", "--model", model, "--layer", "9", "--hash", h, "--out", tmp + "/x.bin"], 1,
    "NOT_FOUND")
lk = ok(["lookup", "--model", model, "--block", "16", "--tokens", tmp + "/tok", "--layers",
         "1,2"])
assert lk["layers"] == {"1": 5, "2": 0} and lk["total_blocks"] == 5, lk
st = ok(["stats"])
assert st["counters"]["puts_total"] >= 5 and "leases" in st["counters"], st
assert ok(["health"])["ok"] is True
c = ok(["config", "get", "lease_ttl"])
assert "lease_ttl" in c, c
e = err(["config", "get", "no_such_key"], 1, "NOT_FOUND")
assert e[0]["message"].startswith("config get: "), e
err(["config", "set", "lease_ttl", "banana"], 1, "INVALID_ARGUMENT")
assert ok(["config", "set", "lease_ttl", "45s"])["lease_ttl"]["value"] == "45s"
ev = ok(["evict", "--tier", "host", "--bytes", "512b"])
assert ev["entries"] >= 1 and ev["bytes"] >= 512, ev
err(["evict", "--tier", "gpu"], 1, "FAILED_PRECONDITION")
# profiles: put says what it stored; a file that is no profile never reaches the daemon
pp = ok(["profile", "put", "--file", tmp + "/prof.pb"])
assert pp["stored"] is True and (pp["source_model"], pp["target_model"]) == ("json-src", "json-tgt"), pp
assert pp["layers"] == 2 and pp["block_size"] == 16 and pp["ns"] == ns, pp
text = run(["profile", "put", "--file", tmp + "/prof.pb"], 0, json_mode=False).stdout
assert text.startswith("stored profile json-src -> json-tgt (namespace %s, block 16, 2 layers" % ns), text
err(["profile", "put", "--file", tmp + "/junk.pb"], 2, "INVALID_ARGUMENT")
assert ok(["profile", "get", "--source", "json-src", "--target", "json-tgt"])["layers"]
err(["profile", "get", "--source", "json-src", "--target", "nobody"], 1, "NOT_FOUND")
# profile ls: this namespace's profiles only, in key order (each name shorter first,
# then bytewise: the names are length-prefixed in the key), every page
made = json.load(open(tmp + "/prof.pb.json"))
for i in range(len(made)):
    ok(["profile", "put", "--file", "%s/prof.pb.%d" % (tmp, i)])
first = dict(source_model="json-src", target_model="json-tgt", block_size=16, l0=2,
             target_layers=6, mapped_layers=2, created_by="test_ctl_json",
             encoded_bytes=len(open(tmp + "/prof.pb", "rb").read()))
want = sorted(made + [first], key=lambda d: (len(d["source_model"]), d["source_model"],
                                             len(d["target_model"]), d["target_model"]))
ls = ok(["profile", "ls"])
assert ls == {"profiles": want, "next_page_token": None}, ls
pg = ok(["profile", "ls", "--page-size", "2", "--pages", "1"])
assert pg["profiles"] == want[:2] and pg["next_page_token"], pg
rest = ok(["profile", "ls", "--page-size", "2", "--page-token", pg["next_page_token"]])
assert rest == {"profiles": want[2:], "next_page_token": None}, rest
text = run(["profile", "ls"], 0, json_mode=False).stdout.splitlines()
assert [l.split("\t")[:2] for l in text] == \
    [[d["source_model"], d["target_model"]] for d in want], text
other = subprocess.run([ctl, "--socket", sock, "--ns", ns + "-other", "--json", "profile",
                        "ls"], capture_output=True, text=True, timeout=60)
assert other.returncode == 0 and json.loads(other.stdout) == \
    {"profiles": [], "next_page_token": None}, other
err(["profile", "ls", "--page-size", "1001"], 1, "INVALID_ARGUMENT")
print("profile ls:", len(want), "profiles,", len(pg["profiles"]), "on page 1")
assert ok(["del", "--model", model, "--layer", "1", "--hash", h])["deleted"] == 1
assert ok(["flush"])["entries"] >= 1
assert ok(["ls"]) == {"entries": [], "next_page_token": None}

# stats --interval, text: compact (fewer lines than counters), rates only on counters
p = run(["stats", "--interval", "0.05", "--count", "2"], 0, json_mode=False).stdout
n_counters = len(st["counters"])
lines = p.splitlines()
assert len(lines) < n_counters, (len(lines), n_counters, p)
rated = [l for l in lines if l.endswith("/s")]
assert rated and all(l.split()[0].split("{")[0].endswith(("_total", "_count")) for l in rated), p
assert any("gauges:" in l and "leases" in l for l in lines) and "leases 0/s" not in p, p
print("phase 2: every command's --json parsed, failures included")
PY
mf_stop
echo "test_ctl_json: ok"
