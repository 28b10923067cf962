"""A 2-D float32 or bf16 convolution as a oneDNN primitive made once, run with only pointers
changing (the primitive itself, its descriptors, post-ops and packed weight:
`onednn_conv_primitive.py`).

`torch.ops.mkldnn._convolution_pointwise` (the `onednn` kernel of `conv_kernels.py`) looks its
primitive up again on every call through ideep: 25-55 us per call on the 2-core EPYC, about a
quarter of MobileNetV2's time at batch 1. Here the primitive descriptor, the primitive, its
memory objects and its scratchpad are made once, at prepare, through oneDNN's C API
(`onednn_capi.py`); a call sets the input's and output's data pointers and executes. A layer
writing its arena slot gets a leaner closure (`_run_into`): pointers set only when a tensor
changes, the execution's arguments bound once (a step's Python runs cold in a network).

The layouts are those of the other kernels: activations channels-last (oneDNN's `nhwc`), a new
channels-last output per call, the weight reordered once into the layout oneDNN chose for the
layer. Asymmetric padding is oneDNN's own (`padding_l` / `padding_r`), so the input is not
padded first. The epilogue is post-ops in the order the graph computes it: the add operand
(a binary `add`, or a `sum` into the operand's own memory when `ConvPlan.in_place`), then
the activation (`relu`, `hardtanh` = clip(lo, hi), or `swish`); or, `ConvPlan.add_after`
(YOLO's C2f shortcut, silu(conv + bias) + x), the activation first and the add after it.
A network's NCHW input is converted by a oneDNN reorder made once (5x faster than torch's
`contiguous` on a 3-channel image). `benchmarks/onednn_conv_probe.py` measures the kernel
against the `onednn` one.

oneDNN offers several implementations of a layer and takes the first that applies
(`implementations` lists them). A plan naming another one (`ConvPlan.impl`, the measured
choice of `conv_choice.py`) gets that one: its descriptor is moved there with
`dnnl_primitive_desc_next_impl` and its primitive made with oneDNN's primitive cache off (in
oneDNN 3.2 a cached primitive of the same layer, at the first implementation, comes back
otherwise); a name oneDNN does not offer (a choice cached by another library version) runs the
first, said once.

A bf16 layer (the weight is bf16: `quantize_bf16`) runs in bf16 end to end: source, weight and
destination bf16, the bias in its own type (bf16 or float32), the add operand of the
destination's type; oneDNN accumulates in float32 and applies the post-ops before rounding to
bf16 once. It takes oneDNN's native kernels (`brgconv_1x1` / `brdgmm_dw` / `jit_bf16` on
`avx512_core_bf16`, or AMX) with the weight packed once in bf16, and only on a CPU with bf16
instructions (`supports`): elsewhere oneDNN would run a slow reference kernel.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from operator import itemgetter

import torch

from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
from pygraphx.targets.torch_lowering.onednn_capi import (
    OneDnnError,
    Runtime,
    check,
    primitive_cache_off,
    runtime,
    unavailable_reason,
)
from pygraphx.targets.torch_lowering.onednn_conv_primitive import (  # noqa: F401 (re-exported)
    DTYPES,
    UNARY,
    ConvPlan,
    Descriptor,
    Primitive,
    geometry,
)

Tensor = torch.Tensor
Getter = Callable[[], Tensor]
log = logging.getLogger("pygraphx.cpu")
_SAID: set[str] = set()  # warnings given once per process


def supports(plan: ConvPlan) -> bool:
    """Whether a primitive here can run `plan` with its whole epilogue: float32, or bf16 on a
    CPU with bf16 instructions."""
    dtype_ok = plan.weight.dtype == torch.float32 or (
        plan.weight.dtype == torch.bfloat16 and cpu_has_bf16()
    )
    dw = plan.dw
    dw_ok = dw is None or (
        dw.weight.dtype == plan.weight.dtype and (dw.unary == "none" or dw.unary in UNARY)
    )
    return dtype_ok and dw_ok and (plan.unary == "none" or plan.unary in UNARY)


def implementations(plan: ConvPlan, other: bool) -> list[str]:
    """The names of the implementations oneDNN offers for `plan` (with its epilogue; `other`:
    an add operand), in its order of preference, reference kernels left out."""
    rt = runtime()
    if rt is None:
        raise OneDnnError(f"oneDNN's C API library is not available: {unavailable_reason()}")
    with primitive_cache_off(rt.lib):
        names = Descriptor(rt, plan, other, None).impls()
    return [n for n in dict.fromkeys(names) if not n.startswith("ref")]


def first_implementation(plan: ConvPlan) -> str:
    """The implementation oneDNN takes for `plan` (no add operand) at this thread count: for
    a fused 1x1 + depthwise pair `jit_1x1:...` runs them as one kernel, `ref_fused_convolution`
    as two primitives one after the other (`conv_dw_fusion` fuses only the first)."""
    rt = _runtime_for([plan])
    desc = Descriptor(rt, plan, False, None)  # (its descriptor lives while it does)
    return rt.impl_name(desc.pd)


def available() -> bool:
    """Whether oneDNN's C API library is loaded (see `onednn_capi.library`)."""
    return runtime() is not None


