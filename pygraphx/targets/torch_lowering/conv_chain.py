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
  channels-last copy) is read, converted and pointed to each run, just before its member's
  primitive runs (it may be a copy of an earlier member's result: a channel slice of a slot).

A chain's members read nothing that a step between them writes: they are consecutive steps;
an input copied each run is copied right before its member runs, after the members before it
wrote (a YOLOv8 C2f split read at the chain's start gave the previous run's values). The same
primitives run as the members' own closures would run (same objects, same order), so the
outputs are identical. oneDNN fixes a primitive's thread count when it is made; a chain's
members have one thread count (`chain_steps` cuts at a change), and a chain keeps one list of
primitives per thread count it runs under, made at its first run under it.

Timing (`perf --cpu`, `profile.time_steps`): `Chain.clock` set, a run times each member
(the per-run guard and inputs counted in the first) into `Chain.seconds`. The profiled
(observer) path runs the instructions' own unfused steps, never a chain. `CHAIN = False`
(read when a program is prepared) runs every step alone (A/B: `benchmarks/chain11_ab.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_, itemgetter
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import Step
from pygraphx.targets.torch_lowering.onednn_capi import check
from pygraphx.targets.torch_lowering.onednn_conv import Link, Primitive, _channels_last

#: chain consecutive lean oneDNN convolution steps (read by `chain_steps`; False: A/B)
CHAIN = True

Tensor = torch.Tensor
#: an input of a member: (member, 0 for the source / 2 for the add operand, env index or None,
#: the getter)
_Input = tuple[int, int, int | None, Callable[[], Tensor]]


class _Team:
    """A chain's primitives for one thread count, and the state of their inputs."""

    __slots__ = ("prims", "calls", "fixed", "fetch", "expected", "varying", "varying_at")

    def __init__(self, prims: list[Primitive]) -> None:
        self.prims = prims
        self.calls = [p.call for p in prims]
        self.fixed: list[_Input] = []  # pointed to once, guarded by `fetch` / `expected`
        self.fetch: Callable[[list], Any] = lambda env: ()
        self.expected: tuple = ()
        self.varying: list[_Input] = []  # read and pointed to every run
        self.varying_at: set[int] = set()  # the members with varying inputs


class Chain:
    """The step running `links` (lean convolution closures' `Link`s) one after the other,
    then dropping the env values `releases`; `static[k]`: whether env slot `k` holds the
    same tensor every run."""

    def __init__(
        self,
        links: Sequence[Link],
        env: list,
        static: Sequence[bool],
        releases: Sequence[int] = (),
    ) -> None:
        self.links = list(links)
        self.env = env
        #: env indices set to None after the chain (values it read for the last time)
        self.releases = list(releases)
        self.teams: dict[int, _Team] = {}
        self.inputs: list[_Input] = []
        self.fixed: list[_Input] = []
        for k, link in enumerate(self.links):
            for slot, get in ((0, link.get_x), (2, link.get_other)):
                if get is None:
                    continue
                where = getattr(get, "slot", None)
                index = where[1] if where is not None and where[0] is env else None
                entry = (k, slot, index, get)
                self.inputs.append(entry)
                if index is not None and static[index]:
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
        if self.clock is not None:
            self._run_timed(team)
            return
        env = self.env
        if not all(map(is_, team.fetch(env), team.expected)):
            self._point_fixed(team)
        if team.varying:
            self._run_varying(team)
        else:
            for call in team.calls:
                status = call()
                if status:
                    self._failed(team, call, status)
        for index in self.releases:
            env[index] = None

    def _run_varying(self, team: _Team) -> None:
        """`run`'s calls where some inputs are read each run: each member's varying inputs
        are read, converted and pointed to just before its primitive runs, since one may be
        (a copy of) an earlier member's result (a slice of a slot, as a C2f block's split)."""
        hold: list[Tensor] = []  # the converted inputs, alive until the primitives read them
        for k, call in enumerate(team.calls):
            if k in team.varying_at:
                hold.extend(self._point_varying(team, k))
            status = call()
            if status:
                self._failed(team, call, status)

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
        team.varying_at = {k for k, _, _, _ in varying}
        indices = [index for _, _, index, _ in fixed]
        team.fetch = _tuple_getter(indices)
        team.expected = tuple(team.fetch(env))

    def _point_varying(self, team: _Team, member: int) -> list[Tensor]:
        """Read, convert and point to the varying inputs of `member`; the tensors to hold
        until its primitive has read them."""
        hold = []
        prims, links = team.prims, self.links
        for k, slot, _, get in team.varying:
            if k != member:
                continue
            p, x = prims[k], get()
            x = links[k].source(p, x) if slot == 0 else _channels_last(x)
            hold.append(x)
            p.point(p.src if slot == 0 else p.other, slot, x.data_ptr())
        return hold

    def _run_timed(self, team: _Team) -> None:
        """`run`, each member timed with `clock` (the guard and inputs in the first)."""
        clock, seconds = self.clock, self.seconds
        assert clock is not None
        start = clock()
        if not all(map(is_, team.fetch(self.env), team.expected)):
            self._point_fixed(team)
        hold: list[Tensor] = []  # the converted inputs, alive until the primitives read them
        for k, call in enumerate(team.calls):
            if k in team.varying_at:
                hold.extend(self._point_varying(team, k))
            status = call()
            if status:
                self._failed(team, call, status)
            end = clock()
            seconds[k] = end - start
            start = end
        for index in self.releases:
            self.env[index] = None

    def _failed(self, team: _Team, call: Callable[[], int], status: int) -> None:
        k = team.calls.index(call)
        check(status, f"convolution {k + 1} of a chain of {len(team.calls)}")


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
        self.chains: list[Chain | None] = []

    def add(self, steps: Sequence[Step], count: int, chain: Chain | None) -> None:
        self.fns.append(chain.run if chain is not None else steps[0].fn)
        self.counts.append(count)
        self.computes.append([i for s in steps for i in s.instructions])
        self.fallbacks.append(any(s.fallback for s in steps))
        self.chains.append(chain)


def chain_steps(
    steps: Sequence[Step], counts: Sequence[int], env: list, static: Sequence[bool]
) -> Chained:
    """`steps` (with their thread counts `counts`) with each run of two or more consecutive
    lean oneDNN convolution steps of one thread count made one `Chain` step (none when
    `CHAIN` is off)."""
    out = Chained()
    k = 0
    while k < len(steps):
        end = k + 1
        if CHAIN and link_of(steps[k].fn) is not None:
            while (end < len(steps) and counts[end] == counts[k]
                   and link_of(steps[end].fn) is not None):  # fmt: skip
                end += 1
        if end - k >= 2:
            links = [link_of(s.fn) for s in steps[k:end]]
            releases = [i for s in steps[k:end] for i in _releases(s.fn)]
            chain = Chain(links, env, static, releases)  # type: ignore[arg-type]
            out.add(steps[k:end], counts[k], chain)
        else:
            out.add(steps[k:end], counts[k], None)
        k = end
    return out


__all__ = ["CHAIN", "Chain", "Chained", "chain_steps", "link_of"]
