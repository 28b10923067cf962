"""bf16's graph tail in float32 (`truncate_float.WIDE_TAIL`, `PGX_BF16_WIDE_TAIL`): A/B in one
process, the earlier rule ("old") against the tail rule ("new"), with each one's relative RMS
error against ONNX Runtime float32 (and OpenVINO bf16's, `--openvino`).

    PYTHONPATH=. python benchmarks/yolo13_ab.py --threads 2 --rounds 8 --repeat 5 --openvino
    PYTHONPATH=. python benchmarks/yolo13_ab.py --models resnet50 mobilenetv2 --rounds 0

A wrapper of `benchmarks/ab_harness.py` (the one harness): both programs are quantized
(`quantize_bf16`, the default "products" policy), the rule switched by the module constant
while each compiles (`@pygraphx.quantize.truncate_float.WIDE_TAIL`), compiled for `cpu` with
the target's defaults (arena conv outputs, step threads, as `cpu_vs_peers.py`). Kept here: per
model, whether the two quantized programs differ at all (printed form; identical ones compile
to the same steps). Then each one's error, and (`--rounds` > 0) timing in alternating blocks -
a settle run and `--repeat` timed runs of one program, then of the other, the order reversed
every round - the median block (wall at 2 threads, thread CPU at 1), the best block, the
process CPU ms a run.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks import ab_harness as ab  # noqa: E402

#: the module (the package's `truncate_float` attribute is the function of that name)
truncate_float = importlib.import_module("pygraphx.quantize.truncate_float")
KEY = "@pygraphx.quantize.truncate_float.WIDE_TAIL"
NAMED = {"old": ab.Variant("old", {KEY: "False"}, bf16=True),
         "new": ab.Variant("new", {KEY: "True"}, bf16=True)}  # fmt: skip


def identical(spec: str) -> bool:
    """Whether the two rules quantize the model to the same program (printed form)."""
    data = ab.load(spec).data
    text = []
    for wide in (False, True):
        prog = pygraphx.parse_onnx_buffer(data)
        with ab.settings({KEY: str(wide)}):
            pygraphx.quantize_bf16(prog)
        text.append(str(prog))
    return text[0] == text[1]


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=["yolov8_style"], threads=2, rounds=8, runs=5,
                  settle=1, named=NAMED, default_names=["old", "new"])  # fmt: skip
    args = p.parse_args(argv)
    for spec in args.models:
        same = identical(spec)
        print(f"{spec}: quantized programs {'identical' if same else 'differ'}", flush=True)
    return ab.run_args(args, named=NAMED)


if __name__ == "__main__":
    raise SystemExit(main())
