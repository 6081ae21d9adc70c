#!/usr/bin/env python3
"""Routing simulation for the hand-off benchmark (issue 10): throughput at a P90 TTFT limit.

The issue: "a bounded trace of multi-turn requests sharing long prefixes, alternating
between the two models; throughput at a P90 TTFT limit with and without MapFlow".

Trace: `n_conv` conversations open at Poisson times (rate λ conversations/s); each has
`turns` requests that alternate source model, target model, source, … on one shared
prefix of N tokens (N drawn uniformly from the measured lengths); the next turn arrives
`think` seconds after the previous one's first token. One GPU serves both models'
prefills one at a time, first come first served (both models resident, as in the
benchmark). A request's TTFT = queueing + its service time. Service times, from the
measurements (handoff.json, per N and per variant):
  without MapFlow: source = its full prefill, target = its full prefill;
  with MapFlow:    source = full prefill + extract (sum of the mf_extract calls' CUDA
                   events; they run inline, between layers) + put tail (puts still
                   running after the source's last layer: the source counts as done
                   only once its rows are in the daemon). The put thread's time before
                   that overlaps the next layers and is not counted: the measured
                   prefill wall time under the put thread (prefill_done_ms) is not used,
                   because in run 1 it was inflated by the daemon's per-row DtoH
                   validation holding the source's scratch buffers;
                   target = get (all mapped layers' leases) + reuse prefill.
No KV prefix caching across turns (each turn prefills its whole context; a model's own
KV from two turns ago would shrink both arms alike).

P90 limit: `limit_x` × the slowest single request's full service time (the largest
source/target full prefill over the measured N, i.e. the 32k source prefill), the same
limit for both arms. At low load each arm's P90 is its slowest common request's service
time, so the limit is met by both as long as MapFlow's slowest request (source + extract
+ tail) stays under it; `idle_p90` in the output shows it.

Sweep: λ on a geometric grid (offered GPU load 0.02 … 2 of the without-MapFlow arm); the
largest grid λ such that it and every smaller grid λ meet the limit, refined by bisection
up to the next grid point. Reported per arm: that λ (conversations/s), the offered
request rate λ·turns, the trace's throughput there (requests / makespan) and its P90;
the ratio of the two arms' λ is the throughput gain at the limit.

Pure Python, deterministic (seeded).
  python3 bench/handoff/sim.py                     self-check (known answers)
  python3 bench/handoff/sim.py --from-json F.json  recompute from a benchmark's JSON
"""
import argparse
import heapq
import json
import random
import sys


def trace(n_conv, lengths, seed=1):
    """[(unit-rate exponential gap, N)] per conversation."""
    rng = random.Random(seed)
    return [(rng.expovariate(1.0), rng.choice(lengths)) for _ in range(n_conv)]


def simulate(conv, rate, turns, think, make_svc):
    """conv: [(gap at rate 1, N)]; make_svc() → a fresh svc(conversation, turn, N) →
    seconds (it may keep state: the daemon's rows). One FCFS server: requests are served
    in ready-time order, so svc sees them in service order.
    Returns (sorted TTFTs, makespan)."""
    svc = make_svc()
    t = 0.0
    ev = []  # (ready time, seq, conversation, turn)
    seq = 0
    for c, (gap, _) in enumerate(conv):
        t += gap / rate
        heapq.heappush(ev, (t, seq, c, 0))
        seq += 1
    free = 0.0
    ttft = []
    while ev:
        arr, _, c, k = heapq.heappop(ev)
        free = max(arr, free) + svc(c, k, conv[c][1])
        ttft.append(free - arr)
        if k + 1 < turns:
            heapq.heappush(ev, (free + think, seq, c, k + 1))
            seq += 1
    ttft.sort()
    return ttft, free


