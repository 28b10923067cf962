"""truncate_float: make an uncompiled program compute in half or bf16 (MIGraphX's quantize_fp16).

`quantize_fp16(prog)` and `quantize_bf16(prog)` rewrite a parsed (uncompiled) program in place,
before `compile`, as MIGraphX's `truncate_float` pass does:

* every computing instruction whose output is float32 or float64 takes its float inputs in the
  low type and computes in it; an instruction with a fixed output type (comparisons -> bool,
  argmax -> int64, convert to an integer) computes on the low-precision values it is given;
* a `convert` to float32/float64 in the graph becomes a `convert` to the low type;
* float parameters keep their type, with one `convert` to the low type right after each, and
  every float output is converted back to its original type before `@return`, so callers feed
  and receive the same dtypes as before;
* float literals (weights) become low-precision literals directly, a `convert` of a literal
  is folded into one, and a view of a literal (a broadcast scalar, left wide when the view's
  operator is not selected) becomes the same view of the low-precision literal, so no runtime
  conversion of constants is left;
* integer and bool computations that touch no converted value (token ids, gather indices, shape
  math, masks) are left exactly as they were.

Converting a literal saturates like MIGraphX's `convert` does: finite values beyond the low
type's range become its largest finite value (an attention mask built from
`finfo(float32).min` becomes -65504 in half rather than -inf, so `0 * mask` stays 0 and softmax
stays finite). Infinities and NaN are kept.

`ins_names` restricts the rewrite to instructions with those operator names (MIGraphX's
argument; `("all",)`, `quantize_fp16`'s default, selects every one); an instruction that is not
selected gets its inputs converted back to their original types. `"products"` (`PRODUCTS`,
`quantize_bf16`'s default) selects by data flow rather than by name, as OpenVINO's bf16 does:

* the products (`dot`, `convolution`, `deconvolution`) compute in the low type, their inputs
  and weights rounded to it, except a small head: a product of at most `HEAD_ELEMENTS` values
  that reach only the outputs (through element-wise steps), with at most `HEAD_WEIGHTS`
  constant values (read in float32: twice the bytes), such as BERT's pooler, stays in float32
  for next to no time, so its result is not rounded either, as OpenVINO returns its last
  product's result unrounded (BERT-base's pooler at batch 8: 5.6e-3 against float32 when
  rounded, OpenVINO 5.4e-3); a CNN's classifier (2M weights on ResNet-50, 0.25 ms more per
  run in float32, no better error) and a language model's vocabulary projection stay low;
* an instruction whose run-time float inputs (constants do not count) are all low-precision
  values computes in the low type too (a bias add, GELU, ReLU, a CNN's residual add of two
  convolutions, a scaled score);
* the rest stays in its float type: softmax and the reductions (`reduce_*`), anything with a
  float32 run-time input (a transformer's residual stream, adding a product to the float32
  sum; the layer norms that follow it; an attention mask), what reads only constants (an
  embedding gather), and the last step before an output (a classifier's bias add, a pooler's
  tanh: the outputs are float32 anyway);
* with `WIDE_TAIL` (the default; `PGX_BF16_WIDE_TAIL=0` turns it off), so does the graph's
  tail, as OpenVINO keeps it: the arithmetic after the last products on the way to an output
  (`graph_tail.py`; a product's own bias and activation stay with the product, data movement
  follows its inputs), e.g. a detector's box decoding (DFL distances plus anchor points, times
  the stride: values up to the image size, where bf16's ulp reaches 4 pixels); and a small
  head's walk to the outputs may pass through concatenations (the DFL's 16 -> 1 product, whose
  distances are concatenated with the class scores, stays float32). The YOLOv8-style
  detector's relative error against float32 goes from 4.1e-3 to 2.5e-3 (OpenVINO bf16 2.6e-3);
  the other bf16 programs of `cpu_vs_peers.py` are unchanged.

* with `CENTER_LAST_OUT` (the default; `PGX_BF16_CENTER_LAST_OUT=0` turns it off), the last
  attention's output projection (the product with a constant weight reading the last
  `softmax(...) @ v`, whose result is added to a residual) computes `(ctx - m) @ W` with `m`
  the mean of its input over the tokens, and `m @ W` (one row a sequence) is added to the
  residual in float32 (`centered_out.py`): the same value in exact arithmetic, but the error
  of the rounded weights on `m`, the same for every token, which a mean over the tokens keeps,
  is not made. On MiniLM (a sentence embedding: the mean over the tokens of the last layer) that
  projection's weight rounding is the largest single part of the bf16 error, as the last
  attention's context has a large mean; centred, the relative error against float32 on the
  zoo's sentences goes from 4.91e-3 to 4.73e-3 (OpenVINO bf16 4.89e-3), for 0.3-0.6 % more
  time on MiniLM and BERT-base (`benchmarks/results/acc16.md`).

A transformer then keeps its residual sums, layer norms and softmax in float32 and rounds only
the products' inputs and weights (BERT-base's relative error against float32 4.7e-3 rather
than 1.7e-2 with `"all"`), while a CNN, whose every activation comes from a convolution, runs
entirely in the low type as with `"all"`. Fused sub-modules (`pointwise`,
`fused_reduce` bodies, from `optimize`) are rewritten with their caller: their float
parameters become low-precision parameters and their bodies compute in the low type. A fused
instruction counts as selected when its own name or the name of any instruction in its body is.
"""

