"""Layout ops and the odd ones out: SpaceToDepth / DepthToSpace (both modes), CenterCropPad, EyeLike,
TfIdfVectorizer, against onnxruntime, on the CPU and through the GPU path's PyTorch functions (CPU tensors);
and the size checks of ops whose output shape comes from input values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import make, onnxruntime, randn, run_on, same, vi

from xpuruntime.onnx import InferenceSession, SessionOptions
from xpuruntime.onnx.errors import OutputTooLargeError

F, I64 = TensorProto.FLOAT, TensorProto.INT64
PATHS = ("numpy", "torch")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_round_trip(path: str, mode: str, torch_session, rng) -> None:
    x = randn(rng, 2, 12, 3, 5)
    to_space = helper.make_node("DepthToSpace", ["x"], ["s"], blocksize=2, mode=mode)
    back = helper.make_node("SpaceToDepth", ["s"], ["d"], blocksize=2, mode=mode)
    model = make([to_space, back], [vi("x", [2, 12, 3, 5])], [vi("s", None), vi("d", None)], opset=28)
    space, depth = run_on(path, torch_session, model, {"x": x})
    same([depth], [x], atol=0, rtol=0)
    old = make([to_space], [vi("x", [2, 12, 3, 5])], [vi("s", None)], opset=13)  # onnxruntime runs opset 13
    same([space], onnxruntime(old, {"x": x}), atol=0, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_center_crop_pad_and_eye_like(path: str, torch_session, rng) -> None:
    x = randn(rng, 5, 6, 3)
    for axes, target in ((None, [3, 9, 3]), ([0, 1], [8, 1]), ([-1], [6])):
        node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **({} if axes is None else {"axes": axes}))
        model = make([node], [vi("x", [5, 6, 3]), vi("shape", [len(target)], I64)], [vi("y", None)], opset=18)
        feed = {"x": x, "shape": np.array(target, np.int64)}
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=0, rtol=0)
    for k in (-2, 0, 3, 7):
        node = helper.make_node("EyeLike", ["x"], ["eye"], k=k, dtype=TensorProto.DOUBLE)
        model = make([node], [vi("x", [4, 6])], [vi("eye", None, TensorProto.DOUBLE)], opset=22)
        same(run_on(path, torch_session, model, {"x": randn(rng, 4, 6)}), [np.eye(4, 6, k)], atol=0, rtol=0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_vectorizer_matches_onnxruntime(path: str, mode: str, torch_session, rng) -> None:
    attrs = {"mode": mode, "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 2,
             "ngram_counts": [0, 3, 7], "ngram_indexes": [5, 0, 6, 1, 3, 2, 4, 7],
             "pool_int64s": [2, 3, 5, 2, 3, 3, 5, 5, 2, 4, 2, 3, 5], "weights": list(rng.uniform(0.5, 2, 8))}  # fmt: skip
    for shape in ([12], [3, 10]):
        node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
        model = make([node], [vi("x", shape, I64)], [vi("y", None)], opset=9)
        feed = {"x": rng.integers(1, 6, shape).astype(np.int64)}
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=1e-6)


def test_outputs_sized_by_input_values_are_refused_before_allocating() -> None:
    """Ops whose output shape comes from an input's values say how large it would be before allocating it."""
    huge = np.array(2**40, np.int64)
    cases = [
        ("HannWindow", [vi("n", [], I64)], {"n": huge}, {}),
        ("CenterCropPad", [vi("x", [2, 3]), vi("s", [2], I64)],
         {"x": np.ones((2, 3), np.float32), "s": np.array([2**20, 2**20], np.int64)}, {}),
        ("MaxUnpool", [vi("x", [1, 1, 2, 2]), vi("i", [1, 1, 2, 2], I64), vi("s", [4], I64)],
         {"x": np.ones((1, 1, 2, 2), np.float32), "i": np.zeros((1, 1, 2, 2), np.int64),
          "s": np.array([1, 1, 2**20, 2**20], np.int64)}, {"kernel_shape": [2, 2]}),
        ("DFT", [vi("x", [1, 4, 1]), vi("n", [], I64)], {"x": np.ones((1, 4, 1), np.float32), "n": huge}, {}),
        ("AffineGrid", [vi("t", [1, 2, 3]), vi("s", [4], I64)],
         {"t": np.ones((1, 2, 3), np.float32), "s": np.array([1, 1, 2**20, 2**20], np.int64)}, {}),
    ]  # fmt: skip
    for op, inputs, feed, attrs in cases:
        names = [i.name for i in inputs]
        if op == "DFT":
            names = ["x", "n"]
        node = helper.make_node(op, names, ["y"], **attrs)
        model = make([node], inputs, [vi("y", None)], opset=22)
        with pytest.raises(OutputTooLargeError, match=rf"\({op}\): its output of shape .* would take"):
            InferenceSession(model.SerializeToString(), SessionOptions(max_tensor_bytes=2**30)).run(None, feed)
