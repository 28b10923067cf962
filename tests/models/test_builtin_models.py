"""Tests for the built-in model zoo (``pygraphx.models``).

The zoo's ONNX builders feed the driver's ``--model NAME`` demos and many other tests, so
here each model is checked to be valid ONNX, to run under onnxruntime (CPU) with the
inputs from ``model_inputs``, and to give finite, non-degenerate outputs of the declared
shapes. Built models are cached per (name, batch, seq_len) to keep the suite fast.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pygraphx.models import get_model, list_models, model_inputs

MODELS = ["resnet50", "mobilenetv2", "bert_base", "gpt2"]
SHORT_SEQ = 16

EXPECTED_IO = {
    "resnet50": (["input"], {"output": lambda b, s: (b, 1000)}),
    "mobilenetv2": (["input"], {"output": lambda b, s: (b, 1000)}),
    "bert_base": (
        ["input_ids", "attention_mask", "token_type_ids"],
        {"last_hidden_state": lambda b, s: (b, s, 768), "pooler_output": lambda b, s: (b, 768)},
    ),
    "gpt2": (["input_ids", "attention_mask"], {"logits": lambda b, s: (b, s, 50257)}),
}


@functools.cache
def _model(name: str, batch: int = 1, seq_len: int = SHORT_SEQ) -> onnx.ModelProto:
    return get_model(name, batch=batch, seq_len=seq_len)


@functools.cache
def _run(
    name: str, batch: int = 1, seq_len: int = SHORT_SEQ
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    model = _model(name, batch, seq_len)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = model_inputs(name, model, seed=1)
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(names, feeds), strict=True))


def _declared_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


def _check_outputs(name: str, batch: int, seq_len: int) -> None:
    model = _model(name, batch, seq_len)
    _, outs = _run(name, batch, seq_len)
    expected = EXPECTED_IO[name][1]
    assert set(outs) == set(expected)
    declared = {vi.name: _declared_shape(vi) for vi in model.graph.output}
    for out_name, value in outs.items():
        shape = expected[out_name](batch, seq_len)
        assert value.shape == shape == declared[out_name], out_name
        assert value.dtype == np.float32
        assert np.isfinite(value).all(), f"{name}.{out_name} has non-finite values"
        assert float(value.std()) > 1e-2, f"{name}.{out_name} is near constant"
        assert float(np.abs(value).max()) < 1e3, f"{name}.{out_name} explodes"
        if value.ndim == 3:  # different positions must give different vectors
            assert float(value.std(axis=1).mean()) > 1e-2, f"{name}.{out_name}: positions"
        if batch > 1:  # different inputs must give different outputs
            assert float(np.abs(value[1:] - value[:1]).mean()) > 1e-2


def test_list_models() -> None:
    assert sorted(list_models()) == sorted(MODELS)


def test_unknown_model_raises() -> None:
    with pytest.raises(ValueError) as info:
        get_model("no_such_model")
    for known in MODELS:
        assert known in str(info.value)
    with pytest.raises(ValueError):
        model_inputs("no_such_model", _model("mobilenetv2"))


@pytest.mark.slow  # onnx.checker with full shape inference on whole networks
@pytest.mark.parametrize("name", MODELS)
def test_model_is_valid_onnx(name: str) -> None:
    model = _model(name)
    onnx.checker.check_model(model)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    init_names = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in init_names]
    assert inputs == EXPECTED_IO[name][0]
    node_names = [n.name for n in model.graph.node]
    assert len(node_names) == len(set(node_names))
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            assert np.isfinite(onnx.numpy_helper.to_array(t)).all(), t.name


@pytest.mark.parametrize("name", MODELS)
def test_model_inputs(name: str) -> None:
    model = _model(name)
    feeds = model_inputs(name, model, seed=3)
    assert list(feeds) == EXPECTED_IO[name][0]
    vocab = {"bert_base": 30522, "gpt2": 50257}.get(name)
    for key, value in feeds.items():
        if key == "input":
            assert value.dtype == np.float32 and value.shape == (1, 3, 224, 224)
        else:
            assert value.dtype == np.int64 and value.shape == (1, SHORT_SEQ)
        if key == "input_ids":
            assert value.min() >= 0 and value.max() < vocab
        if key == "attention_mask":
            assert (value == 1).all()
        if key == "token_type_ids":
            assert set(np.unique(value)) <= {0, 1}
    again = model_inputs(name, model, seed=3)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


@pytest.mark.slow  # whole networks on ONNX Runtime and ref
@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_outputs(name: str) -> None:
    _check_outputs(name, batch=1, seq_len=SHORT_SEQ)


@pytest.mark.slow
def test_bert_base_seq128() -> None:
    _check_outputs("bert_base", batch=1, seq_len=128)


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_cnn_batch2_depends_on_input(name: str) -> None:
    _check_outputs(name, batch=2, seq_len=SHORT_SEQ)


def test_seed_is_deterministic() -> None:
    a = get_model("mobilenetv2", seed=5)
    b = get_model("mobilenetv2", seed=5)
    c = get_model("mobilenetv2", seed=6)
    assert a.SerializeToString() == b.SerializeToString()
    wa, wc = (onnx.numpy_helper.to_array(m.graph.initializer[0]) for m in (a, c))
    assert not np.array_equal(wa, wc)


def _ops(name: str) -> Counter[str]:
    return Counter(n.op_type for n in _model(name).graph.node)


def test_cnn_structure() -> None:
    ops = _ops("resnet50")
    assert ops["Conv"] == 53 and ops["BatchNormalization"] == 53  # BN kept, not folded
    assert ops["Add"] == 16 and ops["MaxPool"] == 1 and ops["Gemm"] == 1
    ops = _ops("mobilenetv2")
    assert ops["Conv"] == 52 and ops["BatchNormalization"] == 52 and ops["Add"] == 10
    model = _model("mobilenetv2")
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert clips and all(len(n.input) == 3 for n in clips)
    groups = [
        a.i
        for n in model.graph.node
        if n.op_type == "Conv"
        for a in n.attribute
        if a.name == "group"
    ]
    assert sum(g > 1 for g in groups) == 17  # one depthwise conv per inverted residual


def test_transformer_structure() -> None:
    bert = _ops("bert_base")
    assert bert["LayerNormalization"] == 25 and bert["Softmax"] == 12 and bert["Erf"] == 12
    assert bert["Shape"] > 0 and bert["Concat"] > 0 and bert["Reshape"] == 48
    gpt = _ops("gpt2")
    for op in ("Range", "Split", "Where", "Slice", "Pow", "Tanh"):
        assert gpt[op] >= 1, op
    # Reshape targets come from Shape -> Gather -> Unsqueeze -> Concat chains.
    for name in ("bert_base", "gpt2"):
        graph = _model(name).graph
        producer = {o: n for n in graph.node for o in n.output}
        reshape = next(n for n in graph.node if n.op_type == "Reshape")
        concat = producer[reshape.input[1]]
        assert concat.op_type == "Concat"
        unsq = producer[concat.input[0]]
        gather = producer[unsq.input[0]]
        assert (unsq.op_type, gather.op_type) == ("Unsqueeze", "Gather")
        assert producer[gather.input[0]].op_type == "Shape"
