"""Saving and loading programs: a documented msgpack container (never pickle).

File layout (all integers little-endian):

    offset  size  field
    0       8     magic b"\\x89PGXPRG\\n"
    8       4     format version (uint32), currently FORMAT_VERSION
    12      8     payload length in bytes (uint64)
    20      32    SHA-256 of the payload
    52      n     payload: one msgpack map

The payload map holds `pygraphx_version`, `output_names`, `target` (name or nil),
`compile_options`, and `modules`: a list of {name, parent, instructions}, each instruction {op,
attrs, inputs, modules, shape} and, when known, `source` (the labels of the ONNX nodes it
computes, `Instruction.source`; files without it load with none). Inputs are [module index,
instruction index] pairs. Shapes are msgpack extension 1 ([type, lens, strides]); arrays
(literal values) are extension 2 (type name, lens, raw C-order bytes). Operators are rebuilt by
name from the operator registry, so a file can only create IR objects; it never runs code.
Loading checks the magic, version, length and hash before decoding, and recomputes every
instruction's shape against the stored one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import struct
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from pygraphx.ir import registry
from pygraphx.ir.argument import Literal, RoundedLiteral
from pygraphx.ir.atomic_write import write_atomic
from pygraphx.ir.builtin_ops import LiteralOp
from pygraphx.ir.file_read import read_regular_file
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.mapped import check_program
from pygraphx.ir.module import Module, compute_shape
from pygraphx.ir.op import OPS, Op
from pygraphx.ir.program import Program, ProgramError
from pygraphx.ir.shape import DynamicDimension, Shape, from_dtype, to_dtype
from pygraphx.version import __version__

MAGIC = b"\x89PGXPRG\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQ32s")
_EXT_SHAPE = 1
_EXT_ARRAY = 2


class SerializationError(ValueError):
    """The file is not a pygraphx program, or is truncated, tampered with, or of another version."""


#: kind -> function(program, spec) that sets `program.specializer` from the plain-data spec a
#: frontend left in `program.specializer_spec` (the ONNX frontend registers "onnx")
_SPECIALIZERS: dict[str, Callable[[Program, Mapping[str, Any]], None]] = {}


def register_specializer(kind: str, restore: Callable[[Program, Mapping[str, Any]], None]) -> None:
    """Let programs whose `specializer_spec` has this `kind` be loaded with a specializer."""
    _SPECIALIZERS[kind] = restore


# --- encoding ---------------------------------------------------------------------------------
def _encode_array(arr: np.ndarray) -> msgpack.ExtType:
    arr = np.asarray(arr, order="C")
    head = msgpack.packb([from_dtype(arr.dtype), list(arr.shape)])
    return msgpack.ExtType(_EXT_ARRAY, struct.pack("<I", len(head)) + head + arr.tobytes())


def _default(obj: Any) -> Any:
    if isinstance(obj, Shape):
        fields = [obj.type(), obj.lens(), obj.strides()]
        if obj.dynamic():
            fields.append([[d.min, d.max, list(d.optimals)] for d in obj.dyn_dims()])
        return msgpack.ExtType(_EXT_SHAPE, msgpack.packb(fields))
    if isinstance(obj, np.ndarray):
        return _encode_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise a value of type {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    try:
        return _decode_ext(code, data)
    except SerializationError:
        raise
    except (struct.error, msgpack.UnpackException, ValueError, TypeError) as exc:
        raise SerializationError(f"extension {code}: malformed: {exc}") from exc


def _decode_ext(code: int, data: bytes) -> Any:
    if code == _EXT_SHAPE:
        fields = msgpack.unpackb(data)
        if len(fields) == 4:  # dynamic: [type, max lens, strides, [[min, max, optimals], ...]]
            dyn = [DynamicDimension(lo, hi, tuple(opt)) for lo, hi, opt in fields[3]]
            return Shape(fields[0], dyn_dims=dyn)
        type_name, lens, strides = fields
        return Shape(type_name, lens, strides)
    if code == _EXT_ARRAY:
        (n,) = struct.unpack_from("<I", data)
        type_name, lens = msgpack.unpackb(data[4 : 4 + n])
        dtype = to_dtype(type_name)
        body = data[4 + n :]
        count = int(np.prod(lens)) if lens else 1
        if len(body) != count * dtype.itemsize:
            raise SerializationError("array payload has the wrong size")
        return np.frombuffer(body, dtype=dtype).reshape(lens).copy()
    raise SerializationError(f"unknown msgpack extension type {code}")


def _op_attrs(op: Op) -> dict[str, Any]:
    return {f.name: getattr(op, f.name) for f in dataclasses.fields(op)}


def program_to_dict(program: Program) -> dict[str, Any]:
    modules = list(program.modules.values())
    mod_index = {id(m): k for k, m in enumerate(modules)}
    position: dict[int, tuple[int, int]] = {}
    out_modules = []
    for mi, mod in enumerate(modules):
        instructions = []
        for ii, ins in enumerate(mod.instructions):
            position[id(ins)] = (mi, ii)
            if ins.is_literal():
                lit = ins.get_literal()
                attrs: dict[str, Any] = {"value": lit.array}
                if isinstance(lit, RoundedLiteral):  # the float32 value it was rounded from
                    attrs["wide"] = lit.wide
            else:
                attrs = _op_attrs(ins.op)
            item: dict[str, Any] = {
                "op": ins.op.name,
                "attrs": attrs,
                "inputs": [list(position[id(i)]) for i in ins.inputs],
                "modules": [mod_index[id(m)] for m in ins.module_inputs],
                "shape": ins.shape,
            }
            if ins.source:
                item["source"] = list(ins.source)
            instructions.append(item)
        parent = mod_index[id(mod.parent)] if mod.parent is not None else None
        out_modules.append({"name": mod.name, "parent": parent, "instructions": instructions})
    return {
        "pygraphx_version": __version__,
        "output_names": list(program.output_names),
        "target": program.target.name if program.target is not None else None,
        "compile_options": dict(program.compile_options),
        "modules": out_modules,
        # dynamic programs: what rebuilds them per input lens / values (see Program)
        "specializer": program.specializer_spec,
        "value_inputs": sorted(program.value_inputs),
        "output_structure": program.output_structure,
    }


def dumps(program: Program) -> bytes:
    """The bytes of the saved form of `program`."""
    if program.specializer is not None and program.specializer_spec is None:
        raise SerializationError(
            "this dynamic program was built without a saveable specializer (not by the ONNX "
            "frontend); parse with static map_input_dims (one file per shape) to save"
        )
    if program.specializer is not None and program.transforms:
        raise SerializationError(
            "dynamic programs with program-level transforms (optimize, quantize) cannot be "
            "saved yet: the transforms would not be re-applied to the shapes it specializes to"
        )
    check_program(program, "save")  # its weights may be views of a model file
    payload = msgpack.packb(program_to_dict(program), default=_default, use_bin_type=True)
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), digest) + payload


def save(program: Program, path: str | Path) -> None:
    """Write `program` (parsed, optimised or compiled) to the file `path`.

    The file (by convention `.pgx`, or MIGraphX's `.mxr`) is a msgpack document behind a header
    with a format version and a SHA-256 checksum; it holds no code, so loading it cannot run
    any. A compiled program loads back compiled for the same target. The write is atomic: an
    interrupted or failed save leaves the file that was at `path` before unchanged.

    Example:
        >>> prog.compile(pygraphx.get_target("cpu"))
        >>> pygraphx.save(prog, "model.pgx")
    """
    write_atomic(path, dumps(program))


# --- decoding ---------------------------------------------------------------------------------
def loads(data: bytes, source: str = "<bytes>") -> Program:
    """Rebuild a program from `dumps` output; compiled programs come back compiled."""
    if len(data) < _HEADER.size or not data.startswith(MAGIC):
        raise SerializationError(f"{source}: not a pygraphx program file (bad magic number)")
    _, version, length, digest = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"{source}: program file format version {version}; this pygraphx ({__version__}) "
            f"reads version {FORMAT_VERSION}. Re-create it from the ONNX model"
        )
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise SerializationError(
            f"{source}: truncated or padded: payload has {len(payload)} bytes, header says {length}"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise SerializationError(
            f"{source}: checksum mismatch: the file is corrupt or was modified"
        )
    try:
        doc = msgpack.unpackb(
            payload, ext_hook=_ext_hook, raw=False, use_list=False, strict_map_key=True
        )
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise SerializationError(f"{source}: payload cannot be decoded: {exc}") from exc
    try:
        return _program_from_dict(doc)
    except SerializationError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, ProgramError) as exc:
        raise SerializationError(
            f"{source}: malformed program: {type(exc).__name__}: {exc}"
        ) from exc


def _program_from_dict(doc: dict[str, Any]) -> Program:
    program = Program()
    program.modules.clear()
    modules: list[Module] = []
    for m in doc["modules"]:
        parent = modules[m["parent"]] if m["parent"] is not None else None
        modules.append(program.create_module(m["name"], parent))
    # first every instruction with its stored shape (bodies may refer to outer values and
    # outer instructions to bodies), then every shape recomputed and compared
    for mod, m in zip(modules, doc["modules"], strict=True):
        for item in m["instructions"]:
            inputs = [modules[mi].instructions[ii] for mi, ii in item["inputs"]]
            subs = [modules[i] for i in item["modules"]]
            _make_instruction(mod, item, inputs, subs).source = _source(item)
    for mod in modules:
        for k, ins in enumerate(mod.instructions):
            if ins.is_return() or ins.is_literal() or ins.is_param():
                continue
            shape = compute_shape(ins.op, ins.inputs, ins.module_inputs)
            if shape != ins.shape:
                raise SerializationError(
                    f"module {mod.name!r} instruction {k} ({ins.op.name}): stored shape "
                    f"{ins.shape} differs from the computed {shape}"
                )
    program.output_names = list(doc["output_names"])
    _restore_specializer(program, doc)
    target = doc["target"]
    if target is not None:
        t = registry.get_target(target)
        options = dict(doc["compile_options"])
        program._executable = t.prepare(program, options)
        program._dynamic = program.is_dynamic()
        program.target = t
        program.compile_options = options
    return program


def _restore_specializer(program: Program, doc: Mapping[str, Any]) -> None:
    spec = doc.get("specializer")
    program.value_inputs = set(doc.get("value_inputs", ()))
    structure = doc.get("output_structure")
    program.output_structure = list(structure) if structure is not None else None
    if spec is None:
        return
    restore = _SPECIALIZERS.get(spec["kind"])
    if restore is None:
        raise SerializationError(
            f"the program is rebuilt per input shape by the {spec['kind']!r} frontend, which "
            "is not loaded (import pygraphx, or pygraphx.onnx, before loading)"
        )
    program.specializer_spec = _thaw(spec)
    restore(program, program.specializer_spec)


def _thaw(value: Any) -> Any:
    """msgpack gives tuples for lists (use_list=False): lists again, recursively."""
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    return value


def _literal(attrs: dict[str, Any]) -> Literal:
    wide = attrs.get("wide")
    if wide is None:
        return Literal(attrs["value"], copy=False)
    try:
        return RoundedLiteral(attrs["value"], np.asarray(wide))
    except ValueError as exc:
        raise SerializationError(f"a rounded literal's float32 value: {exc}") from exc


def _make_instruction(
    mod: Module, item: dict[str, Any], inputs: list[Instruction], subs: list[Module]
) -> Instruction:
    name = item["op"]
    if not isinstance(item["shape"], Shape):
        raise SerializationError(f"operator {name!r}: its shape is {type(item['shape']).__name__}")
    if name == "@literal":
        ins = Instruction(LiteralOp(_literal(item["attrs"])), [], item["shape"], mod)
        mod.instructions.append(ins)
        return ins
    cls = OPS.get(name)
    if cls is None:
        raise SerializationError(
            f"the file uses operator {name!r}, unknown to pygraphx {__version__}"
        )
    fields = {f.name for f in dataclasses.fields(cls)}
    attrs = dict(item["attrs"])
    # a file from before an attribute with a default existed (convert's `clamp`) loads with it
    defaulted = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    if not set(attrs) <= fields or not fields - set(attrs) <= defaulted:
        raise SerializationError(
            f"operator {name!r}: attributes {sorted(attrs)} != {sorted(fields)}"
        )
    _check_attr_types(cls, attrs)
    op = cls(**attrs)
    if name == "@param":
        ins = mod.add_parameter(op.parameter, op.shape)
        if op.dynamic_shape is not None:
            ins.op = op
        return ins
    ins = Instruction(op, inputs, item["shape"], mod, subs)
    for i in inputs:
        if ins not in i.outputs:
            i.outputs.append(ins)
    mod.instructions.append(ins)
    return ins


def _source(item: Mapping[str, Any]) -> tuple[str, ...]:
    """The ONNX node labels stored with an instruction (none in files written before them)."""
    labels = item.get("source", ())
    if not isinstance(labels, tuple | list) or not all(isinstance(x, str) for x in labels):
        raise SerializationError(f"operator {item['op']!r}: its source is not a list of names")
    return tuple(labels)


@functools.cache
def _attr_types(cls: type) -> dict[str, Any]:
    """The operator dataclass's field types (annotations resolved)."""
    return typing.get_type_hints(cls)


def _check_attr_types(cls: type, attrs: Mapping[str, Any]) -> None:
    """Refuse attribute values of the wrong kind before the operator sees them (a file is
    untrusted input: an int where a shape belongs must not reach the shape code)."""
    for key, hint in _attr_types(cls).items():
        if key not in attrs:
            continue
        kind = typing.get_origin(hint) or hint
        if kind is typing.Union or isinstance(hint, types.UnionType):
            kinds = tuple(typing.get_origin(h) or h for h in typing.get_args(hint))
        else:
            kinds = (kind,)
        kinds = tuple(k for k in kinds if isinstance(k, type))
        if not kinds or any(k in (object, float) for k in kinds):
            continue  # Any, or float (which also takes ints and numpy scalars)
        value = attrs[key]
        if not isinstance(value, kinds):
            raise SerializationError(
                f"operator {cls.__name__}: attribute {key!r} is {type(value).__name__}, "
                f"expected {hint}"
            )


def load(path: str | Path) -> Program:
    """Read a program written by `save` (compiled programs come back ready to run).

    Raises:
        SerializationError: the file is missing, not a saved program (for example a program's
            text), of another format version, truncated, or modified (checksum mismatch).

    Example:
        >>> prog = pygraphx.load("model.pgx")
        >>> prog.run({"input": x})
    """
    path = Path(path)
    data = read_regular_file(path, SerializationError, "a pygraphx program file")
    return loads(data, str(path))
