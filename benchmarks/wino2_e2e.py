"""End to end A/B of Winograd rules and kernels in one process (helper wino2): the modes of
`benchmarks/wino_resnet_ab.py` plus

* `rule:T` (or `rule:T:C`): the default mode's rule with at least T 4x4 tiles and at least
  C channels each side (default `winograd_rule.RULE_CHANNELS`), whatever the thread count
  (`winograd_rule.rule_limits` patched while compiling);
* `rule@REF`: the default rule, but the Winograd layers built by git revision REF's kernel
  (`benchmarks/wino2_ab.load_revision`), e.g. `rule@main` against `rule`.

    PGX_CONV_CHOICE_CACHE=off python benchmarks/wino2_e2e.py --models resnet50:1 \\
        --threads 1 --modes off rule:32 rule:16 ort

* a `/torch` suffix (`rule/torch`): the Winograd layers on the torch-ops route and its rule
  (`PGX_WINOGRAD_NATIVE=0` while compiling; wino13), against the native kernel's;
* a `/fresh` suffix on any mode (`rule/fresh`): the Winograd layers allocate their
  temporaries on every call (`PGX_WINOGRAD_SCRATCH=0`, the path before rn12) instead of
  taking them from the program's scratch (scratch12; per thread and process-wide before).

Same alternation and report as `wino_resnet_ab.py` (`off` there is `impl` with the rule off).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)

from benchmarks import wino_resnet_ab  # noqa: E402
from benchmarks.wino2_ab import load_revision  # noqa: E402
from pygraphx.targets.torch_lowering import winograd, winograd_native, winograd_rule  # noqa: E402

_plain_compile = wino_resnet_ab.compile_mode


def compile_mode(model: object, mode: str, threads: int, budget: str) -> tuple[Callable, str]:
    """`wino_resnet_ab.compile_mode` knowing `off`, `rule:T` and `rule@REF` too, and a
    `/fresh` suffix (the Winograd layers allocate their temporaries every call, rn12)."""
    if mode.endswith("/torch"):
        with mock.patch.dict(os.environ, {winograd_native.NATIVE_ENV: "0"}):
            return compile_mode(model, mode[: -len("/torch")], threads, budget)
    if mode.endswith("/fresh"):
        with mock.patch.dict(os.environ, {winograd.SCRATCH_ENV: "0"}):
            return compile_mode(model, mode[: -len("/fresh")], threads, budget)
    if mode == "off":
        return _plain_compile(model, "impl", threads, budget)
    if mode.startswith("rule:"):
        tiles, _, channels = mode.partition(":")[2].partition(":")
        wide = int(channels or winograd_rule.RULE_CHANNELS)
        with mock.patch.object(winograd_rule, "rule_limits", lambda _threads: (wide, int(tiles))):
            return _plain_compile(model, "rule", threads, budget)
    if mode.startswith("rule@"):
        old = load_revision(mode.partition("@")[2])
        # a revision whose build writes the slot (`out`, wino2) is given it; none is given
        # this tree's program scratch (scratch12): it runs with its own temporaries
        writes_out = "out" in inspect.signature(old.build).parameters

        def build(
            plan: object,
            get_x: object,
            get_other: object,
            m: int = 4,
            out: object = None,
            scratch: object = None,
        ):
            if writes_out:
                return old.build(plan, get_x, get_other, m, out)
            return old.build(plan, get_x, get_other, m)  # (a new result, copied into a slot)

        with mock.patch.object(winograd, "build", build):
            return _plain_compile(model, "rule", threads, budget)
    return _plain_compile(model, mode, threads, budget)


def main(argv: list[str] | None = None) -> int:
    return wino_resnet_ab.cli(
        argv, __doc__, ["off", "rule", "ort"], compile_mode, ["resnet50:1"], [1], budget="1"
    )


if __name__ == "__main__":
    raise SystemExit(main())
