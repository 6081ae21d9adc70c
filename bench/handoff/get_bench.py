#!/usr/bin/env python3
"""The target's leased prefix Get of a 32k prefix, in Python, on the CPU (issue 20).

What handoff.py's get times on the H200 (one leased get_prefix of every mapped layer, then
per-layer device row pointers), here with the fake CUDA driver (build/lib/tests/
libfakecuda.so: device memory is host memory) and a real mapflowd with its GPU tier: LAYERS
layers × BLOCKS MASK rows (40 heads, B = 64) put with one put region per layer, then the
get REPS times (leases released between), split into
  c        the C call alone (mf_get_prefix through ctypes, nothing made in Python),
  result   the binding's GetResult around it (what Channel.get_prefix adds),
  table / columns  GetResult.table() / GetResult.columns() alone (when it has them),
  bench_after  handoff.Store.get_layers on that result: the bench's own code (rows
           checked, per-layer device pointers and sizes);
  c_cpu    the CPU behind the C call: this process's (the channel's I/O thread: the reply's
           unpack and the result) and mapflowd's (per get + release);
  end_to_end  handoff.Store.get_layers as the hand-off times it;
medians in ms (each phase on the same result, leases released after each get). Not a
test (timed; make test does not run it).
  python3 bench/handoff/get_bench.py [--layers 30] [--blocks 512] [--reps 15]
Env: MF_BUILD (build dir, default build), MF_BIN (its bin/).
"""
import argparse
import ctypes as C
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import mftest  # noqa: E402  (the tests' real mapflowd on a unix socket)

# read once by libmapflow's driver loader and inherited by mapflowd: set before the import
os.environ["MF_CUDA_DRIVER"] = os.path.join(mftest.BUILD, "lib", "tests", "libfakecuda.so")
os.environ.setdefault("FAKECUDA_DEVICES", "1")
mapflow = mftest.import_mapflow()
sys.path.insert(0, HERE)
import handoff  # noqa: E402

import numpy as np  # noqa: E402

B, HEADS = handoff.B, 40
MODEL = "src-mask-32768-50"  # a name of the hand-off's length


class _Spec(C.Structure):  # mf_row_spec_t (proto/mf_row.h)
    _fields_ = [("model", C.c_char_p), ("layer", C.c_uint32), ("block_index", C.c_uint32),
                ("block_size", C.c_uint32), ("n_heads", C.c_uint32), ("codec", C.c_int),
                ("top_p", C.c_float), ("parent", mapflow._Hash), ("hash", mapflow._Hash),
                ("tokens", C.POINTER(C.c_uint32))]


def make_rows(lib, tokens, hashes, root, layer, nb, rng):
    """nb MASK rows of one layer (mf_row_build): the sink, one random column and the
    diagonal, random head masks and masses."""
    tok = (C.c_uint32 * len(tokens))(*tokens)
    all_heads = (1 << HEADS) - 1
    out = []
    buf = C.create_string_buffer(1 << 16)
    for b in range(nb):
        cols = sorted({0, rng.randrange(b + 1), b})
        masks = [all_heads if c in (0, b) else (rng.getrandbits(HEADS) | 1) for c in cols]
        e = sum(bin(m).count("1") for m in masks)
        spec = _Spec(MODEL.encode(), layer, b, B, HEADS, 0, 0.9, hashes[b - 1] if b else root,
                     hashes[b], C.cast(C.byref(tok, 4 * b * B), C.POINTER(C.c_uint32)))
        mass = (C.c_float * e)(*[rng.uniform(0.001, 1.0) for _ in range(e)])
        size, why = C.c_size_t(), C.c_char_p()
        st = lib.mf_row_build(buf, len(buf), C.byref(spec), len(cols),
                              (C.c_uint32 * len(cols))(*cols),
                              (C.c_uint64 * len(cols))(*masks), mass, None, C.byref(size),
                              C.byref(why))
        if st:
            raise RuntimeError("mf_row_build: %d %s" % (st, why.value))
        out.append(buf.raw[:size.value])
    return out


def put_layers(ch, lib, tokens, layers, nb):
    hashes = (mapflow._Hash * nb)()
    got = C.c_size_t()
    tok = (C.c_uint32 * len(tokens))(*tokens)
    if lib.mf_hash_prefix(handoff.NS.encode(), MODEL.encode(), B, tok, len(tokens), hashes,
                          nb, C.byref(got)) or got.value != nb:
        raise RuntimeError("mf_hash_prefix")
    root = lib.mf_hash_root(B, handoff.NS.encode(), len(handoff.NS), MODEL.encode(),
                            len(MODEL))
    rng = random.Random(20)
    for layer in layers:
        rows = make_rows(lib, tokens, hashes, root, layer, nb, rng)
        reg = ch.put_region(MODEL, layer, [len(r) for r in rows])
        try:
            for d, r in zip(reg.rows, rows):  # the fake's device memory is host memory
                C.memmove(d, r, len(r))
            res = reg.commit()
        finally:
            reg.close()
        if res["committed"] != nb:
            raise RuntimeError("layer %d: %r" % (layer, res))


class _Answer:
    """A channel whose get_prefix returns a result already got (the rest: the channel's)."""

    def __init__(self, ch, res):
        self._ch, self._res = ch, res

    def get_prefix(self, *a, **kw):
        return self._res

    def __getattr__(self, name):
        return getattr(self._ch, name)


