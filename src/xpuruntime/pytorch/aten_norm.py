"""aten::layer_norm and aten::rms_norm routed to the `layer_norm` / `rms_norm` ops, forward and backward.

Both are composite ops, overridden at the Autograd key with autograd Functions: forward dispatches the
norm op, backward dispatches `layer_norm_backward` / `rms_norm_backward` (when registered) under the
policy the forward saw, else runs PyTorch's backward. Below autograd the backend-key override
dispatches the forward only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..policy import current_policy
from .autograd_common import (
    GRAD_ALIASES,
    any_requires_grad,
    grad_leaves,
    native_layer_norm_stats,
    plain,
    unpack_norm_grads,
)
from .families import family_policy, fell_back, without
from .routing import attrs_for, dispatch, has_op, input_names, inputs_for, memoized, wants

_LAYER_NORM = torch.ops.aten.layer_norm.default
_NATIVE_LAYER_NORM = torch.ops.aten.native_layer_norm.default
_RMS_NORM = torch.ops.aten.rms_norm.default
_LN_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


class _Backward(NamedTuple):
    """How a norm's backward op is called for one (op, normalized_shape, eps): fixed by its schema."""

    op: str
    attrs: tuple
    stats: bool  # whether it takes the forward's mean and rstd


def _backward_route(op: str, normalized_shape: tuple, eps: float) -> _Backward | None:
    """The backward op of `op` with its attributes, or None when the registry has none (made once)."""
    backward = f"{op}_backward"
    if not has_op(backward):
        return None

    def make() -> _Backward:
        attrs = attrs_for(backward, {"normalized_shape": normalized_shape, "eps": eps})
        names = {name for name, _ in input_names(backward, GRAD_ALIASES)}
        return _Backward(backward, attrs, bool(names & {"mean", "rstd"}))

    return memoized((backward, normalized_shape, eps, type(eps)), make)


def _stats(x: torch.Tensor, normalized_shape: tuple, eps: float, rms: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, rstd) in fp32, shaped as native_layer_norm returns them (mean is zero for RMS norm)."""
    xf, axes = x.float(), tuple(range(x.dim() - len(normalized_shape), x.dim()))
    if rms:
        return torch.zeros((), device=x.device), torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    var, mean = torch.var_mean(xf, dim=axes, keepdim=True, correction=0)
    return mean, torch.rsqrt(var + eps)


def _saved_stats(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's (mean, rstd) when PyTorch's forward ran (it returns them), else recomputed."""
    if ctx.mean is not None:
        return ctx.mean, ctx.rstd
    return _stats(x, ctx.normalized_shape, ctx.eps, ctx.op == "rms_norm")


def _routable(x: Any, weight: Any, bias: Any = None) -> bool:
    if not plain(x, weight, bias):
        return False
    return (weight is None or weight.dtype == x.dtype) and (bias is None or bias.dtype == x.dtype)


def _routed_grads(ctx: Any, dy: torch.Tensor) -> tuple | None:
    route = _backward_route(ctx.op, ctx.normalized_shape, ctx.eps)
    if route is None:
        return None
    x, weight, bias = ctx.tensors
    values = {"dout": dy, "x": x, "weight": weight, "bias": bias}
    if route.stats:
        values["mean"], values["rstd"] = _saved_stats(ctx, x)
    inputs = inputs_for(route.op, values, GRAD_ALIASES)
    if inputs is None:
        return None
    policy = ctx.policy
    if fell_back(ctx.op, _inputs(ctx.op, x, weight, bias), (ctx.normalized_shape, ctx.raw_eps), policy):
        policy = without(policy, (route.op,), ctx.user_policy)  # the forward's fallback warning was enough
    result = dispatch(route.op, inputs, route.attrs, policy=policy)
    if result is None:
        return None
    grads = [*unpack_norm_grads(result, x, ctx.normalized_shape, 2 if ctx.op == "layer_norm" else 1), None]
    return grads[0], (grads[1] if weight is not None else None), (grads[2] if bias is not None else None)


