"""mapflow._clib — the binding's view of libmapflow in C terms: the ctypes mirrors of the
structs mapflow.h declares (checked against the library's own layout, mf_abi_layout, at
import by mapflow._check_abi), the functions' prototypes, and finding and loading the
library (the order is in mapflow's docstring). Everything else in the package uses it
through the names mapflow re-exports.

Thread safety: loaded once at import; read-only afterwards.
"""

from __future__ import annotations

import ctypes as C
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

_SONAME = "libmapflow.so.0"


# ==== C types (client/mapflow.h, proto/mf_row.h) ========================================

class _Hash(C.Structure):
    _c_type_ = "mf_hash128_t"
    _fields_ = [("lo", C.c_uint64), ("hi", C.c_uint64)]


class _RowView(C.Structure):
    _c_type_ = "mf_row_view_t"
    _fields_ = [("base", C.c_void_p), ("size", C.c_size_t), ("codec", C.c_int),
                ("layer", C.c_uint32), ("block_index", C.c_uint32),
                ("block_size", C.c_uint32), ("n_heads", C.c_uint32), ("n_cols", C.c_uint32),
                ("n_entries", C.c_uint32), ("top_p", C.c_float), ("model", C.c_void_p),
                ("model_len", C.c_uint32), ("parent", _Hash), ("hash", _Hash),
                ("tokens", C.c_void_p), ("cols", C.c_void_p), ("col_off", C.c_void_p),
                ("head_mask", C.c_void_p), ("mass", C.c_void_p), ("scales", C.c_void_p),
                ("tiles", C.c_void_p), ("tile_bytes", C.c_size_t)]


class _RowRef(C.Structure):
    _c_type_ = "mf_row_ref_t"
    _fields_ = [("status", C.c_int), ("layer", C.c_uint32), ("block", C.c_uint32),
                ("tier", C.c_int), ("data", C.c_void_p), ("length", C.c_size_t),
                ("lease_id", C.c_uint64), ("view", _RowView), ("on_device", C.c_int),
                ("gpu_arena", C.c_uint32)]


class _GetResult(C.Structure):
    _c_type_ = "mf_get_result_t"
    _fields_ = [("n_rows", C.c_size_t), ("rows", C.POINTER(_RowRef)),
                ("lease_ttl_ms", C.c_uint64), ("priv_", C.c_void_p)]


class _RowColumns(C.Structure):
    _c_type_ = "mf_row_columns_t"
    _fields_ = [("cap", C.c_size_t), ("status", C.c_void_p), ("layer", C.c_void_p),
                ("block", C.c_void_p), ("tier", C.c_void_p), ("data", C.c_void_p),
                ("length", C.c_void_p), ("lease_id", C.c_void_p), ("on_device", C.c_void_p),
                ("gpu_arena", C.c_void_p)]


class _Key(C.Structure):
    _c_type_ = "mf_key_t"
    _fields_ = [("model", C.c_char_p), ("layer", C.c_uint32), ("hash", _Hash)]


class _Retry(C.Structure):
    _c_type_ = "mf_retry_policy_t"
    _fields_ = [("max_retries", C.c_uint32), ("initial_backoff_ms", C.c_uint32),
                ("max_backoff_ms", C.c_uint32), ("multiplier", C.c_float),
                ("jitter", C.c_float)]


class _Params(C.Structure):
    _c_type_ = "mf_channel_params_t"
    _fields_ = [("field_mask", C.c_uint64), ("ns", C.c_char_p), ("token", C.c_char_p),
                ("client_name", C.c_char_p), ("want_arena", C.c_int),
                ("timeout_ms", C.c_int64), ("max_frame", C.c_uint32), ("retry", _Retry),
                ("verify", C.c_int), ("gpu_device", C.c_int), ("admin_token", C.c_char_p)]


class _GpuArenaInfo(C.Structure):
    _c_type_ = "mf_gpu_arena_info_t"
    _fields_ = [("index", C.c_uint32), ("bytes", C.c_uint64), ("mapped", C.c_int),
                ("device", C.c_int), ("peer", C.c_int), ("pci_bus_id", C.c_char * 32),
                ("why", C.c_char * 256)]


