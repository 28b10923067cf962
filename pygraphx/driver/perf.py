"""The driver's `time` and `perf` commands: whole-run times and the per-instruction report.

`time -n N` runs the compiled program once to warm up, then N times, and prints the average
(`Total time: 1.23ms`) and the rate (`Rate: 812.3/sec` = 1000 / total ms * batch).

`perf -n N` prints the report of `migraphx-driver perf`, with every total explained:

    Allocating params ...
    Running performance report ...
    main:@2 = convolution[...](input,main:@1) -> float_type, {...}, {...}: 0.123ms, 5.2%
    ...
    Summary:
    convolution: 22.6576ms / 49 = 0.4624ms, 53.2898%
    ...
    Fused groups:
    main:fused_reduce0 (mul, add, softmax): 0.0123ms, 0.5%
    ...
    Steps as they run (cpu):
    dot+fused_reduce+dot: 1.5ms / 12 = 0.125ms, 9.1%
    ...
    Batch size: 1 (first dimension of input 'input')
    Rate: 975.796/sec (batch size / total time)
    Total time: 32.7937ms (mean of 100 runs, not profiled)
    Total instructions time: 31.9ms (sum of the instructions' mean times in 100 profiled runs)
    Profiled run time: 32.1ms (instructions + overhead; profiling took away 0.69ms to ...)
    Overhead time: 0.2ms (profiled run time - total instructions time)
    Overhead: 1% of the profiled run time
    Run time (min / median / p90 / p99): ... (the runs not profiled)

How each number is measured (all averages are per run, over the N runs). Every figure is
measured in the runs it describes, so none can come out negative:
* an instruction's time and share come from N runs with an observer
  (`program.run(params, observer=...)`): its average time, and that time as a share of the
  total instructions time (so the shares sum to 100%);
* `Summary:` groups the instructions by op name: per-run time of all of them / their count =
  average per instruction, share; sorted by time;
* `Fused groups:` lists each fused group that ran (`pointwise`, `fused_reduce`): its module,
  the ops in its body, its per-run time and share (in `--json`: `fused_groups`);
* `Total time` is the average of N further runs without an observer (the real run time), and
  the min / median / p90 / p99 line describes those runs; `Rate` = 1000 / total ms * batch;
* `Steps as they run` (the `cpu` target only): the instruction lines above come from the
  observer path, which runs a fused step's parts one by one; this section times the fast
  path's own steps in N more runs (a convolution with its fused epilogue, a GEMM with its bias
  and GELU, an attention block, a layer normalisation are each one step), grouped by the ops
  each step computes (views and literals left out), with per-run time / count = average per
  step and share of the steps' total (in `--json`: `steps`);
* `Batch size` is the first dimension of the first input that has two or more (the line says
  which), so `--input-dim @x 4 ...` and `--batch 4` both report 4; 1 when no input has one;
* `Total instructions time` is the sum of the instructions' average times in the profiled runs;
  `Profiled run time` is those runs' average wall time, and `Overhead time` the difference (the
  walk over the program, bookkeeping, the observer calls), with its share of the profiled run.
  Instructions timed one by one can take longer than the un-profiled run (a target that
  overlaps work, or caches warmed differently): the `Profiled run time` line says by how much
  profiling changed the run time, instead of MIGraphX's `Total time - Total instructions time`
  (which came out as a negative overhead).

`--json` prints the same data as one JSON document instead. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pygraphx.driver.commands import (
    Steps,
    add_input_arguments,
    add_target_arguments,
    compile_program,
    make_inputs,
    print_threads,
)
from pygraphx.driver.loader import add_loader_arguments, describe_source, positive_int
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.printer import instruction_names, print_module
from pygraphx.ir.program import Program
from pygraphx.passes.fusion_policy import inner_op_names

DEFAULT_RUNS = 100
FUSED_OPS = ("pointwise", "fused_reduce")

#: advance(k) is called after each run; a no-op when no progress is shown
Advance = Callable[[], None]


def _no_advance() -> None:
    pass


# --- measuring ------------------------------------------------------------------------------
def time_runs(
    program: Program, params: Mapping[str, Any], n: int, advance: Advance = _no_advance
) -> list[float]:
    """Seconds of each of `n` runs without an observer (the caller warms up first)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        program.run(params)
        times.append(time.perf_counter() - start)
        advance()
    return times


