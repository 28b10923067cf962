"""`Program.run`'s input check: one fast loop for well-typed arrays, the full check otherwise.

The parameters `run` checks against are read from `main` once per executable (not per run);
every input that is not an exact-type numpy array or `argument` of the static lens takes the
full check, so wrong names, types and lens still fail with the message that names them, and
other accepted forms (lists, torch tensors, strided views) still give the right numbers.
The oracle is numpy on the same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.module import Module
from tests.helpers import make_model

torch = pytest.importorskip("torch")

X = np.arange(12, dtype=np.float32).reshape(3, 4)
Y = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


class _Tagged(np.ndarray):
    """An ndarray subclass (as a user's array type may be)."""


def _expected(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32) * 2.0 + np.asarray(y, np.float32)


@pytest.fixture(params=["ref", "cpu"])
def prog(request: pytest.FixtureRequest) -> pygraphx.Program:
    nodes = [
        helper.make_node("Add", ["x", "x"], ["d"]),
        helper.make_node("Add", ["d", "y"], ["z"]),
    ]
    model = make_model(nodes, {"x": X, "y": Y}, ["z"])
    program = pygraphx.parse_onnx_buffer(model.SerializeToString())
    program.compile(pygraphx.get_target(request.param))
    return program


def _run(prog: pygraphx.Program, feeds: dict) -> np.ndarray:
    return np.array(prog.run(feeds)[0])


def test_parameters_are_read_once_per_executable(
    prog: pygraphx.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(prog, {"x": X, "y": Y})
    calls = []
    original = Module.get_parameter_shapes

    def counting(self: Module) -> dict:
        calls.append(self.name)
        return original(self)

    monkeypatch.setattr(Module, "get_parameter_shapes", counting)
    for _ in range(3):
        np.testing.assert_allclose(_run(prog, {"x": X, "y": Y}), _expected(X, Y), rtol=1e-6)
    assert calls == []


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": X}, r"missing parameter 'y'"),
        ({"x": X, "y": Y, "w": Y}, r"unknown parameter\(s\) \['w'\]"),
        ({"x": X.astype(np.float64), "y": Y}, r"'x' expects float_type but got double_type"),
        ({"x": X, "y": Y.reshape(4, 3)}, r"'y' expects lens \[3, 4\] but got \[4, 3\]"),
        ({"x": X[:2], "y": Y}, r"'x' expects lens \[3, 4\] but got \[2, 4\]"),
    ],
    ids=["missing", "unknown", "dtype", "lens", "fewer-rows"],
)
def test_bad_inputs_still_raise_their_errors(
    prog: pygraphx.Program, feeds: dict, message: str
) -> None:
    _run(prog, {"x": X, "y": Y})  # the signature is cached by now
    with pytest.raises(pygraphx.ProgramError, match=message):
        prog.run(feeds)


def test_other_input_forms_take_the_full_check(prog: pygraphx.Program) -> None:
    want = _expected(X, Y)
    forms = {
        "argument": {"x": pygraphx.argument(X), "y": Y},
        "torch": {"x": torch.from_numpy(X.copy()), "y": Y},
        "subclass": {"x": X.view(_Tagged), "y": Y},  # not exactly ndarray: the full check
    }
    for name, feeds in forms.items():
        np.testing.assert_allclose(_run(prog, feeds), want, rtol=1e-6, err_msg=name)


def test_strided_and_read_only_inputs(prog: pygraphx.Program) -> None:
    wide = np.arange(24, dtype=np.float32).reshape(3, 8)
    x = wide[:, ::2]  # strided view of the right type and lens: the fast path takes it
    y = Y[::-1, ::-1]  # negative strides
    frozen = X.copy()
    frozen.flags.writeable = False
    np.testing.assert_allclose(_run(prog, {"x": x, "y": y}), _expected(x, y), rtol=1e-6)
    np.testing.assert_allclose(_run(prog, {"x": frozen, "y": Y}), _expected(X, Y), rtol=1e-6)
    assert frozen.flags.writeable is False


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_outputs_are_the_callers_own(target: str) -> None:
    """An output that is an input (Identity) or another output comes back as its own copy."""
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Identity", ["x"], ["b"]),
        helper.make_node("Neg", ["x"], ["c"]),
    ]
    model = make_model(nodes, {"x": X}, ["a", "b", "c"])
    program = pygraphx.parse_onnx_buffer(model.SerializeToString())
    program.compile(pygraphx.get_target(target))
    x = X.copy()
    outs = program.run({"x": x})
    arrays = [np.array(o, copy=False) for o in outs]
    assert all(isinstance(o, pygraphx.argument) for o in outs)
    np.testing.assert_array_equal(arrays[0], X)
    np.testing.assert_array_equal(arrays[1], X)
    np.testing.assert_array_equal(arrays[2], -X)
    for k, arr in enumerate(arrays):
        assert arr.flags.writeable
        assert not np.may_share_memory(arr, x)
        assert not any(np.may_share_memory(arr, other) for other in arrays[k + 1 :])
