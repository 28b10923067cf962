"""What the signal, detection and other default-domain op tests share: their random source
and the check of pygraphx against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from tests.helpers import assert_outputs_match, run_pgx

RNG = np.random.default_rng(0)


def check_reference(model: onnx.ModelProto, feeds: dict, rtol: float = 1e-5, atol: float = 1e-6):
    """pygraphx against ONNX's reference evaluator."""
    ref = ReferenceEvaluator(model).run(None, feeds)
    ours = run_pgx(model, feeds)
    assert_outputs_match(ours, ref, rtol, atol)
    return ours
