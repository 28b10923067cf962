"""Safe loading of initialisers stored as ONNX external data.

The data file must resolve inside the model's folder: absolute paths, `..` components and
symbolic links that lead out of the folder are refused, as is a file shorter than
offset + length or a length that does not match the tensor's size. A model given as a buffer has
no folder, so its external data cannot be read.
"""

from __future__ import annotations

import os
from math import prod
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import numpy_helper

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
    with path.open("rb") as f:
        f.seek(offset)
        raw = f.read(length)
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = raw
    return np.asarray(numpy_helper.to_array(copy), order="C")
