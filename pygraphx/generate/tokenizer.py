"""Text in and out when a tokenizer is at hand: a `tokenizer.json` beside the model file, read
with the `tokenizers` package. Without one, `generate` takes and returns token ids only."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


class TokenizerUnavailableError(RuntimeError):
    """Text was given but no tokenizer could be loaded for the model."""


def tokenizer_beside(model_path: str | Path | None) -> Any:
    """The `tokenizers.Tokenizer` in `tokenizer.json` next to `model_path`, else None."""
    if model_path is None:
        return None
    path = Path(model_path)
    candidate = (path if path.is_dir() else path.parent) / TOKENIZER_FILE
    if not candidate.is_file():
        return None
    try:
        tokenizers = importlib.import_module("tokenizers")
    except ImportError as exc:
        raise TokenizerUnavailableError(
            f"{candidate} is there but the 'tokenizers' package is not installed ({exc}); "
            "pip install tokenizers, or pass token ids"
        ) from exc
    return tokenizers.Tokenizer.from_file(str(candidate))


def encode(tokenizer: Any, texts: list[str], source: str) -> list[list[int]]:
    if tokenizer is None:
        raise TokenizerUnavailableError(
            f"text prompt given but no {TOKENIZER_FILE} beside {source}; pass token ids or "
            "tokenizer=..."
        )
    return [list(tokenizer.encode(t).ids) for t in texts]


def decode(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    return [tokenizer.decode(r) for r in rows]