@dataclass
class Profile:
    """What `n` observed runs measured: per-instruction total seconds and per-run sums."""

    runs: int
    order: list[Instruction] = field(default_factory=list)  # first-run order of main
    seconds: dict[int, float] = field(default_factory=dict)  # id(ins) -> total over runs
    walls: list[float] = field(default_factory=list)  # each observed run's wall time
    sums: list[float] = field(default_factory=list)  # each observed run's instruction sum

    def average(self, ins: Instruction) -> float:
        return self.seconds.get(id(ins), 0.0) / self.runs


def profile_runs(
    program: Program, params: Mapping[str, Any], n: int, advance: Advance = _no_advance
) -> Profile:
    """Run `n` times with an observer that adds up every instruction's time."""
    prof = Profile(n)

    for _ in range(n):
        run_sum = 0.0

        def observe(ins: Instruction, value: Any, seconds: float) -> None:
            nonlocal run_sum
            key = id(ins)
            if key not in prof.seconds:
                prof.seconds[key] = 0.0
                prof.order.append(ins)
            prof.seconds[key] += seconds
            run_sum += seconds

        start = time.perf_counter()
        program.run(params, observer=observe)
        prof.walls.append(time.perf_counter() - start)
        prof.sums.append(run_sum)
        advance()
    return prof


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


