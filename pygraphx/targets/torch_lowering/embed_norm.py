"""An encoder's embeddings - rows gathered from tables, summed with a fixed (position) table -
and the layer normalisation over that sum as one native step (helper norms18, issue 10).

BERT and MiniLM start with `LN(word[ids] + position (+ type[type_ids]))`: one gather step per
table (each writing (B, T, N)), a step adding them (reading them again, writing the sum) and the
norm's step (reading it again): on MiniLM 8 x 128 at one thread ~0.46 ms a run in the model.
The instructions, over float32 (B, T, N):

    g_k = gather(table_k, ids_k) (axis 0; table_k a fixed (V_k, N) table, ids_k an int64
          (B, T) program input)
    a   = pointwise{((in_0 + in_1) + in_2) ...}(...) (a chain of adds, each input a g_k or a
          fixed table broadcast over the batch, (T, N) or smaller)
    y   = the layer normalisation of `a` (`layernorm.match_layernorm`, float32 result, no
          convert and no bf16 copy)

each g_k and `a` used only inside the pattern. The whole is one step at `y`'s place:
`layernorm.c`'s `ln_embed_f32` sums each row's parts in the chain's order into a row buffer
and normalises it (v2's row statistics) into `y`: the tables' rows read once, one (B, T, N)
write. The match is made when the lowering reaches the first gather (the others and `a` come
later in the program and are bound with no step); the ids are program inputs, so they are
intact at `y`'s place. An index out of range raises IndexError as the gather step does.

`PGX_CPU_EMBED_NORM=0` keeps the old steps; without a compiler or AVX-512F the pattern is not
taken (said once, `native.announce_fallback`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from pygraphx.ir.env import switch_on
from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import layernorm, native_layernorm
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.layernorm import (
    Norm,
    _bound,
    _fixed,
    _is_in,
    _is_node,
    _rounded_copy,
    match_layernorm,
)
from pygraphx.targets.torch_lowering.lower_layout import gather_range_message
from pygraphx.targets.torch_lowering.lower_math import trace_group

#: `0` / `off`: the embeddings' gathers, their sum and the norm stay separate steps
ENV = "PGX_CPU_EMBED_NORM"
#: `ctx.cache` key of the number of fused embedding + norm steps a lowering made
BLOCKS = "embed_norm_blocks"
F32 = torch.float32


def enabled() -> bool:
    return switch_on(ENV)


@dataclass
class EmbedNorm:
    """A matched embedding sum + norm: the parts in the sum's order (a gather, or a fixed
    (T, N) table), the sum, the norm."""

    parts: list[tuple[Instruction | None, torch.Tensor]]  # (the ids or None, the table)
    gathers: list[Instruction]
    add: Instruction
    norm: Norm


def _chain(add: Instruction) -> list[int] | None:
    """The input positions of `add`'s chain of adds in their order, or None."""
    traced = trace_group(add.module_inputs[0], {})
    if traced is None:
        return None
    trace, result = traced
    nodes = trace.nodes
    if not nodes or not _is_node(result, len(nodes) - 1):
        return None
    order: list[int] = []

    def pos(v: object) -> int | None:
        k = getattr(v, "index", None)
        return k if isinstance(k, int) and _is_in(v, k) else None

    for k, node in enumerate(nodes):
        if node.fn != "add" or len(node.args) != 2:
            return None
        a, b = node.args
        if k == 0:
            if pos(a) is None or pos(b) is None:
                return None
            order += [pos(a), pos(b)]
        else:
            if not _is_node(a, k - 1) or pos(b) is None:
                return None
            order.append(pos(b))
    if sorted(order) != list(range(len(add.inputs))):
        return None
    return order


def _table(ctx: LoweringContext, g: Instruction, n: int) -> torch.Tensor | None:
    """`g`'s table as the lowering holds it (a fixed contiguous float32 (V, n) tensor)."""
    table = g.inputs[0]
    if not table.is_literal():
        return None
    idx = ctx.index.get(id(table))
    t = ctx.constant(idx) if idx is not None else None
    if not isinstance(t, torch.Tensor) or t.dtype != F32 or t.dim() != 2 or t.shape[1] != n:
        return None
    return t if t.is_contiguous() else None


