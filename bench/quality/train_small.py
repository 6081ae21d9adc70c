#!/usr/bin/env python3
"""Trains the small model pair committed under bench/models/ (for mapflow-worker, make demo).

Same model and training loop as the quality evaluation (model.py, train.py's train_clock):
one byte-level BPE (its own small trainer below: the `tokenizers` package is missing on
Debian 12; --tokenizer keeps an existing one), a source and a target with head dim 64, each
trained for a wall-clock budget, on the CPU or (--device cuda) on a GPU beside the quality
pair (run.sh). Stages: prepare (tokenizer, WORK/small_*.npy), train (= source, then
target: fp16 WORK/<name>.safetensors + <name>.json), finish (on the CPU, from WORK's
weights); all = each in turn. Writes to OUT:

  tokenizer.txt          "mapflow-bpe 1", merge count, then one merge "A B" (token ids) per
                         line in rank order; token 256 + r is merge r, 0..255 are bytes
  source.safetensors     fp16 weights, config in __metadata__ (vocab, n_layer, n_head,
  target.safetensors     d_model, ctx); names as model.GPT's state_dict
  passage.txt            a held-out passage (State of the Union 1991-2021, the "in" test split)
  fixture/               tokens.npy [n] and {source,target}_logits.npy [n, vocab] (float32),
                         PyTorch's logits of the fp16 weights; tok_text.txt + tok_ids.npy
  models.json            shapes, steps, tokens, seconds, test perplexity (in / out)
and, with --calibrate BIN (mapflow-calibrate), sample maps [L, H, N, N] of both models on
the calibration split into WORK/cal/{src,tgt} and the profile OUT/profile.pb.

  train_small.py --data bench/quality/data --out bench/models --work DIR
                 [--stage all] [--src-seconds 570] [--tgt-seconds 570]
                 [--calibrate build/bin/mapflow-calibrate] [--calibrate-opts "..."]

Debian's torch uses the reference BLAS (about 3 GFLOPS here); run it with OpenBLAS from
`apt-get download libopenblas0-pthread` unpacked and put first on LD_LIBRARY_PATH (20x).
"""
import argparse
import heapq
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402
import train as T  # noqa: E402

# Pre-tokenizer (mapflow-worker's tokenizer.c implements the same rule): classes
# L = ASCII letters and bytes >= 0x80, D = digits, S = whitespace, P = the rest; a chunk is
# an optional space and a run of one class, or whitespace that leaves its last byte to a
# following word.
_S = rb" \t\n\r\x0b\x0c"
PRETOK = re.compile(rb" ?[A-Za-z\x80-\xff]+| ?[0-9]+| ?[^A-Za-z0-9\x80-\xff" + _S + rb"]+|["
                    + _S + rb"]+(?![^" + _S + rb"])|[" + _S + rb"]+")


def log(*a):
    print("[train_small %6.1fs]" % (time.time() - T0), *a, flush=True)


T0 = time.time()


def merge_pair(w, p, new):
    """w with every occurrence of the pair p, left to right, replaced by new."""
    out, i = [], 0
    while i < len(w):
        if i + 1 < len(w) and (w[i], w[i + 1]) == p:
            out.append(new)
            i += 2
        else:
            out.append(w[i])
            i += 1
    return out


def bpe_train(text_bytes, vocab):
    """Merges (a, b) in rank order, by pair frequency over the pre-tokenized chunks."""
    counts = Counter(PRETOK.findall(text_bytes))
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pairs, where = Counter(), {}
    for wi, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[wi]
            where.setdefault(p, set()).add(wi)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < vocab - 256 and heap:
        c, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -c or c == 0:
            continue
        new = 256 + len(merges)
        merges.append(p)
        touched = Counter()
        for wi in where.pop(p, ()):
            w, f = words[wi], freq[wi]
            for q in zip(w, w[1:]):
                pairs[q] -= f
                touched[q] += 1
            out = words[wi] = merge_pair(w, p, new)
            for q in zip(out, out[1:]):
                pairs[q] += f
                touched[q] += 1
                where.setdefault(q, set()).add(wi)
        pairs.pop(p, None)
        for q in touched:
            if q != p and pairs.get(q, 0) > 0:
                heapq.heappush(heap, (-pairs[q], q))
    return merges