# --- the report -----------------------------------------------------------------------------
@dataclass
class PerfReport:
    """The numbers of `perf` (times in ms), ready to print or to dump as JSON."""

    program: Program
    profile: Profile
    run_times: list[float]  # seconds of the un-observed runs
    batch: int
    batch_source: str = "given"  # what the batch size was read from
    steps: list[Any] | None = None  # the fast path's steps timed as they run (cpu)

    def __post_init__(self) -> None:
        self.names = instruction_names(self.program.get_main_module())

    @property
    def total_ms(self) -> float:
        return float(np.mean(self.run_times)) * 1e3

    @property
    def instructions_ms(self) -> float:
        return sum(self.profile.average(i) for i in self.profile.order) * 1e3

    def share(self, ms: float) -> float:
        total = self.instructions_ms
        return 100.0 * ms / total if total > 0 else 0.0

    @property
    def rate(self) -> float:
        return 1000.0 / self.total_ms * self.batch if self.total_ms > 0 else float("inf")

    @property
    def profiled_ms(self) -> float:
        """Average wall time of the profiled runs."""
        return float(np.mean(self.profile.walls)) * 1e3

    @property
    def overhead_ms(self) -> float:
        """Profiled run time minus its instructions' times (never negative: measured in the
        same runs): walking the program, bookkeeping, the observer calls."""
        return max(self.profiled_ms - self.instructions_ms, 0.0)

    def summary(self) -> list[tuple[str, float, int]]:
        """(op name, per-run ms of all its instructions, count), slowest first."""
        totals: dict[str, list[float]] = {}
        for ins in self.profile.order:
            totals.setdefault(ins.op.name, []).append(self.profile.average(ins) * 1e3)
        rows = [(name, sum(ts), len(ts)) for name, ts in totals.items()]
        return sorted(rows, key=lambda r: r[1], reverse=True)

    def fused_groups(self) -> list[dict[str, Any]]:
        """Every fused group of `main` (`pointwise`, `fused_reduce`) that ran: its module, the
        instruction calling it, the ops in its body, per-run ms and share; in program order."""
        rows = []
        for ins in self.profile.order:
            if ins.op.name not in FUSED_OPS or not ins.module_inputs:
                continue
            ms = self.profile.average(ins) * 1e3
            rows.append(
                {
                    "group": ins.module_inputs[0].name,
                    "instruction": self.names[id(ins)],
                    "kind": ins.op.name,
                    "ops": inner_op_names(ins),
                    "time_ms": ms,
                    "percent": self.share(ms),
                }
            )
        return rows

    def run_stats(self) -> dict[str, float]:
        ms = [t * 1e3 for t in self.run_times]
        return {
            "min": min(ms),
            "median": percentile(ms, 50),
            "p90": percentile(ms, 90),
            "p99": percentile(ms, 99),
        }

    def annotate(self, ins: Instruction) -> str:
        if id(ins) not in self.profile.seconds:
            return ""  # @return: nothing runs
        ms = self.profile.average(ins) * 1e3
        return f": {ms:g}ms, {self.share(ms):g}%"

    def program_text(self) -> str:
        """The compiled program, `main` annotated with each instruction's time and share."""
        main = self.program.get_main_module()
        out = [print_module(main, annotate=self.annotate)]
        for mod in self.program.modules.values():
            if mod is not main:  # fused bodies and sub-graphs, as the program prints them
                out.append(print_module(mod, names=self.names))
        return "\n".join(out)

    def lines(self) -> list[str]:
        """Everything after `Running performance report ...`."""
        lines = self.program_text().rstrip("\n").splitlines()
        lines += ["", "Summary:"]
        for name, ms, count in self.summary():
            lines.append(f"{name}: {ms:g}ms / {count} = {ms / count:g}ms, {self.share(ms):g}%")
        lines += ["", "Fused groups:"]
        for g in self.fused_groups():
            ops = ", ".join(g["ops"])
            lines.append(f"{g['group']} ({ops}): {g['time_ms']:g}ms, {g['percent']:g}%")
        if self.steps:
            lines += ["", "Steps as they run (cpu):"]
            total = sum(ms for _, ms, _ in self.step_summary())
            for kind, ms, count in self.step_summary():
                share = 100.0 * ms / total if total > 0 else 0.0
                lines.append(f"{kind}: {ms:g}ms / {count} = {ms / count:g}ms, {share:g}%")
        lines += ["", *self.totals()]
        return lines

    def step_summary(self) -> list[tuple[str, float, int]]:
        """(ops of a step, per-run ms of all such steps, count), slowest first."""
        totals: dict[str, list[float]] = {}
        for step in self.steps or []:
            names = [i.op.name for i in step.instructions if _works(i)]
            kind = "+".join(names or [i.op.name for i in step.instructions])
            totals.setdefault(kind, []).append(step.seconds * 1e3)
        rows = [(kind, sum(ts), len(ts)) for kind, ts in totals.items()]
        return sorted(rows, key=lambda r: r[1], reverse=True)

    def totals(self) -> list[str]:
        """The closing figures, each saying what it measures."""
        total, profiled, overhead = self.total_ms, self.profiled_ms, self.overhead_ms
        cost = profiled - total
        stats = self.run_stats()
        n = self.profile.runs
        return [
            f"Batch size: {self.batch} ({self.batch_source})",
            f"Rate: {self.rate:g}/sec (batch size / total time)",
            f"Total time: {total:g}ms (mean of {n} runs, not profiled)",
            f"Total instructions time: {self.instructions_ms:g}ms (sum of the instructions' "
            f"mean times in {n} profiled runs)",
            f"Profiled run time: {profiled:g}ms (instructions + overhead; profiling "
            f"{'added' if cost >= 0 else 'took away'} {abs(cost):g}ms to the total time)",
            f"Overhead time: {overhead:g}ms (profiled run time - total instructions time)",
            f"Overhead: {round(100 * overhead / profiled) if profiled > 0 else 0:d}% of the "
            "profiled run time",
            "Run time (min / median / p90 / p99): "
            + " / ".join(f"{stats[k]:g}ms" for k in ("min", "median", "p90", "p99"))
            + " (the runs not profiled)",
        ]

    def to_json(self) -> dict[str, Any]:
        from pygraphx.ir.printer import format_instruction

        instructions = []
        for ins in self.program.get_main_module().instructions:
            if id(ins) not in self.profile.seconds:
                continue
            ms = self.profile.average(ins) * 1e3
            instructions.append(
                {
                    "name": self.names[id(ins)],
                    "op": ins.op.name,
                    "instruction": format_instruction(ins, self.names),
                    "time_ms": ms,
                    "percent": self.share(ms),
                }
            )
        total = self.total_ms
        return {
            "runs": self.profile.runs,
            "instructions": instructions,
            "summary": [
                {
                    "op": name,
                    "time_ms": ms,
                    "count": count,
                    "average_ms": ms / count,
                    "percent": self.share(ms),
                }
                for name, ms, count in self.summary()
            ],
            "fused_groups": self.fused_groups(),
            "steps": [
                {"ops": kind, "time_ms": ms, "count": count}
                for kind, ms, count in self.step_summary()
            ],
            "batch_size": self.batch,
            "batch_size_from": self.batch_source,
            "rate_per_sec": self.rate,
            "total_time_ms": total,
            "total_instructions_time_ms": self.instructions_ms,
            "profiled_run_time_ms": self.profiled_ms,
            "overhead_time_ms": self.overhead_ms,
            "overhead_percent": 100 * self.overhead_ms / self.profiled_ms
            if self.profiled_ms > 0
            else 0.0,
            "profiling_cost_ms": self.profiled_ms - total,
            "run_time_ms": self.run_stats(),
        }


