"""A native kernel's library, built (or loaded from the cache) and its functions bound once per
process: `BoundLibrary`.

A failure - no C compiler, a build that failed or ran past `PGX_NATIVE_BUILD_TIMEOUT`, a
processor without the instructions the kernel needs - is kept and raised again for the rest of
the process: a network's layers (MobileNetV2's 17 blocks, BERT's 25 layer norms) ask one after
the other, and each would otherwise start the same failing build again. `PGX_NATIVE=off` is not
kept (it may be lifted later in the process). The first caller announces the fallback
(`available`: once per kernel, `compiler.announce_fallback`).

A kernel's source may be several files (`parts`: `kernels/<name>.c` then `kernels/<part>.c` for
each part, joined into one translation unit and hashed as one, so a change to any part builds
afresh; only `kernels/*.c` ships with the package).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence

from pygraphx.targets.native import compiler

__all__ = ["BoundLibrary"]


class BoundLibrary:
    """Kernel `name`'s library, loaded with `extra_flags` and given to `bind` (which sets the
    functions' argument types and raises `compiler.NativeUnavailable` where the build has no
    kernel for this processor) once; then the same library, or the first failure, each call.
    `parts`: further source files of the kernel (`kernels/<part>.c`), appended in order."""

    def __init__(
        self,
        name: str,
        bind: Callable[[ctypes.CDLL], None],
        extra_flags: Sequence[str] = (),
        parts: Sequence[str] = (),
    ) -> None:
        self.name = name
        self._bind = bind
        self._flags = tuple(extra_flags)
        self.parts = tuple(parts)
        self._lib: ctypes.CDLL | None = None
        self._failed: compiler.NativeUnavailable | None = None
        self._lock = threading.Lock()

    def get(self) -> ctypes.CDLL:
        """The bound library; raises `compiler.NativeUnavailable` (the first failure's, again,
        for the rest of the process)."""
        with self._lock:
            if self._lib is not None:
                return self._lib
            if self._failed is not None:
                raise self._failed
            try:
                lib = self._load()
                self._bind(lib)
            except compiler.NativeUnavailable as exc:
                if compiler.enabled():  # (`PGX_NATIVE=off` may be lifted later: not kept)
                    self._failed = exc
                raise
            self._lib = lib
            return lib

    def source(self) -> str:
        """The kernel's source: `kernels/<name>.c` and its parts, joined; raises
        `compiler.NativeUnavailable` where a file cannot be read."""
        texts = []
        for part in (self.name, *self.parts):
            path = compiler.KERNELS / f"{part}.c"
            try:
                texts.append(path.read_text())
            except OSError as exc:
                raise compiler.NativeUnavailable(
                    f"native kernel {self.name}: cannot read {path}: {exc}"
                ) from exc
        return "".join(texts)

    def _load(self) -> ctypes.CDLL:
        if not self.parts:
            return compiler.load(self.name, self._flags)
        return compiler.load_source(self.name, self.source(), self._flags)

    def available(self, route: str) -> bool:
        """Whether the library can be had; where not, says once why and that `route` runs."""
        try:
            self.get()
        except compiler.NativeUnavailable as exc:
            compiler.announce_fallback(self.name, exc, route)
            return False
        return True

    def forget(self) -> None:
        """Drop the library and a kept failure (tests: a compiler that appears or changes)."""
        with self._lock:
            self._lib, self._failed = None, None
