"""Shared pieces of the Python binding tests (tests/python/test_*binding*.py, and
tests/gpu/test_dlpack_gpu.py): paths, the ASan re-exec, a real mapflowd on a unix socket
in a temp dir (DaemonTest: one per test class), and rows from mapflow-synth.

Importing this module does not import mapflow: a test may set the environment the library
reads once (MF_CUDA_DRIVER for the fake driver) first, then call import_mapflow().
Env: MF_BIN (build/bin), MF_BUILD (build dir, for libmapflow)."""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("MF_BUILD", "build"))
MF_BIN = os.environ.get("MF_BIN", os.path.join(BUILD, "bin"))
LIB = os.environ.setdefault("MAPFLOW_LIB", os.path.join(BUILD, "lib", "libmapflow.so.0"))


def preload_asan():
    """A sanitized libmapflow (make asan) needs the ASan runtime loaded first."""
    if os.environ.get("LD_PRELOAD") or not os.path.exists(LIB):
        return
    out = subprocess.run(["ldd", LIB], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libasan" in line and "=>" in line:
            env = dict(os.environ, LD_PRELOAD=line.split("=>")[1].split()[0],
                       ASAN_OPTIONS="detect_leaks=0")
            os.execve(sys.executable, [sys.executable] + sys.argv, env)


def import_mapflow():
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import mapflow
    return mapflow


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def synth_rows(tmp, ns, model, block, tokens, layers, nb, seed_base):
    """{layer: [row bytes of blocks 0..nb-1]} from mapflow-synth (fp16, 4 heads, top-p 0.9)."""
    tok = os.path.join(tmp, "tok")
    with open(tok, "wb") as f:
        f.write(struct.pack("<%dI" % len(tokens), *tokens))
    rows = {}
    for layer in layers:
        out = os.path.join(tmp, "rows%d" % layer)
        subprocess.run([os.path.join(MF_BIN, "mapflow-synth"), "--model", model, "--layer",
                        str(layer), "--block", str(block), "--heads", "4", "--tokens", tok,
                        "--codec", "fp16", "--top-p", "0.9", "--seed", str(layer + seed_base),
                        "--out", out, "--ns", ns], check=True, stdout=subprocess.DEVNULL)
        rows[layer] = [read_bytes(os.path.join(out, "row-%d.bin" % i)) for i in range(nb)]
    return rows


class Daemon:
    """A real mapflowd (extra args appended), health-checked before start() returns."""

    def __init__(self, tmp, mapflow, *args):
        self.tmp, self.mapflow, self.args = tmp, mapflow, list(args)
        self.sock = os.path.join(tmp, "d.sock")
        self.proc = None

    def start(self):
        self.log = open(os.path.join(self.tmp, "daemon.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(MF_BIN, "mapflowd"), "--socket", self.sock, "--data_dir",
             os.path.join(self.tmp, "data"), "--http", "127.0.0.1:0"] + self.args,
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(500):
            if self.proc.poll() is not None:
                raise RuntimeError("mapflowd exited during start: " + self.logtail())
            try:
                with self.mapflow.Channel("unix:" + self.sock, timeout_ms=1000) as ch:
                    ch.health()
                return
            except self.mapflow.MapflowError:
                time.sleep(0.02)
        raise RuntimeError("mapflowd did not come up: " + self.logtail())

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=20)
        self.log.close()
        if rc != 0:
            raise AssertionError("mapflowd exited %d on SIGTERM: %s" % (rc, self.logtail()))

    def logtail(self):
        with open(os.path.join(self.tmp, "daemon.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")


class DaemonTest(unittest.TestCase):
    """A test class with a temp dir (cls.tmp, from make_tmp) and one real mapflowd for all
    its tests (cls.d, from start_daemon). Class cleanups (they run even when setUpClass
    fails later) stop the daemon — it must exit 0 on SIGTERM — and remove the dir."""

    @classmethod
    def make_tmp(cls, prefix):
        cls.tmp = tempfile.mkdtemp(prefix=prefix)
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        return cls.tmp

    @classmethod
    def start_daemon(cls, mapflow, *args):
        cls.d = Daemon(cls.tmp, mapflow, *args)
        cls.d.start()
        cls.addClassCleanup(cls.d.stop)
        return cls.d
