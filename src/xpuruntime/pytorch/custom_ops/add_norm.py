"""`xpuruntime::add_rms_norm`, `xpuruntime::add_layer_norm` and their backward ops: a transformer block's
residual add and the norm after it in one pass, (y, h) with h = x + residual and y = norm(h), as torch.library
custom ops.

Forward: the `add_rms_norm` / `add_layer_norm` op through the selector (h into a fresh buffer of the dtype x and
residual promote to), else PyTorch's add and norm. Backward: `add_*_norm_backward`, which adds the gradient that
reaches h from the rest of the residual stream to the norm's input gradient in the same pass (dh_total, the
gradient of both x and residual), else autograd through PyTorch's formula. Only h (and the parameters) are saved.
rms_norm's `offset` and `casting` as in `norm`. Under CUDA autocast add_layer_norm's inputs are cast to float32,
as PyTorch's autocast runs layer_norm; add_rms_norm keeps its dtypes. See `eager` for the two paths.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...backends.torch.norm import rms_norm_formula
from ...policy import KernelPolicy
from ..router import IN_FORCE, Pinned, dispatch, pinned_policy
from .common import autocast_float32, by_autograd, compact, or_empty, pytorch_ran, unaliased
from .eager import OpGlue, backward_call, custom_op_body, run
from .inline import fused_custom_op


def _norm(h: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, options: tuple | None) -> Tensor:
    """PyTorch's norm of h: layer_norm (options None) or rms_norm with (offset, casting)."""
    if options is None:
        return F.layer_norm(h, h.shape[-1:], weight, bias, eps)
    attrs = {"normalized_shape": h.shape[-1:], "eps": eps, "offset": options[0], "casting": options[1]}
    return rms_norm_formula(h, weight, attrs)


def _eps(h: Tensor, eps: float | None) -> float:
    return torch.finfo(h.dtype).eps if eps is None else eps


