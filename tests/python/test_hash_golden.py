"""Checks the golden prefix-hash table in proto/README.md against an independent
Python implementation (tests/python/prefix_hash.py), and that the table covers every
case. The C implementation is checked against the same numbers by test_proto_hash.c."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import prefix_hash as P  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GoldenTable(unittest.TestCase):
    def test_table_matches_independent_implementation(self):
        with open(os.path.join(ROOT, "proto", "README.md"), encoding="utf-8") as f:
            text = f.read()
        rows = re.findall(r"^\| (\d+) \| `([^`]*)` \| `([^`]*)` \| (\d+) \| [^|]* \| `([0-9a-f]{32})` \| (\d+) \| `([0-9a-f]{32})` \|$",
                          text, re.M)
        expected = sum(len(t) // b for _, _, b, t in P.CASES)
        self.assertEqual(len(rows), expected)
        for case, ns, model, b, root_hex, block, h_hex in rows:
            cns, cmodel, cb, toks = P.CASES[int(case)]
            self.assertEqual((ns, model, int(b)), (cns, cmodel, cb))
            self.assertEqual(root_hex, P.hexof(P.root(cb, cns, cmodel)))
            self.assertEqual(h_hex, P.hexof(P.prefix(cns, cmodel, cb, toks)[int(block)]))

    def test_changes_propagate(self):
        toks = list(range(1000, 1000 + 64 * 4))
        base = P.prefix("ns", "model", 64, toks)
        changed = list(toks)
        changed[64 + 5] += 1
        other = P.prefix("ns", "model", 64, changed)
        self.assertEqual(base[0], other[0])
        for i in range(1, 4):
            self.assertNotEqual(base[i], other[i])


if __name__ == "__main__":
    unittest.main()
