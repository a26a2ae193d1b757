"""Neural-network ONNX ops: Softmax and LogSoftmax (and Hardmax), LayerNormalization and RMSNormalization
(through the selector's kernels where they fit), Dropout (inference only), BatchNormalization, and the other
normalizations: Instance, Group, MeanVariance, Lp and LRN (written once for both paths, see arrays.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .arrays import builders
from .record import Fn, LoadContext, Lowered, axis_index, check_elem_dtype, elem_dtype, is_float, op, to_host, torch


# -- Softmax and LogSoftmax --------------------------------------------------------------------------------------
def softmax(node: Node, opset: int) -> Fn:
    log = node.op == "LogSoftmax"
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)

    def along(x: np.ndarray, ax: int) -> np.ndarray:
        shifted = x - np.max(x, axis=ax, keepdims=True)
        e = np.exp(shifted)
        s = np.sum(e, axis=ax, keepdims=True)
        return (shifted - np.log(s)) if log else e / s

    def run(x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return x.copy()
        if opset >= 13:
            return along(x, axis).astype(x.dtype, copy=False)
        ax = axis % max(x.ndim, 1)  # before opset 13: the input is coerced to 2-D at `axis`
        flat = x.reshape(math.prod(x.shape[:ax]), -1)
        return along(flat, 1).reshape(x.shape).astype(x.dtype, copy=False)

    return run


def softmax_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)

    def run(x: Any) -> Any:
        fn = torch.log_softmax if node.op == "LogSoftmax" else torch.softmax
        if opset >= 13:
            return fn(x, axis)
        ax = axis % x.dim()
        return fn(x.reshape(math.prod(x.shape[:ax]), -1), 1).reshape(x.shape)

    return run


def lower_softmax(node: Node, args: list, opset: int) -> Lowered | None:
    (x,) = args
    if opset >= 13 and is_float(x) and x.ndim >= 1:
        return "softmax", (0,), {"axis": node.attrs.get("axis", -1)}
    return None


op("Softmax", softmax, softmax_torch, lower=lower_softmax)
op("LogSoftmax", softmax, softmax_torch)


def hardmax(node: Node, opset: int) -> Fn:
    """1 at the first largest value along the axis, 0 elsewhere (before opset 13: of the input coerced to
    2-D at the axis)."""
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)

    def run(x: np.ndarray) -> np.ndarray:
        shape = x.shape
        if opset < 13:
            x = x.reshape(math.prod(shape[: axis % max(x.ndim, 1)]), -1)
        ax = axis_index("Hardmax", axis if opset >= 13 else 1, x.ndim)
        out = np.zeros(x.shape, x.dtype)
        if x.size:
            np.put_along_axis(out, np.argmax(x, axis=ax, keepdims=True), 1, axis=ax)
        return out.reshape(shape)

    return run


def hardmax_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)

    def run(x: Any) -> Any:
        shape = x.shape
        if opset < 13:
            x = x.reshape(math.prod(shape[: axis % max(x.dim(), 1)]), -1)
        ax = axis_index("Hardmax", axis if opset >= 13 else 1, x.dim())
        out = torch.zeros_like(x)
        if x.numel():
            out.scatter_(ax, torch.argmax(x, dim=ax, keepdim=True), 1)
        return out.reshape(shape)

    return run


op("Hardmax", hardmax, hardmax_torch)


# -- LayerNormalization ------------------------------------------------------------------------------------------
def layer_norm(node: Node, opset: int) -> Fn:
    axis, eps = node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5)

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> tuple:
        ax = axis_index("LayerNormalization", axis, x.ndim)
        axes = tuple(range(ax, x.ndim))
        xf = x.astype(np.float32) if x.dtype == np.float16 else x
        mean = xf.mean(axis=axes, keepdims=True)
        centered = xf - mean
        inv_std = 1.0 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + eps)
        y = centered * inv_std * scale
        if bias is not None:
            y = y + bias
        return y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32)

    return run


def layer_norm_torch(node: Node, opset: int) -> Fn:
    axis, eps = node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5)

    def run(x: Any, scale: Any, bias: Any = None) -> tuple:
        axes = tuple(range(axis_index("LayerNormalization", axis, x.dim()), x.dim()))
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        mean = xf.mean(dim=axes, keepdim=True)
        centered = xf - mean
        inv = torch.rsqrt((centered * centered).mean(dim=axes, keepdim=True) + eps)
        y = centered * inv * scale
        y = y if bias is None else y + bias
        return y.to(x.dtype), mean.float(), inv.float()

    return run


def lower_layer_norm(node: Node, args: list, opset: int) -> Lowered | None:
    if any(node.outputs[1:]):  # Mean / InvStdDev are wanted: only the op map computes them
        return None
    x, scale, *rest = args
    bias = rest[0] if rest else None
    if not is_float(x) or x.ndim == 0:
        return None
    dims = x.shape[node.attrs.get("axis", -1) % x.ndim :]
    if scale.shape != dims or scale.dtype != x.dtype:
        return None
    if bias is not None and (bias.shape != dims or bias.dtype != x.dtype):
        return None
    attrs = {"normalized_shape": dims, "eps": float(node.attrs.get("epsilon", 1e-5))}
    return "layer_norm", (0, 1, 2 if bias is not None else None), attrs


op("LayerNormalization", layer_norm, layer_norm_torch, tuple_output=True, lower=lower_layer_norm)


# -- Dropout (inference) -----------------------------------------------------------------------------------------
def _ratio_and_training(node: Node, ctx: LoadContext) -> tuple[float | None, bool | None]:
    """A Dropout's ratio and training flag where the model fixes them (None: fed, overridable or computed
    at run time)."""
    graph = ctx.graph
    if graph.opset < 12:  # ratio is an attribute; before opset 7, is_test=0 (the default) means training
        return float(node.attrs.get("ratio", 0.5)), graph.opset < 7 and not node.attrs.get("is_test", 0)
    ratio, training = 0.5, False
    if len(node.inputs) > 1 and node.inputs[1]:
        value = None if node.inputs[1] in ctx.overridable else graph.constant(node.inputs[1])
        ratio = None if value is None else float(np.asarray(value).reshape(-1)[0])
    if len(node.inputs) > 2 and node.inputs[2]:
        value = None if node.inputs[2] in ctx.overridable else graph.constant(node.inputs[2])
        training = None if value is None else bool(np.asarray(value).reshape(-1)[0])
    return ratio, training


def check_dropout(node: Node, ctx: LoadContext) -> None:
    """Dropout in inference is the identity (its mask all True); a training-mode Dropout that drops
    anything is random and declined. One whose mask nobody reads becomes an Identity (which the graph
    passes then remove)."""
    ratio, training = _ratio_and_training(node, ctx)
    if training and ratio != 0:
        flag = "is_test=0" if ctx.graph.opset < 7 else "training_mode=True"
        raise UnsupportedModelError(
            f"{node.describe()}: {flag} makes Dropout drop values at random (training); the session runs "
            "inference only: supported are training_mode False or absent (is_test=1 before opset 7), or ratio 0"
        )
    if training is not None and not any(node.outputs[1:]):
        node.op, node.inputs, node.outputs, node.attrs = "Identity", node.inputs[:1], node.outputs[:1], {}


def check_inference_dropout(ratio: Any, training: Any) -> None:
    """A training_mode fed as True drops values at random unless the ratio is 0: refused, as the session
    runs inference only (a constant one is declined at load time)."""
    on = training is not None and bool(np.asarray(training).reshape(-1)[0])
    if on and (ratio is None or np.asarray(ratio).reshape(-1)[0] != 0):
        raise ArgumentError(
            "Dropout: training_mode=True with a ratio above 0 drops values at random; the session runs "
            "inference only (training_mode False, or ratio 0)"
        )


def dropout(node: Node, opset: int) -> Fn:
    mask = len(node.outputs) > 1 and bool(node.outputs[1])  # all True: bool from opset 10, x's type before

    def run(x: np.ndarray, ratio: Any = None, training: Any = None) -> tuple:
        check_inference_dropout(ratio, training)
        return (x, np.ones(x.shape, bool if opset >= 10 else x.dtype)) if mask else (x,)

    return run


def dropout_torch(node: Node, opset: int) -> Fn:
    mask = len(node.outputs) > 1 and bool(node.outputs[1])

    def run(x: Any, ratio: Any = None, training: Any = None) -> tuple:
        check_inference_dropout(to_host(ratio), to_host(training))
        if not mask:
            return (x,)
        return x, torch.ones(x.shape, dtype=torch.bool if opset >= 10 else x.dtype, device=x.device)

    return run


op("Dropout", dropout, dropout_torch, host_inputs=(1, 2), tuple_output=True, check=check_dropout)


# -- BatchNormalization --------------------------------------------------------------------------------------------
def check_batch_norm(node: Node, ctx: LoadContext) -> None:
    """Before opset 14, the outputs after Y are training statistics of an older design: declined."""
    if ctx.graph.opset < 14 and any(node.outputs[1:]):
        raise UnsupportedModelError(
            f"{node.describe()}: BatchNormalization before opset 14 with its training outputs (mean, var, "
            "saved_mean, saved_var) is not supported; the session runs inference (one output, Y)"
        )


def _channel(p: Any, ndim: int) -> Any:
    """A per-channel parameter (C,) (or, with spatial=0 before opset 9, (C, D1, ...)) shaped to broadcast
    over (N, C, D1, ...)."""
    return p.reshape(1, *p.shape, *(1,) * (ndim - 1 - len(p.shape)))


def _batch_norm(node: Node, opset: int, torch_path: bool) -> Fn:
    eps, momentum = float(node.attrs.get("epsilon", 1e-5)), float(node.attrs.get("momentum", 0.9))
    training = opset >= 14 and bool(node.attrs.get("training_mode", 0))

    def run(x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> tuple:
        ndim = len(x.shape)
        if not training:
            y = (x - _channel(mean, ndim)) / (_channel(var, ndim) + eps) ** 0.5 * _channel(scale, ndim)
            return (_same_dtype(y + _channel(bias, ndim), x, torch_path),)
        axes = tuple(a for a in range(ndim) if a != 1)
        current_mean = x.mean(axes) if torch_path else x.mean(axis=axes)
        current_var = x.var(axes, unbiased=False) if torch_path else x.var(axis=axes)
        y = (x - _channel(current_mean, ndim)) / (_channel(current_var, ndim) + eps) ** 0.5
        y = y * _channel(scale, ndim) + _channel(bias, ndim)
        running_mean = mean * momentum + current_mean * (1 - momentum)
        running_var = var * momentum + current_var * (1 - momentum)
        return tuple(_same_dtype(v, x, torch_path) for v in (y, running_mean, running_var))

    return run


def _same_dtype(y: Any, x: Any, torch_path: bool) -> Any:
    return y.to(x.dtype) if torch_path else np.asarray(y).astype(x.dtype, copy=False)


op("BatchNormalization", lambda node, opset: _batch_norm(node, opset, False),
   lambda node, opset: _batch_norm(node, opset, True), tuple_output=True, check=check_batch_norm)  # fmt: skip


# -- RMSNormalization ------------------------------------------------------------------------------------------------
def _norm_axes(node: Node, ndim: int) -> tuple[int, ...]:
    return tuple(range(axis_index(node.op, node.attrs.get("axis", -1), ndim), ndim))


def rms_norm(node: Node, opset: int) -> Fn:
    eps = float(node.attrs.get("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        xf = x.astype(np.float32) if x.dtype == np.float16 else x
        mean_square = np.mean(np.square(xf), axis=_norm_axes(node, x.ndim), keepdims=True)
        return (xf / np.sqrt(mean_square + eps) * scale).astype(x.dtype, copy=False)

    return run


def rms_norm_torch(node: Node, opset: int) -> Fn:
    eps = float(node.attrs.get("epsilon", 1e-5))

    def run(x: Any, scale: Any) -> Any:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        mean_square = (xf * xf).mean(dim=_norm_axes(node, x.dim()), keepdim=True)
        return (xf * torch.rsqrt(mean_square + eps) * scale).to(x.dtype)

    return run


def lower_rms_norm(node: Node, args: list, opset: int) -> Lowered | None:
    x, scale = args
    if not is_float(x) or x.ndim == 0:
        return None
    dims = x.shape[_norm_axes(node, x.ndim)[0] :]
    if scale.shape != dims or scale.dtype != x.dtype:
        return None
    return "rms_norm", (0, 1), {"normalized_shape": dims, "eps": float(node.attrs.get("epsilon", 1e-5))}


op("RMSNormalization", rms_norm, rms_norm_torch, lower=lower_rms_norm)


# -- InstanceNormalization, GroupNormalization, MeanVarianceNormalization, LpNormalization, LRN ------------------
def _standardize(xp: Any, x: Any, axes: tuple[int, ...], eps: float) -> Any:
    """(x - mean) / sqrt(var + eps) over `axes`, in float32 (float64 for float64 inputs)."""
    xf = xp.cast(x, xp.compute_dtype(x))
    centered = xf - xp.mean(xf, axes)
    return centered / (xp.mean(centered * centered, axes) + eps) ** 0.5


def _instance_norm(xp: Any, node: Node, opset: int, x: Any, scale: Any, bias: Any) -> Any:
    """Per sample and channel over the spatial dims, then scale and bias per channel."""
    if x.ndim < 3 or tuple(scale.shape) != (x.shape[1],) or tuple(bias.shape) != (x.shape[1],):
        raise ShapeError(f"InstanceNormalization: input {tuple(x.shape)} must be (N, C, ...) and scale / bias (C,), "
                         f"got {tuple(scale.shape)}, {tuple(bias.shape)}")  # fmt: skip
    y = _standardize(xp, x, tuple(range(2, x.ndim)), node.attrs.get("epsilon", 1e-5))
    per_channel = (-1,) + (1,) * (x.ndim - 2)
    return xp.cast(y * xp.cast(scale, y.dtype).reshape(per_channel) + xp.cast(bias, y.dtype).reshape(per_channel),
                   x.dtype)  # fmt: skip


def _group_norm(xp: Any, node: Node, opset: int, x: Any, scale: Any, bias: Any) -> Any:
    """Per sample and group of channels over the group's channels and the spatial dims; scale and bias per
    channel (before opset 21: per group)."""
    groups = node.attrs["num_groups"]
    n, c = x.shape[:2]
    per_group = opset < 21
    wanted = (groups,) if per_group else (c,)
    if x.ndim < 2 or groups < 1 or c % groups or tuple(scale.shape) != wanted or tuple(bias.shape) != wanted:
        raise ShapeError(f"GroupNormalization: input {tuple(x.shape)} must have channels divisible by num_groups "
                         f"{groups}, and scale / bias be {wanted}")  # fmt: skip
    stash = elem_dtype(node, "stash_type", np.dtype(np.float32))
    grouped = xp.cast(x, xp.dtype(stash.name)).reshape(n, groups, -1)
    y = _standardize(xp, grouped, (2,), node.attrs.get("epsilon", 1e-5)).reshape(x.shape)
    y = xp.cast(y, x.dtype)
    if per_group:
        scale, bias = xp.repeat(scale, c // groups, 0), xp.repeat(bias, c // groups, 0)
    per_channel = (-1,) + (1,) * (x.ndim - 2)
    return y * xp.cast(scale, x.dtype).reshape(per_channel) + xp.cast(bias, x.dtype).reshape(per_channel)


def _mean_variance_norm(xp: Any, node: Node, opset: int, x: Any) -> Any:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (default 0, 2, 3), as the spec's function."""
    axes = tuple(axis_index("MeanVarianceNormalization", a, x.ndim) for a in node.attrs.get("axes", (0, 2, 3)))
    mean = xp.mean(x, axes)
    std = xp.clip(xp.mean(x * x, axes) - mean * mean, 0, None) ** 0.5
    return xp.cast((x - mean) / (std + 1e-9), x.dtype)


