"""The convolution choice cache: what `conv_choice` measured, kept per process and on disk.

A measured choice (a kernel name, or "dnnl/<implementation>") is stored under a key naming
everything that decided it (`conv_choice.choice_key`). Every compile in a process shares one
table; across processes the table lives in a JSON file, like MIOpen's find-db or TensorRT's
timing cache, so only a machine's first compile of a model pays for the measurement:

- `PGX_CONV_CHOICE_CACHE` unset: the per-user file `$XDG_CACHE_HOME/pygraphx/` (default
  `~/.cache/pygraphx/`) `conv_choice-<tag>.json`, the tag a hash of the CPU model, torch's
  version and the oneDNN library's version (`machine_tag`): another processor or another
  build measures afresh;
- `PGX_CONV_CHOICE_CACHE=/path/file.json`: that file;
- `PGX_CONV_CHOICE_CACHE=off` (or `0`, `none`, empty): this process only.

The file is read at the first measured layer of a process and written (merged with what other
processes added meanwhile, then renamed into place) after a compile that measured something;
a file that cannot be read or written is said (WARNING, `pygraphx.cpu`) and the compile goes
on measuring. Delete the file to measure again (a choice made under heavy load stays until
then).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from pygraphx.targets.torch_lowering import onednn_capi

log = logging.getLogger("pygraphx.cpu")

CACHE_ENV = "PGX_CONV_CHOICE_CACHE"
#: values of `PGX_CONV_CHOICE_CACHE` that keep the choices in the process only
OFF_VALUES = ("", "off", "0", "none")

_TABLE: dict[str, str] = {}
_LOADED: set[str] = set()


def cache_path() -> Path | None:
    """The cache file in force (see the module docstring), or None for none."""
    raw = os.environ.get(CACHE_ENV)
    if raw is None:
        return default_path()
    if raw.strip().lower() in OFF_VALUES:
        return None
    return Path(raw.strip()).expanduser()


def default_path() -> Path:
    """The per-user file: `$XDG_CACHE_HOME/pygraphx/conv_choice-<machine_tag()>.json`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pygraphx" / f"conv_choice-{machine_tag()}.json"


@functools.cache
def machine_tag() -> str:
    """A short hash of the CPU model, torch's version and oneDNN's (what makes choices
    measured on one machine and build wrong on another)."""
    parts = [_cpu_model(), torch.__version__, _onednn_version()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@functools.cache
def cpu_vendor() -> str:
    """The processor's vendor string (`vendor_id` of /proc/cpuinfo: "AuthenticAMD",
    "GenuineIntel"), "" where it cannot be read."""
    return _cpuinfo("vendor_id") or ""


def _cpuinfo(field: str) -> str | None:
    """The first `field` line's value in /proc/cpuinfo, None where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    model = _cpuinfo("model name")  # (not Linux: the platform's own description)
    return model if model is not None else f"{platform.machine()} {platform.processor()}"


class _Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
    ]


def _onednn_version() -> str:
    """oneDNN's version and commit where its C API library loads, else "none"."""
    lib = onednn_capi.library()
    if lib is None:
        return "none"
    fn = lib.dnnl_version
    fn.restype, fn.argtypes = ctypes.POINTER(_Version), []
    v = fn().contents
    return f"{v.major}.{v.minor}.{v.patch}+{(v.hash or b'').decode(errors='replace')}"


def lookup(key: str) -> str | None:
    """The stored choice under `key` (the file read first, once per process and path)."""
    _load()
    return _TABLE.get(key)


def store(key: str, choice: str) -> None:
    """Keep `choice` under `key` in this process (`save` writes the file)."""
    _TABLE[key] = choice


def _load() -> None:
    path = cache_path()
    if path is None or str(path) in _LOADED:
        return
    _LOADED.add(str(path))
    _TABLE.update({k: v for k, v in _read(path).items() if k not in _TABLE})


def _read(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s=%s: cannot read the convolution choice cache (%s)", CACHE_ENV, path, exc)
        return {}
    if not isinstance(entries, dict):
        return {}
    return {str(k): str(v) for k, v in entries.items()}


def save(valid: Callable[[str], bool]) -> Path | None:
    """Write this process's choices that pass `valid` to the cache file (merged with the
    entries other processes wrote since); the file written, or None."""
    path = cache_path()
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read(path), **_TABLE}
        merged = {k: v for k, v in merged.items() if valid(v)}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        log.warning("%s=%s: cannot write the convolution choice cache (%s)", CACHE_ENV, path, exc)
        return None
    return path


def clear() -> None:
    """Forget every choice of this process (the file is read again at the next lookup)."""
    _TABLE.clear()
    _LOADED.clear()


__all__ = [
    "CACHE_ENV",
    "OFF_VALUES",
    "cache_path",
    "clear",
    "cpu_vendor",
    "default_path",
    "lookup",
    "machine_tag",
    "save",
    "store",
]
