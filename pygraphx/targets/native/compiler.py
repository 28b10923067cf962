"""Build, cache and load a native CPU kernel: one C source -> one shared library.

`load("attention_bf16")` compiles `kernels/attention_bf16.c` with the machine's C compiler at
the first call on a machine, keeps the library in the per-user cache and loads it with ctypes;
later processes load the cached file (a few milliseconds). The cache file's name carries a hash
of everything the machine code depends on: the source, the compiler's identity, the flags and
the processor (model and instruction-set flags: `-march=native` code is this CPU's only), so a
changed source or another machine builds afresh and nothing stale is ever loaded. A kernel may
`#include "name.h"` a header of `kernels/` (shared vector maths, `vmath.h`): the line is replaced
by the header's text before hashing and building (`inline_headers`; each header once), so a
changed header builds afresh too.

Settings (environment):
- `PGX_NATIVE=off` (or `0`): no native kernel; every caller takes its library route and says so.
- `PGX_CC`: the compiler command (default the first of `cc`, `gcc`, `clang` on PATH).
- `PGX_NATIVE_CACHE`: the cache directory (default `$XDG_CACHE_HOME/pygraphx/native`, i.e.
  `~/.cache/pygraphx/native`).
- `PGX_NATIVE_BUILD_TIMEOUT`: seconds one build may take (default 120).

Safety: a shared library is code, so the cache directory is made private (0700) and a cached
file is loaded only when this user owns it and nobody else can write it or its directory;
otherwise the kernel is built again in a private temporary directory. Builds write a temporary
file and rename it into place, so processes compiling the same kernel at once never load a
half-written library.

The libraries link the GNU OpenMP runtime; torch is imported first so that its `libgomp.so.1`
is the one they bind to (one thread pool for torch, oneDNN and the kernels; checked after
loading).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch  # noqa: F401  (first: its libgomp.so.1 is the one the kernels bind to)

from pygraphx.ir.env import switch_on
from pygraphx.targets.native.openmp import openmp_runtimes, openmp_shared

log = logging.getLogger("pygraphx.cpu")

NATIVE_ENV = "PGX_NATIVE"
CC_ENV = "PGX_CC"
CACHE_ENV = "PGX_NATIVE_CACHE"
TIMEOUT_ENV = "PGX_NATIVE_BUILD_TIMEOUT"
#: the directory of the kernels' C sources
KERNELS = Path(__file__).parent / "kernels"
#: every kernel's flags (a kernel may add its own)
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
              "-fno-math-errno", "-Wall")

#: builds of one kernel kept in the cache (the newest; older sources' builds are removed)
KEEP_BUILDS = 4

_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], ctypes.CDLL] = {}
_ANNOUNCED: set[str] = set()
_TEMP_DIRS: list[Path] = []


@atexit.register
def _remove_temp_dirs() -> None:
    """Remove the private temporary build directories of this process (the libraries in them
    are mapped already; nothing reads the files again)."""
    for path in _TEMP_DIRS:
        shutil.rmtree(path, ignore_errors=True)


def _temp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="pygraphx-native-"))
    _TEMP_DIRS.append(path)
    return path


class NativeUnavailable(RuntimeError):
    """A native kernel cannot be had here: why (no compiler, a failed build, disabled)."""


def enabled() -> bool:
    """Whether native kernels may be used (`PGX_NATIVE` is not off)."""
    return switch_on(NATIVE_ENV)


def compiler_command() -> list[str] | None:
    """The C compiler command (`PGX_CC`, else `cc` / `gcc` / `clang` on PATH), None if none."""
    raw = os.environ.get(CC_ENV, "").strip()
    if raw:
        cmd = shlex.split(raw)
        return cmd if shutil.which(cmd[0]) else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def build_flags(extra: Sequence[str] = ()) -> list[str]:
    """The flags a kernel is built with: `BASE_FLAGS` then its own."""
    return [*BASE_FLAGS, *extra]


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pygraphx" / "native"


@functools.cache
def _compiler_identity(cmd: tuple[str, ...]) -> str:
    """The compiler's `--version` first line (part of the cache key)."""
    try:
        done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"cannot run the C compiler {shlex.join(cmd)}: {exc}") from exc
    lines = (done.stdout or done.stderr).splitlines()
    return lines[0] if lines else shlex.join(cmd)


@functools.cache
def _processor() -> str:
    """The processor's model and instruction-set flags (`-march=native` code is for this CPU)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "flags") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        pass
    return "|".join([platform.machine(), fields.get("model name", ""), fields.get("flags", "")])


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        return float(raw) if raw else 120.0
    except ValueError as exc:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds") from exc


def _private(path: Path) -> bool:
    """Whether `path` is this user's and writable by nobody else."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _directory() -> Path:
    """The cache directory, made private; a private temporary one where it cannot be."""
    path = cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if _private(path):
            return path
        why = "it is not private to this user"
    except OSError as exc:
        why = str(exc)
    tmp = _temp_dir()
    log.warning("native kernels: cache %s unusable (%s); building in %s", path, why, tmp)
    return tmp


