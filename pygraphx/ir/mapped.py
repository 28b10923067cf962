"""Literals that are views of memory-mapped files: their files' identity, the bytes copied out of
them, and giving their pages back to the page cache.

The ONNX frontend reads weights as read-only views of the mapped model file
(`onnx/mapped_model.py`, `onnx/external_data.py`) through `map_file`, which records the file's
identity (device, inode, size, modification time) and keeps a descriptor of the mapped inode.

A mapping follows its file: a file rewritten in place (truncated and written again, what
`torch.onnx.export` or `onnx.save` to the same path do) changes the mapped weights, and a read
of a page past the new end of the file kills the process with SIGBUS. So:

- `detach_ranges` copies the bytes that a compiled program's steps read at run time (the
  weights used as they are, not packed: an embedding table, biases) out of the file *at the
  same addresses*: the copy is mapped and moved over the file's pages with one `mremap`, so
  every view, tensor and closure keeps working and no run reads the model file again, whatever
  happens to it. A large copy (`SPILL_BYTES` or more) goes to an unnamed file (`O_TMPFILE`)
  in the model's folder, filled by the kernel (`copy_file_range`): like the model file's, its
  pages are page cache, resident only where a run reads them (a gather touches a few rows of
  a table), and can be given back; a small one, or where the folder takes no such file
  (read-only), to anonymous memory. Linux only; elsewhere the bytes stay in the model file and
  `detach_ranges` says so.
- `check_unchanged` / `check_program` compare the mapped inode with its recorded identity
  before the weights are read again (a compile, a save, a detach) and raise `MappedFileChanged`,
  naming the file and what to do, instead of reading changed or missing pages.

A page of a view counts in the process's resident memory once something has read it; a target
that has made packed copies of the weights (the cpu target's oneDNN and MKL layouts) no longer
needs those pages, but they stay resident while the mapping lives. `release_mapped` drops them:
the kernel keeps them in its page cache (reclaimable, shared with every other reader of the
file), and a later read of the view faults them back in. Bytes copied into anonymous memory
are never released (that would lose them).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pygraphx.ir.program import ProgramError

try:  # numpy 2 moved it
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # numpy 1
    _byte_bounds = np.byte_bounds

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

log = logging.getLogger(__name__)

#: id -> a read-only np.memmap of a whole model file (registered by the frontend)
_ROOTS: weakref.WeakValueDictionary[int, np.memmap] = weakref.WeakValueDictionary()
#: (path, device, inode, size, mtime) -> the whole file mapped read-only, while a view lives
_BY_FILE: weakref.WeakValueDictionary[tuple, np.memmap] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()

#: copies of at least this many bytes go to an unnamed file beside the model (see `_copy_in_place`)
SPILL_BYTES = 1 << 20
#: detached ranges closer than this are copied as one (fewer mappings; the gap costs little)
MERGE_GAP = 4 * mmap.PAGESIZE


class MappedFileChanged(ProgramError):
    """The model file a program's weights are mapped from was rewritten in place since it was
    parsed (its size or modification time changed): its weights can no longer be read."""


@dataclass
class MappedFile:
    """What `map_file` recorded about a mapped file (kept on the mapping as `pygraphx_mapped`)."""

    path: str
    fd: int
    """A descriptor of the mapped inode: `os.fstat` sees what happened to *this* file, also
    after another file was renamed over its path (which is safe: the inode lives on)."""
    size: int
    mtime_ns: int
    detached: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) offsets (whole pages) copied out of the file by `detach_ranges`."""
    in_memory: list[tuple[int, int]] = field(default_factory=list)
    """The part of `detached` copied into anonymous memory: never released (it would be lost;
    a copy in an unnamed file is released like the model file's pages)."""

    def changed(self) -> str | None:
        """How the file differs from what was mapped, or None when it does not."""
        st = os.fstat(self.fd)
        if st.st_size != self.size:
            return f"its size changed from {self.size:,} to {st.st_size:,} bytes"
        if st.st_mtime_ns != self.mtime_ns:
            return "it was modified"
        return None


