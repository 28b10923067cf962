"""bf16 programs end to end: the concat sum chain's and the bf16 transposed convolutions' bias
rounded to bf16 (`old`, the route before hyg15) against added in float32 (`new`, the default),
A/B in one process (helper hyg15, issue 10).

    PYTHONPATH=. python benchmarks/hyg15_ab.py --models unet_small yolov8_style --threads 1 2

`old` is compiled with `conv_concat.wide_bias` and `conv_epilogue_match.wide_bias` (which
`deconv_bf16.fuse_group` imports at call time) answering False: exactly those two routes take
the rounded bias; every other layer is the same in both programs (`conv_fusion` holds its own
binding). A wrapper of `benchmarks/ab_harness.py` (blocks of runs alternating, the order
reversed every round; median block, best block, process CPU ms a run, the relative RMS error
against ONNX Runtime float32), each compile's route counts (`conv_concat_sum`,
`deconv_capi`) printed. `compile_variant` stays importable here (hyg15_errors.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.targets.torch_lowering import conv_concat, conv_epilogue_match  # noqa: E402


def rounded_bias(case: ab.Case, threads: int):
    never = lambda user, conv: False  # noqa: E731
    with (
        mock.patch.object(conv_concat, "wide_bias", never),
        mock.patch.object(conv_epilogue_match, "wide_bias", never),
    ):
        return ab.compile_variant(case, threads, ab.Variant("old", bf16=True))


def compile_variant(model, threads: int, variant: str):  # noqa: ANN201
    """`cpu_engines.make_pygraphx`'s (run, seconds, program) of `variant` (hyg15_errors.py)."""
    import time

    start = time.perf_counter()
    case = ab.Case("", model.SerializeToString(), {})
    prog = NAMED[variant].build(case, threads) if variant == "old" else ab.compile_variant(
        case, threads, NAMED[variant])  # fmt: skip
    return (lambda feeds: prog.run(feeds)), time.perf_counter() - start, prog


NAMED = {
    "old": ab.Variant("old", bf16=True, build=rounded_bias, label="bias rounded to bf16"),
    "new": ab.Variant("new", bf16=True),
}


def routes(prog) -> str:
    cache = prog._executable.lowered.ctx.cache
    return str({k: cache.get(k, 0) for k in ("conv_concat_sum", "deconv_capi")})


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], named=NAMED,
                   default_names=["old", "new"], models=["unet_small", "yolov8_style"],
                   threads=[1], rounds=6, runs=8, settle=1, note=routes)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
