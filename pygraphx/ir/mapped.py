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
from collections.abc import Iterable

import numpy as np


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


__all__ = ["release_mapped"]
