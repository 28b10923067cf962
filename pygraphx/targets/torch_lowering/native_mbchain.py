"""Consecutive native inverted-residual block steps run as one C call: a block chain (mnv17).

A MobileNetV2 program at batch 1 runs 17 of its 18 steps on `native_mbconv`'s kernel, one
ctypes call and one OpenMP parallel region each, with some 5-10 us of Python a step around the
call (the closure's input checks, the thread count, the scratch's address, the executor's
loop: cold after the block before) and, at 2 threads, a fork/join of the team each. A chain
runs a run of such steps as `mbconv_head.c`'s `mbconv_chain_stamped`: one call, one parallel region,
the blocks one after the other, each ending with a barrier (as each block's region ended with
its join), so the kernels compute exactly what the members' own calls would.

Members: the steps' closures (`MbConv.closure`, `run.mb`) that write their arena slot
(`writes`), of one thread count (`conv_chain.chain_steps` cuts at a change) and one dtype
(float32 blocks on `mbconv_chain_stamped`, bf16 ones on `mbconv_bf16_head.c`'s
`mbconv_bf16_chain_stamped`). The first member may read any input (the network's image: a new
tensor each run, pointed to each run as its closure does); a later member joins only where
its input and residual are env slots holding the same channels-last tensor every run
(`LoweringContext.static`), pointed to once; one guard a run checks, in C, that those slots
still hold the tensors pointed to (else they are pointed to again, and a chain whose input
then needs a copy runs its members' own closures, `each`, until the guard sees inputs that need
none again; the first time in a process it says so: `native.announce_fallback`).

The members share the program's block scratch (`program_scratch`, `WORK_ROLE`): its address is
asked once a run and set in every member's arguments when it moved. A new thread count (the
load adaptation's lower count) re-plans every member (`MbConv._set_threads`) before the call;
the C function runs nothing where a member is planned for another count than the chain (its own
step ran at another since: the chain then plans every member again and calls again).

Timing (`perf --cpu`, `profile.time_steps`): with `clock` set a run is the same one C call,
given an array for time stamps (`mbconv_chain_stamped`: thread 0 stamps `omp_get_wtime()`
before the fork and after each member's closing barrier; NULL, as a plain run passes, stamps
nothing), and each member's time goes into `seconds`: a later member's is its span between two
stamps (wall time, in `clock`'s units by the run's `clock` / wall ratio: 1 for the default
`time.perf_counter`), the first member's the rest of the step's `clock` time (the guard, its
inputs, the fork, its block, the join, the releases). The profiled (observer) path runs the
instructions' own unfused steps, never a chain. A chain running its members' closures (`each`)
times each closure with `clock` (the guard counted in the first).
`PGX_CPU_NATIVE_MBCHAIN=0` (`enabled()`, read by `conv_chain.chain_steps` when a program is
prepared) runs every block step alone (the path before mnv17; A/B: `benchmarks/mnv17_ab.py`);
`conv_chain.HEAD_IN_CHAIN = False` leaves the head its own step (`BF16_HEAD = False` a bf16
head alone: mnv18, whose bf16 chain function takes a bf16 head). (`conv_chain.CHAIN` is the
oneDNN convolution chain's switch: it leaves block chains on.)
"""

from __future__ import annotations

import ctypes
import time
import weakref
from collections.abc import Callable, Sequence
from operator import is_, itemgetter
from typing import Any

import torch

from pygraphx.ir.env import switch_on
from pygraphx.ir.instruction import Instruction
from pygraphx.runtime.executor import step_error
from pygraphx.targets import native
from pygraphx.targets.torch_lowering.native_mbconv import KERNEL, WORK_ROLE, MbConv
from pygraphx.targets.torch_lowering.native_mbhead import MbHead

#: `PGX_CPU_NATIVE_MBCHAIN=0`: every native block its own step (the path before mnv17)
ENV = "PGX_CPU_NATIVE_MBCHAIN"
#: mnv18: a bf16 native head after a bf16 block chain is its last member (as the float32
#: head, `conv_chain.HEAD_IN_CHAIN`); False: its own step (A/B)
BF16_HEAD = True

Tensor = torch.Tensor
CL = torch.channels_last


def enabled() -> bool:
    """Whether consecutive native block steps are chained (`PGX_CPU_NATIVE_MBCHAIN`, on)."""
    return switch_on(ENV, default=True)


