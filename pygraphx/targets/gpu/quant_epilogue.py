"""The element-wise group after an int8 product as the Triton GEMM's epilogue.

After `quant_dot` / `quant_convolution` and its dequantise (already the GEMM's epilogue), the
next instruction is usually a `pointwise` group adding the bias, a residual, and a ReLU. When
that group is the dequantise's only user and its body is at most three of

    add(running value, per-channel constant)   -> "bias"
    add(running value, another activation)     -> "residual"
    relu(running value)                        -> "relu"

the group runs inside the GEMM (`quant_kernels.Epilogue`): its output is written once, not
written by the GEMM, read and written again by the group. Each op is rounded to the group's
type as the unfused op stores it, so the numbers are the unfused program's. When the group
has an int8 or fp8 `quantizelinear` user with one constant scale (the next layer's input),
the kernel writes that 8-bit tensor too, and the float one only if something else reads it.

An fp8 product (`passes/fold_fp8.py`: float32 sums) has no dequantise: its group starts with
`mul(product, per-channel constant)` and, in a half program, `convert` to the group's type.
`deferred_epilogue(..., scaled=True)` reads those two as the dequantise (the kernel's scale)
and the rest as above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu import quant_kernels as qk
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh
from pygraphx.targets.torch_lowering.registry import defer

__all__ = [
    "EpiloguePlan",
    "bind_quantised",
    "deferred_epilogue",
    "epilogue_plan",
]
QUANTISED_TYPES = {"int8_type": torch.int8, "fp8e4m3fn_type": torch.float8_e4m3fn}


@dataclass
class EpiloguePlan:
    """The group absorbed (`group`), the kernel's `Epilogue` and the residual's env slot."""

    group: Instruction
    epilogue: qk.Epilogue
    residual: int | None
    #: the group's int8 / fp8 `quantizelinear` user the kernel also computes (None: it runs
    #: alone)
    quantise: Instruction | None = None
    #: the dequantise scale read from the group (`scaled_epilogue`), else None
    scale: torch.Tensor | None = None

    def quantised_output(self, lens: tuple, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(a new tensor for the quantised result, the view the kernel writes: int8, or fp8
        as bytes), or None when the plan does not quantise."""
        if self.quantise is None:
            return None
        q = torch.empty(lens, dtype=QUANTISED_TYPES[self.quantise.shape.type()], device=device)
        return q, (q if q.dtype == torch.int8 else q.view(torch.uint8))

    def residual_rows(self, env: list, rows: Callable[[torch.Tensor], torch.Tensor]):
        """`() -> (rows, channels)` view of the residual (`rows` flattens it), or None."""
        if self.residual is None:
            return lambda: None
        slot = self.residual
        return lambda: _unit_inner(rows(env[slot]))


def bind_quantised(ctx: LoweringContext, plan: EpiloguePlan, layout: str) -> dict:
    """Make the plan's `quantizelinear` (when it has one) take the int8 tensor the GEMM step
    leaves in the returned holder under "q" (its own step only binds it); {} otherwise."""
    holder: dict = {}
    if plan.quantise is not None:

        def bound(c: LoweringContext, q: Instruction) -> bool:
            return _emit_fresh(c, q, lambda: holder["q"], layout)

        ctx.fusers[id(plan.quantise)] = bound
    return holder


