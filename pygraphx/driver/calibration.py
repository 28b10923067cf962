"""Calibration samples for `--int8` / `--fp8`: read, checked, from a `.npz` file.

The file (written with `numpy.savez`) holds several samples of the model's inputs, in either
layout, per input:

* one array named `<input>` with a leading sample axis: shape `(S, *input_lens)` holds S
  samples (an array of exactly the input's lens is one sample);
* arrays named `<input>_0`, `<input>_1`, ... each of the input's lens, one per sample.

Every input of the program needs the same number of samples; values are cast to the input's
type (floats to an integer input are refused unless they are whole numbers). An array that
names no input is an error (a misspelt name would otherwise be ignored). `--calibration-samples
N` keeps the first N samples; the rest are held out (`verify --int8` measures on them).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pygraphx.driver.errors import DriverError
from pygraphx.ir.shape import Shape

__all__ = ["FORMAT_HELP", "read_calibration"]

#: the format in one sentence, for --help
FORMAT_HELP = (
    "a .npz file (numpy.savez) of sample inputs: per input an array named INPUT with a leading "
    "sample axis (shape S x the input's lens), or arrays INPUT_0, INPUT_1, ... of the input's lens"
)


def read_calibration(path: str, shapes: Mapping[str, Shape]) -> list[dict[str, np.ndarray]]:
    """The samples in `path` as [{input name: array}], checked against the program's input
    `shapes`; a `DriverError` naming the file and the input for anything wrong."""
    arrays = _load(path)
    per_input: dict[str, list[np.ndarray]] = {}
    used: set[str] = set()
    for name, shape in shapes.items():
        per_input[name] = _samples_of(path, name, shape, arrays, used)
    unused = sorted(set(arrays) - used)
    if unused:
        raise DriverError(
            f"--calibration {path}: array(s) {', '.join(unused)} name no input of the model "
            f"(its inputs: {', '.join(shapes)}); {FORMAT_HELP}"
        )
    counts = {name: len(samples) for name, samples in per_input.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise DriverError(
            f"--calibration {path}: the inputs have different numbers of samples ({listed})"
        )
    count = next(iter(counts.values()), 0)
    return [{name: per_input[name][k] for name in shapes} for k in range(count)]


def _load(path: str) -> dict[str, np.ndarray]:
    if not Path(path).is_file():
        raise DriverError(f"--calibration {path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise DriverError(
                f"--calibration {path}: a single array (.npy), not a .npz file; {FORMAT_HELP}"
            )
        with data:
            return {key: data[key] for key in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DriverError(
            f"--calibration {path}: cannot be read as a .npz file ({exc}); {FORMAT_HELP}"
        ) from None


def _samples_of(
    path: str, name: str, shape: Shape, arrays: Mapping[str, np.ndarray], used: set[str]
) -> list[np.ndarray]:
    """Input `name`'s samples from the stacked array `name` or from `name_0`, `name_1`, ..."""
    lens = tuple(shape.lens())
    where = f"--calibration {path}: input {name!r}"
    if name in arrays:
        used.add(name)
        arr = arrays[name]
        if arr.shape == lens:
            return [_cast(where, arr, shape)]
        if arr.ndim == len(lens) + 1 and arr.shape[1:] == lens and arr.shape[0] > 0:
            return [_cast(f"{where} sample {k}", arr[k], shape) for k in range(arr.shape[0])]
        raise DriverError(
            f"{where}: array of shape {arr.shape}; expected (S, {', '.join(map(str, lens))}) "
            f"for S samples of the input's lens {list(lens)}"
        )
    pattern = re.compile(re.escape(name) + r"_(\d+)")
    numbered = sorted(
        (int(m.group(1)), key)
        for key in arrays
        if (m := pattern.fullmatch(key)) and key not in used
    )
    if not numbered:
        raise DriverError(
            f"{where}: no samples (expected an array {name!r} of shape (S, "
            f"{', '.join(map(str, lens))}) or arrays {name}_0, {name}_1, ...); the file holds: "
            f"{', '.join(sorted(arrays)) or 'nothing'}"
        )
    samples = []
    for _index, key in numbered:
        used.add(key)
        arr = arrays[key]
        if arr.shape != lens:
            raise DriverError(f"{where}: {key} has shape {arr.shape}, the input's lens are {lens}")
        samples.append(_cast(f"{where} ({key})", arr, shape))
    return samples


def _cast(where: str, arr: np.ndarray, shape: Shape) -> Any:
    dtype = shape.dtype()
    if arr.dtype == dtype:
        return np.ascontiguousarray(arr)
    if dtype.kind in "iub" and arr.dtype.kind == "f" and not np.all(np.mod(arr, 1) == 0):
        raise DriverError(f"{where}: values are not whole numbers, the input is {shape.type()}")
    if arr.dtype.kind not in "iubf":
        raise DriverError(f"{where}: {arr.dtype} values cannot be cast to {shape.type()}")
    return np.ascontiguousarray(arr.astype(dtype))
