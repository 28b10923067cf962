"""The one A/B harness of whole models on the cpu target (helper tidy17; `benchmarks/ab.py` is
its command line, the `*_ab.py` scripts of benchmarks/ thin wrappers with their own defaults).

    PYTHONPATH=. python benchmarks/ab.py --old PGX_CPU_GELU_ERF_NATIVE=0 --new \
        --models minilm bert_base:1 --threads 1 --rounds 10

What it does, per model (`--models`: `name[:batch]` of `pygraphx.models`, a zoo name of
`benchmarks/zoo.py`, or a path to an `.onnx` file, fed seeded random inputs):

- compiles every variant for the cpu target with its settings in force only while it parses
  and compiles (`--old K=V ...` / `--new K=V ...`: the variants `old` and `new`; or
  `--variant NAME:K=V,K=V` as often as wanted, which replaces them). A key `@module.NAME` sets
  an attribute of `pygraphx.targets.torch_lowering.<module>` (`@cpu.module.NAME`:
  `pygraphx.targets.cpu.<module>`; `@pygraphx.any.module.NAME`: that module) to a Python
  literal instead of an environment variable; `target.NAME=value`: the cpu target's option
  NAME (`CpuTarget(NAME=value)`, e.g. `target.conv_output=torch`). Refused (they need
  separate processes: `PROCESS_KEYS`): keys read once a process or at run time (PGX_NATIVE*,
  PGX_CC, PGX_ONEDNN_LIB, PGX_CPU_KEEP_FREED, PGX_CPU_HUGE_PAGES, GOMP_* / OMP_* / KMP_*,
  ONEDNN_* / DNNL_* / MKL_*, PGX_TRACE_EVAL, PGX_CPU_LOAD_ADAPT, PGX_CPU_STALL_ADAPT,
  @native_attention.CAUSAL_ROWS, @lower_gemm.WIDEN_BLOCK, @cpu.scheduling.LOAD_CHECK_S); a
  `PGX_*` key no file under pygraphx/ mentions is warned of (a typo: an A/A run).
  `--bf16`: every variant `quantize_bf16`'d; `--openvino`: OpenVINO (f32, or bf16 with
  `--bf16`; one stream, the same threads) as one more variant `OV`;
- compares the outputs: each variant against ONNX Runtime float32 (the oracle: rel. RMS error
  and max abs difference) and against the first variant (rel. RMS difference); a variant
  further than `--tol` (default 1e-3 float32, 1e-1 bf16, each variant its own; against the
  first variant the looser of the two) from either is a MISMATCH: the
  figures still print, the exit status is 1. Each output is judged alone: `err` / `diff` are
  the worst output's (a MISMATCH names it; the JSON keeps the pooled figures too);
- warms each variant (`--warmup` runs), waits with `--wait-quiet S` up to S seconds for a
  quiet moment (/proc/stat busy < 15 % over 2 s) and says whether one came (and what the
  machine was like after the timing); the machine's busy share during the timing, and the
  others' share of it (this process's CPU time taken out), is said with `--wait-quiet` or
  where the others took more than 15 %, and is in the JSON always;
- sets the cpu target's run-time thread controls `PGX_CPU_LOAD_ADAPT` and
  `PGX_CPU_STALL_ADAPT` to 0 where they are unset (`--keep-adapt`: leaves them), so that a
  "t2" A/B runs on 2 threads and A and B on the same count; says their values in the header
  and the JSON (`adaptation`);
- times `--rounds` rounds; in each, every variant runs one block of `--runs` runs (after
  `--settle` untimed runs), the order reversed every round (both orders; 3 or more variants
  also rotate every two rounds, so that each takes every position). The clock: thread
  CPU time at 1 thread, wall at 2+ (`--clock` overrides: `process` is the process's CPU time);
  the process CPU time of each block is kept beside it. The first variant declared (`old`) is
  the reference of the ratios and differences whatever the run order (`--new-first`: the
  first round runs them last to first);
- `--steps`: as many profiled rounds again, each step timed alone, printed as ms a run per kind
  of step (`gemm14_profile.pgx_kind`, or a wrapper's `Config.kind_of`), each step's median;
- `--spread` (what a loaded machine needs besides the median): each variant's 25th percentile
  block and the median of the rounds' ratios to the first variant, and with `--steps` the sum
  of each step's fastest time beside the medians (the JSON has them always);
- prints one table a model, in this form (stable: the notes quote it):

      <spec> t<threads> <f32|bf16>, <R> rounds x <N> runs, <clock> ms a run (median over
      blocks, best block, ratio of medians to <first>, median of the rounds' difference from
      it; process CPU ms; rel RMS err vs ORT f32, worst output; rel RMS diff vs <first>,
      worst output):
        <name>   <median> (best <best>)  <ratio>  <+paired>  cpu <ms>  err <e>  diff <d>  <settings>

  each variant's compile first (`  <spec> t<threads> <name>: compiled in <s> s[; note]`).
  `--no-ort` skips the ORT reference (err `nan`; the check against the first variant stays).

  and with `--json FILE` all of it (every block's time too) as JSON.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import pygraphx  # noqa: E402,F401  (before torch: it sets OpenMP's spin count and the allocator)

TOL = {"f32": 1e-3, "bf16": 1e-1}
TARGET = "target."  # a setting `target.NAME=value`: the option NAME of CpuTarget


@dataclass
class Case:
    """One model to A/B: its label, its ONNX bytes, the feeds."""

    spec: str
    data: bytes
    feeds: dict[str, np.ndarray]


@dataclass
class Variant:
    """A way to build the program: settings in force while it compiles, or a builder of its
    own (`build(case, threads)` -> anything with `run(feeds)`)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    bf16: bool = False
    build: Callable[[Case, int], Any] | None = None
    label: str = ""

    def describe(self) -> str:
        if self.label:
            return self.label
        return ",".join(f"{k}={v}" for k, v in self.env.items()) or "(defaults)"


