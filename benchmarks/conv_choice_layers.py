"""What the cpu target's convolution choice measures on each layer of a built-in model.

    python benchmarks/conv_choice_layers.py resnet50 mobilenetv2
    PGX_CONV_KERNEL=measure python benchmarks/conv_choice_layers.py mobilenetv2

Compiles each model (batch 1, random weights) for the cpu target with nothing cached (the
choice cache file off) and prints, for every layer `conv_choice` times: its input and weight
shapes, stride, groups, whether the epilogue adds another tensor, the time spent on it, each
candidate's best call time over oneDNN's first implementation's, and the choice. This is the
data behind the rules that leave layers untimed (`conv_choice.WIDE_1X1_CHANNELS`,
`GENERIC_KERNEL`, `MIN_1X1_PIXELS`): a layer those rules skip is not printed, so run it on
the commit before a new rule to see what the rule gives up.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def layer_line(plan: Any, times: dict[str, float], spent: float, other: bool) -> str:
    """One measured layer: shapes, geometry, seconds spent, each candidate's time ratio."""
    from pygraphx.targets.torch_lowering import conv_choice

    first = times[next(iter(times))]
    ratios = " ".join(f"{k.split('/')[-1]}={v / first:.2f}" for k, v in times.items())
    return (
        f"{str(list(plan.x_lens)):20s} w{str(list(plan.weight.shape)):18s} s{list(plan.stride)} "
        f"g{plan.groups} other={other} {spent * 1e3:5.0f}ms  {ratios} "
        f"first={first * 1e6:.0f}us -> {conv_choice.pick(times).split('/')[-1]}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args(argv)
    os.environ["PGX_CONV_CHOICE_CACHE"] = "off"
    import onnx

    import pygraphx
    import pygraphx.targets  # noqa: F401  (before torch: see pygraphx/targets/__init__.py)
    from pygraphx.models import get_model
    from pygraphx.targets.torch_lowering import conv_choice

    timer = conv_choice.time_kernels

    def traced(plan: Any, names: list[str], other: Any, deadline: float = float("inf")) -> Any:
        start = time.perf_counter()
        times = timer(plan, names, other, deadline)
        print(layer_line(plan, times, time.perf_counter() - start, other is not None))
        return times

    conv_choice.time_kernels = traced
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(get_model(name, batch=1), str(path))
            print(f"# {name} (load average {os.getloadavg()[0]:.1f})")
            prog = pygraphx.parse_onnx(str(path))
            start = time.perf_counter()
            prog.compile(pygraphx.get_target("cpu"))
            print(f"# compiled in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
