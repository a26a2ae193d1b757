"""If, Loop and Scan with subgraphs: against onnxruntime at every optimization level and through the GPU
path's PyTorch functions (CPU tensors); subgraphs reading values of the graphs around them (also two levels
up, also after a pass renamed them), zero-iteration loops, the optimized model saved with its subgraphs, and
the load-time and run-time errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_models import LEVELS, make, onnxruntime, randn, run_on, same, session_at, vi

from xpuruntime.graph.ir import GraphError
from xpuruntime.onnx import InferenceSession, NodeExecutionError, SessionOptions, UnsupportedModelError

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
PATHS = ("numpy", "torch")


def graph(nodes: list, inputs: list, outputs: list, name: str, consts: dict | None = None) -> onnx.GraphProto:
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    return helper.make_graph(nodes, name, inputs, outputs, inits)


def if_model() -> onnx.ModelProto:
    """y = x * w + 1 (then) or x - w (else), where the then branch holds a nested If reading `w` and `x`
    from two levels up; `w` is an initializer only the subgraphs read."""
    inner_then = graph([helper.make_node("Add", ["xw", "one"], ["r"])], [], [vi("r", None)], "inner_then",
                       {"one": np.float32(1.0)})  # fmt: skip
    inner_else = graph([helper.make_node("Sub", ["xw", "x"], ["r2"])], [], [vi("r2", None)], "inner_else")
    then = graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]),
         helper.make_node("If", ["flag"], ["t"], then_branch=inner_then, else_branch=inner_else)],
        [], [vi("t", None)], "then",
    )  # fmt: skip
    otherwise = graph([helper.make_node("Sub", ["x", "w"], ["e"])], [], [vi("e", None)], "else")
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=otherwise),
    ]
    inputs = [vi("x", [3, 4]), vi("flag", [], B)]
    consts = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "zero": np.float32(0.0)}
    return make(nodes, inputs, [vi("y", [3, 4])], consts, opset=13)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("level", LEVELS)
def test_if_branches_read_outer_values_two_levels_up(path: str, level: str, torch_session, rng) -> None:
    model = if_model()
    for sign, flag in ((1, True), (1, False), (-1, True)):
        feed = {"x": np.abs(randn(rng, 3, 4)) * sign, "flag": np.array(flag)}
        got = session_at(model, level).run(None, feed) if path == "numpy" else run_on(path, torch_session, model, feed)
        same(got, onnxruntime(model, feed))


def loop_model(trip: bool = True, cond: bool = True) -> onnx.ModelProto:
    """Carried `acc` += x * i + bias (bias from the outer graph), scan output acc each step, while the sum
    stays under `limit` (when cond is given) and i < M (when M is given)."""
    body = graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["xi", "bias"], ["step"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["seen"]),
        ],
        [vi("i", [], I64), vi("cond_in", [], B), vi("acc_in", [2, 3])],
        [vi("cond_out", [], B), vi("acc_out", [2, 3]), vi("seen", [2, 3])],
        "body",
    )
    names = ["M" if trip else "", "cond" if cond else "", "acc0"]
    node = helper.make_node("Loop", names, ["acc", "history"], body=body)
    inputs = [vi("x", [2, 3]), vi("acc0", [2, 3]), vi("limit", [], F)]
    inputs += [vi("M", [], I64)] if trip else []
    inputs += [vi("cond", [], B)] if cond else []
    return make([node], inputs, [vi("acc", [2, 3]), vi("history", None)], {"bias": np.float32(0.5)}, opset=13)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("form", ["for and while", "for", "while"])
def test_loop_with_carried_values_scan_outputs_and_outer_values(path: str, form: str, torch_session, rng) -> None:
    trip, cond = form != "while", form != "for"
    model = loop_model(trip, cond)
    x, acc0 = np.abs(randn(rng, 2, 3)), randn(rng, 2, 3)
    for steps, limit in ((5, 1e9), (5, 15.0), (0, 1e9)):  # to the end, stopped by the condition, none at all
        if not trip and steps == 0:
            continue
        feed = {"x": x, "acc0": acc0, "limit": np.array(limit, np.float32)}
        feed |= {"M": np.array(steps, np.int64)} if trip else {}
        feed |= {"cond": np.array(True)} if cond else {}
        want = onnxruntime(model, feed)
        got = run_on(path, torch_session, model, feed)
        same(got, want)
        if steps == 0:
            assert got[1].shape == (0, 2, 3)  # no iteration: an empty scan output of the body's declared shape


def test_loop_that_could_never_end_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match=r"\(Loop\): a Loop with neither M nor cond never ends"):
        InferenceSession(loop_model(trip=False, cond=False).SerializeToString())


def scan_model(opset: int) -> onnx.ModelProto:
    """A running sum and product over the scanned axis: Scan-9+ scans x along axis 1 backwards and writes its
    outputs along axis 1 in reverse; Scan-8 scans each batch entry of (B, T, 2) for sequence_lens[b] steps."""
    body = graph(
        [helper.make_node("Add", ["sum_in", "xt"], ["sum_out"]), helper.make_node("Mul", ["sum_out", "scale"], ["y"])],
        [vi("sum_in", [2]), vi("xt", [2])], [vi("sum_out", [2]), vi("y", [2])], "body",
    )  # fmt: skip
    if opset >= 9:
        attrs = {"scan_input_axes": [1], "scan_input_directions": [1], "scan_output_axes": [1],
                 "scan_output_directions": [1]}  # fmt: skip
        node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, **attrs)
        inputs = [vi("s0", [2]), vi("x", [2, 5])]
        return make([node], inputs, [vi("s", [2]), vi("ys", None)], {"scale": np.float32(2.0)}, opset)
    body.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    node = helper.make_node("Scan", ["lens", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1)
    inputs = [vi("lens", [3], I64), vi("s0", [3, 2]), vi("x", [3, 4, 2])]
    return make([node], inputs, [vi("s", [3, 2]), vi("ys", None)], {"scale": np.float32(2.0)}, opset)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("opset", [8, 11])
def test_scan_axes_directions_and_sequence_lengths(path: str, opset: int, torch_session, rng) -> None:
    model = scan_model(opset)
    if opset >= 9:
        feed = {"s0": randn(rng, 2), "x": randn(rng, 2, 5)}
    else:
        feed = {"lens": np.array([4, 2, 1], np.int64), "s0": randn(rng, 3, 2), "x": randn(rng, 3, 4, 2)}
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed))


def test_a_renamed_outer_value_still_reaches_the_subgraph_and_the_saved_model(tmp_path, rng) -> None:
    """Two equal constants: CSE points the If at the first one, by position, and the saved optimized model
    bridges the new name to the one its subgraph reads (onnxruntime runs it)."""
    then = graph([helper.make_node("Add", ["x", "c2"], ["t"])], [], [vi("t", None)], "then")
    otherwise = graph([helper.make_node("Mul", ["x", "c2"], ["e"])], [], [vi("e", None)], "else")
    nodes = [helper.make_node("Add", ["x", "c1"], ["a"]),
             helper.make_node("If", ["flag"], ["b"], then_branch=then, else_branch=otherwise),
             helper.make_node("Sub", ["a", "b"], ["y"])]  # fmt: skip
    const = np.linspace(1, 2, 4, dtype=np.float32)
    model = make(nodes, [vi("x", [4]), vi("flag", [], B)], [vi("y", [4])], {"c1": const, "c2": const.copy()})
    saved = str(tmp_path / "optimized.onnx")
    options = SessionOptions(optimized_model_filepath=saved, graph_optimization_level="basic")  # no xrt nodes
    sess = InferenceSession(model.SerializeToString(), options)
    (node,) = [n for n in sess.graph.nodes if n.op == "If"]
    assert node.inputs == ["flag", "x", "c1"] and node.implicit_inputs() == ["x", "c2"]  # CSE renamed c2, by position
    for flag in (True, False):
        feed = {"x": randn(rng, 4), "flag": np.array(flag)}
        want = onnxruntime(model, feed)
        same(sess.run(None, feed), want)
        same(onnxruntime(onnx.load(saved), feed), want)


def test_subgraph_errors_name_the_node(rng) -> None:
    bad_op = graph([helper.make_node("StringNormalizer", ["x"], ["t"])], [], [vi("t", None)], "then")
    fine = graph([helper.make_node("Identity", ["x"], ["e"])], [], [vi("e", None)], "else")
    node = helper.make_node("If", ["flag"], ["y"], then_branch=bad_op, else_branch=fine)
    model = make([node], [vi("x", [4]), vi("flag", [], B)], [vi("y", None)])
    with pytest.raises(UnsupportedModelError, match="unsupported StringNormalizer"):
        InferenceSession(model.SerializeToString())
    dangling = graph([helper.make_node("Identity", ["nowhere"], ["t"])], [], [vi("t", None)], "then")
    node = helper.make_node("If", ["flag"], ["y"], then_branch=dangling, else_branch=fine)
    model = make([node], [vi("x", [4]), vi("flag", [], B)], [vi("y", None)])
    with pytest.raises(GraphError, match="input 'nowhere' is not produced by any node"):
        InferenceSession(model.SerializeToString())
    failing = graph([helper.make_node("Reshape", ["x", "shape"], ["t"])], [], [vi("t", None)], "then",
                    {"shape": np.array([3, 5], np.int64)})  # fmt: skip
    node = helper.make_node("If", ["flag"], ["y"], then_branch=failing, else_branch=fine)
    model = make([node], [vi("x", [4]), vi("flag", [], B)], [vi("y", None)])
    sess = InferenceSession(model.SerializeToString())
    x = randn(rng, 4)
    same(sess.run(None, {"x": x, "flag": np.array(False)}), [x])  # the failing branch is not run
    with pytest.raises(NodeExecutionError, match=r"\(If\).*\(Reshape\) in subgraph 'then'"):
        sess.run(None, {"x": randn(rng, 4), "flag": np.array(True)})


def test_gpu_path_subgraphs_compute_on_the_device_of_the_outer_tensors(rng) -> None:
    """On the GPU path an If's condition is read on the host (a NumPy array) and its other inputs are device
    tensors: the branch's own constants (here a GatherElements index and a value added) go to the tensors'
    device, not the host's. NumPy arrays have a `.device` ('cpu') since NumPy 2; taken for a tensor's, it sent
    them to the host (ONNX's affine_grid expanded tests failed so on CUDA). The 'meta' device stands in for
    CUDA here: mixing it with host tensors fails as mixing CUDA with host tensors does."""
    torch = pytest.importorskip("torch")
    from xpuruntime.onnx.importer import import_model
    from xpuruntime.onnx.ops import OPS

    then = graph(
        [helper.make_node("GatherElements", ["x", "index"], ["g"], axis=1), helper.make_node("Add", ["g", "c"], ["t"])],
        [], [vi("t", None)], "then", {"index": np.array([[1, 0], [2, 2]], np.int64), "c": np.float32(2.0)},
    )  # fmt: skip
    otherwise = graph([helper.make_node("Identity", ["x"], ["e"])], [], [vi("e", None)], "else")
    node = helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=otherwise)
    model = make([node], [vi("x", [2, 3]), vi("flag", [], B)], [vi("y", None)])
    (if_node,) = import_model(model).nodes
    run_if = OPS["If"].torch(if_node, 13)
    x = randn(rng, 2, 3)
    (y,) = run_if(np.array(True), torch.from_numpy(x).to("meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (2, 2)
    (y,) = run_if(np.array(True), torch.from_numpy(x))  # the values, on the CPU
    np.testing.assert_allclose(y.numpy(), np.take_along_axis(x, np.array([[1, 0], [2, 2]]), 1) + 2.0)
