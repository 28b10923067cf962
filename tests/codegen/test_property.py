"""Property test: random pointwise (+ reduce) groups, generated Triton vs numpy vs torch vs ref.

A group is a few element-wise steps over 1-3 inputs of one lens, each input laid out with
random strides (broadcast dimensions, transposed layouts), optionally ending in a reduction
over trailing axes (sum, mean, max, min, prod, softmax, logsoftmax) and one element-wise epilogue
step. The group is a real IR sub-module, so ref (the `Evaluator` of its body) is the oracle.
Examples are derandomized so CI sees the same ones every run; `PGX_HYPOTHESIS_EXAMPLES`
raises the count locally.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pygraphx.codegen.trace import module_trace
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.ops.base import make_op
from tests.codegen.conftest import needs_triton
from tests.codegen.groupcheck import assert_close, run_three

UNARY = ["neg", "abs", "exp", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "atan",
         "relu", "sqrt", "sinh", "round", "sign"]  # fmt: skip
BINARY = ["add", "sub", "mul", "max", "min", "div"]
REDUCE = [
    "reduce_sum",
    "reduce_mean",
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "softmax",
    "logsoftmax",
]
EXAMPLES = int(os.environ.get("PGX_HYPOTHESIS_EXAMPLES", "120"))


@st.composite
def groups(draw: st.DrawFn) -> tuple[Module, list[Shape], str]:
    rank = draw(st.integers(1, 3))
    lens = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    shapes = [_layout(draw, lens) for _ in range(draw(st.integers(1, 3)))]
    body = Module("main:group")
    values = [body.add_parameter(f"x{k}", Shape("float_type", lens)) for k in range(len(shapes))]
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            values.append(body.add_instruction(make_op(op), [draw(st.sampled_from(values))]))
        else:
            op = draw(st.sampled_from(BINARY))
            pair = [draw(st.sampled_from(values)) for _ in range(2)]
            values.append(body.add_instruction(make_op(op), pair))
    result = values[-1]
    kind = "pointwise"
    if draw(st.booleans()):
        kind = "fused_reduce"
        red = draw(st.sampled_from(REDUCE))
        first = draw(st.integers(0, rank - 1))  # reduce the trailing axes from here
        if red in ("softmax", "logsoftmax"):
            op = make_op(red, axis=rank - 1)
        else:
            op = make_op(red, axes=tuple(range(first, rank)))
        result = body.add_instruction(op, [result])
        if draw(st.booleans()):  # an epilogue step on the reduced value
            result = body.add_instruction(make_op(draw(st.sampled_from(UNARY))), [result])
    body.add_return([result])
    return body, shapes, kind


def _layout(draw: st.DrawFn, lens: list[int]) -> Shape:
    """A shape of `lens` with random strides: some dimensions broadcast, the rest packed in a
    random order (a transposed layout)."""
    rank = len(lens)
    broadcast = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    order = draw(st.permutations(list(range(rank))))
    strides = [0] * rank
    step = 1
    for d in reversed(order):
        if not broadcast[d]:
            strides[d] = step
            step *= lens[d]
    return Shape("float_type", lens, strides)


@needs_triton
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=groups())
def test_random_group_matches_ref(case: tuple, interpret: object) -> None:
    body, shapes, kind = case
    group = module_trace(body, shapes, kind)
    got = run_three(group, body, np.random.default_rng(0))
    assert_close(got, rtol=1e-4, atol=1e-5, what=str(body))
