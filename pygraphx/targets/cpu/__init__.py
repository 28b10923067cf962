"""The `cpu` target: programs lowered to torch on the CPU (oneDNN / MKL for conv and GEMM).

Importing this package does not import torch; `make_target()` does, and says how to install it
when it is missing.

OpenMP threads: when torch is not imported yet and the user has set neither `OMP_WAIT_POLICY`
nor `GOMP_SPINCOUNT`, `configure_openmp()` sets `GOMP_SPINCOUNT` to `spincount()`: an idle
OpenMP worker spins that many rounds (a `pause` each, 40-140 cycles by processor) and then
sleeps, instead of spinning for GNU OpenMP's default 300000 rounds (milliseconds). The count is
`SPINCOUNT` where this process may use fewer than `MANY_CORES` physical cores (affinity and
cgroup quota, `threads.BUDGET`), `SPINCOUNT_MANY` where it may use more; both are 10000 (a few
hundred microseconds) since the 2-core measurement below, kept apart so that either can move.

On few cores: it was 1000 (tens of microseconds) until a quiet 2-core EPYC (2 threads,
2026-11-26, `benchmarks/cpu_vs_peers.py --threads 2 --no-openvino`, processes at each setting,
`benchmarks/results/cpu2_spin{1000,10000,30000}_t2_session9.json` and the reruns in the
session-9 note) showed MobileNetV2 at batch 1 unstable at 1000: 5.2-9.5 ms a run (1.29-2.06x
ORT in the same processes) against 4.7-6.7 ms (0.97-1.16x) at 10000-30000, its workers falling
asleep in the gaps between its ~60 short regions; ResNet-50, BERT-base and MobileNetV2 at batch
8 moved within the machine's noise (ResNet-50 b1 1.04 / 1.03 / 0.99x ORT, b8 0.98 / 0.97 /
0.96; BERT-base b1 1.00 / 0.93 / 0.99, b8 0.88 / 0.93 / 0.88).

Why not less: a run's parallel regions (oneDNN convolutions, GEMMs, torch's kernels) are
separated by the Python and dispatch time of the steps between them, 10-50 us; workers that
fall asleep in those gaps must be woken by a system call at every region, and a team of 16
woken some 50 times per MobileNetV2 run costs milliseconds. Why more on many cores: the same
count bounds the wait at the barrier that ends a region, so in a long, unevenly split region (a
transformer's or ResNet's GEMMs and convolutions on 16 threads) the threads that finish first,
the calling thread among them, fall asleep and must be woken when the last one arrives; the
gaps of view and copy steps between a transformer's GEMMs can outlast 1000 rounds too (both
are the likely reasons, not measured apart). On the
16-core Xeon host (H200 machine, torch 2.11, 2026-11-26, 16 threads, batch 1, processes at 1000
and 10000 alternating, two each, `benchmarks/results/h200host16_s7_ab_log.txt`): BERT-base
36.1 / 36.6 ms at 1000 against 29.4 / 30.3 at 10000 (ORT in the same processes 33.9 / 35.7 and
33.6 / 31.7), ResNet-50 10.5 / 10.4 against 8.5 / 8.8 (ORT 9.9 / 9.7 and 8.7 / 9.1), MobileNetV2
no change beyond ORT's own drift. The price is CPU time: per run 1.2x ORT's on MobileNetV2 in
blocks after a pygraphx block (1.05-1.09x at 1000), but 1.4-1.8x in blocks right after ORT's,
whose pool was still spinning (workers then spin out their rounds instead of sleeping; the
latency did not change); BERT-base and ResNet-50 0.9-1.0x ORT's. Counting each engine's own
threads (`benchmarks/cpu_threads_probe.py --ab --engines on@16 ort@16`, ratios per round of
alternating blocks, `benchmarks/results/host16_s8_table_b{1,8}.json`): 0.69-1.10x ORT's CPU
time on ResNet-50, MobileNetV2, BERT-base and GPT-2 at batch 1 and 8.
Why not more: on a fresh 16-core host (H100 machine, 2026-11-26, 16 threads, batch 1, pygraphx
alone in each process, processes at 10000 / 100000 / 1000000 / `OMP_WAIT_POLICY=active`
alternating, twice, `benchmarks/results/host16_s8_alone_*_{1,2}.json`) ResNet-50 took 7.1 / 8.0,
8.4 / 7.7, 8.1 / 8.4 and 8.6 / 6.8 ms, MobileNetV2 1.72 / 1.76, 1.66 / 1.81, 1.74 / 1.73 and
2.16 / 1.63 ms: no order beyond the host's drift, so the gaps of a run are already covered at
10000 (two earlier single calls that favoured `active` by 15-25% did not hold up).
Why not more, and why not on few cores: after a run, or between runs, workers that keep
spinning burn the time slices that other work on the same cores needs (another thread pool,
other processes), and every parallel region then waits for its own descheduled laggards.
History: GNU OpenMP's default spun so long that on 2 cores shared with other work (load average
14) MobileNetV2 at batch 1 took 160-350 ms at spin 10000 against 7.4-51 ms at spin 100; on such
a machine `scheduling.load_threads` now runs on one thread, where no region starts at all.
`benchmarks/cpu_threads_probe.py --spincounts 100 1000 10000` compares settings on a host.

`import pygraphx` calls `configure_openmp()`, so the setting holds whenever pygraphx is imported
before torch; when torch came first (GNU OpenMP reads the variable once, when it loads),
`make_target()` warns once and says what to do. `openmp_setting()` says what holds (the first
run logs it, level INFO, logger `pygraphx.cpu`).

Huge pages for large tensors: `import pygraphx` also calls `configure_allocator()`, which sets
torch's `THP_MEM_ALLOC_ENABLE=1` when the user has not set it, torch is not imported yet (its CPU
allocator reads the variable once, at its first allocation) and the kernel offers transparent
huge pages (`/sys/kernel/mm/transparent_hugepage/enabled` is not `[never]`): torch's allocator
then asks for huge pages (`madvise(MADV_HUGEPAGE)`) on every allocation of 2 MiB or more, and
page-aligns allocations. The cpu target's packed GEMM weights are such allocations (BERT-base:
85M float32 weights, 340 MB, streamed through the caches once a run); on 4 KiB pages every run
walks some 83,000 of them. Measured on the 2-core AMD EPYC (Zen 4, THP `madvise`, torch 2.13,
batch 1, process CPU time a run, fresh processes alternating with and without huge pages while
other work ran; `benchmarks/xfmr2_thp_ab.py`, benchmarks/results/xfmr2_thp.md): BERT-base at one
thread faster in 8 of 9 pairs, by 4.5 ms (2 %) on average; GPT-2 317.1 against 324.7 ms at one
thread, 327.1 against 336.6 at two; BERT-base at two threads even (238.1 / 238.5); ResNet-50 and
MobileNetV2 no slower; peak memory unchanged. `PGX_CPU_HUGE_PAGES=0` leaves the variable alone;
`allocator_setting()` says what holds (logged with the OpenMP line).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygraphx.targets.cpu.target import CpuTarget


def make_target(**settings: Any) -> CpuTarget:
    """The `cpu` target (needs torch); `settings` as `CpuTarget` takes them (`threads=N`)."""
    if not configure_openmp():
        _warn_spinning()
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the 'cpu' target needs PyTorch, which is not installed: "
            "pip install 'pygraphx[torch]' (or pip install torch), or use get_target('ref')"
        ) from exc
    from pygraphx.targets.cpu.target import CpuTarget

    return CpuTarget(**settings)


#: GNU OpenMP spin rounds before an idle worker sleeps (see the module docstring): where this
#: process may use fewer than `MANY_CORES` physical cores, and where it may use more
SPINCOUNT = "10000"
SPINCOUNT_MANY = "10000"
MANY_CORES = 8


def spincount(cores: int | None = None) -> str:
    """The `GOMP_SPINCOUNT` pygraphx sets for a process that may use `cores` physical cores
    (default: this process's, as `threads.BUDGET` counts them)."""
    if cores is None:
        from pygraphx.targets.cpu.threads import BUDGET  # imports no torch

        cores = BUDGET.total
    return SPINCOUNT_MANY if cores >= MANY_CORES else SPINCOUNT


#: what `configure_openmp` found or did (see `openmp_setting`)
_setting = ""


def configure_openmp() -> bool:
    """Bound how long idle OpenMP workers spin (see the module docstring), if it is not too
    late (torch not imported yet) and the user has not chosen. False when it is too late
    (`make_target` then says so once)."""
    global _setting
    if _setting == f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')} (set by pygraphx)":
        return True
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in os.environ:
            _setting = f"{name}={os.environ[name]} (from the environment)"
            return True
    if "torch" in sys.modules:
        _setting = "GNU OpenMP's default spin (torch was imported before pygraphx)"
        return False
    spin = spincount()
    os.environ["GOMP_SPINCOUNT"] = spin
    _setting = f"GOMP_SPINCOUNT={spin} (set by pygraphx)"
    return True


def openmp_setting() -> str:
    """One line: the OpenMP waiting policy torch's workers run with, and who chose it."""
    return _setting or "not configured (pygraphx.targets.cpu.configure_openmp was not called)"


_warned = False


def _warn_spinning() -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        "pygraphx cpu target: torch was imported before pygraphx, so OpenMP's idle workers "
        "spin for GNU OpenMP's default 300000 rounds, which slows runs when other work shares "
        f"the cores; import pygraphx first or set GOMP_SPINCOUNT={spincount()} in the "
        "environment",
        RuntimeWarning,
        stacklevel=3,
    )


