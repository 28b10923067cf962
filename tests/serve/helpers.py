"""Shared pieces of the serving tests: small models in a repository, a running server, and the
oracle (the same ONNX file parsed, compiled and run by `Program.run`, apart from the server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pygraphx.models import get_model
from pygraphx.models.bert import BertConfig, build_bert
from pygraphx.onnx import parse_onnx
from pygraphx.passes.pipeline import optimize
from pygraphx.serve.config import scan_repository
from pygraphx.serve.core import InferenceServer
from pygraphx.serve.server import Ports, ServerThread
from pygraphx.targets import get_target

TINY_BERT = BertConfig(vocab_size=100, hidden=32, layers=2, heads=2, intermediate=64)
SEQ = 8


def tiny_bert() -> onnx.ModelProto:
    return build_bert(seq_len=SEQ, config=TINY_BERT)


def add_model(root: Path, name: str, model: onnx.ModelProto, **config: Any) -> Path:
    """Write `root/name/model.onnx` and its config.json."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, path)
    (folder / "config.json").write_text(json.dumps(config))
    return path


def reference_run(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`Program.run` on the model file at the inputs' own shapes (cpu, optimised, as served)."""
    dims = {k: list(v.shape) for k, v in inputs.items()}
    program = parse_onnx(path, map_input_dims=dims)
    optimize(program)
    program.compile(get_target("cpu"))
    return [np.array(r) for r in program.run(inputs)]


def bert_inputs(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY_BERT.vocab_size, (rows, SEQ), dtype=np.int64)
    mask = np.ones((rows, SEQ), np.int64)
    mask[:, SEQ - 1 - seed % 3 :] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def image(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 224, 224)).astype(np.float32)


@contextmanager
def running(root: Path, **options: Any) -> Iterator[tuple[InferenceServer, Ports]]:
    """A server for the repository at `root` on free loopback ports, stopped afterwards."""
    server = InferenceServer.load(scan_repository(root))
    thread = ServerThread(server, http_port=0, grpc_port=0, **options)
    ports = thread.start()
    try:
        yield server, ports
    finally:
        thread.stop()


def mobilenet() -> onnx.ModelProto:
    return get_model("mobilenetv2")
