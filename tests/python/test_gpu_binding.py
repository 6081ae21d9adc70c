"""The Python binding's GPU calls against a real mapflowd with its GPU tier on, on the CPU.

The fake CUDA driver (build/lib/tests/libfakecuda.so, selected with MF_CUDA_DRIVER before
the first channel opens) gives the daemon and this process memfd-backed "device memory":
device addresses are host addresses, so the test reads leased device views with
ctypes.string_at and allocates "device" rows through the same library. Rows come from
mapflow-synth. Covers: Channel(gpu_device=) and gpu_info(), put_device / put_device_batch
into the gpu tier, leased rows on_device with device_ptr and gpu_arena whose bytes are
the rows and whose DLPack capsules / __cuda_array_interface__ describe them (kDLCUDA),
get_lease on the device, copies of GPU rows, a channel without gpu_device
getting host views, put_region (rows written at its device addresses, one flipped byte
refused with the others stored, misuse; capacities=True with commit(lengths=...)),
GetResult.columns() of a leased get of device rows and missing ones (equal to the Row
objects and to table(), addresses at the rows' bytes, leases released,
mf_get_result_columns refusing a short cap or no result), and errors (no GPU channel, a
bad device address) as MapflowError.
Env: MF_BIN (build/bin), MF_BUILD (build dir, for libmapflow and the fake driver).
"""
import array
import ctypes as C
import gc
import os
import random
import sys
import unittest
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

FAKE = os.path.join(mftest.BUILD, "lib", "tests", "libfakecuda.so")
mftest.preload_asan()
# Read once per process by libmapflow's driver loader, and inherited by mapflowd.
os.environ["MF_CUDA_DRIVER"] = os.path.abspath(FAKE)
os.environ["FAKECUDA_DEVICES"] = "2"
os.environ.pop("FAKECUDA_NO_PEER", None)
mapflow = mftest.import_mapflow()

NS = "py-gpu"
MODEL = "py-gpu-src"
B = 16


class FakeCuda:
    """Device memory through the fake driver (the same loaded library libmapflow uses)."""

    def __init__(self):
        self.lib = C.CDLL(FAKE)
        for name, args in (("cuInit", [C.c_uint]), ("cuDeviceGet", [C.POINTER(C.c_int), C.c_int]),
                           ("cuDevicePrimaryCtxRetain", [C.POINTER(C.c_void_p), C.c_int]),
                           ("cuCtxSetCurrent", [C.c_void_p]),
                           ("cuMemAlloc_v2", [C.POINTER(C.c_uint64), C.c_size_t]),
                           ("cuMemFree_v2", [C.c_uint64]),
                           ("cuMemcpyHtoD_v2", [C.c_uint64, C.c_char_p, C.c_size_t]),
                           ("cuCtxSynchronize", [])):
            getattr(self.lib, name).argtypes = args
            getattr(self.lib, name).restype = C.c_int
        self.ok(self.lib.cuInit(0))
        dev, ctx = C.c_int(), C.c_void_p()
        self.ok(self.lib.cuDeviceGet(C.byref(dev), 0))
        self.ok(self.lib.cuDevicePrimaryCtxRetain(C.byref(ctx), dev))
        self.ok(self.lib.cuCtxSetCurrent(ctx))

    @staticmethod
    def ok(r):
        if r != 0:
            raise RuntimeError("fake CUDA call failed: %d" % r)

    def copy(self, data):
        p = C.c_uint64()
        self.ok(self.lib.cuMemAlloc_v2(C.byref(p), len(data)))
        self.ok(self.lib.cuMemcpyHtoD_v2(p, data, len(data)))
        return p.value

    def free(self, p):
        self.ok(self.lib.cuMemFree_v2(p))


class DLDevice(C.Structure):  # dlpack.h, written out here independently of the binding
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)),
                ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p),
                ("deleter", C.CFUNCTYPE(None, C.c_void_p))]


def consume_dlpack(cap):
    """What a consumer (torch.from_dlpack) does with a capsule: reads the tensor, renames
    the capsule "used_dltensor", and calls the deleter when done. Returns
    (data, device_type, device_id, shape, (code, bits, lanes), strides is NULL)."""
    api = C.PyDLL(None)  # not ctypes.pythonapi: its argtypes are shared process-wide
    api.PyCapsule_GetPointer.restype = C.c_void_p
    api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
    api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]
    addr = api.PyCapsule_GetPointer(cap, b"dltensor")
    mt = DLManagedTensor.from_address(addr)
    t = mt.dl_tensor
    got = (t.data, t.device.device_type, t.device.device_id,
           tuple(t.shape[i] for i in range(t.ndim)), (t.code, t.bits, t.lanes),
           not t.strides, t.byte_offset)
    api.PyCapsule_SetName(cap, b"used_dltensor")
    mt.deleter(addr)
    return got


