"""recognize_activations: decomposed GELU/SiLU in the orders exporters write become one op, with
unchanged values (checked against ONNX Runtime); near misses stay as they are."""

from __future__ import annotations

import io
import re

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.passes.pipeline import optimize
from tests.helpers import make_model, run_ort

RNG = np.random.default_rng(3)
C = {"half": np.float32(0.5), "one": np.float32(1.0), "s2": np.float32(1.4142135),
     "r2": np.float32(0.70710677), "k": np.float32(0.044715), "three": np.float32(3.0),
     "c": np.float32(0.7978846), "near": np.float32(0.7)}  # fmt: skip
mk = helper.make_node

FORMS = {
    # torch.onnx F.gelu: Div(sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5
    "erf_torch": ([mk("Div", ["x", "s2"], ["t"]), mk("Erf", ["t"], ["e"]),
                   mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
                   mk("Mul", ["g", "half"], ["y"])], "gelu"),
    # transformers: x * 0.5 * (1 + erf(x * (1/sqrt 2)))
    "erf_hf": ([mk("Mul", ["x", "half"], ["h"]), mk("Mul", ["r2", "x"], ["t"]),
                mk("Erf", ["t"], ["e"]), mk("Add", ["one", "e"], ["e1"]),
                mk("Mul", ["h", "e1"], ["y"])], "gelu"),
    # 0.5 * (x * (1 + erf))
    "erf_assoc": ([mk("Div", ["x", "s2"], ["t"]), mk("Erf", ["t"], ["e"]),
                   mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["half", "e1"], ["g"]),
                   mk("Mul", ["x", "g"], ["y"])], "gelu"),
    # GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 pow(x, 3))))
    "tanh_pow": ([mk("Pow", ["x", "three"], ["p"]), mk("Mul", ["k", "p"], ["kp"]),
                  mk("Add", ["x", "kp"], ["i"]), mk("Mul", ["i", "c"], ["ic"]),
                  mk("Tanh", ["ic"], ["t"]), mk("Add", ["one", "t"], ["t1"]),
                  mk("Mul", ["half", "x"], ["hx"]), mk("Mul", ["hx", "t1"], ["y"])], "gelu_tanh"),
    # x^3 as x * x * x
    "tanh_mul": ([mk("Mul", ["x", "x"], ["xx"]), mk("Mul", ["x", "xx"], ["p"]),
                  mk("Mul", ["p", "k"], ["kp"]), mk("Add", ["kp", "x"], ["i"]),
                  mk("Mul", ["c", "i"], ["ic"]), mk("Tanh", ["ic"], ["t"]),
                  mk("Add", ["t", "one"], ["t1"]), mk("Mul", ["x", "t1"], ["xt"]),
                  mk("Mul", ["xt", "half"], ["y"])], "gelu_tanh"),
    "silu": ([mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["s", "x"], ["y"])], "silu"),
    # near miss: erf(x * 0.7), not erf(x / sqrt 2)
    "near": ([mk("Mul", ["x", "near"], ["t"]), mk("Erf", ["t"], ["e"]),
              mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
              mk("Mul", ["g", "half"], ["y"])], None),
    # near miss: x * sigmoid(another value)
    "silu_other": ([mk("Sigmoid", ["a"], ["s"]), mk("Mul", ["s", "x"], ["y"])], None),
}  # fmt: skip


def _ops(prog: Program) -> list[str]:
    return [i.op.name for i in prog.get_main_module().instructions]


def _compare_with_ort(model: onnx.ModelProto, feeds: dict) -> Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    optimize(prog)
    prog.compile(pygraphx.get_target("ref"))
    got = [np.array(r) for r in prog.run(feeds)]
    for a, b in zip(got, run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return prog


@pytest.mark.parametrize("form", sorted(FORMS))
def test_decomposed_forms_become_one_op(form: str) -> None:
    nodes, want = FORMS[form]
    nodes = [mk("Add", ["a", "b"], ["x"])] + nodes + [mk("Add", ["y", "a"], ["z"])]
    feeds = {"a": RNG.standard_normal((4, 6)).astype(np.float32) * 3,
             "b": RNG.standard_normal((4, 6)).astype(np.float32)}  # fmt: skip
    prog = pygraphx.parse_onnx_buffer(make_model(nodes, feeds, ["z"], C).SerializeToString())
    from pygraphx.passes.recognize_activations import recognize_activations
    from pygraphx.passes.simplify_algebra import simplify_algebra

    main = prog.get_main_module()
    simplify_algebra(main)
    recognize_activations(main)
    ops = _ops(prog)
    if want is None:
        assert not {"gelu", "gelu_tanh", "silu"} & set(ops)
    else:
        assert ops.count(want) == 1 and not {"erf", "tanh", "sigmoid"} & set(ops)
    _compare_with_ort(make_model(nodes, feeds, ["z"], C), feeds)


def test_trace_rewrite_prints_each_rule(monkeypatch, capsys) -> None:
    nodes, _ = FORMS["silu"]
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    prog = pygraphx.parse_onnx_buffer(make_model(nodes, {"x": x}, ["y"]).SerializeToString())
    monkeypatch.setenv("PGX_TRACE_REWRITE", "1")
    optimize(prog)
    err = capsys.readouterr().err
    assert re.search(r"rewrite: recognize_activations\.silu: main:@\d+ = mul\(main:@\d+,x\)"
                     r" -> .*  =>  main:@\d+ = silu", err)  # fmt: skip


# --- whole models: every GELU is found -------------------------------------------------------
def _optimised_ops(model: onnx.ModelProto) -> list[str]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    optimize(prog)
    return [i.op.name for m in prog.modules.values() for i in m.instructions]


@pytest.mark.slow  # whole transformers built and optimised
@pytest.mark.parametrize(("name", "op", "layers"), [("bert_base", "gelu", 12),
                                                    ("gpt2", "gelu_tanh", 12)])  # fmt: skip
def test_builtin_models_keep_their_gelu(name: str, op: str, layers: int) -> None:
    from pygraphx.models import get_model

    ops = _optimised_ops(get_model(name, batch=1, seq_len=8))
    assert ops.count(op) == layers
    assert "erf" not in ops and "pow" not in ops  # nothing of a decomposed GELU is left


def _export(module, args: tuple, opset: int = 17) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module.eval(), args, buf, opset_version=opset, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.slow  # transformers exports
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "silu"])
def test_transformers_export_keeps_its_activation(act: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, hidden_act=act, attn_implementation="eager")  # fmt: skip
    model = transformers.BertModel(config)
    ids = torch.randint(0, 50, (1, 7))

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, return_dict=True).last_hidden_state

    onnx_model = _export(Wrapper(), (ids,))
    want = {"gelu": "gelu", "gelu_new": "gelu_tanh", "silu": "silu"}[act]
    assert _optimised_ops(onnx_model).count(want) == 2
    feeds = {onnx_model.graph.input[0].name: ids.numpy()}
    _compare_with_ort(onnx_model, feeds)
