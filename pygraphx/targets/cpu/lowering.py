"""The cpu target's lowerings, handed to `targets/torch_lowering` as `lowering_overrides`.

* `dot` and `fused_reduce`: attention blocks (`softmax(Q K^T * s + mask) V`) recognised and
  run as one `scaled_dot_product_attention` call (torch's fused CPU kernel: the score matrix
  is never written out), see `torch_lowering/attention.py`; every other product and reduction
  lowers as the torch lowering does.

The setting `attention=False` turns the recognition off (to compare).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.attention import with_attention
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.lower import LOWERINGS, _load_lowerings

Lowering = Callable[[LoweringContext, Instruction], bool]


def cpu_overrides(options: dict[str, Any]) -> dict[str, Lowering]:
    """Op name -> lowering for the cpu target (see the module docstring)."""
    _load_lowerings()
    overrides: dict[str, Lowering] = {}
    if options.get("attention", True):
        overrides.update(with_attention(LOWERINGS["dot"], LOWERINGS["fused_reduce"]))
    return overrides
