"""Attention recognition for the gpu target: the shared matcher of
`targets/torch_lowering/attention.py` (the cpu target uses it too), re-exported here."""

from pygraphx.targets.torch_lowering.attention import (
    MASKED_FILL,
    Pattern,
    lower_attention_dot,
    lower_attention_softmax,
    match_prologue,
)

__all__ = [
    "MASKED_FILL",
    "Pattern",
    "lower_attention_dot",
    "lower_attention_softmax",
    "match_prologue",
]