class _GpuInfo(C.Structure):
    _c_type_ = "mf_gpu_info_t"
    _fields_ = [("gpu_device", C.c_int), ("driver", C.c_int), ("why", C.c_char * 256),
                ("n_announced", C.c_uint32), ("n_mapped", C.c_uint32), ("n_peer", C.c_uint32),
                ("arenas", _GpuArenaInfo * 16), ("host_arena_pinned", C.c_int)]


class _Info(C.Structure):
    _c_type_ = "mf_server_info_t"
    _fields_ = [("daemon_version", C.c_char_p), ("session_id", C.c_uint64),
                ("host_arena_bytes", C.c_uint64), ("max_frame", C.c_uint32),
                ("max_batch", C.c_uint32), ("gpu_tier", C.c_int), ("connected", C.c_int),
                ("reconnects", C.c_uint64), ("in_flight", C.c_size_t)]


class _PutResult(C.Structure):
    _c_type_ = "mf_put_result_t"
    _fields_ = [("tier", C.c_int), ("durable", C.c_int), ("replaced", C.c_int)]


class _PutItem(C.Structure):
    _c_type_ = "mf_put_item_t"
    _fields_ = [("row", C.c_void_p), ("len", C.c_size_t), ("status", C.c_int),
                ("result", _PutResult)]


class _PutRegionParams(C.Structure):
    _c_type_ = "mf_put_region_params_t"
    _fields_ = [("field_mask", C.c_uint64), ("gpu_arena", C.c_uint32),
                ("capacities", C.c_int)]


class _PutRegionResult(C.Structure):
    _c_type_ = "mf_put_region_result_t"
    _fields_ = [("committed", C.c_size_t), ("replaced", C.c_size_t),
                ("first_failed", C.c_size_t), ("checked_on_gpu", C.c_int)]


class _Lease(C.Structure):
    _c_type_ = "mf_lease_t"
    _fields_ = [("data", C.c_void_p), ("length", C.c_size_t), ("lease_id", C.c_uint64),
                ("view", _RowView), ("ttl_ms", C.c_uint64), ("on_device", C.c_int),
                ("gpu_arena", C.c_uint32)]


class _Entry(C.Structure):
    _c_type_ = "mf_entry_info_t"
    _fields_ = [("model", C.c_char * 256), ("layer", C.c_uint32), ("hash", _Hash),
                ("block", C.c_uint32), ("size", C.c_uint64), ("tier", C.c_int),
                ("on_ssd", C.c_int), ("pins", C.c_uint32), ("last_access_ms", C.c_uint64)]


class _ListPage(C.Structure):
    _c_type_ = "mf_list_page_t"
    _fields_ = [("n_entries", C.c_size_t), ("entries", C.POINTER(_Entry)),
                ("next_page_token", C.POINTER(C.c_uint8)), ("next_page_token_len", C.c_size_t)]


class _ProfileInfo(C.Structure):
    _c_type_ = "mf_profile_info_t"
    _fields_ = [("source_model", C.c_char * 256), ("target_model", C.c_char * 256),
                ("block_size", C.c_uint32), ("l0", C.c_uint32), ("target_layers", C.c_uint32),
                ("mapped_layers", C.c_uint32), ("created_by", C.c_char_p),
                ("encoded_bytes", C.c_uint64)]


class _ProfilePage(C.Structure):
    _c_type_ = "mf_profile_page_t"
    _fields_ = [("n_profiles", C.c_size_t), ("profiles", C.POINTER(_ProfileInfo)),
                ("next_page_token", C.POINTER(C.c_uint8)), ("next_page_token_len", C.c_size_t)]


class _TierStats(C.Structure):
    _c_type_ = "mf_tier_stats_t"
    _fields_ = [("tier", C.c_int), ("enabled", C.c_int), ("used_bytes", C.c_uint64),
                ("capacity_bytes", C.c_uint64), ("entries", C.c_uint64),
                ("why_off", C.c_char * 128)]


