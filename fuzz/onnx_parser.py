"""atheris harness: `parse_onnx_buffer` (then compile for `ref`) on mutated model bytes.

Half of the inputs are mutated structurally (decode, change a dim / attribute / output name /
op type / external location / opset, encode: `fuzz.targets.mutate_model`), the rest by
libFuzzer's byte mutator. Any exception other than the project's parse and compile errors is a
crash. Usage (from the repository root; libFuzzer flags pass through):

    python -m fuzz.onnx_parser fuzz/corpus/onnx -max_total_time=600 -rss_limit_mb=4096
"""

from __future__ import annotations

import random
import sys

import atheris

with atheris.instrument_imports(include=["pygraphx"]):
    from fuzz.targets import mutate_model, parse_onnx_bytes


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        mutated = mutate_model(data, rng)
        if mutated is not None and len(mutated) <= max_size:
            return mutated
    return atheris.Mutate(data, max_size)


def main() -> None:
    sys.setrecursionlimit(10_000)  # the default: a deep model must not rely on a larger one
    atheris.Setup(sys.argv, parse_onnx_bytes, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
