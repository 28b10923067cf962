"""fold_fp8: a `dot` of dequantised fp8 values becomes `mul(quant_dot(fp8, fp8), scale)`, and the
`ref` target's result is the unfolded program's (numpy's float32 maths on the same fp8 values)
to float rounding."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.passes.fold_fp8 import fold_fp8

RNG = np.random.default_rng(5)


def matmul_model(k: int = 24, n: int = 10):
    w = numpy_helper.from_array(RNG.standard_normal((k, n)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fp8_program(model, samples) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_fp8(prog, "ref", samples)
    return prog


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_fold_fp8_rewrites_the_product(fp16: bool) -> None:
    model = matmul_model()
    samples = [{"x": RNG.standard_normal((6, 24)).astype(np.float32)} for _ in range(2)]
    plain, folded = fp8_program(model, samples), fp8_program(model, samples)
    if fp16:
        pygraphx.quantize_fp16(folded)
    fold_fp8(folded.get_main_module())
    ops = [ins.op.name for ins in folded.get_main_module().instructions]
    assert "dot" not in ops and ops.count("quant_dot") == 1 and "mul" in ops
    assert ("convert" in ops) == fp16  # a half product converts back to half
    if fp16:
        return
    plain.compile(pygraphx.get_target("ref"))
    folded.compile(pygraphx.get_target("ref"))
    feeds = {"x": RNG.standard_normal((6, 24)).astype(np.float32)}
    want, got = np.array(plain.run(feeds)[0]), np.array(folded.run(feeds)[0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_fold_fp8_leaves_int8_and_float_products() -> None:
    model = matmul_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    fold_fp8(prog.get_main_module())
    assert [i.op.name for i in prog.get_main_module().instructions].count("dot") == 1
    pygraphx.quantize_int8(prog, "ref", [{"x": np.ones((6, 24), np.float32)}])
    before = str(prog)
    fold_fp8(prog.get_main_module())
    assert str(prog) == before
