"""Model repository layout and per-model configuration of the server.

A repository is a folder with one sub-folder per model, named after the model:

    models/
      resnet50/
        model.onnx          (or model.pgx: a program saved by `pygraphx.save`)
        config.json         optional: the settings of `ModelConfig`, e.g.
                            {"target": "cpu", "max_batch": 8, "batch_window_us": 2000}

A single file (`--onnx FILE` / `--migraphx FILE.pgx`) is a model named after its stem, with the
default settings. Compiled programs are cached next to the model file (see `model.py`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
MODEL_SUFFIXES = (".onnx", ".pgx")


class ConfigError(ValueError):
    """A model repository or config file that cannot be served; the message names the file."""


@dataclass(frozen=True)
class ModelConfig:
    """How one model is served.

    target: "ref", "cpu" or "gpu". precision: "fp32" (as the model is), "fp16" or "bf16".
    optimize: run the optimisation passes before compiling. max_batch: the largest batch the
    dynamic batcher gathers (0: no batch axis, each request runs alone as given).
    batch_window_us: how long the first request of a batch waits for others.
    dynamic_batching: gather concurrent requests into batches (off: each runs alone).
    instances: programs run concurrently (each compiled copy runs one batch at a time).
    queue_size: requests that may wait; more are refused (HTTP 429). timeout_s: a request
    waiting longer fails (HTTP 504). version: the model version the protocol reports.
    """

    target: str = "cpu"
    precision: str = "fp32"
    optimize: bool = True
    max_batch: int = 8
    batch_window_us: int = 2000
    dynamic_batching: bool = True
    instances: int = 1
    queue_size: int = 256
    timeout_s: float = 60.0
    version: str = "1"

    def __post_init__(self) -> None:
        if self.target not in ("ref", "cpu", "gpu"):
            raise ConfigError(f"target must be ref, cpu or gpu, got {self.target!r}")
        if self.precision not in ("fp32", "fp16", "bf16"):
            raise ConfigError(f"precision must be fp32, fp16 or bf16, got {self.precision!r}")
        for name in ("max_batch", "batch_window_us"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("instances", "queue_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str) -> ModelConfig:
        """The config from a JSON object; unknown keys are an error naming the file."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown setting(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**doc)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{source}: {exc}") from None


@dataclass(frozen=True)
class ModelSource:
    """A model to load: its name, its file and its settings."""

    name: str
    path: Path
    config: ModelConfig


def read_config(folder: Path, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """`folder/config.json` (defaults where absent), then `overrides` on top."""
    path = folder / CONFIG_FILE
    doc: dict[str, Any] = {}
    if path.exists():
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: must hold a JSON object of settings")
    return ModelConfig.from_dict({**doc, **(overrides or {})}, str(path))


def scan_repository(root: Path, overrides: dict[str, Any] | None = None) -> list[ModelSource]:
    """The models of a repository folder, one per sub-folder holding a .onnx or .pgx file."""
    if not root.is_dir():
        raise ConfigError(f"{root}: model repository is not a directory")
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = [
            p
            for p in sorted(folder.iterdir())
            if p.suffix in MODEL_SUFFIXES and ".cache" not in p.suffixes
        ]
        if not files:
            continue
        if len(files) > 1:
            names = [p.name for p in files]
            raise ConfigError(f"{folder}: more than one model file {names}; keep one")
        found.append(ModelSource(folder.name, files[0], read_config(folder, overrides)))
    if not found:
        raise ConfigError(f"{root}: no model folders (each needs one .onnx or .pgx file)")
    return found


def single_model(path: Path, overrides: dict[str, Any] | None = None) -> ModelSource:
    """One model file served under its stem, with config.json from its folder if any."""
    if not path.is_file():
        raise ConfigError(f"{path}: model file not found")
    return ModelSource(path.stem, path, read_config(path.parent, overrides))