def build(
    plan: ConvPlan, get_x: Getter, get_other: Getter | None, out: Tensor | None = None
) -> Callable[[], Tensor]:
    """A closure running `plan` on `get_x()` (and the add operand `get_other()`) through a
    primitive made now; it returns a new channels-last tensor (or, `plan.in_place`, the add
    operand with the result written over it; or `out`, a channels-last tensor of the result's
    lens and type, such as its arena slot, written every call: no allocation, no copy).

    oneDNN fixes a primitive's thread count when it is made (its kernels split the work for
    that many threads and start a team that size), so a primitive is made for each thread
    count the closure is called under (`torch.get_num_threads()`): the one of now, at
    prepare, and others at their first call (a step the cpu target runs on fewer threads)."""
    rt = _runtime_for([plan])
    other = get_other is not None
    made: dict[int, Primitive] = {}
    threads = torch.get_num_threads

    def primitive() -> Primitive:
        n = threads()
        prim = made.get(n)
        if prim is None:
            share = next(iter(made.values()), None)
            prim = made[n] = Primitive(rt, plan, other, share)
            if out is not None and not plan.in_place:  # the output's address never changes
                prim.point(prim.dst, 1, out.data_ptr())
        return prim

    _say_if_reference(plan, primitive().impl)
    cl, out_lens, dtype = torch.channels_last, made[threads()].out_lens, plan.weight.dtype
    if out is not None and not _fits(out, out_lens, dtype):
        raise OneDnnError(f"output buffer {list(out.shape)} {out.dtype}: expected a "
                          f"channels-last {out_lens} {dtype}")  # fmt: skip

    def source(p: Primitive, x: Tensor) -> Tensor:
        if x.is_contiguous(memory_format=cl):
            return x
        if x.is_contiguous() and list(x.shape) == p.x_lens:
            return p.channels_last(x)  # a network's NCHW input
        return x.contiguous(memory_format=cl)

    if out is not None and not plan.in_place and LEAN_CLOSURE:
        return _run_into(made, primitive, (get_x, get_other), source, out)
    n_, c_, h_, w_ = out_lens
    strides = (c_ * h_ * w_, 1, w_ * c_, c_)  # channels-last: `empty_strided` is 0.6 us faster
    empty = torch.empty_strided

    def run() -> Tensor:
        p = primitive()
        x = source(p, get_x())
        if plan.in_place and other:  # oneDNN's sum: the result lands in the add operand
            y = _channels_last(get_other())
        else:
            y = out if out is not None else empty(out_lens, strides, dtype=dtype)
            if other:  # (`o` holds a converted operand until the primitive has read it)
                o = _channels_last(get_other())
                p.point(p.other, 2, o.data_ptr())
        p.execute(x, y)
        return y

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitive (tests)
    return run


