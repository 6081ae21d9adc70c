"""Block selections of the block-sparse baselines, and flex_attention block masks for them
(issue 18; used by bench/handoff/handoff.py and bench/gpu/bench_torch.py).

FlexPrefill (arXiv 2502.20766; rules as summarised in ../shared/research/ml-anchors.md §3),
per head, over 128-token blocks, at run time from the target's own Q/K:
  1. the last query block's softmax against every key (causal inside the block) gives a
     vertical score per key and a slash score per diagonal offset;
  2. the pattern test: the square-root Jensen-Shannon divergence (natural log) between
     the pooled estimate softmax(avgpool(Q_last) · avgpool(K)ᵀ / √d) and the true vertical
     distribution summed to key blocks; below τ the head is query-aware;
  3. query-aware heads: the pooled block map softmax(avgpool(Q) · avgpool(K)ᵀ / √d) (per
     query block, causal), the fewest blocks covering γ of the head's total mass;
  4. the other heads: vertical-slash, the fewest keys and diagonals covering γ of their
     scores, at least min_budget tokens each, mapped to the blocks they touch;
  5. the sink block and the diagonal are always kept.
γ sets the density; the benchmarks calibrate it (calibrate_gamma) so that FlexPrefill
keeps the same fraction of causal blocks as MapFlow (their own block sizes: 128 here,
64 for MapFlow) - FlexPrefill's own default is γ = 0.9, τ = 0.1, min_budget = 1024
(halved by calibrate_gamma where it alone exceeds the density, and reported).

"pooled-QK only" (pooled_keep): the earlier "FlexPrefill-like" selection, kept as a
second row: the pooled block map alone, per query block the sink, the diagonal and the
top-scoring blocks up to a fixed budget (⌈density·(i+1)⌉ blocks).

All functions take the torch module as t (the benchmarks import torch late) and run on
Q [N, Hq, d], K [N, Hkv, d]; keep masks are [Hq, nb, nb] bool, causal (j <= i).
Called from the benchmark's one thread.
"""
import math


