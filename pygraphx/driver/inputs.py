"""Valid test inputs for the driver's `run`, `time`, `perf` and `verify`.

Random integers are wrong for most integer inputs: token ids index an embedding table, token type
ids a table of two rows, attention masks are 0 or 1. `plan_inputs` reads the program to find what
consumes each integer input: it follows the input through operators that keep its values
(reshapes, broadcasts, integer converts, ...) to the `gather`s that use it as indices (the valid
range is the size of the gathered axis, the smallest over all of them) or to a convert to bool or
float (a mask: 0 or 1). `generate_inputs` then draws every input from its range and says what it
drew; `check_index_inputs` tells which input, node and range before a run that would index out
of bounds. `check_input_sizes` refuses inputs that cannot fit in this machine's memory before any
is allocated, and `seed_argument` is `--seed`'s type (a non-negative 64-bit integer).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pygraphx.ir.argument import Argument, generate_argument
from pygraphx.ir.instruction import Instruction, reachable
from pygraphx.ir.printer import instruction_names
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape

#: operators whose output holds the values of their first input (moved, repeated or selected)
VALUE_PRESERVING = {
    "reshape",
    "reshape_lazy",
    "squeeze",
    "unsqueeze",
    "flatten",
    "broadcast",
    "multibroadcast",
    "contiguous",
    "transpose",
    "slice",
    "identity",
    "concat",
}
#: operator -> (index of the input holding indices, attribute naming the indexed axis)
INDEXING = {"gather": 1, "gather_elements": 1}
INTEGER_TYPES = ("int8_type", "int16_type", "int32_type", "int64_type")
INTEGER_TYPES += ("uint8_type", "uint16_type", "uint32_type", "uint64_type")
DEFAULT_HIGH = 8  # generate_argument's integers are in [0, 8)
MAX_SEED = 2**63 - 1


@dataclass
class InputPlan:
    """How to draw one input: integers in [0, high) (`high` None: generate_argument's default)."""

    name: str
    shape: Shape
    high: int | None = None
    why: str = ""  # what consumes it: "indices of main:@18 gather (axis 0 of size 50)"
    node: str = ""  # the consuming node, for errors

    def describe(self) -> str:
        if self.high is None:
            return f"{self.name}: random"
        if self.high == 2 and self.why.startswith("a mask"):
            return f"{self.name}: 0/1 ({self.why})"
        return f"{self.name}: integers in [0, {self.high}) ({self.why})"


def _index_uses(ins: Instruction, names: dict[int, str]) -> list[tuple[int, str]]:
    """(valid exclusive bound, description) for every gather that takes `ins`'s values as
    indices, following value-preserving operators."""
    found: list[tuple[int, str]] = []
    for cur in reachable([ins], _value_preserving_users):
        for user in cur.outputs:
            name = user.op.name
            if name in INDEXING and len(user.inputs) > 1 and user.inputs[1] is cur:
                data = user.inputs[0].shape
                axis = int(getattr(user.op, "axis", 0))
                axis = axis + data.ndim() if axis < 0 else axis
                size = data.lens()[axis]
                label = names.get(id(user), name)
                found.append((size, f"indices of {label} {name} (axis {axis} of size {size})"))
    return found


def _value_preserving_users(ins: Instruction) -> list[Instruction]:
    """The users that pass `ins`'s values on unchanged (reshapes, integer converts, ...)."""
    return [u for u in ins.outputs if u.op.name in VALUE_PRESERVING or _int_convert(u)]


def _int_convert(ins: Instruction) -> bool:
    return ins.op.name == "convert" and ins.shape.type() in INTEGER_TYPES


def _mask_use(ins: Instruction, names: dict[int, str]) -> str | None:
    """`a mask: converted to bool by main:@38` when the input is only read as a truth value."""
    for user in ins.outputs:
        if user.op.name == "convert" and user.shape.type() in ("bool_type",):
            return f"a mask: converted to bool by {names.get(id(user), 'convert')}"
        if user.op.name == "convert" and user.shape.type() not in INTEGER_TYPES:
            return f"a mask: converted to {user.shape.type()} by {names.get(id(user), 'convert')}"
    return None


def plan_inputs(program: Program) -> dict[str, InputPlan]:
    """Every parameter of `main` and the range its values are drawn from."""
    main = program.get_main_module()
    names = instruction_names(main)
    plans: dict[str, InputPlan] = {}
    for param in main.get_parameters():
        name, shape = param.op.parameter, param.shape
        plan = InputPlan(name, shape)
        if shape.type() in INTEGER_TYPES:
            uses = _index_uses(param, names)
            if uses:
                plan.high, plan.why = min(uses)
                plan.node = plan.why
            else:
                mask = _mask_use(param, names)
                if mask is not None:
                    plan.high, plan.why = 2, mask
        plans[name] = plan
    return plans


def generate_inputs(
    plans: dict[str, InputPlan], shapes: dict[str, Shape], seed: int
) -> tuple[dict[str, Argument], list[str]]:
    """Seeded random inputs of `shapes`, integers drawn from their plan's range; and one line per
    input whose range comes from the program."""
    inputs: dict[str, Argument] = {}
    notes: list[str] = []
    for k, (name, shape) in enumerate(shapes.items()):
        plan = plans.get(name)
        if plan is None or plan.high is None:  # each input its own stream
            inputs[name] = generate_argument(shape, seed + k)
            continue
        rng = np.random.default_rng(seed + k)
        data = rng.integers(0, plan.high, shape.lens()).astype(shape.dtype())
        inputs[name] = Argument(data, shape)
        notes.append(plan.describe())
    return inputs, notes


def seed_argument(text: str) -> int:
    """`--seed`'s argparse type: an integer in [0, 2**63 - 1] (argparse reports the message)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63 - 1], got {seed}")
    return seed


def physical_memory() -> int | None:
    """Bytes of memory this machine has (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_input_sizes(shapes: Mapping[str, Shape], limit: int | None = None) -> None:
    """A `ValueError` naming the input, its shape and its bytes when the inputs to generate need
    more than `limit` bytes (default: this machine's memory); checked before any is allocated."""
    limit = physical_memory() if limit is None else limit
    if limit is None:
        return
    total = 0
    for name, shape in shapes.items():
        nbytes = shape.elements() * shape.type_size()
        total += nbytes
        if nbytes > limit:
            raise ValueError(
                f"input {name!r} ({shape.type()} {shape.lens()}) needs {nbytes:,} bytes, more than "
                f"this machine's memory ({limit:,} bytes); give it smaller dimensions "
                f"(--input-dim @{name} ...)"
            )
    if total > limit:
        raise ValueError(
            f"the inputs need {total:,} bytes together, more than this machine's memory "
            f"({limit:,} bytes); give them smaller dimensions (--input-dim)"
        )


def check_index_inputs(plans: dict[str, InputPlan], inputs: dict[str, Argument]) -> None:
    """A `ValueError` naming the input, the node and the valid range when an input's values
    fall outside the range of the gather that takes them as indices (negative indices count
    from the end, as in ONNX)."""
    for name, plan in plans.items():
        if not plan.node or name not in inputs:
            continue
        values = np.asarray(inputs[name])
        if values.size == 0:
            continue
        low, high = int(values.min()), int(values.max())
        if low < -plan.high or high >= plan.high:
            bad = high if high >= plan.high else low
            raise ValueError(
                f"input {name!r} holds {bad}, outside [-{plan.high}, {plan.high}): it is used "
                f"as {plan.why}"
            )


__all__ = [
    "DEFAULT_HIGH",
    "InputPlan",
    "check_index_inputs",
    "check_input_sizes",
    "generate_inputs",
    "plan_inputs",
    "seed_argument",
]
