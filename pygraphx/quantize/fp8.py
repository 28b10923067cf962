"""quantize_fp8: calibrated fp8 (e4m3) quantisation of `dot` and `convolution` (MIGraphX's).

`quantize_fp8(prog, target, calibration)` follows `quantize_int8` step for step (the shared
code is `int8.quantize_qdq`), with fp8 e4m3 (`fp8e4m3fn_type`, largest finite value 448) as
the quantised type:

* activations: `quantizelinear` -> `dequantizelinear` with one scale per tensor,
  `scale = max|x| / 448` over the calibration samples (or a percentile of |x|);
* constant weights: an fp8 literal per output channel, `scale[c] = max|w[c]| / 448`, and a
  `dequantizelinear`;
* rounding to nearest even in e4m3 with saturation at +-448 (`ops/quant.py`).

The products stay `dot` / `convolution` of the dequantised fp8 values: on `ref` the program is
the exact oracle of fp8 inference with float32 accumulation. Only the gpu target has fp8
kernels (`FP8_GEMM_TARGETS`); on the others the products run in float32 after dequantising (the
numbers are fp8's, the speed is not); `quantize_fp8` says so once with a warning for a target
other than `ref`. Without calibration data the activations take the default step of `quantize_int8`
(1/64, so values beyond +-7 saturate), with a loud warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from pygraphx.ir.program import Program
from pygraphx.quantize.int8 import QuantFormat, quantize_qdq

__all__ = ["FP8", "FP8_GEMM_TARGETS", "quantize_fp8"]

_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8 = QuantFormat("fp8", "fp8e4m3fn_type", _E4M3, float(ml_dtypes.finfo(_E4M3).max))
#: targets that run fp8 products as fp8 GEMMs (gpu: the `dot`s and, with
#: `PGX_GPU_FP8_CONV=triton`, the convolutions, `passes/fold_fp8.py`; ref is the oracle, not a
#: fast path)
FP8_GEMM_TARGETS: frozenset[str] = frozenset({"gpu"})
_warned: set[str] = set()


def quantize_fp8(
    prog: Program,
    target: Any = "ref",
    calibration: Sequence[Mapping[str, Any]] | None = None,
    ins_names: Iterable[str] = ("dot", "convolution"),
    method: str = "max",
    percentile: float = 99.99,
    smooth: float | None = None,
    keep_float: int = 0,
    dynamic: bool = False,
    activation_products: bool = True,
    residuals: bool = False,
) -> None:
    """Quantise the uncompiled float `prog` in place to fp8 e4m3 `dot` / `convolution` inputs.

    The float program is run over `calibration` to choose the activations' scales
    (`max|x| / 448`, one per tensor); weights are quantised per output channel. The products
    compute in float32 on the dequantised fp8 values (see the module docstring).

    Args:
        prog: a parsed, not yet compiled program with static input shapes.
        target: where the calibration runs (a target or its name; `ref` by default); a target
            without fp8 GEMM kernels (every one but `ref`, the oracle) gets a warning that the
            products run as float32 maths.
        calibration, ins_names, method, percentile, smooth, keep_float, dynamic,
            activation_products, residuals: as for `quantize_int8` (sample inputs; the
            operators; the activation statistic, "max" or "percentile"; the SmoothQuant alpha or
            None; how many most peaked layers stay float; run-time per-row scales for the dots'
            activations; False: products of two activations, attention's, stay float; True:
            residual adds' other operands quantised too, `residual.py`).

    Raises:
        QuantizeError: `prog` is compiled or dynamic, or an argument is not valid.

    Example:
        >>> prog = pygraphx.parse_onnx("resnet50.onnx")
        >>> samples = [{"data": image} for image in calibration_images]
        >>> pygraphx.quantize_fp8(prog, pygraphx.get_target("ref"), samples)
        >>> prog.compile(pygraphx.get_target("ref"))
    """
    quantize_qdq(
        prog, target, calibration, ins_names, method, percentile, FP8, smooth, keep_float, dynamic,
        activation_products, residuals,
    )  # fmt: skip
    _announce_float_products(target)


def _announce_float_products(target: Any) -> None:
    """Warn once per target name that its fp8 products run as float32 maths."""
    name = target if isinstance(target, str) else getattr(target, "name", str(target))
    if name == "ref" or name in FP8_GEMM_TARGETS or name in _warned:
        return
    _warned.add(name)
    message = (
        f"quantize_fp8: target {name!r} has no fp8 GEMM kernel in pygraphx yet, so the fp8 "
        "dot/convolution run as float32 maths on dequantised fp8 values: the results are the "
        "fp8 program's, but it is not faster than float32 (quantise/dequantise add time)"
    )
    warnings.warn(message, UserWarning, stacklevel=3)
