"""review17b: reproductions for `native_mbchain.MbChain` (xfail(strict=True) until fixed; L1:
fixed by chainfix17, a timed run in `each` mode times its members' closures)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering.native_mbchain import MbChain  # noqa: E402
from tests.targets.test_native_mbchain import _blocks, needs_kernel, threads  # noqa: E402, F401


@needs_kernel
def test_timed_run_in_each_mode_times_the_members(threads) -> None:  # noqa: ANN001, F811
    threads(1)
    g = torch.Generator().manual_seed(3)
    _, _, env, fns = _blocks(1, g, False)
    chain = MbChain(fns[2:], env)  # blocks 3 and 4: block 4 reads env[3]
    env[2] = torch.randn(1, 40, 10, 10, generator=g).contiguous(memory_format=torch.channels_last)
    env[3] = env[3].contiguous()  # (NCHW: the member needs a copy, the chain runs `each`)
    chain.clock = time.perf_counter
    chain.run()
    assert chain.each
    assert all(s > 0 for s in chain.seconds), chain.seconds
