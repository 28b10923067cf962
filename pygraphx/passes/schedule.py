"""schedule: reorder a module so values are computed just before they are needed.

A value computed long before its first use occupies memory the whole time in between. This
pass rebuilds the order by depth-first walks from the outputs, emitting each instruction's
inputs right before it (earliest input first, or latest first), so each producer sits as close
to its consumer as dependencies allow. Of the original order and the two walks, the one with
the lowest peak of simultaneously live bytes (the bound memory_coloring works to) is kept.
(MIGraphX's schedule also assigns streams; this one only orders.)
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.memory_coloring import live_peak


def _dfs_order(module: Module, latest_first: bool) -> list[Instruction]:
    index = {id(ins): k for k, ins in enumerate(module.instructions)}
    done: set[int] = set()
    order: list[Instruction] = []
    params = [i for i in module.instructions if i.is_param()]
    roots = [module.instructions[-1]] if module.instructions else []
    for root in params + roots:
        stack: list[tuple[Instruction, bool]] = [(root, False)]
        while stack:
            ins, expanded = stack.pop()
            if id(ins) in done:
                continue
            if expanded:
                done.add(id(ins))
                order.append(ins)
                continue
            stack.append((ins, True))
            # inputs are emitted earliest-first, or latest-first (the input made last usually
            # heads the longest chain; computing it first shortens the others' live ranges)
            own = [i for i in ins.inputs if i.module is module]  # bodies may read outer values
            for i in sorted(own, key=lambda x: index[id(x)], reverse=not latest_first):
                if id(i) not in done:
                    stack.append((i, False))
    # anything unreachable (dead code) keeps its relative place at the end
    order += [i for i in module.instructions if id(i) not in done]
    return order


def schedule(module: Module) -> None:
    """Reorder `module` depth-first from its outputs when that lowers peak live memory."""
    if len(module.instructions) < 3:
        return
    best = list(module.instructions)
    best_peak = live_peak(module)
    for latest_first in (False, True):
        module.instructions = _dfs_order(module, latest_first)
        peak = live_peak(module)
        if peak < best_peak:
            best, best_peak = list(module.instructions), peak
    module.instructions = best
