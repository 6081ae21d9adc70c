"""mapflow — Python binding of libmapflow, the client of mapflowd (ctypes, no build step).

The same calls as the C library (client/mapflow.h): a Channel to one daemon and
namespace with put / put_batch / lookup / get_prefix / get / get_lease / release /
delete and the admin calls, each with a deadline (timeout_ms), retries of UNAVAILABLE
and automatic reconnection done by the library; async calls that complete on a
CompletionQueue. A failed call raises MapflowError carrying the status code.

Rows come back as memoryviews — read-only, zero-copy views of the daemon's host arena
for leased gets — and as NumPy arrays when NumPy is importable (Row.array(), Row.tokens),
so a PyTorch worker can wrap them with torch.from_numpy / torch.frombuffer without a copy.

GPU: Channel(..., gpu_device=N) maps the daemon's GPU arenas (CUDA IPC) in device N's
primary context; leased rows of the gpu tier then come back with on_device = True and
device_ptr (an int device address, valid in that context; data is None: the host never
reads device memory). put_device(ptr, length) stores a row that sits in device memory
(e.g. tensor.data_ptr() of a uint8 CUDA tensor, after the stream that wrote it is
synchronized). gpu_info() says which arenas are mapped and why not.
A view is valid while its GetResult (or Lease) is open and, for leases, until release();
after close() the memory may be reused: never keep views longer than the result.

The library is found through $MAPFLOW_LIB (a path to libmapflow.so), then the source
tree's build/lib (../../build/lib from this package), then the system loader
(libmapflow.so.0, e.g. after `make install`).

Thread safety: a Channel may be used from several threads (the C library serialises
nothing but its own state); a CompletionQueue may be waited on from any thread.
"""

import ctypes as C
import os

try:
    import numpy as _np
except ImportError:  # NumPy is optional
    _np = None

__all__ = ["Channel", "CompletionQueue", "MapflowError", "GetResult", "Row", "Lease",
           "Event", "PutResult", "hash_prefix", "version", "STATUS", "TIMEOUT_DEFAULT",
           "TIMEOUT_INFINITE"]

TIMEOUT_DEFAULT = -1
TIMEOUT_INFINITE = -2
_SONAME = "libmapflow.so.0"

STATUS = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
          4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
          7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
          10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
          14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}
globals().update({name: code for code, name in STATUS.items()})
__all__ += list(STATUS.values())
_TIERS = {0: "none", 1: "gpu", 2: "host", 3: "ssd"}
_CODECS = {0: "mask", 1: "fp16", 2: "bf16", 3: "fp8", 4: "u8log"}


class MapflowError(Exception):
    """A failed call: .code (int, gRPC numbering), .status (its name), .message."""

    def __init__(self, code, message=""):
        self.code = int(code)
        self.status = STATUS.get(self.code, "UNKNOWN")
        self.message = message
        super().__init__("%s: %s" % (self.status, message) if message else self.status)


# ==== C types (client/mapflow.h, proto/mf_row.h) ========================================

class _Hash(C.Structure):
    _fields_ = [("lo", C.c_uint64), ("hi", C.c_uint64)]


class _RowView(C.Structure):
    _fields_ = [("base", C.c_void_p), ("size", C.c_size_t), ("codec", C.c_int),
                ("layer", C.c_uint32), ("block_index", C.c_uint32),
                ("block_size", C.c_uint32), ("n_heads", C.c_uint32), ("n_cols", C.c_uint32),
                ("n_entries", C.c_uint32), ("top_p", C.c_float), ("model", C.c_void_p),
                ("model_len", C.c_uint32), ("parent", _Hash), ("hash", _Hash),
                ("tokens", C.c_void_p), ("cols", C.c_void_p), ("col_off", C.c_void_p),
                ("head_mask", C.c_void_p), ("mass", C.c_void_p), ("scales", C.c_void_p),
                ("tiles", C.c_void_p), ("tile_bytes", C.c_size_t)]


class _RowRef(C.Structure):
    _fields_ = [("status", C.c_int), ("layer", C.c_uint32), ("block", C.c_uint32),
                ("tier", C.c_int), ("data", C.c_void_p), ("length", C.c_size_t),
                ("lease_id", C.c_uint64), ("view", _RowView), ("on_device", C.c_int),
                ("gpu_arena", C.c_uint32)]


class _GetResult(C.Structure):
    _fields_ = [("n_rows", C.c_size_t), ("rows", C.POINTER(_RowRef)),
                ("lease_ttl_ms", C.c_uint64), ("priv_", C.c_void_p)]


class _Key(C.Structure):
    _fields_ = [("model", C.c_char_p), ("layer", C.c_uint32), ("hash", _Hash)]


