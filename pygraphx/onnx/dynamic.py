"""Dynamic input dimensions (`map_dyn_input_dims`, `default_dyn_dim_value`) and programs whose
shapes depend on input values (`specialize_on_input_values=True`).

A model parsed with dynamic dimensions gets parameters whose shapes are ranges
(`{{1, 8}, {3, 3}, {224, 224}, {224, 224}}`); its body is built for the maximum lens (seed 001:
"set a maximum input shape, then run with smaller ones"). Running it with other lens inside the
ranges rebuilds the program for those lens from the same model, re-applies the program-level
transforms (quantize, optimize), compiles it for the same target and caches it per lens, so each
shape runs a fully static, fully optimised program.

A model whose shapes depend on the *values* of some inputs (a Reshape target, ReduceSum axes
or TopK's K fed as graph inputs) cannot be compiled before those values are known; with
`specialize_on_input_values=True` it parses to a program of parameters only, and each run
builds, compiles and caches the program for the values it is given.

Dimension specs: an int (fixed), a (min, max) pair, a dict {"min", "max", "optimals"}, or a
`DynamicDimension`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from pygraphx.ir.program import Program
from pygraphx.ir.shape import DynamicDimension, Shape
from pygraphx.onnx import parser
from pygraphx.onnx.errors import InputValueNeeded, OnnxParseError
from pygraphx.ops.builtin import Param

DYNAMIC_OPTIONS = ("map_dyn_input_dims", "default_dyn_dim_value")


def to_dynamic_dimension(spec: Any) -> DynamicDimension:
    """A `DynamicDimension` from an int, a (min, max[, optimals]) sequence or a dict."""
    if isinstance(spec, DynamicDimension):
        return spec
    if isinstance(spec, int):
        return DynamicDimension(spec, spec)
    if isinstance(spec, Mapping):
        return DynamicDimension(
            int(spec["min"]), int(spec["max"]), tuple(int(o) for o in spec.get("optimals", ()))
        )
    if isinstance(spec, Sequence) and len(spec) in (2, 3):
        opts = tuple(int(o) for o in spec[2]) if len(spec) == 3 else ()
        return DynamicDimension(int(spec[0]), int(spec[1]), opts)
    raise ValueError(f"cannot read a dynamic dimension from {spec!r}")


def parse_onnx(path: str | Path, **options: Any) -> Program:
    """`parser.parse_onnx` with dynamic-dimension and value-specialization options."""
    dyn = _take_dynamic(options)

    def parse(opts: dict[str, Any]) -> Program:
        return parser.parse_onnx(path, **opts)

    def proto() -> onnx.ModelProto:
        return onnx.load(str(path), load_external_data=False)

    return _parse(parse, proto, str(path), options, dyn)


def parse_onnx_buffer(data: bytes, **options: Any) -> Program:
    """`parser.parse_onnx_buffer` with dynamic-dimension and value-specialization options."""
    dyn = _take_dynamic(options)
    data = bytes(data)

    def parse(opts: dict[str, Any]) -> Program:
        return parser.parse_onnx_buffer(data, **opts)

    def proto() -> onnx.ModelProto:
        return parser.load_model_proto(data, "<buffer>")

    return _parse(parse, proto, "<buffer>", options, dyn)


def _parse(
    parse: Callable[[dict[str, Any]], Program],
    proto: Callable[[], onnx.ModelProto],
    source: str,
    options: dict[str, Any],
    dyn: Mapping[str, Any],
) -> Program:
    try:
        if not dyn:
            return parse(options)
        return _parse_dynamic(proto(), source, parse, options, dyn)
    except InputValueNeeded as exc:
        if not options.get("specialize_on_input_values") or dyn:
            raise
        return _deferred(proto(), source, parse, options, exc.inputs)


def _deferred(
    proto: onnx.ModelProto,
    source: str,
    parse: Callable[[dict[str, Any]], Program],
    options: dict[str, Any],
    needed: set[str],
) -> Program:
    """A program whose shapes depend on the values of `needed` inputs: only its parameters
    are known until it runs; each run builds (and caches) the program for the given values."""
    program = Program()
    main = program.get_main_module()
    shapes = parser.OnnxParser({**parser.OPTIONS, **options}, source, None)
    initialised = {t.name for t in proto.graph.initializer}
    for inp in proto.graph.input:
        if inp.name not in initialised:
            main.add_parameter(inp.name, shapes.input_shape(inp))
    main.add_return([])
    program.output_names = [o.name for o in proto.graph.output]
    program.value_inputs = set(needed)

    def specialize(arrays: dict[str, Any]) -> Program:
        while True:
            consts = {n: arrays[n] for n in program.value_inputs}
            try:
                return parse({**options, "constant_inputs": consts})
            except InputValueNeeded as exc:
                if exc.inputs <= program.value_inputs:
                    raise
                program.value_inputs |= exc.inputs

    program.specializer = specialize
    return program


def _take_dynamic(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options.pop(k) for k in DYNAMIC_OPTIONS if options.get(k) is not None}


def _dynamic_inputs(
    proto: onnx.ModelProto, source: str, options: Mapping[str, Any], dyn: Mapping[str, Any]
) -> dict[str, list[DynamicDimension]]:
    mapped = dict(dyn.get("map_dyn_input_dims") or {})
    default = dyn.get("default_dyn_dim_value")
    default_dim = to_dynamic_dimension(default) if default is not None else None
    static_map = options.get("map_input_dims") or {}
    initialised = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initialised]
    unknown = sorted(set(mapped) - set(names))
    if unknown:
        raise OnnxParseError(f"{source}: map_dyn_input_dims names {unknown}, not inputs {names}")
    both = sorted(set(mapped) & set(static_map))
    if both:
        raise OnnxParseError(
            f"{source}: {both} given in both map_input_dims and map_dyn_input_dims"
        )
    out: dict[str, list[DynamicDimension]] = {}
    for inp in proto.graph.input:
        if inp.name in initialised or inp.name in static_map:
            continue
        if inp.name in mapped:
            out[inp.name] = [to_dynamic_dimension(d) for d in mapped[inp.name]]
        elif default_dim is not None and inp.type.HasField("tensor_type"):
            dims = inp.type.tensor_type.shape.dim
            if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
                out[inp.name] = [
                    DynamicDimension(d.dim_value, d.dim_value)
                    if d.HasField("dim_value") and d.dim_value > 0
                    else default_dim
                    for d in dims
                ]
    return out


def _parse_dynamic(
    proto: onnx.ModelProto,
    source: str,
    parse: Callable[[dict[str, Any]], Program],
    options: dict[str, Any],
    dyn: Mapping[str, Any],
) -> Program:
    try:
        dims = _dynamic_inputs(proto, source, options, dyn)
    except (ValueError, KeyError, TypeError) as exc:
        raise OnnxParseError(f"{source}: bad dynamic dimension option: {exc}") from None
    del proto
    user_map = dict(options.get("map_input_dims") or {})
    base = {**user_map, **{n: [d.max for d in ds] for n, ds in dims.items()}}
    program = parse({**options, "map_input_dims": base})
    main = program.get_main_module()
    for ins in main.get_parameters():
        ds = dims.get(ins.op.parameter)
        if ds is not None and any(not d.is_fixed() for d in ds):
            dyn_shape = Shape(ins.shape.type(), dyn_dims=ds)
            main.replace_op(ins, Param(ins.op.parameter, ins.shape, dyn_shape))

    def specialize(arrays: dict[str, Any]) -> Program:
        lens = {n: list(a.shape) for n, a in arrays.items()}
        return parse({**options, "map_input_dims": {**user_map, **lens}})

    program.specializer = specialize
    return program