class GpuBindingTest(mftest.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.make_tmp("mfpygpu-")
        rng = random.Random(17)
        cls.nb = 5
        cls.tokens = [rng.randrange(1, 50000) for _ in range(cls.nb * B + 3)]
        cls.rows = mftest.synth_rows(cls.tmp, NS, MODEL, B, cls.tokens, (1, 2, 3, 4, 5),
                                     cls.nb, 40)
        cls.hashes = mapflow.hash_prefix(NS, MODEL, B, cls.tokens)
        cls.start_daemon(mapflow, "--host_bytes", "32mb", "--gpu_bytes", "8mb")
        cls.sock = cls.d.sock
        cls.cu = FakeCuda()

    def chan(self, **kw):
        kw.setdefault("ns", NS)
        kw.setdefault("want_arena", True)
        return mapflow.Channel("unix:" + self.sock, **kw)

    def test_device_put_and_device_views(self):
        with self.chan(gpu_device=0) as ch:
            gi = ch.gpu_info()
            self.assertEqual((gi["gpu_device"], gi["driver"]), (0, True))
            self.assertEqual((gi["announced"], gi["mapped"], gi["peer"]), (2, 2, 1))
            self.assertTrue(all(a["mapped"] and not a["why"] for a in gi["arenas"]))
            self.assertTrue(ch.info()["gpu_tier"])
            dev = [self.cu.copy(r) for r in self.rows[1]]
            try:
                for p, r in zip(dev[:3], self.rows[1][:3]):
                    self.assertEqual(ch.put_device(p, len(r)).tier, "gpu")
                res = ch.put_device_batch([(p, len(r)) for p, r in zip(dev[3:], self.rows[1][3:])])
                self.assertEqual([x.tier for x in res], ["gpu"] * (self.nb - 3))
            finally:
                for p in dev:
                    self.cu.free(p)
            with ch.get_prefix(MODEL, B, self.tokens, [1], lease=True) as g:
                self.assertEqual(len(g), self.nb)
                for i, row in enumerate(g):
                    self.assertTrue(row.ok, row)
                    self.assertTrue(row.on_device)
                    self.assertEqual(row.tier, "gpu")
                    self.assertIsNone(row.data)
                    self.assertIn(row.gpu_arena, (0, 1))
                    self.assertTrue(row.lease_id)
                    self.assertEqual(row.length, len(self.rows[1][i]))
                    # fake driver: the device address is readable from the host
                    self.assertEqual(C.string_at(row.device_ptr, row.length), self.rows[1][i])
                    # DLPack / CUDA array interface: kDLCUDA (2) on gpu_device 0, 1-D uint8
                    self.assertEqual(row.__dlpack_device__(), (2, 0))
                    self.assertEqual(consume_dlpack(row.__dlpack__(stream=1)),
                                     (row.device_ptr, 2, 0, (row.length,), (1, 8, 1), True, 0))
                    cai = row.__cuda_array_interface__
                    self.assertEqual((cai["shape"], cai["typestr"], cai["data"], cai["version"]),
                                     ((row.length,), "|u1", (row.device_ptr, True), 3))
                # A row that exported its CUDA array interface keeps the memory (CuPy and
                # Numba hold the row, not the dict).
                del cai, row
                # An unconsumed capsule keeps the views' memory (and the arena) until it
                # dies; a consumed one until the consumer calls the deleter.
                owner = weakref.ref(g._views.owner)
                kept, used = g[0].__dlpack__(), g[1].__dlpack__()
                g.release()
                g.close()
                with self.assertRaises(mapflow.ViewClosed):
                    g[0].__dlpack__()
                gc.collect()
                self.assertIsNotNone(owner())
                del kept
                gc.collect()
                self.assertIsNotNone(owner())
                self.assertEqual(consume_dlpack(used)[0], g[1].device_ptr)
                gc.collect()
                self.assertIsNotNone(owner())  # g[*] exported __cuda_array_interface__
                g._made = []  # drop the Row objects made so far (each holds its CAI owner)
                gc.collect()
                self.assertIsNone(owner(), "the deleter did not let the result go")
            with ch.get_prefix(MODEL, B, self.tokens, [1]) as g:  # copies of GPU rows
                self.assertEqual([r.data.tobytes() for r in g], self.rows[1])
                self.assertFalse(any(r.on_device for r in g))
            lease = ch.get_lease(MODEL, 1, self.hashes[2])
            self.assertTrue(lease.on_device)
            self.assertIsNone(lease.data)
            self.assertEqual(C.string_at(lease.device_ptr, lease.length), self.rows[1][2])
            lease.release()
            self.assertEqual(ch.get(MODEL, 1, self.hashes[4]), self.rows[1][4])
        # without gpu_device: host views of the same rows (staged by the daemon)
        with self.chan() as ch:
            self.assertEqual(ch.gpu_info()["announced"], 0)
            with ch.get_prefix(MODEL, B, self.tokens, [1], lease=True) as g:
                self.assertEqual([r.data.tobytes() for r in g], self.rows[1])
                self.assertEqual({r.tier for r in g}, {"host"})
                self.assertFalse(any(r.on_device for r in g))

    def test_put_region(self):
        rows = self.rows[3]
        bad = random.Random(os.getpid()).randrange(len(rows))
        with self.chan(gpu_device=0) as ch:
            with ch.put_region(MODEL, 3, [len(r) for r in rows]) as reg:
                self.assertEqual(len(reg.rows), len(rows))
                for i, (p, r) in enumerate(zip(reg.rows, rows)):
                    self.assertEqual(p % 16, 0)
                    if i == bad:  # one byte flipped after sealing (in the masses / tiles)
                        r = r[:-5] + bytes([r[-5] ^ 0x08]) + r[-4:]
                    self.cu.ok(self.cu.lib.cuMemcpyHtoD_v2(p, r, len(r)))
                self.cu.ok(self.cu.lib.cuCtxSynchronize())
                with self.assertRaises(mapflow.DataLoss) as e:
                    reg.commit()
                res = e.exception.result
                self.assertEqual((res["committed"], res["first_failed"]), (len(rows) - 1, bad))
                self.assertEqual(res["statuses"], [mapflow.DATA_LOSS if i == bad else 0
                                                   for i in range(len(rows))])
                with self.assertRaises(mapflow.FailedPrecondition):
                    reg.commit()  # once only
            for i, r in enumerate(rows):
                if i == bad:
                    with self.assertRaises(mapflow.NotFound):
                        ch.get(MODEL, 3, self.hashes[i])
                else:
                    self.assertEqual(ch.get(MODEL, 3, self.hashes[i]), r)
            reg = ch.put_region(MODEL, 3, [len(rows[0])])
            reg.abort()
            with self.assertRaises(mapflow.FailedPrecondition):
                reg.commit()
            reg.close()
            with self.assertRaises(mapflow.FailedPrecondition):
                reg.abort()  # closed
            with self.assertRaises(mapflow.InvalidArgument):
                ch.put_region(MODEL, 3, [])
        with self.chan() as ch, self.assertRaises(mapflow.FailedPrecondition):
            ch.put_region(MODEL, 3, [len(rows[0])])  # no gpu_device: put_device_batch

    def test_put_region_capacities(self):
        rows = self.rows[2]
        rng = random.Random(os.getpid())
        caps = [len(r) + rng.randrange(0, 4000) for r in rows]
        with self.chan(gpu_device=0) as ch:
            reg = ch.put_region(MODEL, 2, caps, capacities=True)
            with reg:
                for p, r, c in zip(reg.rows, rows, caps):  # random bytes in the slack
                    junk = r + bytes(rng.randrange(256) for _ in range(c - len(r)))
                    self.cu.ok(self.cu.lib.cuMemcpyHtoD_v2(p, junk, c))
                self.cu.ok(self.cu.lib.cuCtxSynchronize())
                with self.assertRaises(mapflow.FailedPrecondition):
                    reg.commit()  # a capacities region needs its lengths
                over = [len(r) for r in rows]
                over[-1] = caps[-1] + 1
                for bad in (over, [len(r) for r in rows][:-1], [79] * len(rows)):
                    with self.assertRaises(mapflow.InvalidArgument):
                        reg.commit(lengths=bad)
                # any sequence of ints (a list, array.array, a NumPy array)
                lens = [len(r) for r in rows]
                try:
                    import numpy as np
                    lens = np.array(lens, dtype=np.int64)
                except ImportError:
                    lens = array.array("Q", lens)
                res = reg.commit(lengths=lens)
                self.assertEqual((res["committed"], res["first_failed"]), (len(rows), None))
            for i, r in enumerate(rows):
                self.assertEqual(ch.get(MODEL, 2, self.hashes[i]), r)
            with ch.put_region(MODEL, 2, [len(rows[0])]) as reg:  # exact: no lengths
                with self.assertRaises(mapflow.InvalidArgument):
                    reg.commit(lengths=[len(rows[0])])
                reg.abort()

    def test_row_columns(self):
        rng = random.Random(os.getpid())
        layers = [4, 6, 5]  # 6 has no rows: NOT_FOUND rows among the device views
        rng.shuffle(layers)
        with self.chan(gpu_device=0) as ch:
            for layer in (4, 5):
                with ch.put_region(MODEL, layer, [len(r) for r in self.rows[layer]]) as reg:
                    for p, r in zip(reg.rows, self.rows[layer]):
                        self.cu.ok(self.cu.lib.cuMemcpyHtoD_v2(p, r, len(r)))
                    self.cu.ok(self.cu.lib.cuCtxSynchronize())
                    self.assertEqual(reg.commit()["committed"], self.nb)
            first = rng.randrange(self.nb - 1)
            nb = self.nb - first
            g = ch.get_prefix(MODEL, B, self.tokens, layers, first_block=first, lease=True)
            cols = g.columns()
            self.assertEqual(len(cols), len(layers) * nb)
            self.assertEqual(g._made, [None] * len(g))  # no Row made for the columns
            self.assertEqual(ch.stats()["counters"]["leases"], 2 * nb)
            tab = g.table()
            for i in rng.sample(range(len(g)), len(g)):  # any order
                row, layer = g[i], layers[i // nb]
                want = (0, layer, first + i % nb, "gpu") if layer != 6 else \
                    (mapflow.NOT_FOUND, layer, first + i % nb, "none")
                self.assertEqual((int(cols.status[i]), int(cols.layer[i]), int(cols.block[i]),
                                  mapflow._TIERS[int(cols.tier[i])]), want)
                self.assertEqual((int(cols.status[i]), int(cols.layer[i]), int(cols.block[i]),
                                  int(cols.data[i]), int(cols.length[i]), int(cols.lease_id[i]),
                                  bool(cols.on_device[i]), int(cols.gpu_arena[i])),
                                 (row.status, row.layer, row.block, row.device_ptr, row.length,
                                  row.lease_id, row.on_device, row.gpu_arena))
                for f, _ in mapflow.RowColumns.FIELDS:
                    self.assertEqual(tab[f][i], cols[f][i], f)
                if layer != 6:  # the fake driver's device memory is readable here
                    self.assertEqual(C.string_at(int(cols.data[i]), int(cols.length[i])),
                                     self.rows[layer][first + i % nb])
                else:
                    self.assertEqual((int(cols.data[i]), int(cols.length[i]),
                                      bool(cols.on_device[i])), (0, 0, False))
            k = layers.index(5)
            sl = cols.data[k * nb:(k + 1) * nb]  # a layer's rows: a view, not a copy
            self.assertIs(sl.base, cols.data)
            self.assertEqual(sl.dtype, np.uint64)
            # The C call refuses a cap below the result's rows and writes nothing.
            out = np.full(len(g), 7, dtype=np.uint64)
            short = mapflow._clib._RowColumns(len(g) - 1, data=out.ctypes.data)
            self.assertEqual(mapflow._lib.mf_get_result_columns(g._ptr, C.byref(short)),
                             mapflow.INVALID_ARGUMENT)
            self.assertEqual(set(out.tolist()), {7})
            self.assertEqual(mapflow._lib.mf_get_result_columns(None, C.byref(short)),
                             mapflow.INVALID_ARGUMENT)
            self.assertEqual(mapflow._lib.mf_get_result_columns(g._ptr, None),
                             mapflow.INVALID_ARGUMENT)
            g.release()
            self.assertFalse(g.columns().lease_id.any())
            self.assertEqual(ch.stats()["counters"]["leases"], 0)
            g.close()
            with self.assertRaises(mapflow.ViewClosed):
                g.columns()
            self.assertEqual(cols.length.dtype, np.uint64)  # arrays outlive the result
            self.assertTrue(cols.length[cols.status == 0].all())

    def test_errors(self):
        p = self.cu.copy(self.rows[2][0])
        try:
            with self.chan() as ch:  # no GPU
                with self.assertRaises(mapflow.MapflowError) as e:
                    ch.put_device(p, len(self.rows[2][0]))
                self.assertEqual(e.exception.code, mapflow.FAILED_PRECONDITION)
            with self.chan(gpu_device=0) as ch:
                with self.assertRaises(mapflow.MapflowError) as e:
                    ch.put_device(p, len(self.rows[2][0]) - 16)  # wrong length
                self.assertEqual(e.exception.code, mapflow.INVALID_ARGUMENT)
                buf = C.create_string_buffer(self.rows[2][0])  # host memory, not device
                with self.assertRaises(mapflow.MapflowError) as e:
                    ch.put_device(C.addressof(buf) & ~15, len(self.rows[2][0]))
                self.assertEqual(e.exception.code, mapflow.INVALID_ARGUMENT)
                self.assertEqual(ch.put_device(p, len(self.rows[2][0])).tier, "gpu")
            with self.chan(gpu_device=7) as ch:  # not a device of this process
                gi = ch.gpu_info()
                self.assertFalse(gi["driver"])
                self.assertIn("gpu_device 7", gi["why"])
                self.assertEqual(ch.get(MODEL, 2, self.hashes[0]), self.rows[2][0])
        finally:
            self.cu.free(p)


if __name__ == "__main__":
    unittest.main(verbosity=2)
