"""The ONNX frontend: reads a model file or buffer and builds a `Program`.

`parse_onnx(path, **options)` and `parse_onnx_buffer(data, **options)` take MIGraphX's
onnx_options (`default_dim_value`, `map_input_dims`, `skip_unknown_operators`,
`print_program_on_error`). The walk is: check every node has a handler (one error lists all the
unsupported ones), turn initialisers into literals (external data read safely, see
`external_data.py`), inputs into parameters, then each node through its handler in order;
outputs become `@return`. Constant sub-graphs that handlers consumed as compile-time values
(shape-computing chains) are then removed as dead code.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

import pygraphx.onnx.handlers  # noqa: F401 - registers every handler
from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.errors import OnnxParseError, UnsupportedOperatorError
from pygraphx.onnx.external_data import load_external_tensor
from pygraphx.onnx.registry import find_handler
from pygraphx.passes.dead_code_elimination import dead_code_elimination

_OPTIONS = {
    "default_dim_value": 1,
    "map_input_dims": None,
    "skip_unknown_operators": False,
    "print_program_on_error": False,
}


def parse_onnx(path: str | Path, **options: Any) -> Program:
    """Parse the ONNX model file at `path` into a program."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise OnnxParseError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise OnnxParseError(f"{path}: is a directory, not an ONNX file") from None
    except PermissionError:
        raise OnnxParseError(f"{path}: permission denied") from None
    return _parse(data, str(path), path.resolve().parent, options)


def parse_onnx_buffer(data: bytes, **options: Any) -> Program:
    """Parse an ONNX model held in memory (external data is not allowed: it has no folder)."""
    return _parse(bytes(data), "<buffer>", None, options)


def _parse(data: bytes, source: str, model_dir: Path | None, options: dict[str, Any]) -> Program:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"unknown parse option(s) {unknown}; known: {sorted(_OPTIONS)}")
    opts = {**_OPTIONS, **options}
    model = load_model_proto(data, source)
    return OnnxParser(opts, source, model_dir).parse_model(model)


def load_model_proto(data: bytes, source: str) -> onnx.ModelProto:
    """Decode the protobuf; a truncated or corrupt file gets a clear message."""
    if not data:
        raise OnnxParseError(f"{source}: the file is empty, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        raise OnnxParseError(
            f"{source}: not a valid ONNX model (the protobuf cannot be decoded: {exc}); "
            "the file may be truncated or corrupt"
        ) from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxParseError(
            f"{source}: not a valid ONNX model (no graph, nodes or outputs); "
            "the file may be truncated, corrupt, or not ONNX"
        )
    if model.ir_version <= 0 or not model.opset_import:
        raise OnnxParseError(
            f"{source}: not a valid ONNX model (ir_version {model.ir_version}, "
            f"{len(model.opset_import)} opset imports); the file may be corrupt"
        )
    return model


def _iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _iter_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _iter_nodes(g)


