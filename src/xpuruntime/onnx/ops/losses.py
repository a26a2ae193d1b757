"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (which adds log_softmax over the class
axis, and may return the log-probabilities), with class weights, ignore_index and the reductions none, sum and
mean (a weighted mean: the sum of weighted losses over the sum of the weights of the targets not ignored)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, op, torch

REDUCTIONS = ("none", "sum", "mean")


def check_reduction(node: Node, ctx: LoadContext) -> None:
    value = node.attrs.get("reduction", "mean")
    if value not in REDUCTIONS:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute reduction={value!r} is not supported; supported: {', '.join(REDUCTIONS)}"
        )


def _check(node: Node, x: Any, target: Any) -> None:
    if len(x.shape) < 2 or tuple(target.shape) != (x.shape[0], *x.shape[2:]):
        raise ShapeError(f"{node.op}: input {tuple(x.shape)} (N, C, ...) and target {tuple(target.shape)} (N, ...)")


def nll(node: Node, log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """The loss of NumPy log-probabilities (N, C, ...) for int targets (N, ...)."""
    ignore, reduction = node.attrs.get("ignore_index"), node.attrs.get("reduction", "mean")
    _check(node, log_prob, target)
    kept = np.ones(target.shape, bool) if ignore is None else target != ignore
    classes = np.clip(target, 0, log_prob.shape[1] - 1)
    picked = np.take_along_axis(log_prob, classes[:, None], axis=1)[:, 0]
    w = (np.ones(target.shape, log_prob.dtype) if weight is None else weight[classes]) * kept
    loss = -picked * w
    if reduction == "none":
        return loss.astype(log_prob.dtype)
    total = loss.sum(dtype=np.float64)
    return np.asarray(total / w.sum(dtype=np.float64) if reduction == "mean" else total, log_prob.dtype)


def nll_torch(node: Node, log_prob: Any, target: Any, weight: Any) -> Any:
    ignore, reduction = node.attrs.get("ignore_index"), node.attrs.get("reduction", "mean")
    _check(node, log_prob, target)
    target = target.long()
    kept = torch.ones_like(target, dtype=torch.bool) if ignore is None else target != ignore
    classes = target.clamp(0, log_prob.shape[1] - 1)
    picked = torch.gather(log_prob, 1, classes.unsqueeze(1)).squeeze(1)
    w = (torch.ones_like(picked) if weight is None else weight[classes]) * kept
    loss = -picked * w
    if reduction == "none":
        return loss
    total = loss.double().sum()
    return (total / w.double().sum() if reduction == "mean" else total).to(log_prob.dtype)


op("NegativeLogLikelihoodLoss", lambda node, opset: lambda x, t, w=None: nll(node, x, t, w),
   lambda node, opset: lambda x, t, w=None: nll_torch(node, x, t, w), check=check_reduction)  # fmt: skip


def softmax_cross_entropy(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None) -> tuple:
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        shifted = work - work.max(axis=1, keepdims=True)
        log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = nll(node, log_prob, target, None if weight is None else weight.astype(work.dtype))
        return loss.astype(x.dtype), log_prob.astype(x.dtype)

    return run


def softmax_cross_entropy_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, target: Any, weight: Any = None) -> tuple:
        work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        log_prob = torch.log_softmax(work, dim=1)
        loss = nll_torch(node, log_prob, target, None if weight is None else weight.to(work.dtype))
        return loss.to(x.dtype), log_prob.to(x.dtype)

    return run


op("SoftmaxCrossEntropyLoss", softmax_cross_entropy, softmax_cross_entropy_torch, tuple_output=True,
   check=check_reduction)  # fmt: skip
