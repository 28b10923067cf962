"""Choosing each convolution's CPU kernel by measuring the candidates on its real shape.

At prepare, every convolution the cpu target runs through oneDNN gets the kernels that can
run it with its fused epilogue (`conv_kernels.kernels_for`), of which `MEASURED` are timed:
`onednn`, `dnnl` (where oneDNN's C API library loads) and `matmul` (1x1 stride-1 layers)
(`torch_cl`, `F.conv2d` on channels-last, was never faster than `onednn` on MobileNetV2's
layers, including the depthwise ones, and runs only when forced). Each candidate runs on
inputs of the layer's shape, with the program's thread count, a few times in
interleaved rounds; the fastest is kept when it beats the default by more than `MARGIN` (a
noisy machine must not flip a layer for nothing), else the default is kept.

The default kernel (`default_kernel`) is `dnnl` where oneDNN's C API library loads
(`pip install onednn-cpu-gomp`, see `onednn_capi.py`): the same oneDNN kernels as `onednn`
without ideep's set-up on every call, 20-60 us less per convolution (MobileNetV2 at batch 1,
2-core EPYC, 1 thread: 9.3 ms instead of 11.3, ONNX Runtime 7.7;
`benchmarks/onednn_conv_probe.py`, `benchmarks/results/cpu2_onednn_conv.md`); `measure`
picked `dnnl` for all 52 layers. Without
the library it is `onednn`, and the first compile with a convolution says so once (WARNING on
the `pygraphx.cpu` logger).

oneDNN offers several implementations of one convolution (`dnnl_primitive_desc_next_impl`:
`brgconv_1x1`, `jit_1x1`, `jit`, `brdgmm_dw`, `jit_dw`, for each instruction-set level), and
takes the first that applies, which is not always the fastest on a given processor. Mode
`impl` (the default) times the `dnnl` kernel on each of them (`impl_candidates`: not the
gemm-based or SSE4.1 ones; on a depthwise layer the depthwise kernels only) and runs the
winner (`ConvPlan.impl`, candidate name "dnnl/<implementation>"). On the 2-core EPYC (AVX-512,
Zen 4) it picks `jit_dw` on most depthwise layers and the AVX2 `jit_1x1` / `brgconv_1x1` on
some 1x1 layers: MobileNetV2 float32 4-5% faster at batch 1 and 6-9% at batch 8 (1 thread,
process CPU time, A/B in one process in both compile orders), 2-4% at batch 1 on 2 threads;
bf16 MobileNetV2 0-2%, ResNet-50 unchanged (`benchmarks/results/dnnlimpl.md`). One rule is
applied untimed in modes `impl` and `measure`: on an AMD processor a residual expansion
(`residual_1x1_impl`: ResNet's 1x1 bottleneck expansions that add the block's residual) runs
`jit_1x1:avx2` (`PGX_CONV_RESIDUAL_1X1`, `benchmarks/results/rn12.md`).

Choices are cached by everything that decides them (input lens, weight shape, geometry,
epilogue, candidates, threads, torch version, CPU capability), so a second compile of the same
model, or a program loaded from a file (which is prepared again), measures nothing in this
process; and across processes in a per-user file (`choice_cache.py`:
`$XDG_CACHE_HOME/pygraphx/conv_choice-<tag>.json`, the tag naming the CPU model, torch and
oneDNN; `PGX_CONV_CHOICE_CACHE=/path/file.json` names another, `=off` keeps none), so only a
machine's first compile of a model measures.

Measurement is bounded: at most `PGX_CONV_CHOICE_BUDGET` seconds (default `DEFAULT_BUDGET_S`)
per compile; layers reached after the budget is spent take the default (MobileNetV2 on 1
thread: 0.3-0.5 s at batch 1, the whole second at batch 8, and ResNet-50 too).
Compile logs one line on the `pygraphx.cpu` logger (INFO): how many layers were measured,
how long it took, how many came from the cache and its file, what was chosen.

The switch: the target setting `conv_kernel=` (`get_target("cpu", conv_kernel=...)`), else the
environment variable `PGX_CONV_KERNEL`: `impl` (the default), `off` (no measurement: every
convolution runs the default kernel on oneDNN's first implementation, deterministic),
`measure` (the kernels of `MEASURED` and the implementations), or a kernel name (`onednn`,
`matmul`, `dnnl`, `torch_cl`) to run that kernel wherever it applies and the default
elsewhere. A bf16 layer is measured on bf16 inputs (every kernel runs bf16: oneDNN's native
kernels on a CPU with bf16 instructions).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from pygraphx.targets.settings import env_choice
from pygraphx.targets.torch_lowering import (
    choice_cache,
    onednn_capi,
    onednn_conv,
    winograd_native,
    winograd_rule,
)
from pygraphx.targets.torch_lowering.choice_cache import CACHE_ENV
from pygraphx.targets.torch_lowering.conv_kernels import (
    KERNELS,
    ConvPlan,
    build_kernel,
    kernels_for,
)

log = logging.getLogger("pygraphx.cpu")

KERNEL_ENV = "PGX_CONV_KERNEL"
BUDGET_ENV = "PGX_CONV_CHOICE_BUDGET"
#: the default mode's Winograd rule (`winograd_rule.by_rule`): "rule" runs the layers it names on
#: F(4x4, 3x3) untimed, "off" leaves every layer to oneDNN's direct kernels
WINOGRAD_ENV = "PGX_CONV_WINOGRAD"
WINOGRAD_MODES = ("rule", "off")
#: on by default: quiet 2-core EPYC, 2 threads, A/B in one process
#: (`benchmarks/results/wino_rule_ab_t2_quiet.txt`): UNet b1 -17% wall (0.87x ORT, was
#: 1.06x), ResNet-50 b8 -6%, YOLOv8-style unchanged; output error against ORT 1e-5 -> 2e-5
#: relative RMS on UNet (F(4,3)'s rounding, README)
DEFAULT_WINOGRAD = "rule"
MODES = ("measure", "impl", "off", *KERNELS)
#: oneDNN's implementations are measured unless told otherwise (the kernels themselves are
#: opt-in, `measure`: on the 2-core EPYC no other kernel beat `dnnl` beyond noise)
DEFAULT_MODE = "impl"
#: the kernels timed against each other (`torch_cl` is never faster on the layers measured so
#: far, and re-packs its weight every call: it runs only when forced)
MEASURED = ("onednn", "dnnl", "matmul", "winograd", "winograd2")

#: a candidate "dnnl/<name>" is the `dnnl` kernel on oneDNN's implementation <name> (the plain
#: "dnnl" runs oneDNN's first); the implementations never timed: the gemm-based one and the
#: SSE4.1 kernels (slower than the AVX ones on every layer measured)
IMPL_SEP = "/"
SKIPPED_IMPLS = ("gemm", ":sse41")
#: oneDNN's generic direct kernels ("jit:<isa>"), not timed on a 1x1 layer: on the 23 timed
#: 1x1 layers of MobileNetV2 and ResNet-50 (2-core EPYC) they ran 0.97-2.0x oneDNN's first
#: and were never chosen (`benchmarks/results/ctime9.md`)
GENERIC_KERNEL = "jit:"

#: seconds of measurement per compile at most (`PGX_CONV_CHOICE_BUDGET`): MobileNetV2 at
#: batch 8 on one thread of the 2-core EPYC measures its 30 distinct layers in 1.0-1.3 s (the
#: last few then keep oneDNN's first), at batch 1 in 0.3-0.5 s; ResNet-50 at batch 8 would
#: spend any budget on its 1x1 layers, for no gain on this machine
DEFAULT_BUDGET_S = 1.0

#: an alternative must be this much faster than the default to be chosen
MARGIN = 0.05
#: a candidate this much slower than the fastest on its warm-up call is not timed again (the
#: generic `jit` kernels on a depthwise layer: 12-17x slower than `jit_dw` / `brdgmm_dw`)
PRUNE = 1.3
#: timed rounds per layer (each runs every candidate once), and the warm-up calls
ROUNDS, WARMUP = 5, 1
#: a layer whose calls take longer than this is timed with fewer rounds (at least 2)
SLOW_CALL_S = 0.002
#: bytes written before each timed call: more than a core's caches hold (1 MiB L2 on the
#: 2-core EPYC, 2 MiB on recent Xeons)
FLUSH_BYTES = 4 << 20

_ANNOUNCED: set[str] = set()


class ConvChoiceError(ValueError):
    """A bad `conv_kernel` setting or `PGX_CONV_KERNEL` / `PGX_CONV_CHOICE_BUDGET` value."""


@dataclass
class ChoiceState:
    """One compile's choices: mode, spent budget, and what was chosen (for the log line)."""

    mode: str
    budget_s: float
    winograd: str = DEFAULT_WINOGRAD
    spent_s: float = 0.0
    measured: int = 0
    cached: int = 0
    over_budget: int = 0
    chosen: Counter = field(default_factory=Counter)
    new_entries: bool = False


