"""Attention recognised in the lowered program and run as `scaled_dot_product_attention`
(shared by the `cpu` and `gpu` targets: `with_attention` wraps their `dot` and `fused_reduce`
lowerings).

The optimised IR of an attention block is `s = dot(Q, Kt)`, then a `fused_reduce` whose body
is `softmax(prologue(s, ...), axis=-1)`, then `o = dot(p, V)`. When

* `s` feeds only the group and the group only the second product (as its left operand),
* nothing between the first product and the second writes memory (only views, literals and
  the group), so Q, K and V are intact when the fused step runs,
* the prologue is exactly `s * c` (or `s / c`) for a constant c, then optionally
  `where(b, ., F)` with F <= -1e4 (a masked-out fill: its softmax weight is 0 whether or not the
  scaled score is added to it, as long as a row keeps one unmasked entry), then optionally
  `+ m`,

the three instructions become one step: `F.scaled_dot_product_attention(Q, K, V,
attn_mask=..., scale=c)` (flash / memory-efficient kernels on CUDA; on the CPU torch's fused
flash-attention kernel, which never materialises the score matrix). The additive mask is
`where(b, m, F + m)` (or its parts) computed per run, once for all the blocks that read the same
mask inputs (a model's layers do: GPT-2's 12 blocks share one causal mask and one padding
mask), and at its own size: the inputs' broadcast axes (stride 0) are cut to length 1 before
`where`, and `scaled_dot_product_attention` broadcasts the result over heads and batch
(GPT-2 at batch 1, one thread: building a (1, 12, 128, 128) mask in each of 12 layers cost
3.5 of the 14.6 ms its attention took). A bf16 block on the CPU, and a float32 one of a
middling size, runs as three oneDNN primitives instead (`onednn_attention.py`: the scores scaled
and masked in float32 inside the first matmul, oneDNN's softmax writing the product type;
faster than torch's kernels there, see `_on_onednn`); before that, a bf16 block (and a float32
one of 32K scores or more, `_native_f32`) runs as one native fused kernel where it takes the
operands (`native_attention.py`: the scores kept in the cache, never written; a block whose
`where` keeps exactly a literal lower triangle runs causal there, skipping the keys its query
rows do not see, in the runs where its additive mask is all zero: `causal_offset`); where
oneDNN's C API library is missing, torch's fused kernel (float32) or matmul / softmax / matmul
(bf16).
Anything else lowers as before: when the group does not match, the first product is lowered at
the group's place (only views and literals lie between them, so its inputs are unchanged).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import native_attention, onednn_attention
from pygraphx.targets.torch_lowering.context import LoweringContext, Step
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_math import scalar_inputs
from pygraphx.targets.torch_lowering.lower_views import CHAIN_VIEWS, view_chain, view_step
from pygraphx.targets.torch_lowering.pointwise import Node, NotTraceable, Value, trace_body

Lowering = Callable[[LoweringContext, Instruction], bool]
#: `ctx.cache` key of the number of attention blocks a lowering fused
BLOCKS = "attention_blocks"
#: `ctx.cache` key of the masks shared between blocks (mask inputs -> cell)
MASKS = "attention_masks"
#: fills at or below this are "masked out" (see the module docstring)
MASKED_FILL = -1e4
#: a trace's converts (a bf16 score widened to a float32 softmax); `cast_finite` clamps
CASTS = ("cast", "cast_finite")


@dataclass
class Pattern:
    scale: float
    keep: int | None = None  # group input of the boolean keep-mask of `where`
    keep_true: bool = True  # whether `where` keeps the score where the mask is true
    fill: float = 0.0
    add: int | None = None  # group input of the additive mask


def _softmax_group(ins: Instruction) -> bool:
    if ins.op.name != "fused_reduce":
        return False
    red = ins.module_inputs[0].get_returns()[0]
    return red.op.name == "softmax" and red.op.axis in (-1, red.shape.ndim() - 1)


def _convert_only(ins: Instruction) -> bool:
    """`ins` is an element-wise group that only converts its one input."""
    if ins.op.name != "pointwise" or len(ins.inputs) != 1:
        return False
    body = [i for i in ins.module_inputs[0].instructions if not (i.is_param() or i.is_return())]
    return len(body) == 1 and body[0].op.name == "convert"


def _probabilities(group: Instruction) -> Instruction:
    """What the second product reads of the softmax group: the group, or the one convert of
    its result (`quantize_bf16`'s default: a float32 softmax rounded to bf16)."""
    user = group.outputs[0] if len(group.outputs) == 1 else None
    return user if user is not None and _convert_only(user) else group


def _candidate(ctx: LoweringContext, dot1: Instruction) -> Instruction | None:
    """The second product when `dot1` starts an attention block (structure only)."""
    if len(dot1.outputs) != 1 or dot1.shape.ndim() < 3:
        return None
    group = dot1.outputs[0]
    if not _softmax_group(group) or len(group.outputs) != 1 or group.inputs.count(dot1) != 1:
        return None
    probs = _probabilities(group)
    if len(probs.outputs) != 1:
        return None
    dot2 = probs.outputs[0]
    if dot2.op.name != "dot" or dot2.inputs[0] is not probs or dot2.inputs[1] is probs:
        return None
    dtypes = {i.shape.type() for i in (*dot1.inputs, dot2.inputs[1], dot2)}
    if (
        len(dtypes) != 1
        or dot2.shape.dtype() not in (np.float32, np.float16)
        and (dot2.shape.type() != "bf16_type")
    ):
        return None
    pos, module = ctx.cache["position"], ctx.cache["module"]
    for between in module.instructions[pos[id(dot1)] + 1 : pos[id(dot2)]]:
        if between in (group, probs) or between.is_literal() or between.is_param():
            continue
        if between.op.output_alias(len(between.inputs)) < 0:
            return None
    return dot2


def lower_attention_dot(ctx: LoweringContext, ins: Instruction, plain: Lowering) -> bool:
    """First product of a candidate block: bound with no step (decided at the group);
    the second product of a matched block: the fused step."""
    pattern = ctx.cache.get(("attention", id(ins)))
    if pattern is not None:
        _emit_sdpa(ctx, ins, pattern)
        return True
    if _candidate(ctx, ins) is None:
        return False
    ctx.bind_dynamic(ins)
    ctx.cache[("attention_pending", id(ins.outputs[0]))] = ins
    return True


def lower_attention_softmax(ctx: LoweringContext, ins: Instruction, plain: Lowering) -> bool:
    """The softmax group of a candidate block: matched, it is bound with no step; not matched,
    the pending first product is lowered here and the group declines (lowered as usual)."""
    dot1 = ctx.cache.pop(("attention_pending", id(ins)), None)
    if dot1 is None:
        return False
    pattern = match_prologue(ctx, ins, ins.inputs.index(dot1))
    if pattern is None:
        if not plain(ctx, dot1):
            raise RuntimeError(f"{dot1.op}: postponed product could not be lowered")
        return False
    ctx.bind_dynamic(ins)
    probs = _probabilities(ins)
    if probs is not ins:  # the convert: bound, no step of its own
        ctx.bind_dynamic(probs)
        ctx.fusers[id(probs)] = _bound
    ctx.cache[("attention", id(probs.outputs[0]))] = pattern
    return True


def _bound(ctx: LoweringContext, ins: Instruction) -> bool:
    """The convert of a fused block's probabilities: bound when matched, no step."""
    return True


def match_prologue(ctx: LoweringContext, group: Instruction, score: int) -> Pattern | None:
    """The softmax prologue as a `Pattern`, or None when it is not exactly one."""
    body = group.module_inputs[0]
    red = body.get_returns()[0]
    try:
        trace, result = trace_body(body, stop=red, consts=scalar_inputs(ctx, group))
    except NotTraceable:
        return None
    nodes = trace.nodes
    if not nodes or result.kind != "node" or result.index != len(nodes) - 1:
        return None
    first = nodes[0]
    if first.fn not in ("mul", "div") or not _is_input(first.args[0], score):
        return None
    c = _const(first.args[1])
    if c is None or c == 0:
        return None
    pattern = Pattern(scale=c if first.fn == "mul" else 1.0 / c)
    for k, node in enumerate(nodes[1:], start=1):
        if not _extend(pattern, node, k):
            return None
    return pattern


def _extend(p: Pattern, node: Node, k: int) -> bool:
    """Take node `k` (which must use node k-1) into the pattern: the where, then the add."""

    def same(a: object) -> bool:
        return isinstance(a, Value) and a.kind == "node" and a.index == k - 1

    if node.fn in CASTS and same(node.args[0]) and node.dtype == np.float32:
        return True  # widening the scaled score: its value unchanged
    if node.fn == "where" and p.keep is None and p.add is None and _input(node.args[0]) is not None:
        b, x, y = node.args
        if same(x) and _const(y) is not None and _const(y) <= MASKED_FILL:
            p.keep, p.keep_true, p.fill = _input(b), True, _const(y)
            return True
        if same(y) and _const(x) is not None and _const(x) <= MASKED_FILL:
            p.keep, p.keep_true, p.fill = _input(b), False, _const(x)
            return True
        return False
    if node.fn == "add" and p.add is None:
        a, b = node.args
        other = b if same(a) else a if same(b) else None
        if other is not None and _input(other) is not None:
            p.add = _input(other)
            return True
    return False


def _is_input(v: object, k: int) -> bool:
    return _input(v) == k


def _input(v: object) -> int | None:
    return v.index if isinstance(v, Value) and v.kind == "in" else None


def _const(v: object) -> float | None:
    if isinstance(v, Value) and v.kind == "const":
        return float(v.const)
    return None


def _emit_sdpa(ctx: LoweringContext, dot2: Instruction, p: Pattern) -> None:
    probs = dot2.inputs[0]
    group = probs.inputs[0] if probs.op.name == "pointwise" else probs
    dot1 = next(i for i in group.inputs if i.op.name == "dot" and i.outputs == [group])
    env = ctx.env
    q, kt = ctx.args(dot1)
    v = ctx.arg(dot2, 1)
    gargs = ctx.args(group)
    keep = gargs[p.keep] if p.keep is not None else None
    add = gargs[p.add] if p.add is not None else None
    dtype = torch_dtype(dot2.shape.dtype())
    share = _shared_mask(ctx, (keep, p.keep_true, p.fill, add, dtype))
    on_onednn = _on_onednn(ctx, dtype, dot1.shape.elements())
    attend = _cpu_attention(ctx, p.scale, dtype) if on_onednn else None
    route = "oneDNN's attention primitives" if attend is not None else "torch's SDPA"
    attend = attend or _sdpa(p.scale, dtype)
    native_f32 = _native_f32(ctx, dtype, dot1.shape.elements())
    read = [*dot1.inputs, dot2.inputs[1]]
    read += [x for x in group.inputs if x is not dot1]
    slot = _slot(ctx, dot2, read) if native_f32 else None
    if native_f32:
        table = ctx.cache.setdefault(NATIVE_TABLE, {})
        attend = native_attention.attend(p.scale, table, attend, dtype, route, out=slot)
    causal = None
    if native_f32 or dtype == torch.bfloat16 and on_onednn and _native_bf16(ctx):
        offset = causal_offset(ctx, p, keep, dot1)
        if offset is not None:
            table = ctx.cache.setdefault(NATIVE_TABLE, {})
            causal = native_attention.attend_causal(p.scale, table, dtype, offset, out=slot)
    if slot is not None:  # every route writes the slot: a fixed tensor
        idx = ctx.bind_static(dot2, slot)
    else:
        idx = ctx.bind_dynamic(dot2)
        ctx.mark_fresh(idx)
    # the heads merged back (transpose, reshape) in this step, not a step each (CPU)
    views = view_chain(ctx, dot2) if ctx.device.type == "cpu" else []
    first, last = share.enrol(idx)
    mask, unpadded = share.mask, share.unpadded

    def block() -> None:
        if first:
            share.begin()
        y = causal(env[q], env[kt], env[v]) if causal is not None and unpadded() else None
        env[idx] = attend(env[q], env[kt], env[v], mask()) if y is None else y
        if last[0]:
            share.end()

    members = [dot1, group, dot2] if probs is group else [dot1, group, probs, dot2]
    if not views:
        ctx.emit(block, members, idx)
    else:

        def step() -> None:
            block()
            y = env[idx]
            for _, fn, (_, out) in views:
                env[out] = y = fn(y)

        unfused = [Step(block, [dot2], idx)]
        unfused += [Step(view_step(env, io[0], fn, io[1]), [ins], io[1]) for ins, fn, io in views]
        chain = [ins for ins, _, _ in views]
        ctx.emit(step, members + chain, ctx.index[id(chain[-1])], unfused)
    ctx.cache[BLOCKS] = ctx.cache.get(BLOCKS, 0) + 1


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def _merged_views(dot2: Instruction) -> list[Instruction]:
    """The views `view_chain` will bind after `dot2` (the heads merged back), not bound yet."""
    chain, cur = [], dot2
    while len(cur.outputs) == 1 and cur.outputs[0].op.name in CHAIN_VIEWS:
        nxt = cur.outputs[0]
        if len(nxt.inputs) != 1:
            break
        chain.append(nxt)
        cur = nxt
    return chain


def _slot(ctx: LoweringContext, dot2: Instruction, read: list[Instruction]) -> torch.Tensor | None:
    """The arena slot a float32 block on the native kernel writes its output into (a view of
    the kernel's token-major layout, `native_attention.out_layout`), or None (a new tensor each
    run, as before): where the memory plan gave the output (`dot2`) a slot sharing no byte with
    any buffer the block reads (`read`: Q, K^T, V, the mask's parts), the heads are merged back
    in the step (`_merged_views`: the readers see only the merged view, not the slot's 4-D
    tensor). A fixed tensor is not `fresh`: no later step writes over it in place, and where
    the merged view is a program output the end of the run copies it (as any non-fresh view).
    `PGX_CPU_ATTENTION_SLOT=0`: never (helper tfov17).

    Why: the block's output, read once by the attention's output product, then landed in a block
    malloc handed out each run, memory the caches no longer held; the slot is memory the plan
    reuses from step to step (gpt16 did the same for GPT-2's norms, `layernorm._slot`).
    `benchmarks/results/tfov17.md`."""
    if not native_attention.slot_enabled() or ctx.device.type != "cpu":
        return None
    views = _merged_views(dot2)
    if not views or dot2.shape.type() != "float_type" or not ctx.has_slot(dot2):
        return None
    if not native_attention.f32_available():  # (every run would copy the route's result)
        return None
    if not all(ctx.apart(x, dot2) for x in read):
        return None
    shape = tuple(dot2.shape.lens())
    flat = ctx.slot_tensor(dot2)
    if not flat.is_contiguous() or flat.dtype != torch.float32:
        return None
    return flat.as_strided(shape, native_attention.out_layout(shape))


#: float32 blocks run on oneDNN for this many score values (b * h * s * t) or more, and at most
#: `ONEDNN_F32_MAX` (see `_on_onednn`)
ONEDNN_F32_MIN = 1 << 15
ONEDNN_F32_MAX = 1 << 21
#: `0` keeps every float32 block on torch's fused kernel (A/B measurements; bf16 unchanged)
F32_ENV = "PGX_CPU_ONEDNN_ATTENTION_F32"


def _on_onednn(ctx: LoweringContext, dtype: torch.dtype, scores: int) -> bool:
    """Whether a block with `scores` score values runs as oneDNN's three primitives on the CPU
    (`onednn_attention.py`): bf16 always, float32 for `ONEDNN_F32_MIN` to `ONEDNN_F32_MAX`
    scores.

    bf16: torch's fused kernel is slower there than three steps (BERT-base's (12, 128, 64)
    heads at batch 1, one thread: 0.85 ms against torch's three 0.60 and oneDNN's 0.42).
    float32 (the 2-core AMD EPYC, Q / K / V strided heads of a fused QKV product, fastest of
    10-100 calls, `benchmarks/bertb1_attention.py`): torch's fused flash kernel splits a short
    sequence's work unevenly over threads, so the primitives win in the middle: BERT-base's
    (1, 12, 128, 64) block 0.36 ms against 0.47 on two threads (0.72 against 0.76 on one),
    GPT-2's causal one 0.37 against 0.48, MiniLM's 32-wide heads 0.24 against 0.30, ViT-B/16's
    (1, 12, 197, 64) 0.92 against 1.11 (1.54 against 1.92 on one). Below 32K scores the calls'
    fixed cost evens it out ((1, 4, 64, 64): 65 against 61 us on two threads), and from some
    millions the scores no longer fit the caches while the flash kernel never writes them
    (ViT-B/16 at batch 8, 3.7M scores: 17.3 ms against 16.7 on one thread; BERT-base at batch
    8, 1.6M: 6.78 against 6.84). In the model the gain is smaller (the scores buffer is cold
    after the GEMMs; `benchmarks/results/bertb1_profile.md`), and on two threads that share one
    busy core the three primitives' waits cost more than the flash kernel's: `F32_ENV=0` keeps
    float32 on torch's kernel."""
    if ctx.device.type != "cpu":
        return False
    if dtype == torch.bfloat16:
        return True
    if os.environ.get(F32_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    return dtype == torch.float32 and ONEDNN_F32_MIN <= scores <= ONEDNN_F32_MAX


#: `0` keeps float32 blocks off the native kernel (on their oneDNN / torch route)
NATIVE_F32_ENV = "PGX_CPU_NATIVE_ATTENTION_F32"


def _native_f32(ctx: LoweringContext, dtype: torch.dtype, scores: int) -> bool:
    """Whether a float32 block with `scores` score values runs on the native kernel first (its
    FMA variant; `native_attention.py`), its route as decided above the fallback: on the CPU,
    from `ONEDNN_F32_MIN` scores (below, the calls' fixed cost decides). 2-core EPYC, one
    thread, thread CPU time, loaded machine (`benchmarks/results/attn13.md`): BERT-base's
    block 744 us against oneDNN's 751 and torch's 824; at batch 8 6.64 ms against 7.44 / 7.17;
    ViT-B/16 at batch 8 14.5 against 19.3 / 16.1 (torch's, the route there). Whole float32
    models at 2 threads (quiet): 0.99-1.00x the route before (MiniLM, BERT-base b1 / b8,
    ViT-B/16): the products run at the machine's FMA rate either way.
    `ctx.options["onednn_attention"] = False` (torch's route asked for) keeps it off too."""
    if ctx.device.type != "cpu" or dtype != torch.float32 or not native_attention.enabled():
        return False
    if not ctx.options.get("onednn_attention", True):
        return False
    if os.environ.get(NATIVE_F32_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    return scores >= ONEDNN_F32_MIN


#: `ctx.cache` key of the oneDNN attention primitives shared by a program's blocks
ONEDNN_TABLE = "attention_onednn"
#: `ctx.cache` key of the native attention kernel's plans shared by a program's blocks
NATIVE_TABLE = "attention_native"


def _cpu_attention(ctx: LoweringContext, scale: float, dtype: torch.dtype) -> Attend | None:
    """Attention on the CPU: a bf16 block first as the native fused kernel
    (`native_attention.py`, unless `PGX_CPU_NATIVE_ATTENTION=0`), for the operands it takes;
    then oneDNN's primitives (`onednn_attention.py`) where its C API library is loaded; else
    torch's three steps for bf16 (`_bf16_attention`) and None for float32 (torch's fused
    kernel, `_sdpa`). Operands the primitives refuse go to that same fallback.
    `ctx.options["onednn_attention"] = False` asks for torch's route: neither the native
    kernel nor the primitives."""
    fallback = _bf16_attention(scale) if dtype == torch.bfloat16 else _sdpa(scale, dtype)
    if not ctx.options.get("onednn_attention", True):
        return fallback if dtype == torch.bfloat16 else None
    route = onednn_attention.attend(scale, ctx.cache.setdefault(ONEDNN_TABLE, {}), fallback)
    if dtype == torch.bfloat16 and native_attention.enabled():
        name = "torch's three bf16 steps" if route is fallback else "oneDNN's attention primitives"
        table = ctx.cache.setdefault(NATIVE_TABLE, {})
        return native_attention.attend(scale, table, route, dtype, name)
    return route


def _sdpa(scale: float, dtype: torch.dtype) -> Attend:
    sdpa = F.scaled_dot_product_attention

    def attend(
        q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if mask is not None and mask.dtype != dtype and mask.dtype != torch.bool:
            mask = mask.to(dtype)  # a float32 additive mask with bf16 / half products
        return sdpa(q, kt.transpose(-1, -2), v, attn_mask=mask, scale=scale)

    return attend


def _bf16_attention(scale: float) -> Attend:
    """The block as the bf16 program computes it: the scores a bf16 product, then scaled,
    masked and normalised in float32 (as `quantize_bf16`'s default keeps softmax), the
    probabilities rounded to bf16 for the second product."""
    matmul, softmax, bf16 = torch.matmul, torch.softmax, torch.bfloat16

    def attend(
        q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = matmul(q, kt).float().mul_(scale)
        if mask is not None:
            x.add_(mask)
        return matmul(softmax(x, -1).to(bf16), v)

    return attend


class SharedMask:
    """The additive mask of the blocks that read the same mask inputs (a model's layers do),
    computed at most once a run, when a block first asks for it (`mask`), and dropped after the
    last block; `unpadded`: whether the pattern's additive part is absent or all zero this run
    (computed once a run; a causal block then needs no mask at all, `causal_offset`). The first
    block in program order calls `begin` (forget the last run's), the last one `end`."""

    _UNSET = object()

    def __init__(self, make: Callable[[], torch.Tensor | None],
                 pad: Callable[[], torch.Tensor] | None) -> None:  # fmt: skip
        self.make, self.pad = make, pad
        self.value: object = self._UNSET
        self.zero: bool | None = None
        self.last: list[bool] | None = None

    def enrol(self, block: int) -> tuple[bool, list[bool]]:
        """(whether this block is the first, a cell saying whether it is the last) for a block
        lowered after the ones enrolled before (program order)."""
        first = self.last is None
        if self.last is not None:
            self.last[0] = False
        self.last = [True]
        return first, self.last

    def begin(self) -> None:
        self.value, self.zero = self._UNSET, None

    def end(self) -> None:
        self.value, self.zero = self._UNSET, None

    def mask(self) -> torch.Tensor | None:
        if self.value is self._UNSET:
            self.value = self.make()
        return self.value  # type: ignore[return-value]

    def unpadded(self) -> bool:
        if self.zero is None:
            self.zero = self.pad is None or not bool(self.pad().any())
        return self.zero


def _shared_mask(ctx: LoweringContext, key: tuple) -> SharedMask:
    """The `SharedMask` of the mask inputs `key` (keep, keep_true, fill, add, dtype)."""
    cells = ctx.cache.setdefault(MASKS, {})
    if key not in cells:
        keep, keep_true, fill, add, dtype = key
        make = _mask_fn(ctx.env, *key, compact=ctx.device.type == "cpu")
        pad = None
        if add is not None:
            env, cut = ctx.env, _compact if ctx.device.type == "cpu" else (lambda t: t)
            pad = lambda: cut(env[add])  # noqa: E731
        cells[key] = SharedMask(make, pad)
    return cells[key]


def _native_bf16(ctx: LoweringContext) -> bool:
    """Whether a bf16 block on the CPU route may take the native kernel (`_cpu_attention`)."""
    return ctx.options.get("onednn_attention", True) and native_attention.enabled()


def causal_offset(ctx: LoweringContext, p: Pattern, keep: int | None,
                  dot1: Instruction) -> int | None:  # fmt: skip
    """The offset `o` when the block's `where` keeps exactly the scores (i, j) with j <= i + o
    (o >= 0: every query row keeps a key), known at prepare time (a literal or a view of one,
    GPT-2's sliced lower triangle), the same for every batch and head, and fills the rest with
    `MASKED_FILL` or less; else None. Its additive part (a padding mask) is not looked at here:
    a block runs causal only in the runs where that part is all zero (`SharedMask.unpadded`)."""
    if keep is None or p.fill > MASKED_FILL:
        return None
    b = ctx.constant(keep)
    s, t = dot1.shape.lens()[-2], dot1.shape.lens()[-1]
    if b is None or b.dtype != torch.bool or b.dim() < 2 or tuple(b.shape[-2:]) != (s, t):
        return None
    if not p.keep_true:
        b = ~b
    offset = int(b.reshape(-1, s, t)[0, 0].sum()) - 1  # GPT-2's: t - s, the last s of t keys
    if offset < 0:
        return None
    want = torch.ones(s, t, dtype=torch.bool).tril(offset)
    return offset if bool((b == want).all()) else None


def _compact(t: torch.Tensor) -> torch.Tensor:
    """`t` with its broadcast axes (stride 0, length > 1) cut to length 1 (a view)."""
    if all(s != 0 or n == 1 for s, n in zip(t.stride(), t.shape, strict=True)):
        return t
    return t[tuple(slice(0, 1) if s == 0 else slice(None) for s in t.stride())]


def _mask_fn(
    env: list,
    keep: int | None,
    keep_true: bool,
    fill: float,
    add: int | None,
    dtype: torch.dtype,
    compact: bool,
) -> Callable[[], torch.Tensor | None]:
    """The additive attention mask of the pattern, computed per run (or None); a computed one
    with `compact` (the CPU, whose kernel broadcasts the mask itself) at the size of its
    inputs' broadcast-free views."""
    where = torch.where
    cut = _compact if compact else (lambda t: t)
    if keep is None and add is None:
        return lambda: None
    if keep is None:  # passed as it is: nothing to compute
        return lambda: env[add]
    if add is None:
        on, off = (0.0, fill) if keep_true else (fill, 0.0)
        return lambda: where(cut(env[keep]), on, off).to(dtype)

    def both() -> torch.Tensor:
        b, m = cut(env[keep]), cut(env[add])
        return where(b, m, m + fill) if keep_true else where(b, m + fill, m)

    return both


def with_attention(dot: Lowering, fused_reduce: Lowering) -> dict[str, Lowering]:
    """`dot` and `fused_reduce` lowerings that recognise attention first and otherwise lower
    as `dot` and `fused_reduce` do (a target's `lowering_overrides` entries)."""

    def lower_dot(ctx: LoweringContext, ins: Instruction) -> bool:
        return lower_attention_dot(ctx, ins, dot) or dot(ctx, ins)

    def lower_reduce(ctx: LoweringContext, ins: Instruction) -> bool:
        return lower_attention_softmax(ctx, ins, dot) or fused_reduce(ctx, ins)

    return {"dot": lower_dot, "fused_reduce": lower_reduce}
