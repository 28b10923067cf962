"""Run the ONNX backend node suite on a pygraphx target and group the failures by cause.

    python tools/node_suite_report.py [--target ref] [--json out.json]

Used to keep the exclusion list of tests/onnx/test_backend_node.py honest: every failing test
is printed with the first line of its error, grouped by the operator it tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from pygraphx.onnx.backend import PygraphxBackend


def _array(x: object) -> object:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def run_case(case, target: str) -> str | None:
    """None when the case passes, else a one-line reason."""
    try:
        rep = PygraphxBackend.prepare(case.model, "CPU", target=target)
        for inputs, expected in case.data_sets:
            inputs = [_array(x) for x in inputs]
            expected = [_array(x) for x in expected]
            outputs = rep.run(inputs)
            if len(outputs) != len(expected):
                return f"{len(outputs)} outputs, expected {len(expected)}"
            for got, want in zip(outputs, expected, strict=True):
                want = np.asarray(want)
                if want.dtype == object:
                    return "expected value is not a tensor"
                if got.dtype != want.dtype:
                    return f"dtype {got.dtype}, expected {want.dtype}"
                if got.shape != want.shape:
                    return f"shape {got.shape}, expected {want.shape}"
                np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
    except AssertionError:
        return "wrong values"
    except Exception as exc:  # the report groups every failure by its message
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="ref")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cases = load_model_tests(kind="node")
    failures: dict[str, str] = {}
    for case in cases:
        reason = run_case(case, args.target)
        if reason is not None:
            failures[case.name] = reason
    passed = len(cases) - len(failures)
    print(f"{passed} of {len(cases)} node tests pass on {args.target}")
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name, reason in failures.items():
        reason = re.sub(r"<buffer>: node '[^']*' ", "", reason)
        groups[reason].append(name)
    for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{len(names)} x {reason}")
        for n in names[:8]:
            print(f"    {n}")
        if len(names) > 8:
            print(f"    ... {len(names) - 8} more")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"passed": passed, "total": len(cases), "failures": failures}, f, indent=1)


if __name__ == "__main__":
    main()
