"""mapflow's result objects: row views and their owners (GetResult, Lease: views are
refused once the owner is closed or released), PutResult, Row, completion-queue Events,
Calls and the CompletionQueue. Re-exported by mapflow/__init__.py; thread safety as the
package docstring says."""

from __future__ import annotations

import ctypes as C
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from ._base import (MapflowError, ViewClosed, STATUS, TIMEOUT_INFINITE, _CODECS, _TIERS, _hex,
                    _np, _timeout, Tag, Timeout)
from ._base import OK, FAILED_PRECONDITION  # noqa: F401  (status names: set at import)
from ._clib import _Event, _Lease, _lib, _P, _PutResult, _RowColumns, _RowRef
from ._dlpack import _KDLCPU, _KDLCUDA, _dlpack

if TYPE_CHECKING:  # annotations only: the package imports this module
    from . import Channel

class _Chan:
    """The C channel of a Channel. mf_channel_close unmaps the arenas that leased views
    point into, so it runs once the Channel is closed *and* no _Owner of arena memory
    (an open GetResult / Lease, or an array / tensor made from one) is left. In a child of
    fork() it never runs: the channel's I/O thread is the parent's (see mapflow.h), so the
    child leaves the C channel alone and its calls fail."""

    __slots__ = ("h", "views", "closing", "pid", "mu")

    def __init__(self, h: C.c_void_p):
        self.h, self.views, self.closing, self.pid = h, 0, False, os.getpid()
        self.mu = threading.Lock()  # views may come and go on several threads

    def add_view(self) -> None:
        with self.mu:
            self.views += 1

    def close(self, drop_view: bool = False) -> None:
        with self.mu:
            if drop_view:
                self.views -= 1
            else:
                self.closing = True
            if not self.closing or self.views or not self.h:
                return
            h, self.h = self.h, None
        if self.pid == os.getpid():
            _lib.mf_channel_close(h)

    def handle(self) -> C.c_void_p:
        if self.closing or not self.h:
            raise MapflowError(FAILED_PRECONDITION, "the channel is closed")
        if self.pid != os.getpid():
            raise MapflowError(FAILED_PRECONDITION, "the channel belongs to process %d (this "
                               "is a child of fork(): open a channel here)" % self.pid)
        return self.h


class _Owner:
    """Memory that views point into, kept until the last view (memoryview, NumPy array,
    DLPack tensor) is gone: a get result's C struct (freed here) and, for arena memory,
    the channel's mappings (its close waits for this)."""

    def __init__(self, free: Optional[Callable[[], None]], chan: Optional[_Chan]):
        self.free, self.chan = free, chan
        if chan is not None:
            chan.add_view()

    def __del__(self):
        try:
            if self.free is not None:
                self.free()
            if self.chan is not None:
                self.chan.close(drop_view=True)
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class _Views:
    """The views one GetResult / Lease handed out: close() releases the memoryviews and
    drops the owner; later view requests raise ViewClosed."""

    def __init__(self, owner: _Owner, what: str):
        self.owner: Optional[_Owner] = owner
        self.what = what
        self.handed: List[memoryview] = []

    def live_owner(self) -> _Owner:
        if self.owner is None:
            raise ViewClosed("this row's %s is closed: its views are gone" % self.what)
        return self.owner

    def array_at(self, addr: int, n: int) -> "C.Array[C.c_ubyte]":
        owner = self.live_owner()
        arr = (C.c_ubyte * n).from_address(addr) if n else (C.c_ubyte * 0)()
        arr._keep = owner  # the memory lives as long as anything viewing it
        return arr

    def memoryview(self, addr: int, n: int) -> memoryview:
        mv = memoryview(self.array_at(addr, n)).cast("B").toreadonly()
        self.handed.append(mv)
        return mv

    def close(self) -> None:
        for mv in self.handed:
            try:
                mv.release()
            except BufferError:  # an array made from it still uses it (and the memory)
                pass
        self.handed = []
        self.owner = None


