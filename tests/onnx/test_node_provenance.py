"""Run-time errors name the ONNX node they come from (`Instruction.source`).

A model whose node fails at run time (a Gather, GatherElements or ScatterND fed out-of-range
indices) must fail on the `ref` and `cpu` targets, plain and profiled, with a
`pygraphx.EvaluationError` naming that node (`(ONNX node 'enc/lookup' Gather)`, or
`Gather #1`, its index in the graph, when it has no name). ONNX Runtime is the oracle that the
model is sound for in-range indices and that the feed is bad. The nodes survive the
optimisation passes (constant propagation gives the folded literal the node it came from;
fusion lists every member's node, and a failure inside a fused step names them all), the
module's insert/replace helpers, sub-graphs (an If branch), and save/load; files written before
sources existed (the fuzz corpus) still load and run; printed programs are unchanged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.driver.main import main as driver_main
from pygraphx.ir import serialize
from pygraphx.ir.instruction import node_source
from pygraphx.ir.module import Module
from pygraphx.ir.printer import print_program, source_annotation
from pygraphx.ir.shape import Shape
from pygraphx.onnx.parser import node_source_label
from pygraphx.ops import make_op
from pygraphx.passes.pipeline import optimize
from tests.helpers import assert_outputs_match, make_model, plant_cpu_step_failure, run_ort

pytest.importorskip("torch")

DATA = np.arange(12, dtype=np.float32).reshape(3, 4)
ROOT = Path(__file__).resolve().parents[2]


def _label(node: onnx.NodeProto, index: int) -> str:
    """The label the test expects, written out independently of the parser's helper."""
    return f"'{node.name}' {node.op_type}" if node.name else f"{node.op_type} #{index}"


def _index_model(case: str, named: bool) -> tuple[onnx.ModelProto, dict, dict, int]:
    """(model, good feeds, bad feeds, index of the failing node): Relu -> indexing -> Exp."""
    name = "enc/lookup" if named else ""
    if case == "gather":
        op = helper.make_node("Gather", ["r", "i"], ["g"], axis=1, name=name)
        good, bad = np.array([0, 3], np.int64), np.array([0, 7], np.int64)
        extra: dict = {}
    elif case == "gather_elements":
        op = helper.make_node("GatherElements", ["r", "i"], ["g"], axis=1, name=name)
        good = np.array([[0, 3, 1, 2]] * 3, np.int64)
        bad = np.array([[0, 9, 1, 2]] * 3, np.int64)
        extra = {}
    else:
        op = helper.make_node("ScatterND", ["r", "i", "u"], ["g"], name=name)
        good, bad = np.array([[1], [2]], np.int64), np.array([[1], [8]], np.int64)
        extra = {"u": np.ones((2, 4), np.float32)}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="enc/relu"),
        op,
        helper.make_node("Exp", ["g"], ["y"]),
    ]
    feeds = {"x": DATA, "i": good, **extra}
    return make_model(nodes, feeds, ["y"]), feeds, {**feeds, "i": bad}, 1


def _compiled(model: onnx.ModelProto, target: str, optimized: bool) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if optimized:
        optimize(prog)
    prog.compile(pygraphx.get_target(target))
    return prog


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
@pytest.mark.parametrize("target", ["ref", "ref-optimized", "cpu"])
@pytest.mark.parametrize("case", ["gather", "gather_elements", "scatternd"])
def test_run_time_error_names_the_onnx_node(
    case: str, target: str, profiled: bool, named: bool
) -> None:
    model, good, bad, k = _index_model(case, named)
    prog = _compiled(model, target.split("-")[0], target.endswith("optimized"))
    # the model is sound: in-range indices give ONNX Runtime's answer
    assert_outputs_match([np.array(prog.run(good)[0])], run_ort(model, good), 1e-6, 1e-6)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the oracle: ORT refuses the feed too
        run_ort(model, bad)
    observer = (lambda ins, value, seconds: None) if profiled else None
    with pytest.raises(pygraphx.EvaluationError) as err:
        prog.run(bad, observer=observer)
    message = str(err.value)
    assert message.endswith(f"(ONNX node {_label(model.graph.node[k], k)})"), message
    assert "enc/relu" not in message  # only the node that failed


def test_parser_labels_match_the_model() -> None:
    """Every instruction a node adds carries that node; parameters and initialisers none."""
    model, _, _, _ = _index_model("scatternd", named=True)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    labels = {_label(n, k) for k, n in enumerate(model.graph.node)}
    main = prog.get_main_module()
    seen = set()
    for ins in main.instructions:
        if ins.is_param() or ins.is_return():
            assert ins.source == (), ins
        else:
            assert len(ins.source) == 1 and ins.source[0] in labels, ins.source
            seen.add(ins.source[0])
    assert seen == labels
    other = helper.make_node("Attention", ["a"], ["b"], domain="com.microsoft")
    assert node_source_label(other, 4) == "com.microsoft::Attention #4"


