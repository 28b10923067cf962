"""Lowering the IR to torch calls, for any torch device (the `cpu` target, later the `gpu` one).

`lower_module(module, device, options)` turns an optimised module into pre-bound steps over
torch tensors (`lower.py` and the `lower_*` modules: one small function per op family, numpy
fallback for the rest); `TORCH` is the ops handler that runs pointwise math on tensors
(`handler.py`); `pointwise.py` compiles fused element-wise groups into in-place torch code;
`conv_fusion.py` holds the CPU's oneDNN convolution path.
"""

from __future__ import annotations

from pygraphx.targets.torch_lowering.handler import TORCH, TorchOps
from pygraphx.targets.torch_lowering.lower import Lowered, lower_module

__all__ = ["TORCH", "Lowered", "TorchOps", "lower_module"]