#: `build` gives a layer with no add operand that writes its arena slot the lean closure of
#: `_run_into` (False: the general one; for A/B, `benchmarks/mnv2b1_ab.py`)
LEAN_CLOSURE = True


def _run_into(
    made: dict[int, Primitive],
    primitive: Callable[[], Primitive],
    getters: tuple[Getter, Getter | None],
    source: Callable[[Primitive, Tensor], Tensor],
    out: Tensor,
) -> Callable[[], Tensor]:
    """`build`'s closure for a layer writing `out` (its arena slot): the output's address is
    set once per primitive, and the source's layout and address (and the add operand's) are
    checked and set only when the getter returns another tensor than at the last call (an
    arena slot is the same tensor every run). In a network each step's Python runs cold (the
    layer's data went through the caches since the last run): MobileNetV2 at batch 1, one
    thread, 13 -> 10 us of thread CPU a convolution step besides oneDNN's own call (with the
    measuring); `benchmarks/results/mnv2b1.md`."""
    threads, ref = torch.get_num_threads, weakref.ref
    get_x, get_other = getters
    # a getter that says which list slot it reads (`conv_steps.env_getter`) is read in C
    env, index = getattr(get_x, "slot", (None, None))
    fetch = (lambda _: get_x()) if env is None else itemgetter(index)

    def run() -> Tensor:
        p = made.get(threads()) or primitive()
        x = fetch(env)
        seen = p.seen
        if seen is None or seen() is not x:
            x = source(p, x)  # (held until the primitive has read it)
            p.point(p.src, 0, x.data_ptr())
            p.seen = ref(x)
        if get_other is not None:
            o = get_other()
            seen = p.seen_other
            if seen is None or seen() is not o:
                o = _channels_last(o)
                p.point(p.other, 2, o.data_ptr())
                p.seen_other = ref(o)
        status = p.call()
        if status:
            check(status, "convolution")
        return out

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitive (tests)
    run.writes = out  # type: ignore[attr-defined]  # (`conv_steps.into`: nothing to copy)
    run.link = Link(primitive, get_x, get_other, source)  # type: ignore[attr-defined]
    return run


class Link:
    """What `conv_chain` needs to run a lean closure's layer inside a chain of them: its
    primitive for the current thread count (made at the first call under it), the getters of
    its source and add operand, and `source(primitive, x)`, `x` as the channels-last tensor
    the primitive reads (`x` itself when it is one)."""

    __slots__ = ("primitive", "get_x", "get_other", "source")

    def __init__(
        self,
        primitive: Callable[[], Primitive],
        get_x: Getter,
        get_other: Getter | None,
        source: Callable[[Primitive, Tensor], Tensor],
    ) -> None:
        self.primitive = primitive
        self.get_x = get_x
        self.get_other = get_other
        self.source = source


