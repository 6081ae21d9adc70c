"""Llama-shaped decoder with random bf16 weights for the hand-off benchmark (timing only).

Shapes are real ones (TARGET = Llama-3.1-8B, SOURCE = Qwen2.5-14B: 48 layers, 40 heads,
8 KV heads, width 5120, FFN 13824, q/k/v bias); weights are N(0, 0.02) so the maps are
unstructured (every key block about equally heavy): what a block costs does not depend on
which block it is, and the benchmark sets the density through the source's Top-P instead.

prefill(tokens, attn) runs the whole prompt and returns the first generated token; for
every layer it calls attn(layer, x_norm, model) which must return the attention output
[N, Hq·d] (before o_proj). native_attention() is the dense one (SDPA with enable_gqa and
torch's own backend, cuDNN on the H200; a math fallback for old CPU torch in --dry); qkv()
projects and applies RoPE, optionally only for the last rows of Q (prob mode needs Q for
its exact rows only).
Layout of Q/K/V: [N, H, d] contiguous, which is what the MapFlow kernels take.

Single-threaded: one model per process thread that calls it.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Shape:
    name: str
    layers: int
    heads: int
    kv_heads: int
    width: int
    ffn: int
    vocab: int
    rope_base: float
    qkv_bias: bool

    @property
    def head_dim(self):
        return self.width // self.heads

    def params(self):
        d = self.head_dim
        attn = self.width * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.width
        return self.layers * (attn + 3 * self.width * self.ffn) + 2 * self.vocab * self.width


TARGET = Shape("llama-3.1-8b-shape", 32, 32, 8, 4096, 14336, 128256, 500000.0, False)
SOURCE = Shape("qwen2.5-14b-shape", 48, 40, 8, 5120, 13824, 152064, 1000000.0, True)


def tiny(shape, layers, heads, kv_heads, head_dim, ffn, vocab=512):
    """A small model of the same kind (--dry)."""
    return Shape(shape.name + "-tiny", layers, heads, kv_heads, heads * head_dim, ffn, vocab,
                 shape.rope_base, shape.qkv_bias)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


# ==== the dense baseline: what a user of torch gets =======================================
# SDPA with enable_gqa and torch's own backend choice (cuDNN on the H200 with torch 2.11:
# 1.7× torch's FlashAttention-2, issue 18); never a forced backend. The LSE comes from
# the cuDNN op at the same speed; whether it takes unrepeated (GQA) K/V is checked once
# against SDPA and a float reference (else K/V are repeated for it).
_LSE = {}


def _dev_key(dev):
    return dev.index if dev.index is not None else torch.cuda.current_device()


def sdpa_backend(qs, ks, vs):
    """Name of the backend SDPA picks for [1, H, N, d] causal GQA inputs."""
    try:
        i = int(torch._fused_sdp_choice(qs, ks, vs, None, 0.0, True, enable_gqa=True))
    except Exception as e:  # noqa: BLE001
        return "unknown (%s)" % type(e).__name__
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    return names.get(i, str(i))


def _cudnn_lse(qs, ks, vs):
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(qs, ks, vs, None, True, 0.0,
                                                            True, False)
    return r[0], r[1].reshape(qs.shape[1], qs.shape[2]).float()


def _lse_check(dev):
    """How the cuDNN op is called: "gqa" (K/V as they are), "repeat" (K/V repeated), or
    "flash" when cuDNN fails (torch's flash op, labelled as such in the results)."""
    g = torch.Generator(device=dev).manual_seed(7)
    n, hq, hkv, d = 1024, 8, 2, 128
    q, k, v = (torch.randn(1, h, n, d, device=dev, generator=g).to(torch.bfloat16)
               for h in (hq, hkv, hkv))
    kr, vr = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    sc = (q.double() @ kr.double().transpose(-1, -2)) / math.sqrt(d)
    sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    lse_ref = torch.logsumexp(sc, -1)[0]
    o_ref = torch.softmax(sc, -1) @ vr.double()

    def ok(o, lse):
        eo = float((o.double() - o_ref).norm() / o_ref.norm())
        el = float((lse.double() - lse_ref).abs().max())
        return eo < 1e-2 and el < 1e-2
    for how, kk, vv in (("gqa", k, v), ("repeat", kr, vr)):
        try:
            if ok(*_cudnn_lse(q, kk, vv)):
                return how
        except Exception:  # noqa: BLE001
            pass
    return "flash"


def sdpa_lse(qs, ks, vs):
    """(O [1, Hq, N, d], LSE [Hq, N] fp32, natural log) of causal attention."""
    key = _dev_key(qs.device)
    how = _LSE.get(key)
    if how is None:
        how = _LSE[key] = _lse_check(qs.device)
    hq = qs.shape[1]
    if how != "gqa" and ks.shape[1] != hq:
        ks = ks.repeat_interleave(hq // ks.shape[1], 1)
        vs = vs.repeat_interleave(hq // vs.shape[1], 1)
    if how == "flash":
        r = torch.ops.aten._scaled_dot_product_flash_attention(qs, ks, vs, 0.0, True)
        return r[0], r[1].reshape(hq, qs.shape[2]).float()
    return _cudnn_lse(qs, ks, vs)


def lse_source(dev):
    """How sdpa_lse got its LSE on dev ("cudnn gqa", "cudnn repeat", "flash op")."""
    how = _LSE.get(_dev_key(dev))
    return {"gqa": "cudnn op, GQA K/V", "repeat": "cudnn op, K/V repeated",
            "flash": "flash op (cuDNN op failed its check)"}.get(how, "not used")


def dense_rate(q_heads, kv_heads, n, d, dev, reps=5):
    """SDPA's backend and its ms (min, median, max) and TFLOP/s at the median, causal,
    for one [N, H, d] layer: the dense row every table prints."""
    import statistics
    g = torch.Generator(device=dev).manual_seed(n)
    qs, ks, vs = (torch.randn(1, h, n, d, device=dev, generator=g).to(torch.bfloat16)
                  for h in (q_heads, kv_heads, kv_heads))

    def f():
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    med = statistics.median(ts)
    flops = 2.0 * n * n * d * q_heads  # causal: half of 4·N²·d per head
    return {"backend": sdpa_backend(qs, ks, vs), "kernel": _kernel_name(f),
            "ms": [min(ts), med, max(ts)], "TFLOPs": flops / (med * 1e-3) / 1e12}


def _kernel_name(f):
    """The longest-running GPU kernel of f() (the profiler's name, cut to 60 characters):
    which kernel SDPA's choice really ran."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            f()
            torch.cuda.synchronize()
        ev = [e for e in p.key_averages() if getattr(e, "device_time_total", 0) > 0]
        top = max(ev, key=lambda e: e.device_time_total)
        return top.key[:60]
    except Exception as e:  # noqa: BLE001
        return "? (%s)" % type(e).__name__


def break_even(points):
    """Density at which speed-up (full ÷ sparse) falls to 1, by linear interpolation
    between sweep points [(density, speed-up)]; ("> d", extrapolated) past the last."""
    pts = sorted(points)
    for (d0, s0), (d1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            return "%.3f" % (d0 + (s0 - 1.0) * (d1 - d0) / (s0 - s1))
    if pts and pts[0][1] < 1.0:
        return "< %.2f (slower at every density)" % pts[0][0]
    if len(pts) >= 2 and pts[-1][1] < pts[-2][1]:
        (d0, s0), (d1, s1) = pts[-2], pts[-1]
        return "> %.2f (extrapolated %.2f)" % (d1, d1 + (s1 - 1.0) * (d1 - d0) / (s0 - s1))
    return "> %.2f" % pts[-1][0] if pts else "-"


class Model:
    def __init__(self, shape, device, dtype=torch.bfloat16, seed=0):
        self.s = shape
        self.device = device
        self.dtype = dtype
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        d = shape.head_dim

        def w(*size):
            t = torch.empty(*size, dtype=dtype, device=device)
            return t.normal_(0.0, 0.02, generator=g)
        self.embed = w(shape.vocab, shape.width)
        self.head = w(shape.width, shape.vocab)
        self.layers = []
        nq, nkv = shape.heads * d, shape.kv_heads * d
        for _ in range(shape.layers):
            self.layers.append({
                "wqkv": w(shape.width, nq + 2 * nkv),
                "bqkv": w(nq + 2 * nkv) if shape.qkv_bias else None,
                "wo": w(nq, shape.width),
                "wgu": w(shape.width, 2 * shape.ffn),
                "wd": w(shape.ffn, shape.width),
                "n1": torch.ones(shape.width, dtype=dtype, device=device),
                "n2": torch.ones(shape.width, dtype=dtype, device=device)})
        self.norm = torch.ones(shape.width, dtype=dtype, device=device)
        self._rope = {}

    def bytes(self):
        return self.s.params() * torch.finfo(self.dtype).bits // 8

    def rope(self, n):
        """cos, sin [n, d/2] float32 (cached per n)."""
        if n not in self._rope:
            d = self.s.head_dim
            inv = 1.0 / (self.s.rope_base ** (torch.arange(0, d, 2, dtype=torch.float32,
                                                           device=self.device) / d))
            ang = torch.arange(n, dtype=torch.float32, device=self.device)[:, None] * inv[None]
            self._rope = {n: (torch.cos(ang), torch.sin(ang))}
        return self._rope[n]

    @staticmethod
    def _rms(x, wt):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * wt

    def _apply_rope(self, t, cos, sin):
        """t [n, H, d] → rotated (rotate-half), same dtype, contiguous."""
        h = t.shape[-1] // 2
        t1, t2 = t[..., :h].float(), t[..., h:].float()
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1).to(t.dtype)

    def qkv(self, layer, xn, q_rows=None):
        """Q [N or q_rows, Hq, d], K, V [N, Hkv, d] with RoPE. q_rows: only the last q_rows
        rows of Q are computed (written at the end of an uninitialised [N, Hq, d] tensor)."""
        s, lw = self.s, self.layers[layer]
        n, d = xn.shape[0], s.head_dim
        nq, nkv = s.heads * d, s.kv_heads * d
        cos, sin = self.rope(n)
        b = lw["bqkv"]
        if q_rows is None:
            y = xn @ lw["wqkv"]
            if b is not None:
                y = y + b
            q = y[:, :nq].view(n, s.heads, d)
            k = y[:, nq:nq + nkv].view(n, s.kv_heads, d)
            v = y[:, nq + nkv:].contiguous().view(n, s.kv_heads, d)
            return self._apply_rope(q, cos, sin), self._apply_rope(k, cos, sin), v
        kv = xn @ lw["wqkv"][:, nq:]
        if b is not None:
            kv = kv + b[nq:]
        k = self._apply_rope(kv[:, :nkv].view(n, s.kv_heads, d), cos, sin)
        v = kv[:, nkv:].contiguous().view(n, s.kv_heads, d)
        q = torch.empty(n, s.heads, d, dtype=self.dtype, device=self.device)
        if q_rows:
            qt = xn[n - q_rows:] @ lw["wqkv"][:, :nq]
            if b is not None:
                qt = qt + b[:nq]
            q[n - q_rows:] = self._apply_rope(qt.view(q_rows, s.heads, d), cos[n - q_rows:],
                                              sin[n - q_rows:])
        return q, k, v

    def native_attention(self, q, k, v, want_lse=False):
        """Dense causal attention of [N, H, d] Q and [N, Hkv, d] K, V → ([N, Hq·d], LSE
        [Hq, N] fp32 or None): SDPA with enable_gqa and torch's own backend choice (cuDNN
        on the H200), the LSE from the cuDNN op (sdpa_lse); a math fallback for old CPU
        torch in --dry (LSE None: extract computes it)."""
        n, hq, d = q.shape
        qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        if self.device.type == "cuda":
            if want_lse:
                o, lse = sdpa_lse(qs, ks, vs)
                return o[0].transpose(0, 1).reshape(n, hq * d), lse
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            return o[0].transpose(0, 1).reshape(n, hq * d), None
        rep = hq // k.shape[1]
        ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        if has_sdpa():
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        else:  # CPU torch < 2.0 (--dry only)
            sc = (qs.float() @ ks.float().transpose(-1, -2)) / math.sqrt(d)
            sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1),
                                float("-inf"))
            o = (torch.softmax(sc, -1) @ vs.float()).to(q.dtype)
        return o[0].transpose(0, 1).reshape(n, hq * d), None

    def prefill(self, tokens, attn):
        """tokens: int64 [N] on the device. Returns the first token (int tensor, on device)."""
        x = self.embed[tokens]
        for i, lw in enumerate(self.layers):
            a = attn(i, self._rms(x, lw["n1"]), self)
            x = x + a @ lw["wo"]
            del a
            xn = self._rms(x, lw["n2"])
            gu = xn @ lw["wgu"]
            f = self.s.ffn
            h = F.silu(gu[:, :f]) * gu[:, f:]
            del gu
            x = x + h @ lw["wd"]
            del h
        last = self._rms(x[-1:], self.norm)
        return torch.argmax(last @ self.head, dim=-1)


def dense_attn(i, xn, m):
    q, k, v = m.qkv(i, xn)
    return m.native_attention(q, k, v)[0]
