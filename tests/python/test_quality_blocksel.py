"""bench/quality/blocksel.py (issue 21) against independent brute-force NumPy on random
inputs: XAttention's antidiagonal scores and τ selection, the per-head Top-P calibration of
the random-W control, target-side selections as mask rows (read back, and accepted by the
C row decoder), the calibration/dev split, the window bootstrap and the dev-chosen
operating point. NumPy only (no torch), a few seconds."""
import ctypes as C
import math
import os
import sys
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "quality"))
import blocksel as S  # noqa: E402


def brute_topp(row, forced, cand, p):
    """Selection of one query-block row: forced blocks, then candidates by mass (ties to
    the lower index) while the mass taken so far is below p of the candidates' total."""
    tot = sum(row[j] for j in range(len(row)) if cand[j])
    take = set(j for j in range(len(row)) if forced[j])
    acc = sum(row[j] for j in take)
    others = sorted((j for j in range(len(row)) if cand[j] and not forced[j]),
                    key=lambda j: (-row[j], j))
    for j in others:
        if acc < p * tot or p >= 1.0:
            take.add(j)
            acc += row[j]
    return take


class XAttention(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(21)

    def brute_scores(self, q, k, b, st):
        n, h, d = q.shape
        m = n // st
        out = np.zeros((h, n // b, n // b))
        for hh in range(h):
            s = np.full((m, m), -np.inf)
            for i in range(m):
                for j in range(i + 1):
                    s[i, j] = sum(float(q[i * st + st - 1 - x, hh] @ k[j * st + x, hh])
                                  for x in range(st)) / (math.sqrt(d) * st)
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            c = b // st
            for i in range(m):
                for j in range(m):
                    out[hh, i // c, j // c] += p[i, j]
        return out

    def test_scores_match_brute_force(self):
        for n, b, st, h, d in ((64, 16, 4, 2, 8), (96, 32, 8, 3, 4), (48, 16, 16, 1, 16)):
            q = self.rng.standard_normal((n, h, d)).astype(np.float32) * 2
            k = self.rng.standard_normal((n, h, d)).astype(np.float32) * 2
            got = S.xattn_scores(q, k, b, st)
            want = self.brute_scores(q, k, b, st)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # fp32 products
            # each query block's cells hold B/S softmax rows
            np.testing.assert_allclose(got.sum(-1), b // st, rtol=1e-9)
            self.assertGreater(np.abs(got - np.eye(n // b)).max(), 0.1)  # not trivial
            self.assertTrue((np.triu(np.ones((n // b, n // b)), 1)[None] * got == 0).all())

    def test_keep_matches_brute_force(self):
        n, b, st, h, d = 128, 16, 4, 3, 8
        q = self.rng.standard_normal((n, h, d)).astype(np.float32) * 3
        k = self.rng.standard_normal((n, h, d)).astype(np.float32) * 3
        sc = S.xattn_scores(q, k, b, st)  # checked above; here the selection
        nb = n // b
        for tau in (0.5, 0.8, 0.95, 1.0):
            keep = S.xattn_keep(q, k, b, st, tau)
            for hh in range(h):
                for i in range(nb):
                    forced = [j == 0 or j == i for j in range(i + 1)]
                    want = brute_topp(sc[hh, i, :i + 1], forced, [True] * (i + 1), tau)
                    got = set(np.nonzero(keep[hh, i])[0].tolist())
                    self.assertEqual(got, want, (tau, hh, i))
        dens = [S.xattn_keep(q, k, b, st, t).sum() for t in (0.5, 0.8, 0.95)]
        self.assertTrue(dens[0] <= dens[1] <= dens[2])

    def test_torch_scores_agree(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        q = self.rng.standard_normal((256, 3, 16)).astype(np.float32) * 2
        k = self.rng.standard_normal((256, 3, 16)).astype(np.float32) * 2
        got = S.xattn_scores_torch(torch, torch.from_numpy(q), torch.from_numpy(k), 32, 8)
        np.testing.assert_allclose(got, S.xattn_scores(q, k, 32, 8), rtol=1e-5, atol=1e-7)

    def test_bad_stride(self):
        q = np.ones((64, 1, 4), np.float32)
        with self.assertRaises(ValueError):
            S.xattn_scores(q, q, 16, 5)


class Calibration(unittest.TestCase):
    def test_top_p_matches_brute_force(self):
        rng = np.random.default_rng(5)
        hs, ht, nb = 3, 2, 6
        src, tgt = [], []
        for _ in range(3):
            a = rng.gamma(0.3, size=(hs, nb, nb)) * np.tril(np.ones((nb, nb)))
            src.append(a / a.sum(-1, keepdims=True))
            t = rng.gamma(0.3, size=(ht, nb, nb)) * np.tril(np.ones((nb, nb)))
            tgt.append(t / t.sum(-1, keepdims=True))
        w = rng.dirichlet(np.ones(hs), size=ht).astype(np.float32)
        w[0, 1] = 0.0  # a source head that does not count for head 0
        src_p, want_r = 0.9, 0.9
        top_p, rec = S.calibrate_top_p(src, tgt, w, src_p, want_r)
        # brute force: recall at every grid point, smallest reaching want_r
        for h in range(ht):
            recs = []
            for p in S.TOPP_GRID:
                num = den = 0.0
                for sm, tm in zip(src, tgt):
                    for i in range(1, nb):
                        kept = [brute_topp(sm[s, i, :i + 1], [j == 0 or j == i for j in
                                                              range(i + 1)],
                                           [True] * (i + 1), src_p) for s in range(hs)]
                        cand = [any(j in kept[s] for s in range(hs) if w[h, s] > 0)
                                for j in range(i + 1)]
                        mix = [sum(w[h, s] * sm[s, i, j] for s in range(hs))
                               for j in range(i + 1)]
                        sel = brute_topp(mix, [j == 0 or j == i for j in range(i + 1)],
                                         cand, p)
                        num += sum(tm[h, i, j] for j in sel)
                        den += tm[h, i, :i + 1].sum()
                recs.append(num / den)
            g = next((x for x, r in enumerate(recs) if r >= want_r), len(recs) - 1)
            self.assertAlmostEqual(float(top_p[h]), S.TOPP_GRID[g], places=6)
            self.assertAlmostEqual(float(rec[h]), recs[g], places=9)
            self.assertTrue(all(a <= b + 1e-12 for a, b in zip(recs, recs[1:])))


class Rows(unittest.TestCase):
    def lib(self):
        path = os.path.join(os.environ.get("MF_BUILD", os.path.join(ROOT, "build")), "lib",
                            "libmfkernels_ref.so")
        if not os.path.exists(path):
            self.skipTest("no %s (make builds it)" % path)
        return C.CDLL(path)

    def test_keep_rows_round_trip_and_decode(self):
        rng = np.random.default_rng(9)
        lib = self.lib()
        lib.mf_row_seal.restype = C.c_int
        lib.mf_row_seal.argtypes = [C.c_void_p, C.c_size_t]
        lib.mf_row_decode.restype = C.c_int
        lib.mf_row_decode.argtypes = [C.c_void_p, C.c_size_t, C.c_uint, C.c_void_p,
                                      C.POINTER(C.c_char_p)]

        def seal(row):
            self.assertEqual(lib.mf_row_seal(row.ctypes.data, len(row)), 0)
        for h, nb, b in ((3, 7, 32), (8, 16, 64)):
            keep = rng.random((h, nb, nb)) < 0.3
            buf, offs, sizes = S.keep_rows(keep, b, layer=2, seal=seal)
            self.assertTrue(all(o % 16 == 0 for o in offs))
            rows = [buf[o:o + s] for o, s in zip(offs, sizes)]
            got, mass = S.parse_row_list(rows, h, nb)
            ii = np.arange(nb)
            want = (keep | (ii[None, :] == 0) | (ii[None, :] == ii[:, None])) & \
                (ii[None, :] <= ii[:, None])
            self.assertTrue((got == want).all())
            self.assertTrue((mass[got] > 0).all() and (mass[~got] == 0).all())
            view = (C.c_uint8 * 512)()
            why = C.c_char_p()
            for r in rows:
                self.assertEqual(lib.mf_row_decode(r.ctypes.data, len(r), 0, view,
                                                   C.byref(why)), 0, why.value)
            # the apply kernel at Top-P 1 with W = I attends exactly the rows' blocks
            sel = S.select_mask(got, mass, np.eye(h, dtype=np.float32), np.ones(h))
            self.assertTrue((sel == want).all())
            bad = rows[1].copy()
            bad[-1] ^= 0xff
            self.assertNotEqual(lib.mf_row_decode(bad.ctypes.data, len(bad), 0, view,
                                                  C.byref(why)), 0)

    def test_too_many_heads(self):
        with self.assertRaises(ValueError):
            S.keep_rows(np.ones((65, 2, 2), bool), 32)


class Splits(unittest.TestCase):
    def test_no_leak(self):
        rng = np.random.default_rng(3)
        for _ in range(300):
            n, m = int(rng.integers(16, 300)), int(rng.integers(16, 300))
            total = int(rng.integers(2 * max(n, m + 1), 40 * (n + m)))
            cw, dw = int(rng.integers(1, 10)), int(rng.integers(1, 10))
            cal, dev = S.split_calib(total, n, cw, m, dw)
            self.assertTrue(1 <= len(cal) <= cw and 1 <= len(dev) <= dw)
            used = np.zeros(total + 1, int)
            for s in cal:
                used[s:s + n] += 1
            for s in dev:
                self.assertLessEqual(s + m + 1, total)
                used[s:s + m + 1] += 1
            self.assertLessEqual(used.max(), 1, (total, n, m, cw, dw))
            if total >= (cw + dw) * max(n, m + 1):
                self.assertEqual((len(cal), len(dev)), (cw, dw))
            if len(dev) >= 2 and len(cal) >= 2:  # dev spread over the split, not its tail
                self.assertLess(min(dev), total / 2)
                self.assertGreater(max(dev), total / 2)
        with self.assertRaises(ValueError):
            S.split_calib(100, 64, 2, 64, 2)


def windows(rng, nw, shift):
    tok = rng.integers(500, 1500, nw).astype(float)
    base = tok * rng.uniform(3.0, 4.0, nw)
    return {"tokens": tok, "base_nll": base, "nll": base + tok * rng.normal(shift, 0.01, nw),
            "kl": tok * rng.uniform(0, 0.02, nw), "agree": tok * rng.uniform(0.95, 1.0, nw),
            "work": rng.uniform(40, 60, nw), "dense": np.full(nw, 100.0)}


class Bootstrap(unittest.TestCase):
    def test_stats_and_intervals(self):
        rng = np.random.default_rng(1)
        w = windows(rng, 40, 0.005)
        st = S.stats(w)
        tok = w["tokens"].sum()
        self.assertAlmostEqual(st["dppl_pct"], 100 * (math.exp(
            (w["nll"].sum() - w["base_nll"].sum()) / tok) - 1), places=9)
        self.assertAlmostEqual(st["agree_pct"], 100 * w["agree"].sum() / tok, places=9)
        self.assertAlmostEqual(st["skipped_pct"], 100 * (1 - w["work"].sum() / 4000),
                               places=9)
        ci = S.bootstrap(w, 400, seed=2)
        for k in ("dppl_pct", "kl", "agree_pct", "skipped_pct"):
            self.assertLessEqual(ci[k][0], st[k])
            self.assertGreaterEqual(ci[k][1], st[k])
            self.assertLess(ci[k][0], ci[k][1])
        wide = S.bootstrap(windows(rng, 10, 0.005), 400, seed=2)["dppl_pct"]
        narrow = S.bootstrap(windows(rng, 400, 0.005), 400, seed=2)["dppl_pct"]
        self.assertGreater(wide[1] - wide[0], narrow[1] - narrow[0])
        self.assertEqual(S.bootstrap(windows(rng, 1, 0.0)), {})

    def test_paired_constant_shift_is_exact(self):
        rng = np.random.default_rng(4)
        tok = rng.integers(100, 900, 30).astype(float)
        base = tok * rng.uniform(2, 5, 30)
        w = {"tokens": tok, "base_nll": base, "nll": base + 0.01 * tok, "kl": 0 * tok,
             "agree": tok}
        ci = S.bootstrap(w, 200)
        want = 100 * (math.exp(0.01) - 1)
        self.assertAlmostEqual(ci["dppl_pct"][0], want, places=9)
        self.assertAlmostEqual(ci["dppl_pct"][1], want, places=9)


class OperatingPoint(unittest.TestCase):
    def test_chosen_on_dev_only(self):
        def pt(name, sk, dppl, agree, test_sk):
            return {"name": name, "dev": {"skipped_pct": sk, "dppl_pct": dppl,
                                          "agree_pct": agree},
                    "in": {"skipped_pct": test_sk, "dppl_pct": 0.0, "agree_pct": 100.0}}
        pts = [pt("a", 30, 0.2, 99, 30), pt("b", 50, 0.9, 97.5, 50),
               pt("c", 70, 1.5, 98, 99), pt("d", 60, 0.5, 96.9, 99)]
        self.assertEqual(S.operating_point(pts)["name"], "b")
        self.assertIsNone(S.operating_point([pts[2], pts[3]]))
        self.assertEqual(S.operating_point(pts, max_dppl=2.0)["name"], "c")

    def test_strict_uses_intervals(self):
        r = {"dppl_pct": 0.5, "agree_pct": 98.0, "ci": {"dppl_pct": [0.1, 1.2],
                                                        "agree_pct": [97.5, 98.5]}}
        self.assertTrue(S.passes(r))
        self.assertFalse(S.passes(r, strict=True))
        r["ci"]["dppl_pct"][1] = 0.9
        self.assertTrue(S.passes(r, strict=True))


if __name__ == "__main__":
    unittest.main()