from __future__ import annotations

from collections.abc import Iterable

import ml_dtypes
import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.env import switch_on
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module, compute_shape
from pygraphx.ir.program import Program
from pygraphx.ir.shape import to_dtype
from pygraphx.ops.base import ViewOp
from pygraphx.ops.builtin import Param, Return
from pygraphx.ops.literal_views import view_source
from pygraphx.ops.pointwise import Convert, Pointwise
from pygraphx.passes.manager import run_passes
from pygraphx.passes.pipeline import optimize_passes
from pygraphx.quantize.centered_out import center_product
from pygraphx.quantize.graph_tail import MOVE_OPS, graph_tail, is_constant_view
from pygraphx.quantize.wide_constants import rounded

__all__ = ["PRODUCTS", "QuantizeError", "quantize_bf16", "quantize_fp16", "truncate_float"]

#: the types that are truncated
WIDE_FLOATS = frozenset({"float_type", "double_type"})
#: `ins_names` entry selecting by data flow (see the module docstring)
PRODUCTS = "products"
#: the operators `PRODUCTS` always computes in the low type
PRODUCT_OPS = frozenset({"dot", "convolution", "deconvolution"})
#: `PRODUCTS` keeps a product of at most this many values, with constant operands of at most
#: `HEAD_WEIGHTS` values, that feeds only the outputs (a pooler's head) in its float type (see
#: the module docstring)
HEAD_ELEMENTS = 1 << 16
HEAD_WEIGHTS = 1 << 20
#: the operators `PRODUCTS` always keeps in their float type
WIDE_OPS = frozenset(
    {
        "softmax",
        "logsoftmax",
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
    }
)
#: `PRODUCTS` keeps the graph's tail (the arithmetic after the last products on the way to an
#: output) in its float type, and lets a small head's walk pass concatenations (see the module
#: docstring); None: `PGX_BF16_WIDE_TAIL` decides when a program is quantized (on unless it is
#: 0 / off / false / no, which restores the earlier rule); True / False force it
WIDE_TAIL: bool | None = None
WIDE_TAIL_ENV = "PGX_BF16_WIDE_TAIL"


def wide_tail() -> bool:
    """Whether the graph's tail stays in its float type (`WIDE_TAIL`, else its variable)."""
    if WIDE_TAIL is not None:
        return WIDE_TAIL
    return switch_on(WIDE_TAIL_ENV)


#: `PRODUCTS` computes the last attention's output projection on its input's deviation from the
#: mean over the tokens, the mean's product in float32 (`centered_out.py`, see the module
#: docstring); None: `PGX_BF16_CENTER_LAST_OUT` decides when a program is quantized (on unless
#: 0 / off / false / no, which restores the earlier program); True / False force it
CENTER_LAST_OUT: bool | None = None
CENTER_LAST_OUT_ENV = "PGX_BF16_CENTER_LAST_OUT"


