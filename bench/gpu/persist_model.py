#!/usr/bin/env python3
"""Protocol model of kernels/attn_core.cu persist_kernel (no GPU needed): the lister, the
loader and the two consumer warpgroups as coroutines over mbarriers (count, phase, TMA bytes;
try_wait.parity as the hardware answers it) and the ping-pong named barriers, every CTA of
a grid at once, its lister taking tile indices from the shared counter (atomicAdd; an index
past the last tile is the sentinel everyone stops at), run in random interleavings with TMA
completions in random order, on random tile counts (0 = an empty tile) and grids. Asserts:
no deadlock, every tile taken by exactly one CTA, every list / Q / K / V buffer read is the
tile it should be and is never overwritten while in use, both consumers of a CTA walk
exactly the non-empty tiles its lister took, in that order, no named-barrier double
arrival, turns matched at the end. bench/gpu/NOTES.md
("core v5", "core v5.1") says what it found. Usage: python3 bench/gpu/persist_model.py
(--sched: instead, the static walk's and the counter's makespans on the bench's patterns)
"""
import random, sys

class MBar:
    def __init__(s, name, count): s.name, s.count, s.pend, s.ph, s.tx = name, count, 0, 0, 0
    def arrive(s):
        s.pend += 1
        assert s.pend <= s.count, s.name
        s.check()
    def expect(s, b): s.tx += b; s.arrive()
    def complete_tx(s, b):
        s.tx -= b; assert s.tx >= 0; s.check()
    def check(s):
        if s.pend == s.count and s.tx == 0:
            s.pend = 0; s.ph += 1
    def done(s, parity): return (s.ph & 1) != parity

class Named:  # bar.sync by waiter wg + bar.arrive by the other: one pending at most
    def __init__(s, name): s.name, s.pend = name, 0
    def give(s):
        assert s.pend == 0, "double arrive on " + s.name
        s.pend = 1
    def can(s): return s.pend == 1
    def take(s): s.pend = 0