def choice_state(options: dict[str, Any], cache: dict[Any, Any]) -> ChoiceState:
    """The compile's `ChoiceState` (made once per lowering context, kept in its `cache`)."""
    state = cache.get("conv_choice")
    if state is None:
        rule = env_choice(WINOGRAD_ENV, WINOGRAD_MODES, DEFAULT_WINOGRAD, error=ConvChoiceError)
        state = ChoiceState(_mode(options), _budget(), rule)
        cache["conv_choice"] = state
    return state


def _mode(options: dict[str, Any]) -> str:
    setting = options.get("conv_kernel")
    source = "conv_kernel" if setting is not None else KERNEL_ENV
    mode = str(setting if setting is not None else os.environ.get(KERNEL_ENV, DEFAULT_MODE))
    mode = mode.strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise ConvChoiceError(f"{source}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _budget() -> float:
    raw = os.environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_S))
    try:
        budget = float(raw)
    except ValueError:
        raise ConvChoiceError(f"{BUDGET_ENV}={raw!r}: expected a number of seconds") from None
    if budget < 0 or budget != budget:
        raise ConvChoiceError(f"{BUDGET_ENV}={raw!r}: expected a number of seconds >= 0")
    return budget


def choose_kernel(state: ChoiceState, plan: ConvPlan, other_lens: list[int] | None) -> str:
    """The kernel `plan` runs on (see the module docstring), and for `dnnl` the oneDNN
    implementation, set as `plan.impl` when it is not oneDNN's first; `other_lens` are the
    lens of the add operand when the epilogue has one."""
    names = kernels_for(plan)
    default = default_kernel(names)
    measured = [default]
    if state.mode == "measure":
        measured += [name for name in names if name in MEASURED and name != default]
    if state.mode in ("measure", "impl") and "dnnl" in measured:
        measured += impl_candidates(plan, other_lens is not None)
    if state.mode == "impl" and state.winograd == "rule" and _winograd_rule(plan, names):
        choice = "winograd"
    elif state.mode == "off" or (state.mode in ("measure", "impl") and len(measured) == 1):
        choice = default
    elif state.mode not in ("measure", "impl"):
        choice = state.mode if state.mode in names else default
    else:
        choice = _measured(state, plan, measured, other_lens)
    kernel, _, impl = choice.partition(IMPL_SEP)
    if kernel == "dnnl" and not impl and state.mode in ("impl", "measure"):
        impl = residual_1x1_impl(plan, other_lens is not None)
        if impl:
            choice = f"dnnl{IMPL_SEP}{impl}"
    state.chosen[choice] += 1
    plan.impl = impl or None
    return kernel


