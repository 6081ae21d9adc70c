"""mapflow — Python binding of libmapflow, the client of mapflowd (ctypes, no build step).

The same calls as the C library (client/mapflow.h): a Channel to one daemon and
namespace with put / put_batch / lookup / get_prefix / get / get_lease / release /
delete and the admin calls, each with a deadline (timeout_ms), retries of UNAVAILABLE
and automatic reconnection done by the library; async calls that complete on a
CompletionQueue. A failed call raises a subclass of MapflowError named after its status
(NotFound, PermissionDenied, Unavailable, ...; .code, .status, .message).

Rows come back as read-only memoryviews — zero-copy views of the daemon's host arena for
leased gets — as NumPy arrays when NumPy is importable (Row.array(), Row.tokens), and
through DLPack (Row.__dlpack__ / __dlpack_device__: kDLCPU for host rows, kDLCUDA for
device rows) so torch.from_dlpack(row) / numpy.from_dlpack(row) wrap them without a copy;
device rows also carry __cuda_array_interface__ (CuPy, Numba). The tensors are one-
dimensional uint8 and must never be written (the arena is shared with the daemon).

GPU: Channel(..., gpu_device=N) maps the daemon's GPU arenas (CUDA IPC) in device N's
primary context; leased rows of the gpu tier then come back with on_device = True and
device_ptr (an int device address, valid in that context; data is None: the host never
reads device memory). put_device(ptr, length) stores a row that sits in device memory
(e.g. tensor.data_ptr() of a uint8 CUDA tensor, after the stream that wrote it is
synchronized). gpu_info() says which arenas are mapped and why not.

Lifetimes: a row's views (data, array(), tokens, __dlpack__) work until its
GetResult.close() (the end of its `with` block) or Lease.release(); then they raise
ViewClosed (a MapflowError) instead of reading memory that is gone. Arrays and tensors
made before keep the memory they view alive: a copied row's buffer is freed, and a
closed Channel's arenas unmapped, only once the last of them is gone. Their bytes are
protected by the daemon only while the lease is held, though: release after use.

The library is found, in this order, through $MAPFLOW_LIB (a path to libmapflow.so.0),
next to this package (a bundled copy), in the source tree's build/lib (when this package
is client/python/mapflow of a built checkout), in the library directories recorded at
install time (`make install PREFIX=...`, `pip install ./client/python`: see setup.py),
then through the system loader. The binding checks, at import, that every struct it
mirrors has the library's layout (mf_abi_layout) and refuses a library that differs.

Kernels: mapflow.kernels wraps MapFlow's extract / apply kernels and dense attention (the
C reference on NumPy arrays, the CUDA kernels on torch tensors); see its docstring.

Thread safety: a Channel may be used from several threads (the C library serialises
nothing but its own state); a CompletionQueue may be waited on from any thread.
fork(): a child must not use its parent's channels (see mapflow.h); open new ones.
"""

from __future__ import annotations

import ctypes as C
from typing import (Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union)

try:
    import numpy as _np
except ImportError:  # NumPy is optional
    _np = None

__all__ = ["Channel", "CompletionQueue", "MapflowError", "ViewClosed", "GetResult", "Row",
           "RowColumns", "Lease", "Event", "PutResult", "PutRegion", "Call", "hash_prefix",
           "version", "__version__",
           "STATUS", "TIMEOUT_DEFAULT", "TIMEOUT_INFINITE"]



# The C side (structs, prototypes, loading) and DLPack export live in their own modules;
# their names are re-exported here for the rest of the package (kernels.py) and the tests.
from ._clib import (_abi_mismatches, _AbiField, _candidates, _ConfigItem, _dlopen, _Event,
                    _GetResult, _GpuInfo, _Hash, _Health, _Info, _Key, _Lease, _lib,
                    _lib_layout, _lib_path, _ListPage, _MIRRORS, _P, _Params, _ProfilePage,
                    _PutItem, _PutRegionParams, _PutRegionResult, _PutResult, _Retry,
                    _RowRef, _RowView, _Stats)  # noqa: F401
from ._dlpack import _KDLCPU, _KDLCUDA, _dlpack