class _Counter(C.Structure):
    _c_type_ = "mf_counter_t"
    _fields_ = [("name", C.c_char_p), ("value", C.c_uint64)]


class _Stats(C.Structure):
    _c_type_ = "mf_stats_t"
    _fields_ = [("n_tiers", C.c_size_t), ("tiers", C.POINTER(_TierStats)),
                ("n_counters", C.c_size_t), ("counters", C.POINTER(_Counter)),
                ("uptime_ms", C.c_uint64), ("connections", C.c_uint32)]


class _ConfigItem(C.Structure):
    _c_type_ = "mf_config_item_t"
    _fields_ = [("key", C.c_char_p), ("value", C.c_char_p), ("live", C.c_int)]


class _Health(C.Structure):
    _c_type_ = "mf_health_t"
    _fields_ = [("ok", C.c_int), ("ready", C.c_int), ("status", C.c_char * 256),
                ("n_tiers", C.c_size_t), ("tiers", _TierStats * 4)]


class _Event(C.Structure):
    _c_type_ = "mf_cq_event_t"
    _fields_ = [("type", C.c_int), ("tag", C.c_void_p), ("status", C.c_int),
                ("message", C.c_char * 256)]



class _AbiField(C.Structure):
    _c_type_ = "mf_abi_field_t"
    _fields_ = [("type", C.c_char_p), ("member", C.c_char_p), ("offset", C.c_uint32),
                ("size", C.c_uint32)]


# Every C type the binding lays out itself, checked against mf_abi_layout() at import
# (enums are passed as C int).
_MIRRORS = [_AbiField, _Hash, _RowView, _RowRef, _GetResult, _RowColumns, _Key, _Retry,
            _Params, _GpuArenaInfo, _GpuInfo, _Info, _PutResult, _PutItem, _PutRegionParams,
            _PutRegionResult, _Lease, _Entry, _ListPage,
            _ProfileInfo, _ProfilePage, _TierStats, _Counter, _Stats, _ConfigItem, _Health, _Event] + [
    type("_Enum", (C.c_int,), {"_c_type_": t})
    for t in ("mf_status_t", "mf_tier_t", "mf_codec_t", "mf_verify_t", "mf_get_mode_t",
              "mf_cq_event_type_t")]

_P = C.c_void_p
_U32P = C.POINTER(C.c_uint32)
_ASYNC = [_P, _P, C.POINTER(_P)]  # cq, tag, call
_PROTOS = {
    "mf_version": (C.c_char_p, []),
    "mf_abi_layout": (C.POINTER(_AbiField), [C.POINTER(C.c_size_t)]),
    "mf_status_name": (C.c_char_p, [C.c_int]),
    "mf_status_valid": (C.c_int, [C.c_int]),
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
    "mf_put_region_begin": (C.c_int, [_P, C.c_char_p, C.c_uint32, C.POINTER(C.c_size_t),
                                      C.c_size_t, C.c_uint, C.POINTER(_PutRegionParams),
                                      C.POINTER(_P), C.POINTER(_P), C.c_int64]),
    "mf_put_region_row": (_P, [_P, C.c_size_t]),
    "mf_put_region_rows": (C.c_size_t, [_P]),
    "mf_put_region_set_lengths": (C.c_int, [_P, C.POINTER(C.c_size_t), C.c_size_t]),
    "mf_put_region_commit": (C.c_int, [_P, C.POINTER(C.c_int), C.POINTER(_PutRegionResult),
                                       C.c_int64]),
    "mf_put_region_abort": (C.c_int, [_P, C.c_int64]),
    "mf_put_region_free": (None, [_P]),
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
    "mf_get_result_columns": (C.c_int, [C.POINTER(_GetResult), C.POINTER(_RowColumns)]),
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
    "mf_profile_list": (C.c_int, [_P, C.c_uint32, _P, C.c_size_t,
                                  C.POINTER(C.POINTER(_ProfilePage)), C.c_int64]),
    "mf_profile_page_free": (None, [C.POINTER(_ProfilePage)]),
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


def _candidates(soname: str = _SONAME, env: Optional[str] = "MAPFLOW_LIB") -> List[str]:
    """Where a library of the project is looked for, in order (see the module docstring).
    $env, when set, is the only place: an override must not fall back to another library.
    (mapflow.kernels finds libmfkernels_*.so the same way.)"""
    if env and os.environ.get(env):
        return [os.environ[env]]
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, soname)]
    tree = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    if os.path.exists(os.path.join(tree, "client", "mapflow.h")):  # client/python/mapflow
        cands.append(os.path.join(tree, "build", "lib", soname))
    try:
        from . import _config  # written by make install / setup.py, absent in the tree
        cands += [os.path.join(d, soname) for d in _config.LIBDIRS]
    except ImportError:
        pass
    return cands + [soname]