def member_of(fn: Callable[[], None]) -> tuple[MbConv, list, int, int | None] | None:
    """(block, env, input index, residual index or None) of a step function that is a native
    block closure writing its arena slot (alone, or followed by the releases of values read
    for the last time: `lower._with_release`), else None."""
    inner = getattr(fn, "released", (fn, ()))[0]
    mb = getattr(inner, "mb", None)
    if mb is None or getattr(inner, "writes", None) is None:
        return None
    return mb if isinstance(mb[0], MbConv) else None


def _static_input(mb: MbConv | MbHead, env: list, index: int | None, static: Sequence[bool],
                  lens: list[int]) -> bool:  # fmt: skip
    """Whether env slot `index` holds, every run, a channels-last tensor of `mb`'s dtype and
    `lens` that the kernel reads as it is (pointed to once)."""
    if index is None or not static[index]:
        return False
    t = env[index]
    return (
        isinstance(t, Tensor) and t.dtype == getattr(mb, "dtype", torch.float32)
        and list(t.shape) == lens
        and t.is_contiguous(memory_format=CL) and t.stride(1) == 1
    )  # fmt: skip


def starts(fn: Callable[[], None], env: list) -> MbConv | None:
    """The block of a step function that may start a block chain over `env` (`member_of`, its
    closure over `env`), else None."""
    got = member_of(fn)
    return got[0] if got is not None and got[1] is env else None


def joins(fn: Callable[[], None], env: list, static: Sequence[bool], first: MbConv) -> bool:
    """Whether a step may run inside a block chain that `first` starts, after other members:
    a block of `first`'s dtype using its scratch (see the module docstring)."""
    got = member_of(fn)
    if got is None or got[1] is not env:
        return False
    mb, _, xi, ri = got
    if mb.args.stem or mb.dtype != first.dtype or mb.scratch is not first.scratch:
        return False
    if not _static_input(mb, env, xi, static, mb.x_lens):
        return False
    return ri is None or _static_input(mb, env, ri, static, mb.out_lens)


def head_of(fn: Callable[[], None]) -> tuple[MbHead, list, int, int | None] | None:
    """(head, env, input index, the env index it stores a new output tensor at, or None where
    it writes its arena slot) of a step function that runs a network's head on the native
    kernel (`MbHead.closure`, alone or storing its new tensor: `conv_steps.emit_fused`;
    either followed by releases), else None."""
    inner = getattr(fn, "released", (fn, ()))[0]
    stores = getattr(inner, "stores", None)
    store = None
    if stores is not None:
        store, inner = stores
    head = getattr(inner, "head", None)
    if head is None or not isinstance(head[0], MbHead):
        return None
    if store is None and getattr(inner, "writes", None) is None:
        return None
    return head[0], head[1], head[2], store


def head_joins(fn: Callable[[], None], env: list, static: Sequence[bool],
               dtype: torch.dtype) -> bool:  # fmt: skip
    """Whether a step is a native head that may end a chain of `dtype` blocks: of their dtype
    (float32, or, mnv18, bf16: `BF16_HEAD`), its input an env slot holding the same
    channels-last tensor every run."""
    got = head_of(fn)
    if got is None or got[1] is not env or got[0].dtype != dtype:
        return False
    if dtype == torch.bfloat16 and not BF16_HEAD:
        return False
    return _static_input(got[0], env, got[2], static, got[0].x_lens)