def center_last_out() -> bool:
    """Whether the last attention's output projection is centred (`CENTER_LAST_OUT`, else its
    variable)."""
    if CENTER_LAST_OUT is not None:
        return CENTER_LAST_OUT
    return switch_on(CENTER_LAST_OUT_ENV)


def last_attention_out(module: Module) -> Instruction | None:
    """The product with a constant weight that reads (through views and copies) the last
    attention's `softmax(...) @ v` product of `module`, or None."""
    pv = None
    for ins in module.instructions:
        if ins.op.name != "dot" or any(is_constant_view(x) for x in ins.inputs):
            continue
        if _through_moves(ins.inputs[0]).op.name == "softmax":
            pv = ins
    if pv is None:
        return None
    todo = list(pv.outputs)
    while todo:
        user = todo.pop()
        if user.op.name == "dot":
            a, b = user.inputs
            return user if is_constant_view(b) and not is_constant_view(a) else None
        if isinstance(user.op, ViewOp) or user.op.name in MOVE_OPS:
            todo.extend(user.outputs)
    return None


def _through_moves(ins: Instruction) -> Instruction:
    """Where a chain of one-input views / copies / converts ending at `ins` starts."""
    while (
        isinstance(ins.op, ViewOp) or ins.op.name in ("contiguous", "convert")
    ) and len(ins.inputs) == 1:
        ins = ins.inputs[0]
    return ins


#: the types a program may be truncated to
LOW_FLOATS = frozenset({"half_type", "bf16_type"})


class QuantizeError(ValueError):
    """The program cannot be quantized as asked (compiled already, bad arguments, ...)."""


def quantize_fp16(prog: Program, ins_names: Iterable[str] = ("all",)) -> None:
    """Rewrite the uncompiled `prog` in place to compute in half precision (`half_type`).

    Parameters and outputs keep their types (converts are inserted at the edges), so callers
    pass and get the same arrays as before.

    Args:
        prog: a parsed, not yet compiled program.
        ins_names: which instructions to convert: `("all",)`, or names of operators.

    Raises:
        QuantizeError: `prog` is not a program, or is already compiled.

    Example:
        >>> prog = pygraphx.parse_onnx("model.onnx")
        >>> pygraphx.quantize_fp16(prog)
        >>> prog.compile(pygraphx.get_target("gpu"))
    """
    truncate_float(prog, "half_type", ins_names)


def quantize_bf16(prog: Program, ins_names: Iterable[str] = (PRODUCTS,)) -> None:
    """Rewrite the uncompiled `prog` in place to compute in bfloat16 (`bf16_type`); as
    `quantize_fp16`, with bfloat16's range (that of float32) and fewer mantissa bits.

    By default (`ins_names=("products",)`, see the module docstring) the matrix products and
    convolutions, and what computes only on their results, run in bf16, while softmax,
    reductions and values mixed with float32 ones (residual sums, layer norms) stay float32;
    `("all",)` converts every instruction.

    The program is simplified first in its own float types (`simplify=True`, as MIGraphX's
    quantize optimises before truncating): constants are folded and batch normalisations
    folded into the convolutions' weights at full precision, so each folded weight is rounded
    to bf16 once rather than after every step of the folding (on MobileNetV2 this takes the
    relative error against float32 from 5.2e-2 to 3.7e-2).

    Example:
        >>> pygraphx.quantize_bf16(prog)
    """
    truncate_float(prog, "bf16_type", ins_names, simplify=True)


