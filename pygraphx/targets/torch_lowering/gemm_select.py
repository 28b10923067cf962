"""Choosing the kernel of a constant-weight GEMM by measuring the candidates at prepare.

`lower_gemm.py` can run `x @ W (+ b)` with a fixed weight through oneDNN (`dnnl`, weight
reordered once), MKL (`mkl`, weight packed once) or plain `torch.addmm` (`addmm`). Which is
fastest depends on the shape, the thread count and the machine (on the 2-core AMD EPYC
development machine oneDNN wins every BERT / GPT-2 shape at one thread, 100-110 GFLOP/s
against MKL's and addmm's 75-97, and is 2x faster on GPT-2's 128 x 768 x 50257 head; Intel
hosts may differ). So at prepare every candidate is timed on a random input of the real shape
with the threads the run will use (best of a few calls after a warm-up, which is robust to a
busy machine), and the fastest is taken. The choice is cached for the process by (rows, k, n,
threads, candidates), so a model's repeated layers and later compiles measure nothing (a bias
add inside the GEMM costs every kernel alike, so whether there is one is not part of the key).

Measuring is skipped (the first candidate, oneDNN where available, is taken) when one call
would take longer than `MAX_MEASURED_SECONDS` at `ASSUMED_GFLOPS` per thread: such products
are bandwidth- and FMA-bound in every library and the measurement would dominate compile time.

`PGX_CPU_GEMM` overrides the choice: `auto` (default), or one of `dnnl`, `mkl`, `addmm` for
every product that kernel can run (others keep `auto`). An unknown value is an error.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

import torch

log = logging.getLogger("pygraphx.cpu")

KERNEL_ENV = "PGX_CPU_GEMM"
KERNELS = ("dnnl", "mkl", "addmm")
#: per-thread speed assumed to estimate a call's time before measuring
ASSUMED_GFLOPS = 50.0
#: calls estimated slower than this are not measured
MAX_MEASURED_SECONDS = 0.05
#: time spent measuring one candidate (at least two timed calls, at most `MAX_REPEATS`)
MEASURE_SECONDS = 0.02
MAX_REPEATS = 5

Key = tuple[int, int, int, int, tuple[str, ...]]
_CHOICES: dict[Key, str] = {}


def forced_kernel() -> str | None:
    """The kernel `PGX_CPU_GEMM` names, or None for `auto` / unset."""
    value = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if value == "auto":
        return None
    if value not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}={value!r}: expected auto or one of {', '.join(KERNELS)}")
    return value


def estimated_seconds(rows: int, k: int, n: int, threads: int) -> float:
    """A rough time of one (rows x k) @ (k x n) product, for deciding whether to measure."""
    return 2.0 * rows * k * n / (ASSUMED_GFLOPS * 1e9 * max(1, threads))


def choose(
    rows: int,
    k: int,
    n: int,
    candidates: Sequence[str],
    make: Callable[[str], Callable[[torch.Tensor], torch.Tensor]],
) -> str:
    """The fastest of `candidates` (kernel names, preferred first) for this product;
    `make(name)` builds a candidate as a function of the (rows, k) input."""
    forced = forced_kernel()
    if forced in candidates:
        return forced
    if len(candidates) == 1:
        return candidates[0]
    threads = torch.get_num_threads()
    key = (rows, k, n, threads, tuple(candidates))
    if key in _CHOICES:
        return _CHOICES[key]
    if estimated_seconds(rows, k, n, threads) > MAX_MEASURED_SECONDS:
        choice = candidates[0]
    else:
        times = measure({name: make(name) for name in candidates}, torch.randn(rows, k))
        choice = min(candidates, key=lambda name: times[name])
        log.debug("cpu gemm %dx%dx%d threads=%d: %s -> %s", rows, k, n, threads,
                  {name: round(t * 1e3, 3) for name, t in times.items()}, choice)  # fmt: skip
    _CHOICES[key] = choice
    return choice


def measure(
    kernels: Mapping[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor
) -> dict[str, float]:
    """Each kernel's best wall time on `x`: one untimed warm-up call (oneDNN creates its
    primitive then), then 2 to `MAX_REPEATS` timed calls (fewer for slow kernels), the kernels
    interleaved so that a burst of load elsewhere hits them alike."""
    first = {}
    for name, fn in kernels.items():
        start = time.perf_counter()
        fn(x)
        first[name] = time.perf_counter() - start
    slowest = max(first.values())
    repeats = max(2, min(MAX_REPEATS, int(MEASURE_SECONDS / max(slowest, 1e-6))))
    best = dict.fromkeys(kernels, float("inf"))
    for _ in range(repeats):
        for name, fn in kernels.items():
            start = time.perf_counter()
            fn(x)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def clear_cache() -> None:
    """Forget the choices made so far (tests; a process whose load changed)."""
    _CHOICES.clear()


__all__ = ["KERNELS", "KERNEL_ENV", "choose", "clear_cache", "estimated_seconds", "measure"]