def parse_env(items: str | list[str] | None) -> dict[str, str]:
    """`K=V,K=V` (or a list of such) as a dict."""
    if items is None:
        return {}
    if isinstance(items, str):
        items = [items]
    env = {}
    for text in items:
        for kv in text.split(","):
            if kv:
                key, sep, value = kv.partition("=")
                if not sep:
                    raise SystemExit(f"not K=V: {kv!r}")
                env[key] = value
    return env


def parse_variant(text: str, bf16: bool = False) -> Variant:
    """`NAME:K=V,K=V` as a Variant."""
    name, _, rest = text.partition(":")
    return Variant(name, parse_env(rest), bf16)


#: settings a variant cannot carry ("in force only while it compiles" does not reach them):
#: read once a process (the native kernels' compiler and cache, the oneDNN library, the
#: allocator, OpenMP and the math libraries' own variables) or at run time (the thread
#: controls, evaluation tracing, plans made at the first run, the load check's interval)
PROCESS_KEYS = ("PGX_NATIVE", "PGX_CC", "PGX_NATIVE_CACHE", "PGX_NATIVE_BUILD_TIMEOUT",
                "PGX_ONEDNN_LIB", "PGX_CPU_KEEP_FREED", "PGX_CPU_HUGE_PAGES",
                "THP_MEM_ALLOC_ENABLE", "PGX_TRACE_EVAL", "PGX_CPU_LOAD_ADAPT",
                "PGX_CPU_STALL_ADAPT")  # fmt: skip
PROCESS_PREFIXES = ("GOMP_", "OMP_", "KMP_", "ONEDNN_", "DNNL_", "MKL_")
PROCESS_ATTRS = ("pygraphx.targets.torch_lowering.native_attention.CAUSAL_ROWS",
                 "pygraphx.targets.torch_lowering.lower_gemm.WIDEN_BLOCK",
                 "pygraphx.targets.cpu.scheduling.LOAD_CHECK_S")  # fmt: skip


def attribute_path(key: str) -> str:
    """`@module.NAME` as `pygraphx.<package>.<module>.NAME` (see `settings`)."""
    module_name, _, name = key[1:].rpartition(".")
    if not module_name.startswith("pygraphx."):
        package = "cpu" if module_name.startswith("cpu.") else "torch_lowering"
        module_name = f"pygraphx.targets.{package}.{module_name.removeprefix('cpu.')}"
    return f"{module_name}.{name}"


@functools.cache
def _pygraphx_text() -> str:
    root = Path(__file__).resolve().parents[1] / "pygraphx"
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*"))
                     if p.suffix in (".py", ".c", ".h") and p.is_file())  # fmt: skip


def check_settings(variants: list[Variant], out=None, warn: bool = True) -> None:
    """Refuse a variant setting that needs separate processes (`PROCESS_KEYS`,
    `PROCESS_PREFIXES`, `PROCESS_ATTRS`: SystemExit); warn on a `PGX_*` key that no file
    under pygraphx/ mentions (a typo would make the A/B an A/A)."""
    out = out or sys.stdout
    for v in variants:
        for key in v.env:
            if key.startswith(TARGET):
                continue
            if key.startswith("@"):
                if attribute_path(key) in PROCESS_ATTRS:
                    raise SystemExit(f"variant {v.name}: {key} is read at run time, not while "
                                     "the variant compiles: it needs separate processes")
                continue
            if key in PROCESS_KEYS or key.startswith(PROCESS_PREFIXES):
                raise SystemExit(f"variant {v.name}: {key} is read once a process or at run "
                                 "time, not while the variant compiles: it needs separate "
                                 "processes (run the harness once per value)")  # fmt: skip
            if warn and key.startswith("PGX_") and key not in _pygraphx_text():
                print(f"# WARNING variant {v.name}: {key} is mentioned by no file under "
                      "pygraphx/ (a typo? the variants may be the same program)", file=out)


def check_names(variants: list[Variant], openvino: bool) -> None:
    """Variant names must differ (the figures are kept by name), and not be `OV` with
    `--openvino`: SystemExit."""
    names = [v.name for v in variants] + (["OV"] if openvino else [])
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"variant names given twice: {', '.join(twice)}"
                         + (" (`OV` is --openvino's)" if "OV" in twice and openvino else ""))


def check_bf16(variants: list[Variant], bf16: bool) -> None:
    """`--bf16` with a variant that builds its own program and does not say it is bf16
    (`Variant.bf16`): refused (it would be timed as float32 under a bf16 heading)."""
    if not bf16:
        return
    for v in variants:
        if v.build is not None and not v.bf16:
            raise SystemExit(f"--bf16: variant {v.name} builds its own program and does not "
                             "apply quantize_bf16; this script does not take --bf16")


