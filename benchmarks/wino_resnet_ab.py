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
that no mode reuses choices another process measured. The timing alternates blocks of runs (one
warm-up run, then `--repeat` timed runs) of every mode, the order rotated each round, so that
load from other processes falls on all alike. Reported per mode: median wall ms over all timed
runs, the best block median, mean process CPU ms per run, the ratio to ORT's median, the
relative RMS error against ORT, and the kernels chosen.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,I001  (first: pygraphx sets OpenMP's spin count before torch)
import numpy as np  # noqa: E402

from benchmarks.arena_conv_ab import load  # noqa: E402
from benchmarks.cpu_vs_peers import make_ort, relative_error  # noqa: E402
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


def ab(
    spec: str, modes: list[str], threads: int, rounds: int, repeat: int, budget: str = "30"
) -> None:
    label, model, feeds = load(spec)
    want = make_ort(model, threads)[0](feeds)
    runs: dict[str, Callable] = {}
    for mode in modes:
        if mode == "ort":
            runs[mode] = make_ort(model, threads)[0]
            note = ""
        else:
            runs[mode], note = compile_mode(model, mode, threads, budget)
        got = [np.asarray(a, np.float64) for a in runs[mode](feeds)]
        print(f"  {label} t{threads} {mode}: rel error vs ORT {relative_error(got, want):.2e}; "
              f"{note}", flush=True)  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):  # the order rotated each round
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            block = timed_block(runs[mode], feeds, repeat)
            times[mode] += block
            blocks[mode].append(statistics.median(w for w, _ in block))
    ort_ms = statistics.median(w for w, _ in times["ort"]) if "ort" in times else None
    for mode in modes:
        wall = statistics.median(w for w, _ in times[mode])
        cpu = statistics.fmean(c for _, c in times[mode]) * 1e3
        ratio = f", {wall / ort_ms:.3f}x ORT" if ort_ms else ""
        best = min(blocks[mode]) * 1e3
        print(f"{label:>14} t{threads} {mode:>9}: wall {wall * 1e3:8.2f} ms (best block "
              f"{best:8.2f}), cpu {cpu:8.2f} ms/run{ratio}", flush=True)  # fmt: skip


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
    `wino2_e2e.py`, `rn12_ab.py`: their own `compile_fn` takes the place of `compile_mode`)."""
    global compile_mode
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--models", nargs="+", default=models or ["resnet50:1"],
                   help="name[:batch] or zoo")  # fmt: skip
    p.add_argument("--modes", nargs="+", default=modes)
    p.add_argument("--threads", type=int, nargs="+", default=threads or [2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--budget", default=budget, help="PGX_CONV_CHOICE_BUDGET seconds")
    args = p.parse_args(argv)
    if compile_fn is not None:
        compile_mode = compile_fn
    for spec, n in itertools.product(args.models, args.threads):
        ab(spec, args.modes, n, args.rounds, args.repeat, args.budget)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__, ["impl", "winograd", "measure", "ort"])


if __name__ == "__main__":
    raise SystemExit(main())
