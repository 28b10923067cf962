"""Dynamic input dimensions and programs whose shapes depend on input values.

Dimensions become ranges in three ways:
- `map_input_dims` (MIGraphX's "set a maximum input shape, then run with smaller ones"): for a
  dimension the model declares symbolic or unknown, the given value is the maximum (and the
  optimal) of a range `[1, given]`; dimensions the model fixes take the given value as today;
- `map_dyn_input_dims`: explicit ranges per input (MIGraphX's option);
- `default_dyn_dim_value`: a range for every symbolic dimension not otherwise mapped.

A program with ranges gets parameters whose shapes are ranges
(`{{1, 8}, {3, 3}, {224, 224}, {224, 224}}`); its body is built for the maximum lens. Running
it with other lens inside the ranges rebuilds the program for those lens from the same model,
re-applies the program-level transforms (quantize, optimize), compiles it for the same target
and caches it per lens (`Program._specialized_for`), so each shape runs a fully static, fully
optimised program.

A model whose shapes depend on the *values* of some inputs (a Reshape target, ReduceSum axes
or TopK's K fed as graph inputs) cannot be compiled before those values are known: it parses to
a program of parameters only, and each run builds, compiles and caches the program for the
values it is given (`specialize_on_input_values=False` forbids this: the parse then fails).

The model bytes and parse options stay with the program (`Program.specializer_spec`), so a
compiled dynamic program can be saved and loaded (`ir/serialize.py` calls `restore_specializer`
through its registry).

Dimension specs: an int (fixed), a (min, max) pair, a dict {"min", "max", "optimals"}, or a
`DynamicDimension`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pygraphx.ir.program import Program
from pygraphx.ir.serialize import register_specializer
from pygraphx.ir.shape import DynamicDimension, Shape
from pygraphx.onnx import parser
from pygraphx.onnx.errors import InputValueNeeded, OnnxParseError
from pygraphx.ops.builtin import Param

DYNAMIC_OPTIONS = ("map_dyn_input_dims", "default_dyn_dim_value")
ALL_OPTIONS = sorted([*parser.OPTIONS, *DYNAMIC_OPTIONS])
_SPEC_KIND = "onnx"
#: the range of a symbolic dimension of a program built per input value: any size
_ANY_SIZE = 2**31 - 1


def to_dynamic_dimension(spec: Any) -> DynamicDimension:
    """A `DynamicDimension` from an int, a (min, max[, optimals]) sequence or a dict."""
    if isinstance(spec, DynamicDimension):
        return spec
    if isinstance(spec, int | np.integer):
        return DynamicDimension(int(spec), int(spec))
    if isinstance(spec, Mapping):
        return DynamicDimension(
            int(spec["min"]), int(spec["max"]), tuple(int(o) for o in spec.get("optimals", ()))
        )
    if isinstance(spec, Sequence) and len(spec) in (2, 3):
        opts = tuple(int(o) for o in spec[2]) if len(spec) == 3 else ()
        return DynamicDimension(int(spec[0]), int(spec[1]), opts)
    raise ValueError(f"cannot read a dynamic dimension from {spec!r}")


@dataclasses.dataclass
class _Model:
    """The model bytes and where they came from: parsed again for each specialization."""

    data: bytes
    source: str
    model_dir: Path | None
    tensors: dict[Any, np.ndarray] | None = None
    """Initialisers decoded once, shared by every program parsed from this model (set for the
    specializations; a plain parse decodes them as it goes)."""
    path: Path | None = None
    """The model file, when `data` refers to its weights in place (`mapped_model.py`)."""

    def whole(self) -> bytes:
        """The model with its weights inline (what a saved specializer must carry: the file
        it was read from may be gone when the program is loaded)."""
        if self.path is None or self.path.stat().st_size == len(self.data):
            return self.data  # read whole: nothing was left in the file
        return parser.read_model_file(self.path, mapped=False)

    def parse(self, options: dict[str, Any]) -> Program:
        if self.tensors is not None:
            options = {**options, "tensor_cache": self.tensors}
        return parser.parse_bytes(self.data, self.source, self.model_dir, options)

    def proto(self) -> onnx.ModelProto:
        return parser.load_model_proto(self.data, self.source)


def parse_onnx(path: str | Path, **options: Any) -> Program:
    """`parser.parse_onnx` with dynamic-dimension and value-specialization options."""
    path = Path(path)
    model = _Model(parser.read_model_file(path), str(path), path.resolve().parent, path=path)
    return _parse(model, options)


def parse_onnx_buffer(data: bytes, **options: Any) -> Program:
    """`parser.parse_onnx_buffer` with dynamic-dimension and value-specialization options."""
    return _parse(_Model(bytes(data), "<buffer>", None), options)


def _parse(model: _Model, options: dict[str, Any]) -> Program:
    unknown = sorted(set(options) - set(ALL_OPTIONS))
    if unknown:
        raise TypeError(f"unknown parse option(s) {unknown}; known: {ALL_OPTIONS}")
    dyn = {k: options.pop(k) for k in DYNAMIC_OPTIONS if options.get(k) is not None}
    dims: dict[str, list[DynamicDimension]] = {}
    if dyn or options.get("map_input_dims"):
        proto = model.proto()
        try:
            dims = _dynamic_inputs(proto, model.source, options, dyn)
        except OnnxParseError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise OnnxParseError(f"{model.source}: bad dynamic dimension option: {exc}") from None
        del proto
    dims = {n: ds for n, ds in dims.items() if any(not d.is_fixed() for d in ds)}
    user_map = {
        n: [int(v) for v in lens]
        for n, lens in (options.get("map_input_dims") or {}).items()
        if n not in dims
    }
    base = {**user_map, **{n: [d.max for d in ds] for n, ds in dims.items()}}
    try:
        program = model.parse({**options, "map_input_dims": base})
        needed: set[str] = set()
    except InputValueNeeded as exc:
        if options.get("specialize_on_input_values") is False:
            raise
        program, structured = _parameters_only(model, {**options, "map_input_dims": base}, dims)
        needed = set(exc.inputs) | structured
    _attach(program, model, options, user_map, dims, needed)
    return program


def _parameters_only(
    model: _Model, options: dict[str, Any], dims: dict[str, list[DynamicDimension]]
) -> tuple[Program, set[str]]:
    """A program of parameters only, for a model whose shapes depend on input values: only its
    signature is known until it runs. Dimensions the model leaves symbolic (and no option
    fixes) accept any size (`dims` gets them): each run is built for the lens it is given.
    Also returns the sequence and optional inputs, which are no parameters."""
    proto = model.proto()
    program = Program()
    main = program.get_main_module()
    shapes = parser.OnnxParser({**parser.OPTIONS, **options}, model.source, None)
    initialised = {t.name for t in proto.graph.initializer}
    structured = set()
    fixed = options.get("map_input_dims") or {}
    for inp in proto.graph.input:
        if inp.name in initialised:
            continue
        if parser.structured_input(inp):
            structured.add(inp.name)
            continue
        shape = shapes.input_shape(inp)
        main.add_parameter(inp.name, shape)
        tt = inp.type.tensor_type
        if inp.name not in fixed and tt.HasField("shape") and any(map(_symbolic, tt.shape.dim)):
            dims[inp.name] = [
                DynamicDimension(0, _ANY_SIZE) if _symbolic(d) else DynamicDimension(n, n)
                for d, n in zip(tt.shape.dim, shape.lens(), strict=True)
            ]
    main.add_return([])
    program.output_names = [o.name for o in proto.graph.output]
    return program, structured


def _attach(
    program: Program,
    model: _Model,
    options: dict[str, Any],
    user_map: dict[str, list[int]],
    dims: Mapping[str, list[DynamicDimension]],
    needed: set[str],
) -> None:
    """Give the parameters their ranges and the program its specializer (and the spec that
    rebuilds it after a save and load)."""
    main = program.get_main_module()
    for ins in main.get_parameters():
        ds = dims.get(ins.op.parameter)
        if ds is not None:
            dyn_shape = Shape(ins.shape.type(), dyn_dims=ds)
            main.replace_op(ins, Param(ins.op.parameter, ins.shape, dyn_shape))
    program.value_inputs = set(needed)
    if not dims and not needed:
        return
    opts = {k: v for k, v in options.items() if k != "map_input_dims"}
    program.specializer_spec = {
        "kind": _SPEC_KIND,
        "model": model.whole(),
        "source": model.source,
        "model_dir": str(model.model_dir) if model.model_dir is not None else None,
        "options": opts,
        "map_input_dims": user_map,
    }
    restore_specializer(program, program.specializer_spec)


def restore_specializer(program: Program, spec: Mapping[str, Any]) -> None:
    """Set `program.specializer` from its spec: the model parsed again with the concrete lens of
    every input and the values of `program.value_inputs`. The specializations share the model's
    decoded initialisers: their weights are held once, however many the program's cache keeps."""
    model_dir = spec["model_dir"]
    model = _Model(bytes(spec["model"]), spec["source"], Path(model_dir) if model_dir else None)
    model.tensors = {}
    options = dict(spec["options"])
    user_map = {n: list(v) for n, v in spec["map_input_dims"].items()}

    def specialize(arrays: dict[str, Any]) -> Program:
        lens = {n: list(a.shape) for n, a in arrays.items() if isinstance(a, np.ndarray)}
        opts = {**options, "map_input_dims": {**user_map, **lens}}
        while True:
            consts = {n: arrays[n] for n in program.value_inputs}
            try:
                return model.parse({**opts, "constant_inputs": consts or None})
            except InputValueNeeded as exc:
                if exc.inputs <= program.value_inputs:
                    raise
                program.value_inputs |= exc.inputs

    program.specializer = specialize