def _lp_norm(xp: Any, node: Node, opset: int, x: Any) -> Any:
    """x / ||x||_p along the axis (p 1 or 2), 0 where the norm is 0."""
    p, axis = node.attrs.get("p", 2), axis_index("LpNormalization", node.attrs.get("axis", -1), x.ndim)
    norm = xp.sum(xp.abs(x), (axis,)) if p == 1 else xp.sum(x * x, (axis,)) ** 0.5
    return xp.cast(xp.where(norm == 0, 0 * x, x / xp.where(norm == 0, 1 + 0 * norm, norm)), x.dtype)


def check_lp_norm(node: Node, ctx: LoadContext) -> None:
    if node.attrs.get("p", 2) not in (1, 2):
        raise UnsupportedModelError(f"{node.describe()}: p={node.attrs['p']}; LpNormalization takes p 1 or 2")


def _lrn(xp: Any, node: Node, opset: int, x: Any) -> Any:
    """x / (bias + alpha / size * sum of squares over the channels around c) ** beta; the window holds
    floor((size - 1) / 2) channels before c and ceil((size - 1) / 2) after."""
    size = node.attrs["size"]
    alpha, beta, bias = node.attrs.get("alpha", 1e-4), node.attrs.get("beta", 0.75), node.attrs.get("bias", 1.0)
    if x.ndim < 3 or size < 1:
        raise ShapeError(f"LRN: input {tuple(x.shape)} must be (N, C, ...) and size >= 1, got {size}")
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    squares = xp.cast(x, xp.compute_dtype(x)) ** 2
    c = x.shape[1]
    rows = np.arange(c)[:, None]
    band = ((np.arange(c)[None, :] >= rows - before) & (np.arange(c)[None, :] <= rows + after)).astype(np.float64)
    window = xp.cast(xp.from_host(band, x), squares.dtype)  # (C, C): which channels each channel sums
    summed = xp.einsum("dc,nc...->nd...", window, squares)
    return xp.cast(xp.cast(x, squares.dtype) / (bias + alpha / size * summed) ** beta, x.dtype)


op("InstanceNormalization", *builders(_instance_norm))
op("GroupNormalization", *builders(_group_norm), check=check_elem_dtype("stash_type"))
op("MeanVarianceNormalization", *builders(_mean_variance_norm))
op("LpNormalization", *builders(_lp_norm), check=check_lp_norm)
op("LRN", *builders(_lrn))