class Bpe:
    def __init__(self, merges):
        self.rank = {p: r for r, p in enumerate(merges)}
        self.cache = {}
        self.bytes = [bytes([i]) for i in range(256)] + [b""] * len(merges)
        for r, (a, b) in enumerate(merges):
            self.bytes[256 + r] = self.bytes[a] + self.bytes[b]

    def chunk(self, c):
        """Lowest-rank pair first, every occurrence left to right, until none is left."""
        w = list(c)
        while len(w) > 1:
            best = min(((self.rank.get(p, 1 << 30), p) for p in zip(w, w[1:])))
            if best[0] == 1 << 30:
                break
            w = merge_pair(w, best[1], 256 + best[0])
        return w

    def encode(self, text):
        out = []
        for c in PRETOK.findall(text.encode("utf-8", "replace")):
            ids = self.cache.get(c)
            if ids is None:
                ids = self.cache[c] = self.chunk(c)
            out.extend(ids)
        return np.asarray(out, dtype=np.int32)

    def decode(self, ids):
        return b"".join(self.bytes[i] for i in ids).decode("utf-8", "replace")


def save_tokenizer(merges, path):
    with open(path, "w") as f:
        f.write("mapflow-bpe 1\n%d\n" % len(merges))
        f.writelines("%d %d\n" % p for p in merges)


def save_safetensors_f16(m, path, meta):
    """safetensors by hand (the package is missing): u64 header length, JSON, raw data."""
    sd = {k: v.detach().to(torch.float16).contiguous().cpu().numpy() for k, v in
          m.state_dict().items()}
    header, off = {"__metadata__": {k: str(v) for k, v in meta.items()}}, 0
    for k, a in sd.items():
        header[k] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for a in sd.values():
            f.write(a.tobytes())


def load_f16_into(m, path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    sd = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        sd[k] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float16).astype(np.float32)
                                 .reshape(v["shape"]))
    m.load_state_dict(sd)
    return m.eval()


def load_tokenizer(path):
    """Merges of a tokenizer.txt written by save_tokenizer."""
    with open(path) as f:
        lines = f.read().split("\n")
    if lines[0] != "mapflow-bpe 1":
        raise SystemExit("%s: not a mapflow-bpe 1 file" % path)
    n = int(lines[1])
    return [tuple(int(x) for x in ln.split()) for ln in lines[2:2 + n]]


_TOK = None


def _encode_one(text):
    return _TOK.encode(text)


def encode_many(tok, texts, jobs):
    """[tok.encode(t) for t in texts], the big ones cut at line ends and spread over `jobs`
    forked processes (the BPE is pure Python)."""
    global _TOK
    _TOK = tok
    parts, owner = [], []
    for n, t in enumerate(texts):
        i, step = 0, 1 << 22
        while i < len(t):
            j = t.find("\n", i + step)
            j = len(t) if j < 0 else j + 1
            parts.append(t[i:j])
            owner.append(n)
            i = j
    if jobs > 1 and len(parts) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(jobs) as pool:
            enc = pool.map(_encode_one, parts, chunksize=1)
    else:
        enc = [tok.encode(p) for p in parts]
    out = [[] for _ in texts]
    for n, e in zip(owner, enc):
        out[n].append(e)
    return [np.concatenate(x) if x else np.zeros(0, np.int32) for x in out]


@torch.no_grad()
def attention_maps(m, idx):
    """[L, H, N, N] softmax probabilities of one sequence, through the model's attn hook."""
    maps = []

    def hook(layer, q, k, v):
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        p = torch.softmax(s, -1)
        maps.append(p[0])
        return p @ v.float()
    m(idx[None, :], attn=hook)
    return torch.stack(maps).numpy().astype(np.float16)


def split_texts(args):
    names = M.TRAIN_SOURCES + list(M.TEST_SOURCES.values())
    texts = M.read_texts(args.data, names, args.chars)
    train, calib = [], []
    for n in M.TRAIN_SOURCES:
        t = texts[n]
        cut = int(len(t) * (1 - M.CALIB_SHARE))
        cut = t.rfind("\n", 0, cut) + 1 or cut
        train.append(t[:cut])
        calib.append(t[cut:])
    return texts, train, calib