class _Exportable:
    """The zero-copy exports of one row (Row and Lease): DLPack for both kinds,
    __cuda_array_interface__ for device rows. Subclasses set _views, _addr, length,
    on_device and _gpu."""

    _views: _Views
    _addr: int
    _gpu: int
    length: int
    on_device: bool

    def _owner(self) -> _Owner:
        return self._views.live_owner()  # ViewClosed once closed

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_KDLCUDA, self._gpu) if self.on_device else (_KDLCPU, 0)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the row's bytes (1-D uint8, read only by contract). The
        row is complete when it is handed out, so no stream needs to wait."""
        if copy:
            raise BufferError("mapflow rows are exported without a copy (copy=True asked)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("the row is on %r, not on %r" % (self.__dlpack_device__(),
                                                                 tuple(dl_device)))
        if not self._addr:
            raise BufferError("this row has no data (status %s)" %
                              STATUS.get(getattr(self, "status", OK)))
        return _dlpack(self._addr, self.length, self.__dlpack_device__(), self._owner())

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if not self.on_device:
            raise AttributeError("a host row has no __cuda_array_interface__ (use DLPack)")
        # Consumers (CuPy, Numba) keep this object, not the dict: from now on it keeps
        # the memory, so their arrays outlive close() safely.
        self._cai_owner = self._owner()
        return {"shape": (self.length,), "typestr": "|u1", "data": (self._addr, True),
                "version": 3, "strides": None, "stream": None}


class PutResult:
    __slots__ = ("tier", "durable", "replaced", "status")

    def __init__(self, r: _PutResult, status: int = 0):
        self.tier = _TIERS.get(r.tier, "none")
        self.durable = bool(r.durable)
        self.replaced = bool(r.replaced)
        self.status = status

    def __repr__(self) -> str:
        return "PutResult(tier=%r, durable=%r, replaced=%r, status=%s)" % (
            self.tier, self.durable, self.replaced, STATUS.get(self.status))


class Row(_Exportable):
    """One returned row: status, layer, block, tier, lease_id and, when status is OK, the
    row bytes (data: read-only memoryview; array(): NumPy uint8; DLPack) and its decoded
    header. A leased row of a mapped GPU arena has on_device True, device_ptr (int) and
    length instead: data is None and the header is not decoded (the GPU kernels check
    it); DLPack and __cuda_array_interface__ export it as a CUDA tensor."""

    def __init__(self, ref: _RowRef, views: _Views, gpu: int):
        self._views, self._gpu = views, gpu
        self.status = ref.status
        self.layer = ref.layer
        self.block = ref.block
        self.tier = _TIERS.get(ref.tier, "none")
        self.lease_id = ref.lease_id
        self.on_device = bool(ref.on_device)
        self.gpu_arena = ref.gpu_arena
        ok = ref.status == OK
        self._addr = (ref.data or 0) if ok else 0
        self.device_ptr = self._addr if self.on_device else 0
        self.length = ref.length if ok else 0
        self._data: Optional[memoryview] = None
        self._tok = (0, 0)
        if ok and ref.data and not ref.on_device:
            v = ref.view
            self._data = views.memoryview(ref.data, ref.length)
            self.model = C.string_at(v.model, v.model_len).decode()
            self.block_size = v.block_size
            self.n_heads = v.n_heads
            self.n_cols = v.n_cols
            self.n_entries = v.n_entries
            self.codec = _CODECS.get(v.codec, str(v.codec))
            self.top_p = v.top_p
            self.hash = _hex(v.hash)
            self._tok = (v.tokens - ref.data, v.block_size)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def data(self) -> Optional[memoryview]:
        """The row's bytes (read-only, zero copy); None without host data. ViewClosed
        once the GetResult is closed."""
        if self._data is None:
            return None
        self._owner()
        return self._data

    def _host(self, what: str) -> int:
        if self._data is None:
            raise ValueError("%s: this row has no host data (%s)" % (
                what, "on the device" if self.on_device else STATUS.get(self.status)))
        return self._addr

    def array(self) -> Any:
        """The row bytes as a read-only NumPy uint8 array (no copy; it keeps the memory)."""
        if _np is None:
            raise ImportError("NumPy is not importable")
        a = _np.frombuffer(self._views.array_at(self._host("array()"), self.length),
                           dtype=_np.uint8)
        a.flags.writeable = False
        return a

    @property
    def tokens(self) -> Any:
        """The block's tokens (NumPy uint32 view when NumPy is importable, else a list)."""
        off, n = self._tok
        arr = self._views.array_at(self._host("tokens") + off, 4 * n)
        if _np is None:
            return list(memoryview(arr).cast("B").cast("I"))
        a = _np.frombuffer(arr, dtype=_np.uint32)
        a.flags.writeable = False
        return a

    def __repr__(self) -> str:
        return "Row(layer=%d, block=%d, status=%s, tier=%s, %s)" % (
            self.layer, self.block, STATUS.get(self.status), self.tier,
            "%d bytes on device at 0x%x" % (self.length, self.device_ptr) if self.on_device
            else "%d bytes" % self.length if self._data is not None else "no data")