@contextmanager
def settings(env: dict[str, str]) -> Iterator[None]:
    """`env` in force inside: environment variables, and `@module.NAME` module attributes."""
    with ExitStack() as stack:
        for key, value in env.items():
            if key.startswith("@"):
                module_name, _, name = attribute_path(key).rpartition(".")
                module = importlib.import_module(module_name)
                stack.enter_context(mock.patch.object(module, name, ast.literal_eval(value)))
            else:
                stack.enter_context(mock.patch.dict(os.environ, {key: value}))
        yield


def load(spec: str, seed: int = 0) -> Case:
    """`name[:batch]` (pygraphx.models), a zoo name (benchmarks/zoo.py; `name:test` its test
    size, else full) or an .onnx path."""
    if spec.endswith(".onnx"):
        import onnx

        data = Path(spec).read_bytes()
        model = onnx.load_from_string(data)
        init = {i.name for i in model.graph.initializer}
        rng = np.random.default_rng(seed)
        feeds = {}
        for inp in model.graph.input:
            if inp.name in init:
                continue
            t = inp.type.tensor_type
            shape = [d.dim_value or 1 for d in t.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            if np.issubdtype(dtype, np.integer):
                feeds[inp.name] = rng.integers(0, 2, shape).astype(dtype)
            else:
                feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        return Case(spec, data, feeds)
    name, _, batch = spec.partition(":")
    from benchmarks.zoo import ZOO_NAMES, zoo_model

    if name in ZOO_NAMES:
        if batch.isdigit():
            raise SystemExit(f"{spec}: a zoo model takes `{name}` (full size) or `{name}:test`, "
                             "not a batch")  # fmt: skip
        path, feeds = zoo_model(name, batch if batch and not batch.isdigit() else "full")
        return Case(spec, Path(path).read_bytes(), feeds)
    from pygraphx.models import get_model, model_inputs

    model = get_model(name, batch=int(batch or 1))
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(name, model).items()}
    return Case(spec, model.SerializeToString(), feeds)


def compile_variant(case: Case, threads: int, variant: Variant) -> Any:
    if variant.build is not None:
        return variant.build(case, threads)
    from pygraphx.targets.cpu.target import CpuTarget

    env = {k: v for k, v in variant.env.items() if not k.startswith(TARGET)}
    options = {k[len(TARGET):]: _literal(v) for k, v in variant.env.items() if k.startswith(TARGET)}
    with settings(env):
        prog = pygraphx.parse_onnx_buffer(case.data)
        if variant.bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads, **options))
    return prog


def _literal(text: str) -> Any:
    """A Python literal's value, else the text itself (`conv_output=torch`)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class OpenVino:
    """OpenVINO's compiled model with a `run(feeds)` like a program's."""

    def __init__(self, data: bytes, threads: int, bf16: bool) -> None:
        
        import openvino as ov

        path = Path(scratch_dir()) / "model.onnx"
        path.write_bytes(data)
        config = {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}  # fmt: skip
        core = ov.Core()
        self.request = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.request.create_infer_request()

    def run(self, feeds: dict) -> list:
        result = self.request.infer(feeds)
        return [np.asarray(v) for v in result.values()]


def ort_outputs(case: Case, threads: int) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(case.data, opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, case.feeds)]


def rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Relative RMS difference of `got` from `want`, pooled over all outputs (kept in the JSON
    as `*_pooled`; the check judges each output alone: `rel_errs`)."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs against {len(want)}")
    pairs = zip(got, want, strict=True)
    num = sum(float(((np.asarray(g, np.float64) - w) ** 2).sum()) for g, w in pairs)
    den = sum(float((np.asarray(w, np.float64) ** 2).sum()) for w in want)
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return (num / den) ** 0.5


def rel_errs(got: list[np.ndarray], want: list[np.ndarray]) -> list[float]:
    """Relative RMS difference of each output of `got` from the same output of `want`."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs against {len(want)}")
    return [rel_err([g], [w]) for g, w in zip(got, want, strict=True)]


def worst(errs: list[float], names: list[str]) -> tuple[float, str]:
    """The largest of `errs` (NaN counts as largest) and the name of its output."""
    if not errs:
        return 0.0, ""
    i = max(range(len(errs)), key=lambda k: (np.isnan(errs[k]), errs[k]))
    return errs[i], names[i] if i < len(names) else f"output {i}"


def output_names(data: bytes) -> list[str]:
    """The model's output names, in order (the external data is not read)."""
    import onnx

    model = onnx.load_from_string(data)
    return [o.name for o in model.graph.output]


def max_abs(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(g, np.float64) - w).max(initial=0.0))
               for g, w in zip(got, want, strict=True))  # fmt: skip


def cpu_stat() -> list[int]:
    """The machine's CPU time counters (/proc/stat's first line)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]


def busy_between(a: list[int], b: list[int]) -> float:
    """The fraction of the machine's CPU time spent busy between two `cpu_stat()`s (this
    process's own work included); NaN where no tick passed (the counters are in 10 ms ticks)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    total = sum(d[:8])
    return 1.0 - (d[3] + d[4]) / total if total > 0 else float("nan")