class OnnxParser:
    """One parse of one model."""

    def __init__(self, options: Mapping[str, Any], source: str, model_dir: Path | None) -> None:
        self.options = options
        self.source = source
        self.model_dir = model_dir
        self.opsets: dict[str, int] = {}
        self.program = Program()
        self._const: dict[int, np.ndarray | None] = {}
        self._value_info: dict[str, onnx.ValueInfoProto] = {}

    # --- entry ----------------------------------------------------------------------------
    def parse_model(self, model: onnx.ModelProto) -> Program:
        for imp in model.opset_import:
            domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
            self.opsets[domain] = int(imp.version)
        self._check_supported(model.graph)
        main = self.program.get_main_module()
        try:
            outputs = self.parse_graph(model.graph, main, {})
            main.add_return(outputs)
            self.program.output_names = [o.name for o in model.graph.output]
            dead_code_elimination(main)
        except OnnxParseError:
            if self.options["print_program_on_error"]:
                print(self.program, file=sys.stderr)
            raise
        return self.program

    def _check_supported(self, graph: onnx.GraphProto) -> None:
        missing: dict[tuple[str, str, int], list[str]] = {}
        for node in _iter_nodes(graph):
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            opset = self.opsets.get(domain)
            if opset is None:
                raise OnnxParseError(
                    f"{self.source}: node {node.name!r} ({node.domain}::{node.op_type}) uses "
                    f"domain {node.domain!r}, which the model does not import"
                )
            if find_handler(domain, node.op_type, opset) is None:
                key = (domain or "ai.onnx", node.op_type, opset)
                missing.setdefault(key, []).append(node.name or f"<output {node.output[0]}>")
        if not missing:
            return
        if self.options["skip_unknown_operators"]:
            return
        lines = []
        for (domain, op_type, opset), names in sorted(missing.items()):
            shown = ", ".join(names[:5]) + (f", ... ({len(names)} nodes)" if len(names) > 5 else "")
            lines.append(f"  {domain}::{op_type} (opset {opset}): {shown}")
        raise UnsupportedOperatorError(
            f"{self.source}: {len(missing)} unsupported operator(s):\n"
            + "\n".join(lines)
            + "\n(see `pygraphx-driver onnx --list`; skip_unknown_operators=True parses anyway)",
            [(d, o, v, n) for (d, o, v), n in sorted(missing.items())],
        )

    # --- graphs ---------------------------------------------------------------------------
    def parse_graph(
        self,
        graph: onnx.GraphProto,
        module: Module,
        outer: Mapping[str, Instruction],
        input_shapes: Sequence[Shape] | None = None,
    ) -> list[Instruction]:
        """Add `graph` to `module`; returns the instructions of the graph's outputs."""
        values: dict[str, Instruction] = dict(outer)
        for vi in list(graph.value_info) + list(graph.output):
            self._value_info[vi.name] = vi
        initialised = set()
        for tensor in graph.initializer:
            values[tensor.name] = module.add_literal(
                Literal(self.tensor_to_array(tensor), copy=False)
            )
            initialised.add(tensor.name)
        k = 0
        for inp in graph.input:
            if inp.name in initialised:
                continue
            if input_shapes is not None:
                shape = input_shapes[k]
            else:
                shape = self._input_shape(inp)
            values[inp.name] = module.add_parameter(inp.name, shape)
            k += 1
        for node in graph.node:
            self._parse_node(node, module, values)
        outs = []
        for out in graph.output:
            if out.name not in values:
                raise OnnxParseError(f"{self.source}: graph output {out.name!r} is never produced")
            outs.append(values[out.name])
        return outs

    def _input_shape(self, inp: onnx.ValueInfoProto) -> Shape:
        map_dims = self.options["map_input_dims"] or {}
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise OnnxParseError(f"{self.source}: input {inp.name!r} is not a tensor")
        try:
            type_name = onnx_type_to_shape_type(tt.elem_type)
        except ValueError as exc:
            raise OnnxParseError(f"{self.source}: input {inp.name!r}: {exc}") from None
        if inp.name in map_dims:
            return Shape(type_name, [int(d) for d in map_dims[inp.name]])
        if not tt.HasField("shape"):
            raise OnnxParseError(
                f"{self.source}: input {inp.name!r} has no shape; give one with "
                f"map_input_dims={{'{inp.name}': [...]}}"
            )
        default = int(self.options["default_dim_value"]) or 1
        lens = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                lens.append(int(d.dim_value))
            else:
                lens.append(default)
        return Shape(type_name, lens)

    def _parse_node(
        self, node: onnx.NodeProto, module: Module, values: dict[str, Instruction]
    ) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets[domain]
        ctx = NodeContext(self, node, module, opset)
        args: list[Instruction | None] = []
        for name in node.input:
            if not name:
                args.append(None)
            elif name in values:
                args.append(values[name])
            else:
                raise ctx.error(f"input {name!r} is not produced by any earlier node or input")
        handler = find_handler(domain, node.op_type, opset)
        if handler is None:  # only reachable with skip_unknown_operators
            results = self._unknown(ctx, args)
        else:
            try:
                results = handler(ctx, args)
            except OnnxParseError:
                raise
            except (ValueError, TypeError, IndexError, KeyError, NotImplementedError) as exc:
                raise ctx.error(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(results, Instruction) or results is None:
            results = [results]
        names = list(node.output)
        for k, name in enumerate(names):
            if not name:
                continue
            if k >= len(results) or results[k] is None:
                raise ctx.error(f"the handler does not produce output {k} ({name!r})")
            values[name] = results[k]

    def _unknown(self, ctx: NodeContext, args: list[Instruction | None]) -> list[Instruction]:
        from pygraphx.ops.builtin import Unknown

        outs = []
        for name in ctx.node.output:
            vi = self._value_info.get(name)
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                raise ctx.error(
                    "unsupported operator skipped, but its output shape is unknown; "
                    "run onnx.shape_inference on the model first"
                )
            shape = self._input_shape(vi)
            op = Unknown(ctx.op_type, ctx.domain, shape)
            outs.append(ctx.module.add_instruction(op, [a for a in args if a is not None]))
        return outs

    def value_info(self, name: str) -> onnx.ValueInfoProto | None:
        """The declared type of value `name` (graph outputs and value_info), if any."""
        return self._value_info.get(name)

    # --- tensors and constants ------------------------------------------------------------
    def tensor_to_array(self, tensor: onnx.TensorProto) -> np.ndarray:
        if tensor.data_type == onnx.TensorProto.STRING:
            raise OnnxParseError(
                f"{self.source}: tensor {tensor.name!r}: string tensors are not supported"
            )
        try:
            onnx_type_to_shape_type(tensor.data_type)
        except ValueError as exc:
            raise OnnxParseError(f"{self.source}: tensor {tensor.name!r}: {exc}") from None
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return load_external_tensor(tensor, self.model_dir, self.source)
        try:
            arr = numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise OnnxParseError(
                f"{self.source}: tensor {tensor.name!r} is corrupt: {exc}"
            ) from None
        return np.asarray(arr, order="C")

    def const_value(self, ins: Instruction) -> np.ndarray | None:
        """Evaluate `ins` at parse time if it depends only on literals (memoised)."""
        key = id(ins)
        if key in self._const:
            return self._const[key]
        if ins.is_literal():
            value: np.ndarray | None = ins.get_literal().array
        elif ins.is_param() or ins.module_inputs or ins.op.name == "unknown":
            value = None
        else:
            args = [self.const_value(i) for i in ins.inputs]
            if any(a is None for a in args):
                value = None
            else:
                value = np.asarray(ins.op.compute(ins.shape, args))
        self._const[key] = value
        return value
