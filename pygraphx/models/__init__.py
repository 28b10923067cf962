"""The project's built-in model zoo: ONNX demo models built in code, with no download.

Every CLI demo (the driver's ``--model NAME``) and many tests take their networks from here.
Each builder writes an opset-17 ``onnx.ModelProto`` with ``onnx.helper`` and seeded random
weights, in the node layout that ``torch.onnx.export`` gives for the matching torchvision /
HuggingFace model. This module is the registry:

* :func:`list_models` - the known names;
* :func:`get_model` - build one model for a batch size / sequence length / seed;
* :func:`model_inputs` - valid random inputs for a built model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from pygraphx.models.bert import BERT_BASE, build_bert
from pygraphx.models.gpt2 import GPT2_SMALL, build_gpt2
from pygraphx.models.mobilenetv2 import build_mobilenetv2
from pygraphx.models.resnet50 import build_resnet50

__all__ = ["get_model", "list_models", "model_inputs"]


@dataclass(frozen=True)
class _Entry:
    build: Callable[[int, int, int], onnx.ModelProto]  # (batch, seq_len, seed)
    vocab_size: int = 0  # for token-id inputs; 0 for image models


_REGISTRY: dict[str, _Entry] = {
    "resnet50": _Entry(lambda b, s, seed: build_resnet50(batch=b, seed=seed)),
    "mobilenetv2": _Entry(lambda b, s, seed: build_mobilenetv2(batch=b, seed=seed)),
    "bert_base": _Entry(
        lambda b, s, seed: build_bert(batch=b, seq_len=s, seed=seed), BERT_BASE.vocab_size
    ),
    "gpt2": _Entry(
        lambda b, s, seed: build_gpt2(batch=b, seq_len=s, seed=seed), GPT2_SMALL.vocab_size
    ),
}

_TYPE_VOCAB = BERT_BASE.type_vocab


def list_models() -> list[str]:
    """Names accepted by :func:`get_model`, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
    key = name.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return _REGISTRY[key]


def get_model(name: str, *, batch: int = 1, seq_len: int = 128, seed: int = 0) -> onnx.ModelProto:
    """Build the built-in model ``name`` (``seq_len`` is ignored by the image models)."""
    entry = _entry(name)
    if batch < 1 or seq_len < 1:
        raise ValueError(f"batch and seq_len must be >= 1, got {batch}, {seq_len}")
    return entry.build(batch, seq_len, seed)


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        raise ValueError(f"input {vi.name!r} has a symbolic shape; build with a static one")
    return tuple(d.dim_value for d in dims)


def model_inputs(name: str, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random valid inputs for ``model`` (built by ``get_model(name, ...)``), keyed by name.

    Images are float32 standard normal; ``input_ids`` are int64 in ``[0, vocab)``;
    ``token_type_ids`` int64 in ``[0, 2)``; ``attention_mask`` is all ones (int64).
    """
    entry = _entry(name)
    rng = np.random.default_rng(seed)
    init_names = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        shape = _static_shape(vi)
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(0, entry.vocab_size, shape, dtype=np.int64)
        elif vi.name == "token_type_ids":
            feeds[vi.name] = rng.integers(0, _TYPE_VOCAB, shape, dtype=np.int64)
        elif vi.name == "attention_mask":
            feeds[vi.name] = np.ones(shape, dtype=np.int64)
        else:
            elem = vi.type.tensor_type.elem_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
            feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    return feeds
