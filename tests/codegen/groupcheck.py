"""Run one fused group through numpy, torch and Triton from its one description and compare
each with the reference evaluation of the group's IR body (`Evaluator`, the ref target)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pygraphx.codegen.trace import GroupTrace, TensorDesc, evaluate, group_trace
from pygraphx.ir.instruction import Instruction
from pygraphx.ops.handler import NUMPY
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.handler import TORCH


def strided_input(desc: TensorDesc, rng: np.random.Generator) -> tuple[np.ndarray, torch.Tensor]:
    """A random value laid out with `desc`'s strides: the numpy view and the torch view of one
    buffer (a broadcast input is a zero-stride view, as the IR has it)."""
    span = 1 + sum((n - 1) * s for n, s in zip(desc.lens, desc.strides, strict=True) if n)
    if desc.dtype == np.bool_:
        base = rng.integers(0, 2, span).astype(np.bool_)
    elif desc.dtype.kind in "iu":
        base = rng.integers(-3, 4 if desc.dtype.kind == "i" else 7, span).astype(desc.dtype)
    else:
        base = rng.standard_normal(span).astype(desc.dtype)
    item = base.itemsize
    view = np.lib.stride_tricks.as_strided(base, desc.lens, [s * item for s in desc.strides])
    tensor = torch.as_strided(torch.from_numpy(base.view(np.uint8)).view(torch_dtype(desc.dtype)),
                              desc.lens, desc.strides)  # fmt: skip
    return view, tensor


def reference(ins_body: object, args: Sequence[np.ndarray]) -> np.ndarray:
    params = ins_body.get_parameters()
    feeds = {p.op.parameter: np.ascontiguousarray(a) for p, a in zip(params, args, strict=True)}
    with np.errstate(all="ignore"):
        return np.asarray(Evaluator(ins_body).run(feeds)[0])


def run_three(
    group: GroupTrace,
    body: object,
    rng: np.random.Generator,
    triton: bool = True,
    inputs: Sequence[np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The group's output from ref (the body), numpy, torch and (if asked) Triton, on random
    inputs laid out as the group says (or on contiguous `inputs`)."""
    if inputs is None:
        pairs = [strided_input(d, rng) for d in group.inputs]
    else:
        pairs = [(a, torch.from_numpy(a.copy())) for a in inputs]
    arrays = [a for a, _ in pairs]
    tensors = [t for _, t in pairs]
    got = {"ref": reference(body, arrays)}
    with np.errstate(all="ignore"):
        got["numpy"] = np.asarray(evaluate(group, NUMPY, arrays))
    got["torch"] = _to_numpy(evaluate(group, TORCH, tensors))
    if triton:
        from pygraphx.codegen.triton.build import build_kernel

        out = torch.empty(group.output.lens, dtype=torch_dtype(group.output.dtype))
        build_kernel(group, "cpu")(tensors, out)
        got["triton"] = _to_numpy(out)
    return got


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    from pygraphx.targets.torch_lowering.dtypes import to_numpy

    return np.asarray(to_numpy(t.contiguous()))


def assert_close(got: dict[str, np.ndarray], rtol: float, atol: float, what: str) -> None:
    want = got["ref"]
    for name, value in got.items():
        assert value.shape == want.shape, f"{what}: {name} shape {value.shape} != {want.shape}"
        assert value.dtype == want.dtype, f"{what}: {name} dtype {value.dtype} != {want.dtype}"
        np.testing.assert_allclose(
            value.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
            equal_nan=True, err_msg=f"{what}: {name} differs from ref",
        )  # fmt: skip


def check_instruction(ins: Instruction, rng: np.random.Generator, rtol: float, atol: float) -> None:
    group = group_trace(ins)
    got = run_three(group, ins.module_inputs[0], rng)
    assert_close(got, rtol, atol, f"{group.name} {[n.fn for n in group.steps.nodes]}")
