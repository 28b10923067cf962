"""ResNet-50 end to end, the residual sum written over its operand's slot (rn11, `base`: the
arena plan without `shared_slot`, a binary add post-op into a slot of its own; `over`: the
default, oneDNN's sum post-op over the residual's slot) against ONNX Runtime (`ort`) and
OpenVINO float32 (`ov_f32`), A/B in one process: blocks of runs alternated, the order rotated
each round (`benchmarks/wino_resnet_ab.py`'s report: median wall, best block, process CPU).

    PGX_CONV_CHOICE_CACHE=off python benchmarks/rn11_ab.py --models resnet50:1 --threads 1 2
"""

from __future__ import annotations

import argparse
import itertools
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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50:1"], help="name[:batch] or zoo")
    p.add_argument("--modes", nargs="+", default=["base", "over", "ort", "ov_f32"])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    wino_resnet_ab.compile_mode = compile_mode
    for spec, threads in itertools.product(args.models, args.threads):
        wino_resnet_ab.ab(spec, args.modes, threads, args.rounds, args.repeat, "1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
