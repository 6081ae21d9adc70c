"""The Python binding's contract beyond the calls, against a real mapflowd (unix socket):

- DLPack: numpy.from_dlpack (and torch.from_dlpack when torch is importable) of leased
  host rows and of copied rows reads the row's bytes with no copy, device (kDLCPU, 0);
  a device row's exports are covered by tests/gpu/test_dlpack_gpu.py on a GPU machine.
- Lifetimes: after GetResult.close() / Lease.release() the views raise ViewClosed; an
  array made before keeps its memory (the C result is freed, and a closed channel's arenas
  unmapped, only when the last array is gone — checked through weak references); a
  closed Channel refuses calls with FailedPrecondition.
- GetResult.__exit__ releases the leases when the block raises.
- GetResult.table(): every row's fields as a NumPy array, equal to the Row objects' (which
  are made when first asked for); addresses point at the rows' bytes; a row first asked
  for after close() raises ViewClosed, one read before keeps its fields.
- Errors: one subclass per status of the library's table, messages without the status.
- ABI: the import-time layout check refuses a mirror that differs from mf_abi_layout().
- fork(): the parent's channel and queue refuse calls in the child and close there without
  touching the library; the child opens its own channel and reads rows; the parent's
  channel and queue go on, on the same connection.
Rows come from mapflow-synth with random tokens. Env: MF_BIN, MF_BUILD, MAPFLOW_LIB.
"""
import ctypes as C
import gc
import os
import pickle
import random
import sys
import time
import unittest
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

mftest.preload_asan()
mapflow = mftest.import_mapflow()

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None

NS = "py-views"
MODEL = "py-views-src"
B = 16


