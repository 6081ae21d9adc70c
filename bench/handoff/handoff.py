#!/usr/bin/env python3
"""Hand-off benchmark at real model shapes (issue 10; bench/handoff/run.sh runs it).

Source: a Qwen2.5-14B-shaped model (48 layers, 40 heads, 8 KV heads, width 5120); target:
a Llama-3.1-8B-shaped one (32 layers, 32 heads, 8 KV heads, width 4096, FFN 14336); random
bf16 weights, RoPE, SDPA (flash backend) for native attention, one H200, one process (the
target opens its own channel; rows cross through the daemon either way).

Per N (largest first), all in this process, ratios against the target's full prefill:
  1. target full prefill (TTFT), source full prefill (CUDA events, median of --reps);
  2. density: the source's Top-P is chosen (bisection on one exported layer's real Q/K)
     so that the target's mapped heads attend --density of the causal blocks (random
     weights give unstructured maps: Top-P then sets the density);
  3. per variant (prob FP8, prob U8_LOG, mask): the source prefills again, extracting
     each exported layer (mf_extract_cuda; LSE from the flash kernel when torch exposes
     it) and putting its rows to mapflowd from a second thread while it goes on; the
     target gets the rows (leases: device pointers in the daemon's GPU arena through CUDA
     IPC, or host views copied to the GPU) and prefills with mf_apply_cuda on layers ≥ L0
     (hand-off latency = source done → target's first token); then --reps timed reuse
     prefills; GPU memory held by rows (daemon stats); rows deleted;
  4. a FlexPrefill-like baseline: the target's own block-sparse attention on the same
     layers, blocks chosen at run time from mean-pooled Q/K (128-token blocks, the
     highest-scoring blocks per row up to the same density, plus sink and diagonal),
     flex_attention (compiled);
then a routing simulation (sim.py) on the measured times, the table (printed last), JSON
and a PNG of TTFT against N.

Put/get path, chosen at run time and printed: "gpu" when the Python binding has the GPU
tier API (Channel(gpu_device=…), put_device, rows with .device_ptr), else "host" (rows
copied to pinned host memory and put through the host arena; leased host views copied
to the GPU). --dry: tiny shapes on the CPU with the C reference kernels
(libmfkernels_ref.so), for checking the script without a GPU.
"""
import argparse
import ctypes as C
import json
import math
import os
import queue
import statistics
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "quality"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, HERE)

NS = "handoff"
B = 64
T0 = float(os.environ.get("HANDOFF_T0") or time.time())  # two-GPU workers: the source's
TAG = ""  # "peer" / "staged" in a two-GPU target worker (handoff_2gpu.py)


def log(*a):
    print("[%6.1fs]%s" % (time.time() - T0, " [%s]" % TAG if TAG else ""), *a, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="mapflowd unix socket path")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/handoff"))
    ap.add_argument("--ns", default=os.environ.get("HANDOFF_NS"),
                    help="comma list of N (default 32768,16384,8192; --dry 512,256)")
    ap.add_argument("--reps", type=int, default=int(os.environ.get("HANDOFF_REPS", "3")))
    ap.add_argument("--density", type=float,
                    default=float(os.environ.get("HANDOFF_DENSITY", "0.10")),
                    help="blocks the target's mapped heads attend (fraction of causal)")
    ap.add_argument("--l0", type=int, default=int(os.environ.get("HANDOFF_L0", "2")))
    ap.add_argument("--variants", default=os.environ.get("HANDOFF_VARIANTS"),
                    help="default prob_fp8,prob_u8log,mask (two GPUs: prob_fp8)")
    ap.add_argument("--no-flex", action="store_true",
                    default=os.environ.get("HANDOFF_FLEX", "1") == "0")
    ap.add_argument("--budget", type=float,
                    default=float(os.environ.get("HANDOFF_BUDGET", "285")),
                    help="seconds for this script; later steps are skipped past it")
    ap.add_argument("--path", default=os.environ.get("HANDOFF_PATH", "auto"),
                    choices=["auto", "gpu", "host"])
    ap.add_argument("--row-bytes", dest="row_bytes", type=float,
                    default=float(os.environ.get("HANDOFF_ROW_BYTES", "0")),
                    help="memory for one variant's rows in the daemon (0: no limit); "
                    "prob mode is used on as many layers as fit, mask on the rest")
    ap.add_argument("--dry", action="store_true", help="tiny shapes, CPU, C reference kernels")
    ap.add_argument("--target-device", dest="target_device", type=int,
                    default=int(os.environ.get("HANDOFF_TARGET_DEVICE", "0")),
                    help="issue 14: ≥ 1 runs the target in its own process on this device "
                    "(handoff_2gpu.py); 0: one GPU, one process")
    ap.add_argument("--staged", type=int, default=int(os.environ.get("HANDOFF_STAGED", "1")),
                    help="two GPUs: also a target process with CUDA_VISIBLE_DEVICES=target "
                    "device (rows staged through the daemon's host arena)")
    ap.add_argument("--worker", choices=["peer", "staged"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-device", dest="worker_device", type=int, default=0,
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    two = a.target_device > 0 or a.worker
    if a.variants is None:
        a.variants = "prob_fp8" if two else "prob_fp8,prob_u8log,mask"
    if a.ns is None:
        a.ns = ("512" if two else "512,256") if a.dry else ("32768" if two else
                                                             "32768,16384,8192")
    a.ns = [int(x) for x in a.ns.split(",") if x.strip()]
    a.variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or not a.ns or any(n % 128 or n < 256 for n in a.ns) or a.reps < 1:
        ap.error("variants from %s; N multiples of 128, ≥ 256; reps ≥ 1" % list(VARIANTS))
    if not 0.0 < a.density < 1.0:
        ap.error("--density in (0, 1)")
    return a


# variant → (codec name, head mode name)
VARIANTS = {"prob_fp8": ("fp8", "prob"), "prob_u8log": ("u8log", "prob"),
            "mask": ("mask", "mask")}


# ==== timing ==============================================================================

class Clock:
    """CUDA events on the current stream (GPU) or perf_counter (CPU, --dry)."""

    def __init__(self, torch, cuda):
        self.t, self.cuda = torch, cuda

    def sync(self):
        if self.cuda:
            self.t.cuda.synchronize()

    def time(self, fn, reps, warm=1):
        """Median ms of reps calls after warm ones; also the last result."""
        out = None
        for _ in range(warm):
            out = fn()
        self.sync()
        ts = []
        for _ in range(reps):
            if self.cuda:
                s = self.t.cuda.Event(enable_timing=True)
                e = self.t.cuda.Event(enable_timing=True)
                s.record()
                out = fn()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e))
            else:
                t = time.perf_counter()
                out = fn()
                ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts), out

    def wall(self, fn):
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return (time.perf_counter() - t) * 1e3, out


