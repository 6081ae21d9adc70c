#!/usr/bin/env python3
"""Hand-off benchmark at real model shapes (issues 10, 18; bench/handoff/run.sh runs it).

Source: a Qwen2.5-14B-shaped model (48 layers, 40 heads, 8 KV heads, width 5120); target:
a Llama-3.1-8B-shaped one (32 layers, 32 heads, 8 KV heads, width 4096, FFN 14336); random
bf16 weights, RoPE, dense attention = SDPA with enable_gqa and torch's own backend (cuDNN
on the H200; the LSE from the cuDNN op), one H200, one process (the target opens its own
channel; rows cross through the daemon either way).

Per N (largest first), all in this process, ratios against the target's full prefill:
  1. target full prefill (TTFT), source full prefill (CUDA events, min / median / max of
     --reps), one dense attention layer of each (backend, TFLOP/s);
  2. per density (the sweep --densities at the largest N, --density elsewhere): the
     source's Top-P is chosen (bisection on one exported layer's real Q/K) so that the
     target's mapped heads attend that density of the causal blocks (random weights give
     unstructured maps: Top-P then sets the density);
  3. per variant (prob FP8, prob U8_LOG, mask; --sweep-variants off the headline): the
     source prefills again, extracting each exported layer (mf_extract_cuda) and putting
     its rows to mapflowd from a second thread while it goes on; its cost is its wall
     time under export (first layer to the last row acknowledged, scratch-slot stalls
     included); the target gets the rows (leases: device pointers in the daemon's GPU
     arena through CUDA IPC, or host views copied to the GPU) and prefills with
     mf_apply_cuda on layers ≥ L0; TTFT = get + prefill to the first token (hand-off
     latency = source done → target's first token); GPU memory held by rows; rows deleted;
  4. the block-sparse baselines on the same layers, flex_attention (compiled, 128-token
     blocks, default options), selection inside the timed prefill (flexprefill.py):
     FlexPrefill (γ calibrated to the same density) and pooled-QK only;
then sim.py's workloads on the measured times, the tables (printed last), JSON and a PNG
of the speed-up over dense against density and N.

Put/get path, chosen at run time and printed: "gpu" when the Python binding has the GPU
tier API (Channel(gpu_device=…), put_device, rows with .device_ptr), else "host" (rows
copied to pinned host memory and put through the host arena; leased host views copied
to the GPU). --dry: tiny shapes on the CPU with the C reference kernels
(libmfkernels_ref.so), for checking the script without a GPU.

Source put path (issue 20): a layer's rows go into its put region in one launch
(mf_rows_copy_cuda) on the put thread's own stream, waiting only for that copy. With
--exporter fused, O comes from the kernel in the model's dtype (HANDOFF_O_FP32=1: fp32 O
and a cast, as before) and the rows' launches run on a second stream, waited for in the
put thread (HANDOFF_ROWS_STREAM=0: on the source's stream, sizes read back there).
The target's mapped layers get O from mf_apply_cuda in the model's dtype too (o_dtype: no
fp32 O, no cast; HANDOFF_O_FP32=1 applies to both sides).
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


def quality_density(path, ap):
    """MapFlow mask's density at its operating point in a bench/quality quality.json
    (chosen on dev, numbers on the test splits), and where it came from; an error when the
    run has none or it failed the quality bounds on a test split."""
    try:
        with open(path) as f:
            op = json.load(f)["operating_points"]["mapflow-mask"]
    except (OSError, ValueError, KeyError) as ex:
        ap.error("--quality-json %s: no MapFlow mask operating point (%s)" % (path, ex))
    if not op.get("variant") or op.get("density") is None or not op.get("passes_test"):
        ap.error("--quality-json %s: MapFlow mask has no test-passing operating point" % path)
    return float(op["density"]), "%s: %s (R = %s, test-passing%s)" % (
        path, op["variant"], op.get("R"), ", intervals too" if op.get("passes_test_ci") else "")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="mapflowd unix socket path")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/handoff"))
    ap.add_argument("--ns", default=os.environ.get("HANDOFF_NS"),
                    help="comma list of N (default 32768,16384,8192; --dry 512,256)")
    ap.add_argument("--reps", type=int, default=int(os.environ.get("HANDOFF_REPS", "5")))
    ap.add_argument("--density", type=float,
                    default=float(os.environ.get("HANDOFF_DENSITY", "0.10")),
                    help="blocks the target's mapped heads attend (fraction of causal)")
    ap.add_argument("--densities", default=os.environ.get("HANDOFF_DENSITIES"),
                    help="comma list: the density sweep, run at the largest N (default "
                    "0.05,0.10,0.20,0.35 on the GPU, 0.10,0.35 --dry); --density is its headline")
    ap.add_argument("--sweep-variants", dest="sweep_variants",
                    default=os.environ.get("HANDOFF_SWEEP_VARIANTS", "mask"),
                    help="variants run at the sweep's other densities (all at --density)")
    ap.add_argument("--gamma-tau", dest="tau", type=float,
                    default=float(os.environ.get("HANDOFF_TAU", "0.1")),
                    help="FlexPrefill's pattern-test threshold τ")
    ap.add_argument("--min-budget", dest="min_budget", type=int,
                    default=int(os.environ.get("HANDOFF_MIN_BUDGET", "1024")),
                    help="FlexPrefill's min_budget (tokens)")
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
    ap.add_argument("--quality-json", dest="quality_json",
                    default=os.environ.get("HANDOFF_QUALITY_JSON"),
                    help="a quality.json of bench/quality (issue 21): the headline --density "
                    "becomes MapFlow mask's dev-chosen, test-passing operating point there")
    ap.add_argument("--exporter", choices=("extract", "fused"),
                    default=os.environ.get("HANDOFF_EXPORTER", "extract"),
                    help="the source's exported layers: cuDNN attention + mf_extract_cuda "
                    "(extract), or mf_export_cuda's fused attention + rows (fused, sm_90, the "
                    "exporter that ships; its O replaces the layer's attention)")
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
    if a.exporter == "fused" and a.dry:
        ap.error("--exporter fused needs the GPU (mf_export_cuda); --dry runs the C reference")
    two = a.target_device > 0 or a.worker
    if a.variants is None:
        a.variants = "prob_fp8" if two else "prob_fp8,prob_u8log,mask"
    if a.ns is None:
        a.ns = ("512" if two else "512,256") if a.dry else ("32768" if two else
                                                             "32768,16384,8192")
    a.ns = [int(x) for x in a.ns.split(",") if x.strip()]
    a.variants = [v for v in a.variants.split(",") if v]
    if a.quality_json:
        a.density, a.density_source = quality_density(a.quality_json, ap)
    else:
        a.density_source = "--density (not a quality-checked operating point)"
    if a.densities is None:
        a.densities = "0.10,0.35" if a.dry else "0.05,0.10,0.20,0.35"
    a.densities = sorted({float(x) for x in a.densities.split(",") if x.strip()} | {a.density})
    a.sweep_variants = [v for v in a.sweep_variants.split(",") if v in a.variants]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or not a.ns or any(n % 128 or n < 256 for n in a.ns) or a.reps < 1:
        ap.error("variants from %s; N multiples of 128, ≥ 256; reps ≥ 1" % list(VARIANTS))
    if not all(0.0 < x < 1.0 for x in a.densities):
        ap.error("--density / --densities in (0, 1)")
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
        st, out = self.stats(fn, reps, warm)
        return st[1], out

    def stats(self, fn, reps, warm=1):
        """([min, median, max] ms of reps calls after warm ones), the last result."""
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
        return [min(ts), statistics.median(ts), max(ts)], out

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


# ==== put / get ===========================================================================

class Store:
    """The channel to mapflowd and the two paths (gpu tier / host tier)."""

    def __init__(self, mapflow, sock, path, dry, torch, gpu_device=0, name="handoff"):
        self.mf, self.t, self.dry = mapflow, torch, dry
        self.stage_s = 0.0  # host views copied to the GPU (_stage), seconds
        self.get_call_s = 0.0  # the last get_layers' time inside Channel.get_prefix
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
        # HANDOFF_PUT: inplace (default: the fused exporter writes mask rows straight into a
        # put region reserved by capacity), region (rows copied into an exact region), batch
        put = os.environ.get("HANDOFF_PUT", "inplace")
        self.region_ok = put != "batch"
        self.inplace_ok = put == "inplace"
        self.fake = None
        self.put_stream = None  # the put thread's own CUDA stream (stream())
        self.rows_st = None  # the exporter's row launches with async rows (rows_stream())
        # several puts in flight: each is two round trips plus the daemon's check
        self.pool = ThreadPoolExecutor(4) if self.path == "gpu" else None

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def stream(self):
        """The put thread's own CUDA stream: row copies into regions, sizes read back
        (made on first use)."""
        if self.put_stream is None:
            self.put_stream = self.t.cuda.Stream()
        return self.put_stream

    def rows_stream(self):
        """With async rows: the stream the exporter's row launches go to (the source
        thread's; made on first use). Not the put stream: the put thread's copy of layer l
        must not queue behind layer l + 1's rows."""
        if self.rows_st is None:
            self.rows_st = self.t.cuda.Stream()
        return self.rows_st

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

    def begin_inplace(self, model, layer, caps):
        """A put region reserved by capacity (caps: each row's bound) for one layer's rows,
        begun before the exporter writes them there; None when this run does not write in
        place or the daemon refuses (then the copy into an exact region, from now on)."""
        if not (self.path == "gpu" and not self.dry and self.inplace_ok and self.region_ok):
            return None
        try:
            return self.ch.put_region(model, layer, caps, capacities=True)
        except (TypeError, self.mf.MapflowError) as e:
            log("put_region(capacities=True): %s; rows copied into exact regions from now on"
                % e)
            self.inplace_ok = False
            return None

    def _commit_inplace(self, rows):
        """Rows the exporter wrote into their capacities region (rows.region; their work is
        finished): one commit with the sizes the kernel wrote; the daemon checks each row
        and gives each row's slack back to the arena."""
        reg = rows.region
        try:
            res = reg.commit(lengths=[int(x) for x in rows.sizes])
        finally:
            reg.close()
        self._count_region("put_inplace_rows", res)
        if int(res["committed"]) != len(rows.sizes):
            raise RuntimeError("in-place region: %d of %d rows committed (first refused: %s)"
                               % (int(res["committed"]), len(rows.sizes), res["first_failed"]))

    def put_rows(self, rows):
        """Puts one layer's rows (a mfk.RowSet whose work is queued before rows.ready, or
        finished (rows.synced); rows.key = (model, layer) when the caller knows them):
        into one put region (one GPU-arena reservation and one commit for the layer) when
        the binding and the daemon offer it and HANDOFF_PUT is not "batch", else with
        put_device_batch."""
        if getattr(rows, "region", None) is not None:  # written in place
            self._commit_inplace(rows)
            return
        ptrs, sizes = rows.ptrs(), [int(s) for s in rows.sizes]
        if self.path == "gpu" and self.dry:
            ptrs = self._fake_device(rows)
        if (self.path == "gpu" and self.region_ok and getattr(rows, "key", None)
                and hasattr(self.ch, "put_region")):
            try:
                self._put_region(rows, ptrs, sizes)
                return
            except self.mf.MapflowError as e:
                if e.code not in (self.mf.FAILED_PRECONDITION, self.mf.RESOURCE_EXHAUSTED):
                    raise
                log("put_region: %s; put_device_batch from now on" % e)
                self.region_ok = False
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

    def _put_region(self, rows, ptrs, sizes):
        """One layer's rows into one put region: reserve, copy the rows from the
        exporter's buffer to their places in the GPU arena in one call (mf_rows_copy_cuda:
        one launch on this thread's own stream, after the event the source recorded right
        after the layer's export; only that copy is waited for), commit; the daemon checks
        every row before it is visible. --dry: the reference copy (fake driver: device
        memory is host memory)."""
        from mapflow import kernels as K
        model, layer = rows.key
        reg = self.ch.put_region(model, layer, sizes)
        try:
            dst = reg.rows
            if self.dry:
                K.rows_copy_ref(dst, ptrs, sizes)
            else:
                t, dev, ps = self.t, rows.buf.device, self.stream()
                ready = getattr(rows, "ready", None)
                if ready is not None:
                    ps.wait_event(ready)
                elif not getattr(rows, "synced", False):
                    ps.wait_stream(t.cuda.current_stream(dev))  # all queued before now
                K.rows_copy_cuda(dst, ptrs, sizes, stream=ps)
                done = t.cuda.Event()
                done.record(ps)
                done.synchronize()
            res = reg.commit()
        finally:
            reg.close()
        self._count_region("put_region_rows", res)

    def _count_region(self, key, res):
        """A region commit's rows under key, and where the daemon checked them."""
        self.count(key, int(res["committed"]))
        self.count("put_region_checked_on_gpu" if res["checked_on_gpu"] else
                   "put_region_checked_on_host", int(res["committed"]))

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
        staged device buffers); ptrs and sizes are uint64 NumPy arrays (views of one array
        per Get: apply_cuda takes them as they are). Device rows are used in place; host
        rows are copied to the GPU (one buffer per layer) unless --dry (the C reference
        reads them)."""
        # Every layer in one Get when the daemon's max_batch (rows per Get) allows it
        # (its default covers a 32k prefix × 32 layers); split only beyond that.
        per_call = max(1, int(self.ch.info()["max_batch"]) // max(1, nb))
        out, results, staged = {}, [], []
        ls = list(layers)
        self.get_call_s = 0.0  # inside Channel.get_prefix (C call + GetResult), seconds
        for a in range(0, len(ls), per_call):
            chunk = ls[a:a + per_call]
            t0 = time.perf_counter()
            res = self.ch.get_prefix(model, B, tokens, chunk, lease=True)
            self.get_call_s += time.perf_counter() - t0
            results.append(res)
            if len(res) != nb * len(chunk):
                raise RuntimeError("get_prefix: %d rows for %d layers × %d blocks"
                                   % (len(res), len(chunk), nb))
            # Every row's fields as arrays (GetResult.columns): no Python object per row;
            # each check is one NumPy pass over the whole Get.
            cols = res.columns()
            bad = np.flatnonzero(cols.status != 0)
            if bad.size:
                i = int(bad[0])
                raise RuntimeError("get_prefix layer %d: %r" % (chunk[i // nb], res[i]))
            want = (np.repeat(np.asarray(chunk, dtype=np.uint32), nb),
                    np.tile(np.arange(nb, dtype=np.uint32), len(chunk)))
            wrong = np.flatnonzero((cols.layer != want[0]) | (cols.block != want[1]))
            if wrong.size:
                i = int(wrong[0])
                raise RuntimeError("get_prefix: row %d is layer %d block %d, not %d / %d" % (
                    i, int(cols.layer[i]), int(cols.block[i]), int(want[0][i]),
                    int(want[1][i])))
            dev = cols.on_device
            ptrs = np.where(dev, cols.data, np.uint64(0))
            n_dev = int(np.count_nonzero(dev))
            self.count("get_device", n_dev)
            self.count("get_host", dev.size - n_dev)
            for li, layer in enumerate(chunk):
                sl = slice(li * nb, (li + 1) * nb)
                if n_dev < dev.size:
                    host = np.flatnonzero(~dev[sl]).tolist()
                    if host:
                        self._stage({i: res[li * nb + i] for i in host}, host, ptrs[sl],
                                    staged)
                out[layer] = (ptrs[sl], cols.length[sl])
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


class _LazyRows:
    """A layer's rows whose launches run on the put stream (export_layer with async rows):
    resolve() in the put thread waits for them (sizes read back on that stream) and gives
    the RowSet; rows that did not fit their bound are extracted again (redo)."""

    def __init__(self, pending, key, redo, stream, region=None):
        self.pending, self.key, self.redo, self.stream = pending, key, redo, stream
        self.region = region  # the capacities put region the rows were written into

    def resolve(self):
        import mapflow.kernels as K
        try:
            rows = self.pending.wait(self.stream)
            rows.region = self.region
        except K.RowOverflow:
            if self.region is not None:  # cannot happen at worst-case caps; the copy path
                self.region.close()
            rows = self.redo()  # synchronous on the put stream
            rows.region = None
        rows.synced = True  # their work is done: the copy waits for nothing
        rows.key = self.key
        self.pending = self.redo = None  # Q, K, LSE, masses of the layer released here
        return rows


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
                    if isinstance(rows, _LazyRows):  # async rows: wait for them here
                        rows = rows.resolve()
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
        import flexprefill
        self.fp, self.fp_gamma, self.fp_stats = flexprefill, {}, []
        self.flex = None
        if not a.no_flex and self.cuda:
            try:
                from torch.nn.attention.flex_attention import BlockMask, flex_attention
                self.BlockMask = BlockMask
                self.flex = torch.compile(flex_attention, dynamic=False)
            except Exception as e:  # noqa: BLE001
                log("flex_attention unavailable: %s" % e)
        self.stream = torch.cuda.Stream() if self.cuda else None
        # --exporter fused: the rows' launches on the put thread's stream, resolved there
        # (HANDOFF_ROWS_STREAM=0: on the source's stream, sizes read back in the source)
        self.rows_async = os.environ.get("HANDOFF_ROWS_STREAM", "1") != "0"
        self._mask_bounds = {}  # mask_bounds' caps per (heads, query blocks, model)
        self.res = {"path": self.store.path, "path_why": self.store.why,
                    "target": vars(ts), "source": vars(ss), "l0": self.l0,
                    "mapped_layers": len(self.map), "exported_source_layers":
                    len(self.src_layers), "block": B, "density_goal": a.density,
                    "density_source": a.density_source, "densities": a.densities,
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

    def with_entries(self, call, entries):
        """call(entries) with a per-row entry bound; on a row overflow the bound doubles
        (three times), then no bound (the codec's worst case)."""
        e = entries
        for _ in range(4):
            try:
                return call(e)
            except self.mfk.RowOverflow:
                e = None if e is None else [2 * x for x in e]
        return call(None)

    def extract(self, q, k, top_p, codec, layer, tok32, slot, lse, entries, model):
        """mf_extract with a per-row entry bound (with_entries)."""
        return self.with_entries(
            lambda e: self.be.extract(q, k, top_p, codec, layer, tok32, slot, lse=lse,
                                      entries=e, model=model, ns=NS.encode()), entries)

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
    def calibrate(self, n, cap, tok32, goal=None):
        """Source Top-P giving the goal density (default --density) on one exported layer,
        and per-row entry bounds (1.3 × what that layer kept + slack) for the row buffers."""
        hs, nb = self.src.s.heads, n // B
        goal = self.a.density if goal is None else goal
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

        fused = self.a.exporter == "fused"

        def attn(i, xn, m):
            q, kk, v = m.qkv(i, xn)
            exp = i in self.src_layers
            if exp and fused:  # the layer's attention and its rows from one fused pass
                return self.export_layer(q, kk, v, top_p, codecs[i], i, tok32, putter, k,
                                         evs, entries, model, lse_used)
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
                rows.key = (model, i)
                if self.cuda:
                    e.record()
                    evs.append((s, e))
                    rows.ready = e  # the put thread's copy waits for this, not the stream
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
                "exporter": self.a.exporter,
                "lse": "fused (mf_export_cuda)" if self.a.exporter == "fused" else
                "given (dense op)" if lse_used[1] == 0 else
                ("computed by extract" if lse_used[0] == 0 else "mixed")}, t1

    def export_layer(self, q, kk, v, top_p, codec, i, tok32, putter, k, evs, entries, model,
                     lse_used):
        """--exporter fused: one exported layer through mf_export_cuda (O, LSE, masses,
        rows, seal), timed like extract (CUDA events: here they cover the attention too);
        O comes in the model's dtype from the kernel (o_dtype: no fp32 O, no cast; the
        environment's HANDOFF_O_FP32=1 casts an fp32 O as before, for an A/B run); the rows
        go to the put thread with the event recorded right after the export."""
        t = self.t
        slot = putter.slot(k[0])
        k[0] += 1
        s, e = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        s.record()
        fp32 = os.environ.get("HANDOFF_O_FP32") == "1"
        # mask rows in place: a region reserved by each row's worst-case bound (a few MB a
        # layer at 32k, the slack given back at commit), so no row can outgrow its cap
        reg, caps = None, None
        if codec == self.mfk.CODECS["mask"]:
            caps = self.mask_bounds(q.shape[1], q.shape[0] // 64, model)
            reg = self.store.begin_inplace(model, i, caps)
        dest = dict(rows=reg.rows, caps=caps) if reg is not None else {}
        if self.rows_async:  # the rows' launches on the put stream: the source goes on
            o, _, pending = self.be.export(q, kk, v, top_p, codec, i, tok32, ("src", slot),
                                           entries=entries, model=model, ns=NS.encode(),
                                           o_dtype=None if fp32 else q.dtype,
                                           rows_stream=self.store.rows_stream(), **dest)
            rows = _LazyRows(pending, (model, i), lambda: self.redo_rows(
                q, kk, top_p, codec, i, tok32, slot, entries, model), self.store.stream(),
                region=reg)
        else:
            o, _, rows = self.with_entries(
                lambda e: self.be.export(q, kk, v, top_p, codec, i, tok32, ("src", slot),
                                         entries=e, model=model, ns=NS.encode(),
                                         o_dtype=None if fp32 else q.dtype, **dest), entries)
            rows.region = reg
        out = o.view(q.shape[0], -1)
        if fp32:
            out = out.to(q.dtype)
        e.record()
        evs.append((s, e))
        lse_used[0] += 1
        if not self.rows_async:
            rows.key = (model, i)
            rows.ready = e
        putter.submit(slot, rows)
        return out

    def mask_bounds(self, heads, nb, model):
        """Each mask row's worst-case size (kernels.row_bounds), the caps an in-place region
        is reserved by: the same for every exported layer of a shape, computed once."""
        key = (heads, nb, model)
        if key not in self._mask_bounds:
            from mapflow import kernels as K
            self._mask_bounds[key] = K.row_bounds(heads, 0, nb, block_size=64, model=model,
                                                  codec="mask")
        return self._mask_bounds[key]

    def redo_rows(self, q, kk, top_p, codec, i, tok32, slot, entries, model):
        """A layer whose rows did not fit the entry bound (async rows, found in the put
        thread): extracted again there, on the put stream, with mf_extract_cuda (masses
        from Q and K; the fused forward's ℓ scratch is the source's) and a doubled bound."""
        t = self.t
        self.store.count("rows_redone")
        with t.cuda.stream(self.store.stream()):
            rows = self.with_entries(
                lambda e: self.be.extract(q, kk, top_p, codec, i, tok32, ("src", slot),
                                          lse=None, entries=e, model=model, ns=NS.encode()),
                None if entries is None else [2 * x for x in entries])
        return rows

    def target_reuse_attn(self, n, rowsets, modes):
        """modes: {target layer: "prob" | "mask"} (every head of a layer alike)."""
        mfk = self.mfk
        ht = self.tgt.s.heads
        mode = {"prob": np.full(ht, mfk.PROB, np.uint8),
                "mask": np.full(ht, mfk.MASK_MODE, np.uint8)}
        top_p = np.ones(ht, dtype=np.float32)
        exact_last = 1

        # O in the model's dtype from the kernels (o_dtype: no fp32 O, no cast);
        # HANDOFF_O_FP32=1 casts an fp32 O as before (A/B, as for the exporter)
        fp32 = os.environ.get("HANDOFF_O_FP32") == "1"

        def attn(i, xn, m):
            if i not in rowsets:
                return self.dense(i, xn, m)
            prob = modes[i] == "prob"
            q, k, v = m.qkv(i, xn, q_rows=B * exact_last if prob else None)
            o, _ = self.be.apply(rowsets[i], self.w, mode[modes[i]], top_p, q, k, v,
                                 exact_last, o_dtype=None if fp32 else q.dtype)
            return o.view(n, -1).to(q.dtype) if fp32 else o.view(n, -1)
        return attn

    def flex_attn(self, n, density, kind):
        """Block-sparse baseline attention for layers ≥ L0 on flex_attention (compiled,
        GQA, 128-token blocks, default kernel options): kind "flexprefill" (FlexPrefill's
        selection, γ calibrated on the first layer it sees so that it keeps `density` of
        the causal blocks) or "pooled" (the pooled-QK-only selection at that budget).
        The selection runs inside the timed prefill, as it does for FlexPrefill.
        self.fp_stats collects per layer (density, query-aware share) of the last run."""
        t, FP = self.t, self.fp
        bf = 128
        self.fp_stats = []

        def attn(i, xn, m):
            q, k, v = m.qkv(i, xn)
            if i < self.l0:
                return m.native_attention(q, k, v)[0]
            hq, d = q.shape[1], q.shape[2]
            if kind == "pooled":
                keep, qa = FP.pooled_keep(t, q, k, density, bf), None
            else:
                sc = FP.Scores(t, q, k, bf, self.a.tau)
                key = (n, density)
                if key not in self.fp_gamma:
                    self.fp_gamma[key] = FP.calibrate_gamma(sc, density, self.a.min_budget)
                    log("N=%d density %.2f: FlexPrefill γ %.4f → %.3f on layer %d "
                        "(min_budget %d)" % ((n, density) + self.fp_gamma[key][:2] +
                                             (i, self.fp_gamma[key][2])))
                keep = sc.keep(self.fp_gamma[key][0], self.fp_gamma[key][2])
                qa = sc.query_aware
            self.fp_stats.append((keep, qa))
            bm = FP.block_mask(t, self.BlockMask, keep, bf)
            q4 = q.transpose(0, 1).unsqueeze(0).contiguous()
            k4 = k.transpose(0, 1).unsqueeze(0).contiguous()
            v4 = v.transpose(0, 1).unsqueeze(0).contiguous()
            o = self.flex(q4, k4, v4, block_mask=bm, enable_gqa=True)
            return o[0].transpose(0, 1).reshape(n, hq * d)
        return attn

    def fp_summary(self):
        """Mean kept density and query-aware share over the last run's layers (the keep
        masks are read here, after the timed runs)."""
        if not self.fp_stats:
            return {}
        dens = [self.fp.density(k) for k, _ in self.fp_stats]
        qa = [float(x.float().mean()) for _, x in self.fp_stats if x is not None]
        self.fp_stats = []
        return {"keep_density": sum(dens) / len(dens),
                "query_aware_share": (sum(qa) / len(qa)) if qa else None}

    def baseline(self, n, tok, dens, full_ms):
        """FlexPrefill and pooled-QK-only at one density: {kind: record}."""
        out = {}
        for kind in ("flexprefill", "pooled"):
            if self.left() < 20 + 4 * full_ms / 1e3:
                log("N=%d density %.2f: %s skipped (time budget)" % (n, dens, kind))
                continue
            try:
                fa = self.flex_attn(n, dens, kind)
                tc = time.perf_counter()
                self.tgt.prefill(tok, fa)  # compiles for this N (first time), calibrates γ
                self.clock.sync()
                warm_s = time.perf_counter() - tc
                self.fp_stats = []
                st, _ = self.clock.stats(lambda: self.tgt.prefill(tok, fa), self.a.reps, warm=0)
                r = dict(self.fp_summary(), ms=st, prefill_ms=st[1], warm_s=warm_s,
                         gain=1.0 - st[1] / full_ms)
                if kind == "flexprefill":
                    r.update(gamma=self.fp_gamma[(n, dens)][0], tau=self.a.tau,
                             min_budget=self.fp_gamma[(n, dens)][2])
                out[kind] = r
                log("N=%d density %.2f: %s %.1f ms (%+.1f%% vs full; kept %.3f, query-aware "
                    "%s; first run %.1f s)" % (n, dens, kind, st[1], 100 * (st[1] / full_ms - 1),
                                              r.get("keep_density", 0),
                                              r.get("query_aware_share"), warm_s))
            except Exception as e:  # noqa: BLE001
                out[kind] = {"error": "%s: %s" % (type(e).__name__, str(e)[:300])}
                log("N=%d: %s: %s" % (n, kind, out[kind]["error"]))
        return out

    def variant(self, n, var, dens, tok, tok32, top_p, entries, n_prob, full):
        """One variant's hand-off at one density: source prefill under export, get, the
        target's first reuse prefill (hand-off), then timed reuse prefills."""
        t, reps = self.t, self.a.reps
        nb = n // B
        model = "src-%s-%d-%d" % (VARIANTS[var][0], n, round(1000 * dens))
        names, modes = variant_layers(var, self.src_layers, self.map, n_prob)
        codecs = {sl: self.mfk.CODECS[x] for sl, x in names.items()}
        self.store.counts = {}
        try:
            srec, t_src_done = self.source_handoff(n, tok, tok32, codecs, top_p, entries,
                                                   model.encode())
            gpu_used = self.store.gpu_used()
            layers = {tl: sl for tl, sl in self.map.items()}
            # The get timed reps times (the first right after the source's puts, as in a
            # hand-off; leases released between): its median goes into TTFT, all of them
            # into the JSON (one sample was one 288 ms outlier in the issue-20 run).
            get_all, get_call_all = [], []
            for r in range(max(1, reps)):
                for c in ("get_device", "get_host"):  # counts: the last get's rows
                    self.store.counts.pop(c, None)
                t_get0 = time.perf_counter()
                got, results, staged = self.store.get_layers(model, tok32,
                                                             sorted(set(layers.values())), nb)
                get_all.append((time.perf_counter() - t_get0) * 1e3)
                get_call_all.append(self.store.get_call_s * 1e3)
                if r + 1 < max(1, reps):
                    self.store.release(results)
                    got = results = staged = None
            get_ms = statistics.median(get_all)
            rowsets = {tl: self.mfk.RowSet.at(got[sl][0], got[sl][1], codecs[sl])
                       for tl, sl in layers.items()}
            attn = self.target_reuse_attn(n, rowsets, modes)
            first = self.tgt.prefill(tok, attn)
            int(first[0])  # the first token is on the host: hand-off done
            t_first = time.perf_counter()
            st, _ = self.clock.stats(lambda: self.tgt.prefill(tok, attn), reps, warm=0)
            ms = st[1]
            bad = self.be.check()  # rows the kernel refused so far (must stay 0)
            staged_b = sum(x.numel() for x in staged)
            self.store.release(results)
            rowsets = got = staged = attn = None
            self.store.delete(model)
            # what a user sees: TTFT = get (leases of every mapped layer) + the prefill
            # up to the first token on the host; the source's cost = its wall time under
            # export (first layer to the last row acknowledged, Putter.slot stalls included)
            # get_call_ms_all: the part of each get inside Channel.get_prefix (the C call,
            # client + daemon); the rest is the bench's Python on the result
            v = dict(srec, get_ms=get_ms, get_ms_all=get_all, get_call_ms_all=get_call_all,
                     handoff_ms=(t_first - t_src_done) * 1e3,
                     prefill_ms=ms, prefill_ms_stats=st, ttft_ms=ms + get_ms,
                     gain=1.0 - (ms + get_ms) / full["target_full_ms"],
                     prefill_gain=1.0 - ms / full["target_full_ms"],
                     daemon_gpu_bytes=gpu_used, staged_gpu_bytes=staged_b,
                     bad_rows=bad, counts=dict(self.store.counts),
                     prob_layers=sum(1 for x in modes.values() if x == "prob"))
            v["source_extra_ms"] = srec["wall_ms"] - full["source_full_ms"]
            v["source_wall_ratio"] = srec["wall_ms"] / full["source_full_ms"]
            v["handoff_overhead"] = v["source_extra_ms"] / full["source_full_ms"]
            log("N=%d %.2f %s: TTFT %.1f ms (%+.1f%% vs full; prefill %.1f [%.1f..%.1f], get "
                "%.1f, of it in get_prefix %.1f), hand-off %.1f ms, source wall %.1f ms (+%.1f: "
                "extract %.1f, put thread %.1f, tail %.1f), rows %.2f GB, %s"
                % (n, dens, var, v["ttft_ms"], -100 * v["gain"], ms, st[0], st[2], get_ms,
                   statistics.median(get_call_all), v["handoff_ms"], srec["wall_ms"],
                   v["source_extra_ms"], srec["extract_ms"],
                   srec["put_thread_ms"], srec["put_tail_ms"], srec["row_bytes"] / 1e9,
                   v["counts"]))
            return v
        except Exception as e:  # noqa: BLE001 — one variant failing must not stop the rest
            import traceback
            traceback.print_exc()
            self.store.delete(model)
            return {"error": "%s: %s" % (type(e).__name__, e)}
        finally:
            if self.cuda:
                t.cuda.empty_cache()

    def run_n(self, n, sweep):
        """One N: full prefills, then per density of the sweep (the headline --density
        only unless sweep) the source's Top-P, the variants and the two flex baselines.
        The headline density's results are also the record's top-level keys."""
        a = self.a
        tok_np, tok = self.tokens(n)
        tok32 = tok_np.astype(np.uint32)
        rec = {"N": n}
        # 1. full prefills (the source's warm-up run captures one layer's Q, K, LSE)
        st, _ = self.clock.stats(lambda: self.tgt.prefill(tok, self.dense), a.reps)
        rec["target_full_ms"], rec["target_full_ms_stats"] = st[1], st
        log("N=%d: target full prefill %.1f ms [%.1f..%.1f]" % (n, st[1], st[0], st[2]))
        cap = {}
        cal_layer = self.src_layers[len(self.src_layers) // 2]
        self.src.prefill(tok, self.capture_hook(cal_layer, cap))
        st, _ = self.clock.stats(lambda: self.src.prefill(tok, self.dense), a.reps, warm=0)
        rec["source_full_ms"], rec["source_full_ms_stats"] = st[1], st
        log("N=%d: source full prefill %.1f ms [%.1f..%.1f]" % (n, st[1], st[0], st[2]))
        if self.cuda:
            from model import dense_rate, lse_source
            ts, ss = self.tgt.s, self.src.s
            rec["dense_attention"] = {
                "target": dense_rate(ts.heads, ts.kv_heads, n, ts.head_dim, self.dev, a.reps),
                "source": dense_rate(ss.heads, ss.kv_heads, n, ss.head_dim, self.dev, a.reps),
                "lse": lse_source(self.dev)}
            log("N=%d: dense attention one layer: %s" % (n, rec["dense_attention"]))
        rec["sweep"] = []
        for dens in (a.densities if sweep else [a.density]):
            if rec["sweep"] and self.left() < 60:
                log("N=%d density %.2f: skipped (time budget: %.0f s left)"
                    % (n, dens, self.left()))
                continue
            d = {"density_goal": dens}
            top_p, cst, entries = self.calibrate(n, cap, tok32, dens)
            d.update(source_top_p=top_p, density_per_head=cst["per_head"],
                     density_eff=cst["eff"], row_columns=cst["cols"])
            per_layer, n_prob = n_prob_layers(self, n, cst)
            d.update(prob_row_bytes_per_layer_est=per_layer, prob_layers=n_prob)
            head = dens == a.density
            for var in (a.variants if head else a.sweep_variants):
                if self.left() < 25 + 6 * rec["source_full_ms"] / 1e3:
                    log("N=%d %.2f %s: skipped (time budget: %.0f s left)"
                        % (n, dens, var, self.left()))
                    continue
                d[var] = self.variant(n, var, dens, tok, tok32, top_p, entries, n_prob, rec)
            if self.flex is not None:
                d.update(self.baseline(n, tok, d["density_eff"], rec["target_full_ms"]))
            elif not self.cuda:  # --dry: no flex_attention on old CPU torch; check selections
                d.update(self.dry_selection(n, d["density_eff"]))
            rec["sweep"].append(d)
            if head:
                rec.update({k: x for k, x in d.items() if k != "density_goal"})
        cap.clear()
        if hasattr(self.be, "pool"):
            self.be.pool.pop("cal", None)
        return rec

    def dry_selection(self, n, dens):
        """--dry: both flex baselines' selections on random Q/K (no flex_attention here)."""
        t, FP = self.t, self.fp
        g = t.Generator().manual_seed(n)
        qx = t.randn(n, self.tgt.s.heads, 32, generator=g).to(t.bfloat16)
        kx = t.randn(n, self.tgt.s.kv_heads, 32, generator=g).to(t.bfloat16)
        sc = FP.Scores(t, qx, kx, 128, self.a.tau)
        gam, got, mb = FP.calibrate_gamma(sc, dens, self.a.min_budget)
        out = {"pooled": {"keep_density": FP.density(FP.pooled_keep(t, qx, kx, dens))},
               "flexprefill": {"keep_density": got, "gamma": gam, "min_budget": mb,
                               "query_aware_share": float(sc.query_aware.float().mean())}}
        log("N=%d density %.3f: selections (no flex_attention here): %s" % (n, dens, out))
        return out

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
                r = self.run_n(n, n == max(self.a.ns))
                r["elapsed_s"] = time.perf_counter() - tn
                self.res["rows"].append(r)
                if self.cuda:
                    self.t.cuda.empty_cache()
        self.res["gpu"] = self.t.cuda.get_device_name(0) if self.cuda else "CPU (--dry)"
        self.res["sweep_variants"] = self.a.sweep_variants
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


def _ttft(x):
    """A variant's TTFT (get + prefill), or its prefill where no get was timed."""
    if not isinstance(x, dict) or "prefill_ms" not in x:
        return None
    return x.get("ttft_ms", x["prefill_ms"])


def best_variant(r, variants):
    ok = [(_ttft(r.get(v)), v) for v in variants if _ttft(r.get(v)) is not None]
    return min(ok) if ok else (None, None)


def routing(res):
    """sim.py on this run's measured times (the same as `sim.py --from-json handoff.json`)."""
    import sim
    return sim.from_result(res)


# ==== report ==============================================================================

def _cell(ms, full):
    return "%.1f (%+.1f%%)" % (ms, 100 * (ms / full - 1)) if ms else "-"


def header(res):
    """Commit, command, dense backend lines (every table starts with them)."""
    lines = ["commit %s; command: `%s`; %s; torch %s; reps %d (min / median / max)"
             % (res.get("commit") or "?", res.get("command") or "?", res.get("gpu") or "?",
                res.get("torch"), res.get("reps", 0))]
    for r in res["rows"]:
        da = r.get("dense_attention")
        if da:
            lines.append("dense attention, N=%d, one layer: target %s %.2f ms (%.0f TFLOP/s), "
                         "source %s %.2f ms (%.0f TFLOP/s); kernel %s; LSE: %s"
                         % (r["N"], da["target"]["backend"], da["target"]["ms"][1],
                            da["target"]["TFLOPs"], da["source"]["backend"],
                            da["source"]["ms"][1], da["source"]["TFLOPs"],
                            da["target"].get("kernel", "?"), da["lse"]))
    return lines


def table(res):
    lines = header(res) + [""]
    vs = res["variants"]
    head = ["N", "dens head/eff", "target full ms (min..max)"] + \
        ["%s TTFT ms (Δ)" % v for v in vs] + \
        ["FlexPrefill ms (Δ)", "pooled-QK only ms (Δ)", "best vs FlexPrefill",
         "source full ms", "source wall under export ms (+%)", "extract ms", "get ms",
         "hand-off ms", "rows GB"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in res["rows"]:
        full = r["target_full_ms"]
        fs = r.get("target_full_ms_stats") or [full, full, full]
        cells = [str(r["N"]), "%.3f/%.3f" % (r.get("density_per_head", 0),
                                             r.get("density_eff", 0)),
                 "%.1f (%.1f..%.1f)" % (full, fs[0], fs[2])]
        for v in vs:
            x = r.get(v) or {}
            cells.append(_cell(_ttft(x), full) if _ttft(x) else ("error" if "error" in x else "-"))
        fx = (r.get("flexprefill") or {}).get("prefill_ms")
        cells.append(_cell(fx, full))
        cells.append(_cell((r.get("pooled") or {}).get("prefill_ms"), full))
        ms, bv = best_variant(r, vs)
        cells.append("%+.1f%% (%s)" % (100 * (1 - ms / fx), bv) if fx and ms else "-")
        cells.append("%.1f" % r["source_full_ms"])
        x = r.get(bv) or {}
        if x:
            gb = x.get("daemon_gpu_bytes") or x.get("staged_gpu_bytes") or 0
            cells += ["%.1f (%+.1f%%)" % (x["wall_ms"], 100 * x.get("handoff_overhead", 0)),
                      "%.1f" % x["extract_ms"], "%.1f" % x["get_ms"], "%.1f" % x["handoff_ms"],
                      "%.2f (%.2f)" % (x["row_bytes"] / 1e9, gb / 1e9)]
        else:
            cells += ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += sweep_table(res)
    ro = res.get("routing", {})
    if ro.get("workloads") or ro.get("variants"):
        import sim
        lines.append("")
        lines += sim.summary(ro)
    lines.append("path: %s (%s)" % (res["path"], res["path_why"]))
    return "\n".join(lines)


def sweep_table(res):
    """Density sweep at the largest N: speed-up against the target's full (dense cuDNN)
    prefill, per variant and baseline, and the break-even densities."""
    from model import break_even
    rows = [r for r in res["rows"] if len(r.get("sweep") or []) > 1]
    lines = []
    for r in rows:
        full = r["target_full_ms"]
        names = [v for v in res["variants"] if any(isinstance(d.get(v), dict) and
                                                   _ttft(d.get(v)) for d in r["sweep"])]
        lines.append("density sweep at N=%d (speed-up = dense TTFT ÷ TTFT; MapFlow densities "
                     "at 64-token blocks, FlexPrefill's at 128):" % r["N"])
        head = ["goal", "eff"] + ["%s TTFT ms (×)" % v for v in names] + \
            ["FlexPrefill ms (×) [kept, γ, query-aware]", "pooled-QK only ms (×) [kept]",
             "source wall ms (+%%) (%s)" % ((res.get("sweep_variants") or names)[:1] or ["-"])[0]]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        curves = {k: [] for k in names + ["%s prefill only" % v for v in names] +
                  ["flexprefill", "pooled"]}
        for d in r["sweep"]:
            cells = ["%.2f" % d["density_goal"], "%.3f" % d.get("density_eff", 0)]
            for v in names:
                ms = _ttft(d.get(v))
                cells.append("%.1f (%.2f)" % (ms, full / ms) if ms else "-")
                if ms:
                    curves[v].append((d["density_eff"], full / ms))
                    curves[v + " prefill only"].append((d["density_eff"],
                                                        full / d[v]["prefill_ms"]))
            for k in ("flexprefill", "pooled"):
                x = d.get(k) or {}
                ms = x.get("prefill_ms")
                extra = "%.3f" % x.get("keep_density", 0)
                if k == "flexprefill" and "gamma" in x:
                    extra += ", %.3f, %s" % (x["gamma"], "%.2f" % x["query_aware_share"]
                                             if x.get("query_aware_share") is not None else "-")
                cells.append("%.1f (%.2f) [%s]" % (ms, full / ms, extra) if ms else
                             ("error" if "error" in x else
                              "selection only [%s]" % extra if x else "-"))
                if ms:
                    curves[k].append((x.get("keep_density", d["density_eff"]), full / ms))
            order = [v for v in res.get("sweep_variants", []) if v in names] + names
            x = next((d[v] for v in order if _ttft(d.get(v))), None)  # a sweep variant's
            cells.append("%.1f (%+.1f%%)" % (x["wall_ms"], 100 * x["handoff_overhead"])
                         if x else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("break-even density against dense (speed-up 1): " + "; ".join(
            "%s %s" % (k, break_even(c)) for k, c in curves.items() if c))
        lines.append("")
    return lines


def plot(res, path):
    """Speed-up (dense TTFT ÷ TTFT) against density at the largest N and against N at the
    headline density: MapFlow's variants, FlexPrefill, pooled-QK only; 1 = dense cuDNN."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log("no plot: %s" % e)
        return
    rows = sorted(res["rows"], key=lambda r: r["N"])
    if not rows:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = list(res["variants"]) + ["flexprefill", "pooled"]
    label = {"flexprefill": "FlexPrefill (flex_attention)", "pooled": "pooled-QK only (flex)"}

    def ms_of(d, k):
        return _ttft(d.get(k)) if k in res["variants"] else (d.get(k) or {}).get("prefill_ms")
    big = rows[-1]
    for k in names:
        pts = [(d.get("density_eff", d["density_goal"]) if k in res["variants"] else
                (d.get(k) or {}).get("keep_density", d.get("density_eff")),
                big["target_full_ms"] / ms_of(d, k))
               for d in big.get("sweep", []) if ms_of(d, k)]
        if len(pts) > 1 or (pts and k not in res.get("sweep_variants", [])):
            pts.sort()
            ax1.plot([100 * p[0] for p in pts], [p[1] for p in pts], marker="o",
                     label=label.get(k, "MapFlow " + k))
    ax1.axhline(1.0, color="k", lw=0.8, ls="--", label="dense SDPA (cuDNN)")
    ax1.set_xlabel("kept causal blocks (%%), N = %dk" % (big["N"] // 1024))
    ax1.set_ylabel("TTFT speed-up vs dense")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ns = [r["N"] for r in rows]
    for k in names:
        pts = [(r["N"], r["target_full_ms"] / ms_of(r, k)) for r in rows if ms_of(r, k)]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                     label=label.get(k, "MapFlow " + k))
    ax2.axhline(1.0, color="k", lw=0.8, ls="--")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(ns)
    ax2.set_xticklabels(["%dk" % (n // 1024) if n >= 1024 else str(n) for n in ns])
    ax2.set_xlabel("context N (tokens), density %.2f" % res["density_goal"])
    ax2.grid(alpha=0.3)
    fig.suptitle("Hand-off %s → %s: speed-up over dense (path %s, commit %s)"
                 % (res["source"]["name"], res["target"]["name"], res["path"],
                    res.get("commit") or "?"), fontsize=9)
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
    res["commit"] = os.environ.get("MF_COMMIT")
    res["command"] = os.environ.get("MF_COMMAND") or " ".join(["bench/handoff/handoff.py"] +
                                                                (argv or sys.argv[1:]))
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
