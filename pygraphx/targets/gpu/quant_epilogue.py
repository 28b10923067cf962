"""The element-wise group after an int8 or fp8 product as the Triton kernel's epilogue.

After `quant_dot` / `quant_convolution` and its dequantise (already the GEMM's epilogue), the
next instruction is usually a `pointwise` group adding the bias, a residual, and a ReLU. When
that group is the dequantise's only user and its body is at most three of

    add(running value, per-channel constant)   -> "bias"
    add(running value, another activation)     -> "residual"
    relu(running value)                        -> "relu"
    gelu(running value)                        -> "gelu"
    (h * (erf(h * 1/sqrt(2)) + 1)) * 1/2        -> "gelu" (h the running value, five ops)

the group runs inside the GEMM (`quant_kernels.Epilogue`): its output is written once, not
written by the GEMM, read and written again by the group. Each op is rounded to the group's
type as the unfused op stores it, so the numbers are the unfused program's (GELU's five ops
are computed in float32 and rounded once, as the generated group kernel does). When the group
has an int8 or fp8 `quantizelinear` user with one constant scale (the next layer's input),
the kernel writes that 8-bit tensor too, and the float one only if something else reads it.

Where two products meet (ResNet's first block of a stage: the shortcut convolution and the
last one, each with its bias, added, then ReLU), the group also computes the other product's
value beside the running one: `add(other, bias)` (int8: `other` its dequantised value), or
for fp8 `mul(other, channel scale)`, `convert`, `add(bias)`. Added to the running value it is
a "residual_affine" op (`quant_kernels.Epilogue`): the other product's tensor read as the
residual with its scale and bias applied in the epilogue, each step rounded as the group
does, so the group and its quantise run inside the second product's kernel.

An fp8 product (`passes/fold_fp8.py`: `quant_dot` / `quant_convolution` with float32 sums)
has no dequantise: its group starts with `mul(product, per-channel constant)` and, in a half
program, `convert` to the group's type. `deferred_epilogue(..., scaled=True)` reads those two
as the dequantise (`EpiloguePlan.scale`, the kernel's scale) and the rest as above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu import quant_kernels as qk
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh
from pygraphx.targets.torch_lowering.lower_quant import channel_vector as lower_channel_vector
from pygraphx.targets.torch_lowering.registry import defer

__all__ = [
    "PRESCALE",
    "EpiloguePlan",
    "bind_quantised",
    "deferred_epilogue",
    "epilogue_plan",
    "quantising_user",
]
#: the types an epilogue quantises to (`quant_kernels.Epilogue`)
QUANTISED_TYPES = ("int8_type", "fp8e4m3fn_type")
#: `ctx.cache` key: id(fp8 product run alone) -> its hook `(scale, dtype)` making it write
#: its scaled sums in `dtype` (`EpiloguePlan.use_prescale`; `quant_conv` registers it)
PRESCALE = "fp8_prescale"


@dataclass
class EpiloguePlan:
    """The group absorbed (`group`), the kernel's `Epilogue` and the residual's env slot."""

    group: Instruction
    epilogue: qk.Epilogue
    residual: int | None
    #: the group's int8 / fp8 `quantizelinear` user the kernel also computes (None: it runs
    #: alone)
    quantise: Instruction | None = None
    #: an fp8 product's per-channel scale read from the group (`deferred_epilogue(...,
    #: scaled=True)`: the kernel's dequantise), else None
    scale: torch.Tensor | None = None
    #: for a "residual_affine" whose residual is an fp8 product run alone that can apply its
    #: scale itself (`PRESCALE`): the hook making it do so (called once the plan is used)
    prescale: Callable[[torch.Tensor, torch.dtype], None] | None = None

    def use_prescale(self) -> None:
        """Have the residual's fp8 product write `half(sum * scale)` in the group's type
        instead of its float32 sums, and read it with a scale of one: the same rounding
        steps (a float32 product, then the group's type), half the bytes written and read."""
        if self.prescale is None or self.epilogue.residual_affine is None:
            return
        scale, bias = self.epilogue.residual_affine
        self.prescale(scale, torch_dtype(self.group.shape.dtype()))
        self.epilogue.residual_affine = (torch.ones_like(scale), bias)
        self.prescale = None

    def quantised_output(self, lens: tuple, device) -> torch.Tensor | None:
        """A new tensor for the quantised result (int8 or fp8 e4m3fn: the kernels write fp8
        as its bytes themselves), or None when the plan does not quantise."""
        if self.quantise is None:
            return None
        return torch.empty(lens, dtype=torch_dtype(self.quantise.shape.dtype()), device=device)

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
    """Input `k` of `ins` as a float32 vector of `n` when it is a float constant of any rank
    varying along `axis` only (`lower_quant.channel_vector`)."""
    return lower_channel_vector(ctx, ins, k, n, any_float=True, axis=axis, ndim=None)


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
            plan.use_prescale()
            return emit(c, g, plan)
        emit(c, user, None)
        return False

    return defer(ctx, user, group, fuse)


def _body(group: Instruction, user: Instruction):
    """(the group's parameter -> input index map, the parameter reading `user`, the body's
    computing steps and its return)."""
    body = group.module_inputs[0].instructions
    source = {id(i): int(i.op.parameter[1:]) for i in body if i.is_param()}
    running = next((i for i in body if i.is_param() and group.inputs[source[id(i)]] is user), None)
    return source, running, [i for i in body if not (i.is_param() or i.is_literal())]


def _plan_body(ctx, user: Instruction, group: Instruction, axis: int, n: int, scaled=False):
    """The plan of `group` after `user` (module docstring), channels along `axis`; `scaled`:
    its leading scale multiply (and convert) is the dequantise (`plan.scale`). Else None."""
    source, running, steps = _body(group, user)
    scale = None
    if scaled:
        lead = _leading_scale(ctx, group, steps, source, running, (axis, n))
        if lead is None:
            return None
        scale, running, steps = lead
    plan = _plan_steps(ctx, group, steps, running, source, (axis, n))
    if plan is not None:
        plan.scale = scale
    return plan


def _leading_scale(ctx, group: Instruction, steps: list, source: dict, running, channels):
    """(the per-channel float32 scale, the value after which the epilogue starts, the rest of
    the steps) when the first step reading `running` is `mul(running, channel constant)` in
    float32, optionally followed by a `convert` of it to the group's type (`fold_fp8`'s
    dequantise), else None. Steps before it do not read `running`: they stay, in order."""
    first = next((i for i, ins in enumerate(steps) if running in ins.inputs), None)
    if first is None:
        return None
    before, steps = steps[:first], steps[first:]
    mul = steps[0]
    if mul.op.name != "mul" or len(mul.inputs) != 2:
        return None
    other = mul.inputs[1] if mul.inputs[0] is running else mul.inputs[0]
    if mul.shape.type() != "float_type" or id(other) not in source or other is running:
        return None
    scale = channel_vector(ctx, group, source[id(other)], *channels)
    if scale is None:
        return None
    at, last = 1, mul
    if len(steps) > 1 and steps[1].op.name == "convert" and list(steps[1].inputs) == [mul]:
        at, last = 2, steps[1]
    if last.shape.type() != group.shape.type():
        return None
    return scale, last, before + steps[at:]


def _plan_steps(ctx, group, steps, running, source, channels):
    """The plan of the group's `steps` after the dequantised value `running` (module
    docstring), with its 8-bit quantise when it has one; else None."""
    ops, found, at = [], {"gelu": (0.0, 0.0, 0.0), "side": {}}, 0
    while at < len(steps):
        ins = steps[at]
        if ins.is_return():
            if len(ins.inputs) != 1 or ins.inputs[0] is not running or len(ops) > 3:
                return None
            quantise, scale, store = quantising_user(ctx, group)
            epilogue = qk.Epilogue(
                ops, found.get("bias"), scale, store, found["gelu"], found.get("affine")
            )
            plan = EpiloguePlan(group, epilogue, found.get("residual"), quantise)
            plan.prescale = found.get("prescale")
            return plan
        gelu = _gelu(ctx, group, steps[at : at + 5], running, source)
        if gelu is not None:
            ops.append("gelu")
            found["gelu"], running, at = gelu, steps[at + 4], at + 5
            continue
        if running not in ins.inputs:  # another product's dequantise / bias, beside it
            if not _side_step(ctx, group, ins, source, channels, found["side"]):
                return None
            at += 1
            continue
        if ins.op.name in ("relu", "gelu") and list(ins.inputs) == [running]:
            ops.append(ins.op.name)  # gelu: the recognised op, x * 0.5 * (1 + erf(x / sqrt 2))
            found["gelu"] = GELU if ins.op.name == "gelu" else found["gelu"]
        elif not _add(ctx, group, ins, running, source, channels, ops, found):
            return None
        running, at = ins, at + 1
    return None


def _side_step(ctx, group: Instruction, ins: Instruction, source: dict, channels, side) -> bool:
    """Record in `side` a step that does not read the running value when it is part of
    another activation's `(a * channel scale)` (float32, then `convert` to the group's type)
    or `a + channel bias`: side[id(ins)] = (a's input index, scale, bias, whether it is of the
    group's type), the residual of a "residual_affine" epilogue once it is added."""
    args = list(ins.inputs)
    name = ins.op.name
    if name == "convert" and len(args) == 1 and _quantised_source(group, args[0], source):
        # a quantised residual (`passes/rewrite_dequantize.py`): its 8-bit values in float32
        side[id(ins)] = (source[id(args[0])], None, None, False)
        return ins.shape.type() == "float_type"
    if name == "convert" and len(args) == 1 and id(args[0]) in side:
        k, scale, bias, _ = side[id(args[0])]
        side[id(ins)] = (k, scale, bias, ins.shape.type() == group.shape.type())
        return bias is None
    if name not in ("mul", "add") or len(args) != 2:
        return False
    for a, c in (args, args[::-1]):
        vector = channel_vector(ctx, group, source[id(c)], *channels) if id(c) in source else None
        if vector is None or (id(a) not in source and id(a) not in side):
            continue
        if id(a) in source:  # the other activation itself (not a constant)
            k = source[id(a)]
            x = group.inputs[k]
            if x.shape.lens() != group.shape.lens() or ctx.constant(ctx.arg(group, k)) is not None:
                return False
            a_state = (k, None, None, group.inputs[k].shape.type() == group.shape.type())
        else:
            a_state = side[id(a)]
        k, scale, bias, typed = a_state
        if name == "mul" and scale is None and bias is None and ins.shape.type() == "float_type":
            side[id(ins)] = (k, vector, None, ins.shape.type() == group.shape.type())
            return True
        if name == "add" and bias is None and typed:
            side[id(ins)] = (k, scale, vector, True)
            return True
    return False


def _quantised_source(group: Instruction, x: Instruction, source: dict) -> bool:
    """Whether body value `x` is a group input holding int8 / fp8 e4m3 values."""
    return id(x) in source and group.inputs[source[id(x)]].shape.type() in QUANTISED_TYPES


def _add(ctx, group, ins, running, source, channels, ops: list, found: dict) -> bool:
    """`ins` as an "add" of a per-channel bias or of a residual (into `ops` and `found`)."""
    if ins.op.name != "add" or len(ins.inputs) != 2 or running not in ins.inputs:
        return False
    other = ins.inputs[1] if ins.inputs[0] is running else ins.inputs[0]
    if other is running:
        return False
    side = found["side"].get(id(other))
    scaled = side is not None and side[3] and (side[1], side[2]) != (None, None)
    if scaled and "residual" not in found:
        k, scale, bias, _ = side
        if scale is None:  # an int8 product's dequantised value: its scale is applied
            scale = torch.ones_like(bias)
        elif group.inputs[k].shape.type() in QUANTISED_TYPES:  # a quantised residual, no bias
            bias = torch.zeros_like(scale) if bias is None else bias
        else:  # an fp8 product's float32 sums: it may apply its scale itself
            found["prescale"] = ctx.cache.get(PRESCALE, {}).get(id(group.inputs[k]))
        if bias is None:
            return False
        ops.append("residual_affine")
        found["residual"], found["affine"] = ctx.arg(group, k), (scale, bias)
        return True
    if id(other) not in source:
        return False
    k = source[id(other)]
    vector = channel_vector(ctx, group, k, *channels)
    if vector is not None and "bias" not in found:
        ops.append("bias")
        found["bias"] = vector
    elif vector is None and "residual" not in found and _same(group.inputs[k], group):
        ops.append("residual")
        found["residual"] = ctx.arg(group, k)
    else:
        return False
    return True


#: `gelu`'s constants (g1, g2, g3) as `ops/activation.py` decomposes it (float32 maths)
GELU = (float(np.float32(0.7071067811865476)), 1.0, 0.5)


def _gelu(ctx, group, five: list, h: Instruction, source: dict):
    """(g1, g2, g3) when `five` computes `(h * (erf(h * g1) + g2)) * g3` (an exact GELU as
    exported: g1 = 1/sqrt(2), g2 = 1, g3 = 1/2) with scalar constants, else None."""
    names = ["mul", "erf", "add", "mul", "mul"]
    if len(five) != 5 or [i.op.name for i in five] != names:
        return None
    m1, e, a, m2, m3 = five
    g1, g2, g3 = (_scalar(ctx, group, m1, h, source), _scalar(ctx, group, a, e, source),
                  _scalar(ctx, group, m3, m2, source))  # fmt: skip
    if list(e.inputs) != [m1] or set(map(id, m2.inputs)) != {id(h), id(a)} or len(m2.inputs) != 2:
        return None
    if None in (g1, g2, g3) or abs(g1 - 0.7071067811865476) > 1e-3 or g2 != 1.0 or g3 != 0.5:
        return None
    return g1, g2, g3


def _scalar(ctx, group, ins: Instruction, x: Instruction, source: dict) -> float | None:
    """The one value of `ins`'s operand other than `x` (a group input or a literal in the
    body), when it is a constant with one value everywhere, else None."""
    if len(ins.inputs) != 2 or x not in ins.inputs or ins.inputs[0] is ins.inputs[1]:
        return None
    other = ins.inputs[1] if ins.inputs[0] is x else ins.inputs[0]
    if other.is_literal():
        value = np.asarray(other.get_literal().array)
    elif id(other) in source and id(group.inputs[source[id(other)]]) in ctx.index:
        t = ctx.constant(ctx.arg(group, source[id(other)]))
        value = None if t is None else t.float().cpu().numpy()
    else:
        return None
    if value is None or value.size == 0 or not (value == value.flat[0]).all():
        return None
    return float(value.flat[0])


def quantising_user(ctx: LoweringContext, group: Instruction, types=QUANTISED_TYPES):
    """(the `quantizelinear` of `group` to one of `types` with one constant scale, that scale
    as a one-element float32 tensor, whether the group's float value is still needed) or
    (None, None, True)."""
    users = [u for u in group.outputs if u.op.name == "quantizelinear"]
    if len(users) != 1 or len(users[0].inputs) != 2 or users[0].inputs[0] is not group:
        return None, None, True
    quantise = users[0]
    if quantise.shape.type() not in types or id(quantise) in ctx.fusers:
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
