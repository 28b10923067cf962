"""oneDNN's own C API through `ctypes`: the library, its constants, and a few safe wrappers.

torch links oneDNN statically and exports none of its C API, so this module loads the library
of oneDNN's own PyPI package (`pip install onednn-cpu-gomp`, the optional extra
`pygraphx[onednn]`): its `libdnnl.so.3` lands in `<prefix>/lib`. `PGX_ONEDNN_LIB` names
another file (or the folder holding it). The library is optional: `library()` returns None,
and says why once on the `pygraphx.cpu` logger, when it cannot be loaded.

The GNU OpenMP build is the one taken, and torch is imported first: the library's `libgomp.so.1`
is then the one torch already loaded (torch's wheel ships it under that name), so oneDNN's
parallel regions use torch's one pool of worker threads and `torch.set_num_threads` sets its
thread count too (`openmp_shared()` checks this; `benchmarks/onednn_conv_probe.py` measures it).

The values of the constants are those of oneDNN 3.x's headers (`dnnl_types.h`,
`dnnl_common_types.h`), stable across its 3.x releases.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_void_p
from pathlib import Path

import torch

from pygraphx.targets.native.openmp import openmp_runtimes, openmp_shared

log = logging.getLogger("pygraphx.cpu")

LIB_ENV = "PGX_ONEDNN_LIB"
LIB_NAME = "libdnnl.so.3"

# --- constants (oneDNN 3.x) ------------------------------------------------------------------
SUCCESS = 0
LAST_IMPL_REACHED = 4  # dnnl_last_impl_reached: `dnnl_primitive_desc_next_impl` at the end
F32, BF16 = 3, 2
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT = 1
POOLING_MAX, POOLING_AVG_INCLUDE, POOLING_AVG_EXCLUDE = 0x1FF, 0x2FF, 0x3FF
ELTWISE_RELU, ELTWISE_SWISH, ELTWISE_CLIP = 0x20, 0x2C, 0x2E
BINARY_ADD = 0x1FFF0
TAG_ANY, TAG_A, TAG_AB, TAG_ABC, TAG_NCHW, TAG_NHWC = 1, 2, 3, 4, 5, 22
TAG_OIHW, TAG_GOIHW = 5, 6
#: the tensor types the primitives here run in, and oneDNN's names
DTYPES = {torch.float32: F32, torch.bfloat16: BF16}
CPU_ENGINE = 1
STREAM_DEFAULT = 1
SCRATCHPAD_USER = 1
QUERY_IMPL_INFO_STR = 8
QUERY_WEIGHTS_MD, QUERY_SCRATCHPAD_MD = 131, 136
ARG_SRC, ARG_SRC_1, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 2, 17, 33, 41, 80
ARG_FROM, ARG_TO = 1, 17
POST_OP_BASE = 32768
POST_OP_DW = 16384  # DNNL_ARG_ATTR_POST_OP_DW: the fused depthwise convolution's arguments
QUERY_EXEC_ARG_MD = 255
DATA_UNDEF = 0
MAX_NDIMS = 12

Dims = c_int64 * MAX_NDIMS
Handle = c_void_p


class ExecArg(ctypes.Structure):
    """`dnnl_exec_arg_t`: an argument index and its memory object."""

    _fields_ = [("arg", c_int), ("memory", c_void_p)]


class OneDnnError(RuntimeError):
    """A oneDNN C API call that did not return `dnnl_success`."""


def post_op_arg(index: int, arg: int) -> int:
    """`DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | arg`: a binary post-op's operand."""
    return POST_OP_BASE * (index + 1) | arg