def forward(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float | None,
    options: tuple | None, policy: KernelPolicy,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(y, h); `options` None for add_layer_norm, (offset, casting) for add_rms_norm."""
    h = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    if options is None:
        y = dispatch("add_layer_norm", (x, residual, weight, bias, h), (eps,), policy=policy, routed=False)
    else:
        y = dispatch("add_rms_norm", (x, residual, weight, h), (eps, *options), policy=policy, routed=False)
    if y is None:
        pytorch_ran("add_layer_norm" if options is None else "add_rms_norm", x, residual)
        torch.add(x, residual, out=h)
        y = _norm(h, weight, bias, _eps(h, eps), options)
    return y, h


def backward(
    dy: Tensor, dh: Tensor | None, h: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float | None,
    options: tuple | None, policy: KernelPolicy,
) -> tuple[Tensor, Tensor | None, Tensor | None]:  # fmt: skip
    """(dh_total, dweight, dbias): the gradient of x and of residual (in h's dtype), and the parameters'."""
    if options is None:
        packed = dispatch("add_layer_norm_backward", (dy, dh, h, weight), (eps,), policy=policy, routed=False)
    else:
        packed = dispatch("add_rms_norm_backward", (dy, dh, h, weight), (eps, *options), policy=policy, routed=False)
    if packed is None:
        pytorch_ran("add_layer_norm_backward" if options is None else "add_rms_norm_backward", dy, h)
        grads = by_autograd(lambda h_, w, b: _norm(h_, w, b, _eps(h, eps), options), (h, weight, bias), dy)
        return (grads[0] if dh is None else grads[0] + dh), grads[1], grads[2]
    rows = h.numel() // h.shape[-1]
    dweight = packed[rows] if weight is not None else None
    dbias = packed[rows + 1] if bias is not None else None
    return packed[:rows].view(h.shape), dweight, dbias


# -- the custom ops ----------------------------------------------------------------------------------


@fused_custom_op("xpuruntime::add_rms_norm")
def add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float | None, offset: float, casting: str, policy: str
) -> tuple[Tensor, Tensor]:
    """(rms_norm(h), h) with h = x + residual, over the last dimension."""
    with custom_op_body():
        return unaliased(forward(x, residual, weight, None, eps, (offset, casting), pinned_policy(policy)))


@fused_custom_op("xpuruntime::add_layer_norm")
def add_layer_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, policy: str
) -> tuple[Tensor, Tensor]:
    """(layer_norm(h), h) with h = x + residual, over the last dimension."""
    with custom_op_body():
        return unaliased(forward(x, residual, weight, bias, eps, None, pinned_policy(policy)))


@fused_custom_op("xpuruntime::add_rms_norm_backward")
def add_rms_norm_backward_op(
    dy: Tensor, dh: Tensor | None, h: Tensor, weight: Tensor | None, eps: float | None, offset: float, casting: str,
    policy: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(dh_total, dweight) of add_rms_norm; an absent weight's gradient is an empty tensor."""
    with custom_op_body():
        grads = backward(dy, dh, h, weight, None, eps, (offset, casting), pinned_policy(policy))
        return unaliased((grads[0], or_empty(grads[1], h)))


@fused_custom_op("xpuruntime::add_layer_norm_backward")
def add_layer_norm_backward_op(
    dy: Tensor, dh: Tensor | None, h: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, policy: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(dh_total, dweight, dbias) of add_layer_norm; absent parameters' gradients are empty tensors."""
    with custom_op_body():
        dh_total, dweight, dbias = backward(dy, dh, h, weight, bias, eps, None, pinned_policy(policy))
        return unaliased((dh_total, or_empty(dweight, h), or_empty(dbias, h)))


def _promoted(x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
    shape, dtype = x.shape, torch.promote_types(x.dtype, residual.dtype)
    return x.new_empty(shape, dtype=dtype), x.new_empty(shape, dtype=dtype)


@add_rms_norm_op.register_fake
def _(x, residual, weight, eps, offset, casting, policy):
    return _promoted(x, residual)


@add_layer_norm_op.register_fake
def _(x, residual, weight, bias, eps, policy):
    return _promoted(x, residual)


def _param_fake(t: Tensor | None, h: Tensor) -> Tensor:
    return h.new_empty((0,)) if t is None else t.new_empty(t.shape)


@add_rms_norm_backward_op.register_fake
def _(dy, dh, h, weight, eps, offset, casting, policy):
    return h.new_empty(h.shape), _param_fake(weight, h)


@add_layer_norm_backward_op.register_fake
def _(dy, dh, h, weight, bias, eps, policy):
    return h.new_empty(h.shape), _param_fake(weight, h), _param_fake(bias, h)


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    x, residual, *rest = inputs
    if len(rest) == 5:  # add_rms_norm: weight, eps, offset, casting, policy
        weight, eps, offset, casting, ctx.policy = rest
        bias, ctx.options = None, (offset, casting)
    else:  # add_layer_norm: weight, bias, eps, policy
        weight, bias, eps, ctx.policy = rest
        ctx.options = None
    ctx.save_for_backward(output[1], weight, bias)
    ctx.eps, ctx.dtypes = eps, (x.dtype, residual.dtype)


def _given(t: Tensor | None) -> Tensor | None:
    return None if t is None or (t.dim() == 1 and t.numel() == 0) else t


def _rms_body(dy, dh, h, weight, eps, offset, casting, policy) -> tuple:
    return backward(dy, dh, h, weight, None, eps, (offset, casting), policy)[:2]


def _layer_body(dy, dh, h, weight, bias, eps, policy) -> tuple:
    return backward(dy, dh, h, weight, bias, eps, None, policy)


def _backward(ctx: Any, dy: Tensor | None, dh: Tensor | None) -> tuple:
    h, weight, bias = ctx.saved_tensors
    dy = torch.zeros_like(h) if dy is None else dy.contiguous()
    dh = None if dh is None else dh.contiguous()
    if ctx.options is None:
        grads = backward_call(ctx, _layer_body, add_layer_norm_backward_op, dy, dh, h, weight, bias, ctx.eps)
    else:
        grads = backward_call(ctx, _rms_body, add_rms_norm_backward_op, dy, dh, h, weight, ctx.eps, *ctx.options)
    dh_total, dweight, dbias = (*grads, None)[:3]
    dx, dresidual = (dh_total.to(dtype) for dtype in ctx.dtypes)
    params = (dweight, *((dbias,) if ctx.options is None else ()))
    nones = (None,) * (2 if ctx.options is None else 4)  # eps (and offset, casting) and the policy
    return dx, dresidual, *(None if p is None or _given(p) is None else compact(p) for p in params), *nones


add_rms_norm_op.register_autograd(_backward, setup_context=_setup)
add_layer_norm_op.register_autograd(_backward, setup_context=_setup)
ADD_RMS_NORM = OpGlue(
    add_rms_norm_op, lambda x, r, w, eps, offset, casting, policy: forward(x, r, w, None, eps, (offset, casting),
                                                                           policy),
    _setup, _backward,
)  # fmt: skip
ADD_LAYER_NORM = OpGlue(add_layer_norm_op, lambda x, r, w, b, eps, policy: forward(x, r, w, b, eps, None, policy),
                        _setup, _backward)  # fmt: skip


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float | None = None, offset: float = 0.0,
    casting: str = "torch", pinned: Pinned = IN_FORCE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(rms_norm(h), h) with h = x + residual through the selector, forward and backward."""
    args = (x, residual, weight, None if eps is None else float(eps), float(offset), casting)
    return run(ADD_RMS_NORM, args, pinned)


def add_layer_norm(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5,
    pinned: Pinned = IN_FORCE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(layer_norm(h), h) with h = x + residual through the selector, forward and backward."""
    x, residual, weight, bias = autocast_float32(x, residual, weight, bias)
    return run(ADD_LAYER_NORM, (x, residual, weight, bias, float(eps)), pinned)