class MbChain:
    """The step running the native blocks of `fns` (step functions, `member_of` each) and the
    network's head of `head` (a step function, `head_of`; None: none) in one call, then
    dropping the env values `releases`; `computes[k]`: the instructions member `k` computes
    (the head the last member). `len`, `clock` and `seconds` as `conv_chain.Chain`'s
    (`profile.time_steps`)."""

    def __init__(
        self,
        fns: Sequence[Callable[[], None]],
        env: list,
        releases: Sequence[int] = (),
        computes: Sequence[Sequence[Instruction]] = (),
        head: Callable[[], None] | None = None,
    ) -> None:
        members = [member_of(fn) for fn in fns]
        if any(m is None for m in members) or len(members) + (head is not None) < 2 or (
            not members
        ):
            raise ValueError("native mbchain: two or more native block steps expected")
        if len({m[0].dtype for m in members}) != 1:  # type: ignore[index]
            raise ValueError("native mbchain: the blocks must have one dtype")
        self.fns = [getattr(fn, "released", (fn, ()))[0] for fn in fns]
        self.blocks: list[MbConv] = [m[0] for m in members]  # type: ignore[index]
        self.env = env
        self.releases = list(releases)
        self.computes = list(computes)
        first = members[0]
        self.xi, self.ri = first[2], first[3]  # type: ignore[index]
        #: the later members' inputs: (member, 0 input / 1 residual / 2 the head's, env index)
        self.fixed = [
            (k, slot, index)
            for k, m in enumerate(members[1:], start=1)
            for slot, index in ((0, m[2]), (1, m[3]))  # type: ignore[index]
            if index is not None
        ]
        self.head: MbHead | None = None
        self.head_fn = None
        self.store: int | None = None
        head_ref = None
        if head is not None:
            got = head_of(head)
            if got is None or self.blocks[0].dtype != got[0].dtype:
                raise ValueError("native mbchain: a native head step of the blocks' dtype "
                                 "expected")  # fmt: skip
            self.head, _, hi, self.store = got
            self.head_fn = getattr(head, "released", (head, ()))[0]
            self.fixed.append((len(self.blocks), 2, hi))
            head_ref = ctypes.addressof(self.head.args)
        self.head_ref = head_ref
        indices = [index for _, _, index in self.fixed]
        self.fetch = _tuple_getter(indices)
        self.expected: tuple = ()
        self.each = False  # a later member's input needs a copy: the closures run (`_point_fixed`)
        self.seen: list[Any] = [None, None]
        self.lib = self.blocks[0].lib
        bf16 = self.blocks[0].dtype == torch.bfloat16
        self._chain = _stamped(self.lib, bf16)
        self.array = (ctypes.c_void_p * len(self.blocks))(
            *(ctypes.addressof(b.args) for b in self.blocks))
        self.address_of = ctypes.addressof(self.array)
        self.count = len(self.blocks)
        #: the chain function's arguments but the stamps
        self._call = (self.address_of, self.count, self.head_ref)
        #: a timed run's time stamps (`mbconv_chain_stamped`): before the fork, after each member
        self.stamps = (ctypes.c_double * (len(self) + 1))()
        self._plain = self._call + (None,)
        self._timed = self._call + (ctypes.addressof(self.stamps),)
        self.scratch = self.blocks[0].scratch
        if any(b.scratch is not self.scratch for b in self.blocks):
            raise ValueError("native mbchain: the blocks must share one scratch")
        self.threads = 0
        self.floats = 0
        self.work = None
        #: set: each run times its members with it into `seconds` (one entry a member)
        self.clock: Callable[[], float] | None = None
        self.seconds = [0.0] * len(self)
        self._threads = torch.get_num_threads
        self._point_fixed()

    def __len__(self) -> int:
        return self.count + (self.head is not None)

    def _plan(self, threads: int) -> None:
        """Every member planned for `threads` (`MbConv._set_threads`, `MbHead._set_threads`)."""
        for b in self.blocks:
            if b.threads != threads:
                b._set_threads(threads)
        if self.head is not None and self.head.threads != threads:
            self.head._set_threads(threads)
        self.floats = max(b.floats for b in self.blocks)
        self.threads = threads
        self.work = None

    def _point_fixed(self) -> None:
        """Point the later members to their inputs; while one needs a copy the chain runs its
        members' closures (`each`, said once a process: `native.announce_fallback`)."""
        env, copied = self.env, None
        for k, slot, index in self.fixed:
            x = env[index]
            if slot == 2:
                held = self.head.point_x(x)  # type: ignore[union-attr]
            else:
                b = self.blocks[k]
                held = b.point_x(x) if slot == 0 else b.point_other(x)
            if held is not x and copied is None:
                copied = index
        self.each = copied is not None
        if copied is not None:
            native.announce_fallback(
                "mbconv chain",
                f"native mbchain: env slot {copied}, a later member's input, holds a tensor "
                "the kernel cannot read as it is (not channels-last): it needs a copy each run",
                "the members' own steps (while it does)",
            )
        self.expected = tuple(self.fetch(env))

    def _point_first(self) -> list[Tensor]:
        """Point the first member to its input (and residual) where it is not the tensor of
        the run before (known by a weak reference, as its closure does); what to hold."""
        env, b, seen, hold = self.env, self.blocks[0], self.seen, []
        x = env[self.xi]
        last = seen[0]
        if last is None or last() is not x:
            held = b.point_x(x)
            seen[0] = weakref.ref(x) if held is x else None
            hold.append(held)
        if self.ri is not None:
            r = env[self.ri]
            last = seen[1]
            if last is None or last() is not r:
                held = b.point_other(r)
                seen[1] = weakref.ref(r) if held is r else None
                hold.append(held)
        return hold

    def _head_output(self) -> Tensor | None:
        """A new output tensor for a head that stores one (bound), else None."""
        if self.store is None:
            return None
        head = self.head
        y = head.new_output()  # type: ignore[union-attr]
        head.bind(y)  # type: ignore[union-attr]
        return y

    def run(self) -> None:
        """Run the members' blocks (and head), in order."""
        clock = self.clock
        start = wall = 0.0
        if clock is not None:
            start, wall = clock(), _wall()
        threads = self._threads()
        if threads != self.threads:
            self._plan(threads)
        env = self.env
        if not all(map(is_, self.fetch(env), self.expected)):
            self._point_fixed()
        if self.each:
            self._run_each(clock, start)
            return
        hold = self._point_first()  # noqa: F841 (held until the call)
        work = self.scratch.address(WORK_ROLE, self.floats)
        if work != self.work:
            for b in self.blocks:
                b.args.work = work
            self.work = work
        y = self._head_output() if self.store is not None else None
        args = self._plain if clock is None else self._timed
        status = self._chain(*args)
        if status != 0:
            self._failed(status, args)
        if y is not None:
            env[self.store] = y
        for index in self.releases:
            env[index] = None
        if clock is not None:
            self._take_times(clock() - start, _wall() - wall)

    def _failed(self, status: int, args: tuple) -> None:
        """After the chain function returned `status` (nothing run): 2, a member planned for
        another thread count than the chain's (its own step ran at another count since): every
        member planned again and the call made again; else, or failing again, raise."""
        if status == 2:
            self._plan(self.threads)
            work = self.work = self.scratch.address(WORK_ROLE, self.floats)
            for b in self.blocks:
                b.args.work = work
            status = self._chain(*args)
            if status == 0:
                return
        if status == 2:
            raise RuntimeError("native mbchain: a member is planned for another thread count "
                               f"than the chain's {self.threads}")  # fmt: skip
        raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")

    def _take_times(self, total: float, wall: float) -> None:
        """`seconds` from a timed run's stamps, `total` its `clock` time, `wall` its wall time
        (see the module docstring)."""
        s, seconds = self.stamps, self.seconds
        ratio = 1.0 if self.clock is _wall or wall <= 0 else total / wall
        rest = total
        for k in range(1, len(seconds)):
            seconds[k] = (s[k + 1] - s[k]) * ratio
            rest -= seconds[k]
        seconds[0] = rest

    def _run_each(self, clock: Callable[[], float] | None, start: float) -> None:
        """`run` member by member: the members' own step functions (a later member's input
        needs a copy: `each`), each timed into `seconds` with `clock` where set (the run's
        guard, from `start`, counted in the first)."""
        env, seconds = self.env, self.seconds
        fns = self.fns + ([self.head_fn] if self.head_fn is not None else [])
        for k, fn in enumerate(fns):
            try:
                fn()
            except Exception as exc:  # re-raised naming the member's instructions
                if k >= len(self.computes):
                    raise
                raise step_error(self.computes[k], exc) from exc
            if clock is not None:
                end = clock()
                seconds[k] = end - start
                start = end
        for index in self.releases:
            env[index] = None


#: the wall clock a timed run converts the kernel's stamps with (`omp_get_wtime`'s rate)
_wall = time.perf_counter


def _stamped(lib: ctypes.CDLL, bf16: bool) -> Any:
    """The library's chain function that takes time stamps (`mbconv_chain_stamped`, or
    `mbconv_bf16_chain_stamped`), bound here as a function object of its own (`lib[name]`;
    `native_mbconv._bind` binds the `lib.<name>` ones, without stamps)."""
    fn = lib["mbconv_bf16_chain_stamped" if bf16 else "mbconv_chain_stamped"]
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def _tuple_getter(indices: list[int]) -> Callable[[list], tuple]:
    """`lambda env: tuple(env[i] for i in indices)`, in C."""
    if not indices:
        return lambda env: ()
    if len(indices) == 1:
        get = itemgetter(indices[0])
        return lambda env: (get(env),)
    return itemgetter(*indices)


__all__ = [
    "BF16_HEAD", "ENV", "MbChain", "enabled", "head_joins", "head_of", "joins", "member_of",
    "starts",
]
