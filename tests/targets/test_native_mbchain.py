"""mnv17: consecutive native block steps run as one C call (`native_mbchain.MbChain`,
`mbconv.c`'s `mbconv_chain_stamped`).

Blocks against the same blocks' own closures and against torch's float64 ops (1 and 2 threads,
the thread count changed between runs, a residual, a stem first member reading a new image each
run, a later member whose input needs a copy); a network against ONNX Runtime with the chain on
and off, its runs' outputs not overwritten by later runs, the timed (profile) path: the chain's
own call, stamped. chainfix17 (review17b's findings): the timed path, each mode's timing and
its end, a member planned for another thread count, what `chain_steps` leaves unchained, the
head's output under a float64 default dtype, every bf16 block against float64.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.profile import time_steps  # noqa: E402
from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV, STALL_ADAPT_ENV  # noqa: E402
from pygraphx.targets.torch_lowering import conv_chain, native_mbchain, native_mbconv  # noqa: E402
from pygraphx.targets.torch_lowering.context import Step  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbchain import MbChain  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbconv import MbConv  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbhead import MbHead  # noqa: E402
from pygraphx.targets.torch_lowering.winograd_scratch import Scratch  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_native_mbhead import _compile, _net  # noqa: E402


def _kernel_ok() -> str | None:
    try:
        native_mbconv.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = _kernel_ok()
needs_kernel = pytest.mark.skipif(_WHY is not None, reason=f"native mbconv unavailable: {_WHY}")
CL = torch.channels_last
D = torch.float64
ACTS = [("hardtanh", [0.0, 6.0]), ("hardtanh", [0.0, 6.0]), ("none", [])]


@pytest.fixture
def threads():  # noqa: ANN201
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _r(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g) / np.sqrt(np.prod(shape[1:]) or 1)


def _block_ref(x, we, be, wd, bd, wp, bp, stride, r=None, stem=0):  # noqa: ANN001, ANN202
    """The block in float64: [stem 3x3 | 1x1] + clip, dw3x3 + clip, 1x1 [+ r]."""
    F = torch.nn.functional
    x = x.to(D)
    if stem:
        e = F.conv2d(x, we.to(D), be.to(D), stride=stem, padding=1)
    else:
        e = F.conv2d(x, we.to(D), be.to(D))
    e = e.clamp(0, 6)
    d = F.conv2d(e, wd.to(D), bd.to(D), stride=stride, padding=1, groups=wd.shape[0]).clamp(0, 6)
    y = F.conv2d(d, wp.to(D), bp.to(D))
    return y if r is None else y + r.to(D)


def _blocks(n: int, g: torch.Generator, stem: bool, bf16: bool = False):  # noqa: ANN202
    """Three blocks sharing a scratch: [stem 3 -> 24 s2 +] 24 -> 40 (s2), 40 -> 72 -> 40
    (residual), 40 -> 96 -> 24 (s2); their closures over one env: [image or x, y1, y2, y3]."""
    scratch = Scratch()
    h = 19
    specs = []
    if stem:  # a stem block reading the image (3, 2h-1, 2h-1) in NCHW
        specs.append(dict(c=3, m=24, k=24, s=1, stem=2, x=[n, 3, 2 * h - 1, 2 * h - 1]))
    else:
        specs.append(dict(c=24, m=24 * 3, k=24, s=1, stem=0, x=[n, 24, h, h]))
    specs += [dict(c=24, m=96, k=40, s=2, stem=0), dict(c=40, m=72, k=40, s=1, stem=0, res=1),
              dict(c=40, m=96, k=24, s=2, stem=0)]  # fmt: skip
    mbs, weights, env = [], [], [None]
    hw = h
    for k, sp in enumerate(specs):
        we = _r(g, sp["m"], sp["c"], 3, 3) if sp["stem"] else _r(g, sp["m"], sp["c"], 1, 1)
        w = [we, _r(g, sp["m"]), _r(g, sp["m"], 1, 3, 3), _r(g, sp["m"]),
             _r(g, sp["k"], sp["m"], 1, 1), _r(g, sp["k"])]  # fmt: skip
        x_lens = sp.get("x") or [n, sp["c"], hw, hw]
        mb = MbConv(*w, sp["s"], ACTS, x_lens, bool(sp.get("res")), scratch=scratch,
                    stem=sp["stem"], bf16=bf16)  # fmt: skip
        mbs.append(mb)
        weights.append((w, sp))
        hw = mb.ho
        env.append(torch.empty(mb.out_lens, dtype=mb.dtype).contiguous(memory_format=CL))
    fns = []
    for k, mb in enumerate(mbs):
        ri = k if weights[k][1].get("res") else None  # (the residual: the block's own input)
        fns.append(mb.closure(env, k, ri, env[k + 1]))
    return mbs, weights, env, fns


def _reference(weights, x):  # noqa: ANN001, ANN202
    outs = []
    for w, sp in weights:
        y = _block_ref(x, *w, sp["s"], r=x if sp.get("res") else None, stem=sp["stem"])
        outs.append(y)
        x = y.float()
    return outs


@needs_kernel
@pytest.mark.parametrize("stem", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_chain_matches_the_blocks(n: int, stem: bool, threads) -> None:
    """The chain computes what the members' closures compute (bit for bit) and what torch's
    float64 ops do; a new input tensor each run is pointed to; thread counts 2 -> 1 -> 2
    between runs re-plan the members."""
    g = torch.Generator().manual_seed(n + 10 * stem)
    mbs, weights, env, fns = _blocks(n, g, stem)
    chain = MbChain(fns, env)
    assert len(chain) == 4 and not chain.each
    for nthreads in (2, 1, 2):
        threads(nthreads)
        lens = mbs[0].x_lens
        x = torch.randn(*lens, generator=g)
        env[0] = x if stem else x.contiguous(memory_format=CL)
        chain.run()
        got = [t.clone() for t in env[1:]]
        for fn in fns:  # the members' own calls, in order
            fn()
        for a, b in zip(got, env[1:], strict=True):
            assert torch.equal(a, b)
        for a, b in zip(got, _reference(weights, x), strict=True):
            torch.testing.assert_close(a.to(D), b, rtol=1e-4, atol=1e-4)
        assert chain.threads == nthreads and all(m.threads == nthreads for m in mbs)


def _bf16_ok() -> bool:
    return _WHY is None and bool(native_mbconv.library().mbconv_bf16_supported())


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


@pytest.mark.skipif(not _bf16_ok(), reason="no native mbconv or no AVX512_BF16 build")
@pytest.mark.parametrize("n", [1, 2])
def test_bf16_chain_matches_the_blocks(n: int, threads) -> None:
    """bf16 blocks (`mbconv_bf16_chain_stamped`): bit for bit the members' own calls; each
    block near torch's float64 ops on its bf16 input in the chain (review17b L7: every block,
    not the first only); thread counts 2 -> 1 -> 2."""
    g = torch.Generator().manual_seed(20 + n)
    mbs, weights, env, fns = _blocks(n, g, False, bf16=True)
    chain = MbChain(fns, env)
    assert chain._chain.__name__ == "mbconv_bf16_chain_stamped"
    for nthreads in (2, 1, 2):
        threads(nthreads)
        x = torch.randn(*mbs[0].x_lens, generator=g).to(torch.bfloat16)
        env[0] = x.contiguous(memory_format=CL)
        chain.run()
        got = [t.clone() for t in env[1:]]
        for fn in fns:
            fn()
        for a, b in zip(got, env[1:], strict=True):
            assert torch.equal(a, b)
        inputs = [env[0], *got[:-1]]  # (each block against float64 from its own bf16 input)
        for (w, sp), xin, y in zip(weights, inputs, got, strict=True):
            we, be, wd, bd, wp, bp = w
            xin = xin.float()  # (the 1x1 weights rounded to bf16, as the kernel packs them)
            want = _block_ref(xin, _bf(we), be, wd, bd, _bf(wp), bp, sp["s"],
                              r=xin if sp.get("res") else None)  # fmt: skip
            torch.testing.assert_close(y.to(D), want, rtol=1e-2, atol=4e-2)


def test_chain_refuses_mixed_dtypes() -> None:
    """A float32 block and a bf16 one are no chain (`joins` says so too)."""
    if not _bf16_ok():
        pytest.skip("no native mbconv or no AVX512_BF16 build")
    g = torch.Generator().manual_seed(7)
    _, _, env, fns = _blocks(1, g, False)
    _, _, env_b, fns_b = _blocks(1, g, False, bf16=True)
    fns_b[1].mb = (fns_b[1].mb[0], env, 1, None)  # (the bf16 block over the float32 env)
    with pytest.raises(ValueError, match="one dtype"):
        MbChain([fns[0], fns_b[1]], env)


@needs_kernel
@pytest.mark.parametrize("stores", [False, True])
def test_chain_with_the_head(stores: bool, threads) -> None:
    """Blocks and a head (1x1 + clip + pool + classifier) in one call: bit for bit the members'
    own calls, near torch's float64 ops; the head writing a slot of its own, or storing a new
    tensor each run (`conv_steps.emit_fused`'s step: a run's output is not the next run's);
    thread counts 2 -> 1 -> 2."""
    g = torch.Generator().manual_seed(30 + stores)
    mbs, weights, env, fns = _blocks(1, g, False)
    wh, bh, wc, bc = _r(g, 64, 24, 1, 1), _r(g, 64), _r(g, 64, 10), _r(g, 10)
    head = MbHead(wh, bh, 0.0, 6.0, wc, bc, mbs[-1].out_lens)
    env.append(None)
    if stores:
        produce = head.closure(env, len(mbs), None)

        def step() -> None:
            env[-1] = produce()

        step.stores = (len(env) - 1, produce)  # type: ignore[attr-defined]
    else:
        env[-1] = torch.empty(head.out_lens)
        step = head.closure(env, len(mbs), env[-1])
    chain = MbChain(fns, env, head=step)
    assert len(chain) == 5  # (four blocks and the head)
    outs = []
    for nthreads in (2, 1, 2):
        threads(nthreads)
        x = torch.randn(*mbs[0].x_lens, generator=g).contiguous(memory_format=CL)
        env[0] = x
        chain.run()
        y = env[-1]
        outs.append(y)
        got = y.clone()
        for fn in [*fns, step]:
            fn()
        assert torch.equal(got, env[-1])
        z = _reference(weights, x)[-1]
        F = torch.nn.functional
        h = F.conv2d(z, wh.to(D), bh.to(D)).clamp(0, 6).mean(dim=(2, 3))
        torch.testing.assert_close(got.to(D), h @ wc.to(D) + bc.to(D), rtol=1e-4, atol=1e-4)
        assert head.threads == nthreads
    assert (outs[0] is not outs[1]) == stores


def _counted(chain: MbChain) -> list:
    """The stamps argument of each call of `chain`'s C function, from now on."""
    calls, real = [], chain._chain

    def counted(*args):  # noqa: ANN002, ANN202
        calls.append(args[-1])
        return real(*args)

    chain._chain = counted
    return calls


@needs_kernel
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_timed_run_is_the_chain(nthreads: int, bf16: bool, threads) -> None:
    """review17b M1: a timed run (`clock` set: `perf --cpu`) is the chain's own C call, given
    the stamps (a plain run passes NULL); every member's seconds > 0, adding up to the run's
    `clock` time (a clock ticking 1 a read: exactly 1), the later members' the stamps' spans;
    the outputs are the plain run's."""
    if bf16 and not _bf16_ok():
        pytest.skip("no native mbconv or no AVX512_BF16 build")
    threads(nthreads)
    g = torch.Generator().manual_seed(40 + nthreads)
    mbs, weights, env, fns = _blocks(1, g, False, bf16=bf16)
    head = step = None
    if not bf16:  # (a head ends a float32 chain only)
        wh, bh, wc, bc = _r(g, 64, 24, 1, 1), _r(g, 64), _r(g, 64, 10), _r(g, 10)
        head = MbHead(wh, bh, 0.0, 6.0, wc, bc, mbs[-1].out_lens)
        env.append(torch.empty(head.out_lens))
        step = head.closure(env, len(mbs), env[-1])
    chain = MbChain(fns, env, head=step)
    calls = _counted(chain)
    x = torch.randn(*mbs[0].x_lens, generator=g).to(mbs[0].dtype)
    env[0] = x.contiguous(memory_format=CL)
    chain.run()
    plain = [t.clone() for t in env[1:]]
    assert calls == [None]
    chain.clock = iter(range(1000)).__next__
    chain.run()
    assert calls[1] == ctypes.addressof(chain.stamps)
    assert all(s > 0 for s in chain.seconds), chain.seconds
    assert sum(chain.seconds) == pytest.approx(1.0)  # (two reads of the ticking clock)
    chain.clock = time.perf_counter
    start = time.perf_counter()
    chain.run()
    total = time.perf_counter() - start
    assert len(calls) == 3 and all(s > 0 for s in chain.seconds), chain.seconds
    assert sum(chain.seconds) <= total
    stamps = list(chain.stamps)
    assert stamps == sorted(stamps) and len(stamps) == len(chain) + 1
    spans = [b - a for a, b in zip(stamps, stamps[1:])]
    assert chain.seconds[1:] == spans[1:]
    assert chain.seconds[0] >= spans[0]
    for a, b in zip(plain, env[1:], strict=True):
        assert torch.equal(a, b)


@needs_kernel
@pytest.mark.parametrize("member", ["block", "head", "bf16"])
def test_member_planned_for_another_count(member: str, threads) -> None:
    """review17b L3: a member planned for another thread count than the chain's (its own step
    ran at it since): the C function runs nothing and says 2 (its work buffer and schedule are
    for that count: the chain's team would overrun them); the chain plans it again and runs,
    right."""
    if member == "bf16" and not _bf16_ok():
        pytest.skip("no native mbconv or no AVX512_BF16 build")
    threads(2)
    g = torch.Generator().manual_seed(50)
    mbs, weights, env, fns = _blocks(1, g, False, bf16=member == "bf16")
    step = head = None
    if member == "head":
        wh, bh, wc, bc = _r(g, 64, 24, 1, 1), _r(g, 64), _r(g, 64, 10), _r(g, 10)
        head = MbHead(wh, bh, 0.0, 6.0, wc, bc, mbs[-1].out_lens)
        env.append(torch.empty(head.out_lens))
        step = head.closure(env, len(mbs), env[-1])
    chain = MbChain(fns, env, head=step)
    x = torch.randn(*mbs[0].x_lens, generator=g).to(mbs[0].dtype)
    env[0] = x.contiguous(memory_format=CL)
    chain.run()
    want = [t.clone() for t in env[1:]]
    other = head if head is not None else mbs[2]
    other._set_threads(1)  # (as its own step at 1 thread would)
    for t in env[1:]:
        t.zero_()
    assert chain._chain(*chain._plain) == 2
    assert all(not t.any() for t in env[1:])  # (nothing ran)
    chain.run()
    assert chain.threads == 2 and other.threads == 2
    for a, b in zip(want, env[1:], strict=True):
        assert torch.equal(a, b)


@needs_kernel
def test_head_output_under_a_float64_default(threads) -> None:
    """review17b L6: the head's new output each run is float32 whatever torch's default dtype
    (a program made, then run under `torch.set_default_dtype(torch.float64)`): the chain's and
    the head's own closure's, the same values as under the float32 default."""
    threads(1)
    g = torch.Generator().manual_seed(70)
    mbs, weights, env, fns = _blocks(1, g, False)
    wh, bh, wc, bc = _r(g, 64, 24, 1, 1), _r(g, 64), _r(g, 64, 10), _r(g, 10)
    head = MbHead(wh, bh, 0.0, 6.0, wc, bc, mbs[-1].out_lens)
    env.append(None)
    produce = head.closure(env, len(mbs), None)

    def step() -> None:
        env[-1] = produce()

    step.stores = (len(env) - 1, produce)  # type: ignore[attr-defined]
    chain = MbChain(fns, env, head=step)
    env[0] = torch.randn(*mbs[0].x_lens, generator=g).contiguous(memory_format=CL)
    chain.run()
    want = env[-1]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        chain.run()
        got = env[-1]
        own = produce()
        threads(2)  # (the head planned again: its work buffer made anew)
        again = produce()
        fresh = head.new_output()
    finally:
        torch.set_default_dtype(before)
    assert got.dtype == own.dtype == again.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(own, want)
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)
    assert fresh.dtype == torch.float32