def prepare(args):
    """Tokenizer (trained, or loaded with --tokenizer) and WORK/small_{train,in,out,calib}.npy."""
    texts, train, calib = split_texts(args)
    if args.tokenizer:
        merges = load_tokenizer(args.tokenizer)
    else:
        per = args.bpe_chars // len(train)
        merges = bpe_train("".join(t[:per] for t in train).encode("utf-8", "replace"),
                           args.vocab)
    save_tokenizer(merges, os.path.join(args.work, "tokenizer.txt"))
    tok = Bpe(merges)
    log("BPE: %d merges%s" % (len(merges), " (from %s)" % args.tokenizer if args.tokenizer
                                          else ""))
    enc = encode_many(tok, train + [texts[v] for v in M.TEST_SOURCES.values()] +
                      ["".join(calib)], args.jobs)
    arrs = {"train": np.concatenate(enc[:len(train)]), "in": enc[len(train)],
            "out": enc[len(train) + 1], "calib": enc[-1]}
    for k, a in arrs.items():
        np.save(os.path.join(args.work, "small_%s.npy" % k), a.astype(np.uint16))
    log("tokens: " + ", ".join("%s %d" % kv for kv in ((k, len(a)) for k, a in arrs.items())))


def train_model(args, name, dev):
    """One model (fp16 safetensors + stats in WORK): stage source / target."""
    shape, seed, lr = {"source": (args.src, 1, args.src_lr),
                       "target": (args.tgt, 2, args.tgt_lr)}[name]
    secs = args.src_seconds if name == "source" else args.tgt_seconds
    vocab = 256 + len(load_tokenizer(os.path.join(args.work, "tokenizer.txt")))
    nl, nh, dm = (int(x) for x in shape.split(","))
    cfg = M.Cfg(vocab, nl, nh, dm, args.ctx)
    data = torch.from_numpy(np.load(os.path.join(args.work, "small_train.npy"))
                            .astype(np.int32)).to(dev)
    val = np.load(os.path.join(args.work, "small_calib.npy"))
    log("training %s %s for %.0f s on %s (batch %d x %d)" % (name, shape, secs, dev.type,
                                                             args.batch, args.ctx))
    m, st = T.train_clock(cfg, data, secs, seed, args.batch, lr, dev, val=val,
                          warm_frac=0.05, log_every=50 if dev.type == "cpu" else 500)
    st["epochs"] = st["tokens"] / len(data)
    st.pop("losses", None)
    save_safetensors_f16(m, os.path.join(args.work, name + ".safetensors"), cfg.as_dict())
    with open(os.path.join(args.work, name + ".json"), "w") as f:
        json.dump(dict(st, device=dev.type, lr=lr, batch=args.batch,
                       train_tokens=int(len(data))), f, indent=1)
    log("%s: %d steps, %d tokens (%.1f epochs), final loss %.3f" % (
        name, st["steps"], st["tokens"], st["epochs"], st["final_loss"]))