def busy(seconds: float = 2.0) -> float:
    """The fraction of the machine's CPU time spent busy over `seconds` (/proc/stat)."""
    a = cpu_stat()
    time.sleep(seconds)
    seen = busy_between(a, cpu_stat())
    return 0.0 if seen != seen else seen  # (NaN: no tick in `seconds`)


def wait_quiet(limit: float) -> str:
    """Wait at most `limit` seconds for busy < 15 % over 2 s; says what was seen."""
    end = time.monotonic() + limit
    while True:
        b = busy()
        if b < 0.15:
            return f"quiet (busy {b:.0%} over 2 s)"
        if time.monotonic() > end:
            return f"NOT quiet (busy {b:.0%} over 2 s after waiting {limit:.0f} s)"


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter, "process": time.process_time}
CLOCK_NAMES = {"thread": "thread CPU", "wall": "wall", "process": "process CPU"}


def profiled(prog: Any, feeds: dict, clock: Callable[[], float]) -> list[float]:
    """Each step of one run of `prog`, timed alone."""
    exe = prog._executable
    out = []
    exe.executor.bind(feeds)
    with exe.scope():
        for fn in exe.executor.steps:
            start = clock()
            fn()
            out.append(clock() - start)
    exe.executor.collect()
    return out


@dataclass
class Config:
    threads: int = 2
    rounds: int = 20
    runs: int = 1
    warmup: int = 1
    settle: int = 0
    clock: str = "auto"
    steps: bool = False
    openvino: bool = False
    bf16: bool = False
    wait_quiet: float | None = None
    tol: float | None = None
    ort: bool = True
    kind_of: Callable[[Any], str] | None = None  # `--steps`' kind of a step (gemm14_profile's)
    new_first: bool = False  # the run order: the first round runs the variants last to first
    spread: bool = False  # also each variant's p25 block and median per-round ratio (printed)
    keep_adapt: bool = False  # `run`: leave PGX_CPU_LOAD_ADAPT / PGX_CPU_STALL_ADAPT as they are

    def clock_name(self) -> str:
        if self.clock != "auto":
            return self.clock
        return "thread" if self.threads == 1 else "wall"