register_specializer(_SPEC_KIND, restore_specializer)


def _check_keys(
    source: str, option: str, mapping: Mapping[str, Any], names: list[str], initialised: set[str]
) -> None:
    unknown = sorted(set(mapping) - set(names))
    if not unknown:
        return
    weights = sorted(set(unknown) & initialised)
    note = f" ({weights} are initialisers, not inputs)" if weights else ""
    raise OnnxParseError(
        f"{source}: {option} names {unknown}, which the model has no input for{note}; "
        f"its inputs are {names}"
    )


def _symbolic(d: onnx.TensorShapeProto.Dimension) -> bool:
    return not d.HasField("dim_value") or d.dim_value <= 0


def _from_max_shape(
    source: str, inp: onnx.ValueInfoProto, lens: Sequence[int]
) -> list[DynamicDimension] | None:
    """The ranges `map_input_dims` gives an input: `[1, given]` where the model's dimension is
    symbolic or unknown, the given value elsewhere; None when the model declares no shape."""
    tt = inp.type.tensor_type
    if not inp.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    declared = list(tt.shape.dim)
    lens = [int(n) for n in lens]
    if len(declared) != len(lens):
        raise OnnxParseError(
            f"{source}: map_input_dims gives input {inp.name!r} {len(lens)} dimensions "
            f"{lens}; the model declares {len(declared)}"
        )
    return [
        DynamicDimension(min(1, n), n, (n,)) if _symbolic(d) and n != 1 else DynamicDimension(n, n)
        for d, n in zip(declared, lens, strict=True)
    ]


