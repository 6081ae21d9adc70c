"""The Python binding (client/python/mapflow) against a real mapflowd.

Rows come from mapflow-synth (real encoded rows); the daemon runs on a unix socket in a
temp dir and must exit 0 on SIGTERM. Covers: put_batch / put, lookup, get_prefix in copy
and lease mode with memoryview and NumPy views byte-identical to the files, get / get by
keys / get_lease, release, delete, list paging, stats / health / config / evict / flush,
profiles, MapflowError codes, async calls on a CompletionQueue (each event exactly once),
a deadline while the daemon is stopped, and reconnection after a daemon restart.
Env: MF_BIN (build/bin), MF_BUILD (build dir, for libmapflow), MAPFLOW_LIB (overrides).
"""
import os
import random
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

mftest.preload_asan()
mapflow = mftest.import_mapflow()

try:
    import numpy as np
except ImportError:
    np = None

NS = "py-ns"
MODEL = "py-src"
B = 16



class BindingTest(mftest.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.make_tmp("mfpy-")
        rng = random.Random(8)
        cls.nb = 6
        cls.tokens = [rng.randrange(1, 50000) for _ in range(cls.nb * B + 5)]
        cls.rows = mftest.synth_rows(cls.tmp, NS, MODEL, B, cls.tokens, (3, 4), cls.nb, 0)
        cls.hashes = mapflow.hash_prefix(NS, MODEL, B, cls.tokens)
        cls.start_daemon(mapflow, "--host_bytes", "64mb")

    def admin_chan(self):
        # mapflowd's admin socket beside its socket: d.sock -> d-admin.sock
        return mapflow.Channel("unix:" + self.d.sock[:-len(".sock")] + "-admin.sock", ns=NS)

    def chan(self, **kw):
        kw.setdefault("ns", NS)
        return mapflow.Channel("unix:" + self.d.sock, **kw)

    def setUp(self):
        with self.chan() as ch:
            ch.flush()

    def put_all(self, ch):
        res = ch.put_batch(self.rows[3] + self.rows[4])
        self.assertEqual(len(res), 2 * self.nb)
        self.assertTrue(all(r.status == mapflow.OK and r.tier == "host" for r in res))

    def test_roundtrip_copy_and_lease(self):
        self.assertEqual(len(self.hashes), self.nb)
        with self.chan(want_arena=True) as ch:
            self.assertTrue(ch.has_arena)
            self.put_all(ch)
            self.assertTrue(ch.put(self.rows[3][0]).replaced)
            blocks, total = ch.lookup(MODEL, B, self.tokens, [3, 4, 5])
            self.assertEqual((blocks, total), ([self.nb, self.nb, 0], self.nb))
            for lease in (False, True):
                with ch.get_prefix(MODEL, B, self.tokens, [3, 4], lease=lease) as g:
                    self.assertEqual(len(g), 2 * self.nb)
                    for i, row in enumerate(g):
                        want = self.rows[3 + i // self.nb][i % self.nb]
                        self.assertTrue(row.ok, row)
                        self.assertEqual((row.layer, row.block), (3 + i // self.nb, i % self.nb))
                        self.assertTrue(row.data.readonly)
                        self.assertEqual(row.data.tobytes(), want)
                        self.assertEqual(bool(row.lease_id), lease)
                        self.assertEqual(row.hash, self.hashes[i % self.nb])
                        self.assertEqual(row.model, MODEL)
                        if np is not None:
                            a = row.array()
                            self.assertFalse(a.flags.writeable)
                            self.assertEqual(a.tobytes(), want)
                            blk = i % self.nb
                            self.assertEqual(row.tokens.tolist(),
                                             self.tokens[blk * B:(blk + 1) * B])
            # Partial prefix: blocks 2..3 of layer 4 only.
            with ch.get_prefix(MODEL, B, self.tokens, [4], first_block=2, n_blocks=2) as g:
                self.assertEqual([r.block for r in g], [2, 3])
            self.assertEqual(ch.get(MODEL, 4, self.hashes[5]), self.rows[4][5])
            with ch.get_keys([(MODEL, 3, self.hashes[1]), (MODEL, 9, self.hashes[1])]) as g:
                self.assertEqual(g[0].data.tobytes(), self.rows[3][1])
                self.assertEqual(g[1].status, mapflow.NOT_FOUND)
                self.assertIsNone(g[1].data)
            lease = ch.get_lease(MODEL, 3, self.hashes[2])
            self.assertEqual(lease.data.tobytes(), self.rows[3][2])
            self.assertEqual(ch.release([lease.lease_id]), 1)
            self.assertEqual(ch.delete(MODEL, 3, self.hashes[2]), 1)
            self.assertEqual(ch.lookup(MODEL, B, self.tokens, [3])[0], [2])
            self.assertEqual(ch.delete_model(MODEL, 4), self.nb)

    def test_errors_carry_codes(self):
        with self.chan() as ch:
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.get(MODEL, 3, self.hashes[0])
            self.assertEqual(e.exception.code, mapflow.NOT_FOUND)
            self.assertEqual(e.exception.status, "NOT_FOUND")
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.get_prefix(MODEL, B, self.tokens, [3], lease=True)
            self.assertEqual(e.exception.code, mapflow.FAILED_PRECONDITION)
            bad = bytearray(self.rows[3][0])
            bad[-1] ^= 0x77
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.put_batch([self.rows[3][1], bytes(bad)])
            self.assertNotEqual(e.exception.code, mapflow.OK)
            self.assertEqual(e.exception.results[1].status, e.exception.code)
            self.assertEqual(list(ch.list()), [])  # nothing sent
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.config_set("lease_ttl", "15s")  # a tenant channel: not an admin
            self.assertEqual(e.exception.code, mapflow.PERMISSION_DENIED)
        with self.admin_chan() as ch:
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.config_set("host_bytes", "1gb")  # not live
            self.assertEqual(e.exception.code, mapflow.FAILED_PRECONDITION)
        with self.assertRaises(mapflow.MapflowError) as e:
            mapflow.Channel("unix:" + os.path.join(self.tmp, "nobody.sock"))
        self.assertEqual(e.exception.code, mapflow.UNAVAILABLE)
        self.assertIn("nobody.sock", e.exception.message)

    def test_list_paging_and_admin(self):
        with self.chan() as ch:
            self.put_all(ch)
            entries, tok = ch.list_page(page_size=5)
            self.assertEqual(len(entries), 5)
            self.assertIsNotNone(tok)
            every = list(ch.list(page_size=5))
            self.assertEqual(len(every), 2 * self.nb)
            self.assertEqual({(e["layer"], e["hash"]) for e in every},
                             {(l, h) for l in (3, 4) for h in self.hashes})
            self.assertEqual(len(list(ch.list(layer=4))), self.nb)
            s = ch.stats()  # a tenant's: its namespace's rows only
            self.assertEqual(s["counters"]["namespace_entries"], 2 * self.nb)
            self.assertTrue(any(t["tier"] == "host" and t["entries"] == 2 * self.nb
                                for t in s["tiers"]))
            with self.admin_chan() as adm:  # the daemon's counters are the admin's
                self.assertGreaterEqual(adm.stats()["counters"]["puts_total"], 2 * self.nb)
            h = ch.health()
            self.assertTrue(h["ok"])
            self.assertIn("lease_ttl", ch.config_get())
            pb = b"\x0a\x03py1\x12\x03py2\x18\x10"  # MappingProfile{source, target, block 16}
            with self.admin_chan() as adm:  # config set and profile put are admin calls
                self.assertEqual(adm.config_set("lease_ttl", "15s"),
                                 ch.config_get("lease_ttl")["lease_ttl"][0])
                adm.profile_put(pb)
            self.assertEqual(ch.profile_get("py1", "py2"), pb)
            # profile_list: random extra profiles come back in key order (shorter source names
            # first), across pages
            rng = random.Random()
            names = sorted({"py-%08x" % rng.getrandbits(32) for _ in range(4)})
            with self.admin_chan() as adm:
                for n in names:
                    adm.profile_put(b"\x0a" + bytes([len(n)]) + n.encode() +
                                    b"\x12\x03tgt\x18\x20")
            every = list(ch.profile_list(page_size=2))
            self.assertEqual([(p["source_model"], p["target_model"]) for p in every],
                             [("py1", "py2")] + [(n, "tgt") for n in names])
            self.assertEqual([p["block_size"] for p in every], [16] + [32] * len(names))
            self.assertEqual(every[0]["encoded_bytes"], len(pb))
            first, tok = ch.profile_list_page(page_size=2)
            self.assertEqual(len(first), 2)
            self.assertIsNotNone(tok)
            with self.assertRaises(mapflow.MapflowError) as e:
                ch.profile_get("py1", "nobody")
            self.assertEqual(e.exception.code, mapflow.NOT_FOUND)
            info = ch.info()
            self.assertTrue(info["connected"])
            self.assertEqual(info["in_flight"], 0)
            self.assertEqual(ch.flush(), 2 * self.nb)

    def test_async_each_event_once(self):
        with self.chan(want_arena=True) as ch, mapflow.CompletionQueue() as cq:
            self.put_all(ch)
            n = 200
            for i in range(n):
                kind = i % 4
                if kind == 0:
                    ch.lookup_async(cq, MODEL, B, self.tokens, [3, 4], tag=("lk", i))
                elif kind == 1:
                    ch.get_prefix_async(cq, MODEL, B, self.tokens, [4], i % self.nb, 1,
                                        lease=True, tag=("gp", i))
                elif kind == 2:
                    ch.get_async(cq, MODEL, 3, self.hashes[i % self.nb], tag=("g", i))
                else:
                    ch.put_async(cq, self.rows[3][i % self.nb], tag=("p", i))
            seen = set()
            for _ in range(n):
                ev = cq.next(30000)
                self.assertIsNotNone(ev, "no event within 30 s")
                self.assertNotIn(ev.tag, seen)
                seen.add(ev.tag)
                kind, i = ev.tag
                res = ev.check()
                if kind == "lk":
                    self.assertEqual(res, ([self.nb, self.nb], self.nb))
                elif kind == "gp":
                    self.assertEqual(res[0].data.tobytes(), self.rows[4][i % self.nb])
                    res.release()
                    res.close()
                elif kind == "g":
                    self.assertEqual(res, self.rows[3][i % self.nb])
                else:
                    self.assertTrue(res.replaced)
            self.assertEqual(len(seen), n)
            self.assertIsNone(cq.next(0))
            self.assertEqual(len(cq), 0)

    def test_deadline_and_cancel_while_stopped(self):
        with self.chan(retry={"max_retries": 0}) as ch, mapflow.CompletionQueue() as cq:
            os.kill(self.d.proc.pid, signal.SIGSTOP)
            try:
                with self.assertRaises(mapflow.MapflowError) as e:
                    ch.health(timeout_ms=100)
                self.assertEqual(e.exception.code, mapflow.DEADLINE_EXCEEDED)
                call = ch.health_async(cq, tag="h", timeout_ms=mapflow.TIMEOUT_INFINITE)
                self.assertTrue(call.cancel())
                ev = cq.next(30000)
                self.assertEqual((ev.tag, ev.status), ("h", mapflow.CANCELLED))
                self.assertIsNone(ev.result)
            finally:
                os.kill(self.d.proc.pid, signal.SIGCONT)
            self.assertTrue(ch.health()["ok"])

    def test_reconnect_after_restart(self):
        with self.chan(want_arena=True, retry={"max_retries": 0}) as ch:
            self.put_all(ch)
            self.d.stop()
            try:
                with self.assertRaises(mapflow.MapflowError) as e:
                    ch.health()
                self.assertEqual(e.exception.code, mapflow.UNAVAILABLE)
            finally:
                self.d.start()
            for _ in range(500):
                try:
                    ch.health()
                    break
                except mapflow.MapflowError as err:
                    self.assertEqual(err.code, mapflow.UNAVAILABLE)
                    time.sleep(0.02)
            info = ch.info()
            self.assertTrue(info["connected"])
            self.assertGreaterEqual(info["reconnects"], 1)
            self.assertTrue(ch.has_arena)
            ch.put(self.rows[3][0])
            with ch.get_prefix(MODEL, B, self.tokens, [3], 0, 1, lease=True) as g:
                self.assertEqual(g[0].data.tobytes(), self.rows[3][0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
