"""KServe v2 (Open Inference Protocol) tensors: datatypes, JSON and binary encodings.

Shared by the HTTP front end (`http_app.py`) and the gRPC one (`grpc_server.py`); nothing here
knows about a transport. The binary tensor extension: an HTTP body is a JSON header of
`Inference-Header-Content-Length` bytes followed by the raw tensors of the inputs whose
`parameters.binary_data_size` is set, in input order; a response does the same for outputs
that ask for `binary_data`. Raw data is little-endian and C-ordered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"

#: KServe v2 datatype name -> numpy dtype (little-endian)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_NAMES = {dt: name for name, dt in DATATYPES.items()}


class ProtocolError(ValueError):
    """A malformed request: the client's fault (HTTP 400, gRPC INVALID_ARGUMENT)."""


@dataclass
class Tensor:
    """One named tensor of a request or response."""

    name: str
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    """A decoded inference request: inputs by name and the outputs asked for (all if empty)."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] = field(default_factory=list)
    binary_outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False
    id: str = ""


def datatype_of(dtype: np.dtype) -> str:
    """The KServe datatype name of a numpy dtype."""
    try:
        return _NAMES[np.dtype(dtype)]
    except KeyError:
        raise ProtocolError(f"numpy dtype {np.dtype(dtype)} has no KServe v2 datatype") from None


def dtype_of(datatype: str, name: str) -> np.dtype:
    """The numpy dtype of a KServe datatype; BYTES and unknown names are refused by name."""
    try:
        return DATATYPES[datatype]
    except KeyError:
        known = ", ".join(DATATYPES)
        raise ProtocolError(
            f"input {name!r}: datatype {datatype!r} is not supported (supported: {known})"
        ) from None


def from_raw(raw: bytes, datatype: str, shape: Sequence[int], name: str) -> np.ndarray:
    """A tensor from its raw little-endian bytes; the byte count must match the shape."""
    dtype = dtype_of(datatype, name)
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if any(int(d) < 0 for d in shape):
        raise ProtocolError(f"input {name!r}: negative dimension in shape {list(shape)}")
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {name!r}: {len(raw)} bytes of raw data, but shape {list(shape)} of "
            f"{datatype} needs {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape([int(d) for d in shape])


def from_json_data(data: Any, datatype: str, shape: Sequence[int], name: str) -> np.ndarray:
    """A tensor from JSON `data` (flat or nested, row-major)."""
    dtype = dtype_of(datatype, name)
    try:
        flat = np.asarray(data, dtype=np.float64 if dtype.kind == "V" else None).reshape(-1)
        arr = flat.astype(dtype).reshape([int(d) for d in shape])
    except (ValueError, TypeError) as exc:
        raise ProtocolError(
            f"input {name!r}: data does not fit shape {list(shape)} as {datatype}: {exc}"
        ) from None
    return arr


def to_json_data(arr: np.ndarray) -> list[Any]:
    """The flat row-major JSON list of a tensor (bf16 as floats)."""
    if arr.dtype == DATATYPES["BF16"]:
        arr = arr.astype(np.float32)
    return arr.reshape(-1).tolist()


def to_raw(arr: np.ndarray) -> bytes:
    """The raw little-endian, C-ordered bytes of a tensor."""
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr).tobytes()


def decode_http(body: bytes, header_length: int | None) -> InferRequest:
    """An HTTP infer body (JSON, or JSON + binary tensors) as an `InferRequest`."""
    if header_length is None:
        header, binary = body, b""
    else:
        if not 0 <= header_length <= len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
            )
        header, binary = body[:header_length], body[header_length:]
    try:
        doc = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"request header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise ProtocolError("request must be a JSON object with an 'inputs' list")
    inputs, offset = {}, 0
    for item in doc["inputs"]:
        name, arr, offset = _decode_http_input(item, binary, offset)
        if name in inputs:
            raise ProtocolError(f"input {name!r} is given twice")
        inputs[name] = arr
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data belong to no input")
    return _with_outputs(InferRequest(inputs, id=str(doc.get("id", ""))), doc)


def _decode_http_input(item: Any, binary: bytes, offset: int) -> tuple[str, np.ndarray, int]:
    if not isinstance(item, dict) or not {"name", "shape", "datatype"} <= item.keys():
        raise ProtocolError("each input needs 'name', 'shape' and 'datatype'")
    name, shape, datatype = str(item["name"]), item["shape"], item["datatype"]
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        raise ProtocolError(f"input {name!r}: shape must be a list of integers, got {shape!r}")
    size = (item.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if offset + int(size) > len(binary):
            raise ProtocolError(f"input {name!r}: binary_data_size {size} runs past the body")
        arr = from_raw(binary[offset : offset + int(size)], datatype, shape, name)
        return name, arr, offset + int(size)
    if "data" not in item:
        raise ProtocolError(f"input {name!r} has neither 'data' nor binary_data_size")
    return name, from_json_data(item["data"], datatype, shape, name), offset


def _with_outputs(request: InferRequest, doc: Mapping[str, Any]) -> InferRequest:
    params = doc.get("parameters") or {}
    request.binary_default = bool(params.get("binary_data_output", False))
    for out in doc.get("outputs") or []:
        if not isinstance(out, dict) or "name" not in out:
            raise ProtocolError("each requested output needs a 'name'")
        request.outputs.append(str(out["name"]))
        binary = (out.get("parameters") or {}).get("binary_data")
        if binary is not None:
            request.binary_outputs[str(out["name"])] = bool(binary)
    return request


def encode_http(
    model: str, version: str, request: InferRequest, outputs: Mapping[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The HTTP response body and, when some output is binary, the JSON header's length."""
    items, chunks = [], []
    for name, arr in outputs.items():
        item: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(arr.dtype),
            "shape": list(arr.shape),
        }
        if request.binary_outputs.get(name, request.binary_default):
            raw = to_raw(arr)
            item["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            item["data"] = to_json_data(arr)
        items.append(item)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": items}
    if request.id:
        doc["id"] = request.id
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