def truncate_float(
    prog: Program,
    target_type: str = "half_type",
    ins_names: Iterable[str] = ("all",),
    simplify: bool = False,
    center: bool | None = None,
) -> None:
    """Rewrite the uncompiled `prog` in place so its float32/float64 work runs in `target_type`.

    Parameters and outputs keep their types; see the module docstring for the rules. With
    `simplify`, the target-independent simplifications (constant folding, algebra, no fusion)
    run first, at the program's own precision. `center`: whether the last attention's output
    projection is centred (None: `center_last_out()`, read once here)."""
    if not isinstance(prog, Program):
        raise QuantizeError(f"expected a pygraphx Program, got {type(prog).__name__}")
    if target_type not in LOW_FLOATS:
        raise QuantizeError(
            f"cannot truncate floats to {target_type!r}; choose one of {sorted(LOW_FLOATS)}"
        )
    if prog.is_compiled() or prog.target is not None:
        target = prog.target.name if prog.target is not None else "a target"
        raise QuantizeError(
            f"the program is already compiled for {target!r}; quantize the parsed program "
            "before prog.compile(...) (as MIGraphX does), e.g. quantize_fp16(prog) then "
            "prog.compile(pygraphx.get_target(...))"
        )
    if isinstance(ins_names, str):
        ins_names = (ins_names,)
    names = frozenset(ins_names)
    if not names or not all(isinstance(n, str) for n in names):
        raise QuantizeError(f"ins_names must be operator names (or 'all'), got {ins_names!r}")
    if simplify:
        run_passes(prog, optimize_passes(fuse=False, plan_memory=False))
    # the switches as they are now, also for the shapes the program specializes to later
    center = center_last_out() if center is None else center
    _Truncate(prog, target_type, names, center).run()
    # re-applied to the shapes a program with dynamic dimensions specializes to
    prog.transforms.append(lambda p: truncate_float(p, target_type, names, simplify, center))


def low_precision_array(arr: np.ndarray, target_type: str) -> np.ndarray:
    """`arr` in `target_type`, finite values saturated to its range (inf and NaN are kept)."""
    dtype = to_dtype(target_type)
    arr = np.asarray(arr)
    if arr.dtype.kind in "fiu" and arr.size:
        top = float(ml_dtypes.finfo(dtype).max)
        wide = arr if arr.dtype.kind == "f" else arr.astype(np.float64)
        finite = np.isfinite(wide)
        if np.any(np.abs(wide[finite]) > top):
            arr = np.where(finite, np.clip(wide, -top, top), wide)
    return arr.astype(dtype, order="C")  # (np.ascontiguousarray makes a scalar 1-d)


def _is_wide(ins: Instruction) -> bool:
    return ins.shape.type() in WIDE_FLOATS


