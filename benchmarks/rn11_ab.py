"""ResNet-50 end to end, the residual sum written over its operand's slot (rn11, `base`: the
arena plan without `shared_slot`, a binary add post-op into a slot of its own; `over`: the
default, oneDNN's sum post-op over the residual's slot) against ONNX Runtime (`ort`) and
OpenVINO float32 (`ov_f32`), A/B in one process: blocks of runs alternated, the order rotated
each round (`benchmarks/wino_resnet_ab.py`'s report: median wall, best block, process CPU).

    PGX_CONV_CHOICE_CACHE=off python benchmarks/rn11_ab.py --models resnet50:1 --threads 1 2
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)

from benchmarks import wino_resnet_ab  # noqa: E402
from benchmarks.cpu_vs_peers import make_openvino  # noqa: E402
from pygraphx.targets.cpu import target  # noqa: E402

_plain_compile = wino_resnet_ab.compile_mode


def compile_mode(model: object, mode: str, threads: int, budget: str) -> tuple[Callable, str]:
    """`base` (no shared slot), `over` (this tree's default), `ov_f32`; else as
    `wino_resnet_ab.compile_mode`."""
    if mode == "ov_f32":
        run, seconds, note = make_openvino(model, threads, "f32")
        return run, f"compile {seconds:.2f} s; {note}"
    if mode == "base":
        with mock.patch.object(target, "residual_slot", lambda _ins: None):
            return _plain_compile(model, "rule", threads, budget)
    if mode == "over":
        return _plain_compile(model, "rule", threads, budget)
    return _plain_compile(model, mode, threads, budget)


def main(argv: list[str] | None = None) -> int:
    return wino_resnet_ab.cli(
        argv, __doc__, ["base", "over", "ort", "ov_f32"], compile_mode, ["resnet50:1"], [1], budget="1"
    )


if __name__ == "__main__":
    raise SystemExit(main())
