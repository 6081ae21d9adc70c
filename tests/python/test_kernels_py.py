"""mapflow.kernels on the C reference library (libmfkernels_ref.so), no GPU, NumPy only:

- extract_ref / apply_ref / attention_dense_ref on random inputs give what a direct
  ctypes call of mf_extract_ref / mf_apply_ref / mf_attention_dense_ref gives (bytes of
  every row, O, the work counters), for several codecs, GQA, and partial block ranges;
- apply_ref with no rows is dense causal attention (checked against NumPy in float64);
- rows_copy_ref (the spec of the put path's one-launch row copy) copies exactly its rows;
- a row that does not fit raises RowOverflow (.block, .needed); bad shapes, dtypes,
  layouts, codecs, modes and block sizes raise InvalidArgument naming the argument;
- apply_cuda's row addresses (host side): a uint64 NumPy array is passed without a copy
  and equals what a list of ints gives; bad arrays are refused naming the entry;
- mf_apply_cuda refuses an o_dtype other than F32 and the target's dtype on the host
  (no GPU needed), and so does apply_cuda(o_dtype=);
- the mirror check refuses a struct that differs from mf_kernels_abi_layout(), and the
  library search honours MAPFLOW_KERNELS_LIB (only there).
The CUDA half is tests/gpu/test_kernels_py.py. Env: MF_BUILD (build dir), MAPFLOW_LIB.
"""
import ctypes as C
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

import numpy as np  # noqa: E402

os.environ.setdefault("MAPFLOW_KERNELS_LIB", os.path.join(mftest.BUILD, "lib"))
mapflow = mftest.import_mapflow()
import mapflow.kernels as K  # noqa: E402

REF = os.path.join(os.environ["MAPFLOW_KERNELS_LIB"], "libmfkernels_ref.so")


def rand_qkv(rng, n, hq, hkv, d, dtype=np.float32):
    def t(h):
        return (rng.standard_normal((n, h, d)) * rng.uniform(0.5, 2.0)).astype(dtype)
    return t(hq), t(hkv), t(hkv)


def rand_map(rng, ht, hs):
    w = rng.random((ht, hs)).astype(np.float32)
    w[rng.random((ht, hs)) < 0.4] = 0
    w[np.arange(ht), rng.integers(0, hs, ht)] += 0.1  # no row of zeros
    w /= w.sum(1, keepdims=True)
    mode = rng.integers(0, 3, ht).astype(np.uint8)
    mode[:3] = [K.COMPUTE, K.PROB, K.MASK][:ht]  # every mode, whatever the draw
    return w, mode, rng.uniform(0.5, 1.0, ht).astype(np.float32)