class _Retry(C.Structure):
    _fields_ = [("max_retries", C.c_uint32), ("initial_backoff_ms", C.c_uint32),
                ("max_backoff_ms", C.c_uint32), ("multiplier", C.c_float),
                ("jitter", C.c_float)]


class _Params(C.Structure):
    _fields_ = [("field_mask", C.c_uint64), ("ns", C.c_char_p), ("token", C.c_char_p),
                ("client_name", C.c_char_p), ("want_arena", C.c_int),
                ("timeout_ms", C.c_int64), ("max_frame", C.c_uint32), ("retry", _Retry),
                ("verify", C.c_int), ("gpu_device", C.c_int)]


class _GpuArenaInfo(C.Structure):
    _fields_ = [("index", C.c_uint32), ("bytes", C.c_uint64), ("mapped", C.c_int),
                ("device", C.c_int), ("peer", C.c_int), ("pci_bus_id", C.c_char * 32),
                ("why", C.c_char * 256)]


class _GpuInfo(C.Structure):
    _fields_ = [("gpu_device", C.c_int), ("driver", C.c_int), ("why", C.c_char * 256),
                ("n_announced", C.c_uint32), ("n_mapped", C.c_uint32), ("n_peer", C.c_uint32),
                ("arenas", _GpuArenaInfo * 16), ("host_arena_pinned", C.c_int)]


class _Info(C.Structure):
    _fields_ = [("daemon_version", C.c_char_p), ("session_id", C.c_uint64),
                ("host_arena_bytes", C.c_uint64), ("max_frame", C.c_uint32),
                ("max_batch", C.c_uint32), ("gpu_tier", C.c_int), ("connected", C.c_int),
                ("reconnects", C.c_uint64), ("in_flight", C.c_size_t)]


class _PutResult(C.Structure):
    _fields_ = [("tier", C.c_int), ("durable", C.c_int), ("replaced", C.c_int)]


class _PutItem(C.Structure):
    _fields_ = [("row", C.c_void_p), ("len", C.c_size_t), ("status", C.c_int),
                ("result", _PutResult)]


class _Lease(C.Structure):
    _fields_ = [("data", C.c_void_p), ("length", C.c_size_t), ("lease_id", C.c_uint64),
                ("view", _RowView), ("ttl_ms", C.c_uint64), ("on_device", C.c_int),
                ("gpu_arena", C.c_uint32)]


class _Entry(C.Structure):
    _fields_ = [("model", C.c_char * 256), ("layer", C.c_uint32), ("hash", _Hash),
                ("block", C.c_uint32), ("size", C.c_uint64), ("tier", C.c_int),
                ("on_ssd", C.c_int), ("pins", C.c_uint32), ("last_access_ms", C.c_uint64)]


class _ListPage(C.Structure):
    _fields_ = [("n_entries", C.c_size_t), ("entries", C.POINTER(_Entry)),
                ("next_page_token", C.POINTER(C.c_uint8)), ("next_page_token_len", C.c_size_t)]


class _TierStats(C.Structure):
    _fields_ = [("tier", C.c_int), ("enabled", C.c_int), ("used_bytes", C.c_uint64),
                ("capacity_bytes", C.c_uint64), ("entries", C.c_uint64),
                ("why_off", C.c_char * 128)]


class _Counter(C.Structure):
    _fields_ = [("name", C.c_char_p), ("value", C.c_uint64)]


class _Stats(C.Structure):
    _fields_ = [("n_tiers", C.c_size_t), ("tiers", C.POINTER(_TierStats)),
                ("n_counters", C.c_size_t), ("counters", C.POINTER(_Counter)),
                ("uptime_ms", C.c_uint64), ("connections", C.c_uint32)]


class _ConfigItem(C.Structure):
    _fields_ = [("key", C.c_char_p), ("value", C.c_char_p), ("live", C.c_int)]


class _Health(C.Structure):
    _fields_ = [("ok", C.c_int), ("ready", C.c_int), ("status", C.c_char * 256),
                ("n_tiers", C.c_size_t), ("tiers", _TierStats * 4)]


class _Event(C.Structure):
    _fields_ = [("type", C.c_int), ("tag", C.c_void_p), ("status", C.c_int),
                ("message", C.c_char * 256)]