def ab_case(case: Case, variants: list[Variant], cfg: Config, out=None, extra=None,
            note=None) -> dict:  # fmt: skip
    """Compile, check and time `variants` on `case`; print the table; the figures as a dict
    (`ok`: no variant further than the tolerance from ORT or from the first variant).
    `extra(progs, case, cfg, out)`: a wrapper's own measurement after the timing (it prints
    what it found; what it returns is the dict's `extra`). `note(prog)`: a wrapper's words on
    each compiled program (routes taken, kernels chosen), printed on its compile line."""
    out = out or sys.stdout
    check_names(variants, cfg.openvino)
    check_settings(variants, out)
    check_bf16(variants, cfg.bf16)
    want = ort_outputs(case, cfg.threads) if cfg.ort else None
    from pygraphx.targets.cpu.target import CpuTarget  # noqa: F401  (not in the first compile time)

    progs = {}
    for v in variants:
        start = time.perf_counter()
        progs[v.name] = compile_variant(case, cfg.threads, v)
        seconds = time.perf_counter() - start
        said = f"; {note(progs[v.name])}" if note is not None else ""
        print(f"  {case.spec} t{cfg.threads} {v.name}: compiled in {seconds:.2f} s{said}",
              file=out, flush=True)  # fmt: skip
    described = {v.name: v.describe() for v in variants}
    bf16 = cfg.bf16 or any(v.bf16 for v in variants)
    if cfg.openvino:
        progs["OV"] = OpenVino(case.data, cfg.threads, bf16)
        described["OV"] = f"OpenVINO {'bf16' if bf16 else 'f32'}"
    outs = {n: [np.asarray(o) for o in p.run(case.feeds)] for n, p in progs.items()}
    names = list(progs)  # as declared: the first (`old`, `off`) is the reference of the ratios
    first = names[0]
    order = names[::-1] if cfg.new_first else names  # the run order (reversed every round)
    nan = float("nan")
    onames = output_names(case.data)
    # each output judged alone (a small output badly wrong must not hide under a big one's
    # figures): the worst output's rel. RMS error, and its name; the pooled figure in the JSON
    errs = {n: rel_errs(o, want) if want else [nan] * len(o) for n, o in outs.items()}
    diffs = {n: rel_errs(o, outs[first]) for n, o in outs.items()}
    err, err_at = {}, {}
    diff, diff_at = {}, {}
    for n in names:
        err[n], err_at[n] = worst(errs[n], onames) if want else (nan, "")
        diff[n], diff_at[n] = worst(diffs[n], onames)
    err_pooled = {n: rel_err(o, want) if want else nan for n, o in outs.items()}
    diff_pooled = {n: rel_err(o, outs[first]) for n, o in outs.items()}
    abs_ort = {n: max_abs(o, want) if want else nan for n, o in outs.items()}
    # each variant's own tolerance (a bf16 one does not loosen the others'); against the
    # reference, the looser of the two
    is_bf16 = {v.name: cfg.bf16 or v.bf16 for v in variants}
    if cfg.openvino:
        is_bf16["OV"] = bf16
    tols = {n: cfg.tol if cfg.tol is not None else TOL["bf16" if is_bf16[n] else "f32"]
            for n in names}  # fmt: skip
    tol_ref = {n: max(tols[n], tols[first]) for n in names}
    # who is blamed: with ORT, a variant off the oracle, or off a reference that is itself
    # within tolerance of it; without ORT only the pair is known (`new vs old`: either may be
    # the wrong one)
    off_ort = [n for n in names if want is not None and not err[n] <= tols[n]]
    apart = [n for n in names if not diff[n] <= tol_ref[n]]
    if want is not None:
        bad = [n for n in names if n in off_ort or (n in apart and first not in off_ort)]
    else:
        bad = [f"{n} vs {first}" for n in apart]
    for p in progs.values():
        for _ in range(cfg.warmup):
            p.run(case.feeds)
    before = wait_quiet(cfg.wait_quiet) if cfg.wait_quiet is not None else None
    if before:
        print(f"# {case.spec}: {before}", file=out, flush=True)
    cname = cfg.clock_name()
    clock = CLOCKS[cname]
    runs = cfg.runs
    if runs <= 0:  # enough for about 0.2 s a block, by the first variant's runs
        t0 = time.perf_counter()
        for _ in range(3):
            progs[first].run(case.feeds)
        runs = max(2, int(0.2 / max((time.perf_counter() - t0) / 3, 1e-6)))
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    stat0, proc0, wall0 = cpu_stat(), time.process_time(), time.perf_counter()
    for r in range(cfg.rounds):
        for n in round_order(order, r):
            prog = progs[n]
            for _ in range(cfg.settle):
                prog.run(case.feeds)
            c0, t0 = time.process_time(), clock()
            for _ in range(runs):
                prog.run(case.feeds)
            times[n].append((clock() - t0) / runs * 1e3)
            cpu[n].append((time.process_time() - c0) / runs * 1e3)
    # the machine during the timing: all its busy CPU time, and the others' (ours taken out)
    stat1, proc1, wall1 = cpu_stat(), time.process_time(), time.perf_counter()
    during = busy_between(stat0, stat1)
    cpus = os.cpu_count() or 1
    ours = (proc1 - proc0) / max(1e-9, (wall1 - wall0) * cpus)
    others = during if during != during else max(0.0, during - ours)  # (NaN: too short)
    after = busy() if cfg.wait_quiet is not None else None
    med = {n: statistics.median(t) if t else float("nan") for n, t in times.items()}
    best = {n: min(t, default=float("nan")) for n, t in times.items()}
    cpu_med = {n: statistics.median(t) if t else float("nan") for n, t in cpu.items()}
    # each round's difference from the first variant (adjacent blocks): robust to drifting load
    paired = {n: statistics.median(np.subtract(t, times[first])) if t else float("nan")
              for n, t in times.items()}  # fmt: skip
    # what a loaded machine needs besides the median (gpt17's figures): the 25th percentile
    # block, and the median of the rounds' ratios to the reference (adjacent blocks)
    p25 = {n: float(np.percentile(t, 25)) if t else float("nan") for n, t in times.items()}
    paired_ratio = {n: statistics.median(np.divide(t, times[first])) if t else float("nan")
                    for n, t in times.items()}  # fmt: skip
    dtype = "bf16" if bf16 else "f32"
    adapt = {key: os.environ.get(key) for key in ADAPT_KEYS}
    print(f"# {case.spec} t{cfg.threads}: {describe_adaptation(adapt)}; run order "
          f"{', '.join(order)} (reversed every round{'; rotated' if len(order) > 2 else ''}); "
          f"ratios to {first}", file=out)  # fmt: skip
    print(f"{case.spec} t{cfg.threads} {dtype}, {cfg.rounds} rounds x {runs} runs, "
          f"{CLOCK_NAMES[cname]} ms a run (median over blocks, best block, ratio of medians to "
          f"{first}, median of the rounds' difference from it; process CPU ms; rel RMS err vs "
          f"ORT f32, worst output; rel RMS diff vs {first}, worst output):",
          file=out)  # fmt: skip
    for n in names:
        print(f"  {n:10s} {med[n]:9.2f} (best {best[n]:9.2f})  {med[n] / med[first]:.3f}  "
              f"{paired[n]:+8.2f}  cpu {cpu_med[n]:9.2f}  err {err[n]:.1e}  diff {diff[n]:.1e}  "
              f"{described[n]}", file=out)  # fmt: skip
    if cfg.spread:
        print(f"  (the 25th percentile block, ms a run; the median of the rounds' ratios to "
              f"{first})", file=out)  # fmt: skip
        for n in names:
            print(f"  {n:10s} p25 {p25[n]:9.2f}  paired {paired_ratio[n]:.3f}", file=out)
    out.flush()
    # the steps after the table is out: a failure here loses only the steps (said, and in the
    # JSON's `steps_error`)
    step_ms: dict[str, dict[str, float]] = {}
    step_fast: dict[str, dict[str, float]] = {}
    step_error = None
    if cfg.steps:
        profiled_names = [n for n in order if hasattr(progs[n], "_executable")]
        try:
            step_ms, step_fast = _steps(progs, profiled_names, case.feeds, cfg.rounds, clock,
                                        cfg.kind_of)  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (reported, and the table is already out)
            step_error = f"{type(exc).__name__}: {exc}"
            print(f"# {case.spec}: --steps FAILED ({step_error}); the table above stands",
                  file=out)  # fmt: skip
    if step_ms:
        _print_steps(step_ms, out, cfg.kind_of is None, step_fast if cfg.spread else None)
    more = extra(progs, case, cfg, out) if extra is not None else None
    if after is not None:
        print(f"# {case.spec}: machine after the timing: busy {after:.0%} over 2 s", file=out)
    if cfg.wait_quiet is not None or others > 0.15:
        print(f"# {case.spec}: machine during the timing: busy {during:.0%}, of which others "
              f"{others:.0%}" + (" (NOT quiet)" if others > 0.15 else ""), file=out)  # fmt: skip
    for n in apart if want is None else ():
        print(f"MISMATCH {case.spec} {n} vs {first}: rel RMS diff {diff[n]:.1e} (output "
              f"{diff_at[n]!r}), tolerance {tol_ref[n]:.0e}; no ORT reference (--no-ort): "
              "either may be the wrong one", file=out)  # fmt: skip
    for n in bad if want is not None else ():
        print(f"MISMATCH {case.spec} {n}: rel RMS err vs ORT {err[n]:.1e} (output "
              f"{err_at[n]!r}), diff vs {first} {diff[n]:.1e} (output {diff_at[n]!r}), "
              f"tolerance {tols[n]:.0e} (vs {first} {tol_ref[n]:.0e})", file=out)  # fmt: skip
    out.flush()
    return {
        "spec": case.spec, "threads": cfg.threads, "dtype": dtype, "clock": cname,
        "rounds": cfg.rounds, "runs": runs, "first": first, "reference": first,
        "run_order": order, "quiet_before": before,
        "busy_after": after, "busy_during": during,
        "busy_others_during": others, "adaptation": adapt, "tol": max(tols.values()), "ok": not bad,
        "mismatch": bad,
        "variants": {n: {"settings": described[n], "median_ms": med[n],
                         "best_ms": best[n], "ratio": med[n] / med[first],
                         "paired_diff_ms": paired[n], "p25_ms": p25[n],
                         "paired_ratio": paired_ratio[n],
                         "max_abs_diff_first": max_abs(outs[n], outs[first]),
                         "cpu_ms": cpu_med[n], "rel_err_ort": err[n],
                         "rel_err_ort_output": err_at[n], "rel_err_ort_pooled": err_pooled[n],
                         "rel_err_ort_outputs": dict(zip(onames, errs[n], strict=False)),
                         "max_abs_diff_ort": abs_ort[n], "rel_diff_first": diff[n],
                         "rel_diff_first_output": diff_at[n],
                         "rel_diff_first_pooled": diff_pooled[n], "tol": tols[n],
                         "tol_first": tol_ref[n], "bf16": is_bf16[n],
                         "blocks_ms": times[n], "cpu_blocks_ms": cpu[n]} for n in names},
        "steps_ms": step_ms, "steps_fastest_ms": step_fast, "steps_error": step_error,
        "extra": more,
    }  # fmt: skip


