"""DLPack and __cuda_array_interface__ of leased rows on a real GPU (never in `make test`:
run on the GPU machine, e.g. `python3 tests/gpu/test_dlpack_gpu.py`, after `make`).

A mapflowd with its gpu tier on (a unix socket in a temp dir); random rows from
mapflow-synth are put from CUDA tensors (put_device), then read back leased on device 0:
torch.from_dlpack(row) is a cuda:0 uint8 tensor at the row's device address (no copy)
whose bytes are the row's, torch.as_tensor(row) through __cuda_array_interface__ the
same; the tensor stays readable after the GetResult is closed and, held, keeps the
channel's arenas mapped after Channel.close(). Host rows (a channel without gpu_device)
come back kDLCPU and torch.from_dlpack gives a CPU tensor.
Env: MF_BIN (build/bin), MF_BUILD (build dir), MAPFLOW_LIB.
"""
import gc
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mftest  # noqa: E402

mapflow = mftest.import_mapflow()
import torch  # noqa: E402
try:
    import cupy  # on the H200 image; optional
except ImportError:
    cupy = None

NS, MODEL, B = "gpu-dlpack", "gpu-dlpack-src", 16


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
class DlpackGpuTest(mftest.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.make_tmp("mfdlp-")
        rng = random.Random()
        cls.nb = 6
        cls.tokens = [rng.randrange(1, 60000) for _ in range(cls.nb * B)]
        cls.rows = mftest.synth_rows(cls.tmp, NS, MODEL, B, cls.tokens, (5,), cls.nb,
                                     rng.randrange(1000))[5]
        cls.start_daemon(mapflow, "--host_bytes", "64mb", "--gpu_bytes", "256mb")

    def test_device_rows_to_torch(self):
        ch = mapflow.Channel("unix:" + self.d.sock, ns=NS, want_arena=True, gpu_device=0)
        self.assertGreater(ch.gpu_info()["mapped"], 0, ch.gpu_info())
        for r in self.rows:
            t = torch.frombuffer(bytearray(r), dtype=torch.uint8).cuda()
            torch.cuda.synchronize()
            self.assertEqual(ch.put_device(t.data_ptr(), len(r)).tier, "gpu")
        g = ch.get_prefix(MODEL, B, self.tokens, [5], lease=True)
        tensors = []
        for i, row in enumerate(g):
            self.assertTrue(row.on_device, row)
            self.assertEqual(row.__dlpack_device__(), (2, 0))
            t = torch.from_dlpack(row)
            self.assertEqual((t.device.type, t.device.index, t.dtype, tuple(t.shape)),
                             ("cuda", 0, torch.uint8, (len(self.rows[i]),)))
            self.assertEqual(t.data_ptr(), row.device_ptr)
            self.assertEqual(bytes(t.cpu().numpy()), self.rows[i])
            # __cuda_array_interface__ says read-only (the arena is shared with the daemon):
            # torch.as_tensor refuses such views (seen on the H200, torch 2.11), CuPy takes them.
            cai = row.__cuda_array_interface__
            self.assertEqual(cai["data"], (row.device_ptr, True))
            self.assertEqual((cai["shape"], cai["typestr"]), ((len(self.rows[i]),), "|u1"))
            if cupy is not None:
                c = cupy.asarray(row)
                self.assertEqual(c.data.ptr, row.device_ptr)
                self.assertEqual(bytes(cupy.asnumpy(c)), self.rows[i])
            tensors.append(t)
        g.close()
        with self.assertRaises(mapflow.ViewClosed):
            g[0].__dlpack__()
        self.assertEqual(bytes(tensors[0].cpu().numpy()), self.rows[0])
        ch.close()
        gc.collect()
        self.assertIsNotNone(ch._core.h)  # the tensors keep the arenas mapped
        self.assertEqual(bytes(tensors[-1].cpu().numpy()), self.rows[-1])
        del tensors, t, c, row, g
        gc.collect()
        self.assertIsNone(ch._core.h)

    def test_host_rows_to_torch(self):
        with mapflow.Channel("unix:" + self.d.sock, ns=NS, want_arena=True) as ch:
            ch.put_batch(self.rows)
            with ch.get_prefix(MODEL, B, self.tokens, [5], lease=True) as g:
                for i, row in enumerate(g):
                    self.assertFalse(row.on_device)
                    self.assertEqual(row.__dlpack_device__(), (1, 0))
                    t = torch.from_dlpack(row)
                    self.assertEqual(t.device.type, "cpu")
                    self.assertEqual(bytes(t.numpy()), self.rows[i])


if __name__ == "__main__":
    unittest.main(verbosity=2)
