"""Real-architecture ONNX fixtures exported from PyTorch with random weights.

Each builder constructs a well-known network (ResNet-50, MobileNetV2, BERT-base, GPT-2 small),
initialises it deterministically, exports it with the TorchScript ONNX exporter (opset 17,
constant folding on) and returns ``(onnx_bytes, inputs)`` where ``inputs`` maps each graph input
name to a numpy array drawn from a fixed seed.

The CNNs are written here by hand (torchvision is not available in this environment) and follow
the torchvision layer layout.  Randomly initialised CNNs produce almost-constant, near-zero
outputs because every BatchNorm layer sits at its default running statistics; we therefore
re-estimate the BN statistics on a few random batches before export so the logits have a
sensible spread and numerical comparisons are meaningful.

``export_cached`` stores exports on disk keyed by a version string (plus a hash of this file),
so the slow export runs once and edits here invalidate stale files automatically.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = [
    "BUILDERS",
    "EXPORT_VERSION",
    "MODEL_NAMES",
    "MobileNetV2",
    "ResNet50",
    "bert_base",
    "cache_key",
    "export_cached",
    "gpt2",
    "load_inputs",
    "mobilenetv2",
    "resnet50",
]

#: Bump to invalidate every cached export (the source hash below also changes on any edit).
EXPORT_VERSION = "1"

OPSET = 17
TORCH_SEED = 0
NUMPY_SEED = 1234

ExportResult = tuple[bytes, dict[str, np.ndarray]]


# --------------------------------------------------------------------------------------------
# ResNet-50 (torchvision v1.5 layout)
# --------------------------------------------------------------------------------------------


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, groups=groups, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: the stride lives on the 3x3 convolution."""

    expansion = 4

    def __init__(
        self, in_ch: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        out_ch = planes * self.expansion
        self.conv1 = _conv1x1(in_ch, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, out_ch)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class ResNet50(nn.Module):
    """ResNet-50 with torchvision's module structure: stem, 4 stages of [3, 4, 6, 3], fc."""

    def __init__(self, num_classes: int = 1000, layers: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.in_ch = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_stage(64, layers[0], stride=1)
        self.layer2 = self._make_stage(128, layers[1], stride=2)
        self.layer3 = self._make_stage(256, layers[2], stride=2)
        self.layer4 = self._make_stage(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        out_ch = planes * Bottleneck.expansion
        downsample: nn.Module | None = None
        if stride != 1 or self.in_ch != out_ch:
            downsample = nn.Sequential(_conv1x1(self.in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))
        stage = [Bottleneck(self.in_ch, planes, stride, downsample)]
        self.in_ch = out_ch
        stage.extend(Bottleneck(self.in_ch, planes) for _ in range(1, blocks))
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# --------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision layout, width multiplier 1.0)
# --------------------------------------------------------------------------------------------


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to a multiple of ``divisor`` without dropping more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


class ConvBNReLU6(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + ReLU6, 'same' padding for odd kernels."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise (3x3) -> linear projection (1x1), residual when shapes match."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(in_ch * expand_ratio))
        self.use_res_connect = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(in_ch, hidden, kernel=1))
        layers.append(ConvBNReLU6(hidden, hidden, kernel=3, stride=stride, groups=hidden))
        layers.append(nn.Conv2d(hidden, out_ch, 1, bias=False))
        layers.append(nn.BatchNorm2d(out_ch))
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return x + y if self.use_res_connect else y


class MobileNetV2(nn.Module):
    """MobileNetV2 with torchvision's settings table, last channel 1280, dropout 0.2."""

    # expand ratio t, output channels c, repeats n, first stride s
    SETTINGS: tuple[tuple[int, int, int, int], ...] = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(
        self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2
    ) -> None:
        super().__init__()
        in_ch = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNReLU6(3, in_ch, stride=2)]
        for t, c, n, s in self.SETTINGS:
            out_ch = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(in_ch, out_ch, s if i == 0 else 1, t))
                in_ch = out_ch
        features.append(ConvBNReLU6(in_ch, self.last_channel, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes)
        )

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


# --------------------------------------------------------------------------------------------
# Export helpers
# --------------------------------------------------------------------------------------------


