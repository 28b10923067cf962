"""Export transformers decoders to ONNX with the KV cache as graph inputs and outputs.

The layout is the one Optimum / ONNX Runtime GenAI exports use: inputs `input_ids`,
`attention_mask` (covering past + new tokens), `position_ids`, then `past_key_values.{i}.key` /
`.value` per layer ([batch, kv_heads, past, head_dim]); outputs `logits` then
`present.{i}.key` / `.value` ([batch, kv_heads, past + seq, head_dim]). Batch, sequence and past
length are dynamic axes. The attention mask always covers exactly past + new tokens (transformers'
mask code reads a padding length from it at trace time, which is then 0 for every shape).

torch and transformers are imported only when an export runs (they are optional dependencies of
pygraphx); a missing one raises `ExportUnavailableError` naming the package.
"""

from __future__ import annotations

import importlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPSET = 17


class ExportUnavailableError(RuntimeError):
    """torch or transformers is missing, so a decoder cannot be exported."""


def _require(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ExportUnavailableError(
            f"exporting a decoder needs the '{name}' package ({exc}); "
            f"install it with: pip install torch transformers"
        ) from exc


@dataclass(frozen=True)
class TinyDecoder:
    """A small random-weight configuration of one transformers decoder architecture."""

    arch: str  # transformers model class name
    config_class: str
    config: dict[str, Any]


# Llama and Qwen2 share one tiny shape: grouped-query attention (4 query heads on 2 KV heads)
_GQA_TINY: dict[str, int] = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

TINY_DECODERS: dict[str, TinyDecoder] = {
    "gpt2_tiny": TinyDecoder(
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=256),
    ),
    "llama_tiny": TinyDecoder("LlamaForCausalLM", "LlamaConfig", dict(_GQA_TINY)),
    "qwen2_tiny": TinyDecoder("Qwen2ForCausalLM", "Qwen2Config", dict(_GQA_TINY)),
}


def tiny_model(name: str, seed: int = 0) -> Any:
    """The transformers model `name` (a key of TINY_DECODERS) with seeded random fp32 weights."""
    if name not in TINY_DECODERS:
        raise ValueError(f"unknown tiny decoder {name!r}; known: {sorted(TINY_DECODERS)}")
    torch = _require("torch")
    transformers = _require("transformers")
    spec = TINY_DECODERS[name]
    config = getattr(transformers, spec.config_class)(**spec.config)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, spec.arch)(config)
    return model.eval()


def kv_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), key then value per layer."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return past, present


def _wrapper(model: Any, last_logits_only: bool) -> Any:
    """A module taking flat tensors (ids, mask, positions, past...) and returning flat ones."""
    torch = _require("torch")
    cache_utils = _require("transformers.cache_utils")

    class FlatCacheDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):  # noqa: ANN001
            cache = cache_utils.DynamicCache(config=self.model.config)
            for layer in range(len(past) // 2):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
                **({"logits_to_keep": 1} if last_logits_only else {}),
            )
            flat = []
            for layer in range(len(past) // 2):
                flat.extend(_layer_kv(out.past_key_values, layer))
            return (out.logits, *flat)

    return FlatCacheDecoder().eval()


def _layer_kv(cache: Any, layer: int) -> tuple[Any, Any]:
    """(key, value) of one layer of a transformers cache (4.x tuples or 5.x layer objects)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache[layer][0], cache[layer][1]


def model_dims(model: Any) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a transformers decoder config."""
    cfg = model.config
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return layers, kv_heads, head_dim


def export_decoder(
    model: Any,
    path: str | Path | None = None,
    last_logits_only: bool = True,
    external_data: str | None = None,
    one_data_file: bool = True,
) -> bytes:
    """Export `model` (a transformers causal LM) to ONNX with past/present KV tensors.

    The example inputs take the model's device and float type (export an fp16 model on the GPU
    as it is). `external_data`: the name of one data file beside `path` that then holds every
    weight (large models: ONNX files are limited to 2 GB); returns b"" in that case.

    `last_logits_only`: `logits` is [batch, 1, vocab], the last position's only (what
    generation needs; transformers' own `generate` computes only those too), which saves the
    LM head's work on the other prompt positions at prefill.

    Returns the model bytes, also written to `path` when given.
    """
    torch = _require("torch")
    if external_data is not None and path is None:
        raise ValueError("external_data needs a path to write the model to")
    layers, kv_heads, head_dim = model_dims(model)
    past_names, present_names = kv_names(layers)
    batch, seq, past_len = 2, 3, 4
    weight = next(model.parameters())
    dev = weight.device
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    mask = torch.ones(batch, past_len + seq, dtype=torch.int64, device=dev)
    pos = torch.arange(past_len, past_len + seq, device=dev).unsqueeze(0).expand(batch, seq)
    pos = pos.contiguous()
    past = [
        torch.randn(batch, kv_heads, past_len, head_dim, dtype=weight.dtype, device=dev)
        for _ in past_names
    ]
    axes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch"} if last_logits_only else {0: "batch", 1: "seq"},
    }
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    buf: Any = io.BytesIO() if external_data is None else str(path)
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer's notes on transformers' Python-side checks (mask padding length, cache
        # initialisation) hold for every shape of this layout; see the module docstring
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*aten::index.*")
        torch.onnx.export(
            _wrapper(model, last_logits_only),
            (ids, mask, pos, *past),
            buf,
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    if external_data is not None:
        if one_data_file or _inline_initialisers(Path(path)):
            _to_one_data_file(Path(path), external_data)
        return b""
    data = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


#: a model file larger than this holds its weights inline (torch wrote it whole, under 2 GB)
INLINE_BYTES = 64 << 20


def _inline_initialisers(path: Path) -> bool:
    """Whether the model at `path` holds its weights inline rather than in data files."""
    return path.stat().st_size > INLINE_BYTES


def _to_one_data_file(path: Path, location: str) -> None:
    """Rewrite the model at `path` with every initialiser in the data file `location` beside
    it (torch writes models over 2 GB with one file per tensor, smaller ones inline)."""
    onnx = _require("onnx")
    proto = onnx.load_model(str(path), load_external_data=False)
    old = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=1024,
    )
    for name in old - {location}:
        (path.parent / name).unlink(missing_ok=True)


def cache_dir() -> Path:
    """Where exported tiny decoders are kept: $PGX_CACHE_DIR, else ~/.cache/pygraphx."""
    root = os.environ.get("PGX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pygraphx"
    )
    return Path(root) / "decoders"


def tiny_decoder_path(name: str, seed: int = 0) -> Path:
    """The ONNX file of tiny decoder `name`, exported on first use and cached per torch and
    transformers version (the export is deterministic for a seed)."""
    torch = _require("torch")
    transformers = _require("transformers")
    folder = cache_dir()
    tag = f"{name}-s{seed}-torch{torch.__version__}-tf{transformers.__version__}".replace("+", "_")
    path = folder / f"{tag}.onnx"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        data = export_decoder(tiny_model(name, seed))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: a concurrent export leaves one whole file
    return path