class RowColumns:
    """The rows' fields of a GetResult as NumPy arrays (GetResult.columns()): attributes
    status, layer, block, tier, data, length, lease_id, on_device, gpu_arena, also by name
    (cols["data"]); len() is the row count. Slices of a layer's rows are views."""

    FIELDS = (("status", "<i4"), ("layer", "<u4"), ("block", "<u4"), ("tier", "<i4"),
              ("data", "<u8"), ("length", "<u8"), ("lease_id", "<u8"), ("on_device", "?"),
              ("gpu_arena", "<u4"))
    __slots__ = tuple(f for f, _ in FIELDS)

    def __init__(self, cols: Dict[str, Any]):
        for f, _ in self.FIELDS:
            setattr(self, f, cols[f])

    def __getitem__(self, name: str) -> Any:
        if name not in self.__slots__:
            raise KeyError(name)
        return getattr(self, name)

    def __len__(self) -> int:
        return len(self.status)

    def __repr__(self) -> str:
        return "RowColumns(%d rows)" % len(self)


class GetResult:
    """Rows of a batched get (layer-major). Views stay valid until close() (then they
    raise ViewClosed); leases until release() (or their TTL, or the channel's close /
    reconnect). As a context manager it releases the leases and closes, also when the
    block raises. Row objects are made when first asked for (a 32k prefix × 30 layers is
    15,360 rows: making them all costs more than the get itself); columns() gives every
    row's fields at once as NumPy arrays (table(): as one structured array). A row first
    asked for after close() raises ViewClosed."""

    def __init__(self, ch: "Channel", ptr: Any, leased: bool):
        self._ch = ch
        self._ptr = ptr
        r = ptr.contents
        self.lease_ttl_ms = r.lease_ttl_ms
        self._n = int(r.n_rows)
        self._made: List[Optional[Row]] = [None] * self._n
        owner = _Owner(lambda: _lib.mf_get_result_free(ptr), ch._core if leased else None)
        self._views = _Views(owner, "GetResult")

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(self._n))

    def __getitem__(self, i: int) -> Row:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("row %d of a result of %d rows" % (i, self._n))
        row = self._made[i]
        if row is None:
            if not self._ptr:
                raise ViewClosed("this GetResult is closed: row %d was not read before "
                                 "close()" % i)
            row = self._made[i] = Row(self._ptr.contents.rows[i], self._views, self._ch._gpu)
        return row

    @property
    def rows(self) -> List[Row]:
        """Every row as a Row (made now where not made yet)."""
        return [self[i] for i in range(self._n)]

    def columns(self) -> "RowColumns":
        """Every row's fields as NumPy arrays, one per field, in the result's order
        (RowColumns; mf_get_result_columns: no Python object per row): status, layer,
        block, tier (codes as in mapflow.h), data (the row's address: host, or device when
        on_device; 0 unless OK), length (0 unless OK), lease_id, on_device (bool),
        gpu_arena. The arrays are the caller's; the addresses are valid as long as the
        rows' views (host) or leases (device) are. ViewClosed after close()."""
        if _np is None:
            raise ImportError("NumPy is not importable")
        if not self._ptr:
            raise ViewClosed("this GetResult is closed")
        n = self._n
        cols = {f: _np.empty(n, dtype=dt) for f, dt in RowColumns.FIELDS}
        c = _RowColumns(n, *[cols[f].ctypes.data for f, _ in RowColumns.FIELDS])
        st = _lib.mf_get_result_columns(self._ptr, C.byref(c))
        if st != OK:
            raise MapflowError(st, "mf_get_result_columns: %d rows" % n)
        return RowColumns(cols)

    def table(self) -> Any:
        """Every row's fields as a NumPy structured array (one record per row, in the
        result's order; the fields of columns(), on_device as int32). ViewClosed after
        close()."""
        cols = self.columns()
        dt = _np.dtype([(f, "<i4" if f == "on_device" else dt)
                        for f, dt in RowColumns.FIELDS])
        tab = _np.empty(len(cols), dtype=dt)
        for f, _ in RowColumns.FIELDS:
            tab[f] = cols[f]
        return tab

    def release(self, timeout_ms: Optional[int] = None) -> None:
        """Releases every lease of the result (the daemon may reuse those bytes after)."""
        if self._ptr:
            self._ch._check(_lib.mf_release_result(self._ch._h, self._ptr, _timeout(timeout_ms)))
            for row in self._made:
                if row is not None:
                    row.lease_id = 0

    def close(self) -> None:
        """Ends the views (leases are not released: call release() first). The C result
        is freed once no array or tensor made from it is left."""
        if self._ptr:
            self._ptr = None
            self._views.close()

    def __enter__(self) -> "GetResult":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.release()
            else:
                try:  # the leases must not stay pinned until their TTL
                    self.release()
                except MapflowError:
                    pass  # the block's own exception is the one to see
        finally:
            self.close()

    def __del__(self):
        self.close()


