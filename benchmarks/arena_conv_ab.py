"""`conv_output="torch"` vs `"arena"` on the cpu target: A/B in one process.

    python benchmarks/arena_conv_ab.py --threads 1 2 --rounds 6 --repeat 8
    python benchmarks/arena_conv_ab.py --models mobilenetv2:1 resnet50:1 yolov8_style
    python benchmarks/arena_conv_ab.py --bf16 --threads 1   # quantize_bf16 ("products") first

Both programs are compiled from the same ONNX model (`target.conv_output=torch` / `arena`); a
wrapper of `benchmarks/ab_harness.py` (the one harness): the timing alternates blocks of runs
(a settle run, then `--repeat` timed runs) of the two modes, the order swapped every round, so
load from other processes falls on both alike. Reported per mode: the median block (wall at 2
threads, thread CPU at 1), the best block, and process CPU ms per run (all threads of this
process). Outputs are checked against ONNX Runtime and the arena's size is printed. `load`
stays importable here (wino_resnet_ab.py, rn12_steps_ab.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness  # noqa: E402
from benchmarks.cpu_vs_peers import load_zoo  # noqa: E402
from benchmarks.zoo import ZOO_NAMES  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

MODES = ("torch", "arena")


def load(spec: str) -> tuple[str, onnx.ModelProto, dict[str, np.ndarray]]:
    """`name[:batch]` -> (label, model, inputs): a built-in model or a zoo model ("full")."""
    name, _, batch = spec.partition(":")
    if name in ZOO_NAMES:
        model, feeds, b = load_zoo(name, "full")
        return f"{name} b{b}", model, feeds
    model = get_model(name, batch=int(batch or 1))
    return f"{name} b{batch or 1}", model, model_inputs(name, model)


NAMED = {m: ab_harness.Variant(m, {f"{ab_harness.TARGET}conv_output": m}) for m in MODES}


def arena(prog) -> str:
    ctx = prog._executable.lowered.ctx
    return (f"arena {ctx.plan.arena_bytes / 1e6:6.2f} MB, conv into slot "
            f"{ctx.cache.get('conv_into_slot', 0)}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    models = ["mobilenetv2:1", "mobilenetv2:8", "resnet50:1", "yolov8_style"]
    p = ab_harness.parser(__doc__.split("\n")[0], models=models, threads=[1, 2], rounds=6,
                          runs=8, settle=1, named=NAMED, default_names=list(MODES))  # fmt: skip
    args = p.parse_args(argv)
    return ab_harness.run_args(args, named=NAMED, note=arena)


if __name__ == "__main__":
    raise SystemExit(main())
