"""Consecutive oneDNN convolution steps run as one step: a chain.

A convolution that writes its arena slot runs through `onednn_conv`'s lean closure, about
6.5 us of Python a step besides oneDNN's own call in a network (the closure, the executor's
loop, each cold after the layer before). A chain runs the primitives of a run of such steps
back to back from one Python call, each with its arguments bound once
(`Primitive.call`: one `dnnl_primitive_execute`, nothing else per layer):

* the outputs are the members' arena slots, whose addresses each primitive holds already;
* a source or add operand read from an arena slot (`LoweringContext.static`: the same tensor
  every run) that is channels-last is pointed to once per primitive; one guard a run checks,
  in C, that those slots still hold the tensors pointed to (else they are pointed to again);
* any other input (the network's input, a value stored anew each run, a tensor that needs a
  channels-last copy) is read, converted and pointed to at the chain's start, each run: only
  the first member may have one (`chain_steps` starts a new chain at a later one: a view of
  an earlier member's result, such as a split's half, must be copied after that member ran);
  a later member's input that turns into one at run time is read right before the member.

A chain's members read nothing that a step between them writes: they are consecutive steps. The same
primitives run as the members' own closures would run (same objects, same order), so the
outputs are identical. oneDNN fixes a primitive's thread count when it is made; a chain's
members have one thread count (`chain_steps` cuts at a change), and a chain keeps one list of
primitives per thread count it runs under, made at its first run under it.

Timing (`perf --cpu`, `profile.time_steps`): `Chain.clock` set, a run times each member
(the per-run guard and inputs counted in the first) into `Chain.seconds`. The profiled
(observer) path runs the instructions' own unfused steps, never a chain. `CHAIN = False`
(read when a program is prepared) runs every convolution step alone (A/B:
`benchmarks/chain11_ab.sh`); native block chains (`native_mbchain.MbChain`, also made by
`chain_steps`) have their own switch, `PGX_CPU_NATIVE_MBCHAIN=0`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_, itemgetter
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.runtime.executor import step_error
from pygraphx.targets.torch_lowering import native_mbchain
from pygraphx.targets.torch_lowering.context import Step
from pygraphx.targets.torch_lowering.native_mbchain import MbChain
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError, check
from pygraphx.targets.torch_lowering.onednn_conv import Link, Primitive, _channels_last

#: chain consecutive lean oneDNN convolution steps (read by `chain_steps`; False: A/B; native
#: block chains: `native_mbchain.enabled()`)
CHAIN = True
#: mnv17: a native head step right after a native block chain ends the chain (one C call for
#: MobileNetV2's whole network at batch 1; read by `chain_steps`; False: its own step, A/B)
HEAD_IN_CHAIN = True

Tensor = torch.Tensor
CL = torch.channels_last
#: an input of a member: (member, 0 for the source / 2 for the add operand, env index or None,
#: the getter)
_Input = tuple[int, int, int | None, Callable[[], Tensor]]


class _Team:
    """A chain's primitives for one thread count, and the state of their inputs."""

    __slots__ = ("prims", "calls", "fixed", "fetch", "expected", "varying", "late")

    def __init__(self, prims: list[Primitive]) -> None:
        self.prims = prims
        self.calls = [p.call for p in prims]
        self.fixed: list[_Input] = []  # pointed to once, guarded by `fetch` / `expected`
        self.fetch: Callable[[list], Any] = lambda env: ()
        self.expected: tuple = ()
        self.varying: list[_Input] = []  # read and pointed to every run
        self.late = False  # a varying input of a member after the first (`Chain._run_each`)