from ._base import (MapflowError, ViewClosed, STATUS, TIMEOUT_DEFAULT,  # noqa: F401
                    TIMEOUT_INFINITE, _ERRORS, _CODECS, _TIERS, _b, _class_name, _hash, _hex,
                    _key, _timeout, _u32, Buffer, Hash, Tag, Timeout, Tokens)
from ._results import (_Chan, _Owner, _Views, _Exportable, PutResult, Row,  # noqa: F401
                       RowColumns, GetResult, Lease, Event, Call, CompletionQueue)

# Public classes defined in the private modules say mapflow is their home (repr, pickle,
# documentation tools).
for _c in (MapflowError, ViewClosed, PutResult, Row, RowColumns, GetResult, Lease, Event,
           Call, CompletionQueue):
    _c.__module__ = __name__
del _c

# the status names (NOT_FOUND = 5, ...) and their error classes (NotFound, ...)
globals().update({name: code for code, name in STATUS.items()})
__all__ += list(STATUS.values())
globals().update({c.__name__: c for c in _ERRORS.values()})
__all__ += [c.__name__ for c in _ERRORS.values()]


def _check_abi() -> None:
    bad = _abi_mismatches(_lib_layout(), _MIRRORS)
    if bad:
        raise ImportError("mapflow: %s (version %s) does not match this binding's view of "
                          "its structs, so calls would read the wrong bytes; install the "
                          "binding and the library from the same release. Differences: %s"
                          % (_lib_path, _lib.mf_version().decode(), " | ".join(bad)))


_check_abi()
__version__: str = _lib.mf_version().decode()


def version() -> str:
    """Version of the loaded libmapflow ("MAJOR.MINOR.PATCH"), = __version__."""
    return _lib.mf_version().decode()


def hash_prefix(ns: str, model: str, block_size: int, tokens: Tokens) -> List[str]:
    """Prefix hashes (32 hex digits each) of every full block of tokens (DESIGN §4)."""
    arr, n = _u32(tokens)
    nb = n // block_size
    out = (_Hash * max(nb, 1))()
    got = C.c_size_t()
    st = _lib.mf_hash_prefix(_b(ns), _b(model), block_size, arr, n, out, nb, C.byref(got))
    if st:
        raise MapflowError(st, _lib.mf_strerror(st).decode())
    return [_hex(out[i]) for i in range(got.value)]


# ==== channel ============================================================================

_PARAM_NS, _PARAM_TOKEN, _PARAM_NAME, _PARAM_ARENA, _PARAM_TIMEOUT, _PARAM_FRAME, \
    _PARAM_RETRY, _PARAM_VERIFY, _PARAM_GPU, _PARAM_ADMIN_TOKEN = (1 << i for i in range(10))


class PutRegion:
    """A layer's rows written in place (Channel.put_region): rows[i] is row i's device
    address (int) in the channel's gpu_device context. commit() makes the daemon check
    every row (a region begun with capacities=True: commit(lengths=...), each row's actual
    bytes, a list or NumPy array; the slack after each row goes back to the arena) and
    returns {"committed", "replaced", "first_failed", "checked_on_gpu",
    "statuses"}; a refused row raises MapflowError (of the first refused row's status)
    with .result (that dict). close() frees the handle, aborting a region neither
    committed nor aborted; the channel's close waits for it."""

    def __init__(self, ch: "Channel", h: C.c_void_p, n: int):
        self._ch, self._n, self._hv = ch, n, h
        self._owner: Optional[_Owner] = _Owner(lambda: _lib.mf_put_region_free(h), ch._core)
        self.rows = [_lib.mf_put_region_row(h, i) or 0 for i in range(n)]

    def _handle(self) -> C.c_void_p:
        if self._owner is None:
            raise MapflowError(FAILED_PRECONDITION, "the put region is closed")
        return self._hv

    def commit(self, timeout_ms: Timeout = None,
               lengths: Optional[Sequence[int]] = None) -> Dict[str, Any]:
        if lengths is not None:
            n = len(lengths)
            lens = (C.c_size_t * max(n, 1))(*[int(x) for x in lengths])
            self._ch._check(_lib.mf_put_region_set_lengths(self._handle(), lens, n))
        sts = (C.c_int * max(self._n, 1))()
        r = _PutRegionResult()
        st = _lib.mf_put_region_commit(self._handle(), sts, C.byref(r), _timeout(timeout_ms))
        res = {"committed": r.committed, "replaced": r.replaced,
               "first_failed": r.first_failed if r.first_failed < self._n else None,
               "checked_on_gpu": bool(r.checked_on_gpu),
               "statuses": [int(sts[i]) for i in range(self._n)]}
        if st != OK:
            err = MapflowError(st, self._ch.last_error)
            err.result = res
            raise err
        return res

    def abort(self, timeout_ms: Timeout = None) -> None:
        self._ch._check(_lib.mf_put_region_abort(self._handle(), _timeout(timeout_ms)))

    def close(self) -> None:
        self._owner = None  # its finalizer frees the C handle

    def __enter__(self) -> "PutRegion":
        return self

    def __exit__(self, *exc):
        self.close()