def _dlopen(cands: Sequence[str], what: str, hint: str) -> Tuple[C.CDLL, str]:
    """The first of cands that loads (a name without a slash goes to the system loader);
    ImportError listing every try, and hint, when none does."""
    tried = []
    for cand in cands:
        if os.sep in cand and not os.path.exists(cand):
            tried.append("%s: no such file" % cand)
            continue
        try:
            return C.CDLL(cand), cand
        except OSError as e:
            tried.append("%s: %s" % (cand, e))
    raise ImportError("mapflow: cannot load %s; tried %s%s" % (what, "; ".join(tried), hint))


def _load() -> Tuple[C.CDLL, str]:
    lib, cand = _dlopen(_candidates(), "libmapflow",
                        "" if os.environ.get("MAPFLOW_LIB") else
                        " (MAPFLOW_LIB=PATH names the libmapflow.so.0 to use)")
    for name, (res, args) in _PROTOS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError("mapflow: %s has no %s: a libmapflow older than this binding"
                              % (cand, name)) from None
        f.restype = res
        f.argtypes = args
    return lib, cand


_lib, _lib_path = _load()


def _abi_mismatches(entries: Dict[str, List[Tuple[str, int, int]]],
                    mirrors: Sequence[type]) -> List[str]:
    """What differs between the library's layout ({type: [(member, offset, size)]}, the
    type's own entry first with member "") and the ctypes mirrors (classes with _c_type_)."""
    bad = []
    for cls in mirrors:
        lib = entries.get(cls._c_type_)
        if lib is None:
            bad.append("%s: not in the library's layout" % cls._c_type_)
            continue
        if issubclass(cls, C.Structure):
            mine = [("", 0, C.sizeof(cls))] + [
                (f[0], getattr(cls, f[0]).offset, getattr(cls, f[0]).size)
                for f in cls._fields_]
        else:
            mine = [("", 0, C.sizeof(cls))]
        if mine != lib:
            diff = [("%s: %s" % (m[0] or "sizeof", "offset %d size %d here" % m[1:]
                                 if m else "absent here")) +
                    (", offset %d size %d in the library" % l[1:] if l else ", absent there")
                    for m, l in _zip_longest(mine, lib) if m != l]
            bad.append("%s (%s)" % (cls._c_type_, "; ".join(diff[:3])))
    return bad


def _zip_longest(a, b):
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


def _lib_layout(layout_fn: Optional[Callable] = None) -> Dict[str, List[Tuple[str, int, int]]]:
    """{type: [(member, offset, size)]} from mf_abi_layout, or from layout_fn (a function
    of that signature: mf_kernels_abi_layout of the kernel libraries)."""
    n = C.c_size_t()
    p = (layout_fn or _lib.mf_abi_layout)(C.byref(n))
    out: Dict[str, List[Tuple[str, int, int]]] = {}
    for i in range(n.value):
        f = p[i]
        out.setdefault(f.type.decode(), []).append((f.member.decode(), f.offset, f.size))
    return out