class Chain:
    """The step running `links` (lean convolution closures' `Link`s) one after the other,
    then dropping the env values `releases`; `static[k]`: whether env slot `k` holds the
    same tensor every run; `computes[k]`: the instructions member `k` computes."""

    def __init__(
        self,
        links: Sequence[Link],
        env: list,
        static: Sequence[bool],
        releases: Sequence[int] = (),
        computes: Sequence[Sequence[Instruction]] = (),
    ) -> None:
        self.links = list(links)
        #: the instructions each member computes (a failing member's error names them)
        self.computes = list(computes)
        self.env = env
        #: env indices set to None after the chain (values it read for the last time)
        self.releases = list(releases)
        self.teams: dict[int, _Team] = {}
        self.inputs: list[_Input] = []
        self.fixed: list[_Input] = []
        for k, link in enumerate(self.links):
            for entry in _inputs(k, link, env):
                self.inputs.append(entry)
                if _fixed(entry, env, static):
                    self.fixed.append(entry)
        #: set: each run times its members with it into `seconds` (one entry a member)
        self.clock: Callable[[], float] | None = None
        self.seconds = [0.0] * len(self.links)
        self._threads = torch.get_num_threads

    def __len__(self) -> int:
        return len(self.links)

    def run(self) -> None:
        """Run the members' primitives, in order."""
        team = self.teams.get(self._threads())
        if team is None:
            team = self._team()
        env = self.env
        if not all(map(is_, team.fetch(env), team.expected)):
            self._point_fixed(team)
        if self.clock is not None or team.late:
            self._run_each(team)
            return
        hold = self._point_varying(team, team.varying) if team.varying else None  # noqa: F841
        for call in team.calls:
            status = call()
            if status:
                self._failed(team, call, status)
        for index in self.releases:
            env[index] = None

    def _team(self) -> _Team:
        """The primitives for the current thread count (made now where a member has none),
        their fixed inputs pointed to."""
        team = _Team([link.primitive() for link in self.links])
        for p in team.prims:  # (the members' own closures would point them again)
            p.seen = p.seen_other = None
        self.teams[self._threads()] = team
        self._point_fixed(team)
        return team

    def _point_fixed(self, team: _Team) -> None:
        """Point the primitives to their fixed inputs; one that is not channels-last (a copy
        each run) becomes a varying input."""
        env, fixed, varying = self.env, [], [e for e in self.inputs if e not in self.fixed]
        for entry in self.fixed:
            k, slot, index, _ = entry
            p, x = team.prims[k], env[index]
            y = self.links[k].source(p, x) if slot == 0 else _channels_last(x)
            if y is not x:
                varying.append(entry)
                continue
            p.point(p.src if slot == 0 else p.other, slot, x.data_ptr())
            fixed.append(entry)
        team.fixed, team.varying = fixed, varying
        team.late = any(k > 0 for k, _, _, _ in varying)
        indices = [index for _, _, index, _ in fixed]
        team.fetch = _tuple_getter(indices)
        team.expected = tuple(team.fetch(env))

    def _point_varying(self, team: _Team, entries: list[_Input]) -> list[Tensor]:
        """Read, convert and point to the varying inputs `entries`; the tensors to hold until
        the primitives have read them."""
        hold = []
        prims, links = team.prims, self.links
        for k, slot, _, get in entries:
            p, x = prims[k], get()
            x = links[k].source(p, x) if slot == 0 else _channels_last(x)
            hold.append(x)
            p.point(p.src if slot == 0 else p.other, slot, x.data_ptr())
        return hold

    def _run_each(self, team: _Team) -> None:
        """`run` member by member: each member's varying inputs read right before it (one
        may be a view of an earlier member's result), each member timed when `clock` is set
        (the run's guard counted in the first)."""
        clock, seconds = self.clock or (lambda: 0.0), self.seconds
        start = clock()
        for k, call in enumerate(team.calls):
            mine = [e for e in team.varying if e[0] == k]
            hold = self._point_varying(team, mine) if mine else None  # noqa: F841 (held)
            status = call()
            if status:
                self._failed(team, call, status)
            end = clock()
            seconds[k] = end - start
            start = end
        for index in self.releases:
            self.env[index] = None

    def _failed(self, team: _Team, call: Callable[[], int], status: int) -> None:
        """Raise the error of member `call` that returned `status`, naming its instructions."""
        k = team.calls.index(call)
        try:
            check(status, f"convolution {k + 1} of a chain of {len(team.calls)}")
        except OneDnnError as exc:
            if k >= len(self.computes):
                raise
            raise step_error(self.computes[k], exc) from exc


def _inputs(k: int, link: Link, env: list) -> list[_Input]:
    """Member `k`'s inputs: its source, and its add operand if any."""
    entries = []
    for slot, get in ((0, link.get_x), (2, link.get_other)):
        if get is not None:
            where = getattr(get, "slot", None)
            index = where[1] if where is not None and where[0] is env else None
            entries.append((k, slot, index, get))
    return entries


def _fixed(entry: _Input, env: list, static: Sequence[bool]) -> bool:
    """Whether an input is pointed to once: an env slot holding the same tensor every run
    (`static`), a channels-last one (the primitive reads it as it is, never a copy)."""
    index = entry[2]
    if index is None or not static[index]:
        return False
    t = env[index]
    return isinstance(t, Tensor) and t.dim() == 4 and t.is_contiguous(memory_format=CL)


