"""Shared test helpers: build one-node (or small) ONNX models and compare pygraphx with ORT.

ONNX Runtime is the independent oracle; `check_node` runs the same model on both and compares
shapes, dtypes and values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import pygraphx
from pygraphx.targets.cpu.target import CpuTarget


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model of `nodes` whose graph inputs are typed from the example arrays."""
    graph_inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)
        )
        for name, arr in inputs.items()
    ]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph_outputs = [onnx.ValueInfoProto(name=o) for o in outputs]
    graph = helper.make_graph(list(nodes), "test", graph_inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        if out.name in known and known[out.name].type.HasField("tensor_type"):
            out.type.CopyFrom(known[out.name].type)
    return model


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def run_pgx(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], target: str = "ref", **parse: Any
) -> list[np.ndarray]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString(), **parse)
    prog.compile(pygraphx.get_target(target))
    return [np.array(r) for r in prog.run(dict(feeds))]


def assert_outputs_match(
    ours: Sequence[np.ndarray], ref: Sequence[np.ndarray], rtol: float, atol: float
) -> None:
    assert len(ours) == len(ref), f"{len(ours)} outputs, expected {len(ref)}"
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        b = np.asarray(b)
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")


def check_node(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    num_outputs: int = 1,
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    domain: str = "",
) -> list[np.ndarray]:
    """Run a one-node model on pygraphx `ref` and ONNX Runtime and compare every output.

    `inputs` become graph inputs, `initializers` constant inputs; the node's inputs are the
    names of both, in the order given (inputs first). Returns pygraphx's outputs.
    """
    names = list(inputs) + list(initializers or {})
    outs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    model = make_model([node], inputs, outs, initializers, opset)
    ref = run_ort(model, inputs)
    ours = run_pgx(model, inputs)
    assert_outputs_match(ours, ref, rtol, atol)
    return ours


NodeInput = tuple[str, "np.ndarray | None", bool]  # (name, value or None if omitted, constant?)


def node_model(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: Mapping[str, Any] | None = None,
    outputs: Sequence[int] = (0,),
    *,
    opset: int = 17,
    domain: str = "",
    extra_opsets: Sequence[tuple[str, int]] = (),
    typed: bool = False,
    out_types: Mapping[int, Any] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model and its feeds. Omitted inputs (value None) and unrequested outputs
    get empty names; constant inputs become initialisers. With `typed`, outputs are declared
    with the first input's type unless `out_types` says otherwise (ONNX Runtime wants a type
    for every graph output of some contrib ops)."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for name, value, const in inputs:
        if value is None:
            names.append("")
            continue
        names.append(name)
        if const:
            inits.append(numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
            feeds[name] = value
    while names and not names[-1]:
        names.pop()
    out_names = [f"out{k}" if k in outputs else "" for k in range(max(outputs) + 1)]
    node = helper.make_node(op_type, names, out_names, domain=domain, **(attrs or {}))
    if typed:
        first = next(v for _, v, _ in inputs if v is not None)
        graph_outputs = [
            helper.make_tensor_value_info(
                name,
                helper.np_dtype_to_tensor_dtype(np.dtype((out_types or {}).get(k, first.dtype))),
                None,
            )
            for k, name in enumerate(out_names)
            if name
        ]
    else:
        graph_outputs = [onnx.ValueInfoProto(name=n) for n in out_names if n]
    graph = helper.make_graph([node], "test", graph_inputs, graph_outputs, inits)
    imports = [helper.make_opsetid("", opset)]
    imports += [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model, feeds


def plant_cpu_step_failure(prog: pygraphx.Program, op_name: str) -> None:
    """Make the step of a cpu-compiled `prog` whose result is an `op_name` instruction raise
    ZeroDivisionError("planted") (to check how the executor reports a failing step)."""
    executor = prog._executable.executor
    steps = list(executor.steps)
    victim = next(k for k, ins in enumerate(executor.computes) if ins[-1].op.name == op_name)

    def broken() -> None:
        raise ZeroDivisionError("planted")

    steps[victim] = broken
    executor.steps = tuple(steps)


# ---- small bf16 transformers (the attention tests of the cpu target) ----


def compile_bf16(model, **settings) -> pygraphx.Program:
    """`model` parsed, quantized to bf16 and compiled for `CpuTarget(**settings)`."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(**settings))
    return prog


def small_model(name: str) -> tuple:
    """A 2-layer BERT or GPT-2 (batch 2, the second sequence padded) and its inputs."""
    from pygraphx.models.bert import BertConfig, build_bert
    from pygraphx.models.gpt2 import GPT2Config, build_gpt2

    ids = np.random.default_rng(6).integers(0, 100, (2, 16)).astype(np.int64)
    keep = np.ones_like(ids)
    keep[1, 11:] = 0
    feeds = {"input_ids": ids, "attention_mask": keep}
    sizes = {"hidden": 64, "layers": 2, "heads": 2, "vocab_size": 100}
    if name == "gpt2":
        config = GPT2Config(**sizes, n_positions=32)
        return build_gpt2(batch=2, seq_len=16, seed=5, config=config), feeds
    config = BertConfig(**sizes, intermediate=128)
    feeds["token_type_ids"] = ids * 0
    return build_bert(batch=2, seq_len=16, seed=5, config=config), feeds


def rel_rms_np(got: np.ndarray, want: np.ndarray) -> float:
    """Relative RMS error of `got` against `want`."""
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))