def map_file(path: Path) -> np.memmap:
    """The whole file at `path` mapped read-only, one mapping per file (by device, inode, size
    and modification time) while some view of it lives, its identity recorded (see the module
    docstring)."""
    with path.open("rb") as f:
        st = os.fstat(f.fileno())
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with _LOCK:
            root = _BY_FILE.get(key)
            if root is not None:
                return root
            root = np.memmap(f, dtype=np.uint8, mode="r")
            fd = os.dup(f.fileno())
            weakref.finalize(root, os.close, fd)
            root.pygraphx_file = key  # what the device literal store identifies it by
            root.pygraphx_mapped = MappedFile(str(path), fd, st.st_size, st.st_mtime_ns)
            _BY_FILE[key] = root
            _ROOTS[id(root)] = root  # its pages may be given back once the weights are packed
    return root


def register_mapping(root: np.memmap) -> None:
    """Record `root`, a read-only mapping of a whole file, so that `release_range` may drop
    pages inside it (no other memory is ever released: on anonymous memory that would lose
    data). `map_file` registers the mappings it makes."""
    with _LOCK:
        _ROOTS[id(root)] = root


# --- identity ---------------------------------------------------------------------------------


def changed_message(path: str, how: str, action: str) -> str:
    """The message of `MappedFileChanged` (also used by callers that find it out otherwise)."""
    return (
        f"{path}: the model file was rewritten in place after it was parsed ({how}); the "
        f"program's weights are views of that file, so {action} cannot read them. Parse the "
        "model again. To replace a model file that a live program was parsed from, write the "
        "new file under another name and rename it over the old one (os.replace), or parse "
        "with PGX_MAP_WEIGHTS=0 (reads the file whole)"
    )


def _root_of(array: np.ndarray) -> np.ndarray | None:
    """The array directly over the mmap that `array` views, or None (not a mapped file)."""
    base = array
    while isinstance(base, np.ndarray):
        if isinstance(base.base, mmap.mmap):
            return base
        base = base.base
    return None


def check_unchanged(arrays: Iterable[np.ndarray], action: str) -> None:
    """Raise `MappedFileChanged` (naming the file and `action`, what was about to read it) when
    a file that some of `arrays` view was rewritten in place since it was mapped."""
    seen: set[int] = set()
    for array in arrays:
        root = _root_of(array) if isinstance(array, np.ndarray) else None
        if root is None or id(root) in seen:
            continue
        seen.add(id(root))
        info = getattr(root, "pygraphx_mapped", None)
        how = info.changed() if info is not None else None
        if how is not None:
            raise MappedFileChanged(changed_message(info.path, how, action))


def _literal_arrays(program: Program) -> list[np.ndarray]:
    return [
        ins.get_literal().array
        for module in program.modules.values()
        for ins in module.instructions
        if ins.is_literal()
    ]


def check_program(program: Program, action: str) -> None:
    """`check_unchanged` on every literal of `program` (before `action` reads them)."""
    check_unchanged(_literal_arrays(program), action)


# --- detaching: private copies at the same addresses ------------------------------------------


def _registered_roots() -> list[np.memmap]:
    with _LOCK:
        return [r for r in _ROOTS.values() if isinstance(r.base, mmap.mmap) and not r.base.closed]


def any_mapped() -> bool:
    """Whether a mapped model file is open in the process (else no span can lie in one, and
    a search for the spans a program reads in mapped files can be skipped)."""
    return bool(_registered_roots())


