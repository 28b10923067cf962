"""The torch ops handler: `NumpyOps`' method names over torch tensors.

A pointwise operator's `apply(o, *xs)` runs unchanged on torch tensors with `o = TORCH`, on any
torch device. Every method also takes `out=`: the fused-pointwise code generator
(`pointwise.py`) calls these functions with an output buffer, so a fused group writes into its
arena slot and updates it in place instead of allocating one tensor per operation.

Semantics follow `NumpyOps` (the reference): integer division truncates toward zero, `mod` takes
the divisor's sign, `sign(nan)` is nan, `round` is half to even, constants take the dtype of the
value they combine with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from pygraphx.ops.handler import accumulation_dtype, compute_dtype, library_primitives
from pygraphx.targets.torch_lowering.dtypes import numpy_dtype, python_scalar, torch_dtype

Tensor = torch.Tensor


def _into(result: Tensor, out: Tensor | None) -> Tensor:
    if out is None:
        return result
    out.copy_(result)
    return out


def _div(x: Tensor, y: Tensor, *, out: Tensor | None = None) -> Tensor:
    if x.is_floating_point():
        return torch.div(x, y, out=out)
    return torch.div(x, y, rounding_mode="trunc", out=out)


def _sign(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    if not x.is_floating_point():
        return torch.sign(x, out=out)
    nan = torch.isnan(x)  # taken first: `out` may be `x`
    r = torch.sign(x, out=out)
    return r.masked_fill_(nan, float("nan"))


def _isnan(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch.ne(x, x, out=out)


def _isinf(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return _into(torch.isinf(x), out)


def _constant(value: Any, like: Any) -> Tensor:
    """A 0-d tensor of `like`'s dtype (broadcasts against it, takes part in no promotion)."""
    dtype = like.dtype if isinstance(like.dtype, torch.dtype) else torch_dtype(like.dtype)
    device = getattr(like, "device", None)
    return torch.tensor(python_scalar(value, dtype), dtype=dtype, device=device)


def _cast(x: Tensor, dtype: Any, *, out: Tensor | None = None) -> Tensor:
    if out is not None:
        return out.copy_(x)
    return x.to(torch_dtype(dtype))


def _cast_finite(x: Tensor, dtype: Any, *, out: Tensor | None = None) -> Tensor:
    """`cast`, then the infinities the cast made out of finite values replaced by the signed
    largest finite value. On the CPU a pass finding the result's extremes decides whether any
    infinity came out (most often none: the cast alone); on devices the check is branch-free
    (no synchronisation, graph capture keeps working)."""
    y = _cast(x, dtype, out=out)
    if y.numel() == 0 or not y.is_floating_point():
        return y
    if x.is_floating_point() and torch.finfo(y.dtype).max >= torch.finfo(x.dtype).max:
        return y  # a widening cast (bf16 -> float32) makes no infinity of a finite value
    if y.device.type == "cpu":
        low, high = torch.aminmax(y)
        if bool(low > -math.inf) and bool(high < math.inf):  # also False for NaN: checked below
            return y
    top = torch.finfo(y.dtype).max
    made = torch.isinf(y) & ~torch.isinf(x)  # infinities from finite values (not from NaN)
    return y.masked_fill_(made & (x > 0), top).masked_fill_(made & (x < 0), -top)


def _gelu(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch._C._nn.gelu(x, out=out) if out is not None else torch._C._nn.gelu(x)


def _gelu_tanh(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    if out is None:
        return torch._C._nn.gelu(x, approximate="tanh")
    return torch._C._nn.gelu(x, approximate="tanh", out=out)


def _silu(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch._C._nn.silu(x, out=out) if out is not None else torch._C._nn.silu(x)


def _acc(x: Tensor) -> torch.dtype:
    return torch_dtype(accumulation_dtype(numpy_dtype(x.dtype)))


def _reduce_sum(x: Tensor, axes: Sequence[int], *, out: Tensor | None = None) -> Tensor:
    return torch.sum(x, list(axes), keepdim=True, dtype=_acc(x), out=out)


def _reduce_prod(x: Tensor, axes: Sequence[int], *, out: Tensor | None = None) -> Tensor:
    r = x.to(_acc(x))
    for a in sorted(axes):
        r = torch.prod(r, a, keepdim=True)
    return _into(r, out)


def _reduce_max(x: Tensor, axes: Sequence[int], *, out: Tensor | None = None) -> Tensor:
    if any(x.shape[a] == 0 for a in axes):  # empty: the type's lowest, as numpy's `initial`
        return _into(_filled(x, axes, numpy_lowest(x.dtype)), out)
    return torch.amax(x, list(axes), keepdim=True, out=out)


def _reduce_min(x: Tensor, axes: Sequence[int], *, out: Tensor | None = None) -> Tensor:
    if any(x.shape[a] == 0 for a in axes):
        return _into(_filled(x, axes, numpy_highest(x.dtype)), out)
    return torch.amin(x, list(axes), keepdim=True, out=out)


def _reduce_mean(x: Tensor, axes: Sequence[int], *, out: Tensor | None = None) -> Tensor:
    total = _reduce_sum(x, axes)
    count = 1
    for a in axes:
        count *= x.shape[a]
    return _into(total / count if count else total, out)


def _filled(x: Tensor, axes: Sequence[int], value: Any) -> Tensor:
    lens = [1 if k in axes else n for k, n in enumerate(x.shape)]
    return torch.full(lens, value, dtype=x.dtype, device=x.device)


def numpy_lowest(dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min if not dtype.is_floating_point else -math.inf


def numpy_highest(dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max if not dtype.is_floating_point else math.inf


def _hardswish(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch._C._nn.hardswish(x, out=out) if out is not None else torch._C._nn.hardswish(x)


def _mish(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch._C._nn.mish(x, out=out) if out is not None else torch._C._nn.mish(x)


def _softplus(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    # threshold 20: x itself above 20, where log(1 + exp(x)) - x < 3e-9
    if out is None:
        return torch._C._nn.softplus(x, 1, 20)
    return torch._C._nn.softplus(x, 1, 20, out=out)


@library_primitives(
    torch,
    """add sub mul neg abs fmod mod=remainder pow round maximum minimum fmax fmin floor ceil
    recip=reciprocal exp log sqrt rsqrt erf sigmoid sin cos tan asin acos atan sinh cosh tanh
    asinh acosh atanh equal=eq less=lt greater=gt less_equal=le greater_equal=ge logical_and
    logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor bitwise_not where""",
    div=_div,
    sign=_sign,
    isnan=_isnan,
    isinf=_isinf,
    constant=_constant,
    cast=_cast,
    cast_finite=_cast_finite,
    compute_dtype=compute_dtype,
    reduce_sum=_reduce_sum,
    reduce_prod=_reduce_prod,
    reduce_max=_reduce_max,
    reduce_min=_reduce_min,
    reduce_mean=_reduce_mean,
    # native activations: ops/activation.py's operators call these instead of their
    # decomposition (one torch kernel, one pass over memory)
    gelu=_gelu,
    gelu_tanh=_gelu_tanh,
    silu=_silu,
    hardswish=_hardswish,
    mish=_mish,
    softplus=_softplus,
)
class TorchOps:
    """The torch ops handler (method names and semantics of `NumpyOps`): torch's functions
    from the table above (`round` is half to even, as numpy and ONNX), and ours where torch
    differs from numpy or takes no `out=`."""


TORCH = TorchOps()
