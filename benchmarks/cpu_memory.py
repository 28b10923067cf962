"""Peak resident memory of a process that compiles and runs a model: pygraphx `cpu` vs ORT.

    python benchmarks/cpu_memory.py                       # resnet50, bert_base, gpt2
    python benchmarks/cpu_memory.py --models resnet50 --json out.json
    python benchmarks/cpu_memory.py --dir /tmp/models     # where the .onnx files are written

Each built-in model (`pygraphx.models`, random weights, batch 1, sequence 128) is written to an
`.onnx` file once. Then, for every model and engine, a fresh Python process imports the same
modules (numpy, onnx, torch, onnxruntime, pygraphx: what either engine needs, so the baseline is
the same), loads the model from the file (its inputs from an `.npz` beside it), compiles it
(pygraphx: `parse_onnx` + `compile(get_target("cpu"))`; ORT: `InferenceSession(path)` on the
CPU provider), runs it once on `model_inputs`, and exits. Its peak resident set size is the
child's `ru_maxrss` from
`os.wait4` (what `/usr/bin/time -v` reports as "Maximum resident set size"); the parent
imports nothing big and exports the models in children of their own, because Linux carries a
forked parent's peak into the child's `ru_maxrss` across exec. A third child,
`imports`, only imports the modules: the memory every process pays before it sees a model.

The table gives MB (10^6 bytes) per engine and pygraphx / ORT; `--json` writes the rows.
`--repeat N` runs N children per engine and reports the median (other processes on the machine
move ORT's peak by about 10%). Thread counts are each engine's default (they change memory
little); `--threads N` sets both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ("resnet50", "bert_base", "gpt2")
ENGINES = ("imports", "pygraphx", "ort")


def _child(engine: str, name: str, path: str, threads: int) -> None:
    """The measured process: the same imports for every engine, then one engine's work."""
    # isort: off
    import pygraphx
    import pygraphx.targets.cpu  # noqa: F401  (sets OpenMP's waiting policy before torch loads)

    # isort: on
    import numpy as np
    import onnx  # noqa: F401
    import onnxruntime as ort
    import torch  # noqa: F401  (the same imports in every child)

    if engine == "imports":
        return
    with np.load(_inputs_file(path)) as npz:
        feeds = {k: npz[k] for k in npz.files}
    start = time.perf_counter()
    if engine == "pygraphx":
        prog = pygraphx.parse_onnx(path)
        kw = {"threads": threads} if threads else {}
        prog.compile(pygraphx.get_target("cpu", **kw))
        compiled = time.perf_counter() - start
        out = [np.asarray(a) for a in prog.run(feeds)]
    else:
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        compiled = time.perf_counter() - start
        out = sess.run(None, feeds)
    print(json.dumps({"compile_s": compiled, "out0_sum": float(np.sum(out[0], dtype=np.float64))}))


def measure(engine: str, name: str, path: Path, threads: int) -> dict[str, Any]:
    """Run one child and return its peak RSS (MB) and what it printed."""
    cmd = [sys.executable, __file__, "--child", engine, name, str(path), str(threads)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} on {name} failed with exit code {proc.returncode}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    info = json.loads(lines[-1]) if lines else {}
    return {"peak_mb": usage.ru_maxrss * 1024 / 1e6, **info}  # ru_maxrss is in KiB on Linux


def _median(engine: str, name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run with the median peak of `--repeat` children."""
    runs = sorted(
        (measure(engine, name, path, args.threads) for _ in range(max(args.repeat, 1))),
        key=lambda r: r["peak_mb"],
    )
    return {**runs[len(runs) // 2], "peaks_mb": [r["peak_mb"] for r in runs]}


def export(name: str, folder: Path) -> Path:
    """The model's .onnx file in `folder`, written once (by a child process: a child forked
    from a big parent would inherit its peak, which Linux keeps in `ru_maxrss` across exec)."""
    path = folder / f"{name}_b1.onnx"
    if not path.exists() or not _inputs_file(path).exists():
        cmd = [sys.executable, __file__, "--export", name, str(path)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        subprocess.run(cmd, check=True, env=env)
    return path


def _inputs_file(path: str | Path) -> Path:
    """Where the model's inputs are saved (the children must not load the model to make them)."""
    return Path(path).with_suffix(".inputs.npz")


def _export(name: str, path: str) -> None:
    import numpy as np

    from pygraphx.models import get_model, model_inputs

    model = get_model(name, batch=1, seq_len=128)
    np.savez(_inputs_file(path), **model_inputs(name, model))
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache/pygraphx/memory_models")
    ap.add_argument("--threads", type=int, default=0, help="0: each engine's default")
    ap.add_argument("--repeat", type=int, default=1, help="children per engine; the median")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'model':10} {'file MB':>8} {'imports':>8} {'pygraphx':>9} {'ORT':>7} {'ratio':>6}")
    for name in args.models:
        path = export(name, args.dir)
        res = {e: _median(e, name, path, args) for e in ENGINES}
        row = {
            "model": name,
            "file_mb": path.stat().st_size / 1e6,
            **{f"{e}_mb": r["peak_mb"] for e, r in res.items()},
            "ratio_pygraphx_over_ort": res["pygraphx"]["peak_mb"] / res["ort"]["peak_mb"],
            "peaks_mb": {e: r["peaks_mb"] for e, r in res.items()},
            "compile_s": {e: res[e].get("compile_s") for e in ("pygraphx", "ort")},
            "out0_sum": {e: res[e].get("out0_sum") for e in ("pygraphx", "ort")},
        }
        rows.append(row)
        print(
            f"{name:10} {row['file_mb']:8.0f} {row['imports_mb']:8.0f} {row['pygraphx_mb']:9.0f} "
            f"{row['ort_mb']:7.0f} {row['ratio_pygraphx_over_ort']:6.2f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--export":
        _export(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
