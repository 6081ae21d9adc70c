#!/usr/bin/env python3
"""k8s_negative: k8s_check's negative tests in one process (Python starts slowly).

    k8s_negative.py SRC_DIR < CASES

Each CASES line: FILE | PATH | OP | VALUE | EXPECTED  (split on '|', which no field
may contain; VALUE empty for del; blank lines and '#' lines skipped). For each case SRC_DIR is copied,
FILE (relative to it) is edited with k8s_mutate's PATH/OP/VALUE, and k8s_check must
reject the copy with an error containing EXPECTED. Prints one line per case and a
summary; exit 1 when a case was accepted, rejected for another reason or did not apply.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_check  # noqa: E402
import k8s_mutate  # noqa: E402


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    cases = [ln.rstrip("\n") for ln in sys.stdin if ln.strip() and not ln.lstrip().startswith("#")]
    n = ok = 0
    with tempfile.TemporaryDirectory() as tmp:
        for line in cases:
            n += 1
            parts = line.split("|")
            if len(parts) != 5:
                print(f"FAIL: case line needs 5 fields: {line!r}")
                continue
            fname, field, op, value, expect = (p.strip() for p in parts)
            work = os.path.join(tmp, f"case{n}")
            shutil.copytree(argv[1], work)
            try:
                k8s_mutate.mutate(os.path.join(work, fname), field, op, value or None)
            except (KeyError, ValueError) as e:
                print(f"FAIL: mutation {fname} {field} {op} did not apply: {e}")
                continue
            ck = k8s_check.Checker(None)
            ck.run([work])
            hits = [e for e in ck.errs if expect in e]
            if hits:
                ok += 1
                print(f"rejected as expected: {fname} {field} {op} {value} -> {hits[0].replace(work + '/', '')}")
            else:
                print(f"FAIL: {fname} {field} {op} {value} not rejected with {expect!r}; errors: {ck.errs}")
    print(f"k8s negative cases (in-process): {ok} of {n} rejected with the expected reason")
    return 0 if ok == n and n > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