_P = C.c_void_p
_U32P = C.POINTER(C.c_uint32)
_ASYNC = [_P, _P, C.POINTER(_P)]  # cq, tag, call
_PROTOS = {
    "mf_version": (C.c_char_p, []),
    "mf_strerror": (C.c_char_p, [C.c_int]),
    "mf_retry_policy_default": (None, [C.POINTER(_Retry)]),
    "mf_channel_open": (C.c_int, [C.c_char_p, C.POINTER(_Params), C.POINTER(_P)]),
    "mf_channel_close": (None, [_P]),
    "mf_channel_last_error": (C.c_char_p, [_P]),
    "mf_channel_has_arena": (C.c_int, [_P]),
    "mf_channel_info": (None, [_P, C.POINTER(_Info)]),
    "mf_channel_gpu_info": (None, [_P, C.POINTER(_GpuInfo)]),
    "mf_put_device": (C.c_int, [_P, _P, C.c_size_t, C.c_uint, C.POINTER(_PutResult),
                                C.c_int64]),
    "mf_put_device_batch": (C.c_int, [_P, C.POINTER(_PutItem), C.c_size_t, C.c_uint,
                                      C.c_int64]),
    "mf_put": (C.c_int, [_P, _P, C.c_size_t, C.c_uint, C.POINTER(_PutResult), C.c_int64]),
    "mf_put_async": (C.c_int, [_P, _P, C.c_size_t, C.c_uint, C.POINTER(_PutResult),
                               C.c_int64] + _ASYNC),
    "mf_put_batch": (C.c_int, [_P, C.POINTER(_PutItem), C.c_size_t, C.c_uint, C.c_int64]),
    "mf_lookup": (C.c_int, [_P, C.c_char_p, C.c_uint32, _U32P, C.c_size_t, _U32P,
                            C.c_size_t, _U32P, _U32P, C.c_int64]),
    "mf_lookup_async": (C.c_int, [_P, C.c_char_p, C.c_uint32, _U32P, C.c_size_t, _U32P,
                                  C.c_size_t, _U32P, _U32P, C.c_int64] + _ASYNC),
    "mf_get_prefix": (C.c_int, [_P, C.c_char_p, C.c_uint32, _U32P, C.c_size_t, _U32P,
                                C.c_size_t, C.c_uint32, C.c_uint32, C.c_int,
                                C.POINTER(C.POINTER(_GetResult)), C.c_int64]),
    "mf_get_prefix_async": (C.c_int, [_P, C.c_char_p, C.c_uint32, _U32P, C.c_size_t, _U32P,
                                      C.c_size_t, C.c_uint32, C.c_uint32, C.c_int,
                                      C.POINTER(C.POINTER(_GetResult)), C.c_int64] + _ASYNC),
    "mf_get_keys": (C.c_int, [_P, C.POINTER(_Key), C.c_size_t, C.c_int,
                              C.POINTER(C.POINTER(_GetResult)), C.c_int64]),
    "mf_lookup_peer": (C.c_int, [_P, C.c_char_p, C.c_char_p, C.c_uint32, _U32P, C.c_size_t,
                                 _U32P, C.c_size_t, _U32P, _U32P, C.c_int64]),
    "mf_get_prefix_peer": (C.c_int, [_P, C.c_char_p, C.c_char_p, C.c_uint32, _U32P,
                                     C.c_size_t, _U32P, C.c_size_t, C.c_uint32, C.c_uint32,
                                     C.c_int, C.POINTER(C.POINTER(_GetResult)), C.c_int64]),
    "mf_get_keys_peer": (C.c_int, [_P, C.c_char_p, C.POINTER(_Key), C.c_size_t, C.c_int,
                                   C.POINTER(C.POINTER(_GetResult)), C.c_int64]),
    "mf_get_result_free": (None, [C.POINTER(_GetResult)]),
    "mf_release_result": (C.c_int, [_P, C.POINTER(_GetResult), C.c_int64]),
    "mf_get": (C.c_int, [_P, C.POINTER(_Key), _P, C.c_size_t, C.POINTER(C.c_size_t),
                         C.c_int64]),
    "mf_get_async": (C.c_int, [_P, C.POINTER(_Key), _P, C.c_size_t, C.POINTER(C.c_size_t),
                               C.c_int64] + _ASYNC),
    "mf_get_lease": (C.c_int, [_P, C.POINTER(_Key), C.POINTER(_Lease), C.c_int64]),
    "mf_release": (C.c_int, [_P, C.POINTER(C.c_uint64), C.c_size_t, _U32P, C.c_int64]),
    "mf_delete": (C.c_int, [_P, C.POINTER(_Key), C.POINTER(C.c_uint64), C.c_int64]),
    "mf_delete_model": (C.c_int, [_P, C.c_char_p, C.c_int64, C.POINTER(C.c_uint64),
                                  C.c_int64]),
    "mf_list": (C.c_int, [_P, C.c_char_p, C.c_int64, C.c_uint32, _P, C.c_size_t,
                          C.POINTER(C.POINTER(_ListPage)), C.c_int64]),
    "mf_list_page_free": (None, [C.POINTER(_ListPage)]),
    "mf_stats": (C.c_int, [_P, C.POINTER(C.POINTER(_Stats)), C.c_int64]),
    "mf_stats_free": (None, [C.POINTER(_Stats)]),
    "mf_evict": (C.c_int, [_P, C.c_int, C.c_uint64, C.POINTER(C.c_uint64),
                           C.POINTER(C.c_uint64), C.c_int64]),
    "mf_flush": (C.c_int, [_P, C.POINTER(C.c_uint64), C.c_int64]),
    "mf_config_get": (C.c_int, [_P, C.c_char_p, C.POINTER(C.POINTER(_ConfigItem)),
                                C.POINTER(C.c_size_t), C.c_int64]),
    "mf_config_set": (C.c_int, [_P, C.c_char_p, C.c_char_p,
                                C.POINTER(C.POINTER(_ConfigItem)), C.c_int64]),
    "mf_config_items_free": (None, [C.POINTER(_ConfigItem), C.c_size_t]),
    "mf_health": (C.c_int, [_P, C.POINTER(_Health), C.c_int64]),
    "mf_health_async": (C.c_int, [_P, C.POINTER(_Health), C.c_int64] + _ASYNC),
    "mf_profile_put": (C.c_int, [_P, _P, C.c_size_t, C.c_int64]),
    "mf_profile_get": (C.c_int, [_P, C.c_char_p, C.c_char_p, C.POINTER(_P),
                                 C.POINTER(C.c_size_t), C.c_int64]),
    "mf_cq_create": (C.c_int, [C.POINTER(_P)]),
    "mf_cq_next": (C.c_int, [_P, C.c_int64, C.POINTER(_Event)]),
    "mf_cq_shutdown": (None, [_P]),
    "mf_cq_destroy": (None, [_P]),
    "mf_call_cancel": (C.c_int, [_P]),
    "mf_call_free": (None, [_P]),
    "mf_hash_prefix": (C.c_int, [C.c_char_p, C.c_char_p, C.c_uint32, _U32P, C.c_size_t,
                                 C.POINTER(_Hash), C.c_size_t, C.POINTER(C.c_size_t)]),
    "mf_hash_to_hex": (None, [_Hash, C.c_char_p]),
    "mf_hash_from_hex": (C.c_int, [C.c_char_p, C.POINTER(_Hash)]),
}


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    tried = []
    for cand in (os.environ.get("MAPFLOW_LIB"),
                 os.path.join(here, "..", "..", "..", "build", "lib", _SONAME),
                 _SONAME):
        if not cand or (os.sep in cand and not os.path.exists(cand)):
            continue
        try:
            lib = C.CDLL(cand)
            break
        except OSError as e:
            tried.append("%s: %s" % (cand, e))
    else:
        raise ImportError("cannot load libmapflow (set MAPFLOW_LIB): " + "; ".join(tried))
    for name, (res, args) in _PROTOS.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


