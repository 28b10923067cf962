"""Every fused `pointwise` and `fused_reduce` group of the four built-in models, run through
numpy, torch and generated Triton (interpreter) from its one description, against ref.

Groups that differ only in name are checked once (same steps, lens, strides and dtypes).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

import pygraphx
from pygraphx.codegen.trace import group_trace
from pygraphx.ir.instruction import Instruction
from pygraphx.models import get_model
from pygraphx.passes.manager import run_passes
from pygraphx.passes.pipeline import optimize_passes
from tests.codegen.conftest import needs_triton
from tests.codegen.groupcheck import check_instruction
from tests.codegen.test_triton_kernels import compile_ahead_of_time

SEQ = 8  # the transformer models at a short sequence (their groups are the same code)


@cache
def fused_groups(name: str) -> list[Instruction]:
    model = get_model(name, seq_len=SEQ)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(plan_memory=False))
    seen: dict[str, Instruction] = {}
    for ins in prog.get_main_module().instructions:
        if ins.op.name not in ("pointwise", "fused_reduce"):
            continue
        body = ins.module_inputs[0]
        steps = [(i.op.name, str(i.op)) for i in body.instructions if not i.is_param()]
        key = repr((ins.op.name, steps, [str(i.shape) for i in ins.inputs]))
        seen.setdefault(key, ins)
    return list(seen.values())


@pytest.mark.slow  # every fused group of a whole network through the Triton interpreter
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "bert_base", "gpt2"])
def test_every_fused_group_matches_ref(name: str, interpret: object) -> None:
    groups = fused_groups(name)
    kinds = {ins.op.name for ins in groups}
    assert "pointwise" in kinds
    if name in ("bert_base", "gpt2"):
        assert "fused_reduce" in kinds  # softmax and the layernorm means
    rng = np.random.default_rng(0)
    for ins in groups:
        check_instruction(ins, rng, rtol=2e-5, atol=2e-5)


@pytest.mark.slow  # every kernel of a whole transformer compiled ahead of time
@needs_triton
@pytest.mark.parametrize("name", ["bert_base", "gpt2"])
def test_transformer_kernels_compile_for_gpus(name: str, tmp_path: Path) -> None:
    """Every fused group's kernel of the transformer models through Triton's real compiler
    (sm_90 and gfx942); the interpreter alone accepts code the compiler refuses."""
    compile_ahead_of_time([group_trace(ins) for ins in fused_groups(name)], tmp_path)
