"""Winograd's scratch: the temporaries of a program's Winograd layers (`winograd.Winograd`)
kept from call to call instead of allocated anew, owned by the compiled program
(`program_scratch`) and freed with it (helpers rn12, scratch12; `benchmarks/results/rn12.md`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

Tensor = torch.Tensor


#: `PGX_WINOGRAD_SCRATCH=0`: every call allocates its temporaries and zeroes its padded
#: buffer's border (the path before rn12)
SCRATCH_ENV = "PGX_WINOGRAD_SCRATCH"


class Scratch:
    """The temporaries of Winograd calls, kept for the next call instead of allocated anew:
    one buffer per role shared by every layer that holds this scratch (grown to the largest
    request), and one zero-bordered padded input per geometry, its border zeroed once (a call
    copies only the interior).

    Owner: one compiled program (`program_scratch`: made by the lowering, handed to each of
    its `Winograd` layers, freed with the program; scratch12). A program's runs are serialised
    (`CpuExecutable._lock`), so its layers never use the buffers at the same time; a scratch
    is not for two threads at once (a `Winograd` made outside a program, such as a candidate
    timed at compile, gets one of its own).

    Why: a fresh temporary lands wherever malloc finds a block, usually one last touched
    long ago, so its first writes fetch lines from memory; reused buffers are the ones the
    previous Winograd layer just used, still in the caches (rn12, `benchmarks/results/rn12.md`).
    The price: the buffers stay allocated while the program lives (ResNet-50 at batch 8: some
    35 MB).
    """

    def __init__(self) -> None:
        self.bufs: dict[tuple, Tensor] = {}

    def get(self, role: str, shape: Sequence[int]) -> Tensor:
        """A float32 tensor of `shape` (contiguous, contents undefined) for `role`."""
        bufs = self.bufs
        need = 1
        for d in shape:
            need *= d
        # an inference-mode tensor cannot be written outside inference mode: a set for each
        key = (role, torch.is_inference_mode_enabled())
        buf = bufs.get(key)
        if buf is None or buf.numel() < need:
            buf = bufs[key] = torch.empty(need, dtype=torch.float32)
        return buf[:need].view(shape)

    def address(self, role: str, floats: int) -> int:
        """The address of `role`'s buffer (as `get` gives it) of at least `floats` floats, for
        a native kernel: no tensor views made when it is already large enough."""
        buf = self.bufs.get((role, torch.is_inference_mode_enabled()))
        if buf is None or buf.numel() < floats:
            return self.get(role, (floats,)).data_ptr()
        return buf.data_ptr()

    def padded(self, geo: Any) -> Tensor:
        """The (N * hp, wp, C) padded input buffer of `geo` (a `winograd.Geometry`: this
        module imports nothing of `winograd`), its border zero (and never
        written by a call: `_padded` writes the interior only)."""
        bufs = self.bufs
        g = geo  # (the output channels K play no part: layers of any K share the buffer)
        key = ("flat", g.n, g.c, g.h, g.w, g.top, g.left, g.hp, g.wp)
        key += (torch.is_inference_mode_enabled(),)
        buf = bufs.get(key)
        if buf is None:
            buf = bufs[key] = torch.zeros(geo.n * geo.hp, geo.wp, geo.c, dtype=torch.float32)
        return buf

    def nbytes(self) -> int:
        """The bytes its buffers hold."""
        return sum(b.numel() * b.element_size() for b in self.bufs.values())


def scratch_enabled() -> bool:
    """Whether Winograd calls take their temporaries from a `Scratch` (`PGX_WINOGRAD_SCRATCH`,
    default on)."""
    return os.environ.get(SCRATCH_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


#: the key of a program's scratch in its lowering context's `cache`
SCRATCH_KEY = "winograd_scratch"


def program_scratch(cache: dict) -> Scratch | None:
    """The Winograd scratch of the program being lowered (`cache`: its lowering context's
    `cache`, which the compiled program keeps): made at its first Winograd layer, shared by
    all of them, None with `PGX_WINOGRAD_SCRATCH=0`."""
    if not scratch_enabled():
        return None
    scratch = cache.get(SCRATCH_KEY)
    if scratch is None:
        scratch = cache[SCRATCH_KEY] = Scratch()
    return scratch


__all__ = ["SCRATCH_ENV", "SCRATCH_KEY", "Scratch", "program_scratch", "scratch_enabled"]