@needs_kernel
def test_chain_with_a_member_input_that_needs_a_copy(threads) -> None:
    """A later member's slot that comes to hold a tensor the kernel cannot read as it is (not
    channels-last): the guard sees the new tensor, the chain runs the members' closures from
    then on (they copy it), still right."""
    threads(2)
    g = torch.Generator().manual_seed(3)
    mbs, weights, env, fns = _blocks(1, g, False)
    fns = fns[2:]  # blocks 3 and 4: block 4 reads env[3]
    chain = MbChain(fns, env)
    x = torch.randn(1, 40, 10, 10, generator=g).contiguous(memory_format=CL)
    env[2] = x
    chain.run()
    want = _reference(weights[2:], x)
    torch.testing.assert_close(env[4].to(D), want[1], rtol=1e-4, atol=1e-4)
    env[3] = env[3].contiguous()  # (NCHW now: a later member's input needs a copy)
    chain.run()
    assert chain.each
    torch.testing.assert_close(env[4].to(D), want[1], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_chain_runs_again_when_no_copy_is_needed(
    threads, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """review17b L2: a later member's input needing a copy makes the chain run its members'
    closures, said once (`native.announce_fallback`), only while it does: the slot holding a
    channels-last tensor again, the chain's one call runs again; right throughout."""
    threads(2)
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    g = torch.Generator().manual_seed(4)
    _, weights, env, fns = _blocks(1, g, False)
    chain = MbChain(fns[2:], env)  # blocks 3 and 4: block 4 reads env[3]
    calls = _counted(chain)
    slot, out = env[3], env[4]
    env[2] = x = torch.randn(1, 40, 10, 10, generator=g).contiguous(memory_format=CL)
    want = _reference(weights[2:], x)
    for layout in [CL, torch.contiguous_format, torch.contiguous_format, CL]:
        # (NCHW: block 4 needs a copy; block 3 writes its slot, so the copy holds what block 3
        # wrote the run before: the same input each run)
        env[3] = slot if layout is CL else slot.contiguous()
        out.zero_()
        with caplog.at_level("WARNING", logger="pygraphx.cpu"):
            chain.run()
        assert chain.each == (layout is not CL)
        torch.testing.assert_close(out.to(D), want[1], rtol=1e-4, atol=1e-4)
    assert len(calls) == 2  # (runs 1 and 4)
    said = [r for r in caplog.records if "needs a copy" in r.getMessage()]
    assert len(said) == 1, caplog.records


@needs_kernel
def test_chain_refuses_other_steps() -> None:
    """Fewer than two members, or a step that is no native block writing its slot."""
    g = torch.Generator().manual_seed(5)
    _, _, env, fns = _blocks(1, g, False)
    with pytest.raises(ValueError, match="two or more"):
        MbChain(fns[:1], env)
    with pytest.raises(ValueError, match="two or more"):
        MbChain([fns[0], lambda: None], env)
    with pytest.raises(ValueError, match="native head"):
        MbChain(fns[:1], env, head=fns[1])  # (a block is no head)
    assert native_mbchain.member_of(lambda: None) is None


@needs_kernel
def test_chain_steps_leaves_what_no_chain_can_run() -> None:
    """review17b L4: `chain_steps` chains no block of another scratch than the first member's
    and starts no chain at a block over another env (`MbChain` would refuse the first; the
    second reads the wrong env): those steps are left alone, the rest chained."""
    g = torch.Generator().manual_seed(60)
    mbs, weights, env, fns = _blocks(1, g, False)
    w, sp = weights[1]
    apart = MbConv(*w, sp["s"], ACTS, mbs[1].x_lens, False, scratch=Scratch())  # (its own)
    fns[1] = apart.closure(env, 1, None, env[2])
    _, _, env_b, fns_b = _blocks(1, g, False)
    static = [False] + [True] * (len(env) - 1)

    def steps(fns):  # noqa: ANN001, ANN202
        return [Step(fn, [], k + 1) for k, fn in enumerate(fns)]

    got = conv_chain.chain_steps(steps(fns), [1] * 4, env, static)
    assert [len(c) if c else None for c in got.chains] == [None, None, 2]
    got = conv_chain.chain_steps(steps([fns_b[0], *fns[1:]]), [1] * 4, env, static)
    assert [len(c) if c else None for c in got.chains] == [None, None, 2]
    assert got.chains[2].blocks == mbs[2:]
    assert native_mbchain.starts(fns_b[0], env) is None
    assert native_mbchain.starts(fns_b[0], env_b) is not None


@needs_kernel
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("n,h", [(1, 23), (3, 16)])
def test_network_against_ort(
    n: int, h: int, nthreads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stem + first block, the second block and the head one chain step, against ONNX
    Runtime; a run's output is not overwritten by the next run on another image; the timed
    path (`profile.time_steps`) reports the members as the steps they are; the head left out
    (`HEAD_IN_CHAIN`); the switch off: no chain; the same outputs. Every step, and the chain,
    at `nthreads` (review17b M2: no per-step thread counts, no load or stall adaptation)."""
    monkeypatch.delenv(native_mbchain.ENV, raising=False)
    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")
    monkeypatch.setenv(STALL_ADAPT_ENV, "0")
    model, feeds = _net(n, h)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, nthreads, step_threads=False)
    exe = prog._executable
    chains = [c for c in exe.chained.chains if isinstance(c, MbChain)]
    assert [len(c) for c in chains] == [3], exe.chained.chains  # two blocks and the head
    assert chains[0].head is not None and chains[0].store is not None
    assert len(exe.executor.steps) == len(exe.lowered.steps) - 2
    first = np.asarray(prog.run(feeds)[0])
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)
    assert chains[0].threads == nthreads  # (the chain ran at the count asked)
    assert all(b.threads == nthreads for b in chains[0].blocks)
    kept = first.copy()
    other = {"x": (feeds["x"][:, :, ::-1] * 0.5).copy()}
    want_other = run_ort(model, other)[0]
    np.testing.assert_allclose(np.asarray(prog.run(other)[0]), want_other, rtol=1e-4, atol=1e-4)
    assert np.array_equal(first, kept), "a later run overwrote an earlier run's output"
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    calls = _counted(chains[0])
    timed = time_steps(exe, feeds, 2)
    assert len(calls) == 2 and None not in calls  # (the chain itself, stamped: review17b M1)
    assert len(timed) == len(exe.lowered.steps)
    assert all(t.seconds > 0 for t in timed)
    assert chains[0].clock is None
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(conv_chain, "HEAD_IN_CHAIN", False)
    apart = _compile(model, nthreads, step_threads=False)
    chains = [c for c in apart._executable.chained.chains if isinstance(c, MbChain)]
    assert [len(c) for c in chains] == [2] and chains[0].head is None
    np.testing.assert_allclose(np.asarray(apart.run(feeds)[0]), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(native_mbchain.ENV, "0")
    off = _compile(model, nthreads, step_threads=False)
    assert not any(isinstance(c, MbChain) for c in off._executable.chained.chains)
    assert len(off._executable.executor.steps) == len(off._executable.lowered.steps)
    np.testing.assert_allclose(off.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
