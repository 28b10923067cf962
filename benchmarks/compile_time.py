"""Compile time: pygraphx parse + passes + prepare against ONNX Runtime's session creation.

    python benchmarks/compile_time.py                       # resnet50, mobilenetv2, bert_base, gpt2
    python benchmarks/compile_time.py --models resnet50 --runs 3
    python benchmarks/compile_time.py --json out.json
    python benchmarks/compile_time.py --profile 25          # + cProfile top 25 of pygraphx cpu

Each built-in model (`pygraphx.models`, batch 1, sequence 128, random weights) is exported to
an ONNX file once. Every engine then compiles it in a fresh Python process (imports done before
the clock starts, so no engine profits from another's warm caches), `--runs` times (default 2);
the best process counts. What is timed, from the model file's bytes in memory:

- pygraphx `cpu` (and `gpu` where `torch.cuda.is_available()`): `parse_onnx_buffer`, then
  `Program.compile(target)`, split into each pass (`program.pass_times`), `prepare` (lowering to
  torch steps, weight packing) and the rest (the pass manager's validation of every module
  after every pass);
- `--baseline DIR`: another checkout's pygraphx cpu, cold, in the same turns (an A/B);
- ONNX Runtime: `InferenceSession(bytes, providers=["CPUExecutionProvider"])` with default
  session options (all graph optimisations, ORT's default threads).

pygraphx cpu is timed cold (`PGX_CONV_CHOICE_CACHE=off`: every convolution choice measured
in the process, nothing read from disk) and warm (`pygraphx-cpu-warm`: the choices read from a
cache file that one earlier process of the same model wrote, as the per-user default file
`$XDG_CACHE_HOME/pygraphx/conv_choice-<tag>.json` serves every compile after a machine's
first). The ratio is cold pygraphx cpu (parse + compile) / ORT session creation: the goal of
issue 10, part 5, is at most 1 for ResNet-50.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("resnet50", "mobilenetv2", "bert_base", "gpt2")


# --- the child process: one engine compiles one model ------------------------------------


def _time_pygraphx(data: bytes, target_name: str) -> dict[str, Any]:
    import pygraphx

    target = pygraphx.get_target(target_name)
    stamps: dict[str, float] = {}
    prepare = target.prepare

    def timed_prepare(program: Any, options: dict[str, Any]) -> Any:
        start = time.perf_counter()
        result = prepare(program, options)
        if target_name == "gpu":  # weights uploaded and packed, not just queued
            import torch

            torch.cuda.synchronize()
        stamps["prepare"] = time.perf_counter() - start
        return result

    target.prepare = timed_prepare  # type: ignore[method-assign]
    cpu_start = time.process_time()
    start = time.perf_counter()
    prog = pygraphx.parse_onnx_buffer(data)
    parsed = time.perf_counter()
    prog.compile(target)
    done = time.perf_counter()
    cpu_s = time.process_time() - cpu_start
    passes = [(name, seconds) for name, seconds in prog.pass_times]
    compile_s = done - parsed
    pass_s = sum(s for _, s in passes)
    return {
        "parse": parsed - start,
        "passes": pass_s,
        "prepare": stamps["prepare"],
        "validate_other": compile_s - pass_s - stamps["prepare"],
        "total": done - start,
        "cpu": cpu_s,
        "pass_times": passes,
    }


def _time_ort(data: bytes) -> dict[str, Any]:
    import onnxruntime as ort

    cpu_start = time.process_time()
    start = time.perf_counter()
    ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return {"total": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}


def child(engine: str, path: str, profile: int) -> dict[str, Any]:
    """Time one engine compiling the model at `path` (run in a fresh process)."""
    start = time.perf_counter()
    if engine == "ort":
        import onnxruntime  # noqa: F401
    else:  # pygraphx before torch, as a user's program would (see pygraphx/targets/__init__.py)
        import importlib

        import pygraphx.targets  # noqa: F401

        importlib.import_module("torch")
    imports = time.perf_counter() - start
    data = Path(path).read_bytes()
    if engine == "ort":
        result = _time_ort(data)
    elif profile:
        result = _profiled(data, engine, profile)
    else:
        result = _time_pygraphx(data, _target_name(engine))
    result["imports"] = imports
    return result


def _target_name(engine: str) -> str:
    """ "pygraphx-cpu-warm" -> "cpu" (warm differs only in its environment)."""
    return engine.removeprefix("pygraphx-").removesuffix("-warm")


def _profiled(data: bytes, engine: str, top: int) -> dict[str, Any]:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    result = _time_pygraphx(data, _target_name(engine))
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    result["profile"] = text.getvalue()
    return result


# --- the parent: export, spawn, collect --------------------------------------------------


def export(name: str, folder: Path) -> Path:
    """The built-in model `name` (batch 1, sequence 128) as an ONNX file in `folder`."""
    import onnx

    from pygraphx.models import get_model

    path = folder / f"{name}.onnx"
    if not path.exists():
        onnx.save(get_model(name, batch=1, seq_len=128), str(path))
    return path


def spawn(
    engine: str,
    path: Path,
    profile: int = 0,
    choices: Path | None = None,
    root: Path = ROOT,
) -> dict[str, Any]:
    """Run `child(engine, path)` in a fresh interpreter and return its measurements; pygraphx
    reads and writes its convolution choices in the file `choices` (None: none, cold); `root`:
    the checkout whose pygraphx is timed (by this file's code; another one: a baseline)."""
    cmd = [sys.executable, __file__, "--child", engine, str(path), "--profile", str(profile)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "PGX_CONV_CHOICE_CACHE": str(choices) if choices is not None else "off",
    }
    # modules the compile imports on first use (the lowering tables) load from their cached
    # bytecode, as an installed package's do: without it every process compiled them from
    # source inside the timed span (12-15 ms of ResNet-50's compile)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} on {path.name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def engines() -> list[str]:
    """pygraphx cpu (cold and warm), pygraphx gpu where torch sees a CUDA device, and ORT."""
    import torch

    found = ["pygraphx-cpu", "pygraphx-cpu-warm"]
    if torch.cuda.is_available():
        found.append("pygraphx-gpu")
    return [*found, "ort"]


def measure(
    name: str, folder: Path, runs: int, profile: int, baseline: Path | None = None
) -> dict[str, Any]:
    """Best of `runs` fresh processes per engine for model `name`, the engines taking turns
    (a change of load hits them alike); `baseline`: another checkout, timed cold as
    "baseline-cpu" in the same turns."""
    path = export(name, folder)
    row: dict[str, Any] = {"model": name, "onnx_mb": path.stat().st_size / 1e6}
    row["load_before"] = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    choices = folder / f"{name}.conv_choices.json"
    choices.unlink(missing_ok=True)
    spawn("pygraphx-cpu-warm", path, choices=choices)  # writes the file the warm ones read
    names = engines() + (["baseline-cpu"] if baseline is not None else [])
    tries: dict[str, list[dict[str, Any]]] = {engine: [] for engine in names}
    for _ in range(runs):
        for engine in names:
            if engine == "baseline-cpu":  # a new file: cold (older code reads "off" as a path)
                fresh = folder / f"{name}.baseline_choices.json"
                fresh.unlink(missing_ok=True)
                got = spawn("pygraphx-cpu", path, choices=fresh, root=baseline)
                fresh.unlink(missing_ok=True)
            else:
                warm = engine.endswith("-warm")
                got = spawn(engine, path, choices=choices if warm else None)
            tries[engine].append(got)
    for engine, got in tries.items():
        row[engine] = min(got, key=lambda r: r["total"])
        row[engine]["all_totals"] = [r["total"] for r in got]
    row["load_after"] = os.getloadavg()[0]
    row["ratio_cpu_vs_ort"] = row["pygraphx-cpu"]["total"] / row["ort"]["total"]
    # CPU seconds of each process's threads over the same span, least of the runs: what load
    # from other processes inflates least (a loaded machine stretches the wall clock 1.5-3x)
    for engine in tries:
        row[engine]["least_cpu"] = min(r.get("cpu", float("nan")) for r in tries[engine])
    if profile:
        row["profile"] = spawn("pygraphx-cpu", path, profile)["profile"]
    return row


def print_row(row: dict[str, Any]) -> None:
    cpu, ort = row["pygraphx-cpu"], row["ort"]
    line = (
        f"{row['model']:12s} {row['onnx_mb']:6.0f} MB  pgx cpu {cpu['total']:6.2f} s "
        f"(parse {cpu['parse']:.2f}, passes {cpu['passes']:.2f}, validate+other "
        f"{cpu['validate_other']:.2f}, prepare {cpu['prepare']:.2f})  ORT {ort['total']:6.2f} s"
        f"  ratio {row['ratio_cpu_vs_ort']:.2f}"
    )
    line += f"  | warm {row['pygraphx-cpu-warm']['total']:.2f} s"
    line += (
        f"  | CPU s: pgx {cpu['least_cpu']:.2f}, warm {row['pygraphx-cpu-warm']['least_cpu']:.2f},"
        f" ORT {ort['least_cpu']:.2f}"
    )
    if "baseline-cpu" in row:
        base = row["baseline-cpu"]
        line += f"  | baseline cold {base['total']:.2f} s (CPU {base['least_cpu']:.2f})"
    line += f"  (load {row['load_before']:.1f}-{row['load_after']:.1f})"
    if "pygraphx-gpu" in row:
        gpu = row["pygraphx-gpu"]
        line += f"  | pgx gpu {gpu['total']:.2f} s (prepare {gpu['prepare']:.2f})"
    print(line, flush=True)
    slow = sorted(cpu["pass_times"], key=lambda p: -p[1])[:4]
    print("    slowest passes: " + ", ".join(f"{n} {s * 1e3:.0f} ms" for n, s in slow))
    if "profile" in row:
        print(row["profile"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--runs", type=int, default=2, help="fresh processes per engine (best kept)")
    ap.add_argument("--json", help="write the measurements to this file")
    ap.add_argument("--profile", type=int, default=0, help="cProfile top N of pygraphx cpu")
    ap.add_argument("--baseline", type=Path, help="another checkout, timed cold in turn")
    ap.add_argument("--cache", help="folder for the exported models (default: a temporary one)")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.profile)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.cache or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in args.models:
            rows.append(measure(name, folder, args.runs, args.profile, args.baseline))
            print_row(rows[-1])
    if args.json:
        meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": sys.version}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
