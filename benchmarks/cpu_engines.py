"""The engines `cpu_vs_peers.py` and its probes time: each maker compiles an ONNX model and
returns a run function (feeds -> list of arrays) with the compile's seconds.

* `make_pygraphx`: pygraphx's `cpu` target (optionally bf16 through `quantize_bf16`);
* `make_ort`: an ONNX Runtime CPU session, its pool's spinning set by `ORT_SPIN`;
* `make_openvino`: an OpenVINO CPU model at float32 or its default precision on this CPU;
* `make_eager`: the CNNs interpreted node by node with torch.nn.functional (a floor, not a
  peer).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402


def make_pygraphx(
    model: onnx.ModelProto,
    conv_output: str,
    threads: int,
    step_threads: bool = True,
    bf16: tuple[str, ...] | None = None,
) -> tuple[Callable, float, Any]:
    start = time.perf_counter()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    from pygraphx.targets.cpu.target import CpuTarget

    if bf16:  # the operators converted (quantize_bf16's ins_names)
        pygraphx.quantize_bf16(prog, bf16)

    prog.compile(CpuTarget(conv_output=conv_output, threads=threads, step_threads=step_threads))
    seconds = time.perf_counter() - start
    return (lambda feeds: prog.run(feeds)), seconds, prog


#: ORT's session config for `make_ort`'s `spin`: its pool's threads spin after their work
#: (default), never ("off": `session.intra_op.allow_spinning` 0), or within a run only
#: ("between_runs": `session.force_spinning_stop` 1, they stop when a run ends)
ORT_SPIN = {
    "default": {},
    "off": {"session.intra_op.allow_spinning": "0"},
    "between_runs": {"session.force_spinning_stop": "1"},
}


def make_ort(model: onnx.ModelProto, threads: int, spin: str = "default") -> tuple[Callable, float]:
    """An ONNX Runtime CPU session, its pool spinning as `ORT_SPIN[spin]` says."""
    import onnxruntime as ort

    start = time.perf_counter()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    for key, value in ORT_SPIN[spin].items():
        opts.add_session_config_entry(key, value)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - start
    return (lambda feeds: sess.run(None, feeds)), seconds


def openvino_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def make_openvino(
    model: onnx.ModelProto, threads: int, precision: str | None
) -> tuple[Callable, float, str]:
    """An OpenVINO CPU model: `precision` "f32", or None for OpenVINO's default on this CPU;
    returns (run, compile seconds, the precision it runs at)."""
    import tempfile

    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        start = time.perf_counter()
        compiled = ov.Core().compile_model(str(path), "CPU", config)
        seconds = time.perf_counter() - start
    request = compiled.create_infer_request()
    outputs = compiled.outputs

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request.infer(feeds)
        return [request.get_tensor(o).data.copy() for o in outputs]

    precision_used = compiled.get_property("INFERENCE_PRECISION_HINT")
    return run, seconds, getattr(precision_used, "get_type_name", lambda: str(precision_used))()


def profiled_openvino(model: onnx.ModelProto, threads: int, precision: str = "f32") -> Any:
    """An OpenVINO CPU compiled model at `precision` with its per-layer counters on
    (`PERF_COUNT`: `get_profiling_info()` of a request after each `infer`), for the per-layer
    benchmarks (`mnv2dw_layers.py`, `rn11_peers.py`)."""
    import openvino as ov

    core = ov.Core()
    config = {
        "INFERENCE_NUM_THREADS": threads,
        "PERF_COUNT": True,
        "INFERENCE_PRECISION_HINT": precision,
        "PERFORMANCE_HINT": "LATENCY",
    }
    return core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU", config)


def make_eager(model: onnx.ModelProto) -> tuple[Callable, float]:
    """Interpret the CNN graph node by node with torch.nn.functional (eager mode)."""
    import torch
    import torch.nn.functional as F

    start = time.perf_counter()
    weights = {
        t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer
    }
    nodes = list(model.graph.node)
    out_name = model.graph.output[0].name

    def attrs(node: onnx.NodeProto) -> dict[str, Any]:
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            v: dict[str, Any] = dict(weights)
            v.update({k: torch.from_numpy(a) for k, a in feeds.items()})
            for n in nodes:
                a = attrs(n)
                x = [v[i] if i else None for i in n.input]
                op = n.op_type
                if op == "Conv":
                    p = a.get("pads", [0, 0, 0, 0])
                    y = F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, a.get("strides", 1),
                                 p[:2], a.get("dilations", 1), a.get("group", 1))  # fmt: skip
                elif op == "BatchNormalization":
                    y = F.batch_norm(
                        x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("epsilon", 1e-5)
                    )
                elif op == "Relu":
                    y = F.relu(x[0])
                elif op == "Clip":
                    y = torch.clamp(x[0], float(x[1]), float(x[2]))
                elif op == "Add":
                    y = x[0] + x[1]
                elif op == "MaxPool":
                    p = a.get("pads", [0, 0, 0, 0])
                    y = F.max_pool2d(x[0], a["kernel_shape"], a.get("strides", 1), p[:2])
                elif op == "GlobalAveragePool":
                    y = x[0].mean((2, 3), keepdim=True)
                elif op == "Flatten":
                    y = torch.flatten(x[0], a.get("axis", 1))
                elif op == "Gemm":
                    w = x[1].t() if a.get("transB", 0) else x[1]
                    y = torch.addmm(x[2], x[0], w)
                elif op == "Constant":
                    y = torch.from_numpy(numpy_helper.to_array(a["value"]).copy())
                else:
                    raise NotImplementedError(f"eager baseline: ONNX op {op}")
                v[n.output[0]] = y
            return [v[out_name].numpy()]

    return run, time.perf_counter() - start