def _tuple_getter(indices: list[int]) -> Callable[[list], tuple]:
    """`lambda env: tuple(env[i] for i in indices)`, in C."""
    if not indices:
        return lambda env: ()
    if len(indices) == 1:
        get = itemgetter(indices[0])
        return lambda env: (get(env),)
    return itemgetter(*indices)


def link_of(fn: Callable[[], None]) -> Link | None:
    """The chain link of a step function (a lean oneDNN convolution closure, or one followed
    by releases of values read for the last time: `lower._with_release`), or None."""
    inner, _ = getattr(fn, "released", (fn, ()))
    link = getattr(inner, "link", None)
    return link if isinstance(link, Link) else None


def _releases(fn: Callable[[], None]) -> list[int]:
    """The env indices step function `fn` sets to None after its work (`lower._with_release`)."""
    return list(getattr(fn, "released", (None, ()))[1])


class Chained:
    """Steps after chaining: each step's function, thread count, the instructions it
    computes, whether it is a fallback, and its chain (None for a step left alone)."""

    def __init__(self) -> None:
        self.fns: list[Callable[[], None]] = []
        self.counts: list[int] = []
        self.computes: list[list[Instruction]] = []
        self.fallbacks: list[bool] = []
        self.chains: list[Chain | MbChain | None] = []

    def add(self, steps: Sequence[Step], count: int, chain: Chain | MbChain | None) -> None:
        self.fns.append(chain.run if chain is not None else steps[0].fn)
        self.counts.append(count)
        self.computes.append([i for s in steps for i in s.instructions])
        self.fallbacks.append(any(s.fallback for s in steps))
        self.chains.append(chain)


def _joins(step: Step, env: list, static: Sequence[bool]) -> bool:
    """Whether `step` may run inside a chain after other members: a lean convolution whose
    inputs are all pointed to once (a varying input is read at a chain's start, before the
    members run: the first member's only)."""
    link = link_of(step.fn)
    return link is not None and all(_fixed(e, env, static) for e in _inputs(1, link, env))


def chain_steps(
    steps: Sequence[Step], counts: Sequence[int], env: list, static: Sequence[bool]
) -> Chained:
    """`steps` (with their thread counts `counts`) with each run of two or more consecutive
    lean oneDNN convolution steps of one thread count made one `Chain` step (none when
    `CHAIN` is off), and each run of two or more native block steps one `MbChain` step
    (mnv17; none when `native_mbchain.enabled()` is off)."""
    out = Chained()
    native = native_mbchain.enabled()
    k = 0
    while k < len(steps):
        end = k + 1
        first = native_mbchain.starts(steps[k].fn, env) if native else None
        if first is not None:
            while end < len(steps) and counts[end] == counts[k] and (
                native_mbchain.joins(steps[end].fn, env, static, first)
            ):
                end += 1
            blocks = end
            if end < len(steps) and counts[end] == counts[k] and HEAD_IN_CHAIN and (
                native_mbchain.head_joins(steps[end].fn, env, static, first.dtype)
            ):  # the network's head after the blocks: the chain's last member
                end += 1
            if end - k >= 2:
                fns = [s.fn for s in steps[k:blocks]]
                head = steps[blocks].fn if end > blocks else None
                releases = [i for s in steps[k:end] for i in _releases(s.fn)]
                computes = [s.instructions for s in steps[k:end]]
                chain = MbChain(fns, env, releases, computes, head=head)
                out.add(steps[k:end], counts[k], chain)
                k = end
                continue
            end = k + 1
        if CHAIN and link_of(steps[k].fn) is not None:
            while end < len(steps) and counts[end] == counts[k] and _joins(steps[end], env, static):
                end += 1
        if end - k >= 2:
            links = [link_of(s.fn) for s in steps[k:end]]
            releases = [i for s in steps[k:end] for i in _releases(s.fn)]
            computes = [s.instructions for s in steps[k:end]]
            chain = Chain(links, env, static, releases, computes)  # type: ignore[arg-type]
            out.add(steps[k:end], counts[k], chain)
        else:
            out.add(steps[k:end], counts[k], None)
        k = end
    return out


__all__ = ["CHAIN", "Chain", "Chained", "chain_steps", "link_of"]
