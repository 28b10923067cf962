"""The last steps of a CNN (global pool, classifier) split into oneDNN's call and the rest of
the step, A/B of programs compiled under different settings, in one process, alternating runs.

    python benchmarks/tail12_overhead_ab.py --model resnet50 --threads 2 --runs 300 \\
        --variant old:@gemm_kernels.LEAN_CLASSIFIER=False --variant lean: [--clock thread]

Each step of the fast path is timed as `targets.cpu.profile.time_steps` does, and every oneDNN
pooling / matmul execute inside it separately (same clock), so a step's time less its oneDNN
calls is its Python and torch overhead. `--clock thread`: the calling thread's CPU time (robust
to load; at 2 threads oneDNN's share on the other thread is not in it), `wall`: perf_counter.
Variants as in `mnv2b1_ab.py` (`NAME:VAR=VALUE,...`, `@module.NAME=literal`). Printed per
variant: each pooling / product step's min / median, its oneDNN call's min / median, and the
overhead (step less calls) min / median, in us; and the run's summed steps.

The steps reported are the pooling and product steps that hold no convolution, each with the
oneDNN calls made while it ran (counted per step: a step that calls none, e.g. the classifier
on one thread, which runs MKL's `addmm`, shows a call time of 0 and all its time as overhead).
tidy18: the script assumed one call a step and failed (`AssertionError: (1, 0)`) since mnv15
made MobileNetV2's head (1x1 convolution + global pool + classifier) one native step
(`native_mbhead`) that calls no oneDNN primitive; that step is no longer reported, so on
today's default MobileNetV2 nothing is left to split. Give `PGX_CPU_NATIVE_MBHEAD=0` in every
variant to measure the oneDNN route tail12 measured (2 threads, as tail12.md):

    python benchmarks/tail12_overhead_ab.py --model mobilenetv2 --threads 2 --runs 300 \\
        --variant old:PGX_CPU_NATIVE_MBHEAD=0,@gemm_kernels.LEAN_CLASSIFIER=False \\
        --variant lean:PGX_CPU_NATIVE_MBHEAD=0

(ResNet-50's pooling and classifier are oneDNN steps by default.) `PGX_CPU_LOAD_ADAPT` is 0
unless set (as the harness does since tidy17): on a busy machine the load rule would run a
"2 thread" run on one, where the classifier is `addmm`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401
from benchmarks.mnv2b1_ab import compiled, parse_variant  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402


#: the steps reported: those with one of these and no convolution (a native head, which holds
#: both with its convolution, calls no oneDNN primitive)
OPS = {"pooling", "dot"}


def reported(instructions) -> bool:  # noqa: ANN001
    """Whether a step of these instructions is one of the pooling / product steps reported."""
    ops = {i.op.name for i in instructions}
    return bool(ops & OPS) and "convolution" not in ops


def count_calls(exe, calls: list[float]) -> list[list[int]]:  # noqa: ANN001
    """Wraps the executor's steps so that each notes how many entries `calls` had before and
    after it ran; the list of those [before, after] pairs, one a step function (refilled by
    every run)."""
    spans = [[0, 0] for _ in exe.executor.steps]

    def wrap(fn, span: list[int]):  # noqa: ANN001, ANN202
        def step() -> None:
            span[0] = len(calls)
            fn()
            span[1] = len(calls)

        return step

    exe.executor.steps = tuple(wrap(f, sp) for f, sp in zip(exe.executor.steps, spans,
                                                              strict=True))  # fmt: skip
    return spans


def call_spans(exe, spans: list[list[int]]) -> list[tuple[int, int] | None]:  # noqa: ANN001
    """Each lowered step's [before, after) range of `calls` (None for a chain's members: a
    chain of convolutions runs as one step function, and calls neither primitive hooked)."""
    out: list[tuple[int, int] | None] = []
    for span, chain in zip(spans, exe.chained.chains, strict=True):
        if chain is None:
            out.append((span[0], span[1]))
        else:
            out.extend([None] * len(chain.seconds))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--clock", choices=("thread", "wall"), default="thread")
    p.add_argument("--variant", action="append", required=True)
    args = p.parse_args()
    from pygraphx.targets.cpu.profile import time_steps
    from pygraphx.targets.torch_lowering import onednn_linear, onednn_pool

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    calls: list[float] = []
    for cls in (onednn_linear._Primitive, onednn_pool.Primitive):
        def timed(self, x, y, _orig=cls.execute) -> None:  # noqa: ANN001
            t = clock()
            _orig(self, x, y)
            calls.append(clock() - t)

        cls.execute = timed
    model = get_model(args.model)
    feeds = model_inputs(args.model, model)
    variants = map(parse_variant, args.variant)
    progs = {name: compiled(model, args.threads, env) for name, env in variants}
    spans = {name: count_calls(prog._executable, calls) for name, prog in progs.items()}
    rows = {name: {"step": [], "call": [], "sum": []} for name in progs}
    for _ in range(5):
        for prog in progs.values():
            time_steps(prog._executable, feeds, 1, clock)
    for r in range(args.runs):
        order = list(progs) if r % 2 == 0 else list(progs)[::-1]
        for name in order:
            calls.clear()
            steps = time_steps(progs[name]._executable, feeds, 1, clock)
            # the pooling and product steps, each with the oneDNN calls made inside it
            at = call_spans(progs[name]._executable, spans[name])
            picked = [k for k, s in enumerate(steps) if reported(s.instructions)]
            if not picked:
                raise SystemExit(f"{name}: no pooling / product step outside a native head (on "
                                 "MobileNetV2 the head is one native step: give "
                                 "PGX_CPU_NATIVE_MBHEAD=0 in every variant)")  # fmt: skip
            mine = [steps[k].seconds for k in picked]
            mine_calls = [sum(calls[slice(*at[k])]) if at[k] else 0.0 for k in picked]
            rows[name]["step"].append(mine)
            rows[name]["sum"].append(sum(s.seconds for s in steps))
            rows[name]["call"].append(mine_calls)
    for name, row in rows.items():
        step, call = np.array(row["step"]) * 1e6, np.array(row["call"]) * 1e6
        over = step - call
        fmt = lambda a: [f"{x:.1f}" for x in a]  # noqa: E731
        print(name, f"steps min {fmt(step.min(0))} med {fmt(np.median(step, 0))}",
              f"| calls min {fmt(call.min(0))} med {fmt(np.median(call, 0))}",
              f"| overhead min {fmt(over.min(0))} med {fmt(np.median(over, 0))}",
              f"| run sum med {np.median(row['sum']) * 1e3:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
