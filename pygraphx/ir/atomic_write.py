"""Atomic file writes: every file pygraphx writes (saved programs, caches, reports) goes through
`write_atomic`, so a crash, a kill or a full disk mid-write never leaves a half-written file at
the destination, and the file that was there before survives any failure.

The bytes go to a temporary file in the destination's folder (same file system, so the final
`os.replace` is an atomic rename), are flushed and fsync'ed, and only then renamed over the
destination; the folder is fsync'ed too so the rename itself survives a power cut. On any error
the temporary file is removed and the error is re-raised as `AtomicWriteError` naming the file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

_CHUNK = 1 << 22  # bytes per write call (a full disk is noticed early)


class AtomicWriteError(OSError):
    """Writing a file failed; the previous file at the path (if any) is unchanged."""


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write `data` to `path` all-or-nothing (see the module docstring)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if path.is_dir():
        raise AtomicWriteError(f"{path}: is a directory; cannot write a file there")
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise AtomicWriteError(f"{path}: cannot create a temporary file: {exc}") from exc
    try:
        os.chmod(tmp, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            view = memoryview(raw)
            for start in range(0, len(view), _CHUNK):
                f.write(view[start : start + _CHUNK])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # KeyboardInterrupt too: the temporary file never stays
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise AtomicWriteError(
                f"{path}: write failed ({exc.strerror or exc}); the previous file is unchanged"
            ) from exc
        raise
    _fsync_folder(folder)


def _mode_for(path: Path) -> int:
    """The permissions the file gets: those of the file it replaces, else 0o666 less the
    umask (what a plain `open(path, "w")` gives; mkstemp alone would give 0o600)."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        pass
    try:
        status = Path("/proc/self/status").read_text()
        umask = next(int(line.split()[1], 8) for line in status.splitlines() if "Umask" in line)
    except (OSError, StopIteration, ValueError):
        umask = 0o022
    return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; some file systems cannot open a folder, which is harmless."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