def _recalibrate_batchnorm(
    model: nn.Module, shape: tuple[int, ...], batches: int = 4, batch_size: int = 8
) -> None:
    """Re-estimate BN running stats on random data so eval-mode activations are well scaled."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.momentum = None  # cumulative moving average over all calibration batches
        bn.reset_running_stats()
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch_size, *shape))
    model.eval()


def _export(model: nn.Module, inputs: dict[str, np.ndarray], output_names: list[str]) -> bytes:
    """Export ``model`` (called positionally with ``inputs`` in dict order) to ONNX bytes."""
    model.eval()
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            model,
            args,
            buf,
            input_names=list(inputs),
            output_names=output_names,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    return buf.getvalue()


def _image_input(seed: int = NUMPY_SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}


def resnet50() -> ExportResult:
    """ResNet-50 (v1.5) with random weights and recalibrated BN; input ``input`` [1,3,224,224]."""
    torch.manual_seed(TORCH_SEED)
    model = ResNet50()
    _recalibrate_batchnorm(model, (3, 224, 224))
    inputs = _image_input()
    return _export(model, inputs, ["output"]), inputs


def mobilenetv2() -> ExportResult:
    """MobileNetV2 (width 1.0) with random weights and recalibrated BN; input [1,3,224,224]."""
    torch.manual_seed(TORCH_SEED)
    model = MobileNetV2()
    _recalibrate_batchnorm(model, (3, 224, 224))
    inputs = _image_input()
    return _export(model, inputs, ["output"]), inputs


class _BertWrapper(nn.Module):
    """Positional-argument adaptor returning (last_hidden_state, pooler_output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        return out.last_hidden_state, out.pooler_output


class _GPT2Wrapper(nn.Module):
    """Positional-argument adaptor returning the LM logits only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
        )
        return out.logits


def bert_base(seq_len: int = 128) -> ExportResult:
    """BERT-base (random weights, eager attention); inputs int64 [1, seq_len].

    The attention mask pads the last eighth of the sequence so masking is exercised, and the
    token types split the sequence into two segments.
    """
    from transformers import BertConfig, BertModel

    torch.manual_seed(TORCH_SEED)
    # transformers 5 takes the attention backend on the config, not the model constructor.
    config = BertConfig(attn_implementation="eager")
    model = BertModel(config).eval()
    assert model.config._attn_implementation == "eager"
    rng = np.random.default_rng(NUMPY_SEED)
    input_ids = rng.integers(0, config.vocab_size, size=(1, seq_len), dtype=np.int64)
    attention_mask = np.ones((1, seq_len), dtype=np.int64)
    attention_mask[:, seq_len - seq_len // 8 :] = 0
    token_type_ids = np.zeros((1, seq_len), dtype=np.int64)
    token_type_ids[:, seq_len // 2 :] = 1
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
    onnx_bytes = _export(_BertWrapper(model), inputs, ["last_hidden_state", "pooler_output"])
    return onnx_bytes, inputs


def gpt2(seq_len: int = 128) -> ExportResult:
    """GPT-2 small LM head (random weights, eager attention, no KV cache); output ``logits``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(TORCH_SEED)
    config = GPT2Config(use_cache=False, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    assert model.config._attn_implementation == "eager"
    rng = np.random.default_rng(NUMPY_SEED)
    inputs = {
        "input_ids": rng.integers(0, config.vocab_size, size=(1, seq_len), dtype=np.int64),
        "attention_mask": np.ones((1, seq_len), dtype=np.int64),
    }
    return _export(_GPT2Wrapper(model), inputs, ["logits"]), inputs


BUILDERS: dict[str, Callable[[], ExportResult]] = {
    "resnet50": resnet50,
    "mobilenetv2": mobilenetv2,
    "bert_base": bert_base,
    "gpt2": gpt2,
}
MODEL_NAMES: tuple[str, ...] = tuple(BUILDERS)


# --------------------------------------------------------------------------------------------
# Disk cache
# --------------------------------------------------------------------------------------------


def cache_key(*extra_sources: Path) -> str:
    """Version string that names cache files: manual version, library versions, and a hash of
    this file's source plus ``extra_sources`` (the files of other builders using this cache)."""
    import transformers

    source = b"".join(path.read_bytes() for path in (Path(__file__), *extra_sources))
    digest = hashlib.sha256(source).hexdigest()[:10]
    return (
        f"v{EXPORT_VERSION}-torch{torch.__version__}-tf{transformers.__version__}-{digest}"
    ).replace("+", "_")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (POSIX); serialises exports across pytest-xdist workers."""
    try:
        import fcntl
    except ImportError:  # non-POSIX: fall back to atomic renames only
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _atomic_write(path: Path, writer: Callable[[Path], None]) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_inputs(npz_path: Path) -> dict[str, np.ndarray]:
    """Read inputs saved by :func:`export_cached`, preserving the graph-input order."""
    with np.load(npz_path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def export_cached(
    name: str,
    cache_dir: str | os.PathLike[str],
    builders: dict[str, Callable[[], ExportResult]] | None = None,
    key: str | None = None,
) -> tuple[Path, dict[str, np.ndarray]]:
    """Export model ``name`` into ``cache_dir`` once and return ``(onnx_path, inputs)``.

    ``builders`` defaults to :data:`BUILDERS` and ``key`` to :func:`cache_key`; other model
    collections (``benchmarks/zoo.py``) pass their own. Files are named ``<name>-<key>.onnx`` /
    ``.npz``; exports from older keys for the same model are deleted when a new one is written.
    """
    builders = BUILDERS if builders is None else builders
    if name not in builders:
        raise KeyError(f"unknown exported model {name!r}; choose from {tuple(builders)}")
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{key or cache_key()}"
    onnx_path = directory / f"{stem}.onnx"
    npz_path = directory / f"{stem}.npz"

    with _file_lock(directory / f"{name}.lock"):
        if not (onnx_path.exists() and npz_path.exists()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer/deprecation chatter from the exporter
                onnx_bytes, inputs = builders[name]()
            for stale in directory.glob(f"{name}-*"):
                if stale.suffix in (".onnx", ".npz"):
                    stale.unlink(missing_ok=True)
            _atomic_write(npz_path, lambda p: _save_npz(p, inputs))
            _atomic_write(onnx_path, lambda p: p.write_bytes(onnx_bytes))
    return onnx_path, load_inputs(npz_path)


def _save_npz(path: Path, inputs: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as handle:  # file handle so numpy does not append ".npz"
        np.savez(handle, **inputs)
