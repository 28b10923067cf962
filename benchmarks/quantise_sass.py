"""SASS instruction counts of the quantise forms, compiled for sm_90 with no GPU.

    python benchmarks/quantise_sass.py

A static proxy for the device time of compute-bound element-wise kernels (the fp8 GELU group of
BERT-base ran at three times its memory time on an H100): Triton's real compiler and the
bundled `cuobjdump` give the SASS of `quantise_forms_ab.py`'s GELU + quantise kernel for each
form, of `quantise_kernels._quantise_fp8_kernel` with and without `CAST`, and of the generated
layer-norm group quantising to fp8 with and without `QuantOutput.cast`. Whole kernels, 8
elements a thread (counts, not timings: the device decides).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))

import triton  # noqa: E402
from group_tune_ab import layer_norm_group  # noqa: E402
from quantise_cost import _module  # noqa: E402
from quantise_forms_ab import NAMES, VARIANTS  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.tools.disasm import get_sass  # noqa: E402

from pygraphx.codegen.triton.emitter import tl_dtype  # noqa: E402
from pygraphx.codegen.triton.kernels import QuantOutput, kernel_source  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels as qe  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
_INSTR = re.compile(r"^[0-9a-f-]{2}:[0-9a-f-]:[0-9a-f-]:[A-Y-]:[0-9a-f]\s")
_SHORT = {"tl.float32": "fp32", "tl.float16": "fp16"}
_ALIGNED = {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}


def sass_count(fn, signature: dict, constexprs: dict, attrs: dict | None = None) -> int:
    """The number of SASS instructions of `fn` compiled for sm_90 with 4 warps."""
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs or {})
    compiled = triton.compile(src, target=SM90, options={"num_warps": 4})
    return sum(bool(_INSTR.match(line)) for line in get_sass(compiled.asm["cubin"]).splitlines())


def main() -> int:
    tmp = Path(scratch_dir())
    sys.path.insert(0, str(tmp))
    mod = _module(tmp / "quantise_forms.py", VARIANTS, "quantise_forms")
    sig = {"x_ptr": "*fp16", "s_ptr": "*fp32", "out_ptr": "*i8", "n": "i32"}
    sig |= {"BLOCK": "constexpr", "WHICH": "constexpr"}
    for w, name in enumerate(NAMES):
        n = sass_count(mod.gelu, sig, {"BLOCK": 1024, "WHICH": w}, _ALIGNED)
        print(f"gelu + quantise, {name:14s} {n:5d}")
    sig = {"x_ptr": "*fp16", "scale_ptr": "*fp32", "out_ptr": "*u8", "n": "i32"}
    sig |= {k: "constexpr" for k in ("BLOCK", "MAGIC", "ROUND_TRIP", "CAST")}
    for cast in (False, True):
        consts = {"BLOCK": 1024, "MAGIC": qk.MAGIC, "ROUND_TRIP": False, "CAST": cast}
        n = sass_count(qe._quantise_fp8_kernel, sig, consts, _ALIGNED)
        print(f"quantise_fp8, CAST={cast!s:5s}        {n:5d}")
    _, group = layer_norm_group(64)
    sig = {f"in{j}": "*" + _SHORT[tl_dtype(d.dtype)] for j, d in enumerate(group.inputs)}
    sig |= {"out": "*fp16", "qscale": "*fp32", "qout": "*u8", "BLOCK": "constexpr"}
    for cast in (False, True):
        path = tmp / f"ln_{cast}.py"
        path.write_text(kernel_source(group, QuantOutput("fp8", store=True, cast=cast)).source)
        spec = importlib.util.spec_from_file_location(f"ln_{cast}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        n = sass_count(module.kernel, sig, {"BLOCK": 1})
        print(f"layer norm + fp8, cast={cast!s:5s}    {n:5d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