# name -> (restype, argtypes); every other function returns dnnl_status_t
_P = c_void_p
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "dnnl_engine_create": (c_int, [POINTER(_P), c_int, c_size_t]),
    "dnnl_stream_create": (c_int, [POINTER(_P), _P, c_int]),
    "dnnl_memory_desc_create_with_tag": (c_int, [POINTER(_P), c_int, Dims, c_int, c_int]),
    "dnnl_memory_desc_destroy": (c_int, [_P]),
    "dnnl_memory_desc_get_size": (c_size_t, [_P]),
    "dnnl_memory_desc_equal": (c_int, [_P, _P]),
    "dnnl_memory_create": (c_int, [POINTER(_P), _P, _P, _P]),
    "dnnl_memory_set_data_handle": (c_int, [_P, _P]),
    "dnnl_memory_destroy": (c_int, [_P]),
    "dnnl_primitive_attr_create": (c_int, [POINTER(_P)]),
    "dnnl_primitive_attr_destroy": (c_int, [_P]),
    "dnnl_primitive_attr_set_scratchpad_mode": (c_int, [_P, c_int]),
    "dnnl_primitive_attr_set_post_ops": (c_int, [_P, _P]),
    "dnnl_post_ops_create": (c_int, [POINTER(_P)]),
    "dnnl_post_ops_destroy": (c_int, [_P]),
    "dnnl_post_ops_append_sum": (c_int, [_P, c_float, c_int32, c_int]),
    "dnnl_post_ops_append_eltwise": (c_int, [_P, c_int, c_float, c_float]),
    "dnnl_post_ops_append_binary": (c_int, [_P, c_int, _P]),
    "dnnl_post_ops_append_dw": (c_int, [_P, c_int, c_int, c_int, c_int64, c_int64, c_int64]),
    "dnnl_convolution_forward_primitive_desc_create": (
        c_int,
        [POINTER(_P), _P, c_int, c_int, _P, _P, _P, _P, Dims, Dims, Dims, Dims, _P],
    ),
    "dnnl_pooling_forward_primitive_desc_create": (
        c_int,
        [POINTER(_P), _P, c_int, c_int, _P, _P, Dims, Dims, Dims, Dims, Dims, _P],
    ),
    "dnnl_reorder_primitive_desc_create": (c_int, [POINTER(_P), _P, _P, _P, _P, _P]),
    "dnnl_primitive_desc_query": (c_int, [_P, c_int, c_int, _P]),
    "dnnl_primitive_desc_next_impl": (c_int, [_P]),
    "dnnl_get_primitive_cache_capacity": (c_int, [POINTER(c_int)]),
    "dnnl_set_primitive_cache_capacity": (c_int, [c_int]),
    "dnnl_primitive_desc_query_md": (_P, [_P, c_int, c_int]),
    "dnnl_primitive_desc_destroy": (c_int, [_P]),
    "dnnl_primitive_create": (c_int, [POINTER(_P), _P]),
    "dnnl_primitive_destroy": (c_int, [_P]),
    "dnnl_primitive_execute": (c_int, [_P, _P, c_int, POINTER(ExecArg)]),
}

_state: dict[str, object] = {}


