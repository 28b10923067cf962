"""pygraphx `gpu` vs torch eager vs torch.compile (default) vs torch.compile(reduce-overhead).

    python benchmarks/gpu_vs_peers.py                  # every row, fp32 and fp16
    python benchmarks/gpu_vs_peers.py --quick          # batch-1 rows, fewer runs, no warm
                                                       # torch.compile, torch.compile in fp16 only
    python benchmarks/gpu_vs_peers.py --json out.json
    python benchmarks/gpu_vs_peers.py --zoo            # the zoo rows only (benchmarks/zoo.py)

Rows: ResNet-50 (batch 1 and 32), MobileNetV2, BERT-base (seq 128) and GPT-2 small (seq 128) at
batch 1. Each is built from torchvision / transformers with random weights (seeded), exported
to ONNX once (fp32), and that ONNX file is what pygraphx compiles, so every engine runs the
same weights. fp16 means `module.half()` for torch and `quantize_fp16` for pygraphx (which keeps
float32 inputs and outputs, converting at the edges).

Every engine is timed in its own block, one after the other on the same GPU: build (the
module's weights are copied to the GPU inside the block), compile, warm up, then `--runs`
timed calls, each between two CUDA events on the current stream (the host's Python time shows
as GPU idle time between the events, so it is counted); the median is reported. Peak memory is
`torch.cuda.max_memory_allocated()` during the block minus what was allocated before it
(torch's caching allocator: pygraphx, eager and torch.compile all allocate through it).
Compile time: pygraphx cold = the first compile of the model in this process (ONNX bytes to a
runnable program, graph capture included: it happens on the first run, so the first run is
counted), warm = a second compile of the same ONNX in the same process; torch.compile cold =
the first call of the compiled module, warm = the same after `torch._dynamo.reset()` (inductor's
on-disk caches are then warm). pygraphx takes its inputs on the device (`offload_copy=False`)
like the torch engines, so no engine pays host copies. Settings: pygraphx runs with its
defaults (TF32 off, cuDNN autotuning on); the torch engines with torch's defaults, restored
before each of their blocks (cuDNN convolutions may use TF32 there: torch's default).
"""

from __future__ import annotations

import argparse
import copy
import gc
import io
import json
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402

ENGINES = ("pygraphx", "eager", "compile", "compile_ro")
# most asked-about rows first: a run cut short still has them
ROWS = (("resnet50", 1), ("bert_base", 1), ("gpt2", 1), ("mobilenetv2", 1), ("resnet50", 32))
#: `benchmarks/zoo.py` at full size (ViT-B/16 224, YOLOv8n-style 640, UNet 256, all-MiniLM-L6-v2
#: on 8 sentences x 128 tokens): run with `--zoo` or by name in `--models`; the batch is the
#: zoo's own (the number of sentences for minilm)
ZOO_ROWS = (("vit_b16", 1), ("yolov8_style", 1), ("unet_small", 1), ("minilm", 8))
_ZOO: dict[str, tuple] = {}
#: torch's own settings, restored before every torch engine (the gpu target sets its own)
TORCH_DEFAULTS = {
    "cudnn_tf32": torch.backends.cudnn.allow_tf32,
    "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
    "cudnn_benchmark": torch.backends.cudnn.benchmark,
}
SEQ = 128


# --- the models -----------------------------------------------------------------------------


class LastHidden(torch.nn.Module):
    """A transformers model returning its last hidden state as one tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state


def zoo_entry(name: str) -> tuple[torch.nn.Module, dict]:
    """A zoo model's torch module and inputs (built once: the detector recalibrates its BN)."""
    if name not in _ZOO:
        from benchmarks.zoo import torch_module

        _ZOO[name] = torch_module(name, "full")
    return _ZOO[name]


def build_module(name: str) -> torch.nn.Module:
    if name in dict(ZOO_ROWS):
        return zoo_entry(name)[0]
    torch.manual_seed(0)
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50(weights=None).eval()
    if name == "mobilenetv2":
        from torchvision.models import mobilenet_v2

        return mobilenet_v2(weights=None).eval()
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    if name == "bert_base":
        model = BertModel(BertConfig(attn_implementation="eager"), add_pooling_layer=False)
    else:
        model = GPT2Model(GPT2Config(attn_implementation="eager", use_cache=False))
    return LastHidden(model.eval()).eval()


