"""Text generation with decoder ONNX models that carry a KV cache (past/present tensors).

`generate(model, input_ids, max_new_tokens=...)` runs prefill then decode, greedy or sampled;
`DecoderSession` holds one compiled decoder (reuse it across calls); `export` writes tiny
transformers decoders (GPT-2, Llama, Qwen2) to ONNX with the KV cache as inputs and outputs.

The package itself is callable, so the public API reads `pygraphx.generate(model, ids, ...)`
while `pygraphx.generate.export` etc. stay importable as modules (a function bound to the name
`pygraphx.generate` would hide the package).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from pygraphx.generate.loop import GenerationResult, generate, run_generation
from pygraphx.generate.sampling import SamplingConfig, filtered_probs, next_tokens
from pygraphx.generate.session import DecoderSession, GenerateError, bucket

__all__ = [
    "DecoderSession",
    "GenerateError",
    "GenerationResult",
    "SamplingConfig",
    "bucket",
    "filtered_probs",
    "generate",
    "next_tokens",
    "run_generation",
]


class _CallablePackage(types.ModuleType):
    """This package's module type: calling it calls `generate`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
