"""bench/quality/report.py's prob-mode study (issue 21, goal 3) on a synthetic
quality.json: one table row per (objective, prob gate) with the share of prob heads per
target layer, the dev-chosen profile of each objective marked, and the per-run summary
table (also for a run whose --sweeps left methods out). Standard library only."""
import json
import os
import random
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "quality"))
import report  # noqa: E402


def numbers(rng):
    d = rng.uniform(-1, 4)
    return {"dppl_pct": d, "kl": rng.uniform(0, 0.1), "agree_pct": rng.uniform(80, 100),
            "skipped_pct": rng.uniform(0, 60), "density": rng.uniform(0.2, 1),
            "ci": {"dppl_pct": [d - 0.5, d + 0.5]}, "windows": 3}


def result(rng, block):
    study = []
    for obj, gates in (("maps", (0.2, 0.3)), ("outputs", (0.05, 0.1, 0.2, 0.3))):
        for g in gates:
            per_layer = [rng.choice((0.0, 0.125, 0.5, 1.0)) for _ in range(8)]
            study.append({"variant": "cal-%s-prob%g-r0.97-php" % (obj[:3], g),
                          "objective": obj, "gate": g, "per_layer": per_layer,
                          "share": sum(per_layer) / 8, "dev": numbers(rng),
                          "in": numbers(rng), "out": numbers(rng)})
    pick = dict(study[3])  # outputs, gate 0.1
    return {"config": {"ctx": 8192, "block": block}, "operating_points": {},
            "verdict": {}, "train": {},
            "prob_mode": {"variant": pick["variant"], "per_layer": pick["per_layer"],
                          "in": pick["in"], "out": pick["out"], "study": study,
                          "by_objective": {"maps": {"variant": None}, "outputs": pick}}}


class ProbStudy(unittest.TestCase):
    def test_table_and_summary(self):
        rng = random.Random(21)
        res = result(rng, 64)
        text = report.prob_section(res)
        rows = [ln for ln in text.splitlines() if ln.startswith("| maps") or
                ln.startswith("| outputs")]
        self.assertEqual(len(rows), 6)
        chosen = [ln for ln in rows if "**yes**" in ln]
        self.assertEqual(len(chosen), 1)
        self.assertIn("| outputs | 0.1 |", chosen[0])
        want = " ".join("%.0f" % (100 * x) for x in res["prob_mode"]["study"][3]["per_layer"])
        self.assertIn(want, chosen[0])
        self.assertIn("maps objective: no profile of the study within", text)
        self.assertIn("outputs objective, dev-chosen at Δppl ≤ +2 %: gate 0.1", text)
        self.assertEqual(report.prob_section({"prob_mode": {"variant": None}}), "")
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for b in (64, 32):
                os.makedirs(os.path.join(d, "B%d" % b))
                paths.append(os.path.join(d, "B%d" % b, "quality.json"))
                with open(paths[-1], "w") as f:
                    json.dump(result(rng, b), f)
            s = report.summary(paths)
        runs = [ln for ln in s.splitlines() if ln.startswith("| first |") or
                ln.startswith("| B32 |")]
        self.assertEqual(len(runs), 2 + 4)  # the methods table, then 2 objectives × 2 runs
        self.assertTrue(any("| 32 | outputs | 0.1 |" in ln for ln in runs))
        self.assertTrue(any("| 64 | maps | none within +2 % on dev" in ln for ln in runs))
        # methods left out by --sweeps read "–", not "none"
        self.assertIn("| – | – | – |", runs[0])


if __name__ == "__main__":
    unittest.main()
