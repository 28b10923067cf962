"""A oneDNN primitive that reads one source tensor and writes one destination, run with only
their addresses changing (pooling `onednn_pool.py`, resampling `onednn_resample.py`,
deconvolution `onednn_deconv.py`), and the table of such primitives per thread count.

A subclass makes its primitive descriptor into `self.pd` (after `start`), then calls `bind`:
oneDNN's reference kernel is refused (`OneDnnError`: the caller keeps torch's kernel), the
primitive, its user scratchpad and its memories are made (source and destination unbound;
constant operands, a packed weight or a bias, bound once), and `execute(x, y)` points the two
memories at new addresses only when they moved (a run's tensors often land where the last did).
oneDNN fixes a primitive's thread count when it is made, so `PerThreadCount` keeps one per count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from ctypes import byref, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_DST,
    ARG_SCRATCHPAD,
    ARG_SRC,
    QUERY_SCRATCHPAD_MD,
    SCRATCHPAD_USER,
    ExecArg,
    OneDnnError,
    Runtime,
    check,
    release,
)

log = logging.getLogger("pygraphx.cpu")
_SAID: set[str] = set()


def warn_once(key: str, message: str, *args: object) -> None:
    """A warning on the `pygraphx.cpu` logger, once per process per `key` (a layer that falls
    back from a oneDNN primitive to torch's kernel)."""
    if key not in _SAID:
        _SAID.add(key)
        log.warning(message, *args)


@contextmanager
def scratchpad_attr(lib: object) -> Iterator[c_void_p]:
    """A primitive attribute with a user scratchpad (`SourceToDest.bind` allocates it),
    destroyed on leaving."""
    attr = c_void_p()
    try:
        check(lib.dnnl_primitive_attr_create(byref(attr)), "primitive_attr_create")
        check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, SCRATCHPAD_USER), "scratch")
        yield attr
    finally:
        if attr.value:
            lib.dnnl_primitive_attr_destroy(attr)


class SourceToDest:
    """One primitive from a source to a destination (module docstring); its oneDNN objects
    are destroyed with it."""

    what = "primitive"

    def start(self, rt: Runtime) -> None:
        """Set the (empty) handles: call first in a subclass's `__init__`."""
        self.rt = rt
        self.pd, self.prim, self.mems = c_void_p(), None, []

    def bind(self, name: str, src_md: c_void_p, dst_md: c_void_p,
             constants: Sequence[tuple[int, c_void_p, int]] = ()) -> None:  # fmt: skip
        """After `self.pd` is made: refuse a reference kernel (`name` says which layer), make
        the primitive, scratchpad and memories; `constants`: (argument, md, address) bound
        once."""
        rt, lib = self.rt, self.rt.lib
        self.refuse_reference(name)
        self.prim = rt.primitive(self.pd)
        scratch_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_SCRATCHPAD_MD, 0)
        size = lib.dnnl_memory_desc_get_size(scratch_md)
        self.scratch = torch.empty(max(size, 1), dtype=torch.uint8)
        kinds = [ARG_SRC, ARG_DST, ARG_SCRATCHPAD, *(arg for arg, _, _ in constants)]
        self.mems = [rt.memory(src_md, None), rt.memory(dst_md, None),
                     rt.memory(scratch_md, self.scratch.data_ptr()),
                     *(rt.memory(md, address) for _, md, address in constants)]  # fmt: skip
        self.args = (ExecArg * len(kinds))(
            *(ExecArg(a, m) for a, m in zip(kinds, self.mems, strict=True))
        )
        self.addresses = [0, 0]
        self._execute, self._point = lib.dnnl_primitive_execute, lib.dnnl_memory_set_data_handle

    def refuse_reference(self, name: str) -> None:
        """`OneDnnError` where `self.pd` is oneDNN's reference kernel (call before costly work
        such as a weight reorder; `bind` calls it too)."""
        self.impl = self.rt.impl_name(self.pd)
        if self.impl.startswith("ref"):
            raise OneDnnError(f"{name}: oneDNN offers its reference kernel only ({self.impl})")

    def execute(self, x: int, y: int) -> None:
        """Run from the source at address `x` into the destination at address `y`."""
        for k, address in enumerate((x, y)):
            if self.addresses[k] != address:
                self._point(self.mems[k], address)
                self.addresses[k] = address
        check(self._execute(self.prim, self.rt.stream, len(self.args), self.args), self.what)

    def __del__(self) -> None:
        pd = getattr(self, "pd", None)
        if hasattr(self, "rt"):
            release(self.rt.lib, self.mems, self.prim, pd if pd is not None and pd.value else None)


class PerThreadCount:
    """A `SourceToDest` per thread count, the one of now made at once (`OneDnnError` when
    oneDNN cannot run it well); called with the channels-last source and destination."""

    def __init__(self, make: Callable[[], SourceToDest]) -> None:
        self.make = make
        first = make()
        self.impl = first.impl
        self.made = {torch.get_num_threads(): first}

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        n = torch.get_num_threads()
        prim = self.made.get(n)
        if prim is None:
            prim = self.made[n] = self.make()
        prim.execute(x.data_ptr(), y.data_ptr())


__all__ = ["PerThreadCount", "SourceToDest", "scratchpad_attr", "warn_once"]