#: torch's CPU allocator setting (see the module docstring) and pygraphx's switch for it
THP_ENV = "THP_MEM_ALLOC_ENABLE"
HUGE_PAGES_ENV = "PGX_CPU_HUGE_PAGES"
THP_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"

#: what `configure_allocator` found or did (see `allocator_setting`)
_allocator = ""


def _thp_offered(path: str = THP_SYSFS) -> bool:
    """The kernel offers transparent huge pages to a process that asks (`always` or
    `madvise` selected); False where the file is missing or unreadable (not Linux)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return False
    return "[never]" not in text and "[" in text


def configure_allocator(sysfs: str = THP_SYSFS) -> bool:
    """Ask torch's CPU allocator for huge pages on large tensors (see the module docstring),
    if it is not too late (torch not imported yet), the user has not chosen (`THP_ENV` set, or
    `HUGE_PAGES_ENV=0`) and the kernel offers them. True when the variable is set now."""
    global _allocator
    if _allocator == f"{THP_ENV}=1 (set by pygraphx)" and os.environ.get(THP_ENV) == "1":
        return True
    if THP_ENV in os.environ:
        _allocator = f"{THP_ENV}={os.environ[THP_ENV]} (from the environment)"
        return False
    if os.environ.get(HUGE_PAGES_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        _allocator = f"torch's default pages ({HUGE_PAGES_ENV}=0)"
        return False
    if "torch" in sys.modules:
        _allocator = "torch's default pages (torch was imported before pygraphx)"
        return False
    if not _thp_offered(sysfs):
        _allocator = "torch's default pages (the kernel offers no transparent huge pages)"
        return False
    os.environ[THP_ENV] = "1"
    _allocator = f"{THP_ENV}=1 (set by pygraphx)"
    return True


def allocator_setting() -> str:
    """One line: whether torch's CPU allocator asks for huge pages, and who chose it."""
    return _allocator or "not configured (pygraphx.targets.cpu.configure_allocator was not called)"


configure_openmp()  # on import: `import pygraphx` imports this package before anything loads torch
configure_allocator()

__all__ = [
    "HUGE_PAGES_ENV",
    "MANY_CORES",
    "SPINCOUNT",
    "SPINCOUNT_MANY",
    "THP_ENV",
    "allocator_setting",
    "configure_allocator",
    "configure_openmp",
    "make_target",
    "openmp_setting",
    "spincount",
]
