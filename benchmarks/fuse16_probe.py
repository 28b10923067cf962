"""fp16 convolutions with their bias / residual / ReLU epilogue on one GPU (`conv_epilogue.py`).

    python benchmarks/fuse16_probe.py --json out.json            # layers, then the model A/B
    python benchmarks/fuse16_probe.py --no-model                  # the layer table only

1. Layers: ResNet-50's convolution shapes at batch `--batch` (fp16, channels-last), each with
   the epilogue its group has there (bias + ReLU; bias + residual + ReLU), timed in this one
   process (`conv_epilogue._time`: 10 calls captured in one CUDA graph, the best of 3
   replays, the measure the `auto` choice uses) as: `conv` (F.conv2d alone, the floor),
   `conv+pass` (F.conv2d then
   `epilogue_in_place`: one in-place pass, as today's separate Triton group and the `triton`
   form), `bias+torch` (F.conv2d with its bias, which torch adds in a kernel of its own, then
   in-place torch add_ / relu_) and `cudnn` (cuDNN's fused op).
2. Model: ResNet-50 (`--model`: another of `pygraphx.models`; random weights) through
   `quant_gpu.py`'s own helpers,
   every variant compiled in this process and timed in blocks (`quant_gpu.time_blocks`), then
   profiled (`quant_gpu.device_profile`): fp32 and fp16, each with
   `PGX_GPU_CONV_EPILOGUE=off` (the convolution and its group apart, as before) and each of
   `--modes` (fp32: NCHW, no TF32), and with `--int8`, int8 (conv=gemm, gemm=triton: its
   row against the new fp16).
   Accuracy: relative RMS against ONNX Runtime float32 on the host and against pgx fp32.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from quant_gpu import (  # noqa: E402
    INT8_CONV_ENV,
    INT8_GEMM_ENV,
    device_profile,
    quantised_file,
    rel_rms,
    time_blocks,
    variant,
)

from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.gpu import conv_epilogue as ce  # noqa: E402

CL = torch.channels_last
#: (c_in, hw_in, c_out, kernel, stride, epilogue) of ResNet-50's convolutions (one per shape;
#: `add`: bias + residual + ReLU; `relu`: bias + ReLU)
LAYERS = [
    (3, 224, 64, 7, 2, "relu"),
    (64, 56, 64, 1, 1, "relu"), (64, 56, 64, 3, 1, "relu"), (64, 56, 256, 1, 1, "add"),
    (256, 56, 64, 1, 1, "relu"), (256, 56, 128, 1, 1, "relu"), (128, 56, 128, 3, 2, "relu"),
    (128, 28, 512, 1, 1, "add"), (512, 28, 128, 1, 1, "relu"), (128, 28, 128, 3, 1, "relu"),
    (512, 28, 256, 1, 1, "relu"), (256, 28, 256, 3, 2, "relu"), (256, 14, 1024, 1, 1, "add"),
    (1024, 14, 256, 1, 1, "relu"), (256, 14, 256, 3, 1, "relu"), (1024, 14, 512, 1, 1, "relu"),
    (512, 14, 512, 3, 2, "relu"), (512, 7, 2048, 1, 1, "add"), (2048, 7, 512, 1, 1, "relu"),
    (512, 7, 512, 3, 1, "relu"),
]  # fmt: skip


def layer_row(batch: int, layer: tuple) -> dict:
    c_in, hw, c_out, k, stride, kind = layer
    dev, half = "cuda", torch.float16
    x = torch.randn(batch, c_in, hw, hw, device=dev, dtype=half).contiguous(memory_format=CL)
    w = (torch.randn(c_out, c_in, k, k, device=dev, dtype=half) * 0.05).contiguous(memory_format=CL)
    bias = torch.randn(c_out, device=dev, dtype=half)
    geo = ce.Geometry(w, [stride] * 2, [k // 2] * 2, [1, 1], 1, "channels_last")
    z = None
    if kind == "add":
        z = torch.randn_like(geo.conv(x)).contiguous(memory_format=CL)
    epi = ce.Epilogue(bias, None if z is None else object(), relu=True)

    def conv_pass() -> torch.Tensor:
        y = geo.conv(x)
        ce.epilogue_in_place(y, bias, z, True)
        return y

    def bias_torch() -> torch.Tensor:
        y = F.conv2d(x, w, bias, geo.stride, geo.padding)
        if z is not None:
            y.add_(z)
        return y.relu_()

    cudnn = ce.fused_function("cudnn", geo, epi)
    forms = {"conv": lambda: geo.conv(x), "conv+pass": conv_pass, "bias+torch": bias_torch,
             "cudnn": lambda: cudnn(x, z)}  # fmt: skip
    row = {"layer": list(layer)}
    for name, fn in forms.items():
        try:
            row[name] = ce._time(fn)
        except RuntimeError as exc:
            row[name] = None
            print(f"    {name} failed on {layer}: {exc}")
    want = bias_torch().float()
    row["cudnn_max_err"] = float((cudnn(x, z).float() - want).abs().max())
    return row


def layers(batch: int) -> list[dict]:
    rows = [layer_row(batch, layer) for layer in LAYERS]
    print("layer (c_in hw c_out k s epi)        conv  conv+pass  bias+torch  cudnn  (ms)  err")
    for r in rows:
        cells = "".join(
            f"{r[k]:10.4f}" if r[k] is not None else "      fail"
            for k in ("conv", "conv+pass", "bias+torch", "cudnn")
        )
        print(f"  {r['layer']!s:34s}{cells}  {r['cudnn_max_err']:.3g}")
    for k in ("conv", "conv+pass", "bias+torch", "cudnn"):
        print(f"  sum {k}: {sum(r[k] or 0 for r in rows):.4f} ms (one layer per shape)")
    return rows


def ort_reference(model, host: dict) -> np.ndarray:
    import onnxruntime as ort

    model.ir_version = min(model.ir_version, 13)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, host)[0]


def model_ab(args: argparse.Namespace) -> list[dict]:
    model = get_model(args.model, batch=args.batch)
    host = model_inputs(args.model, model, seed=0)
    feeds = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
    plans = [
        (f"{kind} epilogue={m}", kind, {ce.EPILOGUE_ENV: m})
        for kind in ("fp32", "fp16")
        for m in ("off", *args.modes)
    ]
    if args.int8:
        env = {INT8_CONV_ENV: "gemm", INT8_GEMM_ENV: "triton", ce.EPILOGUE_ENV: "auto"}
        plans.append(("int8 conv=gemm gemm=triton", "int8", env))
    want = ort_reference(model, host)
    calib = [model_inputs(args.model, model, seed=k) for k in range(1, args.calib + 1)]
    rows, progs, files, fp32 = [], [], {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, env in plans:
            if kind not in files:
                files[kind] = quantised_file(
                    model.SerializeToString(), kind, calib, Path(tmp), False
                )
            try:
                row, out, prog = variant(label, files[kind], env, feeds, args)
            except Exception:  # noqa: BLE001 - reported, the other variants still run
                traceback.print_exc()
                continue
            fp32 = out if fp32 is None else fp32  # the first row: fp32 as before
            row["rel_rms_vs_ort"] = rel_rms(out, want)
            row["rel_rms_vs_fp32"] = rel_rms(out, fp32)
            row["fused"] = dict(prog._executable.lowered.ctx.cache.get("conv_epilogue", {}))
            print(f"  compiled {label} (prepare {row['prepare_s']:.1f} s) fused {row['fused']}")
            rows.append(row)
            progs.append(prog)
        time_blocks(rows, progs, feeds, args)
        for row, prog in zip(rows, progs, strict=True):
            print(f"  {row['variant']}:")
            row["profile"] = device_profile(prog, feeds, args.profile_runs, args.top)
    base = next(r["ms"] for r in rows if r["variant"] == "fp16 epilogue=off")
    for r in rows:
        acc = f"rel rms vs ORT {r['rel_rms_vs_ort']:.2e} vs fp32 {r['rel_rms_vs_fp32']:.2e}"
        dev = r["profile"]["total_ms"]
        print(
            f"  {r['variant']:28s} {r['ms']:7.3f} ms  queued {r['ms_queued']:.3f}  "
            f"/fp16-off {r['ms'] / base:.3f}  device {dev:.3f} ms  {acc}"
        )
    print("  auto's choices:", {str(k[3]) + str(k[9:11]): v for k, v in ce.choices().items()})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--model", default="resnet50", help="a `pygraphx.models` name")
    ap.add_argument("--no-layers", action="store_true")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--modes", nargs="*", default=["auto"], help="fp16 epilogue modes besides off")
    ap.add_argument("--int8", action="store_true", help="an int8 row too (prepare ~80 s)")
    ap.add_argument("--calib", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--profile-runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fuse16_probe.py needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    out: dict = {"device": torch.cuda.get_device_name(), "batch": args.batch}
    if not args.no_layers:
        out["layers"] = layers(args.batch)
    if not args.no_model:
        out["model"] = model_ab(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