#: `PGX_CONV_RESIDUAL_1X1`: the oneDNN implementation a narrow residual expansion runs on
#: (`residual_1x1_impl`): `auto` (the default: `RESIDUAL_1X1_IMPL` on an AMD processor, where it
#: was measured, oneDNN's first elsewhere), `off` (oneDNN's first everywhere), or an
#: implementation name (any processor)
RESIDUAL_1X1_ENV = "PGX_CONV_RESIDUAL_1X1"
#: ResNet-50's 56x56 and 28x28 expansions (64 -> 256 and 128 -> 512 channels, the block's
#: residual added by oneDNN's sum post-op over its slot, rn11) on the 2-core EPYC (Zen 4, whose
#: AVX-512 units are 256 bits wide), thread CPU time in the network at batch 8, 1 thread:
#: oneDNN's first, brgconv_1x1:avx512_core, 10.4-10.8 and 9.1 ms a layer (ONNX Runtime 7.9
#: and 7.9), jit_1x1:avx2 8.4-8.5 and 8.1-8.3; 2 threads (wall, best of 8 rounds) 5.2 ->
#: 4.1-4.2 and 4.55 -> 4.05 (ORT 4.0 and 4.0), the run 280.0 -> 273.9 ms; batch 1 within 0.1
#: ms (`benchmarks/rn12_steps_ab.py`, `benchmarks/results/rn12.md`). The wider ones are not
#: taken: 256 -> 1024 gained 0.15-0.35 ms at batch 8 but lost 0.02 at batch 1, 512 -> 2048
#: lost 0.2-0.8 ms at batch 8.
RESIDUAL_1X1_IMPL = "jit_1x1:avx2"
#: the input channels of such a layer (the measured ones had 64 and 128), and the least ratio
#: of its output channels to them (an expansion: ResNet's bottleneck blocks widen 4x)
RESIDUAL_1X1_CHANNELS, RESIDUAL_1X1_EXPANSION = (32, 128), 4


