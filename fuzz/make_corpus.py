"""Write the seed corpus: small valid ONNX models (fuzz/corpus/onnx) covering the frontend's
main paths (initialisers, attributes, constant shape inputs, sub-graphs), their saved forms
(fuzz/corpus/pgx), and driver command lines (fuzz/corpus/driver: NUL-separated argv, `WS:`
naming the driver harness's workspace files).
Run from the repository root: `python -m fuzz.make_corpus`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import pygraphx

CORPUS = Path(__file__).resolve().parent / "corpus"


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    graph = helper.make_graph(nodes, "seed", ins, outs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _init(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def seeds() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["b"])],
        "then",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 8])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["c"])],
        "else",
        [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 8])],
    )
    return {
        "mlp": _model(
            [
                helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("Softmax", ["r"], ["y"], axis=-1),
            ],
            [("x", [2, 8])],
            ["y"],
            [_init("w", w)],
        ),
        "conv": _model(
            [
                helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
            ],
            [("x", [1, 2, 6, 6])],
            ["y"],
            [_init("k", rng.standard_normal((3, 2, 3, 3)).astype(np.float32))],
        ),
        "reshape": _model(
            [
                helper.make_node("Add", ["s", "one"], ["s2"]),
                helper.make_node("Reshape", ["x", "s2"], ["r"]),
                helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
                helper.make_node("Gather", ["t", "idx"], ["y"], axis=0),
            ],
            [("x", [2, 8])],
            ["y"],
            [
                _init("s", np.array([3, 3], np.int64)),
                _init("one", np.array([1, 1], np.int64)),
                _init("idx", np.array([0, 3, 1], np.int64)),
            ],
        ),
        "if": _model(
            [
                helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                helper.make_node("Greater", ["s", "zero"], ["cond"]),
                helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other),
            ],
            [("x", [2, 8])],
            ["y"],
            [_init("zero", np.float32(0))],
        ),
        "expand": _model(
            [
                helper.make_node("Expand", ["x", "shape"], ["e"]),
                helper.make_node("Concat", ["e", "e"], ["c"], axis=0),
                helper.make_node("ReduceMean", ["c"], ["y"], axes=[1]),
            ],
            [("x", [1, 8])],
            ["y"],
            [_init("shape", np.array([3, 8], np.int64))],
            opset=13,
        ),
    }


#: driver command lines for `fuzz/driver_args.py` (its options, good and bad values)
DRIVER_SEEDS = [
    ["read", "WS:mlp.onnx"],
    ["read", "--onnx", "WS:mlp.onnx", "-O", "--fp16"],
    ["read", "--migraphx", "WS:mlp.pgx"],
    ["read", "WS:mlp.onnx", "--input-dim", "@x", "3", "8"],
    ["read", "WS:mlp.onnx", "--dyn-input-dim", "@x", "1:4", "8"],
    ["read", "WS:mlp.onnx", "--batch", "2", "--default-dim-value", "3", "--bf16"],
    ["read", "WS:mlp.onnx", "--skip-unknown-operators"],
    ["params", "WS:mlp.onnx", "--json"],
    ["params", "WS:mlp_ref.pgx", "--batch", "2"],
    ["run", "WS:mlp.onnx", "--seed", "3"],
    ["run", "WS:mlp.onnx", "--fill1", "--ref"],
    ["run", "WS:mlp_ref.pgx", "--seed", "-1"],
    ["run", "WS:mlp.onnx", "--input-dim", "@x", "100000", "100000", "100000"],
    ["run", "WS:mlp.onnx", "--dyn-input-dim", "@x", "{1,8}", "8", "--fill0"],
    ["run", "/dev/zero"],
    ["run", "WS:mlp.onnx", "--gpu"],
    ["read", "WS:", "--debug"],
    ["onnx", "--list"],
    ["version", "--migraphx", "WS:mlp.pgx"],
    ["compile", "--help"],
    ["--version"],
]


def write_driver_corpus() -> None:
    """fuzz/corpus/driver: one file per `DRIVER_SEEDS` entry."""
    folder = CORPUS / "driver"
    folder.mkdir(parents=True, exist_ok=True)
    for k, argv in enumerate(DRIVER_SEEDS):
        (folder / f"argv-{k:02d}").write_bytes(b"\0".join(a.encode() for a in argv))


def main() -> None:
    write_driver_corpus()
    (CORPUS / "onnx").mkdir(parents=True, exist_ok=True)
    (CORPUS / "pgx").mkdir(parents=True, exist_ok=True)
    for name, model in seeds().items():
        data = model.SerializeToString()
        (CORPUS / "onnx" / f"{name}.onnx").write_bytes(data)
        prog = pygraphx.parse_onnx_buffer(data)
        pygraphx.save(prog, CORPUS / "pgx" / f"{name}.pgx")
        compiled = pygraphx.parse_onnx_buffer(data)
        compiled.compile(pygraphx.get_target("ref"))
        pygraphx.save(compiled, CORPUS / "pgx" / f"{name}_ref.pgx")


if __name__ == "__main__":
    main()
