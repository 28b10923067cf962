"""The ONNX frontend: reads a model file or buffer and builds a `Program`.

`parse_onnx(path, **options)` and `parse_onnx_buffer(data, **options)` take MIGraphX's
onnx_options (`default_dim_value`, `map_input_dims`, `skip_unknown_operators`,
`print_program_on_error`, `max_loop_iterations`: see handlers/control.py). The walk is: check
every node has a handler (one error lists all the unsupported ones), turn initialisers into
literals (external data read safely, see `external_data.py`) and inputs into parameters (both
in `graph_inputs.py`), then each node through its handler in order;
outputs become `@return`. Every instruction a node's handler makes records the node
(`Instruction.source`, see `node_source_label`), so run-time errors name it. Constant
sub-graphs that handlers consumed as compile-time values (shape-computing chains) are then
removed as dead code.

Sub-graphs (If branches, Loop and Scan bodies; onnx/handlers/control.py) are parsed by the same
walk into sub-modules whose parent is the module of their node (`parse_subgraph`); their nodes
see every value of the enclosing scopes by name. Errors inside a sub-graph name the node and the
chain of sub-graphs it sits in. Values are instructions, or, for ONNX sequences and optionals,
compile-time `SequenceValue`/`OptionalValue` objects (onnx/handlers/sequence.py) that only the
handlers marked `takes_sequences` (and Identity) accept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

import pygraphx.onnx.handlers  # noqa: F401 - registers every handler
from pygraphx.ir.argument import Literal
from pygraphx.ir.file_read import read_regular_file
from pygraphx.ir.instruction import Instruction, node_source
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.errors import InputValueNeeded, OnnxParseError, UnsupportedOperatorError
from pygraphx.onnx.graph_inputs import GraphInputs, structured_input
from pygraphx.onnx.handlers.sequence import OptionalValue, SequenceValue, Value, describe
from pygraphx.onnx.mapped_model import read_model_mapped, split_buffer
from pygraphx.onnx.registry import find_handler
from pygraphx.onnx.schema import missing_required_inputs
from pygraphx.onnx.validate import validate_model
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.propagate_constant import fold_limit, too_large_to_fold

OPTIONS = {
    "default_dim_value": 1,
    "map_input_dims": None,
    "skip_unknown_operators": False,
    "print_program_on_error": False,
    # static length of a Loop's scan outputs when nothing else fixes it (control.py says how)
    "max_loop_iterations": 10,
    # graph inputs given values at parse time (they become literals, not parameters); used to
    # specialize models whose shapes depend on input values (see onnx/dynamic.py)
    "constant_inputs": None,
    # models whose shapes depend on input values compile per value at run time (onnx/dynamic.py);
    # False forbids it (such a model then fails to parse with InputValueNeeded)
    "specialize_on_input_values": True,
    # internal: a dict shared by the parses of one model (onnx/dynamic.py's specializations):
    # each initialiser is decoded once and its read-only array shared by every program
    "tensor_cache": None,
}

#: ops that pass any value through unchanged, sequences and optionals included
_PASS_THROUGH = {"Identity"}


def parse_onnx(path: str | Path, **options: Any) -> Program:
    """Parse the ONNX model file at `path` into a program."""
    path = Path(path)
    return parse_bytes(read_model_file(path), str(path), path.resolve().parent, options)


def read_model_file(path: Path, mapped: bool = True) -> bytes:
    """The bytes of the model file at `path`; a missing or unreadable file gets a clear error.
    With `mapped`, large initialisers are left in the file and the bytes refer to them as
    external data (`mapped_model.py`: the parse then holds no copy of the weights)."""
    if mapped and path.is_file():
        stripped = read_model_mapped(path)
        if stripped is not None:
            return stripped
    return read_regular_file(path, OnnxParseError, "an ONNX file")


def parse_onnx_buffer(data: bytes, **options: Any) -> Program:
    """Parse an ONNX model held in memory (external data is not allowed: it has no folder)."""
    return parse_bytes(bytes(data), "<buffer>", None, options)


def parse_bytes(
    data: bytes, source: str, model_dir: Path | None, options: dict[str, Any]
) -> Program:
    """Parse the model `data` read from `source`; external data is looked up in `model_dir`."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown parse option(s) {unknown}; known: {sorted(OPTIONS)}")
    opts = {**OPTIONS, **options}
    split = split_buffer(data)  # large initialisers stay in `data`: views, not copies
    model = load_model_proto(data if split is None else split[0], source)
    held = None if split is None else (data, split[1])
    return OnnxParser(opts, source, model_dir, held).parse_model(model)


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


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or f"<output {node.output[0] if node.output else '?'}>"


