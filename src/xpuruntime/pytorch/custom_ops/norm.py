"""`xpuruntime::layer_norm`, `xpuruntime::rms_norm` and their backward ops: the norms through the selector,
as torch.library custom ops.

Forward: the `layer_norm` / `rms_norm` op through the selector, else PyTorch's kernel. Backward: the
`layer_norm_backward` / `rms_norm_backward` op, else PyTorch's backward (recomputing the statistics, which
the forward op does not return). Both follow the policy in force when they run, extended to the op's family
(`layer_norm=K` names K for `layer_norm_backward`); the policy name `torch` means PyTorch's own kernels.

The norm routes emit the forward ops into graphs that torch.compile traces while a policy steers the norm;
their registered autograd puts the backward ops into the backward graph. Eager calls of the routes run
`forward` / `backward` below directly, and so compute the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ...policy import KernelPolicy, current_policy
from ..router import attrs_for, dispatch, family_policy, has_op, input_names, inputs_for, memoized
from .common import (
    GRAD_ALIASES,
    grad_leaves,
    graph_origin,
    native_layer_norm_stats,
    or_empty,
    unaliased,
    unpack_norm_grads,
)

TORCH_KERNEL = "torch"  # the policy name that means "PyTorch's own kernel" for these ops
_LAYER_NORM = torch.ops.aten.layer_norm.default
_RMS_NORM = torch.ops.aten.rms_norm.default
_LN_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


def inputs(op: str, x: Any, weight: Any, bias: Any) -> tuple:
    return (x, weight, bias) if op == "layer_norm" else (x, weight)


def forward(
    op: str, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: Any, policy: Any, routed: bool = True
) -> Any:
    """The norm through the selector; None where no kernel of ours can take the call."""
    return dispatch(op, inputs(op, x, weight, bias), (normalized_shape, eps), policy=policy, routed=routed)


def torch_forward(op: str, x: Tensor, weight: Any, bias: Any, normalized_shape: Any, eps: Any) -> Tensor:
    """PyTorch's own norm (its composite: never the route again)."""
    if op == "layer_norm":
        return _LAYER_NORM.decompose(x, list(normalized_shape), weight, bias, eps)
    return _RMS_NORM.decompose(x, list(normalized_shape), weight, eps)


class BackwardRoute(NamedTuple):
    """How a norm's backward op is called for one (op, normalized_shape, eps): fixed by its schema."""

    op: str
    attrs: tuple
    stats: bool  # whether it takes the forward's mean and rstd


def backward_route(op: str, normalized_shape: tuple, eps: float) -> BackwardRoute | None:
    """The backward op of `op` with its attributes, or None when the registry has none (made once)."""
    backward_op = f"{op}_backward"
    if not has_op(backward_op):
        return None

    def make() -> BackwardRoute:
        attrs = attrs_for(backward_op, {"normalized_shape": normalized_shape, "eps": eps})
        names = {name for name, _ in input_names(backward_op, GRAD_ALIASES)}
        return BackwardRoute(backward_op, attrs, bool(names & {"mean", "rstd"}))

    return memoized((backward_op, normalized_shape, eps, type(eps)), make)


def stats(x: Tensor, normalized_shape: tuple, eps: float, rms: bool) -> tuple[Tensor, Tensor]:
    """(mean, rstd) in fp32, shaped as native_layer_norm returns them (mean is zero for RMS norm)."""
    xf, axes = x.float(), tuple(range(x.dim() - len(normalized_shape), x.dim()))
    if rms:
        return torch.zeros((), device=x.device), torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    var, mean = torch.var_mean(xf, dim=axes, keepdim=True, correction=0)
    return mean, torch.rsqrt(var + eps)


