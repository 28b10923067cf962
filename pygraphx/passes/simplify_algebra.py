"""simplify_algebra: algebraic rewrites, declared as rules of the pattern language (pattern.py).

Each rule is a pattern (commutative ops match either way) and a rewrite that builds the
replacement (or declines). The rule set is applied to a fixed point; dead instructions are
removed between sweeps; `PGX_TRACE_REWRITE=1` prints each rule as it fires. Constants are
literals, or broadcast views of literals (what the frontend makes of ONNX's broadcasting).
Rules that fold constants into weights compute the new weights at once, so no runtime work is
added.

A separate sweep, `fuse_horizontal_dots`, merges matrix products that share their left input
and have constant right inputs (the Q/K/V projections of attention) into one wider product.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction, merge_sources
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.derived_literals import concatenate
from pygraphx.passes.pattern import (
    Captures,
    Rewrite,
    Rule,
    RuleSet,
    any_,
    const,
    const_source,
    const_value,
    is_float,
    op,
    scalar,
    single_use,
)


# --- constants ----------------------------------------------------------------------------
def channel_vector(ins: Instruction, axis: int) -> np.ndarray | None:
    """If the constant varies only along `axis` of its shape, its values along it."""
    src = const_source(ins)
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


def _other(ins: Instruction, x: Instruction) -> Instruction:
    a, b = ins.inputs
    return b if a is x else a


# --- rules: each a pattern and a rewrite ---------------------------------------------------
def _x(m: Module, ins: Instruction, c: Captures) -> Instruction:
    return c["x"]


def _zeros(m: Module, ins: Instruction, c: Captures) -> Instruction:
    return _broadcast_literal(m, ins, np.zeros((), ins.shape.dtype()), ins.shape.lens())


def _unary(name: str) -> Rewrite:
    def rewrite(m: Module, ins: Instruction, c: Captures) -> Instruction:
        return m.insert_instruction(ins, make_op(name), [c["x"]])

    return rewrite


def _square(m: Module, ins: Instruction, c: Captures) -> Instruction:
    return m.insert_instruction(ins, make_op("mul"), [c["x"], c["x"]])


def _times_reciprocal(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    lit = const_source(c["c"]).get_literal().array
    if not np.all(lit != 0):
        return None
    recip = (1 / lit.astype(np.float64)).astype(lit.dtype)
    new_c = _broadcast_literal(m, ins, recip, ins.shape.lens())
    return m.insert_instruction(ins, make_op("mul"), [c["x"], new_c])


def _plus_negated(m: Module, ins: Instruction, c: Captures) -> Instruction:
    lit = const_source(c["c"]).get_literal().array
    new_c = _broadcast_literal(m, ins, -lit, ins.shape.lens())
    return m.insert_instruction(ins, make_op("add"), [c["x"], new_c])


def _batch_norm_affine(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    x = c["x"]
    if ins.op.bn_mode != 1:
        return None  # per-activation parameters: not a per-channel affine map
    values = [const_value(c[k]) for k in ("scale", "bias", "mean", "var")]
    s, b, mu, v = (np.asarray(t, np.float64).reshape(-1) for t in values)
    a = s / np.sqrt(v + ins.op.epsilon)
    shift = b - mu * a
    lens = x.shape.lens()
    shape = [1, lens[1]] + [1] * (len(lens) - 2)
    dtype = x.shape.dtype()
    scale = _broadcast_literal(m, ins, a.astype(dtype).reshape(shape), lens)
    mul = m.insert_instruction(ins, make_op("mul"), [x, scale])
    bias = _broadcast_literal(m, ins, shift.astype(dtype).reshape(shape), lens)
    return m.insert_instruction(ins, make_op("add"), [mul, bias])


def _conv_scaled(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    conv, weights = c["conv"], c["w"].get_literal().array
    scale = channel_vector(c["c"], 1)
    if scale is None or scale.shape[0] != weights.shape[0]:
        return None
    scaled = weights * scale.reshape([-1] + [1] * (weights.ndim - 1))
    scaled = scaled.astype(weights.dtype, copy=False)  # no second copy when the type is right
    return m.insert_instruction(ins, conv.op, [c["x"], _literal(m, ins, scaled)])


def _dot_scaled(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    dot, b = c["dot"], c["w"]
    scale = channel_vector(c["c"], dot.shape.ndim() - 1)
    weights = const_source(b).get_literal().array
    if scale is None or weights.shape[-1] != scale.shape[0]:
        return None
    scaled = (weights * scale).astype(weights.dtype, copy=False)
    new_b = _broadcast_literal(m, ins, scaled, b.shape.lens())
    return m.insert_instruction(ins, dot.op, [c["x"], new_b])


def _distribute_scale(m: Module, ins: Instruction, c: Captures) -> Instruction:
    bv, cv = const_value(c["b"]), const_value(c["c"])
    scaled = _const_operand(m, ins, (bv * cv).astype(bv.dtype), ins.shape.lens())
    mul = m.insert_instruction(ins, make_op("mul"), [c["x"], c["c"]])
    return m.insert_instruction(ins, make_op("add"), [mul, scaled])


def _fold_constants(m: Module, ins: Instruction, c: Captures) -> Instruction:
    bv, cv = const_value(c["b"]), const_value(c["c"])
    summed = _const_operand(m, ins, (bv + cv).astype(bv.dtype), ins.shape.lens())
    return m.insert_instruction(ins, make_op("add"), [c["x"], summed])


def _not_const(ins: Instruction) -> bool:
    return const_value(ins) is None


def _not_float(ins: Instruction) -> bool:
    return not is_float(ins)


X = any_("x")
_CONV = op("convolution", X, any_("w").where(lambda i: i.is_literal())).where(single_use)
_DOT = op("dot", X, const("w")).where(single_use)
_CONV_OR_DOT = op(("convolution", "dot")).named("x")
_ADD_CONST = op("add", X.where(_not_const), const("b")).where(single_use)

# each rule: its algebra, its pattern, its rewrite (the rules of one op are tried in order)
RULES = RuleSet("simplify_algebra", [
    # x * 1 -> x
    Rule("mul_one", op("mul", X, scalar(1)), _x),
    # x * 0 -> 0 (integers and bools only: for floats x * 0 is NaN when x is inf or NaN)
    Rule("mul_zero", op("mul", X, scalar(0)).where(_not_float), _zeros),
    # conv(x, w) * c -> conv(x, w * c)   (c per output channel)
    Rule("conv_mul", op("mul", _CONV.named("conv"), const("c")), _conv_scaled),
    # dot(x, W) * c -> dot(x, W * c)     (c per output column)
    Rule("dot_mul", op("mul", _DOT.named("dot"), const("c")), _dot_scaled),
    # (a + b) * c -> a * c + b * c       (b, c constants; a a conv or dot, which takes the scale)
    Rule("mul_add_const", op("mul", op("add", _CONV_OR_DOT, const("b")).where(single_use),
                             const("c")), _distribute_scale),
    # x + 0 -> x
    Rule("add_zero", op("add", X, scalar(0)), _x),
    # (a + b) + c -> a + (b + c)         (b, c constants)
    Rule("add_add_const", op("add", _ADD_CONST, const("c")), _fold_constants),
    # x - 0 -> x
    Rule("sub_zero", op("sub", X, scalar(0)), _x),
    # x - c -> x + (-c)                  (floats)
    Rule("sub_const", op("sub", X, const("c")).where(is_float), _plus_negated),
    # x / 1 -> x
    Rule("div_one", op("div", X, scalar(1)), _x),
    # 1 / sqrt(x) -> rsqrt(x)
    Rule("one_div_sqrt", op("div", scalar(1), op("sqrt", X)), _unary("rsqrt")),
    # x / c -> x * (1 / c)               (floats, c nowhere zero)
    Rule("div_const", op("div", X, const("c")).where(is_float), _times_reciprocal),
    # -(-x) -> x
    Rule("neg_neg", op("neg", op("neg", X)), _x),
    # recip(sqrt(x)) -> rsqrt(x)
    Rule("recip_sqrt", op("recip", op("sqrt", X)), _unary("rsqrt")),
    # x ^ 2 -> x * x                     (floats)
    Rule("pow_two", op("pow", X, scalar(2)).where(is_float), _square),
    # bn(x) -> x * (s / sqrt(v + eps)) + (b - m * s / sqrt(v + eps))
    Rule("batch_norm_affine",
         op("batch_norm_inference", X.where(lambda i: i.shape.ndim() >= 2), const("scale"),
            const("bias"), const("mean"), const("var")), _batch_norm_affine),
])  # fmt: skip


def simplify_algebra(module: Module) -> None:
    """Apply the rule table to a fixed point, then merge horizontal matrix products."""
    RULES.apply(module)
    fuse_horizontal_dots(module)


def fuse_horizontal_dots(module: Module) -> None:
    """dot(x, W1), dot(x, W2), ... -> slices of dot(x, [W1 W2 ...]) (constant W's, same K).

    When every product is followed only by the addition of a constant bias along its last
    axis, the biases are concatenated too, so Q/K/V projections become one product and one add.
    The weights' concatenation is shared by every program optimised from the same weights
    (`derived_literals.concatenate`): each bucketed shape of a decoder reuses it.
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
            weights.append(const_source(b).get_literal().array)
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
        wcat = concatenate(weights, axis=-1)  # made once for every specialization
        lens = first.inputs[1].shape.lens()[:-1] + [wcat.shape[-1]]
        b_ins = _broadcast_literal(module, anchor, wcat, lens)
        fused = module.insert_instruction(anchor, make_op("dot"), [first.inputs[0], b_ins])
        fused.source = merge_sources(dots)  # one product computes every MatMul's node
        if with_bias:
            bcat = np.concatenate([vec for _, vec in biases]).astype(wcat.dtype)
            bias_ins = _broadcast_literal(module, anchor, bcat, fused.shape.lens())
            fused = module.insert_instruction(anchor, make_op("add"), [fused, bias_ins])
            fused.source = merge_sources(add for add, _ in biases)
        axis = fused.shape.ndim() - 1
        start = 0
        for d, (add, _) in zip(dots, biases, strict=True):
            n = d.shape.lens()[-1]
            part = module.insert_instruction(
                anchor, make_op("slice", axes=(axis,), starts=(start,), ends=(start + n,)), [fused]
            )
            part.source = (add if with_bias else d).source  # what this slice stands for
            start += n
            module.replace_instruction(add if with_bias else d, part)
    dead_code_elimination(module)
