#!/usr/bin/env python3
"""Updates the results table of tests/RELIABILITY.md from rel_tool's RESULT lines.

    record.py RELIABILITY.md [MODE] < output   (lines: RESULT|id|what|how|outcome)
    record.py RELIABILITY.md --fuzz SECONDS build-fuzz/<target>.log ...

Each id owns one table row (replaced in place, or appended); the date and the
command that produced it are stamped in. Rows of other ids are left as they are.

Where the table goes: only with MF_RECORD=1 is the given RELIABILITY.md rewritten.
Otherwise (every plain `make test`) the rows go to $MF_BUILD/RELIABILITY-results.md
(else build/RELIABILITY-results.md), seeded from the given file on first use, so a test
run never leaves the tracked document modified.
"""
import datetime
import os
import re
import shutil
import sys


def target(path):
    """The file to update: `path` itself when MF_RECORD=1, else the build copy."""
    if os.environ.get("MF_RECORD") == "1":
        return path
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_dir = os.environ.get("MF_BUILD") or os.path.join(root, "build")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "RELIABILITY-results.md")
    if not os.path.exists(out) and os.path.exists(path):
        shutil.copyfile(path, out)
    return out

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEAD = ["| id | fault or attack | how | what happened | run |",
        "|---|---|---|---|---|"]


FBEGIN, FEND = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"
FHEAD = ["| target | seconds | executions | cov | features | corpus | run |",
         "|---|---|---|---|---|---|---|"]


def fuzz(path, seconds, logs):
    """Rows of the fuzz table from libFuzzer logs (build-fuzz/<target>.log)."""
    new = {}
    for log in logs:
        name = os.path.basename(log)[:-4]
        execs = cov = ft = corp = None
        for line in open(log, errors="replace"):
            if line.startswith("stat::number_of_executed_units:"):
                execs = int(line.split(":")[-1])
            m = re.search(r"cov: (\d+) ft: (\d+) corp: (\d+)", line)
            if m:
                cov, ft, corp = m.groups()
        if execs is not None:
            new[name] = [name, seconds, str(execs), cov or "?", ft or "?", corp or "?",
                         datetime.date.today().isoformat()]
    text = open(path).read()
    pre, rest = text.split(FBEGIN, 1)
    body, post = rest.split(FEND, 1)
    rows = {r.split("|")[1].strip(): r for r in body.strip().splitlines()
            if r.startswith("| ") and r not in FHEAD}
    for k, cells in new.items():
        rows[k] = "| " + " | ".join(cells) + " |"
    out = FHEAD + [rows[k] for k in sorted(rows)]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(pre + FBEGIN + "\n" + "\n".join(out) + "\n" + FEND + post)
    os.replace(tmp, path)
    return 0


def main():
    path = target(sys.argv[1])
    if len(sys.argv) > 3 and sys.argv[2] == "--fuzz":
        return fuzz(path, sys.argv[3], sys.argv[4:])
    mode = sys.argv[2] if len(sys.argv) > 2 else "make test"
    new = {}
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line.startswith("RESULT|"):
            parts = line.split("|", 4)
            if len(parts) == 5:
                new[parts[1]] = [p.replace("|", "/") for p in parts[1:]]
    if not new:
        return 0
    text = open(path).read() if os.path.exists(path) else BEGIN + "\n" + END + "\n"
    if BEGIN not in text or END not in text:
        text += "\n" + BEGIN + "\n" + END + "\n"
    pre, rest = text.split(BEGIN, 1)
    body, post = rest.split(END, 1)
    rows = [l for l in body.strip().splitlines() if l.startswith("| ") and l not in HEAD]
    stamp = "%s, %s" % (datetime.date.today().isoformat(), mode)
    seen = set()
    out = []
    for r in rows:
        rid = r.split("|")[1].strip()
        if rid in new:
            out.append("| " + " | ".join(new[rid] + [stamp]) + " |")
            seen.add(rid)
        else:
            out.append(r)
    for rid, cells in new.items():
        if rid not in seen:
            out.append("| " + " | ".join(cells + [stamp]) + " |")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(pre + BEGIN + "\n" + "\n".join(HEAD + out) + "\n" + END + post)
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
