"""An encoder's last layer normalisation and the masked sum over the tokens after it (the sum
in sentence-transformers' mean pooling, MiniLM's) as one native step (helper norms18, issue 10).

The pooling `(hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)` after the last norm reaches
the cpu target with the norm's affine group fused into the masked sum's `fused_reduce`, so
`layernorm.match_layernorm` does not see a norm there and the norm ran as four steps (mean,
deviation, variance, square root), the masked sum a fifth reading the deviation again (on
MiniLM 8 x 128 at one thread ~0.55 ms a run against ~0.1 for one pass; its reads of x and of
the deviation each 1.5 MB). The instructions, over a float32 `x` of shape (B, T, N):

    m = reduce_mean(x) (last axis)        d = pointwise{sub}(x, broadcast(m))
    v = fused_reduce{mul(d, d), reduce_mean (last axis)}(d)
    s = pointwise{add(v, eps), sqrt}(v)
    p = fused_reduce{div(d, broadcast(s)) [* w] [+ b], * broadcast(M), reduce_sum (axis 1)}(...)

with `w`, `b` fixed (N,) vectors, `M` a float32 (B, T, 1) tensor (the mask, computed by earlier
steps), `p` of shape (B, 1, N). The whole is one step at `p`'s place (where `M` is ready):
`layernorm.c`'s `ln_pool_f32` normalises each row of `x` (the mean and variance as the native
norm's v2 computes them) and adds it, times its mask value, to its batch's float32 sums: one
read of `x`, nothing else written. `x` must be a tensor its step makes each run (`run_owned`)
and read only by the pattern (so nothing writes over it before the step), every intermediate
used only inside the pattern.

Where the program has the rest of the mean after it (`_tail`: `M = convert(unsqueeze(P))` of
an int64 program input `P`, the count `reduce_sum(M)`, `max(count, clamp)` and the division,
each used only there and none before the norm, as MiniLM's export has them), the step takes
those in too: it reads `P` itself and writes the mean `(B, N)` at the division's place
and, where the L2 normalisation `e / max(sqrt(sum(e * e)), l2eps)` of the mean follows in the
same way (`_l2`), that too (MiniLM 8 x 128: the 12 steps after the last FFN-down product ->
1). Otherwise they stay as they were.

`PGX_CPU_NORM_POOL=0` keeps the old steps; without a compiler or AVX-512F the pattern is not
taken (said once, `native.announce_fallback`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pygraphx.ir.env import switch_on
from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import layernorm, native_layernorm
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.layernorm import (
    _bound,
    _scalars,
    _centre,
    _const,
    _is_in,
    _is_node,
    _last_axis,
    _only_user,
    _stddev,
    _vector,
)
from pygraphx.targets.torch_lowering.lower_math import trace_group
from pygraphx.targets.torch_lowering.pointwise import NotTraceable, trace_body

#: `0` / `off`: the norm and the masked sum after it stay separate steps
ENV = "PGX_CPU_NORM_POOL"
#: `ctx.cache` key of the number of fused norm + pooling steps a lowering made
BLOCKS = "norm_pool_blocks"
#: `ctx.cache` key of how many of them took in the mean's count and division (`_tail`)
TAILS = "norm_pool_tails"
#: `ctx.cache` key of how many of them took in the L2 normalisation too (`_l2`)
L2S = "norm_pool_l2"
F32 = torch.float32


def enabled() -> bool:
    return switch_on(ENV)


@dataclass
class NormPool:
    """A matched norm + masked token sum: its input, members (program order), the sum `p`,
    the mask `M` (an input of `p`'s broadcast) and the affine parts."""

    x: Instruction
    members: list[Instruction]
    p: Instruction
    mask: Instruction
    eps: float
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    # the mean's tail (`_tail`), where it is taken in too: the division's result, the clamp,
    # the int64 mask read in place of `mask`, and the tail's instructions
    mean_out: Instruction | None = None
    clamp: float | None = None
    mask_src: Instruction | None = None
    tail: tuple[Instruction, ...] = ()
    l2eps: float | None = None  # where `_l2` took in the L2 normalisation after the mean


def _variance_of(v: Instruction, d: Instruction) -> bool:
    """`v = mean(d * d)` over the last axis, a `fused_reduce` reading only `d`."""
    if v.op.name != "fused_reduce" or v.inputs != [d]:
        return False
    body = v.module_inputs[0]
    red = body.get_returns()[0]
    if red.op.name != "reduce_mean" or not _last_axis(red, d.shape.ndim()):
        return False
    try:
        trace, result = trace_body(body, stop=red)
    except NotTraceable:
        return False
    if len(trace.nodes) != 1 or not _is_node(result, 0):
        return False
    node = trace.nodes[0]
    if node.fn == "mul":
        return all(_is_in(a, 0) for a in node.args)
    return node.fn == "pow" and _is_in(node.args[0], 0) and _const(node.args[1]) == 2.0


def _pool_body(p: Instruction, d: Instruction, sb: Instruction) -> tuple | None:
    """`p = sum over axis 1 of (d / sb [* w] [+ b]) * mb`: (w, b, the mask M) or None."""
    body = p.module_inputs[0]
    red = body.get_returns()[0]
    rank = d.shape.ndim()
    if red.op.name != "reduce_sum" or tuple(int(a) % rank for a in red.op.axes) != (1,):
        return None
    try:
        trace, result = trace_body(body, stop=red)
    except NotTraceable:
        return None
    nodes = trace.nodes
    if len(nodes) < 2 or not _is_node(result, len(nodes) - 1):
        return None
    if p.inputs.count(d) != 1 or p.inputs.count(sb) != 1:
        return None
    kd, ks = p.inputs.index(d), p.inputs.index(sb)
    first = nodes[0]
    if first.fn != "div" or not (_is_in(first.args[0], kd) and _is_in(first.args[1], ks)):
        return None
    n = d.shape.lens()[-1]
    found: dict[str, object] = {}
    used = {kd, ks}
    for k, node in enumerate(nodes[1:], start=1):
        if node.fn not in ("mul", "add") or len(node.args) != 2:
            return None
        a, b = node.args
        other = b if _is_node(a, k - 1) else a if _is_node(b, k - 1) else None
        if other is None or getattr(other, "kind", None) != "in" or other.index in used:
            return None
        used.add(other.index)
        x = p.inputs[other.index]
        last = k == len(nodes) - 1
        if last:  # the mask, broadcast from (B, T, 1) along the last axis
            if node.fn != "mul" or x.op.name != "multibroadcast":
                return None
            m = x.inputs[0]
            lens = d.shape.lens()
            if list(m.shape.lens()) != [lens[0], lens[1], 1] or m.shape.type() != "float_type":
                return None
            found["mask"] = m
            continue
        if node.fn in found or "add" in found:  # [mul w] then [add b], each once
            return None
        vec = _vector(x, n)
        if vec is None or vec.dtype != F32:
            return None
        found[node.fn] = vec
    if "mask" not in found or used != set(range(len(p.inputs))):
        return None
    return found.get("mul"), found.get("add"), found["mask"]


def match_norm_pool(ctx: LoweringContext, mean: Instruction) -> NormPool | None:
    """The norm + masked token sum `mean` starts (see the module docstring), or None."""
    if mean.op.name != "reduce_mean" or len(mean.inputs) != 1:
        return None
    x = mean.inputs[0]
    lens = x.shape.lens()
    if len(lens) != 3 or x.shape.type() != "float_type" or not x.shape.standard():
        return None
    d = _centre(mean)
    if d is None or len(d.outputs) != 2:
        return None
    v = next((u for u in d.outputs if _variance_of(u, d)), None)
    if v is None:
        return None
    p = next(u for u in d.outputs if u is not v)
    if p.op.name != "fused_reduce" or list(p.shape.lens()) != [lens[0], 1, lens[2]]:
        return None
    if p.shape.type() != "float_type":
        return None
    found = _stddev(v)
    if found is None:
        return None
    s, eps = found
    sb = _only_user(s, "multibroadcast")
    if sb is None or sb.outputs != [p] or list(sb.shape.lens()) != list(lens):
        return None
    body = _pool_body(p, d, sb)
    if body is None:
        return None
    w, b, mask = body
    # x: read at p's place, so only the pattern may read it, and it must be a tensor its
    # step makes each run (an arena slot could be handed to a step between)
    if set(map(id, x.outputs)) != {id(mean), id(d)} or not ctx.run_owned(x):
        return None
    members = [mean, mean.outputs[0], d, v, s, sb, p]
    return _tail(ctx, NormPool(x, members, p, mask, eps, w, b))


_VIEWS = ("squeeze", "reshape", "unsqueeze")


def _one_node(ins: Instruction) -> tuple | None:
    """An element-wise group of one node: (the node, its scalars folded), or None."""
    traced = trace_group(ins.module_inputs[0], _scalars(ins))
    if traced is None:
        return None
    trace, result = traced
    if len(trace.nodes) != 1 or not _is_node(result, 0):
        return None
    return trace.nodes[0]


def _divides(node: object) -> bool:
    """`node` is `div(input 0, input 1)`."""
    args = getattr(node, "args", None)
    return getattr(node, "fn", None) == "div" and _is_in(args[0], 0) and _is_in(args[1], 1)


def _tail(ctx: LoweringContext, found: NormPool) -> NormPool:
    """`found` with the rest of the mean taken in where the program has it, else as it is:

        M = convert(unsqueeze(P)) (P an int64 (B, T) program input, M's users the sum and
        R = reduce_sum(M) (axis 1) only)     c = max(view(R), clamp)   (a fixed number)
        out = view(p) / broadcast(c)         (out: (B, N))

    every instruction used only inside, none lowered yet (all after the norm's mean in the
    program): the step then reads P itself and writes `out` at `out`'s place (x and P are
    intact there: x is read only by the pattern, P is a program input)."""
    p, m = found.p, found.mask
    lens = found.x.shape.lens()
    B, N = lens[0], lens[2]
    sq = p.outputs[0] if len(p.outputs) == 1 else None
    if sq is None or sq.op.name not in _VIEWS or list(sq.shape.lens()) != [B, N]:
        return found
    dv = sq.outputs[0] if len(sq.outputs) == 1 else None
    if dv is None or dv.op.name != "pointwise" or len(dv.inputs) != 2 or dv.inputs[0] is not sq:
        return found
    if dv.shape.type() != "float_type" or list(dv.shape.lens()) != [B, N]:
        return found
    node = _one_node(dv)
    if node is None or not _divides(node):
        return found
    cb = dv.inputs[1]
    if cb.op.name != "multibroadcast" or cb.outputs != [dv]:
        return found
    c = cb.inputs[0]
    if c.op.name != "pointwise" or c.outputs != [cb] or list(c.shape.lens()) != [B, 1]:
        return found
    node = _one_node(c)
    if node is None or node.fn not in ("max", "maximum"):
        return found
    a0, a1 = node.args
    clamp = _const(a1) if _is_in(a0, 0) else _const(a0) if _is_in(a1, 0) else None
    rs = c.inputs[0]
    if clamp is None or rs.op.name not in _VIEWS or rs.outputs != [c]:
        return found
    r = rs.inputs[0]
    if r.op.name != "reduce_sum" or r.inputs != [m] or r.outputs != [rs]:
        return found
    if tuple(int(a) % 3 for a in r.op.axes) != (1,):
        return found
    mb = next(i for i in p.inputs if i.op.name == "multibroadcast" and i.inputs == [m])
    if set(map(id, m.outputs)) != {id(mb), id(r)} or len(m.outputs) != 2 or mb.outputs != [p]:
        return found
    if m.op.name != "pointwise" or len(m.inputs) != 1:
        return found
    body = [i for i in m.module_inputs[0].instructions if not (i.is_param() or i.is_return())]
    u = m.inputs[0]
    if len(body) != 1 or body[0].op.name != "convert" or u.op.name not in _VIEWS:
        return found
    src = u.inputs[0]
    if u.outputs != [m] or not src.is_param() or src.shape.type() != "int64_type":
        return found
    if list(src.shape.lens()) != [B, lens[1]] or not src.shape.standard():
        return found
    tail = (mb, u, m, r, rs, c, cb, sq, dv)
    if any(id(i) in ctx.index for i in tail):  # lowered already (before the mean)
        return found
    found.mean_out, found.clamp, found.mask_src, found.tail = dv, clamp, src, tail
    return _l2(ctx, found)


def _l2(ctx: LoweringContext, found: NormPool) -> NormPool:
    """`found` (its mean taken in) with the L2 normalisation after the mean taken in too
    where the program has it, else as it is:

        q = fused_reduce{mul(e, e), reduce_sum (last axis)}(e)    (e: the mean, (B, N))
        z = max(sqrt(q), l2eps)                                   out = e / broadcast(z)

    each used only there, none lowered yet: the step then writes `out` at its place."""
    e = found.mean_out
    assert e is not None
    B, N = e.shape.lens()
    if len(e.outputs) != 2:
        return found
    q = next((u for u in e.outputs if u.op.name == "fused_reduce"), None)
    out = next((u for u in e.outputs if u.op.name == "pointwise"), None)
    if q is None or out is None or q.inputs != [e] or len(q.outputs) != 1:
        return found
    body = q.module_inputs[0]
    red = body.get_returns()[0]
    if red.op.name != "reduce_sum" or tuple(int(a) % 2 for a in red.op.axes) != (1,):
        return found
    try:
        trace, result = trace_body(body, stop=red)
    except NotTraceable:
        return found
    if len(trace.nodes) != 1 or not _is_node(result, 0):
        return found
    sq = trace.nodes[0]
    if not (sq.fn == "mul" and all(_is_in(a, 0) for a in sq.args)):
        return found
    z = q.outputs[0]
    if z.op.name != "pointwise" or z.inputs[0] is not q or len(z.outputs) != 1:
        return found
    traced = trace_group(z.module_inputs[0], _scalars(z))
    if traced is None or len(traced[0].nodes) != 2 or not _is_node(traced[1], 1):
        return found
    root, big = traced[0].nodes
    if root.fn != "sqrt" or not _is_in(root.args[0], 0) or big.fn not in ("max", "maximum"):
        return found
    a0, a1 = big.args
    l2eps = _const(a1) if _is_node(a0, 0) else _const(a0) if _is_node(a1, 0) else None
    zb = z.outputs[0]
    if l2eps is None or zb.op.name != "multibroadcast" or zb.outputs != [out]:
        return found
    if out.inputs != [e, zb] or list(out.shape.lens()) != [B, N]:
        return found
    if out.shape.type() != "float_type":
        return found
    node = _one_node(out)
    if node is None or not _divides(node):
        return found
    more = (q, z, zb, out)
    if any(id(i) in ctx.index for i in more):
        return found
    found.tail = (*found.tail, *more)
    found.mean_out, found.l2eps = out, l2eps
    return found


class Pool:
    """`ln_pool_f32` for one matched pattern: `(x, mask) -> p` into `out` (B, 1, N) or, with
    `clamp` (the mean), (B, N): p / max(mask count, clamp). The mask: float32 (B, T, 1) or,
    with `mask_i64`, the int64 (B, T) it was converted from. With `l2eps` (and `clamp`) the
    mean's rows are divided by max(their L2 norm, l2eps) too."""

    def __init__(self, dims: tuple[int, int, int], weight: torch.Tensor | None,
                 bias: torch.Tensor | None, eps: float, out: torch.Tensor | None,
                 clamp: float | None = None, mask_i64: bool = False,
                 l2eps: float | None = None) -> None:  # fmt: skip
        lib = native_layernorm.library()
        self.fn = lib.ln_pool_f32
        self.dims = dims
        B, T, N = dims
        self.out = out
        self.weight = None if weight is None else weight.to(F32).contiguous()
        self.bias = None if bias is None else bias.to(F32).contiguous()
        self.scratch: torch.Tensor | None = None
        self.B, self.T, self.N, self.eps = B, T, N, ctypes.c_float(float(eps))
        self.w = None if self.weight is None else self.weight.data_ptr()
        self.b = None if self.bias is None else self.bias.data_ptr()
        self.clamp = clamp
        self.mask_i64 = mask_i64
        self.out_shape = (B, 1, N) if clamp is None else (B, N)
        self.mask_shape = (B, T) if mask_i64 else (B, T, 1)
        self.mask_dtype = torch.int64 if mask_i64 else F32
        if out is not None and (tuple(out.shape) != self.out_shape or out.dtype != F32
                                or not out.is_contiguous()):  # fmt: skip
            raise ValueError(f"native norm + pool: out must be dense float32 {self.out_shape}")
        if l2eps is not None and clamp is None:
            raise ValueError("native norm + pool: the L2 normalisation needs the mean (clamp)")
        self.tail = (self.eps, int(clamp is not None), ctypes.c_float(clamp or 0.0),
                     int(l2eps is not None), ctypes.c_float(l2eps or 0.0))

    def __call__(self, x: torch.Tensor, mask: torch.Tensor, threads: int) -> torch.Tensor:
        B, T, N = self.dims
        if not mask.is_contiguous():  # a program input as given (review18b)
            mask = mask.contiguous()
        if x.dim() == 3 and (x.stride(2) != 1 or x.stride(1) != N):
            x = x.contiguous()
        if (x.dtype != F32 or tuple(x.shape) != self.dims or x.stride(2) != 1
                or x.stride(1) != N or mask.dtype != self.mask_dtype
                or tuple(mask.shape) != self.mask_shape or mask.stride(1) != 1):  # fmt: skip
            raise RuntimeError(
                f"native norm + pool: input {tuple(x.shape)} {x.dtype} {tuple(x.stride())} or "
                f"mask {tuple(mask.shape)} {mask.dtype} {tuple(mask.stride())} not as lowered")
        out = self.out if self.out is not None else torch.empty(self.out_shape, dtype=F32)
        scratch = None
        if threads > 1:
            if self.scratch is None or self.scratch.numel() < threads * B * N:
                self.scratch = torch.empty(threads * B * N, dtype=F32)
            scratch = self.scratch.data_ptr()
        rc = self.fn(x.data_ptr(), mask.data_ptr(), int(self.mask_i64), self.w, self.b,
                     out.data_ptr(), scratch, B, T, N, x.stride(1), x.stride(0), mask.stride(0),
                     N, *self.tail, threads)  # fmt: skip
        if rc:
            raise RuntimeError("native kernel layernorm: ln_pool_f32 not built for this processor")
        return out


def lower_norm_pool(ctx: LoweringContext, mean: Instruction) -> bool:
    """`mean` starting a norm + masked token sum: its members bound with no step, the one step
    emitted when the lowering reaches the last of them (`p`, or the mean's division where
    `_tail` took it in); False (nothing bound) where it does not start one."""
    if not enabled():
        return False
    found = match_norm_pool(ctx, mean)
    if found is None or not native_layernorm.available(False):
        return False
    env = ctx.env
    x = ctx.arg(mean, 0)
    last = found.mean_out if found.mean_out is not None else found.p
    members = found.members + [i for i in found.tail if i is not last]
    if found.mean_out is not None:
        members.append(last)
    if any(id(m) in ctx.fusers for m in members):  # (another lowering's plan for one of them)
        return False
    for member in members[:-1]:
        ctx.bind_dynamic(member)
        if member is not mean:
            ctx.fusers[id(member)] = _bound
    dims = tuple(int(v) for v in found.x.shape.lens())
    mask_ins = found.mask_src if found.mask_src is not None else found.mask

    def at_last(ctx2: LoweringContext, ins: Instruction) -> bool:
        assert ins is last
        idx, out = ctx2.output(ins)
        if out is not None and (not out.is_contiguous() or not ctx2.apart(mask_ins, ins)
                                or not ctx2.apart(found.x, ins)):  # fmt: skip
            out = None
        if out is None and ctx2.static[idx]:
            # (a slot the kernel may not write: a new tensor each run instead)
            idx = ctx2.bind_dynamic(ins)
        if out is None:
            ctx2.mark_fresh(idx)
        pool = Pool(dims, found.weight, found.bias, found.eps, out, found.clamp,
                    mask_i64=found.mask_src is not None, l2eps=found.l2eps)  # fmt: skip
        m = ctx2.index[id(mask_ins)]
        threads = native_layernorm.get_num_threads

        def step() -> None:
            env[idx] = pool(env[x], env[m], threads())

        ctx2.emit(step, members, idx)
        ctx2.cache[BLOCKS] = ctx2.cache.get(BLOCKS, 0) + 1
        # (a fused normalisation as `layernorm.lower_layernorm`'s: `layernorm_blocks` counts it)
        ctx2.cache[layernorm.BLOCKS] = ctx2.cache.get(layernorm.BLOCKS, 0) + 1
        if found.mean_out is not None:
            ctx2.cache[TAILS] = ctx2.cache.get(TAILS, 0) + 1
        if found.l2eps is not None:
            ctx2.cache[L2S] = ctx2.cache.get(L2S, 0) + 1
        return True

    ctx.fusers[id(last)] = at_last
    return True


__all__ = ["BLOCKS", "ENV", "L2S", "TAILS", "NormPool", "Pool", "enabled", "lower_norm_pool",
           "match_norm_pool"]  # fmt: skip
