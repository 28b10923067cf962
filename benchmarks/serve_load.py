"""Load on `pygraphx-driver serve` over loopback: throughput and latency, batching on and off.

    python benchmarks/serve_load.py                                  # ResNet-50, cpu
    python benchmarks/serve_load.py --model mobilenetv2 --concurrency 1 8 64 --duration 10
    python benchmarks/serve_load.py --onnx model.onnx --batching on --json load.json

For each batching mode (`on`: dynamic batching up to `--max-batch` within `--window-us`;
`off`: every request runs alone at batch 1) the server runs in its own process (the driver's
`serve` command, free loopback ports), and for each concurrency level that many clients (the
official `tritonclient.http.aio` client, one coroutine each, binary tensors) send requests back
to back until `--requests` have been sent or `--duration` seconds have passed, whichever comes
first. Reported per level: requests answered / failed / lost (sent but never answered),
throughput, p50 and p99 latency, and the mean rows per executed batch (from `/metrics`). The
model file and its compiled programs are cached under `--cache-dir` so reruns do not compile.
Loopback only: the server binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--model", default="resnet50", help="a built-in model (resnet50)")
    what.add_argument("--onnx", help="an ONNX file (batch axis first)")
    p.add_argument("--target", default="cpu", choices=["ref", "cpu", "gpu"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--duration", type=float, default=30.0, help="seconds per level (limit)")
    p.add_argument("--requests", type=int, default=5000, help="requests per level (limit)")
    p.add_argument("--batching", choices=["on", "off", "both"], default="both")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--window-us", type=int, default=5000)
    p.add_argument("--queue-size", type=int, default=1024)
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "pygraphx-serve-load"))
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    return p.parse_args(argv)


def model_file(args: argparse.Namespace) -> Path:
    """The ONNX file to serve: `--onnx`, or the built-in model written once to the cache."""
    if args.onnx:
        return Path(args.onnx)
    folder = Path(args.cache_dir) / args.model
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{args.model}.onnx"
    if not path.exists():
        sys.path.insert(0, str(ROOT))
        from pygraphx.models import get_model

        onnx.save(get_model(args.model, batch=1), path)
    return path


def start_server(path: Path, args: argparse.Namespace, batching: bool) -> tuple[Any, int]:
    """The driver's serve command in a process; returns it and its HTTP port."""
    cmd = [sys.executable, "-m", "pygraphx", "serve", "--onnx", str(path), f"--{args.target}"]
    cmd += ["--http-port", "0", "--grpc-port", "0", "--log-level", "warning"]
    cmd += ["--queue-size", str(args.queue_size)]
    if batching:
        cmd += ["--max-batch", str(args.max_batch), "--batch-window-us", str(args.window_us)]
    else:
        cmd += ["--max-batch", "1", "--no-batching"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # this checkout first, the caller's path kept
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("Serving: HTTP"):
        proc.kill()
        raise RuntimeError(f"the server did not start (exit {proc.wait()}): {line!r}")
    return proc, int(line.split()[2].rstrip(","))


def sample_inputs(path: Path) -> list[tuple[str, np.ndarray, str]]:
    """One batch-1 input per graph input: random floats, or small integers (token ids)."""
    model = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    out = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [1] + [d.dim_value for d in vi.type.tensor_type.shape.dim[1:]]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out.append((vi.name, rng.integers(0, 100, shape, dtype=np.int64), "INT64"))
        else:
            out.append((vi.name, rng.standard_normal(shape).astype(np.float32), "FP32"))
    return out


async def run_level(port: int, inputs: list, clients: int, args: argparse.Namespace) -> dict:
    """`clients` coroutines sending requests back to back; latencies and outcomes."""
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=clients)
    infer_inputs = []
    for name, arr, datatype in inputs:
        inp = aioclient.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr)
        infer_inputs.append(inp)
    latencies: list[float] = []
    failures: dict[str, int] = {}
    budget = {"left": args.requests}
    deadline = time.perf_counter() + args.duration

    async def one_client() -> None:
        while budget["left"] > 0 and time.perf_counter() < deadline:
            budget["left"] -= 1
            start = time.perf_counter()
            try:
                await client.infer(args.model_name, infer_inputs)
                latencies.append(time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001 - counted by kind, reported
                key = type(exc).__name__ + ": " + str(exc)[:80]
                failures[key] = failures.get(key, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    await client.close()
    sent = args.requests - budget["left"]
    ok = len(latencies)
    lat = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    return {
        "clients": clients,
        "sent": sent,
        "ok": ok,
        "failed": sum(failures.values()),
        "lost": sent - ok - sum(failures.values()),
        "failures": failures,
        "seconds": round(elapsed, 2),
        "throughput": round(ok / elapsed, 2),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
    }


def batch_stats(port: int) -> tuple[float, float]:
    """Executed batches and rows so far, from the server's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    count = re.search(r"^pgx_batch_size_count\{[^}]*\} (\S+)$", text, re.M)
    total = re.search(r"^pgx_batch_size_sum\{[^}]*\} (\S+)$", text, re.M)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)


def run_mode(path: Path, args: argparse.Namespace, batching: bool) -> list[dict]:
    proc, port = start_server(path, args, batching)
    rows = []
    try:
        inputs = sample_inputs(path)
        asyncio.run(run_level(port, inputs, 1, argparse.Namespace(**{**vars(args), "requests": 3})))
        for clients in args.concurrency:
            before = batch_stats(port)
            row = asyncio.run(run_level(port, inputs, clients, args))
            after = batch_stats(port)
            batches = after[0] - before[0]
            row["mean_batch"] = round((after[1] - before[1]) / batches, 2) if batches else 0.0
            row["batching"] = "on" if batching else "off"
            rows.append(row)
            print(format_row(row), flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
    return rows


def format_row(r: dict) -> str:
    return (
        f"batching {r['batching']:>3}  clients {r['clients']:>3}  ok {r['ok']:>5}  "
        f"failed {r['failed']:>3}  lost {r['lost']:>2}  {r['throughput']:8.2f} req/s  "
        f"p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  mean batch {r['mean_batch']:5.2f}"
        + (f"  failures {r['failures']}" if r["failures"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = model_file(args)
    args.model_name = path.stem
    print(
        f"{path.name} on {args.target}: {os.cpu_count()} CPUs ({platform.processor()}), "
        f"{args.duration:g} s or {args.requests} requests per level",
        flush=True,
    )
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.batching]
    rows = [row for batching in modes for row in run_mode(path, args, batching)]
    if args.json:
        doc = {"model": path.name, "target": args.target, "args": vars(args), "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
