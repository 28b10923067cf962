"""Safe loading of initialisers stored as ONNX external data.

The data file must resolve inside the model's folder: absolute paths, `..` components and
symbolic links that lead out of the folder are refused, as is a file shorter than
offset + length or a length that does not match the tensor's size. A model given as a buffer has
no folder, so its external data cannot be read.

Tensors of plain numeric types are read-only views of the data file mapped into memory
(`numpy.memmap`, one mapping per file, shared by every parse while some view of it lives): a
parse copies no weight bytes, the device upload reads them straight from the page cache, and the
parses of one model for several input shapes share the same pages (and, on a GPU, one device
copy: `targets/torch_lowering/literal_store.py` identifies such views by file and offset).
Other types (strings, sub-byte types) are read and converted through ONNX's helper.
"""

from __future__ import annotations

import os
from math import prod
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import numpy_helper

from pygraphx.ir.mapped import map_file
from pygraphx.onnx.errors import ExternalDataError


def load_external_tensor(
    tensor: onnx.TensorProto, model_dir: Path | None, source: str
) -> np.ndarray:
    """The numpy value of an initialiser whose bytes live in an external file."""
    where = f"{source}: initialiser {tensor.name!r}"
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location")
    if not location:
        raise ExternalDataError(f"{where}: external data without a 'location'")
    if model_dir is None:
        raise ExternalDataError(
            f"{where}: external data {location!r} cannot be read from a buffer; "
            "parse the model from its file with parse_onnx(path)"
        )
    if os.path.isabs(location) or PureWindowsPath(location).is_absolute():
        raise ExternalDataError(f"{where}: external data path {location!r} is absolute; refused")
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if ".." in parts:
        raise ExternalDataError(
            f"{where}: external data path {location!r} contains '..' and could leave the "
            "model's folder; refused"
        )
    base = model_dir.resolve()
    path = (base / location).resolve()
    if not path.is_relative_to(base):
        raise ExternalDataError(
            f"{where}: external data path {location!r} resolves to {path}, outside the model's "
            f"folder {base} (a symbolic link?); refused"
        )
    if not path.is_file():
        raise ExternalDataError(f"{where}: external data file {path} does not exist")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ExternalDataError(f"{where}: external data offset/length are not integers") from None
    if offset < 0 or (length is not None and length < 0):
        raise ExternalDataError(f"{where}: negative external data offset or length")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    expected = prod(tensor.dims) * dtype.itemsize
    if length is None:
        length = expected
    if length != expected:
        raise ExternalDataError(
            f"{where}: external data length {length} does not match the tensor "
            f"{list(tensor.dims)} of {dtype} ({expected} bytes)"
        )
    size = path.stat().st_size
    if offset + length > size:
        raise ExternalDataError(
            f"{where}: external data needs bytes {offset}..{offset + length} of {path}, "
            f"but the file has only {size} bytes (truncated?)"
        )
    mapped = _mapped_view(tensor, path, offset, length, dtype)
    if mapped is not None:
        return mapped
    with path.open("rb") as f:
        f.seek(offset)
        raw = f.read(length)
    return decode_raw(tensor, raw)


def decode_raw(tensor: onnx.TensorProto, raw: bytes) -> np.ndarray:
    """The value of `tensor` (external data) had its bytes been `raw` inline: decoded through
    ONNX's helper (a copy; for the types numpy cannot view in place)."""
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = raw
    return np.asarray(numpy_helper.to_array(copy), order="C")


def held_tensor(tensor: onnx.TensorProto, data: bytes, offset: int, length: int) -> np.ndarray:
    """The value of `tensor`, whose raw bytes are `data[offset:offset + length]` (a model
    held in memory, see `mapped_model.split_buffer`): a read-only view of `data` where the type
    allows, else decoded. ValueError when the length does not fit the tensor's dims."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if not _viewable(tensor, dtype, length):
        return decode_raw(tensor, bytes(data[offset : offset + length]))
    expected = prod(tensor.dims) * dtype.itemsize
    if length != expected:
        raise ValueError(
            f"raw_data holds {length} bytes, the tensor {list(tensor.dims)} of {dtype} "
            f"needs {expected}"
        )
    view = np.frombuffer(data, dtype=np.uint8, count=length, offset=offset)
    return view.view(dtype).reshape(tuple(tensor.dims))


def _viewable(tensor: onnx.TensorProto, dtype: np.dtype, length: int) -> bool:
    """Whether the tensor's bytes are its numpy values (not strings, 4-bit or 8-bit float
    types; a little-endian host)."""
    if dtype.kind not in "biuf" or dtype.itemsize * 8 != _bits(tensor.data_type) or length == 0:
        return False
    return bool(np.little_endian)


def _mapped_view(
    tensor: onnx.TensorProto, path: Path, offset: int, length: int, dtype: np.dtype
) -> np.ndarray | None:
    """The tensor as a read-only view of its mapped file (`ir/mapped.py`'s `map_file`: one
    mapping per file, its identity recorded), or None for types not stored as their numpy bytes
    (strings, 4-bit and 8-bit float types, big-endian hosts)."""
    if not _viewable(tensor, dtype, length):
        return None
    root = map_file(path)
    return root[offset : offset + length].view(dtype).reshape(tuple(tensor.dims))


def _bits(data_type: int) -> int:
    """Bits per element ONNX stores a tensor type with (0: not a fixed-size numeric type)."""
    T = onnx.TensorProto
    bits = {
        T.FLOAT: 32, T.DOUBLE: 64, T.FLOAT16: 16, T.INT8: 8, T.UINT8: 8, T.INT16: 16,
        T.UINT16: 16, T.INT32: 32, T.UINT32: 32, T.INT64: 64, T.UINT64: 64, T.BOOL: 8,
    }  # fmt: skip
    return bits.get(data_type, 0)
