"""Device copies of literals shared by every program lowered onto the same device.

A program with dynamic dimensions is parsed, optimised and compiled again for each input shape
it meets (`Program._specialized_for`); each specialization holds its own numpy literals. Lowered
onto a GPU, each would upload its own copy of the weights (15 GB per shape for a 7B decoder).
`LITERALS.tensor(array, device)` uploads a literal once and hands the same device tensor to every
later program that holds an equal literal:

- a literal whose memory is a view of a memory-mapped file (external data, see
  `onnx/external_data.py`) is identified by the file (path, size, modification time) and its
  byte offset, shape, strides and dtype: no bytes are read to look it up;
- a literal the passes concatenated from other literals (q/k/v or gate/up projections,
  `passes/derived_literals.py`, which makes each once for every specialization) by the keys of
  its sources and the axis: no bytes are read either;
- any other literal of at least `MIN_SHARED_BYTES` by its dtype, shape, strides and a SHA-256
  digest of its bytes, computed in `CHUNK_BYTES` pieces on a thread pool (hashlib releases the
  GIL; about 1 GB/s a core); smaller literals are uploaded per program.

Entries hold weak references: a device tensor lives while some lowered program uses it, and a
program lowered later uploads it again. Steps never write literals (they are inputs only), so
sharing one tensor between programs is safe.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from pygraphx.passes.derived_literals import sources_of
from pygraphx.targets.torch_lowering.dtypes import from_numpy

#: literals smaller than this are uploaded per program (hashing them saves nothing)
MIN_SHARED_BYTES = 4096
#: bytes hashed per task when digesting a large literal
CHUNK_BYTES = 32 << 20


def _mapped_root(array: np.ndarray) -> np.memmap | None:
    """The memory-mapped array `array`'s memory belongs to, if any."""
    base: Any = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and not isinstance(base.base, np.ndarray):
            return base
        base = base.base
    return None


def literal_key(array: np.ndarray) -> tuple[Any, ...] | None:
    """What identifies `array`'s values (see the module docstring); None: not shared."""
    layout = (array.dtype.str, array.shape, array.strides)
    root = _mapped_root(array)
    file = _file_identity(root) if root is not None else None
    if root is not None and file is not None:
        where = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return ("file", *file, root.offset + where, *layout)
    if array.nbytes < MIN_SHARED_BYTES:
        return None
    derived = sources_of(array)
    if derived is not None:
        parts = [_source_key(s) for s in derived[1]]
        if all(p is not None for p in parts):
            return ("concat", derived[0], *parts, *layout)
    return ("bytes", _digest(np.ascontiguousarray(array)), *layout)


def _source_key(array: np.ndarray) -> tuple[Any, ...] | None:
    """A derived literal's source by place: its file and offset, or (small sources, which
    `literal_key` leaves unshared) the digest of its bytes; None: a source with neither."""
    key = literal_key(array)
    if key is None and array.nbytes < MIN_SHARED_BYTES:
        return ("small", _digest(np.ascontiguousarray(array)), array.dtype.str, array.shape)
    return key


def _file_identity(root: np.memmap) -> tuple[str, int, int] | None:
    """(path, size, modification time) of the file `root` maps, as they were when it was mapped
    (`external_data.py` records them: a file replaced or deleted since then must not lend its
    new identity to the old bytes), else as they are now; None: the file is gone."""
    recorded = getattr(root, "pygraphx_file", None)
    if recorded is not None:
        return recorded
    if root.filename is None:
        return None
    try:
        stat = os.stat(root.filename)
    except OSError:
        return None
    return (root.filename, stat.st_size, stat.st_mtime_ns)


def _digest(array: np.ndarray) -> bytes:
    """SHA-256 of the digests of `array`'s bytes in `CHUNK_BYTES` pieces."""
    data = memoryview(array.reshape(-1).view(np.uint8))
    pieces = [data[k : k + CHUNK_BYTES] for k in range(0, len(data), CHUNK_BYTES)]
    if len(pieces) == 1:
        return hashlib.sha256(data).digest()
    with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1)) as pool:
        parts = pool.map(lambda m: hashlib.sha256(m).digest(), pieces)
        return hashlib.sha256(b"".join(parts)).digest()


class LiteralStore:
    """See the module docstring. `uploads` and `hits` count what `tensor` did."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], weakref.ref[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.uploads = 0
        self.hits = 0
        self._prune_at = 256

    def tensor(self, array: np.ndarray, device: torch.device) -> torch.Tensor:
        """`array` on `device`: the tensor uploaded for an equal literal when one is alive."""
        key = literal_key(array)
        if key is None:
            return _upload(array, device)
        key = (str(device), *key)
        with self._lock:
            ref = self._entries.get(key)
            found = ref() if ref is not None else None
            if found is not None:
                self.hits += 1
                return found
            t = _upload(array, device)
            self.uploads += 1
            self._entries[key] = weakref.ref(t)
            if len(self._entries) > self._prune_at:  # drop dead entries now and then
                self._entries = {k: r for k, r in self._entries.items() if r() is not None}
                self._prune_at = max(256, 2 * len(self._entries))
            return t

    def __len__(self) -> int:
        """Literals held on some device now."""
        return sum(1 for r in self._entries.values() if r() is not None)


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    t = from_numpy(array)
    return t if t.device == device else t.to(device)


#: the store every lowering shares (see `lower.literal_tensor`)
LITERALS = LiteralStore()

__all__ = ["LITERALS", "MIN_SHARED_BYTES", "LiteralStore", "literal_key"]
