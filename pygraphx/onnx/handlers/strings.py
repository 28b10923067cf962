"""String operators: StringConcat, RegexFullMatch (run time), StringNormalizer and StringSplit
(their output lens depend on the strings, so their input must be known when the program is
built: a constant, or a graph input, whose values the program is then built for per run)."""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.sequence import Args
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.strings import (
    STRING,
    RegexFullMatch,
    StringConcat,
    string_normalize,
    string_split,
)


def _strings(ctx: NodeContext, ins: Instruction, what: str) -> Instruction:
    if ins.shape.type() != STRING:
        raise ctx.error(f"input {what!r} is {ins.shape.type()}, not a string tensor")
    return ins


@onnx_op("StringConcat", since=20)
def parse_string_concat(ctx: NodeContext, args: Args) -> Instruction:
    a = _strings(ctx, args[0], "X")
    b = _strings(ctx, args[1], "Y")
    return ctx.add(StringConcat(), *ctx.broadcast(a, b))


@onnx_op("RegexFullMatch", since=20)
def parse_regex_full_match(ctx: NodeContext, args: Args) -> Instruction:
    pattern = ctx.attr("pattern", "")
    if isinstance(pattern, bytes):
        pattern = pattern.decode("utf-8")
    return ctx.add(RegexFullMatch(pattern), _strings(ctx, args[0], "X"))


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@onnx_op("StringNormalizer", since=10)
def parse_string_normalizer(ctx: NodeContext, args: Args) -> Instruction:
    x = ctx.require_const(_strings(ctx, args[0], "X"), "X")
    stopwords = [_text(w) for w in (ctx.attr("stopwords", None) or ())]
    case = _text(ctx.attr("case_change_action", "NONE"))
    sensitive = bool(ctx.attr("is_case_sensitive", 0))
    return ctx.literal(string_normalize(x, case, sensitive, stopwords))


@onnx_op("StringSplit", since=20)
def parse_string_split(ctx: NodeContext, args: Args) -> list[Instruction]:
    x = ctx.require_const(_strings(ctx, args[0], "X"), "X")
    delimiter = ctx.attr("delimiter", None)
    maxsplit = ctx.attr("maxsplit", None)
    parts, counts = string_split(x, _text(delimiter) if delimiter is not None else None, maxsplit)
    return [ctx.literal(parts), ctx.literal(counts)]
