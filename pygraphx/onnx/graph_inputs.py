"""How the ONNX frontend reads a graph's inputs and initialisers: the shape of an input
(`input_shape`, with `map_input_dims` and `default_dim_value`), an input given a value at parse
time (`_constant_input`), and an initialiser's array (`initializer_array`: external data read
safely, see `external_data.py`; initialisers left in a memory-mapped model's bytes, see
`mapped_model.py`). `OnnxParser` (parser.py) takes these methods from `GraphInputs`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from pygraphx.ir.argument import Literal
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.onnx.context import onnx_type_to_shape_type
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.onnx.external_data import held_tensor, load_external_tensor
from pygraphx.onnx.handlers.sequence import OptionalValue, SequenceValue, Value
from pygraphx.onnx.mapped_model import BUFFER_LOCATION


class GraphInputs:
    """The parser's graph-input and initialiser methods (a base class of `OnnxParser`, which
    sets these attributes)."""

    options: Mapping[str, Any]
    source: str
    model_dir: Path | None
    #: the model's bytes and the (offset, length) of the initialisers left in them
    _held: tuple[bytes, set[tuple[int, int]]] | None

    def _constant_input(self, module: Module, inp: onnx.ValueInfoProto, value: Any) -> Value:
        """A graph input given at parse time: a literal, or a sequence or optional of them."""
        t = inp.type
        if t.HasField("optional_type"):
            if value is None:
                return OptionalValue(None)
            inner = onnx.ValueInfoProto(name=inp.name, type=t.optional_type.elem_type)
            return OptionalValue(self._constant_input(module, inner, value))
        if t.HasField("sequence_type"):
            if not isinstance(value, list | tuple):
                raise OnnxParseError(
                    f"{self.source}: input {inp.name!r} is a sequence; give a list of arrays"
                )
            elem = t.sequence_type.elem_type.tensor_type.elem_type
            elem_type = onnx_type_to_shape_type(elem) if elem else None
            items = [module.add_literal(Literal(np.asarray(v))) for v in value]
            return SequenceValue(items, elem_type)
        return module.add_literal(Literal(np.asarray(value)))

    def input_shape(self, inp: onnx.ValueInfoProto) -> Shape:
        map_dims = self.options["map_input_dims"] or {}
        t = inp.type
        if t.HasField("optional_type") and t.optional_type.elem_type.HasField("tensor_type"):
            # an optional tensor input is a parameter that must be given (so it has an element)
            t = t.optional_type.elem_type
        tt = t.tensor_type
        if t.HasField("sequence_type") or t.HasField("optional_type"):
            kind = "a sequence" if t.HasField("sequence_type") else "an optional sequence"
            raise OnnxParseError(
                f"{self.source}: input {inp.name!r} is {kind}: programs take tensors only "
                "(sequences are resolved at compile time, so they cannot be graph inputs)"
            )
        if not t.HasField("tensor_type"):
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

    def initializer_array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """`tensor_to_array`, decoded once per model when the parse has a `tensor_cache` (an
        initialiser held in the model's bytes, keyed by its name, type, dims and a digest of
        its bytes); the array is then read-only and shared by the programs of that model."""
        cache = self.options.get("tensor_cache")
        if cache is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return self.tensor_to_array(tensor)
        raw = tensor.raw_data
        key = (tensor.name, tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).digest())
        arr = cache.get(key) if raw else None
        if arr is None:
            arr = self.tensor_to_array(tensor)
            arr.flags.writeable = False
            if raw:
                cache[key] = arr
        return arr

    def tensor_to_array(self, tensor: onnx.TensorProto) -> np.ndarray:
        if tensor.data_type == onnx.TensorProto.STRING:
            raise OnnxParseError(
                f"{self.source}: tensor {tensor.name!r}: string tensors are not supported"
            )
        try:
            onnx_type_to_shape_type(tensor.data_type)
        except ValueError as exc:
            raise OnnxParseError(f"{self.source}: tensor {tensor.name!r}: {exc}") from None
        span = self._held_span(tensor)
        if span is None and tensor.data_location == onnx.TensorProto.EXTERNAL:
            return load_external_tensor(tensor, self.model_dir, self.source)
        try:
            if span is not None and self._held is not None:
                return held_tensor(tensor, self._held[0], *span)
            arr = numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise OnnxParseError(
                f"{self.source}: tensor {tensor.name!r} is corrupt: {exc}"
            ) from None
        return np.asarray(arr, order="C")

    def _held_span(self, tensor: onnx.TensorProto) -> tuple[int, int] | None:
        """(offset, length) of `tensor`'s bytes in the model's bytes when `split_buffer` left
        them there (only spans it recorded: no other location is ever read this way)."""
        if self._held is None or tensor.data_location != onnx.TensorProto.EXTERNAL:
            return None
        info = {e.key: e.value for e in tensor.external_data}
        if info.get("location") != BUFFER_LOCATION:
            return None
        try:
            span = (int(info.get("offset", "")), int(info.get("length", "")))
        except ValueError:
            return None
        return span if span in self._held[1] else None


def structured_input(inp: onnx.ValueInfoProto) -> bool:
    """A sequence input, or an optional one that may hold a sequence or nothing."""
    t = inp.type
    if t.HasField("sequence_type"):
        return True
    return t.HasField("optional_type") and not t.optional_type.elem_type.HasField("tensor_type")
