"""Object-detection ONNX ops: NonMaxSuppression (greedy, per batch and class) and RoiAlign (average or max of
bilinear samples per output bin).

Both run on the host (the GPU path gives them host copies: NMS has a data-dependent output size and a
greedy order, RoiAlign a sampling grid per region): NMS with one IoU matrix per batch, RoiAlign with one
gather per region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, op, scalar


# -- NonMaxSuppression -------------------------------------------------------------------------------------------
def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(y1, x1, y2, x2) boxes, each corner pair in order, from [y1, x1, y2, x2] in any corner order or from
    [x_center, y_center, width, height]."""
    if center:
        xc, yc, w, h = np.moveaxis(boxes.astype(np.float64), -1, 0)
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y1, x1, y2, x2 = np.moveaxis(boxes.astype(np.float64), -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def iou_matrix(boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of every pair of (N, 4) corner boxes (0 where the union is empty)."""
    y1, x1, y2, x2 = boxes.T
    area = (y2 - y1) * (x2 - x1)
    height = np.clip(np.minimum(y2[:, None], y2[None, :]) - np.maximum(y1[:, None], y1[None, :]), 0, None)
    width = np.clip(np.minimum(x2[:, None], x2[None, :]) - np.maximum(x1[:, None], x1[None, :]), 0, None)
    inter = height * width
    union = area[:, None] + area[None, :] - inter
    return np.where((inter > 0) & (union > 0), inter / np.where(union > 0, union, 1), 0.0)


def _greedy(order: np.ndarray, iou: np.ndarray, threshold: float, limit: int) -> list[int]:
    """Take the best remaining box, drop the ones overlapping it by more than the threshold, repeat."""
    chosen: list[int] = []
    while order.size and len(chosen) < limit:
        best, order = order[0], order[1:]
        chosen.append(int(best))
        order = order[iou[best, order] <= threshold]
    return chosen


def non_max_suppression(node: Node, opset: int) -> Fn:
    """Selected (batch, class, box) triples, per batch and class in order of descending score: boxes scoring
    above score_threshold, none overlapping an earlier pick by more than iou_threshold, at most
    max_output_boxes_per_class each (0 or left out: none)."""
    center = bool(node.attrs.get("center_point_box", 0))

    def run(boxes: np.ndarray, scores: np.ndarray, limit: Any = None, iou: Any = None, floor: Any = None):
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
            raise ShapeError(f"NonMaxSuppression: boxes {boxes.shape} must be (B, N, 4) and scores {scores.shape} "
                             "(B, C, N)")  # fmt: skip
        most = 0 if limit is None else int(scalar(limit))
        threshold = 0.0 if iou is None else float(scalar(iou))
        if not 0 <= threshold <= 1:
            raise ArgumentError(f"NonMaxSuppression: iou_threshold {threshold} must lie in [0, 1]")
        picked = []
        for b in range(boxes.shape[0] if most > 0 else 0):
            overlap = iou_matrix(_corners(boxes[b], center))
            for c in range(scores.shape[1]):
                s = scores[b, c]
                order = np.argsort(-s, kind="stable")
                if floor is not None:
                    order = order[s[order] > float(scalar(floor))]
                picked += [(b, c, i) for i in _greedy(order, overlap, threshold, most)]
        return np.array(picked, np.int64).reshape(-1, 3)

    return run


op("NonMaxSuppression", non_max_suppression, shape_inputs=(0, 1, 2),
   host_inputs=(3, 4))  # fmt: skip


# -- RoiAlign ----------------------------------------------------------------------------------------------------
def check_roi_align(node: Node, ctx: LoadContext) -> None:
    mode, transform = node.attrs.get("mode", "avg"), node.attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        raise UnsupportedModelError(
            f"{node.describe()}: mode {mode!r} / coordinate_transformation_mode {transform!r}: supported are avg, "
            "max and half_pixel, output_half_pixel"
        )


def _samples(start: float, size: float, bins: int, grid: int, length: int) -> tuple:
    """The sample coordinates of one axis ((bins * grid,), grid per bin, at the grid cells' centers), their
    low and high neighbours, the weight of the high one, and whether each lies on the map at all."""
    at = (
        start
        + np.repeat(np.arange(bins), grid) * size / bins
        + (np.tile(np.arange(grid), bins) + 0.5) * size / (bins * grid)
    )
    inside = (at >= -1.0) & (at <= length)
    at = np.maximum(at, 0.0)
    low = np.minimum(at.astype(np.int64), length - 1)
    high = np.where(low >= length - 1, low, low + 1)
    frac = np.where(low >= length - 1, 0.0, at - low)
    return low, high, frac, inside


def roi_align(node: Node, opset: int) -> Fn:
    """Each region's bins sampled on a grid (sampling_ratio per side, else ceil(bin size)); each sample the
    bilinear blend of its four neighbours; a bin is their average, or (mode max) the largest weighted
    neighbour over its samples, as onnxruntime and the spec's reference define it."""
    attrs = node.attrs
    out_h, out_w, ratio = attrs.get("output_height", 1), attrs.get("output_width", 1), attrs.get("sampling_ratio", 0)
    scale, use_max = attrs.get("spatial_scale", 1.0), attrs.get("mode", "avg") == "max"
    offset = 0.5 if attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel" else 0.0

    def run(x: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray) -> np.ndarray:
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != rois.shape[:1]:
            raise ShapeError(f"RoiAlign: X {x.shape}, rois {rois.shape} and batch_indices {batch_indices.shape} "
                             "must be (N, C, H, W), (R, 4) and (R,)")  # fmt: skip
        if batch_indices.size and (batch_indices.min() < 0 or batch_indices.max() >= x.shape[0]):
            raise ArgumentError(f"RoiAlign: batch_indices outside [0, {x.shape[0]})")
        height, width = x.shape[2:]
        out = np.zeros((rois.shape[0], x.shape[1], out_h, out_w), np.float64)
        for r, (x1, y1, x2, y2) in enumerate(rois.astype(np.float64) * scale - offset):
            roi_h, roi_w = y2 - y1, x2 - x1
            if not offset:
                roi_h, roi_w = max(roi_h, 1.0), max(roi_w, 1.0)
            grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / out_h))
            grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / out_w))
            if grid_h * grid_w == 0:
                continue
            ylo, yhi, ly, yin = _samples(y1, roi_h, out_h, grid_h, height)
            xlo, xhi, lx, xin = _samples(x1, roi_w, out_w, grid_w, width)
            inside = yin[:, None] & xin[None, :]
            fmap = x[batch_indices[r]].astype(np.float64)
            corners = [
                fmap[:, ylo[:, None], xlo[None, :]] * ((1 - ly)[:, None] * (1 - lx)[None, :]),
                fmap[:, ylo[:, None], xhi[None, :]] * ((1 - ly)[:, None] * lx[None, :]),
                fmap[:, yhi[:, None], xlo[None, :]] * (ly[:, None] * (1 - lx)[None, :]),
                fmap[:, yhi[:, None], xhi[None, :]] * (ly[:, None] * lx[None, :]),
            ]
            samples = np.where(inside, np.maximum.reduce(corners) if use_max else sum(corners), 0.0)
            binned = samples.reshape(x.shape[1], out_h, grid_h, out_w, grid_w)
            out[r] = binned.max(axis=(2, 4)) if use_max else binned.mean(axis=(2, 4))
        return out.astype(x.dtype)

    return run


op("RoiAlign", roi_align, check=check_roi_align)
