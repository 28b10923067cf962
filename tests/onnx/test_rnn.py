"""ONNX RNN, GRU and LSTM on pygraphx `ref` against ONNX Runtime.

Covers every direction, both layouts, sequence_lens (constant and run-time, including empty
sequences), clip, linear_before_reset, input_forget, peepholes, activations with alpha/beta,
omitted optional inputs and outputs, and LSTM/GRU networks exported from torch. ONNX Runtime runs
layout 0 only, so layout-1 models are checked against the layout-0 model on transposed data.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import ShapeError
from pygraphx.ops.rnn import Gru, Lstm, Rnn
from tests import helpers
from tests.helpers import NodeInput, run_ort, run_pgx

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


# (name, value or None for an omitted input, is an initializer)
def node_model(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: dict[str, Any],
    outputs: Sequence[int],
    opset: int = 22,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model; omitted inputs get empty names, unrequested outputs too."""
    return helpers.node_model(op_type, inputs, attrs, outputs, opset=opset)


def _layer_inputs(
    op: str,
    rng: np.random.Generator,
    *,
    seq: int,
    batch: int,
    size: int,
    hidden: int,
    directions: int,
    layout: int,
    seq_lens: Sequence[int] | None,
    runtime_lens: bool,
    bias: bool,
    initial: bool,
    peepholes: bool,
    dtype: type = np.float32,
) -> list[NodeInput]:
    g = GATES[op]

    def rand(*lens: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(lens) * scale).astype(dtype)

    def state() -> np.ndarray | None:
        if not initial:
            return None
        return rand(batch, directions, hidden) if layout else rand(directions, batch, hidden)

    lens = None if seq_lens is None else np.asarray(seq_lens, dtype=np.int32)
    inputs: list[NodeInput] = [
        ("X", rand(batch, seq, size) if layout else rand(seq, batch, size), False),
        ("W", rand(directions, g * hidden, size, scale=0.5), True),
        ("R", rand(directions, g * hidden, hidden, scale=0.5), True),
        ("B", rand(directions, 2 * g * hidden) if bias else None, True),
        ("sequence_lens", lens, not runtime_lens),
        ("initial_h", state(), False),
    ]
    if op == "LSTM":
        inputs.append(("initial_c", state(), False))
        inputs.append(("P", rand(directions, 3 * hidden) if peepholes else None, True))
    return inputs


def check_recurrent(
    op: str,
    *,
    direction: str = "forward",
    layout: int = 0,
    seq: int = 5,
    batch: int = 3,
    size: int = 4,
    hidden: int = 6,
    seq_lens: Sequence[int] | None = None,
    runtime_lens: bool = False,
    bias: bool = True,
    initial: bool = True,
    peepholes: bool = False,
    outputs: Sequence[int] | None = None,
    dtype: type = np.float32,
    seed: int = 0,
    **attrs: Any,
) -> None:
    """Build one RNN/GRU/LSTM node, run it on pygraphx and ONNX Runtime, compare."""
    rng = np.random.default_rng(seed)
    directions = 2 if direction == "bidirectional" else 1
    inputs = _layer_inputs(
        op,
        rng,
        seq=seq,
        batch=batch,
        size=size,
        hidden=hidden,
        directions=directions,
        layout=layout,
        seq_lens=seq_lens,
        runtime_lens=runtime_lens,
        bias=bias,
        initial=initial,
        peepholes=peepholes,
        dtype=dtype,
    )
    if outputs is None:
        outputs = (0, 1, 2) if op == "LSTM" else (0, 1)
    attrs = {"hidden_size": hidden, "direction": direction, **attrs}
    model, feeds = node_model(op, inputs, {**attrs, "layout": layout}, outputs)
    ours = run_pgx(model, feeds)
    if layout == 0:
        ref = run_ort(model, feeds)
    else:  # ONNX Runtime has no layout 1: run layout 0 on transposed data
        swapped = [
            (
                n,
                v.transpose(1, 0, 2)
                if v is not None and n in ("X", "initial_h", "initial_c")
                else v,
                c,
            )
            for n, v, c in inputs
        ]
        model0, feeds0 = node_model(op, swapped, {**attrs, "layout": 0}, outputs)
        ref = [
            r.transpose(2, 0, 1, 3) if r.ndim == 4 else r.transpose(1, 0, 2)
            for r in run_ort(model0, feeds0)
        ]
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op: str, direction: str, layout: int) -> None:
    check_recurrent(op, direction=direction, layout=layout)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("runtime_lens", [False, True])