def _chain_model() -> onnx.ModelProto:
    """x -> Add(x, scale*bias) -> Mul -> Exp -> MatMul: `scale` folds, the rest fuses."""
    nodes = [
        helper.make_node("Mul", ["c1", "c2"], ["c"], name="scale"),
        helper.make_node("Add", ["x", "c"], ["a"], name="blk/add"),
        helper.make_node("Mul", ["a", "a"], ["m"], name="blk/square"),
        helper.make_node("Exp", ["m"], ["e"], name="blk/exp"),
        helper.make_node("MatMul", ["e", "w"], ["y"], name="proj"),
    ]
    inits = {
        "c1": np.full((3,), 0.5, np.float32),
        "c2": np.arange(3, dtype=np.float32),
        "w": np.ones((3, 2), np.float32),
    }
    return make_model(nodes, {"x": np.ones((2, 3), np.float32) * 0.1}, ["y"], inits)


FUSED = ("'blk/add' Add", "'blk/square' Mul", "'blk/exp' Exp")


def test_optimisation_keeps_sources() -> None:
    """Constant propagation gives the folded literal its node; the pointwise group lists its
    members' nodes in order; the MatMul keeps its own."""
    model = _chain_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    optimize(prog)
    main = prog.get_main_module()
    fused = [i for i in main.instructions if i.op.name == "pointwise"]
    assert [f.source for f in fused] == [FUSED]
    folded = [i for i in main.instructions if i.is_literal() and i.shape.lens() == [3]]
    assert [f.source for f in folded] == [("'scale' Mul",)]  # c1 * c2, folded
    np.testing.assert_array_equal(folded[0].get_literal().array, [0, 0.5, 1])
    dot = next(i for i in main.instructions if i.op.name == "dot")
    assert dot.source == ("'proj' MatMul",)
    x = {"x": np.ones((2, 3), np.float32) * 0.1}
    prog.compile(pygraphx.get_target("ref"))
    assert_outputs_match([np.array(prog.run(x)[0])], run_ort(model, x), 1e-5, 1e-6)


def test_failure_in_a_fused_cpu_step_names_every_fused_node() -> None:
    prog = pygraphx.parse_onnx_buffer(_chain_model().SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    plant_cpu_step_failure(prog, "pointwise")
    with pytest.raises(pygraphx.EvaluationError, match="planted") as err:
        prog.run({"x": np.ones((2, 3), np.float32)})
    assert str(err.value).endswith("(ONNX nodes " + ", ".join(FUSED) + ")"), str(err.value)


def test_failure_inside_a_fused_body_on_ref_names_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body's instructions know no node; the error of the sub-module's evaluator gets the
    fused instruction's nodes."""
    prog = pygraphx.parse_onnx_buffer(_chain_model().SerializeToString())
    optimize(prog)
    prog.compile(pygraphx.get_target("ref"))
    body = next(m for m in prog.modules.values() if m.parent is not None)
    exp = next(i for i in body.instructions if i.op.name == "exp")

    def broken(self: object, shape: object, args: object) -> None:
        raise FloatingPointError("planted")

    monkeypatch.setattr(type(exp.op), "compute", broken)
    with pytest.raises(pygraphx.EvaluationError, match="planted") as err:
        prog.run({"x": np.ones((2, 3), np.float32)})
    message = str(err.value)
    assert f"{body.name}:@" in message  # the body's instruction is named
    assert message.endswith("(ONNX nodes " + ", ".join(FUSED) + ")"), message


def test_node_inside_an_if_branch_is_named() -> None:
    then_g = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["t"], axis=1, name="branch/lookup")],
        "then_body",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Gather", ["x", "j"], ["e"], axis=1, name="branch/other")],
        "else_body",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    node = helper.make_node(
        "If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g
    )
    idx = np.array([0, 1], np.int64)
    feeds = {"x": DATA, "c": np.array(True), "i": idx, "j": idx}
    model = make_model([node], feeds, ["y"])
    bad = {**feeds, "i": np.array([0, 9], np.int64)}
    for target in ("ref", "cpu"):
        prog = _compiled(model, target, optimized=False)
        assert_outputs_match([np.array(prog.run(feeds)[0])], run_ort(model, feeds), 0, 0)
        with pytest.raises(pygraphx.EvaluationError) as err:
            prog.run(bad)
        message = str(err.value)
        assert "(ONNX node 'branch/lookup' Gather)" in message, message
        assert "choose" not in message  # the inner node is named, not the If around it


