"""Each pass by its effect on a small printed program, and by unchanged outputs on `ref`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.eliminate_common_subexpression import eliminate_common_subexpression
from pygraphx.passes.eliminate_pad import eliminate_pad
from pygraphx.passes.fuse_pointwise import fuse_pointwise
from pygraphx.passes.fuse_reduce import fuse_reduce
from pygraphx.passes.manager import Pass, PassError, module_pass, run_passes
from pygraphx.passes.memory_coloring import check_plan, live_peak, memory_coloring, plan_memory
from pygraphx.passes.pipeline import optimize
from pygraphx.passes.propagate_constant import propagate_constant
from pygraphx.passes.simplify_algebra import simplify_algebra
from pygraphx.passes.simplify_reshapes import simplify_reshapes
from tests.helpers import make_model

RNG = np.random.default_rng(0)


def _parse(nodes, inputs, outputs, inits=None, opset=17) -> tuple[Program, dict]:
    model = make_model(nodes, inputs, outputs, inits, opset)
    return pygraphx.parse_onnx_buffer(model.SerializeToString()), dict(inputs)


def _run(prog: Program, feeds: dict) -> list[np.ndarray]:
    prog.compile(pygraphx.get_target("ref"))
    return [np.array(r) for r in prog.run(feeds)]


def _check(
    nodes, inputs, outputs, inits, passes: list[Pass], rtol: float = 1e-5, atol: float = 1e-6
) -> Program:
    """Apply `passes`; outputs must match the unoptimised program. Returns the rewritten one."""
    before, feeds = _parse(nodes, inputs, outputs, inits)
    after, _ = _parse(nodes, inputs, outputs, inits)
    run_passes(after, passes)
    text = str(after)
    ref = _run(before, feeds)
    got = _run(after, feeds)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    after.text = text  # type: ignore[attr-defined]
    return after


def _ops(prog: Program, module: str = "main") -> list[str]:
    return [i.op.name for i in prog.get_module(module).instructions]


def P(fn: Callable) -> Pass:  # noqa: N802 - short name for tables
    return module_pass(fn)


X = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)


def test_dead_code_elimination_removes_unused_work() -> None:
    prog, _ = _parse(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Exp", ["x"], ["unused"])],
        {"x": X},
        ["y"],
    )
    main = prog.get_main_module()
    ret = main.instructions[-1]
    exp = main.insert_instruction(ret, pygraphx.make_op("exp"), [main.get_parameter("x")])
    assert "exp" in _ops(prog)
    dead_code_elimination(main)
    assert "exp" not in _ops(prog) and exp not in main.instructions
    assert _ops(prog) == ["@param", "relu", "@return"]


def test_cse_merges_identical_instructions_and_literals() -> None:
    c = np.float32(2.0)
    prog = _check(
        [
            helper.make_node("Mul", ["x", "c1"], ["a"]),
            helper.make_node("Mul", ["x", "c2"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        {"x": X},
        ["y"],
        {"c1": np.array(c), "c2": np.array(c)},
        [P(eliminate_common_subexpression), P(dead_code_elimination)],
    )
    assert _ops(prog).count("mul") == 1
    assert _ops(prog).count("@literal") == 1


def test_cse_merges_big_literals_only_when_every_byte_is_equal() -> None:
    """CSE buckets literals by a sample of their bytes: literals that differ only outside the
    sample stay apart, equal ones merge (checked against the unoptimised program on ref)."""
    w = RNG.standard_normal((3, 8, 8)).astype(np.float32)
    near = w.copy()
    near.reshape(-1)[1] += 1.0  # element 1 is not in the strided sample of 192 elements
    nodes = [
        helper.make_node("Add", ["x", "w1"], ["a"]),
        helper.make_node("Add", ["x", "w2"], ["b"]),
        helper.make_node("Add", ["x", "w3"], ["c"]),
        helper.make_node("Sum", ["a", "b", "c"], ["y"]),
    ]
    inits = {"w1": w, "w2": near, "w3": w.copy()}
    prog = _check(
        nodes, {"x": X}, ["y"], inits, [P(eliminate_common_subexpression), P(dead_code_elimination)]
    )
    assert _ops(prog).count("@literal") == 2
    assert _ops(prog).count("add") == 2 + 2  # a, b (c merged into a) and the two of Sum


def test_propagate_constant_folds_literal_math_but_not_broadcasts() -> None:
    a = RNG.standard_normal((8,)).astype(np.float32)
    prog = _check(
        [
            helper.make_node("Exp", ["a"], ["ea"]),
            helper.make_node("Add", ["ea", "a"], ["k"]),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        {"x": X},
        ["y"],
        {"a": a},
        [P(propagate_constant)],
    )
    ops = _ops(prog)
    assert "exp" not in ops and ops.count("add") == 1
    lit = [i for i in prog.get_main_module() if i.is_literal()]
    assert [i.shape.lens() for i in lit] == [[8]]  # folded before the broadcast, not after


def test_propagate_constant_keeps_a_new_unit_axis_of_a_weight_without_a_copy() -> None:
    """multibroadcast [4, 5] -> [1, 4, 5] of a weight (what a MatMul of a 3-D input by a 2-D
    weight parses to) folds to a literal with standard strides viewing the weight's memory;
    the program still computes x + w (numpy)."""
    prog = Program()
    m = prog.get_main_module()
    w = RNG.standard_normal((4, 5)).astype(np.float32)
    x = m.add_parameter("x", pygraphx.Shape("float_type", [1, 4, 5]))
    lit = m.add_literal(w)
    wide = m.add_instruction(pygraphx.make_op("multibroadcast", out_lens=[1, 4, 5]), [lit])
    m.add_return([m.add_instruction(pygraphx.make_op("add"), [x, wide])])
    propagate_constant(m)
    m.validate()
    (folded,) = [i for i in m if i.is_literal()]
    assert folded.shape == pygraphx.Shape("float_type", [1, 4, 5])  # standard strides
    assert np.shares_memory(folded.get_literal().array, lit.get_literal().array)
    xv = RNG.standard_normal((1, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(_run(prog, {"x": xv})[0], xv + w[None])


@pytest.mark.parametrize(
    "make",
    [
        lambda w: w.T,  # a transposed weight
        lambda w: np.broadcast_to(w.T, (1, *w.T.shape)),  # ... broadcast to [1, N, K]
        lambda w: w.astype(np.float16).T,
        lambda w: w[::2].T,  # a strided transpose
        lambda w: np.broadcast_to(w[0], w.shape),  # broadcast along a real axis: numpy's copy
        lambda w: w[:7, :5].T,  # small: numpy's copy
    ],
)
def test_c_ordered_copies_like_numpy(make: Callable) -> None:
    from pygraphx.passes.propagate_constant import c_ordered

    src = make(RNG.standard_normal((700, 301)).astype(np.float32))
    got = c_ordered(src)
    want = np.ascontiguousarray(src)
    assert got.flags.c_contiguous and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, src)


def _conv_bn_model(pad: bool = False):
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    inits = {
        "w": w,
        "b": RNG.standard_normal(4).astype(np.float32),
        "s": RNG.uniform(0.5, 1.5, 4).astype(np.float32),
        "bb": RNG.standard_normal(4).astype(np.float32),
        "m": RNG.standard_normal(4).astype(np.float32),
        "v": RNG.uniform(0.5, 2, 4).astype(np.float32),
    }
    nodes = []
    src = "x"
    if pad:
        inits["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
        nodes.append(helper.make_node("Pad", ["x", "pads"], ["xp"]))
        src = "xp"
    nodes += [
        helper.make_node("Conv", [src, "w", "b"], ["c"], pads=[0, 0, 0, 0] if pad else [1] * 4),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    return nodes, inits


def test_simplify_algebra_folds_batch_norm_into_the_convolution() -> None:
    nodes, inits = _conv_bn_model()
    prog = _check(
        nodes,
        {"x": X},
        ["y"],
        inits,
        [P(simplify_algebra), P(propagate_constant), P(dead_code_elimination)],
        rtol=1e-4,
        atol=1e-5,
    )
    ops = _ops(prog)
    assert "batch_norm_inference" not in ops
    assert ops.count("convolution") == 1 and ops.count("mul") == 0
    assert ops.count("add") == 1  # conv + (bias and bn shift, merged)


def test_whole_pipeline_leaves_conv_plus_one_pointwise() -> None:
    nodes, inits = _conv_bn_model()
    before, feeds = _parse(nodes, {"x": X}, ["y"], inits)
    after, _ = _parse(nodes, {"x": X}, ["y"], inits)
    optimize(after)
    ref, got = _run(before, feeds)[0], _run(after, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    computing = [o for o in _ops(after) if o not in ("@param", "@literal", "@return")]
    assert sorted(computing) == ["convolution", "multibroadcast", "pointwise"]
    assert after.get_memory_usage() > 0


@pytest.mark.parametrize(
    ("nodes", "inits", "absent", "present"),
    [
        ([helper.make_node("Mul", ["x", "one"], ["y"])], {"one": np.float32(1)}, "mul", None),
        ([helper.make_node("Add", ["x", "zero"], ["y"])], {"zero": np.float32(0)}, "add", None),
        ([helper.make_node("Sub", ["x", "zero"], ["y"])], {"zero": np.float32(0)}, "sub", None),
        ([helper.make_node("Div", ["x", "one"], ["y"])], {"one": np.float32(1)}, "div", None),
        ([helper.make_node("Div", ["x", "c"], ["y"])], {"c": np.float32(4)}, "div", "mul"),
        ([helper.make_node("Sub", ["x", "c"], ["y"])], {"c": np.float32(4)}, "sub", "add"),
        ([helper.make_node("Pow", ["x", "two"], ["y"])], {"two": np.float32(2)}, "pow", "mul"),
        (
            [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Neg", ["n"], ["y"])],
            {},
            "neg",
            None,
        ),
        (
            [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["y"])],
            {},
            "recip",
            "rsqrt",
        ),
    ],
)  # fmt: skip
def test_simplify_algebra_rules(nodes, inits, absent: str, present: str | None) -> None:
    inits = {k: np.array(v) for k, v in inits.items()}
    prog = _check(nodes, {"x": X}, ["y"], inits, [P(simplify_algebra)], rtol=1e-6)
    assert absent not in _ops(prog)
    if present:
        assert present in _ops(prog)


def test_horizontal_fusion_of_qkv_projections() -> None:
    x = RNG.standard_normal((1, 16, 32)).astype(np.float32)
    inits, nodes = {}, []
    for n in "qkv":
        inits[f"w{n}"] = (RNG.standard_normal((32, 32)) * 0.1).astype(np.float32)
        inits[f"b{n}"] = RNG.standard_normal(32).astype(np.float32)
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"m{n}"]),
            helper.make_node("Add", [f"m{n}", f"b{n}"], [n]),
        ]
    nodes.append(helper.make_node("Concat", ["q", "k", "v"], ["y"], axis=0))
    prog = _check(nodes, {"x": x}, ["y"], inits, [P(simplify_algebra)], rtol=1e-5, atol=1e-5)
    ops = _ops(prog)
    assert ops.count("dot") == 1 and ops.count("add") == 1 and ops.count("slice") == 3


def test_simplify_reshapes_collapses_transposes_and_reshapes() -> None:
    prog = _check(
        [
            helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
            helper.make_node("Reshape", ["t2", "s1"], ["r1"]),
            helper.make_node("Reshape", ["r1", "s2"], ["y"]),
        ],
        {"x": X},
        ["y"],
        {"s1": np.array([2, 3, 64], np.int64), "s2": np.array([6, 64], np.int64)},
        [P(simplify_reshapes)],
    )
    ops = _ops(prog)
    assert "transpose" not in ops and ops.count("reshape") == 1


def test_eliminate_pad_moves_pads_into_the_convolution() -> None:
    nodes, inits = _conv_bn_model(pad=True)
    prog = _check(nodes, {"x": X}, ["y"], inits, [P(propagate_constant), P(eliminate_pad)])
    assert "pad" not in _ops(prog)
    assert "padding={1, 1, 1, 1}" in prog.text


def test_fuse_pointwise_builds_one_sub_module_per_chain() -> None:
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Mul", ["b", "b"], ["c"]),
        helper.make_node("Tanh", ["c"], ["y"]),
    ]
    prog = _check(nodes, {"x": X}, ["y"], None, [Pass("fuse_pointwise", fuse_pointwise)])
    assert _ops(prog) == ["@param", "pointwise", "@return"]
    body = prog.get_module("main:pointwise0")
    assert [i.op.name for i in body] == ["@param", "add", "relu", "mul", "tanh", "@return"]
    assert 'module: "main:pointwise0"' in prog.text
    assert "pointwise(x), [main:pointwise0]" in prog.text


def test_fuse_reduce_merges_the_softmax_region() -> None:
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["a"]),
        helper.make_node("Add", ["a", "m"], ["b"]),
        helper.make_node("Softmax", ["b"], ["y"], axis=-1),
    ]
    inits = {"s": np.array(0.125, np.float32), "m": RNG.standard_normal(8).astype(np.float32)}
    prog = _check(
        nodes,
        {"x": X},
        ["y"],
        inits,
        [Pass("fuse_pointwise", fuse_pointwise), Pass("fuse_reduce", fuse_reduce)],
    )
    assert [o for o in _ops(prog) if o not in ("@param", "@literal", "multibroadcast")] == [
        "fused_reduce",
        "@return",
    ]
    body = [i.op.name for i in prog.get_module("main:fused_reduce0")]
    assert body[-2:] == ["softmax", "@return"] and "mul" in body and "add" in body


def test_memory_coloring_reuses_buffers_of_a_chain() -> None:
    nodes = [helper.make_node("Exp" if k % 2 else "Tanh", [f"t{k}"], [f"t{k + 1}"])
             for k in range(6)]  # fmt: skip
    nodes[0].input[0] = "x"
    prog, _ = _parse(nodes, {"x": X}, ["t6"])
    plan = plan_memory(prog.get_main_module())
    check_plan(plan)
    one = X.nbytes
    assert plan.naive_bytes == 6 * one
    assert plan.arena_bytes == plan.lower_bound == 2 * one
    assert live_peak(prog.get_main_module()) == 2 * one  # what schedule compares, unplaced


def test_memory_coloring_debug_check_and_views(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Add", ["t", "e"], ["y"]),
    ]
    prog = _check(nodes, {"x": X}, ["y"], None, [P(memory_coloring)])
    plan = prog.get_main_module().memory_plan
    # relu's buffer is read through the transpose at the add, so it must not share with exp's
    relu = next(i for i in prog.get_main_module() if i.op.name == "relu")
    exp = next(i for i in prog.get_main_module() if i.op.name == "exp")
    a, b = plan.offset_of(relu), plan.offset_of(exp)
    assert abs(a - b) >= X.nbytes
    assert plan.arena_bytes >= plan.lower_bound


def test_manager_disable_time_and_trace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Neg", ["n"], ["y"])]
    monkeypatch.setenv("PGX_DISABLE_PASSES", "simplify_algebra")
    monkeypatch.setenv("PGX_TIME_PASSES", "1")
    monkeypatch.setenv("PGX_TRACE_COMPILE", "1")
    prog, _ = _parse(nodes, {"x": X}, ["y"])
    run_passes(prog, [P(simplify_algebra), P(dead_code_elimination)])
    err = capsys.readouterr().err
    assert "simplify_algebra (disabled by PGX_DISABLE_PASSES)" in err
    assert "Pass: dead_code_elimination:" in err and "ms" in err
    assert 'module: "main"' in err
    assert _ops(prog).count("neg") == 2


def test_manager_names_a_pass_that_breaks_the_program() -> None:
    def broken(module) -> None:
        relu = next(i for i in module if i.op.name == "relu")
        relu.shape = pygraphx.Shape("float_type", [1])

    prog, _ = _parse([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"])
    with pytest.raises(PassError, match="pass 'broken' left the program invalid"):
        run_passes(prog, [module_pass(broken)])


def test_schedule_computes_values_next_to_their_use() -> None:
    from pygraphx.passes.schedule import schedule

    # `early` is computed first but only reduced at the very end, after a long chain
    nodes = [helper.make_node("Exp", ["x"], ["early"])]
    prev = "x"
    for k in range(4):
        nodes.append(helper.make_node("Tanh", [prev], [f"c{k}"]))
        prev = f"c{k}"
    nodes += [
        helper.make_node("ReduceSum", [prev], ["r1"], keepdims=0),
        helper.make_node("ReduceSum", ["early"], ["r2"], keepdims=0),
        helper.make_node("Add", ["r1", "r2"], ["y"]),
    ]
    prog, _ = _parse(nodes, {"x": X}, ["y"])
    before = plan_memory(prog.get_main_module()).lower_bound
    prog2 = _check(nodes, {"x": X}, ["y"], None, [P(schedule)], rtol=1e-5, atol=1e-4)
    after = plan_memory(prog2.get_main_module()).lower_bound
    assert before >= 3 * X.nbytes
    assert after < before and after <= 2 * X.nbytes + 256
    ops = _ops(prog2)
    assert ops.index("exp") > max(k for k, o in enumerate(ops) if o == "tanh")


def test_eliminate_identity_and_contiguous() -> None:
    from pygraphx.passes.eliminate_contiguous import eliminate_contiguous
    from pygraphx.passes.eliminate_identity import eliminate_identity

    prog, feeds = _parse([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"])
    main = prog.get_main_module()
    relu, ret = main.instructions[-2], main.instructions[-1]
    ident = main.insert_instruction(ret, pygraphx.make_op("identity"), [relu])
    copy = main.insert_instruction(ret, pygraphx.make_op("contiguous"), [ident])
    t = main.insert_instruction(
        ret, pygraphx.make_op("transpose", permutation=(0, 1, 3, 2)), [copy]
    )
    kept = main.insert_instruction(ret, pygraphx.make_op("contiguous"), [t])
    main.replace_instruction(relu, relu)  # no-op
    main.remove_instruction(ret)
    main.add_return([kept])
    expected = _run(prog, feeds)[0]
    prog2, _ = _parse([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"])
    prog2.modules = prog.modules  # same modules, uncompiled program object
    run_passes(prog2, [P(eliminate_identity), P(eliminate_contiguous)])
    ops = _ops(prog2)
    assert "identity" not in ops
    assert ops.count("contiguous") == 1  # the copy of the transposed view stays
    np.testing.assert_array_equal(_run(prog2, feeds)[0], expected)