def round_order(names: list[str], r: int) -> list[str]:
    """Round `r`'s order of `names`: reversed every other round; with 3 or more, also rotated
    by one every two rounds, so that each takes every position (reversal alone keeps the
    middle one in the middle)."""
    k = (r // 2) % len(names) if len(names) > 2 else 0
    rotated = names[k:] + names[:k]
    return rotated if r % 2 == 0 else rotated[::-1]


def _steps(progs: dict, names: list[str], feeds: dict, rounds: int, clock,
           kind_of) -> tuple[dict, dict]:  # fmt: skip
    """Each lowered step's median time over `rounds` profiled runs (`profile.time_steps`: a
    chain of convolutions times its members itself), summed per kind, ms a run; and the same
    of each step's fastest time."""
    from pygraphx.targets.cpu.profile import time_steps

    if kind_of is None:
        from benchmarks.gemm14_profile import pgx_kind as kind_of

    runs: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        for n in round_order(names, r):
            timed = time_steps(progs[n]._executable, feeds, 1, clock)
            runs[n].append([st.seconds for st in timed])
    per, fast = {}, {}
    for n in names:
        arr = np.array(runs[n])
        for table, col in ((per, np.median(arr, axis=0)), (fast, arr.min(axis=0))):
            acc: dict[str, float] = defaultdict(float)
            for st, t in zip(progs[n]._executable.lowered.steps, col, strict=True):
                acc[kind_of(st)] += float(t) * 1e3
            table[n] = dict(acc)
    return per, fast


def _print_steps(per: dict[str, dict[str, float]], out, gemm14_kinds: bool = True,
                 fast: dict[str, dict[str, float]] | None = None) -> None:  # fmt: skip
    """The per-kind table; `fast`: each step's fastest too, after a `|`."""
    names = list(per)
    if gemm14_kinds:
        from benchmarks.gemm14_profile import KINDS
    else:
        KINDS = sorted({k for n in names for k in per[n]})  # noqa: N806
    print("  kind        " + " ".join(f"{n:>10s}" for n in names) + "  (ms a run, each step's "
          "median)" + (" | (each step's fastest)" if fast else ""), file=out)  # fmt: skip
    for k in (*KINDS, "sum"):
        tables = [per, fast] if fast else [per]
        row = [[sum(t[n].values()) if k == "sum" else t[n].get(k, 0.0) for n in names]
               for t in tables]  # fmt: skip
        if any(v for part in row for v in part):
            print(f"  {k:10s} " + " | ".join(" ".join(f"{v:10.2f}" for v in part)
                                            for part in row), file=out)  # fmt: skip


#: the run-time thread controls of the cpu target (`scheduling.py`): `PGX_CPU_LOAD_ADAPT` is
#: read at every run (under load it runs a "t2" A/B on 1 thread), `PGX_CPU_STALL_ADAPT` when a
#: program compiles (A and B could run at different counts): `run` sets both to 0 unless they
#: are set already or `--keep-adapt` is given
ADAPT_KEYS = ("PGX_CPU_LOAD_ADAPT", "PGX_CPU_STALL_ADAPT")


def fix_adaptation(keep: bool = False) -> dict[str, str | None]:
    """Default the adaptation switches to 0 (`keep`: leave them as they are); their values."""
    if not keep:
        for key in ADAPT_KEYS:
            os.environ.setdefault(key, "0")
    return {key: os.environ.get(key) for key in ADAPT_KEYS}


def describe_adaptation(values: dict[str, str | None]) -> str:
    return ", ".join(f"{k}={'(unset: on)' if v is None else v}" for k, v in values.items())


def run(cases: list[Case] | list[str], variants: list[Variant], cfg: Config | list[Config],
        json_path: str | None = None, doc: dict | None = None, extra=None,
        note=None) -> int:  # fmt: skip
    """`ab_case` over each thread count's config, each case (a spec is loaded first; `extra`,
    `note` as there); 0, or 1 on any MISMATCH. `doc`: more to write into the JSON."""
    cfgs = cfg if isinstance(cfg, list) else [cfg]
    for c in cfgs:
        check_names(variants, c.openvino)
        check_bf16(variants, c.bf16)
    check_settings(variants, warn=False)  # (refused before any model loads; `ab_case` warns)
    before = {key: os.environ.get(key) for key in ADAPT_KEYS}
    try:
        return _run(cases, variants, cfgs, json_path, doc, extra, note)
    finally:  # (the switches are the harness's for its run only: a caller's process keeps its own)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(cases, variants, cfgs, json_path, doc, extra, note) -> int:  # fmt: skip
    """`run`'s body, with the adaptation switches defaulted for its duration."""
    import torch

    adapt = fix_adaptation(keep=any(c.keep_adapt for c in cfgs))
    print("# loadavg at the start:", loadavg(), flush=True)
    print("# run-time thread adaptation:", describe_adaptation(adapt), flush=True)
    results = []
    loaded: dict[str, Case] = {}  # (kept only where several thread counts use them)
    for c in cfgs:
        torch.set_num_threads(c.threads)
        for case in cases:
            if isinstance(case, str):
                spec = case
                case = loaded.get(spec) or load(spec)
                if len(cfgs) > 1:
                    loaded[spec] = case
            results.append(ab_case(case, variants, c, extra=extra, note=note))
    print("# loadavg at the end:", loadavg(), flush=True)
    if json_path:
        doc = {"configs": [vars(c) for c in cfgs], "variants": [v.describe() for v in variants],
               "adaptation": adapt, "models": results, **(doc or {})}  # fmt: skip
        Path(json_path).write_text(json.dumps(doc, indent=1, default=str))
    return 0 if all(r["ok"] for r in results) else 1


def parser(description: str | None = None, *, models: list[str] | None = None,
           threads: int | list[int] = 2, rounds: int = 20, runs: int = 1, warmup: int = 1,
           settle: int = 0, named: dict[str, Variant] | None = None,
           default_names: list[str] | None = None,
           env_options: bool = True) -> argparse.ArgumentParser:  # fmt: skip
    """The harness's arguments, with a wrapper's defaults; `named`: the wrapper's variants by
    name, chosen with `--variants NAME ...` (default `default_names`; `openvino` too; no
    `--old` / `--new` / `--variant` / `--new-first` then: they would drop the wrapper's switch);
    `env_options=False`: no `--old` / `--new` / `--variant` (a wrapper that builds its own)."""
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0],
                                conflict_handler="resolve")  # a wrapper may take an option
    p.add_argument("--models", nargs="+", default=["minilm"] if models is None else models,
                   help="name[:batch], zoo name or .onnx path")  # fmt: skip
    if env_options and not named:  # a wrapper's named variants: `--variants` only
        p.add_argument("--old", nargs="*", default=None, help="K=V[,K=V] ...: variant `old`")
        p.add_argument("--new", nargs="*", default=None, help="K=V[,K=V] ...: variant `new`")
        p.add_argument("--variant", action="append", default=None,
                       help="NAME:K=V,K=V (repeatable; replaces --old / --new)")  # fmt: skip
        p.add_argument("--new-first", action="store_true",
                       help="run order: the first round runs `new` (the last variant) first; "
                            "the ratios stay to `old` (the first declared)")  # fmt: skip
    if named:
        p.add_argument("--variants", nargs="+", default=default_names or list(named),
                       choices=[*named, "openvino"], help="this script's variants, by name")
    p.add_argument("--threads", type=int, nargs="+",
                   default=threads if isinstance(threads, list) else [threads],
                   help="one A/B per thread count")  # fmt: skip
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--runs", "--repeat", dest="runs", type=int, default=runs,
                   help="runs in a timed block (0: about 0.2 s)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=warmup, help="untimed runs a variant first")
    p.add_argument("--settle", type=int, default=settle, help="untimed runs before each block")
    p.add_argument("--clock", choices=["auto", *CLOCKS], default="auto",
                   help="auto: thread CPU at 1 thread, wall at 2+")  # fmt: skip
    p.add_argument("--bf16", action="store_true", help="quantize_bf16 every variant")
    p.add_argument("--openvino", action="store_true", help="OpenVINO as one more variant")
    p.add_argument("--steps", action="store_true", help="also per-kind step times")
    p.add_argument("--spread", action="store_true",
                   help="also each variant's 25th percentile block and the median of the rounds' "
                        "ratios (and with --steps each step's fastest)")  # fmt: skip
    p.add_argument("--wait-quiet", "--quiet", dest="wait_quiet", type=float, default=None,
                   metavar="S", help="wait up to S s for a quiet moment before timing")  # fmt: skip
    p.add_argument("--tol", type=float, default=None,
                   help="largest rel RMS difference vs ORT / the first variant (default 1e-3 "
                        "f32, 1e-1 bf16)")  # fmt: skip
    p.add_argument("--no-ort", dest="ort", action="store_false",
                   help="no ONNX Runtime reference (outputs checked against the first variant)")
    p.add_argument("--keep-adapt", action="store_true",
                   help="leave PGX_CPU_LOAD_ADAPT / PGX_CPU_STALL_ADAPT as they are (default: "
                        "0 where unset, so that the thread count is the one asked for)")
    p.add_argument("--json", default=None, metavar="FILE")
    return p


