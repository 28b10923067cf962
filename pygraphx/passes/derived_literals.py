"""Weights the passes derive from other literals, made once and shared by every specialization.

A program with dynamic dimensions is parsed and optimised again for each input shape it meets;
`fuse_horizontal_dots` concatenates the q/k/v (or gate/up) weights of each layer for every one of
them. `concatenate(arrays, axis)` makes each such concatenation once: while its result lives,
a later call on the same source memory returns that very array (a 7B decoder's ~8.5 GB of fused
weights exist once, not once per compiled shape), and `sources_of(result)` names what it was
made from, so a device store can identify the result by its sources (a file and offset for
memory-mapped weights) instead of hashing its bytes.

Sources are matched by where their bytes are (address, shape, strides, dtype), which is safe only
while that memory cannot change: every source's memory must belong to a read-only root (the
read-only mapping of an external data file, or a `Literal`'s own read-only array); otherwise
the concatenation is made afresh and not recorded. A record holds its sources (so their memory
stays where it is) and lives exactly as long as its result.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

_Key = tuple[Any, ...]

_LOCK = threading.Lock()
#: source layouts + axis -> the concatenation (alive while some program holds it)
_MEMO: weakref.WeakValueDictionary[_Key, np.ndarray] = weakref.WeakValueDictionary()
#: id(result) -> (a weak reference to it, axis, the source arrays)
_SOURCES: dict[int, tuple[weakref.ref[np.ndarray], int, tuple[np.ndarray, ...]]] = {}


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns `array`'s memory (the end of its chain of bases)."""
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base


def _frozen(array: np.ndarray) -> bool:
    """Whether nobody can write `array`'s memory through numpy (it and its root read-only)."""
    return not array.flags.writeable and not _root(array).flags.writeable


def _where(array: np.ndarray) -> _Key:
    return (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)


def concatenate(arrays: list[np.ndarray], axis: int) -> np.ndarray:
    """`np.concatenate(arrays, axis)` (C order, read-only), the same array object for the same
    read-only sources while an earlier result lives (see the module docstring)."""
    if not arrays or not all(isinstance(a, np.ndarray) and _frozen(a) for a in arrays):
        return np.ascontiguousarray(np.concatenate(arrays, axis=axis))
    key = (axis % arrays[0].ndim, *(_where(a) for a in arrays))
    with _LOCK:
        found = _MEMO.get(key)
        if found is not None:
            return found
    result = np.ascontiguousarray(np.concatenate(arrays, axis=axis))
    result.flags.writeable = False
    with _LOCK:
        found = _MEMO.get(key)  # another thread made it meanwhile: keep one
        if found is not None:
            return found
        rid = id(result)
        _SOURCES[rid] = (
            weakref.ref(result, lambda _r: _SOURCES.pop(rid, None)),
            key[0],
            tuple(arrays),
        )
        _MEMO[key] = result
    return result


def sources_of(array: np.ndarray) -> tuple[int, tuple[np.ndarray, ...]] | None:
    """(axis, sources) when `array` is a live result of `concatenate`, else None."""
    with _LOCK:
        entry = _SOURCES.get(id(array))
    if entry is None or entry[0]() is not array:
        return None
    return entry[1], entry[2]


def live_results() -> int:
    """Concatenations alive now (tests and memory reports)."""
    with _LOCK:
        return sum(1 for ref, _, _ in _SOURCES.values() if ref() is not None)


__all__ = ["concatenate", "live_results", "sources_of"]