def _spans_by_root(spans: Iterable[tuple[int, int]]) -> dict[int, tuple[np.memmap, list]]:
    """The (address, nbytes) spans that lie in registered mappings, as whole-page [lo, hi)
    offsets per mapping (others are ignored)."""
    roots = _registered_roots()
    found: dict[int, tuple[np.memmap, list]] = {}
    for address, nbytes in spans:
        for root in roots:
            start, size = root.ctypes.data, len(root.base)
            if nbytes > 0 and start <= address < start + size:
                lo = (address - start) // mmap.PAGESIZE * mmap.PAGESIZE
                hi = min(-(-(address - start + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE, size)
                found.setdefault(id(root), (root, []))[1].append((lo, hi))
                break
    return found


def _merged(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + gap:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(ranges: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `ranges` outside every range of `taken` (both sorted, disjoint)."""
    out = []
    for lo, hi in ranges:
        for t_lo, t_hi in taken:
            if t_hi <= lo or t_lo >= hi:
                continue
            if t_lo > lo:
                out.append((lo, t_lo))
            lo = max(lo, t_hi)
        if lo < hi:
            out.append((lo, hi))
    return out


class _Libc:
    """mmap / mremap / mprotect / munmap from the C library (Linux)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        self.mmap = libc.mmap
        self.mmap.restype, self.mmap.argtypes = vp, [vp, sz, i, i, i, ctypes.c_long]
        self.mremap = libc.mremap
        self.mremap.restype, self.mremap.argtypes = vp, [vp, sz, sz, i, vp]
        self.mprotect = libc.mprotect
        self.mprotect.restype, self.mprotect.argtypes = i, [vp, sz, i]
        self.munmap = libc.munmap
        self.munmap.restype, self.munmap.argtypes = i, [vp, sz]

    def map(self, nbytes: int, prot: int, flags: int, fd: int = -1) -> int:
        address = self.mmap(None, nbytes, prot, flags, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the copy failed")
        return address

    def place(self, copy: int, address: int, nbytes: int) -> None:
        """Move the mapping at `copy` over the pages at `address` (one `mremap`: other
        threads see the old pages or the copy, never a hole)."""
        moved = self.mremap(copy, nbytes, nbytes, _MREMAP_MAYMOVE | _MREMAP_FIXED, address)
        if moved != address:
            err = ctypes.get_errno()
            self.munmap(copy, nbytes)
            raise OSError(err, "mremap of the copy over the file's pages failed")

    def memory_copy(self, fd: int, offset: int, nbytes: int) -> int | None:
        """A private read-only anonymous mapping holding bytes [offset, offset + nbytes) of
        `fd`, read with `pread`; None when the file is shorter now."""
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        anon = self.map(nbytes, prot, flags)
        view = memoryview((ctypes.c_char * nbytes).from_address(anon)).cast("B")
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:  # truncated since it was checked: a read of the mapping would fault
                break
            done += n
        view.release()
        if done < nbytes:
            self.munmap(anon, nbytes)
            return None
        if self.mprotect(anon, nbytes, mmap.PROT_READ) != 0:
            err = ctypes.get_errno()
            self.munmap(anon, nbytes)
            raise OSError(err, "mprotect of the copy failed")
        return anon

    def file_copy(self, fd: int, offset: int, nbytes: int, folder: str) -> int | None:
        """A read-only shared mapping of a new unnamed file in `folder` (nobody else can open
        it) holding bytes [offset, offset + nbytes) of `fd`, copied by the kernel; None when
        the file is shorter now. OSError when `folder` takes no such file."""
        tmp = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
        try:
            done = 0
            while done < nbytes:
                n = os.copy_file_range(fd, tmp, nbytes - done, offset + done, done)
                if n == 0:
                    return None
                done += n
            return self.map(nbytes, mmap.PROT_READ, mmap.MAP_SHARED, tmp)
        finally:
            os.close(tmp)  # the mapping keeps the file


_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_LIBC: list[_Libc | None] = []


def _libc() -> _Libc | None:
    if not _LIBC:
        ok = sys.platform.startswith("linux") and hasattr(mmap, "MAP_ANONYMOUS")
        _LIBC.append(_Libc() if ok else None)
    return _LIBC[0]


def _copy_in_place(
    libc: _Libc, address: int, info: MappedFile, offset: int, nbytes: int
) -> str | None:
    """Replace the pages at `address` (bytes `offset`.. of `info`'s file) by a copy: in a new
    unnamed file beside the model (`SPILL_BYTES` or more: page cache, resident only where read,
    as the model file was) or in anonymous memory. Returns "file" or "memory", or None when the
    file is shorter now (nothing changed)."""
    copy, where = None, "memory"
    if nbytes >= SPILL_BYTES and hasattr(os, "O_TMPFILE") and hasattr(os, "copy_file_range"):
        folder = os.path.dirname(info.path)
        try:
            copy, where = libc.file_copy(info.fd, offset, nbytes, folder), "file"
        except OSError as exc:  # a read-only folder, a file system without unnamed files
            log.debug("%s: copy in memory, not beside the file: %s", info.path, exc)
    if where == "memory":
        copy = libc.memory_copy(info.fd, offset, nbytes)
    if copy is None:
        return None
    libc.place(copy, address, nbytes)
    return where


def detach_ranges(spans: Iterable[tuple[int, int]], action: str = "compiling") -> int:
    """Copy the pages of the (address, nbytes) `spans` that lie in mapped model files into
    private memory at the same addresses (see the module docstring), so that rewriting the file
    cannot change or take them away. Checks each file first (`MappedFileChanged`, naming
    `action`). Returns the bytes copied (0 on systems without `mremap`, which is logged)."""
    copied = 0
    for root, ranges in _spans_by_root(spans).values():
        info = getattr(root, "pygraphx_mapped", None)
        if info is None:
            continue
        how = info.changed()
        if how is not None:
            raise MappedFileChanged(changed_message(info.path, how, action))
        libc = _libc()
        if libc is None:
            log.warning(
                "%s: weights read at run time stay in the mapped file on this system; do not "
                "rewrite it in place while the program lives", info.path,
            )  # fmt: skip
            return 0
        with _LOCK:
            todo = _minus(_merged(ranges, MERGE_GAP), info.detached)
            for lo, hi in todo:
                try:
                    where = _copy_in_place(libc, root.ctypes.data + lo, info, lo, hi - lo)
                except OSError as exc:  # no memory for the copy, too many mappings
                    log.warning(
                        "%s: %d bytes of weights read at run time could not be copied out of "
                        "the mapped file (%s); they are read from it: do not rewrite it in "
                        "place while the program lives", info.path, hi - lo, exc,
                    )  # fmt: skip
                    continue
                if where is None:
                    how = "it is shorter than when it was mapped"
                    raise MappedFileChanged(changed_message(info.path, how, action))
                info.detached = _merged([*info.detached, (lo, hi)], 0)
                if where == "memory":
                    info.in_memory = _merged([*info.in_memory, (lo, hi)], 0)
                copied += hi - lo
    return copied


def array_span(array: np.ndarray) -> tuple[int, int]:
    """(address, nbytes) of the memory `array` spans (strides included)."""
    lo, hi = _byte_bounds(array)
    return lo, hi - lo


def detach_program(program: Program, action: str = "compiling") -> int:
    """`detach_ranges` on every literal of `program`: for a target whose runs read the
    literals themselves (`ref`). Returns the bytes copied."""
    spans = []
    for array in _literal_arrays(program):
        if isinstance(array, np.ndarray) and array.size and _root_of(array) is not None:
            spans.append(array_span(array))
    return detach_ranges(spans, action)


# --- releasing pages --------------------------------------------------------------------------


def _release(root: np.ndarray, lo: int, hi: int) -> int:
    """madvise(DONTNEED) on the pages [lo, hi) of `root`'s mapping, less its detached ranges."""
    raw = root.base
    info = getattr(root, "pygraphx_mapped", None)
    ranges = _minus([(lo, hi)], info.in_memory) if info is not None else [(lo, hi)]
    for a, b in ranges:
        raw.madvise(mmap.MADV_DONTNEED, a, b - a)
    return sum(b - a for a, b in ranges)


def release_range(address: int, nbytes: int) -> int:
    """Drop the whole pages of [address, address + nbytes) from resident memory when they lie
    in a registered file mapping (see the module docstring); returns the bytes released (0
    for memory that is not such a mapping)."""
    for root in _registered_roots():
        start = root.ctypes.data
        if not start <= address < start + len(root.base):
            continue
        lo = -(-(address - start) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = min(address + nbytes - start, len(root.base)) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi <= lo or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        return _release(root, lo, hi)
    return 0


def release_mapped(arrays: Iterable[np.ndarray]) -> int:
    """Drop the pages of the files that `arrays` (views of mapped model files) map from this
    process's resident memory: they stay in the page cache, and a later read faults them back
    in. Returns the bytes of mapping released. Used once the weights have been packed into
    copies of their own, so that the process does not hold both."""
    roots: dict[int, np.ndarray] = {}
    for array in arrays:
        root = _root_of(array)
        if root is not None:
            roots[id(root)] = root
    released = 0
    for root in roots.values():
        raw = root.base
        if hasattr(raw, "madvise") and hasattr(mmap, "MADV_DONTNEED") and not raw.closed:
            released += _release(root, 0, len(raw))
    return released


def release_weight_pages(program: Program) -> int:
    """After lowering: drop the pages of the mapped model file that this process has read (the
    passes and the weight packing read every weight once) from its resident memory. The
    literals stay views of the file (save and the dynamic re-compiles read them again); the
    weights the steps use as they are were copied out of the file (`detach_ranges`), the packed
    ones are never read again. Returns the bytes of mapping released."""
    return release_mapped(_literal_arrays(program))


__all__ = [
    "MERGE_GAP",
    "SPILL_BYTES",
    "MappedFile",
    "MappedFileChanged",
    "any_mapped",
    "array_span",
    "changed_message",
    "check_program",
    "check_unchanged",
    "detach_program",
    "detach_ranges",
    "map_file",
    "register_mapping",
    "release_mapped",
    "release_range",
    "release_weight_pages",
]