def match_embed_norm(ctx: LoweringContext, first: Instruction) -> EmbedNorm | None:
    """The embedding sum + norm the gather `first` starts (see the module docstring)."""
    if first.op.name != "gather" or len(first.outputs) != 1:
        return None
    add = first.outputs[0]
    if add.op.name != "pointwise" or add.shape.type() != "float_type":
        return None
    lens = add.shape.lens()
    if len(lens) != 3:
        return None
    B, T, N = lens
    order = _chain(add)
    if order is None:
        return None
    means = [u for u in add.outputs if u.op.name == "reduce_mean"]
    if len(means) != 1:
        return None
    norm = match_layernorm(ctx, means[0])
    if norm is None or norm.x is not add or norm.cast is not None or _rounded_copy(norm):
        return None
    if norm.y.shape.type() != "float_type":
        return None
    if any(t is not None and t.dtype != F32 for t in (norm.weight, norm.bias)):
        return None
    parts: list[tuple[Instruction | None, torch.Tensor]] = []
    gathers: list[Instruction] = []
    for k in order:
        x = add.inputs[k]
        if x.op.name == "gather":
            ids = x.inputs[1]
            axis = x.op.axis % 2 if x.inputs[0].shape.ndim() == 2 else -1
            if axis != 0 or x.outputs != [add] or add.inputs.count(x) != 1:
                return None
            if not ids.is_param() or ids.shape.type() != "int64_type":
                return None
            if list(ids.shape.lens()) != [B, T] or not ids.shape.standard():
                return None
            if x is not first and id(x) in ctx.index:
                return None
            table = _table(ctx, x, N)
            if table is None:
                return None
            parts.append((ids, table))
            gathers.append(x)
            continue
        a = _fixed(x)
        if a is None or a.dtype != np.float32 or x.shape.lens() != lens:
            return None
        shape = a.shape
        if len(shape) > 3 or (len(shape) == 3 and shape[0] != 1):
            return None
        rows = a.reshape(shape[-2:] if len(shape) > 1 else shape)
        try:
            fixed = np.ascontiguousarray(np.broadcast_to(rows, (T, N)))
        except ValueError:
            return None
        parts.append((None, torch.from_numpy(fixed.copy())))
    readers = {id(norm.members[0]), id(norm.members[2])}  # the norm's mean and deviation
    if first not in gathers or set(map(id, add.outputs)) != readers:
        return None
    return EmbedNorm(parts, gathers, add, norm)


class Embed:
    """`ln_embed_f32` for one matched pattern: the ids tensors (in the parts' order, those of
    the gathered parts) -> y (B, T, N), into `out` where given."""

    def __init__(self, dims: tuple[int, int, int], parts: list[tuple[bool, torch.Tensor]],
                 weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                 out: torch.Tensor | None) -> None:  # fmt: skip
        lib = native_layernorm.library()
        self.fn = lib.ln_embed_f32
        self.dims = dims
        B, T, N = dims
        if out is not None and (tuple(out.shape) != dims or out.dtype != F32
                                or not out.is_contiguous()):  # fmt: skip
            raise ValueError(f"native embedding norm: out must be dense float32 {dims}")
        self.out = out
        self.tables = [t for _, t in parts]  # (kept alive: the kernel reads their addresses)
        self.gathered = [g for g, _ in parts]
        n = len(parts)
        self.tab = (ctypes.c_void_p * n)(*[t.data_ptr() for t in self.tables])
        self.idx = (ctypes.c_void_p * n)()
        self.vocab = (ctypes.c_int64 * n)(*[t.shape[0] for t in self.tables])
        self.weight = None if weight is None else weight.contiguous()
        self.bias = None if bias is None else bias.contiguous()
        w = None if self.weight is None else self.weight.data_ptr()
        b = None if self.bias is None else self.bias.data_ptr()
        self.head = (w, b, B * T, T, N, N, ctypes.c_float(float(eps)), n)
        self.scratch: torch.Tensor | None = None

    def __call__(self, ids: list[torch.Tensor], threads: int) -> torch.Tensor:
        B, T, N = self.dims
        k, dense = 0, []  # (dense copies of strided ids, alive through the call: review18b)
        for j, gathered in enumerate(self.gathered):
            if not gathered:
                continue
            t = ids[k]
            k += 1
            if not t.is_contiguous():  # a program input as given: a slice, Fortran order
                t = t.contiguous()
                dense.append(t)
            if t.dtype != torch.int64 or tuple(t.shape) != (B, T) or not t.is_contiguous():
                raise RuntimeError(f"native embedding norm: ids {tuple(t.shape)} {t.dtype} "
                                   "not as lowered")  # fmt: skip
            self.idx[j] = t.data_ptr()
        if self.scratch is None or self.scratch.numel() < max(threads, 1) * N:
            self.scratch = torch.empty(max(threads, 1) * N, dtype=F32)
        out = self.out if self.out is not None else torch.empty(self.dims, dtype=F32)
        rc = self.fn(out.data_ptr(), *self.head, self.tab, self.idx, self.vocab,
                     self.scratch.data_ptr(), threads)  # fmt: skip
        if rc == -2:
            raise IndexError("native embedding norm: an index is out of range")
        if rc:
            raise RuntimeError("native kernel layernorm: ln_embed_f32 not built for this processor")
        return out


