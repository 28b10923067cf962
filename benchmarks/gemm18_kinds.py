"""gemm18: which kernel each fixed-weight product of a model takes (`GEMM_KERNELS` counts after
compiling at 1 thread).

    PYTHONPATH=. python benchmarks/gemm18_kinds.py gpt2:1 bert_base:1 minilm vit_b16
"""
import sys, collections
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from benchmarks.ab_harness import load, compile_variant, parse_variant
from pygraphx.targets.torch_lowering.gemm_kernels import GEMM_KERNELS
for spec in sys.argv[1:]:
    case = load(spec)
    prog = compile_variant(case, 1, parse_variant('new:'))
    kinds = collections.Counter(prog._executable.lowered.ctx.cache.get(GEMM_KERNELS, {}).values())
    print(spec, dict(kinds), flush=True)