class Channel:
    """A connection to one mapflowd (target "unix:PATH", "tcp:HOST:PORT" or "ucx:HOST:PORT":
    rows then move one-sided and come back as copies, see mapflow.h) bound to one
    namespace. retry: dict of mf_retry_policy_t fields (max_retries, initial_backoff_ms,
    max_backoff_ms, multiplier, jitter) overriding the defaults. gpu_device: this
    process's CUDA ordinal in which the daemon's GPU arenas are mapped (None: no GPU).
    admin_token: the daemon's admin_token, for admin calls (config set, profile put,
    flush / evict of every namespace) on a channel that is not on the admin socket."""

    _core: Optional[_Chan] = None  # set once the C object exists (close / __del__ check it)
    _gpu = -1

    def __init__(self, target: str, ns: str = "default", token: Optional[str] = None,
                 client_name: str = "mapflow-python", want_arena: bool = False,
                 timeout_ms: int = 30000, max_frame: int = 0,
                 retry: Optional[Dict[str, Union[int, float]]] = None,
                 gpu_device: Optional[int] = None, admin_token: Optional[str] = None):
        p = _Params()
        p.field_mask = _PARAM_NS | _PARAM_NAME | _PARAM_ARENA | _PARAM_TIMEOUT
        self._strs = [_b(ns), _b(client_name), _b(token or ""), _b(admin_token or "")]
        p.ns, p.client_name = self._strs[0], self._strs[1]
        if token:
            p.field_mask |= _PARAM_TOKEN
            p.token = self._strs[2]
        p.want_arena = 1 if want_arena else 0
        p.timeout_ms = int(timeout_ms)
        if max_frame:
            p.field_mask |= _PARAM_FRAME
            p.max_frame = int(max_frame)
        if retry is not None:
            _lib.mf_retry_policy_default(C.byref(p.retry))
            for k, v in dict(retry).items():
                if k not in dict(_Retry._fields_):
                    raise ValueError("unknown retry field %r" % k)
                setattr(p.retry, k, v)
            p.field_mask |= _PARAM_RETRY
        if gpu_device is not None:
            p.field_mask |= _PARAM_GPU
            p.gpu_device = int(gpu_device)
        if admin_token:
            p.field_mask |= _PARAM_ADMIN_TOKEN
            p.admin_token = self._strs[3]
        h = _P()
        st = _lib.mf_channel_open(_b(target), C.byref(p), C.byref(h))
        if st != OK:
            msg = _lib.mf_channel_last_error(h).decode() if h else ""
            _lib.mf_channel_close(h)
            raise MapflowError(st, msg)
        self._core = _Chan(h)
        self._gpu = -1 if gpu_device is None else int(gpu_device)

    @property
    def _h(self) -> C.c_void_p:
        """The C channel; FailedPrecondition once closed (never a NULL into the library)."""
        if self._core is None:
            raise MapflowError(FAILED_PRECONDITION, "the channel is closed")
        return self._core.handle()

    # -- plumbing --
    def _check(self, st: int) -> None:
        if st != OK:
            raise MapflowError(st, _lib.mf_channel_last_error(self._h).decode(errors="replace"))

    def _async(self, cq, tag, start, finish, keep):
        """Starts an async call with C arguments args; finish() builds the result."""
        t = cq._register(tag, finish, keep)
        call = _P()
        st = start(cq._q(), _P(t), C.byref(call))
        if st != OK:
            cq._pending.pop(t, None)
            self._check(st)
        return Call(call)

    def close(self) -> None:
        """Closes the channel: async calls still running finish with CANCELLED. While an
        open GetResult / Lease of it, or an array or tensor made from one, still views
        its arenas, the library's close (which unmaps them) waits for the last of them;
        the Channel refuses calls from now on either way."""
        if self._core is not None:
            self._core.close()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @property
    def closed(self) -> bool:
        return self._core is None or self._core.closing

    @property
    def last_error(self) -> str:
        return _lib.mf_channel_last_error(self._h).decode(errors="replace")

    @property
    def has_arena(self) -> bool:
        return bool(_lib.mf_channel_has_arena(self._h))

    def info(self) -> Dict[str, Any]:
        i = _Info()
        _lib.mf_channel_info(self._h, C.byref(i))
        return {"daemon_version": (i.daemon_version or b"").decode(),
                "session_id": i.session_id, "host_arena_bytes": i.host_arena_bytes,
                "max_frame": i.max_frame, "max_batch": i.max_batch,
                "gpu_tier": bool(i.gpu_tier), "connected": bool(i.connected),
                "reconnects": i.reconnects, "in_flight": i.in_flight}

    def gpu_info(self) -> Dict[str, Any]:
        """The GPU arenas of the current connection: {"gpu_device", "driver", "why",
        "announced", "mapped", "peer", "arenas": [{index, bytes, mapped, device, peer,
        pci_bus_id, why}], "host_arena_pinned": 1 | 0 (not yet / none) | -1 (refused)}."""
        g = _GpuInfo()
        _lib.mf_channel_gpu_info(self._h, C.byref(g))
        arenas = [{"index": a.index, "bytes": a.bytes, "mapped": bool(a.mapped),
                   "device": a.device, "peer": bool(a.peer),
                   "pci_bus_id": a.pci_bus_id.decode(), "why": a.why.decode(errors="replace")}
                  for a in g.arenas[:min(g.n_announced, 16)]]
        return {"gpu_device": g.gpu_device, "driver": bool(g.driver),
                "why": g.why.decode(errors="replace"), "announced": g.n_announced,
                "mapped": g.n_mapped, "peer": g.n_peer, "arenas": arenas,
                "host_arena_pinned": g.host_arena_pinned}

    # -- data calls --
    def put(self, row: Buffer, durable: bool = False, timeout_ms: Timeout = None) -> PutResult:
        """Stores one encoded row (bytes-like); returns a PutResult."""
        buf = _rowbuf(row)
        r = _PutResult()
        self._check(_lib.mf_put(self._h, buf, len(buf), 1 if durable else 0, C.byref(r),
                                _timeout(timeout_ms)))
        return PutResult(r)

    def put_device(self, ptr: int, length: int, durable: bool = False,
                   timeout_ms: Timeout = None) -> PutResult:
        """Stores one encoded row that sits in device memory at ptr (int, 16-byte aligned,
        valid in gpu_device's context; the work that wrote it finished); a PutResult."""
        r = _PutResult()
        self._check(_lib.mf_put_device(self._h, _P(int(ptr)), int(length),
                                       1 if durable else 0, C.byref(r), _timeout(timeout_ms)))
        return PutResult(r)

    def put_device_batch(self, rows: Sequence[Tuple[int, int]], durable: bool = False,
                         timeout_ms: Timeout = None) -> List[PutResult]:
        """put_device for many rows: rows is a list of (ptr, length); one PutResult each.
        On failure raises MapflowError with .results."""
        rows = list(rows)
        items = (_PutItem * max(len(rows), 1))()
        for i, (ptr, n) in enumerate(rows):
            items[i].row = int(ptr)
            items[i].len = int(n)
        st = _lib.mf_put_device_batch(self._h, items, len(rows), 1 if durable else 0,
                                      _timeout(timeout_ms))
        results = [PutResult(items[i].result, items[i].status) for i in range(len(rows))]
        if st != OK:
            err = MapflowError(st, self.last_error)
            err.results = results
            raise err
        return results

    def put_region(self, model: str, layer: int, lengths: Sequence[int],
                   gpu_arena: Optional[int] = None, timeout_ms: Timeout = None,
                   capacities: bool = False) -> "PutRegion":
        """One GPU-arena reservation for a layer's rows (mf_put_region_begin): the
        PutRegion's rows are their device addresses; write the rows there, finish that
        work, then commit(). capacities=True: lengths are each row's capacity (an upper
        bound, e.g. the caps mf_extract_cuda takes), and commit(lengths=...) names the
        actual sizes. Raises MapflowError (FAILED_PRECONDITION / RESOURCE_EXHAUSTED: fall
        back to put_device_batch)."""
        n = len(lengths)
        lens = (C.c_size_t * max(n, 1))(*[int(x) for x in lengths])
        mask = (1 if gpu_arena is not None else 0) | (2 if capacities else 0)
        params = (_PutRegionParams(mask, int(gpu_arena or 0), int(bool(capacities)))
                  if mask else None)
        h = _P()
        self._check(_lib.mf_put_region_begin(self._h, _b(model), int(layer), lens, n, 0,
                                             C.byref(params) if params else None, None,
                                             C.byref(h), _timeout(timeout_ms)))
        return PutRegion(self, h, n)

    def put_async(self, cq: CompletionQueue, row: Buffer, tag: Tag = None,
                  durable: bool = False, timeout_ms: Timeout = None) -> Call:
        buf = _rowbuf(row)
        r = _PutResult()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_put_async(
            self._h, buf, len(buf), 1 if durable else 0, C.byref(r), _timeout(timeout_ms),
            q, t, c), lambda: PutResult(r), (buf, r))

    def put_batch(self, rows: Sequence[Buffer], durable: bool = False,
                  timeout_ms: Timeout = None) -> List[PutResult]:
        """Stores many rows in about two round trips; returns one PutResult per row.
        On failure raises MapflowError with .results (per-row PutResult, .status set)."""
        bufs = [_rowbuf(r) for r in rows]
        items = (_PutItem * max(len(bufs), 1))()
        for i, b in enumerate(bufs):
            items[i].row = C.addressof(b)
            items[i].len = len(b)
        st = _lib.mf_put_batch(self._h, items, len(bufs), 1 if durable else 0,
                               _timeout(timeout_ms))
        results = [PutResult(items[i].result, items[i].status) for i in range(len(bufs))]
        if st != OK:
            err = MapflowError(st, self.last_error)
            err.results = results
            raise err
        return results

    def lookup(self, model: str, block_size: int, tokens: Tokens, layers: Tokens,
               timeout_ms: Timeout = None, peer: Optional[str] = None
               ) -> Tuple[List[int], int]:
        """Cached leading blocks per layer: (list of counts in layer order, total blocks).
        peer: "HOST:PORT" of another daemon's UCX listener to ask too."""
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        blocks = (C.c_uint32 * max(nl, 1))()
        total = C.c_uint32()
        self._check(_lib.mf_lookup_peer(self._h, _b(peer), _b(model), block_size, tok, nt,
                                        lay, nl, blocks, C.byref(total), _timeout(timeout_ms)))
        return list(blocks[:nl]), total.value

    def lookup_async(self, cq: CompletionQueue, model: str, block_size: int, tokens: Tokens,
                     layers: Tokens, tag: Tag = None, timeout_ms: Timeout = None) -> Call:
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        blocks = (C.c_uint32 * max(nl, 1))()
        total = C.c_uint32()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_lookup_async(
            self._h, _b(model), block_size, tok, nt, lay, nl, blocks, C.byref(total),
            _timeout(timeout_ms), q, t, c), lambda: (list(blocks[:nl]), total.value),
            (blocks, total))

    def get_prefix(self, model: str, block_size: int, tokens: Tokens, layers: Tokens,
                   first_block: int = 0, n_blocks: int = 0, lease: bool = False,
                   timeout_ms: Timeout = None, peer: Optional[str] = None) -> GetResult:
        """Rows of blocks [first_block, +n_blocks) (0 = every full block) of each layer in
        one round trip, verified here. lease=True: zero-copy views of the arena. peer:
        "HOST:PORT" of a daemon's UCX listener to read missing rows through from."""
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        out = C.POINTER(_GetResult)()
        self._check(_lib.mf_get_prefix_peer(self._h, _b(peer), _b(model), block_size, tok, nt,
                                            lay, nl, first_block, n_blocks, 1 if lease else 0,
                                            C.byref(out), _timeout(timeout_ms)))
        return GetResult(self, out, lease)

    def get_prefix_async(self, cq: CompletionQueue, model: str, block_size: int,
                         tokens: Tokens, layers: Tokens, first_block: int = 0,
                         n_blocks: int = 0, lease: bool = False, tag: Tag = None,
                         timeout_ms: Timeout = None) -> Call:
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        out = C.POINTER(_GetResult)()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_get_prefix_async(
            self._h, _b(model), block_size, tok, nt, lay, nl, first_block, n_blocks,
            1 if lease else 0, C.byref(out), _timeout(timeout_ms), q, t, c),
            lambda: GetResult(self, out, lease), (out,))

    def get_keys(self, keys: Sequence[Tuple[str, int, Hash]], lease: bool = False,
                 timeout_ms: Timeout = None, peer: Optional[str] = None) -> GetResult:
        """Rows by explicit key: keys is a list of (model, layer, hash) triples. peer: as
        in get_prefix."""
        ks = (_Key * max(len(keys), 1))(*[_key(*k) for k in keys])
        out = C.POINTER(_GetResult)()
        self._check(_lib.mf_get_keys_peer(self._h, _b(peer), ks, len(keys), 1 if lease else 0,
                                          C.byref(out), _timeout(timeout_ms)))
        return GetResult(self, out, lease)

    def get(self, model: str, layer: int, hash: Hash, max_bytes: int = 64 << 20,
            timeout_ms: Timeout = None) -> bytes:
        """One row by key, copied: bytes."""
        k = _key(model, layer, hash)
        n = C.c_size_t()
        cap = 1 << 16
        while True:
            buf = C.create_string_buffer(cap)
            st = _lib.mf_get(self._h, C.byref(k), buf, cap, C.byref(n), _timeout(timeout_ms))
            if st == RESOURCE_EXHAUSTED and n.value > cap and n.value <= max_bytes:
                cap = n.value  # a larger row than guessed: ask again with room for it
                continue
            self._check(st)
            return buf.raw[:n.value]

    def get_async(self, cq: CompletionQueue, model: str, layer: int, hash: Hash,
                  cap: int = 1 << 20, tag: Tag = None, timeout_ms: Timeout = None) -> Call:
        k = _key(model, layer, hash)
        n = C.c_size_t()
        buf = C.create_string_buffer(cap)
        return self._async(cq, tag, lambda q, t, c: _lib.mf_get_async(
            self._h, C.byref(k), buf, cap, C.byref(n), _timeout(timeout_ms), q, t, c),
            lambda: buf.raw[:n.value], (k, n, buf))

    def get_lease(self, model: str, layer: int, hash: Hash,
                  timeout_ms: Timeout = None) -> Lease:
        """One row by key as a leased zero-copy view (needs want_arena): a Lease."""
        k = _key(model, layer, hash)
        out = _Lease()
        st = _lib.mf_get_lease(self._h, C.byref(k), C.byref(out), _timeout(timeout_ms))
        if st != OK and out.lease_id:
            self.release([out.lease_id])
        self._check(st)
        return Lease(self, out)

    def release(self, lease_ids: Sequence[int], timeout_ms: Timeout = None) -> int:
        ids = (C.c_uint64 * max(len(lease_ids), 1))(*lease_ids)
        n = C.c_uint32()
        self._check(_lib.mf_release(self._h, ids, len(lease_ids), C.byref(n),
                                    _timeout(timeout_ms)))
        return n.value

    def delete(self, model: str, layer: int, hash: Hash, timeout_ms: Timeout = None) -> int:
        k = _key(model, layer, hash)
        n = C.c_uint64()
        self._check(_lib.mf_delete(self._h, C.byref(k), C.byref(n), _timeout(timeout_ms)))
        return n.value

    def delete_model(self, model: str, layer: Optional[int] = None,
                     timeout_ms: Timeout = None) -> int:
        n = C.c_uint64()
        self._check(_lib.mf_delete_model(self._h, _b(model), -1 if layer is None else layer,
                                         C.byref(n), _timeout(timeout_ms)))
        return n.value

    # -- admin calls --
    def list_page(self, model: Optional[str] = None, layer: Optional[int] = None,
                  page_size: int = 0, page_token: Optional[bytes] = None,
                  timeout_ms: Timeout = None) -> Tuple[List[Dict[str, Any]], Optional[bytes]]:
        """One page: (entries as dicts, next_page_token or None)."""
        tok = _b(page_token) if page_token else None
        out = C.POINTER(_ListPage)()
        self._check(_lib.mf_list(self._h, _b(model) if model else None,
                                 -1 if layer is None else layer, page_size, tok,
                                 len(tok) if tok else 0, C.byref(out), _timeout(timeout_ms)))
        try:
            p = out.contents
            entries = [{"model": e.model.decode(), "layer": e.layer, "hash": _hex(e.hash),
                        "block": e.block, "size": e.size, "tier": _TIERS.get(e.tier, "none"),
                        "on_ssd": bool(e.on_ssd), "pins": e.pins,
                        "last_access_ms": e.last_access_ms}
                       for e in p.entries[:p.n_entries]]
            nxt = C.string_at(p.next_page_token, p.next_page_token_len) \
                if p.next_page_token_len else None
        finally:
            _lib.mf_list_page_free(out)
        return entries, nxt

    def list(self, model: Optional[str] = None, layer: Optional[int] = None,
             page_size: int = 0, timeout_ms: Timeout = None) -> Iterator[Dict[str, Any]]:
        """Every entry of the namespace, page after page (a generator)."""
        tok = None
        while True:
            entries, tok = self.list_page(model, layer, page_size, tok, timeout_ms)
            yield from entries
            if not tok:
                return

    def stats(self, timeout_ms: Timeout = None) -> Dict[str, Any]:
        out = C.POINTER(_Stats)()
        self._check(_lib.mf_stats(self._h, C.byref(out), _timeout(timeout_ms)))
        try:
            s = out.contents
            return {"uptime_ms": s.uptime_ms, "connections": s.connections,
                    "tiers": [_tier(s.tiers[i]) for i in range(s.n_tiers)],
                    "counters": {s.counters[i].name.decode(): s.counters[i].value
                                 for i in range(s.n_counters)}}
        finally:
            _lib.mf_stats_free(out)

    def evict(self, tier: str, nbytes: int = 0, timeout_ms: Timeout = None) -> Tuple[int, int]:
        t = {v: k for k, v in _TIERS.items()}[tier]
        b, e = C.c_uint64(), C.c_uint64()
        self._check(_lib.mf_evict(self._h, t, nbytes, C.byref(b), C.byref(e),
                                  _timeout(timeout_ms)))
        return b.value, e.value

    def flush(self, timeout_ms: Timeout = None) -> int:
        n = C.c_uint64()
        self._check(_lib.mf_flush(self._h, C.byref(n), _timeout(timeout_ms)))
        return n.value

    def config_get(self, key: Optional[str] = None,
                   timeout_ms: Timeout = None) -> Dict[str, Tuple[str, bool]]:
        """{key: (value, live)} for one key or all."""
        items = C.POINTER(_ConfigItem)()
        n = C.c_size_t()
        self._check(_lib.mf_config_get(self._h, _b(key or ""), C.byref(items), C.byref(n),
                                       _timeout(timeout_ms)))
        try:
            return {items[i].key.decode(): (items[i].value.decode(), bool(items[i].live))
                    for i in range(n.value)}
        finally:
            _lib.mf_config_items_free(items, n.value)

    def config_set(self, key: str, value: Any, timeout_ms: Timeout = None) -> Optional[str]:
        """Sets a live key; returns the value now in effect."""
        item = C.POINTER(_ConfigItem)()
        self._check(_lib.mf_config_set(self._h, _b(key), _b(str(value)), C.byref(item),
                                       _timeout(timeout_ms)))
        try:
            return item.contents.value.decode() if item else None
        finally:
            _lib.mf_config_items_free(item, 1 if item else 0)

    def health(self, timeout_ms: Timeout = None) -> Dict[str, Any]:
        h = _Health()
        self._check(_lib.mf_health(self._h, C.byref(h), _timeout(timeout_ms)))
        return _health(h)

    def health_async(self, cq: CompletionQueue, tag: Tag = None,
                     timeout_ms: Timeout = None) -> Call:
        h = _Health()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_health_async(
            self._h, C.byref(h), _timeout(timeout_ms), q, t, c), lambda: _health(h), (h,))

    def profile_put(self, profile_pb: Buffer, timeout_ms: Timeout = None) -> None:
        """Stores a mapping profile (bytes of an encoded mapflow.v1.MappingProfile)."""
        buf = _rowbuf(profile_pb)
        self._check(_lib.mf_profile_put(self._h, buf, len(buf), _timeout(timeout_ms)))

    def profile_get(self, source_model: str, target_model: str,
                    timeout_ms: Timeout = None) -> bytes:
        p = _P()
        n = C.c_size_t()
        self._check(_lib.mf_profile_get(self._h, _b(source_model), _b(target_model),
                                        C.byref(p), C.byref(n), _timeout(timeout_ms)))
        try:
            return C.string_at(p, n.value)
        finally:
            C.CDLL(None).free(p)

    def profile_list_page(self, page_size: int = 0, page_token: Optional[bytes] = None,
                          timeout_ms: Timeout = None
                          ) -> Tuple[List[Dict[str, Any]], Optional[bytes]]:
        """One page of the namespace's profiles: (summaries as dicts, next token or None)."""
        tok = _b(page_token) if page_token else None
        out = C.POINTER(_ProfilePage)()
        self._check(_lib.mf_profile_list(self._h, page_size, tok, len(tok) if tok else 0,
                                         C.byref(out), _timeout(timeout_ms)))
        try:
            p = out.contents
            profiles = [{"source_model": e.source_model.decode(errors="replace"),
                         "target_model": e.target_model.decode(errors="replace"),
                         "block_size": e.block_size, "l0": e.l0,
                         "target_layers": e.target_layers, "mapped_layers": e.mapped_layers,
                         "created_by": (e.created_by or b"").decode(errors="replace"),
                         "encoded_bytes": e.encoded_bytes}
                        for e in p.profiles[:p.n_profiles]]
            nxt = C.string_at(p.next_page_token, p.next_page_token_len) \
                if p.next_page_token_len else None
        finally:
            _lib.mf_profile_page_free(out)
        return profiles, nxt

    def profile_list(self, page_size: int = 0,
                     timeout_ms: Timeout = None) -> Iterator[Dict[str, Any]]:
        """Every profile of the namespace in key order (source, then target; shorter names
        first, then bytewise), a generator."""
        tok = None
        while True:
            profiles, tok = self.profile_list_page(page_size, tok, timeout_ms)
            yield from profiles
            if not tok:
                return


def _tier(t):
    return {"tier": _TIERS.get(t.tier, "none"), "enabled": bool(t.enabled),
            "used_bytes": t.used_bytes, "capacity_bytes": t.capacity_bytes,
            "entries": t.entries, "why_off": t.why_off.decode(errors="replace")}


def _health(h):
    return {"ok": bool(h.ok), "ready": bool(h.ready), "status": h.status.decode(),
            "tiers": [_tier(h.tiers[i]) for i in range(h.n_tiers)]}


def _rowbuf(row):
    """A 16-byte aligned ctypes copy of a bytes-like row (the decoder needs alignment;
    the copy also keeps the bytes alive while an async call runs)."""
    mv = memoryview(row).cast("B")
    n = len(mv)
    raw = (C.c_ubyte * (n + 16))()
    off = (-C.addressof(raw)) % 16
    buf = (C.c_ubyte * n).from_buffer(raw, off)
    C.memmove(buf, mv.tobytes(), n)
    buf._raw = raw
    return buf
