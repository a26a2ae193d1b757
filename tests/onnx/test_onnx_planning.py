"""How the session plans and runs: shapes set by input values that change from run to run (CPU and GPU path),
results that belong to the caller, a strict policy, the GPU path's constants, and every op family in one
graph through the GPU path (CPU tensors here; CUDA with CUDA graphs on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import LEVELS, RNG, check_reference, make, onnxruntime, ours, randn, same, session_at, torch_run, vi

from xpuruntime.onnx import InferenceSession, SessionOptions

F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


@pytest.mark.parametrize("level", LEVELS)
def test_shapes_set_by_input_values_change_between_runs(level: str) -> None:
    """Same input signature, different values of `n`: the sliced rows, and every shape after them
    (a MatMul, a Softmax, Shape -> ConstantOfShape), differ from run to run."""
    nodes = [
        helper.make_node("Slice", ["x", "zero", "n", "zero"], ["rows"]),
        helper.make_node("MatMul", ["rows", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"]),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Add", ["p", "ones"], ["y"]),
    ]
    consts = {"w": randn(RNG, 5, 3), "zero": np.array([0])}
    model = make(nodes, [vi("x", [7, 5]), vi("n", [1], I64)], [vi("y", None), vi("s", None)], consts)
    sess, x = session_at(model, level), randn(RNG, 7, 5)
    for n in (2, 5, 7, 2):
        check_reference(sess, model, {"x": x, "n": np.array([n])})


@pytest.mark.parametrize("level", LEVELS)
def test_results_belong_to_the_caller(level: str) -> None:
    """Changing the returned arrays changes neither the inputs nor later runs: outputs that are constants,
    shapes or the input itself are copies."""
    nodes = [
        helper.make_node("Add", ["c1", "c2"], ["k"]),  # all constants: folded
        helper.make_node("Mul", ["x", "k"], ["y"]),
        helper.make_node("Shape", ["x"], ["s"]),  # a constant of the plan
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    outputs = [vi("y", None), vi("k", None), vi("s", None), vi("same", None), vi("x", [3, 4])]
    model = make(nodes, [vi("x", [3, 4])], outputs, {"c1": randn(RNG, 4), "c2": randn(RNG, 4)})
    sess, x = session_at(model, level), randn(RNG, 3, 4)
    x_copy = x.copy()
    first = sess.run(None, {"x": x})
    for result in first:
        assert not np.shares_memory(result, x)
        result[...] = 0
    np.testing.assert_array_equal(x, x_copy)
    check_reference(sess, model, {"x": x})


def test_gpu_planner_recomputes_value_set_shapes() -> None:
    """The GPU path (run here with CPU tensors): a Shape of a value-set shape runs each time too."""
    pytest.importorskip("torch")
    from xpuruntime.onnx.runners import gpu_runner_factory

    nodes = [
        helper.make_node("Slice", ["x"], ["rows"], starts=[0], ends=[3], axes=[1]),
        helper.make_node("Reshape", ["rows", "target"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Sub", ["r", "ones"], ["y"]),
    ]
    model = make(nodes, [vi("x", [6, 4]), vi("target", [2], I64)], [vi("y", None), vi("s", None)], opset=9)
    options = SessionOptions(enable_cuda_graph=False)
    sess = InferenceSession(model.SerializeToString(), options, runner=gpu_runner_factory("cpu"))
    x = randn(RNG, 6, 4)
    for target in ([9, 2], [2, 9], [-1, 6], [9, 2]):
        check_reference(sess, model, {"x": x, "target": np.array(target)})


def test_a_strict_policy_whose_kernel_cannot_run_a_node_raises():
    """strict=True means the policy's kernel or an error: never the op map's function in its place."""
    from xpuruntime.errors import UnsupportedByPolicyError

    model = make([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", [5, 7]), vi("b", [7, 3])], [vi("y", None)])
    feed = {"a": randn(RNG, 5, 7), "b": randn(RNG, 7, 3)}
    relaxed = InferenceSession(model.SerializeToString(), policy="matmul=gemv")  # falls back, as it should
    check_reference(relaxed, model, feed)
    strict = InferenceSession(model.SerializeToString(), policy="matmul=gemv,strict=true")
    with pytest.raises(UnsupportedByPolicyError, match="gemv"):
        strict.run(None, feed)


# -- the GPU path's constants ---------------------------------------------------------------------------------------
def test_gpu_path_moves_read_only_initializers_without_a_warning(torch_session, rng, monkeypatch) -> None:
    """Initializers come from onnx as read-only arrays: torch.from_numpy would warn that it may write them
    (once per process, so the test also watches what reaches it). A 0-d initializer stays 0-d."""
    torch = pytest.importorskip("torch")
    seen: list[bool] = []
    from_numpy = torch.from_numpy

    def spy(array: np.ndarray):
        seen.append(array.flags.writeable)
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", spy)
    weight = randn(rng, 5, 3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"]),
             helper.make_node("Mul", ["s", "c"], ["z"])]  # fmt: skip
    consts = {"w": weight, "bias": randn(rng, 3), "c": np.array(1.5, np.float32)}
    model = make(nodes, [vi("x", [4, 5]), vi("s", [])], [vi("y", None), vi("z", None)], consts)
    feed = {"x": randn(rng, 4, 5), "s": np.array(2.5, np.float32)}
    got = torch_run(torch_session, model, feed)
    same(got, onnxruntime(model, feed))
    assert got[1].shape == ()
    assert seen and all(seen)


def test_gpu_path_runs_every_new_op_in_one_graph(torch_session, rng) -> None:
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="cubic"),
        helper.make_node("Dropout", ["r"], ["d"]),
        helper.make_node("TopK", ["d", "k"], ["v", "i"], axis=-1),
    ]
    consts = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "scales": np.array([1, 1, 1.5, 0.7], np.float32),
              "k": np.array([3])}  # fmt: skip
    model = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("v", None), vi("i", None, I64)], consts)
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    got = torch_run(torch_session, model, feed)
    same(got, onnxruntime(model, feed))
    same(got, ours(model, feed))


@pytest.mark.gpu
def test_new_ops_on_cuda_with_cuda_graphs(rng) -> None:
    pytest.importorskip("torch")
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge"),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="linear"),
        helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1),
    ]
    consts = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "scales": np.array([1, 1, 1.5, 0.7], np.float32),
              "k": np.array([3])}  # fmt: skip
    model = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("r", None), vi("v", None), vi("i", None, I64)], consts)
    session = InferenceSession(model.SerializeToString(), SessionOptions(enable_cuda_graph=True), device="cuda")
    for _ in range(3):
        feed = {"x": randn(rng, 2, 3, 5, 7)}
        (r, v, i), (want_r, want_v, _) = session.run(None, feed), onnxruntime(model, feed)
        same([r, v], [want_r, want_v])
        # edge padding makes equal neighbours, which the GPU's interpolation may leave 1 ulp apart: a tie
        # on one side is not on the other, so the indices are checked by what they pick
        np.testing.assert_array_equal(np.take_along_axis(r, i, -1), v)
        assert all(len(set(row)) == 3 for row in i.reshape(-1, 3).tolist())
    assert {entry.note for entry in session.runner.cache.values()} == {"CUDA graph captured"}


def test_an_output_left_out_does_not_fill_the_slot_of_inputs_left_out(rng) -> None:
    """An LSTM whose Y is left out ('') and a later Clip whose min is left out: the Clip must see no min."""
    x, w, r = randn(rng, 4, 2, 3) / 3, randn(rng, 1, 8, 3) / 3, randn(rng, 1, 8, 2) / 3
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["", "h"], hidden_size=2),
             helper.make_node("Clip", ["h", "", "hi"], ["y"])]  # fmt: skip
    model = make(nodes, [vi("x", [4, 2, 3])], [vi("y", None)], {"w": w, "r": r, "hi": np.float32(0.1)}, opset=13)
    for level in LEVELS:
        same(session_at(model, level).run(None, {"x": x}), onnxruntime(model, {"x": x}))


def test_planning_a_signature_computes_each_step_once(monkeypatch) -> None:
    """A Gemm reading a reused buffer (the LayerNormalization kernel's output) with constant weights runs once
    in the run that plans a signature and once per later run: binding the plan takes views of fixed arrays
    only through the ops that return views, it does not compute a Gemm again to find out."""
    import dataclasses

    from xpuruntime.onnx.ops import OPS

    calls = []
    record = OPS["Gemm"]

    def counted(node, opset):
        fn = record.numpy(node, opset)
        return lambda *args: calls.append(1) or fn(*args)

    monkeypatch.setitem(OPS, "Gemm", dataclasses.replace(record, numpy=counted))
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
        helper.make_node("Gemm", ["h", "w", "c"], ["y"], transB=1),
    ]
    consts = {"g": randn(RNG, 6), "b": randn(RNG, 6), "w": randn(RNG, 4, 6), "c": randn(RNG, 4)}
    model = make(nodes, [vi("x", ["m", 6])], [vi("y", None)], consts, 17)
    sess = InferenceSession(model.SerializeToString())
    for rows, runs in ((3, 1), (3, 2), (5, 1)):
        calls.clear()
        x = randn(RNG, rows, 6)
        for _ in range(runs):
            check_reference(sess, model, {"x": x})
        assert len(calls) == runs, f"{rows} rows: the Gemm ran {len(calls)} times in {runs} run(s)"


def _returning_registry(results: list, outs: list):
    """A registry whose only softmax kernel is declared returns_output: it records the out= it was given and
    returns the array in `results` (or a new one)."""
    import dataclasses

    from xpuruntime.ops.softmax import reference
    from xpuruntime.registry import Registry, default_registry

    default = default_registry()
    registry = Registry()
    for schema in default.ops.values():
        registry.register_op(schema)
    registry.register_backend(default.backends["cpu"])

    def launch(args):
        outs.append(args.out)
        result = results.pop(0) if results else reference(args.inputs[0]).astype(np.float32)
        if args.out is not None and result is not None:
            args.out[...] = result
        return result

    numpy_kernel = default.kernel("softmax", "numpy")
    registry.register_kernel(dataclasses.replace(numpy_kernel, name="returning", launch=launch, returns_output=True))
    return registry


def test_a_returning_kernels_step_keeps_its_result_without_a_copy() -> None:
    """A kernel step whose kernel is declared returns_output (PyTorch's SDPA backends on the GPU path) launches
    with out=None where the plan lends no buffer, and the node's output is the very array the kernel returned (no
    new array, no copy); a result of the wrong shape is refused on the first run, naming the kernel."""
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.errors import LaunchError
    from xpuruntime.graph.ir import Node
    from xpuruntime.onnx.executor import _kernel_step

    x = randn(RNG, 3, 5)
    mine = np.full((3, 5), 0.5, np.float32)
    results, outs = [mine], []
    dispatcher = Dispatcher(_returning_registry(results, outs))
    plan = dispatcher.plan("softmax", x)
    step = _kernel_step(Node("softmax", ["x"], ["y"], {}, "s", "xrt"), [1], (2,), plan, 1, dispatcher)
    env = [None, x, None]
    step.run(env)
    assert env[2] is mine and outs == [None]
    step.run(env)  # later runs: the kernel's new array each time
    np.testing.assert_allclose(env[2], np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-6)
    results.append(np.zeros((2, 5), np.float32))
    fresh = _kernel_step(Node("softmax", ["x"], ["y"], {}, "s", "xrt"), [1], (2,), plan, 1, dispatcher)
    with pytest.raises(LaunchError, match="returning"):
        fresh.run([None, x, None])
