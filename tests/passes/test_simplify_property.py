"""Property: the full optimise pipeline never changes what a program computes.

Hypothesis builds random small programs of element-wise ops (including the decomposed GELU/SiLU
forms recognize_activations looks for), constants broadcast from random shapes (with the values
the algebra rules look for: 0, 1, 2, 0.5, ...), transposes, reshapes, reductions and matrix
products. The optimised program (`optimize`: simplify_algebra, simplify_reshapes,
recognize_activations, fusion, memory planning, ...) must compute the same values on `ref` as
the unoptimised one, evaluated instruction by instruction with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pygraphx
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.passes.pipeline import optimize

UNARY = ["neg", "abs", "relu", "tanh", "sigmoid", "sin", "erf", "gelu", "silu"]
BINARY = ["add", "sub", "mul", "max", "min"]
SPECIAL = [0.0, 1.0, 2.0, -1.0, 0.5, 0.7071067811865476, 3.0, 0.044715]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"]
STEPS = ["unary", "binary", "const", "const", "affine", "affine", "div_const", "pow2",
         "transpose", "reshape", "reduce", "dot", "dot", "gelu_form", "silu_form",
         "neg_neg"]  # fmt: skip


class Builder:
    """Adds random instructions to a module, drawing every choice from hypothesis."""

    def __init__(self, draw, m: Module, x: Instruction) -> None:
        self.draw, self.m, self.values = draw, m, [x]

    def pick(self) -> Instruction:
        # draws are plain data (an index), so a recorded sequence rebuilds the same program
        return self.values[self.draw(st.integers(0, len(self.values) - 1))]

    def add(self, name: str, inputs: list[Instruction], **attrs) -> Instruction:
        ins = self.m.add_instruction(make_op(name, **attrs), inputs)
        self.values.append(ins)
        return ins

    def const(self, lens: list[int]) -> Instruction:
        """A constant broadcast to `lens`: a scalar, one value per axis k, or a full array."""
        kind = self.draw(st.sampled_from(["scalar", "scalar", "axis", "axis", "full"]))
        if kind == "scalar":
            value = np.float32(self.draw(st.sampled_from(SPECIAL[:3] + SPECIAL + [-0.3, 1.7])))
        elif kind == "axis" and lens:
            k = self.draw(st.integers(0, len(lens) - 1))
            shape = [n if d == k else 1 for d, n in enumerate(lens)]
            value = self._array(shape)
        else:
            value = self._array(lens)
        lit = self.m.add_literal(np.asarray(value, np.float32))
        if lit.shape.lens() == list(lens):
            return lit
        return self.m.add_instruction(make_op("multibroadcast", out_lens=tuple(lens)), [lit])

    def _array(self, shape: list[int]) -> np.ndarray:
        seed = self.draw(st.integers(0, 2**16))
        arr = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)
        if self.draw(st.booleans()):  # constant-valued arrays hit the scalar rules
            arr[...] = self.draw(st.sampled_from(SPECIAL))
        return arr

    def step(self, kind: str) -> None:
        x = self.pick()
        lens = x.shape.lens()
        getattr(self, f"_{kind}")(x, lens)

    def _unary(self, x: Instruction, lens: list[int]) -> None:
        self.add(self.draw(st.sampled_from(UNARY)), [x])

    def _binary(self, x: Instruction, lens: list[int]) -> None:
        same = [v for v in self.values if v.shape.lens() == lens]
        y = same[self.draw(st.integers(0, len(same) - 1))]
        a, b = (x, y) if self.draw(st.booleans()) else (y, x)
        self.add(self.draw(st.sampled_from(BINARY)), [a, b])

    def _const(self, x: Instruction, lens: list[int]) -> None:
        c = self.const(lens)
        a, b = (x, c) if self.draw(st.booleans()) else (c, x)
        self.add(self.draw(st.sampled_from(BINARY)), [a, b])

    def _affine(self, x: Instruction, lens: list[int]) -> None:
        """(x op1 c1) op2 c2: what the constant-folding rules (and a dot or conv's bias and
        scale) look for."""
        if self.draw(st.booleans()) and len(lens) >= 2:
            self._dot(x, lens)
            x = self.values[-1]
            lens = x.shape.lens()
        for _ in range(2):
            c = self.const(lens)
            op = self.draw(st.sampled_from(["add", "mul", "sub"]))
            x = self.add(op, [x, c] if op == "sub" else self._order(x, c))

    def _div_const(self, x: Instruction, lens: list[int]) -> None:
        c = self.const(lens)
        lit = c if c.is_literal() else c.inputs[0]
        arr = lit.get_literal().array
        if np.all(np.abs(arr) > 0.1):
            self.add("div", [x, c])

    def _pow2(self, x: Instruction, lens: list[int]) -> None:
        two = self.m.add_literal(np.float32(2.0))
        lit = self.m.add_instruction(make_op("multibroadcast", out_lens=tuple(lens)), [two])
        self.add("pow", [x, lit])

    def _neg_neg(self, x: Instruction, lens: list[int]) -> None:
        self.add("neg", [self.add("neg", [x])])

    def _transpose(self, x: Instruction, lens: list[int]) -> None:
        perm = self.draw(st.permutations(range(len(lens))))
        self.add("transpose", [x], permutation=tuple(perm))

    def _reshape(self, x: Instruction, lens: list[int]) -> None:
        n = int(np.prod(lens))
        dims = self.draw(st.sampled_from([d for d in ([n], [1, n], [n, 1], _split(n)) if d]))
        self.add("reshape", [x], dims=tuple(dims))

    def _reduce(self, x: Instruction, lens: list[int]) -> None:
        axis = self.draw(st.integers(0, len(lens) - 1))
        self.add(self.draw(st.sampled_from(REDUCE)), [x], axes=(axis,))

    def _dot(self, x: Instruction, lens: list[int]) -> None:
        if len(lens) < 2:
            return
        n = self.draw(st.integers(1, 4))
        w = self.m.add_literal(self._array([lens[-1], n]))
        if len(lens) > 2:
            w = self.m.add_instruction(
                make_op("multibroadcast", out_lens=tuple(lens[:-2] + [lens[-1], n])), [w]
            )
        self.add("dot", [x, w])

    def _gelu_form(self, x: Instruction, lens: list[int]) -> None:
        """x * 0.5 * (1 + erf(x / sqrt 2)) in a random association and operand order."""
        k = self.const_scalar
        t = self.add("erf", [self.add("div", [x, k(1.4142135, lens)])])
        one_plus = self.add("add", self._order(t, k(1.0, lens)))
        half = k(0.5, lens)
        if self.draw(st.booleans()):
            self.add("mul", self._order(self.add("mul", self._order(x, one_plus)), half))
        else:
            self.add("mul", self._order(self.add("mul", self._order(x, half)), one_plus))

    def _silu_form(self, x: Instruction, lens: list[int]) -> None:
        self.add("mul", self._order(x, self.add("sigmoid", [x])))

    def const_scalar(self, value: float, lens: list[int]) -> Instruction:
        lit = self.m.add_literal(np.float32(value))
        return self.m.add_instruction(make_op("multibroadcast", out_lens=tuple(lens)), [lit])

    def _order(self, a: Instruction, b: Instruction) -> list[Instruction]:
        return [a, b] if self.draw(st.booleans()) else [b, a]


def _split(n: int) -> list[int] | None:
    for d in (2, 3):
        if n % d == 0 and n > d:
            return [d, n // d]
    return None


def _build(draw, lens: list[int], steps: list[str], n_outputs: int) -> Program:
    prog = Program()
    m = prog.get_main_module()
    b = Builder(draw, m, m.add_parameter("x", Shape("float_type", lens)))
    for kind in steps:
        b.step(kind)
    outs = [b.values[-1]] + [b.pick() for _ in range(n_outputs - 1)]
    m.add_return(outs)
    return prog


def _run(prog: Program, x: np.ndarray) -> list[np.ndarray]:
    prog.compile(pygraphx.get_target("ref"))
    return [np.array(r) for r in prog.run({"x": x})]


class Replay:
    """Records the values `draw` returns, then hands them back in order (a second build)."""

    def __init__(self, draw) -> None:
        self.inner, self.values, self.pos = draw, [], None

    def __call__(self, strategy):
        if self.pos is None:
            value = self.inner(strategy)
            self.values.append(value)
            return value
        self.pos += 1
        return self.values[self.pos - 1]

    def rewind(self) -> Replay:
        self.pos = 0
        return self


def draw_twin_programs(data, max_dim: int = 4) -> tuple[Program, Program, np.ndarray]:
    """Two copies of one random program (built from the same draws, so each can be compiled on
    its own) and a random input `x` for it; also used by tests/targets/test_ref_cpu_property.py."""
    lens = data.draw(st.lists(st.integers(1, max_dim), min_size=1, max_size=3), label="lens")
    steps = data.draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=8), label="steps")
    n_outputs = data.draw(st.integers(1, 2), label="outputs")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    replay = Replay(data.draw)
    first = _build(replay, lens, steps, n_outputs)
    second = _build(replay.rewind(), lens, steps, n_outputs)
    x = np.random.default_rng(seed).standard_normal(lens).astype(np.float32)
    return first, second, x


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(data=st.data())
def test_optimised_program_computes_the_same_values(data) -> None:
    plain, optimised, x = draw_twin_programs(data)
    text = str(plain)
    optimize(optimised)
    want = _run(plain, x)
    got = _run(optimised, x)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale, err_msg=text)


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