def _works(ins: Instruction) -> bool:
    """Whether `ins` is named in a step's ops (views and literals are not work)."""
    return not ins.is_literal() and ins.op.output_alias(len(ins.inputs)) < 0


def step_times(program: Program, params: Mapping[str, Any], n: int) -> list[Any] | None:
    """The cpu target's fast-path steps timed as they run (None for other targets)."""
    from pygraphx.targets.cpu.target import CpuExecutable

    exe = getattr(program, "_executable", None)
    if not isinstance(exe, CpuExecutable):
        return None
    from pygraphx.targets.cpu.profile import time_steps

    return time_steps(exe, params, n)


def make_progress(steps: Steps) -> AbstractContextManager[Progress | None]:
    """A progress bar on stderr while the runs go on; none when stderr is not a terminal."""
    if not steps.console.is_terminal:
        return contextlib.nullcontext(None)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=steps.console,
        transient=True,
    )


def perf_report(
    program: Program,
    params: Mapping[str, Any],
    n: int,
    batch: tuple[int, str] = (1, "given"),
    progress: Progress | None = None,
) -> PerfReport:
    """Warm up once, then `n` observed runs and `n` plain runs of a compiled program."""
    program.run(params)
    if progress is None:
        prof = profile_runs(program, params, n)
        times = time_runs(program, params, n)
        return PerfReport(program, prof, times, *batch, steps=step_times(program, params, n))
    observed = progress.add_task("instructions", total=n)
    prof = profile_runs(program, params, n, lambda: progress.advance(observed))
    plain = progress.add_task("runs", total=n)
    times = time_runs(program, params, n, lambda: progress.advance(plain))
    return PerfReport(program, prof, times, *batch, steps=step_times(program, params, n))


def batch_size(program: Program) -> tuple[int, str]:
    """The batch a run processes: the first dimension of the first input with two or more
    dimensions, and where it was read from."""
    for name, shape in program.get_parameter_shapes().items():
        if len(shape.lens()) >= 2:
            return shape.lens()[0], f"first dimension of input {name!r}"
    return 1, "no input has a batch dimension"


# --- the commands ---------------------------------------------------------------------------
def time_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `time`: the model, the target, the inputs, -n."""
    add_loader_arguments(parser)
    add_target_arguments(parser)
    add_input_arguments(parser)
    parser.add_argument(
        "-n",
        "--iterations",
        dest="n",
        type=positive_int,
        default=DEFAULT_RUNS,
        metavar="N",
        help=f"number of timed runs, after one warm-up run (default {DEFAULT_RUNS})",
    )


def perf_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `perf`: those of `time`, and --json."""
    time_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_time(args: argparse.Namespace, steps: Steps) -> int:
    """Average run time over -n runs after one warm-up, and the rate."""
    print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    print_threads(target)
    print("Allocating params ...", flush=True)
    inputs, _ = make_inputs(args, loaded)
    print("Running ...", flush=True)
    program = loaded.program
    program.run(inputs)
    with make_progress(steps) as progress:
        if progress is None:
            times = time_runs(program, inputs, args.n)
        else:
            task = progress.add_task("runs", total=args.n)
            times = time_runs(program, inputs, args.n, lambda: progress.advance(task))
    total = float(np.mean(times)) * 1e3
    batch, source = batch_size(program)
    print(f"Batch size: {batch} ({source})")
    print(f"Total time: {total:g}ms")
    print(f"Rate: {1000.0 / total * batch:g}/sec")
    return 0


def cmd_perf(args: argparse.Namespace, steps: Steps) -> int:
    """The performance report of `migraphx-driver perf`, every total explained (or --json)."""
    text = not args.json
    if text:
        print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    if text:
        print_threads(target)
        print("Allocating params ...", flush=True)
    inputs, described = make_inputs(args, loaded)
    if text:
        print(f"Inputs: {described}")
        print("Running performance report ...", flush=True)
    with make_progress(steps) as progress:
        report = perf_report(loaded.program, inputs, args.n, batch_size(loaded.program), progress)
    if text:
        print("\n".join(report.lines()))
        return 0
    doc = {
        "source": describe_source(args),
        "target": target.name,
        "threads": getattr(getattr(target, "threads", None), "n", None),
        "transforms": list(loaded.transforms),
        "inputs": described,
        **report.to_json(),
    }
    print(json.dumps(doc, indent=2))
    return 0
