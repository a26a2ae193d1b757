"""InferenceSession on neural-network ops: Dropout (1 to 22) in inference, training-mode refusals; the Instance,
Group, MeanVariance and Lp normalizations, LRN, RotaryEmbedding; on the CPU and through the GPU path's PyTorch
functions (CPU tensors)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_models import LEVELS, make, onnxruntime, ours, randn, run_on, same, torch_run, vi

from xpuruntime.onnx import InferenceSession, NodeExecutionError, UnsupportedModelError

F, H, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL


# -- Dropout --------------------------------------------------------------------------------------------------
def dropout_model(opset: int, *, mask: bool = True, ratio: float | None = None, training: bool | None = None,
                  fed: tuple[str, ...] = (), attrs: dict | None = None, dtype: int = F) -> onnx.ModelProto:  # fmt: skip
    mask_type = B if opset >= 10 else dtype
    outputs = [vi("y", None, dtype)] + ([vi("mask", None, mask_type)] if mask else [])
    inputs, consts, names = [vi("x", [3, 4, 5], dtype)], {}, ["x"]
    if opset >= 12:
        for name, value, elem in (("ratio", ratio, F), ("training", training, B)):
            if value is None and name not in fed:
                names.append("")
                continue
            names.append(name)
            if name in fed:
                inputs.append(vi(name, [], elem))
            else:
                consts[name] = np.array(value, np.float32 if name == "ratio" else np.bool_)
        while not names[-1]:
            names.pop()
    elif ratio is not None:
        attrs = {**(attrs or {}), "ratio": ratio}
    node = helper.make_node("Dropout", names, [o.name for o in outputs], **(attrs or {}))
    return make([node], inputs, outputs, consts, opset)


@pytest.mark.parametrize("opset", [7, 9, 10, 12, 13, 22])
@pytest.mark.parametrize("level", LEVELS)
def test_dropout_is_the_identity_in_inference(opset: int, level: str, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    model = dropout_model(opset, ratio=0.3, training=False if opset >= 12 else None)
    y, mask = ours(model, feed, level)
    want_y, want_mask = onnxruntime(model, feed)
    same([y], [want_y], atol=0, rtol=0)
    # onnxruntime's Dropout-7 to -11 kernels return an all-zero mask; the spec (and its reference): nothing
    # is dropped, every element kept
    want = np.ones((3, 4, 5), np.bool_ if opset >= 10 else np.float32)
    same([mask], [want if opset < 12 else want_mask], atol=0, rtol=0)
    plain = dropout_model(opset, mask=False)
    same(ours(plain, feed, level), onnxruntime(plain, feed), atol=0, rtol=0)
    assert "Dropout" not in InferenceSession(plain.SerializeToString()).original.op_counts()  # now an Identity


@pytest.mark.parametrize("opset", [1, 6])
def test_dropout_before_opset_7_follows_is_test(opset: int, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    model = dropout_model(opset, attrs={"is_test": 1}, ratio=0.4)
    y, mask = ours(model, feed)
    same([y, mask], [feed["x"], np.ones((3, 4, 5), np.float32)], atol=0, rtol=0)
    for attrs in ({"is_test": 0}, {}):  # is_test=0 (the default) is training: random
        training = dropout_model(opset, attrs=attrs, mask=False)
        with pytest.raises(UnsupportedModelError, match=r"\(Dropout\): is_test=0 makes Dropout drop values"):
            InferenceSession(training.SerializeToString())
    same(ours(dropout_model(opset, attrs={}, ratio=0.0), feed), [feed["x"], np.ones((3, 4, 5), np.float32)])


def test_dropout_training_mode(rng) -> None:
    """A constant training_mode=True is declined at load time, a fed one refused when a run sets it; with
    ratio 0 nothing is dropped either way."""
    feed = {"x": randn(rng, 3, 4, 5)}
    with pytest.raises(UnsupportedModelError, match=r"node 'Dropout_0' \(Dropout\): training_mode=True makes"):
        InferenceSession(dropout_model(13, training=True).SerializeToString())
    with pytest.raises(UnsupportedModelError, match="training_mode=True"):
        InferenceSession(dropout_model(13, ratio=0.5, training=True).SerializeToString())
    zero = dropout_model(13, ratio=0.0, training=True)
    same(ours(zero, feed), onnxruntime(zero, feed), atol=0, rtol=0)
    fed = dropout_model(13, ratio=0.25, fed=("training",))
    sess = InferenceSession(fed.SerializeToString())
    off = {**feed, "training": np.array(False)}
    same(sess.run(None, off), onnxruntime(fed, off), atol=0, rtol=0)
    with pytest.raises(NodeExecutionError, match=r"Dropout.*training_mode=True with a ratio above 0"):
        sess.run(None, {**feed, "training": np.array(True)})
    both = dropout_model(13, fed=("ratio", "training"))
    feed_zero = {**feed, "ratio": np.array(0.0, np.float32), "training": np.array(True)}
    same(ours(both, feed_zero), onnxruntime(both, feed_zero), atol=0, rtol=0)


def test_an_overridable_training_flag_is_not_folded_away(rng) -> None:
    """training_mode as an overridable initializer (False by default): a feed of True must reach the node."""
    model = dropout_model(13, mask=False, ratio=0.5, training=False)
    model.graph.input.append(vi("training", [], B))
    sess = InferenceSession(model.SerializeToString())
    x = randn(rng, 3, 4, 5)
    same(sess.run(None, {"x": x}), [x], atol=0, rtol=0)
    with pytest.raises(NodeExecutionError, match="training_mode=True with a ratio above 0"):
        sess.run(None, {"x": x, "training": np.array(True)})


def test_dropout_through_the_torch_path(torch_session, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    for opset in (7, 10, 13):
        model = dropout_model(opset, ratio=0.2)
        same(torch_run(torch_session, model, feed), ours(model, feed), atol=0, rtol=0)
    fed = dropout_model(13, fed=("training",))
    session = torch_session(fed)
    same(session.run(None, {**feed, "training": np.array(False)}), ours(fed, {**feed, "training": np.array(False)}))
    with pytest.raises(NodeExecutionError, match="training_mode=True"):
        session.run(None, {**feed, "training": np.array(True)})


# -- Instance, Group, MeanVariance, Lp normalization, LRN, RotaryEmbedding ------------------------------------------
@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_normalizations_match_onnxruntime(path: str, torch_session, rng) -> None:
    x = randn(rng, 2, 6, 5, 3)
    x[0, :, 0, 0] = 0  # a zero vector for LpNormalization
    nodes = [
        helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["inst"], epsilon=1e-3),
        helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["group"], num_groups=3),
        helper.make_node("MeanVarianceNormalization", ["x"], ["mvn"], axes=[0, 2]),
        helper.make_node("LpNormalization", ["x"], ["l1"], axis=1, p=1),
        helper.make_node("LpNormalization", ["x"], ["l2"], axis=-1, p=2),
        helper.make_node("LRN", ["x"], ["lrn"], size=3, alpha=0.02, beta=0.6, bias=1.5),
    ]
    outs = [vi(n.output[0], None) for n in nodes]
    consts = {"scale": randn(rng, 6), "bias": randn(rng, 6)}
    model = make(nodes, [vi("x", [2, 6, 5, 3])], outs, consts, opset=21)
    same(run_on(path, torch_session, model, {"x": x}), onnxruntime(model, {"x": x}), atol=1e-4, rtol=1e-4)
    # an even LRN size (onnxruntime takes odd ones only): 1 channel before, 2 after
    even = make([helper.make_node("LRN", ["x"], ["y"], size=4, alpha=0.02)], [vi("x", [2, 6, 5, 3])], [vi("y", None)])
    wide = x.astype(np.float64)
    sums = np.stack([(wide[:, max(c - 1, 0) : c + 3] ** 2).sum(axis=1) for c in range(6)], axis=1)
    want = (wide / (1 + 0.02 / 4 * sums) ** 0.75).astype(np.float32)
    same(run_on(path, torch_session, even, {"x": x}), [want], atol=1e-5)


@pytest.mark.parametrize("path", ["numpy", "torch"])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_matches_onnxruntime(path: str, interleaved: int, torch_session, rng) -> None:
    for rotary_dim, rank in ((0, 4), (4, 4), (0, 3)):
        half = (rotary_dim or 8) // 2
        attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim} | (
            {"num_heads": 2} if rank == 3 else {}
        )
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
        shape = [2, 2, 3, 8] if rank == 4 else [2, 3, 16]
        inputs = [vi("x", shape), vi("cos", [10, half]), vi("sin", [10, half]), vi("pos", [2, 3], TensorProto.INT64)]
        model = make([node], inputs, [vi("y", None)], opset=23)
        angles = rng.uniform(0, 6, (10, half))
        feed = {"x": randn(rng, *shape), "cos": np.cos(angles).astype(np.float32),
                "sin": np.sin(angles).astype(np.float32), "pos": rng.integers(0, 10, (2, 3))}  # fmt: skip
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=1e-5)
