"""bf16 programs end to end: 3x3 layers on oneDNN's bf16 kernels (`old`,
`PGX_WINOGRAD_NATIVE_BF16=0`) against the native F(4,3) kernel on bf16 activations (`new`, the
default), A/B in one process (helper bf16wino14, issue 10).

    PYTHONPATH=. python benchmarks/bf16wino14_ab.py --models unet_small yolov8_style \
        resnet50 mobilenetv2 --threads 2 --variants old new openvino

A wrapper of `benchmarks/ab_harness.py` (the one harness; its docstring says what it prints).
Models: `benchmarks/zoo.py`'s (UNet-small, YOLOv8-style, full size) or built-ins (batch 1).
bf16 = `quantize_bf16`'s default "products" policy (what `cpu_vs_peers --bf16` runs);
`openvino`: OpenVINO (bf16) as one more variant. Each program is compiled once (the switch is
read at compile); timing alternates blocks of runs (a settle run, then `--repeat` timed runs)
of the variants, the order reversed every round (both orders). Reported per variant: the
median block (wall at 2+ threads, thread CPU at 1), the best block, process CPU ms a run, the
relative RMS error against ONNX Runtime float32; kept here: each compile's convolution kernel
counts (the `pygraphx.cpu` log line). `load` stays importable here.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.torch_lowering.winograd_native import BF16_ENV  # noqa: E402

VARIANTS = {"old": "0", "new": "1"}
ZOO = ("unet_small", "yolov8_style")
NAMED = {k: ab.Variant(k, {BF16_ENV: v}, bf16=True) for k, v in VARIANTS.items()}


class _Chosen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "convolution" in msg or "measured" in msg:
            self.lines.append(msg)


def load(name: str) -> tuple:
    """(model, feeds) of a zoo model at full size or a built-in at batch 1."""
    if name in ZOO:
        from benchmarks.cpu_vs_peers import load_zoo

        model, feeds, _ = load_zoo(name, "full")
        return model, feeds
    model = get_model(name, batch=1)
    return model, model_inputs(name, model)


def logged(variant: ab.Variant) -> ab.Variant:
    """`variant`, compiled with the cpu target's convolution log lines printed."""

    def build(case: ab.Case, threads: int):
        chosen = _Chosen()
        log = logging.getLogger("pygraphx.cpu")
        log.addHandler(chosen)
        level = log.level
        log.setLevel(logging.INFO)
        try:
            prog = ab.compile_variant(case, threads, ab.Variant(variant.name, variant.env, True))
        finally:
            log.removeHandler(chosen)
            log.setLevel(level)
        print(f"  {case.spec} {variant.name}: {' | '.join(chosen.lines)}", flush=True)
        return prog

    return ab.Variant(variant.name, variant.env, True, build)


def main(argv: list[str] | None = None) -> int:
    named = {k: logged(v) for k, v in NAMED.items()}
    return ab.main(argv, description=__doc__.splitlines()[0], named=named,
                   default_names=["old", "new"], models=list(ZOO), threads=[2], rounds=6,
                   runs=8, settle=1)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