def _candidates() -> list[Path]:
    raw = os.environ.get(LIB_ENV)
    if raw:
        path = Path(raw)
        return [path / LIB_NAME if path.is_dir() else path]
    prefixes = dict.fromkeys([sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX", "")])
    return [Path(p) / "lib" / LIB_NAME for p in prefixes if p]


def library() -> ctypes.CDLL | None:
    """The loaded oneDNN library with its signatures set, or None (said once) without it."""
    if "lib" in _state:
        return _state["lib"]  # type: ignore[return-value]
    lib, why = None, ""
    paths = [p for p in _candidates() if p.exists()]
    if not paths:
        why = f"{LIB_NAME} not found ({LIB_ENV} or `pip install onednn-cpu-gomp`)"
    for path in paths[:1]:
        try:
            lib = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
        except (OSError, AttributeError) as exc:
            lib, why = None, f"cannot load {path}: {exc}"
        if lib is not None and not openmp_shared():  # two thread pools would fight for cores
            runtimes = ", ".join(openmp_runtimes())
            lib, why = None, f"two OpenMP runtimes in this process ({runtimes}), not one shared"
    if lib is None:
        log.info("oneDNN C API unavailable: %s", why)
    _state["lib"], _state["why"] = lib, why
    return lib


def unavailable_reason() -> str:
    """Why `library()` is None ('' when it loaded)."""
    library()
    return str(_state.get("why", ""))


def check(status: int, what: str) -> None:
    """Raise `OneDnnError` naming `what` unless `status` is success."""
    if status != SUCCESS:
        raise OneDnnError(f"oneDNN {what} failed (dnnl_status_t {status})")


class Runtime:
    """The library with one CPU engine and one in-order stream (made once per process)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.engine, self.stream = c_void_p(), c_void_p()
        check(lib.dnnl_engine_create(byref(self.engine), CPU_ENGINE, 0), "engine_create")
        check(lib.dnnl_stream_create(byref(self.stream), self.engine, STREAM_DEFAULT), "stream")

    def desc(self, dims: list[int], dtype: int, tag: int) -> c_void_p:
        """A new memory descriptor (the caller destroys it)."""
        md = c_void_p()
        check(
            self.lib.dnnl_memory_desc_create_with_tag(
                byref(md), len(dims), Dims(*dims), dtype, tag
            ),
            f"memory_desc_create{tuple(dims)}",
        )
        return md

    def memory(self, md: c_void_p, data: int | None) -> c_void_p:
        """A memory object of descriptor `md` over the buffer at address `data`."""
        mem = c_void_p()
        check(self.lib.dnnl_memory_create(byref(mem), md, self.engine, data), "memory_create")
        return mem

    def primitive(self, pd: c_void_p) -> c_void_p:
        prim = c_void_p()
        check(self.lib.dnnl_primitive_create(byref(prim), pd), "primitive_create")
        return prim

    def impl_name(self, pd: c_void_p) -> str:
        """The implementation oneDNN picked for `pd` (e.g. 'brg_conv_fwd:avx512_core')."""
        name = c_char_p()
        status = self.lib.dnnl_primitive_desc_query(pd, QUERY_IMPL_INFO_STR, 0, byref(name))
        return name.value.decode() if status == SUCCESS and name.value else "?"

    def next_impl(self, pd: c_void_p) -> bool:
        """Move `pd` to oneDNN's next implementation of it (its own order of preference);
        False at the end (`pd` is then unchanged). In oneDNN 3.2 this does not advance while a
        primitive of the same descriptor is in the primitive cache: see `primitive_cache_off`."""
        status = self.lib.dnnl_primitive_desc_next_impl(pd)
        if status == LAST_IMPL_REACHED:
            return False
        check(status, "primitive_desc_next_impl")
        return True

    def reorder(self, src: torch.Tensor, src_md: c_void_p, dst_md: c_void_p) -> torch.Tensor:
        """`src` (laid out as `src_md`) copied into a new buffer laid out as `dst_md`."""
        dst = torch.empty(max(self.lib.dnnl_memory_desc_get_size(dst_md), 1), dtype=torch.uint8)
        Reorder(self, src_md, dst_md).run(src.data_ptr(), dst.data_ptr())
        return dst


class Reorder:
    """A reorder primitive made once: `run` copies a buffer laid out as `src_md` into one
    laid out as `dst_md` (the oneDNN objects are destroyed with it)."""

    def __init__(self, rt: Runtime, src_md: c_void_p, dst_md: c_void_p) -> None:
        self.rt, lib = rt, rt.lib
        self.pd, self.prim, self.mems = c_void_p(), None, []
        check(
            lib.dnnl_reorder_primitive_desc_create(
                byref(self.pd), src_md, rt.engine, dst_md, rt.engine, None
            ),
            "reorder_primitive_desc_create",
        )
        self.prim = rt.primitive(self.pd)
        self.mems = [rt.memory(src_md, None), rt.memory(dst_md, None)]
        self.args = (ExecArg * 2)(ExecArg(ARG_FROM, self.mems[0]), ExecArg(ARG_TO, self.mems[1]))

    def run(self, src: int, dst: int) -> None:
        """Copy from address `src` to address `dst`."""
        lib = self.rt.lib
        lib.dnnl_memory_set_data_handle(self.mems[0], src)
        lib.dnnl_memory_set_data_handle(self.mems[1], dst)
        check(lib.dnnl_primitive_execute(self.prim, self.rt.stream, 2, self.args), "reorder")

    def __del__(self) -> None:
        release(self.rt.lib, self.mems, self.prim, self.pd)


_CACHE_LOCK = threading.RLock()  # two compiles in two threads restore the capacity in turn


@contextmanager
def primitive_cache_off(lib: ctypes.CDLL) -> Iterator[None]:
    """oneDNN's primitive cache emptied and off inside the block, its capacity restored after
    (the cached primitives are only a speed-up of making the same primitive again)."""
    with _CACHE_LOCK:
        capacity = c_int()
        check(lib.dnnl_get_primitive_cache_capacity(byref(capacity)), "get_cache_capacity")
        check(lib.dnnl_set_primitive_cache_capacity(0), "set_primitive_cache_capacity")
        try:
            yield
        finally:
            check(lib.dnnl_set_primitive_cache_capacity(capacity.value), "set_cache_capacity")


def release(
    lib: ctypes.CDLL,
    mems: list[c_void_p],
    prim: c_void_p | None,
    pd: c_void_p | None,
    mds: list[c_void_p] | tuple[()] = (),
) -> None:
    """Destroy a primitive's oneDNN objects: memories, primitive, descriptor, memory descs."""
    for mem in mems:
        lib.dnnl_memory_destroy(mem)
    if prim is not None:
        lib.dnnl_primitive_destroy(prim)
    if pd is not None:
        lib.dnnl_primitive_desc_destroy(pd)
    for md in mds:
        lib.dnnl_memory_desc_destroy(md)


def runtime() -> Runtime | None:
    """The process's `Runtime`, or None without the library."""
    if "runtime" not in _state:
        lib = library()
        _state["runtime"] = None if lib is None else Runtime(lib)
    return _state["runtime"]  # type: ignore[return-value]


__all__ = [
    "LIB_ENV",
    "ExecArg",
    "OneDnnError",
    "Reorder",
    "Runtime",
    "check",
    "library",
    "openmp_shared",
    "post_op_arg",
    "primitive_cache_off",
    "release",
    "runtime",
    "unavailable_reason",
]


def declare_matmul(lib: object) -> None:
    """Declare `dnnl_matmul_primitive_desc_create`'s argument types (not among the functions
    this module declares; `onednn_bmm`, `onednn_linear` make matmul primitives)."""
    fn = lib.dnnl_matmul_primitive_desc_create
    fn.restype, fn.argtypes = c_int, [POINTER(c_void_p), *[c_void_p] * 6]
