"""The target-independent optimisation pipeline (what `-O` runs before a target lowers).

The order matters and is explicit: fold constants, simplify algebra and layout, absorb pads,
move 1x1 convolutions in front of the upsampling resizes that feed them, merge repeated work,
recognise whole activations (GELU, SiLU), remove what is dead, fuse element-wise and reduction
regions, then plan memory. `optimize(program)` runs it; targets start their own lists with
`optimize_passes()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.eliminate_common_subexpression import eliminate_common_subexpression
from pygraphx.passes.eliminate_contiguous import eliminate_contiguous
from pygraphx.passes.eliminate_identity import eliminate_identity
from pygraphx.passes.eliminate_pad import eliminate_pad
from pygraphx.passes.fuse_pointwise import fuse_pointwise
from pygraphx.passes.fuse_reduce import fuse_reduce
from pygraphx.passes.fusion_policy import DefaultFusion, FusionPolicy
from pygraphx.passes.manager import Pass, module_pass, run_passes
from pygraphx.passes.memory_coloring import memory_coloring
from pygraphx.passes.propagate_constant import propagate_constant
from pygraphx.passes.recognize_activations import recognize_activations
from pygraphx.passes.schedule import schedule
from pygraphx.passes.simplify_algebra import simplify_algebra
from pygraphx.passes.simplify_reshapes import simplify_reshapes
from pygraphx.passes.swap_resize_convolution import swap_resize_convolution

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


def optimize_passes(
    fuse: bool = True, plan_memory: bool = True, policy: FusionPolicy | None = None
) -> list[Pass]:
    """The ordered target-independent pass list; `policy` decides what the fusion passes group
    (`DefaultFusion` when None, the CPU's choice)."""
    policy = policy or DefaultFusion()
    passes = [
        module_pass(eliminate_identity),
        module_pass(propagate_constant),
        module_pass(simplify_reshapes),
        module_pass(simplify_algebra),
        module_pass(eliminate_pad),
        module_pass(swap_resize_convolution),
        module_pass(propagate_constant),
        module_pass(eliminate_common_subexpression),
        module_pass(simplify_algebra),
        module_pass(simplify_reshapes),
        module_pass(recognize_activations),
        module_pass(eliminate_contiguous),
        module_pass(dead_code_elimination),
    ]
    if fuse:
        passes += [
            Pass("fuse_pointwise", lambda m, p: fuse_pointwise(m, p, policy)),
            Pass("fuse_reduce", lambda m, p: fuse_reduce(m, p, policy)),
        ]
    if plan_memory:
        passes += [module_pass(schedule), module_pass(memory_coloring)]
    return passes


def optimize(program: Program) -> Program:
    """Run the optimisation pipeline on an uncompiled program, in place; returns it."""
    if program.is_compiled():
        raise ValueError("optimize() works on an uncompiled program")
    policy = DefaultFusion()
    passes = optimize_passes(policy=policy)
    program.pass_times = run_passes(program, passes)
    program.transforms.append(optimize)  # re-applied to shapes a dynamic program specializes
    # what compile() checks so that -O then compile does not run the same passes twice
    program.optimized_as = (tuple(p.name for p in passes), policy_key(policy), structure(program))
    return program


def structure(program: Program) -> tuple:
    """The program's modules and their instructions' op names: changes when a pass or a
    transform (quantize, a user's edit) changes the program."""
    return tuple(
        (name, tuple(ins.op.name for ins in mod.instructions))
        for name, mod in program.modules.items()
    )


def policy_key(policy: FusionPolicy) -> tuple:
    """A fusion policy's name and settings (two policies with equal keys fuse alike)."""
    settings = getattr(policy, "__dict__", {})
    return (type(policy).__name__, policy.name, sorted(settings.items(), key=str))


def already_optimized(program: Program, passes: list[Pass], policy: FusionPolicy) -> bool:
    """Whether `optimize()` ran these very passes (by name, in order, fusing by the same
    `policy`) on the program as it is now, so that running them again would redo its work.
    A target's own leading passes (the cpu target's `fold_qdq`, the gpu target's `fold_fp8`)
    do not count: they fold quantised products before constant propagation makes their
    weights float, which on a program `optimize()` already ran has happened, so they would
    find nothing left to fold."""
    done = getattr(program, "optimized_as", None)
    if done is None or not passes:
        return False
    names, key, shape = done
    target_names = tuple(p.name for p in passes)
    same_passes = target_names[len(target_names) - len(names) :] == names
    return same_passes and key == policy_key(policy) and shape == structure(program)