def _unit_inner(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def channel_vector(
    ctx: LoweringContext, ins: Instruction, k: int, axis: int, n: int
) -> torch.Tensor | None:
    """Input `k` of `ins` as a float32 vector of `n` when it is a constant varying along
    `axis` only."""
    if id(ins.inputs[k]) not in ctx.index:
        return None
    t = ctx.constant(ctx.arg(ins, k))
    if t is None or t.dim() <= axis % max(t.dim(), 1) or t.shape[axis] != n:
        return None
    ax = axis % t.dim()
    if any(st != 0 for a, (st, size) in enumerate(zip(t.stride(), t.shape, strict=True))
           if a != ax and size > 1):  # fmt: skip
        return None
    index = tuple(slice(None) if a == ax else 0 for a in range(t.dim()))
    return t[index].to(torch.float32).contiguous()


def epilogue_group(user: Instruction, same_type: bool = True) -> Instruction | None:
    """The `pointwise` group that is `user`'s only user, of its lens (and type, unless
    `same_type` is off: an fp8 product's float32 sums) (a candidate: `epilogue_plan` reads the
    group's body once its inputs are lowered)."""
    if len(user.outputs) != 1:
        return None
    group = user.outputs[0]
    if group.op.name != "pointwise" or len(group.module_inputs) != 1:
        return None
    if same_type and group.shape.type() != user.shape.type():
        return None
    if group.shape.lens() != user.shape.lens():
        return None
    if sum(x is user for x in group.inputs) != 1:
        return None
    return group


def epilogue_plan(ctx: LoweringContext, user: Instruction, axis: int, n: int):
    """The plan for `user` (a product's dequantise) when its only user is a group the GEMM can
    finish (module docstring); `axis` is the channel axis (-1 for dot, 1 for convolution).
    Call it when the group's inputs are lowered (at the group's turn)."""
    group = epilogue_group(user)
    return None if group is None else _plan_body(ctx, user, group, axis, n)


def deferred_epilogue(
    ctx: LoweringContext,
    user: Instruction,
    axis: int,
    n: int,
    emit: Callable[[LoweringContext, Instruction, EpiloguePlan | None], bool],
    scaled: bool = False,
) -> bool:
    """Defer `user` (whose product is deferred into it) into its group when it is a candidate:
    at the group's turn `emit(ctx, group, plan)` runs the product with the group as epilogue,
    or, when the body does not fit, `emit(ctx, user, None)` runs it alone there and the group
    is lowered as usual. False (nothing deferred) when there is no candidate. `scaled`: `user`
    is an fp8 product itself, whose group starts with its dequantise (`plan.scale`)."""
    group = epilogue_group(user, same_type=not scaled)
    if group is None:
        return False

    def fuse(c: LoweringContext, g: Instruction) -> bool:
        plan = _plan_body(c, user, g, axis, n, scaled)
        if plan is not None:
            return emit(c, g, plan)
        emit(c, user, None)
        return False

    return defer(ctx, user, group, fuse)


def _leading_scale(ctx, group: Instruction, body: list, source: dict, running, axis: int, n: int):
    """(the per-channel scale, the instruction after which the epilogue starts, the rest of
    the body) when `body` starts with mul(running, channel constant) [, convert]."""
    ops = [i for i in body if not (i.is_param() or i.is_literal())]
    if not ops or ops[0].op.name != "mul" or running not in ops[0].inputs:
        return None
    if ops[0].shape.type() != "float_type":
        return None
    other = ops[0].inputs[1] if ops[0].inputs[0] is running else ops[0].inputs[0]
    if id(other) not in source or other is running:
        return None
    scale = channel_vector(ctx, group, source[id(other)], axis, n)
    if scale is None:
        return None
    rest, last = ops[1:], ops[0]
    if rest and rest[0].op.name == "convert" and list(rest[0].inputs) == [last]:
        rest, last = rest[1:], rest[0]
    if last.shape.type() != group.shape.type():
        return None
    return scale, last, rest


def _plan_body(ctx, user: Instruction, group: Instruction, axis: int, n: int, scaled=False):
    body = group.module_inputs[0].instructions
    source = {}
    for ins in body:
        if ins.is_param():
            source[id(ins)] = int(ins.op.parameter[1:])
    running = next((i for i in body if i.is_param() and group.inputs[source[id(i)]] is user), None)
    ops, bias, residual, scale = [], None, None, None
    if scaled:
        lead = _leading_scale(ctx, group, body, source, running, axis, n)
        if lead is None:
            return None
        scale, running, body = lead
    for ins in body:
        if ins.is_param() or ins.is_literal():
            continue
        if ins.is_return():
            if len(ins.inputs) != 1 or ins.inputs[0] is not running or len(ops) > 3:
                return None
            quantise, q_scale, store = quantising_user(ctx, group)
            epilogue = qk.Epilogue(ops, bias, q_scale, store)
            return EpiloguePlan(group, epilogue, residual, quantise, scale)
        if ins.op.name == "relu" and list(ins.inputs) == [running]:
            ops.append("relu")
        elif ins.op.name == "add" and len(ins.inputs) == 2 and running in ins.inputs:
            other = ins.inputs[1] if ins.inputs[0] is running else ins.inputs[0]
            if id(other) not in source or other is running:
                return None
            k = source[id(other)]
            vector = channel_vector(ctx, group, k, axis, n)
            if vector is not None and bias is None:
                ops.append("bias")
                bias = vector
            elif vector is None and residual is None and _same(group.inputs[k], group):
                ops.append("residual")
                residual = ctx.arg(group, k)
            else:
                return None
        else:
            return None
        running = ins
    return None


def quantising_user(ctx: LoweringContext, group: Instruction):
    """(the int8 or fp8 `quantizelinear` of `group` with one constant scale, that scale as a
    float32 tensor, whether the group's float value is still needed) or (None, None, True)."""
    users = [u for u in group.outputs if u.op.name == "quantizelinear"]
    if len(users) != 1 or len(users[0].inputs) != 2 or users[0].inputs[0] is not group:
        return None, None, True
    quantise = users[0]
    if quantise.shape.type() not in QUANTISED_TYPES:
        return None, None, True
    value = _literal_behind(quantise.inputs[1])
    if value is None or value.size == 0 or not (value == value.flat[0]).all():
        return None, None, True
    scale = torch.tensor([float(value.flat[0])], dtype=torch.float32, device=ctx.device)
    returned = any(group in r.inputs for r in ctx.module.instructions if r.is_return())
    return quantise, scale, len(group.outputs) > 1 or returned


def _literal_behind(x: Instruction) -> np.ndarray | None:
    """The values of the literal `x` broadcasts or reshapes, else None."""
    while x.op.name in ("multibroadcast", "broadcast", "reshape", "contiguous"):
        x = x.inputs[0]
    return np.asarray(x.get_literal().array) if x.is_literal() else None


def _same(x: Instruction, group: Instruction) -> bool:
    return x.shape.lens() == group.shape.lens() and x.shape.type() == group.shape.type()