def variants_of(args: argparse.Namespace, old: dict | None = None, new: dict | None = None,
                named: dict[str, Variant] | None = None) -> list[Variant]:  # fmt: skip
    """The variants the arguments name: `--variant`s; else `--old` / `--new` where given; else
    the wrapper's `named` ones that `--variants` picks (`openvino` sets `args.openvino`); else
    `old` / `new` with the wrapper's default settings. `--bf16` makes each one bf16."""
    given, old_arg, new_arg = (getattr(args, k, None) for k in ("variant", "old", "new"))
    if given:
        chosen = [parse_variant(v) for v in given]
    elif named and old_arg is None and new_arg is None:
        if "openvino" in args.variants:
            args.openvino = True
        chosen = [named[n] for n in args.variants if n != "openvino"]
    else:
        chosen = [
            Variant("old", parse_env(old_arg) if old_arg is not None else dict(old or {})),
            Variant("new", parse_env(new_arg) if new_arg is not None else dict(new or {})),
        ]
        if chosen[0].env == chosen[1].env and old_arg is None and new_arg is None:
            raise SystemExit("no variants: give --old K=V / --new K=V or --variant NAME:K=V")
    if args.bf16:  # (a variant with a builder of its own: its own `bf16`, see `check_bf16`)
        chosen = [v if v.build is not None else replace(v, bf16=True) for v in chosen]
    return chosen