class Lease(_Exportable):
    """One leased row: data (read-only memoryview into the daemon's arena), lease_id; or,
    on_device, device_ptr and length (data None) for a row of a mapped GPU arena. Views
    (data, array(), DLPack) raise ViewClosed after release()."""

    def __init__(self, ch: "Channel", lease: _Lease):
        self._ch = ch
        self._gpu = ch._gpu
        self._views = _Views(_Owner(None, ch._core), "Lease")
        self.lease_id = lease.lease_id
        self.ttl_ms = lease.ttl_ms
        self.on_device = bool(lease.on_device)
        self.gpu_arena = lease.gpu_arena
        self.length = lease.length
        self._addr = lease.data or 0
        self.device_ptr = self._addr if lease.on_device else 0
        self._data = None if lease.on_device else self._views.memoryview(self._addr,
                                                                          lease.length)
        # a device row's header is not read here
        self.layer = None if lease.on_device else lease.view.layer
        self.block = None if lease.on_device else lease.view.block_index

    @property
    def data(self) -> Optional[memoryview]:
        if self._data is None:
            return None
        self._owner()
        return self._data

    def array(self) -> Any:
        if _np is None:
            raise ImportError("NumPy is not importable")
        if self.on_device:
            raise ValueError("array(): the row is on the device (use DLPack)")
        a = _np.frombuffer(self._views.array_at(self._addr, self.length), dtype=_np.uint8)
        a.flags.writeable = False
        return a

    def release(self, timeout_ms: Optional[int] = None) -> None:
        """Releases the lease and ends the views."""
        if self.lease_id:
            lid, self.lease_id = self.lease_id, 0
            self._views.close()
            self._ch.release([lid], timeout_ms)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Event:
    """A finished async call: tag, status (int), message, result (or None on failure)."""
    __slots__ = ("tag", "status", "message", "result")

    def __init__(self, tag: Tag, status: int, message: str, result: Any):
        self.tag, self.status, self.message, self.result = tag, status, message, result

    @property
    def ok(self) -> bool:
        return self.status == OK

    def check(self) -> Any:
        """The result, or MapflowError for a failed call."""
        if self.status != OK:
            raise MapflowError(self.status, self.message)
        return self.result

    def __repr__(self):
        return "Event(tag=%r, status=%s, message=%r)" % (self.tag, STATUS.get(self.status),
                                                         self.message)


class Call:
    """Handle of an async call: cancel() asks it to stop (its event says CANCELLED)."""

    def __init__(self, handle: C.c_void_p):
        self._h = handle

    def cancel(self) -> bool:
        return _lib.mf_call_cancel(self._h) == OK

    def __del__(self):
        if self._h:
            _lib.mf_call_free(self._h)
            self._h = None


class CompletionQueue:
    """Events of async calls, one per call, in completion order. next(timeout_ms) returns
    an Event, None on timeout, and raises StopIteration once shut down and drained."""

    _h = None  # set once the C object exists (close / __del__ check it)

    def __init__(self):
        h = _P()
        st = _lib.mf_cq_create(C.byref(h))
        if st:
            raise MapflowError(st, "mf_cq_create")
        self._h = h
        self._pid = os.getpid()
        self._pending: Dict[int, Tuple[Tag, Callable[[], Any], Any]] = {}
        self._next_tag = 1

    def _q(self) -> C.c_void_p:
        if not self._h:
            raise MapflowError(FAILED_PRECONDITION, "the completion queue is closed")
        if self._pid != os.getpid():
            raise MapflowError(FAILED_PRECONDITION, "the completion queue belongs to process "
                               "%d (this is a child of fork())" % self._pid)
        return self._h

    def _register(self, tag: Tag, finish: Callable[[], Any], keep: Any) -> int:
        t = self._next_tag
        self._next_tag += 1
        self._pending[t] = (tag, finish, keep)
        return t

    def next(self, timeout_ms: Timeout = None) -> Optional[Event]:
        ev = _Event()
        t = _lib.mf_cq_next(self._q(), TIMEOUT_INFINITE if timeout_ms is None else int(timeout_ms),
                            C.byref(ev))
        if t == 2:
            return None
        if t == 3:
            raise StopIteration
        tag, finish, keep = self._pending.pop(ev.tag)
        result = finish() if ev.status == OK else None
        return Event(tag, ev.status, ev.message.decode(errors="replace"), result)

    def shutdown(self) -> None:
        _lib.mf_cq_shutdown(self._q())

    def close(self) -> None:
        """Shuts down, drains the events still to come, and frees the queue. In a child of
        fork() it only forgets the queue: its calls are the parent's and never end here."""
        if self._h and self._pid != os.getpid():
            self._h = None
        if self._h:
            self.shutdown()
            try:
                while True:
                    self.next()
            except StopIteration:
                pass
            _lib.mf_cq_destroy(self._h)
            self._h = None

    def __len__(self) -> int:
        return len(self._pending)

    def __enter__(self) -> "CompletionQueue":
        return self

    def __exit__(self, *exc):
        self.close()
