"""Routing simulation for the hand-off benchmark (issue 10): throughput at a P90 TTFT limit.

A bounded trace of multi-turn conversations: each opens at a Poisson time, has `turns`
requests that alternate source model, target model, source, … on one long shared prefix
of N tokens (N drawn from the measured lengths), the next turn arriving `think` seconds
after the previous one's first token. One GPU serves both models' prefills one at a time,
first come first served (both models resident, as in the benchmark). A request's TTFT =
queueing + its prefill (service) time, taken from the measurements:
  without MapFlow: source turns src_full[N], target turns tgt_full[N];
  with MapFlow:    source turns src_mf[N] (prefill with the extracts inline: the source
                   exports its maps on every turn; the puts that finish after its prefill,
                   src_tail[N], run on the CPU and the daemon, not the GPU, and hold back
                   the next turn only when longer than the think time), target turns
                   tgt_mf[N] (get + reuse prefill; the previous turn is always the
                   source's on the same prefix here).
No KV prefix caching across turns (each turn prefills its whole context; a model's own
KV cache from two turns ago would shrink both arms alike). Throughput = requests / time
of the trace at the largest arrival rate whose P90 TTFT stays within the limit (bisection
on the rate). Pure Python, deterministic (seeded).
"""
import heapq
import random


def trace(n_conv, turns, lengths, seed=1):
    rng = random.Random(seed)
    return [(rng.expovariate(1.0), rng.choice(lengths)) for _ in range(n_conv)]


def simulate(conv, rate, turns, think, svc, tail=None):
    """conv: [(unit inter-arrival gap, N)]; svc(turn_index, N) → seconds; tail(turn, N) →
    seconds after the service before the next turn's inputs exist. Returns (sorted
    TTFTs, makespan)."""
    t = 0.0
    ev = []  # (ready time, seq, conv id, turn)
    seq = 0
    for c, (gap, _) in enumerate(conv):
        t += gap / rate
        heapq.heappush(ev, (t, seq, c, 0))
        seq += 1
    free = 0.0
    ttft = []
    while ev:
        arr, _, c, k = heapq.heappop(ev)
        start = max(arr, free)
        free = start + svc(k, conv[c][1])
        ttft.append(free - arr)
        if k + 1 < turns:
            wait = max(think, tail(k, conv[c][1]) if tail else 0.0)
            heapq.heappush(ev, (free + wait, seq, c, k + 1))
            seq += 1
    ttft.sort()
    return ttft, free


def p90(xs):
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def max_rate(conv, turns, think, svc, limit, iters=40, tail=None):
    """Largest conversation arrival rate (per s) whose P90 TTFT ≤ limit, and the trace's
    throughput (requests / s) and P90 there; throughput 0 if even an idle system misses
    the limit."""
    lo, hi = 1e-6, 1e3
    idle = p90(simulate(conv, lo, turns, think, svc, tail)[0])
    if idle > limit:
        return {"rate": 0.0, "throughput": 0.0, "p90": idle}
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        if p90(simulate(conv, mid, turns, think, svc, tail)[0]) <= limit:
            lo = mid
        else:
            hi = mid
    tt, span = simulate(conv, lo, turns, think, svc, tail)
    return {"rate": lo, "throughput": len(tt) / span, "p90": p90(tt)}


def run(times, n_conv=200, turns=4, think=5.0, limit=None, seed=1):
    """times: {N: {src_full, src_mf, tgt_full, tgt_mf, src_tail (optional)}} in seconds
    (Ns with the first four)."""
    ns = sorted(n for n, v in times.items()
                if all(v.get(k) for k in ("src_full", "src_mf", "tgt_full", "tgt_mf")))
    if not ns:
        return {"skipped": "no N with all four times"}
    conv = trace(n_conv, turns, ns, seed)

    def base(k, n):
        return times[n]["src_full" if k % 2 == 0 else "tgt_full"]

    def mf(k, n):
        return times[n]["src_mf" if k % 2 == 0 else "tgt_mf"]

    def tail(k, n):
        return times[n].get("src_tail", 0.0) if k % 2 == 0 else 0.0
    if limit is None:  # 2.5 × the mean service time without MapFlow over this mix
        mean = sum(base(k, n) for _, n in conv for k in range(turns)) / (len(conv) * turns)
        limit = 2.5 * mean
    out = {"lengths": ns, "conversations": n_conv, "turns": turns, "think_s": think,
           "p90_limit_s": limit, "without": max_rate(conv, turns, think, base, limit),
           "with": max_rate(conv, turns, think, mf, limit, tail=tail)}
    if out["without"]["throughput"] > 0:
        out["gain"] = out["with"]["throughput"] / out["without"]["throughput"] - 1.0
    return out


if __name__ == "__main__":  # self-check with made-up times: a faster target must not lose
    t = {8192: {"src_full": 0.5, "src_mf": 0.52, "tgt_full": 0.3, "tgt_mf": 0.2},
         32768: {"src_full": 2.5, "src_mf": 2.6, "tgt_full": 1.3, "tgt_mf": 0.9}}
    r = run(t, limit=6.0)
    print(r)
    assert r["with"]["throughput"] > r["without"]["throughput"] > 0, r
    same = run({n: dict(v, src_mf=v["src_full"], tgt_mf=v["tgt_full"]) for n, v in t.items()},
               limit=6.0)
    assert abs(same["gain"]) < 1e-6, same
