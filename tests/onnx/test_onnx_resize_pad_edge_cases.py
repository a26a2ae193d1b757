"""Resize, Pad, TopK and PRelu edge cases a review found (each once wrong): the session against the ONNX
spec, onnxruntime, the ONNX reference evaluator, and its NumPy path against the GPU path's PyTorch op map
(run here with CPU tensors)."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_models import make, onnxruntime, ours, torch_path_builder, vi

from xpuruntime.onnx import NodeExecutionError

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
PATHS = ("numpy", "torch")


@pytest.fixture(scope="module")
def torch_build():
    """A session builder through the GPU path's PyTorch op map, with CPU tensors (onnx_models)."""
    pytest.importorskip("torch")
    return torch_path_builder()


def run_on(path: str, build, model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    if path == "numpy":
        return ours(model, feed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(model).run(None, {k: v.copy() for k, v in feed.items()})


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal(shape) * 3
    return (x + np.where(x >= 0, 0.01, -0.01)).astype(np.float32)  # never zero


# -- Pad: a negative pad larger than the dim, with a positive pad on the other side --------------------------
def _pad_reference(x: np.ndarray, begin: int, end: int, value: float) -> np.ndarray:
    """Pad's definition along the last axis: output j reads input j - begin, or the value outside the input."""
    n = x.shape[-1]
    out = np.full((*x.shape[:-1], n + begin + end), value, x.dtype)
    for j in range(out.shape[-1]):
        if 0 <= j - begin < n:
            out[..., j] = x[..., j - begin]
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pads", [(-7, 9), (9, -7), (-6, 3), (3, -6)])
def test_pad_crop_past_the_dim_then_pad_keeps_the_spec_output_size(pads: tuple, path: str, torch_build, rng) -> None:
    """x[..., 5] padded by (begin=-7, end=9) has 5 - 7 + 9 = 7 elements, all the constant (onnxruntime, and
    the spec's output shape); the session crops to nothing first and then pads 9: 9 elements."""
    x = randn(rng, 2, 5)
    begin, end = pads
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode="constant")
    consts = {"pads": np.array([0, begin, 0, end], np.int64), "value": np.array(1.25, np.float32)}
    model = make([node], [vi("x", [2, 5])], [vi("y", None)], consts, 13)
    want = _pad_reference(x, begin, end, 1.25)
    np.testing.assert_array_equal(onnxruntime(model, {"x": x})[0], want)
    got = run_on(path, torch_build, model, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# -- Resize: nearest-neighbour ties that `sizes` makes exact -------------------------------------------------
TIES = [  # (input length, sizes, coordinate mode, nearest_mode): some x_original is exactly k + 1/2
    (7, 2, "asymmetric", "round_prefer_ceil"),  # x = 1 * 7/2 = 3.5: ceil -> 4
    (7, 38, "asymmetric", "round_prefer_floor"),  # x = 19 * 7/38 = 3.5: floor -> 3
    (14, 1, "half_pixel", "round_prefer_ceil"),  # x = 0.5 * 14 - 0.5 = 6.5: ceil -> 7
    (14, 19, "half_pixel", "round_prefer_floor"),
    (14, 39, "pytorch_half_pixel", "round_prefer_ceil"),
]


def _exact_x(n_in: int, n_out: int, coordinates: str) -> list[Fraction]:
    """x_original in exact arithmetic, with the spec's scale = length_resized / length_original."""
    scale = Fraction(n_out, n_in)
    if coordinates == "asymmetric":
        return [i / scale for i in range(n_out)]
    return [(i + Fraction(1, 2)) / scale - Fraction(1, 2) for i in range(n_out)]


@pytest.mark.parametrize(("n_in", "n_out", "coordinates", "nearest_mode"), TIES)
def test_resize_nearest_exact_ties_from_sizes_follow_nearest_mode(n_in, n_out, coordinates, nearest_mode, rng) -> None:
    """With `sizes`, scale = n_out / n_in is rational and a tie is exact; round_prefer_ceil/floor must decide it
    (onnxruntime and the ONNX reference agree). The session divides by float32(n_out / n_in), lands 1 ulp off
    the half and rounds the other way."""
    halves = [x for x in _exact_x(n_in, n_out, coordinates) if x.denominator == 2 and 0 < x < n_in - 1]
    assert halves  # the case really has an exact tie
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coordinates, "nearest_mode": nearest_mode}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    model = make([node], [vi("x", [1, 2, 3, n_in])], [vi("y", None)], {"sizes": np.array([1, 2, 3, n_out])}, 19)
    feed = {"x": randn(rng, 1, 2, 3, n_in)}
    want = onnxruntime(model, feed)[0]
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, feed)[0], want)
    np.testing.assert_array_equal(ours(model, feed)[0], want)