_lib = _load()
_lib.mf_strerror.restype = C.c_char_p


def version():
    """Version of the loaded libmapflow ("MAJOR.MINOR.PATCH")."""
    return _lib.mf_version().decode()


def _b(s):
    return s.encode() if isinstance(s, str) else s


def _timeout(t):
    return TIMEOUT_DEFAULT if t is None else int(t)


def _u32(seq):
    """A ctypes u32 array from a list, array('I'), bytes of u32 or NumPy array."""
    if _np is not None and isinstance(seq, _np.ndarray):
        a = _np.ascontiguousarray(seq, dtype=_np.uint32)
        return (C.c_uint32 * a.size).from_buffer_copy(a.tobytes()), a.size
    seq = list(seq)
    return (C.c_uint32 * max(len(seq), 1))(*seq), len(seq)


def _hash(h):
    """A hash from 32 hex digits, a (lo, hi) pair or an _Hash."""
    if isinstance(h, _Hash):
        return h
    if isinstance(h, (tuple, list)):
        return _Hash(h[0], h[1])
    out = _Hash()
    if _lib.mf_hash_from_hex(_b(h), C.byref(out)) != 0:
        raise MapflowError(INVALID_ARGUMENT, "hash must be 32 hex digits: %r" % (h,))
    return out


def _hex(h):
    buf = C.create_string_buffer(33)
    _lib.mf_hash_to_hex(h, buf)
    return buf.value.decode()


def _key(model, layer, h):
    return _Key(_b(model), int(layer), _hash(h))


