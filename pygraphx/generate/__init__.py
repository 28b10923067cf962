"""Text generation with decoder ONNX models that carry a KV cache (past/present tensors).

`generate(model, input_ids, max_new_tokens=...)` runs prefill then decode, greedy or sampled;
`DecoderSession` holds one compiled decoder (reuse it across calls); `export` writes tiny
transformers decoders (GPT-2, Llama, Qwen2) to ONNX with the KV cache as inputs and outputs.
"""

from __future__ import annotations

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
