"""Probe: the cpu target's arena on transparent huge pages, A/B in one process.

    python benchmarks/mnv2dw_thp.py --batch 1 --threads 1 [--huge-first]

Where THP is `madvise` only (the 2-core EPYC VM: `/sys/kernel/mm/transparent_hugepage/enabled`
is `always [madvise] never`), the arena of intermediates (`context.allocate_arena`, one
`torch.empty`) lives on 4 KiB pages. This compiles MobileNetV2 twice and, on one program,
gives the arena's whole 2 MiB pages back (`MADV_DONTNEED`) and marks them `MADV_HUGEPAGE`, so
the next run faults them in as huge pages; then it runs the two in alternating blocks and
prints the median wall and process CPU ms per run of each. Nothing in pygraphx does this yet.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

MADV_DONTNEED, MADV_HUGEPAGE, HUGE = 4, 14, 2 << 20


def compiled(model: object, threads: int, huge: bool) -> object:
    """MobileNetV2 compiled for the cpu target, its arena on huge pages when `huge`."""
    from pygraphx.targets.cpu.target import CpuTarget

    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads))
    if huge:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        arena = prog._executable.lowered.ctx.arena
        lo = (arena.data_ptr() + HUGE - 1) & ~(HUGE - 1)
        hi = (arena.data_ptr() + arena.numel()) & ~(HUGE - 1)
        for advice in (MADV_DONTNEED, MADV_HUGEPAGE):
            if hi > lo and libc.madvise(lo, hi - lo, advice) != 0:
                raise OSError(ctypes.get_errno(), f"madvise({advice}) on the arena")
    return prog


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--huge-first", action="store_true")
    args = p.parse_args(argv)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = model_inputs("mobilenetv2", model)
    order = [True, False] if args.huge_first else [False, True]
    progs = {huge: compiled(model, args.threads, huge) for huge in order}
    for prog in progs.values():
        for _ in range(5):
            prog.run(feeds)
    runs = 20 if args.batch == 1 else 3
    rows: dict[bool, list[tuple[float, float]]] = {h: [] for h in order}
    for r in range(args.rounds):
        for huge in order if r % 2 == 0 else order[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(runs):
                progs[huge].run(feeds)
            rows[huge].append(((time.perf_counter() - wall) / runs * 1e3,
                               (time.process_time() - cpu) / runs * 1e3))  # fmt: skip
    for huge in order:
        wall = statistics.median(w for w, _ in rows[huge])
        cpu = statistics.median(c for _, c in rows[huge])
        print(f"{'huge' if huge else '4k'}: wall {wall:.3f} ms  cpu {cpu:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
