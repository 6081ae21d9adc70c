"""mapflow.kernels' CUDA calls against the C reference on a real GPU (never in `make test`:
tests/gpu/all.sh runs it as step kernels-py, after `make`; the CPU half is
tests/python/test_kernels_py.py). Fresh random inputs each run, fp16 and bf16:

- attention_dense_cuda vs attention_dense_ref (float64): ‖O − O64‖ / ‖O64‖ ≤ 2e-3, LSE
  within 1e-3 (the limits of tests/gpu/gpu_check.c), on a non-default torch stream;
- extract_cuda: every row decodes (mf_row_decode: structure + checksum) with the header
  extract_ref writes for the same block (block, heads, layer, prefix hash), and the block
  masses (want_mass) are within 1e-3 of float64 masses from the dense reference;
- apply_cuda with those rows (as Rows, and as a list of device addresses) vs apply_ref on
  the same rows copied to the host, for implementations core and v2: ‖O − O_ref‖ /
  ‖O_ref‖ ≤ 2e-3; with no rows it is dense attention; with o_dtype = q's dtype (new or
  out=) O equals that call's fp32 O rounded to nearest, bit for bit; another o_dtype, or
  an out of the wrong dtype, is refused;
- export_cuda (the fused forward + extract's selection): O / LSE vs float64, masses vs
  extract_cuda's, rows that decode with extract_ref's headers; with o_dtype = q's dtype
  O equals the fp32 O rounded to nearest; with rows_stream the rows (PendingRows.wait)
  are the same bytes;
- rows_copy_cuda on a side stream equals rows_copy_ref's copy, nothing else written;
- extract_cuda with sample_stride (the strided query sample, the engine's LSE given):
  masses within 1e-3 of the float64 sampled masses (and not the exact ones), rows that
  decode with extract_ref's headers for the same sample; a bad stride is refused;
- CPU tensors, float32, non-contiguous tensors and mixed devices raise InvalidArgument.
Env: MF_BUILD (build dir), MAPFLOW_LIB, MAPFLOW_KERNELS_LIB.
"""
import ctypes as C
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mftest  # noqa: E402

import numpy as np  # noqa: E402

os.environ.setdefault("MAPFLOW_KERNELS_LIB", os.path.join(mftest.BUILD, "lib"))
mapflow = mftest.import_mapflow()
import mapflow.kernels as K  # noqa: E402
import torch  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def host(t):
    """A CUDA tensor as the reference takes it (fp16 as NumPy, bf16 as a CPU tensor)."""
    t = t.cpu().contiguous()
    return t.numpy() if t.dtype == torch.float16 else t


def lib_scratch(n):
    """mf_attention_masses_scratch(n) of the CUDA library (bytes of the fused forward's
    scratch on the current device)."""
    return K.library("cuda").mf_attention_masses_scratch(n)


