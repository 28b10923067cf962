"""The `gpu` target: programs lowered to torch on one CUDA or ROCm device, replayed as one graph.

Importing this package does not import torch; `make_target()` does, and raises
`GpuUnavailableError` naming what is missing (torch, a CUDA/ROCm build of it, a visible device).
The pieces: `target.py` (the target and its settings), `lowering.py` (the GPU's own lowerings of
convolution, GEMM, attention and fused groups, given to `targets/torch_lowering` as overrides),
`executable.py` (warm-up, graph capture and replay, host or device I/O, event profiling),
`device_api.py` (`to_gpu`, `from_gpu`, `allocate_gpu` and the device argument they exchange).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygraphx.targets.gpu.target import GpuTarget


class GpuUnavailableError(RuntimeError):
    """The gpu target or the device API was asked for on a machine that cannot run it."""


def check_gpu(device_id: int = 0) -> None:
    """Raise `GpuUnavailableError` saying why device `device_id` cannot be used."""
    try:
        import torch
    except ImportError as exc:
        raise GpuUnavailableError(
            "the 'gpu' target needs PyTorch with CUDA or ROCm, and torch is not installed: "
            "pip install torch (a CUDA or ROCm build), or use get_target('cpu')"
        ) from exc
    if not torch.cuda.is_available():
        build = "ROCm " + torch.version.hip if torch.version.hip else None
        build = build or ("CUDA " + torch.version.cuda if torch.version.cuda else "CPU-only")
        raise GpuUnavailableError(
            f"the 'gpu' target found no usable GPU: torch {torch.__version__} is a {build} "
            "build and torch.cuda.is_available() is False (no device visible, or no driver); "
            "use get_target('cpu') or get_target('ref')"
        )
    count = torch.cuda.device_count()
    if not 0 <= device_id < count:
        raise GpuUnavailableError(
            f"device_id={device_id} is out of range: torch sees {count} GPU(s)"
        )


def make_target(**settings: Any) -> GpuTarget:
    """The `gpu` target (needs torch with a visible CUDA/ROCm device unless device='cpu')."""
    if settings.get("device", "cuda") != "cpu":
        check_gpu(int(settings.get("device_id", 0)))
    from pygraphx.targets.gpu.target import GpuTarget

    return GpuTarget(**settings)


__all__ = ["GpuUnavailableError", "check_gpu", "make_target"]
