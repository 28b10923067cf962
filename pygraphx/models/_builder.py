"""Small helper for writing ONNX graphs by hand, shared by the built-in model zoo.

The model zoo (``pygraphx.models``) builds its demo networks directly with ``onnx.helper``
so that the driver's ``--model NAME`` and the tests need no download and no torch. This
module holds :class:`GraphBuilder`, which gives nodes and tensors unique, exporter-style
names (``/layer1/0/conv1/Conv`` with outputs ``/layer1/0/conv1/Conv_output_0``), keeps
a stack of module scopes for parameter names (``layer1.0.conv1.weight``), adds
initialisers and ``Constant`` nodes, and assembles an opset-17 ``ModelProto``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class GraphBuilder:
    """Accumulates nodes, initialisers and graph inputs/outputs for one ONNX graph."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        # Written in place: copying hundreds of MB of weights through make_graph is slow.
        self.model = onnx.ModelProto()
        self.graph = self.model.graph
        self._scope: list[str] = []
        self._used: set[str] = set()

    # ----------------------------------------------------------------- naming
    @contextmanager
    def scope(self, *names: str | int) -> Iterator[None]:
        """Enter a module scope (``with gb.scope("layer1", 0):``) for node/param names."""
        self._scope.extend(str(n) for n in names)
        try:
            yield
        finally:
            del self._scope[len(self._scope) - len(names) :]

    def _unique(self, base: str) -> str:
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def param_name(self, leaf: str) -> str:
        """Dotted parameter name of ``leaf`` in the current scope, e.g. ``conv1.weight``."""
        return ".".join([*self._scope, leaf])

    # ------------------------------------------------------------ tensors
    def add_input(self, name: str, dtype: type | np.dtype, shape: Sequence[int | str]) -> str:
        """Declare a graph input and return its name."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.graph.input.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self._used.add(name)
        return name

    def add_output(self, name: str, dtype: type | np.dtype, shape: Sequence[int | str]) -> None:
        """Declare an existing tensor ``name`` as a graph output."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.graph.output.append(helper.make_tensor_value_info(name, elem, list(shape)))

    def initializer(
        self, array: np.ndarray, leaf: str | None = None, name: str | None = None
    ) -> str:
        """Add ``array`` as an initialiser named ``name`` or ``<scope>.<leaf>``."""
        if name is None:
            name = self.param_name(leaf if leaf is not None else "tensor")
        name = self._unique(name)
        arr = np.ascontiguousarray(array)
        tensor = self.graph.initializer.add()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        tensor.dims.extend(arr.shape)
        tensor.raw_data = arr.tobytes()
        return name

    def normal(self, shape: Sequence[int], std: float, mean: float = 0.0) -> np.ndarray:
        """float32 normal samples from the builder's generator."""
        out = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        out *= np.float32(std)
        if mean:
            out += np.float32(mean)
        return out

    def const(
        self, value: float | int | Sequence | np.ndarray, dtype: type | np.dtype | None = None
    ) -> str:
        """Emit a ``Constant`` node (as the exporter does for literals); return its output."""
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        node_name = self._node_name("Constant")
        out = f"{node_name}_output_0"
        self._used.add(out)
        self.graph.node.append(
            helper.make_node(
                "Constant", [], [out], name=node_name, value=numpy_helper.from_array(arr)
            )
        )
        return out

    # --------------------------------------------------------------- nodes
    def _node_name(self, op_type: str) -> str:
        return self._unique("/" + "/".join([*self._scope, op_type]))

    def _add(
        self, op_type: str, inputs: Sequence[str], outs: list[str] | int, attrs: dict[str, object]
    ) -> list[str]:
        node_name = self._node_name(op_type)
        if isinstance(outs, int):
            outs = [f"{node_name}_output_{i}" for i in range(outs)]
        self._used.update(outs)
        self.graph.node.append(
            helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs)
        )
        return outs

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attrs: object) -> str:
        """Add a single-output node (output named ``output`` if given); return the output."""
        return self._add(op_type, inputs, [output] if output else 1, attrs)[0]

    def multi(self, op_type: str, *inputs: str, n: int, **attrs: object) -> list[str]:
        """Add a node with ``n`` outputs (e.g. Split); return their names."""
        return self._add(op_type, inputs, n, attrs)

    # ---------------------------------------------------------------- model
    def build(self, graph_name: str, doc: str = "") -> onnx.ModelProto:
        """Finish the opset-17, IR-version-8 model (the builder should not be used after)."""
        self.graph.name = graph_name
        self.graph.doc_string = doc
        model = self.model
        model.ir_version = IR_VERSION
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name = "pygraphx.models"
        model.producer_version = "0.1"
        return model
