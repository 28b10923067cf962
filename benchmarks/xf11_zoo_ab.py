"""A/B in one process on the zoo's transformers (ViT-B/16, MiniLM at 8 sentences): GEMMs on
torch's oneDNN linear (`PGX_CPU_DNNL_GEMM=torch`) against oneDNN's matmul primitive through its
C API (the default), float32 and bf16.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xf11_zoo_ab.py --threads 2 --runs 8

A wrapper of `benchmarks/ab_harness.py` (the one harness): programs alternate run by run (which
goes first alternates too), `--runs` rounds of one run each, float32 then bf16; printed: the
median ms a run of each (wall at 2 threads, thread CPU at 1), and each one's relative RMS
difference from ONNX Runtime's output. `--bf16`: bf16 only; `--json FILE`: FILE's stem with
`.f32.json` / `.bf16.json`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import DNNL_GEMM_ENV  # noqa: E402

VARIANTS = [ab.Variant(s, {DNNL_GEMM_ENV: s}) for s in ("torch", "matmul")]


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=["vit_b16", "minilm"], threads=2,
                  env_options=False)  # fmt: skip
    p.add_argument("--runs", dest="rounds", type=int, default=8, help="rounds of one run each")
    args = p.parse_args(argv)
    if args.runs != 1:  # (`--repeat`: the harness's runs a block; here a block is one run)
        raise SystemExit("--repeat: this script's blocks are one run each (--runs: the rounds)")
    rc = 0
    for bf16 in (True,) if args.bf16 else (False, True):  # `--bf16`: bf16 only
        args.bf16 = bf16
        path = args.json and str(Path(args.json).with_suffix(f".{'bf16' if bf16 else 'f32'}.json"))
        rc |= ab.run(args.models, [ab.Variant(v.name, v.env, bf16) for v in VARIANTS],
                     ab.configs_of(args), path, {"argv": sys.argv[1:]})  # fmt: skip
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