def hash_prefix(ns, model, block_size, tokens):
    """Prefix hashes (32 hex digits each) of every full block of tokens (DESIGN §4)."""
    arr, n = _u32(tokens)
    nb = n // block_size
    out = (_Hash * max(nb, 1))()
    got = C.c_size_t()
    st = _lib.mf_hash_prefix(_b(ns), _b(model), block_size, arr, n, out, nb, C.byref(got))
    if st:
        raise MapflowError(st, _lib.mf_strerror(st).decode())
    return [_hex(out[i]) for i in range(got.value)]


def _view(addr, n, keep):
    """A read-only memoryview of n bytes at addr that keeps `keep` alive."""
    arr = (C.c_ubyte * n).from_address(addr) if n else (C.c_ubyte * 0)()
    arr._keep = keep
    return memoryview(arr).cast("B").toreadonly()


class PutResult:
    __slots__ = ("tier", "durable", "replaced", "status")

    def __init__(self, r, status=OK):
        self.tier = _TIERS.get(r.tier, "none")
        self.durable = bool(r.durable)
        self.replaced = bool(r.replaced)
        self.status = status

    def __repr__(self):
        return "PutResult(tier=%r, durable=%r, replaced=%r, status=%s)" % (
            self.tier, self.durable, self.replaced, STATUS.get(self.status))


class Row:
    """One returned row: status, layer, block, tier, lease_id and, when status is OK, the
    row bytes (data: memoryview; array(): NumPy uint8) and its decoded header. A leased
    row of a mapped GPU arena has on_device True, device_ptr (int) and length instead:
    data is None and the header is not decoded (the GPU kernels check it)."""

    def __init__(self, ref, owner):
        self.status = ref.status
        self.layer = ref.layer
        self.block = ref.block
        self.tier = _TIERS.get(ref.tier, "none")
        self.lease_id = ref.lease_id
        self.on_device = bool(ref.on_device)
        self.gpu_arena = ref.gpu_arena
        self.device_ptr = ref.data if ref.status == OK and ref.on_device else 0
        self.length = ref.length if ref.status == OK else 0
        self.data = None
        if ref.status == OK and ref.data and not ref.on_device:
            v = ref.view
            self.data = _view(ref.data, ref.length, owner)
            self.model = C.string_at(v.model, v.model_len).decode()
            self.block_size = v.block_size
            self.n_heads = v.n_heads
            self.n_cols = v.n_cols
            self.n_entries = v.n_entries
            self.codec = _CODECS.get(v.codec, str(v.codec))
            self.top_p = v.top_p
            self.hash = _hex(v.hash)
            off = v.tokens - ref.data
            self._tok = (off, v.block_size)

    @property
    def ok(self):
        return self.status == OK

    def array(self):
        """The row bytes as a read-only NumPy uint8 array (no copy)."""
        if _np is None:
            raise ImportError("NumPy is not importable")
        return _np.frombuffer(self.data, dtype=_np.uint8)

    @property
    def tokens(self):
        """The block's tokens (NumPy uint32 view when NumPy is importable, else a list)."""
        off, n = self._tok
        mv = self.data[off:off + 4 * n]
        return _np.frombuffer(mv, dtype=_np.uint32) if _np is not None else list(mv.cast("I"))

    def __repr__(self):
        return "Row(layer=%d, block=%d, status=%s, tier=%s, %s)" % (
            self.layer, self.block, STATUS.get(self.status), self.tier,
            "%d bytes on device at 0x%x" % (self.length, self.device_ptr) if self.on_device
            else "%d bytes" % len(self.data) if self.data is not None else "no data")


