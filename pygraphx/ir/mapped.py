"""Literals that are views of memory-mapped files: giving their pages back to the page cache.

The ONNX frontend reads weights as read-only views of the mapped model file
(`onnx/mapped_model.py`, `onnx/external_data.py`). A page of such a view counts in the process's
resident memory once something has read it; a target that has made packed copies of the weights
(the cpu target's oneDNN and MKL layouts) no longer needs those pages, but they stay resident
while the mapping lives. `release_mapped` drops them: the kernel keeps them in its page cache
(reclaimable, shared with every other reader of the file), and a later read of the view faults
them back in, so the literals stay valid for save, re-compiles and any step that reads them.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

#: id -> a read-only np.memmap of a whole model file (registered by the frontend)
_ROOTS: weakref.WeakValueDictionary[int, np.memmap] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def register_mapping(root: np.memmap) -> None:
    """Record `root`, a read-only mapping of a whole file, so that `release_range` may drop
    pages inside it (no other memory is ever released: on anonymous memory that would lose
    data)."""
    with _LOCK:
        _ROOTS[id(root)] = root


def release_range(address: int, nbytes: int) -> int:
    """Drop the whole pages of [address, address + nbytes) from resident memory when they lie
    in a registered file mapping (see the module docstring); returns the bytes released (0
    for memory that is not such a mapping)."""
    with _LOCK:
        roots = list(_ROOTS.values())
    for root in roots:
        raw = root.base
        start = root.ctypes.data
        if not isinstance(raw, mmap.mmap) or raw.closed or not start <= address < start + len(raw):
            continue
        lo = -(-(address - start) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = min(address + nbytes - start, len(raw)) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi <= lo or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        raw.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return hi - lo
    return 0


def release_mapped(arrays: Iterable[np.ndarray]) -> int:
    """Drop the pages of the files that `arrays` (views of mapped model files) map from this
    process's resident memory: they stay in the page cache, and a later read faults them back
    in. Returns the bytes of mapping released. Used once the weights have been packed into
    copies of their own, so that the process does not hold both."""
    roots: dict[int, mmap.mmap] = {}
    for array in arrays:
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, mmap.mmap):
            roots[id(base)] = base
    released = 0
    for raw in roots.values():
        if hasattr(raw, "madvise") and hasattr(mmap, "MADV_DONTNEED") and not raw.closed:
            raw.madvise(mmap.MADV_DONTNEED)
            released += len(raw)
    return released


def release_weight_pages(program: Program) -> int:
    """After lowering: drop the pages of the mapped model file that this process has read (the
    passes and the weight packing read every weight once) from its resident memory. The
    literals stay views of the file (save and the dynamic re-compiles read them again); the
    weights the steps use as they are fault back in from the page cache on the first run, the
    packed ones are never read again. Returns the bytes of mapping released."""
    arrays = [
        ins.get_literal().array
        for module in program.modules.values()
        for ins in module.instructions
        if ins.is_literal()
    ]
    return release_mapped(arrays)


__all__ = ["register_mapping", "release_mapped", "release_range", "release_weight_pages"]