def backward(
    op: str, dy: Tensor, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: float, policy: Any,
    saved_stats: tuple | None = None, routed: bool = True,
) -> tuple | None:  # fmt: skip
    """(dx, dweight or None, dbias or None) from the norm's backward op; None where none can run.
    `saved_stats`: the forward's (mean, rstd) if PyTorch's forward made them (else recomputed if needed)."""
    route = backward_route(op, normalized_shape, eps)
    if route is None:
        return None
    values = {"dout": dy, "x": x, "weight": weight, "bias": bias}
    if route.stats:
        values["mean"], values["rstd"] = saved_stats or stats(x, normalized_shape, eps, op == "rms_norm")
    args = inputs_for(route.op, values, GRAD_ALIASES)
    if args is None:
        return None
    result = dispatch(route.op, args, route.attrs, policy=policy, routed=routed)
    if result is None:
        return None
    grads = [*unpack_norm_grads(result, x, normalized_shape, 2 if op == "layer_norm" else 1), None]
    return grads[0], (grads[1] if weight is not None else None), (grads[2] if bias is not None else None)


def torch_grads(
    op: str, dy: Tensor, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: float,
    saved_stats: tuple | None = None, differentiable: bool | None = None,
) -> tuple:  # fmt: skip
    """PyTorch's backward (it reaches no routed aten op, so no policy scope is needed); differentiable itself
    under create_graph (grad mode on; `differentiable=False` inside a custom op's body, below autograd)."""
    if op == "layer_norm":
        mean, rstd = saved_stats or native_layer_norm_stats(x, normalized_shape, weight, bias, eps)
        mask = [True, weight is not None, bias is not None]
        return tuple(_LN_BACKWARD(dy, x, list(normalized_shape), mean, rstd, weight, bias, mask))
    if not (torch.is_grad_enabled() if differentiable is None else differentiable):
        return (*_rms_norm_grads(dy, x, weight, normalized_shape, eps), None)
    with torch.enable_grad():  # create_graph: gradients differentiable in turn
        leaves = grad_leaves(x, weight)
        out = _RMS_NORM.decompose(leaves[0], list(normalized_shape), leaves[1], eps)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, present, dy, create_graph=True))
        return next(grads), (next(grads) if weight is not None else None), None


def _rms_norm_grads(dy: Tensor, x: Tensor, weight: Any, normalized_shape: tuple, eps: float) -> tuple:
    """(dx, dweight or None) of rms_norm, computed in fp32 (fp64 for fp64 inputs)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    axes = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    xf, dyf = x.to(dtype), dy.to(dtype)
    rstd = torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    xhat = xf * rstd
    g = dyf if weight is None else dyf * weight.to(dtype)
    dx = rstd * (g - xhat * (g * xhat).mean(axes, keepdim=True))
    dw = None if weight is None else (dyf * xhat).sum_to_size(weight.shape).to(weight.dtype)
    return dx.to(x.dtype), dw


def default_eps(x: Tensor, eps: float | None) -> float:
    """rms_norm's eps=None: the dtype's machine epsilon, as PyTorch."""
    return torch.finfo(x.dtype).eps if eps is None else eps


# -- the custom ops ----------------------------------------------------------------------------------


def _policy(op: str) -> KernelPolicy | None:
    """The family policy these ops dispatch under, or None where the policy names PyTorch's own kernel."""
    policy = current_policy()
    return None if policy.preferences.get(op) == TORCH_KERNEL else family_policy(policy)


def _forward_op(op: str, x: Tensor, shape: tuple, weight: Any, bias: Any, eps: Any) -> Tensor:
    with graph_origin():
        policy = _policy(op)
        out = None if policy is None else forward(op, x, weight, bias, shape, eps, policy, routed=False)
        out = torch_forward(op, x, weight, bias, shape, eps) if out is None else out
        return unaliased((out,))[0]  # contiguous, as the fake says (inductor checks strides)


