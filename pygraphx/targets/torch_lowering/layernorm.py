"""Layer normalisation recognised in the lowered program and run as one `torch.layer_norm`
call.

ONNX's LayerNormalization (and the exporters' ReduceMean / Sub / Pow / Sqrt / Div chains) reach
the lowering as seven instructions over the last axis of a float32 (or bf16) `x`:

    m = reduce_mean(x)                     d = pointwise{sub}(x, broadcast(m))
    v = fused_reduce{mul(d, d), reduce_mean}(d)
    s = pointwise{add(v, eps), sqrt}(v)    y = pointwise{div(d, broadcast(s)) [* w] [+ b]}(...)

When they form exactly this shape (each intermediate used only inside it, `w` and `b` fixed
vectors along the last axis, `eps` one constant) and nothing between `m` and `y` writes memory
(only the pattern, views, literals and parameters), the whole normalisation is one step at
`m`'s place: `y = torch.layer_norm(x, (n,), w, b, eps)`, a new tensor (one pass over `x` in
torch's fused kernel instead of four passes and three temporaries). The other instructions of the
pattern emit no step. Anything else lowers as before. A bf16 normalisation (`quantize_bf16`)
is computed in float32 inside torch's kernel and rounded once, where the instructions round each
step. A float32 normalisation whose last group also converts to bf16 (`quantize_bf16`'s default
keeps a pre-norm transformer's norms in float32 and rounds their output for the next product,
GPT-2's) is matched too: the step converts torch's result (finite values: a normalised row
never nears float32's largest, so the clamping convert's saturation cannot apply); so is one
whose float32 output also has a user that only converts it to bf16 (a post-norm transformer's,
BERT's, where the output feeds the next residual sum too): the step makes that copy as well.
A float32 norm rounded to bf16 runs as oneDNN's primitive writing bf16 in one pass
(`onednn_layernorm.py`; `PGX_CPU_LAYERNORM=torch` keeps torch's kernel), see `_kernel`. A float32
norm with a float32 result (and its bf16 copy, if it has one) runs as a native kernel writing
both in one pass (`native_layernorm.py`; `PGX_CPU_LAYERNORM_NATIVE=0` keeps the above), see
`_native`; so does a float32 norm rounded to bf16, writing the bf16 result alone (helper gemm15;
`PGX_CPU_LAYERNORM_NATIVE_BF16=0` keeps oneDNN's primitive for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import native_layernorm, onednn_layernorm
from pygraphx.targets.torch_lowering.context import LoweringContext, Step
from pygraphx.targets.torch_lowering.dtypes import from_numpy, torch_dtype
from pygraphx.targets.torch_lowering.lower_math import trace_group
from pygraphx.targets.torch_lowering.pointwise import Node, NotTraceable, Value, trace_body

#: `ctx.cache` key of the number of normalisations a lowering fused
BLOCKS = "layernorm_blocks"
#: `ctx.cache` key of the oneDNN layer-norm primitives shared by a program's norms
ONEDNN_TABLE = "onednn_layernorm"
#: the element types normalised in one step
NORM_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))
#: the IR type a float32 normalisation may be rounded to for its products
BF16 = "bf16_type"
#: a trace's converts (`cast_finite` clamps to the target's range)
CASTS = ("cast", "cast_finite")


@dataclass
class Norm:
    """A matched layer normalisation: its input, instructions (program order), output, and
    the affine parts."""

    x: Instruction
    members: list[Instruction]
    y: Instruction
    eps: float
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    cast: torch.dtype | None = None  # a convert after the affine part (to the next product)


def _only_user(ins: Instruction, op: str) -> Instruction | None:
    users = ins.outputs
    if len(users) != 1 or users[0].op.name != op:
        return None
    return users[0]


def _last_axis(ins: Instruction, rank: int) -> bool:
    return tuple(int(a) % rank for a in ins.op.axes) == (rank - 1,)


def _is_in(v: object, k: int) -> bool:
    return isinstance(v, Value) and v.kind == "in" and v.index == k


def _is_node(v: object, k: int) -> bool:
    return isinstance(v, Value) and v.kind == "node" and v.index == k


def _const(v: object) -> float | None:
    return float(v.const) if isinstance(v, Value) and v.kind == "const" else None


def _fixed(ins: Instruction) -> np.ndarray | None:
    """The values of a literal seen through broadcasts (the literal's own array), or None.
    (Matching runs before the inputs after `m` are lowered, so this reads the IR.)"""
    while ins.op.name == "multibroadcast":
        ins = ins.inputs[0]
    return ins.get_literal().array if ins.is_literal() else None


def _scalars(group: Instruction) -> dict[int, np.ndarray]:
    """Inputs of `group` that are one fixed number, by position (folded into its trace)."""
    found = {}
    for k, x in enumerate(group.inputs):
        a = _fixed(x)
        if a is not None and a.size == 1 and x.shape.dtype() == a.dtype:
            found[k] = a.reshape(())
    return found


def _vector(x: Instruction, n: int) -> torch.Tensor | None:
    """A fixed float32 (bf16) input that is one (n,) vector along the last axis, broadcast."""
    a = _fixed(x)
    if a is None or a.dtype not in NORM_DTYPES or a.size != n or (a.ndim and a.shape[-1] != n):
        return None
    return from_numpy(np.ascontiguousarray(a).reshape(n).copy())


def _fns(group: Instruction) -> list[Node] | None:
    """The nodes of an element-wise group's trace, when its result is the last node."""
    traced = trace_group(group.module_inputs[0], _scalars(group))
    if traced is None:
        return None
    trace, result = traced
    if not trace.nodes or not _is_node(result, len(trace.nodes) - 1):
        return None
    return trace.nodes


def _of_inputs(node: Node, fn: str, a: int, b: int) -> bool:
    """`node` is `fn(input a, input b)` (either order for mul)."""
    if node.fn != fn:
        return False
    x, y = node.args
    return (_is_in(x, a) and _is_in(y, b)) or (fn == "mul" and _is_in(x, b) and _is_in(y, a))


def _centre(mean: Instruction) -> Instruction | None:
    """`d = x - broadcast(mean(x))`, the deviation, when `mean` starts the pattern."""
    x = mean.inputs[0]
    lens = x.shape.lens()
    if x.shape.dtype() not in NORM_DTYPES:
        return None
    if not lens or not _last_axis(mean, len(lens)):
        return None
    mb = _only_user(mean, "multibroadcast")
    d = _only_user(mb, "pointwise") if mb is not None else None
    if d is None or mb.shape.lens() != lens or len(d.inputs) != 2 or mb not in d.inputs:
        return None
    nodes = _fns(d)
    kx, km = d.inputs.index(x) if x in d.inputs else -1, d.inputs.index(mb)
    if nodes is None or len(nodes) != 1 or kx < 0:
        return None
    return d if _of_inputs(nodes[0], "sub", kx, km) else None


def _variance(d: Instruction) -> Instruction | None:
    """`v = mean(d * d)` over the last axis, a `fused_reduce` reading only `d`."""
    users = [u for u in d.outputs if u.op.name == "fused_reduce"]
    if len(users) != 1 or users[0].inputs != [d]:
        return None
    v = users[0]
    body = v.module_inputs[0]
    red = body.get_returns()[0]
    if red.op.name != "reduce_mean" or not _last_axis(red, d.shape.ndim()):
        return None
    try:
        trace, result = trace_body(body, stop=red)
    except NotTraceable:
        return None
    nodes = trace.nodes
    if len(nodes) != 1 or not _is_node(result, 0):
        return None
    node = nodes[0]
    square = _of_inputs(node, "mul", 0, 0)
    return v if square or (node.fn == "pow" and _const(node.args[1]) == 2.0) else None


def _stddev(v: Instruction) -> tuple[Instruction, float] | None:
    """`s = sqrt(v + eps)`, one element-wise group on `v` alone; (s, eps)."""
    s = _only_user(v, "pointwise")
    nodes = _fns(s) if s is not None else None
    if nodes is None or len(nodes) != 2 or nodes[1].fn != "sqrt":
        return None
    add, k = nodes[0], s.inputs.index(v)
    if add.fn != "add" or not _is_node(nodes[1].args[0], 0):
        return None
    a, b = add.args
    eps = _const(b) if _is_in(a, k) else _const(a) if _is_in(b, k) else None
    return (s, eps) if eps is not None and eps >= 0 else None


def _affine(
    y: Instruction, d: Instruction, sb: Instruction
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.dtype | None] | None:
    """`y = d / sb [* w] [+ b] [then a convert]`: the fixed vectors (w, b) and the type
    converted to (None: no convert), or None."""
    nodes = _fns(y)
    if nodes is None or d not in y.inputs or sb not in y.inputs or y.inputs.count(d) != 1:
        return None
    cast = None
    if len(nodes) > 1 and nodes[-1].fn in CASTS and _is_node(nodes[-1].args[0], len(nodes) - 2):
        cast = torch_dtype(y.shape.dtype())
        nodes = nodes[:-1]
    if not _of_inputs(nodes[0], "div", y.inputs.index(d), y.inputs.index(sb)):
        return None
    n = d.shape.lens()[-1]
    found: dict[str, torch.Tensor] = {}
    for k, node in enumerate(nodes[1:], start=1):
        if node.fn not in ("mul", "add") or node.fn in found or "add" in found:
            return None
        a, b = node.args
        other = b if _is_node(a, k - 1) else a if _is_node(b, k - 1) else None
        if other is None or other.kind != "in":
            return None
        vec = _vector(y.inputs[other.index], n)
        if vec is None:
            return None
        found[node.fn] = vec
    return found.get("mul"), found.get("add"), cast


def match_layernorm(ctx: LoweringContext, mean: Instruction) -> Norm | None:
    """The layer normalisation `mean` starts (see the module docstring), or None."""
    if mean.op.name != "reduce_mean" or len(mean.inputs) != 1:
        return None
    d = _centre(mean)
    v = _variance(d) if d is not None else None
    found = _stddev(v) if v is not None else None
    if found is None:
        return None
    s, eps = found
    sb = _only_user(s, "multibroadcast")
    y = _only_user(sb, "pointwise") if sb is not None else None
    if y is None or sb.shape.lens() != d.shape.lens() or set(d.outputs) != {v, y}:
        return None
    if len(d.outputs) != 2 or y.shape.lens() != d.shape.lens():
        return None
    affine = _affine(y, d, sb)
    if affine is None or (affine[2] is None) != (y.shape.dtype() == d.shape.dtype()):
        return None
    members = [mean, mean.outputs[0], d, v, s, sb, y]
    if not _nothing_writes_between(ctx, members):
        return None
    return Norm(mean.inputs[0], members, y, eps, *affine)


def _nothing_writes_between(ctx: LoweringContext, members: list[Instruction]) -> bool:
    pos = ctx.position
    module = ctx.module
    assert module is not None
    ids = {id(m) for m in members}
    lo, hi = pos[id(members[0])], pos[id(members[-1])]
    for between in module.instructions[lo + 1 : hi]:
        if id(between) in ids or between.is_literal() or between.is_param():
            continue
        if between.op.output_alias(len(between.inputs)) < 0:
            return False
    return True


def lower_layernorm(ctx: LoweringContext, mean: Instruction) -> bool:
    """`mean` starting a layer normalisation: the whole of it as one step (see the module
    docstring); False (nothing bound) when it does not start one."""
    norm = match_layernorm(ctx, mean)
    if norm is None:
        return False
    env = ctx.env
    x = ctx.arg(mean, 0)
    for member in norm.members:
        ctx.bind_dynamic(member)
        if member is not mean:
            ctx.fusers[id(member)] = _bound
    idx = ctx.index[id(norm.y)]
    copy = _rounded_copy(norm) if norm.cast is None else None
    slot = _slot(ctx, norm, copy)
    if slot is not None:  # the native kernel writes the arena slot: a fixed tensor
        idx = ctx.bind_static(norm.y, slot)
    else:
        ctx.mark_fresh(idx)
    both = _native(norm, copy is not None, out=slot)
    assert slot is None or both is not None, "a slot is taken only for the native kernel"
    normalise = both if both is not None else _kernel(ctx, norm)
    unfused = None
    if both is not None and slot is None and norm.cast is None and _over_input(ctx, norm):
        # the observer path (profiling, per-instruction checks) keeps the input: a twin
        # writing a new tensor
        twin, both = both, _native(norm, copy is not None, inplace=True)
        normalise = both
        assert twin is not None and both is not None

        def apart() -> None:
            out = twin(env[x])
            if copy is None:
                env[idx] = out
            else:
                env[idx], env[ctx.index[id(copy)]] = out

        unfused = [Step(apart, norm.members + ([copy] if copy is not None else []), idx)]
    if copy is not None:  # computed by this step: bound, no step of its own
        cidx = ctx.bind_dynamic(copy)
        ctx.mark_fresh(cidx)
        ctx.fusers[id(copy)] = _bound
        low = torch_dtype(copy.shape.dtype())

        if both is not None:  # the float32 result and its bf16 copy in one pass

            def step() -> None:
                env[idx], env[cidx] = both(env[x])

        else:

            def step() -> None:
                env[idx] = y = normalise(env[x])
                env[cidx] = y.to(low)

    else:

        def step() -> None:
            env[idx] = normalise(env[x])

    ctx.emit(step, norm.members + ([copy] if copy is not None else []), idx, unfused)
    ctx.cache[BLOCKS] = ctx.cache.get(BLOCKS, 0) + 1
    return True


def _over_input(ctx: LoweringContext, norm: Norm) -> bool:
    """Whether the native norm may write its float32 result over its input: a tensor a step
    makes each run (`ctx.fresh`: a residual sum, say), not a program output, read by nothing
    but the norm (`PGX_CPU_LAYERNORM_INPLACE=0`: never). Why: the result then lands in memory
    the caches hold (the sum was just written), not in a block malloc hands out; see
    `benchmarks/results/gemm14.md`."""
    if not native_layernorm.inplace_enabled():
        return False
    x = norm.x
    if not ctx.run_owned(x):
        return False
    if x.op.output_alias(len(x.inputs)) >= 0 or x.shape.lens() != norm.y.shape.lens():
        return False
    members = {id(m) for m in norm.members}
    return all(id(u) in members and not u.is_return() for u in x.outputs)


def _slot(ctx: LoweringContext, norm: Norm, copy: Instruction | None) -> torch.Tensor | None:
    """The arena slot a float32 norm's native kernel writes its result into, or None (a new
    tensor each run, as before): where the norm has a float32 result only (no bf16 copy, no
    convert), the native kernel is on, the memory plan gave `norm.y` a slot sharing no byte
    with the input's buffer, only products read the result (not a program output: a new
    tensor needs no copy at the end; not a residual: a residual sum accumulates in place into
    a new tensor only, `gemm_residual._overwritable`, as into a post-norm block's first norm,
    BERT's) and the norm would not write over its input (`_over_input`);
    `PGX_CPU_LAYERNORM_SLOT=0`: never (helper gpt16).

    Why: a pre-norm transformer's norm (GPT-2's: its input, the residual, is read again by the
    next residual sum) wrote a block malloc handed out, one the caches no longer held; the slot
    is memory the plan reuses from step to step. The 2-core EPYC, one thread, thread CPU, a
    (128, 768) norm right after a 3072 x 768 product with its residual sum: 41-67 us into a new
    tensor against 31-42 into a fixed one (22-24 both warm); GPT-2 in
    `benchmarks/results/gpt16.md`."""
    if not native_layernorm.slot_enabled() or copy is not None or norm.cast is not None:
        return None
    if norm.x.shape.type() != "float_type" or norm.y.shape.type() != "float_type":
        return None
    if not all(u.op.name == "dot" for u in norm.y.outputs):
        return None
    if not ctx.has_slot(norm.y) or not ctx.apart(norm.x, norm.y):
        return None
    if any(t is not None and t.dtype != torch.float32 for t in (norm.weight, norm.bias)):
        return None
    if not native_layernorm.available(False) or _over_input(ctx, norm):
        return None
    out = ctx.slot_tensor(norm.y)
    if not out.is_contiguous() or out.dtype != torch.float32:
        return None
    return out


def _native(
    norm: Norm, copy: bool, inplace: bool = False, out: torch.Tensor | None = None
) -> native_layernorm.LayerNorm | None:
    """The native kernel (`native_layernorm.py`) for a float32 norm with a float32 result and
    float32 (or no) affine parts, with its bf16 copy when `copy`; or for one whose float32
    result is only rounded to bf16 (`norm.cast`, GPT-2's in a bf16 program: the bf16 result
    alone, `PGX_CPU_LAYERNORM_NATIVE_BF16=0` keeps oneDNN's primitive); else None (`_kernel`)."""
    w, b = norm.weight, norm.bias
    only_copy = norm.cast == torch.bfloat16 and native_layernorm.bf16_only_enabled()
    if norm.x.shape.type() != "float_type" or (norm.cast is not None and not only_copy):
        return None
    if only_copy:  # float32 in, the bf16 rounding of the float32 result out (GPT-2's)
        if any(t is not None and t.dtype != torch.float32 for t in (w, b)):
            return None
        if not native_layernorm.available(True):
            return None
        dims = tuple(norm.x.shape.lens())
        return native_layernorm.LayerNorm(dims, w, b, norm.eps, True, False, only_copy=True)
    if norm.y.shape.type() != "float_type" or any(
        t is not None and t.dtype != torch.float32 for t in (w, b)
    ):
        return None
    if not native_layernorm.available(copy):
        return None
    dims = tuple(norm.x.shape.lens())
    return native_layernorm.LayerNorm(dims, w, b, norm.eps, copy, inplace, out=out)


def _kernel(ctx: LoweringContext, norm: Norm) -> Callable[[torch.Tensor], torch.Tensor]:
    """The normalisation of the step's input, in the type of `norm.y`: oneDNN's primitive
    (`onednn_layernorm.py`: one pass writing bf16) for a float32 input with float32 affine
    parts whose result is rounded to bf16 (a pre-norm transformer's, GPT-2's), else torch's
    `torch.layer_norm` (then the convert). Float32 results stay on torch's kernel: in BERT-base
    (float32 output plus its bf16 copy) the primitive was no faster in the model (2.49 ms of
    layer norm a run against 2.29, 1 thread), though faster on its own.

    torch's kernel is called as `torch.layer_norm` (the C binding), not `F.layer_norm`, whose
    Python body (the `__torch_function__` checks) runs first: in a model every step after a
    weight product starts with its code out of the caches (the product streamed megabytes of
    weights through L2), and there the wrapper cost 15-35 us a norm (2-core EPYC, one thread,
    thread CPU time right after a (128 x 3072) x (3072 x 768) product: 87-113 against 67-87
    us, `benchmarks/attn10_cold.py`; warm the two are equal, 32-37 us). In the model: BERT-base
    and GPT-2's 25 norms 2.2-2.6 -> 1.7-2.1 ms a run (`benchmarks/attn10_ab.py`)."""
    shape, w, b, eps, cast = (norm.x.shape.lens()[-1],), norm.weight, norm.bias, norm.eps, norm.cast
    fixed = all(t is None or t.dtype == torch.float32 for t in (w, b))
    if norm.x.shape.type() == "float_type" and cast == torch.bfloat16 and fixed:
        if onednn_layernorm.wanted():
            table = ctx.cache.setdefault(ONEDNN_TABLE, {})
            dims = tuple(norm.x.shape.lens())
            return onednn_layernorm.LayerNorm(table, dims, w, b, eps, cast)

    layer_norm = torch.layer_norm  # not `F.layer_norm`: see `_kernel`'s docstring
    if cast is None:

        def torch_norm(t: torch.Tensor) -> torch.Tensor:
            return layer_norm(t, shape, w, b, eps)

        return torch_norm

    def torch_norm_cast(t: torch.Tensor) -> torch.Tensor:
        return layer_norm(t, shape, w, b, eps).to(cast)

    return torch_norm_cast


def _rounded_copy(norm: Norm) -> Instruction | None:
    """A bf16 copy of the float32 output that a user makes for its products (a post-norm
    transformer's, BERT's: the output also feeds the next residual sum), a group that only
    converts it, or None."""
    for user in norm.y.outputs:
        if user.op.name != "pointwise" or user.inputs != [norm.y] or user.shape.type() != BF16:
            continue
        body = user.module_inputs[0].instructions
        ops = [i for i in body if not (i.is_param() or i.is_return())]
        if len(ops) == 1 and ops[0].op.name == "convert" and norm.y.shape.type() == "float_type":
            return user
    return None


def _bound(ctx: LoweringContext, ins: Instruction) -> bool:
    """A member of a fused normalisation: bound when it was matched, no step of its own."""
    return True