def residual_1x1_impl(plan: ConvPlan, other: bool) -> str | None:
    """The implementation a float32 1x1 stride-1 convolution that adds a residual (`other`,
    or accumulating into its slot), of `RESIDUAL_1X1_CHANNELS` input channels and at least
    `RESIDUAL_1X1_EXPANSION` times as many output channels, runs on (`PGX_CONV_RESIDUAL_1X1`),
    where oneDNN offers it; None: oneDNN's first."""
    setting = os.environ.get(RESIDUAL_1X1_ENV, "auto").strip() or "auto"
    if setting == "off":
        return None
    w = plan.weight
    if not (
        (other or plan.accumulate)
        and w.dtype == torch.float32
        and tuple(w.shape[2:]) == (1, 1)
        and plan.groups == 1
        and all(s == 1 for s in plan.stride)
        and RESIDUAL_1X1_CHANNELS[0] <= w.shape[1] <= RESIDUAL_1X1_CHANNELS[1]
        and w.shape[0] >= RESIDUAL_1X1_EXPANSION * w.shape[1]
        and plan.dw is None
    ):
        return None
    explicit = setting != "auto"
    if not explicit:
        if choice_cache.cpu_vendor() != "AuthenticAMD":
            return None
        setting = RESIDUAL_1X1_IMPL
    names = onednn_conv.implementations(plan, other)
    if setting not in names:
        if explicit:
            raise ConvChoiceError(
                f"{RESIDUAL_1X1_ENV}={setting!r}: oneDNN offers {', '.join(names)} for the "
                f"{w.shape[1]} -> {w.shape[0]} channel 1x1 layer"
            )
        return None  # (an AMD processor without AVX2: oneDNN's first)
    return None if setting == names[0] else setting


def _winograd_rule(plan: ConvPlan, names: list[str]) -> bool:
    """Whether the default mode's rule runs `plan` on `winograd` (where it can take it)."""
    return "winograd" in names and winograd_rule.by_rule(plan)


def choose_impl(state: ChoiceState, plan: ConvPlan) -> None:
    """Set `plan.impl` to the fastest of oneDNN's implementations of `plan` on the `dnnl`
    kernel (modes `impl` and `measure`; a part of a sum chain, which runs on `dnnl` only)."""
    if state.mode not in ("impl", "measure"):
        return
    names = ["dnnl", *impl_candidates(plan, False)]
    if len(names) > 1:
        key = choice_key(plan, names, None)
        timer = lambda deadline: time_kernels(plan, names, None, deadline)  # noqa: E731
        choice = measured_choice(state, key, names, timer)
        state.chosen[choice] += 1
        plan.impl = choice.partition(IMPL_SEP)[2] or None


