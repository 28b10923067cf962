"""No compile-time allocation proportional to a huge shape (issue 16, case 3).

Expand to a huge shape, then Exp: the cpu target's arena for the intermediates is reserved at
compile but no page of it is written, so compiling costs no memory; an arena that cannot even be
reserved (here: an address-space limit) is a clear `ArenaError` naming its bytes and the largest
buffers, and so is a dynamic range whose maximum is absurd. Each case runs in a subprocess under
an RLIMIT_AS guard, so a regression fails the test instead of exhausting the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, resource, sys
limit = int(sys.argv[1]) << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import pygraphx

n, target, dynamic = int(float(sys.argv[2])), sys.argv[3], sys.argv[4] == "dynamic"
out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
if dynamic:
    nodes = [helper.make_node("Exp", ["x"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])
    graph = helper.make_graph(nodes, "g", [x], [out])
    opts = {"map_dyn_input_dims": {"x": [1, [1, n]]}}
else:
    nodes = [helper.make_node("Expand", ["x", "s"], ["e"]), helper.make_node("Exp", ["e"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    shape = numpy_helper.from_array(np.array([n, n], np.int64), "s")
    graph = helper.make_graph(nodes, "g", [x], [out], [shape])
    opts = {}
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
prog = pygraphx.parse_onnx_buffer(model.SerializeToString(), **opts)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = {"error": None, "type": None}
try:
    prog.compile(pygraphx.get_target(target))
    if dynamic:
        small = prog.run({"x": np.full((1, 3), 2.0, np.float32)})
        result["small"] = np.array(small[0]).tolist()
except Exception as exc:
    result.update(error=str(exc), type=[c.__name__ for c in type(exc).__mro__])
result["grew_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(result))
"""


def _compile(limit_gib: int, n: float, target: str, kind: str = "static") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(limit_gib), str(n), target, kind],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compile_reserves_a_huge_arena_without_touching_it() -> None:
    # 30000 x 30000 float32 = 3.6 GB of intermediates: the old arena wrote all of it at compile
    result = _compile(8, 30000, "cpu")
    assert result["error"] is None, result["error"]
    assert result["grew_mb"] < 1000, result


def test_arena_that_cannot_be_had_is_a_clear_error() -> None:
    # 46000 x 46000 float32 = 8.46 GB under a 4 GiB address-space limit
    result = _compile(4, 46000, "cpu")
    assert "ArenaError" in result["type"] and "MemoryError" in result["type"], result
    message = result["error"]
    assert "8,464,000,000-byte" in message and "8.46 GB" in message
    assert "main:@" in message and "{46000, 46000}" in message
    assert result["grew_mb"] < 1000, result


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_absurd_dynamic_maximum(target: str) -> None:
    """A dynamic range (1, 10**12): ref compiles and runs small inputs; cpu, which plans the
    body for the maximum, refuses it clearly instead of allocating 4 TB."""
    result = _compile(4, 1e12, target, "dynamic")
    if target == "ref":
        assert result["error"] is None, result["error"]
        want = np.exp(np.full((1, 3), 2.0, np.float32))
        np.testing.assert_allclose(np.array(result["small"], np.float32), want, rtol=1e-6)
    else:
        assert "ArenaError" in result["type"], result
        assert "4,000,000,000,000-byte" in result["error"]
        assert "smaller dynamic maximum" in result["error"]
    assert result["grew_mb"] < 1000, result
