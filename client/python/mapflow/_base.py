"""mapflow's status table, error classes and argument helpers (shared by the package's
modules; the public names are re-exported by mapflow/__init__.py). Import-time only
state: the status table read from the loaded libmapflow."""

from __future__ import annotations

import ctypes as C
from typing import Any, Dict, Optional, Sequence, Tuple, Union

try:
    import numpy as _np
except ImportError:  # NumPy is optional
    _np = None

from ._clib import _Hash, _Key, _lib

TIMEOUT_DEFAULT = -1
TIMEOUT_INFINITE = -2
_TIERS = {0: "none", 1: "gpu", 2: "host", 3: "ssd"}
_CODECS = {0: "mask", 1: "fp16", 2: "bf16", 3: "fp8", 4: "u8log"}

Hash = Union[str, Tuple[int, int]]  # 32 hex digits or (lo, hi)
Tokens = Union[Sequence[int], Any]  # a sequence of ints, array('I') or NumPy array
Buffer = Any  # bytes-like: bytes, bytearray, memoryview, NumPy array
Timeout = Optional[int]  # milliseconds; None = the channel's, TIMEOUT_INFINITE
Tag = Any

def _statuses() -> Dict[int, str]:
    """The library's status table (proto/mf_status.h): {code: "NAME"}."""
    out, code = {}, 0
    while _lib.mf_status_valid(code):
        out[code] = _lib.mf_status_name(code).decode()
        code += 1
    return out


STATUS: Dict[int, str] = _statuses()
globals().update({name: code for code, name in STATUS.items()})


class MapflowError(Exception):
    """A failed call: .code (int, gRPC numbering), .status (its name), .message (why,
    without the status name). MapflowError(code, message) builds the subclass of that
    status (NotFound for NOT_FOUND, ...), so `except mapflow.NotFound` catches it."""

    code: int
    status: str
    message: str

    def __new__(cls, code: int, message: str = ""):
        if cls is MapflowError:
            cls = _ERRORS.get(int(code), MapflowError)
        return super().__new__(cls, code, message)

    def __init__(self, code: int, message: str = ""):
        self.code = int(code)
        self.status = STATUS.get(self.code, "UNKNOWN")
        # The C library's messages may start with the status name already.
        prefix = self.status + ": "
        while message.startswith(prefix):
            message = message[len(prefix):]
        self.message = message
        super().__init__("%s: %s" % (self.status, message) if message else self.status)

    def __reduce__(self):
        # Pickled by code and message (multiprocessing hands errors between workers);
        # the default would rebuild from the formatted text.
        return (MapflowError, (self.code, self.message))


def _class_name(status: str) -> str:
    return "".join(w.capitalize() for w in status.split("_"))  # NOT_FOUND -> NotFound


_ERRORS: Dict[int, type] = {}
for _code, _name in STATUS.items():
    if _code:
        _cls = type(_class_name(_name), (MapflowError,),
                    {"__doc__": "MapflowError with status %s." % _name,
                     "__module__": "mapflow"})
        _ERRORS[_code] = _cls
        globals()[_cls.__name__] = _cls
del _code, _name, _cls


class ViewClosed(_ERRORS[FAILED_PRECONDITION]):
    """A row view used after its GetResult / Lease was closed or released."""

    def __new__(cls, message: str):
        return super().__new__(cls, FAILED_PRECONDITION, message)

    def __init__(self, message: str):
        super().__init__(FAILED_PRECONDITION, message)

    def __reduce__(self):
        return (ViewClosed, (self.message,))



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