def _dynamic_inputs(
    proto: onnx.ModelProto, source: str, options: Mapping[str, Any], dyn: Mapping[str, Any]
) -> dict[str, list[DynamicDimension]]:
    mapped = dict(dyn.get("map_dyn_input_dims") or {})
    default = dyn.get("default_dyn_dim_value")
    default_dim = to_dynamic_dimension(default) if default is not None else None
    static_map = options.get("map_input_dims") or {}
    initialised = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initialised]
    _check_keys(source, "map_dyn_input_dims", mapped, names, initialised)
    _check_keys(source, "map_input_dims", static_map, names, initialised)
    both = sorted(set(mapped) & set(static_map))
    if both:
        raise OnnxParseError(
            f"{source}: {both} given in both map_input_dims and map_dyn_input_dims"
        )
    out: dict[str, list[DynamicDimension]] = {}
    for inp in proto.graph.input:
        if inp.name in initialised:
            continue
        if inp.name in static_map:
            ranges = _from_max_shape(source, inp, static_map[inp.name])
            if ranges is not None:
                out[inp.name] = ranges
        elif inp.name in mapped:
            out[inp.name] = [to_dynamic_dimension(d) for d in mapped[inp.name]]
        elif default_dim is not None and inp.type.HasField("tensor_type"):
            dims = inp.type.tensor_type.shape.dim
            if any(_symbolic(d) for d in dims):
                out[inp.name] = [
                    default_dim if _symbolic(d) else DynamicDimension(d.dim_value, d.dim_value)
                    for d in dims
                ]
    return out
