#!/usr/bin/env python3
"""Serving simulations on the hand-off benchmark's measured times (issue 18).

What is counted (both arms alike unless said):
  - vLLM-style prefix caching in both arms: a model's later turn on a conversation reuses
    its own KV of everything it saw (its prompt and its own response) and prefills only
    the tokens added since; prefixes grow (each turn appends user and response tokens);
  - a prefill of Δ new tokens on a cached prefix of P costs a·Δ + b·((P+Δ)² − P²): a and
    b per model fitted (least squares) to its measured full prefills (dense SDPA, cuDNN),
    so inc(0, N) is the measured full prefill and increments add up;
  - with MapFlow the exporting model pays its measured wall time under export: (wall −
    full) at N per causal (query, key) pair, times the pairs it prefills; the rows it
    exports cover the tokens it prefilled (not its generated response);
  - a reusing target saves, on the covered share of its new tokens, the measured saving
    of its reuse prefill per pair ((full − reuse prefill) / N² at the nearest measured N)
    and pays the get (leases of every mapped layer), per covered token;
  - one GPU serves every model's prefills, first come first served; decode is not
    modelled (it would occupy the GPU alike in both arms); TTFT = queueing + prefill.
Workloads (all printed by --from-json):
  (a) routing: multi-turn conversations on a long prompt (N from the measured lengths);
      each turn a router sends to the strong (source-shaped, exports) or the weak (target-
      shaped, reuses) model, the same choices in both arms; throughput (conversations/s)
      at a P90 TTFT limit (limit_x × the slowest full prefill), ratio with ÷ without;
  (b) agent pipeline: per round the 14B-shaped source plans (exports), the 8B-shaped
      target refines, a 3B-shaped model summarises (its times are the 8B ones scaled by
      FLOPs: not measured), each reading everything so far; one pipeline alone on the
      GPU: the hand-off pause (the next model's TTFT) saved per round;
  (c) fan-out: one source prefill serving k = 1, 2, 4 different target models (each its
      own cache); throughput at the P90 limit, ratio with ÷ without.
Rows live in the daemon's row memory (LRU by conversation, bytes per pair from the run);
evicted rows are gone (the host tier is not modelled).

Pure Python, deterministic (seeded).
  python3 bench/handoff/sim.py                     self-check (known answers)
  python3 bench/handoff/sim.py --from-json F.json  all three workloads from a run's JSON
"""
import argparse
import heapq
import json
import random
import sys

# Llama-3.2-3B shape against Llama-3.1-8B: (layers, heads, head dim, width, FFN) for the
# FLOP scaling of workload (b)'s summariser.
SHAPE_3B = {"layers": 28, "heads": 24, "head_dim": 128, "width": 3072, "ffn": 8192}
ROW_CAP = 45875 * 1048576.0  # the daemon's row memory in run.sh's GPU setting


# ==== cost model ==========================================================================

def pairs(p, d):
    """Causal (query, key) pairs of Δ new queries on a cached prefix of P (× 2: N² for a
    full prefill of N)."""
    return (p + d) ** 2 - p ** 2


def fit(full, attn=None):
    """{N: seconds} → (a, b) with a·N + b·N² through the points (least squares). One
    point: b from the measured dense attention time of the whole model at that N (attn,
    seconds), else a quadratic share of 0.3; the output says which."""
    ns = sorted(full)
    if len(ns) == 1:
        n = ns[0]
        q = min(attn, full[n]) if attn else 0.3 * full[n]
        return (full[n] - q) / n, q / n ** 2
    s11 = sum(n * n for n in ns)
    s12 = sum(n ** 3 for n in ns)
    s22 = sum(n ** 4 for n in ns)
    y1 = sum(n * full[n] for n in ns)
    y2 = sum(n * n * full[n] for n in ns)
    det = s11 * s22 - s12 * s12
    a, b = (y1 * s22 - y2 * s12) / det, (s11 * y2 - s12 * y1) / det
    if a < 0 or b < 0:  # keep both terms physical
        b = max(0.0, b)
        a = max(0.0, (y1 - b * s12) / s11)
    return a, b


def nearest(d, n):
    return d[min(d, key=lambda m: abs(m - n))]