def test_module_edits_carry_sources() -> None:
    """insert takes the source of the instruction it goes before, replace gives a replacement
    with none of its own the replaced one's; parameters and instructions with their own keep
    theirs."""
    m = Module("main")
    x = m.add_parameter("x", Shape("float_type", [2]))
    with node_source(("'a' Relu",)):
        a = m.add_instruction(make_op("relu"), [x])
    with node_source(("'b' Exp",)):
        b = m.add_instruction(make_op("exp"), [a])
    m.add_return([b])
    assert (x.source, a.source, b.source) == ((), ("'a' Relu",), ("'b' Exp",))
    neg = m.insert_instruction(b, make_op("neg"), [a])
    assert neg.source == ("'b' Exp",)
    new = m.insert_instruction(b, make_op("exp"), [neg])
    new.source = ()
    m.replace_instruction(b, new)
    assert new.source == ("'b' Exp",)
    m.replace_instruction(a, x)  # a value replaced by a parameter: it stays a parameter
    assert x.source == ()
    lit = m.insert_literal(neg, np.ones(2, np.float32))
    assert lit.source == ("'b' Exp",)
    m.validate()


def test_save_and_load_keep_sources(tmp_path: Path) -> None:
    model, good, bad, k = _index_model("gather", named=True)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    path = tmp_path / "m.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    for name, mod in prog.modules.items():
        assert [i.source for i in loaded.get_module(name).instructions] == [
            i.source for i in mod.instructions
        ]
    assert any(i.source for i in loaded.get_main_module().instructions)
    np.testing.assert_array_equal(np.array(loaded.run(good)[0]), np.array(prog.run(good)[0]))
    with pytest.raises(pygraphx.EvaluationError, match="'enc/lookup' Gather"):
        loaded.run(bad)


@pytest.mark.parametrize("name", ["mlp", "mlp_ref", "if_ref", "reshape"])
def test_files_written_before_sources_load(name: str) -> None:
    """The fuzz corpus was saved before instructions had sources: it loads with none, runs,
    and round-trips through save/load to the same results."""
    prog = pygraphx.load(ROOT / "fuzz" / "corpus" / "pgx" / f"{name}.pgx")
    assert all(i.source == () for m in prog.modules.values() for i in m.instructions)
    x = {n: np.ones(s.lens(), s.dtype()) for n, s in prog.get_inputs().items()}
    if not prog.is_compiled():
        prog.compile(pygraphx.get_target("ref"))
    again = serialize.loads(serialize.dumps(prog))
    out = np.array(prog.run(x)[0])
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(np.array(again.run(x)[0]), out)


def test_a_malformed_source_is_refused() -> None:
    prog = pygraphx.parse_onnx_buffer(_index_model("gather", True)[0].SerializeToString())
    doc = serialize.program_to_dict(prog)
    doc["modules"][0]["instructions"][-2]["source"] = [7]
    payload = msgpack.packb(doc, default=serialize._default, use_bin_type=True)
    data = (
        serialize._HEADER.pack(
            serialize.MAGIC,
            serialize.FORMAT_VERSION,
            len(payload),
            hashlib.sha256(payload).digest(),
        )
        + payload
    )
    with pytest.raises(serialize.SerializationError, match="source"):
        serialize.loads(data)


def test_printed_programs_do_not_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`print(prog)` shows no sources; `source_annotation` (the driver's `read --sources`)
    ends each line with its nodes."""
    model, _, _, _ = _index_model("gather", named=True)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    plain = str(prog)
    assert "enc/" not in plain and "#" not in plain
    annotated = print_program(prog, source_annotation)
    for line, noted in zip(plain.splitlines(), annotated.splitlines(), strict=True):
        assert noted.startswith(line)
        assert ("gather[" in line) == noted.endswith("  # 'enc/lookup' Gather")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert driver_main(["read", str(path), "--sources"]) == 0
    assert annotated in capsys.readouterr().out
    assert driver_main(["read", str(path)]) == 0
    assert plain in capsys.readouterr().out


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
def test_gpu_step_loop_names_the_onnx_node(profiled: bool) -> None:
    """The gpu target's step loops (here its lowering on the CPU device), plain and profiled."""
    from pygraphx.targets.gpu.target import GpuTarget

    model, good, bad, k = _index_model("gather", named=True)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu"))
    assert_outputs_match([np.array(prog.run(good)[0])], run_ort(model, good), 1e-6, 1e-6)
    observer = (lambda ins, value, seconds: None) if profiled else None
    with pytest.raises(pygraphx.EvaluationError) as err:
        prog.run(bad, observer=observer)
    assert str(err.value).endswith("(ONNX node 'enc/lookup' Gather)"), str(err.value)
