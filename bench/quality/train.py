#!/usr/bin/env python3
"""Trains the quality evaluation's model pair (or loads it when WORK already holds it).

One byte-level BPE (8k) trained on the train split, shared by both models; a source
(default 6 layers × 8 heads × 512) and a target (4 × 6 × 384), head dim 64, context CTX,
trained separately (seeds 1 and 2; --seed k: 1 + 10k and 2 + 10k) for a wall-clock
budget each (train_clock: the schedule follows the clock, so two models can share one GPU
as two processes). Stages: prepare
(tok.json, tokens_{train,calib,in,out}.npy, prep.json), source / target (WORK/<name>.
safetensors fp32, <name>.json: config, steps, tokens, epochs, held-out loss at each quarter
of the time, own test perplexity), meta (meta.json: the configs; train.json); all = each
in turn.

  train.py --data bench/quality/data --work DIR [--stage all] [--ctx 2048]
           [--src-seconds 80] [--tgt-seconds 55] [--smoke]   (--smoke: tiny, CPU)
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


def prepare(args):
    """Tokenizer and the token arrays of every split (WORK/tokens_*.npy, prep.json)."""
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
    np.save(os.path.join(args.work, "tokens_train.npy"), tr.astype(np.uint16))
    with open(os.path.join(args.work, "prep.json"), "w") as f:
        json.dump({"vocab": tok.vocab, "ctx": args.ctx, "train_tokens": int(len(tr))}, f)


def train_clock(cfg, data, seconds, seed, batch, lr, dev, val=None, warm_frac=0.03,
                log_every=200):
    """Trains a fresh model.GPT for `seconds` of wall clock: AdamW (0.9, 0.95; weight decay
    0.1 on matrices), clip 1, linear warm-up over warm_frac of the time, cosine to 10 %.
    The schedule follows elapsed time (not a step count), so a model that shares its GPU
    with other training processes, whose speed changes as they start and end, still ends
    on time with a finished schedule. On CUDA: bf16 autocast and torch.compile (the
    compile time, in the first step, is taken out of the schedule's span). val: token
    array; its loss (8 windows) is logged at each quarter of the time (convergence)."""
    torch.manual_seed(seed)
    cuda = dev.type == "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    m = M.GPT(cfg).to(dev)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    kw = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=lr,
                            betas=(0.9, 0.95), **kw)

    def loss_fn(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = m(x)
        return F.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1).long())
    step_fn = torch.compile(loss_fn) if cuda and hasattr(torch, "compile") else loss_fn
    span = torch.arange(cfg.ctx + 1, device=dev)
    t_start = time.time()
    t0, step, losses, vals, next_val = None, 0, [], [], 0.25
    while True:
        now = time.time()
        frac = 0.0 if t0 is None else (now - t0) / max(1e-3, seconds - (t0 - t_start))
        if frac >= 1.0:
            break
        c = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        lr_now = lr * min(1.0, frac / warm_frac + 0.01) * c
        for grp in opt.param_groups:
            grp["lr"] = lr_now
        off = torch.randint(0, len(data) - cfg.ctx - 1, (batch,), device=dev, generator=g)
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
        if t0 is None:  # the first step compiled the model: the schedule starts now
            t0 = time.time()
            log("  first step (compile) %.1f s" % (t0 - t_start))
        if step % log_every == 0:
            losses.append((step, float(loss.item())))
            log("  step %d loss %.4f lr %.2e" % (step, losses[-1][1], lr_now))
        if val is not None and frac >= next_val:
            vals.append((step, round(frac, 2), val_loss(m, val, cfg.ctx, dev)))
            log("  step %d (%.0f %% of the time): held-out loss %.4f" % (step, 100 * frac,
                                                                        vals[-1][2]))
            next_val += 0.25
        step += 1
    if cuda:
        torch.cuda.synchronize()
    st = {"steps": step, "tokens": step * batch * cfg.ctx, "seconds": time.time() - t_start,
          "compile_seconds": (t0 or time.time()) - t_start, "losses": losses,
          "final_loss": float(loss.item())}
    if val is not None:
        vals.append((step, 1.0, val_loss(m, val, cfg.ctx, dev)))
        log("  step %d (end): held-out loss %.4f" % (step, vals[-1][2]))
        st["val_loss"] = vals
    return m.eval(), st


@torch.no_grad()
def val_loss(m, arr, ctx, dev, windows=0):
    """Mean next-token loss over the first `windows` windows of arr (autocast as training)."""
    was = m.training
    m.eval()
    n = min(windows or (8 if dev.type == "cuda" else 1), (len(arr) - 1) // ctx)
    t = torch.as_tensor(np.asarray(arr[:n * ctx + 1], dtype=np.int64), device=dev)
    idx = torch.stack([t[w * ctx:(w + 1) * ctx + 1] for w in range(n)])
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        logits = m(idx[:, :-1])
    out = float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                idx[:, 1:].reshape(-1)))
    m.train(was)
    return out


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


MODELS = {  # name: (shape option, seed, learning rate)
    "source": ("src", 1, 1.5e-3),
    "target": ("tgt", 2, 2e-3),
}


def train_model(args, name, dev):
    """One model of the pair (stage source / target): WORK/<name>.safetensors + <name>.json."""
    with open(os.path.join(args.work, "prep.json")) as f:
        prep = json.load(f)
    opt, seed, lr = MODELS[name]
    seed += 10 * args.seed  # --seed k: another training of the same shapes (issue 21)
    nl, nh, dm = (int(x) for x in getattr(args, opt).split(","))
    cfg = M.Cfg(prep["vocab"], nl, nh, dm, args.ctx)
    data = torch.from_numpy(np.load(os.path.join(args.work, "tokens_train.npy"))
                            .astype(np.int32)).to(dev)
    val = np.load(os.path.join(args.work, "tokens_calib.npy"))
    secs = args.src_seconds if name == "source" else args.tgt_seconds
    log("training %s %s for %.0f s (batch %d x %d)" % (name, getattr(args, opt), secs,
                                                       args.batch, args.ctx))
    m, st = train_clock(cfg, data, secs, seed, args.batch, lr, dev, val=val)
    st["params"] = sum(p.numel() for p in m.parameters())
    st["seed"] = seed
    st["epochs"] = st["tokens"] / len(data)
    for split in ("in", "out"):
        arr = np.load(os.path.join(args.work, "tokens_%s.npy" % split))
        st["ppl_" + split], st["windows_" + split] = test_ppl(m, arr, args.ctx,
                                                             args.test_windows, dev)
    log("%s: %d params, %d steps, %d tokens (%.1f epochs), ppl in %.2f out %.2f" % (
        name, st["params"], st["steps"], st["tokens"], st["epochs"], st["ppl_in"],
        st["ppl_out"]))
    M.save_weights(m, os.path.join(args.work, name + ".safetensors"))
    with open(os.path.join(args.work, name + ".json"), "w") as f:
        json.dump({"cfg": cfg.as_dict(), "stats": st}, f, indent=1)


def write_meta(args):
    """meta.json (vocab, ctx, configs; evaluate.py loads the pair from it) and train.json."""
    with open(os.path.join(args.work, "prep.json")) as f:
        prep = json.load(f)
    meta, report = {"vocab": prep["vocab"], "ctx": args.ctx}, {"train_tokens": prep["train_tokens"]}
    for name in MODELS:
        with open(os.path.join(args.work, name + ".json")) as f:
            one = json.load(f)
        meta[name], report[name] = one["cfg"], one["stats"]
    with open(os.path.join(args.work, "train.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.work, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--stage", default="all", choices=("all", "prepare", "source", "target",
                                                        "meta"),
                    help="all = prepare, source, target, meta in turn; the GPU run starts "
                    "source and target as two processes after prepare")
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
    ap.add_argument("--seed", type=int, default=0,
                    help="training seed index k (model seeds 1 + 10k, 2 + 10k)")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.max_chars, args.vocab, args.tok_sample = 300000, 512, 1 << 20
    os.makedirs(args.work, exist_ok=True)
    if args.stage in ("all", "prepare") and os.path.exists(
            os.path.join(args.work, "meta.json")) and not args.retrain:
        log("models found in", args.work, "(use --retrain to train again)")
        return 0
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.stage in ("all", "prepare"):
        prepare(args)
    for name in MODELS:
        if args.stage in ("all", name):
            train_model(args, name, dev)
    if args.stage in ("all", "meta"):
        write_meta(args)
    log("done (%s)" % args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