class GetResult:
    """Rows of a batched get (layer-major). Views stay valid until close(); leases until
    release() (or their TTL, or the channel's close / reconnect)."""

    def __init__(self, ch, ptr):
        self._ch = ch
        self._ptr = ptr
        r = ptr.contents
        self.lease_ttl_ms = r.lease_ttl_ms
        self.rows = [Row(r.rows[i], self) for i in range(r.n_rows)]

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def release(self, timeout_ms=None):
        if self._ptr:
            self._ch._check(_lib.mf_release_result(self._ch._h, self._ptr, _timeout(timeout_ms)))
            for row in self.rows:
                row.lease_id = 0

    def close(self):
        """Frees the result (leases are not released: call release() first)."""
        if self._ptr:
            _lib.mf_get_result_free(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.release()
        finally:
            self.close()

    def __del__(self):
        self.close()


class Lease:
    """One leased row: data (read-only memoryview into the daemon's arena), lease_id; or,
    on_device, device_ptr and length (data None) for a row of a mapped GPU arena."""

    def __init__(self, ch, lease):
        self._ch = ch
        self.lease_id = lease.lease_id
        self.ttl_ms = lease.ttl_ms
        self.on_device = bool(lease.on_device)
        self.gpu_arena = lease.gpu_arena
        self.length = lease.length
        self.device_ptr = lease.data if lease.on_device else 0
        self.data = None if lease.on_device else _view(lease.data, lease.length, self)
        # a device row's header is not read here
        self.layer = None if lease.on_device else lease.view.layer
        self.block = None if lease.on_device else lease.view.block_index

    def array(self):
        if _np is None:
            raise ImportError("NumPy is not importable")
        return _np.frombuffer(self.data, dtype=_np.uint8)

    def release(self, timeout_ms=None):
        if self.lease_id:
            self._ch.release([self.lease_id], timeout_ms)
            self.lease_id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Event:
    """A finished async call: tag, status (int), message, result (or None on failure)."""
    __slots__ = ("tag", "status", "message", "result")

    def __init__(self, tag, status, message, result):
        self.tag, self.status, self.message, self.result = tag, status, message, result

    @property
    def ok(self):
        return self.status == OK

    def check(self):
        """The result, or MapflowError for a failed call."""
        if self.status != OK:
            raise MapflowError(self.status, self.message)
        return self.result

    def __repr__(self):
        return "Event(tag=%r, status=%s, message=%r)" % (self.tag, STATUS.get(self.status),
                                                         self.message)


class Call:
    """Handle of an async call: cancel() asks it to stop (its event says CANCELLED)."""

    def __init__(self, handle):
        self._h = handle

    def cancel(self):
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
        self._pending = {}
        self._next_tag = 1

    def _register(self, tag, finish, keep):
        t = self._next_tag
        self._next_tag += 1
        self._pending[t] = (tag, finish, keep)
        return t

    def next(self, timeout_ms=None):
        ev = _Event()
        t = _lib.mf_cq_next(self._h, TIMEOUT_INFINITE if timeout_ms is None else int(timeout_ms),
                            C.byref(ev))
        if t == 2:
            return None
        if t == 3:
            raise StopIteration
        tag, finish, keep = self._pending.pop(ev.tag)
        result = finish() if ev.status == OK else None
        return Event(tag, ev.status, ev.message.decode(errors="replace"), result)

    def shutdown(self):
        _lib.mf_cq_shutdown(self._h)

    def close(self):
        """Shuts down, drains the events still to come, and frees the queue."""
        if self._h:
            self.shutdown()
            try:
                while True:
                    self.next()
            except StopIteration:
                pass
            _lib.mf_cq_destroy(self._h)
            self._h = None

    def __len__(self):
        return len(self._pending)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ==== channel ============================================================================

_PARAM_NS, _PARAM_TOKEN, _PARAM_NAME, _PARAM_ARENA, _PARAM_TIMEOUT, _PARAM_FRAME, \
    _PARAM_RETRY, _PARAM_VERIFY, _PARAM_GPU = (1 << i for i in range(9))


class Channel:
    """A connection to one mapflowd (target "unix:PATH", "tcp:HOST:PORT" or "ucx:HOST:PORT":
    rows then move one-sided and come back as copies, see mapflow.h) bound to one
    namespace. retry: dict of mf_retry_policy_t fields (max_retries, initial_backoff_ms,
    max_backoff_ms, multiplier, jitter) overriding the defaults. gpu_device: this
    process's CUDA ordinal in which the daemon's GPU arenas are mapped (None: no GPU)."""

    _h = None  # set once the C object exists (close / __del__ check it)

    def __init__(self, target, ns="default", token=None, client_name="mapflow-python",
                 want_arena=False, timeout_ms=30000, max_frame=0, retry=None,
                 gpu_device=None):
        p = _Params()
        p.field_mask = _PARAM_NS | _PARAM_NAME | _PARAM_ARENA | _PARAM_TIMEOUT
        self._strs = [_b(ns), _b(client_name), _b(token or "")]
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
        h = _P()
        st = _lib.mf_channel_open(_b(target), C.byref(p), C.byref(h))
        if st != OK:
            msg = _lib.mf_channel_last_error(h).decode() if h else ""
            _lib.mf_channel_close(h)
            raise MapflowError(st, msg)
        self._h = h

    # -- plumbing --
    def _check(self, st):
        if st != OK:
            raise MapflowError(st, _lib.mf_channel_last_error(self._h).decode(errors="replace"))

    def _async(self, cq, tag, start, finish, keep):
        """Starts an async call with C arguments args; finish() builds the result."""
        t = cq._register(tag, finish, keep)
        call = _P()
        st = start(cq._h, _P(t), C.byref(call))
        if st != OK:
            cq._pending.pop(t, None)
            self._check(st)
        return Call(call)

    def close(self):
        """Closes the channel: async calls still running finish with CANCELLED."""
        if self._h:
            _lib.mf_channel_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @property
    def last_error(self):
        return _lib.mf_channel_last_error(self._h).decode(errors="replace")

    @property
    def has_arena(self):
        return bool(_lib.mf_channel_has_arena(self._h))

    def info(self):
        i = _Info()
        _lib.mf_channel_info(self._h, C.byref(i))
        return {"daemon_version": (i.daemon_version or b"").decode(),
                "session_id": i.session_id, "host_arena_bytes": i.host_arena_bytes,
                "max_frame": i.max_frame, "max_batch": i.max_batch,
                "gpu_tier": bool(i.gpu_tier), "connected": bool(i.connected),
                "reconnects": i.reconnects, "in_flight": i.in_flight}

    def gpu_info(self):
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
    def put(self, row, durable=False, timeout_ms=None):
        """Stores one encoded row (bytes-like); returns a PutResult."""
        buf = _rowbuf(row)
        r = _PutResult()
        self._check(_lib.mf_put(self._h, buf, len(buf), 1 if durable else 0, C.byref(r),
                                _timeout(timeout_ms)))
        return PutResult(r)

    def put_device(self, ptr, length, durable=False, timeout_ms=None):
        """Stores one encoded row that sits in device memory at ptr (int, 16-byte aligned,
        valid in gpu_device's context; the work that wrote it finished); a PutResult."""
        r = _PutResult()
        self._check(_lib.mf_put_device(self._h, _P(int(ptr)), int(length),
                                       1 if durable else 0, C.byref(r), _timeout(timeout_ms)))
        return PutResult(r)

    def put_device_batch(self, rows, durable=False, timeout_ms=None):
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

    def put_async(self, cq, row, tag=None, durable=False, timeout_ms=None):
        buf = _rowbuf(row)
        r = _PutResult()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_put_async(
            self._h, buf, len(buf), 1 if durable else 0, C.byref(r), _timeout(timeout_ms),
            q, t, c), lambda: PutResult(r), (buf, r))

    def put_batch(self, rows, durable=False, timeout_ms=None):
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

    def lookup(self, model, block_size, tokens, layers, timeout_ms=None, peer=None):
        """Cached leading blocks per layer: (list of counts in layer order, total blocks).
        peer: "HOST:PORT" of another daemon's UCX listener to ask too."""
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        blocks = (C.c_uint32 * max(nl, 1))()
        total = C.c_uint32()
        self._check(_lib.mf_lookup_peer(self._h, _b(peer), _b(model), block_size, tok, nt,
                                        lay, nl, blocks, C.byref(total), _timeout(timeout_ms)))
        return list(blocks[:nl]), total.value

    def lookup_async(self, cq, model, block_size, tokens, layers, tag=None, timeout_ms=None):
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        blocks = (C.c_uint32 * max(nl, 1))()
        total = C.c_uint32()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_lookup_async(
            self._h, _b(model), block_size, tok, nt, lay, nl, blocks, C.byref(total),
            _timeout(timeout_ms), q, t, c), lambda: (list(blocks[:nl]), total.value),
            (blocks, total))

    def get_prefix(self, model, block_size, tokens, layers, first_block=0, n_blocks=0,
                   lease=False, timeout_ms=None, peer=None):
        """Rows of blocks [first_block, +n_blocks) (0 = every full block) of each layer in
        one round trip, verified here. lease=True: zero-copy views of the arena. peer:
        "HOST:PORT" of a daemon's UCX listener to read missing rows through from."""
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        out = C.POINTER(_GetResult)()
        self._check(_lib.mf_get_prefix_peer(self._h, _b(peer), _b(model), block_size, tok, nt,
                                            lay, nl, first_block, n_blocks, 1 if lease else 0,
                                            C.byref(out), _timeout(timeout_ms)))
        return GetResult(self, out)

    def get_prefix_async(self, cq, model, block_size, tokens, layers, first_block=0,
                         n_blocks=0, lease=False, tag=None, timeout_ms=None):
        tok, nt = _u32(tokens)
        lay, nl = _u32(layers)
        out = C.POINTER(_GetResult)()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_get_prefix_async(
            self._h, _b(model), block_size, tok, nt, lay, nl, first_block, n_blocks,
            1 if lease else 0, C.byref(out), _timeout(timeout_ms), q, t, c),
            lambda: GetResult(self, out), (out,))

    def get_keys(self, keys, lease=False, timeout_ms=None, peer=None):
        """Rows by explicit key: keys is a list of (model, layer, hash) triples. peer: as
        in get_prefix."""
        ks = (_Key * max(len(keys), 1))(*[_key(*k) for k in keys])
        out = C.POINTER(_GetResult)()
        self._check(_lib.mf_get_keys_peer(self._h, _b(peer), ks, len(keys), 1 if lease else 0,
                                          C.byref(out), _timeout(timeout_ms)))
        return GetResult(self, out)

    def get(self, model, layer, hash, max_bytes=64 << 20, timeout_ms=None):
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

    def get_async(self, cq, model, layer, hash, cap=1 << 20, tag=None, timeout_ms=None):
        k = _key(model, layer, hash)
        n = C.c_size_t()
        buf = C.create_string_buffer(cap)
        return self._async(cq, tag, lambda q, t, c: _lib.mf_get_async(
            self._h, C.byref(k), buf, cap, C.byref(n), _timeout(timeout_ms), q, t, c),
            lambda: buf.raw[:n.value], (k, n, buf))

    def get_lease(self, model, layer, hash, timeout_ms=None):
        """One row by key as a leased zero-copy view (needs want_arena): a Lease."""
        k = _key(model, layer, hash)
        out = _Lease()
        st = _lib.mf_get_lease(self._h, C.byref(k), C.byref(out), _timeout(timeout_ms))
        if st != OK and out.lease_id:
            self.release([out.lease_id])
        self._check(st)
        return Lease(self, out)

    def release(self, lease_ids, timeout_ms=None):
        ids = (C.c_uint64 * max(len(lease_ids), 1))(*lease_ids)
        n = C.c_uint32()
        self._check(_lib.mf_release(self._h, ids, len(lease_ids), C.byref(n),
                                    _timeout(timeout_ms)))
        return n.value

    def delete(self, model, layer, hash, timeout_ms=None):
        k = _key(model, layer, hash)
        n = C.c_uint64()
        self._check(_lib.mf_delete(self._h, C.byref(k), C.byref(n), _timeout(timeout_ms)))
        return n.value

    def delete_model(self, model, layer=None, timeout_ms=None):
        n = C.c_uint64()
        self._check(_lib.mf_delete_model(self._h, _b(model), -1 if layer is None else layer,
                                         C.byref(n), _timeout(timeout_ms)))
        return n.value

    # -- admin calls --
    def list_page(self, model=None, layer=None, page_size=0, page_token=None,
                  timeout_ms=None):
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

    def list(self, model=None, layer=None, page_size=0, timeout_ms=None):
        """Every entry of the namespace, page after page (a generator)."""
        tok = None
        while True:
            entries, tok = self.list_page(model, layer, page_size, tok, timeout_ms)
            yield from entries
            if not tok:
                return

    def stats(self, timeout_ms=None):
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

    def evict(self, tier, nbytes=0, timeout_ms=None):
        t = {v: k for k, v in _TIERS.items()}[tier]
        b, e = C.c_uint64(), C.c_uint64()
        self._check(_lib.mf_evict(self._h, t, nbytes, C.byref(b), C.byref(e),
                                  _timeout(timeout_ms)))
        return b.value, e.value

    def flush(self, timeout_ms=None):
        n = C.c_uint64()
        self._check(_lib.mf_flush(self._h, C.byref(n), _timeout(timeout_ms)))
        return n.value

    def config_get(self, key=None, timeout_ms=None):
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

    def config_set(self, key, value, timeout_ms=None):
        """Sets a live key; returns the value now in effect."""
        item = C.POINTER(_ConfigItem)()
        self._check(_lib.mf_config_set(self._h, _b(key), _b(str(value)), C.byref(item),
                                       _timeout(timeout_ms)))
        try:
            return item.contents.value.decode() if item else None
        finally:
            _lib.mf_config_items_free(item, 1 if item else 0)

    def health(self, timeout_ms=None):
        h = _Health()
        self._check(_lib.mf_health(self._h, C.byref(h), _timeout(timeout_ms)))
        return _health(h)

    def health_async(self, cq, tag=None, timeout_ms=None):
        h = _Health()
        return self._async(cq, tag, lambda q, t, c: _lib.mf_health_async(
            self._h, C.byref(h), _timeout(timeout_ms), q, t, c), lambda: _health(h), (h,))

    def profile_put(self, profile_pb, timeout_ms=None):
        """Stores a mapping profile (bytes of an encoded mapflow.v1.MappingProfile)."""
        buf = _rowbuf(profile_pb)
        self._check(_lib.mf_profile_put(self._h, buf, len(buf), _timeout(timeout_ms)))

    def profile_get(self, source_model, target_model, timeout_ms=None):
        p = _P()
        n = C.c_size_t()
        self._check(_lib.mf_profile_get(self._h, _b(source_model), _b(target_model),
                                        C.byref(p), C.byref(n), _timeout(timeout_ms)))
        try:
            return C.string_at(p, n.value)
        finally:
            C.CDLL(None).free(p)


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