# ==== profile =============================================================================

def variant_layers(var, src_layers, layer_map, n_prob):
    """Codec name per exported source layer and mode per target layer for a variant: prob
    rows on the first n_prob exported layers (what fits in the daemon), mask rows elsewhere."""
    codec_name, mode_name = VARIANTS[var]
    names = {sl: codec_name if mode_name == "mask" or k < n_prob else "mask"
             for k, sl in enumerate(src_layers)}
    modes = {tl: "mask" if names[sl] == "mask" else "prob" for tl, sl in layer_map.items()}
    return names, modes


def make_profile(tgt, src, l0):
    """Target layer → source layer (same relative depth) for layers ≥ L0; W [Ht, Hs]:
    target head t mixes source heads s(t) and s(t)+1 (0.75 / 0.25), the usual shape of a
    fit (bench/gpu/NOTES.md); timing depends only on which entries are nonzero."""
    lt, ls = tgt.layers, src.layers
    layers = {t: min(ls - 1, round(t * (ls - 1) / max(1, lt - 1))) for t in range(l0, lt)}
    ht, hs = tgt.heads, src.heads
    w = np.zeros((ht, hs), dtype=np.float32)
    for t in range(ht):
        s = min(hs - 2, (t * hs) // ht)
        w[t, s], w[t, s + 1] = 0.75, 0.25
    return layers, w


# ==== rows: statistics read back from the row buffers =====================================

def row_stats(R, rows, hs, w, nb, take):
    """Per-head density (entries / (Hs · causal blocks)) and the target's effective
    density (blocks its heads attend through W's nonzero sources) of one layer's rows.
    take(idx) gathers bytes of the row buffers at int64 addresses relative to rows.base."""
    offs = np.asarray(rows.offs, dtype=np.int64)
    hdr = take((offs[:, None] + np.arange(48)[None, :]).ravel()).reshape(len(offs), 48)
    import struct
    idx, ents = [], []
    for i, (r, o) in enumerate(zip(hdr, offs)):
        f = struct.unpack_from("<IHBBQIIIHHIIfI", r.tobytes())
        magic, codec, mlen, blk, ncols, ne = f[0], f[2], f[3], f[7], f[10], f[11]
        if magic != R.MAGIC or blk != i:
            raise RuntimeError("row_stats: row %d: magic %#x block %d" % (i, magic, blk))
        lay = R.layout(codec, B, ncols, ne, mlen)
        idx.append(o + lay["head_mask"] + np.arange(8 * ncols))
        ents.append(ne)
    hm = take(np.concatenate(idx)).view(np.uint64)
    causal = nb * (nb + 1) / 2
    tmask = np.zeros(w.shape[0], dtype=np.uint64)
    for t in range(w.shape[0]):
        for s in np.nonzero(w[t] > 0)[0]:
            tmask[t] |= np.uint64(1) << np.uint64(s)
    eff = ((hm[:, None] & tmask[None, :]) != 0).sum()
    return {"per_head": sum(ents) / (hs * causal), "eff": float(eff) / (w.shape[0] * causal),
            "cols": len(hm) / causal, "entries": ents}


def flexprefill_keep(t, q, k, density, bf=128):
    """FlexPrefill's query-aware selection at a fixed budget: softmax(pooled Q · pooled
    Kᵀ / √d) over 128-token blocks, per head the sink, the diagonal and the top-scoring
    others of query block i, ⌈density·(i+1)⌉ blocks in all (as MapFlow's density counts
    its forced blocks too). q [N, Hq, d], k [N, Hkv, d] → keep [Hq, nb, nb] bool
    (causal)."""
    n, hq, d = q.shape
    hkv, nbf = k.shape[1], n // bf
    ii = t.arange(nbf, device=q.device)
    causal_b = ii[None, :] <= ii[:, None]
    budget = t.clamp(t.ceil(density * (ii + 1).float()) - 2, min=0).long()
    qp = q.view(nbf, bf, hq, d).mean(1, dtype=t.float32).transpose(0, 1)  # [H, nbf, d]
    kp = k.view(nbf, bf, hkv, d).mean(1, dtype=t.float32).transpose(0, 1)
    kp = kp.repeat_interleave(hq // hkv, dim=0)
    sc = (qp @ kp.transpose(1, 2)) / math.sqrt(d)
    forced = (ii[None, :] == 0) | (ii[None, :] == ii[:, None])
    sc = sc.masked_fill(~causal_b | forced, float("-inf")).softmax(-1)
    rank = sc.argsort(-1, descending=True).argsort(-1)
    keep = (rank < budget[None, :, None]) & causal_b & ~forced
    return keep | forced[None]


# ==== put / get ===========================================================================

class Store:
    """The channel to mapflowd and the two paths (gpu tier / host tier)."""

    def __init__(self, mapflow, sock, path, dry, torch, gpu_device=0, name="handoff"):
        self.mf, self.t, self.dry = mapflow, torch, dry
        self.stage_s = 0.0  # host views copied to the GPU (_stage), seconds
        self.path, self.why, self.gpu_info = None, "", {}
        self.ch = None
        want_gpu = path == "gpu" or (path == "auto" and not dry)
        if want_gpu:
            try:
                self.ch = mapflow.Channel("unix:" + sock, ns=NS, want_arena=True,
                                          client_name=name, gpu_device=gpu_device,
                                          timeout_ms=120000)
                if not hasattr(self.ch, "put_device"):
                    raise TypeError("binding has no put_device")
                self.path = "gpu"
                info = getattr(self.ch, "gpu_info", None)
                gi = info() if callable(info) else {}
                self.why = ("driver %s, arenas mapped %s of %s, peer %s %s" % (
                    gi.get("driver"), gi.get("mapped"), gi.get("announced"), gi.get("peer"),
                    gi.get("why", ""))).strip() if gi else "gpu_info() not in binding"
                self.gpu_info = gi
            except TypeError as e:  # the binding before the GPU tier: no gpu_device argument
                self.why = "binding without GPU tier API (%s)" % e
                if self.ch is not None:
                    self.ch.close()
                    self.ch = None
        if self.ch is None:
            self.ch = mapflow.Channel("unix:" + sock, ns=NS, want_arena=True,
                                      client_name=name, timeout_ms=120000)
            self.path = "host"
            self.why = self.why or ("requested" if path == "host" else "--dry")
        self.pinned = None
        self.counts = {}
        self.batch_ok = True
        self.fake = None
        # several puts in flight: each is two round trips plus the daemon's check
        self.pool = ThreadPoolExecutor(4) if self.path == "gpu" else None

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def _put_ptrs(self, ptrs, sizes):
        """mf_put_batch on rows already in this process's host memory (no Python copy:
        the binding's put_batch copies each row into bytes first)."""
        mf = self.mf
        step = 1024
        for a in range(0, len(ptrs), step):
            p, s = ptrs[a:a + step], sizes[a:a + step]
            items = (mf._PutItem * len(p))()
            for i, (x, n) in enumerate(zip(p, s)):
                items[i].row, items[i].len = x, n
            st = mf._lib.mf_put_batch(self.ch._h, items, len(p), 0, -1)
            if st != 0:
                raise mf.MapflowError(st, self.ch.last_error)
            for i in range(len(p)):
                self.count("put_" + mf._TIERS.get(items[i].result.tier, "none"))

    def put_rows(self, rows):
        """Puts one layer's rows (a mfk.RowSet whose work is finished)."""
        ptrs, sizes = rows.ptrs(), [int(s) for s in rows.sizes]
        if self.path == "gpu" and self.dry:
            ptrs = self._fake_device(rows)
        if self.path == "gpu":
            batch = getattr(self.ch, "put_device_batch", None)
            if batch is not None and self.batch_ok:
                try:  # assumed shape: [(device address, length)] → [PutResult]
                    for r in batch(list(zip(ptrs, sizes))):
                        self.count("put_" + str(getattr(r, "tier", "?")))
                    return
                except TypeError as e:
                    log("put_device_batch(%s): per-row put_device instead" % e)
                    self.batch_ok = False
            for r in self.pool.map(lambda pn: self.ch.put_device(pn[0], pn[1]),
                                   zip(ptrs, sizes)):
                self.count("put_" + str(getattr(r, "tier", "?")))
            return
        if self.dry:
            self._put_ptrs(ptrs, sizes)
            return
        used = rows.offs[-1] + sizes[-1]
        if self.pinned is None or self.pinned.numel() < used:
            self.pinned = self.t.empty(int(used * 1.25), dtype=self.t.uint8, pin_memory=True)
        self.pinned[:used].copy_(rows.buf[:used])  # synchronous: the row bytes are here
        base = self.pinned.data_ptr()
        self._put_ptrs([base + o for o in rows.offs], sizes)

    def _fake_device(self, rows):
        """--dry on the GPU path (run.sh with HANDOFF_FAKECUDA): the reference kernels
        write host memory, so rows are copied into memory of the fake CUDA driver
        (tests/fakecuda: device memory is host-mapped) before put_device."""
        if self.fake is None:
            self.fake = C.CDLL(os.environ["MF_CUDA_DRIVER"])
            self.fake.cuInit(0)
            self.fake_ctx = C.c_void_p()
            self.fake.cuDevicePrimaryCtxRetain(C.byref(self.fake_ctx), 0)
            self.fake_buf = (0, 0)
        self.fake.cuCtxSetCurrent(self.fake_ctx)
        used = rows.offs[-1] + int(rows.sizes[-1])
        if self.fake_buf[1] < used:
            p = C.c_ulonglong()
            st = self.fake.cuMemAlloc_v2(C.byref(p), C.c_size_t(used))
            if st != 0:
                raise RuntimeError("fake cuMemAlloc: %d" % st)
            self.fake_buf = (p.value, used)
        C.memmove(self.fake_buf[0], rows.base, used)
        return [self.fake_buf[0] + o for o in rows.offs]

    def get_layers(self, model, tokens, layers, nb):
        """Leased rows of every layer: ({layer: (ptrs, sizes)}, results to release,
        staged device buffers). Device rows are used in place; host rows are copied to
        the GPU (one buffer per layer) unless --dry (the C reference reads them)."""
        per_call = max(1, 4096 // max(1, nb))
        out, results, staged = {}, [], []
        ls = list(layers)
        for a in range(0, len(ls), per_call):
            chunk = ls[a:a + per_call]
            res = self.ch.get_prefix(model, B, tokens, chunk, lease=True)
            results.append(res)
            rows = list(res)
            if len(rows) != nb * len(chunk):
                raise RuntimeError("get_prefix: %d rows for %d layers × %d blocks"
                                   % (len(rows), len(chunk), nb))
            for li, layer in enumerate(chunk):
                lr = rows[li * nb:(li + 1) * nb]
                bad = [r for r in lr if not r.ok]
                if bad:
                    raise RuntimeError("get_prefix layer %d: %r" % (layer, bad[0]))
                ptrs, sizes, host = [0] * nb, [0] * nb, []
                for i, r in enumerate(lr):
                    if r.block != i:
                        raise RuntimeError("get_prefix: layer %d row %d is block %d"
                                           % (layer, i, r.block))
                    dp = getattr(r, "device_ptr", 0) if getattr(r, "on_device", 0) else 0
                    if dp:
                        ptrs[i], sizes[i] = dp, int(getattr(r, "length", 0) or
                                                    len(r.data or b""))
                        self.count("get_device")
                    else:
                        host.append(i)
                        sizes[i] = len(r.data)
                        self.count("get_host")
                if host:
                    self._stage(lr, host, ptrs, staged)
                out[layer] = (ptrs, sizes)
        return out, results, staged

    def _stage(self, lr, idx, ptrs, staged):
        t = self.t
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.frombuffer on read-only views
            if self.dry:
                for i in idx:
                    ptrs[i] = np.frombuffer(lr[i].data, dtype=np.uint8).ctypes.data
                return
            t0 = time.perf_counter()
            offs, tot = [], 0
            for i in idx:
                offs.append(tot)
                tot += (len(lr[i].data) + 255) & ~255
            dev = t.empty(tot, dtype=t.uint8, device="cuda")
            for i, o in zip(idx, offs):
                src = t.frombuffer(lr[i].data, dtype=t.uint8)
                dev[o:o + src.numel()].copy_(src)
            staged.append(dev)
            for i, o in zip(idx, offs):
                ptrs[i] = dev.data_ptr() + o
            t.cuda.current_stream().synchronize()
            self.stage_s += time.perf_counter() - t0

    def release(self, results):
        for r in results:
            try:
                r.release()
            finally:
                r.close()

    def gpu_used(self):
        try:
            st = self.ch.stats()
            return sum(x["used_bytes"] for x in st["tiers"] if x["tier"] == "gpu")
        except Exception:  # noqa: BLE001
            return None

    def delete(self, model):
        try:
            return self.ch.delete_model(model)
        except Exception as e:  # noqa: BLE001
            log("delete_model %s: %s" % (model, e))
            return 0


class Putter:
    """Puts rows from a second thread while the source goes on; each scratch slot is
    reused once its rows are in the daemon (two slots: extract of layer l + 1 overlaps
    the put of layer l)."""

    def __init__(self, store, n_slots=2):
        self.store = store
        self.q = queue.Queue()
        self.free = [threading.Event() for _ in range(n_slots)]
        for f in self.free:
            f.set()
        self.err = None
        self.put_s = 0.0
        self.bytes = 0
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            slot, rows = item
            try:
                if self.err is None:
                    t = time.perf_counter()
                    self.store.put_rows(rows)
                    self.put_s += time.perf_counter() - t
                    self.bytes += rows.total_bytes()
            except Exception as e:  # noqa: BLE001
                self.err = e
            finally:
                self.free[slot].set()

    def slot(self, k):
        s = k % len(self.free)
        self.free[s].wait()
        if self.err is not None:
            raise self.err
        self.free[s].clear()
        return s

    def submit(self, slot, rows):
        self.q.put((slot, rows))

    def finish(self):
        self.q.put(None)
        self.th.join()
        if self.err is not None:
            raise self.err


# ==== the benchmark =======================================================================

def shapes(dry):
    """(target, source) shapes: the real ones, or tiny ones of the same kind (--dry)."""
    from model import SOURCE, TARGET, tiny
    if dry:
        return tiny(TARGET, 4, 4, 2, 32, 256), tiny(SOURCE, 6, 5, 1, 32, 320)
    return TARGET, SOURCE


def n_prob_layers(bench, n, st):
    """Prob rows of one layer (FP8 and U8_LOG tiles are 1 byte): how many exported layers
    fit --row-bytes in prob mode (the rest mask). Returns (bytes per layer, layers)."""
    R = bench.R
    per_layer = sum(R.align16(R.layout(R.FP8, B, i + 1, e, 16)["total"])
                    for i, e in enumerate(st["entries_measured"]))
    n_prob = len(bench.src_layers)
    if bench.a.row_bytes and per_layer * n_prob > bench.a.row_bytes:
        n_prob = int(bench.a.row_bytes // per_layer)
        log("N=%d: prob rows ≈ %.2f GB per layer: %d of %d mapped layers in prob mode "
            "(the rest mask), to fit %.1f GB of row memory"
            % (n, per_layer / 1e9, n_prob, len(bench.src_layers), bench.a.row_bytes / 1e9))
    return per_layer, n_prob


class Bench:
    def __init__(self, a):
        import torch
        self.a, self.t = a, torch
        import mfk
        import rows as R
        import mapflow
        from model import Model
        self.mfk, self.R = mfk, R
        self.cuda = not a.dry
        if self.cuda and not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --dry on a CPU machine)")
        dev = torch.device("cuda" if self.cuda else "cpu")
        self.dev = dev
        ts, ss = shapes(a.dry)
        self.be = mfk.Ref(B) if a.dry else mfk.Cuda(B)
        self.clock = Clock(torch, self.cuda)
        log("torch %s, device %s, path request %s" % (torch.__version__, dev, a.path))
        t = time.perf_counter()
        self.tgt = Model(ts, dev, seed=1)
        self.src = Model(ss, dev, seed=2)
        self.clock.sync()
        log("models: target %s %.1f GB, source %s %.1f GB (random bf16, %.1f s)"
            % (ts.name, self.tgt.bytes() / 1e9, ss.name, self.src.bytes() / 1e9,
               time.perf_counter() - t))
        self.l0 = min(a.l0, ts.layers - 1)
        self.map, self.w = make_profile(ts, ss, self.l0)
        self.src_layers = sorted(set(self.map.values()))
        self.store = Store(mapflow, a.socket, a.path, a.dry, torch)
        log("path: %s (%s)" % (self.store.path, self.store.why))
        self.flex = None
        if not a.no_flex and self.cuda:
            try:
                from torch.nn.attention.flex_attention import BlockMask, flex_attention
                self.BlockMask = BlockMask
                self.flex = torch.compile(flex_attention, dynamic=False)
            except Exception as e:  # noqa: BLE001
                log("flex_attention unavailable: %s" % e)
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.res = {"path": self.store.path, "path_why": self.store.why,
                    "target": vars(ts), "source": vars(ss), "l0": self.l0,
                    "mapped_layers": len(self.map), "exported_source_layers":
                    len(self.src_layers), "block": B, "density_goal": a.density,
                    "variants": a.variants, "reps": a.reps, "torch": torch.__version__,
                    "gpu_info": self.store.gpu_info, "rows": []}

    def left(self):
        return self.a.budget - (time.time() - T0)

    # -- attention hooks --
    def tokens(self, n):
        g = np.random.default_rng(n)
        tok = g.integers(0, min(self.tgt.s.vocab, self.src.s.vocab), n).astype(np.int64)
        return tok, self.t.from_numpy(tok).to(self.dev)

    def dense(self, i, xn, m):
        q, k, v = m.qkv(i, xn)
        return m.native_attention(q, k, v)[0]

    def capture_hook(self, layer, store):
        def attn(i, xn, m):
            q, k, v = m.qkv(i, xn)
            o, lse = m.native_attention(q, k, v, want_lse=(i == layer))
            if i == layer:
                store.update(q=q, k=k, lse=lse)
            return o
        return attn

    def extract(self, q, k, top_p, codec, layer, tok32, slot, lse, entries, model):
        """mf_extract with a per-row entry bound; on overflow the bound doubles."""
        e = entries
        for _ in range(4):
            try:
                return self.be.extract(q, k, top_p, codec, layer, tok32, slot, lse=lse,
                                       entries=e, model=model, ns=NS.encode())
            except self.mfk.RowOverflow:
                e = None if e is None else [2 * x for x in e]
        return self.be.extract(q, k, top_p, codec, layer, tok32, slot, lse=lse,
                               model=model, ns=NS.encode())

    def take_fn(self, rows):
        if self.cuda:
            buf = rows.buf

            def take(idx):
                return buf[self.t.from_numpy(idx).to(buf.device)].cpu().numpy()
        else:
            arr = (C.c_ubyte * (rows.offs[-1] + rows.sizes[-1])).from_address(rows.base)
            a = np.frombuffer(arr, dtype=np.uint8)

            def take(idx):
                return a[idx]
        return take

    # -- steps --
    def calibrate(self, n, cap, tok32):
        """Source Top-P giving the goal density on one exported layer, and per-row entry
        bounds (1.3 × what that layer kept + slack) for the row buffers."""
        hs, nb, goal = self.src.s.heads, n // B, self.a.density
        q, k, lse = cap["q"], cap["k"], cap.get("lse")
        layer = self.src_layers[len(self.src_layers) // 2]

        def measure(p):
            rows = self.extract(q, k, p, self.R.MASK, layer, tok32, "cal", lse, None, b"cal")
            st = row_stats(self.R, rows, hs, self.w, nb, self.take_fn(rows))
            return st, rows
        lo, hi = 1e-3, 0.999
        best = None
        for _ in range(8 if self.cuda else 5):
            p = math.sqrt(lo * hi)
            st, rows = measure(p)
            if best is None or abs(st["eff"] - goal) < abs(best[1]["eff"] - goal):
                best = (p, st, rows)
            if st["eff"] > goal:
                hi = p
            else:
                lo = p
        p, st, rows = best
        st["entries_measured"] = st.pop("entries")
        entries = [min(hs * (i + 1), int(1.3 * e) + 2 * hs + 8)
                   for i, e in enumerate(st["entries_measured"])]
        log("N=%d: source Top-P %.4f → per-head density %.3f, target effective %.3f "
            "(goal %.3f), row columns %.3f" % (n, p, st["per_head"], st["eff"], goal,
                                               st["cols"]))
        return p, st, entries

    def source_handoff(self, n, tok, tok32, codecs, top_p, entries, model):
        """Source prefill with extract + put of every exported layer. Returns (wall ms,
        extract ms (CUDA events), put seconds in the put thread, row bytes, put tail ms
        after the prefill)."""
        t, putter = self.t, Putter(self.store)
        evs, k = [], [0]
        lse_used = [0, 0]

        def attn(i, xn, m):
            q, kk, v = m.qkv(i, xn)
            exp = i in self.src_layers
            o, lse = m.native_attention(q, kk, v, want_lse=exp)
            if exp:
                lse_used[0 if lse is not None else 1] += 1
                slot = putter.slot(k[0])
                k[0] += 1
                if self.cuda:
                    s, e = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                    s.record()
                tt = time.perf_counter()
                rows = self.extract(q, kk, top_p, codecs[i], i, tok32, ("src", slot), lse, entries,
                                    model)
                if self.cuda:
                    e.record()
                    evs.append((s, e))
                else:
                    evs.append(time.perf_counter() - tt)
                putter.submit(slot, rows)
            return o
        self.clock.sync()
        t0 = time.perf_counter()
        first = self.src.prefill(tok, attn)
        self.clock.sync()
        t_pre = time.perf_counter()
        putter.finish()
        t1 = time.perf_counter()
        ext = sum(s.elapsed_time(e) for s, e in evs) if self.cuda else 1e3 * sum(evs)
        del first
        return {"wall_ms": (t1 - t0) * 1e3, "prefill_done_ms": (t_pre - t0) * 1e3,
                "extract_ms": ext, "put_thread_ms": putter.put_s * 1e3,
                "put_tail_ms": (t1 - t_pre) * 1e3, "row_bytes": putter.bytes,
                "lse": "flash" if lse_used[1] == 0 else
                ("computed by extract" if lse_used[0] == 0 else "mixed")}, t1

    def target_reuse_attn(self, n, rowsets, modes):
        """modes: {target layer: "prob" | "mask"} (every head of a layer alike)."""
        mfk = self.mfk
        ht = self.tgt.s.heads
        mode = {"prob": np.full(ht, mfk.PROB, np.uint8),
                "mask": np.full(ht, mfk.MASK_MODE, np.uint8)}
        top_p = np.ones(ht, dtype=np.float32)
        exact_last = 1

        def attn(i, xn, m):
            if i not in rowsets:
                return self.dense(i, xn, m)
            prob = modes[i] == "prob"
            q, k, v = m.qkv(i, xn, q_rows=B * exact_last if prob else None)
            o, _ = self.be.apply(rowsets[i], self.w, mode[modes[i]], top_p, q, k, v,
                                 exact_last)
            return o.view(n, -1).to(q.dtype)
        return attn

    def flex_attn(self, n, density):
        """FlexPrefill-like attention for layers ≥ L0 (flexprefill_keep → BlockMask →
        compiled flex_attention, GQA)."""
        t = self.t
        bf = 128
        nbf = n // bf
        ii = t.arange(nbf, device=self.dev)
        bm_cls = self.BlockMask

        def causal(b, h, qi, ki):
            return qi >= ki

        def attn(i, xn, m):
            q, k, v = m.qkv(i, xn)
            if i < self.l0:
                return m.native_attention(q, k, v)[0]
            hq, d = q.shape[1], q.shape[2]
            keep = flexprefill_keep(t, q, k, density, bf)
            if i == self.l0:
                self.flex_density = float(keep.sum()) / (hq * nbf * (nbf + 1) / 2)
            full = keep & (ii[None, None, :] < ii[None, :, None])
            full_n = full.sum(-1).to(t.int32)[None]
            full_i = t.argsort((~full).to(t.int8), dim=-1, stable=True).to(t.int32)[None]
            part_n = t.ones(1, hq, nbf, dtype=t.int32, device=self.dev)
            part_i = ii.view(1, 1, nbf, 1).expand(1, hq, nbf, nbf).contiguous().to(t.int32)
            bm = bm_cls.from_kv_blocks(part_n, part_i, full_n, full_i, BLOCK_SIZE=bf,
                                       mask_mod=causal)
            q4 = q.transpose(0, 1).unsqueeze(0).contiguous()
            k4 = k.transpose(0, 1).unsqueeze(0).contiguous()
            v4 = v.transpose(0, 1).unsqueeze(0).contiguous()
            o = self.flex(q4, k4, v4, block_mask=bm, enable_gqa=True)
            return o[0].transpose(0, 1).reshape(n, hq * d)
        return attn

    def run_n(self, n):
        a, t = self.a, self.t
        tok_np, tok = self.tokens(n)
        tok32 = tok_np.astype(np.uint32)
        nb = n // B
        rec = {"N": n}
        reps = a.reps
        # 1. full prefills (the source's warm-up run captures one layer's Q, K, LSE)
        rec["target_full_ms"], _ = self.clock.time(
            lambda: self.tgt.prefill(tok, self.dense), reps)
        log("N=%d: target full prefill %.1f ms" % (n, rec["target_full_ms"]))
        cap = {}
        cal_layer = self.src_layers[len(self.src_layers) // 2]
        self.src.prefill(tok, self.capture_hook(cal_layer, cap))
        rec["source_full_ms"], _ = self.clock.time(
            lambda: self.src.prefill(tok, self.dense), max(1, reps - 1), warm=0)
        log("N=%d: source full prefill %.1f ms" % (n, rec["source_full_ms"]))
        # 2. density
        top_p, st, entries = self.calibrate(n, cap, tok32)
        cap.clear()
        self.be.pool.pop("cal", None) if hasattr(self.be, "pool") else None
        rec.update(source_top_p=top_p, density_per_head=st["per_head"],
                   density_eff=st["eff"], row_columns=st["cols"])
        per_layer, n_prob = n_prob_layers(self, n, st)
        rec.update(prob_row_bytes_per_layer_est=per_layer, prob_layers=n_prob)
        # 3. variants
        need = 25.0  # seconds a variant takes, updated with the last one at this N
        for var in a.variants:
            if self.left() < need:
                log("N=%d %s: skipped (time budget: %.0f s left, ~%.0f s needed)"
                    % (n, var, self.left(), need))
                continue
            tv = time.perf_counter()
            model = "src-%s-%d" % (VARIANTS[var][0], n)
            names, modes = variant_layers(var, self.src_layers, self.map, n_prob)
            codecs = {sl: self.mfk.CODECS[x] for sl, x in names.items()}
            self.store.counts = {}
            try:
                srec, t_src_done = self.source_handoff(n, tok, tok32, codecs, top_p, entries,
                                                       model.encode())
                gpu_used = self.store.gpu_used()
                t_get0 = time.perf_counter()
                layers = {tl: sl for tl, sl in self.map.items()}
                got, results, staged = self.store.get_layers(model, tok32,
                                                             sorted(set(layers.values())), nb)
                get_ms = (time.perf_counter() - t_get0) * 1e3
                rowsets = {tl: self.mfk.RowSet.at(got[sl][0], got[sl][1], codecs[sl])
                           for tl, sl in layers.items()}
                attn = self.target_reuse_attn(n, rowsets, modes)
                first = self.tgt.prefill(tok, attn)
                int(first[0])  # the first token is on the host: hand-off done
                t_first = time.perf_counter()
                ms, _ = self.clock.time(lambda: self.tgt.prefill(tok, attn), reps, warm=0)
                bad = self.be.check()  # rows the kernel refused so far (must stay 0)
                staged_b = sum(x.numel() for x in staged)
                self.store.release(results)
                rowsets = got = staged = attn = None
                self.store.delete(model)
                v = dict(srec, get_ms=get_ms, handoff_ms=(t_first - t_src_done) * 1e3,
                         prefill_ms=ms, ttft_ms=ms + get_ms,
                         gain=1.0 - ms / rec["target_full_ms"],
                         daemon_gpu_bytes=gpu_used, staged_gpu_bytes=staged_b,
                         bad_rows=bad, counts=dict(self.store.counts),
                         prob_layers=sum(1 for x in modes.values() if x == "prob"))
                v["source_extra_ms"] = srec["wall_ms"] - rec["source_full_ms"]
                v["handoff_overhead"] = (srec["extract_ms"] + srec["put_tail_ms"] + get_ms) / \
                    rec["source_full_ms"]
                rec[var] = v
                log("N=%d %s: prefill %.1f ms (%.1f%% vs full), get %.1f ms, hand-off %.1f ms,"
                    " source +%.1f ms (extract %.1f, put thread %.1f, tail %.1f), rows %.2f GB,"
                    " %s" % (n, var, ms, -100 * v["gain"], get_ms, v["handoff_ms"],
                             v["source_extra_ms"], srec["extract_ms"], srec["put_thread_ms"],
                             srec["put_tail_ms"], srec["row_bytes"] / 1e9, v["counts"]))
            except Exception as e:  # noqa: BLE001 — one variant failing must not stop the rest
                import traceback
                traceback.print_exc()
                rec[var] = {"error": "%s: %s" % (type(e).__name__, e)}
                self.store.delete(model)
            if self.cuda:
                t.cuda.empty_cache()
            need = 1.1 * (time.perf_counter() - tv)
        # 4. FlexPrefill-like baseline (compiling takes most of it)
        if self.flex is not None and self.left() > 30 + 4 * rec["target_full_ms"] / 1e3:
            try:
                fa = self.flex_attn(n, rec["density_eff"])
                tc = time.perf_counter()
                self.tgt.prefill(tok, fa)  # compiles for this N
                self.clock.sync()
                rec["flex_compile_s"] = time.perf_counter() - tc
                rec["flex_ms"], _ = self.clock.time(lambda: self.tgt.prefill(tok, fa), reps,
                                                    warm=0)
                rec["flex_gain"] = 1.0 - rec["flex_ms"] / rec["target_full_ms"]
                rec["flex_keep_density"] = self.flex_density
                log("N=%d: FlexPrefill-like %.1f ms (%.1f%% vs full; compile %.0f s)"
                    % (n, rec["flex_ms"], -100 * rec["flex_gain"], rec["flex_compile_s"]))
            except Exception as e:  # noqa: BLE001
                rec["flex_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
                log("N=%d: flex: %s" % (n, rec["flex_error"]))
        elif self.flex is not None:
            log("N=%d: FlexPrefill-like skipped (time budget)" % n)
        if not self.cuda:  # --dry: no flex_attention on old CPU torch; check the selection
            g = t.Generator().manual_seed(n)
            qx = t.randn(n, self.tgt.s.heads, 32, generator=g).to(t.bfloat16)
            kx = t.randn(n, self.tgt.s.kv_heads, 32, generator=g).to(t.bfloat16)
            keep = flexprefill_keep(t, qx, kx, rec["density_eff"])
            nbf = n // 128
            rec["flex_keep_density"] = float(keep.sum()) / (keep.shape[0] * nbf * (nbf + 1) / 2)
            log("N=%d: FlexPrefill-like selection (no flex_attention here): density %.3f"
                % (n, rec["flex_keep_density"]))
        return rec

    def run(self):
        ctx = self.t.cuda.stream(self.stream) if self.cuda else _Null()
        with ctx, self.t.no_grad():
            # kernel warm-up on a small N (lazy init, cuBLAS handles, scratch pools)
            n0 = 512 if self.cuda else self.a.ns[-1]
            _, tk = self.tokens(n0)
            self.tgt.prefill(tk, self.dense)
            self.src.prefill(tk, self.dense)
            for n in self.a.ns:
                if self.res["rows"] and self.left() < 20 + self.res["rows"][-1]["elapsed_s"] / 3:
                    log("N=%d: skipped (time budget: %.0f s left)" % (n, self.left()))
                    continue
                tn = time.perf_counter()
                r = self.run_n(n)
                r["elapsed_s"] = time.perf_counter() - tn
                self.res["rows"].append(r)
                if self.cuda:
                    self.t.cuda.empty_cache()
        self.res["gpu_total_bytes"] = (self.t.cuda.get_device_properties(0).total_memory
                                       if self.cuda else None)
        self.res["row_budget_bytes"] = self.a.row_bytes or None
        self.res["routing"] = routing(self.res)
        return self.res


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def best_variant(r, variants):
    ok = [(r[v]["prefill_ms"], v) for v in variants if isinstance(r.get(v), dict)
          and "prefill_ms" in r[v]]
    return min(ok) if ok else (None, None)


def routing(res):
    """sim.py on this run's measured times (the same as `sim.py --from-json handoff.json`)."""
    import sim
    return sim.from_result(res)


# ==== report ==============================================================================

def table(res):
    lines = []
    vs = res["variants"]
    head = ["N", "dens head/eff", "target full ms"] + ["%s ms (Δ)" % v for v in vs] + \
        ["flex-like ms (Δ)", "best vs flex", "source ms", "extract ms", "put tail ms",
         "get ms", "overhead % src", "hand-off ms", "rows GB"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in res["rows"]:
        full = r["target_full_ms"]
        cells = [str(r["N"]), "%.3f/%.3f" % (r.get("density_per_head", 0),
                                             r.get("density_eff", 0)), "%.1f" % full]
        for v in vs:
            x = r.get(v) or {}
            cells.append("%.1f (%+.1f%%)" % (x["prefill_ms"], -100 * x["gain"])
                         if "prefill_ms" in x else ("error" if "error" in x else "-"))
        fx = r.get("flex_ms")
        cells.append("%.1f (%+.1f%%)" % (fx, 100 * (fx / full - 1)) if fx else "-")
        ms, bv = best_variant(r, vs)
        cells.append("%+.1f%% (%s)" % (100 * (1 - ms / fx), bv) if fx and ms else "-")
        cells.append("%.1f" % r["source_full_ms"])
        x = r.get(bv) or {}
        if x:
            gb = x.get("daemon_gpu_bytes") or x.get("staged_gpu_bytes") or 0
            cells += ["%.1f" % x["extract_ms"], "%.1f" % x["put_tail_ms"], "%.1f" % x["get_ms"],
                      "%.1f" % (100 * x["handoff_overhead"]), "%.1f" % x["handoff_ms"],
                      "%.2f (%.2f)" % (x["row_bytes"] / 1e9, gb / 1e9)]
        else:
            cells += ["-"] * 6
        lines.append("| " + " | ".join(cells) + " |")
    ro = res.get("routing", {})
    if ro.get("variants"):
        import sim
        lines.append("")
        lines += sim.summary(ro)
    lines.append("path: %s (%s)" % (res["path"], res["path_why"]))
    return "\n".join(lines)


def plot(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log("no plot: %s" % e)
        return
    rows = sorted(res["rows"], key=lambda r: r["N"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ns = [r["N"] for r in rows]
    series = [("target full", [r["target_full_ms"] for r in rows])]
    for v in res["variants"]:
        series.append(("MapFlow " + v + " (get + prefill)",
                       [r[v]["ttft_ms"] if "ttft_ms" in (r.get(v) or {}) else None
                        for r in rows]))
    series.append(("FlexPrefill-like", [r.get("flex_ms") for r in rows]))
    series.append(("source full", [r["source_full_ms"] for r in rows]))
    for name, ys in series:
        pts = [(x, y) for x, y in zip(ns, ys) if y]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels(["%dk" % (n // 1024) if n >= 1024 else str(n) for n in ns])
    ax.set_xlabel("context N (tokens)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title("Hand-off TTFT, %s → %s (path %s)" % (res["source"]["name"],
                                                        res["target"]["name"], res["path"]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log("plot: %s" % path)


def main(argv=None):
    a = parse_args(argv)
    sys.modules.setdefault("handoff", sys.modules[__name__])  # one copy for handoff_2gpu
    if a.worker:  # a two-GPU target process (started by handoff_2gpu.TwoGpu)
        import handoff_2gpu
        return handoff_2gpu.worker_main(a)
    os.makedirs(a.out, exist_ok=True)
    two = None
    if a.target_device > 0:
        import handoff_2gpu as two
        b = two.TwoGpu(a)
    else:
        b = Bench(a)
    res = b.run()
    res["elapsed_s"] = time.time() - T0
    with open(os.path.join(a.out, "handoff.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    if two is None:
        plot(res, os.path.join(a.out, "handoff.png"))
    tab = table(res) if two is None else table(res) + "\n\n" + two.table(res)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(tab + "\n")
    print()
    print(tab)
    errs = [v for r in res["rows"] for v in a.variants if "error" in (r.get(v) or {})]
    return 1 if errs or not res["rows"] else 0


if __name__ == "__main__":
    sys.exit(main())