class ViewsTest(mftest.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.make_tmp("mfpyv-")
        rng = random.Random(int(time.time()))
        cls.nb = 4
        cls.tokens = [rng.randrange(1, 60000) for _ in range(cls.nb * B + 3)]
        cls.rows = mftest.synth_rows(cls.tmp, NS, MODEL, B, cls.tokens, (2,), cls.nb,
                                     rng.randrange(1000))[2]
        cls.hashes = mapflow.hash_prefix(NS, MODEL, B, cls.tokens)
        cls.start_daemon(mapflow, "--host_bytes", "64mb")
        with cls.chan() as ch:
            ch.put_batch(cls.rows)

    @classmethod
    def chan(cls, **kw):
        kw.setdefault("ns", NS)
        return mapflow.Channel("unix:" + cls.d.sock, **kw)

    def get(self, ch, lease):
        return ch.get_prefix(MODEL, B, self.tokens, [2], lease=lease)

    @unittest.skipIf(np is None, "NumPy is not importable")
    def test_dlpack_round_trip(self):
        self.assertTrue(hasattr(np, "from_dlpack"))
        with self.chan(want_arena=True) as ch:
            for lease in (True, False):
                with self.get(ch, lease) as g:
                    self.assertEqual(len(g), self.nb)
                    for i, row in enumerate(g):
                        self.assertEqual(row.__dlpack_device__(), (1, 0))  # kDLCPU
                        self.assertFalse(hasattr(row, "__cuda_array_interface__"))
                        a = np.from_dlpack(row)
                        self.assertEqual((a.dtype, a.shape), (np.uint8, (len(self.rows[i]),)))
                        self.assertEqual(a.tobytes(), self.rows[i])
                        # zero copy: the array is the row where the library has it
                        self.assertEqual(a.ctypes.data, np.frombuffer(row.data, np.uint8)
                                         .ctypes.data)
                        if torch is not None:
                            t = torch.from_dlpack(row)
                            self.assertEqual(bytes(t.numpy().tobytes()), self.rows[i])
            lease = ch.get_lease(MODEL, 2, self.hashes[1])
            self.assertEqual(np.from_dlpack(lease).tobytes(), self.rows[1])
            lease.release()

    def closed_views(self, ch, lease):
        """A result's views after close(): ViewClosed, and its memory kept for arrays."""
        g = self.get(ch, lease)
        row = g[2]
        mv = row.data
        arr = row.array() if np is not None else None
        owner = weakref.ref(g._views.owner)
        g.release()
        g.close()
        for use in (lambda: row.data, lambda: row.array(), lambda: row.tokens,
                    lambda: row.__dlpack__()):
            with self.assertRaises(mapflow.ViewClosed):
                use()
        with self.assertRaises(ValueError):  # the memoryview handed out is released
            mv.tobytes()
        self.assertTrue(issubclass(mapflow.ViewClosed, mapflow.FailedPrecondition))
        if arr is not None:
            gc.collect()
            self.assertIsNotNone(owner(), "memory freed under a live array")
            self.assertEqual(arr.tobytes(), self.rows[2])
            del arr
        row = mv = None  # (the lambdas above share this cell)
        gc.collect()
        self.assertIsNone(owner(), "result not freed once nothing views it")

    @unittest.skipIf(np is None, "NumPy is not importable")
    def test_table_matches_rows(self):
        with self.chan(want_arena=True) as ch:
            for lease in (True, False):
                g = self.get(ch, lease)
                tab = g.table()
                self.assertEqual(len(tab), self.nb)
                self.assertEqual(g._made, [None] * self.nb)  # nothing made yet
                for i in (self.nb - 1, 0):  # any order, one at a time
                    row = g[i]
                    self.assertEqual((int(tab["status"][i]), int(tab["layer"][i]),
                                      int(tab["block"][i]), int(tab["length"][i]),
                                      int(tab["lease_id"][i]), bool(tab["on_device"][i])),
                                     (row.status, row.layer, row.block, row.length,
                                      row.lease_id, row.on_device))
                    self.assertEqual(C.string_at(int(tab["data"][i]), int(tab["length"][i])),
                                     self.rows[i])
                self.assertEqual(list(tab["block"]), list(range(self.nb)))
                self.assertEqual(bool(all(tab["lease_id"])), lease)
                self.assertIsNone(g._made[1])
                self.assertEqual(g[-1].block, self.nb - 1)
                with self.assertRaises(IndexError):
                    g[self.nb]
                g.release()
                self.assertFalse(any(g.table()["lease_id"]))  # the C result zeroes them
                self.assertEqual(g[0].lease_id, 0)
                g.close()
                self.assertEqual(g[0].block, 0)  # read before close: kept
                for use in (lambda: g[1], lambda: g.table(), lambda: list(g)):
                    with self.assertRaises(mapflow.ViewClosed):
                        use()

    def test_views_closed_and_memory_kept(self):
        with self.chan(want_arena=True) as ch:
            self.closed_views(ch, False)
            self.closed_views(ch, True)
            lease = ch.get_lease(MODEL, 2, self.hashes[3])
            self.assertEqual(lease.data.tobytes(), self.rows[3])
            lease.release()
            with self.assertRaises(mapflow.ViewClosed):
                lease.data

    def test_channel_close_waits_for_arena_views(self):
        ch = self.chan(want_arena=True)
        g = self.get(ch, True)
        arr = g[0].array() if np is not None else None
        g.release()
        g.close()
        ch.close()
        self.assertTrue(ch.closed)
        with self.assertRaises(mapflow.FailedPrecondition) as e:
            ch.health()
        self.assertEqual(e.exception.message, "the channel is closed")
        if arr is not None:
            self.assertIsNotNone(ch._core.h, "arena unmapped under a live array")
            self.assertEqual(arr.tobytes(), self.rows[0])  # mapped still: no fault
            del arr
        del g
        gc.collect()
        self.assertIsNone(ch._core.h, "mf_channel_close never ran")

    def test_exit_releases_on_exception(self):
        with self.chan(want_arena=True) as ch:
            with self.assertRaises(KeyError):
                with self.get(ch, True) as g:
                    ids = [r.lease_id for r in g]
                    self.assertTrue(all(ids))
                    raise KeyError("boom")
            self.assertEqual(ch.release(ids), 0)  # nothing left to release
            g2 = self.get(ch, True)  # control: an unreleased result's leases are held
            ids2 = [r.lease_id for r in g2]
            g2.close()
            self.assertEqual(ch.release(ids2), len(ids2))

    def test_error_classes_and_messages(self):
        self.assertEqual(mapflow.STATUS[5], "NOT_FOUND")
        for code, name in mapflow.STATUS.items():
            if code:
                cls = type(mapflow.MapflowError(code, "x"))
                self.assertTrue(issubclass(cls, mapflow.MapflowError))
                self.assertEqual(cls.__name__.upper(), name.replace("_", ""))
        for err in (mapflow.MapflowError(mapflow.DATA_LOSS, "DATA_LOSS: row 3 bad"),
                    mapflow.ViewClosed("gone")):  # multiprocessing pickles errors
            back = pickle.loads(pickle.dumps(err))
            self.assertIs(type(back), type(err))
            self.assertEqual((back.code, back.message, str(back)),
                             (err.code, err.message, str(err)))
        self.assertEqual(str(mapflow.MapflowError(mapflow.DATA_LOSS, "DATA_LOSS: row 3 bad")),
                         "DATA_LOSS: row 3 bad")
        with self.chan() as ch:
            with self.assertRaises(mapflow.NotFound) as e:
                ch.get(MODEL, 77, self.hashes[0])
            self.assertEqual(e.exception.code, mapflow.NOT_FOUND)
            self.assertFalse(e.exception.message.startswith("NOT_FOUND"), e.exception.message)
            self.assertEqual(str(e.exception).count("NOT_FOUND"), 1, str(e.exception))
            with self.assertRaises(mapflow.FailedPrecondition):
                ch.get_prefix(MODEL, B, self.tokens, [2], lease=True)  # no arena
            with self.assertRaises(mapflow.InvalidArgument):
                ch.get(MODEL, 2, "not-hex")
        with self.assertRaises(mapflow.Unavailable):
            mapflow.Channel("unix:" + os.path.join(self.tmp, "nobody.sock"),
                            retry={"max_retries": 0})
        self.assertEqual(mapflow.__version__, mapflow.version())
        with open(os.path.join(mftest.ROOT, "client", "mapflow.h")) as f:
            self.assertIn('#define MF_VERSION_STRING "%s"' % mapflow.__version__, f.read())

    def test_abi_layout_check_refuses_a_mismatch(self):
        lib = mapflow._lib_layout()
        self.assertEqual(lib["mf_row_ref_t"][0], ("", 0, C.sizeof(mapflow._RowRef)))
        self.assertEqual(mapflow._abi_mismatches(lib, mapflow._MIRRORS), [])
        fields = list(mapflow._RowRef._fields_)
        fields[1], fields[2] = fields[2], ("layer", C.c_uint64)  # a wider member

        class Bad(C.Structure):
            _c_type_ = "mf_row_ref_t"
            _fields_ = fields

        class Unknown(C.Structure):
            _c_type_ = "mf_nothing_t"
            _fields_ = [("x", C.c_int)]

        bad = mapflow._abi_mismatches(lib, [Bad, Unknown])
        self.assertEqual(len(bad), 2, bad)
        self.assertIn("mf_row_ref_t", bad[0])
        self.assertIn("mf_nothing_t: not in the library's layout", bad[1])
        saved = mapflow._MIRRORS
        mapflow._MIRRORS = [Bad]
        try:
            with self.assertRaises(ImportError) as e:
                mapflow._check_abi()
        finally:
            mapflow._MIRRORS = saved
        self.assertIn(mapflow._lib_path, str(e.exception))
        self.assertIn("mf_row_ref_t", str(e.exception))

    def test_fork_child_opens_its_own_channel(self):
        with self.chan(want_arena=True) as ch:
            self.assertTrue(ch.health()["ok"])
            cq = mapflow.CompletionQueue()
            pid = os.fork()
            if pid == 0:  # the child
                rc = 1
                try:
                    # The parent's channel and queue refuse calls here and close without
                    # touching the library (its close would join the parent's I/O thread).
                    try:
                        ch.health()
                        rc = 3
                    except mapflow.FailedPrecondition as e:
                        rc = 0 if "child of fork()" in e.message else 4
                    ch.close()
                    cq.close()
                    if rc == 0:
                        with self.chan(want_arena=True) as mine:
                            with mine.get_prefix(MODEL, B, self.tokens, [2], lease=True) as g:
                                rc = 0 if [r.data.tobytes() for r in g] == self.rows else 2
                finally:
                    os._exit(rc)
            deadline = time.time() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.time() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    self.fail("the forked child hung")
                time.sleep(0.02)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            with self.get(ch, True) as g:
                self.assertEqual([r.data.tobytes() for r in g], self.rows)
            self.assertEqual(ch.info()["reconnects"], 0)  # the connection was not disturbed
            ch.health_async(cq, tag="after-fork")
            self.assertEqual(cq.next(10000).tag, "after-fork")
            cq.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