def make_inputs(name: str, batch: int) -> dict[str, torch.Tensor]:
    if name in dict(ZOO_ROWS):
        return {k: torch.from_numpy(v) for k, v in zoo_entry(name)[1].items()}
    g = torch.Generator().manual_seed(1)
    if name in ("resnet50", "mobilenetv2"):
        return {"input": torch.randn(batch, 3, 224, 224, generator=g)}
    ids = torch.randint(0, 30000, (batch, SEQ), generator=g)
    # GPT-2 gets its mask too: without one, transformers' mask code uses aten::diff, which the
    # TorchScript exporter cannot write
    return {"input_ids": ids, "attention_mask": torch.ones(batch, SEQ, dtype=torch.int64)}


def export_onnx(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> bytes:
    """The module as ONNX (TorchScript exporter; the dynamo one if that fails, announced)."""
    buf = io.BytesIO()
    args = tuple(inputs.values())
    try:
        torch.onnx.export(module, args, buf, input_names=list(inputs), output_names=["output"],
                          opset_version=17, dynamo=False)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - reported, then the other exporter is tried
        print(f"  TorchScript export failed ({type(exc).__name__}: {exc}); trying dynamo=True")
        buf = io.BytesIO()
        torch.onnx.export(module, args, buf, input_names=list(inputs), output_names=["output"],
                          dynamo=True)  # fmt: skip
    return buf.getvalue()


# --- timing ---------------------------------------------------------------------------------


def time_calls(fn: Callable[[], Any], warmup: int, runs: int) -> list[float]:
    """Milliseconds of each of `runs` calls, by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return times


def fresh_block() -> int:
    """Start an engine's block; returns the bytes allocated at its start. cuBLAS workspaces
    that torch cached for earlier blocks' streams are freed first: torch.compile's CUDA graphs
    (and pygraphx's capture) free them while they run, so a workspace left in the baseline
    would be subtracted from that engine's peak (32 MiB on Hopper, once per stream)."""
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def compile_pygraphx(onnx_bytes: bytes, fp16: bool) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(onnx_bytes)
    if fp16:
        pygraphx.quantize_fp16(prog)
    prog.compile(pygraphx.get_target("gpu"), offload_copy=False)
    return prog


def run_pygraphx(onnx_bytes: bytes, inputs: dict, fp16: bool, opts: argparse.Namespace) -> dict:
    feeds = {k: v.cuda() for k, v in inputs.items()}
    start = time.perf_counter()
    prog = compile_pygraphx(onnx_bytes, fp16)
    prog.run(feeds)  # captures the graph
    torch.cuda.synchronize()
    cold = time.perf_counter() - start
    ex = prog._executable
    info = {"graph": ex.graph is not None, "attention_blocks": ex.attention_blocks,
            "fallbacks": ex.fallbacks, "why_uncaptured": ex.why_uncaptured}  # fmt: skip
    times = time_calls(lambda: prog.run(feeds), opts.warmup, opts.runs)
    warm = None
    if not opts.quick:
        # the first program must be gone before the second compiles, else the peak counts both
        first = weakref.ref(ex)
        del prog, ex
        drop_program(first)
        start = time.perf_counter()
        again = compile_pygraphx(onnx_bytes, fp16)
        again.run(feeds)
        torch.cuda.synchronize()
        warm = time.perf_counter() - start
    return {"times": times, "compile_cold_s": cold, "compile_warm_s": warm, **info}


def drop_program(first: weakref.ref) -> None:
    """Collect the first program's executable (its weights, arena and graph pool) and fail
    loudly if something still holds it."""
    gc.collect()
    if first() is not None:
        raise RuntimeError(
            "benchmark bug: the first pygraphx executable is still referenced before the warm "
            f"compile ({[type(r).__name__ for r in gc.get_referrers(first())]}), so its memory "
            "would count in the peak"
        )


def run_torch(
    module: torch.nn.Module, inputs: dict, fp16: bool, mode: str | None, opts: argparse.Namespace
) -> dict:
    """torch eager (mode None) or torch.compile with `mode` ("default", "reduce-overhead")."""
    torch.backends.cudnn.allow_tf32 = TORCH_DEFAULTS["cudnn_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = TORCH_DEFAULTS["matmul_tf32"]
    torch.backends.cudnn.benchmark = TORCH_DEFAULTS["cudnn_benchmark"]
    m = copy.deepcopy(module).cuda()
    feeds = {k: v.cuda() for k, v in inputs.items()}
    if fp16:
        m = m.half()
        feeds = {k: v.half() if v.is_floating_point() else v for k, v in feeds.items()}
    args = tuple(feeds.values())
    fn = m if mode is None else torch.compile(m, mode=mode)
    cold = warm = None
    with torch.inference_mode():
        if mode is not None:
            start = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            cold = time.perf_counter() - start
            if not opts.quick:
                torch._dynamo.reset()
                fn = torch.compile(m, mode=mode)
                start = time.perf_counter()
                fn(*args)
                torch.cuda.synchronize()
                warm = time.perf_counter() - start
        times = time_calls(lambda: fn(*args), opts.warmup, opts.runs)
    if mode is not None:
        torch._dynamo.reset()
    return {"times": times, "compile_cold_s": cold, "compile_warm_s": warm}


# --- the run --------------------------------------------------------------------------------


def engines_for(dtype: str, opts: argparse.Namespace) -> list[str]:
    chosen = [e for e in ENGINES if e in opts.engines]
    if opts.quick and dtype == "fp32":  # torch.compile takes 15-25 s a model: fp16 only
        chosen = [e for e in chosen if not e.startswith("compile")]
    return chosen


def bench_row(name: str, batch: int, opts: argparse.Namespace) -> list[dict]:
    module = build_module(name)
    inputs = make_inputs(name, batch)
    onnx_bytes = export_onnx(module, inputs)
    results = []
    for dtype in opts.dtypes:
        fp16 = dtype == "fp16"
        for engine in engines_for(dtype, opts):
            base = fresh_block()
            if engine == "pygraphx":
                r = run_pygraphx(onnx_bytes, inputs, fp16, opts)
            else:
                mode = {"eager": None, "compile": "default", "compile_ro": "reduce-overhead"}
                r = run_torch(module, inputs, fp16, mode[engine], opts)
            r["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            r["median_ms"] = statistics.median(r.pop("times"))
            row = {"model": name, "batch": batch, "dtype": dtype, "engine": engine, **r}
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def ratio_table(results: list[dict]) -> list[str]:
    """Latency and memory of pygraphx over each peer, per row."""
    lines = [f"{'row':<22}{'engine':<12}{'ms':>9}{'pgx/x':>8}{'peak MB':>10}{'compile s':>11}"]
    keys = sorted({(r["model"], r["batch"], r["dtype"]) for r in results}, key=str)
    for key in keys:
        rows = {r["engine"]: r for r in results if (r["model"], r["batch"], r["dtype"]) == key}
        pgx = rows.get("pygraphx")
        for engine, r in rows.items():
            ratio = pgx["median_ms"] / r["median_ms"] if pgx else float("nan")
            comp = r.get("compile_cold_s")
            label = f"{key[0]} b{key[1]} {key[2]}"
            lines.append(
                f"{label:<22}{engine:<12}{r['median_ms']:>9.3f}{ratio:>8.2f}"
                f"{r['peak_mb']:>10.0f}{comp if comp is None else round(comp, 1)!s:>11}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--models", nargs="*", default=None, help="subset of the model names")
    ap.add_argument("--zoo", action="store_true", help="the zoo rows (vit_b16, yolov8_style, ...)")
    ap.add_argument("--dtypes", nargs="*", default=["fp32", "fp16"])
    ap.add_argument("--engines", nargs="*", default=list(ENGINES))
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    opts = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_vs_peers needs a CUDA/ROCm GPU (torch.cuda.is_available() is False)")
        return 2
    opts.runs = opts.runs or (20 if opts.quick else 100)
    opts.warmup = opts.warmup or (5 if opts.quick else 20)
    rows = list(ZOO_ROWS if opts.zoo else ROWS + ZOO_ROWS if opts.models else ROWS)
    rows = [(m, b) for m, b in rows if not opts.quick or b == 1 or (m, b) in ZOO_ROWS]
    rows = [(m, b) for m, b in rows if opts.models is None or m in opts.models]
    results = []
    for name, batch in rows:
        print(f"== {name} batch {batch}", flush=True)
        results += bench_row(name, batch, opts)
    print("\n".join(ratio_table(results)))
    if opts.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "quick": opts.quick, "runs": opts.runs, "warmup": opts.warmup}  # fmt: skip
        Path(opts.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