class MapFlowArm:
    """Service times with MapFlow, and the daemon's rows. export="every": every source
    turn extracts and puts (as measured per hand-off); "first": a source turn extracts
    only when its conversation's rows are not in the daemon (the prefix is shared, so
    rows of an earlier turn still cover it); "free": as "every" but the export costs
    nothing (the ceiling: masses fused into the source's attention, puts hidden). A target turn reuses rows when they are in
    the daemon, else prefills in full. Rows live in an LRU of `cap` bytes (the daemon's
    GPU row memory; what it evicts counts as gone: demotion to the 8 GiB host tier is
    not modelled) and are deleted when their conversation's last turn is served."""

    def __init__(self, times, turns, export="every", cap=0.0):
        self.t, self.turns, self.export, self.cap = times, turns, export, cap
        self.lru = {}  # conversation → row bytes, oldest first
        self.used = 0.0
        self.hits = self.misses = self.extracts = 0

    def _drop(self, c):
        self.used -= self.lru.pop(c, 0.0)

    def __call__(self, c, k, n):
        x = self.t[n]
        last = k + 1 == self.turns
        if k % 2 == 0:  # source
            if self.export == "first" and c in self.lru:
                self.lru[c] = self.lru.pop(c)
                s = x["src_full"]
            else:
                self.extracts += 1
                self._drop(c)
                b = x.get("row_bytes", 0.0)
                while self.cap and self.lru and self.used + b > self.cap:
                    self._drop(next(iter(self.lru)))
                if not self.cap or b <= self.cap:
                    self.lru[c] = b
                    self.used += b
                s = x["src_full" if self.export == "free" else "src_mf"]
        else:  # target
            if c in self.lru:
                self.hits += 1
                self.lru[c] = self.lru.pop(c)
                s = x["tgt_mf"]
            else:
                self.misses += 1
                s = x["tgt_full"]
        if last:
            self._drop(c)
        return s


def p90(xs):
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def max_rate(conv, turns, think, make_svc, limit, grid, iters=40):
    """Largest λ meeting the limit: grid sweep (stops at the first miss), then bisection
    between the last hit and the first miss. Returns a dict with the P90 per grid λ."""
    def p90_at(r):
        return p90(simulate(conv, r, turns, think, make_svc)[0])
    sweep = []
    last_ok = miss = None
    for r in grid:
        q = p90_at(r)
        sweep.append(q)
        if q > limit:
            miss = r
            break
        last_ok = r
    sweep += [None] * (len(grid) - len(sweep))
    idle = p90_at(grid[0] * 1e-3)
    if last_ok is None:
        return {"rate": 0.0, "req_rate": 0.0, "throughput": 0.0, "p90": sweep[0],
                "idle_p90": idle, "sweep_p90": sweep}
    if miss is not None:
        lo, hi = last_ok, miss
        for _ in range(iters):
            mid = (lo * hi) ** 0.5
            if p90_at(mid) <= limit:
                lo = mid
            else:
                hi = mid
        last_ok = lo
    svc = []
    tt, span = simulate(conv, last_ok, turns, think, lambda: svc.append(make_svc()) or svc[0])
    out = {"rate": last_ok, "req_rate": last_ok * turns, "throughput": len(tt) / span,
           "p90": p90(tt), "idle_p90": idle, "saturated_grid": miss is None,
           "sweep_p90": sweep}
    if isinstance(svc[0], MapFlowArm):
        out.update(extracts=svc[0].extracts, target_hits=svc[0].hits,
                   target_misses=svc[0].misses)
    return out


def service_times(rows, variant):
    """Seconds (and row bytes) per N from handoff.json rows for one variant; N without
    the variant are left out."""
    out = {}
    for r in rows:
        x = r.get(variant)
        if not isinstance(x, dict) or "prefill_ms" not in x:
            continue
        out[r["N"]] = {"src_full": r["source_full_ms"] / 1e3,
                       "src_mf": (r["source_full_ms"] + x["extract_ms"] + x["put_tail_ms"]) / 1e3,
                       "tgt_full": r["target_full_ms"] / 1e3,
                       "tgt_mf": (x["get_ms"] + x["prefill_ms"]) / 1e3,
                       "row_bytes": float(x.get("row_bytes", 0))}
    return out


def run(times, n_conv=200, turns=4, think=5.0, limit_x=2.0, seed=1, points=48,
        export="every", cap=0.0):
    """times: {N: {src_full, src_mf, tgt_full, tgt_mf[, row_bytes]}} in seconds."""
    ns = sorted(times)
    if not ns:
        return {"skipped": "no N with all four times"}
    conv = trace(n_conv, ns, seed)

    def base(c, k, n):
        return times[n]["src_full" if k % 2 == 0 else "tgt_full"]

    slowest = max(max(v["src_full"], v["tgt_full"]) for v in times.values())
    limit = limit_x * slowest
    # λ grid: offered load λ·(service per conversation) from 0.02 to 2 without MapFlow
    work = sum(base(0, k, n) for _, n in conv for k in range(turns)) / len(conv)
    grid = [0.02 / work * (100.0 ** (i / (points - 1))) for i in range(points)]
    wo = max_rate(conv, turns, think, lambda: base, limit, grid)
    wi = max_rate(conv, turns, think, lambda: MapFlowArm(times, turns, export, cap),
                  limit, grid)
    out = {"lengths": ns, "conversations": n_conv, "turns": turns, "think_s": think,
           "export": export, "row_cap_bytes": cap, "limit_x": limit_x,
           "slowest_full_s": slowest, "p90_limit_s": limit, "grid_rate": grid,
           "without": wo, "with": wi, "times_s": times}
    if wo["rate"] > 0:
        out["ratio"] = wi["rate"] / wo["rate"]
    return out