def _torch_grads(ctx: Any, dy: torch.Tensor) -> tuple:
    """PyTorch's backward (it reaches no routed aten op, so no policy scope is needed); differentiable
    itself under create_graph."""
    x, weight, bias = ctx.tensors
    if ctx.op == "layer_norm":
        mean, rstd = ctx.mean, ctx.rstd
        if mean is None:
            mean, rstd = native_layer_norm_stats(x, ctx.normalized_shape, weight, bias, ctx.eps)
        mask = [True, weight is not None, bias is not None]
        return tuple(_LN_BACKWARD(dy, x, list(ctx.normalized_shape), mean, rstd, weight, bias, mask))
    create = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = grad_leaves(x, weight)
        out = _RMS_NORM.decompose(leaves[0], list(ctx.normalized_shape), leaves[1], ctx.eps)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, present, dy, create_graph=create))
        return next(grads), (next(grads) if weight is not None else None), None


class NormFunction(torch.autograd.Function):
    """Forward through `layer_norm` / `rms_norm`, backward through their backward ops, one policy."""

    @staticmethod
    def forward(ctx: Any, op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any) -> Any:
        ctx.user_policy = current_policy()
        ctx.policy = family_policy(ctx.user_policy)
        ctx.op, ctx.normalized_shape, ctx.raw_eps = op, normalized_shape, eps
        ctx.eps = torch.finfo(x.dtype).eps if eps is None else eps  # rms_norm's default: the dtype's epsilon
        ctx.save_for_backward(x, weight, bias)
        ctx.mean = ctx.rstd = None
        out = _forward(op, x, weight, bias, normalized_shape, eps, ctx.policy)
        if out is None and op == "layer_norm":  # PyTorch's forward, keeping its stats for the backward
            out, ctx.mean, ctx.rstd = _NATIVE_LAYER_NORM(x, list(normalized_shape), weight, bias, eps)
        elif out is None:
            out = _torch_forward(op, x, weight, bias, normalized_shape, eps)
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        ctx.tensors = ctx.saved_tensors
        # under create_graph (grad mode on here) only PyTorch's backward gives differentiable gradients
        grads = None if torch.is_grad_enabled() else _routed_grads(ctx, dy)
        if grads is None:
            grads = _torch_grads(ctx, dy)
        ctx.tensors = ctx.mean = ctx.rstd = None
        return None, grads[0], grads[1], grads[2], None, None


def _inputs(op: str, x: Any, weight: Any, bias: Any) -> tuple:
    return (x, weight, bias) if op == "layer_norm" else (x, weight)


def _forward(op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any, policy: Any = None) -> Any:
    return dispatch(op, _inputs(op, x, weight, bias), (normalized_shape, eps), policy=policy)


def _torch_forward(op: str, x: Any, weight: Any, bias: Any, normalized_shape: Any, eps: Any) -> Any:
    if op == "layer_norm":
        return _LAYER_NORM.decompose(x, list(normalized_shape), weight, bias, eps)
    return _RMS_NORM.decompose(x, list(normalized_shape), weight, eps)


def _norm(op: str, autograd: bool, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any) -> Any:
    if wants(op) and _routable(x, weight, bias):
        shape = tuple(map(int, normalized_shape))
        if autograd and any_requires_grad(x, weight, bias):
            return NormFunction.apply(op, x, weight, bias, shape, eps)
        out = _forward(op, x, weight, bias, shape, eps)
        if out is not None:
            return out
    return _torch_forward(op, x, weight, bias, normalized_shape, eps)


def layer_norm_autograd(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """Autograd-key override of aten::layer_norm."""
    return _norm("layer_norm", True, input, normalized_shape, weight, bias, eps)


def layer_norm_backend(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """Backend-key override of aten::layer_norm (below autograd): forward only."""
    return _norm("layer_norm", False, input, normalized_shape, weight, bias, eps)


def rms_norm_autograd(input, normalized_shape, weight=None, eps=None):
    """Autograd-key override of aten::rms_norm."""
    return _norm("rms_norm", True, input, normalized_shape, weight, None, eps)


def rms_norm_backend(input, normalized_shape, weight=None, eps=None):
    """Backend-key override of aten::rms_norm (below autograd): forward only."""
    return _norm("rms_norm", False, input, normalized_shape, weight, None, eps)


ROUTES = {
    "layer_norm": (("layer_norm", "autograd", layer_norm_autograd), ("layer_norm", "backend", layer_norm_backend)),
    "rms_norm": (("rms_norm", "autograd", rms_norm_autograd), ("rms_norm", "backend", rms_norm_backend)),
}
