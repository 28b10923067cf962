"""bf16 MobileNetV2's error against a float64 reference (helper mnv18): the program before
(the bf16 stem and head switches off) and after, and OpenVINO bf16, over several images.

    PYTHONPATH=. python benchmarks/mnv18_errors.py --batch 1 --threads 2 --seeds 0 1 2 3 4 5

The float64 reference: the model's ONNX graph interpreted with torch's float64 ops
(`float64_reference`; ONNX Runtime has no float64 Conv); ORT float32's own error against it is
printed too. Relative RMS error ||y - ref|| / ||ref|| and max |y - ref| / max |ref|, per
image batch (seed 0: the harness's image; others standard normal) and their mean.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import Variant, compile_variant, load  # noqa: E402


def float64_reference(model, feeds: dict[str, np.ndarray]) -> np.ndarray:  # noqa: ANN001
    """The model's first output in float64: its ONNX graph interpreted with torch's float64
    ops (the ops MobileNetV2's graph uses: Conv, BatchNormalization, Clip, Add,
    GlobalAveragePool, Flatten, Gemm, Constant; ONNX Runtime has no double Conv)."""
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    d = torch.float64
    env = {}
    for i in model.graph.initializer:
        arr = numpy_helper.to_array(i)
        env[i.name] = torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr)
    env.update({k: torch.from_numpy(v.astype(np.float64)) for k, v in feeds.items()})
    for node in model.graph.node:
        at = {a.name: a for a in node.attribute}
        x = [env[i] if i else None for i in node.input]
        op = node.op_type
        if op == "Constant":
            y = torch.from_numpy(numpy_helper.to_array(at["value"].t).astype(np.float64))
        elif op == "Conv":
            pads = list(at["pads"].ints) if "pads" in at else [0, 0, 0, 0]
            assert pads[:2] == pads[2:]
            stride = list(at["strides"].ints) if "strides" in at else [1, 1]
            group = at["group"].i if "group" in at else 1
            y = F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride, pads[:2], 1, group)
        elif op == "BatchNormalization":
            eps = at["epsilon"].f if "epsilon" in at else 1e-5
            y = F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0, eps)
        elif op == "Clip":
            y = x[0].clamp(float(x[1]), float(x[2]))
        elif op == "Relu":
            y = x[0].relu()
        elif op == "Add":
            y = x[0] + x[1]
        elif op == "GlobalAveragePool":
            y = x[0].mean(dim=(2, 3), keepdim=True)
        elif op == "Flatten":
            y = x[0].reshape(x[0].shape[0], -1)
        elif op == "Gemm":
            b = x[1].t() if "transB" in at and at["transB"].i else x[1]
            y = x[0] @ b + (x[2] if len(x) > 2 else 0)
        else:
            raise NotImplementedError(op)
        env[node.output[0]] = y.to(d) if y.is_floating_point() else y
    return env[model.graph.output[0].name].numpy()


def errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    got = np.asarray(got, np.float64)
    return (float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
            float(np.abs(got - ref).max() / np.abs(ref).max()))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = p.parse_args()
    import onnx
    import onnxruntime as ort
    import torch

    torch.set_num_threads(a.threads)
    old = {"PGX_CPU_NATIVE_MBSTEM_BF16": "0", "PGX_CPU_NATIVE_MBHEAD_BF16": "0"}
    table: dict[str, list[tuple[float, float]]] = {}
    case = load(f"mobilenetv2:{a.batch}")
    model = onnx.load_from_string(case.data)
    sess32 = ort.InferenceSession(case.data, providers=["CPUExecutionProvider"])
    progs = {name: compile_variant(case, a.threads, Variant(name, env, bf16=True))
             for name, env in (("pgx bf16 before", old), ("pgx bf16 now", {}))}  # fmt: skip
    import openvino as ov

    core = ov.Core()
    cm = core.compile_model(core.read_model(case.data, b""), "CPU",
                            {"INFERENCE_PRECISION_HINT": "bf16",
                             "INFERENCE_NUM_THREADS": a.threads})  # fmt: skip
    for seed in a.seeds:  # (seed 0: the harness's image; others: standard normal images)
        feeds = {k: np.asarray(v) for k, v in case.feeds.items()}
        if seed:
            rng = np.random.default_rng(seed)
            feeds = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
        ref = float64_reference(model, feeds)
        rows = {"ORT f32": sess32.run(None, feeds)[0]}
        for name, prog in progs.items():
            out = prog.run(feeds)
            rows[name] = np.asarray(out[0] if isinstance(out, list | tuple) else
                                    next(iter(out.values())))  # fmt: skip
        rows["OpenVINO bf16"] = cm(list(feeds.values()))[0]
        for name, y in rows.items():
            table.setdefault(name, []).append(errors(y, ref))
    print(f"# mobilenetv2 b{a.batch} t{a.threads}, seeds {a.seeds}: error against float64 "
          "(torch float64 ops on the graph): rel RMS / max |diff| over max |ref|, per seed; mean")
    for name, errs in table.items():
        each = "  ".join(f"{r:.5f}/{m:.5f}" for r, m in errs)
        mean_r = sum(r for r, _ in errs) / len(errs)
        mean_m = sum(m for _, m in errs) / len(errs)
        print(f"  {name:16s} mean {mean_r:.5f} / {mean_m:.5f}   ({each})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