def lower_embed_norm(ctx: LoweringContext, first: Instruction) -> bool:
    """The gather `first` starting an embedding sum + norm: every member bound with no step,
    the one step emitted when the lowering reaches the norm's result; False (nothing bound)
    where it does not start one."""
    if not enabled():
        return False
    found = match_embed_norm(ctx, first)
    if found is None or not native_layernorm.available(False):
        return False
    norm = found.norm
    members = [*found.gathers, found.add, *norm.members]
    members.sort(key=lambda i: ctx.position[id(i)])
    if members[0] is not first or members[-1] is not norm.y:
        return False
    if any(id(m) in ctx.fusers for m in members):  # (another lowering's plan for one of them)
        return False
    for member in members[:-1]:
        ctx.bind_dynamic(member)
        if member is not first:
            ctx.fusers[id(member)] = _bound
    env = ctx.env
    dims = tuple(int(v) for v in found.add.shape.lens())
    id_ins = [g.inputs[1] for g in found.gathers]
    parts = [(ids is not None, t) for ids, t in found.parts]
    gather_of = {id(g.inputs[1]): g for g in found.gathers}

    def at_norm(ctx2: LoweringContext, ins: Instruction) -> bool:
        assert ins is norm.y
        idx, out = ctx2.output(ins)
        if out is not None and not out.is_contiguous():
            out = None
        if out is None and ctx2.static[idx]:
            idx = ctx2.bind_dynamic(ins)
        if out is None:
            ctx2.mark_fresh(idx)
        embed = Embed(dims, parts, norm.weight, norm.bias, norm.eps, out)
        src = [ctx2.index[id(i)] for ids, _ in found.parts if ids is not None
               for i in (ids,)]  # fmt: skip
        threads = native_layernorm.get_num_threads

        def step() -> None:
            ids = [env[k] for k in src]
            try:
                env[idx] = embed(ids, threads())
            except IndexError:
                for i, t in zip(id_ins, ids, strict=True):
                    g = gather_of[id(i)]
                    n = g.inputs[0].shape.lens()[0]
                    if bool(((t < -n) | (t >= n)).any()):
                        raise IndexError(gather_range_message(g, t, n)) from None
                raise

        ctx2.emit(step, members, idx)
        ctx2.cache[BLOCKS] = ctx2.cache.get(BLOCKS, 0) + 1
        # (a fused normalisation as `layernorm.lower_layernorm`'s: `layernorm_blocks` counts it)
        ctx2.cache[layernorm.BLOCKS] = ctx2.cache.get(layernorm.BLOCKS, 0) + 1
        return True

    ctx.fusers[id(norm.y)] = at_norm
    return True


__all__ = ["BLOCKS", "ENV", "Embed", "EmbedNorm", "enabled", "lower_embed_norm",
           "match_embed_norm"]  # fmt: skip
