"""`quant_gpu.py` (its arguments as given), then the tiles the convolution autotuning chose.

    python benchmarks/resgpu_run.py --tiles $OUT/tiles.json -- --models resnet50 ...

Runs `quant_gpu.main()` in this process, then writes every (M, N, K, C, ..., dtypes) key the
autotuned convolution kernel (`quant_conv_kernels`) and GEMM kernels (`quant_kernels`) timed,
with the configuration kept and the timings of the others, to `--tiles` (the data a shape
table of tiles is built from: autotuning is most of an int8 / fp8 ResNet-50's prepare time).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_gpu  # noqa: E402

from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402


def _config(cfg) -> list:
    k = cfg.kwargs
    return [k["BLOCK_M"], k["BLOCK_N"], k["BLOCK_K"], cfg.num_warps, cfg.num_stages]


def tiles() -> dict[str, list]:
    """name -> [(key, kept config, {config: ms} of the timed ones)] of each autotuned kernel."""
    found = {}
    for name, tuner in [*qck._tuned.items(), *qk._tuned.items()]:
        rows = []
        timings = getattr(tuner, "configs_timings", None) or {}
        for key, cfg in tuner.cache.items():
            rows.append([[str(k) for k in key], _config(cfg)])
        found[name] = rows
        found[name + "_last_timings"] = [[_config(c), t] for c, t in timings.items()]
    return found


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    mine, theirs = argv[:split], argv[split + 1 :]
    out = mine[mine.index("--tiles") + 1] if "--tiles" in mine else None
    sys.argv = ["quant_gpu.py", *theirs]
    code = quant_gpu.main()
    if out:
        Path(out).write_text(json.dumps(tiles(), indent=0, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
