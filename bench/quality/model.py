"""The two small LMs of the quality evaluation and their data (see bench/quality/README.md).

A pre-LN decoder-only transformer with RoPE, GELU MLP and tied embeddings. forward() takes an
optional `attn(layer, q, k, v) -> o` hook (q, k after RoPE, [B, H, N, d]) so the evaluation
can replace any layer's attention with MapFlow's kernels; without it attention is PyTorch's
causal SDPA (or an explicit softmax where SDPA is missing, torch < 2.0).

Data: texts from bench/quality/data/*.txt.xz (get-data.sh). Splits: train = linuxdoc, gcide,
pydoc, perlpod, fortunes, sotu-train, minus the last CALIB_SHARE of each (the calibration
split); test-in = sotu-test; test-out = moby. Works on torch 1.13 (CPU smoke test) and 2.x.
"""
import lzma
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAIN_SOURCES = ["linuxdoc", "gcide", "pydoc", "perlpod", "fortunes", "sotu-train"]
TEST_SOURCES = {"in": "sotu-test", "out": "moby"}
CALIB_SHARE = 0.01


def read_texts(data_dir, names, max_chars=0):
    def one(n):
        with lzma.open(os.path.join(data_dir, n + ".txt.xz"), "rt", encoding="utf-8",
                       errors="replace") as f:
            return f.read(max_chars) if max_chars else f.read()
    with ThreadPoolExecutor(len(names)) as ex:
        return dict(zip(names, ex.map(one, names)))


class Tok:
    """Byte-level BPE (HF tokenizers). Without that package (CPU smoke test only) raw bytes."""

    def __init__(self, tk=None):
        self.tk = tk
        self.vocab = tk.get_vocab_size() if tk is not None else 256

    @staticmethod
    def train(texts, vocab, sample_chars):
        try:
            return Tok._train(texts, vocab, sample_chars)
        except Exception as ex:  # noqa: BLE001  (no package, or an API change: say so, go on)
            print("tokenizer: BPE failed (%r); raw bytes instead" % ex, flush=True)
            return Tok(None)

    @staticmethod
    def _train(texts, vocab, sample_chars):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        per = sample_chars // max(1, len(texts))

        def chunks():
            for t in texts:
                s = t[:per]
                for i in range(0, len(s), 1 << 16):
                    yield s[i:i + (1 << 16)]
        tk.train_from_iterator(chunks(), trainer=tr)
        return Tok(tk)

    def save(self, path):
        if self.tk is not None:
            self.tk.save(path)

    @staticmethod
    def load(path):
        if os.path.exists(path):
            from tokenizers import Tokenizer
            return Tok(Tokenizer.from_file(path))
        return Tok(None)

    def encode(self, text):
        """uint16-ready list of ids; chunks at line ends so the BPE runs in parallel."""
        import numpy as np
        if self.tk is None:
            return np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8).astype(np.int32)
        parts, i, step = [], 0, 1 << 18
        while i < len(text):
            j = text.find("\n", i + step)
            j = len(text) if j < 0 else j + 1
            parts.append(text[i:j])
            i = j
        out = []
        for k in range(0, len(parts), 256):
            out.extend(e.ids for e in self.tk.encode_batch(parts[k:k + 256]))
        return np.concatenate([np.asarray(x, dtype=np.int32) for x in out if len(x)])


class Cfg:
    def __init__(self, vocab, n_layer, n_head, d_model, ctx):
        self.vocab, self.n_layer, self.n_head, self.d_model, self.ctx = (vocab, n_layer, n_head,
                                                                          d_model, ctx)
        self.head_dim = d_model // n_head

    def as_dict(self):
        return dict(vocab=self.vocab, n_layer=self.n_layer, n_head=self.n_head,
                    d_model=self.d_model, ctx=self.ctx)


def rope_tables(n, d, device, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    ang = torch.arange(n, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


def rope(x, cos, sin):
    """x [B, H, N, d]: rotates pairs (first half, second half)."""
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2].float(), x[..., d2:].float()
    c, s = cos[:x.shape[2]], sin[:x.shape[2]]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).to(x.dtype)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    n = q.shape[2]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.dh = c.n_head, c.head_dim
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model, bias=False)
        self.out = nn.Linear(4 * c.d_model, c.d_model, bias=False)

    def forward(self, x, cos, sin, attn=None, layer=0):
        b, n, dm = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = attn(layer, q, k, v) if attn is not None else causal_attention(q, k, v)
        x = x + self.proj(o.to(x.dtype).transpose(1, 2).reshape(b, n, dm))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.cfg = c
        self.emb = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.lnf = nn.LayerNorm(c.d_model)
        self.apply(self._init)
        for blk in self.blocks:  # GPT-2's scaled init of the residual projections
            for p in (blk.proj.weight, blk.out.weight):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layer))
        self.rope = None

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, attn=None):
        n = idx.shape[1]
        if self.rope is None or self.rope[0].shape[0] < n or self.rope[0].device != idx.device:
            self.rope = rope_tables(max(n, self.cfg.ctx), self.cfg.head_dim, idx.device)
        cos, sin = self.rope
        x = self.emb(idx)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, attn, i)
        return self.lnf(x) @ self.emb.weight.t()


def save_weights(m, path):
    """safetensors (fp32); torch.save under the same name where safetensors is missing."""
    sd = {k: v.detach().float().contiguous().cpu() for k, v in m.state_dict().items()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        torch.save(sd, path)
        return
    save_file(sd, path)


def load_model(cfg_dict, path, dev):
    m = GPT(Cfg(**cfg_dict))
    try:
        from safetensors.torch import load_file
        sd = load_file(path)
    except ImportError:
        sd = torch.load(path)
    m.load_state_dict(sd)
    return m.to(dev).eval()