# the daemon's row memory in run.sh's GPU setting: 80 % of the 56 GiB arena
ROW_CAP = 45875 * 1048576.0


def from_result(res, variants=None, limit_xs=(2.0,), exports=("every", "first", "free"),
                cap=None, **kw):
    """Routing per variant × export mode × limit multiple from a handoff.json result."""
    variants = variants or res.get("variants") or []
    if cap is None:
        cap = float(res.get("row_budget_bytes") or ROW_CAP)
    out = {"counted": "without: full prefills; with: source = full prefill + extract + put "
                      "tail when it exports, target = get + reuse prefill when its rows are "
                      "in the daemon (else full); P90 limit = limit_x × slowest full request",
           "row_cap_bytes": cap, "variants": {}}
    for v in variants:
        t = service_times(res.get("rows", []), v)
        if not t:
            continue
        out["variants"][v] = {"%s/%g" % (e, x): run(t, limit_x=x, export=e, cap=cap, **kw)
                              for e in exports for x in limit_xs}
    return out


def summary(ro):
    """Markdown table lines for table.md and the results file."""
    lines = ["| routing variant | source exports | P90 limit s | without: conv/s (req/s) "
             "| with: conv/s (req/s) | with ÷ without | idle P90 without / with s "
             "| target reuse hits |",
             "|---|---|---|---|---|---|---|---|"]
    for v, byx in (ro.get("variants") or {}).items():
        for key, r in byx.items():
            wo, wi = r["without"], r["with"]
            h, m = wi.get("target_hits", 0), wi.get("target_misses", 0)
            lines.append("| %s | %s | %.2f (%g × %.2f) | %.4f (%.3f) | %.4f (%.3f) | %s "
                         "| %.2f / %.2f | %d / %d |"
                         % (v, r["export"], r["p90_limit_s"], r["limit_x"],
                            r["slowest_full_s"], wo["rate"], wo["req_rate"], wi["rate"],
                            wi["req_rate"],
                            "%.3f (%+.1f%%)" % (r["ratio"], 100 * (r["ratio"] - 1))
                            if "ratio" in r else "-", wo["idle_p90"], wi["idle_p90"],
                            h, h + m))
    if ro.get("variants"):
        r = next(iter(next(iter(ro["variants"].values())).values()))
        lines.append("")
        lines.append("routing: %d conversations × %d turns (source, target, …) on one "
                     "prefix each, N ∈ %s, think %.0f s, one GPU FCFS; rows ≤ %.1f GB in "
                     "the daemon (LRU)" % (r["conversations"], r["turns"], r["lengths"],
                                          r["think_s"], ro["row_cap_bytes"] / 1e9))
    return lines


