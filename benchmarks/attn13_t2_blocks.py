"""bf16 attention blocks at two threads under load: the oneDNN route (A) and the native kernel
(B), process CPU time (both threads, OpenMP's spin-waits included) per call, median of 11
alternating rounds of 10 calls, and the fastest round's wall time per call.

    PYTHONPATH=. python benchmarks/attn13_t2_blocks.py

On a machine others share, the fastest wall round is the best estimate of the uncontended
2-thread time; process CPU shows the work and waiting the threads did.
"""

import statistics
import sys
import time
from pathlib import Path

import pygraphx  # noqa: F401  (before torch: it sets OpenMP's spin count)
import torch
from pygraphx.targets.torch_lowering import native_attention as na  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_attention as oa  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _bf16_attention  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attn13_ab import operands  # noqa: E402

SHAPES = {"bert b1": (1, 12, 64, 128, 1), "minilm b8": (8, 12, 32, 128, 1),
          "vit b1": (1, 12, 64, 197, 0)}  # fmt: skip


def main() -> int:
    torch.set_num_threads(2)
    for name, (b, h, d, s, m) in SHAPES.items():
        q, kt, v, mask = operands(b, h, d, s, bool(m))
        scale = d**-0.5
        fns = {"A": oa.attend(scale, {}, _bf16_attention(scale)), "B": na.attend(scale, {}, None)}
        cpu: dict[str, list[float]] = {n: [] for n in fns}
        wall: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(11):
            for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(10):
                    fns[n](q, kt, v, mask)
                cpu[n].append((time.process_time() - c0) / 10)
                wall[n].append((time.perf_counter() - w0) / 10)
        print(f"{name} 2 threads: process CPU us A/B {statistics.median(cpu['A']) * 1e6:.0f} "
              f"{statistics.median(cpu['B']) * 1e6:.0f}  min wall us A/B "
              f"{min(wall['A']) * 1e6:.0f} {min(wall['B']) * 1e6:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
