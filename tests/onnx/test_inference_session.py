"""InferenceSession API: inputs/outputs, output selection, plans made once per signature, the session's
policy, buffer reuse that never leaks into results, saving the optimized graph, profiling, the CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xpuruntime as xrt
from xpuruntime.cli import main
from xpuruntime.onnx import GraphOptimizationLevel, InferenceSession, SessionOptions
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model


@pytest.fixture(scope="module")
def encoder() -> bytes:
    return encoder_model(layers=1, hidden=32, heads=2, ffn=64, vocab=50).SerializeToString()


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]), helper.make_node("Softmax", ["y"], ["p"], axis=-1),
    ]  # fmt: skip
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w1", (8, 16)), ("w2", (16, 4)))
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("y", "p")], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inputs_outputs_and_output_selection() -> None:
    session = xrt.InferenceSession(mlp().SerializeToString())
    (arg,) = session.get_inputs()
    assert (arg.name, arg.shape, arg.type) == ("x", ["N", 8], "tensor(float)")
    assert [o.name for o in session.get_outputs()] == ["y", "p"]
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    y, p = session.run(None, {"x": x})
    assert y.shape == p.shape == (5, 4)
    (p_only,) = session.run(["p"], {"x": x})
    np.testing.assert_allclose(p_only, p)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)


def test_plans_are_made_once_per_signature(encoder: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    session = InferenceSession(encoder)
    calls = []
    original = session.dispatcher.plan
    monkeypatch.setattr(session.dispatcher, "plan", lambda *a, **k: calls.append(a[0]) or original(*a, **k))
    feed = encoder_inputs(2, 6, vocab=50)
    first = session.run(None, feed)[0]
    planned = len(calls)
    assert planned > 0
    for _ in range(3):
        np.testing.assert_array_equal(session.run(None, feed)[0], first)
    assert len(calls) == planned  # no re-planning on later runs
    session.run(None, encoder_inputs(3, 4, vocab=50))
    assert len(calls) == 2 * planned  # a new signature gets its own plan
    assert len(session.runner.plans()) == 2


def test_results_never_share_reused_buffers(encoder: bytes) -> None:
    session = InferenceSession(encoder)
    feed_a, feed_b = encoder_inputs(2, 6, vocab=50, seed=1), encoder_inputs(2, 6, vocab=50, seed=2)
    a = session.run(None, feed_a)[0]
    a_copy = a.copy()
    b = session.run(None, feed_b)[0]
    np.testing.assert_array_equal(a, a_copy)  # the second run did not write into the first result
    assert not np.shares_memory(a, b)
    plan = session.runner.plans()[0]
    assert plan.reused_buffers > 0


def test_bound_runs_match_runs_without_reuse(encoder: bytes) -> None:
    """The shared-buffer run does its fixed parts once (views of buffers taken, launches prebuilt); its
    results equal those of a run that allocates everything, run after run."""
    bound = InferenceSession(encoder)
    plain = InferenceSession(encoder, SessionOptions(enable_mem_reuse=False))
    for seed in range(3):
        feed = encoder_inputs(2, 6, vocab=50, seed=seed)
        np.testing.assert_allclose(bound.run(None, feed)[0], plain.run(None, feed)[0], rtol=1e-6, atol=1e-6)
    plan = bound.plan(feed)
    assert "Transpose" in {s.node.op for s in plan.steps}
    assert "Transpose" not in {s.node.op for s in plan.bound_steps}  # views of reused buffers: taken once
    planned = {id(s) for s in plan.steps}
    assert any(id(s) not in planned for s in plan.bound_steps)  # kernel steps with a prebuilt launch


def test_session_policy_is_used(encoder: bytes) -> None:
    session = InferenceSession(
        encoder, policy="matmul=blocked", sess_options=SessionOptions(graph_optimization_level=1)
    )
    feed = encoder_inputs(2, 5, vocab=50)
    reference = InferenceSession(encoder, SessionOptions(graph_optimization_level=1)).run(None, feed)[0]
    np.testing.assert_allclose(session.run(None, feed)[0], reference, rtol=1e-4, atol=1e-5)
    assert "matmul/blocked [cpu] (policy)" in session.explain()


def test_levels_parse_and_unknown_level_fails() -> None:
    assert GraphOptimizationLevel.parse("extended") is GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert GraphOptimizationLevel.parse(99) is GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(xrt.ArgumentError, match="graph_optimization_level"):
        GraphOptimizationLevel.parse("max")


def test_save_optimized_graph_and_profile(encoder: bytes, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "opt.onnx"
    options = SessionOptions(optimized_model_filepath=str(path), enable_profiling=True)
    session = InferenceSession(encoder, options)
    saved = onnx.load(str(path))
    assert {n.op_type for n in saved.graph.node} >= {"attention", "MatMul", "fused_elementwise"}
    session.run(None, encoder_inputs(2, 5, vocab=50))
    session.run(None, encoder_inputs(2, 5, vocab=50))
    trace = json.loads((tmp_path / session.end_profiling()).read_text())
    assert len(trace["traceEvents"]) == len(session.runner.plans()[0].bound_steps)  # the steps run


def test_cli_run_builtin_and_file(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", "--iterations", "1", "--dim", "batch=1", "--dim", "seq=4"]) == 0
    out = capsys.readouterr().out
    assert "last_hidden_state" in out and "(1, 4, 128)" in out and "attention_fusion" in out and "matmul/" in out
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), str(path))
    np.savez(tmp_path / "in.npz", x=np.ones((3, 8), np.float32))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--level", "basic", "--iterations", "1"]) == 0
    assert "(3, 4)" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_concurrent_runs_give_correct_results(encoder: bytes) -> None:
    """Threads sharing one session: a run that finds the reused buffers busy allocates its own."""
    import concurrent.futures

    session = InferenceSession(encoder)
    feeds = [encoder_inputs(2, 6, vocab=50, seed=s) for s in range(6)]
    expected = [session.run(None, f)[0] for f in feeds]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            results = list(pool.map(lambda f: session.run(None, f)[0], feeds))
            for got, want in zip(results, expected):
                np.testing.assert_array_equal(got, want)


def test_verbose_explain_lists_every_candidate(encoder: bytes) -> None:
    session = InferenceSession(encoder)
    text = session.explain(encoder_inputs(2, 5, vocab=50), verbose=True)
    assert "matmul/numpy_blas [cpu] (auto)" in text
    assert "blocked [cpu]: supported, score" in text  # the runner-up, with its score
    assert "rejected:" in text


def test_a_kernel_failing_on_its_first_launch_is_replaced() -> None:
    """The planning run catches a kernel that raises and runs the node with the op map instead."""
    from xpuruntime.backends.cpu import BACKEND
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.registry import Registry, kernel

    registry = Registry()
    for schema in xrt.default_registry().ops.values():
        registry.register_op(schema)
    registry.register_backend(BACKEND)

    @kernel("matmul", "boom", backend="cpu", priority=100)
    def boom(args: object) -> None:
        raise RuntimeError("kaboom")

    registry.register_kernel(boom)
    session = InferenceSession(mlp(), dispatcher=Dispatcher(registry))
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    want = InferenceSession(mlp()).run(None, {"x": x})
    for got, expected in zip(session.run(None, {"x": x}), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert "kernel matmul/boom failed: RuntimeError: kaboom" in session.explain()