def configs_of(args: argparse.Namespace) -> list[Config]:
    """One Config a thread count of `--threads` (an option a wrapper took over: its default)."""
    keys = ("rounds", "runs", "warmup", "settle", "clock", "steps", "openvino", "bf16",
            "wait_quiet", "tol", "ort", "keep_adapt", "new_first", "spread")  # fmt: skip
    given = {k: getattr(args, k) for k in keys if hasattr(args, k)}
    return [Config(threads=t, **given) for t in args.threads]


def run_args(args: argparse.Namespace, *, old: dict | None = None, new: dict | None = None,
             named: dict[str, Variant] | None = None, models: list[str] | None = None,
             more: list[Variant] = (), extra=None, note=None) -> int:  # fmt: skip
    """`run` as the parsed arguments say (`models` replaces `--models`; `more` variants after
    the chosen ones)."""
    variants = variants_of(args, old, new, named) + list(more)
    return run(models or args.models, variants, configs_of(args), args.json,
               {"argv": sys.argv[1:]}, extra, note)  # fmt: skip


def main(argv: list[str] | None = None, *, description: str | None = None,
         old: dict | None = None, new: dict | None = None,
         named: dict[str, Variant] | None = None, default_names: list[str] | None = None,
         extra=None, note=None, **defaults: Any) -> int:  # fmt: skip
    """The command line; a wrapper passes its description, default `old` / `new` settings or
    its `named` variants, and argument defaults (`models`, `threads`, `rounds`, `runs`,
    `warmup`, `settle`)."""
    args = parser(description, named=named, default_names=default_names, **defaults).parse_args(
        argv
    )
    return run_args(args, old=old, new=new, named=named, extra=extra, note=note)
