"""Recognising whole activation functions in traced element-wise groups.

`collapse_activations(trace, result)` replaces every sub-graph of a traced group that computes
GELU (erf or tanh form) or SiLU of one value by a single handler primitive (`gelu`,
`gelu_tanh`, `silu` in `handler.py`), so torch makes one pass over memory instead of six to
nine. Sub-graphs are recognised by what they compute, not how they are written (see the
function's docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pygraphx.ops.handler import NUMPY
from pygraphx.targets.torch_lowering.pointwise import Node, Trace, Value

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def _gelu(x: np.ndarray) -> np.ndarray:
    import scipy.special

    return 0.5 * x * (1.0 + scipy.special.erf(x / np.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


#: handler primitive (see handler.py) -> its float64 definition
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": _silu,
}
_PROBE = np.concatenate([np.linspace(-9.0, 9.0, 181), [-0.0, 1e-3, -1e-3, 0.5, -0.5]])


def collapse_activations(trace: Trace, result: Value) -> tuple[Trace, Value]:
    """Replace every sub-graph that computes a known activation of one value (GELU written as
    `0.5 * x * (1 + erf(x / sqrt 2))`, its tanh form, SiLU) by one primitive.

    Sub-graphs are recognised by what they compute, not how they are written: a candidate is a
    node whose inputs, traced back to one value x, involve only constants, and whose
    intermediate nodes are used nowhere else; it is evaluated in float32 on a dense set of
    points and compared with each activation (relative error below 1e-5). One torch kernel then
    makes one pass over memory instead of six to nine.
    """
    nodes = trace.nodes
    if not nodes:
        return trace, result
    users: dict[int, set[int]] = {j: set() for j in range(len(nodes))}
    for j, n in enumerate(nodes):
        for a in n.args:
            if isinstance(a, Value) and a.kind == "node":
                users[a.index].add(j)
    result_node = result.index if result.kind == "node" else -1
    replaced: dict[int, tuple[str, Value, set[int]]] = {}
    taken: set[int] = set()
    for root in range(len(nodes) - 1, -1, -1):
        if root in taken or nodes[root].dtype.kind != "f":
            continue
        match = _match_activation(trace, root, users, result_node)
        if match is not None:
            replaced[root] = match
            taken |= match[2]
    if not replaced:
        return trace, result
    remap: dict[int, Value] = {}
    out: list[Node] = []

    def sub(a: Any) -> Any:
        return remap[a.index] if isinstance(a, Value) and a.kind == "node" else a

    for j, n in enumerate(nodes):
        if j in replaced:
            name, x, _ = replaced[j]
            out.append(Node(name, [sub(x)], n.dtype))
        elif j in taken:
            continue
        else:
            out.append(Node(n.fn, [sub(a) for a in n.args], n.dtype))
        remap[j] = Value("node", n.dtype, index=len(out) - 1)
    return Trace(trace.inputs, out), sub(result)


def _match_activation(
    trace: Trace, root: int, users: dict[int, set[int]], result_node: int
) -> tuple[str, Value, set[int]] | None:
    nodes = trace.nodes
    # the nodes feeding `root` (back to inputs), nearest first
    cone: set[int] = set()
    stack = [root]
    while stack:
        j = stack.pop()
        if j in cone:
            continue
        cone.add(j)
        for a in nodes[j].args:
            if isinstance(a, Value) and a.kind == "node":
                stack.append(a.index)
    if len(cone) < 2:
        return None
    # candidate x: a value the cone reads from outside the sub-graph; try the largest
    # sub-graphs first (x as far back as possible)
    for x in _frontier_candidates(trace, root, cone):
        sub = _subgraph(trace, root, x)
        if sub is None or len(sub) < 2:
            continue
        if any(j != root and (users[j] - sub or j == result_node) for j in sub):
            continue  # an intermediate value is needed elsewhere
        got = _evaluate(trace, sub, x)
        if got is None:
            continue
        for name, fn in ACTIVATIONS.items():
            want = fn(_PROBE)
            if np.allclose(got, want, rtol=1e-5, atol=1e-6):
                return name, x, sub
    return None


def _frontier_candidates(trace: Trace, root: int, cone: set[int]) -> list[Value]:
    seen: list[Value] = []
    for j in sorted(cone):
        for a in trace.nodes[j].args:
            if (
                isinstance(a, Value)
                and a.kind == "in"
                and not any(v.kind == "in" and v.index == a.index for v in seen)
            ):
                seen.append(a)
    seen += [Value("node", trace.nodes[j].dtype, index=j) for j in sorted(cone) if j != root]
    return [v for v in seen if v.dtype.kind == "f"]


def _subgraph(trace: Trace, root: int, x: Value) -> set[int] | None:
    """Nodes of `root`'s cone computed from `x` and constants alone, or None."""
    sub: set[int] = set()
    stack = [root]
    while stack:
        j = stack.pop()
        if j in sub:
            continue
        if x.kind == "node" and j == x.index:
            continue
        sub.add(j)
        for a in trace.nodes[j].args:
            if not isinstance(a, Value) or a.kind == "const":
                continue
            if a.kind == x.kind and a.index == x.index:
                continue
            if a.kind == "in":
                return None
            stack.append(a.index)
    return sub


def _evaluate(trace: Trace, sub: set[int], x: Value) -> np.ndarray | None:
    values: dict[int, Any] = {}
    probe = _PROBE.astype(x.dtype)

    def arg(a: Any) -> Any:
        if not isinstance(a, Value):
            return a
        if a.kind == "const":
            return a.const
        if a.kind == x.kind and a.index == x.index:
            return probe
        return values[a.index]

    with np.errstate(all="ignore"):
        for j in sorted(sub):
            n = trace.nodes[j]
            values[j] = np.asarray(getattr(NUMPY, n.fn)(*[arg(a) for a in n.args]))
    out = values[max(sub)]
    if out.shape != probe.shape:
        return None
    return out.astype(np.float64)