#: 1x1 layers with fewer output pixels than a 28x28 map are not timed: on MobileNetV2's 14x14
#: and 7x7 1x1 layers every other implementation was within 5% of oneDNN's first
#: (`benchmarks/results/dnnlimpl_probe_mnv2_t1.txt`), and timing ResNet-50's spent the whole
#: budget (its first compile 0.51 -> 1.16 s at 2 threads) for no choice
MIN_1X1_PIXELS = 28 * 28
#: nor are 1x1 layers with at least this many input and output channels: on ResNet-50's ten
#: timed 1x1 layers (64 to 512 channels, 56x56 and 28x28) no implementation beat oneDNN's
#: first by more than 4% and none was chosen (0.42 s of its 0.71 s compile on the 2-core
#: EPYC); MobileNetV2's winners (AVX2 `jit_1x1` / `brgconv_1x1`, 5-24% faster) all have 16 to
#: 32 channels on one side (`benchmarks/results/ctime9.md`)
WIDE_1X1_CHANNELS = 64


def _out_pixels(plan: ConvPlan) -> int:
    """Output pixels an image of the 1x1 convolution `plan` (input pixels over the strides)."""
    h, w = plan.x_lens[2], plan.x_lens[3]
    return -(-h // plan.stride[0]) * -(-w // plan.stride[1])


def impl_candidates(plan: ConvPlan, other: bool) -> list[str]:
    """The candidates "dnnl/<name>": the implementations oneDNN offers for `plan` after its
    first one (`other`: the epilogue has an add operand), those of `SKIPPED_IMPLS` left out,
    on a 1x1 layer the generic `jit` ones (`GENERIC_KERNEL`), and on a depthwise layer all but
    the depthwise kernels (the generic `jit` ones are 12-17x
    slower on every depthwise layer of MobileNetV2, float32 and bf16). Only 1x1 and depthwise
    layers have candidates: on the dense 3x3 layers of ResNet-50, UNet and YOLO oneDNN's
    implementations were within 2% of each other, and measuring them spent ResNet-50's whole
    budget for nothing; a 1x1 layer is timed only from a 28x28 output (`MIN_1X1_PIXELS`)
    and with fewer than 64 channels on one side (`WIDE_1X1_CHANNELS`)."""
    depthwise = plan.groups > 1 and plan.groups == plan.x_lens[1]
    if not depthwise and tuple(plan.weight.shape[2:]) != (1, 1):
        return []
    if not depthwise and _out_pixels(plan) < MIN_1X1_PIXELS:
        return []
    if not depthwise and min(plan.weight.shape[:2]) >= WIDE_1X1_CHANNELS:
        return []
    names = onednn_conv.implementations(plan, other)[1:]
    if depthwise:
        names = [n for n in names if "_dw" in n]
    else:  # a 1x1 layer: the 1x1 kernels only (`GENERIC_KERNEL`)
        names = [n for n in names if not n.startswith(GENERIC_KERNEL)]
    return [f"dnnl{IMPL_SEP}{n}" for n in names if not any(s in n for s in SKIPPED_IMPLS)]


def default_kernel(names: list[str]) -> str:
    """`dnnl` when it can run the layer (oneDNN's C API library loaded), else `onednn`; the
    first call without the library says so once."""
    if "dnnl" in names:
        return "dnnl"
    if "dnnl_missing" not in _ANNOUNCED and not onednn_conv.available():
        _ANNOUNCED.add("dnnl_missing")
        log.warning(
            "cpu convolutions run through torch's mkldnn ops (%s); oneDNN's own package "
            "(the pygraphx[onednn] extra) saves 20-60 us per call",
            onednn_capi.unavailable_reason(),
        )
    return "onednn"


def _measured(
    state: ChoiceState, plan: ConvPlan, names: list[str], other_lens: list[int] | None
) -> str:
    key = choice_key(plan, names, other_lens)
    return measured_choice(
        state, key, names, lambda deadline: time_kernels(plan, names, other_lens, deadline)
    )


def measured_choice(
    state: ChoiceState, key: str, names: list[str], timer: Callable[[float], dict[str, float]]
) -> str:
    """The cached choice among `names` under `key`, else the one `pick` makes of
    `timer(deadline)` (seconds per call of each name; rounds after the first stop at the
    `time.perf_counter()` value `deadline`), cached; the first name once the compile's
    budget is spent."""
    cached = choice_cache.lookup(key)
    if cached in names:
        state.cached += 1
        return cached
    if state.spent_s >= state.budget_s:
        state.over_budget += 1
        return names[0]
    start = time.perf_counter()
    times = timer(start + state.budget_s - state.spent_s)
    state.spent_s += time.perf_counter() - start
    state.measured += 1
    choice = pick(times)
    choice_cache.store(key, choice)
    state.new_entries = True
    return choice


def pick(times: dict[str, float]) -> str:
    """The default (the first kernel) unless another is faster by more than `MARGIN`."""
    default = next(iter(times))
    best = min(times, key=times.__getitem__)
    if best != default and times[best] < times[default] * (1 - MARGIN):
        return best
    return default


def choice_key(plan: ConvPlan, names: list[str], other_lens: list[int] | None) -> str:
    """The cache key: everything the measured choice depends on."""
    parts = [
        tuple(plan.x_lens),
        tuple(plan.weight.shape),
        tuple(plan.padding),
        tuple(plan.stride),
        tuple(plan.dilation),
        plan.groups,
        tuple(plan.pre_pad or ()),
        plan.bias is not None,
        plan.unary,
        plan.add_after,
        plan.accumulate,
        tuple(other_lens or ()),
        tuple(names),
        str(plan.weight.dtype),
        torch.get_num_threads(),
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),
    ]
    if "winograd" in names:  # F(4,3)'s route: the native kernel (wino13) or torch ops
        parts.append(("winograd_f43", winograd_native.available()))
        if plan.weight.dtype == torch.bfloat16:  # (bf16wino14: on bf16 activations)
            parts.append(("winograd_f43_bf16", winograd_native.bf16_available()))
    return repr(parts)


