"""Native CPU kernels: C sources shipped with pygraphx, compiled on the user's machine at their
first use, cached, and loaded with ctypes (`compiler.py`; the sources are in `kernels/`).

The cpu target's counterpart of the GPU target's generated Triton kernels: where neither torch
nor oneDNN has a primitive that does a fused job at the hardware's speed (an attention block
kept in cache, a Winograd tile pipeline), a small C kernel compiled with `-O3 -march=native
-fopenmp` does it. Without a C compiler (or with `PGX_NATIVE=off`) each caller says so once and
takes its library route.
"""

from pygraphx.targets.native.bound import BoundLibrary
from pygraphx.targets.native.compiler import (
    NATIVE_ENV,
    NativeUnavailable,
    announce_fallback,
    build_flags,
    cache_dir,
    compiler_command,
    load,
    load_source,
)
from pygraphx.targets.native.openmp import openmp_runtimes, openmp_shared

__all__ = [
    "BoundLibrary",
    "NATIVE_ENV",
    "NativeUnavailable",
    "announce_fallback",
    "build_flags",
    "cache_dir",
    "compiler_command",
    "load",
    "load_source",
    "openmp_runtimes",
    "openmp_shared",
]
