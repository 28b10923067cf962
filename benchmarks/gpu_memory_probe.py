"""Where pygraphx's peak device memory goes, stage by stage (H100 probe for issue 9).

For each row (model, batch, fp16) it reports, in MB above the block's start: the allocated
bytes after parse + quantize_fp16, the peak during compile, allocated after compile, the peak
of the first run (graph capture), allocated afterwards, and the peak of steady runs; then the
same with Triton off, graph capture off and cudnn.benchmark off, so each contributor shows.
With `--snapshot DIR` it also dumps torch's allocator history of the default configuration
(`torch.cuda.memory._dump_snapshot`) for reading on another machine.

    python benchmarks/gpu_memory_probe.py --rows resnet50:1 resnet50:32 mobilenetv2:1 \
        --json $OUT/mem.json --snapshot $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_vs_peers as peers  # noqa: E402

import pygraphx  # noqa: E402

MB = 2**20

VARIANTS = {
    "default": {},
    "triton_off": {"PGX_GPU_TRITON": "0"},
    "graph_off": {"PGX_GPU_GRAPH": "0"},
    "cudnn_benchmark_off": {"_cudnn_benchmark": "0"},
}


def stage(base: int) -> tuple[float, float]:
    torch.cuda.synchronize()
    now, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    return (now - base) / MB, (peak - base) / MB


def probe(onnx_bytes: bytes, inputs: dict, variant: dict, snapshot: Path | None) -> dict:
    env = {k: v for k, v in variant.items() if not k.startswith("_")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        base = peers.fresh_block()
        if snapshot is not None:
            torch.cuda.memory._record_memory_history(max_entries=200000)
        feeds = {k: v.cuda() for k, v in inputs.items()}
        r: dict = {}
        prog = pygraphx.parse_onnx_buffer(onnx_bytes)
        pygraphx.quantize_fp16(prog)
        r["after_parse"] = stage(base)[0]
        torch.cuda.reset_peak_memory_stats()
        t = pygraphx.get_target("gpu")
        prog.compile(t, offload_copy=False)
        if variant.get("_cudnn_benchmark") == "0":
            torch.backends.cudnn.benchmark = False
        r["after_compile"], r["peak_compile"] = stage(base)
        torch.cuda.reset_peak_memory_stats()
        prog.run(feeds)
        r["after_first_run"], r["peak_first_run"] = stage(base)
        torch.cuda.reset_peak_memory_stats()
        for _ in range(5):
            prog.run(feeds)
        r["after_runs"], r["peak_runs"] = stage(base)
        ex = prog._executable
        r["graph"] = ex.graph is not None
        r["reserved"] = torch.cuda.memory_reserved() / MB
        if snapshot is not None:
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
        del prog, ex
        return r
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch.backends.cudnn.benchmark = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=["resnet50:1", "resnet50:32", "mobilenetv2:1"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--snapshot", type=Path, help="allocator snapshots folder")
    opts = ap.parse_args()
    out = []
    for row in opts.rows:
        name, batch = row.split(":")
        module = peers.build_module(name)
        inputs = peers.make_inputs(name, int(batch))
        onnx_bytes = peers.export_onnx(module, inputs)
        del module
        for v in opts.variants:
            snap = None
            if opts.snapshot is not None and v == "default":
                snap = opts.snapshot / f"snapshot_{name}_b{batch}.pickle"
            r = {"model": name, "batch": int(batch), "variant": v,
                 **probe(onnx_bytes, inputs, VARIANTS[v], snap)}  # fmt: skip
            print(json.dumps({k: round(x, 1) if isinstance(x, float) else x for k, x in r.items()}),
                  flush=True)  # fmt: skip
            out.append(r)
    if opts.json:
        opts.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