def time_kernels(
    plan: ConvPlan,
    names: list[str],
    other_lens: list[int] | None,
    deadline: float = float("inf"),
) -> dict[str, float]:
    """Best seconds per call of each kernel on channels-last inputs of `plan`'s shape.

    The candidates run interleaved round by round (a burst of load hits them alike). Before
    each timed call the caches are left as a network's run leaves them for a layer
    (`_as_in_a_network`): its weight pushed out of the per-core caches by other work, its input
    just written (the previous layer's output). Timed on a loop of calls, a small layer's
    weight stays in the core's cache and the kernels that win there are not always those that
    win in the network (bf16 MobileNetV2 at batch 1: 2-3% slower with such choices). With one
    thread the clock is the thread's CPU time, which other processes' load does not inflate.
    Rounds after the first stop at `deadline` (a `time.perf_counter()` value)."""
    cl = torch.channels_last
    lens = list(plan.x_lens)
    if plan.pre_pad is not None:  # the kernels pad the input themselves
        pads = plan.pre_pad
        lens[2] -= pads[2] + pads[3]
        lens[3] -= pads[0] + pads[1]
    dtype = plan.weight.dtype  # float32 or bf16: the layer's activations have its type

    def filled(shape: list[int]) -> torch.Tensor:  # (oneDNN's time does not depend on values)
        return torch.empty(shape, dtype=dtype, memory_format=cl).fill_(0.5)

    inputs = [filled(lens)]
    get_other = None
    if other_lens is not None:
        inputs.append(filled(other_lens))
        get_other = lambda: inputs[1]  # noqa: E731
    # the `dnnl` candidates write one output buffer (as into an arena slot): a new one per call
    # would be fresh pages (page faults) for a large layer unless malloc keeps freed memory
    out = None
    if not plan.in_place and onednn_conv.supports(plan):
        out = filled(onednn_conv.geometry(plan)[3])
    fns = _candidates(plan, names, lambda: inputs[0], get_other, out)
    return race(fns, inputs, deadline)