def self_check():
    # 1. Known answer: one request per "conversation" (turns = 1), evenly spaced
    # arrivals, constant service s. Request i's TTFT = s + i·(s − 1/λ) once λ > 1/s, so
    # the P90 (request i = 900 of 1000) reaches L at 1/λ = s − (L − s)/900.
    conv = [(1.0, 1)] * 1000
    L = 2.0
    grid = [0.1 * 1.1 ** i for i in range(60)]
    for s in (1.0, 0.8):
        got = max_rate(conv, 1, 0.0, lambda: (lambda c, k, n: s), L, grid)["rate"]
        want = 1.0 / (s - (L - s) / 900)
        assert abs(got / want - 1) < 1e-9, (s, got, want)
    # 2. Identical arms: ratio exactly 1, every target turn reuses.
    t = {8192: {"src_full": 0.57, "src_mf": 0.57, "tgt_full": 0.30, "tgt_mf": 0.30,
                "row_bytes": 2.7e9},
         32768: {"src_full": 3.42, "src_mf": 3.42, "tgt_full": 1.83, "tgt_mf": 1.83,
                 "row_bytes": 35.7e9}}
    r = run(t)
    assert r["ratio"] == 1.0, r["ratio"]
    assert r["with"]["target_hits"] == 400 and r["with"]["extracts"] == 400, r["with"]
    # 3. MapFlow faster on every request: not slower; idle P90 within the limit.
    t2 = {n: dict(v, src_mf=v["src_full"] * 0.99, tgt_mf=v["tgt_full"] * 0.6)
          for n, v in t.items()}
    r2 = run(t2)
    assert r2["ratio"] > 1.0, r2["ratio"]
    assert r2["without"]["idle_p90"] <= r2["p90_limit_s"] >= r2["with"]["idle_p90"]
    # 4. Slower on every request: not faster.
    t3 = {n: dict(v, src_mf=v["src_full"] * 1.3, tgt_mf=v["tgt_full"] * 1.01)
          for n, v in t.items()}
    assert run(t3)["ratio"] < 1.0
    # 5. Export once per conversation: 200 extracts at low load (no eviction when the
    # LRU is unbounded); a cap below one 32k prefix's rows: 32k targets never reuse.
    a = MapFlowArm(t2, 4, "first")
    assert [a(0, k, 32768) for k in range(4)] == [t2[32768][x] for x in
                                                  ("src_mf", "tgt_mf", "src_full", "tgt_mf")]
    assert a.extracts == 1 and a.hits == 2 and not a.lru
    b = MapFlowArm(t2, 4, "every", cap=10e9)
    assert [b(0, k, 32768) for k in range(2)] == [t2[32768]["src_mf"], t2[32768]["tgt_full"]]
    b(1, 0, 8192), b(2, 0, 8192), b(3, 0, 8192), b(4, 0, 8192)  # 4 × 2.7 GB > 10 GB
    assert 1 not in b.lru and b.used <= 10e9 and b(2, 1, 8192) == t2[8192]["tgt_mf"]
    f = MapFlowArm(t3, 4, "free")
    assert [f(0, k, 8192) for k in range(2)] == [t3[8192]["src_full"], t3[8192]["tgt_mf"]]
    # 6. --from-json path: a handoff.json-shaped result gives the expected times.
    res = {"variants": ["mask"], "rows": [
        {"N": 32768, "source_full_ms": 3420.0, "target_full_ms": 1830.0,
         "mask": {"extract_ms": 800.0, "put_tail_ms": 30.0, "get_ms": 50.0,
                  "prefill_ms": 1180.0, "row_bytes": 68e6}}]}
    st = service_times(res["rows"], "mask")[32768]
    assert abs(st["src_mf"] - 4.25) < 1e-9 and abs(st["tgt_mf"] - 1.23) < 1e-9, st
    ro = from_result(res)
    assert "ratio" in ro["variants"]["mask"]["every/2"], ro
    print("sim self-check ok: known-answer max rates %.6f / %.6f conv/s; identical arms "
          "ratio 1; faster arm ratio %.3f; residency (export first / LRU cap) ok"
          % (1 / (1 - 1 / 900), 1 / (0.8 - 1.2 / 900), r2["ratio"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from-json", help="handoff.json of a benchmark run")
    ap.add_argument("--variants", help="comma list (default: the run's variants)")
    ap.add_argument("--limit-x", default="2",
                    help="comma list: P90 limit as multiples of the slowest full request")
    ap.add_argument("--export", default="every,first,free",
                    help="comma list of source export modes: every, first, free")
    ap.add_argument("--row-cap-gb", type=float,
                    help="daemon row memory (default: the run's, else %.1f GB)" % (ROW_CAP / 1e9))
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--think", type=float, default=5.0)
    ap.add_argument("--out", help="write the routing JSON here")
    a = ap.parse_args(argv)
    if not a.from_json:
        self_check()
        return 0
    with open(a.from_json) as f:
        res = json.load(f)
    ro = from_result(res, a.variants.split(",") if a.variants else None,
                     tuple(float(x) for x in a.limit_x.split(",")),
                     tuple(a.export.split(",")),
                     a.row_cap_gb * 1e9 if a.row_cap_gb else None,
                     n_conv=a.conversations, turns=a.turns, think=a.think)
    for line in summary(ro):
        print(line)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ro, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
