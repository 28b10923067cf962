"""Compile time stays linear: a 2000-instruction relu chain optimises and compiles in < 10 s."""

from __future__ import annotations

import time

import numpy as np
import pytest

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.passes.pipeline import optimize

N = 2000


def _relu_chain(n: int) -> Program:
    prog = Program()
    m = prog.get_main_module()
    y = m.add_parameter("x", Shape("float_type", [4, 8]))
    for _ in range(n):
        y = m.add_instruction(make_op("relu"), [y])
    m.add_return([y])
    return prog


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_relu_chain_compiles_quickly(target: str) -> None:
    if target == "cpu":
        pytest.importorskip("torch")
    prog = _relu_chain(N)
    start = time.perf_counter()
    if target == "ref":
        optimize(prog)  # ref runs no passes of its own; cpu runs the same pipeline in compile
    prog.compile(pygraphx.get_target(target))
    seconds = time.perf_counter() - start
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(np.array(prog.run({"x": x})[0]), np.maximum(x, 0))
    assert seconds < 10, f"{N}-node relu chain took {seconds:.1f} s to compile on {target}"
