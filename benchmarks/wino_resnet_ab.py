"""ResNet-50 (or another model) end to end with and without the Winograd kernels: A/B in one
process, ONNX Runtime timed in the same alternation.

    python benchmarks/wino_resnet_ab.py --models resnet50:1 resnet50:8 --threads 2
    python benchmarks/wino_resnet_ab.py --modes impl winograd measure --rounds 6 --repeat 5

Modes are `conv_kernel` settings of the cpu target (`conv_choice.py`): `impl` (the default:
oneDNN's implementations timed, no Winograd), `winograd` / `winograd2` (forced on every 3x3
stride-1 layer, the default kernel elsewhere), `measure` (every kernel timed per layer, the
Winograd ones included, with a 30 s budget, `--budget`, so that every layer is timed), `rule`
(the default mode with `PGX_CONV_WINOGRAD=rule`: the layers `winograd_rule.by_rule` names on F(4,3)
untimed; the other modes run with it off), and `ort`. Run with `PGX_CONV_CHOICE_CACHE=off` so
that no mode reuses choices another process measured. A wrapper of `benchmarks/ab_harness.py`
(the one harness): the timing alternates blocks of runs (one settle run, then `--repeat` timed
runs) of every mode, the order reversed each round, so that load from other processes falls on
all alike. Reported per mode: the median block (wall at 2 threads, thread CPU at 1), the best
block, process CPU ms per run, the ratio to ORT's median (`ort` runs first), the relative RMS
error against ORT, and the kernels chosen.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,I001  (first: pygraphx sets OpenMP's spin count before torch)
import onnx  # noqa: E402

from benchmarks import ab_harness as ab  # noqa: E402
from benchmarks.arena_conv_ab import load  # noqa: E402
from benchmarks.cpu_vs_peers import make_ort  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice  # noqa: E402


def compile_mode(model: object, mode: str, threads: int, budget: str) -> tuple[Callable, str]:
    """The run function of `model` compiled with `conv_kernel=mode` (a fresh choice cache,
    `budget` seconds of timing), and its kernel counts."""
    os.environ[conv_choice.BUDGET_ENV] = budget
    os.environ[conv_choice.WINOGRAD_ENV] = "rule" if mode == "rule" else "off"
    conv_choice.clear_cache()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    start = time.perf_counter()
    prog.compile(CpuTarget(conv_kernel="impl" if mode == "rule" else mode, threads=threads))
    seconds = time.perf_counter() - start
    chosen = prog._executable.lowered.ctx.cache["conv_choice"].chosen
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(chosen.items()))
    return (lambda feeds: prog.run(feeds)), f"compile {seconds:.2f} s; {kinds}"


def timed_block(run: Callable, feeds: dict, repeat: int) -> list[tuple[float, float]]:
    """One warm-up run, then (wall, process CPU) seconds of each of `repeat` runs."""
    run(feeds)
    clocks = (time.perf_counter, time.process_time)
    out = []
    for _ in range(repeat):
        start = [c() for c in clocks]
        run(feeds)
        out.append(tuple(c() - s for c, s in zip(clocks, start, strict=True)))
    return out


class _Runner:
    """A run function with a program's `run(feeds)`."""

    def __init__(self, run: Callable) -> None:
        self.run = run


def variant(mode: str, compile_fn: Callable, budget: str) -> ab.Variant:
    """The harness's variant of `mode` (`ort`: ONNX Runtime), compiled by `compile_fn`."""

    def build(case: ab.Case, threads: int) -> _Runner:
        model = onnx.load_from_string(case.data)
        if mode == "ort":
            return _Runner(make_ort(model, threads)[0])
        run, note = compile_fn(model, mode, threads, budget)
        print(f"  {case.spec} t{threads} {mode}: {note}", flush=True)
        return _Runner(run)

    return ab.Variant(mode, build=build, label=f"mode {mode}")


def cli(
    argv: list[str] | None,
    doc: str,
    modes: list[str],
    compile_fn: Callable[[object, str, int, str], tuple[Callable, str]] | None = None,
    models: list[str] | None = None,
    threads: list[int] | None = None,
    budget: str = "30",
) -> int:
    """The command line of this A/B, and of the scripts that add modes to it (`rn11_ab.py`,
    `wino2_e2e.py`, `rn12_ab.py`: their own `compile_fn` takes the place of `compile_mode`):
    `benchmarks/ab_harness.py` over the modes, `ort` (when named) first, so that the ratio
    column is each mode's to ONNX Runtime."""
    p = ab.parser(doc.split("\n")[0], models=models or ["resnet50:1"], threads=threads or [2],
                  rounds=6, runs=5, settle=1, env_options=False)  # fmt: skip
    p.add_argument("--modes", nargs="+", default=modes)
    p.add_argument("--budget", default=budget, help="PGX_CONV_CHOICE_BUDGET seconds")
    args = p.parse_args(argv)
    fn = compile_fn or compile_mode
    order = (["ort"] if "ort" in args.modes else []) + [m for m in args.modes if m != "ort"]
    variants = [variant(m, fn, args.budget) for m in order]
    cases = []
    for spec in args.models:
        label, model, feeds = load(spec)
        cases.append(ab.Case(label, model.SerializeToString(), feeds))
    return ab.run(cases, variants, ab.configs_of(args), args.json, {"argv": sys.argv[1:]})


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__, ["impl", "winograd", "measure", "ort"])


if __name__ == "__main__":
    raise SystemExit(main())