def finish(args):
    """From WORK's fp16 weights (made here or on a GPU), on the CPU: OUT's safetensors,
    tokenizer, passage, fixture, test perplexity, models.json and (--calibrate) profile."""
    import shutil
    texts, _, calib = split_texts(args)
    merges = load_tokenizer(os.path.join(args.work, "tokenizer.txt"))
    tok = Bpe(merges)
    shutil.copyfile(os.path.join(args.work, "tokenizer.txt"),
                    os.path.join(args.out, "tokenizer.txt"))
    test = {k: tok.encode(texts[v]) for k, v in M.TEST_SOURCES.items()}
    cal = tok.encode("".join(calib))
    # The held-out passage: a stretch of the "in" test text starting at a paragraph.
    tin = texts[M.TEST_SOURCES["in"]]
    start = tin.find("\n\n", len(tin) // 2) + 2
    with open(os.path.join(args.out, "passage.txt"), "w") as f:
        f.write(tin[start:start + 6000])
    sample = "Hello, world!  The 3 models\n\tsaid: \"caf\u00e9 \u2014 ok?\" 2024-01-01  \n"
    with open(os.path.join(args.out, "fixture", "tok_text.txt"), "w") as f:
        f.write(sample)
    np.save(os.path.join(args.out, "fixture", "tok_ids.npy"), tok.encode(sample).astype(np.float32))
    fx = test["in"][1000:1024]
    np.save(os.path.join(args.out, "fixture", "tokens.npy"), fx.astype(np.float32))
    report = {"vocab": 256 + len(merges), "ctx": None, "block": args.block}
    dev = torch.device("cpu")
    for name in ("source", "target"):
        with open(os.path.join(args.work, name + ".json")) as f:
            st = json.load(f)
        path = os.path.join(args.out, name + ".safetensors")
        shutil.copyfile(os.path.join(args.work, name + ".safetensors"), path)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            cfg = M.Cfg(**{k: int(v) for k, v in json.loads(f.read(n))["__metadata__"].items()})
        report["ctx"] = cfg.ctx
        m = load_f16_into(M.GPT(cfg), path)  # evaluate exactly what is committed
        st["params"] = sum(p.numel() for p in m.parameters())
        for split in ("in", "out"):
            st["ppl_" + split], st["windows_" + split] = T.test_ppl(
                m, test[split], cfg.ctx, args.test_windows, dev)
        with torch.no_grad():
            logits = m(torch.from_numpy(fx.astype(np.int64))[None, :])[0].float().numpy()
        np.save(os.path.join(args.out, "fixture", name + "_logits.npy"), logits)
        log("%s: %d params, ppl in %.2f out %.2f" % (name, st["params"], st["ppl_in"],
                                                      st["ppl_out"]))
        report[name] = dict(st, shape=cfg.as_dict())
        if args.calibrate:
            d = os.path.join(args.work, "cal", name)
            os.makedirs(d, exist_ok=True)
            for s in range(args.cal_samples):
                w = cal[s * args.cal_n:(s + 1) * args.cal_n]
                np.save(os.path.join(d, "seq-%03d.npy" % s),
                        attention_maps(m, torch.from_numpy(w.astype(np.int64))))
    with open(os.path.join(args.out, "models.json"), "w") as f:
        json.dump(report, f, indent=1)
    if args.calibrate:
        cmd = [args.calibrate, "--source", os.path.join(args.work, "cal", "source"),
               "--target", os.path.join(args.work, "cal", "target"),
               "--out", os.path.join(args.out, "profile.pb"), "--block", str(args.block),
               "--source-model", "mapflow-small-src", "--target-model", "mapflow-small-tgt",
               "--recompute-last", "1"] + args.calibrate_opts.split()
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("--stage", default="all", choices=("all", "prepare", "train", "source",
                                                        "target", "finish"),
                    help="all = each in turn on this machine; train = source then target; "
                    "on a GPU: prepare and train there, then finish on the CPU")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tokenizer", default="", help="an existing tokenizer.txt (no BPE "
                    "training; the committed one keeps the fixture's token ids)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the BPE encoding")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--chars", type=int, default=1_500_000, help="per text (0: all)")
    ap.add_argument("--bpe-chars", type=int, default=3_000_000)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--src", default="4,4,256")
    ap.add_argument("--tgt", default="3,3,192")
    ap.add_argument("--src-lr", type=float, default=3e-3)
    ap.add_argument("--tgt-lr", type=float, default=3.5e-3)
    ap.add_argument("--src-seconds", type=float, default=570)
    ap.add_argument("--tgt-seconds", type=float, default=570)
    ap.add_argument("--test-windows", type=int, default=6)
    ap.add_argument("--calibrate", default="")
    ap.add_argument("--calibrate-opts", default="", help="more mapflow-calibrate options")
    ap.add_argument("--cal-n", type=int, default=512)
    ap.add_argument("--cal-samples", type=int, default=6)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    if args.stage in ("all", "finish"):
        if not args.out:
            raise SystemExit("train_small: --out is needed for the finish stage")
        os.makedirs(os.path.join(args.out, "fixture"), exist_ok=True)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.stage in ("all", "prepare"):
        prepare(args)
    for name in ("source", "target"):
        if args.stage in ("all", "train", name):
            train_model(args, name, dev)
    if args.stage in ("all", "finish"):
        finish(args)
    log("done (%s)" % args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
