"""Keeping freed memory in the process for the next run (glibc malloc's two thresholds).

A step whose torch kernel allocates its own result (every oneDNN convolution: torch's mkldnn
ops take no `out=`) gets a new tensor on every run, and frees it after its last use. glibc
serves a request above `M_MMAP_THRESHOLD` (dynamic, at most 32 MiB) with its own `mmap` and
gives it back with `munmap` when freed, and returns the heap's free top above
`M_TRIM_THRESHOLD` to the kernel. The activations of a batch-8 CNN (ResNet-50's are up to 25
MiB each) then come back every run as fresh, zero-filled pages: 13,000-23,000 minor page faults
a run, measured on the 2-core EPYC at 1 thread as 5% of ResNet-50's time and 17% of
MobileNetV2's at batch 8 (`benchmarks/results/cpuconv.md`).

`keep_freed_memory()` raises both thresholds to `KEEP_BYTES` once per process, so that freed
blocks stay in the heap and serve the next run's requests, as an arena would. The price: the
process's resident memory stays at its peak between runs instead of falling back (its peak
itself does not change). It is called when the cpu target lowers a convolution whose output
torch allocates, and logs one line on the `pygraphx.cpu` logger (INFO) when it changes the
settings.

The switch: `PGX_CPU_KEEP_FREED=0` leaves malloc's settings alone (then nothing is logged). It
does nothing where the C library is not glibc (musl, macOS, Windows).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("pygraphx.cpu")

ENV = "PGX_CPU_KEEP_FREED"
#: blocks up to this size come from (and go back to) the heap; this much free heap top is kept
KEEP_BYTES = 1 << 30
#: mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

_state: dict[str, bool] = {}


def enabled() -> bool:
    """Whether `keep_freed_memory` may change malloc's settings (`PGX_CPU_KEEP_FREED`)."""
    raw = os.environ.get(ENV, "1").strip().lower()
    return raw not in ("0", "false", "no", "off")


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process (see the module docstring).

    Returns whether the settings are in force after the call."""
    if "done" in _state:
        return _state["done"]
    if not enabled():
        return False  # asked again next time: the variable may be unset later
    done = False
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        done = _mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) and _mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
    _state["done"] = done
    if done:
        log.info(
            "cpu: glibc malloc keeps freed blocks up to %d MiB for reuse (results torch "
            "allocates, e.g. convolution outputs, reuse them instead of faulting in new "
            "pages every run); %s=0 leaves malloc alone",
            KEEP_BYTES >> 20,
            ENV,
        )
    return done


def _mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)))


__all__ = ["ENV", "KEEP_BYTES", "enabled", "keep_freed_memory"]