def _backward_op(op: str, dy: Tensor, x: Tensor, shape: tuple, weight: Any, bias: Any, eps: Any) -> tuple:
    with graph_origin():
        policy = _policy(op)
        eps = default_eps(x, eps)
        grads = None if policy is None else backward(op, dy, x, weight, bias, shape, eps, policy, routed=False)
        if grads is None:
            grads = torch_grads(op, dy, x, weight, bias, shape, eps, differentiable=False)
        dx, dw, db = grads
        return unaliased((dx, or_empty(dw, x), or_empty(db, x)))


@torch.library.custom_op("xpuruntime::layer_norm", mutates_args=())
def layer_norm_op(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """F.layer_norm(input, normalized_shape, weight, bias, eps) through the selector."""
    return _forward_op("layer_norm", input, tuple(normalized_shape), weight, bias, eps)


@layer_norm_op.register_fake
def _(input, normalized_shape, weight, bias, eps):
    return input.new_empty(input.shape)


@torch.library.custom_op("xpuruntime::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(
    dy: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dx, dweight, dbias) of layer_norm; an absent weight's or bias's gradient is an empty tensor."""
    return _backward_op("layer_norm", dy, input, tuple(normalized_shape), weight, bias, eps)


@layer_norm_backward_op.register_fake
def _(dy, input, normalized_shape, weight, bias, eps):
    dw = input.new_empty((0,)) if weight is None else weight.new_empty(weight.shape)
    db = input.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)
    return input.new_empty(input.shape), dw, db


@torch.library.custom_op("xpuruntime::rms_norm", mutates_args=())
def rms_norm_op(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None) -> Tensor:
    """F.rms_norm(input, normalized_shape, weight, eps) through the selector."""
    return _forward_op("rms_norm", input, tuple(normalized_shape), weight, None, eps)


@rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps):
    return input.new_empty(input.shape)


@torch.library.custom_op("xpuruntime::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(
    dy: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> tuple[Tensor, Tensor]:
    """(dx, dweight) of rms_norm; an absent weight's gradient is an empty tensor."""
    dx, dw, _ = _backward_op("rms_norm", dy, input, tuple(normalized_shape), weight, None, eps)
    return dx, dw


@rms_norm_backward_op.register_fake
def _(dy, input, normalized_shape, weight, eps):
    return input.new_empty(input.shape), input.new_empty((0,)) if weight is None else weight.new_empty(weight.shape)


def _setup(ctx, inputs, output) -> None:
    x, normalized_shape, weight, *rest = inputs
    bias = rest[0] if len(rest) == 2 else None
    ctx.save_for_backward(x, *(t for t in (weight, bias) if t is not None))
    ctx.normalized_shape, ctx.eps = tuple(normalized_shape), rest[-1]
    ctx.has_weight, ctx.has_bias = weight is not None, bias is not None


def _saved(ctx) -> tuple:
    x, *params = ctx.saved_tensors
    weight = params.pop(0) if ctx.has_weight else None
    bias = params.pop(0) if ctx.has_bias else None
    return x, weight, bias


def _layer_norm_backward(ctx, dy):
    x, weight, bias = _saved(ctx)
    dx, dw, db = layer_norm_backward_op(dy, x, ctx.normalized_shape, weight, bias, ctx.eps)
    return dx, None, dw if ctx.has_weight else None, db if ctx.has_bias else None, None


def _rms_norm_backward(ctx, dy):
    x, weight, _ = _saved(ctx)
    dx, dw = rms_norm_backward_op(dy, x, ctx.normalized_shape, weight, ctx.eps)
    return dx, None, dw if ctx.has_weight else None, None


layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_setup)
rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_setup)


def call(op: str, x: Tensor, normalized_shape: tuple, weight: Any, bias: Any, eps: Any) -> Tensor:
    """The forward op's output (what a route emits into a traced graph)."""
    if op == "layer_norm":
        return torch.ops.xpuruntime.layer_norm(x, list(normalized_shape), weight, bias, float(eps))
    return torch.ops.xpuruntime.rms_norm(x, list(normalized_shape), weight, None if eps is None else float(eps))