def test_sequence_lens(op: str, direction: str, runtime_lens: bool) -> None:
    check_recurrent(op, direction=direction, seq_lens=[5, 3, 1], runtime_lens=runtime_lens)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_empty_sequence_gives_zero_states(op: str) -> None:
    check_recurrent(op, direction="bidirectional", seq_lens=[0, 3, 5], runtime_lens=True)


def test_sequence_lens_with_layout_1() -> None:
    check_recurrent("LSTM", direction="reverse", layout=1, seq_lens=[2, 5, 4], runtime_lens=True)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("RNN", {"clip": 0.5}),
        ("GRU", {"clip": 0.5, "direction": "bidirectional"}),
        ("LSTM", {"clip": 0.3, "direction": "bidirectional"}),
        ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}),
        ("GRU", {"linear_before_reset": 1, "clip": 0.8}),
        ("LSTM", {"input_forget": 1}),
        ("LSTM", {"peepholes": True, "direction": "bidirectional"}),
        ("LSTM", {"peepholes": True, "input_forget": 1, "clip": 0.7, "seq_lens": [4, 2, 5]}),
    ],
)
def test_cell_options(op: str, attrs: dict[str, Any]) -> None:
    check_recurrent(op, **attrs)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("RNN", {"activations": ["Relu"]}),
        ("RNN", {"activations": ["Affine"], "activation_alpha": [0.5], "activation_beta": [0.2]}),
        ("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.3]}),
        (
            "RNN",
            {
                "direction": "bidirectional",
                "activations": ["LeakyRelu", "Elu"],
                "activation_alpha": [0.2, 0.7],
            },
        ),
        (
            "GRU",
            {
                "activations": ["HardSigmoid", "Softsign"],
                "activation_alpha": [0.3],
                "activation_beta": [0.4],
            },
        ),
        (
            "GRU",
            {
                "direction": "bidirectional",
                "activations": ["Sigmoid", "Softplus", "HardSigmoid", "ScaledTanh"],
                "activation_alpha": [0.3, 0.8],
                "activation_beta": [0.4, 1.2],
            },
        ),
        (
            "LSTM",
            {
                "activations": ["HardSigmoid", "Affine", "ThresholdedRelu"],
                "activation_alpha": [0.3, 0.5, 0.2],
                "activation_beta": [0.4, 0.1],
            },
        ),
        (
            "LSTM",
            {
                "direction": "bidirectional",
                "activations": ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "ScaledTanh"],
                "activation_alpha": [1.5],
                "activation_beta": [0.5],
                "clip": 1.0,
            },
        ),
    ],
)
def test_activations(op: str, attrs: dict[str, Any]) -> None:
    check_recurrent(op, **attrs)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("RNN", {"bias": False, "initial": False}),
        ("GRU", {"bias": False, "initial": False, "outputs": (1,)}),
        ("LSTM", {"initial": False, "outputs": (2,)}),
        ("LSTM", {"outputs": (0, 2)}),
        ("LSTM", {"outputs": (1,), "direction": "bidirectional", "layout": 1}),
        ("GRU", {"outputs": (0,), "seq": 1}),
        ("LSTM", {"batch": 1, "seq": 7, "seq_lens": [7], "runtime_lens": True}),
    ],
)
def test_optional_inputs_and_outputs(op: str, attrs: dict[str, Any]) -> None:
    check_recurrent(op, **attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_double(op: str) -> None:
    # ONNX Runtime's RNN and LSTM have no double kernels: compare with its float32 run
    rng = np.random.default_rng(0)
    inputs = _layer_inputs(
        op, rng, seq=4, batch=2, size=3, hidden=5, directions=2, layout=0, seq_lens=[4, 2],
        runtime_lens=True, bias=True, initial=True, peepholes=op == "LSTM", dtype=np.float64,
    )  # fmt: skip
    attrs = {"hidden_size": 5, "direction": "bidirectional"}
    outputs = (0, 1, 2) if op == "LSTM" else (0, 1)
    model, feeds = node_model(op, inputs, attrs, outputs)
    single = [
        (n, v if v is None or v.dtype != np.float64 else v.astype(np.float32), c)
        for n, v, c in inputs
    ]
    model32, feeds32 = node_model(op, single, attrs, outputs)
    for a, b in zip(run_pgx(model, feeds), run_ort(model32, feeds32), strict=True):
        assert a.dtype == np.float64 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_unknown_activation_is_an_error() -> None:
    rng = np.random.default_rng(0)
    inputs = _layer_inputs(
        "RNN", rng, seq=2, batch=1, size=2, hidden=2, directions=1, layout=0, seq_lens=None,
        runtime_lens=False, bias=True, initial=True, peepholes=False,
    )  # fmt: skip
    model, feeds = node_model("RNN", inputs, {"hidden_size": 2, "activations": ["Gelu"]}, [0])
    with pytest.raises(Exception, match="unsupported activation"):
        run_pgx(model, feeds)


def test_operator_shapes_and_errors() -> None:
    attrs = {"hidden_size": 3, "actv_funcs": ("tanh",), "actv_alphas": (0.0,), "actv_betas": (0.0,)}
    x, w = Shape("float_type", [4, 2, 5]), Shape("float_type", [1, 3, 5])
    r, b = Shape("float_type", [1, 3, 3]), Shape("float_type", [1, 6])
    lens, h0 = Shape("int32_type", [2]), Shape("float_type", [1, 2, 3])
    shapes = [x, w, r, b, lens, h0]
    assert Rnn(**attrs).compute_shape(shapes).lens() == [4, 1, 2, 3]
    assert Rnn(output="last_hidden", **attrs).compute_shape(shapes).lens() == [1, 2, 3]
    with pytest.raises(ShapeError, match="W must have lens"):
        Rnn(**attrs).compute_shape([x, Shape("float_type", [1, 3, 4])] + shapes[2:])
    with pytest.raises(ShapeError, match="2 activation functions"):
        Gru(**attrs).compute_shape(shapes)
    with pytest.raises(ShapeError, match="output 'last_cell'"):
        Rnn(output="last_cell", **attrs).compute_shape(shapes)
    op = Lstm(
        hidden_size=3, actv_funcs=("sigmoid", "tanh", "tanh"), actv_alphas=(0.0,) * 3,
        actv_betas=(0.0,) * 3, output="last_cell",
    )  # fmt: skip
    assert str(op).startswith("lstm[hidden_size=3,actv_funcs={sigmoid, tanh, tanh}")


# --- networks exported from torch -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_export(kind: str, batch_first: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cls = getattr(torch.nn, kind)
    net = cls(8, 16, num_layers=2, bidirectional=True, batch_first=batch_first).eval()
    x = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    states = [torch.randn(4, 3, 16) for _ in range(2 if kind == "LSTM" else 1)]
    args = (x, tuple(states)) if kind == "LSTM" else (x, states[0])
    names = ["x", "h0", "c0"][: 1 + len(states)]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, buf, opset_version=17, dynamo=False, input_names=names)
    model = onnx.load_from_string(buf.getvalue())
    assert any(n.op_type == kind for n in model.graph.node)
    feeds = {n: t.numpy() for n, t in zip(names, [x, *states], strict=True)}
    ours, ref = run_pgx(model, feeds), run_ort(model, feeds)
    assert len(ours) == len(ref) == 1 + len(states)
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