def cta(counts, ctr, taken, pingpong):
    """One CTA's four roles (coroutines) and its results; ctr: [next index], shared."""
    STAGES = 2
    total = len(counts)
    qf = [MBar("q_full%d" % b, 1) for b in range(2)]
    lf = [MBar("list_full%d" % b, 1) for b in range(2)]
    tf = [MBar("tile_free%d" % b, 257) for b in range(2)]
    kf = [MBar("k_full%d" % s, 1) for s in range(STAGES)]
    vf = [MBar("v_full%d" % s, 1) for s in range(STAGES)]
    ke = [MBar("k_empty%d" % s, 8) for s in range(STAGES)]
    ve = [MBar("v_empty%d" % s, 8) for s in range(STAGES)]
    turn = [Named("bar1"), Named("bar2")]  # turn[c]: wg c waits on it
    lists = [None, None]; qbuf = [None, None]; kbuf = [None] * STAGES; vbuf = [None] * STAGES
    q_users = [set(), set()]; k_users = [set() for _ in range(STAGES)]; v_users = [set() for _ in range(STAGES)]
    l_users = [set(), set()]
    tma = []  # pending (bar, bytes, buffer-setter)
    done_tiles = {0: [], 1: []}
    tiles = []  # what this CTA's lister took, in order (the sentinel not included)

    def W(cond):
        while not cond():
            yield
    def lister():
        k = 0
        while True:
            b = k & 1
            if k >= 2:
                yield from W(lambda: tf[b].done(((k >> 1) & 1) ^ 1))
            assert not l_users[b], "list overwritten in use"
            i = ctr[0]; ctr[0] += 1  # atomicAdd
            if i >= total:  # the sentinel: published like a tile, then the lister stops
                lists[b] = (i, lists[b][1] if lists[b] else 0)  # the count stays stale
                lf[b].arrive()
                return
            tiles.append(i); taken.append(i)
            cnt = counts[i]
            lists[b] = (i, cnt)
            yield
            if cnt:
                assert not q_users[b], "Q overwritten in use"
                qf[b].expect(1)
                tma.append((qf[b], 1, lambda b=b, i=i: qbuf.__setitem__(b, i)))
            lf[b].arrive()
            k += 1
    def loader():
        kt = 0
        me = "loader"
        for k in range(1 << 30):
            b = k & 1
            yield from W(lambda: lf[b].done((k >> 1) & 1))
            i, cnt = lists[b]
            if i >= total:
                return
            assert i == tiles[k]
            l_users[b].add(me)
            nt = (cnt + 1) // 2
            for x in range(nt):
                g = kt + x; s = g % STAGES; fp = ((g // STAGES) & 1) ^ 1
                if g >= STAGES:
                    yield from W(lambda: ke[s].done(fp))
                assert not k_users[s], "K stage overwritten in use"
                kf[s].expect(1); tma.append((kf[s], 1, lambda s=s, v=(i, x): kbuf.__setitem__(s, v)))
                if g >= STAGES:
                    yield from W(lambda: ve[s].done(fp))
                assert not v_users[s], "V stage overwritten in use"
                vf[s].expect(1); tma.append((vf[s], 1, lambda s=s, v=(i, x): vbuf.__setitem__(s, v)))
                yield
            kt += nt
            l_users[b].discard(me)
            tf[b].arrive()
    def consumer(c):
        kt = 0; qph = 0; gave = False
        me = ("wg", c)
        def tg():
            if pingpong: turn[1 - c].give()
        def tw():
            if pingpong:
                yield from W(turn[c].can); turn[c].take()
        for k in range(1 << 30):
            b = k & 1
            yield from W(lambda: lf[b].done((k >> 1) & 1))
            i, cnt = lists[b]
            if i >= total:
                return
            assert i == tiles[k], ("list of tile", i, "expected", tiles[k])
            l_users[b].add(me)
            if cnt == 0:
                l_users[b].discard(me)
                for _ in range(128): tf[b].arrive()
                continue
            nt = (cnt + 1) // 2
            ps = kt % STAGES; pph = (kt // STAGES) & 1
            if c == 1 and not gave: tg()
            yield from W(lambda: qf[b].done((qph >> b) & 1))
            q_users[b].add(me)
            assert qbuf[b] == i, ("Q of", qbuf[b], "expected", i)
            yield from W(lambda: kf[ps].done(pph))
            k_users[ps].add(me); assert kbuf[ps] == (i, 0)
            yield from tw(); yield; tg()
            k_users[ps].discard(me)
            for _ in range(4): ke[ps].arrive()
            for x in range(1, nt):
                g = kt + x; s = g % STAGES
                yield from W(lambda: kf[s].done((g // STAGES) & 1))
                k_users[s].add(me); assert kbuf[s] == (i, x), (kbuf[s], i, x)
                yield from tw()
                yield from W(lambda: vf[ps].done(pph))
                v_users[ps].add(me); assert vbuf[ps] == (i, x - 1)
                yield; tg()
                k_users[s].discard(me)
                for _ in range(4): ke[s].arrive()
                yield
                v_users[ps].discard(me)
                for _ in range(4): ve[ps].arrive()
                ps = s; pph = (g // STAGES) & 1
            yield from tw()
            yield from W(lambda: vf[ps].done(pph))
            v_users[ps].add(me); assert vbuf[ps] == (i, nt - 1)
            if c == 0: tg()
            yield
            v_users[ps].discard(me)
            for _ in range(4): ve[ps].arrive()
            qph ^= 1 << b; kt += nt
            q_users[b].discard(me); l_users[b].discard(me)
            for _ in range(128): tf[b].arrive()
            # wg 1 gives a non-empty next tile's first turn before its O store
            gave = False
            if c == 1 and pingpong:
                k1 = k + 1
                yield from W(lambda: lf[k1 & 1].done((k1 >> 1) & 1))
                if lists[k1 & 1][0] < total and lists[k1 & 1][1]:
                    tg(); gave = True
            yield  # the O store
            done_tiles[c].append(i)
    def check():
        want = [i for i in tiles if counts[i]]
        assert done_tiles[0] == want and done_tiles[1] == want
        for t in turn: assert t.pend == 0, "unmatched turn " + t.name
    procs = {"lister": lister(), "loader": loader(), "c0": consumer(0), "c1": consumer(1)}
    return procs, tma, check

def run(counts, grid, seed, pingpong=True):
    rnd = random.Random(seed)
    ctr, taken = [0], []
    ctas = [cta(counts, ctr, taken, pingpong) for _ in range(grid)]
    procs = {(b, name): g for b, (ps, _, _) in enumerate(ctas) for name, g in ps.items()}
    tmas = [t for _, t, _ in ctas]
    steps = 0
    while procs or any(tmas):
        steps += 1
        assert steps < 400000 * grid, "deadlock? " + str(list(procs))
        pend = [t for t in tmas if t]
        if pend and (not procs or rnd.random() < 0.3):
            tma = rnd.choice(pend)
            bar, by, setter = tma.pop(rnd.randrange(len(tma)))
            setter(); bar.complete_tx(by); continue
        key = rnd.choice(list(procs))
        try:
            next(procs[key])
        except StopIteration:
            del procs[key]
    assert sorted(taken) == list(range(len(counts))), "a tile taken twice or never"
    assert ctr[0] == len(counts) + grid  # one sentinel grab per CTA
    for _, _, check in ctas:
        check()

def keep_rows(rnd, nb, dens):
    """bench/gpu/rows.py patterns() for one head (sink + window + stripes), rows as int
    bitmasks; pure Python, so its random stripes are not rows.py's draw."""
    stripes = rnd.sample(range(nb), min(nb, max(1, int(round(0.4 * dens * nb)))))
    rows = []
    for i in range(nb):
        win = max(1, int(round(0.6 * dens * (i + 1))))
        r = ((1 << (i + 1)) - 1) & ~((1 << max(0, i - win + 1)) - 1)
        for j in stripes:
            if j <= i:
                r |= 1 << j
        rows.append(r | 1 | (1 << i))
    return rows

def sched(grid=132, hq=32, fixed_us=1.5, per_kt_us=1.9):
    """Makespan of the persistent grid, static walk (CTA b: tiles b, b + grid, ...) vs the
    counter (the next free CTA takes the next tile), tiles in blockIdx order (largest query
    tile first), a tile costing fixed_us + per_kt_us per gathered 128-key tile of its
    union list (NOTES core v5: ~1.9 us a key tile)."""
    import heapq
    for n in (16384, 32768, 65536):
        for dens in (0.05, 0.1, 0.2, 0.35):
            rnd = random.Random(0)
            nb, nt = n // 64, (n + 127) // 128
            heads = [keep_rows(rnd, nb, dens) for _ in range(hq)]
            w = []
            for i in range(nt * hq):
                m, t = nt - 1 - i // hq, i % hq
                u = heads[t][2 * m] | (heads[t][2 * m + 1] if 2 * m + 1 < nb else 0)
                w.append(fixed_us + per_kt_us * ((bin(u).count("1") + 1) // 2))
            static = max(sum(w[b::grid]) for b in range(grid))
            h = [0.0] * grid
            for x in w:
                heapq.heappush(h, heapq.heappop(h) + x)
            ideal = sum(w) / grid
            print("N %5d density %.2f: static %.3f ms, counter %.3f ms, ideal %.3f ms; "
                  "static / ideal %.3f, counter / static %.3f"
                  % (n, dens, static / 1e3, max(h) / 1e3, ideal / 1e3, static / ideal,
                     max(h) / static))

if "--sched" in sys.argv:
    sched()
    sys.exit(0)
rnd = random.Random(1)
n = 0
for trial in range(3000):
    total = rnd.randint(1, 40)
    grid = rnd.randint(1, min(total, 5))
    counts = [rnd.choice([0, 0, 1, 2, 3, 4, 5, 7, 8, 11]) for _ in range(total)]
    run(counts, grid, seed=trial, pingpong=bool(trial & 1))
    n += grid
print("ok", n, "CTA runs in", trial + 1, "grids")
