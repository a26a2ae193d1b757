"""aten::layer_norm and aten::rms_norm routed to the `layer_norm` / `rms_norm` ops, forward and backward.

Both are composite ops, overridden at the Autograd key with autograd Functions: forward dispatches the
norm op, backward dispatches `layer_norm_backward` / `rms_norm_backward` (when registered) under the
policy the forward saw, else runs PyTorch's backward. Below autograd the backend-key override
dispatches the forward only.
"""

from __future__ import annotations

from typing import Any

import torch

from ..policy import current_policy
from .autograd_common import GRAD_ALIASES, any_requires_grad, plain, unpack_norm_grads
from .families import family_policy, fell_back, using, without
from .routing import attrs_for, dispatch, get_dispatcher, has_op, inputs_for, wants

_LAYER_NORM = torch.ops.aten.layer_norm.default
_RMS_NORM = torch.ops.aten.rms_norm.default
_LN_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


def _axes(x: torch.Tensor, normalized_shape: tuple) -> tuple[int, ...]:
    return tuple(range(x.dim() - len(normalized_shape), x.dim()))


def _stats(x: torch.Tensor, normalized_shape: tuple, eps: float, rms: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, rstd) in fp32, shaped as native_layer_norm returns them (mean is zero for RMS norm)."""
    xf, axes = x.float(), _axes(x, normalized_shape)
    if rms:
        return torch.zeros((), device=x.device), torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    var, mean = torch.var_mean(xf, dim=axes, keepdim=True, correction=0)
    return mean, torch.rsqrt(var + eps)


def _routable(x: Any, weight: Any, bias: Any = None) -> bool:
    if not plain(x, weight, bias):
        return False
    return all(t is None or t.dtype == x.dtype for t in (weight, bias))


def _routed_grads(ctx: Any, dy: torch.Tensor) -> tuple | None:
    op = f"{ctx.op}_backward"
    if not has_op(op):
        return None
    x, weight, bias = ctx.tensors
    values = {"dout": dy, "x": x, "weight": weight, "bias": bias}
    wanted = {GRAD_ALIASES.get(n, n) for n in get_dispatcher().registry.op(op).inputs}
    if wanted & {"mean", "rstd"}:
        values["mean"], values["rstd"] = _stats(x, ctx.normalized_shape, ctx.eps, ctx.op == "rms_norm")
    inputs = inputs_for(op, values, GRAD_ALIASES)
    if inputs is None:
        return None
    policy = ctx.policy
    if fell_back(ctx.op, _inputs(ctx.op, x, weight, bias), (ctx.normalized_shape, ctx.raw_eps), policy):
        policy = without(policy, (op,), ctx.user_policy)  # the forward's fallback warning was enough
    attrs = attrs_for(op, {"normalized_shape": ctx.normalized_shape, "eps": ctx.eps})
    result = dispatch(op, inputs, attrs, policy=policy)
    if result is None:
        return None
    grads = [*unpack_norm_grads(result, x, ctx.normalized_shape, 2 if ctx.op == "layer_norm" else 1), None]
    return grads[0], (grads[1] if weight is not None else None), (grads[2] if bias is not None else None)


def _torch_grads(ctx: Any, dy: torch.Tensor) -> tuple:
    x, weight, bias = ctx.tensors
    if ctx.op == "layer_norm":
        mean, rstd = _stats(x, ctx.normalized_shape, ctx.eps, rms=False)
        mask = [True, weight is not None, bias is not None]
        return tuple(_LN_BACKWARD(dy, x, list(ctx.normalized_shape), mean, rstd, weight, bias, mask))
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in (x, weight)]
        out = _RMS_NORM.decompose(leaves[0], list(ctx.normalized_shape), leaves[1], ctx.eps)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, present, dy))
        return next(grads), (next(grads) if weight is not None else None), None


class NormFunction(torch.autograd.Function):
    """Forward through `layer_norm` / `rms_norm`, backward through their backward ops, one policy."""

    @staticmethod
    def forward(ctx: Any, op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any) -> Any:
        ctx.user_policy = current_policy()
        ctx.policy = family_policy(ctx.user_policy)
        ctx.op, ctx.normalized_shape, ctx.eps, ctx.raw_eps = op, normalized_shape, eps, eps
        ctx.save_for_backward(x, weight, bias)
        out = _forward(op, x, weight, bias, normalized_shape, eps, ctx.policy)
        if out is None:
            out = _torch_forward(op, x, weight, bias, normalized_shape, eps)
        if ctx.eps is None:  # rms_norm's default: the input dtype's epsilon
            ctx.eps = torch.finfo(x.dtype).eps
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        ctx.tensors = ctx.saved_tensors
        grads = _routed_grads(ctx, dy)
        if grads is None:
            with using(ctx.user_policy):
                grads = _torch_grads(ctx, dy)
        ctx.tensors = None
        return None, grads[0], grads[1], grads[2], None, None


def _inputs(op: str, x: Any, weight: Any, bias: Any) -> tuple:
    return (x, weight, bias) if op == "layer_norm" else (x, weight)


def _forward(op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any, policy: Any = None) -> Any:
    return dispatch(op, _inputs(op, x, weight, bias), (normalized_shape, eps), policy=policy)


def _torch_forward(op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any) -> Any:
    if op == "layer_norm":
        return _LAYER_NORM.decompose(x, list(normalized_shape), weight, bias, eps)
    return _RMS_NORM.decompose(x, list(normalized_shape), weight, eps)


def _norm(op: str, autograd: bool, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any) -> Any:
    normalized_shape = tuple(int(n) for n in normalized_shape)
    if wants(op) and _routable(x, weight, bias):
        if autograd and any_requires_grad(x, weight, bias):
            return NormFunction.apply(op, x, weight, bias, normalized_shape, eps)
        out = _forward(op, x, weight, bias, normalized_shape, eps)
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
