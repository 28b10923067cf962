"""atheris harness: `parse_onnx_buffer` (then compile for `ref`) on mutated model bytes.

Half of the inputs are mutated structurally (decode, change a dim / attribute / output name /
op type / external location / opset, encode: `fuzz.targets.mutate_model`), the rest by
libFuzzer's byte mutator. Any exception other than the project's parse and compile errors is a
crash. Usage (from the repository root; libFuzzer flags pass through):

    python -m fuzz.onnx_parser fuzz/corpus/onnx -max_total_time=600 -rss_limit_mb=4096
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["pygraphx"]):
    from fuzz.targets import mixed_mutator, mutate_model, parse_onnx_bytes


def main() -> None:
    sys.setrecursionlimit(10_000)  # the default: a deep model must not rely on a larger one
    mutator = mixed_mutator(mutate_model, lambda data, n: atheris.Mutate(data, n))
    atheris.Setup(sys.argv, parse_onnx_bytes, custom_mutator=mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