class Direct:
    """The C functions called by hand (the module's structs, whose layout the library
    vouches for, filled here without the module's code)."""

    def __init__(self):
        self.lib = C.CDLL(REF)
        self.lib.mf_extract_ref.restype = C.c_int
        self.lib.mf_apply_ref.restype = C.c_int
        self.lib.mf_row_decode.restype = C.c_int
        self.lib.mf_attention_dense_ref.restype = C.c_int

    @staticmethod
    def qkv(q, k, v, dt):
        return K.Qkv(q.ctypes.data, k.ctypes.data, v.ctypes.data if v is not None else None,
                     dt, q.shape[0], q.shape[1], k.shape[1], q.shape[2])

    def extract(self, q, k, b, top_p, codec, tokens, model, ns, layer, i0, i1, caps, dt,
                sample=(0, 0, 0), lse=None):
        nr = i1 - i0
        bufs = [np.zeros(c + 16, np.uint8) for c in caps]
        al = [x[(-x.ctypes.data) % 16:][:c] for x, c in zip(bufs, caps)]
        ptrs = (C.c_void_p * nr)(*[x.ctypes.data for x in al])
        capa = (C.c_size_t * nr)(*caps)
        sizes = (C.c_size_t * nr)()
        failed = C.c_uint32()
        tok = np.asarray(tokens, np.uint32)
        a = K.ExtractArgs(self.qkv(q, k, None, dt), None if lse is None else lse.ctypes.data,
                          b, top_p, codec, i0, i1, model, ns, layer, tok.ctypes.data, *sample)
        why = C.c_char_p()
        st = self.lib.mf_extract_ref(C.byref(a), ptrs, capa, sizes, C.byref(failed),
                                     C.byref(why))
        assert st == 0, (st, why.value)
        return [bytes(x[:s]) for x, s in zip(al, sizes)]

    def apply(self, rows, w, mode, top_p, q, k, v, b, exact_last, dt):
        n, ht, d = q.shape
        views = (mapflow._RowView * max(1, len(rows)))()
        vp = (C.c_void_p * max(1, len(rows)))()
        held = []
        for i, r in enumerate(rows):
            if r is None:
                continue
            raw = np.zeros(len(r) + 16, np.uint8)
            a = raw[(-raw.ctypes.data) % 16:][:len(r)]
            a[:] = np.frombuffer(r, np.uint8)
            held.append(raw)
            assert self.lib.mf_row_decode(C.c_void_p(a.ctypes.data), C.c_size_t(len(r)), 0,
                                          C.byref(views[i]), None) == 0
            vp[i] = C.addressof(views[i])
        lm = K.LayerMap(ht, w.shape[1], w.ctypes.data, mode.ctypes.data, top_p.ctypes.data)
        o = np.zeros((n, ht, d), np.float32)
        a = K.ApplyArgs(C.cast(vp, C.c_void_p), len(rows), C.pointer(lm),
                        self.qkv(q, k, v, dt), b, None, 0, exact_last, 0, 0, o.ctypes.data)
        st = K.ApplyStats()
        assert self.lib.mf_apply_ref(C.byref(a), C.byref(st), None) == 0
        return o, {f[0]: getattr(st, f[0]) for f in K.ApplyStats._fields_}