def race(
    fns: dict[str, Callable[[], Any]], inputs: list[torch.Tensor], deadline: float = float("inf")
) -> dict[str, float]:
    """Best seconds per call of each closure of `fns` (the first is the default), timed as
    `time_kernels` times them: interleaved rounds, each call after `inputs` were written and
    the core's caches flushed of the rest."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(WARMUP):
        for name, fn in fns.items():
            best[name] = min(best[name], _seconds(fn, clock, flush, inputs))
    rounds = ROUNDS if min(best.values()) < SLOW_CALL_S else 2
    fastest = min(best.values())  # the default and those near the fastest go on
    racing = {k: fn for i, (k, fn) in enumerate(fns.items()) if not i or best[k] <= fastest * PRUNE}
    for r in range(rounds):
        if r and time.perf_counter() > deadline:
            break
        for name, fn in racing.items():
            best[name] = min(best[name], _seconds(fn, clock, flush, inputs))
    return best


def _candidates(
    plan: ConvPlan,
    names: list[str],
    get_x: Callable[[], torch.Tensor],
    get_other: Any,
    out: torch.Tensor | None,
) -> dict[str, Callable[[], Any]]:
    """The closures of `names`; an implementation after the first that oneDNN fails to make
    is left out, said once per process (the first, the default, must build: its error is
    the layer's)."""
    fns = {}
    for i, name in enumerate(names):
        try:
            fns[name] = _build(plan, name, get_x, get_other, out)
        except onednn_capi.OneDnnError as exc:
            if not i:
                raise
            if name not in _ANNOUNCED:
                _ANNOUNCED.add(name)
                log.warning("convolution %s * %s: candidate %s left out (%s)",
                            plan.x_lens, list(plan.weight.shape), name, exc)  # fmt: skip
    return fns


def _build(
    plan: ConvPlan,
    name: str,
    get_x: Callable[[], torch.Tensor],
    get_other: Any,
    out: torch.Tensor | None,
) -> Callable[[], Any]:
    """The closure of candidate `name` (a kernel, or "dnnl/<implementation>"); the `dnnl`
    ones write `out` when it is given."""
    kernel, _, impl = name.partition(IMPL_SEP)
    out = out if kernel == "dnnl" else None
    return build_kernel(replace(plan, impl=impl or None), kernel, get_x, get_other, out)


def _seconds(
    fn: Callable[[], Any], clock: Callable[[], float], flush: torch.Tensor, inputs: list[Any]
) -> float:
    """One timed call of `fn`, the caches as a network leaves them (`_as_in_a_network`)."""
    _as_in_a_network(flush, inputs)
    start = clock()
    fn()
    return clock() - start


def _as_in_a_network(flush: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    """`flush` written (more than a core's cache holds: the layer's weight leaves it), then
    each input read and written (fresh in the cache, as the layer before leaves it; an
    in-place kernel's sum grows its operand by one result a call, harmless to the timing)."""
    flush.fill_(1.0)
    for t in inputs:
        t.mul_(1.0)


def finish(state: ChoiceState) -> None:
    """After lowering: the log line, and the cache file written when it got new entries."""
    if not state.chosen:
        return
    kinds = ", ".join(f"{name} x{n}" for name, n in sorted(state.chosen.items()))
    if state.mode in ("measure", "impl"):
        note = (
            f"measured {state.measured} layer(s) in {state.spent_s:.2f} s, "
            f"{state.cached} from the cache"
        )
        if state.over_budget:
            note += f", {state.over_budget} left at the default (budget {state.budget_s:g} s spent)"
    else:
        note = f"{KERNEL_ENV}/conv_kernel={state.mode}, nothing measured"
    path = choice_cache.cache_path() if state.mode in ("measure", "impl") else None
    if path is not None:
        note += f"; cache file {path}"
    log.info("cpu convolution kernels: %s (%s)", kinds, note)
    if state.new_entries:
        choice_cache.save(_known)


def _known(choice: str) -> bool:
    """Whether a stored choice names a kernel of this version."""
    return choice.partition(IMPL_SEP)[0] in KERNELS


def clear_cache() -> None:
    """Forget every cached choice in this process (tests, benchmarks); the cache file is
    read again at the next measured layer."""
    choice_cache.clear()


__all__ = [
    "BUDGET_ENV",
    "CACHE_ENV",
    "KERNEL_ENV",
    "RESIDUAL_1X1_ENV",
    "RESIDUAL_1X1_IMPL",
    "ChoiceState",
    "ConvChoiceError",
    "choice_key",
    "choice_state",
    "choose_impl",
    "choose_kernel",
    "clear_cache",
    "default_kernel",
    "finish",
    "impl_candidates",
    "measured_choice",
    "pick",
    "race",
    "residual_1x1_impl",
    "time_kernels",
]
