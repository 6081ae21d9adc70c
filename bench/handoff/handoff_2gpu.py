"""Hand-off across two GPUs of one node (issue 14): handoff.py --target-device D (run.sh
with HANDOFF_TARGET_DEVICE=D) runs this instead of the one-GPU Bench.

This process is the source: mapflowd has its GPU tier on GPU 0 only (gpu_devices 0), the
source model, mf_extract_cuda and the puts run on GPU 0 (its channel maps the arena on
device 0). The target is another process (handoff.py --worker peer): the target model,
its channel (gpu_device = D) and mf_apply_cuda on GPU D; leased rows come back as device
views of GPU 0's arena opened through CUDA IPC in GPU D's context (lazy peer access), so
the apply kernels read them over NVLink/PCIe in place; without peer access they come
staged through the daemon's host arena, and the path line says so. Per N (default 32k)
and variant (default prob_fp8):
  - target full prefill on GPU D (the worker, while the source's full prefill and Top-P
    calibration run on GPU 0), source full prefill;
  - source prefill + extract + put (as handoff.py), then the worker: get (leases) +
    reuse prefill on GPU D (first token: hand-off latency across processes, both clocks
    CLOCK_MONOTONIC), --reps timed reuse prefills;
  - bytes/s: a second lease get + a copy of every leased row GPU0→GPU D from the IPC
    views (cuMemcpyDtoDAsync on the device pointers) against the same bytes copied
    GPU0→GPU D by torch (copy_ between cuda:0 and cuda:D tensors: cudaMemcpyPeer) in
    the worker, one layer's bytes per copy; torch.cuda.can_device_access_peer;
  - the staged fallback: a second target process (--worker staged) with
    CUDA_VISIBLE_DEVICES=D (GPU 0 hidden): get + HtoD of the staged host views + one
    reuse prefill. If the driver still opens the hidden GPU's arena (cuIpcOpenMemHandle
    may open handles of devices the process cannot see), that path is reported and the
    worker measures again with a channel without GPU mapping (rows staged by the daemon).
--dry: the same processes on the CPU (C reference kernels; fake CUDA driver when run.sh
has HANDOFF_FAKECUDA, FAKECUDA_DEVICES=2; FAKECUDA_NO_PEER=1 makes the peer worker's
rows staged); the staged worker then has no GPU mapping (the fake ignores
CUDA_VISIBLE_DEVICES).

Workers speak JSON lines: commands on stdin, one answer line each on their stdout; their
logs go to stderr. Each process is single-threaded apart from handoff.Putter.
"""
import ctypes as C
import json
import os
import select
import subprocess
import sys
import time
import traceback

import numpy as np

import handoff as H


def _layer_bytes(got, layers):
    return {sl: int(np.sum(got[sl][1])) for sl in layers}


class Copier:
    """Copies of device rows into a device buffer: cuMemcpyDtoDAsync on the legacy default
    stream (the pointers are IPC views; unified addressing routes them), memmove on the
    CPU (--dry: fake device memory is host memory)."""

    def __init__(self, cuda):
        self.cuda = cuda
        if cuda:
            lib = C.CDLL("libcuda.so.1")
            self.fn = lib.cuMemcpyDtoDAsync_v2
            self.fn.argtypes = [C.c_uint64, C.c_uint64, C.c_size_t, C.c_void_p]
            self.fn.restype = C.c_int

    def copy(self, dst, src, n):
        if not self.cuda:
            C.memmove(dst, src, n)
            return
        r = self.fn(dst, src, n, None)
        if r != 0:
            raise RuntimeError("cuMemcpyDtoDAsync: CUresult %d" % r)


# ==== target worker =======================================================================