def rand_qkv(gen, n, hq, hkv, d, dtype):
    # a few large keys per head make the maps peaked, as real ones are
    def t(h, s):
        return (torch.randn(n, h, d, generator=gen, device="cuda") * s).to(dtype)
    q, k, v = t(hq, 1.0), t(hkv, 1.0), t(hkv, 1.0)
    sink = torch.randint(0, n, (4,), generator=gen, device="cuda")
    k[sink] *= 3
    return q, k, v


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
class KernelsCuda(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
        print("seed", self.gen.initial_seed())

    def same_headers(self, lib, rows, ref):
        """Every row decodes (mf_row_decode: structure + checksum) with the header the
        reference wrote for the same block."""
        for r, rr in zip(rows.host(), ref.host()):
            va, vb = mapflow._RowView(), mapflow._RowView()
            for row, view in ((r, va), (rr, vb)):
                buf = np.zeros(len(row) + 16, np.uint8)
                a = buf[(-buf.ctypes.data) % 16:][:len(row)]
                a[:] = row
                why = C.c_char_p()
                self.assertEqual(lib.mf_row_decode(a.ctypes.data, len(row), 0, C.byref(view),
                                                   C.byref(why)), 0, why.value)
            for f in ("block_index", "block_size", "n_heads", "layer", "codec"):
                self.assertEqual(getattr(va, f), getattr(vb, f), f)
            self.assertEqual((va.hash.lo, va.hash.hi), (vb.hash.lo, vb.hash.hi))

    def test_dense(self):
        if torch.cuda.get_device_capability() != (9, 0):
            self.skipTest("the attention core is sm_90a")
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = rand_qkv(self.gen, 640, 8, 2, 128, dtype)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                o, lse = K.attention_dense_cuda(q, k, v)
            s.synchronize()
            o64, lse64 = K.attention_dense_ref(host(q), host(k), host(v))
            self.assertLessEqual(rel(o.cpu(), o64), 2e-3, dtype)
            self.assertLessEqual(float(np.abs(lse.cpu().numpy() - lse64).max()), 1e-3, dtype)

    def test_extract_and_apply(self):
        b, nb, hs, d = 64, 12, 8, 128
        n = nb * b
        lib = K.library("ref")
        for dtype, codec in ((torch.float16, "fp8"), (torch.bfloat16, "u8log"),
                             (torch.float16, "mask")):
            ok, why = K.cuda_supported(b, d, dtype, n)
            self.assertTrue(ok, why)
            q, k, _ = rand_qkv(self.gen, n, hs, hs // 2, d, dtype)
            tokens = np.random.default_rng().integers(1, 1 << 30, n)
            ex = dict(block_size=b, top_p=0.9, tokens=tokens, model="src", ns="kpy",
                      codec=codec, layer=3, i0=1)
            rows = K.extract_cuda(q, k, want_mass=True, **ex)
            ref = K.extract_ref(host(q), host(k), **ex)
            self.assertEqual(len(rows), nb - 1)
            self.same_headers(lib, rows, ref)
            # masses vs float64: mean over the block's query rows of the probability in
            # each key block, from the dense reference's LSE
            _, lse64 = K.attention_dense_ref(host(q), host(k), host(k))
            qf = q.double().cpu().numpy()
            kf = np.repeat(k.double().cpu().numpy(), 2, axis=1)
            s = np.einsum("rhd,khd->hrk", qf, kf) / np.sqrt(d)
            s[:, np.triu(np.ones((n, n), bool), 1)] = -np.inf
            p = np.exp(s - lse64[..., None])
            mass = p.reshape(hs, nb, b, nb, b).sum((2, 4)) / b
            got = rows.mass.cpu().numpy()  # [Hs, nb − 1, nb]
            self.assertLessEqual(float(np.abs(got - mass[:, 1:, :]).max()), 1e-3)

            # target: 16 heads over 4 KV heads, every mode, W mixing the source heads
            ht = 16
            qt, kt, vt = rand_qkv(self.gen, n, ht, 4, d, dtype)
            rng = np.random.default_rng()
            w = rng.random((ht, hs)).astype(np.float32)
            w /= w.sum(1, keepdims=True)
            mode = rng.integers(0, 3, ht).astype(np.uint8)
            mode[:3] = [K.COMPUTE, K.PROB, K.MASK]
            if codec == "mask":
                mode[mode == K.PROB] = K.MASK
            tp = rng.uniform(0.6, 1.0, ht).astype(np.float32)
            o_ref, st = K.apply_ref(rows, w, mode, host(qt), host(kt), host(vt),
                                    block_size=b, top_p=tp, exact_last=1)
            self.assertGreater(st["prob_tiles"] + st["mask_blocks"], 0)
            bad = torch.zeros(1, dtype=torch.int32, device="cuda")
            for impl in (K.IMPL_CORE, K.IMPL_V2):
                for rr in (rows, [None] + rows.ptrs()):
                    o = K.apply_cuda(rr, w, mode, qt, kt, vt, block_size=b, top_p=tp,
                                     exact_last=1, impl=impl, bad_rows=bad)
                    torch.cuda.synchronize()
                    self.assertLessEqual(rel(o.cpu(), o_ref), 2e-3, (dtype, codec, impl))
                # O in the model's dtype (o_dtype): the same call's fp32 O rounded to
                # nearest, element for element (a new tensor, and into out=)
                ot = K.apply_cuda(rows, w, mode, qt, kt, vt, block_size=b, top_p=tp,
                                  exact_last=1, impl=impl, o_dtype=dtype)
                out = torch.full_like(ot, float("nan"))
                ot2 = K.apply_cuda(rows, w, mode, qt, kt, vt, block_size=b, top_p=tp,
                                   exact_last=1, impl=impl, o_dtype=dtype, out=out)
                torch.cuda.synchronize()
                self.assertEqual(ot.dtype, dtype)
                self.assertIs(ot2, out)
                want = o.to(dtype)  # o: this impl's fp32 O (rows as addresses, same O)
                for got in (ot, ot2):
                    self.assertEqual(int((got.view(torch.int16) !=
                                          want.view(torch.int16)).sum()), 0, (dtype, impl))
            other = torch.bfloat16 if dtype == torch.float16 else torch.float16
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K.apply_cuda(rows, w, mode, qt, kt, vt, block_size=b, o_dtype=other)
            self.assertIn("o_dtype", str(cm.exception))
            with self.assertRaises(mapflow.InvalidArgument) as cm:  # out must have o_dtype
                K.apply_cuda(rows, w, mode, qt, kt, vt, block_size=b, o_dtype=dtype,
                             out=torch.empty(n, ht, d, device="cuda"))
            self.assertIn("out must be", str(cm.exception))
            self.assertEqual(int(bad.item()), 0)
            o = K.apply_cuda(None, w, mode, qt, kt, vt, block_size=b)
            o64, _ = K.attention_dense_ref(host(qt), host(kt), host(vt))
            self.assertLessEqual(rel(o.cpu(), o64), 2e-3)

    def test_extract_sampled(self):
        b, nb, hs, d = 64, 12, 8, 128
        n = nb * b
        lib = K.library("ref")
        for dtype, codec, st, off in ((torch.float16, "mask", 8, 3),
                                      (torch.bfloat16, "fp8", 4, 0),
                                      (torch.float16, "mask", 16, 15)):
            q, k, _ = rand_qkv(self.gen, n, hs, hs // 2, d, dtype)
            tokens = np.random.default_rng().integers(1, 1 << 30, n)
            _, lse64 = K.attention_dense_ref(host(q), host(k), host(k))
            lse = torch.from_numpy(lse64.astype(np.float32)).cuda()
            ex = dict(block_size=b, top_p=0.9, tokens=tokens, model="src", ns="kpy",
                      codec=codec, layer=1, sample_stride=st, sample_offset=off)
            rows = K.extract_cuda(q, k, lse=lse, want_mass=True, **ex)
            ref = K.extract_ref(host(q), host(k), lse=lse.cpu().numpy(), **ex)
            self.assertEqual(len(rows), nb)
            self.same_headers(lib, rows, ref)
            qf = q.double().cpu().numpy()
            kf = np.repeat(k.double().cpu().numpy(), 2, axis=1)
            s = np.einsum("rhd,khd->hrk", qf, kf) / np.sqrt(d)
            s[:, np.triu(np.ones((n, n), bool), 1)] = -np.inf
            p = np.exp(s - lse64[..., None]).reshape(hs, nb, b, nb, b)
            sampled = p[:, :, off::st].sum((2, 4)) / (b // st)
            exact = p.sum((2, 4)) / b
            got = rows.mass.cpu().numpy()
            self.assertLessEqual(float(np.abs(got - sampled).max()), 1e-3, (st, off))
            self.assertGreater(float(np.abs(got - exact).max()), 1e-3, (st, off))
        with self.assertRaises(mapflow.InvalidArgument) as cm:
            K.extract_cuda(q, k, **dict(ex, sample_stride=128))
        self.assertIn("sample_stride", str(cm.exception))

    def test_export(self):
        """export_cuda (the fused forward + extract's selection): O and LSE against float64,
        masses within 1e-4 of extract_cuda's on the same inputs, and rows that decode
        (structure + checksum) with the header extract_ref writes (kept sets against the
        reference: gpu_check --export)."""
        if torch.cuda.get_device_capability() != (9, 0):
            self.skipTest("the fused forward is sm_90a")
        b, nb, hs = 64, 10, 8
        n = nb * b + 17  # a partial last block
        lib = K.library("ref")
        for dtype, codec, d in ((torch.bfloat16, "mask", 128), (torch.float16, "fp8", 64)):
            q, k, v = rand_qkv(self.gen, n, hs, hs // 2, d, dtype)
            tokens = np.random.default_rng().integers(1, 1 << 30, n)
            ex = dict(top_p=0.9, tokens=tokens, model="src", ns="kpy", codec=codec, layer=2)
            scratch = torch.empty(int(lib_scratch(n)), dtype=torch.uint8, device="cuda")
            o, lse, rows = K.export_cuda(q, k, v, want_mass=True, scratch=scratch, **ex)
            o64, lse64 = K.attention_dense_ref(host(q), host(k), host(v))
            self.assertLessEqual(rel(o.cpu(), o64), 2e-3, dtype)
            self.assertLessEqual(float(np.abs(lse.cpu().numpy() - lse64).max()), 1e-3)
            old = K.extract_cuda(q, k, block_size=b, want_mass=True, **ex)
            full = n // b
            self.assertEqual(tuple(rows.mass.shape), (hs, full, full))
            self.assertLessEqual(float((rows.mass - old.mass[:, :full, :full]).abs().max()),
                                 1e-4)
            ref = K.extract_ref(host(q), host(k), block_size=b, **ex)
            self.assertEqual(len(rows), len(ref))
            self.same_headers(lib, rows, ref)
            # O in the model's dtype: the fp32 O rounded to nearest, element for element,
            # and the same rows
            ot, _, rows_t = K.export_cuda(q, k, v, scratch=scratch, o_dtype=dtype, **ex)
            self.assertEqual(ot.dtype, dtype)
            self.assertTrue(torch.equal(ot, o.to(dtype)), dtype)
            self.assertIsNone(rows_t.mass)
            self.assertEqual(rows_t.sizes, rows.sizes)
            # the rows' launches on a second stream: the same rows once waited for
            side = torch.cuda.Stream()
            _, _, pend = K.export_cuda(q, k, v, scratch=scratch, o_dtype=dtype,
                                       rows_stream=side, **ex)
            rows_s = pend.wait(torch.cuda.Stream())
            self.assertEqual(rows_s.sizes, rows.sizes)
            for a, b_ in zip(rows_s.host(), rows.host()):
                self.assertTrue(np.array_equal(a, b_))
        with self.assertRaises(mapflow.InvalidArgument) as cm:
            K.export_cuda(q, k, v, scratch=torch.empty(8, dtype=torch.uint8, device="cuda"),
                          **ex)
        self.assertIn("scratch must be", str(cm.exception))
        with self.assertRaises(mapflow.InvalidArgument) as cm:
            K.export_cuda(q, k, v, o_dtype=torch.bfloat16, **ex)  # q is float16 here
        self.assertIn("o_dtype", str(cm.exception))

    def test_rows_copy(self):
        """rows_copy_cuda on a side stream: random rows (sizes, gaps, some not 16-aligned)
        land where rows_copy_ref puts them on the host, nothing else in the destination
        changes; a bad table raises InvalidArgument."""
        g = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        n = int(g.integers(50, 300))
        sizes = [int(z) for z in g.integers(0, 70000, n)]
        so, do, at = [], [0] * n, 0
        for z in sizes:
            at += int(g.choice([0, 16, 3]))
            so.append(at)
            at += z
        src = torch.randint(0, 256, (at + 1,), dtype=torch.uint8, device="cuda")
        at = 0
        for x in g.permutation(n):
            at += int(g.choice([0, 16, 5]))
            do[x] = at
            at += sizes[x]
        dst = torch.full((at + 64,), 0x5a, dtype=torch.uint8, device="cuda")
        want = dst.cpu().numpy()
        hsrc = src.cpu().numpy()
        K.rows_copy_ref([want.ctypes.data + o for o in do], [hsrc.ctypes.data + o for o in so],
                        sizes)
        side = torch.cuda.Stream()
        K.rows_copy_cuda([dst.data_ptr() + o for o in do], [src.data_ptr() + o for o in so],
                         sizes, stream=side)
        side.synchronize()
        self.assertTrue(np.array_equal(dst.cpu().numpy(), want))
        with self.assertRaises(mapflow.InvalidArgument) as cm:
            K.rows_copy_cuda([dst.data_ptr()], [dst.data_ptr() + 8], [64], stream=side)
        self.assertIn("overlap", str(cm.exception))

    def test_extract_rows_at_addresses(self):
        """rows=: the rows written at the caller's addresses (what a put region's rows
        are: 64-aligned, laid out by capacity), byte-identical to the buffer path's; the
        bytes after each row (the slack) untouched; caps from row_bounds."""
        b, nb, hs, d = 64, 10, 8, 128
        n = nb * b
        q, k, _ = rand_qkv(self.gen, n, hs, hs // 2, d, torch.float16)
        tokens = np.random.default_rng().integers(1, 1 << 30, n)
        ex = dict(block_size=b, top_p=0.9, tokens=tokens, model="src", ns="kpy",
                  codec="mask", layer=2)
        caps = K.row_bounds(hs, 0, nb, block_size=b, model="src", codec="mask")
        self.assertEqual(len(caps), nb)
        want = K.extract_cuda(q, k, caps=caps, **ex)
        offs, at = [], 0
        for c in reversed(caps):  # not the buffer path's order or alignment
            offs.insert(0, at)
            at += (c + 63) // 64 * 64
        junk = torch.randint(0, 256, (at,), dtype=torch.uint8, device="cuda",
                             generator=self.gen)
        dst = junk.clone()
        got = K.extract_cuda(q, k, caps=caps, rows=[dst.data_ptr() + o for o in offs], **ex)
        self.assertIsNone(got.buf)
        self.assertEqual(got.sizes, want.sizes)
        self.assertEqual(got.ptrs(), [dst.data_ptr() + o for o in offs])
        for r, o, c, s in zip(want.host(), offs, caps, got.sizes):
            self.assertLessEqual(s, c)
            self.assertTrue(np.array_equal(dst[o:o + s].cpu().numpy(), r))
            self.assertTrue(torch.equal(dst[o + s:o + c], junk[o + s:o + c]))
        for rows, msg in (([dst.data_ptr()] * (nb - 1), "addresses for"),
                          ([dst.data_ptr() + 8] * nb, "16-byte aligned")):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K.extract_cuda(q, k, caps=caps, rows=rows, **ex)
            self.assertIn(msg, str(cm.exception))
        with self.assertRaises(mapflow.InvalidArgument):
            got.host()

    def test_bad_arguments(self):
        q, k, v = rand_qkv(self.gen, 256, 4, 2, 64, torch.float16)
        w, mode = np.eye(4, dtype=np.float32), np.zeros(4, np.uint8)
        bad = [
            ("a CUDA tensor wanted", lambda: K.apply_cuda(None, w, mode, q.cpu(), k, v,
                                                          block_size=64)),
            ("float16 or bfloat16", lambda: K.attention_dense_cuda(q.float(), k.float(),
                                                                   v.float())),
            ("not contiguous", lambda: K.attention_dense_cuda(q.transpose(0, 1), k, v)),
            ("one dtype", lambda: K.attention_dense_cuda(q, k.bfloat16(), v)),
            ("k has shape", lambda: K.attention_dense_cuda(q, k[:128].contiguous(), v)),
            ("16-byte aligned device", lambda: K.apply_cuda([12345], w, mode, q, k, v,
                                                            block_size=64)),
            ("out must be", lambda: K.apply_cuda(None, w, mode, q, k, v, block_size=64,
                                                 out=torch.empty(3, device="cuda"))),
            ("lse must be", lambda: K.extract_cuda(q, k, block_size=64, top_p=0.9,
                                                   tokens=np.arange(256), model="m", ns="n",
                                                   lse=torch.empty(4, 255, device="cuda"))),
        ]
        for want, call in bad:
            with self.assertRaises(mapflow.InvalidArgument, msg=want) as cm:
                call()
            self.assertIn(want, str(cm.exception))
        with self.assertRaises(mapflow.MapflowError) as cm:  # B 16: not a CUDA size
            K.apply_cuda(None, w, mode, q, k, v, block_size=16)
        self.assertEqual(cm.exception.status, "UNIMPLEMENTED")


if __name__ == "__main__":
    unittest.main()