def build_sum(
    plans: list[ConvPlan],
    get_xs: list[Getter],
    get_other: Getter | None,
    out: Tensor | None,
    before: Callable[[Tensor], None] | None = None,
) -> Callable[[], Tensor]:
    """A closure running the convolutions `plans` on `get_xs()` into one output and summing
    them there: the parts of a concat along the channels into a 1x1 convolution, each with its
    slice of the weight's input channels, the concat never written (`conv_concat.py`). The
    first plan writes the output (with the bias), each later one adds into it (`accumulate`:
    oneDNN's sum post-op) and the last applies the epilogue (its add operand `get_other()`).
    The output is `out` (a channels-last tensor of the result's lens, written every call)
    or a new channels-last tensor; each primitive is made per thread count, as in `build`.
    `before(y)`, when given, writes the output first (the first plan then accumulates too)."""
    rt = _runtime_for(plans)
    if any(p.in_place for p in plans) or any(not p.accumulate for p in plans[1:]):
        raise OneDnnError("a sum chain's later convolutions accumulate, none in place")
    last = len(plans) - 1
    made: dict[int, list[Primitive]] = {}
    threads = torch.get_num_threads

    def primitives() -> list[Primitive]:
        n = threads()
        prims = made.get(n)
        if prims is None:
            share = next(iter(made.values()), [None] * len(plans))
            prims = made[n] = [
                Primitive(rt, p, get_other is not None and k == last, s)
                for k, (p, s) in enumerate(zip(plans, share, strict=True))
            ]
        return prims

    for plan, prim in zip(plans, primitives(), strict=True):
        _say_if_reference(plan, prim.impl)
    out_lens, dtype = made[threads()][0].out_lens, plans[0].weight.dtype
    if any(p.out_lens != out_lens for p in made[threads()]):
        raise OneDnnError(f"a sum chain's convolutions give different output lens: {out_lens}")
    if out is not None and not _fits(out, out_lens, dtype):
        raise OneDnnError(f"output buffer {list(out.shape)} {out.dtype}: expected a "
                          f"channels-last {out_lens} {dtype}")  # fmt: skip
    n_, c_, h_, w_ = out_lens
    strides = (c_ * h_ * w_, 1, w_ * c_, c_)
    empty = torch.empty_strided

    def run() -> Tensor:
        ps = primitives()
        y = out if out is not None else empty(out_lens, strides, dtype=dtype)
        if before is not None:
            before(y)
        xs = [_channels_last(get()) for get in get_xs]  # (held until every part is read)
        if get_other is not None:
            o = _channels_last(get_other())
            ps[last].point(ps[last].other, 2, o.data_ptr())
        for p, x in zip(ps, xs, strict=True):
            p.execute(x, y)
        return y

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitives (tests)
    return run


def _runtime_for(plans: list[ConvPlan]) -> Runtime:
    """oneDNN's runtime, checked to run every plan of `plans` (`OneDnnError` otherwise)."""
    rt = runtime()
    if rt is None:
        raise OneDnnError(f"oneDNN's C API library is not available: {unavailable_reason()}")
    for plan in plans:
        if not supports(plan):
            raise OneDnnError(f"no oneDNN primitive here for a {plan.unary!r} epilogue")
    return rt


def _channels_last(t: Tensor) -> Tensor:
    """`t`, or a dense channels-last copy of it."""
    cl = torch.channels_last
    return t if t.is_contiguous(memory_format=cl) else t.contiguous(memory_format=cl)


def _say_if_reference(plan: ConvPlan, impl: str) -> None:
    """Warn (once per process) when oneDNN runs a layer on its slow reference kernel (no JIT
    kernel for it on this processor; float32 layers never have)."""
    if plan.dw is not None and impl.startswith("ref_fused"):
        if "ref_fused" not in _SAID:  # (as fast as the two steps: the same numbers)
            _SAID.add("ref_fused")
            log.warning(
                "oneDNN runs the fused 1x1 + depthwise convolutions %s * %s at %d threads as "
                "two primitives (%s), not one kernel", plan.x_lens, list(plan.weight.shape),
                torch.get_num_threads(), impl,
            )  # fmt: skip
        return
    if impl.startswith("ref") and "ref" not in _SAID:
        _SAID.add("ref")
        log.warning(
            "oneDNN runs a %s convolution %s * %s on its reference kernel (slow: no JIT kernel "
            "for it on this processor)", plan.weight.dtype, plan.x_lens, list(plan.weight.shape)
        )  # fmt: skip


def _fits(t: Tensor, lens: list[int], dtype: torch.dtype) -> bool:
    """`t` is a dense channels-last tensor of `lens` and `dtype`."""
    return (
        list(t.shape) == lens
        and t.dtype == dtype
        and t.is_contiguous(memory_format=torch.channels_last)
    )


__all__ = [
    "UNARY",
    "Descriptor",
    "Link",
    "Primitive",
    "available",
    "build",
    "build_sum",
    "first_implementation",
    "geometry",
    "implementations",
    "supports",
]
