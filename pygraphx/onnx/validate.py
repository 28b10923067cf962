"""Structural checks of an ONNX model before it is parsed (frontend; runs in `parse_model`).

The handlers trust what these checks establish, so a malformed model is refused here with a
message naming the file, graph and node, instead of failing later with a raw Python error or,
worse, being read wrongly:

- every name and op type is text (protobuf hands undecodable UTF-8 over as bytes);
- each graph is in SSA form: no value is produced twice (two nodes, or a node and a graph
  input or initialiser, writing one name);
- no initialiser or tensor attribute has a negative dimension, and no tensor has more than
  2**48 elements (overflow);
- external data locations hold no NUL byte;
- every attribute of a standard ONNX operator has the type its schema declares (a FLOAT for
  Softmax's `axis`, an INT for If's `then_branch`, ...; an INT is accepted for a FLOAT).

Graphs nested in attributes (If/Loop/Scan bodies) are checked too, with an explicit stack (no
recursion, so a deeply nested model cannot exhaust Python's stack).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from math import prod

import onnx

from pygraphx.onnx.errors import OnnxParseError

#: the most elements a tensor of the model may have
MAX_ELEMENTS = 1 << 48


def validate_model(model: onnx.ModelProto, source: str) -> None:
    """Raise `OnnxParseError` for the first structural defect of `model` (see the docstring)."""
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        _check_text([imp.domain], f"{source}: opset import")
        if not 1 <= imp.version < 1 << 20:
            raise OnnxParseError(
                f"{source}: opset import {imp.domain or 'ai.onnx'!r} has version {imp.version}"
            )
        opsets[imp.domain or "ai.onnx"] = int(imp.version)
    stack: list[tuple[onnx.GraphProto, str]] = [(model.graph, "main graph")]
    while stack:
        graph, where = stack.pop()
        _check_graph(graph, f"{source}: {where}", opsets)
        for node in graph.node:
            for a in node.attribute:
                subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
                for g in subs:
                    stack.append((g, f"{where} > {a.name} of {node.op_type} {node.name!r}"))


def _check_graph(graph: onnx.GraphProto, where: str, opsets: dict[str, int]) -> None:
    produced: dict[str, str] = {}
    for init in graph.initializer:
        _check_tensor(init, f"{where}: initialiser {init.name!r}")
        produced[init.name] = "an initialiser"
    inputs: set[str] = set()
    for inp in graph.input:
        _check_text([inp.name], f"{where}: graph input")
        _check_value_dims(inp, f"{where}: graph input {inp.name!r}")
        if inp.name in inputs:
            raise OnnxParseError(f"{where}: graph input {inp.name!r} is declared twice")
        inputs.add(inp.name)
        produced.setdefault(inp.name, "a graph input")
    for k, node in enumerate(graph.node):
        label = f"{where}: node {node.name or k!r} ({node.op_type})"
        _check_text([node.name, node.op_type, node.domain, *node.input, *node.output], label)
        _check_attribute_types(node, opsets, label)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                _check_tensor(a.t, f"{label}: attribute {a.name!r}")
        for name in node.output:
            if not name:
                continue
            if name in produced:
                raise OnnxParseError(
                    f"{label}: output {name!r} is already produced by {produced[name]}; "
                    "an ONNX graph must assign each value once (SSA)"
                )
            produced[name] = f"node {node.name or k!r} ({node.op_type})"


@functools.lru_cache(maxsize=1024)
def _declared_types(op_type: str, version: int, domain: str) -> dict[str, int] | None:
    """Attribute name -> declared type of the standard operator at this opset, or None when
    there is none (looked up once per operator: building a schema's attribute table is about
    0.1 ms, and a network repeats a few operators many times)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    return {name: int(spec.type) for name, spec in schema.attributes.items()}


def _check_attribute_types(node: onnx.NodeProto, opsets: dict[str, int], label: str) -> None:
    domain = node.domain or "ai.onnx"
    if domain not in ("ai.onnx", "ai.onnx.ml") or domain not in opsets or not node.attribute:
        return
    declared = _declared_types(node.op_type, opsets[domain], node.domain)
    if declared is None:
        return  # not a standard operator at this opset: its handler (if any) decides
    for a in node.attribute:
        spec = declared.get(a.name)
        if spec is None or spec == a.type:
            continue
        if spec == onnx.AttributeProto.FLOAT and a.type == onnx.AttributeProto.INT:
            continue
        want = onnx.AttributeProto.AttributeType.Name(spec)
        got = (
            onnx.AttributeProto.AttributeType.Name(a.type)
            if a.type in onnx.AttributeProto.AttributeType.values()
            else str(a.type)
        )
        raise OnnxParseError(f"{label}: attribute {a.name!r} must be {want}, got {got}")


def _check_text(values: Iterable[object], where: str) -> None:
    for v in values:
        if not isinstance(v, str):
            raise OnnxParseError(f"{where}: name or op type {v!r} is not valid UTF-8 text")


def _check_dims(dims: list[int], where: str) -> None:
    if any(d < 0 for d in dims):
        raise OnnxParseError(f"{where}: negative dimension in {dims}")
    if prod(dims) > MAX_ELEMENTS:
        raise OnnxParseError(f"{where}: dims {dims} hold more than 2**48 elements")


def _check_tensor(tensor: onnx.TensorProto, where: str) -> None:
    _check_text([tensor.name], where)
    _check_dims(list(tensor.dims), where)
    for entry in tensor.external_data:
        if not isinstance(entry.value, str) or "\x00" in entry.value:
            raise OnnxParseError(
                f"{where}: external data {entry.key!r} {entry.value!r} holds a NUL byte or "
                "is not text; refused"
            )


def _check_value_dims(info: onnx.ValueInfoProto, where: str) -> None:
    tt = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tt.HasField("shape"):
        return
    # a negative dim_value in an input is read as an unknown dimension (some exporters write -1)
    dims = [int(d.dim_value) for d in tt.shape.dim if d.HasField("dim_value")]
    _check_dims([max(d, 1) for d in dims], where)