class Worker(H.Bench):
    """The target in its own process on a.worker_device (its ordinal in this process's
    view). Reuses Bench's attention hooks; holds no source model."""

    def __init__(self, a):
        import torch
        import mfk
        import rows as R
        import mapflow
        from model import Model
        self.a, self.t, self.mfk, self.R, self.mapflow = a, torch, mfk, R, mapflow
        self.cuda = not a.dry
        self.kind = a.worker
        ts, ss = H.shapes(a.dry)
        if self.cuda:
            torch.cuda.set_device(a.worker_device)
            self.dev = torch.device("cuda", a.worker_device)
        else:
            self.dev = torch.device("cpu")
        self.be = mfk.Cuda(H.B) if self.cuda else mfk.Ref(H.B)
        self.clock = H.Clock(torch, self.cuda)
        t = time.perf_counter()
        self.tgt = Model(ts, self.dev, seed=1)
        self.src_s = ss
        self.clock.sync()
        H.log("target %s on %s, %.1f GB (%.1f s), CUDA_VISIBLE_DEVICES=%s"
              % (ts.name, self.dev, self.tgt.bytes() / 1e9, time.perf_counter() - t,
                 os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")))
        self.l0 = min(a.l0, ts.layers - 1)
        self.map, self.w = H.make_profile(ts, ss, self.l0)
        self.layers = sorted(set(self.map.values()))
        # The staged worker runs with MAPFLOW_GPU_ARENAS=off (set by the parent): its channel
        # keeps gpu_device, so the client pins its host-arena mapping for the HtoD copies,
        # but maps no GPU arena, so every row comes back staged by the daemon.
        self.store = self.open_store(False)
        if self.kind == "staged":
            self.wait_pinned()
        self.warm = False

    def wait_pinned(self, limit_s=120.0):
        """The client pins its host-arena mapping in the background: time it, and wait."""
        t0 = time.perf_counter()
        pinned = 0
        while time.perf_counter() - t0 < limit_s:
            pinned = (self.store.ch.gpu_info() or {}).get("host_arena_pinned", 0)
            if pinned:
                break
            time.sleep(0.05)
        H.log("staged worker: host arena pinned %s after %.1f s" % (
            {1: "yes", -1: "refused"}.get(pinned, "not yet"), time.perf_counter() - t0))

    def open_store(self, no_gpu):
        path = "host" if no_gpu else "gpu"
        st = H.Store(self.mapflow, self.a.socket, path, self.a.dry, self.t,
                     gpu_device=None if no_gpu else self.a.worker_device,
                     name="handoff-" + self.kind)
        H.log("channel: path %s (%s)" % (st.path, st.why))
        return st

    def tokens(self, n):
        g = np.random.default_rng(n)
        tok = g.integers(0, min(self.tgt.s.vocab, self.src_s.vocab), n).astype(np.int64)
        return tok, self.t.from_numpy(tok).to(self.dev)

    def info(self):
        t = self.t
        r = {"kind": self.kind, "device": str(self.dev), "path": self.store.path,
             "why": self.store.why, "gpu_info": self.store.gpu_info,
             "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        if self.cuda:
            r["device_count"] = t.cuda.device_count()
            r["device_name"] = t.cuda.get_device_name(self.dev)
            if t.cuda.device_count() > 1 and self.a.worker_device != 0:
                r["can_access_peer"] = bool(t.cuda.can_device_access_peer(self.dev, 0))
        return r

    def full(self, n):
        _, tok = self.tokens(n)
        if not self.warm:
            _, tk = self.tokens(512 if self.cuda else n)
            self.tgt.prefill(tk, self.dense)
            self.warm = True
        ms, _ = self.clock.time(lambda: self.tgt.prefill(tok, self.dense), self.a.reps)
        H.log("N=%d: target full prefill %.1f ms" % (n, ms))
        return {"target_full_ms": ms}

    def reuse(self, n, model, codecs, modes, reps, copy):
        """get + reuse prefill of the rows the source put (codecs: {source layer: codec
        name}, modes: {target layer: "prob" | "mask"})."""
        codecs = {int(k): v for k, v in codecs.items()}
        modes = {int(k): v for k, v in modes.items()}
        v = self._reuse_once(n, model, codecs, modes, reps, copy)
        if self.kind == "staged" and v["rows_device"] and not v.get("error"):
            # the hidden GPU's arena opened anyway: say so, then the staged path proper
            hidden = {k: v[k] for k in ("path", "get_ms", "first_ms", "rows_device")}
            H.log("GPU 0 hidden, but its arena opened (%d device views): again without "
                  "GPU mapping" % v["rows_device"])
            self.store.ch.close()
            self.store = self.open_store(True)
            v = self._reuse_once(n, model, codecs, modes, reps, copy)
            v["hidden_gpu_opened"] = hidden
        return v

    def _reuse_once(self, n, model, codecs, modes, reps, copy):
        t, st = self.t, self.store
        tok_np, tok = self.tokens(n)
        tok32 = tok_np.astype(np.uint32)
        nb = n // H.B
        st.counts, st.stage_s = {}, 0.0
        self.clock.sync()
        t0 = time.perf_counter()
        got, results, staged = st.get_layers(model, tok32, self.layers, nb)
        self.clock.sync()
        t1 = time.perf_counter()
        lb = _layer_bytes(got, self.layers)
        rowsets = {tl: self.mfk.RowSet.at(got[sl][0], got[sl][1], self.mfk.CODECS[codecs[sl]])
                   for tl, sl in self.map.items()}
        attn = self.target_reuse_attn(n, rowsets, modes)
        first = self.tgt.prefill(tok, attn)
        int(first[0])  # the first token is on the host
        t_first = time.perf_counter()
        dev_rows, host_rows = st.counts.get("get_device", 0), st.counts.get("get_host", 0)
        v = {"get_ms": (t1 - t0) * 1e3, "stage_ms": st.stage_s * 1e3,
             "first_ms": (t_first - t1) * 1e3, "t_first": t_first,
             "rows_device": dev_rows, "rows_host": host_rows, "row_bytes_got": sum(lb.values()),
             "path": "peer views" if dev_rows and not host_rows else
             ("staged" if host_rows and not dev_rows else "mixed"),
             "channel": st.why}
        if reps:
            v["prefill_ms"], _ = self.clock.time(lambda: self.tgt.prefill(tok, attn), reps,
                                                 warm=0)
        v["bad_rows"] = self.be.check()
        v["staged_gpu_bytes"] = sum(x.numel() for x in staged)
        st.release(results)
        rowsets = got = staged = attn = None
        H.log("N=%d: get %.1f ms (HtoD of staged views %.1f ms), first token after %.1f ms, "
              "reuse prefill %s ms, %d device views, %d staged rows, %.2f GB"
              % (n, v["get_ms"], v["stage_ms"], v["first_ms"],
                 "%.1f" % v["prefill_ms"] if "prefill_ms" in v else "-", dev_rows, host_rows,
                 v["row_bytes_got"] / 1e9))
        if copy:
            try:
                v.update(self.copy_bw(n, model, tok32, nb))
            except Exception as e:  # noqa: BLE001 — the numbers above stand
                traceback.print_exc()
                v["copy_error"] = "%s: %s" % (type(e).__name__, e)
        if self.cuda:
            t.cuda.empty_cache()
        return v

    def copy_bw(self, n, model, tok32, nb):
        """Bytes/s of lease get + copy of every leased row GPU0→this GPU from the IPC
        views, and of the same bytes GPU0→this GPU by torch in this process."""
        t, st = self.t, self.store
        cp = Copier(self.cuda)
        self.clock.sync()
        t0 = time.perf_counter()
        got, results, staged = st.get_layers(model, tok32, self.layers, nb)
        t1 = time.perf_counter()
        lb = _layer_bytes(got, self.layers)
        big = max(lb.values())
        dst = t.empty(big, dtype=t.uint8, device=self.dev)
        base = dst.data_ptr()
        for sl in self.layers:
            o = 0
            for p, s in zip(got[sl][0].tolist(), got[sl][1].tolist()):  # Python ints
                cp.copy(base + o, p, s)
                o += s
        self.clock.sync()
        t2 = time.perf_counter()
        st.release(results)
        del got, staged  # drop the views and staged copies before the next measurement
        tot = sum(lb.values())
        r = {"ipc_bytes": tot, "ipc_get_ms": (t1 - t0) * 1e3, "ipc_copy_ms": (t2 - t1) * 1e3,
             "ipc_get_copy_GBps": tot / (t2 - t0) / 1e9, "ipc_copy_GBps": tot / (t2 - t1) / 1e9}
        if self.cuda and t.cuda.device_count() > 1 and self.dev.index != 0:
            src = t.empty(big, dtype=t.uint8, device="cuda:0")
            src.fill_(0x5a)
            dst.copy_(src)  # warm-up (peer access, copy engine)
            self.clock.sync()
            t.cuda.synchronize(0)
            t3 = time.perf_counter()
            for sl in self.layers:
                dst[:lb[sl]].copy_(src[:lb[sl]])
            self.clock.sync()
            t.cuda.synchronize(0)
            t4 = time.perf_counter()
            r.update(peer_copy_ms=(t4 - t3) * 1e3, peer_copy_GBps=tot / (t4 - t3) / 1e9,
                     peer_copy_chunk_bytes=big)
            del src
        H.log("N=%d: bytes/s GPU0→%s: lease get + row copies from IPC views %.1f GB/s "
              "(copies alone %.1f GB/s), in-process torch copy %s GB/s, %.2f GB"
              % (n, self.dev, r["ipc_get_copy_GBps"], r["ipc_copy_GBps"],
                 "%.1f" % r["peer_copy_GBps"] if "peer_copy_GBps" in r else "-", tot / 1e9))
        return r


def worker_main(a):
    """--worker peer|staged: answers on the original stdout, logs on stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    H.TAG = a.worker

    def send(x):
        proto.write(json.dumps(x, default=str) + "\n")
        proto.flush()
    try:
        w = Worker(a)
        send(dict(w.info(), ready=True))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        send({"error": "%s: %s" % (type(e).__name__, e)})
        return 1
    with w.t.no_grad():
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            try:
                r = getattr(w, cmd["cmd"])(**cmd.get("args", {}))
            except Exception as e:  # noqa: BLE001 — the source reports it
                traceback.print_exc()
                r = {"error": "%s: %s" % (type(e).__name__, e)}
            send(r)
    w.store.ch.close()
    return 0


# ==== source ==============================================================================

class Proc:
    """One worker process and its JSON-lines pipe."""

    def __init__(self, a, kind, device, env):
        argv = [sys.executable, os.path.join(H.HERE, "handoff.py"), "--worker", kind,
                "--worker-device", str(device), "--socket", a.socket, "--reps", str(a.reps),
                "--l0", str(a.l0), "--ns", ",".join(str(n) for n in a.ns)]
        if a.dry:
            argv.append("--dry")
        self.kind = kind
        env = dict(env, HANDOFF_T0=repr(H.T0))  # one time axis in the log
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env)
        self.buf = b""

    def send(self, cmd, **args):
        self.p.stdin.write((json.dumps({"cmd": cmd, "args": args}) + "\n").encode())
        self.p.stdin.flush()

    def recv(self, timeout):
        end = time.time() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.time()
            if left <= 0:
                raise TimeoutError("%s worker: no answer in %.0f s" % (self.kind, timeout))
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError("%s worker exited (status %s)"
                                       % (self.kind, self.p.wait()))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        try:
            self.send("quit")
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.p.kill()
            self.p.wait()


class TwoGpu(H.Bench):
    def __init__(self, a):
        import torch
        import mfk
        import rows as R
        import mapflow
        from model import Model
        self.a, self.t, self.mfk, self.R = a, torch, mfk, R
        self.cuda = not a.dry
        if self.cuda and torch.cuda.device_count() <= a.target_device:
            raise SystemExit("two GPUs: target device %d, but torch sees %d device(s)"
                             % (a.target_device, torch.cuda.device_count()))
        ts, ss = H.shapes(a.dry)
        # the workers build their models while this process builds the source's
        self.workers = {"peer": Proc(a, "peer", a.target_device, dict(os.environ))}
        if a.staged:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(a.target_device),
                       MAPFLOW_GPU_ARENAS="off")
            self.workers["staged"] = Proc(a, "staged", 0 if self.cuda else a.target_device,
                                          env)
        if self.cuda:
            torch.cuda.set_device(0)
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.be = mfk.Cuda(H.B) if self.cuda else mfk.Ref(H.B)
        self.clock = H.Clock(torch, self.cuda)
        H.log("torch %s, source on %s, target worker on device %d, path request %s"
              % (torch.__version__, self.dev, a.target_device, a.path))
        t = time.perf_counter()
        self.tgt_s = ts
        self.src = Model(ss, self.dev, seed=2)
        self.clock.sync()
        H.log("source %s %.1f GB (%.1f s)" % (ss.name, self.src.bytes() / 1e9,
                                             time.perf_counter() - t))
        self.l0 = min(a.l0, ts.layers - 1)
        self.map, self.w = H.make_profile(ts, ss, self.l0)
        self.src_layers = sorted(set(self.map.values()))
        self.store = H.Store(mapflow, a.socket, a.path, a.dry, torch, gpu_device=0,
                             name="handoff-source")
        H.log("source path: %s (%s)" % (self.store.path, self.store.why))
        self.flex = None
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.res = {"mode": "two_gpu", "path": self.store.path, "path_why": self.store.why,
                    "target_device": a.target_device, "target": vars(ts), "source": vars(ss),
                    "l0": self.l0, "mapped_layers": len(self.map),
                    "exported_source_layers": len(self.src_layers), "block": H.B,
                    "density_goal": a.density, "variants": a.variants, "reps": a.reps,
                    "torch": torch.__version__, "gpu_info": self.store.gpu_info, "rows": []}

    def tokens(self, n):
        g = np.random.default_rng(n)
        tok = g.integers(0, min(self.tgt_s.vocab, self.src.s.vocab), n).astype(np.int64)
        return tok, self.t.from_numpy(tok).to(self.dev)

    def ask(self, kind, cmd, **args):
        w = self.workers[kind]
        w.send(cmd, **args)
        return w.recv(max(30.0, self.left() + 30))

    def run_n(self, n):
        a, t = self.a, self.t
        tok_np, tok = self.tokens(n)
        tok32 = tok_np.astype(np.uint32)
        rec = {"N": n}
        reps = a.reps
        pw = self.workers["peer"]
        pw.send("full", n=n)  # GPU 1 while this process works on GPU 0
        cap = {}
        cal_layer = self.src_layers[len(self.src_layers) // 2]
        self.src.prefill(tok, self.capture_hook(cal_layer, cap))
        rec["source_full_ms"], _ = self.clock.time(
            lambda: self.src.prefill(tok, self.dense), max(1, reps - 1), warm=0)
        H.log("N=%d: source full prefill %.1f ms" % (n, rec["source_full_ms"]))
        top_p, st, entries = self.calibrate(n, cap, tok32)
        cap.clear()
        self.be.pool.pop("cal", None) if hasattr(self.be, "pool") else None
        rec.update(source_top_p=top_p, density_per_head=st["per_head"],
                   density_eff=st["eff"], row_columns=st["cols"])
        r = pw.recv(max(60.0, self.left() + 30))
        if "error" in r:
            raise RuntimeError("target full prefill: " + r["error"])
        rec["target_full_ms"] = r["target_full_ms"]
        per_layer, n_prob = H.n_prob_layers(self, n, st)
        rec.update(prob_row_bytes_per_layer_est=per_layer, prob_layers=n_prob)
        for var in a.variants:
            model = "src2-%s-%d" % (H.VARIANTS[var][0], n)
            names, modes = H.variant_layers(var, self.src_layers, self.map, n_prob)
            codecs = {sl: self.mfk.CODECS[x] for sl, x in names.items()}
            self.store.counts = {}
            try:
                srec, t_src_done = self.source_handoff(n, tok, tok32, codecs, top_p, entries,
                                                       model.encode())
                gpu_used = self.store.gpu_used()
                v = self.ask("peer", "reuse", n=n, model=model, codecs=names, modes=modes,
                             reps=reps, copy=True)
                if "error" in v:
                    raise RuntimeError("peer worker: " + v["error"])
                if "staged" in self.workers:
                    s = self.ask("staged", "reuse", n=n, model=model, codecs=names,
                                 modes=modes, reps=0, copy=False)
                    s["ttft_ms"] = s.get("get_ms", 0) + s.get("first_ms", 0)
                    v["staged"] = s
                v = dict(srec, **v)
                v.update(handoff_ms=(v["t_first"] - t_src_done) * 1e3,
                         ttft_ms=v["prefill_ms"] + v["get_ms"],
                         gain=1.0 - v["prefill_ms"] / rec["target_full_ms"],
                         daemon_gpu_bytes=gpu_used, counts=dict(self.store.counts),
                         prob_layers=sum(1 for x in modes.values() if x == "prob"))
                v["source_extra_ms"] = srec["wall_ms"] - rec["source_full_ms"]
                v["handoff_overhead"] = (srec["extract_ms"] + srec["put_tail_ms"] +
                                         v["get_ms"]) / rec["source_full_ms"]
                rec[var] = v
                H.log("N=%d %s: target on GPU %d: %s, prefill %.1f ms (%.1f%% vs full %.1f), "
                      "get %.1f ms, hand-off %.1f ms" % (
                          n, var, a.target_device, v["path"], v["prefill_ms"],
                          -100 * v["gain"], rec["target_full_ms"], v["get_ms"],
                          v["handoff_ms"]))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rec[var] = {"error": "%s: %s" % (type(e).__name__, e)}
            self.store.delete(model)
            if self.cuda:
                t.cuda.empty_cache()
        return rec

    def run(self):
        ctx = self.t.cuda.stream(self.stream) if self.cuda else H._Null()
        try:
            with ctx, self.t.no_grad():
                _, tk = self.tokens(512 if self.cuda else self.a.ns[-1])
                self.src.prefill(tk, self.dense)
                self.res["workers"] = {}
                for k, w in list(self.workers.items()):
                    r = w.recv(max(60.0, self.left()))
                    self.res["workers"][k] = r
                    H.log("%s worker: %s" % (k, {x: r.get(x) for x in (
                        "error", "device", "visible", "path", "why", "can_access_peer")}))
                    if "error" in r:
                        if k == "peer":
                            raise RuntimeError("peer worker: " + r["error"])
                        w.close()
                        del self.workers[k]
                for n in self.a.ns:
                    if self.res["rows"] and self.left() < 20 + self.res["rows"][-1]["elapsed_s"]:
                        H.log("N=%d: skipped (time budget: %.0f s left)" % (n, self.left()))
                        continue
                    tn = time.perf_counter()
                    r = self.run_n(n)
                    r["elapsed_s"] = time.perf_counter() - tn
                    self.res["rows"].append(r)
        finally:
            for w in self.workers.values():
                w.close()
        self.res["routing"] = {}
        return self.res


def table(res):
    """The two-GPU lines (after handoff.table's row)."""
    dev = res.get("target_device", 1)
    head = ["N", "variant", "path (target GPU %d)" % dev, "target full ms (GPU %d)" % dev,
            "reuse prefill ms (Δ)", "get ms", "hand-off ms",
            "get + row copies GPU0→%d GB/s (copies alone)" % dev,
            "torch copy GPU0→%d GB/s" % dev, "staged: get ms (HtoD ms)",
            "staged: first prefill ms", "staged: get + prefill ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["rows"]:
        for var in res["variants"]:
            x = r.get(var) or {}
            if "prefill_ms" not in x:
                lines.append("| %d | %s | %s |" % (r["N"], var, x.get("error", "-")))
                continue
            s = x.get("staged") or {}
            stg = s.get("path", "-")
            if s.get("hidden_gpu_opened"):
                stg += "; hidden GPU 0's arena opened anyway (%s, get %.1f ms, first %.1f ms)" % (
                    s["hidden_gpu_opened"]["path"], s["hidden_gpu_opened"]["get_ms"],
                    s["hidden_gpu_opened"]["first_ms"])
            cells = [str(r["N"]), var, "%s (%d device views, %d staged)" % (
                x["path"], x["rows_device"], x["rows_host"]), "%.1f" % r["target_full_ms"],
                "%.1f (%+.1f%%)" % (x["prefill_ms"], -100 * x["gain"]), "%.1f" % x["get_ms"],
                "%.1f" % x["handoff_ms"],
                "%.1f (%.1f)%s" % (x["ipc_get_copy_GBps"], x["ipc_copy_GBps"],
                                   "" if x["path"] == "peer views" else " [from staged rows]")
                if "ipc_get_copy_GBps" in x else x.get("copy_error", "-"),
                "%.1f" % x["peer_copy_GBps"] if "peer_copy_GBps" in x else "-",
                ("%.1f (%.1f) [%s]" % (s["get_ms"], s["stage_ms"], stg)) if "get_ms" in s
                else s.get("error", "-"),
                "%.1f" % s["first_ms"] if "first_ms" in s else "-",
                "%.1f" % s["ttft_ms"] if "ttft_ms" in s and "get_ms" in s else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    pw = (res.get("workers") or {}).get("peer") or {}
    lines.append("peer worker: %s, CUDA_VISIBLE_DEVICES %s, can_access_peer(%s, 0) %s; "
                 "channel: %s" % (pw.get("device"), pw.get("visible") or "(unset)",
                                  pw.get("device"), pw.get("can_access_peer"), pw.get("why")))
    sw = (res.get("workers") or {}).get("staged")
    if sw:
        lines.append("staged worker: %s, CUDA_VISIBLE_DEVICES %s; channel: %s"
                     % (sw.get("device"), sw.get("visible"), sw.get("why")))
    return "\n".join(lines)