class Model:
    """One model's prefill times: inc(P, Δ), plus (when it reuses rows) the saving per
    pair and the get per token, (when it exports) the export cost per pair."""

    def __init__(self, name, full, save_pp=None, get_pt=None, export_pp=None, attn=None):
        self.name, self.full = name, full
        self.a, self.b = fit(full, attn)
        self.save_pp, self.get_pt, self.export_pp = save_pp or {}, get_pt or {}, export_pp or {}

    def inc(self, p, d):
        return self.a * d + self.b * pairs(p, d)

    def scaled(self, name, lin, att):
        """The same model with linear work × lin and attention work × att (FLOP ratios)."""
        m = Model(name, {n: v for n, v in self.full.items()})
        m.a, m.b = self.a * lin, self.b * att
        m.save_pp = {n: v * att for n, v in self.save_pp.items()}
        m.get_pt = {n: v * SHAPE_3B["layers"] / 32 for n, v in self.get_pt.items()}
        return m


def models_from(res, variant):
    """(source, target) Models from handoff.json rows for one variant, or None."""
    rows = [r for r in res.get("rows", []) if isinstance(r.get(variant), dict)
            and "prefill_ms" in r[variant]]
    if not rows:
        return None
    src_full = {r["N"]: r["source_full_ms"] / 1e3 for r in rows}
    tgt_full = {r["N"]: r["target_full_ms"] / 1e3 for r in rows}
    export_pp, save_pp, get_pt, bytes_pp = {}, {}, {}, {}
    for r in rows:
        n, x = r["N"], r[variant]
        wall = x.get("wall_ms", r["source_full_ms"] + x.get("extract_ms", 0) +
                     x.get("put_tail_ms", 0))
        export_pp[n] = max(0.0, wall - r["source_full_ms"]) / 1e3 / n ** 2
        save_pp[n] = (r["target_full_ms"] - x["prefill_ms"]) / 1e3 / n ** 2
        get_pt[n] = x.get("get_ms", 0.0) / 1e3 / n
        bytes_pp[n] = float(x.get("row_bytes", 0.0)) / n ** 2
    attn = {}  # one N: the whole model's dense attention there (layers × one layer)
    da = rows[0].get("dense_attention") if len(rows) == 1 else None
    for who in ("source", "target"):
        if da and who in da and res.get(who):
            attn[who] = res[who]["layers"] * da[who]["ms"][1] / 1e3
    src = Model("source", src_full, export_pp=export_pp, attn=attn.get("source"))
    tgt = Model("target", tgt_full, save_pp=save_pp, get_pt=get_pt, attn=attn.get("target"))
    src.attn_measured = tgt.attn_measured = bool(attn)
    src.bytes_pp = bytes_pp
    return src, tgt


