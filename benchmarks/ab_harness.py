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

The harness is four modules by job (tidy18; this one is what wrappers import, and it has
every name the one module had): `ab_harness_variants.py` (models, variants and their
settings, building them, the peers), `ab_harness_timing.py` (the machine's state, the clocks,
the rounds of blocks and their statistics, `--steps`' timing), `ab_harness_report.py` (the
outputs' checks, the printed table, the JSON record), and this one (`Config`, `ab_case` which
puts them together for one model, `run` over models and thread counts, the command line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# (the variants module imports pygraphx first: before torch, it sets OpenMP's spin count)
from benchmarks.ab_harness_variants import (  # noqa: E402,F401  (re-exported: the wrappers' names)
    PROCESS_ATTRS,
    PROCESS_KEYS,
    PROCESS_PREFIXES,
    TARGET,
    Case,
    OpenVino,
    Variant,
    _literal,
    _pygraphx_text,
    attribute_path,
    check_bf16,
    check_names,
    check_settings,
    compile_variant,
    load,
    ort_outputs,
    parse_env,
    parse_variant,
    settings,
)
from benchmarks.ab_harness_timing import (  # noqa: E402,F401
    ADAPT_KEYS,
    CLOCK_NAMES,
    CLOCKS,
    auto_runs,
    busy,
    busy_between,
    cpu_stat,
    describe_adaptation,
    fix_adaptation,
    loadavg,
    profiled,
    round_order,
    summarize,
    time_rounds,
    wait_quiet,
)
from benchmarks.ab_harness_timing import steps_by_kind as _steps  # noqa: E402
from benchmarks.ab_harness_report import (  # noqa: E402,F401
    TOL,
    case_record,
    compare,
    max_abs,
    output_names,
    print_after,
    print_table,
    rel_err,
    rel_errs,
    worst,
)
from benchmarks.ab_harness_report import print_steps as _print_steps  # noqa: E402

import pygraphx  # noqa: E402,F401


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
    is_bf16 = {v.name: cfg.bf16 or v.bf16 for v in variants}
    if cfg.openvino:
        is_bf16["OV"] = bf16
    cmp = compare(outs, want, output_names(case.data), is_bf16, cfg.tol)
    for p in progs.values():
        for _ in range(cfg.warmup):
            p.run(case.feeds)
    before = wait_quiet(cfg.wait_quiet) if cfg.wait_quiet is not None else None
    if before:
        print(f"# {case.spec}: {before}", file=out, flush=True)
    cname = cfg.clock_name()
    clock = CLOCKS[cname]
    # `--runs 0`: enough for about 0.2 s a block, by the first variant's runs
    runs = cfg.runs if cfg.runs > 0 else auto_runs(progs[first], case.feeds)
    timing = time_rounds(progs, order, case.feeds, cfg.rounds, runs, cfg.settle, clock)
    after = busy() if cfg.wait_quiet is not None else None
    stats = summarize(timing, first)
    dtype = "bf16" if bf16 else "f32"
    adapt = {key: os.environ.get(key) for key in ADAPT_KEYS}
    print_table(out, case.spec, cfg.threads, dtype, cfg.rounds, runs, cname, order,
                describe_adaptation(adapt), stats, cmp, described, cfg.spread)  # fmt: skip
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
    print_after(out, case.spec, after, timing, cfg.wait_quiet is not None, cmp)
    return case_record(case.spec, cfg.threads, dtype, cname, cfg.rounds, runs, order, before,
                       after, timing, adapt, stats, cmp, described, is_bf16,
                       (step_ms, step_fast, step_error), more)  # fmt: skip


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
