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

from pygraphx.ops.handler import accumulation_dtype, compute_dtype
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


def _bitwise_not(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch.bitwise_not(x, out=out)


def _constant(value: Any, like: Any) -> Tensor:
    """A 0-d tensor of `like`'s dtype (broadcasts against it, takes part in no promotion)."""
    dtype = like.dtype if isinstance(like.dtype, torch.dtype) else torch_dtype(like.dtype)
    device = getattr(like, "device", None)
    return torch.tensor(python_scalar(value, dtype), dtype=dtype, device=device)


def _cast(x: Tensor, dtype: Any, *, out: Tensor | None = None) -> Tensor:
    if out is not None:
        return out.copy_(x)
    return x.to(torch_dtype(dtype))


def _sigmoid(x: Tensor, *, out: Tensor | None = None) -> Tensor:
    return torch.sigmoid(x, out=out)


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


class TorchOps:
    """The torch ops handler (method names and semantics of `NumpyOps`)."""

    # arithmetic
    add = staticmethod(torch.add)
    sub = staticmethod(torch.sub)
    mul = staticmethod(torch.mul)
    div = staticmethod(_div)
    neg = staticmethod(torch.neg)
    abs = staticmethod(torch.abs)
    sign = staticmethod(_sign)
    maximum = staticmethod(torch.maximum)
    minimum = staticmethod(torch.minimum)
    fmax = staticmethod(torch.fmax)
    fmin = staticmethod(torch.fmin)
    floor = staticmethod(torch.floor)
    ceil = staticmethod(torch.ceil)
    fmod = staticmethod(torch.fmod)
    mod = staticmethod(torch.remainder)
    pow = staticmethod(torch.pow)
    round = staticmethod(torch.round)  # half to even, as numpy and ONNX
    recip = staticmethod(torch.reciprocal)
    # transcendental
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    sqrt = staticmethod(torch.sqrt)
    rsqrt = staticmethod(torch.rsqrt)
    erf = staticmethod(torch.erf)
    sigmoid = staticmethod(_sigmoid)
    sin = staticmethod(torch.sin)
    cos = staticmethod(torch.cos)
    tan = staticmethod(torch.tan)
    asin = staticmethod(torch.asin)
    acos = staticmethod(torch.acos)
    atan = staticmethod(torch.atan)
    sinh = staticmethod(torch.sinh)
    cosh = staticmethod(torch.cosh)
    tanh = staticmethod(torch.tanh)
    asinh = staticmethod(torch.asinh)
    acosh = staticmethod(torch.acosh)
    atanh = staticmethod(torch.atanh)
    isnan = staticmethod(_isnan)
    isinf = staticmethod(_isinf)
    # comparison and logic
    equal = staticmethod(torch.eq)
    less = staticmethod(torch.lt)
    greater = staticmethod(torch.gt)
    less_equal = staticmethod(torch.le)
    greater_equal = staticmethod(torch.ge)
    logical_and = staticmethod(torch.logical_and)
    logical_or = staticmethod(torch.logical_or)
    logical_xor = staticmethod(torch.logical_xor)
    logical_not = staticmethod(torch.logical_not)
    bitwise_and = staticmethod(torch.bitwise_and)
    bitwise_or = staticmethod(torch.bitwise_or)
    bitwise_xor = staticmethod(torch.bitwise_xor)
    bitwise_not = staticmethod(_bitwise_not)
    where = staticmethod(torch.where)
    # native activations: ops/activation.py's operators call these instead of their
    # decomposition (one torch kernel, one pass over memory)
    gelu = staticmethod(_gelu)
    gelu_tanh = staticmethod(_gelu_tanh)
    silu = staticmethod(_silu)
    hardswish = staticmethod(_hardswish)
    mish = staticmethod(_mish)
    softplus = staticmethod(_softplus)
    # values
    constant = staticmethod(_constant)
    cast = staticmethod(_cast)
    compute_dtype = staticmethod(compute_dtype)
    # reductions (kept axes, accumulation_dtype)
    reduce_sum = staticmethod(_reduce_sum)
    reduce_prod = staticmethod(_reduce_prod)
    reduce_max = staticmethod(_reduce_max)
    reduce_min = staticmethod(_reduce_min)
    reduce_mean = staticmethod(_reduce_mean)


TORCH = TorchOps()
