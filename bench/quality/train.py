#!/usr/bin/env python3
"""Trains the quality evaluation's model pair (or loads it when WORK already holds it).

One byte-level BPE (8k) trained on the train split, shared by both models; a source
(default 6 layers × 8 heads × 512) and a target (4 × 6 × 384), head dim 64, context CTX,
trained separately (seeds 1 and 2) for a wall-clock budget each: the step count is set after
the first steps from the measured speed, so the cosine schedule ends on time. Writes to WORK:
tok.json, tokens_{calib,in,out}.npy (the held-out splits), source/target.safetensors (fp32)
with their configs in meta.json, and train.json (steps, tokens, losses, own test perplexity).

  train.py --data bench/quality/data --work DIR [--ctx 2048] [--src-seconds 80]
           [--tgt-seconds 55] [--smoke]          (--smoke: tiny models and data, CPU)
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402


def log(*a):
    print("[train %6.1fs]" % (time.time() - T0), *a, flush=True)


T0 = time.time()


def prepare(args, dev):
    """Tokenizer + token arrays; the train tokens stay in memory (on dev)."""
    texts = M.read_texts(args.data, M.TRAIN_SOURCES + list(M.TEST_SOURCES.values()),
                         args.max_chars)
    log("texts read:", {k: len(v) for k, v in texts.items()})
    train, calib = [], []
    for n in M.TRAIN_SOURCES:
        t = texts[n]
        cut = int(len(t) * (1 - M.CALIB_SHARE))
        cut = t.rfind("\n", 0, cut) + 1 or cut
        train.append(t[:cut])
        calib.append(t[cut:])
    tok = M.Tok.train(train, args.vocab, args.tok_sample)
    tok.save(os.path.join(args.work, "tok.json"))
    log("tokenizer: vocab", tok.vocab, "(byte fallback)" if tok.tk is None else "(BPE)")
    ids = [tok.encode(t) for t in train]
    tr = np.concatenate(ids)
    log("train tokens:", len(tr), {n: len(x) for n, x in zip(M.TRAIN_SOURCES, ids)})
    for name, arr in (("calib", np.concatenate([tok.encode(t) for t in calib])),
                      ("in", tok.encode(texts[M.TEST_SOURCES["in"]])),
                      ("out", tok.encode(texts[M.TEST_SOURCES["out"]]))):
        np.save(os.path.join(args.work, "tokens_%s.npy" % name), arr.astype(np.uint16))
        log("%s tokens: %d" % (name, len(arr)))
    return tok, torch.from_numpy(tr.astype(np.int32)).to(dev)


def train_one(cfg, data, seconds, seed, batch, lr, dev):
    torch.manual_seed(seed)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    m = M.GPT(cfg).to(dev)
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    other = [p for n, p in m.named_parameters() if p.dim() < 2]
    kw = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=lr,
                            betas=(0.9, 0.95), **kw)
    cuda = dev.type == "cuda"

    def loss_fn(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = m(x)
        return F.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1).long())
    step_fn = torch.compile(loss_fn) if cuda and hasattr(torch, "compile") else loss_fn
    n_ctx = cfg.ctx
    span = torch.arange(n_ctx + 1, device=dev)
    warm, total, t_start, t_mark, losses = 150, None, time.time(), None, []
    step = 0
    while total is None or step < total:
        if step == 10:
            if cuda:
                torch.cuda.synchronize()
            t_mark = time.time()
        if step == 40 and total is None:
            if cuda:
                torch.cuda.synchronize()
            rate = 30 / (time.time() - t_mark)
            left = seconds - (time.time() - t_start)
            total = 40 + max(0, int(left * rate))
            log("  %.2f steps/s (%.2f Mtok/s): %d steps" % (rate, rate * batch * n_ctx / 1e6,
                                                            total))
        if total is not None:
            w = min(1.0, (step + 1) / warm)
            c = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total))))
            lr_now = lr * w * c
        else:
            lr_now = lr * min(1.0, (step + 1) / warm)
        for grp in opt.param_groups:
            grp["lr"] = lr_now
        off = torch.randint(0, len(data) - n_ctx - 1, (batch,), device=dev, generator=g)
        xy = data[off[:, None] + span[None, :]]
        try:
            loss = step_fn(xy[:, :-1], xy[:, 1:])
        except Exception as ex:  # noqa: BLE001  (torch.compile trouble: train eagerly)
            if step_fn is loss_fn:
                raise
            log("  torch.compile failed (%r); eager" % ex)
            step_fn = loss_fn
            loss = step_fn(xy[:, :-1], xy[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0 or (total is not None and step == total - 1):
            losses.append((step, float(loss.item())))
            log("  step %d loss %.4f lr %.2e" % (step, losses[-1][1], lr_now))
        step += 1
    if cuda:
        torch.cuda.synchronize()
    return m, {"steps": step, "tokens": step * batch * n_ctx,
               "seconds": time.time() - t_start, "losses": losses}


@torch.no_grad()
def test_ppl(m, arr, ctx, max_windows, dev):
    n = min(max_windows, (len(arr) - 1) // ctx)
    if n < 1:
        return float("nan"), 0
    t = torch.from_numpy(arr[:n * ctx + 1].astype(np.int64)).to(dev)
    nll, cnt = 0.0, 0
    for i in range(0, n, 8):
        idx = torch.stack([t[w * ctx:(w + 1) * ctx + 1] for w in range(i, min(n, i + 8))])
        logits = m(idx[:, :-1]).float()
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                               reduction="sum").item()
        cnt += idx[:, 1:].numel()
    return math.exp(nll / cnt), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tok-sample", type=int, default=12 << 20)
    ap.add_argument("--max-chars", type=int, default=0)
    ap.add_argument("--src", default="6,8,512")
    ap.add_argument("--tgt", default="4,6,384")
    ap.add_argument("--src-seconds", type=float, default=80)
    ap.add_argument("--tgt-seconds", type=float, default=55)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--test-windows", type=int, default=48)
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.max_chars, args.vocab, args.tok_sample = 300000, 512, 1 << 20
    os.makedirs(args.work, exist_ok=True)
    meta_path = os.path.join(args.work, "meta.json")
    if os.path.exists(meta_path) and not args.retrain:
        log("models found in", args.work, "(use --retrain to train again)")
        return 0
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    tok, data = prepare(args, dev)
    meta, report = {"vocab": tok.vocab, "ctx": args.ctx}, {}
    for name, shape, secs, seed, lr in (("source", args.src, args.src_seconds, 1, 1.5e-3),
                                        ("target", args.tgt, args.tgt_seconds, 2, 2e-3)):
        nl, nh, dm = (int(x) for x in shape.split(","))
        cfg = M.Cfg(tok.vocab, nl, nh, dm, args.ctx)
        log("training %s %s for %.0f s" % (name, shape, secs))
        m, st = train_one(cfg, data, secs, seed, args.batch, lr, dev)
        m.eval()
        st["params"] = sum(p.numel() for p in m.parameters())
        for split in ("in", "out"):
            arr = np.load(os.path.join(args.work, "tokens_%s.npy" % split))
            st["ppl_" + split], st["windows_" + split] = test_ppl(m, arr, args.ctx,
                                                                 args.test_windows, dev)
        log("%s: %d params, %d tokens, ppl in %.2f out %.2f" % (
            name, st["params"], st["tokens"], st["ppl_in"], st["ppl_out"]))
        M.save_weights(m, os.path.join(args.work, name + ".safetensors"))
        meta[name] = cfg.as_dict()
        report[name] = st
        del m
    with open(os.path.join(args.work, "train.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