def model_3b(tgt, shape8b):
    """The 3B-shaped summariser: the 8B target scaled by FLOPs (linear and attention)."""
    s = SHAPE_3B
    w8, f8, l8 = shape8b["width"], shape8b["ffn"], shape8b["layers"]
    lin8 = l8 * (4 * w8 * w8 + 3 * w8 * f8)
    lin3 = s["layers"] * (4 * s["width"] ** 2 + 3 * s["width"] * s["ffn"])
    att8 = l8 * shape8b["heads"] * (shape8b["width"] // shape8b["heads"])
    att3 = s["layers"] * s["heads"] * s["head_dim"]
    return tgt.scaled("target-3b (scaled)", lin3 / lin8, att3 / att8)


# ==== conversations =======================================================================

class Conv:
    """One conversation's state in one arm: context length, each model's cached prefix,
    the token spans whose rows were exported (rows of the exporting model)."""

    def __init__(self):
        self.ctx = 0
        self.cached = {}
        self.spans = []  # [(start, end)] exported
        self.bytes = 0.0  # their rows' bytes

    def covered(self, p, e):
        return sum(max(0, min(e, b) - max(p, a)) for a, b in self.spans)


class Arm:
    """Service times of one arm. mapflow: exporters pay export and record spans; other
    models reuse rows of covered tokens. rows: LRU {conversation: bytes} under cap."""

    def __init__(self, models, mapflow, cap=0.0, free_export=False):
        self.m, self.mapflow, self.cap, self.free = models, mapflow, cap, free_export
        self.convs = {}
        self.lru, self.used = {}, 0.0
        self.hits = self.reuse_tokens = self.new_tokens = 0

    def _drop(self, c):
        self.used -= self.lru.pop(c, 0.0)
        if c in self.convs:
            self.convs[c].spans, self.convs[c].bytes = [], 0.0

    def __call__(self, c, turn):
        """turn: (model key, user tokens appended first, response tokens, exports,
        last turn of the conversation) → seconds of GPU prefill."""
        key, user, resp, exports, last = turn
        st = self.convs.setdefault(c, Conv())
        st.ctx += user
        m = self.m[key]
        p = st.cached.get(key, 0)
        d = st.ctx - p
        s = m.inc(p, d)
        self.new_tokens += d
        if self.mapflow and exports:
            if not self.free:
                s += nearest(m.export_pp, st.ctx) * pairs(p, d)
            b = nearest(getattr(m, "bytes_pp", {0: 0.0}), st.ctx) * pairs(p, d)
            self.used -= self.lru.pop(c, 0.0)
            tot = st.bytes + b
            while self.cap and self.lru and self.used + tot > self.cap:
                self._drop(next(iter(self.lru)))
            if not self.cap or tot <= self.cap:
                st.spans.append((p, st.ctx))
                st.bytes = tot
                self.lru[c] = tot
                self.used += tot
            else:
                st.spans, st.bytes = [], 0.0
        elif self.mapflow and m.save_pp and c in self.lru:
            cov = st.covered(p, st.ctx)
            if cov:
                self.hits += 1
                self.reuse_tokens += cov
                self.lru[c] = self.lru.pop(c)
                s -= nearest(m.save_pp, st.ctx) * pairs(p, d) * cov / d
                s += nearest(m.get_pt, st.ctx) * cov
        st.ctx += resp
        st.cached[key] = st.ctx  # its own response's KV is in its cache
        if last:
            self._drop(c)
            self.convs.pop(c, None)
        return max(s, 0.0)


def simulate(convs, rate, think, arm):
    """convs: [(gap at rate 1, [turn, …])]; one FCFS server; the next turn of a
    conversation is ready `think` s after the previous one's first token.
    Returns (sorted TTFTs, makespan)."""
    t, ev, seq = 0.0, [], 0
    for c, (gap, _) in enumerate(convs):
        t += gap / rate
        heapq.heappush(ev, (t, seq, c, 0))
        seq += 1
    free, ttft = 0.0, []
    while ev:
        arr, _, c, k = heapq.heappop(ev)
        free = max(arr, free) + arm(c, convs[c][1][k])
        ttft.append(free - arr)
        if k + 1 < len(convs[c][1]):
            heapq.heappush(ev, (free + think, seq, c, k + 1))
            seq += 1
    ttft.sort()
    return ttft, free


def p90(xs):
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def max_rate(convs, think, make_arm, limit, grid, iters=30):
    """Largest λ meeting the P90 limit: grid sweep to the first miss, then bisection."""
    def p90_at(r):
        return p90(simulate(convs, r, think, make_arm())[0])
    last_ok = miss = None
    for r in grid:
        if p90_at(r) > limit:
            miss = r
            break
        last_ok = r
    idle = p90_at(grid[0] * 1e-3)
    if last_ok is None:
        return {"rate": 0.0, "idle_p90": idle}
    if miss is not None:
        lo, hi = last_ok, miss
        for _ in range(iters):
            mid = (lo * hi) ** 0.5
            if p90_at(mid) <= limit:
                lo = mid
            else:
                hi = mid
        last_ok = lo
    arm = make_arm()
    tt, span = simulate(convs, last_ok, think, arm)
    return {"rate": last_ok, "throughput": len(tt) / span, "p90": p90(tt), "idle_p90": idle,
            "saturated_grid": miss is None, "target_hits": arm.hits,
            "reused_token_share": arm.reuse_tokens / max(1, arm.new_tokens)}


def compare(convs, models, think, limit, cap, points=40, free=False):
    """Both arms on one trace: λ grid from offered load 0.02 to 2 of the arm without."""
    base = Arm(models, False)
    work = sum(base(c, tr) for c, (_, ts) in enumerate(convs) for tr in ts) / len(convs)
    grid = [0.02 / work * (100.0 ** (i / (points - 1))) for i in range(points)]
    wo = max_rate(convs, think, lambda: Arm(models, False), limit, grid)
    wi = max_rate(convs, think, lambda: Arm(models, True, cap, free), limit, grid)
    out = {"without": wo, "with": wi, "p90_limit_s": limit}
    if wo["rate"] > 0:
        out["ratio"] = wi["rate"] / wo["rate"]
    return out


def routing_trace(lengths, n_conv, turns, user, resp, p_strong, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n_conv):
        n0 = rng.choice(lengths)
        ts = []
        for k in range(turns):
            strong = k == 0 or rng.random() < p_strong  # the long prompt goes to the strong
            ts.append(("src" if strong else "tgt", n0 if k == 0 else user, resp, strong,
                       k + 1 == turns))
        out.append((rng.expovariate(1.0), ts))
    return out


def fanout_trace(lengths, n_conv, k, resp, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n_conv):
        n0 = rng.choice(lengths)
        ts = [("src", n0, resp, True, False)]
        ts += [("tgt%d" % j, 0, 0, False, j + 1 == k) for j in range(k)]
        out.append((rng.expovariate(1.0), ts))
    return out


def pipeline(models, n0, rounds, out_tokens, cap):
    """Workload (b) alone on the GPU: per round plan (source), refine (8B), summarise
    (3B); each model's TTFT is the pause the pipeline waits before it. Returns per-round
    pauses without / with and what MapFlow saves."""
    res = []
    arms = {False: Arm(models, False), True: Arm(models, True, cap)}
    for r in range(rounds):
        row = {}
        for mf, arm in arms.items():
            ts = [arm(0, ("src", n0 if r == 0 else out_tokens, out_tokens, True, False)),
                  arm(0, ("tgt", 0, out_tokens, False, False)),
                  arm(0, ("t3b", 0, out_tokens, False, False))]
            row["with" if mf else "without"] = ts
        wo, wi = row["without"], row["with"]
        row["pause_saved_s"] = (wo[1] + wo[2]) - (wi[1] + wi[2])
        row["round_saved_s"] = sum(wo) - sum(wi)
        res.append(row)
    return res


# ==== from a run ==========================================================================

def from_result(res, variants=None, limit_x=2.0, cap=None, n_conv=200, turns=6,
                user=512, resp=256, p_strong=0.5, think=5.0, seed=1, rounds=4):
    """All three workloads per variant from a handoff.json result."""
    variants = variants or res.get("variants") or []
    cap = float(res.get("row_budget_bytes") or ROW_CAP) if cap is None else cap
    out = {"counted": __doc__.split("What is counted")[1].split("Workloads")[0].strip(),
           "row_cap_bytes": cap, "workloads": {}, "params": {
               "conversations": n_conv, "turns": turns, "user_tokens": user,
               "response_tokens": resp, "p_strong": p_strong, "think_s": think,
               "limit_x": limit_x, "rounds": rounds, "seed": seed}}
    tshape = res.get("target") or {"layers": 32, "heads": 32, "width": 4096, "ffn": 14336}
    for v in variants:
        ms = models_from(res, v)
        if ms is None:
            continue
        src, tgt = ms
        lengths = sorted(src.full)
        limit = limit_x * max(max(src.full.values()), max(tgt.full.values()))
        w = {"fit": {"source_a_b": [src.a, src.b], "target_a_b": [tgt.a, tgt.b],
                     "lengths": lengths, "attn_measured": src.attn_measured}}
        models = {"src": src, "tgt": tgt}
        conv = routing_trace(lengths, n_conv, turns, user, resp, p_strong, seed)
        w["routing"] = compare(conv, models, think, limit, cap)
        w["routing_free_export"] = compare(conv, models, think, limit, cap, free=True)
        t3 = model_3b(tgt, tshape)
        w["pipeline"] = {n: pipeline({"src": src, "tgt": tgt, "t3b": t3}, n, rounds, resp, cap)
                         for n in lengths}
        w["fanout"] = {}
        for k in (1, 2, 4):
            mk = dict({"src": src}, **{"tgt%d" % j: tgt for j in range(k)})
            conv = fanout_trace(lengths, n_conv, k, resp, seed)
            w["fanout"][k] = compare(conv, mk, 0.0, limit, cap)
        out["workloads"][v] = w
    return out


def summary(ro):
    """Markdown lines of the three workloads."""
    p = ro.get("params", {})
    lines = ["(a) routing, strong (source, exports) / weak (target, reuses), prefix caching "
             "in both arms: %d conversations × %d turns (+%d user, +%d response tokens a "
             "turn, strong p=%.2f), think %.0f s; P90 limit %g × slowest full prefill"
             % (p.get("conversations", 0), p.get("turns", 0), p.get("user_tokens", 0),
                p.get("response_tokens", 0), p.get("p_strong", 0), p.get("think_s", 0),
                p.get("limit_x", 0)),
             "| variant | P90 limit s | without conv/s | with conv/s | with ÷ without | "
             "free export ÷ without | weak turns reusing | reused share of new tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for v, w in (ro.get("workloads") or {}).items():
        r, f = w["routing"], w["routing_free_export"]
        lines.append("| %s | %.2f | %.4f | %.4f | %s | %s | %d | %.3f |"
                     % (v, r["p90_limit_s"], r["without"]["rate"], r["with"]["rate"],
                        "%.3f" % r["ratio"] if "ratio" in r else "-",
                        "%.3f" % f["ratio"] if "ratio" in f else "-",
                        r["with"].get("target_hits", 0),
                        r["with"].get("reused_token_share", 0.0)))
    lines += ["", "(b) agent pipeline 14B-shaped plans → 8B-shaped refines → 3B-shaped "
              "summarises (3B = 8B times scaled by FLOPs, not measured), %d rounds, +%d "
              "tokens a step; hand-off pause = the next model's TTFT" % (p.get("rounds", 0),
                                                                        p.get("response_tokens", 0)),
              "| variant | N | round 1 pause without / with s | saved round 1 s | saved later "
              "rounds s (mean) | round total saved s (incl. export) |", "|---|---|---|---|---|---|"]
    for v, w in (ro.get("workloads") or {}).items():
        for n, rs in w["pipeline"].items():
            r1 = rs[0]
            later = [x["pause_saved_s"] for x in rs[1:]] or [0.0]
            lines.append("| %s | %s | %.3f / %.3f | %.3f | %.4f | %.3f |"
                         % (v, n, r1["without"][1] + r1["without"][2],
                            r1["with"][1] + r1["with"][2], r1["pause_saved_s"],
                            sum(later) / len(later), r1["round_saved_s"]))
    lines += ["", "(c) fan-out: one source prefill serving k target models (each its own "
              "cache), throughput at the P90 limit",
              "| variant | k | without groups/s | with groups/s | with ÷ without |",
              "|---|---|---|---|---|"]
    for v, w in (ro.get("workloads") or {}).items():
        for k, r in w["fanout"].items():
            lines.append("| %s | %s | %.4f | %.4f | %s |"
                         % (v, k, r["without"]["rate"], r["with"]["rate"],
                            "%.3f" % r["ratio"] if "ratio" in r else "-"))
    lines.append("rows ≤ %.1f GB in the daemon (LRU by conversation)"
                 % (ro.get("row_cap_bytes", 0) / 1e9))
    for v, w in (ro.get("workloads") or {}).items():
        ns = w["fit"]["lengths"]
        lines.append("%s: prefill cost a·N + b·N² fitted to N = %s%s" % (
            v, ns, "" if len(ns) > 1 else
            " (one point: b from the measured dense attention layer × layers, quadratic "
            "share source %.2f / target %.2f)" % tuple(
                w["fit"][k][1] * ns[0] ** 2 / (w["fit"][k][0] * ns[0] + w["fit"][k][1] * ns[0] ** 2)
                for k in ("source_a_b", "target_a_b"))
            if w["fit"].get("attn_measured") else " (one point: a 0.3 quadratic share assumed)"))
    return lines


# ==== self-check ==========================================================================

def synthetic():
    """A handoff.json-shaped result with made-up but plausible times (for --dry and the
    self-check; never a result)."""
    rows = []
    for n, sf, tf, wall, pre, get in ((8192, 570., 300., 700., 250., 20.),
                                      (16384, 1300., 700., 1600., 560., 35.),
                                      (32768, 3400., 1450., 4300., 1150., 60.)):
        rows.append({"N": n, "source_full_ms": sf, "target_full_ms": tf,
                     "mask": {"wall_ms": wall, "prefill_ms": pre, "get_ms": get,
                              "row_bytes": 68e6 * (n / 32768) ** 2}})
    return {"variants": ["mask"], "rows": rows,
            "target": {"layers": 32, "heads": 32, "width": 4096, "ffn": 14336}}


def self_check():
    # 1. FCFS known answer: one-turn conversations, even arrivals, constant service s;
    # request i's TTFT = s + i·(s − 1/λ), so the P90 (request 900 of 1000) reaches L at
    # 1/λ = s − (L − s)/900.
    class Const:
        hits = reuse_tokens = new_tokens = 0

        def __init__(self, s):
            self.s = s

        def __call__(self, c, turn):
            return self.s
    convs = [(1.0, [None])] * 1000
    grid = [0.1 * 1.1 ** i for i in range(60)]
    for s in (1.0, 0.8):
        got = max_rate(convs, 0.0, lambda: Const(s), 2.0, grid)["rate"]
        want = 1.0 / (s - (2.0 - s) / 900)
        assert abs(got / want - 1) < 1e-6, (s, got, want)
    # 2. The cost model: inc(0, N) is the measured full prefill for two points; pieces add.
    m = Model("x", {8192: 0.3, 32768: 1.45})
    assert abs(m.inc(0, 8192) - 0.3) < 1e-9 and abs(m.inc(0, 32768) - 1.45) < 1e-9
    assert abs(m.inc(0, 1000) + m.inc(1000, 500) - m.inc(0, 1500)) < 1e-12
    a1, b1 = fit({4096: 1.0}, attn=0.4)  # one point: the measured attention is b·N²
    assert abs(a1 * 4096 - 0.6) < 1e-12 and abs(b1 * 4096 ** 2 - 0.4) < 1e-12
    # 3. Arms: a target turn after the source's reuses exactly the covered share.
    res = synthetic()
    src, tgt = models_from(res, "mask")
    arm = Arm({"src": src, "tgt": tgt}, True)
    s0 = arm(0, ("src", 32768, 0, True, False))
    n = 32768
    assert abs(src.inc(0, n) / 3.4 - 1) < 0.05 and abs(tgt.inc(0, n) / 1.45 - 1) < 0.05
    assert abs(s0 - (src.inc(0, n) + 0.9)) < 1e-9, s0  # + (wall − full) under export
    s1 = arm(0, ("tgt", 0, 0, False, True))
    assert abs(s1 - (tgt.inc(0, n) - 0.3 + 0.06)) < 1e-9, s1  # − saving + get
    base = Arm({"src": src, "tgt": tgt}, False)
    assert abs(base(0, ("src", n, 0, True, False)) - src.inc(0, n)) < 1e-12
    # prefix caching: the second turn of the same model prefills only the new tokens
    assert abs(base(0, ("src", 512, 0, True, True)) - src.inc(32768, 512)) < 1e-12
    # 4. Identical arms (no export cost, no saving): ratio exactly 1.
    for r in res["rows"]:
        r["mask"].update(wall_ms=r["source_full_ms"], prefill_ms=r["target_full_ms"], get_ms=0)
    ro = from_result(res, n_conv=60, turns=4)
    w = ro["workloads"]["mask"]
    assert w["routing"]["ratio"] == 1.0 and w["fanout"][2]["ratio"] == 1.0, w["routing"]
    # 5. A faster target with free export gains; the synthetic run's fan-out gains with k.
    ro = from_result(synthetic(), n_conv=60, turns=4)
    w = ro["workloads"]["mask"]
    assert w["routing_free_export"]["ratio"] > 1.0, w["routing_free_export"]
    fk = [w["fanout"][k]["ratio"] for k in (1, 2, 4)]
    assert fk[0] < fk[1] < fk[2], fk
    assert w["pipeline"][32768][0]["pause_saved_s"] > 0
    print("sim self-check ok: known-answer max rates, cost model additive, reuse share, "
          "identical arms ratio 1; synthetic fan-out k=1,2,4: %s" % ", ".join(
              "%.3f" % x for x in fk))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from-json", help="handoff.json of a benchmark run")
    ap.add_argument("--synthetic", action="store_true",
                    help="run the workloads on made-up times (CPU check of the printing)")
    ap.add_argument("--variants", help="comma list (default: the run's variants)")
    ap.add_argument("--limit-x", type=float, default=2.0,
                    help="P90 limit as a multiple of the slowest full prefill")
    ap.add_argument("--row-cap-gb", type=float,
                    help="daemon row memory (default: the run's, else %.1f GB)" % (ROW_CAP / 1e9))
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--think", type=float, default=5.0)
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args(argv)
    if not a.from_json and not a.synthetic:
        self_check()
        return 0
    if a.synthetic:
        res = synthetic()
    else:
        with open(a.from_json) as f:
            res = json.load(f)
    ro = from_result(res, a.variants.split(",") if a.variants else None, a.limit_x,
                     a.row_cap_gb * 1e9 if a.row_cap_gb else None,
                     n_conv=a.conversations, turns=a.turns, think=a.think)
    for line in summary(ro):
        print(line)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ro, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
