"""GridSample, AffineGrid, RoiAlign and NonMaxSuppression on random inputs against onnxruntime (the ONNX
reference where onnxruntime does not run a form), on the CPU and through the GPU path's PyTorch functions
(CPU tensors): grids reaching past the borders, every padding mode, degenerate and flipped boxes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import make, onnxruntime, randn, reference, run_on, same, vi

from xpuruntime.onnx import InferenceSession, NodeExecutionError, UnsupportedModelError

F, I64 = TensorProto.FLOAT, TensorProto.INT64
PATHS = ("numpy", "torch")


def grid_sample_model(x_shape: list, grid_shape: list, **attrs: object) -> object:
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    return make([node], [vi("x", x_shape), vi("grid", grid_shape)], [vi("y", None)], opset=22)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_2d_and_3d_match_onnxruntime(path: str, mode: str, padding: str, torch_session, rng) -> None:
    shapes = [([2, 3, 5, 6], [2, 4, 7, 2])] + ([([1, 2, 3, 4, 5], [1, 2, 3, 4, 3])] if mode != "cubic" else [])
    for x_shape, grid_shape in shapes:  # onnxruntime runs cubic in 2-D only
        for align in (0, 1):
            model = grid_sample_model(x_shape, grid_shape, mode=mode, padding_mode=padding, align_corners=align)
            feed = {"x": randn(rng, *x_shape), "grid": (rng.standard_normal(grid_shape) * 0.8).astype(np.float32)}
            same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
def test_grid_sample_1d_and_old_mode_names(path: str, torch_session, rng) -> None:
    """1-D (host copies on the GPU path) against the ONNX reference; GridSample-16's 'bilinear'/'bicubic'."""
    for mode in ("linear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            model = grid_sample_model([2, 3, 7], [2, 5, 1], mode=mode, padding_mode=padding)
            feed = {"x": randn(rng, 2, 3, 7), "grid": (rng.standard_normal((2, 5, 1)) * 1.5).astype(np.float32)}
            same(run_on(path, torch_session, model, feed), reference(model, feed), atol=1e-5)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="bicubic")
    old = make([node], [vi("x", [1, 2, 4, 4]), vi("grid", [1, 3, 3, 2])], [vi("y", None)], opset=16)
    feed = {"x": randn(rng, 1, 2, 4, 4), "grid": (rng.standard_normal((1, 3, 3, 2)) * 0.7).astype(np.float32)}
    same(run_on(path, torch_session, old, feed), onnxruntime(old, feed), atol=1e-4)


def test_grid_sample_refusals() -> None:
    with pytest.raises(UnsupportedModelError, match=r"\(GridSample\): mode 'bogus'"):
        InferenceSession(grid_sample_model([1, 1, 3, 3], [1, 2, 2, 2], mode="bogus").SerializeToString())
    sess = InferenceSession(grid_sample_model([1, 1, 3, 3], [1, 2, 2, 3]).SerializeToString())
    with pytest.raises(NodeExecutionError, match=r"GridSample: grid \(1, 2, 2, 3\) must be \(N, \.\.\., 2\)"):
        sess.run(None, {"x": np.ones((1, 1, 3, 3), np.float32), "grid": np.zeros((1, 2, 2, 3), np.float32)})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rank", [2, 3])
def test_affine_grid_matches_onnxruntime(path: str, rank: int, torch_session, rng) -> None:
    size = [2, 3, 4, 5] if rank == 2 else [2, 3, 4, 5, 6]
    for align in (0, 1):
        node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
        model = make([node], [vi("theta", [2, rank, rank + 1]), vi("size", [rank + 2], I64)], [vi("grid", None)],
                     opset=20)  # fmt: skip
        feed = {"theta": randn(rng, 2, rank, rank + 1), "size": np.array(size, np.int64)}
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
def test_roi_align_matches_onnxruntime(path: str, mode: str, transform: str, torch_session, rng) -> None:
    x = randn(rng, 2, 3, 10, 12)
    corners = rng.uniform(-2, 12, (6, 2, 2))
    rois = np.concatenate([corners.min(1), corners.max(1)], axis=1).astype(np.float32)  # x1, y1, x2, y2
    rois[0] = [3, 3, 3, 3]  # an empty region
    for ratio in (0, 2):
        node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], mode=mode, output_height=3,
                                output_width=4, sampling_ratio=ratio, spatial_scale=0.8,
                                coordinate_transformation_mode=transform)  # fmt: skip
        model = make([node], [vi("x", [2, 3, 10, 12]), vi("rois", [6, 4]), vi("batch", [6], I64)], [vi("y", None)],
                     opset=16)  # fmt: skip
        feed = {"x": x, "rois": rois, "batch": rng.integers(0, 2, 6).astype(np.int64)}
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_matches_onnxruntime(path: str, center: int, torch_session, rng) -> None:
    boxes = rng.uniform(0, 10, (2, 30, 4)).astype(np.float32)
    boxes[0, 5] = boxes[0, 4]  # identical boxes
    scores = rng.random((2, 3, 30)).astype(np.float32)
    scores[1, 0, :5] = 0.5  # ties
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "floor"], ["picked"],
                            center_point_box=center)  # fmt: skip
    inputs = [vi("boxes", [2, 30, 4]), vi("scores", [2, 3, 30]), vi("most", [1], I64), vi("iou", [1]),
              vi("floor", [1])]  # fmt: skip
    model = make([node], inputs, [vi("picked", None, I64)], opset=11)
    for most, iou, floor in ((5, 0.3, 0.2), (100, 0.0, 0.0), (0, 0.5, 0.0), (3, 1.0, 0.9)):
        feed = {"boxes": boxes, "scores": scores, "most": np.array([most], np.int64),
                "iou": np.array([iou], np.float32), "floor": np.array([floor], np.float32)}  # fmt: skip
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=0, rtol=0)
