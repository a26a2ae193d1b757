"""Neural-network ONNX ops: Softmax and LogSoftmax, LayerNormalization (both through the selector's
kernels where they fit), Dropout (inference only)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, Lowered, axis_index, is_float, op, to_host, torch


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


# -- more normalizations (NumPy; the GPU path runs them on the host) ---------------------------------------------------
def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype == np.float16 else x


def lp_normalization(node: Node, opset: int) -> Fn:
    axis, p = node.attrs.get("axis", -1), int(node.attrs.get("p", 2))

    def run(x: np.ndarray) -> np.ndarray:
        ax = axis_index("LpNormalization", axis, x.ndim)
        norm = np.sum(np.abs(_f32(x)) ** p, axis=ax, keepdims=True) ** (1.0 / p)
        return np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype)

    return run


def mean_variance_normalization(node: Node, opset: int) -> Fn:
    axes = tuple(node.attrs.get("axes", (0, 2, 3)))

    def run(x: np.ndarray) -> np.ndarray:
        xf = _f32(x)
        mean = xf.mean(axis=axes, keepdims=True)
        std = np.sqrt(((xf - mean) ** 2).mean(axis=axes, keepdims=True))
        return ((xf - mean) / (std + 1e-9)).astype(x.dtype)

    return run


def instance_normalization(node: Node, opset: int) -> Fn:
    eps = float(node.attrs.get("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        axes = tuple(range(2, x.ndim))
        xf = _f32(x)
        mean, var = xf.mean(axis=axes, keepdims=True), xf.var(axis=axes, keepdims=True)
        y = (xf - mean) / np.sqrt(var + eps) * _channel(scale, x.ndim) + _channel(bias, x.ndim)
        return y.astype(x.dtype)

    return run


def group_normalization(node: Node, opset: int) -> Fn:
    """Scale and bias per channel (opset 21), or per group (opset 18)."""
    eps, groups = float(node.attrs.get("epsilon", 1e-5)), int(node.attrs["num_groups"])

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        if groups < 1 or c % groups:
            raise ShapeError(f"GroupNormalization: {c} channels do not split into num_groups={groups}")
        grouped = _f32(x).reshape(n, groups, -1)
        mean, var = grouped.mean(axis=2, keepdims=True), grouped.var(axis=2, keepdims=True)
        y = ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape)
        if scale.shape[0] == groups and groups != c:
            scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
        return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype)

    return run


def lrn(node: Node, opset: int) -> Fn:
    alpha, beta = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75))
    bias, size = float(node.attrs.get("bias", 1.0)), int(node.attrs["size"])

    def run(x: np.ndarray) -> np.ndarray:
        """Each channel divided by the sum of squares over `size` channels around it."""
        square = np.square(_f32(x))
        low, high = (size - 1) // 2, -(-(size - 1) // 2)
        padded = np.pad(square, [(0, 0), (low, high)] + [(0, 0)] * (x.ndim - 2))
        total = sum(padded[:, i : i + x.shape[1]] for i in range(size))
        return (x / (bias + alpha / size * total) ** beta).astype(x.dtype)

    return run


op("LpNormalization", lp_normalization)
op("MeanVarianceNormalization", mean_variance_normalization)
op("InstanceNormalization", instance_normalization)
op("GroupNormalization", group_normalization)
op("LRN", lrn)