def _build(cmd: list[str], name: str, source: str, flags: list[str], out: Path) -> None:
    """Compile `source` into `out` (written beside it, then renamed into place)."""
    with tempfile.TemporaryDirectory(prefix=f"pgx-{name}-") as work:
        src = Path(work) / f"{name}.c"
        src.write_text(source)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        argv = [*cmd, *flags, "-o", str(tmp), str(src)]
        start = time.perf_counter()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_timeout())
        except subprocess.TimeoutExpired as exc:
            tmp.unlink(missing_ok=True)
            raise NativeUnavailable(
                f"native kernel {name}: the build took over {exc.timeout:.0f} s "
                f"({TIMEOUT_ENV}): {shlex.join(argv)}") from exc
        except OSError as exc:
            raise NativeUnavailable(f"native kernel {name}: cannot run {argv[0]}: {exc}") from exc
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise NativeUnavailable(
                f"native kernel {name}: the build failed (exit {done.returncode}): "
                f"{shlex.join(argv)}\n{tail}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, out)
    log.info("native kernel %s: built in %.2f s (%s)", name, time.perf_counter() - start, out)


def _prune(built: Path) -> None:
    """Keep the `KEEP_BUILDS` newest builds of `built`'s kernel in its directory (a changed
    source, compiler or flag set leaves the old file behind; a process that mapped one keeps
    it mapped after the unlink)."""
    name = built.name.rsplit("-", 1)[0]
    own = re.compile(re.escape(name) + r"-[0-9a-f]{20}\.so")
    try:
        builds = [p for p in built.parent.glob(f"{name}-*.so") if own.fullmatch(p.name)]
        builds.sort(key=lambda p: p.stat().st_mtime)
        for old in builds[:-KEEP_BUILDS]:
            if old != built:
                old.unlink(missing_ok=True)
        for tmp in built.parent.glob(f".{name}-*.tmp"):  # a build killed before its rename
            if time.time() - tmp.stat().st_mtime > 3600:
                tmp.unlink(missing_ok=True)
    except OSError as exc:  # another process pruned it first, or a read-only directory
        log.debug("native kernels: pruning %s: %s", built.parent, exc)


def load(name: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The library of kernel `name` (`kernels/<name>.c`), built at its first use on this
    machine; raises `NativeUnavailable` saying why it cannot be had."""
    path = KERNELS / f"{name}.c"
    try:
        source = path.read_text()
    except OSError as exc:
        raise NativeUnavailable(f"native kernel {name}: cannot read {path}: {exc}") from exc
    return load_source(name, source, extra_flags)


#: a quoted include of a header in `KERNELS` (one line)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([A-Za-z0-9_.-]+\.h)"[ \t]*$', re.M)


def inline_headers(name: str, source: str) -> str:
    """`source` with each `#include "x.h"` line replaced by `kernels/x.h`'s text (headers'
    own includes too; a header included again becomes a comment); raises `NativeUnavailable`
    where a header cannot be read."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            header = match.group(1)
            if header in seen:
                return f"/* {header}: included above */"
            seen.add(header)
            try:
                body = (KERNELS / header).read_text()
            except OSError as exc:
                raise NativeUnavailable(
                    f"native kernel {name}: cannot read {KERNELS / header}: {exc}") from exc
            return f"/* ---- {header} ---- */\n{expand(body)}\n/* ---- end of {header} ---- */"

        return _INCLUDE.sub(one, text)

    return expand(source)


def load_source(name: str, source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """`load` for a source given as text (tests, generated kernels); its `#include "x.h"`
    lines are `kernels/x.h` (`inline_headers`)."""
    if not enabled():
        raise NativeUnavailable(f"native kernel {name}: disabled ({NATIVE_ENV}=off)")
    source = inline_headers(name, source)
    cmd = compiler_command()
    if cmd is None:
        asked = os.environ.get(CC_ENV, "").strip()
        where = f"{CC_ENV}={asked!r} not found" if asked else "no cc, gcc or clang on PATH"
        raise NativeUnavailable(f"native kernel {name}: no C compiler ({where})")
    flags = build_flags(extra_flags)
    parts = [source, _compiler_identity(tuple(cmd)), shlex.join(flags), _processor()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
    with _LOCK:
        lib = _LOADED.get((name, key))
        if lib is not None:
            return lib
        out = _directory() / f"{name}-{key}.so"
        if not (out.exists() and _private(out)):
            if out.exists():  # someone else's or writable by others: never load it
                out = _temp_dir() / out.name
            _build(cmd, name, source, flags, out)
            _prune(out)
        try:
            lib = ctypes.CDLL(str(out))
        except OSError as exc:
            raise NativeUnavailable(f"native kernel {name}: cannot load {out}: {exc}") from exc
        if not openmp_shared():
            runtimes = ", ".join(openmp_runtimes())
            raise NativeUnavailable(
                f"native kernel {name}: two OpenMP runtimes in this process ({runtimes})")
        _LOADED[(name, key)] = lib
        return lib


def announce_fallback(name: str, why: NativeUnavailable | str, route: str) -> None:
    """Say once per process (WARNING, `pygraphx.cpu`) that kernel `name` is not used and which
    route runs instead."""
    if name in _ANNOUNCED:
        return
    _ANNOUNCED.add(name)
    log.warning("%s; %s runs instead", why, route)
