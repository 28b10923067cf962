"""simplify_algebra: algebraic rewrites, written as a table of rules (one line each).

Each rule looks at one instruction and returns its replacement (or None). The table is applied
to a fixed point; dead instructions are removed between sweeps. Constants are literals, or
broadcast views of literals (what the frontend makes of ONNX's broadcasting). Rules that fold
constants into weights compute the new weights at once, so no runtime work is added.

A separate sweep, `fuse_horizontal_dots`, merges matrix products that share their left input
and have constant right inputs (the Q/K/V projections of attention) into one wider product.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.rewrite import Rule, apply_rules

MAX_SWEEPS = 8


# --- constants ----------------------------------------------------------------------------
def const_value(ins: Instruction) -> np.ndarray | None:
    """The value of a literal or of a broadcast view of one, else None."""
    if ins.is_literal():
        return ins.get_literal().array
    if ins.op.name in ("multibroadcast", "broadcast") and ins.inputs[0].is_literal():
        return ins.op.compute(ins.shape, [ins.inputs[0].get_literal().array])
    return None


def scalar_value(ins: Instruction) -> float | None:
    """The single value of a constant whose elements are all equal, else None."""
    src = ins.inputs[0] if ins.op.name in ("multibroadcast", "broadcast") else ins
    if not src.is_literal():
        return None
    arr = src.get_literal().array
    if arr.size == 0:
        return None
    first = arr.reshape(-1)[0]
    if arr.size > 1 and not np.all(arr == first):
        return None
    return first.item()


def channel_vector(ins: Instruction, axis: int) -> np.ndarray | None:
    """If the constant varies only along `axis` of its shape, its values along it."""
    src = ins.inputs[0] if ins.op.name in ("multibroadcast", "broadcast") else ins
    if not src.is_literal():
        return None
    value = const_value(ins)
    if value is None:
        return None
    rank, n = value.ndim, value.shape[axis]
    index = tuple(slice(None) if d == axis else 0 for d in range(rank))
    vec = np.asarray(value[index])
    lit = src.get_literal().array
    # cheap structural check on the (small) literal, full check only if it is small anyway
    expect = np.reshape(vec, [n if d == axis else 1 for d in range(rank)])
    if lit.size <= 4 * n or lit.size <= 4096:
        if not np.array_equal(np.broadcast_to(expect, value.shape), value):
            return None
        return vec
    return None


def _literal(m: Module, before: Instruction, value: np.ndarray) -> Instruction:
    return m.insert_literal(before, Literal(np.asarray(value, order="C"), copy=False))


def _broadcast_literal(
    m: Module, before: Instruction, value: np.ndarray, lens: list[int]
) -> Instruction:
    lit = _literal(m, before, value)
    if lit.shape.lens() == lens:
        return lit
    return m.insert_instruction(before, make_op("multibroadcast", out_lens=tuple(lens)), [lit])


def compress(value: np.ndarray) -> np.ndarray:
    """The smallest array that broadcasts back to `value` (axes of repeated values cut to 1)."""
    out = np.asarray(value)
    for axis in range(out.ndim):
        if out.shape[axis] > 1:
            first = out.take([0], axis=axis)
            if np.array_equal(np.broadcast_to(first, out.shape), out):
                out = first
    return np.asarray(out, order="C")


def _const_operand(
    m: Module, before: Instruction, value: np.ndarray, lens: list[int]
) -> Instruction:
    """A constant operand of `lens`: the compressed literal, broadcast back."""
    return _broadcast_literal(m, before, compress(value), lens)


def _is_float(ins: Instruction) -> bool:
    return np.issubdtype(ins.shape.dtype(), np.floating) or ins.shape.type() == "bf16_type"


def _other(ins: Instruction, x: Instruction) -> Instruction:
    a, b = ins.inputs
    return b if a is x else a


# --- rules --------------------------------------------------------------------------------
def mul_one(m: Module, ins: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if scalar_value(b) == 1:
        return a
    if scalar_value(a) == 1:
        return b
    return None


def add_zero(m: Module, ins: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if scalar_value(b) == 0:
        return a
    if scalar_value(a) == 0:
        return b
    return None


def sub_zero(m: Module, ins: Instruction) -> Instruction | None:
    return ins.inputs[0] if scalar_value(ins.inputs[1]) == 0 else None


def div_one(m: Module, ins: Instruction) -> Instruction | None:
    return ins.inputs[0] if scalar_value(ins.inputs[1]) == 1 else None


def mul_zero(m: Module, ins: Instruction) -> Instruction | None:
    # only for integers and bools: for floats x * 0 is NaN when x is inf or NaN
    if _is_float(ins):
        return None
    a, b = ins.inputs
    if scalar_value(a) == 0 or scalar_value(b) == 0:
        return _broadcast_literal(m, ins, np.zeros((), ins.shape.dtype()), ins.shape.lens())
    return None


def neg_neg(m: Module, ins: Instruction) -> Instruction | None:
    x = ins.inputs[0]
    return x.inputs[0] if x.op.name == "neg" else None


def div_const(m: Module, ins: Instruction) -> Instruction | None:
    a, b = ins.inputs
    value = const_value(b)
    if value is None or not _is_float(ins) or not np.all(value != 0):
        return None
    src = b.inputs[0] if b.op.name in ("multibroadcast", "broadcast") else b
    recip = (1 / src.get_literal().array.astype(np.float64)).astype(src.shape.dtype())
    new_b = _broadcast_literal(m, ins, recip, ins.shape.lens())
    return m.insert_instruction(ins, make_op("mul"), [a, new_b])


def sub_const(m: Module, ins: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if const_value(b) is None or not _is_float(ins):
        return None
    src = b.inputs[0] if b.op.name in ("multibroadcast", "broadcast") else b
    new_b = _broadcast_literal(m, ins, -src.get_literal().array, ins.shape.lens())
    return m.insert_instruction(ins, make_op("add"), [a, new_b])


def recip_sqrt(m: Module, ins: Instruction) -> Instruction | None:
    x = ins.inputs[0]
    if x.op.name == "sqrt":
        return m.insert_instruction(ins, make_op("rsqrt"), [x.inputs[0]])
    return None


def one_div_sqrt(m: Module, ins: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if scalar_value(a) == 1 and b.op.name == "sqrt":
        return m.insert_instruction(ins, make_op("rsqrt"), [b.inputs[0]])
    return None


def pow_two(m: Module, ins: Instruction) -> Instruction | None:
    x, e = ins.inputs
    if scalar_value(e) == 2 and _is_float(ins):
        return m.insert_instruction(ins, make_op("mul"), [x, x])
    return None


def batch_norm_affine(m: Module, ins: Instruction) -> Instruction | None:
    x, scale, bias, mean, var = ins.inputs
    values = [const_value(i) for i in (scale, bias, mean, var)]
    if any(v is None for v in values) or x.shape.ndim() < 2:
        return None
    s, b, mu, v = (np.asarray(t, np.float64).reshape(-1) for t in values)
    a = s / np.sqrt(v + ins.op.epsilon)
    c = b - mu * a
    lens = x.shape.lens()
    shape = [1, lens[1]] + [1] * (len(lens) - 2)
    dtype = x.shape.dtype()
    mul = m.insert_instruction(
        ins, make_op("mul"), [x, _broadcast_literal(m, ins, a.astype(dtype).reshape(shape), lens)]
    )
    return m.insert_instruction(
        ins, make_op("add"), [mul, _broadcast_literal(m, ins, c.astype(dtype).reshape(shape), lens)]
    )


def conv_mul(m: Module, ins: Instruction) -> Instruction | None:
    for conv in ins.inputs:
        if conv.op.name != "convolution" or len(conv.outputs) != 1:
            continue
        w = conv.inputs[1]
        c = channel_vector(_other(ins, conv), 1)
        if c is None or not w.is_literal():
            continue
        weights = w.get_literal().array
        groups_out = weights.shape[0]
        if c.shape[0] != groups_out:
            continue
        scaled = (weights * c.reshape([-1] + [1] * (weights.ndim - 1))).astype(weights.dtype)
        new_w = _literal(m, ins, scaled)
        return m.insert_instruction(ins, conv.op, [conv.inputs[0], new_w])
    return None


def dot_mul(m: Module, ins: Instruction) -> Instruction | None:
    for dot in ins.inputs:
        if dot.op.name != "dot" or len(dot.outputs) != 1:
            continue
        b = dot.inputs[1]
        b_value = const_value(b)
        c = channel_vector(_other(ins, dot), dot.shape.ndim() - 1)
        if b_value is None or c is None:
            continue
        src = b.inputs[0] if b.op.name in ("multibroadcast", "broadcast") else b
        weights = src.get_literal().array
        if weights.shape[-1] != c.shape[0]:
            continue
        new_b = _broadcast_literal(m, ins, (weights * c).astype(weights.dtype), b.shape.lens())
        return m.insert_instruction(ins, dot.op, [dot.inputs[0], new_b])
    return None


def _const_add_operand(
    ins: Instruction,
) -> Iterator[tuple[Instruction, Instruction, np.ndarray, np.ndarray]]:
    """For `ins = op(add(a, b), c)` with constants b and c (either operand order): yields
    (add, a, value of b, value of c)."""
    for add in ins.inputs:
        if add.op.name != "add" or len(add.outputs) != 1:
            continue
        c = const_value(_other(ins, add))
        if c is None:
            continue
        for a, b in (add.inputs, add.inputs[::-1]):
            bv = const_value(b)
            if bv is not None:
                yield add, a, bv, c


def mul_add_const(m: Module, ins: Instruction) -> Instruction | None:
    # (a + b) * c -> a * c + b * c, for constants b and c (moves the scale onto a conv/dot)
    for add, a, bv, c in _const_add_operand(ins):
        if a.op.name in ("convolution", "dot"):
            scaled = _const_operand(m, ins, (bv * c).astype(bv.dtype), ins.shape.lens())
            mul = m.insert_instruction(ins, make_op("mul"), [a, _other(ins, add)])
            return m.insert_instruction(ins, make_op("add"), [mul, scaled])
    return None


def add_add_const(m: Module, ins: Instruction) -> Instruction | None:
    # (a + b) + c -> a + (b + c), for constants b and c
    for _, a, bv, c in _const_add_operand(ins):
        if const_value(a) is None:
            summed = _const_operand(m, ins, (bv + c).astype(bv.dtype), ins.shape.lens())
            return m.insert_instruction(ins, make_op("add"), [a, summed])
    return None


# op name -> rules tried in order; each comment is the rule's algebra
RULES: dict[str, list[Rule]] = {
    "mul": [
        mul_one,          # x * 1 -> x
        mul_zero,         # x * 0 -> 0 (integers and bools only)
        conv_mul,         # conv(x, w) * c -> conv(x, w * c)   (c per output channel)
        dot_mul,          # dot(x, W) * c -> dot(x, W * c)     (c per output column)
        mul_add_const,    # (a + b) * c -> a * c + b * c       (b, c constants)
    ],
    "add": [
        add_zero,         # x + 0 -> x
        add_add_const,    # (a + b) + c -> a + (b + c)         (b, c constants)
    ],
    "sub": [
        sub_zero,         # x - 0 -> x
        sub_const,        # x - c -> x + (-c)
    ],
    "div": [
        div_one,          # x / 1 -> x
        one_div_sqrt,     # 1 / sqrt(x) -> rsqrt(x)
        div_const,        # x / c -> x * (1 / c)
    ],
    "neg": [neg_neg],     # -(-x) -> x
    "recip": [recip_sqrt],  # 1 / sqrt(x) -> rsqrt(x)
    "pow": [pow_two],     # x ^ 2 -> x * x
    "batch_norm_inference": [
        batch_norm_affine,  # bn(x) -> x * (s / sqrt(v + eps)) + (b - m * s / sqrt(v + eps))
    ],
}  # fmt: skip


def simplify_algebra(module: Module) -> None:
    """Apply the rule table to a fixed point, then merge horizontal matrix products."""
    for _ in range(MAX_SWEEPS):
        if not apply_rules(module, RULES):
            break
    fuse_horizontal_dots(module)


def fuse_horizontal_dots(module: Module) -> None:
    """dot(x, W1), dot(x, W2), ... -> slices of dot(x, [W1 W2 ...]) (constant W's, same K).

    When every product is followed only by the addition of a constant bias along its last
    axis, the biases are concatenated too, so Q/K/V projections become one product and one add.
    """
    by_input: dict[int, list[Instruction]] = {}
    for ins in module.instructions:
        if ins.op.name == "dot" and const_value(ins.inputs[1]) is not None and ins.outputs:
            by_input.setdefault(id(ins.inputs[0]), []).append(ins)
    for dots in by_input.values():
        if len(dots) < 2:
            continue
        first = dots[0]
        if any(d.inputs[1].shape.lens()[:-1] != first.inputs[1].shape.lens()[:-1] for d in dots):
            continue
        weights = []
        for d in dots:
            b = d.inputs[1]
            src = b.inputs[0] if b.op.name in ("multibroadcast", "broadcast") else b
            weights.append(src.get_literal().array)
        if any(w.ndim != weights[0].ndim or w.shape[:-1] != weights[0].shape[:-1] for w in weights):
            continue
        biases = []
        for d in dots:
            add = d.outputs[0] if len(d.outputs) == 1 and d.outputs[0].op.name == "add" else None
            vec = channel_vector(_other(add, d), d.shape.ndim() - 1) if add is not None else None
            biases.append((add, vec))
        with_bias = all(vec is not None for _, vec in biases)
        # insert after the last of the products' inputs, before the first product's use
        anchor = min((d for d in dots), key=module.position)
        wcat = np.concatenate(weights, axis=-1)
        lens = first.inputs[1].shape.lens()[:-1] + [wcat.shape[-1]]
        b_ins = _broadcast_literal(module, anchor, wcat, lens)
        fused = module.insert_instruction(anchor, make_op("dot"), [first.inputs[0], b_ins])
        if with_bias:
            bcat = np.concatenate([vec for _, vec in biases]).astype(wcat.dtype)
            bias_ins = _broadcast_literal(module, anchor, bcat, fused.shape.lens())
            fused = module.insert_instruction(anchor, make_op("add"), [fused, bias_ins])
        axis = fused.shape.ndim() - 1
        start = 0
        for d, (add, _) in zip(dots, biases, strict=True):
            n = d.shape.lens()[-1]
            part = module.insert_instruction(
                anchor, make_op("slice", axes=(axis,), starts=(start,), ends=(start + n,)), [fused]
            )
            start += n
            module.replace_instruction(add if with_bias else d, part)
    dead_code_elimination(module)
