"""ResNet-50 at 2 threads (helper rn12): oneDNN implementations forced on the 1x1 layers, and
the Winograd modes of `benchmarks/wino2_e2e.py`, A/B in one process against ONNX Runtime and
OpenVINO float32 (blocks of runs alternated, the order rotated each round: the report of
`benchmarks/wino_resnet_ab.py`: median wall, best block, process CPU).

Modes: those of `wino2_e2e.py` (`rule`, `rule:T:C`, `off`, a `/fresh` suffix ...) and of
`rn11_ab.py` (`ov_f32`), plus `MODE+1x1:WHICH=IMPL`: MODE with the 1x1 stride-1 layers chosen
by WHICH run on oneDNN's first implementation whose name starts with IMPL (e.g.
`rule+1x1:res=jit_1x1:avx512_core`); a `/res_off` suffix: MODE with
`PGX_CONV_RESIDUAL_1X1=off` (oneDNN's first implementation on the narrow residual expansions,
the path before rn12; the suffix goes last: `rule/fresh/res_off`). WHICH: `res` (the residual
expansions, whose epilogue adds a residual: `ConvPlan.accumulate`, or a binary add), `res64`
(those of at most 64 input channels: ResNet-50's 56x56 expansions), `narrow` (fewer than 256
input channels), `all`, and `stem` (the layer of 3 input channels, any kernel size).

    PGX_CPU_LOAD_ADAPT=0 PGX_CONV_CHOICE_CACHE=off PYTHONPATH=. python benchmarks/rn12_ab.py \\
        --models resnet50:8 --threads 2 --modes rule rule+1x1:res=jit_1x1:avx512_core ort
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)

from benchmarks import rn11_ab, wino2_e2e, wino_resnet_ab  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, conv_fusion, onednn_conv  # noqa: E402

#: wino2_e2e's compile (itself over wino_resnet_ab's), taken before either is patched
_wino_compile = wino2_e2e.compile_mode


def _picks(which: str, plan: object, other: bool) -> bool:
    w = plan.weight
    if which == "stem":  # (any kernel size: the layer reading the image)
        return w.shape[1] == 3 and plan.groups == 1
    if tuple(w.shape[2:]) != (1, 1) or any(s != 1 for s in plan.stride) or plan.groups != 1:
        return False
    if which == "res":
        return bool(plan.accumulate) or other
    if which == "res64":
        return (bool(plan.accumulate) or other) and w.shape[1] <= 64
    if which == "narrow":
        return w.shape[1] < 256
    if which == "all":
        return True
    raise ValueError(f"rn12_ab: unknown layer set {which!r} (res, res64, narrow, all, stem)")


def compile_mode(model: object, mode: str, threads: int, budget: str) -> tuple[Callable, str]:
    """`MODE+1x1:WHICH=IMPL` (see the module docstring), else rn11's / wino2's modes."""
    if mode == "ov_f32":
        return rn11_ab.compile_mode(model, mode, threads, budget)
    if mode.endswith("/res_off"):
        with mock.patch.dict(os.environ, {conv_choice.RESIDUAL_1X1_ENV: "off"}):
            return compile_mode(model, mode[: -len("/res_off")], threads, budget)
    base, plus, force = mode.partition("+1x1:")
    if not plus:
        return _wino_compile(model, mode, threads, budget)
    which, _, prefix = force.partition("=")
    original = conv_fusion.choose_kernel
    forced: list[str] = []

    def choose(state: object, plan: object, other_lens: object) -> str:
        kernel = original(state, plan, other_lens)
        if kernel == "dnnl" and _picks(which, plan, other_lens is not None):
            names = onednn_conv.implementations(plan, other_lens is not None)
            hit = next((n for n in names if n.startswith(prefix)), None)
            if hit is None:
                raise ValueError(f"rn12_ab: no implementation {prefix!r} among {names}")
            plan.impl = None if hit == names[0] else hit
            forced.append(hit)
        return kernel

    with mock.patch.object(conv_fusion, "choose_kernel", choose):
        run, note = _wino_compile(model, base, threads, budget)
    return run, f"{note}; forced {len(forced)} layers: {', '.join(sorted(set(forced)))}"


def main(argv: list[str] | None = None) -> int:
    return wino_resnet_ab.cli(
        argv, __doc__, ["rule", "rule+1x1:res=jit_1x1", "ort"], compile_mode, ["resnet50:8"], [2], budget="1"
    )


if __name__ == "__main__":
    raise SystemExit(main())