class _Truncate:
    """One rewrite of one program: value maps shared by every module it touches."""

    def __init__(
        self, program: Program, low: str, names: frozenset[str], center: bool = False
    ) -> None:
        self.program = program
        self.low = low
        self.names = names
        # an instruction -> the instruction now computing its value in another type
        self.repl: dict[Instruction, Instruction] = {}
        # a value kept in its wide type -> its low-precision copy (convert or literal)
        self.low_copy: dict[Instruction, Instruction] = {}
        # a replaced value -> a convert of its replacement back to the original type
        self.orig_copy: dict[Instruction, Instruction] = {}
        # a low-precision copy -> the wide value it copies
        self.copy_of: dict[Instruction, Instruction] = {}
        self.dead: dict[str, list[Instruction]] = {}
        self.main = program.get_main_module()
        self.bodies: set[str] = set()  # sub-modules rewritten
        self.kept_bodies: set[str] = set()  # sub-modules of unselected callers
        # `WIDE_TAIL`: the main module's tail arithmetic, kept in its float type
        self.wide_tail = wide_tail() and PRODUCTS in names
        self.tail = graph_tail(self.main, PRODUCT_OPS) if self.wide_tail else set()
        # `CENTER_LAST_OUT`: the last attention's output projection on its centred input, the
        # mean's product kept in its float type
        self.wide_products: set[Instruction] = set()
        last_out = last_attention_out(self.main) if center and PRODUCTS in names else None
        # (a projection the products rule keeps wide anyway, a small head, gains nothing)
        if last_out is not None and not self.small_head(last_out):
            mean_product = center_product(self.main, last_out)
            if mean_product is not None:
                self.wide_products.add(mean_product)

    # --- driver ---------------------------------------------------------------------------
    def run(self) -> None:
        main = self.program.get_main_module()
        self.rewrite_module(main, top=True)
        for mod in self.program.modules.values():
            mod.memory_plan = None  # planned for the old instructions and sizes
        self.program.validate()

    def selected(self, ins: Instruction) -> bool:
        if "all" in self.names or ins.op.name in self.names:
            return True
        if PRODUCTS in self.names and self.follows_products(ins):
            return True
        return any(self.selected(i) for body in ins.module_inputs for i in body.instructions)

    def follows_products(self, ins: Instruction) -> bool:
        """`PRODUCTS`: `ins` is a product, or every run-time float input of it is already a
        low-precision value (and it is no softmax, reduction or call of a sub-module)."""
        name = ins.op.name
        if name in PRODUCT_OPS:
            return not self.small_head(ins) and ins not in self.wide_products
        if name in WIDE_OPS or ins.module_inputs or ins in self.tail:
            return False
        if ins.module is self.main and ins.outputs and all(u.is_return() for u in ins.outputs):
            return False  # the last element-wise step before an output: at full precision
        floats = [
            x for x in ins.inputs if (x in self.repl or _is_wide(x)) and not is_constant_view(x)
        ]
        return bool(floats) and all(x in self.repl for x in floats)

    def small_head(self, ins: Instruction) -> bool:
        """`ins` (a product of the main module) yields at most `HEAD_ELEMENTS` values that reach
        only the outputs, through element-wise steps and views (and, with `wide_tail()`,
        concatenations): a classifier or pooler head, a detector's DFL product."""
        if ins.module is not self.main or ins.shape.elements() > HEAD_ELEMENTS:
            return False
        weights = [view_source(x) for x in ins.inputs if is_constant_view(x)]
        if sum(w.shape.elements() for w in weights) > HEAD_WEIGHTS:
            return False
        todo, seen = list(ins.outputs), set()
        while todo:
            user = todo.pop()
            if user.is_return() or id(user) in seen:
                continue
            moves = self.wide_tail and user.op.name in MOVE_OPS
            if not (moves or isinstance(user.op, Pointwise | ViewOp)) or user.module_inputs:
                return False
            seen.add(id(user))
            todo.extend(user.outputs)
        return True

    def rewrite_module(self, module: Module, top: bool) -> None:
        self.dead.setdefault(module.name, [])
        last = module.instructions[-1] if module.instructions else None
        for ins in list(module.instructions):
            if ins.is_literal():
                continue  # converted when a selected instruction uses it
            if ins.is_param():
                if not top and _is_wide(ins):
                    self.retype_parameter(module, ins)
            elif ins.is_return():
                self.rewrite_return(module, ins, top)
            else:
                self.rewrite_instruction(module, ins)
        if top and last is not None and not last.is_return() and last in self.repl:
            # no @return: the last instruction is the output, so keep its type
            module.add_instruction(Convert(target_type=last.shape.type()), [self.repl[last]])
        self.remove_dead(module)

    def remove_dead(self, module: Module) -> None:
        module.remove_instructions(set(self.dead.pop(module.name, [])))
        # wide literals (and views of them) whose every user now takes the low-precision copy,
        # removed from the last view back to the literal
        wide = {x for x in self.low_copy if x.module is module and is_constant_view(x)}
        while unused := {x for x in wide if not x.outputs}:
            module.remove_instructions(unused)
            wide -= unused

    # --- values ---------------------------------------------------------------------------
    def insert_after(self, x: Instruction) -> Instruction:
        """The instruction following `x` in its module (new work on `x` goes before it)."""
        mod = x.module
        return mod.instructions[mod.position(x) + 1]

    def low_value(self, x: Instruction) -> Instruction:
        """`x`'s value for a low-precision consumer."""
        if x in self.repl:
            return self.repl[x]
        if not _is_wide(x):
            return x
        if x not in self.low_copy:
            nxt = self.insert_after(x)
            if x.is_literal():
                wide = x.get_literal().array
                arr = low_precision_array(wide, self.low)
                self.low_copy[x] = x.module.insert_literal(nxt, rounded(arr, wide))
            elif is_constant_view(x):
                # a view (broadcast, reshape, ...) of a literal: the same view of the literal's
                # saturated copy, as a runtime convert would turn float32's extremes (a mask's
                # finfo.min) into bf16/half infinities, and 0 * inf into NaN
                low_src = self.low_value(x.inputs[0])
                self.low_copy[x] = x.module.insert_instruction(nxt, x.op, [low_src])
            else:
                self.low_copy[x] = x.module.insert_instruction(
                    nxt, Convert(target_type=self.low), [x]
                )
            self.copy_of[self.low_copy[x]] = x
        return self.low_copy[x]

    def orig_value(self, x: Instruction) -> Instruction:
        """`x`'s value in its original type (for outputs and unselected instructions)."""
        if x not in self.repl:
            return x
        y = self.repl[x]
        if y.shape.type() == x.shape.type():
            return y
        src = self.copy_of.get(y)
        if src is not None and src.shape.type() == x.shape.type():
            return src  # convert(convert(src)) back to src's own type: src itself
        if x not in self.orig_copy:
            back = Convert(target_type=x.shape.type())
            nxt = self.insert_after(y)
            if y.is_literal():
                arr = back.compute(x.shape, [y.get_literal().array])
                self.orig_copy[x] = y.module.insert_literal(nxt, Literal(arr, copy=False))
            else:
                self.orig_copy[x] = y.module.insert_instruction(nxt, back, [y])
        return self.orig_copy[x]

    # --- instructions ---------------------------------------------------------------------
    def retype_parameter(self, module: Module, ins: Instruction) -> None:
        """A fused body's float parameter becomes a low-precision one (its caller converts)."""
        shape = ins.shape.with_type(self.low)
        new = module.insert_instruction(ins, Param(ins.op.parameter, shape))
        self.repl[ins] = new
        self.dead[module.name].append(ins)

    def rewrite_return(self, module: Module, ins: Instruction, top: bool) -> None:
        if top:
            inputs = [self.orig_value(x) for x in ins.inputs]
        else:  # a body returns its low-precision values to its caller
            inputs = [self.repl.get(x, x) for x in ins.inputs]
        if any(a is not b for a, b in zip(inputs, ins.inputs, strict=True)):
            module.replace_op(ins, Return(), inputs)

    def rewrite_instruction(self, module: Module, ins: Instruction) -> None:
        if not self.selected(ins):
            for body in ins.module_inputs:
                self.keep_body(body)
            inputs = [self.orig_value(x) for x in ins.inputs]
            if any(a is not b for a, b in zip(inputs, ins.inputs, strict=True)):
                module.replace_op(ins, ins.op, inputs)
            return
        op = ins.op
        retarget = isinstance(op, Convert) and op.target_type in WIDE_FLOATS
        if not (
            _is_wide(ins) or retarget or any(x in self.repl for x in ins.inputs)
        ):  # integer/bool work on unconverted values: untouched
            return
        inputs = [self.low_value(x) for x in ins.inputs]
        for body in ins.module_inputs:
            self.rewrite_body(body)
        if isinstance(op, Convert):
            op = Convert(target_type=self.low) if retarget else op
            src = inputs[0]
            if src.shape.type() == op.target_type:  # e.g. convert(half -> half): the value
                self.replace_with(module, ins, src)
                return
            if retarget and src.is_literal():  # fold: no runtime convert of constants
                arr = low_precision_array(src.get_literal().array, self.low)
                self.replace_with(module, ins, module.insert_literal(ins, Literal(arr)))
                return
        shape = compute_shape(op, inputs, ins.module_inputs)
        if shape.type() == ins.shape.type():
            if op != ins.op or any(a is not b for a, b in zip(inputs, ins.inputs, strict=True)):
                module.replace_op(ins, op, inputs)
            return
        new = module.insert_instruction(ins, op, inputs, ins.module_inputs)
        self.replace_with(module, ins, new)

    def replace_with(self, module: Module, ins: Instruction, new: Instruction) -> None:
        self.repl[ins] = new
        self.dead[module.name].append(ins)

    def keep_body(self, body: Module) -> None:
        """An unselected caller's sub-module stays as it is."""
        if body.name in self.bodies:
            raise _shared_body(body)
        self.kept_bodies.add(body.name)

    def rewrite_body(self, body: Module) -> None:
        """Rewrite a fused sub-module once, before its (selected) caller is rebuilt."""
        if body.name in self.kept_bodies:
            raise _shared_body(body)
        if body.name in self.bodies:
            return
        self.bodies.add(body.name)
        self.rewrite_module(body, top=False)


def _shared_body(body: Module) -> QuantizeError:
    return QuantizeError(
        f"sub-module {body.name!r} is called by both selected and unselected instructions; "
        "quantize before optimize(), or name both callers' operators in ins_names"
    )