def _pool(t, x, bf, heads):
    """[N, H, d] → block means [heads, nb, d] fp32 (KV heads repeated for GQA)."""
    n, h, d = x.shape
    p = x.view(n // bf, bf, h, d).mean(1, dtype=t.float32).transpose(0, 1)
    return p.repeat_interleave(heads // h, dim=0) if heads != h else p


def _forced(t, nb, dev):
    ii = t.arange(nb, device=dev)
    causal = ii[None, :] <= ii[:, None]
    forced = (ii[None, :] == 0) | (ii[None, :] == ii[:, None])
    return ii, causal, forced


def pooled_keep(t, q, k, density, bf=128):
    """The "pooled-QK only" selection: per head and query block i, the sink, the diagonal
    and the top-scoring others of softmax(pooled Q · pooled Kᵀ / √d), ⌈density·(i+1)⌉
    blocks in all (MapFlow's density counts its forced blocks too)."""
    n, hq, d = q.shape
    nb = n // bf
    ii, causal, forced = _forced(t, nb, q.device)
    budget = t.clamp(t.ceil(density * (ii + 1).float()) - 2, min=0).long()
    sc = (_pool(t, q, bf, hq) @ _pool(t, k, bf, hq).transpose(1, 2)) / math.sqrt(d)
    sc = sc.masked_fill(~causal | forced, float("-inf")).softmax(-1)
    rank = sc.argsort(-1, descending=True).argsort(-1)
    keep = (rank < budget[None, :, None]) & causal & ~forced
    return keep | forced[None]


def _sorted_cover(s):
    """Rows of s [H, M] (≥ 0) sorted descending: (cumulative share of the row's sum, the
    sorted entries' indices); _need() then applies a γ."""
    v, i = s.sort(-1, descending=True)
    c = v.cumsum(-1)
    return c / c[:, -1:].clamp_min(1e-30), i


def _need(cs, gamma):
    """Per row: the fewest largest entries reaching γ of the row's sum (at least 1)."""
    return ((cs < gamma).sum(-1) + 1).clamp(max=cs.shape[-1])


def _select(t, cs, idx, need):
    """bool [H, M]: the need[h] largest entries of each row."""
    rank = t.arange(cs.shape[1], device=cs.device)[None, :]
    return t.zeros(cs.shape, dtype=t.bool, device=cs.device).scatter_(
        1, idx, rank < need[:, None])


class Scores:
    """What FlexPrefill's selection derives from one layer's Q/K before γ is applied
    (computed once; calibrate_gamma re-applies γ many times)."""

    def __init__(self, t, q, k, bf=128, tau=0.1):
        n, hq, d = q.shape
        nb = n // bf
        self.t, self.n, self.hq, self.nb, self.bf, self.dev = t, n, hq, nb, bf, q.device
        rep = hq // k.shape[1]
        # 1. last query block against every key, causal inside the block
        ql = q[n - bf:].transpose(0, 1).float()                     # [H, bf, d]
        kf = k.transpose(0, 1).float().repeat_interleave(rep, 0)    # [H, N, d]
        a = (ql @ kf.transpose(1, 2)) / math.sqrt(d)                 # [H, bf, N]
        pos = t.arange(n - bf, n, device=q.device)[:, None]
        a = a.masked_fill(t.arange(n, device=q.device)[None, :] > pos, float("-inf"))
        a = a.softmax(-1)
        vert = a.sum(1)                                              # [H, N]
        # slash[o] = Σ_r a[r, n-bf+r-o]: keys reversed, row r shifted left by bf-1-r
        # (a strided view of the padded rows; padding and masked keys are zero)
        af = t.nn.functional.pad(a.flip(-1), (0, bf)).contiguous()   # [H, bf, N+bf]
        L = n + bf
        sl = af.as_strided((hq, bf, n), (bf * L, L - 1, 1), af.storage_offset() + bf - 1)
        self.vert, self.slash = vert, sl.sum(1)                      # [H, N] each
        # 2. pattern test: pooled estimate of the last block vs its true block distribution
        qp, kp = _pool(t, q, bf, hq), _pool(t, k, bf, hq)            # [H, nb, d]
        est = ((qp[:, -1:] @ kp.transpose(1, 2))[:, 0] / math.sqrt(d)).softmax(-1)
        tru = vert.view(hq, nb, bf).sum(-1)
        tru = tru / tru.sum(-1, keepdim=True)
        m = 0.5 * (est + tru)

        def kl(p_):
            return (p_ * (p_.clamp_min(1e-30).log() - m.clamp_min(1e-30).log())).sum(-1)
        self.js = (0.5 * kl(est) + 0.5 * kl(tru)).clamp_min(0).sqrt()  # [H]
        self.query_aware = self.js < tau
        # 3. the pooled block map, per query block (causal)
        ii, causal, forced = _forced(t, nb, q.device)
        self.causal, self.forced = causal, forced
        pm = (qp @ kp.transpose(1, 2)) / math.sqrt(d)
        self.pooled = pm.masked_fill(~causal, float("-inf")).softmax(-1)  # [H, nb, nb]
        # query block − key block offset of every (i, j), for the slash diagonals
        self.delta = (ii[:, None] - ii[None, :]).clamp(min=0)
        self._cs = None

    def keep(self, gamma, min_budget=1024):
        """keep [H, nb, nb] for one γ."""
        t, hq, nb, bf, n = self.t, self.hq, self.nb, self.bf, self.n
        if self._cs is None:  # sorted once; γ only moves the cut
            self._cs = [_sorted_cover(x) for x in (self.pooled.reshape(hq, -1).nan_to_num(0.0),
                                                   self.vert, self.slash)]
        (cp, ip), (cv, iv), (cl, il) = self._cs
        # query-aware: fewest blocks covering γ of the head's whole pooled map
        qa = _select(t, cp, ip, _need(cp, gamma)).view(hq, nb, nb)
        # vertical-slash: keys and diagonals covering γ, at least min_budget tokens each
        mb = min(min_budget, n)
        vcols = _select(t, cv, iv, _need(cv, gamma).clamp(min=mb))
        vdiag = _select(t, cl, il, _need(cl, gamma).clamp(min=mb)).to(t.int32)
        colb = vcols.view(hq, nb, bf).any(-1)                          # key blocks
        # a diagonal at offset o touches block offsets o // bf and, unless o % bf == 0,
        # o // bf + 1
        o = t.arange(n, device=self.dev)
        ob = (o // bf)[None].expand(hq, n).contiguous()
        db = t.zeros(hq, nb + 1, dtype=t.int32, device=self.dev)
        db.scatter_add_(1, ob, vdiag)
        db.scatter_add_(1, ob + 1, vdiag * (o % bf != 0).to(t.int32)[None])
        diagb = (db > 0)[:, :nb]
        vs = colb[:, None, :] | diagb[:, self.delta]
        keep = t.where(self.query_aware[:, None, None], qa, vs) & self.causal
        return keep | self.forced[None]


def density(keep):
    """Kept fraction of the causal blocks."""
    nb = keep.shape[-1]
    return float(keep.sum()) / (keep.shape[0] * nb * (nb + 1) / 2)


def calibrate_gamma(sc, goal, min_budget=1024, iters=12):
    """(γ, achieved density, min_budget): γ by bisection, the keep nearest the goal density
    on these scores. Where even γ → 0 keeps more than 1.25 × the goal because min_budget
    tokens of verticals and diagonals touch too many blocks (short N: 1024 tokens are 3 %
    of 32k but 12.5 % of 8k), min_budget is halved (down to one token) until it does not:
    the result says which min_budget was used."""
    mb = min_budget
    while mb > 1 and density(sc.keep(0.0, mb)) > 1.25 * goal:
        mb //= 2
    lo, hi = 0.0, 1.0
    best = None
    for _ in range(iters):
        g = 0.5 * (lo + hi)
        dn = density(sc.keep(g, mb))
        if best is None or abs(dn - goal) < abs(best[1] - goal):
            best = (g, dn)
        if dn > goal:
            hi = g
        else:
            lo = g
    return best[0], best[1], mb


def block_mask(t, bm_cls, keep, bf):
    """flex_attention BlockMask of a causal [H, nb, nb] keep at bf-token blocks: the
    diagonal block partial (causal mask_mod), every other kept block full."""
    hq, nb, _ = keep.shape
    ii = t.arange(nb, device=keep.device)
    full = keep & (ii[None, None, :] < ii[None, :, None])
    full_n = full.sum(-1).to(t.int32)[None]
    full_i = t.argsort((~full).to(t.int8), dim=-1, stable=True).to(t.int32)[None]
    part_n = keep[:, ii, ii].to(t.int32)[None]
    part_i = ii.view(1, 1, nb, 1).expand(1, hq, nb, nb).contiguous().to(t.int32)

    def causal(b, h, qi, ki):
        return qi >= ki
    return bm_cls.from_kv_blocks(part_n, part_i, full_n, full_i, BLOCK_SIZE=bf,
                                 mask_mod=causal)


def block_mask_coarse(t, bm_cls, keep, fine, coarse=128):
    """The same kept (head, fine block) pairs as a BlockMask at coarse-token blocks (flex's
    default tiles): a coarse block whose fine sub-blocks are all kept (and below the
    diagonal) is full, one with some kept is partial and its mask_mod looks the pairs up,
    so flex computes exactly the pairs MapFlow does. Returns (BlockMask, the fraction of
    causal coarse blocks it visits)."""
    hq, nb, _ = keep.shape
    r = coarse // fine
    nc = nb // r
    k4 = keep.view(hq, nc, r, nc, r)
    anyk = k4.any(4).any(2)
    ii = t.arange(nc, device=keep.device)
    fi = t.arange(nb, device=keep.device)
    causal_f = fi[None, :] <= fi[:, None]
    allk = (keep | ~causal_f[None]).view(hq, nc, r, nc, r).all(4).all(2)
    full = anyk & allk & (ii[None, None, :] < ii[None, :, None])
    part = anyk & ~full
    fn = full.sum(-1).to(t.int32)[None]
    fidx = t.argsort((~full).to(t.int8), dim=-1, stable=True).to(t.int32)[None]
    pn = part.sum(-1).to(t.int32)[None]
    pidx = t.argsort((~part).to(t.int8), dim=-1, stable=True).to(t.int32)[None]
    kt = keep.contiguous()

    def mm(b, h, qi, ki):
        return (qi >= ki) & kt[h, qi // fine, ki // fine]
    bm = bm_cls.from_kv_blocks(pn, pidx, fn, fidx, BLOCK_SIZE=coarse, mask_mod=mm)
    return bm, float(anyk.sum()) / (hq * nc * (nc + 1) / 2)
