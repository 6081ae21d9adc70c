"""mapflow._dlpack — DLPack export of row bytes: legacy, unversioned "dltensor" capsules
(what NumPy's and PyTorch's from_dlpack read), one-dimensional uint8, host (kDLCPU) or
device (kDLCUDA) memory. A capsule keeps its owner (the row's views) alive until the
consumer calls the deleter or the capsule dies unused.

Thread safety: the live table is touched under the GIL only (ctypes callbacks hold it).
"""

from __future__ import annotations

import ctypes as C
from typing import Any, Dict, Tuple

_KDLCPU, _KDLCUDA, _KDLUINT = 1, 2, 1


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int),
                ("dtype", _DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


_DL_DELETER = C.CFUNCTYPE(None, C.c_void_p)


class _DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", C.c_void_p),
                ("deleter", _DL_DELETER)]


_dl_live: Dict[int, Tuple[Any, ...]] = {}  # address -> (managed tensor, shape, owner)


@_DL_DELETER
def _dl_delete(addr):
    """The consumer is done (or the capsule died unused): drop what the tensor kept."""
    _dl_live.pop(addr, None)


_pyapi = C.PyDLL(None)  # own function objects: ctypes.pythonapi's argtypes are anyone's
_pyapi.PyCapsule_New.restype = C.py_object
_pyapi.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_pyapi.PyCapsule_IsValid.restype = C.c_int
_pyapi.PyCapsule_IsValid.argtypes = [C.c_void_p, C.c_char_p]
_pyapi.PyCapsule_GetPointer.restype = C.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [C.c_void_p, C.c_char_p]


@C.CFUNCTYPE(None, C.c_void_p)
def _dl_capsule_dtor(cap):
    # A consumer renames the capsule to "used_dltensor" and calls the deleter itself.
    if _pyapi.PyCapsule_IsValid(cap, b"dltensor"):
        _dl_delete(_pyapi.PyCapsule_GetPointer(cap, b"dltensor"))


def _dlpack(addr: int, n: int, device: Tuple[int, int], owner: Any) -> Any:
    """A "dltensor" capsule of n bytes (uint8, one dimension) at addr on device
    (type, id); owner stays referenced until the consumer is done with the tensor."""
    mt = _DLManagedTensor()
    shape = (C.c_int64 * 1)(n)
    t = mt.dl_tensor
    t.data, t.ndim, t.shape, t.byte_offset = addr, 1, shape, 0
    t.device.device_type, t.device.device_id = device
    t.dtype.code, t.dtype.bits, t.dtype.lanes = _KDLUINT, 8, 1
    mt.deleter = _dl_delete
    _dl_live[C.addressof(mt)] = (mt, shape, owner)
    return _pyapi.PyCapsule_New(C.addressof(mt), b"dltensor",
                                C.cast(_dl_capsule_dtor, C.c_void_p))
