"""Choosing the kernel of a constant-weight GEMM, by default or by measuring at prepare.

`lower_gemm.py` can run `x @ W (+ b)` with a fixed weight through oneDNN (`dnnl`, weight
reordered once), MKL (`mkl`, weight packed once) or plain `torch.addmm` (`addmm`). By default
the first available of these is taken (oneDNN wherever torch has it): on the 2-core AMD EPYC
development machine (Zen 4, torch 2.13, one thread, process CPU time, best of 8-200 calls) it
was the fastest on every BERT-base / GPT-2 shape, 100-110 GFLOP/s against MKL's and addmm's
75-97 (ONNX Runtime's MLAS: 95-113), 2x faster than both on GPT-2's 128 x 768 x 50257 head, and
within noise of them on 1-row products (about 55 us for 768 x 768); measuring cost compile time
and found nothing better here.

One exception: a one-row float32 product (a classifier at batch 1, BERT's pooler) streams its
weight once from memory, where it usually is at that point of a run (the rest of the network's
weights went through the caches since), and there `addmm` (MKL's matrix-vector kernel reading
the plain weight row by row) is the fastest: MobileNetV2's 1280 x 1000 classifier at batch 1,
one thread, 0.27-0.33 ms in the model against oneDNN's 0.41 (ORT: 0.26); with the caches flushed
before each call 0.34-0.38 against 0.45-0.51 for oneDNN (768 x 768: 0.19 against 0.30); warm,
all three are within noise (0.11 ms). A decoder's token steps are one-row products too:
`benchmarks/generate_cpu_interleaved.py` (qwen2_small, batch 1) decoded 153-160 tokens/s at one
thread against 120-128 with `PGX_CPU_GEMM=dnnl`, and 128 against 88 at two (a loaded machine).
From two rows on oneDNN is first again (cold, four rows: 0.54-0.58 ms against addmm's
0.63-0.66), and so is a one-row product with a large weight on several threads: MKL's
matrix-vector kernel runs on one, oneDNN's on all (cold, two threads: 768 x 50257 5.3-5.6 ms
against addmm's 6.9-7.2, 2048 x 8192 1.7-1.9 against 3.0-3.2; 512 x 8000 and 768 x 3072 even;
on one thread addmm leads at every size, 768 x 50257 6.4-6.8 against 9.7-10.2).
`measure` measures warm, so it does not see this.

`PGX_CPU_GEMM=measure` times every candidate at prepare on a random input of the real shape
with the threads the run will use (one untimed warm-up, then the best of 2-5 calls, the kernels
interleaved so that a burst of load elsewhere hits them alike) and takes the fastest, for hosts
where another library may win. Choices are cached for the process by (rows, k, n, threads,
candidates), so a model's repeated layers and later compiles measure nothing (a bias add inside
the GEMM costs every kernel alike, so it is not part of the key). Products estimated to take
longer than `MAX_MEASURED_SECONDS` (at `ASSUMED_GFLOPS` per thread) are not measured: they are
FMA-bound in every library, and the measurement would dominate compile time.

`PGX_CPU_GEMM` values: `auto` (the default), `measure`, or one of `dnnl`, `mkl`, `addmm` for
every product that kernel can run (a product with an activation epilogue runs on oneDNN, the
only one that takes it). Another value is an error naming the variable.
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

#: a one-row product with at least this many weight values runs on oneDNN when it has more
#: than one thread (see the module docstring)
ONE_ROW_PARALLEL = 1 << 23

Key = tuple[int, int, int, int, tuple[str, ...]]
_CHOICES: dict[Key, str] = {}


def setting() -> str:
    """`PGX_CPU_GEMM`: `auto` (also when unset), `measure` or a kernel name."""
    value = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "measure", *KERNELS):
        raise ValueError(
            f"{KERNEL_ENV}={value!r}: expected auto, measure or one of {', '.join(KERNELS)}"
        )
    return value


def one_row_on_addmm(rows: int, k: int, n: int, threads: int | None = None) -> bool:
    """Whether a (rows x k) @ (k x n) float32 product runs on `addmm` first: one row, and one
    thread or a weight below `ONE_ROW_PARALLEL` values (see the module docstring); `threads`
    defaults to torch's count now (the run's, at prepare)."""
    threads = torch.get_num_threads() if threads is None else threads
    return rows == 1 and (threads <= 1 or k * n < ONE_ROW_PARALLEL)


def preferred(rows: int, k: int, n: int, names: Sequence[str]) -> list[str]:
    """The candidate `names` (in the default order) for a (rows x k) @ (k x n) product, most
    preferred first: `addmm` first where `one_row_on_addmm` says so."""
    if "addmm" in names and one_row_on_addmm(rows, k, n):
        return ["addmm", *(name for name in names if name != "addmm")]
    return list(names)


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
    """The kernel for this product among `candidates` (names, preferred first): the one
    `PGX_CPU_GEMM` names, else the first, or with `measure` the fastest measured; `make(name)`
    builds a candidate as a function of the (rows, k) input."""
    mode = setting()
    if mode in candidates:
        return mode
    if mode != "measure" or len(candidates) == 1:
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


__all__ = [
    "KERNELS",
    "KERNEL_ENV",
    "choose",
    "clear_cache",
    "estimated_seconds",
    "measure",
    "one_row_on_addmm",
    "preferred",
    "setting",
]
