#!/usr/bin/env python3
"""Updates the results table of tests/RELIABILITY.md from rel_tool's RESULT lines.

    record.py RELIABILITY.md < output     (lines: RESULT|id|what|how|outcome)

Each id owns one table row (replaced in place, or appended); the date and the
command that produced it are stamped in. Rows of other ids are left as they are.
"""
import datetime
import os
import sys

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEAD = ["| id | fault or attack | how | what happened | run |",
        "|---|---|---|---|---|"]


def main():
    path = sys.argv[1]
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