def node_source_label(node: onnx.NodeProto, index: int) -> str:
    """How run-time errors name the node (`Instruction.source`): `'layer1/conv2' Conv`, or
    `Conv #12` (its index in its graph) when it has no name; other domains prefix the op."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    op = f"{domain}::{node.op_type}" if domain else node.op_type
    return f"{node.name!r} {op}" if node.name else f"{op} #{index}"


def _iter_nodes(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[onnx.NodeProto, str]]:
    """Every node, sub-graphs included, with where it sits ('' in the main graph, else e.g.
    "body of Loop 'loop1' > then_branch of If 'if0'")."""
    for node in graph.node:
        yield node, where
        for a in node.attribute:
            graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else []
            if a.type == onnx.AttributeProto.GRAPHS:
                graphs = list(a.graphs)
            for g in graphs:
                inner = f"{a.name} of {node.op_type} {_node_label(node)!r}"
                yield from _iter_nodes(g, f"{where} > {inner}" if where else inner)


class OnnxParser(GraphInputs):
    """One parse of one model."""

    def __init__(
        self,
        options: Mapping[str, Any],
        source: str,
        model_dir: Path | None,
        held: tuple[bytes, set[tuple[int, int]]] | None = None,
    ) -> None:
        self.options = options
        self.source = source
        self.model_dir = model_dir
        # the model's bytes and the (offset, length) of the initialisers left in them
        self._held = held
        self.opsets: dict[str, int] = {}
        self.program = Program()
        # id(instruction) -> (instruction, value): holding the instruction keeps its id unique
        # even when the instruction is removed during the parse (discarded sub-modules, DCE)
        self._const: dict[int, tuple[Instruction, np.ndarray | None]] = {}
        self._value_info: dict[str, onnx.ValueInfoProto] = {}
        self._scope: list[str] = []  # sub-graphs being parsed, outermost first
        self._scope_values: list[dict[str, Value]] = []  # the name -> value map of each graph
        self._counters: dict[tuple[str, str], int] = {}  # (module, kind) -> next index

    # --- entry ----------------------------------------------------------------------------
    def parse_model(self, model: onnx.ModelProto) -> Program:
        for imp in model.opset_import:
            domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
            self.opsets[domain] = int(imp.version)
        validate_model(model, self.source)
        self._check_supported(model.graph)
        main = self.program.get_main_module()
        try:
            values = self.parse_graph(model.graph, main, {})
            outputs: list[Instruction] = []
            structure: list[int | None] = []
            for v, o in zip(values, model.graph.output, strict=True):
                out = self._output_tensor(v, o.name)
                structure.append(len(out) if isinstance(out, list) else None)
                outputs += out if isinstance(out, list) else [out]
            main.add_return(outputs)
            self.program.output_names = [o.name for o in model.graph.output]
            if any(k is not None for k in structure):
                self.program.output_structure = structure
            dead_code_elimination(main)
            self._remove_unused_modules()
        except OnnxParseError:
            if self.options["print_program_on_error"]:
                print(self.program, file=sys.stderr)
            raise
        return self.program

    def _output_tensor(self, value: Value, name: str) -> Instruction | list[Instruction]:
        """The tensor of a graph output, or the tensors of a sequence output (`Program.run`
        gives them back as a list)."""
        if isinstance(value, OptionalValue) and value.item is not None:
            value = value.item
        if isinstance(value, Instruction):
            return value
        if isinstance(value, SequenceValue):
            return list(value.items)
        raise OnnxParseError(
            f"{self.source}: graph output {name!r} is {describe(value)}: programs return "
            "tensors and sequences of tensors only"
        )

    def _remove_unused_modules(self) -> None:
        """Drop sub-modules that no instruction reaches from `main` any more (bodies of dead
        control-flow instructions)."""
        main = self.program.get_main_module()
        reached = {id(main)}
        stack = [main]
        while stack:
            for ins in stack.pop().instructions:
                for sub in ins.module_inputs:
                    if id(sub) not in reached:
                        reached.add(id(sub))
                        stack.append(sub)
        for name, mod in list(self.program.modules.items()):
            if id(mod) not in reached:
                self.program.remove_module(name)

    def _check_supported(self, graph: onnx.GraphProto) -> None:
        missing: dict[tuple[str, str, int], list[str]] = {}
        for node, where in _iter_nodes(graph):
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            opset = self.opsets.get(domain)
            inside = f" (in {where})" if where else ""
            if opset is None:
                raise OnnxParseError(
                    f"{self.source}: node {node.name!r} ({node.domain}::{node.op_type}){inside} "
                    f"uses domain {node.domain!r}, which the model does not import"
                )
            if find_handler(domain, node.op_type, opset) is None:
                key = (domain or "ai.onnx", node.op_type, opset)
                missing.setdefault(key, []).append(_node_label(node) + inside)
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
        outer: Mapping[str, Value],
        input_shapes: Sequence[Shape] | None = None,
        inputs: Sequence[Value] | None = None,
        names: dict[str, Value] | None = None,
    ) -> list[Value]:
        """Add `graph` to `module`; returns the values of the graph's outputs.

        `outer` holds the values of the enclosing scopes by name. The graph's inputs become
        parameters (with `input_shapes` when given, else their declared shapes), or, with
        `inputs`, are bound to those values (a sub-graph inlined into `module`). `names`, when
        given, receives every value of the graph by name."""
        values: dict[str, Value] = dict(outer)
        for vi in list(graph.value_info) + list(graph.output):
            # a sub-graph parsed again keeps shapes declared for it meanwhile (declare_shape)
            if vi.name not in self._value_info or not self.has_static_shape(vi.name):
                self._value_info[vi.name] = vi
        initialised = set()
        for tensor in graph.initializer:
            values[tensor.name] = module.add_literal(
                Literal(self.initializer_array(tensor), copy=False)
            )
            initialised.add(tensor.name)
        formal = [inp for inp in graph.input if inp.name not in initialised]
        if inputs is not None and len(inputs) != len(formal):
            raise OnnxParseError(
                f"{self.source}: graph {graph.name!r} takes {len(formal)} inputs, "
                f"{len(inputs)} given"
            )
        constants = self.options.get("constant_inputs") or {}
        for k, inp in enumerate(formal):
            if inputs is not None:
                values[inp.name] = inputs[k]
                continue
            if module.parent is None and inp.name in constants:
                values[inp.name] = self._constant_input(module, inp, constants[inp.name])
                continue
            if module.parent is None and inputs is None and structured_input(inp):
                raise InputValueNeeded(
                    f"{self.source}: input {inp.name!r} is a sequence or an optional: the "
                    "program is built per value at run time (specialize_on_input_values)",
                    {inp.name},
                )
            if input_shapes is not None:
                shape = input_shapes[k]
            else:
                shape = self.input_shape(inp)
            values[inp.name] = module.add_parameter(inp.name, shape)
        self._scope_values.append(values)
        try:
            for index, node in enumerate(graph.node):
                with node_source((node_source_label(node, index),)):
                    self._parse_node(node, module, values)
        finally:
            self._scope_values.pop()
            if names is not None:
                names.update(values)
        outs = []
        for out in graph.output:
            if out.name not in values:
                raise OnnxParseError(f"{self.source}: graph output {out.name!r} is never produced")
            outs.append(values[out.name])
        return outs

    # --- sub-graphs (used by the control-flow and sequence handlers) ----------------------
    def scope_values(self) -> dict[str, Value]:
        """The name -> value map of the graph being parsed (what a sub-graph sees as outer)."""
        return self._scope_values[-1]

    def parse_subgraph(
        self,
        graph: onnx.GraphProto,
        module: Module,
        outer: Mapping[str, Value],
        *,
        label: str,
        input_shapes: Sequence[Shape] | None = None,
        inputs: Sequence[Value] | None = None,
        names: dict[str, Value] | None = None,
    ) -> list[Value]:
        """`parse_graph` for a sub-graph; errors inside it say `(in <label> > ...)`, where
        `label` says which sub-graph of which node it is."""
        self._scope.append(label)
        try:
            return self.parse_graph(graph, module, outer, input_shapes, inputs, names)
        except OnnxParseError as exc:
            if not getattr(exc, "pgx_scoped", False) and exc.args:
                where = " > ".join(self._scope)
                exc.args = (f"{exc.args[0]} (in {where})", *exc.args[1:])
                exc.pgx_scoped = True  # type: ignore[attr-defined]
            raise
        finally:
            self._scope.pop()

    def next_index(self, parent: Module, kind: str) -> int:
        """The next number for a `kind` sub-module of `parent` (`if0`, `if1`, ...)."""
        key = (parent.name, kind)
        k = self._counters.get(key, 0)
        self._counters[key] = k + 1
        return k

    def new_module(self, parent: Module, suffix: str) -> Module:
        """A sub-module `<parent>:<suffix>` of the program, e.g. `main:if0_then`."""
        return self.program.create_module(f"{parent.name}:{suffix}", parent)

    def finish_module(self, module: Module, outputs: Sequence[Instruction]) -> None:
        """Return `outputs` from a sub-module and drop what they do not need."""
        module.add_return(list(outputs))
        dead_code_elimination(module)

    def discard_module(self, module: Module) -> None:
        """Remove a sub-module (and its own sub-modules) that will not be used after all."""
        doomed = {id(module)}
        changed = True
        while changed:
            changed = False
            for m in self.program.modules.values():
                if id(m) not in doomed and m.parent is not None and id(m.parent) in doomed:
                    doomed.add(id(m))
                    changed = True
        for name, m in list(self.program.modules.items()):
            if id(m) in doomed:
                for key in [k for k in self._counters if k[0] == name]:
                    del self._counters[key]
                for ins in m.instructions:
                    for i in ins.inputs:
                        i.outputs = [u for u in i.outputs if u is not ins]
                m.instructions = []
                self.program.remove_module(name)

    @staticmethod
    def captured(modules: Sequence[Module]) -> list[Instruction]:
        """Values of enclosing modules that `modules` (or their own sub-modules) read, in order
        of first use: the control instruction lists them as inputs, so liveness and ordering
        passes see the dependency."""
        inside: set[int] = set()
        todo = list(modules)
        seen_mods: set[int] = set()
        all_mods = []
        while todo:
            m = todo.pop(0)
            if id(m) in seen_mods:
                continue
            seen_mods.add(id(m))
            all_mods.append(m)
            inside.update(id(i) for i in m.instructions)
            for ins in m.instructions:
                todo.extend(ins.module_inputs)
        out: list[Instruction] = []
        taken: set[int] = set()
        for m in all_mods:
            for ins in m.instructions:
                for i in ins.inputs:
                    if id(i) not in inside and id(i) not in taken:
                        taken.add(id(i))
                        out.append(i)
        return out

    def _parse_node(self, node: onnx.NodeProto, module: Module, values: dict[str, Value]) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets[domain]
        ctx = NodeContext(self, node, module, opset)
        args: list[Value | None] = []
        for name in node.input:
            if not name:
                args.append(None)
            elif name in values:
                args.append(values[name])
            else:
                raise ctx.error(f"input {name!r} is not produced by any earlier node or input")
        handler = find_handler(domain, node.op_type, opset)
        missing = missing_required_inputs(domain, node.op_type, opset, args)
        if missing:
            k = missing[0]
            given = repr(node.input[k]) if k < len(node.input) else "not given"
            raise ctx.error(f"input {k} is required by {node.op_type}-{opset} but is {given}")
        structured = [
            (k, a) for k, a in enumerate(args) if isinstance(a, SequenceValue | OptionalValue)
        ]
        results: Any
        if structured and not getattr(handler, "takes_sequences", False):
            k, a = structured[0]
            if domain == "" and node.op_type in _PASS_THROUGH and len(args) == 1:
                results = a
            else:
                raise ctx.error(
                    f"input {k} ({node.input[k]!r}) is {describe(a)}; this operator takes tensors"
                )
        elif handler is None:  # only reachable with skip_unknown_operators
            results = self._unknown(ctx, args)  # type: ignore[arg-type]
        else:
            try:
                results = handler(ctx, args)
            except OnnxParseError:
                raise
            except (
                ValueError,
                TypeError,
                IndexError,
                KeyError,
                NotImplementedError,
                OverflowError,
            ) as exc:  # a handler meeting values the model should not hold: named, kept
                raise ctx.error(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(results, Instruction | SequenceValue | OptionalValue) or results is None:
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
            shape = self.input_shape(vi)
            op = Unknown(ctx.op_type, ctx.domain, shape)
            outs.append(ctx.module.add_instruction(op, [a for a in args if a is not None]))
        return outs

    def value_info(self, name: str) -> onnx.ValueInfoProto | None:
        """The declared type of value `name` (graph outputs and value_info), if any."""
        return self._value_info.get(name)

    def has_static_shape(self, name: str) -> bool:
        vi = self._value_info.get(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            return False
        tt = vi.type.tensor_type
        return tt.HasField("shape") and all(
            d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim
        )

    def declare_shape(self, name: str, shape: Shape) -> None:
        """Record `shape` as the declared shape of value `name`, as if the model's value_info
        said so (handlers of run-time shape inputs read it; e.g. Loop bodies, see control.py)."""
        elem = onnx.helper.np_dtype_to_tensor_dtype(shape.dtype())
        self._value_info[name] = onnx.helper.make_tensor_value_info(name, elem, shape.lens())

    # --- constants -------------------------------------------------------------------------
    def const_value(self, ins: Instruction) -> np.ndarray | None:
        """Evaluate `ins` at parse time if it depends only on literals (memoised); None when it
        does not, or when a value on the way is too large to fold (`PGX_CONST_FOLD_LIMIT`).
        The walk uses an explicit stack: a chain of thousands of nodes needs no recursion."""
        limit = fold_limit()
        stack = [ins]
        while stack:
            top = stack[-1]
            entry = self._const.get(id(top))
            if entry is not None and entry[0] is top:
                stack.pop()
                continue
            if top.is_literal():
                value: np.ndarray | None = top.get_literal().array
            elif top.is_param() or top.module_inputs or top.op.name == "unknown":
                value = None
            elif too_large_to_fold(top, limit):
                value = None
            else:
                pending = [i for i in top.inputs if not self._memoised(i)]
                if pending:
                    stack.extend(pending)
                    continue
                args = [self._const[id(i)][1] for i in top.inputs]
                if any(a is None for a in args):
                    value = None
                else:
                    value = np.asarray(top.op.compute(top.shape, args))
            stack.pop()
            self._const[id(top)] = (top, value)
        return self._const[id(ins)][1]

    def _memoised(self, ins: Instruction) -> bool:
        """Whether `const_value` has settled `ins` (its value may be None)."""
        entry = self._const.get(id(ins))
        return entry is not None and entry[0] is ins