class KernelsRef(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.direct = Direct()

    def test_extract_and_apply_equal_direct_calls(self):
        rng = np.random.default_rng()
        for case in range(6):
            hs, hkv = [(4, 2), (8, 8), (6, 3)][case % 3]
            b = [8, 16, 32][case % 3]
            nb = int(rng.integers(3, 7))
            n = nb * b + int(rng.integers(0, b))  # a partial tail block too
            d = int(rng.choice([8, 16, 32]))
            codec = list(K.CODECS)[case % len(K.CODECS)]
            dt, npdt = (K.F16, np.float16) if case % 2 else (K.F32, np.float32)
            q, k, v = rand_qkv(rng, n, hs, hs, d, npdt)
            tokens = rng.integers(1, 1 << 31, n)
            top_p = float(rng.uniform(0.3, 1.0))
            i0 = int(rng.integers(0, 2))
            i1 = nb - int(rng.integers(0, 2))
            rows = K.extract_ref(q, k, block_size=b, top_p=top_p, tokens=tokens, model="src",
                                 ns="ns-kern", codec=codec, layer=case, i0=i0, i1=i1)
            caps = [K.library("ref").mf_extract_row_bound(K.CODECS[codec], b, hs, i,
                                                          len(b"src")) for i in range(i0, i1)]
            want = self.direct.extract(q, k, b, top_p, K.CODECS[codec], tokens, b"src",
                                       b"ns-kern", case, i0, i1, caps, dt)
            got = [bytes(r) for r in rows.host()]
            self.assertEqual(got, want, "case %d (%s, B %d)" % (case, codec, b))
            self.assertEqual(len(rows), i1 - i0)
            self.assertTrue(all(p % 16 == 0 for p in rows.ptrs()))

            # target: other heads, GQA, reading those rows
            ht = hkv * int(rng.integers(1, 3))
            qt, kt, vt = rand_qkv(rng, n, ht, hkv, d, npdt)
            w, mode, tp = rand_map(rng, ht, hs)
            if codec == "mask":  # mask rows carry no tiles: no prob heads
                mode[mode == K.PROB] = K.MASK
            el = int(rng.integers(0, 2))
            o, st = K.apply_ref(rows, w, mode, qt, kt, vt, block_size=b, top_p=tp,
                                exact_last=el)
            o2, st2 = self.direct.apply([None] * i0 + want, w, mode, tp, qt, kt, vt, b, el,
                                        dt)
            np.testing.assert_array_equal(o, o2)
            self.assertEqual(st, st2)
            self.assertGreater(st["prob_tiles"] + st["mask_blocks"], 0, st)
            self.assertTrue(np.isfinite(o).all() and np.abs(o).max() > 0)
            # rows as a list of bytes (unaligned copies are realigned) give the same O
            o3, _ = K.apply_ref([None] * i0 + want, w, mode, qt, kt, vt, block_size=b,
                                top_p=tp, exact_last=el)
            np.testing.assert_array_equal(o, o3)

    def test_no_rows_is_dense_attention(self):
        rng = np.random.default_rng()
        n, hq, hkv, d, b = 75, 6, 2, 16, 16
        q, k, v = rand_qkv(rng, n, hq, hkv, d)
        w, mode, tp = rand_map(rng, hq, 3)
        o, st = K.apply_ref(None, w, mode, q, k, v, block_size=b, top_p=tp)
        od, lse = K.attention_dense_ref(q, k, v)
        # NumPy float64, causal, GQA
        kk = np.repeat(k.astype(np.float64), hq // hkv, axis=1)
        vv = np.repeat(v.astype(np.float64), hq // hkv, axis=1)
        s = np.einsum("rhd,khd->hrk", q.astype(np.float64), kk) / np.sqrt(d)
        s[:, np.triu(np.ones((n, n), bool), 1)] = -np.inf
        m = s.max(-1, keepdims=True)
        lse_np = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
        o_np = np.einsum("hrk,khd->rhd", np.exp(s - lse_np[..., None]), vv)
        np.testing.assert_allclose(od, o_np, atol=1e-10)
        np.testing.assert_allclose(lse, lse_np, atol=1e-10)
        np.testing.assert_allclose(o, o_np, atol=1e-4)
        self.assertEqual(st["prob_tiles"] + st["mask_blocks"], 0)

    def test_extract_sample_equals_direct_call(self):
        """sample_stride / sample_offset reach mf_extract_ref as MF_EXTRACT_SAMPLE (bytes of a
        direct call with the fields set), with the LSE given and computed; stride 1 sets
        no field; the sample changes the rows (else nothing was passed)."""
        rng = np.random.default_rng()
        b, nb, h, d = 16, 6, 4, 16
        n = nb * b
        q, k, _ = rand_qkv(rng, n, h, h, d)
        tok = rng.integers(1, 1 << 31, n)
        lse = rng.normal(3.0, 0.5, (h, n)).astype(np.float32)
        caps = [K.library("ref").mf_extract_row_bound(K.CODECS["u8log"], b, h, i, 3)
                for i in range(nb)]
        for st in (2, 4, 16):
            off = int(rng.integers(0, st))
            for given in (None, lse):
                ex = dict(block_size=b, top_p=0.8, tokens=tok, model="src", ns="n",
                          codec="u8log", lse=given)
                got = [bytes(r) for r in K.extract_ref(q, k, sample_stride=st,
                                                       sample_offset=off, **ex).host()]
                want = self.direct.extract(q, k, b, 0.8, K.CODECS["u8log"], tok, b"src", b"n",
                                           0, 0, nb, caps, K.F32, (K.EXTRACT_SAMPLE, st, off),
                                           given)
                self.assertEqual(got, want, (st, off))
                full = [bytes(r) for r in K.extract_ref(q, k, **ex).host()]
                self.assertNotEqual(got, full, (st, off))
        one = [bytes(r) for r in K.extract_ref(q, k, block_size=b, top_p=0.8, tokens=tok,
                                               model="src", ns="n", codec="u8log",
                                               sample_stride=1).host()]
        self.assertEqual(one, self.direct.extract(q, k, b, 0.8, K.CODECS["u8log"], tok,
                                                  b"src", b"n", 0, 0, nb, caps, K.F32))

    def test_row_overflow(self):
        rng = np.random.default_rng()
        b, nb, h, d = 16, 4, 4, 16
        q, k, _ = rand_qkv(rng, nb * b, h, h, d)
        with self.assertRaises(K.RowOverflow) as cm:
            K.extract_ref(q, k, block_size=b, top_p=1.0, tokens=rng.integers(0, 9, nb * b),
                          model="m", ns="n", codec="fp16", caps=[4096, 64, 4096, 4096])
        self.assertEqual(cm.exception.block, 1)
        self.assertGreater(cm.exception.needed, 64)
        self.assertIsInstance(cm.exception, mapflow.ResourceExhausted)

    def test_row_bounds_hold_every_row(self):
        """row_bounds (what a put region is reserved by): one per block, growing with the
        block, and at top_p = 1 (every block kept, the largest rows) never below a row."""
        rng = np.random.default_rng()
        b, nb, h, d = 16, 6, 4, 16
        q, k, _ = rand_qkv(rng, nb * b, h, h, d)
        for codec in ("fp16", "mask"):
            caps = K.row_bounds(h, 1, nb, block_size=b, model="m", codec=codec)
            self.assertEqual(len(caps), nb - 1)
            self.assertEqual(caps, sorted(caps))
            rows = K.extract_ref(q, k, block_size=b, top_p=1.0, tokens=rng.integers(0, 9, nb * b),
                                 model="m", ns="n", codec=codec, i0=1, caps=caps)
            self.assertTrue(all(80 <= s <= c for s, c in zip(rows.sizes, caps)), codec)
        with self.assertRaises(mapflow.InvalidArgument):
            K.row_bounds(h, 2, 2, block_size=b, model="m")

    def test_bad_arguments(self):
        rng = np.random.default_rng()
        n, h, d, b = 64, 4, 16, 16
        q, k, v = rand_qkv(rng, n, h, h, d)
        tok = rng.integers(0, 9, n)
        w, mode, tp = rand_map(rng, h, h)
        k3, v3 = np.ascontiguousarray(k[:, :3]), np.ascontiguousarray(v[:, :3])
        ex = dict(block_size=b, top_p=0.9, tokens=tok, model="m", ns="n")
        bad = [
            ("k has shape", lambda: K.extract_ref(q, k[:-1], **ex)),
            ("must be 3-D", lambda: K.extract_ref(q[0], k, **ex)),
            ("share one dtype", lambda: K.extract_ref(q, k.astype(np.float16), **ex)),
            ("not C-contiguous", lambda: K.extract_ref(q[:, :, ::2], k[:, :, ::2], **ex)),
            ("dtype float64", lambda: K.extract_ref(q.astype(np.float64),
                                                    k.astype(np.float64), **ex)),
            ("power of two", lambda: K.extract_ref(q, k, **dict(ex, block_size=24))),
            ("top_p", lambda: K.extract_ref(q, k, **dict(ex, top_p=0.0))),
            ("tokens has shape", lambda: K.extract_ref(q, k, **dict(ex, tokens=tok[:-1]))),
            ("codec", lambda: K.extract_ref(q, k, codec="fp4", **ex)),
            ("model must be", lambda: K.extract_ref(q, k, **dict(ex, model="x" * 300))),
            ("no query blocks", lambda: K.extract_ref(q, k, i0=2, i1=2, **ex)),
            ("i1 = 9", lambda: K.extract_ref(q, k, i1=9, **ex)),
            ("caps has 3 entries", lambda: K.extract_ref(q, k, caps=[4096] * 3, **ex)),
            ("lse has shape", lambda: K.extract_ref(q, k, lse=np.zeros((h, n - 1)), **ex)),
            ("must be a power of two", lambda: K.extract_ref(q, k, sample_stride=3, **ex)),
            ("sample_stride = 32", lambda: K.extract_ref(q, k, sample_stride=32, **ex)),
            ("sample_stride = 0", lambda: K.extract_ref(q, k, sample_stride=0, **ex)),
            ("sample_offset = 4", lambda: K.extract_ref(q, k, sample_stride=4,
                                                        sample_offset=4, **ex)),
            ("multiple of Hkv", lambda: K.apply_ref(None, w, mode, q, k3, v3,
                                                    block_size=b)),
            ("w has shape", lambda: K.apply_ref(None, w[:2], mode, q, k, v, block_size=b)),
            ("mode has shape", lambda: K.apply_ref(None, w, mode[:2], q, k, v, block_size=b)),
            ("mode holds 7", lambda: K.apply_ref(None, w, [7] * h, q, k, v, block_size=b)),
            ("exact has shape", lambda: K.apply_ref(None, w, mode, q, k, v, block_size=b,
                                                    exact=[1, 0])),
            ("5 rows for 4", lambda: K.apply_ref([None] * 5, w, mode, q, k, v, block_size=b)),
            ("out must be", lambda: K.apply_ref(None, w, mode, q, k, v, block_size=b,
                                                out=np.zeros((n, h, d), np.float64))),
            ("NumPy array or a torch", lambda: K.attention_dense_ref(q.tolist(), k, v)),
        ]
        for want, call in bad:
            with self.assertRaises(mapflow.InvalidArgument, msg=want) as cm:
                call()
            self.assertIn(want, str(cm.exception))
        # a row the decoder refuses: the C status and message come through
        rows = K.extract_ref(q, k, **ex).host()
        broken = bytearray(rows[1])
        broken[len(broken) // 2] ^= 0xff
        with self.assertRaises(mapflow.MapflowError) as cm:
            K.apply_ref([rows[0], bytes(broken)], w, mode, q, k, v, block_size=b)
        self.assertIn("mf_row_decode (row 1)", str(cm.exception))

    def test_rows_copy_ref(self):
        """rows_copy_ref copies each row's bytes to its destination and nothing else (random
        sizes, gaps and a shuffled order); bad tables raise InvalidArgument, nothing
        copied."""
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        n = int(rng.integers(20, 80))
        sizes = [int(z) for z in rng.integers(0, 3000, n)]
        sizes[0] = 0
        src = rng.integers(0, 256, sum(sizes) + 16 * n, dtype=np.uint8)
        dst = np.full(sum(sizes) + 32 * n, 0x5a, dtype=np.uint8)
        want = dst.copy()
        so, do, at = [], [0] * n, 0
        for z in sizes:
            at += int(rng.integers(0, 16))
            so.append(at)
            at += z
        at = 0
        for x in rng.permutation(n):
            at += int(rng.integers(0, 32))
            do[x] = at
            at += sizes[x]
        for x in range(n):
            want[do[x]:do[x] + sizes[x]] = src[so[x]:so[x] + sizes[x]]
        sb, db = src.ctypes.data, dst.ctypes.data
        K.rows_copy_ref([db + o for o in do], [sb + o for o in so], sizes)
        self.assertTrue(np.array_equal(dst, want))
        dst[:] = 0x5a
        for bad, msg in (((([db], [sb], [1, 2])), "1 destinations, 1 sources, 2 sizes"),
                         (([db], [sb], [-1]), "[0, 2**64)"),
                         (([db], [sb], [1 << 32]), "MF_ROW_MAX_BYTES"),
                         (([db], [0], [16]), "no source or destination"),
                         (([db + 8], [db], [16]), "overlap")):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K.rows_copy_ref(*bad)
            self.assertIn(msg, str(cm.exception))
        self.assertTrue((dst == 0x5a).all())
        K.rows_copy_ref([], [], [])  # nothing to copy is fine

    def test_cuda_calls_check_before_the_device(self):
        """Without a GPU: the CUDA wrappers refuse host tensors before any CUDA call (the
        library loads without a device; skipped where it was not built or no torch)."""
        try:
            import torch
            K.library("cuda")
        except ImportError as e:
            self.skipTest(str(e))
        q = torch.randn(128, 4, 64).half()
        w, mode = np.eye(4, dtype=np.float32), np.zeros(4, np.uint8)
        for call in (lambda: K.apply_cuda(None, w, mode, q, q, q, block_size=64),
                     lambda: K.attention_dense_cuda(q, q, q),
                     lambda: K.extract_cuda(q, q, block_size=64, top_p=0.9, model="m",
                                            ns="n", tokens=np.arange(128))):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                call()
            self.assertIn("q is on cpu; a CUDA tensor wanted", str(cm.exception))
        with self.assertRaises(mapflow.InvalidArgument):
            K.apply_cuda(None, w, mode, np.zeros((128, 4, 64), np.float16), q, q,
                         block_size=64)

    def test_apply_cuda_o_dtype_refused(self):
        """mf_apply_cuda's o_dtype check is on the host, before any CUDA call (no GPU here):
        an o_dtype other than F32 and the target's dtype (the other 16-bit type, an
        unknown value) is MF_INVALID_ARGUMENT with the exporter's message, while F32 and
        tgt.dtype pass it (to the layer map's check, which comes next and refuses the
        negative W given here: nothing reaches a device, even where there is one); and
        apply_cuda(o_dtype=) refuses the same before it looks at the tensors' device
        (with torch only). Skipped where the CUDA library was not built."""
        try:
            L = K.library("cuda")
        except ImportError as e:
            self.skipTest(str(e))
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        ht, dt = int(rng.integers(1, 9)), [K.F16, K.BF16][int(rng.integers(0, 2))]
        other = K.BF16 if dt == K.F16 else K.F16
        w = np.full(ht, -1.0, np.float32)  # refused by the map check, after o_dtype's
        mode = np.zeros(ht, np.uint8)
        lm = K.LayerMap(ht, 1, w.ctypes.data, mode.ctypes.data, None)
        fake = 1 << 20  # device addresses never dereferenced on the host, 16-byte aligned
        qkv = K.Qkv(fake, fake, fake, dt, 64 * int(rng.integers(1, 5)), ht, ht, 64)
        for odt, refused in ((other, True), (7, True), (-1, True), (K.F32, False),
                             (dt, False)):
            a = K.ApplyCudaArgs(None, 0, C.pointer(lm), qkv, 64, None, 0, 0, fake, None, odt)
            why = C.c_char_p()
            st = L.mf_apply_cuda_impl(C.byref(a), K.IMPL_CORE, None, C.byref(why))
            msg = (why.value or b"").decode()
            if refused:
                with self.assertRaises(mapflow.InvalidArgument) as cm:
                    K._check(st, "mf_apply_cuda", why)
                self.assertIn("o_dtype must be MF_DTYPE_F32 or the inputs' dtype",
                              str(cm.exception))
            else:
                self.assertEqual(st, K.INVALID_ARGUMENT)
                self.assertIn("W has a negative", msg)
        try:
            import torch
        except ImportError:
            return
        q = torch.randn(128, 4, 64).half()
        w4, m4 = np.eye(4, dtype=np.float32), np.zeros(4, np.uint8)
        for odt in (torch.bfloat16, torch.float64, torch.int8):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K.apply_cuda(None, w4, m4, q, q, q, block_size=64, o_dtype=odt)
            self.assertIn("o_dtype", str(cm.exception))
        # accepted dtypes get as far as the device check
        for odt in (None, torch.float32, torch.float16):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K.apply_cuda(None, w4, m4, q, q, q, block_size=64, o_dtype=odt)
            self.assertIn("q is on cpu", str(cm.exception))

    def test_apply_cuda_row_addresses(self):
        """apply_cuda's rows (its host-side step, no GPU): a uint64 NumPy array of
        addresses is passed as it is (no copy) and gives the array the per-row list
        gives; bad arrays are refused naming the first bad entry."""
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        nblk = 64
        ptrs = (rng.integers(1, 1 << 40, nblk, dtype=np.uint64) << np.uint64(4))
        at, n, keep = K._row_ptrs(ptrs[:50], nblk, None, None)
        self.assertEqual((at, n), (ptrs.ctypes.data, 50))  # the slice itself, no copy
        no_torch = types.SimpleNamespace(Tensor=type("Tensor", (), {}))  # ints only here
        l_at, l_n, l_keep = K._row_ptrs([int(x) for x in ptrs[:50]], nblk, None, no_torch)
        self.assertEqual(l_n, n)
        self.assertEqual(C.string_at(l_at, 8 * n), C.string_at(at, 8 * n))
        odd = ptrs[::2]  # strided: made contiguous, same addresses
        at, n, keep = K._row_ptrs(odd, nblk, None, None)
        self.assertEqual(np.frombuffer(C.string_at(at, 8 * n), np.uint64).tolist(),
                         odd.tolist())
        self.assertEqual(K._row_ptrs(np.zeros(0, np.uint64), nblk, None, None)[:2], (0, 0))
        i = int(rng.integers(0, nblk))
        zero, unaligned = ptrs.copy(), ptrs.copy()
        zero[i] = 0
        unaligned[i] += np.uint64(8)
        for bad, why in ((ptrs.astype(np.int64), "1-D uint64"),
                         (ptrs.reshape(8, 8), "1-D uint64"),
                         (np.concatenate([ptrs, ptrs[:1]]), "65 rows for 64 query blocks"),
                         (zero, "rows[%d] = 0 is not a 16-byte aligned" % i),
                         (unaligned, "rows[%d] = %d is not a 16-byte aligned"
                          % (i, int(unaligned[i])))):
            with self.assertRaises(mapflow.InvalidArgument) as cm:
                K._row_ptrs(bad, nblk, None, None)
            self.assertIn(why, str(cm.exception))

    def test_layout_check_and_search(self):
        lay = mapflow._lib_layout(K.library("ref").mf_kernels_abi_layout)
        self.assertEqual(mapflow._abi_mismatches(lay, K._MIRRORS), [])

        class Wrong(C.Structure):  # mf_qkv_t with dtype and n_tokens swapped
            _c_type_ = "mf_qkv_t"
            _fields_ = [(f, t) for f, t in K.Qkv._fields_[:3]] + [
                ("n_tokens", C.c_uint32), ("dtype", C.c_int)] + K.Qkv._fields_[5:]
        bad = mapflow._abi_mismatches(lay, [Wrong])
        self.assertEqual(len(bad), 1)
        self.assertIn("mf_qkv_t", bad[0])
        self.assertIn("dtype", bad[0])
        cands = K._kernel_candidates("cuda")
        self.assertEqual(cands, [os.path.join(os.environ["MAPFLOW_KERNELS_LIB"],
                                              "libmfkernels_cuda.so")])
        with self.assertRaises(ImportError) as cm:
            K.library("ref", "/nonexistent/libmfkernels_ref.so")
        self.assertIn("no such file", str(cm.exception))
        with self.assertRaises(ValueError):
            K.library("rocm")


if __name__ == "__main__":
    unittest.main()