# -- Resize: keep_aspect_ratio_policy on an empty axis ---------------------------------------------------------
def test_resize_not_smaller_on_an_empty_axis_fails_with_a_resize_error() -> None:
    """sizes [4, 5] for a (.., 0, 7) input: not_smaller's scale is 4/0 = inf and inf * 0 is NaN; the run fails
    with "cannot convert float NaN to integer" instead of a Resize error about the empty axis (onnxruntime:
    "Input dim is zero but required output dim is non-zero")."""
    attrs = {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    model = make([node], [vi("x", [2, 3, 0, 7])], [vi("y", None)], {"sizes": np.array([4, 5])}, 19)
    with pytest.raises(NodeExecutionError, match=r"Resize: ") as info:
        ours(model, {"x": np.zeros((2, 3, 0, 7), np.float32)})
    assert "NaN" not in str(info.value)


# -- Resize: bool data on the two paths -------------------------------------------------------------------------
def test_resize_linear_of_bool_runs_alike_on_both_paths(torch_build, rng) -> None:
    """Resize-13+ allows bool. The NumPy path interpolates and casts back; the PyTorch path fails with
    "torch.bool is not supported by torch.iinfo" on the same model."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = make([node], [vi("x", [1, 2, 4, 5], B)], [vi("y", None, B)],
                 {"scales": np.array([1, 1, 1.5, 0.6], np.float32)}, 19)  # fmt: skip
    feed = {"x": rng.random((1, 2, 4, 5)) > 0.5}
    want = ours(model, feed)[0]
    got = run_on("torch", torch_build, model, feed)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# -- TopK on the PyTorch path: axis and k are not checked -----------------------------------------------------------
def _topk_model(k: list, axis: int) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis)
    return make([node], [vi("x", [3, 4, 9])], [vi("v", None), vi("i", None, I64)], {"k": np.array(k, np.int64)}, 11)


@pytest.mark.parametrize(("k", "axis"), [([2], 3), ([2], -4), ([12], -1), ([-1], -1), ([2, 3], -1)])
def test_topk_torch_path_refuses_what_the_numpy_path_refuses(k: list, axis: int, torch_build, rng) -> None:
    """An axis out of range wraps around on the PyTorch path (axis % rank) and returns a result; k > dim or
    k < 0 surface as PyTorch's narrow() errors; a k of two values silently uses the first. The NumPy path
    refuses each with a TopK error naming k or the axis: the GPU path must too."""
    model, feed = _topk_model(k, axis), {"x": randn(rng, 3, 4, 9)}
    with pytest.raises(NodeExecutionError) as cpu:
        ours(model, feed)
    expected = str(cpu.value).split("): ", 1)[1]  # e.g. "ShapeError: TopK: axis 3 is out of range for a 3-d input"
    with pytest.raises(NodeExecutionError) as gpu:
        run_on("torch", torch_build, model, feed)
    assert expected in str(gpu.value)


# -- PRelu-1/6 with an input whose rank the model does not declare -----------------------------------------------
@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_before_opset_7_is_per_channel_when_the_input_shape_is_undeclared(opset: int, rng) -> None:
    """The per-channel rewrite needs the input's rank at load time; without it the 1-D slope broadcasts
    along the last axis (here also of size 3), so the same model gives another answer than with the shape
    declared (and than PRelu-7 on the per-channel slope in onnxruntime)."""
    x = randn(rng, 2, 3, 4, 3)
    slope = rng.uniform(0.05, 0.9, 3).astype(np.float32)
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["y"])]
    undeclared = make(nodes, [vi("x", None)], [vi("y", None)], {"slope": slope}, opset)
    declared = make(nodes, [vi("x", [2, 3, 4, 3])], [vi("y", None)], {"slope": slope}, opset)
    seven = make(nodes, [vi("x", [2, 3, 4, 3])], [vi("y", None)], {"slope": slope.reshape(3, 1, 1)}, 7)
    want = onnxruntime(seven, {"x": x})[0]
    np.testing.assert_array_equal(ours(declared, {"x": x})[0], want)
    np.testing.assert_array_equal(ours(undeclared, {"x": x})[0], want)
