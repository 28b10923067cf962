"""`get_target("gpu")`: the optimised program lowered to torch on one CUDA / ROCm device.

Compiling runs the target-independent pipeline (`optimize_passes()`); `prepare` lowers `main`
through `targets/torch_lowering` onto `cuda:N` (`device_id`; ROCm builds of torch call their
devices `cuda` too), with this target's own lowerings passed as `lowering_overrides`
(`lowering.py`): convolutions through cuDNN / MIOpen with channels-last weights chosen once here,
GEMMs through cuBLAS / hipBLASLt (bias folded into `addmm`), half and bf16 products and
convolutions in their own type on tensor cores, recognised attention as
`scaled_dot_product_attention`. Weights are uploaded once (literals become device tensors; a
weight relaid for its only user replaces its upload). Intermediates live in the torch
lowering's arena on the device, except the tensors convolutions return (cuDNN / MIOpen take no
out= argument) and the element-wise groups run in place on them (`unplanned`): those live in
torch's allocator (the CUDA graph's private pool once captured), freed after their last use.
`executable.py` then warms the program up and captures it as one CUDA/HIP graph.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from pygraphx.ir.mapped import release_weight_pages
from pygraphx.passes.fold_fp8 import fold_fp8, split_fp8_scales
from pygraphx.passes.fusion_policy import DefaultFusion, FusionPolicy, RowFusion
from pygraphx.passes.manager import Pass, module_pass
from pygraphx.passes.pipeline import optimize_passes
from pygraphx.passes.rewrite_dequantize import rewrite_dequantize
from pygraphx.targets.base import Target
from pygraphx.targets.gpu.executable import GpuExecutable
from pygraphx.targets.gpu.lowering import gpu_overrides
from pygraphx.targets.gpu.quant import FP8_GEMM_ENV, int8_gemm_choice
from pygraphx.targets.gpu.quant_conv import fp8_conv_mode, fp8_kernel_fits
from pygraphx.targets.gpu.triton_groups import TritonGroups, in_place_input, triton_wanted
from pygraphx.targets.torch_lowering import lower_module

if TYPE_CHECKING:
    from pygraphx.ir.instruction import Instruction
    from pygraphx.ir.program import Program

log = logging.getLogger(__name__)

SETTINGS = frozenset(
    [
        "device_id", "device", "graph", "channels_last", "tf32", "overrides", "triton",
        "cudnn_benchmark",
    ]
)  # fmt: skip
#: `PGX_GPU_CUDNN_BENCHMARK=0`: cuDNN's heuristic algorithms instead of timing them
CUDNN_BENCHMARK_ENV = "PGX_GPU_CUDNN_BENCHMARK"


class GpuTarget(Target):
    """`get_target("gpu")`: torch on one GPU.

    Settings (keywords; they apply to this target object): `device_id` (default: compile's
    `device_id`), `graph` (capture one CUDA graph; default on unless `PGX_GPU_GRAPH=0`),
    `channels_last` (convolutions in NHWC; default: chosen at compile, see
    `choose_channels_last`), `tf32` (float32 GEMMs and convolutions
    may use TF32 tensor cores: faster, ~1e-3 relative error; default off), `overrides` (op name
    -> lowering function, tried before this target's own: where generated Triton kernels plug
    in), `triton` (fused element-wise and reduction groups as generated Triton kernels,
    `triton_groups.py`; default on for CUDA/ROCm devices unless `PGX_GPU_TRITON=0`; on the CPU
    only under `TRITON_INTERPRET=1`), `cudnn_benchmark` (cuDNN times its algorithms at the
    first run and keeps the fastest; default: compile's `exhaustive_tune`, which is off, unless
    `PGX_GPU_CUDNN_BENCHMARK` says 0 or 1. Measured on the H100 in fp16, the heuristic choice
    was as fast (ResNet-50 b1 0.44 against 0.48-0.51 ms, b32 1.63 against 1.62 ms, MobileNetV2
    0.27 against 0.35 ms) while the timing allocates the largest workspace any candidate wants,
    e.g. 122 MB for ResNet-50's stem at batch 32, which then shows in the peak),
    `device="cpu"` (run the GPU lowering on the CPU with no graph: tests and debugging).
    """

    name = "gpu"

    def __init__(self, **settings: Any) -> None:
        unknown = set(settings) - SETTINGS
        if unknown:
            raise ValueError(
                f"unknown gpu target settings {sorted(unknown)}; known: {sorted(SETTINGS)}"
            )
        self.settings = settings

    def fusion_policy(self) -> FusionPolicy:
        """`RowFusion` where fused groups become generated Triton kernels (a softmax or a
        layer norm row is one group, one kernel); the CPU's groups where torch code runs them
        (triton off, or the CPU without the interpreter)."""
        cpu = self.settings.get("device", "cuda") == "cpu"
        device = torch.device("cpu" if cpu else "cuda")
        return (
            RowFusion() if triton_wanted(self.settings.get("triton"), device) else DefaultFusion()
        )

    def get_passes(self, options: dict[str, Any]) -> list[Pass]:
        """fp8 products folded for `torch._scaled_mm` and, where Triton kernels run and
        `fp8_conv_mode` says `triton` (Hopper's default), the fp8 convolution kernel
        (`fold_fp8`), then the common list; with `_scaled_mm` (not `PGX_GPU_FP8_GEMM=triton`)
        the fp8 GEMMs' scale and bias split off their groups after the fusion passes
        (`split_fp8_scales`: the GEMM computes them)."""
        policy = self.fusion_policy()
        # fp8 convolution kernels: where Triton runs and `fp8_conv_mode` (`PGX_GPU_FP8_CONV`,
        # by default the device) says so
        convolutions = (
            isinstance(policy, RowFusion) and fp8_conv_mode(self._cuda(options)) == "triton"
        )
        convolutions = convolutions and fp8_kernel_fits  # only those the kernel runs
        fold = Pass("fold_fp8", lambda module, program: fold_fp8(module, convolutions))
        # a residual's dequantise as element-wise maths its add's group (the product's
        # epilogue) absorbs (`quantize_int8(..., residuals=True)`)
        passes = [fold, module_pass(rewrite_dequantize), *optimize_passes(policy=policy)]
        if int8_gemm_choice(isinstance(policy, RowFusion), FP8_GEMM_ENV) == "cublas":
            at = next(k for k, p in enumerate(passes) if p.name == "fuse_reduce") + 1
            passes.insert(at, Pass("split_fp8_scales", split_fp8_scales))
        return passes

    def _cuda(self, options: dict[str, Any]) -> torch.device | None:
        """The CUDA device this target will run on, None for the CPU or without CUDA."""
        if self.settings.get("device", "cuda") == "cpu" or not torch.cuda.is_available():
            return None
        return torch.device("cuda", self._device_id(options))

    def _device_id(self, options: dict[str, Any]) -> int:
        return int(self.settings.get("device_id", options.get("device_id", 0)))

    def device(self, options: dict[str, Any]) -> torch.device:
        if self.settings.get("device", "cuda") == "cpu":
            return torch.device("cpu")
        from pygraphx.targets.gpu import check_gpu

        device_id = self._device_id(options)
        check_gpu(device_id)
        return torch.device("cuda", device_id)

    def prepare(self, program: Program, options: dict[str, Any]) -> GpuExecutable:
        device = self.device(options)
        tf32 = bool(self.settings.get("tf32", False))
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cudnn.benchmark = cudnn_benchmark(
                self.settings.get("cudnn_benchmark"), bool(options.get("exhaustive_tune"))
            )
        channels_last = self.settings.get("channels_last")
        if channels_last is None:
            channels_last = choose_channels_last(program, tf32)
        kernels = None
        if triton_wanted(self.settings.get("triton"), device):
            kernels = TritonGroups(device)
        overrides = gpu_overrides(channels_last=channels_last, kernels=kernels)
        overrides.update(self.settings.get("overrides") or {})
        lower_options = {**options, "lowering_overrides": overrides, "mkldnn": False}
        if options.get("conv_output", "torch") == "torch":
            lower_options["unplanned"] = functools.partial(unplanned, kernels is not None)
        where = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), where:
            lowered = lower_module(program.get_main_module(), device, lower_options)
        release_weight_pages(program)  # the weights are on the device now
        if kernels is not None:
            kernels.announce()
            compiles, seconds = kernels.compile_ahead()
            log.info(
                "gpu target: %d fused groups as %d Triton kernels (%d compiles ahead, %.2f s)",
                kernels.lowered, len(kernels.kernels), compiles, seconds,
            )  # fmt: skip
            lowered.ctx.cache["triton_groups"] = kernels
        return GpuExecutable(
            lowered,
            device,
            offload_copy=bool(options.get("offload_copy", True)),
            graph=self.settings.get("graph"),
        )


def cudnn_benchmark(setting: bool | None, exhaustive_tune: bool = False) -> bool:
    """The `cudnn_benchmark` setting, else `PGX_GPU_CUDNN_BENCHMARK` (0 or 1), else compile's
    `exhaustive_tune` (MIGraphX's switch for searching kernels longer; default off)."""
    if setting is not None:
        return bool(setting)
    env = os.environ.get(CUDNN_BENCHMARK_ENV, "").strip()
    if env:
        return env != "0"
    return exhaustive_tune


def unplanned(triton: bool, ins: Instruction) -> bool:
    """What the arena leaves out: every convolution (its step stores the tensor cuDNN / MIOpen
    return: they take no out= argument), and with Triton the element-wise group run in place
    on a convolution's result (`triton_groups.in_place_input`)."""
    if ins.op.name == "convolution":
        return True
    return triton and in_place_input(ins) is not None


def choose_channels_last(program: Program, tf32: bool) -> bool:
    """NHWC when the convolutions run on tensor cores (half / bf16, or float32 with TF32): the
    layout those kernels want; NCHW for plain float32, where cuDNN's NCHW kernels are faster."""
    if tf32:
        return True
    low = {"half_type", "bf16_type"}
    return any(
        ins.op.name == "convolution" and ins.shape.type() in low
        for ins in program.get_main_module().instructions
    )