def _proc_cpu(pid):
    """User + system CPU seconds of process pid so far (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        st = f.read().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")


def timed(reps, get, done):
    """Median ms of get() over reps runs; done(result) after each (untimed)."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        r = get()
        ts.append((time.perf_counter() - t) * 1e3)
        done(r)
    return statistics.median(ts), min(ts), max(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    nl, nb = a.layers, a.blocks
    lib = C.CDLL(mapflow._lib_path)  # own function objects: argtypes set here stay here
    lib.mf_row_build.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(_Spec), C.c_uint32,
                                 C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                 C.POINTER(C.c_size_t), C.POINTER(C.c_char_p)]
    lib.mf_hash_root.restype = mapflow._Hash
    lib.mf_hash_root.argtypes = [C.c_uint32, C.c_char_p, C.c_size_t, C.c_char_p, C.c_size_t]
    rng = random.Random(7)
    tokens = [rng.randrange(1, 150000) for _ in range(nb * B)]
    tok32 = np.array(tokens, dtype=np.uint32)
    layers = list(range(nl))
    with tempfile.TemporaryDirectory(prefix="mfgetbench-") as tmp:
        d = mftest.Daemon(tmp, mapflow, "--gpu_bytes", "512mb", "--host_bytes", "256mb",
                          "--write_through", "off")
        d.start()
        try:
            store = handoff.Store(mapflow, d.sock, "gpu", True, None)
            if store.path != "gpu":
                raise SystemExit("no GPU path: %s" % store.why)
            t = time.perf_counter()
            put_layers(store.ch, lib, tokens, layers, nb)
            print("get bench: %d layers x %d blocks = %d leased device rows (MASK, %d heads, "
                  "B %d), put in %.1f s; median [min, max] of %d, ms:"
                  % (nl, nb, nl * nb, HEADS, B, time.perf_counter() - t, a.reps))
            ch = store.ch
            tok, ntok = mapflow._u32(tok32)
            lay, nlay = mapflow._u32(layers)
            cols = hasattr(mapflow.GetResult, "columns")

            def c_get():
                out = C.POINTER(mapflow._GetResult)()
                st = mapflow._lib.mf_get_prefix_peer(ch._h, None, MODEL.encode(), B, tok,
                                                     ntok, lay, nlay, 0, 0, 1, C.byref(out),
                                                     -1)
                if st:
                    raise RuntimeError("mf_get_prefix: %d %s" % (st, ch.last_error))
                return out
            split = {k: [] for k in ("c", "result", "table", "columns", "bench_after")}
            split["columns"] = [] if cols else None
            for _ in range(a.reps):
                t0 = time.perf_counter()
                out = c_get()
                t1 = time.perf_counter()
                res = mapflow.GetResult(ch, out, True)  # what Channel.get_prefix returns
                t2 = time.perf_counter()
                res.table()
                t3 = time.perf_counter()
                if cols:
                    res.columns()
                t4 = time.perf_counter()
                # the bench's own code on this result (its get_prefix answered by it)
                store.ch = _Answer(ch, res)
                try:
                    t5 = time.perf_counter()
                    store.get_layers(MODEL, tok32, layers, nb)
                    t6 = time.perf_counter()
                finally:
                    store.ch = ch
                store.release([res])
                for k, v in (("c", t1 - t0), ("result", t2 - t1), ("table", t3 - t2),
                             ("columns", t4 - t3), ("bench_after", t6 - t5)):
                    if split[k] is not None:
                        split[k].append(v * 1e3)
            what = {"c": "C call (mf_get_prefix, leased, device views)",
                    "result": "the binding's GetResult",
                    "table": "GetResult.table() alone",
                    "columns": "GetResult.columns() alone",
                    "bench_after": "handoff.Store.get_layers after the get (its table() or "
                                   "columns() included)"}
            for k, v in split.items():
                if v is not None:
                    print("  %-12s %6.2f [%.2f, %.2f]  %s" % (
                        k, statistics.median(v), min(v), max(v), what[k]))
            # CPU behind the C call: this process (the caller and the channel's I/O thread:
            # the reply's unpack and the result) per get; mapflowd per get + release
            cpu, dcpu0 = [], _proc_cpu(d.proc.pid)
            for _ in range(a.reps):
                t0 = time.process_time()
                out = c_get()
                cpu.append((time.process_time() - t0) * 1e3)
                mapflow._lib.mf_release_result(ch._h, out, -1)
                mapflow._lib.mf_get_result_free(out)
            dcpu = (_proc_cpu(d.proc.pid) - dcpu0) * 1e3 / a.reps
            print("  %-12s %6.2f client CPU of the C call (this process, all threads); mapflowd "
                  "CPU %.2f per get + release (mean of %d)" % ("c_cpu", statistics.median(cpu),
                                                               dcpu, a.reps))
            e2e = timed(a.reps, lambda: store.get_layers(MODEL, tok32, layers, nb)[1],
                        store.release)
            print("  %-12s %6.2f [%.2f, %.2f]  handoff.Store.get_layers end to end (the "
                  "hand-off's get_ms)" % (("end_to_end",) + e2e))
            store.counts = {}
            got = store.get_layers(MODEL, tok32, layers, nb)
            print("  rows: %d device, %d host" % (store.counts.get("get_device", 0),
                                                  store.counts.get("get_host", 0)))
            store.release(got[1])
            store.ch.close()
        finally:
            d.stop()


if __name__ == "__main__":
    main()
