"""`quant_gpu.py` (its arguments as given) with the convolution tiles' progress logged, then
the tiles each convolution shape ran (`conv_tiles`: from the record / table, or autotuned).

    python benchmarks/fp8conv_run.py --tiles $OUT/tiles.json -- --models resnet50 ...

Writes to `--tiles`: `chosen` (shape key -> tile, `conv_tiles.tile_key`), how many shapes were
autotuned and in how many seconds, and the autotuner's own records (`resgpu_run.tiles`: the
keys it timed, with their timings), the data `conv_tiles.TABLE` is built from.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_gpu  # noqa: E402
import resgpu_run  # noqa: E402

from pygraphx.targets.gpu import conv_tiles  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    mine, theirs = argv[:split], argv[split + 1 :]
    out = mine[mine.index("--tiles") + 1] if "--tiles" in mine else None
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger(conv_tiles.__name__).setLevel(logging.INFO)
    sys.argv = ["quant_gpu.py", *theirs]
    code = quant_gpu.main()
    choice = qck._tiles
    print(f"conv tiles: {choice.tuned} shapes autotuned in {choice.tuning_s:.1f} s, "
          f"{choice.looked_up} from the record or table")  # fmt: skip
    if out:
        found = {"chosen": choice.chosen, "tuned": choice.tuned, "tuning_s": choice.tuning_s,
                 "looked_up": choice.looked_up, "autotuner": resgpu_run.tiles()}  # fmt: skip
        Path(out).write_text(json.dumps(found, indent=0, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
